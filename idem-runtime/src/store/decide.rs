//! The claim decision table (on `Call`, "What a call does"), shared by every store that decides in Rust (the memory store,
//! the SQL claim protocol). Stores that decide elsewhere (a Lua script) re-implement it and are
//! held to it by the contract suite.

use std::time::Duration;

use super::{Acquired, Status};

/// The parts of a record the claim decision looks at.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RecordState<'a> {
    pub status: Status,
    pub fingerprint: Option<&'a str>,
    /// Lease end, store clock, ms.
    pub lease_until_ms: i64,
    /// Expiry, store clock, ms.
    pub expire_at_ms: i64,
    /// When a SUCCEEDED record's result stops being replayed, store clock, ms: `None` while it is
    /// kept as long as the record (see [`RESULT_DROPPED`]).
    pub result_until_ms: Option<i64>,
}

/// What `result_until` holds once a sweep dropped the result and the record shrank to a
/// tombstone: a time always past, outside the range a sweep looks for results to drop in.
pub(crate) const RESULT_DROPPED: i64 = 0;

impl RecordState<'_> {
    /// A PROCESSING record whose lease has not run out protects its holder.
    pub(crate) fn lease_is_live(&self, now_ms: i64) -> bool {
        self.status == Status::Processing && self.lease_until_ms > now_ms
    }

    /// Expired: the TTL has passed AND no lease is live. A live lease is never cut short by the
    /// TTL (nor by the sweeper, which uses the same rule).
    pub(crate) fn is_expired(&self, now_ms: i64) -> bool {
        self.expire_at_ms <= now_ms && !self.lease_is_live(now_ms)
    }

    /// A SUCCEEDED record whose result is no longer kept (its result ttl passed): a tombstone
    /// until the record expires.
    pub(crate) fn result_is_gone(&self, now_ms: i64) -> bool {
        self.status == Status::Succeeded && self.result_until_ms.is_some_and(|t| t <= now_ms)
    }
}

/// The decision for an existing record (a missing record is always a fresh claim).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Decision {
    /// Take the record: a new claim with a new fence. When `reset` the record had expired and
    /// starts a new life (attempt 1, new creation time and expiry); otherwise the attempt goes up
    /// by one and the record lives at least until the new lease ends.
    Take { how: Acquired, reset: bool },
    /// Replay the stored snapshot.
    Replay,
    /// Refuse: done, but its result is no longer kept (a tombstone).
    ResultGone,
    /// Refuse: another payload.
    Mismatch,
    /// Refuse: in progress for this many more ms.
    InProgress(i64),
}

/// The claim decision table (on `Call`, "What a call does").
pub(crate) fn decide(rec: &RecordState<'_>, fingerprint: Option<&str>, now_ms: i64) -> Decision {
    if rec.is_expired(now_ms) {
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
        Status::Succeeded if same_payload && rec.result_is_gone(now_ms) => Decision::ResultGone,
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

/// The times and counters of a record after it was taken at `now_ms` (store clock).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Taken {
    pub attempt: u32,
    pub fence: u64,
    pub lease_until_ms: i64,
    pub expire_at_ms: i64,
}

/// What a take writes: a new fence above the old one and above the clock, a lease from now, and
/// an expiry that covers the lease (a fresh life when `reset`).
pub(crate) fn taken(
    old: Option<(u32, u64, i64)>,
    reset: bool,
    now_us: i64,
    lease: Duration,
    ttl: Duration,
) -> Taken {
    let now_ms = now_us.div_euclid(1000);
    let lease_until_ms = now_ms.saturating_add(millis(lease));
    let fresh_expiry = now_ms.saturating_add(millis(ttl));
    let clock_fence = u64::try_from(now_us).unwrap_or(0);
    match old {
        Some((attempt, fence, expire_at_ms)) if !reset => Taken {
            attempt: attempt.saturating_add(1),
            fence: clock_fence.max(fence + 1),
            lease_until_ms,
            expire_at_ms: expire_at_ms.max(lease_until_ms),
        },
        Some((_, fence, _)) => Taken {
            attempt: 1,
            fence: clock_fence.max(fence + 1),
            lease_until_ms,
            expire_at_ms: fresh_expiry,
        },
        None => Taken {
            attempt: 1,
            fence: clock_fence,
            lease_until_ms,
            expire_at_ms: fresh_expiry,
        },
    }
}

/// Converts a duration to whole milliseconds for storage (saturating).
pub(crate) fn millis(d: Duration) -> i64 {
    crate::duration::clamped_millis(d)
}

/// Store-clock milliseconds to a `Duration` (negative becomes zero).
pub(crate) fn duration_ms(ms: i64) -> Duration {
    Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(status: Status, lease_until_ms: i64, expire_at_ms: i64) -> RecordState<'static> {
        RecordState {
            status,
            fingerprint: None,
            lease_until_ms,
            expire_at_ms,
            result_until_ms: None,
        }
    }

    #[test]
    fn a_tombstone_refuses_its_payload_and_mismatches_another() {
        let mut done = rec(Status::Succeeded, 100, 10_000);
        done.fingerprint = Some("a");
        done.result_until_ms = Some(500);
        assert_eq!(decide(&done, Some("a"), 499), Decision::Replay);
        assert_eq!(decide(&done, Some("a"), 500), Decision::ResultGone);
        assert_eq!(decide(&done, None, 9_999), Decision::ResultGone);
        assert_eq!(decide(&done, Some("b"), 600), Decision::Mismatch);
        // Dropped by a sweep: gone at any time; the key's own expiry still ends it.
        done.result_until_ms = Some(RESULT_DROPPED);
        assert_eq!(decide(&done, Some("a"), 200), Decision::ResultGone);
        assert!(matches!(
            decide(&done, Some("a"), 10_000),
            Decision::Take { reset: true, .. }
        ));
    }

    #[test]
    fn a_live_lease_outlives_the_ttl() {
        // TTL passed at 300, lease runs to 450: still in progress at 350.
        let live = rec(Status::Processing, 450, 300);
        assert_eq!(decide(&live, None, 350), Decision::InProgress(100));
        assert!(!live.is_expired(350));
        assert!(live.is_expired(450));
        // A finished record expires with its TTL whatever its old lease said.
        assert!(rec(Status::Succeeded, 450, 300).is_expired(350));
    }

    #[test]
    fn a_takeover_covers_its_lease_and_raises_the_fence() {
        let lease = Duration::from_millis(200);
        let ttl = Duration::from_millis(300);
        // Taken at 250 ms after a failure: the old expiry (300) is raised to the lease end (450).
        let t = taken(Some((1, 7_000, 300)), false, 250_000, lease, ttl);
        assert_eq!(
            t,
            Taken {
                attempt: 2,
                fence: 250_000,
                lease_until_ms: 450,
                expire_at_ms: 450
            }
        );
        // A fence already above the clock still goes up by one.
        assert_eq!(
            taken(Some((2, 900_000, 10_000)), false, 250_000, lease, ttl).fence,
            900_001
        );
        // An expired record starts a new life at attempt 1, with a fence above the old one.
        let t = taken(Some((5, 900_000, 100)), true, 250_000, lease, ttl);
        assert_eq!((t.attempt, t.fence, t.expire_at_ms), (1, 900_001, 550));
    }
}
