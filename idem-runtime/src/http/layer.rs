//! The Idempotency-Key layer: its configuration (a builder checked at start-up) and the tower
//! service that claims, runs, stores and replays.

use std::borrow::Cow;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use bytes::Bytes;
use http::{HeaderName, Method, Request, Response, StatusCode, header};
use http_body_util::BodyExt;
use tower::{Layer, Service};

use super::BoxFuture;
use super::cap::Cap;
use super::key;
use super::principal::Principal;
use super::problem::{self, problem};
use super::stored::{self, Stored};
use crate::{Call, IdemError, IntoSharedStore, Store, duration};

/// The header a client sends its key in.
pub const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");

/// Response headers stored and replayed by default (never `Set-Cookie`: a session must not be
/// handed out again; see [`IdempotencyBuilder::keep_header`] for every header never kept).
const KEPT_HEADERS: [HeaderName; 7] = [
    header::CONTENT_TYPE,
    header::CONTENT_LANGUAGE,
    header::CONTENT_LOCATION,
    header::LOCATION,
    header::ETAG,
    header::LAST_MODIFIED,
    header::LINK,
];

/// The layer's settings, shared by every request.
pub(crate) struct Config {
    store: Arc<dyn Store>,
    biz: Cow<'static, str>,
    pub(crate) header: HeaderName,
    pub(crate) body_field: Option<String>,
    required: bool,
    methods: Vec<Method>,
    pub(crate) max_key_len: usize,
    max_request_bytes: usize,
    max_response_bytes: usize,
    keep_headers: Vec<HeaderName>,
    principal: Principal,
    ttl: Duration,
    lease: Duration,
    heartbeat: Option<Duration>,
    wait: Option<Duration>,
    cap: Option<Arc<Cap>>,
}

/// Builds an [`IdempotencyLayer`]; [`IdempotencyBuilder::build`] checks the whole configuration
/// at start-up.
#[must_use]
pub struct IdempotencyBuilder {
    store: Arc<dyn Store>,
    biz: Cow<'static, str>,
    body_field: Option<String>,
    required: bool,
    methods: Vec<Method>,
    max_key_len: usize,
    max_request_bytes: usize,
    max_response_bytes: usize,
    keep_headers: Vec<HeaderName>,
    principal: Option<Principal>,
    ttl: Duration,
    lease: Duration,
    heartbeat: Option<Duration>,
    wait: Option<Duration>,
    cap: Option<(u32, Duration)>,
}

impl IdempotencyBuilder {
    /// The business type of the layer's records (default `HTTP`): layers with different ones keep
    /// separate key spaces in one store.
    pub fn biz(mut self, biz: impl Into<Cow<'static, str>>) -> Self {
        self.biz = biz.into();
        self
    }

    /// Who is calling (required): see [`Principal`]. Without it [`build`](Self::build) fails,
    /// unless you opt out with [`Principal::unscoped`] and say why.
    pub fn principal(mut self, principal: Principal) -> Self {
        self.principal = Some(principal);
        self
    }

    /// Also takes the key from this field of a JSON body (a JSON pointer such as `/request_id`)
    /// when the `Idempotency-Key` header is missing: proxies have been seen to strip headers.
    pub fn body_key(mut self, pointer: impl Into<String>) -> Self {
        self.body_field = Some(pointer.into());
        self
    }

    /// Lets requests without a key through without idempotency (by default they get 400).
    pub fn key_optional(mut self) -> Self {
        self.required = false;
        self
    }

    /// The methods the layer acts on (default POST and PATCH; others pass through untouched).
    pub fn methods(mut self, methods: impl IntoIterator<Item = Method>) -> Self {
        self.methods = methods.into_iter().collect();
        self
    }

    /// Longest client key in bytes (default 255).
    pub fn max_key_len(mut self, bytes: usize) -> Self {
        self.max_key_len = bytes;
        self
    }

    /// Largest request body in bytes (default 1 MiB; larger ones get 413). The layer reads the
    /// body to fingerprint it.
    pub fn max_request_bytes(mut self, bytes: usize) -> Self {
        self.max_request_bytes = bytes;
        self
    }

