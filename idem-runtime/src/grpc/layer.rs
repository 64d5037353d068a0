//! The gRPC layer: the tower service around a tonic server that claims, runs, stores and replays
//! unary calls, through the layer core's flow (`crate::layer`) with gRPC's answers (`wire.rs`).

use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use tonic::Code;
use tonic::body::Body;
use tower::{Layer, Service};

use super::config::{GrpcConfig, GrpcRecoverRequest};
use super::wire::{Grpc, GrpcStored, NotUnary, one_message, status};
use crate::IdemError;
use crate::layer::body::{self, Unread};
use crate::layer::config::Config;
use crate::layer::flow::{Flow, Keyed, serve_keyed};
use crate::layer::service::{BoxFuture, take_ready};
use crate::layer::{Drain, key};

/// A tower [`Layer`] that makes a tonic service's unary calls idempotent, with the HTTP layer's
/// semantics on gRPC's terms: see [the module](super).
#[derive(Clone)]
pub struct GrpcLayer {
    pub(super) cfg: Arc<Config>,
    pub(super) grpc: Arc<GrpcConfig>,
}

impl GrpcLayer {
    /// Checks at start-up that the layer's store answers and is set up, with one read of a record
    /// (no write), so a store that is unreachable or was never migrated fails the service's
    /// start instead of its first call.
    ///
    /// # Errors
    /// [`IdemError::StoreUnavailable`] when the store cannot be reached,
    /// [`IdemError::StoreSchema`] when its table is missing (run the store's `migrate()`), other
    /// store errors as they come.
    pub async fn check(&self) -> Result<(), IdemError> {
        self.cfg.check().await
    }

    /// A handle that waits, at shutdown, for the handlers this layer is running (they run on
    /// tasks of their own, so a client that goes away does not cancel them): see [`Drain`].
    pub fn drain(&self) -> Drain {
        self.cfg.drain()
    }
}

impl<S> Layer<S> for GrpcLayer {
    type Service = GrpcIdempotency<S>;

    fn layer(&self, inner: S) -> Self::Service {
        GrpcIdempotency {
            inner,
            cfg: Arc::clone(&self.cfg),
            grpc: Arc::clone(&self.grpc),
        }
    }
}

/// The service [`GrpcLayer`] wraps around a tonic server (or a tonic `Server`'s routes).
#[derive(Clone)]
pub struct GrpcIdempotency<S> {
    inner: S,
    cfg: Arc<Config>,
    grpc: Arc<GrpcConfig>,
}

impl<S, ReqBody, B> Service<Request<ReqBody>> for GrpcIdempotency<S>
where
    S: Service<Request<Body>, Response = Response<B>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Send + 'static,
    ReqBody: http_body::Body<Data = Bytes> + Send + 'static,
    ReqBody::Error: Into<crate::BoxError>,
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<crate::BoxError>,
{
    type Response = Response<Body>;
    type Error = S::Error;
    type Future = BoxFuture<Result<Response<Body>, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        let mut inner = take_ready(&mut self.inner);
        let req = req.map(Body::new);
        if self
            .grpc
            .methods
            .binary_search_by(|m| m.as_str().cmp(req.uri().path()))
            .is_err()
        {
            // Not covered (a streaming method, a read): as if the layer were not there.
            let answer = inner.call(req);
            return Box::pin(async move { answer.await.map(|r| r.map(Body::new)) });
        }
        let (cfg, grpc) = (Arc::clone(&self.cfg), Arc::clone(&self.grpc));
        // On its own task: a client that goes away (its deadline passed, a proxy timed out) does
        // not cancel the handler, so its response is stored and the retry replays it.
        let inflight = Arc::clone(&cfg.inflight);
        let work = async move { handle(&cfg, &grpc, inner, req).await };
        inflight.on_own_task(work, || {
            Ok(status(
                Code::Unavailable,
                "SHUTTING_DOWN",
                "the service is shutting down",
                None,
            ))
        })
    }
}

