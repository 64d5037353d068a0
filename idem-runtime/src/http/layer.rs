//! The Idempotency-Key layer: the tower service that reads a request's key and caller and hands
//! it to the layer core's flow (`crate::layer`), which claims, runs, stores and replays (its
//! configuration is in `builder.rs`, the handler's run in `handler.rs`).

use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::Body;
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::BodyExt;
use tower::{Layer, Service};

use super::handler::{Http, kept};
use super::problem::problem;
use super::recover::{RecoverFn, RecoverRequest};
use super::stored::Stored;
use crate::IdemError;
use crate::layer::body::{self, Unread};
use crate::layer::config::Config;
use crate::layer::flow::{Flow, Keyed, serve_keyed};
use crate::layer::service::{BoxFuture, take_ready};
use crate::layer::{Drain, key};

/// A tower [`Layer`] with the IETF HTTPAPI `Idempotency-Key` semantics, for axum routers (and any
/// tower service on `http` types):
///
/// - the key comes from the `Idempotency-Key` header (a structured-field string; a bare value is
///   accepted too) or from a configured JSON body field; a covered request (POST, PATCH) without
///   one gets 400;
/// - the caller ([`Principal`](super::Principal)) is part of the record's identity, so clients never share keys;
/// - the first request runs the handler; its response (status, kept headers, body) is stored, and
///   every repeat gets it again with `Idempotent-Replayed: true`;
/// - a repeat while the first is still running gets 409 with `Retry-After`; the same key with
///   another method, path, content type, body (JSON compared in canonical form) or fingerprinted header gets 422;
/// - a 5xx response is not stored (the record is marked failed, so a retry runs again); a response
///   body over the size limit is not kept: repeats get 409 `response-not-kept`, and the handler
///   does not run twice;
/// - the handler runs on its own task: a client that goes away (a gateway timeout) does not cancel
///   it, so its response is stored and the retry gets it;
/// - every error is an `application/problem+json` body.
///
/// ```no_run
/// # use idem_runtime as idem;
/// # async fn demo() -> Result<(), idem::IdemError> {
/// use axum::{Router, routing::post};
/// use idem::http::{IdempotencyLayer, Principal};
///
/// let store = idem::SqliteStore::open("idem.db").await?;
/// let layer = IdempotencyLayer::builder(store)
///     .principal(Principal::header(http::HeaderName::from_static("x-user-id")))
///     .build()?;
/// let app: Router = Router::new()
///     .route("/orders", post(|| async { "created" }))
///     .layer(layer);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct IdempotencyLayer {
    pub(super) cfg: Arc<Config>,
    /// Asked before a takeover runs a handler again (lease mode).
    pub(super) recover: Option<RecoverFn>,
}

impl IdempotencyLayer {
    /// Checks at start-up that the layer's store answers and is set up, with one read of a record
    /// (no write), so a store that is unreachable or was never migrated fails the service's
    /// start instead of its first request (which would get a 500 or a 503).
    ///
    /// # Errors
    /// [`IdemError::StoreUnavailable`] when the store cannot be reached,
    /// [`IdemError::StoreSchema`] when its table is missing (run the store's `migrate()`), other
    /// store errors as they come.
    pub async fn check(&self) -> Result<(), IdemError> {
        self.cfg.check().await
    }

    /// A handle that waits, at shutdown, for the handlers this layer (and every service made
    /// from it) is running: see [`Drain`].
    pub fn drain(&self) -> Drain {
        self.cfg.drain()
    }
}

impl<S> Layer<S> for IdempotencyLayer {
    type Service = Idempotency<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Idempotency {
            inner,
            cfg: Arc::clone(&self.cfg),
            recover: self.recover.clone(),
        }
    }
}

/// The service [`IdempotencyLayer`] wraps around a handler.
#[derive(Clone)]
pub struct Idempotency<S> {
    inner: S,
    cfg: Arc<Config>,
    recover: Option<RecoverFn>,
}

impl<S, B> Service<Request<Body>> for Idempotency<S>
where
    S: Service<Request<Body>, Response = Response<B>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Send + 'static,
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<crate::BoxError>,
{
    type Response = Response<Body>;
    type Error = S::Error;
    type Future = BoxFuture<Result<Response<Body>, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        let inner = take_ready(&mut self.inner);
        let cfg = Arc::clone(&self.cfg);
        let recover = self.recover.clone();
        // On its own task: when the client goes away (a gateway timeout that was really a
        // success), the handler still finishes and its response is stored, so the retry replays
        // it instead of finding a claim that holds the key until its lease expires.
        let inflight = Arc::clone(&cfg.inflight);
        inflight.on_own_task(handle(cfg, recover, inner, req), || {
            Ok(problem(
                StatusCode::SERVICE_UNAVAILABLE,
                "shutting-down",
                "Try again",
                "the service is shutting down",
            ))
        })
    }
}

/// The route a request is for, to learn its handler's durations and to say where a record came
/// from: axum's matched route when there is one (`POST /orders/{id}`), else the path.
fn route_of(parts: &http::request::Parts) -> String {
    let path = parts
        .extensions
        .get::<axum::extract::MatchedPath>()
        .map_or_else(|| parts.uri.path(), |m| m.as_str());
    format!("{} {path}", parts.method)
}

