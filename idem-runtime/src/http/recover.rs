//! The layer's recover fn: asked, before a takeover runs a handler again, whether the request's
//! action already happened (the handler's writes landed but its response was never stored).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use axum::body::Body;
use bytes::Bytes;
use http::{HeaderMap, Method, Response, Uri};

use crate::BoxError;

/// The request a recover fn is asked about: the first request's method, path, headers and body
/// are the same as this one's (the fingerprint guarantees it), and so are the caller and the key.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct RecoverRequest {
    /// The client's idempotency key, as sent.
    pub key: String,
    /// The caller, as the layer's [`Principal`](super::Principal) found it (`None` when unscoped).
    pub principal: Option<String>,
    /// The request's method.
    pub method: Method,
    /// The request's URI.
    pub uri: Uri,
    /// The request's headers.
    pub headers: HeaderMap,
    /// The request's body.
    pub body: Bytes,
}

type Found = Pin<Box<dyn Future<Output = Result<Option<Response<Body>>, BoxError>> + Send>>;

/// A recover fn, boxed.
pub(super) type RecoverFn = Arc<dyn Fn(RecoverRequest) -> Found + Send + Sync>;

/// Boxes `recover`.
pub(super) fn boxed<F, Fut>(recover: F) -> RecoverFn
where
    F: Fn(RecoverRequest) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Option<Response<Body>>, BoxError>> + Send + 'static,
{
    Arc::new(move |request| Box::pin(recover(request)))
}
