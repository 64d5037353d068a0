//! Transaction mode for the idempotency layers: the layer begins a transaction on its store,
//! claims in it, hands it to the handler ([`LayerTx`], an extractor), and after the handler
//! answers stores the response in it and commits, so the handler's writes and the stored response
//! commit together or not at all.

use std::ops::{Deref, DerefMut};
use std::sync::Arc;

use bytes::Bytes;
use http::{Request, Response};
use tokio::sync::{Mutex, OwnedMappedMutexGuard, OwnedMutexGuard};
use tower::Service;

use super::config::{Begin, Config, Lent};
use super::flow::{Flow, Wire};
use crate::{Call, IdemError, IdemTx};

/// Where the handler finds the request's transaction (a request extension), and the layer takes
/// it back once the handler answered.
#[derive(Clone)]
pub(crate) struct Slot(Arc<Mutex<Option<Box<dyn Lent>>>>);

impl Slot {
    pub(crate) fn new(tx: Box<dyn Lent>) -> Self {
        Slot(Arc::new(Mutex::new(Some(tx))))
    }

    /// The transaction back, once the handler let go of it; `None` when the handler still holds
    /// its [`LayerTx`] (it moved it into a task that outlives it: the transaction rolls back
    /// when that lets go).
    pub(crate) fn take(&self) -> Option<Box<dyn Lent>> {
        self.0.try_lock().ok()?.take()
    }
}

/// The transaction of a request behind an [`IdempotencyLayer`](crate::http::IdempotencyLayer) in
/// transaction mode ([`IdempotencyLayer::builder_tx`](crate::http::IdempotencyLayer::builder_tx)): an
/// axum extractor for the store's transaction type `T` (`idem::SqliteTx`, `idem::MySqlTx`,
/// `idem::PgTx`) that reads as `T` and gives its connection for the handler's own queries
/// ([`LayerTx::conn`]). The layer has claimed the request's key in it; once the handler answers, the layer
/// stores the response in it and commits: the handler's writes and the stored response commit
/// together, or (a 5xx, a response that is not stored, a panic) none of them does.
///
/// ```no_run
/// # use idem_runtime as idem;
/// use idem::http::LayerTx;
/// use idem::{IdemError, SqliteTx};
///
/// async fn create_order(mut tx: LayerTx<SqliteTx>) -> Result<String, String> {
///     let id: i64 = idem::sqlx::query_scalar("INSERT INTO orders (item) VALUES ('tv') RETURNING id")
///         .fetch_one(tx.conn())
///         .await
///         .map_err(|e| e.to_string())?;
///     Ok(format!("order {id}"))
/// }
/// ```
///
/// Let it go before the handler returns (do not move it into a task that outlives the handler):
/// the layer needs it back to commit. A `T` that is no transaction of a store does not compile. A
/// handler behind no layer or a layer in lease mode, or a `T` other than the layer's store's
/// transaction type (a `MySqlTx` behind a SQLite layer), is a mistake of the service that only a
/// request can show: it is answered `500` with the problem type
/// `urn:idem:problem:layer-misconfigured`, whose detail names the mistake, and logged at
/// `error` level.
pub struct LayerTx<T: 'static>(OwnedMappedMutexGuard<Option<Box<dyn Lent>>, T>);

impl<T> Deref for LayerTx<T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.0
    }
}

impl<T> LayerTx<T> {
    /// The transaction, for what takes it by `&mut` (a `#[state_transition]`, a `Call` run in it).
    pub fn get_mut(&mut self) -> &mut T {
        &mut self.0
    }

    /// The transaction's connection, for the handler's own queries: `query.execute(tx.conn())`.
    ///
    /// `LayerTx` gives it by this method rather than by `DerefMut`: a `DerefMut` to a type only
    /// known as `T` would make every blanket impl over `DerefMut` in the build (redis's
    /// `ConnectionLike`, and with it every Redis command) a candidate for its methods.
    pub fn conn(&mut self) -> &mut T::Target
    where
        T: DerefMut,
    {
        &mut self.0
    }
}

impl<T> std::fmt::Debug for LayerTx<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LayerTx")
            .field("type", &std::any::type_name::<T>())
            .finish_non_exhaustive()
    }
}

