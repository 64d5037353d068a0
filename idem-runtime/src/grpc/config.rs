//! The gRPC layer's own settings (the rest are the layer core's, `crate::layer::config::Config`): the
//! methods it covers, which statuses it stores, and its recover fn.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use bytes::Bytes;
use http::HeaderMap;
use tonic::Code;

use crate::BoxError;

/// The call a recover fn is asked about: the first call's method, metadata and message are the
/// same as this one's (the fingerprint guarantees it), and so are the caller and the key.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct GrpcRecoverRequest {
    /// The client's idempotency key, as sent.
    pub key: String,
    /// The caller, as the layer's [`Principal`](super::Principal) found it (`None` when
    /// unscoped).
    pub principal: Option<String>,
    /// The method's path: `/package.Service/Method`.
    pub method: String,
    /// The request's metadata (HTTP/2 headers).
    pub metadata: HeaderMap,
    /// The request message's bytes as sent (protobuf: `Req::decode(req.message)`); compressed when
    /// the client compressed it (`grpc-encoding` in the metadata names how).
    pub message: Bytes,
}

type Found = Pin<Box<dyn Future<Output = Result<Option<Bytes>, BoxError>> + Send>>;

/// A recover fn, boxed.
pub(super) type RecoverFn = Arc<dyn Fn(GrpcRecoverRequest) -> Found + Send + Sync>;

/// A key read from a call without an `idempotency-key` entry: its metadata and message bytes.
pub(super) type KeyFn = Arc<dyn Fn(&HeaderMap, &[u8]) -> Option<String> + Send + Sync>;

/// The gRPC layer's own settings.
pub(crate) struct GrpcConfig {
    /// Where the key comes from when the call has no `idempotency-key` entry.
    pub(super) key_from: Option<KeyFn>,
    /// The methods covered (`/package.Service/Method`); other calls pass through.
    pub(super) methods: Vec<String>,
    pub(super) store_if: fn(Code) -> bool,
    pub(super) recover: Option<RecoverFn>,
}
