//! gRPC on the wire, as the layer needs it: the one message of a unary request, what a record
//! keeps of a response (its metadata, messages and trailers), the replay, and the statuses the
//! layer answers with.

use std::collections::HashMap;
use std::future::Future;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Request, Response};
use http_body_util::{BodyExt, Full};
use serde::{Deserialize, Serialize};
use tonic::body::Body;
use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt};
use tower::Service;

use super::config::GrpcConfig;
use crate::IdemError;
use crate::layer::config::Config;
use crate::layer::flow::{HandlerRun, Wire};
use crate::layer::stored::{StoredBytes, never_kept};

/// The metadata key every replayed response carries, with the value `true` (HTTP's
/// `Idempotent-Replayed`): `response.metadata().get("idempotent-replayed")` on a tonic client.
pub const REPLAYED_METADATA: &str = "idempotent-replayed";

/// The `domain` of the `google.rpc.ErrorInfo` in every status the layer answers with; its
/// `reason` names the answer (`IN_PROGRESS`, `PAYLOAD_MISMATCH`, …: the table in the module docs).
pub const ERROR_DOMAIN: &str = "idem";

/// The gRPC statuses whose responses the layer stores, by default: `OK`, and the answers to the
/// request itself that a retry with the same message would get again and must not run again for
/// (`INVALID_ARGUMENT`, `NOT_FOUND`, `ALREADY_EXISTS`, `FAILED_PRECONDITION`, `OUT_OF_RANGE`).
/// Never stored, whatever the policy: the statuses that say the call may succeed if tried again
/// (`CANCELLED`, `UNKNOWN`, `DEADLINE_EXCEEDED`, `ABORTED`, `INTERNAL`, `UNAVAILABLE`,
/// `DATA_LOSS`); not stored by default: `PERMISSION_DENIED`, `UNAUTHENTICATED`,
/// `RESOURCE_EXHAUSTED` and `UNIMPLEMENTED`, refusals a client fixes (new credentials, a later
/// try, a newer server) and then expects to run.
pub fn stored_by_default(code: Code) -> bool {
    matches!(
        code,
        Code::Ok
            | Code::InvalidArgument
            | Code::NotFound
            | Code::AlreadyExists
            | Code::FailedPrecondition
            | Code::OutOfRange
    )
}

/// Whether a response with `code` may be stored at all: not when it says that trying again may
/// succeed (the record is marked failed and a retry runs the handler).
fn retryable(code: Code) -> bool {
    matches!(
        code,
        Code::Cancelled
            | Code::Unknown
            | Code::DeadlineExceeded
            | Code::Aborted
            | Code::Internal
            | Code::Unavailable
            | Code::DataLoss
    )
}

/// Why a request body is not one gRPC message.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum NotUnary {
    /// Its bytes end inside a message's 5-byte prefix or its message.
    Cut,
    /// It holds this many messages (0, or more than 1).
    Messages(usize),
}

/// The one message of a unary request's body (`[compressed: u8][length: u32 BE][message]`): the
/// message's bytes as sent, and whether they are compressed.
pub(super) fn one_message(body: &[u8]) -> Result<(bool, Bytes), NotUnary> {
    let mut rest = body;
    let mut found = None;
    let mut count = 0;
    while !rest.is_empty() {
        let Some((head, tail)) = rest.split_first_chunk::<5>() else {
            return Err(NotUnary::Cut);
        };
        let len = u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
        if tail.len() < len {
            return Err(NotUnary::Cut);
        }
        found = Some((head[0] == 1, Bytes::copy_from_slice(&tail[..len])));
        count += 1;
        rest = &tail[len..];
    }
    match found {
        Some(message) if count == 1 => Ok(message),
        _ => Err(NotUnary::Messages(count)),
    }
}

/// `message` framed as one uncompressed gRPC message.
pub(super) fn framed(message: &[u8]) -> Bytes {
    let mut body = Vec::with_capacity(5 + message.len());
    body.push(0);
    body.extend_from_slice(
        &u32::try_from(message.len())
            .unwrap_or(u32::MAX)
            .to_be_bytes(),
    );
    body.extend_from_slice(message);
    body.into()
}

/// What a record keeps of a gRPC response: its metadata (but what is never kept), its body (the
/// framed messages; `None` when over the size limit) and its trailers (`grpc-status`,
/// `grpc-message`, the handler's trailing metadata).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct GrpcStored {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    h: Vec<(String, StoredBytes)>,
    b: Option<StoredBytes>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    t: Vec<(String, StoredBytes)>,
}

