//! The Idempotency-Key layer's configuration: [`IdempotencyBuilder`], checked once by `build()`
//! at start-up, and the settings every request reads.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderName, Method, StatusCode};

use super::layer::IdempotencyLayer;
use super::recover::{RecoverFn, RecoverRequest};
use crate::engine::Heartbeat;
use crate::layer::Principal;
use crate::layer::settings::Settings;
use crate::{IdemError, IntoSharedStore};

pub use crate::layer::settings::stored_by_default;

/// Builds an [`IdempotencyLayer`]; [`IdempotencyBuilder::build`] checks the whole configuration
/// at start-up.
#[must_use]
pub struct IdempotencyBuilder {
    settings: Settings,
    recover: Option<RecoverFn>,
}

impl IdempotencyBuilder {
    /// The business type of the layer's records (default `HTTP`): layers with different ones keep
    /// separate key spaces in one store.
    pub fn biz(mut self, biz: impl Into<Cow<'static, str>>) -> Self {
        self.settings.biz = biz.into();
        self
    }

    /// Who is calling (required): see [`Principal`]. Without it [`build`](Self::build) fails,
    /// unless you opt out with [`Principal::unscoped`] and say why.
    pub fn principal(mut self, principal: Principal) -> Self {
        self.settings.principal = Some(principal);
        self
    }

    /// Also takes the key from this field of a JSON body (a JSON pointer such as `/request_id`)
    /// when the `Idempotency-Key` header is missing: proxies have been seen to strip headers.
    pub fn body_key(mut self, pointer: impl Into<String>) -> Self {
        self.settings.body_field = Some(pointer.into());
        self
    }

    /// Lets requests without a key through without idempotency (by default they get 400).
    pub fn key_optional(mut self) -> Self {
        self.settings.required = false;
        self
    }

    /// The methods the layer acts on (default POST and PATCH; others pass through untouched).
    pub fn methods(mut self, methods: impl IntoIterator<Item = Method>) -> Self {
        self.settings.methods = methods.into_iter().collect();
        self
    }

    /// Longest client key in bytes (default 255).
    pub fn max_key_len(mut self, bytes: usize) -> Self {
        self.settings.max_key_len = bytes;
        self
    }

    /// Largest request body in bytes (default 1 MiB; larger ones get 413). The layer reads the
    /// body to fingerprint it.
    pub fn max_request_bytes(mut self, bytes: usize) -> Self {
        self.settings.max_request_bytes = bytes;
        self
    }

    /// Largest response body kept for replay (default 48 KiB, and never more than the store's
    /// snapshot limit allows). A larger response reaches its client, the record is kept as done
    /// with status and headers only, and repeats get 409 `response-not-kept`: the request is not
    /// run twice.
    pub fn max_response_bytes(mut self, bytes: usize) -> Self {
        self.settings.max_response_bytes = bytes;
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
        self.settings.keep_headers.push(name);
        self
    }

    /// Also counts this request header in the fingerprint (by default: method, path with query,
    /// `Content-Type` and body), so a repeat that sends another value of it gets 422
    /// `payload-mismatch` instead of the first response. For headers that change what the handler
    /// does (`Accept`, an API version header); never for ones that change on every try (a
    /// timestamp, a trace id).
    pub fn fingerprint_header(mut self, name: HeaderName) -> Self {
        self.settings.fingerprint_header(name);
        self
    }

    /// Compares JSON bodies byte for byte. By default a body whose `Content-Type` is JSON
    /// (`application/json`, `…+json`) and that parses counts in its canonical form (members
    /// sorted, no insignificant whitespace), as the attribute's payloads do: the same JSON with
    /// members in another order or other spacing replays instead of answering 422.
    pub fn byte_exact_bodies(mut self) -> Self {
        self.settings.canonical_json = false;
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
        self.settings.store_if = policy;
        self
    }

    /// How long a record lives (default 24 hours): a repeat after that runs again. Longer than
    /// the lease, at most [`crate::MAX_DURATION`].
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.settings.ttl = ttl;
        self
    }

    /// Keeps a stored response for replay only this long after its request finished, while the
    /// key stays used for the whole [`ttl`](Self::ttl) (see [`crate::Call::result_ttl`]): a
    /// repeat after it, and before the ttl ends, is answered `410 Gone` with the problem type
    /// `urn:idem:problem:result-expired`, and the handler does not run. Default: as long as the
    /// ttl. 1 ms ..= the ttl.
    pub fn result_ttl(mut self, result_ttl: Duration) -> Self {
        self.settings.result_ttl = Some(result_ttl);
        self
    }

    /// How long a request in progress holds its key before another may take over (default 30 s):
    /// longer than your slowest handler. 1 ms ..= [`crate::MAX_DURATION`], and shorter than the
    /// ttl.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.settings.lease = lease;
        self
    }

    /// Renews the lease every `every` while the handler runs, instead of every third of the
    /// lease (the default), so a slow but healthy handler is not taken over by a retry. At least
    /// 1 ms and shorter than the lease.
    pub fn heartbeat(mut self, every: Duration) -> Self {
        self.settings.heartbeat = Heartbeat::Every(every);
        self
    }

    /// Never renews the lease: a handler slower than its lease may be taken over by a retry while
    /// it still runs, and run twice.
    pub fn no_heartbeat(mut self) -> Self {
        self.settings.heartbeat = Heartbeat::Off;
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
        self.settings.wait = Some(max);
        self
    }

    /// Bounds each of a request's store steps (its claim or replay, each renewal, its mark; in
    /// transaction mode also the `BEGIN` and the commit), as [`Call::store_timeout`](crate::Call::store_timeout):
    /// a store that does not answer in time gets the client 503 with `Retry-After` instead of a
    /// hang. Default [`crate::store::DEFAULT_STORE_TIMEOUT`] (10 s); 1 ms ..= [`crate::MAX_DURATION`].
    pub fn store_timeout(mut self, timeout: Duration) -> Self {
        self.settings.store_timeout = timeout;
        self
    }

    /// At most `max` new records per caller per `window`, counted in this process (each process
    /// of a service has its own budget); beyond it a request for a new key gets 429 with
    /// `Retry-After` before anything is written. Repeats of requests that have a record (replays,
    /// retries) do not count and are not refused. `max` at least 1, `window` 1 ms ..=
    /// [`crate::MAX_DURATION`].
    pub fn cap_per_principal(mut self, max: u32, window: Duration) -> Self {
        self.settings.cap = Some((max, window));
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
        let cfg = self.settings.build(self.recover.is_some())?;
        Ok(IdempotencyLayer {
            cfg: Arc::new(cfg),
            recover: self.recover,
        })
    }
}

impl IdempotencyLayer {
    /// A builder for a layer keeping its records in `store`.
    pub fn builder(store: impl IntoSharedStore) -> IdempotencyBuilder {
        IdempotencyBuilder {
            settings: Settings::new(store),
            recover: None,
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
        IdempotencyBuilder {
            settings: Settings::new_tx(store),
            recover: None,
        }
    }
}