impl<T: IdemTx + Sync + 'static> LayerTx<T> {
    /// The transaction in `slot` (a request's extension), once the handler before has let it go;
    /// else why the route is misconfigured, for the service's log and the client's answer.
    pub(crate) async fn lend(slot: Option<Slot>, layer: &str) -> Result<Self, String> {
        let Some(slot) = slot else {
            return Err(format!(
                "the handler takes a `LayerTx<{}>`, but no transaction-mode idempotency layer \
                 covers this request: put it behind {layer} built with `builder_tx` (a layer \
                 built with `builder` runs in lease mode and has no transaction), and make sure \
                 the layer covers the request",
                std::any::type_name::<T>()
            ));
        };
        let guard: OwnedMutexGuard<Option<Box<dyn Lent>>> = slot.0.lock_owned().await;
        OwnedMutexGuard::try_map(guard, |tx| tx.as_mut()?.as_any().downcast_mut::<T>())
            .map(LayerTx)
            .map_err(|_| {
                format!(
                    "the handler takes a `LayerTx<{}>`, but the layer's store begins another \
                     kind of transaction: take `LayerTx` of the transaction type of the store \
                     given to `builder_tx` (`SqliteTx` for a `SqliteStore`, `MySqlTx` for a \
                     `MySqlStore`, `PgTx` for a `PgStore`)",
                    std::any::type_name::<T>()
                )
            })
    }
}

/// What a transaction-mode request came to: whether its handler ran (a cap slot is refunded
/// otherwise).
pub(crate) enum Ran<Body> {
    Yes(Response<Body>),
    No(Response<Body>),
}

impl<Body> Ran<Body> {
    pub(crate) fn into_response(self) -> Response<Body> {
        match self {
            Ran::Yes(r) | Ran::No(r) => r,
        }
    }
}

/// Transaction mode: begin, claim in the transaction, run the handler with it, then store the
/// response and commit, or roll everything back when the response is not stored; `wire` says it
/// in HTTP's or gRPC's terms.
pub(crate) async fn in_tx<W, Body, S, B>(
    wire: &W,
    cfg: &Config,
    begin: &Begin,
    call: Call,
    mut inner: S,
    mut req: Request<Body>,
    route: &str,
) -> Result<Ran<Body>, S::Error>
where
    W: Wire<Body>,
    Body: Send + 'static,
    S: Service<Request<Body>, Response = Response<B>> + Send,
    S::Future: Send,
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<crate::BoxError>,
{
    use crate::engine::bounded;
    use crate::engine::snapshot::{ErrType, OkType};
    let timeout = cfg.store_timeout;
    let rollback = async |tx: Box<dyn Lent>| {
        if let Err(e) = bounded(timeout, tx.finish(false)).await {
            tracing::warn!(error = %e, "could not roll the request's transaction back; the database rolls it back when the connection ends");
        }
    };
    let tx = match bounded(timeout, begin()).await {
        Ok(tx) => tx,
        Err(e) => return Ok(Ran::No(wire.error(&e))),
    };
    // Whether the handler ran (a replay or a refusal runs nothing), and its own response.
    let mut ran = false;
    let mut live: Option<Response<Body>> = None;
    let (ok, err) = (OkType::<W::Stored>::new(), ErrType::<Flow<S::Error>>::new());
    let (ran_ref, live_ref, inner_ref) = (&mut ran, &mut live, &mut inner);
    let (tx, result) = crate::engine::tx::run_tx(call, ok, err, tx, move |tx| async move {
        *ran_ref = true;
        let slot = Slot::new(tx);
        req.extensions_mut().insert(slot.clone());
        let answer = wire.run(cfg, inner_ref, req, route).await;
        let outcome = match answer {
            Err(e) => Err(Flow::Inner(e)),
            Ok((response, stored)) => {
                *live_ref = Some(response);
                // Not stored: the handler's writes go with it, so a retry starts from nothing.
                stored.ok_or(Flow::NotStored)
            }
        };
        (slot.take(), outcome)
    })
    .await;
    let Some(tx) = tx else {
        tracing::error!(
            "the handler kept the request's transaction past its answer; nothing is committed"
        );
        return Ok(Ran::Yes(wire.internal()));
    };
    if !ran {
        // Nothing ran: a stored response to replay, or a refusal.
        rollback(tx).await;
        return Ok(Ran::No(match result {
            Ok(stored) => wire.replay(&stored),
            Err(Flow::Idem(e)) => wire.refusal(cfg, route, &e),
            Err(_) => wire.internal(),
        }));
    }
    match (result, live) {
        // Marked in the transaction (also a response kept as not storable, which ran).
        (Ok(_) | Err(Flow::Idem(IdemError::ResultNotStorable { .. })), Some(live)) => {
            match bounded(timeout, tx.finish(true)).await {
                Ok(()) => Ok(Ran::Yes(live)),
                Err(e) => {
                    tracing::error!(error = %e, "the request's transaction did not commit; its writes and its record are gone");
                    Ok(Ran::Yes(wire.error(&e)))
                }
            }
        }
        (Err(Flow::NotStored), Some(live)) => {
            rollback(tx).await;
            Ok(Ran::Yes(live))
        }
        (Err(Flow::Inner(e)), _) => {
            rollback(tx).await;
            Err(e)
        }
        (Err(Flow::Idem(e)), _) => {
            rollback(tx).await;
            Ok(Ran::Yes(wire.error(&e)))
        }
        _ => {
            rollback(tx).await;
            Ok(Ran::Yes(wire.internal()))
        }
    }
}