    /// Largest response body kept for replay (default 48 KiB, and never more than the store's
    /// snapshot limit allows). A larger response reaches its client, the record is kept as done
    /// with status and headers only, and repeats get 409 `response-not-kept`: the request is not
    /// run twice.
    pub fn max_response_bytes(mut self, bytes: usize) -> Self {
        self.max_response_bytes = bytes;
        self
    }

    /// Also stores and replays this response header (by default: `Content-Type`,
    /// `Content-Language`, `Content-Location`, `Location`, `ETag`, `Last-Modified`, `Link`). A
    /// header already kept is kept once.
    ///
    /// These are never kept, and [`build`](Self::build) refuses them with
    /// [`IdemError::InvalidOptions`] naming the header and why:
    ///
    /// - `Set-Cookie`, `Set-Cookie2`: the first response's session; a replay would hand it to
    ///   whoever repeats the request;
    /// - `Authorization`, `Proxy-Authorization`, `Cookie`: credentials, never response headers;
    /// - `Authentication-Info`, `Proxy-Authentication-Info`: they authenticate one exchange
    ///   (RFC 9110 §11.6.3);
    /// - hop-by-hop headers, which describe one connection: `Connection`, `Keep-Alive`,
    ///   `Proxy-Connection`, `Proxy-Authenticate`, `TE`, `Upgrade`;
    /// - framing, which the server computes for the body it sends: `Transfer-Encoding`,
    ///   `Content-Length`, `Trailer` (a stored response has no trailers);
    /// - the layer's own `Idempotent-Replayed`.
    ///
    /// `WWW-Authenticate` may be kept: a challenge carries no secret. A record that holds one of
    /// the headers above (written by an older version) never replays it.
    pub fn keep_header(mut self, name: HeaderName) -> Self {
        self.keep_headers.push(name);
        self
    }

    /// How long a record lives (default 24 hours): a repeat after that runs again. Longer than
    /// the lease, at most [`crate::MAX_DURATION`].
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// How long a request in progress holds its key before another may take over (default 30 s):
    /// longer than your slowest handler. 1 ms ..= [`crate::MAX_DURATION`], and shorter than the
    /// ttl.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// Renews the lease every `every` while the handler runs (a third of the lease is usual), so
    /// a slow but healthy handler is not taken over by a retry. At least 1 ms and shorter than the
    /// lease.
    pub fn heartbeat(mut self, every: Duration) -> Self {
        self.heartbeat = Some(every);
        self
    }

    /// A repeat that arrives while the first request runs waits up to `max` for it to finish and
    /// then gets its response, instead of 409 `in-progress` at once. 0 ..=
    /// [`crate::MAX_DURATION`].
    pub fn wait(mut self, max: Duration) -> Self {
        self.wait = Some(max);
        self
    }

    /// At most `max` new records per caller per `window`, counted in this process (each process
    /// of a service has its own budget); beyond it a request for a new key gets 429 with
    /// `Retry-After` before anything is written. Repeats of requests that have a record (replays,
    /// retries) do not count and are not refused. `max` at least 1, `window` 1 ms ..=
    /// [`crate::MAX_DURATION`].
    pub fn cap_per_principal(mut self, max: u32, window: Duration) -> Self {
        self.cap = Some((max, window));
        self
    }

