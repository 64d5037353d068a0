//! The Idempotency-Key layer's configuration: [`IdempotencyBuilder`], checked once by `build()`
//! at start-up, and the settings every request reads.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderName, Method, StatusCode, header};

use super::cap::Cap;
use super::config::{self, Config, IDEMPOTENCY_KEY};
use super::layer::IdempotencyLayer;
use super::principal::Principal;
use super::recover::{RecoverFn, RecoverRequest};
use super::stored;
use crate::engine::Heartbeat;
use crate::{IdemError, IntoSharedStore, Store, duration};

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

/// Which responses the layer stores by default (see [`IdempotencyBuilder::store_if`]): every
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
    fingerprint_headers: Vec<HeaderName>,
    canonical_json: bool,
    store_if: fn(StatusCode) -> bool,
    principal: Option<Principal>,
    ttl: Duration,
    result_ttl: Option<Duration>,
    lease: Duration,
    heartbeat: Heartbeat,
    wait: Option<Duration>,
    store_timeout: Duration,
    cap: Option<(u32, Duration)>,
    recover: Option<RecoverFn>,
    tx: Option<config::Begin>,
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

    /// Also counts this request header in the fingerprint (by default: method, path with query,
    /// `Content-Type` and body), so a repeat that sends another value of it gets 422
    /// `payload-mismatch` instead of the first response. For headers that change what the handler
    /// does (`Accept`, an API version header); never for ones that change on every try (a
    /// timestamp, a trace id).
    pub fn fingerprint_header(mut self, name: HeaderName) -> Self {
        if !self.fingerprint_headers.contains(&name) {
            self.fingerprint_headers.push(name);
        }
        self
    }

    /// Compares JSON bodies byte for byte. By default a body whose `Content-Type` is JSON
    /// (`application/json`, `…+json`) and that parses counts in its canonical form (members
    /// sorted, no insignificant whitespace), as the attribute's payloads do: the same JSON with
    /// members in another order or other spacing replays instead of answering 422.
    pub fn byte_exact_bodies(mut self) -> Self {
        self.canonical_json = false;
        self
    }

    /// Which responses are stored and replayed: `policy(status)` true stores it; false releases
    /// the key (the record is marked failed, nothing is kept) so a retry runs the handler again,
    /// as after a 5xx. The default is [`stored_by_default`] (every status below 500 but the
    /// refusals that mean the handler did nothing: 400, 401, 403, 404, 405, 406, 408, 411, 412,
    /// 413, 414, 415, 421, 422, 423, 425, 428, 429, 431). A 5xx is never stored, and neither is a
    /// response with `Cache-Control: no-store`, whatever the policy says.
    ///
    /// ```
    /// # use idem_runtime as idem;
    /// # fn demo(builder: idem::http::IdempotencyBuilder) {
    /// use idem::http::stored_by_default;
    /// // Also keep 404 (a resource that cannot appear later under the same key):
    /// let builder = builder.store_if(|s| s.as_u16() == 404 || stored_by_default(s));
    /// # let _ = builder; }
    /// ```
    pub fn store_if(mut self, policy: fn(StatusCode) -> bool) -> Self {
        self.store_if = policy;
        self
    }

    /// How long a record lives (default 24 hours): a repeat after that runs again. Longer than
    /// the lease, at most [`crate::MAX_DURATION`].
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// Keeps a stored response for replay only this long after its request finished, while the
    /// key stays used for the whole [`ttl`](Self::ttl) (see [`crate::Call::result_ttl`]): a
    /// repeat after it, and before the ttl ends, is answered `410 Gone` with the problem type
    /// `urn:idem:problem:result-expired`, and the handler does not run. Default: as long as the
    /// ttl. 1 ms ..= the ttl.
    pub fn result_ttl(mut self, result_ttl: Duration) -> Self {
        self.result_ttl = Some(result_ttl);
        self
    }

    /// How long a request in progress holds its key before another may take over (default 30 s):
    /// longer than your slowest handler. 1 ms ..= [`crate::MAX_DURATION`], and shorter than the
    /// ttl.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// Renews the lease every `every` while the handler runs, instead of every third of the
    /// lease (the default), so a slow but healthy handler is not taken over by a retry. At least
    /// 1 ms and shorter than the lease.
    pub fn heartbeat(mut self, every: Duration) -> Self {
        self.heartbeat = Heartbeat::Every(every);
        self
    }

    /// Never renews the lease: a handler slower than its lease may be taken over by a retry while
    /// it still runs, and run twice.
    pub fn no_heartbeat(mut self) -> Self {
        self.heartbeat = Heartbeat::Off;
        self
    }

    /// Asks `recover` before a handler runs again for a request that may already have had its
    /// effect: a retry that takes over the record of a request whose handler died (a crash, a
    /// kill) or could not store its response. `recover` answers whether the request's action
    /// happened (the order row exists, the payment went through) with the response to give:
    /// `Ok(Some(response))` is stored and returned (marked `Idempotent-Replayed: true`, as the
    /// first request's answer), `Ok(None)` runs the handler, `Err(_)` (or a 5xx response: it
    /// cannot be stored) answers 503 `recover-failed` with `Retry-After` and runs nothing; the
    /// record is released and the next retry asks again. Only lease-mode takeovers ask: a first
    /// request, a replay and a retry after a 5xx never do.
    ///
    /// ```no_run
    /// # use idem_runtime as idem;
    /// # fn demo(builder: idem::http::IdempotencyBuilder) {
    /// use axum::response::IntoResponse;
    /// use idem::http::RecoverRequest;
    /// let builder = builder.recover(|req: RecoverRequest| async move {
    ///     // Look the order up by the client's key (the handler stored it with the order).
    ///     let found: Option<String> = None; // e.g. SELECT … WHERE idempotency_key = req.key
    ///     Ok(found.map(|order| (http::StatusCode::CREATED, order).into_response()))
    /// });
    /// # let _ = builder; }
    /// ```
    pub fn recover<F, Fut>(mut self, recover: F) -> Self
    where
        F: Fn(RecoverRequest) -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<
                Output = Result<Option<http::Response<axum::body::Body>>, crate::BoxError>,
            > + Send
            + 'static,
    {
        self.recover = Some(super::recover::boxed(recover));
        self
    }

    /// A repeat that arrives while the first request runs waits up to `max` for it to finish and
    /// then gets its response, instead of 409 `in-progress` at once. 0 ..=
    /// [`crate::MAX_DURATION`].
    pub fn wait(mut self, max: Duration) -> Self {
        self.wait = Some(max);
        self
    }

    /// Bounds each of a request's store steps (its claim or replay, each renewal, its mark; in
    /// transaction mode also the `BEGIN` and the commit), as [`Call::store_timeout`](crate::Call::store_timeout):
    /// a store that does not answer in time gets the client 503 with `Retry-After` instead of a
    /// hang. Default [`crate::store::DEFAULT_STORE_TIMEOUT`] (10 s); 1 ms ..= [`crate::MAX_DURATION`].
    pub fn store_timeout(mut self, timeout: Duration) -> Self {
        self.store_timeout = timeout;
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
        crate::engine::check_durations(self.ttl, self.lease, self.wait, self.heartbeat.given())?;
        crate::engine::check_store_timeout(self.store_timeout)?;
        if let Some(kept) = self.result_ttl {
            crate::engine::check_result_ttl(kept, self.ttl)?;
        }
        if self.tx.is_some() && self.recover.is_some() {
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
                fingerprint_headers: self.fingerprint_headers,
                canonical_json: self.canonical_json,
                store_if: self.store_if,
                durations: super::hint::Durations::default(),
                principal,
                ttl: self.ttl,
                result_ttl: self.result_ttl,
                lease: self.lease,
                heartbeat: self.heartbeat,
                wait: self.wait,
                store_timeout: self.store_timeout,
                cap,
                recover: self.recover,
                tx: self.tx,
                inflight: Arc::default(),
            }),
        })
    }
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
            recover: None,
            tx: None,
        }
    }

    /// A builder for a layer in transaction mode on `store` (SQLite, MySQL / MariaDB, Postgres,
    /// or an `EncryptedStore` over one): for each covered request the layer begins a transaction
    /// on the store, claims the key in it, and hands it to the handler as a
    /// [`LayerTx`](super::LayerTx) extractor for the handler's own writes. When the handler
    /// answers, the layer stores the response in the same transaction and commits: the writes
    /// and the stored response commit together or not at all. A response that is not stored (a
    /// 5xx, a status the policy leaves out, `no-store`), a panic, a process that dies, roll
    /// everything back: nothing written, nothing stored, and a retry runs from the start. A
    /// concurrent duplicate waits in the database for the first transaction (bounded by its lock
    /// timeout: MySQL's `innodb_lock_wait_timeout`, SQLite's busy timeout, Postgres's
    /// `lock_timeout` if set), then replays its response. Each waiting duplicate holds a
    /// connection of the store's pool meanwhile.
    ///
    /// The handler's writes must go through the [`LayerTx`](super::LayerTx) (not the
    /// pool) to commit with the response. [`recover`](IdempotencyBuilder::recover) is for lease
    /// mode and is refused here: a holder that dies takes its transaction with it.
    ///
    /// ```no_run
    /// # use idem_runtime as idem;
    /// # async fn demo() -> Result<(), idem::IdemError> {
    /// use axum::{Router, routing::post};
    /// use idem::http::{IdempotencyLayer, LayerTx, Principal};
    /// use idem::{SqliteStore, SqliteTx};
    ///
    /// async fn create(mut tx: LayerTx<SqliteTx>) -> Result<String, String> {
    ///     idem::sqlx::query("INSERT INTO orders (item) VALUES ('tv')")
    ///         .execute(tx.conn())
    ///         .await
    ///         .map_err(|e| e.to_string())?;
    ///     Ok("created".to_owned())
    /// }
    ///
    /// let store = SqliteStore::open("shop.db").await?;
    /// store.migrate().await?;
    /// let layer = IdempotencyLayer::builder_tx(store)
    ///     .principal(Principal::header(http::HeaderName::from_static("x-user-id")))
    ///     .build()?;
    /// let app: Router = Router::new().route("/orders", post(create)).layer(layer);
    /// # Ok(()) }
    /// ```
    pub fn builder_tx<S>(store: S) -> IdempotencyBuilder
    where
        S: crate::TransactionalStore,
        S::Tx: crate::StoreTx + 'static,
    {
        let store = Arc::new(store);
        let mut builder = IdempotencyLayer::builder(Arc::clone(&store));
        builder.tx = Some(config::begin_on(store));
        builder
    }
}
