//! The claim protocol of the SQL stores: insert-or-skip, then compare-and-set.
//!
//! Uniqueness is decided by one atomic write, never by a read: a new record is an insert that
//! skips on the unique `(biz_type, idem_key)` (a read before it only saves repeats the write); an
//! existing one is changed only by an `UPDATE … WHERE
//! fence = <seen> AND status = <seen> AND lease_until = <seen>`, so two callers that read the same
//! row cannot both win. The loser backs off (with jitter) and reads again.
//!
//! A store's [`ClaimOrder`] chooses the first step: the insert (new keys) or a plain read (repeats:
//! a live success is decided by the read alone, see `store/order.rs`).

use crate::IdemError;
use crate::backoff::back_off;
use crate::store::decide::{Decision, RecordState, decide, duration_ms};
use crate::store::order::ClaimOrder;
use crate::store::{Acquired, Claim, ClaimOutcome, ClaimRequest, Fence, Status, keeps_steps};

/// A row as read for the claim decision, with the database's clock.
#[derive(Debug)]
pub(crate) struct SeenRecord {
    pub status: Status,
    pub attempt: u32,
    pub fence: u64,
    pub fingerprint: Option<String>,
    pub snapshot: Option<Vec<u8>>,
    pub lease_until_ms: i64,
    pub expire_at_ms: i64,
    pub result_until_ms: Option<i64>,
    pub now_ms: i64,
}

impl SeenRecord {
    /// The record a claim's insert just wrote, as far as the claim needs it: PROCESSING under
    /// `attempt` and `fence` (the times are not read back). The server stores' (SQLite's claim
    /// is given the clock and reads its record whole).
    #[cfg(any(feature = "mysql", feature = "postgres"))]
    pub(crate) fn inserted(attempt: u32, fence: u64) -> Self {
        SeenRecord {
            status: Status::Processing,
            attempt,
            fence,
            fingerprint: None,
            snapshot: None,
            lease_until_ms: 0,
            expire_at_ms: 0,
            result_until_ms: None,
            now_ms: 0,
        }
    }

    pub(crate) fn claim(&self) -> Claim {
        Claim {
            attempt: self.attempt,
            fence: Fence::new(self.fence),
        }
    }
}

/// The two primitive steps a SQL store provides, on one connection (a pool connection, or the
/// caller's transaction), and its batch of marks. Each step's future is `Send`, so the claim
/// protocol below runs in the shared `Store` impl (`store.rs`) whatever the database.
pub(crate) trait CasRecords: Send {
    /// Reads the record with the database's clock: a plain read (no lock, the latest committed row
    /// in lease mode, the transaction's snapshot in tx mode). `None` when there is none.
    fn read(
        &mut self,
        req: &ClaimRequest<'_>,
    ) -> impl Future<Output = Result<Option<SeenRecord>, IdemError>> + Send;

    /// Reads the record, or inserts a new PROCESSING record (attempt 1, a fence from the clock) when
    /// there is none: `(inserted, record)`. `None` when a record appeared or vanished between the
    /// read and the insert (another writer was faster): read again.
    fn insert_or_read(
        &mut self,
        req: &ClaimRequest<'_>,
    ) -> impl Future<Output = Result<(bool, Option<SeenRecord>), IdemError>> + Send;