    /// Checks the configuration and builds the layer.
    ///
    /// # Errors
    /// [`IdemError::InvalidOptions`] when no [`Principal`] was given (a layer that stores
    /// responses must know whose they are), an unscoped opt-out has no reason, no method is
    /// covered, the body field is not a JSON pointer, a limit is zero, the cap is empty, a
    /// duration is outside its range (see each setter), or a header that is never kept was given
    /// to [`keep_header`](Self::keep_header); [`IdemError::InvalidBiz`] for a bad business type.
    pub fn build(self) -> Result<IdempotencyLayer, IdemError> {
        let invalid = |reason: &str| {
            Err(IdemError::InvalidOptions {
                reason: reason.to_owned(),
            })
        };
        let Some(principal) = self.principal else {
            return invalid(
                "the Idempotency-Key layer stores responses, so it must know whose: give it `.principal(Principal::extension::<User>())` (or `header`, `from_fn`), or opt out with `.principal(Principal::unscoped(\"why no caller can see another's responses\"))`",
            );
        };
        if principal
            .unscoped_reason()
            .is_some_and(|why| why.trim().is_empty())
        {
            return invalid(
                "`Principal::unscoped` needs a reason: say in the code why callers cannot read each other's responses",
            );
        }
        crate::validate_biz(&self.biz, self.store.limits().max_biz_len)?;
        if self.methods.is_empty() {
            return invalid(
                "the layer covers no method; leave the default (POST, PATCH) or name some",
            );
        }
        if let Some(field) = &self.body_field
            && !field.starts_with('/')
        {
            return invalid("the body key field must be a JSON pointer such as `/request_id`");
        }
        if self.max_key_len == 0 || self.max_request_bytes == 0 {
            return invalid("the key and request size limits must be above zero");
        }
        crate::engine::check_durations(self.ttl, self.lease, self.wait, self.heartbeat)?;
        let cap = match self.cap {
            Some((0, _)) => return invalid("a cap of 0 records refuses every request"),
            Some((max, window)) => {
                duration::check(
                    "the cap's window",
                    window,
                    Duration::from_millis(1),
                    "shorter than 1 ms: every request would start a new window",
                )?;
                Some(Arc::new(Cap::new(max, window)))
            }
            None => None,
        };
        let mut keep_headers: Vec<HeaderName> = Vec::with_capacity(self.keep_headers.len());
        for name in self.keep_headers {
            if let Some(why) = stored::never_kept(&name) {
                return invalid(&format!(
                    "`keep_header({name})` is refused: the `{name}` header is never kept, since {why}"
                ));
            }
            if !keep_headers.contains(&name) {
                keep_headers.push(name);
            }
        }
        Ok(IdempotencyLayer {
            cfg: Arc::new(Config {
                store: self.store,
                biz: self.biz,
                header: IDEMPOTENCY_KEY,
                body_field: self.body_field,
                required: self.required,
                methods: self.methods,
                max_key_len: self.max_key_len,
                max_request_bytes: self.max_request_bytes,
                max_response_bytes: self.max_response_bytes,
                keep_headers,
                principal,
                ttl: self.ttl,
                lease: self.lease,
                heartbeat: self.heartbeat,
                wait: self.wait,
                cap,
            }),
        })
    }
}

/// A tower [`Layer`] with the IETF HTTPAPI `Idempotency-Key` semantics, for axum routers (and any
/// tower service on `http` types):
///
/// - the key comes from the `Idempotency-Key` header (a structured-field string; a bare value is
///   accepted too) or from a configured JSON body field; a covered request (POST, PATCH) without
///   one gets 400;
/// - the caller ([`Principal`]) is part of the record's identity, so clients never share keys;
/// - the first request runs the handler; its response (status, kept headers, body) is stored, and
///   every repeat gets it again with `Idempotent-Replayed: true`;
/// - a repeat while the first is still running gets 409 with `Retry-After`; the same key with
///   another method, path or body gets 422;
/// - a 5xx response is not stored (the record is marked failed, so a retry runs again); a response
///   body over the size limit is not kept: repeats get 409 `response-not-kept`, and the handler
///   does not run twice;
/// - the handler runs on its own task: a client that goes away (a gateway timeout) does not cancel
///   it, so its response is stored and the retry gets it;
/// - every error is an `application/problem+json` body.
///
/// ```no_run
/// # async fn demo() -> Result<(), idem_runtime::IdemError> {
/// use axum::{Router, routing::post};
/// use idem_runtime::http::{IdempotencyLayer, Principal};
///
/// let store = idem_runtime::SqliteStore::open("idem.db").await?;
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
    cfg: Arc<Config>,
}