async fn handle<S, B>(
    cfg: &Config,
    grpc: &GrpcConfig,
    mut inner: S,
    req: Request<Body>,
) -> Result<Response<Body>, S::Error>
where
    S: Service<Request<Body>, Response = Response<B>> + Send,
    S::Future: Send,
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<crate::BoxError>,
{
    let (parts, body) = req.into_parts();
    let Ok(principal) = cfg.principal.of(&parts) else {
        return Ok(status(
            Code::Unauthenticated,
            "NO_PRINCIPAL",
            "idempotent calls are kept per caller, and this call carries no caller identity",
            None,
        ));
    };
    let body = match body::read(body, cfg.max_request_bytes, false).await {
        Ok(body) => body,
        Err(Unread::TooLarge) => {
            return Ok(status(
                Code::ResourceExhausted,
                "REQUEST_TOO_LARGE",
                &format!(
                    "the request message is larger than the {} byte limit",
                    cfg.max_request_bytes
                ),
                None,
            ));
        }
        Err(Unread::Unreadable(e)) => {
            tracing::debug!(error = %e, "the request body could not be read; answering INVALID_ARGUMENT");
            return Ok(status(
                Code::InvalidArgument,
                "REQUEST_UNREADABLE",
                "the request could not be read to its end; nothing was run, send it again",
                None,
            ));
        }
    };
    let message = match one_message(&body) {
        Ok((_, message)) => message,
        Err(why) => {
            let detail = match why {
                NotUnary::Cut => "the request's message is cut short".to_owned(),
                NotUnary::Messages(n) => format!(
                    "the request holds {n} messages; the idempotency layer covers unary calls, which send one (take streaming methods off its `method` list)"
                ),
            };
            return Ok(status(Code::InvalidArgument, "NOT_UNARY", &detail, None));
        }
    };
    let from_message = |key: Option<String>| match (key, &grpc.key_from) {
        (Some(key), _) => Ok(Some(key)),
        (None, Some(f)) => match f(&parts.headers, &message).filter(|k| !k.is_empty()) {
            Some(key) if key.len() > cfg.max_key_len => Err(key::KeyError::TooLong(key.len())),
            key => Ok(key),
        },
        (None, None) => Ok(None),
    };
    let key = match key::client_key(cfg, &parts, &body).and_then(from_message) {
        Ok(Some(key)) => key,
        Ok(None) if !cfg.required => {
            let req = Request::from_parts(parts, Body::new(Full::new(body)));
            return inner.call(req).await.map(|r| r.map(Body::new));
        }
        Ok(None) => {
            return Ok(status(
                Code::InvalidArgument,
                "MISSING_KEY",
                "send the metadata entry `idempotency-key` with a key unique to this call",
                None,
            ));
        }
        Err(e) => {
            return Ok(status(
                Code::InvalidArgument,
                "INVALID_KEY",
                &e.detail(cfg)
                    .replace("Idempotency-Key header", "idempotency-key metadata entry"),
                None,
            ));
        }
    };
    let recover = grpc.recover.as_ref().map(|recover| {
        let asked = GrpcRecoverRequest {
            key: key.clone(),
            principal: principal.clone(),
            method: parts.uri.path().to_owned(),
            metadata: parts.headers.clone(),
            message,
        };
        move || async move {
            match recover(asked).await.map_err(Flow::Recover)? {
                None => Ok(None),
                Some(message) => Ok(Some(GrpcStored::ok(&message).kept(message.len() + 5, cfg))),
            }
        }
    });
    let route = parts.uri.path().to_owned();
    let keyed = Keyed {
        record_key: key::record_key(principal.as_deref(), &key),
        fingerprint: key::with_origin(&route, &key::fingerprint(cfg, &parts, &body)),
        principal: principal.as_deref(),
        route,
    };
    let req = Request::from_parts(parts, Body::new(Full::new(body)));
    serve_keyed(&Grpc(grpc), cfg, inner, req, keyed, recover).await
}
