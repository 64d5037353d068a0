//! HTTP: an `Idempotency-Key` layer for axum and any tower service ([`IdempotencyLayer`]), and
//! One-time submit tokens over HTTP: an endpoint that issues them ([`TokenEndpoint`]) and a guard
//! that spends the one a request carries in `X-Idem-Token` ([`TokenGuardLayer`]). Every error is an
//! `application/problem+json` body whose `type` starts with [`PROBLEM_TYPE_PREFIX`].
//!
//! | Answer | When |
//! |---|---|
//! | the handler's response | first request with a key |
//! | the stored response, `Idempotent-Replayed: true` | a repeat of a finished request |
//! | the handler's response, not stored | a 5xx, a status [`stored_by_default`] (or the layer's policy) leaves out, `Cache-Control: no-store`: the key is released, a retry runs again |
//! | 400 `missing-key` / `invalid-key` | a covered request without a usable key, or with several (two `Idempotency-Key` lines, a body key field twice) |
//! | 400 `request-unreadable` | the request body could not be read to its end (cut short, reset); nothing was written |
//! | 401 `no-principal` | the [`Principal`] extractor found no caller |
//! | 409 `in-progress`, `Retry-After` | a repeat while the first still runs (lease mode), or a claim another request took over before the handler ran |
//! | 409 `response-not-kept` | a repeat of a request whose response was too large to keep |
//! | 413 `request-too-large` | a body over the request limit |
//! | 422 `payload-mismatch` | the key was used with another method, path, content type, body (JSON in canonical form) or fingerprinted header |
//! | 429 `too-many-keys`, `Retry-After` | the caller is over its cap of new records |
//! | 500 `internal` | a fault to fix in the service (logged): a permanent store error such as a table never migrated ([`IdempotencyLayer::check`] finds it at start-up), a stored response that cannot be decrypted, a [`LayerTx`] kept past the handler's answer or asked for on a route without a transaction-mode layer |
//! | 503 `store-unavailable`, `Retry-After` | the store failed (or, in transaction mode, the transaction could not begin or commit); nothing ran or nothing of it was kept |
//! | 503 `recover-failed`, `Retry-After` | a takeover's recover fn could not tell whether the first request's action happened; nothing ran |
//! | 503 `shutting-down` | the runtime dropped the handler's task at shutdown |
//! | 400 `missing-token` / `token-invalid`, 409 `token-used` | the token guard refused |
//!
//! Enabled by the `axum` feature.

mod builder;
mod cap;
mod drain;
mod hint;
mod key;
mod layer;
mod principal;
mod problem;
mod recover;
mod stored;
mod tokens;
mod tx;

pub use builder::{IdempotencyBuilder, stored_by_default};
pub use drain::Drain;
pub use layer::{IDEMPOTENCY_KEY, Idempotency, IdempotencyLayer};
pub use principal::Principal;
pub use problem::PROBLEM_TYPE_PREFIX;
pub use recover::RecoverRequest;
pub use stored::REPLAYED_HEADER;
pub use tokens::{TOKEN_HEADER, TokenEndpoint, TokenGuard, TokenGuardLayer};
pub use tx::LayerTx;

/// What the layers' services return.
type BoxFuture<T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send>>;

/// The one line of a header that must be sent once: `Ok(None)` when it is absent, `Err(lines)`
/// when the request has several lines of it. Several lines of a field are one comma-joined value
/// (RFC 9110 §5.3), which for a single-valued field (a key, a caller, a token) is no value at
/// all; taking the first line instead would let two different requests share it.
fn single_header<'a>(
    headers: &'a http::HeaderMap,
    name: &http::HeaderName,
) -> Result<Option<&'a http::HeaderValue>, usize> {
    let mut lines = headers.get_all(name).iter();
    let first = lines.next();
    match lines.count() {
        0 => Ok(first),
        more => Err(more + 1),
    }
}

/// The inner service that was polled ready, to serve this request; a fresh clone takes its place
/// and waits for the next.
fn take_ready<S: Clone>(slot: &mut S) -> S {
    let fresh = slot.clone();
    std::mem::replace(slot, fresh)
}
