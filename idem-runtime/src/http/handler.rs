//! Running the handler behind the Idempotency-Key layer, in lease mode (`layer.rs`) and in
//! transaction mode (`tx.rs`) alike: its response for its own client, what the record keeps of
//! it, and the answer to a refused request.

use axum::body::Body;
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::BodyExt;
use tower::Service;

use super::config::Config;
use super::problem::{self, problem};
use super::stored::Stored;
use crate::IdemError;

/// Why the layer's body (the handler) did not give a response to store.
pub(super) enum Flow<E> {
    Idem(IdemError),
    /// The handler's service failed.
    Inner(E),
    /// The handler answered what is not stored (a 5xx, a status the storage policy leaves out, a
    /// `Cache-Control: no-store` response): the record is marked failed, a retry runs again.
    NotStored,
    /// The recover fn could not tell whether the first request's action happened.
    Recover(crate::BoxError),
}

impl<E> From<IdemError> for Flow<E> {
    fn from(e: IdemError) -> Self {
        Flow::Idem(e)
    }
}

/// Whether a response says it must not be stored (`Cache-Control: no-store`, RFC 9111 §5.2.2.5).
fn no_store(headers: &http::HeaderMap) -> bool {
    headers
        .get_all(http::header::CACHE_CONTROL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|directive| directive.trim().eq_ignore_ascii_case("no-store"))
}

/// `stored` as the record keeps it: without its body when the body is over `max_body` bytes or
/// the whole would not fit the store's snapshot limit (the engine wraps the snapshot in a few
/// bytes of envelope; a margin is kept for it).
pub(super) fn kept(stored: Stored, body_len: usize, max_body: usize, store_limit: usize) -> Stored {
    let fits = body_len <= max_body
        && (stored.json_len_bound() + 64 <= store_limit
            || serde_json::to_vec(&stored).is_ok_and(|json| json.len() + 64 <= store_limit));
    if fits { stored } else { stored.without_body() }
}

/// The problem for a refused request; a repeat told the first is still running gets the route's
/// recent duration as `Retry-After` (bounded by the first's lease), not the rest of the lease.
pub(super) fn refusal(cfg: &Config, route: &str, e: &IdemError) -> Response<Body> {
    match e {
        IdemError::InProgress { retry_after } => {
            let retry_after = cfg.durations.hint(route, *retry_after);
            problem::from_idem(&IdemError::InProgress { retry_after })
        }
        e => problem::from_idem(e),
    }
}

/// Runs the handler: the response for its own client, and what the record keeps of it (`None`
/// when it is not stored: a 5xx, a status the storage policy leaves out, `Cache-Control:
/// no-store`, a body that failed).
pub(super) async fn run_handler<S, B>(
    cfg: &Config,
    inner: &mut S,
    req: Request<Body>,
    route: &str,
) -> Result<(Response<Body>, Option<Stored>), S::Error>
where
    S: Service<Request<Body>, Response = Response<B>> + Send,
    S::Future: Send,
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<crate::BoxError>,
{
    let started = std::time::Instant::now();
    let response = inner.call(req).await?;
    let (head, body) = response.into_parts();
    let bytes = match body.collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(e) => {
            let e: crate::BoxError = e.into();
            tracing::error!(error = %e, "the handler's response body failed; the request is marked failed");
            let failed = problem(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                "Internal error",
                "the response could not be produced",
            );
            return Ok((failed, None));
        }
    };
    cfg.durations.record(route, started.elapsed());
    let keep =
        !head.status.is_server_error() && (cfg.store_if)(head.status) && !no_store(&head.headers);
    let stored = keep.then(|| {
        let stored = Stored::of(head.status, &head.headers, &bytes, &cfg.keep_headers);
        kept(
            stored,
            bytes.len(),
            cfg.max_response_bytes,
            cfg.store.limits().max_snapshot_len,
        )
    });
    Ok((Response::from_parts(head, Body::from(bytes)), stored))
}
