//! Procedural macros of idem ([`idemkit`](https://docs.rs/idemkit)). Depend on the `idemkit`
//! package (its library is named `idem`), which re-exports them; this crate only parses, checks
//! and expands (no I/O).
//!
//! Each macro has a folder (`idempotent/`, `consume_token/`, `state_machine/`, `state_transition/`)
//! whose `mod.rs` runs
//! parse (`args.rs`) → check (`check.rs`) → expand (`expand.rs`) and falls back to the item as written
//! plus the errors; `common/` holds what every macro uses.

mod common;
mod consume_token;
mod idempotent;
mod state_machine;
mod state_transition;

use proc_macro::TokenStream;

/// Makes an `async fn` idempotent: for one `(biz, key)` the body runs at most once to success, and every
/// repeat gets the first result back.
///
/// ```ignore
/// use idem::{idempotent, IdemError};
///
/// #[idempotent(biz = "PAY", key = "req.order_no", store = "sqlite")]
/// async fn pay(req: &PayReq) -> Result<Receipt, PayError> {
///     // runs at most once per order number; a retry gets the stored `Receipt`
/// }
/// ```
///
/// (Compiled, runnable examples: the crate's front page and the guide
/// [`idem::_guide::idempotent`](https://docs.rs/idemkit/latest/idem/_guide/idempotent/index.html).)
///
/// # Options
///
/// | option | required | value | default |
/// | --- | --- | --- | --- |
/// | `biz` | yes | string literal: the business action, non-empty, at most 32 bytes (UTF-8, the unit the store counts in), no whitespace. The same key in two `biz` is two records. | |
/// | `key` | yes | a Rust expression over the fn's parameters, in a string (`key = "req.order_no"`) or bare (`key = req.order_no`); composite keys are tuples: `key = "(req.user_id, req.client_req_id)"`. rustc's errors point at it either way; written bare, they also get rustc's suggestions (a misspelled field's similar name), which it cannot make inside a string | |
/// | `store` | yes, but not with `tx` | a store name registered at start-up (`store = "sqlite"`), or an expression yielding a store (`store = self.store`, `store = STORE`) | |
/// | `ttl` | no | how long a record is kept: a positive integer and a unit, `ms`, `s`, `m`, `h` or `d` | `"7d"` |
/// | `result_ttl` | no | how long the result is kept for replay when shorter than `ttl`: from then until `ttl` ends the record is a tombstone, and a repeat gets `IdemError::ResultExpired` (HTTP 410) instead of running the body; at most `ttl` (the default) | `"1d"` |
/// | `lease` | no | how long a claim in progress is protected before another attempt may take over; must be shorter than `ttl` | `"30s"` |
/// | `fingerprint` | no | an expression over the parameters (string or bare) whose serialized hash is stored; a repeat with the same key and another fingerprint gets `IdemError::PayloadMismatch` | none |
/// | `on_in_progress` | no | `"reject"`: a repeat while the first call runs gets `IdemError::InProgress`; `"wait(5s)"`: it waits up to that long for the first result | `"reject"` |
/// | `tx` | no | the name of a `&mut` parameter holding a transaction begun with the store's `begin()` (`&mut idem::SqliteTx`, `&mut idem::MySqlTx` or `&mut idem::PgTx`; `ShardedStore::begin_for` and `EncryptedStore::begin` give theirs): claim, body and mark commit or roll back together in it. The transaction carries its store, so `store` is not given (and is refused): the claim goes to that store's table by construction; a sqlx `Transaction` or connection, which carries none, is refused | none |
/// | `heartbeat` | no | renew the lease this often while the body runs, so a slow but healthy body is not taken over (shorter than `lease`; not with `tx`); `"off"` never renews | a third of `lease` |
/// | `store_timeout` | no | the longest each of the call's store steps may wait for the store (the claim or replay, a renewal, the mark, each statement in `tx`), 1 ms up; past it the call ends with the retryable `IdemError::StoreUnavailable` instead of hanging on a store that went silent | `"10s"` |
/// | `tx_idle` | no | with `tx` only: how long the transaction may sit idle (no statement) once it holds the claim before the database server ends its session and rolls it back, so a repeat can take the key of a client that vanished mid-transaction (`Call::tx_idle_timeout`; 1 ms to 24 days, `idem::MAX_TX_IDLE_TIMEOUT`); `"off"` puts no bound in force. Unless given, the store's setting, by default the lease | `lease` |
/// | `recover` | no | a call over the parameters, in a string or bare, to an async fn returning `Result<Option<T>, E2>` with the fn's own `T` and an `E2` the fn's error converts from (`recover = "find_payment(&req.order_no)"`). Asked before a takeover re-runs the body (a holder that died, paused or could not mark): `Some(result)` is stored and returned without running the body, `None` runs it, an error is returned and the next call asks again. Not with `tx` | none |
/// | `crate` | no | the path at which idem is reachable, when it is renamed or re-exported (like serde's) | `"::idem"` |
///
/// # Scope keys by caller
///
/// When the key comes from a client (an `Idempotency-Key` header, a `client_req_id` field in the
/// body), two callers can send the same value, by chance or on purpose, and the second would be
/// handed the first one's stored answer. Put the caller into the key: a tuple of who is calling
/// (from the session or the verified token, never from the request body) and the client's key.
///
/// ```ignore
/// #[idempotent(biz = "ORDER", key = "(user.id, req.client_req_id)", store = "sqlite")]
/// async fn create_order(user: &User, req: &CreateOrder) -> Result<Order, ShopError> { /* … */ }
/// ```
///
/// Each part may be a string, an integer or a nested tuple (`((user.tenant, user.id),
/// req.client_req_id)`); parts are joined with `:` and escaped, so no two tuples share a record.
/// A key the server made itself (an order number it assigned) is unique already and needs no
/// scope. A caller named in the key must be a parameter of the fn: `key = "(user.id, …)"` on a fn
/// without `user` is a compile error that says to take it.
///
/// # What the fn must look like
///
/// - `async fn`, not `const`; methods (`&self`, `&mut self`, `self`), generics and `where` clauses work.
/// - It returns `Result<T, E>` where `T: Serialize + DeserializeOwned` (the result is stored and
///   replayed) and `E: From<idem::IdemError>` (idem's own failures — store down, in progress, payload
///   mismatch — are returned through it). An alias works too, `anyhow::Result<T>` or one under any
///   name, `ShopResult<Receipt>`: the type checker resolves it, and a generic type that is no `Result`
///   is one error at the return type.
///
/// # Checked at compile time
///
/// Each mistake is a compile error at the offending token, saying what to do:
///
/// - a missing, unknown (with "did you mean") or duplicate option; a bad `biz`, duration or
///   `on_in_progress`; `ttl` not longer than `lease`; `result_ttl` longer than `ttl`; a
///   `heartbeat` not shorter than `lease`; `tx_idle` without `tx` or over 24 days; `tx` naming no parameter, a parameter not taken by `&mut`, or one that is no transaction of a store
///   (one error, at `tx`, naming `SqliteTx`, `MySqlTx` and `PgTx`), `store` beside `tx`;
/// - a `key` or `fingerprint` that names an unknown parameter, reads no parameter at all (every call
///   would share one record), contains `.await`, or calls something that differs on every retry
///   (`Uuid::new_v4()`, `SystemTime::now()`, `rand::random()`, …): the key must come from the caller and
///   stay stable across retries. A misspelled field (`req.order_noo`) is reported by rustc inside the
///   attribute;
/// - a fn that is not `async`, is `const`, or does not return `Result`; an Ok type that cannot be stored
///   or an error type without `From<IdemError>` (one error, at the type);
/// - a `recover` that names a fn without calling it, contains `.await`, reads no parameter, is
///   combined with `tx`, calls a fn that does not exist, is not async, returns something other than
///   `Result<Option<T>, _>` with the fn's `T`, or has an error the fn's error does not convert from.
///
/// When the attribute is wrong, the fn is still emitted as written next to the errors (its parameters
/// marked used, so no warning joins them), so its callers compile and only the real errors show.
///
/// Every option also takes its value from a `macro_rules!` fragment (`$biz:literal`, `$key:expr`,
/// `$store:literal`, `$tx:ident`, `$krate:path`), so handlers can be declared by a wrapper macro.
///
/// # More
///
/// ```ignore
/// // A composite key, a fingerprint, a store held by the service, waiting for a call in progress.
/// impl PayService {
///     #[idempotent(
///         biz = "REFUND",
///         key = (req.user_id, req.client_req_id),
///         store = self.store,
///         fingerprint = "req",
///         ttl = "1d",
///         lease = "10s",
///         on_in_progress = "wait(5s)",
///     )]
///     async fn refund(&self, req: &RefundReq) -> Result<Refund, PayError> { /* … */ }
/// }
///
/// // Claim, business writes and mark in one transaction (from `store.begin()`): all commit or none.
/// // On MySQL take a `&mut idem::MySqlTx`, on Postgres a `&mut idem::PgTx` (and bind `$1`).
/// #[idempotent(biz = "PAY", key = "req.order_no", tx = "tx")]
/// async fn pay_in_tx(tx: &mut idem::SqliteTx, req: &PayReq) -> Result<Receipt, PayError> {
///     idem::sqlx::query("INSERT INTO payments (order_no) VALUES (?)")
///         .bind(&req.order_no)
///         .execute(&mut **tx)
///         .await?;
///     /* … */
/// }
///
/// // A slow body keeps its claim: the lease is renewed every 10 s while it runs.
/// #[idempotent(biz = "REPORT", key = "req.id", store = "sqlite", lease = "30s", heartbeat = "10s")]
/// async fn build_report(req: &ReportReq) -> Result<Report, ReportError> { /* … */ }
///
/// // idem re-exported by another crate.
/// #[idempotent(biz = "PAY", key = "req.order_no", store = "sqlite", crate = "my_platform::idem")]
/// async fn pay_via_platform(req: &PayReq) -> Result<Receipt, PayError> { /* … */ }
/// ```
#[proc_macro_attribute]
pub fn idempotent(args: TokenStream, item: TokenStream) -> TokenStream {
    idempotent::idempotent(args.into(), item.into()).into()
}