    /// Inserts a new PROCESSING record for each of `reqs` (distinct keys of one business type,
    /// one lease and ttl) that has none, in one statement: for each, its claim if this statement
    /// inserted its record. `None` when the database cannot say which it inserted (MySQL refuses
    /// the whole statement when one key exists): nothing was inserted then. The default inserts
    /// nothing and says so.
    fn insert_many(
        &mut self,
        reqs: &[ClaimRequest<'_>],
    ) -> impl Future<Output = Result<Option<Vec<Option<Claim>>>, IdemError>> + Send {
        let _ = reqs;
        std::future::ready(Ok(None))
    }

    /// Reads the records of `reqs` (as [`CasRecords::read`] reads one), in one statement where the
    /// database allows: for each, its record or `None`. The default reads them one by one.
    fn read_many(
        &mut self,
        reqs: &[ClaimRequest<'_>],
    ) -> impl Future<Output = Result<Vec<Option<SeenRecord>>, IdemError>> + Send {
        async move {
            let mut seen = Vec::with_capacity(reqs.len());
            for req in reqs {
                seen.push(self.read(req).await?);
            }
            Ok(seen)
        }
    }

    /// Takes `seen` over if it is unchanged (same fence, status and lease end): a new fence, a new
    /// lease, and an expiry that covers the lease (a new life when `reset`); the saved steps (in
    /// `result`) are kept when `keep_steps`, else cleared. `None` when the record changed since it
    /// was read.
    fn take(
        &mut self,
        req: &ClaimRequest<'_>,
        seen: &SeenRecord,
        reset: bool,
        keep_steps: bool,
    ) -> impl Future<Output = Result<Option<Claim>, IdemError>> + Send;

    /// Marks a batch of held records done (lease mode), in as few round trips as the database
    /// allows: for each mark, whether its claim still held.
    fn complete_many(
        &mut self,
        biz: &str,
        marks: &[crate::store::BatchMark<'_>],
        ttl: std::time::Duration,
    ) -> impl Future<Output = Result<Vec<Result<(), IdemError>>, IdemError>> + Send;
}

/// How many times a claim reads again after losing a race before it reports the key as busy.
const MAX_RACES: u32 = 12;

/// The decision table on a row as read.
fn decided(seen: &SeenRecord, req: &ClaimRequest<'_>) -> Decision {
    let state = RecordState {
        status: seen.status,
        fingerprint: seen.fingerprint.as_deref(),
        lease_until_ms: seen.lease_until_ms,
        expire_at_ms: seen.expire_at_ms,
        result_until_ms: seen.result_until_ms,
    };
    decide(&state, req.fingerprint, seen.now_ms)
}

/// How many times a lease-mode claim (of one key or a batch) runs in all while the database
/// picks it as a deadlock victim (the engine's own retry of transient errors comes on top).
pub(crate) const DEADLOCK_TRIES: u32 = 8;

/// Runs `$claim` (an expression awaiting a lease-mode claim: one autocommit statement at a time,
/// so running it again is safe) again with jittered back-off while the database picks it as a
/// deadlock victim, up to [`DEADLOCK_TRIES`] times in all; each retry is counted
/// (`idem_store_retries_total`, reason `deadlock`). InnoDB deadlocks concurrent inserts of one
/// key when a claimant's statement rolls back while others wait on the key (a batch whose insert
/// met an existing key, whatever the order of its keys): each waiter then holds a shared lock
/// that the other's insert must wait for. (A macro: the claim borrows the connection anew on each
/// run, which a closure's future cannot.)
macro_rules! retry_deadlocks {
    ($backend:expr, $claim:expr) => {{
        let mut tried = 0;
        loop {
            match $claim {
                Err(e)
                    if e.restarts_transaction()
                        && tried + 1 < $crate::sql::claim::DEADLOCK_TRIES =>
                {
                    tried += 1;
                    $crate::metrics::store_retry($backend, "deadlock");
                    $crate::backoff::back_off(tried).await;
                }
                done => break done,
            }
        }
    }};
}
pub(crate) use retry_deadlocks;

/// Runs the claim protocol on `records` (lease mode), the first step chosen by `order`, which
/// learns what the claim found.
#[cfg_attr(not(any(feature = "mysql", feature = "postgres")), allow(dead_code))]
pub(crate) async fn claim_by_cas<C: CasRecords>(
    records: &mut C,
    req: &ClaimRequest<'_>,
    order: &ClaimOrder,
) -> Result<ClaimOutcome, IdemError> {
    claim_observed(records, req, order, order.read_first()).await
}

/// Runs the claim protocol on `records` with the insert step first whatever `order` says (which
/// still learns what the claim found): in a transaction (in its savepoint), where a duplicate
/// insert waits for the transaction that holds the key and reads it with a current read (SQLite's
/// insert step reads first anyway, in the same round trip).
pub(crate) async fn claim_insert_first<C: CasRecords>(
    records: &mut C,
    req: &ClaimRequest<'_>,
    order: &ClaimOrder,
) -> Result<ClaimOutcome, IdemError> {
    claim_observed(records, req, order, false).await
}

/// The claim protocol, whose outcome `order` learns.
async fn claim_observed<C: CasRecords>(
    records: &mut C,
    req: &ClaimRequest<'_>,
    order: &ClaimOrder,
    read_first: bool,
) -> Result<ClaimOutcome, IdemError> {
    let outcome = claim_in_order(records, req, read_first).await;
    if let Ok(outcome) = &outcome {
        order.observe(outcome);
    }
    outcome
}

/// In a transaction, before its savepoint: when `order` says repeats prevail, one plain read, which
/// answers a live success (its replay, or a mismatch) on its own. `None`: claim as usual (a record
/// that is not a live success is decided by the locking claim, never by the transaction's
/// snapshot: [`claim_insert_first`]).
pub(crate) async fn replay_by_read<C: CasRecords>(
    records: &mut C,
    req: &ClaimRequest<'_>,
    order: &ClaimOrder,
) -> Result<Option<ClaimOutcome>, IdemError> {
    if !order.read_first() {
        return Ok(None);
    }
    let Some(seen) = records.read(req).await? else {
        return Ok(None);
    };
    let outcome = match (seen.status, decided(&seen, req)) {
        (Status::Succeeded, Decision::Replay) => ClaimOutcome::Replay {
            snapshot: seen.snapshot.unwrap_or_default(),
        },
        (Status::Succeeded, Decision::Mismatch) => ClaimOutcome::Mismatch,
        (Status::Succeeded, Decision::ResultGone) => ClaimOutcome::ResultGone,
        _ => return Ok(None),
    };
    order.observe(&outcome);
    Ok(Some(outcome))
}

/// The claim protocol; the first step a plain read when `read_first`.
async fn claim_in_order<C: CasRecords>(
    records: &mut C,
    req: &ClaimRequest<'_>,
    mut read_first: bool,
) -> Result<ClaimOutcome, IdemError> {
    for race in 0..MAX_RACES {
        let (inserted, seen) = match std::mem::take(&mut read_first) {
            true => match records.read(req).await? {
                Some(seen) => (false, Some(seen)),
                None => records.insert_or_read(req).await?,
            },
            false => records.insert_or_read(req).await?,
        };
        if let Some(seen) = seen {
            if inserted {
                return Ok(ClaimOutcome::Acquired {
                    claim: seen.claim(),
                    how: Acquired::Fresh,
                });
            }
            match decided(&seen, req) {
                Decision::Take { how, reset } => {
                    let keep = keeps_steps(reset, seen.fingerprint.as_deref(), req.fingerprint);
                    if let Some(claim) = records.take(req, &seen, reset, keep).await? {
                        return Ok(ClaimOutcome::Acquired { claim, how });
                    }
                }
                Decision::Replay => {
                    return Ok(ClaimOutcome::Replay {
                        snapshot: seen.snapshot.unwrap_or_default(),
                    });
                }
                Decision::ResultGone => return Ok(ClaimOutcome::ResultGone),
                Decision::Mismatch => return Ok(ClaimOutcome::Mismatch),
                Decision::InProgress(ms) => {
                    return Ok(ClaimOutcome::InProgress {
                        retry_after: duration_ms(ms),
                    });
                }
            }
        }
        // Another writer changed (or swept) the record between our read and our write.
        back_off(race).await;
    }
    // Every try lost a race: the key is hot; the caller may retry.
    Ok(ClaimOutcome::InProgress {
        retry_after: std::time::Duration::from_millis(10),
    })
}

/// The claim protocol for many keys at once (a batch claim in lease mode): the insert of every new
/// key and the read of every existing one in one statement each, the first step chosen by `order`
/// as for one key; each record read is decided by the table, and a takeover or a retry takes its
/// record with its own compare-and-set. A key whose record changed between the statements (a race)
/// is claimed on its own. `order` learns every outcome.
pub(crate) async fn claim_many<C: CasRecords>(
    records: &mut C,
    reqs: &[ClaimRequest<'_>],
    order: &ClaimOrder,
) -> Result<Vec<ClaimOutcome>, IdemError> {
    let mut out: Vec<Option<ClaimOutcome>> = vec![None; reqs.len()];
    let mut inserted_first = false;
    if !order.read_first() {
        inserted_first = insert_new(
            records,
            reqs,
            &(0..reqs.len()).collect::<Vec<_>>(),
            &mut out,
        )
        .await?;
    }
    let pending: Vec<usize> = (0..reqs.len()).filter(|&i| out[i].is_none()).collect();
    if !pending.is_empty() {
        let asked: Vec<ClaimRequest<'_>> = pending.iter().map(|&i| reqs[i]).collect();
        let seen = records.read_many(&asked).await?;
        let mut missing = Vec::new();
        for (&i, seen) in pending.iter().zip(seen) {
            match seen {
                None => missing.push(i),
                Some(seen) => out[i] = decide_seen(records, &reqs[i], seen).await?,
            }
        }
        // Keys the insert did not try (a read first), or that vanished since (swept).
        if !missing.is_empty() && !inserted_first {
            insert_new(records, reqs, &missing, &mut out).await?;
        }
    }
    let mut outcomes = Vec::with_capacity(reqs.len());
    for (req, decided) in reqs.iter().zip(out) {
        let outcome = match decided {
            Some(outcome) => outcome,
            None => claim_in_order(records, req, false).await?,
        };
        order.observe(&outcome);
        outcomes.push(outcome);
    }
    Ok(outcomes)
}

/// Inserts the keys of `reqs` at `at` in one statement; the ones inserted are acquired in `out`.
/// Whether the statement could say which it inserted.
async fn insert_new<C: CasRecords>(
    records: &mut C,
    reqs: &[ClaimRequest<'_>],
    at: &[usize],
    out: &mut [Option<ClaimOutcome>],
) -> Result<bool, IdemError> {
    let asked: Vec<ClaimRequest<'_>> = at.iter().map(|&i| reqs[i]).collect();
    let Some(claims) = records.insert_many(&asked).await? else {
        return Ok(false);
    };
    for (&i, claim) in at.iter().zip(claims) {
        if let Some(claim) = claim {
            out[i] = Some(ClaimOutcome::Acquired {
                claim,
                how: Acquired::Fresh,
            });
        }
    }
    Ok(true)
}

/// The decision for a record read by a batch claim: `None` when a take lost its race (the key is
/// then claimed on its own).
async fn decide_seen<C: CasRecords>(
    records: &mut C,
    req: &ClaimRequest<'_>,
    seen: SeenRecord,
) -> Result<Option<ClaimOutcome>, IdemError> {
    Ok(Some(match decided(&seen, req) {
        Decision::Take { how, reset } => {
            let keep = keeps_steps(reset, seen.fingerprint.as_deref(), req.fingerprint);
            match records.take(req, &seen, reset, keep).await? {
                Some(claim) => ClaimOutcome::Acquired { claim, how },
                None => return Ok(None),
            }
        }
        Decision::Replay => ClaimOutcome::Replay {
            snapshot: seen.snapshot.unwrap_or_default(),
        },
        Decision::ResultGone => ClaimOutcome::ResultGone,
        Decision::Mismatch => ClaimOutcome::Mismatch,
        Decision::InProgress(ms) => ClaimOutcome::InProgress {
            retry_after: duration_ms(ms),
        },
    }))
}
