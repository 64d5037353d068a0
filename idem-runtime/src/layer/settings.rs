//! The settings both adapters' builders share (`IdempotencyBuilder` for HTTP, `GrpcLayerBuilder`
//! for gRPC), their defaults, and the checks `build()` makes of them at start-up.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderName, Method, StatusCode, header};

use super::cap::Cap;
use super::config::{self, Config, IDEMPOTENCY_KEY};
use super::hint::Durations;
use super::principal::Principal;
use super::stored::never_kept;
use crate::engine::Heartbeat;
use crate::{IdemError, IntoSharedStore, Store, duration};

/// Response headers stored and replayed by default (never `Set-Cookie`: a session must not be
/// handed out again; see [`IdempotencyBuilder::keep_header`](crate::http::IdempotencyBuilder::keep_header) for every header never kept).
const KEPT_HEADERS: [HeaderName; 7] = [
    header::CONTENT_TYPE,
    header::CONTENT_LANGUAGE,
    header::CONTENT_LOCATION,
    header::LOCATION,
    header::ETAG,
    header::LAST_MODIFIED,
    header::LINK,
];

/// Which responses the layer stores by default (see [`IdempotencyBuilder::store_if`](crate::http::IdempotencyBuilder::store_if)): every
/// status below 500 but those that say the request was refused before the handler did anything a
/// retry must not repeat, so that a client that fixes its request is not handed the refusal
/// again.
///
/// Not stored (the key is released; a retry runs the handler again): 400 Bad Request, 401
/// Unauthorized, 403 Forbidden, 404 Not Found, 405 Method Not Allowed, 406 Not Acceptable, 408
/// Request Timeout, 411 Length Required, 412 Precondition Failed, 413 Content Too Large, 414 URI
/// Too Long, 415 Unsupported Media Type, 421 Misdirected Request, 422 Unprocessable Content, 423
/// Locked, 425 Too Early, 428 Precondition Required, 429 Too Many Requests, 431 Request Header
/// Fields Too Large. Stored: 1xx–3xx, and the other 4xx, which answer the request itself (402
/// Payment Required for a declined card, 409 Conflict for an order that already exists, 410 Gone,
/// …).
///
/// The IETF draft (draft-ietf-httpapi-idempotency-key-header-07, §2.6) leaves it to the
/// resource which responses to keep; this follows Stripe's published behaviour, which keeps a
/// result only once the endpoint began to execute and not for requests that failed validation
/// or conflicted with a concurrent one. A 5xx is never stored, whatever the policy says.
pub fn stored_by_default(status: StatusCode) -> bool {
    !matches!(
        status.as_u16(),
        400 | 401
            | 403
            | 404
            | 405
            | 406
            | 408
            | 411
            | 412
            | 413
            | 414
            | 415
            | 421
            | 422
            | 423
            | 425
            | 428
            | 429
            | 431
    ) && !status.is_server_error()
}

/// The settings a layer is built from, each set by its adapter's builder.
pub(crate) struct Settings {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) biz: Cow<'static, str>,
    pub(crate) body_field: Option<String>,
    pub(crate) required: bool,
    pub(crate) methods: Vec<Method>,
    pub(crate) max_key_len: usize,
    pub(crate) max_request_bytes: usize,
    pub(crate) max_response_bytes: usize,
    pub(crate) keep_headers: Vec<HeaderName>,
    pub(crate) fingerprint_headers: Vec<HeaderName>,
    pub(crate) canonical_json: bool,
    pub(crate) store_if: fn(StatusCode) -> bool,
    pub(crate) principal: Option<Principal>,
    pub(crate) ttl: Duration,
    pub(crate) result_ttl: Option<Duration>,
    pub(crate) lease: Duration,
    pub(crate) heartbeat: Heartbeat,
    pub(crate) wait: Option<Duration>,
    pub(crate) store_timeout: Duration,
    pub(crate) cap: Option<(u32, Duration)>,
    pub(crate) tx: Option<config::Begin>,
}

impl Settings {
    /// The defaults, for a layer in lease mode keeping its records in `store`.
    pub(crate) fn new(store: impl IntoSharedStore) -> Self {
        Settings {
            store: store.into_shared(),
            biz: Cow::Borrowed("HTTP"),
            body_field: None,
            required: true,
            methods: vec![Method::POST, Method::PATCH],
            max_key_len: 255,
            max_request_bytes: 1 << 20,
            max_response_bytes: 48 << 10,
            keep_headers: KEPT_HEADERS.to_vec(),
            fingerprint_headers: Vec::new(),
            canonical_json: true,
            store_if: stored_by_default,
            principal: None,
            ttl: Duration::from_secs(24 * 3600),
            result_ttl: None,
            lease: crate::DEFAULT_LEASE,
            heartbeat: Heartbeat::Default,
            wait: None,
            store_timeout: crate::DEFAULT_STORE_TIMEOUT,
            cap: None,
            tx: None,
        }
    }

    /// The defaults, for a layer in transaction mode on `store`.
    pub(crate) fn new_tx<S>(store: S) -> Self
    where
        S: crate::TransactionalStore,
        S::Tx: crate::StoreTx + 'static,
    {
        let store = Arc::new(store);
        let mut settings = Settings::new(Arc::clone(&store));
        settings.tx = Some(config::begin_on(store));
        settings
    }

    /// Also counts the request header `name` in the fingerprint (once).
    pub(crate) fn fingerprint_header(&mut self, name: HeaderName) {
        if !self.fingerprint_headers.contains(&name) {
            self.fingerprint_headers.push(name);
        }
    }

    /// Checks the settings and makes the configuration every request reads; `recover` says
    /// whether the layer has a recover fn (refused in transaction mode).
    pub(crate) fn build(self, recover: bool) -> Result<Config, IdemError> {
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
        crate::engine::check_durations(self.ttl, self.lease, self.wait, self.heartbeat.given())?;
        crate::engine::check_store_timeout(self.store_timeout)?;
        if let Some(kept) = self.result_ttl {
            crate::engine::check_result_ttl(kept, self.ttl)?;
        }
        if self.tx.is_some() && recover {
            return invalid(
                "`recover` is for lease mode: in transaction mode a handler that dies rolls its transaction back, so there is nothing to recover; drop `.recover(…)` or build with `builder`",
            );
        }
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
            if let Some(why) = never_kept(&name) {
                return invalid(&format!(
                    "`keep_header({name})` is refused: the `{name}` header is never kept, since {why}"
                ));
            }
            if !keep_headers.contains(&name) {
                keep_headers.push(name);
            }
        }
        Ok(Config {
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
            fingerprint_headers: self.fingerprint_headers,
            canonical_json: self.canonical_json,
            store_if: self.store_if,
            durations: Durations::default(),
            principal,
            ttl: self.ttl,
            result_ttl: self.result_ttl,
            lease: self.lease,
            heartbeat: self.heartbeat,
            wait: self.wait,
            store_timeout: self.store_timeout,
            cap,
            tx: self.tx,
            inflight: Arc::default(),
        })
    }
}