/// Spends a one-time submit token before an `async fn` runs: of N submits carrying the same token
/// (a double click, a resubmitted form), exactly one runs the body; every other gets
/// `IdemError::TokenUsed` (HTTP 409) through the fn's error type, and the body does not run.
///
/// The page is given a token when it is rendered (`tokens.issue(ttl, subject)` on an
/// `idem::TokenStore`) and submits it back; the attribute reads it from the fn's parameters and
/// consumes it, atomically, before the body.
///
/// ```ignore
/// use idem::{consume_token, IdemError};
///
/// #[consume_token(token = "form.token", store = "tokens", subject = "session.user_id", restore_on_err)]
/// async fn place_order(session: &Session, form: &OrderForm) -> Result<Order, ShopError> {
///     // runs at most once per token; a failure puts the token back (restore_on_err)
/// }
/// ```
///
/// (A compiled, runnable example: the guide
/// [`idem::_guide::tokens`](https://docs.rs/idemkit/latest/idem/_guide/tokens/index.html).)
///
/// # Options
///
/// | option | required | value | default |
/// | --- | --- | --- | --- |
/// | `token` | yes | a Rust expression over the fn's parameters, in a string (`token = "form.token"`) or bare (`token = form.token`), whose value is text (`AsRef<str>`: a `String`, a `&str`, …) | |
/// | `store` | yes | a token store registered at start-up with `idem::register_tokens("tokens", store.tokens())` (`store = "tokens"`), or an expression yielding one (`store = self.tokens`): an `idem::TokenStore` (`SqliteTokens`, `RedisTokens`, `MemoryTokens`), an `Arc` of one, `Arc<dyn TokenStore>`, or a reference to one. An unregistered name is `IdemError::UnknownStore` at run time, and the body does not run | |
/// | `subject` | no | an expression over the parameters (string or bare) whose value is text: who the token was issued to (a user or session id). Another subject's token is `IdemError::TokenInvalid`, and stays usable by its own subject | none: the token must have been issued without a subject |
/// | `restore_on_err` | no | a flag, no value: when the body returns `Err`, the token is put back so the user can submit again. A restore that fails is logged (`tracing::warn!`) and the body's error is still returned | off: a failed body leaves the token spent |
/// | `crate` | no | the path at which idem is reachable, when it is renamed or re-exported (like serde's) | `"::idem"` |
///
/// # What happens
///
/// - The token cannot be spent: used already (`IdemError::TokenUsed`, 409); malformed, unknown,
///   expired or another subject's (`IdemError::TokenInvalid`, 400); the store is unknown or fails.
///   The fn returns `Err(E::from(error))` and the body does not run.
/// - The body returns `Ok`: the token stays spent.
/// - The body returns `Err`: with `restore_on_err` the token is restored first; without it, it stays
///   spent (a resubmit gets `TokenUsed`).
/// - The body panics, or the fn's future is dropped (a client that went away, a timeout): the token
///   stays spent, whatever `restore_on_err` says. A duplicate never runs the body twice; the user
///   reloads the page for a fresh token.
///
/// Each call is a `tracing` span `idem.consume_token` with the token store's `backend` and the
/// `outcome` (`executed`, `failed`, `restored`, `restore_failed`, `used`, `invalid`, `rejected`).
/// The token itself is never logged.
///
/// # What the fn must look like
///
/// - `async fn`, not `const`; methods (`&self`, `&mut self`, `self`), generics and `where` clauses
///   work.
/// - It returns `Result<T, E>` where `E: From<idem::IdemError>` (idem's refusals are returned
///   through it); `T` is anything (nothing is stored). An alias works too (`anyhow::Result<T>`,
///   `ShopResult<T>`).
///
/// # Checked at compile time
///
/// Each mistake is a compile error at the offending token, saying what to do:
///
/// - a missing (`token`, `store`), unknown (with "did you mean") or duplicate option; a value given
///   to the flag `restore_on_err`; an empty `token`, `subject` or `store`; a `crate` that is no path;
/// - a `token` or `subject` that names an unknown parameter (with "did you mean"), reads no
///   parameter at all, contains `.await`, or calls something that differs on every call
///   (`Uuid::new_v4()`, `SystemTime::now()`, `rand::random()`, …): both must come from the request;
/// - a `token` or `subject` whose value is no text, a bare `store = tokens` where a name in quotes
///   was meant, a `store` expression that is no token store (one error, at the expression);
/// - a fn that is not `async`, is `const`, does not return `Result` (or returns an `impl Trait`
///   inside it), or whose error type lacks `From<IdemError>` (one error, at the type).
///
/// When the attribute is wrong, the fn is still emitted as written next to the errors (its parameters
/// marked used, so no warning joins them), so its callers compile and only the real errors show.
/// Every option also takes its value from a `macro_rules!` fragment (`$token:expr`,
/// `$store:literal`, `$krate:path`).
///
/// # More
///
/// ```ignore
/// // Tokens held by the service, bound to the session's user, restored when the order fails.
/// impl Shop {
///     #[consume_token(token = form.token, store = self.tokens, subject = session.user_id, restore_on_err)]
///     async fn place_order(&self, session: &Session, form: OrderForm) -> Result<Order, ShopError> {
///         /* … */
///     }
/// }
///
/// // Rendering the form: a token for this user, valid for 30 minutes.
/// let token = shop.tokens.issue(Duration::from_secs(1800), Some(&session.user_id)).await?;
/// ```
#[proc_macro_attribute]
pub fn consume_token(args: TokenStream, item: TokenStream) -> TokenStream {
    consume_token::consume_token(args.into(), item.into()).into()
}

