//! What every layer does with a request once it has its key, in lease mode (here) and in
//! transaction mode (`tx.rs`) alike: the caller's cap, the call, the handler's run, and the answer.
//! [`Wire`] is what differs between protocols: how the handler runs and what the record keeps of
//! its response, and how each answer is said (HTTP's problems, gRPC's statuses).

use std::future::Future;

use bytes::Bytes;
use http::{Request, Response};
use tower::Service;

use super::config::Config;
use super::key;
use super::tx::{self, Ran};
use crate::{Call, IdemError};

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
pub(crate) type HandlerRun<Stored, Body> = (Response<Body>, Option<Stored>);

/// What the layer's flow (claim, run, store, replay, refuse) says and keeps in one protocol's
/// terms: HTTP's responses and problems here, gRPC's messages and statuses in `crate::grpc`.
pub(crate) trait Wire<Body: Send + 'static>: Sync {
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
    ) -> impl Future<Output = Result<HandlerRun<Self::Stored, Body>, S::Error>> + Send
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

/// The answer to a lease-mode request from what its call came to (`result`) and the handler's own
/// response when it ran for this request (`live`).
pub(crate) fn lease_answer<W: Wire<Body>, Body: Send + 'static, E>(
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

/// A request the layer has the key of: whose it is, the record it claims, and what it is for.
pub(crate) struct Keyed<'a> {
    pub(crate) principal: Option<&'a str>,
    /// The record's key: the caller and the client's key, hashed.
    pub(crate) record_key: String,
    /// The route (axum's template, or the gRPC method), for the durations and the record's origin.
    pub(crate) route: String,
    /// The request's fingerprint, with its route before it.
    pub(crate) fingerprint: String,
}

/// What both layers do once a request has its key: the caller's cap, the call, the handler run
/// in transaction mode or lease mode (with `recover` asked first on a takeover), and the answer in
/// `wire`'s terms.
pub(crate) async fn serve_keyed<W, Body, S, B, R, RF>(
    wire: &W,
    cfg: &Config,
    mut inner: S,
    req: Request<Body>,
    keyed: Keyed<'_>,
    recover: Option<R>,
) -> Result<Response<Body>, S::Error>
where
    W: Wire<Body>,
    Body: Send + 'static,
    S: Service<Request<Body>, Response = Response<B>> + Send,
    S::Future: Send,
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<crate::BoxError>,
    R: FnOnce() -> RF + Send,
    RF: Future<Output = Result<Option<W::Stored>, Flow<S::Error>>> + Send,
{
    let Keyed {
        principal,
        record_key,
        route,
        fingerprint,
    } = keyed;
    let reservation = match &cfg.cap {
        None => None,
        Some(cap) => match cap.reserve(key::principal_id(principal)) {
            Ok(slot) => Some(slot),
            // Over the cap, a repeat of a request that has a record still goes through (to its
            // replay, or its retry): the cap bounds new records, not retries.
            Err(_) if matches!(cfg.store.load(&cfg.biz, &record_key).await, Ok(Some(_))) => None,
            Err(wait) => return Ok(wire.too_many_keys(wait)),
        },
    };
    let mut call = Call::new(cfg.biz.clone(), &record_key)
        .fingerprint_hash(fingerprint)
        .ttl(cfg.ttl)
        .lease(cfg.lease);
    call.more_mut().heartbeat = cfg.heartbeat;
    call = call.store_timeout(cfg.store_timeout);
    if let Some(kept) = cfg.result_ttl {
        call = call.result_ttl(kept);
    }
    if let Some(max) = cfg.wait {
        call = call.wait(max);
    }
    if let Some(begin) = &cfg.tx {
        let answer = Box::pin(tx::in_tx(wire, cfg, begin, call, inner, req, &route)).await;
        if let Some(slot) = reservation
            && !matches!(answer, Ok(Ran::Yes(_)))
        {
            slot.refund();
        }
        return answer.map(Ran::into_response);
    }
    let mut live: Option<Response<Body>> = None;
    let mut ran = false;
    let handler = async {
        ran = true;
        let (response, stored) = wire
            .run(cfg, &mut inner, req, &route)
            .await
            .map_err(Flow::Inner)?;
        live = Some(response);
        stored.ok_or(Flow::NotStored)
    };
    let result: Result<W::Stored, Flow<S::Error>> = match recover {
        // Boxed: the engine's future is kilobytes, and the request's future is moved into its task
        // (and polled through the server's layers) whole.
        None => Box::pin(call.run(&*cfg.store, handler)).await,
        Some(recover) => Box::pin(call.recover(recover).run(&*cfg.store, handler)).await,
    };
    if !ran && let Some(slot) = reservation {
        slot.refund();
    }
    lease_answer(wire, cfg, &route, result, live)
}