impl IdempotencyLayer {
    /// A builder for a layer keeping its records in `store`.
    pub fn builder(store: impl IntoSharedStore) -> IdempotencyBuilder {
        IdempotencyBuilder {
            store: store.into_shared(),
            biz: Cow::Borrowed("HTTP"),
            body_field: None,
            required: true,
            methods: vec![Method::POST, Method::PATCH],
            max_key_len: 255,
            max_request_bytes: 1 << 20,
            max_response_bytes: 48 << 10,
            keep_headers: KEPT_HEADERS.to_vec(),
            principal: None,
            ttl: Duration::from_secs(24 * 3600),
            lease: crate::DEFAULT_LEASE,
            heartbeat: None,
            wait: None,
            cap: None,
        }
    }
}

impl<S> Layer<S> for IdempotencyLayer {
    type Service = Idempotency<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Idempotency {
            inner,
            cfg: Arc::clone(&self.cfg),
        }
    }
}

/// The service [`IdempotencyLayer`] wraps around a handler.
#[derive(Clone)]
pub struct Idempotency<S> {
    inner: S,
    cfg: Arc<Config>,
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
        let inner = super::take_ready(&mut self.inner);
        let cfg = Arc::clone(&self.cfg);
        // On its own task: when the client goes away (a gateway timeout that was really a
        // success), the handler still finishes and its response is stored, so the retry replays
        // it instead of finding a claim that holds the key until its lease expires.
        let task = tokio::spawn(handle(cfg, inner, req));
        Box::pin(async move {
            match task.await {
                Ok(response) => response,
                Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
                Err(_) => Ok(problem(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "shutting-down",
                    "Try again",
                    "the service is shutting down",
                )),
            }
        })
    }
}

/// Why the layer's body (the handler) did not give a response to store.
enum Flow<E> {
    Idem(IdemError),
    /// The handler's service failed.
    Inner(E),
    /// The handler answered 5xx: not stored, the record is marked failed.
    ServerError,
}

impl<E> From<IdemError> for Flow<E> {
    fn from(e: IdemError) -> Self {
        Flow::Idem(e)
    }
}

/// Whether reading a body failed because it is over a limit (ours, or one a layer in front of us
/// set with `http_body_util::Limited`), rather than because it was cut short or reset.
fn over_limit(e: &axum::Error) -> bool {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(e) = cause {
        if e.is::<http_body_util::LengthLimitError>() {
            return true;
        }
        cause = e.source();
    }
    false
}

fn with_body<B>(response: Response<B>) -> Response<Body>
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<crate::BoxError>,
{
    response.map(Body::new)
}

