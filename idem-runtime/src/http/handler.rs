//! HTTP's [`Wire`]: running the handler behind the Idempotency-Key layer, in lease mode and in
//! transaction mode alike (the flow is the layer core's, `crate::layer::flow`), its response for
//! its own client, what the record keeps of it, and the answer to a refused request.

use std::future::Future;

use axum::body::Body;
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::BodyExt;
use tower::Service;

use super::problem::{self, problem};
use super::stored::Stored;
use crate::IdemError;
use crate::layer::config::Config;
use crate::layer::flow::{HandlerRun, Wire};

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
pub(crate) fn kept(stored: Stored, body_len: usize, max_body: usize, store_limit: usize) -> Stored {
    let fits = body_len <= max_body
        && (stored.json_len_bound() + 64 <= store_limit
            || serde_json::to_vec(&stored).is_ok_and(|json| json.len() + 64 <= store_limit));
    if fits { stored } else { stored.without_body() }
}

/// HTTP's answers: problem+json bodies, the stored response with `Idempotent-Replayed: true`.
pub(super) struct Http;

impl Wire<Body> for Http {
    type Stored = Stored;

    fn run<S, B>(
        &self,
        cfg: &Config,
        inner: &mut S,
        req: Request<Body>,
        route: &str,
    ) -> impl Future<Output = Result<HandlerRun<Stored, Body>, S::Error>> + Send
    where
        S: Service<Request<Body>, Response = Response<B>> + Send,
        S::Future: Send,
        B: http_body::Body<Data = Bytes> + Send + 'static,
        B::Error: Into<crate::BoxError>,
    {
        run_handler(cfg, inner, req, route)
    }

    fn replay(&self, stored: &Stored) -> Response<Body> {
        stored.replay()
    }

    fn error(&self, e: &IdemError) -> Response<Body> {
        problem::from_idem(e)
    }

    fn recover_failed(&self) -> Response<Body> {
        problem::retry_after(
            problem(
                StatusCode::SERVICE_UNAVAILABLE,
                "recover-failed",
                "Try again",
                "whether this request was already processed could not be checked; nothing was run, retry after the time in Retry-After",
            ),
            std::time::Duration::from_secs(1),
        )
    }

    fn internal(&self) -> Response<Body> {
        problem(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            "Internal error",
            "the request could not be processed",
        )
    }

    fn too_many_keys(&self, wait: std::time::Duration) -> Response<Body> {
        problem::retry_after(
            problem(
                StatusCode::TOO_MANY_REQUESTS,
                "too-many-keys",
                "Too many idempotency keys",
                "this caller made more idempotent requests in this window than the service allows; retry after the time in Retry-After",
            ),
            wait,
        )
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
