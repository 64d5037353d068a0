//! Procedural macros of [idem](https://docs.rs/idem). Depend on `idem`, which re-exports them; this
//! crate only parses, checks and expands (no I/O).
//!
//! Pipeline: `args.rs` parses the attribute, `validate.rs` checks it against the fn, `expand_idempotent.rs`
//! generates code; `expand.rs` runs the three and falls back to the fn as written plus the errors.

mod args;
mod diag;
mod duration;
mod expand;
mod expand_idempotent;
mod validate;

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
/// # Options
///
/// | option | required | value | default |
/// | --- | --- | --- | --- |
/// | `biz` | yes | string literal: the business action, non-empty, at most 32 characters, no whitespace. The same key in two `biz` is two records. | |
/// | `key` | yes | a Rust expression over the fn's parameters, in a string (`key = "req.order_no"`) or bare (`key = req.order_no`); composite keys are tuples: `key = "(req.user_id, req.client_req_id)"` | |
/// | `store` | yes | a store name registered at start-up (`store = "sqlite"`), or an expression yielding a store (`store = self.store`, `store = STORE`) | |
/// | `ttl` | no | how long a record is kept: a positive integer and a unit, `ms`, `s`, `m`, `h` or `d` | `"7d"` |
/// | `lease` | no | how long a claim in progress is protected before another attempt may take over; must be shorter than `ttl` | `"30s"` |
/// | `fingerprint` | no | an expression over the parameters (string or bare) whose serialized hash is stored; a repeat with the same key and another fingerprint gets `IdemError::PayloadMismatch` | none |
/// | `on_in_progress` | no | `"reject"`: a repeat while the first call runs gets `IdemError::InProgress`; `"wait(5s)"`: it waits up to that long for the first result | `"reject"` |
/// | `tx` | no | the name of a `&mut sqlx::Transaction<'_, Sqlite>` (or `&mut SqliteConnection`) parameter: claim, body and mark commit or roll back together in it | none |
/// | `crate` | no | the path at which idem is reachable, when it is renamed or re-exported (like serde's) | `"::idem"` |
///
/// # What the fn must look like
///
/// - `async fn`, not `const`; methods (`&self`, `&mut self`, `self`), generics and `where` clauses work.
/// - It returns `Result<T, E>` (or a one-argument alias such as `anyhow::Result<T>`) where
///   `T: Serialize + DeserializeOwned` (the result is stored and replayed) and `E: From<idem::IdemError>`
///   (idem's own failures — store down, in progress, payload mismatch — are returned through it).
///
/// # Checked at compile time
///
/// Each mistake is a compile error at the offending token, saying what to do:
///
/// - a missing, unknown (with "did you mean") or duplicate option; a bad `biz`, duration or
///   `on_in_progress`; `ttl` not longer than `lease`; `tx` naming no parameter;
/// - a `key` or `fingerprint` that names an unknown parameter, reads no parameter at all (every call
///   would share one record), contains `.await`, or calls something that differs on every retry
///   (`Uuid::new_v4()`, `SystemTime::now()`, `rand::random()`, …): the key must come from the caller and
///   stay stable across retries. A misspelled field (`req.order_noo`) is reported by rustc inside the
///   attribute;
/// - a fn that is not `async`, is `const`, or does not return `Result`; an Ok type that cannot be stored
///   or an error type without `From<IdemError>` (one error, at the type).
///
/// When the attribute is wrong, the fn is still emitted as written next to the errors, so its callers
/// compile and only the real errors show.
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
/// // Claim, business writes and mark in one transaction: all commit or none.
/// #[idempotent(biz = "PAY", key = "req.order_no", store = "sqlite", tx = "tx")]
/// async fn pay_in_tx(
///     tx: &mut sqlx::Transaction<'_, sqlx::Sqlite>,
///     req: &PayReq,
/// ) -> Result<Receipt, PayError> { /* … */ }
///
/// // idem re-exported by another crate.
/// #[idempotent(biz = "PAY", key = "req.order_no", store = "sqlite", crate = "my_platform::idem")]
/// async fn pay_via_platform(req: &PayReq) -> Result<Receipt, PayError> { /* … */ }
/// ```
#[proc_macro_attribute]
pub fn idempotent(args: TokenStream, item: TokenStream) -> TokenStream {
    expand::idempotent(args.into(), item.into()).into()
}