fn kept_fields(map: &HeaderMap) -> Vec<(String, StoredBytes)> {
    map.iter()
        .filter(|(name, _)| never_kept(name).is_none())
        .map(|(name, value)| (name.as_str().to_owned(), StoredBytes::of(value.as_bytes())))
        .collect()
}

fn restored(fields: &[(String, StoredBytes)]) -> HeaderMap {
    let mut map = HeaderMap::new();
    for (name, value) in fields {
        let (Ok(name), Some(value)) = (HeaderName::try_from(name.as_str()), value.bytes()) else {
            continue;
        };
        if never_kept(&name).is_some() {
            continue;
        }
        if let Ok(value) = HeaderValue::from_bytes(&value) {
            map.append(name, value);
        }
    }
    map
}

impl GrpcStored {
    pub(super) fn of(headers: &HeaderMap, body: &[u8], trailers: Option<&HeaderMap>) -> Self {
        GrpcStored {
            h: kept_fields(headers),
            b: Some(StoredBytes::of(body)),
            t: trailers.map(kept_fields).unwrap_or_default(),
        }
    }

    /// A successful response whose one message is `message` (what a recover fn found).
    pub(super) fn ok(message: &[u8]) -> Self {
        let mut headers = HeaderMap::new();
        headers.insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/grpc"),
        );
        let mut trailers = HeaderMap::new();
        trailers.insert("grpc-status", HeaderValue::from_static("0"));
        GrpcStored::of(&headers, &framed(message), Some(&trailers))
    }

    /// As kept: without its messages when they are over `max_body` bytes or the record would be
    /// over the store's snapshot limit.
    pub(super) fn kept(self, body_len: usize, cfg: &Config) -> Self {
        if kept_fits(&self, body_len, cfg) {
            self
        } else {
            GrpcStored { b: None, ..self }
        }
    }

    fn replay(&self) -> Response<Body> {
        let mut response = match &self.b {
            None => status(
                Code::AlreadyExists,
                "RESPONSE_NOT_KEPT",
                "a call with this idempotency key ran, but its response was too large to keep for replay; do not send it again",
                None,
            ),
            Some(body) => {
                let trailers = restored(&self.t);
                let body = Full::new(Bytes::from(body.bytes().unwrap_or_default()));
                let body = if trailers.is_empty() {
                    Body::new(body)
                } else {
                    Body::new(body.with_trailers(async move { Some(Ok(trailers)) }))
                };
                let mut response = Response::new(body);
                *response.headers_mut() = restored(&self.h);
                response
            }
        };
        response.headers_mut().insert(
            HeaderName::from_static(REPLAYED_METADATA),
            HeaderValue::from_static("true"),
        );
        response
    }
}

/// Whether `stored` is kept whole: its body is at most the layer's limit and the
/// record fits the store's snapshot limit, with a margin for the engine's envelope.
fn kept_fits<T: serde::Serialize>(stored: &T, body_len: usize, cfg: &Config) -> bool {
    body_len <= cfg.max_response_bytes
        && serde_json::to_vec(stored)
            .is_ok_and(|json| json.len() + 64 <= cfg.store.limits().max_snapshot_len)
}

/// A gRPC status with a `google.rpc.ErrorInfo` naming `reason` in the [`ERROR_DOMAIN`] and, when
/// the client may try again, a `google.rpc.RetryInfo`.
pub(super) fn grpc_status(
    code: Code,
    reason: &str,
    message: &str,
    retry: Option<Duration>,
) -> Status {
    let mut details = ErrorDetails::new();
    details.set_error_info(reason, ERROR_DOMAIN, HashMap::new());
    if let Some(after) = retry {
        details.set_retry_info(Some(after));
    }
    Status::with_error_details(code, message, details)
}

/// [`grpc_status`] as a (trailers-only) response.
pub(super) fn status(
    code: Code,
    reason: &str,
    message: &str,
    retry: Option<Duration>,
) -> Response<Body> {
    grpc_status(code, reason, message, retry).into_http()
}

/// The status of a response: its trailers' `grpc-status`, or its headers' on a trailers-only
/// response; `UNKNOWN` when neither says.
fn code_of(headers: &HeaderMap, trailers: Option<&HeaderMap>) -> Code {
    trailers
        .and_then(|t| t.get("grpc-status"))
        .or_else(|| headers.get("grpc-status"))
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<i32>().ok())
        .map_or(Code::Unknown, Code::from)
}

