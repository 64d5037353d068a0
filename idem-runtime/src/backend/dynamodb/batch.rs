//! Batches: DynamoDB has no conditional batch write (BatchWriteItem takes no condition, and a
//! transaction fails whole when one key's condition fails), so a batch is one conditional write
//! per key, several in flight at once, each with its own condition.

use std::time::Duration;

use futures_util::{StreamExt, TryStreamExt};

use super::DynamoStore;
use crate::IdemError;
use crate::store::{BatchClaim, BatchMark, ClaimOutcome, ClaimRequest, Store};

/// How many claims or marks of a batch are in flight at once.
const BATCH_CONCURRENCY: usize = 32;

/// One claim per key, up to [`BATCH_CONCURRENCY`] in flight at once, in the batch's order.
pub(super) async fn claim_batch(
    store: &DynamoStore,
    batch: &BatchClaim<'_>,
) -> Result<Vec<ClaimOutcome>, IdemError> {
    batch.check()?;
    let requests: Vec<ClaimRequest<'_>> = batch.requests().collect();
    // The futures gathered first: a stream over a closure is not `Send` for every lifetime.
    let claims: Vec<_> = requests.iter().map(|req| store.claim(req)).collect();
    futures_util::stream::iter(claims)
        .buffered(BATCH_CONCURRENCY)
        .try_collect()
        .await
}

/// One conditional write per mark, up to [`BATCH_CONCURRENCY`] in flight at once: each mark's
/// `LeaseLost` in its place, any other error for the whole batch.
pub(super) async fn complete_batch(
    store: &DynamoStore,
    biz: &str,
    marks: &[BatchMark<'_>],
    ttl: Duration,
) -> Result<Vec<Result<(), IdemError>>, IdemError> {
    crate::store::batch::check_marks(marks)?;
    let writes: Vec<_> = marks
        .iter()
        .map(|m| store.mark(biz, m.key, &m.claim, m.snapshot, ttl, m.result_ttl))
        .collect();
    let answers: Vec<Result<(), IdemError>> = futures_util::stream::iter(writes)
        .buffered(BATCH_CONCURRENCY)
        .collect()
        .await;
    answers
        .into_iter()
        .map(|answer| match answer {
            Err(e @ IdemError::LeaseLost { .. }) => Ok(Err(e)),
            Err(e) => Err(e),
            Ok(()) => Ok(Ok(())),
        })
        .collect()
}
