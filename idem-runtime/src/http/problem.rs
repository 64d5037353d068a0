//! Errors as `application/problem+json` bodies (RFC 9457), rendered as axum responses (the
//! mapping itself is shared with every HTTP front: `crate::problem`).

use std::time::Duration;

use axum::body::Body;
use http::{HeaderValue, Response, StatusCode, header};

use crate::IdemError;

pub use crate::problem::PROBLEM_TYPE_PREFIX;

/// One problem response: `status`, a `type` of `urn:idem:problem:{name}`, a title and a detail.
pub(crate) fn problem(status: StatusCode, name: &str, title: &str, detail: &str) -> Response<Body> {
    with_body(
        status,
        crate::problem::body(status.as_u16(), name, title, detail),
    )
}

/// A problem response of `status` with its `body`.
fn with_body(status: StatusCode, body: Vec<u8>) -> Response<Body> {
    let mut response = Response::new(Body::from(body));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(crate::problem::CONTENT_TYPE),
    );
    response
}

/// Sets `Retry-After` in whole seconds, rounded up, at least 1.
pub(crate) fn retry_after(mut response: Response<Body>, after: Duration) -> Response<Body> {
    response.headers_mut().insert(
        header::RETRY_AFTER,
        HeaderValue::from(crate::problem::retry_after_secs(after)),
    );
    response
}

/// The answer for an [`IdemError`] the layer or a guard met (see `crate::problem::of`).
pub(crate) fn from_idem(e: &IdemError) -> Response<Body> {
    let p = crate::problem::of(e);
    let status = StatusCode::from_u16(p.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let response = with_body(status, p.body());
    match p.retry_after {
        Some(after) => retry_after(response, after),
        None => response,
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
