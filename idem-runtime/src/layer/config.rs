//! The layers' settings as every request reads them ([`Config`]), the builder both adapters' own
//! builders fill ([`Settings`], checked once by [`Settings::build`] at start-up), the header a
//! client sends its key in, and how a layer in transaction mode begins a request's transaction.

use std::any::Any;
use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderName, Method, StatusCode};

use super::cap::Cap;
use super::drain::{Drain, Inflight};
use super::hint::Durations;
use super::principal::Principal;
use super::service::BoxFuture;
use crate::engine::Heartbeat;
use crate::store::tx::StoreTx;
use crate::{IdemError, IdemTx, Store, TransactionalStore};

/// The header a client sends its key in.
pub const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");

/// The layer's settings, shared by every request.
pub(crate) struct Config {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) biz: Cow<'static, str>,
    pub(crate) header: HeaderName,
    pub(crate) body_field: Option<String>,
    pub(crate) required: bool,
    /// HTTP's own (the gRPC layer has its methods and storage policy in `GrpcConfig`).
    #[cfg_attr(not(feature = "axum"), allow(dead_code))]
    pub(crate) methods: Vec<Method>,
    pub(crate) max_key_len: usize,
    pub(crate) max_request_bytes: usize,
    pub(crate) max_response_bytes: usize,
    /// HTTP's own (the gRPC layer has its methods and storage policy in `GrpcConfig`).
    #[cfg_attr(not(feature = "axum"), allow(dead_code))]
    pub(crate) keep_headers: Vec<HeaderName>,
    pub(crate) fingerprint_headers: Vec<HeaderName>,
    pub(crate) canonical_json: bool,
    /// HTTP's own (the gRPC layer has its methods and storage policy in `GrpcConfig`).
    #[cfg_attr(not(feature = "axum"), allow(dead_code))]
    pub(crate) store_if: fn(StatusCode) -> bool,
    pub(crate) durations: Durations,
    pub(crate) principal: Principal,
    pub(crate) ttl: Duration,
    pub(crate) result_ttl: Option<Duration>,
    pub(crate) lease: Duration,
    pub(crate) heartbeat: Heartbeat,
    pub(crate) wait: Option<Duration>,
    pub(crate) store_timeout: Duration,
    pub(crate) cap: Option<Arc<Cap>>,
    /// Transaction mode: how to begin the request's transaction.
    pub(crate) tx: Option<Begin>,
    pub(crate) inflight: Arc<Inflight>,
}

impl Config {
    /// One read of a record (no write): the store answers and is set up.
    pub(crate) async fn check(&self) -> Result<(), IdemError> {
        self.store
            .load(&self.biz, "idem-start-up-check")
            .await
            .map(drop)
    }

    /// The handle that waits for the layer's handler tasks.
    pub(crate) fn drain(&self) -> Drain {
        Drain(Arc::clone(&self.inflight))
    }
}

/// A transaction the layer can begin, lend to the handler and finish.
pub(crate) trait Lent: IdemTx + 'static {
    fn as_any(&mut self) -> &mut dyn Any;
    fn finish(self: Box<Self>, commit: bool) -> BoxFuture<Result<(), IdemError>>;
}

impl<T: IdemTx + StoreTx + 'static> Lent for T {
    fn as_any(&mut self) -> &mut dyn Any {
        self
    }

    fn finish(self: Box<Self>, commit: bool) -> BoxFuture<Result<(), IdemError>> {
        if commit {
            StoreTx::commit(self)
        } else {
            StoreTx::rollback(self)
        }
    }
}

/// Begins one transaction on the layer's store.
pub(crate) type Begin = Arc<dyn Fn() -> BoxFuture<Result<Box<dyn Lent>, IdemError>> + Send + Sync>;

/// `begin()` on `store`, erased.
pub(crate) fn begin_on<S>(store: Arc<S>) -> Begin
where
    S: TransactionalStore,
    S::Tx: StoreTx + 'static,
{
    Arc::new(move || {
        let store = Arc::clone(&store);
        Box::pin(async move {
            let tx = store.begin_tx().await?;
            Ok(Box::new(tx) as Box<dyn Lent>)
        })
    })
}