/// The gRPC layer's answers.
pub(super) struct Grpc<'a>(pub(super) &'a GrpcConfig);

impl Wire<Body> for Grpc<'_> {
    type Stored = GrpcStored;

    fn run<S, B>(
        &self,
        cfg: &Config,
        inner: &mut S,
        req: Request<Body>,
        route: &str,
    ) -> impl Future<Output = Result<HandlerRun<GrpcStored, Body>, S::Error>> + Send
    where
        S: Service<Request<Body>, Response = Response<B>> + Send,
        S::Future: Send,
        B: http_body::Body<Data = Bytes> + Send + 'static,
        B::Error: Into<crate::BoxError>,
    {
        let store_if = self.0.store_if;
        async move {
            let started = std::time::Instant::now();
            let response = inner.call(req).await?;
            let (head, body) = response.into_parts();
            let collected = match body.collect().await {
                Ok(collected) => collected,
                Err(e) => {
                    let e: crate::BoxError = e.into();
                    tracing::error!(error = %e, "the handler's response body failed; the call is marked failed");
                    return Ok((self.internal(), None));
                }
            };
            cfg.durations.record(route, started.elapsed());
            let trailers = collected.trailers().cloned();
            let bytes = collected.to_bytes();
            let code = code_of(&head.headers, trailers.as_ref());
            let keep = head.status == http::StatusCode::OK && !retryable(code) && store_if(code);
            let stored = keep.then(|| {
                GrpcStored::of(&head.headers, &bytes, trailers.as_ref()).kept(bytes.len(), cfg)
            });
            let body = Full::new(bytes);
            let body = match trailers {
                Some(trailers) => Body::new(body.with_trailers(async move { Some(Ok(trailers)) })),
                None => Body::new(body),
            };
            Ok((Response::from_parts(head, body), stored))
        }
    }

    fn replay(&self, stored: &GrpcStored) -> Response<Body> {
        stored.replay()
    }

    fn error(&self, e: &IdemError) -> Response<Body> {
        from_idem(e)
    }

    fn recover_failed(&self) -> Response<Body> {
        status(
            Code::Unavailable,
            "RECOVER_FAILED",
            "whether this call already ran could not be checked; nothing was run, retry after the delay in RetryInfo",
            Some(Duration::from_secs(1)),
        )
    }

    fn internal(&self) -> Response<Body> {
        status(
            Code::Internal,
            "INTERNAL",
            "the call could not be processed",
            None,
        )
    }

    fn too_many_keys(&self, wait: Duration) -> Response<Body> {
        status(
            Code::ResourceExhausted,
            "TOO_MANY_KEYS",
            "this caller made more idempotent calls in this window than the service allows; retry after the delay in RetryInfo",
            Some(wait),
        )
    }
}