fn with_body<B>(response: Response<B>) -> Response<Body>
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<crate::BoxError>,
{
    response.map(Body::new)
}

/// A request through the layer: methods it does not cover go straight to the handler; the others
/// need a caller, a readable body and (when required) a key, then are served by [`serve_keyed`].
async fn handle<S, B>(
    cfg: Arc<Config>,
    recover: Option<RecoverFn>,
    mut inner: S,
    req: Request<Body>,
) -> Result<Response<Body>, S::Error>
where
    S: Service<Request<Body>, Response = Response<B>> + Send,
    S::Future: Send,
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<crate::BoxError>,
{
    if !cfg.methods.contains(req.method()) {
        return inner.call(req).await.map(with_body);
    }
    let (parts, body) = req.into_parts();
    let Ok(principal) = cfg.principal.of(&parts) else {
        return Ok(no_principal());
    };
    let body = match read_body(&cfg, body).await {
        Ok(body) => body,
        Err(problem) => return Ok(problem),
    };
    let key = match key::client_key(&cfg, &parts, &body) {
        Ok(Some(key)) => key,
        Ok(None) if !cfg.required => {
            return inner
                .call(Request::from_parts(parts, Body::from(body)))
                .await
                .map(with_body);
        }
        Ok(None) => return Ok(missing_key(&cfg)),
        Err(e) => {
            return Ok(problem(
                StatusCode::BAD_REQUEST,
                "invalid-key",
                "Invalid idempotency key",
                &e.detail(&cfg),
            ));
        }
    };
    let recover = recover.as_ref().map(|recover| {
        let asked = RecoverRequest {
            key: key.clone(),
            principal: principal.clone(),
            method: parts.method.clone(),
            uri: parts.uri.clone(),
            headers: parts.headers.clone(),
            body: body.clone(),
        };
        let cfg = &*cfg;
        move || recovered(cfg, recover, asked)
    });
    let route = route_of(&parts);
    let keyed = Keyed {
        record_key: key::record_key(principal.as_deref(), &key),
        fingerprint: key::with_origin(&route, &key::fingerprint(&cfg, &parts, &body)),
        principal: principal.as_deref(),
        route,
    };
    let req = Request::from_parts(parts, Body::from(body));
    serve_keyed(&Http, &cfg, inner, req, keyed, recover).await
}

/// The answer to a covered request whose caller the principal rule cannot tell.
#[cold]
fn no_principal() -> Response<Body> {
    problem(
        StatusCode::UNAUTHORIZED,
        "no-principal",
        "Caller unknown",
        "idempotent requests are kept per caller, and this request carries no caller identity",
    )
}

/// The request's body, read whole up to the layer's limit; or the problem to answer when it is
/// over the limit or cannot be read (nothing is claimed or written then).
async fn read_body(cfg: &Config, body: Body) -> Result<Bytes, Response<Body>> {
    match body::read(body, cfg.max_request_bytes, true).await {
        Ok(body) => Ok(body),
        Err(Unread::TooLarge) => Err(problem(
            StatusCode::PAYLOAD_TOO_LARGE,
            "request-too-large",
            "Request body too large",
            &format!(
                "the request body is larger than the {} byte limit",
                cfg.max_request_bytes
            ),
        )),
        Err(Unread::Unreadable(e)) => {
            // Cut short (a Content-Length longer than the body), reset, or badly framed: the
            // client's fault, and nothing was claimed or written.
            tracing::debug!(error = %e, "the request body could not be read; answering 400");
            Err(problem(
                StatusCode::BAD_REQUEST,
                "request-unreadable",
                "Request body unreadable",
                "the request body could not be read to its end (cut short, reset or badly framed); nothing was processed, send the whole request again",
            ))
        }
    }
}

/// The answer to a covered request without a key when the layer requires one.
#[cold]
fn missing_key(cfg: &Config) -> Response<Body> {
    let detail = match &cfg.body_field {
        Some(field) => format!(
            "send an Idempotency-Key header (or the JSON body field {field}) with a key unique to this request"
        ),
        None => "send an Idempotency-Key header with a key unique to this request".to_owned(),
    };
    problem(
        StatusCode::BAD_REQUEST,
        "missing-key",
        "Idempotency key missing",
        &detail,
    )
}

/// What the recover fn tells of a request taken over from a holder that went away: the response
/// to store as the first one's (kept whole only if it fits), or `None` when the action did not
/// happen. A 5xx answer, or a body that cannot be read, is a recover failure.
async fn recovered<E>(
    cfg: &Config,
    recover: &RecoverFn,
    asked: RecoverRequest,
) -> Result<Option<Stored>, Flow<E>> {
    let Some(response) = recover(asked).await.map_err(Flow::Recover)? else {
        return Ok(None);
    };
    let (head, body) = response.into_parts();
    let bytes = body
        .collect()
        .await
        .map_err(|e| Flow::Recover(e.into()))?
        .to_bytes();
    if head.status.is_server_error() {
        return Err(Flow::Recover(
            format!("the recover fn answered {}", head.status).into(),
        ));
    }
    let stored = Stored::of(head.status, &head.headers, &bytes, &cfg.keep_headers);
    let store_limit = cfg.store.limits().max_snapshot_len;
    Ok(Some(kept(
        stored,
        bytes.len(),
        cfg.max_response_bytes,
        store_limit,
    )))
}