/// Declares a state machine stored in one column of one table: one unit variant per state.
///
/// ```ignore
/// #[derive(Debug, Clone, Copy, PartialEq, Eq, idem::StateMachine)]
/// #[state_machine(table = "orders", key = "order_no", status = "status", version = "version")]
/// pub enum OrderStatus {
///     #[state(to(Paid, Closed))] WaitPay,              // stored as "WAIT_PAY"
///     #[state(to(Refunding))] Paid,
///     #[state(name = "REFUND_PENDING", to(Refunded))] Refunding,
///     #[state(terminal)] Refunded,
///     #[state(terminal)] Closed,
/// }
/// ```
///
/// | on the enum, `#[state_machine(…)]` | required | meaning |
/// | --- | --- | --- |
/// | `table = "orders"` | yes | the table; `schema.table` works |
/// | `key = "order_no"` | yes | the column that identifies one row (unique) |
/// | `status = "status"` | no, `"status"` | the column holding the stored state name (TEXT) |
/// | `version = "version"` | no | an integer column for optimistic locking (`version = "…"` on a transition) |
/// | `crate = "path"` | no, `"::idem"` | where idem is reachable when renamed |
///
/// | on a variant, `#[state(…)]` | meaning |
/// | --- | --- |
/// | `to(A, B)` | the declared transitions out of this state, by variant |
/// | `terminal` | no transition leaves it (cannot be combined with `to`) |
/// | `name = "X"` | the stored name; default: the variant in `SCREAMING_SNAKE_CASE` |
///
/// Identifiers must match `[A-Za-z_][A-Za-z0-9_]*` (`schema.table` for the table); they are quoted
/// per dialect in every statement, so reserved words (`order`, `key`) work, and values are always
/// bound. A `to` naming no variant ("did you mean"), `terminal` with `to`, a bad identifier and two
/// states stored under one name are compile errors at the offending token.
///
/// Generates `impl idem::StateMachine` (table, columns, states, terminal states, edges, `as_str`,
/// `parse`), `Display` and `FromStr` (the stored name), `idem::state_machine::ToSqlValue` (the stored name, for
/// `set(…)`), and sqlx `Type`/`Encode`/`Decode` for SQLite as TEXT (with idem's `sqlite` feature;
/// the user's crate needs no sqlx features). It also emits a hidden
/// macro under the enum's own name (macros and types are separate namespaces, so importing the enum
/// imports it too): `#[state_transition]` calls it to check its states, transition, key and version
/// against the machine. The enum may live in any module, inside a fn, or in another crate.
///
/// When the derive reports an error, it still emits the impls (empty), so the code using the machine
/// adds no errors of its own.
#[proc_macro_derive(StateMachine, attributes(state_machine, state))]
pub fn derive_state_machine(item: TokenStream) -> TokenStream {
    state_machine::derive(item.into()).into()
}