/// The status for a call idem refused or could not serve.
pub(super) fn from_idem(e: &IdemError) -> Response<Body> {
    match e {
        IdemError::InProgress { retry_after } => status(
            Code::Aborted,
            "IN_PROGRESS",
            "a call with this idempotency key is still running; retry after the delay in RetryInfo",
            Some(*retry_after),
        ),
        IdemError::LeaseLost { .. } => status(
            Code::Aborted,
            "IN_PROGRESS",
            "another call with this idempotency key is running; retry after the delay in RetryInfo",
            Some(Duration::from_secs(1)),
        ),
        IdemError::PayloadMismatch => status(
            Code::FailedPrecondition,
            "PAYLOAD_MISMATCH",
            "this idempotency key was already used with a different call (method, message or a fingerprinted metadata entry); use a new key for a new call",
            None,
        ),
        IdemError::ResultExpired => status(
            Code::AlreadyExists,
            "RESULT_EXPIRED",
            "a call with this idempotency key ran already, and its response is no longer kept; it was not run again (use a new key for a new call)",
            None,
        ),
        IdemError::InvalidKey { .. }
        | IdemError::InvalidBiz { .. }
        | IdemError::Fingerprint { .. } => {
            status(Code::InvalidArgument, "INVALID_KEY", &e.to_string(), None)
        }
        IdemError::StoreUnavailable { .. } | IdemError::StoreBusy { .. } => {
            tracing::warn!(error = %e, "idempotency store failed; answering UNAVAILABLE");
            status(
                Code::Unavailable,
                "STORE_UNAVAILABLE",
                "the idempotency store is unavailable; nothing was run, retry after the delay in RetryInfo",
                Some(Duration::from_secs(1)),
            )
        }
        _ => {
            tracing::error!(error = %e, "idempotent call failed in idem");
            status(
                Code::Internal,
                "INTERNAL",
                "the call could not be processed idempotently",
                None,
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(message: &[u8]) -> Vec<u8> {
        framed(message).to_vec()
    }

    #[test]
    fn a_unary_body_is_exactly_one_message() {
        assert_eq!(
            one_message(&frame(b"abc")),
            Ok((false, Bytes::from_static(b"abc")))
        );
        assert_eq!(one_message(&frame(b"")), Ok((false, Bytes::new())));
        let mut compressed = frame(b"zz");
        compressed[0] = 1;
        assert_eq!(
            one_message(&compressed),
            Ok((true, Bytes::from_static(b"zz")))
        );
        assert_eq!(one_message(b""), Err(NotUnary::Messages(0)));
        let two = [frame(b"a"), frame(b"b")].concat();
        assert_eq!(one_message(&two), Err(NotUnary::Messages(2)));
        assert_eq!(one_message(&frame(b"abc")[..6]), Err(NotUnary::Cut));
        assert_eq!(one_message(&[0, 0, 0]), Err(NotUnary::Cut));
    }

    #[test]
    fn a_stored_response_replays_its_metadata_messages_and_trailers() {
        let mut headers = HeaderMap::new();
        headers.insert("content-type", HeaderValue::from_static("application/grpc"));
        headers.insert("x-order", HeaderValue::from_static("77"));
        headers.insert("set-cookie", HeaderValue::from_static("session=secret"));
        let mut trailers = HeaderMap::new();
        trailers.insert("grpc-status", HeaderValue::from_static("0"));
        trailers.insert("x-bin", HeaderValue::from_bytes(b"\xff\x80").unwrap());
        let body = frame(&[0xff, 0, 7]);
        let stored = GrpcStored::of(&headers, &body, Some(&trailers));
        let json = serde_json::to_string(&stored).unwrap();
        assert!(!json.contains("secret"), "{json}");
        let back: GrpcStored = serde_json::from_str(&json).unwrap();
        let response = back.replay();
        assert_eq!(response.headers()["x-order"], "77");
        assert_eq!(response.headers()[REPLAYED_METADATA], "true");
        assert!(response.headers().get("set-cookie").is_none());
        let collected = futures_executor(response.into_body().collect());
        let collected = collected.unwrap();
        assert_eq!(collected.trailers().unwrap()["grpc-status"], "0");
        assert_eq!(
            collected.trailers().unwrap()["x-bin"].as_bytes(),
            b"\xff\x80"
        );
        assert_eq!(collected.to_bytes().as_ref(), &body[..]);
    }

    #[test]
    fn a_response_not_kept_replays_as_already_exists() {
        let stored = GrpcStored::ok(b"big");
        let stored = GrpcStored { b: None, ..stored };
        let response = stored.replay();
        let status = Status::from_header_map(response.headers()).unwrap();
        assert_eq!(status.code(), Code::AlreadyExists);
        assert_eq!(
            status.get_details_error_info().unwrap().reason,
            "RESPONSE_NOT_KEPT"
        );
        assert_eq!(response.headers()[REPLAYED_METADATA], "true");
    }

    #[test]
    fn in_progress_is_aborted_with_retry_info() {
        let response = from_idem(&IdemError::InProgress {
            retry_after: Duration::from_secs(3),
        });
        let status = Status::from_header_map(response.headers()).unwrap();
        assert_eq!(status.code(), Code::Aborted);
        let retry = status.get_details_retry_info().unwrap();
        assert_eq!(retry.retry_delay, Some(Duration::from_secs(3)));
        let info = status.get_details_error_info().unwrap();
        assert_eq!(
            (info.reason.as_str(), info.domain.as_str()),
            ("IN_PROGRESS", ERROR_DOMAIN)
        );
    }

    #[test]
    fn the_default_policy_never_stores_what_says_try_again() {
        for code in 0..=16 {
            let code = Code::from(code);
            assert!(!(retryable(code) && stored_by_default(code)), "{code:?}");
        }
        assert!(stored_by_default(Code::Ok));
        assert!(!stored_by_default(Code::Unauthenticated));
    }

    /// Polls `fut` to its end on this thread (the bodies here never wait).
    fn futures_executor<F: Future>(fut: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(fut)
    }
}
