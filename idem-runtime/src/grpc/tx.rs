//! Transaction mode's transaction, for a tonic handler: the layer puts it in the request's
//! extensions, which tonic hands to the handler with the message.

use tonic::Status;

use super::wire::grpc_status;
use crate::IdemTx;
use crate::layer::LayerTx;
use crate::layer::tx::Slot;

impl<T: IdemTx + Sync + 'static> LayerTx<T> {
    /// The transaction of a call behind a [`GrpcLayer`](super::GrpcLayer) in transaction mode
    /// ([`GrpcLayer::builder_tx`](super::GrpcLayer::builder_tx)), for a tonic handler: the layer
    /// has claimed the call's key in it, and once the handler answers it stores the response in
    /// it and commits, so the handler's writes and the stored response commit together, or (a
    /// status the layer does not store, a panic) none of them does.
    ///
    /// ```no_run
    /// # use idem_runtime as idem;
    /// # struct CreateOrder { item: String }
    /// # struct Order { id: i64 }
    /// use idem::grpc::LayerTx;
    ///
    /// async fn create_order(req: tonic::Request<CreateOrder>) -> Result<tonic::Response<Order>, tonic::Status> {
    ///     let mut tx = LayerTx::<idem::SqliteTx>::from_grpc(&req).await?;
    ///     let id: i64 = idem::sqlx::query_scalar("INSERT INTO orders (item) VALUES (?1) RETURNING id")
    ///         .bind(&req.get_ref().item)
    ///         .fetch_one(tx.conn())
    ///         .await
    ///         .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
    ///     Ok(tonic::Response::new(Order { id }))
    /// }
    /// ```
    ///
    /// Let it go before the handler returns (the layer needs it back to commit).
    ///
    /// # Errors
    /// `INTERNAL` with the `ErrorInfo` reason `LAYER_MISCONFIGURED` (also logged at `error`) when
    /// no transaction-mode gRPC layer covers the call, or `T` is not the transaction type of the
    /// layer's store.
    pub async fn from_grpc<M>(req: &tonic::Request<M>) -> Result<Self, Status> {
        let slot = req.extensions().get::<Slot>().cloned();
        LayerTx::lend(slot, "a `GrpcLayer`").await.map_err(|detail| {
            tracing::error!(%detail, "the gRPC idempotency layer is misconfigured for this method");
            grpc_status(tonic::Code::Internal, "LAYER_MISCONFIGURED", &detail, None)
        })
    }
}
