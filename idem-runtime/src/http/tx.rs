//! Transaction mode's transaction, for an axum handler: [`LayerTx`] as an extractor.

use axum::extract::FromRequestParts;
use axum::response::{IntoResponse, Response};
use http::StatusCode;
use http::request::Parts;

use super::problem::problem;
use crate::IdemTx;
use crate::layer::LayerTx;
use crate::layer::tx::Slot;

impl<S: Send + Sync, T: IdemTx + Sync + 'static> FromRequestParts<S> for LayerTx<T> {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        let slot = parts.extensions.get::<Slot>().cloned();
        LayerTx::lend(slot, "an `IdempotencyLayer`")
            .await
            .map_err(|detail| {
                tracing::error!(%detail, "the idempotency layer is misconfigured for this route");
                problem(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "layer-misconfigured",
                    "Idempotency layer misconfigured",
                    &detail,
                )
                .into_response()
            })
    }
}
