//! The decision table of DESIGN §3, shared by every store that reads a record before it writes.

use std::time::Duration;

use super::{Acquired, Status};

/// The parts of a record the claim decision looks at.
#[derive(Debug, Clone, Copy)]
pub struct RecordState<'a> {
    /// Current status.
    pub status: Status,
    /// Stored fingerprint.
    pub fingerprint: Option<&'a str>,
    /// Lease end, store clock, ms.
    pub lease_until_ms: i64,
    /// Expiry, store clock, ms.
    pub expire_at_ms: i64,
}

/// The decision for an existing record (a missing record is always a fresh claim).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Take the record over as a new attempt (`attempt + 1`); when `reset` the record had expired
    /// and starts a new life (new creation time and expiry).
    Take {
        /// How the claim comes about.
        how: Acquired,
        /// The record had expired.
        reset: bool,
    },
    /// Replay the stored snapshot.
    Replay,
    /// Refuse: another payload.
    Mismatch,
    /// Refuse: in progress for this many more ms.
    InProgress(i64),
}

/// The decision table of DESIGN §3, shared by every store that reads before its compare-and-set.
pub fn decide(rec: &RecordState<'_>, fingerprint: Option<&str>, now_ms: i64) -> Decision {
    if rec.expire_at_ms <= now_ms {
        return Decision::Take {
            how: Acquired::Fresh,
            reset: true,
        };
    }
    let same_payload = match (rec.fingerprint, fingerprint) {
        (Some(stored), Some(asked)) => stored == asked,
        _ => true,
    };
    match rec.status {
        Status::Failed => Decision::Take {
            how: Acquired::RetryAfterFailure,
            reset: false,
        },
        Status::Succeeded if same_payload => Decision::Replay,
        Status::Succeeded => Decision::Mismatch,
        Status::Processing if !same_payload => Decision::Mismatch,
        Status::Processing if rec.lease_until_ms > now_ms => {
            Decision::InProgress(rec.lease_until_ms - now_ms)
        }
        Status::Processing => Decision::Take {
            how: Acquired::TakeOver,
            reset: false,
        },
    }
}

/// Converts a duration to whole milliseconds for storage (saturating).
pub fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// Store-clock milliseconds to a `Duration` (negative becomes zero).
pub fn duration_ms(ms: i64) -> Duration {
    Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}
