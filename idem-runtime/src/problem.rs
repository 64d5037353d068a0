//! What an [`IdemError`] means to a client over HTTP: a status, an `application/problem+json`
//! body (RFC 9457) and, where a retry helps, `Retry-After`. One mapping for every HTTP front: the
//! axum layer (`http`) and the Lambda adapter for API Gateway (`lambda`) render it.

use std::borrow::Cow;
use std::time::Duration;

use serde::Serialize;

use crate::IdemError;

/// The `type` of every problem idem's HTTP parts answer with: `urn:idem:problem:<name>`.
pub const PROBLEM_TYPE_PREFIX: &str = "urn:idem:problem:";

/// The content type of a problem body.
pub(crate) const CONTENT_TYPE: &str = "application/problem+json";

/// One answer to a refused or failed request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Problem<'a> {
    /// The HTTP status.
    pub(crate) status: u16,
    /// The problem's name: its `type` is `urn:idem:problem:{name}`.
    pub(crate) name: &'static str,
    pub(crate) title: &'static str,
    pub(crate) detail: Cow<'a, str>,
    /// When to retry (`Retry-After`), for the problems a retry cures.
    pub(crate) retry_after: Option<Duration>,
}

#[derive(Serialize)]
struct Body9457<'a> {
    #[serde(rename = "type")]
    kind: String,
    title: &'a str,
    status: u16,
    detail: &'a str,
}

/// A problem body: `status`, a `type` of `urn:idem:problem:{name}`, a title and a detail.
pub(crate) fn body(status: u16, name: &str, title: &str, detail: &str) -> Vec<u8> {
    serde_json::to_vec(&Body9457 {
        kind: format!("{PROBLEM_TYPE_PREFIX}{name}"),
        title,
        status,
        detail,
    })
    .unwrap_or_default()
}

/// `Retry-After` in whole seconds, rounded up, at least 1.
pub(crate) fn retry_after_secs(after: Duration) -> u64 {
    (after.as_secs() + u64::from(after.subsec_nanos() > 0)).max(1)
}

impl Problem<'_> {
    /// The problem's body.
    pub(crate) fn body(&self) -> Vec<u8> {
        body(self.status, self.name, self.title, &self.detail)
    }
}

/// The answer for an [`IdemError`]. Details of store failures stay in the service's logs: the
/// client learns only that it may retry.
pub(crate) fn of(e: &IdemError) -> Problem<'static> {
    let status = e.http_status();
    let one = |status, name, title, detail: &'static str| Problem {
        status,
        name,
        title,
        detail: Cow::Borrowed(detail),
        retry_after: None,
    };
    match e {
        IdemError::InProgress { retry_after } => Problem {
            retry_after: Some(*retry_after),
            ..one(
                status,
                "in-progress",
                "Request in progress",
                "a request with this idempotency key is still being processed; retry after the time in Retry-After",
            )
        },
        // Another request with this key took the record over before this one's handler ran (its
        // claim came back late): it is that request's now.
        IdemError::LeaseLost { .. } => Problem {
            retry_after: Some(Duration::from_secs(1)),
            ..one(
                409,
                "in-progress",
                "Request in progress",
                "another request with this idempotency key is being processed; retry after the time in Retry-After",
            )
        },
        IdemError::PayloadMismatch => one(
            status,
            "payload-mismatch",
            "Idempotency key reused",
            "this idempotency key was already used with a different request (method, path, content type, body or a fingerprinted header); use a new key for a new request",
        ),
        IdemError::ResultExpired => one(
            status,
            "result-expired",
            "Idempotency key used, result no longer kept",
            "a request with this idempotency key was processed already, and its response is no longer kept; it was not processed again (use a new key for a new request)",
        ),
        IdemError::TokenUsed => one(
            status,
            "token-used",
            "Submit token used",
            "this submit token was used already: the request it came with was accepted once",
        ),
        IdemError::TokenInvalid { reason } => Problem {
            detail: Cow::Owned(reason.clone()),
            ..one(status, "token-invalid", "Invalid submit token", "")
        },
        IdemError::InvalidKey { .. }
        | IdemError::InvalidBiz { .. }
        | IdemError::Fingerprint { .. } => Problem {
            detail: Cow::Owned(e.to_string()),
            ..one(status, "invalid-key", "Invalid idempotency key", "")
        },
        IdemError::StoreUnavailable { .. } | IdemError::StoreBusy { .. } => {
            tracing::warn!(error = %e, "idempotency store failed; answering 503");
            Problem {
                retry_after: Some(Duration::from_secs(1)),
                ..one(
                    503,
                    "store-unavailable",
                    "Try again",
                    "the idempotency store is unavailable; nothing was processed, retry later",
                )
            }
        }
        _ => {
            tracing::error!(error = %e, "idempotent request failed in idem");
            one(
                500,
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
        let p = of(&IdemError::ResultExpired);
        assert_eq!(p.status, 410);
        assert_eq!(p.retry_after, None);
        assert!(
            String::from_utf8(p.body())
                .unwrap()
                .contains("urn:idem:problem:result-expired")
        );
    }

    #[test]
    fn a_claim_taken_over_before_its_handler_ran_is_a_conflict_to_retry() {
        let p = of(&IdemError::LeaseLost { attempt: 2 });
        assert_eq!(p.status, 409);
        assert_eq!(p.retry_after.map(retry_after_secs), Some(1));
    }

    #[test]
    fn retry_after_rounds_up_to_whole_seconds() {
        assert_eq!(retry_after_secs(Duration::from_millis(1)), 1);
        assert_eq!(retry_after_secs(Duration::from_millis(1_001)), 2);
        assert_eq!(retry_after_secs(Duration::ZERO), 1);
    }
}
