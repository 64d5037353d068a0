//! DynamoDB errors sorted into idem's classes (docs/RELIABILITY.md, "Error classes").

use aws_sdk_dynamodb::error::{DisplayErrorContext, ProvideErrorMetadata, SdkError};

use crate::{Busy, IdemError};

/// Where a request went, for errors: the table and the endpoint (or region).
pub(crate) fn dynamo_error<E, R>(place: &str, e: SdkError<E, R>) -> IdemError
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
    R: std::fmt::Debug + Send + Sync + 'static,
{
    let code = e.code().map(str::to_owned);
    let message = format!("DynamoDB {place}: {}", DisplayErrorContext(&e));
    classify(
        code.as_deref(),
        matches!(e, SdkError::ServiceError(_)),
        message,
    )
}

/// - Unavailable (503): no answer (a connection refused or cut, a timeout, a reply that could not
///   be read), or the service's own failure (`InternalServerError`, `ServiceUnavailable`).
/// - Busy, `Locked` (503): throttled (`ProvisionedThroughputExceededException`,
///   `RequestLimitExceeded`, `ThrottlingException`) or a transaction in the way
///   (`TransactionConflictException`): it ends by itself.
/// - Schema (500): the table or its index is missing (`ResourceNotFoundException`): run
///   `migrate()`.
/// - Store (500): the rest (a validation error, a missing permission).
fn classify(code: Option<&str>, service: bool, message: String) -> IdemError {
    if !service {
        return IdemError::unavailable(message);
    }
    match code {
        Some("ResourceNotFoundException") => IdemError::StoreSchema {
            hint: "the table (or its index `idem_stuck`) does not exist: create it with the \
                   store's `migrate()` (or `idem migrate`)"
                .to_owned(),
            source: message.into(),
        },
        Some(
            "ProvisionedThroughputExceededException"
            | "RequestLimitExceeded"
            | "ThrottlingException"
            | "TransactionConflictException"
            | "TransactionInProgressException"
            | "LimitExceededException",
        ) => IdemError::busy(Busy::Locked, message),
        Some("InternalServerError" | "ServiceUnavailable" | "InternalFailure") => {
            IdemError::unavailable(message)
        }
        _ => IdemError::store(message),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_fall_into_classes() {
        let m = || "m".to_owned();
        assert!(matches!(
            classify(None, false, m()),
            IdemError::StoreUnavailable { .. }
        ));
        assert!(matches!(
            classify(Some("ResourceNotFoundException"), true, m()),
            IdemError::StoreSchema { .. }
        ));
        assert!(matches!(
            classify(Some("ThrottlingException"), true, m()),
            IdemError::StoreBusy { .. }
        ));
        assert!(matches!(
            classify(Some("ValidationException"), true, m()),
            IdemError::Store { .. }
        ));
    }
}