async fn handle<S, B>(
    cfg: Arc<Config>,
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
        return Ok(problem(
            StatusCode::UNAUTHORIZED,
            "no-principal",
            "Caller unknown",
            "idempotent requests are kept per caller, and this request carries no caller identity",
        ));
    };
    let body = match axum::body::to_bytes(body, cfg.max_request_bytes).await {
        Ok(body) => body,
        Err(e) if over_limit(&e) => {
            return Ok(problem(
                StatusCode::PAYLOAD_TOO_LARGE,
                "request-too-large",
                "Request body too large",
                &format!(
                    "the request body is larger than the {} byte limit",
                    cfg.max_request_bytes
                ),
            ));
        }
        Err(e) => {
            // Cut short (a Content-Length longer than the body), reset, or badly framed: the
            // client's fault, and nothing was claimed or written.
            tracing::debug!(error = %e, "the request body could not be read; answering 400");
            return Ok(problem(
                StatusCode::BAD_REQUEST,
                "request-unreadable",
                "Request body unreadable",
                "the request body could not be read to its end (cut short, reset or badly framed); nothing was processed, send the whole request again",
            ));
        }
    };
    let key = match key::client_key(&cfg, &parts, &body) {
        Ok(Some(key)) => key,
        Ok(None) if !cfg.required => {
            return inner
                .call(Request::from_parts(parts, Body::from(body)))
                .await
                .map(with_body);
        }
        Ok(None) => {
            let detail = match &cfg.body_field {
                Some(field) => format!(
                    "send an Idempotency-Key header (or the JSON body field {field}) with a key unique to this request"
                ),
                None => {
                    "send an Idempotency-Key header with a key unique to this request".to_owned()
                }
            };
            return Ok(problem(
                StatusCode::BAD_REQUEST,
                "missing-key",
                "Idempotency key missing",
                &detail,
            ));
        }
        Err(e) => {
            return Ok(problem(
                StatusCode::BAD_REQUEST,
                "invalid-key",
                "Invalid idempotency key",
                &e.detail(&cfg),
            ));
        }
    };
    let record_key = key::record_key(principal.as_deref(), &key);
    let fingerprint = key::fingerprint(&parts, &body);
    let reservation = match &cfg.cap {
        None => None,
        Some(cap) => match cap.reserve(key::principal_id(principal.as_deref())) {
            Ok(slot) => Some(slot),
            // Over the cap, a repeat of a request that has a record still goes through (to its
            // replay, or its retry): the cap bounds new records, not retries.
            Err(_) if matches!(cfg.store.load(&cfg.biz, &record_key).await, Ok(Some(_))) => None,
            Err(wait) => {
                return Ok(problem::retry_after(
                    problem(
                        StatusCode::TOO_MANY_REQUESTS,
                        "too-many-keys",
                        "Too many idempotency keys",
                        "this caller made more idempotent requests in this window than the service allows; retry after the time in Retry-After",
                    ),
                    wait,
                ));
            }
        },
    };
    let req = Request::from_parts(parts, Body::from(body));
    let mut live: Option<Response<Body>> = None;
    let mut ran = false;
    let store_limit = cfg.store.limits().max_snapshot_len;
    let mut call = Call::new(cfg.biz.clone(), &record_key)
        .fingerprint_hash(fingerprint)
        .ttl(cfg.ttl)
        .lease(cfg.lease);
    if let Some(every) = cfg.heartbeat {
        call = call.heartbeat(every);
    }
    if let Some(max) = cfg.wait {
        call = call.wait(max);
    }
    let result: Result<Stored, Flow<S::Error>> = call
        .run(&*cfg.store, async {
            ran = true;
            let response = inner.call(req).await.map_err(Flow::Inner)?;
            let (head, body) = response.into_parts();
            let bytes = match body.collect().await {
                Ok(collected) => collected.to_bytes(),
                Err(e) => {
                    let e: crate::BoxError = e.into();
                    tracing::error!(error = %e, "the handler's response body failed; the request is marked failed");
                    live = Some(problem(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        "internal",
                        "Internal error",
                        "the response could not be produced",
                    ));
                    return Err(Flow::ServerError);
                }
            };
            let server_error = head.status.is_server_error();
            let stored = (!server_error)
                .then(|| Stored::of(head.status, &head.headers, &bytes, &cfg.keep_headers));
            live = Some(Response::from_parts(head, Body::from(bytes.clone())));
            let Some(stored) = stored else {
                return Err(Flow::ServerError);
            };
            // The engine wraps the snapshot in a few bytes of envelope; keep a margin for it.
            let fits = bytes.len() <= cfg.max_response_bytes
                && serde_json::to_vec(&stored).is_ok_and(|json| json.len() + 64 <= store_limit);
            Ok(if fits { stored } else { stored.without_body() })
        })
        .await;
    if !ran && let Some(slot) = reservation {
        slot.refund();
    }
    match (result, live) {
        (Err(Flow::Inner(e)), _) => Err(e),
        // The handler ran for this request: its client gets its response, whatever became of the
        // record (stored, not stored, or another attempt's by now).
        (Ok(_) | Err(Flow::ServerError), Some(response)) => Ok(response),
        (Err(Flow::Idem(e)), Some(response)) => {
            tracing::warn!(error = %e, "the handler ran but its response could not be recorded");
            Ok(response)
        }
        (Ok(stored), None) => Ok(stored.replay()),
        (Err(Flow::Idem(e)), None) => Ok(problem::from_idem(&e)),
        (Err(Flow::ServerError), None) => Ok(problem(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            "Internal error",
            "the request could not be processed",
        )),
    }
}
