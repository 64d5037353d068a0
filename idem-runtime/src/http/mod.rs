//! HTTP (feature `axum`): an `Idempotency-Key` layer for axum and any tower service
//! ([`IdempotencyLayer`]), and one-time submit tokens over HTTP: an endpoint that issues them
//! ([`TokenEndpoint`]) and a guard that spends the one a request carries in `X-Idem-Token`
//! ([`TokenGuardLayer`]).
//!
//! [`IdempotencyLayer`] is a tower layer with the IETF HTTPAPI `Idempotency-Key` semantics
//! (draft-ietf-httpapi-idempotency-key-header). The key comes from the `Idempotency-Key` header (a
//! structured-field string, `"…"`; a bare value is accepted) or, because proxies have been seen to
//! strip headers, from a JSON body field ([`IdempotencyBuilder::body_key`]`("/request_id")`).
//! Either must be there once: several header lines are one comma-joined value (RFC 9110 §5.3), as
//! is a bare value with a comma, and a body field on its path twice reads differently in different
//! parsers, so all are 400 `invalid-key`, also when the copies are equal. The first request runs
//! the handler; its response (status, the kept headers, body) is stored, and every repeat gets it
//! again with `Idempotent-Replayed: true` ([`REPLAYED_HEADER`]).
//!
//! ```no_run
//! # use idem_runtime as idem;
//! # async fn demo(store: idem::MemoryStore) -> Result<(), idem::IdemError> {
//! use std::time::Duration;
//!
//! use axum::{Router, routing::post};
//! use idem::http::{IdempotencyLayer, Principal};
//!
//! #[derive(Clone)]
//! struct UserId(u64); // inserted into the request's extensions by your authentication middleware
//! impl std::fmt::Display for UserId {
//!     fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
//!         write!(f, "{}", self.0)
//!     }
//! }
//!
//! let layer = IdempotencyLayer::builder(store)                 // any idem store (lease mode)
//!     .principal(Principal::extension::<UserId>())             // whose records: part of the identity
//!     .cap_per_principal(1000, Duration::from_secs(60))        // optional abuse bound: 429 beyond it
//!     .build()?;                                               // a layer without a principal is an error
//! layer.check().await?;                                        // at start-up: the store answers and is migrated
//! let app: Router = Router::new().route("/orders", post(|| async { "created" }).layer(layer));
//! # Ok(()) }
//! ```
//!
//! **The caller.** [`Principal`] is part of every record's identity, so a client that sends another
//! client's key runs as its own request and never sees the other's stored response. Take it from
//! what your authentication established ([`Principal::extension`], [`Principal::header`] for a
//! gateway's header, [`Principal::from_fn`]); [`Principal::unscoped`] opts out, with a reason. The
//! header must be sent once: several lines are no caller (401), so a client's line never wins over
//! the gateway's.
//!
//! # Transaction mode
//!
//! On SQLite, MySQL / MariaDB and Postgres, [`IdempotencyLayer::builder_tx`] begins a transaction
//! on the store for each request with a new key, claims the key in it, and lends it to the handler
//! as the extractor [`LayerTx<T>`](LayerTx) (`T` the store's transaction: `idem::SqliteTx`,
//! `idem::MySqlTx`, `idem::PgTx`), which derefs to the connection. When the handler answers, the
//! layer stores the response in the same transaction and commits: the handler's writes and the
//! stored response commit together or not at all. A 5xx, a response that is not stored (below), a
//! panic or a process killed mid-handler roll everything back, so no order is left without its
//! record and a retry runs at once, with no lease to wait for. A concurrent duplicate waits in the
//! database for the first transaction (bounded by the database's lock timeout), then replays its
//! response.
//!
//! ```no_run
//! # use idem_runtime as idem;
//! # #[cfg(feature = "sqlite")]
//! # async fn demo(store: idem::SqliteStore) -> Result<(), idem::IdemError> {
//! use axum::{Router, http::StatusCode, response::{IntoResponse, Response}, routing::post};
//! use idem::http::{IdempotencyLayer, LayerTx, Principal};
//!
//! async fn create_order(mut tx: LayerTx<idem::SqliteTx>, item: String) -> Response {
//!     let inserted = idem::sqlx::query("INSERT INTO orders (item) VALUES (?1)")
//!         .bind(&item)
//!         .execute(tx.conn()) // in the layer's transaction
//!         .await;
//!     match inserted {
//!         Ok(_) => (StatusCode::CREATED, item).into_response(),
//!         // A 5xx is not stored: the layer rolls the transaction back, and a retry runs again.
//!         Err(e) => (StatusCode::SERVICE_UNAVAILABLE, e.to_string()).into_response(),
//!     }
//! }
//!
//! let user = http::HeaderName::from_static("x-user-id"); // set by the gateway
//! let layer = IdempotencyLayer::builder_tx(store).principal(Principal::header(user)).build()?;
//! let app: Router = Router::new().route("/orders", post(create_order).layer(layer));
//! # Ok(()) }
//! ```
//!
//! The handler's writes must go through the [`LayerTx`] (a write on the pool commits on its own).
//!
//! # Answers
//!
//! Every error is an `application/problem+json` body whose `type` is `urn:idem:problem:<name>`
//! ([`PROBLEM_TYPE_PREFIX`]). The client whose request ran always gets that run's response, even
//! when it could not be stored (in transaction mode: once it committed).
//!
//! | Answer | When |
//! |---|---|
//! | the handler's response | the first request with a key |
//! | the stored response + `Idempotent-Replayed: true` | a repeat of a finished request |
//! | the handler's response, not stored | a 5xx, a status the storage policy leaves out ([`stored_by_default`]) or a `Cache-Control: no-store` response: the key is released and a retry runs the handler again (in transaction mode its writes are rolled back) |
//! | 400 `missing-key` / `invalid-key` | a covered request (POST, PATCH by default) without a usable key, or with several (two `Idempotency-Key` lines, a body key field twice) |
//! | 400 `request-unreadable` | the body could not be read to its end (shorter than its `Content-Length`, reset by the client); nothing ran or was stored |
//! | 401 `no-principal` | the principal extractor found no caller |
//! | 409 `in-progress` + `Retry-After` | a repeat while the first still runs (lease mode; in transaction mode a repeat waits for the first's commit instead), or a request whose claim another took over before its handler ran |
//! | 409 `response-not-kept` | a repeat of a request whose response body was over the size limit (48 KiB by default): it ran once and is not run again |
//! | 410 `result-expired` | a repeat of a finished request whose response is no longer kept (after [`result_ttl`](IdempotencyBuilder::result_ttl), before the key's ttl ends): the handler does not run again |
//! | 413 `request-too-large` | a body over the request limit (1 MiB by default); only that, never a body cut short |
//! | 422 `payload-mismatch` | the key was used with another method, path, content type, body (JSON in canonical form) or fingerprinted header |
//! | 429 `too-many-keys` + `Retry-After` | the caller is over its cap of new records |
//! | 500 `internal` | a fault to fix in the service, logged with its cause: a permanent store error (a table never migrated: run `migrate()`, or call [`IdempotencyLayer::check`] at start-up to find it there), a stored response that cannot be decrypted, a handler that kept the `LayerTx` past its answer |
//! | 500 `layer-misconfigured` | a handler takes a `LayerTx<T>` on a route no transaction-mode layer covers, or a `T` of another store than the layer's: the detail names the mistake, and it is logged at `error` |
//! | 503 `store-unavailable` + `Retry-After` | the store failed (in transaction mode also: the transaction could not begin or commit); nothing ran, or nothing of it was kept |
//! | 503 `recover-failed` + `Retry-After` | a retry took over a request whose handler died, and the layer's recover fn could not tell whether it had its effect; nothing ran |
//! | 503 `shutting-down` | the runtime dropped the handler's task at shutdown before it answered |
//! | 400 `missing-token` / `token-invalid`, 409 `token-used` | the token guard refused |
//!
//! **What is stored.** Every response below 500 but the refusals that say the handler did nothing a
//! retry must not repeat: a client that fixes its request (sends the right `Content-Type`, valid
//! JSON, fresh credentials) runs the handler, instead of being handed its own 415 for a day. The
//! IETF draft leaves the choice to the resource; the default follows Stripe's published behaviour
//! (a result is kept only once the endpoint began to execute, never for a request that failed
//! validation or met a concurrent one) while keeping 402, 409, 410 and the other 4xx that answer
//! the request itself. [`IdempotencyBuilder::store_if`] changes it ([`stored_by_default`] is the
//! default, to build on); a 5xx and a response with `Cache-Control: no-store` are never stored.
//!
//! **The fingerprint** is the method, the path with its query, the media type of `Content-Type`,
//! the headers named with [`IdempotencyBuilder::fingerprint_header`] (for ones that change what the
//! handler does: `Accept`, an API version), and the body. A JSON body (`application/json` or any
//! `+json` type) that parses counts in its canonical form (members sorted, no insignificant
//! whitespace), as the attribute's payloads do, so the same JSON with members in another order
//! replays; [`IdempotencyBuilder::byte_exact_bodies`] compares bytes instead. Records stored by a
//! version whose fingerprint was the method, path and raw body do not match this one: a repeat of
//! such a request answers 422 `payload-mismatch` until that record expires (24 hours by default).
//!
//! **Retry-After** on a 409 `in-progress` is how long that route's handler recently took (a running
//! mean of its high durations, per matched route, in this process), in whole seconds, at least 1
//! and at most what is left of the first request's lease: of 50 duplicates of a 50 ms handler, each
//! is told 1 s, not the lease's 30 s. With [`IdempotencyBuilder::wait`] a repeat instead waits up
//! to that long for the first to finish and gets its response.
//!
//! **Finding a request's record.** The layer stores each record under a hash of the caller and the
//! key the client sent, never the key itself, so `idem stuck` lists layer records by that hash,
//! with the method and route each came from (`POST /orders/{id}`: axum's route template under a
//! router, else the path; kept before the fingerprint's digest, read by
//! [`Record::origin`](crate::store::Record::origin)); `idem inspect` prints it as `request`, and
//! `idem stats` counts the layer's records per route. To
//! answer "what happened to order request X of customer Y", give the caller and the key as the
//! client sent them: `idem inspect HTTP order-77 --principal alice` (the same on `idem release`;
//! `--http` for a layer without a principal), or
//! [`admin::inspect_http`](crate::admin::inspect_http)`(&store, "HTTP", Some("alice"), "order-77")`
//! from code; [`http_record_key`](crate::key::http_record_key) is the hash itself.
//!
//! **At start-up**, `build()` checks the whole configuration (a principal, durations, limits,
//! headers) and [`IdempotencyLayer::check`] reads the store once, so a store that is unreachable or
//! was never migrated fails the service's start instead of its first request. The layer takes a
//! store value; a store registered by name comes from `idem::store("name")?`, which fails at once
//! with `IdemError::UnknownStore` for a name nobody registered.
//!
//! # Defaults
//!
//! | Default | Value | Setter |
//! |---|---|---|
//! | business type of the records | `HTTP` | [`.biz(b)`](IdempotencyBuilder::biz) |
//! | methods covered | POST, PATCH (others pass through) | [`.methods([…])`](IdempotencyBuilder::methods) |
//! | key required | yes (400 `missing-key` without) | [`.key_optional()`](IdempotencyBuilder::key_optional) |
//! | record lifetime | 24 hours (the attribute's is 7 days) | [`.ttl(d)`](IdempotencyBuilder::ttl): longer than the lease, at most `MAX_DURATION` |
//! | result kept | as long as the record | [`.result_ttl(d)`](IdempotencyBuilder::result_ttl): 1 ms up to the ttl |
//! | lease | 30 s | [`.lease(d)`](IdempotencyBuilder::lease): 1 ms ..= `MAX_DURATION` |
//! | heartbeat | every third of the lease | [`.heartbeat(d)`](IdempotencyBuilder::heartbeat) (1 ms .. the lease), [`.no_heartbeat()`](IdempotencyBuilder::no_heartbeat) |
//! | repeats in progress | 409 at once | [`.wait(d)`](IdempotencyBuilder::wait): 0 ..= `MAX_DURATION` |
//! | store timeout per step | 10 s | [`.store_timeout(d)`](IdempotencyBuilder::store_timeout) |
//! | longest key | 255 bytes | [`.max_key_len(n)`](IdempotencyBuilder::max_key_len): at least 1 |
//! | largest request body | 1 MiB (413 beyond) | [`.max_request_bytes(n)`](IdempotencyBuilder::max_request_bytes): at least 1 |
//! | largest response body kept | 48 KiB, and what the store's snapshot limit allows | [`.max_response_bytes(n)`](IdempotencyBuilder::max_response_bytes) |
//! | headers kept | `Content-Type`, `Content-Language`, `Content-Location`, `Location`, `ETag`, `Last-Modified`, `Link` | [`.keep_header(name)`](IdempotencyBuilder::keep_header) |
//! | statuses stored | [`stored_by_default`] | [`.store_if(f)`](IdempotencyBuilder::store_if) |
//! | fingerprint | method, path + query, content type, canonical JSON body | [`.fingerprint_header(name)`](IdempotencyBuilder::fingerprint_header), [`.byte_exact_bodies()`](IdempotencyBuilder::byte_exact_bodies) |
//! | key in the body | none | [`.body_key(pointer)`](IdempotencyBuilder::body_key) |
//! | caller | required | [`.principal(p)`](IdempotencyBuilder::principal); [`Principal::unscoped`] to opt out |
//! | cap of new records per caller | none | [`.cap_per_principal(max, window)`](IdempotencyBuilder::cap_per_principal): max at least 1, window 1 ms ..= `MAX_DURATION` |
//! | recover | none | [`.recover(f)`](IdempotencyBuilder::recover) (lease mode only) |
//! | mode | lease | [`IdempotencyLayer::builder_tx`] for transaction mode |
//!
//! Durations are checked by `build()`, never per request; out of range is
//! `IdemError::InvalidOptions`.
//!
//! **Headers never kept**, whatever [`IdempotencyBuilder::keep_header`] asks (`build()` refuses
//! them with `IdemError::InvalidOptions` naming the header and why):
//!
//! | Never kept | Why |
//! |---|---|
//! | `Set-Cookie`, `Set-Cookie2` | the first response's session: a replay would hand it to whoever repeats the request |
//! | `Authorization`, `Proxy-Authorization`, `Cookie` | credentials, never response headers: keeping one could only replay a secret |
//! | `Authentication-Info`, `Proxy-Authentication-Info` | they authenticate one exchange (RFC 9110 §11.6.3) |
//! | `Connection`, `Keep-Alive`, `Proxy-Connection`, `Proxy-Authenticate`, `TE`, `Upgrade` | hop-by-hop: they describe one connection |
//! | `Transfer-Encoding`, `Content-Length`, `Trailer` | framing, which the server computes for the body it sends (a stored response has no trailers) |
//! | `Idempotent-Replayed` | the layer's own |
//!
//! `WWW-Authenticate` may be kept (a challenge carries no secret).
//!
//! # When a handler dies
//!
//! In lease mode, a handler killed between its writes and the stored response leaves its record
//! PROCESSING: retries get 409 until the lease ends, then one runs the handler again, unless the
//! layer has a recover fn. [`IdempotencyBuilder::recover`]`(|req: RecoverRequest| async { … })` is
//! asked first on such a takeover, with the request ([`RecoverRequest`]: key, caller, method, URI,
//! headers, body); it answers `Ok(Some(response))` from what the handler wrote (the order row),
//! which is stored and returned, `Ok(None)` to run the handler, or an error for 503
//! `recover-failed`. Without one, use transaction mode, or give the handler's writes their own
//! unique constraint on the key.
//!
//! **Graceful drain.** The layer runs each handler on a task of its own, so a client that goes away
//! (a gateway timeout) does not cancel it; but then a server's graceful shutdown may return while
//! handlers still run. Take `let drain = layer.drain();` before serving, then after
//! `axum::serve(…).with_graceful_shutdown(…).await`, `drain.wait(Duration::from_secs(30)).await`
//! waits for them (`Err(n)`: `n` still ran at the deadline; their leases expire and a retry takes
//! over). See [`Drain`].
//!
//! # Submit tokens over HTTP
//!
//! [`TokenEndpoint::new(tokens, principal).route()`](TokenEndpoint) issues a submit token bound to
//! the caller ([`TokenEndpoint::ttl`], 1 ms ..= `MAX_DURATION`, default 10 minutes), and
//! [`TokenGuardLayer`] spends the one a request carries in `X-Idem-Token` ([`TOKEN_HEADER`]) before
//! the handler runs: a second submit gets 409 `token-used`; a token of another caller, or several
//! `X-Idem-Token` lines, 400; a 5xx puts the token back.
//!
//! # What proves it
//!
//! In the repository: `tests/tests/http_layer/` runs a real axum server on loopback with a
//! reqwest client (64 concurrent duplicate POSTs → one execution, audited in the handler's own
//! table; a handler that died after its effect recovered, not run again);
//! `tests/tests/http_tx.rs` runs transaction mode on SQLite, MariaDB and Postgres (64
//! duplicates → one order; a 5xx, a 422 and a panic after the insert leave no order and no
//! record); `tests/tests/crash/` kills the service with SIGKILL after the insert, before the
//! commit.
//!
//! # An example service
//!
//! `examples/shop.rs` in the repository is what a team would copy to start: axum, the
//! layer in transaction mode for order creation (the order row and its stored 201 commit together),
//! an SQL store, a state machine for orders (`#[state_transition]`), submit tokens for the cancel
//! form, and `/metrics`:
//!
//! ```sh
//! cargo run -p idem-suite --example shop --features axum,metrics                                   # SQLite
//! IDEM_STORE_URL=mysql://root@127.0.0.1:3306/test cargo run -p idem-suite --example shop --features axum,metrics,mysql
//! ```

mod builder;
mod handler;
mod layer;
mod problem;
mod recover;
mod stored;
mod tokens;
mod tx;

pub use crate::layer::config::IDEMPOTENCY_KEY;
pub use crate::layer::stored::REPLAYED_HEADER;
pub use crate::layer::{Drain, LayerTx, Principal};
pub use builder::{IdempotencyBuilder, stored_by_default};
pub use layer::{Idempotency, IdempotencyLayer};
pub use problem::PROBLEM_TYPE_PREFIX;
pub use recover::RecoverRequest;
pub use tokens::{TOKEN_HEADER, TokenEndpoint, TokenGuard, TokenGuardLayer};