/// Makes an `async fn` a state transition: `UPDATE … SET status = to WHERE key = ? AND status = from`
/// moves the row once; a repeat changes nothing and is recognised.
///
/// ```ignore
/// #[state_transition(from = "WAIT_PAY", to = "PAID")]
/// async fn mark_paid(
///     tx: &mut idem::SqliteTx,                   // the caller's transaction (`store.begin()`;
///                                                // `idem::MySqlTx`, `idem::PgTx` on those)
///     order_no: &str,                            // the key: named like the machine's key column
/// ) -> Result<idem::Transition<Receipt, OrderStatus>, PayError> {
///     issue_coupon(tx, order_no).await?;         // runs only when the row moved, in the same tx
///     Ok(Receipt { .. })                         // the body returns Result<T, E>
/// }
/// ```
///
/// (A compiled, runnable example: the guide
/// [`idem::_guide::transitions`](https://docs.rs/idemkit/latest/idem/_guide/transitions/index.html).)
///
/// # Options
///
/// | option | default | meaning |
/// | --- | --- | --- |
/// | `from = "WAIT_PAY"` or `from = ["WAIT_PAY", "PAY_FAILED"]` | required | the stored states the row may move from |
/// | `to = "PAID"` | required | the stored state it moves to |
/// | `machine = OrderStatus` | the `Machine` of the return type `Result<Transition<T, Machine>, E>` | the `#[derive(StateMachine)]` enum, by path |
/// | `key = "req.order_no"` | the first parameter (not `tx`, not `self`), which must then be named like the key column (checked at compile time) | an expression over the parameters, bound to the key column |
/// | `set(trade_no = "cb.trade_no", …)` | none | more columns written by the update, each bound from an expression over the parameters |
/// | `now = "paid_at"` | none | a column set to the database's `CURRENT_TIMESTAMP`: on SQLite UTC text `YYYY-MM-DD HH:MM:SS`; on MySQL the session time zone's date-time; on Postgres a `timestamptz`, the transaction's start time |
/// | `match(trade_no, …)` | none | `set` columns that must equal the stored values for a repeat to count as `AlreadyApplied` (same `trade_no`: the same payment; another: `Rejected`) |
/// | `version = "seen_version"` | none | optimistic lock: adds `AND version = ?`; an `i64` expression; the machine needs `version = "…"`. (A machine with a version column has it bumped by every transition, with or without this option.) |
/// | `tx = "tx"` | a parameter named `tx` | the caller's transaction: `&mut idem::SqliteTx`, `&mut idem::MySqlTx` or `&mut idem::PgTx` (from `store.begin()`), or an `idem::sqlx` `Transaction` / connection; update and body run in a savepoint of it; the caller commits |
/// | `store = "sqlite"` | none | instead of `tx`: a registered store with a database; the fn begins a transaction on it (`BEGIN IMMEDIATE` on SQLite), commits on `Ok`, rolls back on `Err`. The body cannot see this transaction: a body writing to the same SQLite database would wait for its lock, so use `tx` mode for such bodies |
/// | `crate = "path"` | `"::idem"` | where idem is reachable when renamed |
///
/// # The fn
///
/// `async`, returning `Result<idem::Transition<T, Machine>, E>` with `E: From<idem::IdemError>`; the
/// body is written returning `Result<T, E>` and runs only when the update moved one row. Outcomes:
///
/// - `Applied(T)`: the row moved and the body ran in the same transaction. A body `Err` rolls the move
///   and the body's writes back (`ROLLBACK TO SAVEPOINT`) and is returned as is.
/// - `AlreadyApplied`: the row is already in `to` with equal `match` columns; the body did not run;
///   answer the caller with success.
/// - `Rejected { current }`: the row is in another state; nothing changed.
/// - `VersionConflict { current, version }`: the row is in a `from` state at another version.
/// - `NotFound`: no row has the key.
///
/// Database failures come back through `E` as `IdemError::StoreBusy` / `StoreUnavailable`
/// (retryable), `StoreSchema` or `Store`. Every call is an `idem` span (`biz` = the machine's name,
/// `transition`, `outcome`), counted under the machine's name and seen by `idem::metrics::observe`.
///
/// # Checked at compile time
///
/// At the offending token, naming the machine, the states and the fix: an unknown state name (with the
/// closest stored name, or the stored name of a variant written instead), a transition the machine
/// does not declare, a move out of a terminal state, `from` equal to `to`, a column that is no SQL
/// identifier, a `set`/`key`/`version` expression naming an unknown parameter (with "did you mean"),
/// containing `.await` or calling something that differs on every call (`Uuid::new_v4()`, …), a `key`
/// that uses no parameter, `match` on a column not in `set`, `version` without the machine's version
/// column, a defaulted key whose parameter is not named like the key column, a fn that is not `async`
/// or does not return `Result<Transition<…>, E>`. A bad attribute still emits the fn with its body, so
/// its callers compile and only the real errors show.
///
/// # The SQL
///
/// Listed in the fn's docs, with the public expression that gives the exact strings:
/// `idem::state_machine::TransitionSql::build::<Machine>(&idem::state_machine::TransitionShape { … })`, built at compile time from
/// the machine's consts, one pair of statements per dialect (`?` for SQLite and MySQL, `$n` for
/// Postgres; identifiers quoted `"…"` or `` `…` ``). The connection the fn runs on picks its
/// dialect's statement, so a new backend needs no change here. For `from = "WAIT_PAY", to = "PAID",
/// set(trade_no = …), now = "paid_at", match(trade_no)` on `orders` (SQLite):
///
/// ```sql
/// UPDATE "orders" SET "status" = ?, "trade_no" = ?, "paid_at" = CURRENT_TIMESTAMP WHERE "order_no" = ? AND "status" = ?
/// -- no row changed: why? (MySQL/Postgres add FOR UPDATE; SQLite's BEGIN IMMEDIATE holds the lock)
/// SELECT "status", CASE WHEN "status" = ? AND "trade_no" = ? THEN 1 ELSE 0 END FROM "orders" WHERE "order_no" = ?
/// ```
#[proc_macro_attribute]
pub fn state_transition(args: TokenStream, item: TokenStream) -> TokenStream {
    state_transition::attribute(args.into(), item.into()).into()
}

/// Not a public API: what a machine's hidden macro calls to check a `#[state_transition]` against
/// the machine (see `state_transition/machine_check.rs`). Reached as `idem::__macros::check_transition`.
#[doc(hidden)]
#[proc_macro]
pub fn check_transition(input: TokenStream) -> TokenStream {
    state_transition::check_transition(input.into()).into()
}
