//! Errors as `application/problem+json` bodies (RFC 9457).

use std::time::Duration;

use axum::body::Body;
use http::{HeaderValue, Response, StatusCode, header};
use serde::Serialize;

use crate::IdemError;

/// The `type` of every problem idem's HTTP parts answer with: `urn:idem:problem:<name>`.
pub const PROBLEM_TYPE_PREFIX: &str = "urn:idem:problem:";

#[derive(Serialize)]
struct Body9457<'a> {
    #[serde(rename = "type")]
    kind: String,
    title: &'a str,
    status: u16,
    detail: &'a str,
}

/// One problem response: `status`, a `type` of `urn:idem:problem:{name}`, a title and a detail.
pub(crate) fn problem(status: StatusCode, name: &str, title: &str, detail: &str) -> Response<Body> {
    let body = serde_json::to_vec(&Body9457 {
        kind: format!("{PROBLEM_TYPE_PREFIX}{name}"),
        title,
        status: status.as_u16(),
        detail,
    })
    .unwrap_or_default();
    let mut response = Response::new(Body::from(body));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/problem+json"),
    );
    response
}

/// Sets `Retry-After` in whole seconds, rounded up, at least 1.
pub(crate) fn retry_after(mut response: Response<Body>, after: Duration) -> Response<Body> {
    let secs = after.as_secs() + u64::from(after.subsec_nanos() > 0);
    response
        .headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from(secs.max(1)));
    response
}

/// The answer for an [`IdemError`] the layer or a guard met. Details of store failures stay in
/// the service's logs: the client learns only that it may retry.
pub(crate) fn from_idem(e: &IdemError) -> Response<Body> {
    let status = StatusCode::from_u16(e.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    match e {
        IdemError::InProgress { retry_after: after } => retry_after(
            problem(
                status,
                "in-progress",
                "Request in progress",
                "a request with this idempotency key is still being processed; retry after the time in Retry-After",
            ),
            *after,
        ),
        // Another request with this key took the record over before this one's handler ran (its
        // claim came back late): it is that request's now.
        IdemError::LeaseLost { .. } => retry_after(
            problem(
                StatusCode::CONFLICT,
                "in-progress",
                "Request in progress",
                "another request with this idempotency key is being processed; retry after the time in Retry-After",
            ),
            Duration::from_secs(1),
        ),
        IdemError::PayloadMismatch => problem(
            status,
            "payload-mismatch",
            "Idempotency key reused",
            "this idempotency key was already used with a different request (method, path, content type, body or a fingerprinted header); use a new key for a new request",
        ),
        IdemError::ResultExpired => problem(
            status,
            "result-expired",
            "Idempotency key used, result no longer kept",
            "a request with this idempotency key was processed already, and its response is no longer kept; it was not processed again (use a new key for a new request)",
        ),
        IdemError::TokenUsed => problem(
            status,
            "token-used",
            "Submit token used",
            "this submit token was used already: the request it came with was accepted once",
        ),
        IdemError::TokenInvalid { reason } => {
            problem(status, "token-invalid", "Invalid submit token", reason)
        }
        IdemError::InvalidKey { .. }
        | IdemError::InvalidBiz { .. }
        | IdemError::Fingerprint { .. } => problem(
            status,
            "invalid-key",
            "Invalid idempotency key",
            &e.to_string(),
        ),
        IdemError::StoreUnavailable { .. } | IdemError::StoreBusy { .. } => {
            tracing::warn!(error = %e, "idempotency store failed; answering 503");
            retry_after(
                problem(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "store-unavailable",
                    "Try again",
                    "the idempotency store is unavailable; nothing was processed, retry later",
                ),
                Duration::from_secs(1),
            )
        }
        _ => {
            tracing::error!(error = %e, "idempotent request failed in idem");
            problem(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                "Internal error",
                "the request could not be processed idempotently",
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_repeat_whose_result_is_gone_is_410_with_its_own_type() {
        let response = from_idem(&IdemError::ResultExpired);
        assert_eq!(response.status(), StatusCode::GONE);
        assert!(response.headers().get(header::RETRY_AFTER).is_none());
    }

    #[test]
    fn a_claim_taken_over_before_its_handler_ran_is_a_conflict_to_retry() {
        let response = from_idem(&IdemError::LeaseLost { attempt: 2 });
        assert_eq!(response.status(), StatusCode::CONFLICT);
        assert_eq!(response.headers()[header::RETRY_AFTER], "1");
        assert_eq!(
            response.headers()[header::CONTENT_TYPE],
            "application/problem+json"
        );
    }
}
