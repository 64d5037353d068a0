//! Running the handler behind the Idempotency-Key layer, in lease mode (`layer.rs`) and in
//! transaction mode (`tx.rs`) alike: its response for its own client, what the record keeps of
//! it, and the answer to a refused request. [`Wire`] is what differs between HTTP and gRPC (the
//! gRPC layer runs the same flow with its own answers).

use std::future::Future;

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
pub(crate) enum Flow<E> {
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
pub(crate) fn kept(stored: Stored, body_len: usize, max_body: usize, store_limit: usize) -> Stored {
    let fits = body_len <= max_body
        && (stored.json_len_bound() + 64 <= store_limit
            || serde_json::to_vec(&stored).is_ok_and(|json| json.len() + 64 <= store_limit));
    if fits { stored } else { stored.without_body() }
}

/// Whether `stored` (any protocol's) is kept whole: its body is at most the layer's limit and the
/// record fits the store's snapshot limit, with a margin for the engine's envelope.
#[cfg(feature = "grpc")]
pub(crate) fn kept_fits<T: serde::Serialize>(stored: &T, body_len: usize, cfg: &Config) -> bool {
    body_len <= cfg.max_response_bytes
        && serde_json::to_vec(stored)
            .is_ok_and(|json| json.len() + 64 <= cfg.store.limits().max_snapshot_len)
}

/// `e` with a repeat told the first is still running given the route's recent duration as its
/// wait (bounded by the first's lease), not the rest of the lease.
pub(crate) fn hinted(cfg: &Config, route: &str, e: &IdemError) -> Option<IdemError> {
    match e {
        IdemError::InProgress { retry_after } => Some(IdemError::InProgress {
            retry_after: cfg.durations.hint(route, *retry_after),
        }),
        _ => None,
    }
}

/// A handler's run: its response for its own client, and what the record keeps of it (`None`
/// when it is not stored).
pub(crate) type HandlerRun<Stored> = (Response<Body>, Option<Stored>);

/// What the layer's flow (claim, run, store, replay, refuse) says and keeps in one protocol's
/// terms: HTTP's responses and problems here, gRPC's messages and statuses in `crate::grpc`.
pub(crate) trait Wire: Sync {
    /// What a record keeps of a response.
    type Stored: serde::Serialize + serde::de::DeserializeOwned + Send + Sync + 'static;

    /// Runs the handler: its response for its own client, and what the record keeps of it
    /// (`None` when it is not stored).
    fn run<S, B>(
        &self,
        cfg: &Config,
        inner: &mut S,
        req: Request<Body>,
        route: &str,
    ) -> impl Future<Output = Result<HandlerRun<Self::Stored>, S::Error>> + Send
    where
        S: Service<Request<Body>, Response = Response<B>> + Send,
        S::Future: Send,
        B: http_body::Body<Data = Bytes> + Send + 'static,
        B::Error: Into<crate::BoxError>;

    /// A stored response, again, marked as a replay.
    fn replay(&self, stored: &Self::Stored) -> Response<Body>;

    /// The answer to a request idem refused or could not serve.
    fn error(&self, e: &IdemError) -> Response<Body>;

    /// A retry that took over a dead handler's request could not learn from the recover fn
    /// whether it had its effect; nothing ran.
    fn recover_failed(&self) -> Response<Body>;

    /// A fault the client cannot act on.
    fn internal(&self) -> Response<Body>;

    /// The caller is over its cap of new records; it may try again after `wait`.
    fn too_many_keys(&self, wait: std::time::Duration) -> Response<Body>;

    /// The answer to a refused request: [`Wire::error`], a repeat told the first is still running
    /// given the route's recent duration to wait.
    fn refusal(&self, cfg: &Config, route: &str, e: &IdemError) -> Response<Body> {
        self.error(hinted(cfg, route, e).as_ref().unwrap_or(e))
    }
}

/// HTTP's answers: problem+json bodies, the stored response with `Idempotent-Replayed: true`.
pub(super) struct Http;

impl Wire for Http {
    type Stored = Stored;

    fn run<S, B>(
        &self,
        cfg: &Config,
        inner: &mut S,
        req: Request<Body>,
        route: &str,
    ) -> impl Future<Output = Result<HandlerRun<Stored>, S::Error>> + Send
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

/// The answer to a lease-mode request from what its call came to (`result`) and the handler's own
/// response when it ran for this request (`live`).
pub(crate) fn lease_answer<W: Wire, E>(
    wire: &W,
    cfg: &Config,
    route: &str,
    result: Result<W::Stored, Flow<E>>,
    live: Option<Response<Body>>,
) -> Result<Response<Body>, E> {
    match (result, live) {
        (Err(Flow::Inner(e)), _) => Err(e),
        // The handler ran for this request: its client gets its response, whatever became of the
        // record (stored, not stored, or another attempt's by now).
        (Ok(_) | Err(Flow::NotStored), Some(response)) => Ok(response),
        (Err(Flow::Idem(e)), Some(response)) => {
            tracing::warn!(error = %e, "the handler ran but its response could not be recorded");
            Ok(response)
        }
        (Ok(stored), None) => Ok(wire.replay(&stored)),
        (Err(Flow::Idem(e)), None) => Ok(wire.refusal(cfg, route, &e)),
        (Err(Flow::Recover(e)), _) => {
            tracing::warn!(error = %e, "the recover fn could not tell whether the request's action happened; answering that nothing ran");
            Ok(wire.recover_failed())
        }
        (Err(Flow::NotStored), None) => Ok(wire.internal()),
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
