//! The claim protocol for stores that read, decide, then compare-and-set (the SQL stores).
//!
//! Uniqueness is decided by one atomic write, never by a read: a new record is an
//! `INSERT … ON CONFLICT DO NOTHING`; an existing one is changed only by an `UPDATE … WHERE
//! attempt = <seen> AND status = <seen>`, so two callers that read the same row cannot both win.
//! The loser simply reads again.

use crate::IdemError;
use crate::store::decide::{Decision, RecordState, decide, duration_ms};
use crate::store::{ClaimOutcome, ClaimRequest, Status};

/// A row as read for the claim decision, with the database's clock.
pub(crate) struct SeenRecord {
    pub status: Status,
    pub attempt: u32,
    pub fingerprint: Option<String>,
    pub snapshot: Option<Vec<u8>>,
    pub lease_until_ms: i64,
    pub expire_at_ms: i64,
    pub now_ms: i64,
}

/// The three primitive writes and the read a CAS store provides.
pub(crate) trait CasRecords {
    /// Inserts a fresh PROCESSING record with attempt 1; `false` when one exists.
    async fn insert_new(&mut self, req: &ClaimRequest<'_>) -> Result<bool, IdemError>;
    /// Reads the record and the database's clock.
    async fn read(&mut self, req: &ClaimRequest<'_>) -> Result<Option<SeenRecord>, IdemError>;
    /// Takes the record over as `seen_attempt + 1` if it is still `(seen_attempt, seen_status)`;
    /// with `reset` it also starts a new life (creation time and expiry). `false` when it changed.
    async fn take(
        &mut self,
        req: &ClaimRequest<'_>,
        seen_attempt: u32,
        seen_status: Status,
        reset: bool,
    ) -> Result<bool, IdemError>;
}

/// How many times a claim re-reads after losing a race before it reports the key as busy.
const MAX_RACES: usize = 16;

/// Runs the claim protocol on `records`.
pub(crate) async fn claim_by_cas<C: CasRecords>(
    records: &mut C,
    req: &ClaimRequest<'_>,
) -> Result<ClaimOutcome, IdemError> {
    for _ in 0..MAX_RACES {
        if records.insert_new(req).await? {
            return Ok(ClaimOutcome::Acquired {
                attempt: 1,
                how: crate::store::Acquired::Fresh,
            });
        }
        // The record existed a moment ago; it may have been swept since, in which case we loop.
        let Some(seen) = records.read(req).await? else {
            continue;
        };
        let state = RecordState {
            status: seen.status,
            fingerprint: seen.fingerprint.as_deref(),
            lease_until_ms: seen.lease_until_ms,
            expire_at_ms: seen.expire_at_ms,
        };
        match decide(&state, req.fingerprint, seen.now_ms) {
            Decision::Take { how, reset } => {
                if records.take(req, seen.attempt, seen.status, reset).await? {
                    return Ok(ClaimOutcome::Acquired {
                        attempt: seen.attempt + 1,
                        how,
                    });
                }
            }
            Decision::Replay => {
                return Ok(ClaimOutcome::Replay {
                    snapshot: seen.snapshot.unwrap_or_default(),
                });
            }
            Decision::Mismatch => return Ok(ClaimOutcome::Mismatch),
            Decision::InProgress(ms) => {
                return Ok(ClaimOutcome::InProgress {
                    retry_after: duration_ms(ms),
                });
            }
        }
    }
    // Every read lost a race to another writer: the key is hot; the caller may retry.
    Ok(ClaimOutcome::InProgress {
        retry_after: std::time::Duration::from_millis(10),
    })
}
