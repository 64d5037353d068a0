//! Batches: many calls claimed in one round trip per store, each then run on its own as a lease
//! mode call whose claim is already decided (the rest of the engine path is [`execute`]'s, so
//! holding, heartbeats, steps, recover fns and marks are the same as a single call's).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::time::Instant;

use super::snapshot::{ErrType, OkType};
use super::{Call, NoRecover, STORE_TIMEOUT, StoreHandle, execute, retry_transient};
use crate::IdemError;
use crate::metrics::Outcome;
use crate::store::{BatchClaim, BatchItem, BatchMark, Claim, ClaimOutcome, MAX_BATCH, Store};

/// A claim decided by a batch: what the store answered and when the claim was sent (the lease
/// is counted from then).
#[derive(Debug)]
pub(crate) struct Prefetched {
    pub(crate) outcome: ClaimOutcome,
    pub(crate) sent: Instant,
}

/// What a call run as part of a batch brings to the engine: its claim, when the batch made it,
/// and where its mark goes when the batch sends the marks together.
pub(crate) struct BatchPart {
    pub(crate) prefetched: Option<Prefetched>,
    pub(crate) defer: Option<Deferred>,
}

/// A success whose mark the batch sends with the others' (`Inbox::handle_batch`): the call
/// returns its value once the body ran, and is reported once its mark landed.
#[derive(Debug)]
pub(crate) struct PendingMark {
    pub(crate) biz: String,
    pub(crate) key: String,
    pub(crate) claim: Claim,
    pub(crate) snapshot: Vec<u8>,
    pub(crate) ttl: Duration,
    pub(crate) result_ttl: Option<Duration>,
    /// The outcome to report once the mark landed.
    pub(crate) done: Outcome,
    /// When the claim's lease was last sent, and how long it is.
    pub(crate) lease_sent: Instant,
    pub(crate) lease: Duration,
}

/// The marks a batch holds back, each with the index of its call in the batch.
pub(crate) type MarkSink = Arc<Mutex<Vec<(usize, PendingMark)>>>;

/// Where one call's mark goes: the batch's sink, under the call's index.
pub(crate) struct Deferred {
    sink: MarkSink,
    index: usize,
}

impl Deferred {
    pub(crate) fn push(self, mark: PendingMark) {
        self.sink
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((self.index, mark));
    }
}

/// Sends the marks held back in `sink`, emptying it: one [`Store::complete_batch`] per business
/// type and ttl (of at most [`MAX_BATCH`]), tried again on transient errors within `timeout`;
/// when a batch fails, each of its marks is sent on its own, tried until its lease's safe part
/// ends or the store timeout runs out (as a single call's mark is). Each call is reported (its
/// outcome, or `LeaseLost` / `MarkFailed`) and answered by its index: the outcome and attempt, or
/// why its mark did not land.
pub(crate) async fn flush_marks(
    store: &dyn Store,
    sink: &MarkSink,
    timeout: Duration,
) -> Vec<(usize, Result<(Outcome, u32), IdemError>)> {
    let pending = std::mem::take(&mut *sink.lock().unwrap_or_else(|p| p.into_inner()));
    // Marks of one business type and ttl, with their calls' indexes.
    type Group = ((String, Duration), Vec<(usize, PendingMark)>);
    let mut groups: Vec<Group> = Vec::new();
    for (i, mark) in pending {
        let group = (mark.biz.clone(), mark.ttl);
        match groups
            .iter_mut()
            .find(|(g, marks)| *g == group && marks.len() < MAX_BATCH)
        {
            Some((_, marks)) => marks.push((i, mark)),
            None => groups.push((group, vec![(i, mark)])),
        }
    }
    let mut answers = Vec::new();
    for ((biz, ttl), marks) in groups {
        let batch: Vec<BatchMark<'_>> = marks
            .iter()
            .map(|(_, m)| BatchMark {
                key: &m.key,
                claim: m.claim,
                snapshot: &m.snapshot,
                result_ttl: m.result_ttl,
            })
            .collect();
        let sent = retry_transient(super::after(timeout), STORE_TIMEOUT, || {
            store.complete_batch(&biz, &batch, ttl)
        })
        .await;
        let landed: Vec<Result<(), IdemError>> = match sent {
            Ok(landed) if landed.len() == marks.len() => landed,
            failed => {
                if let Err(e) = &failed {
                    tracing::warn!(marks = marks.len(), error = %e, "a batch of marks failed; each is sent on its own");
                }
                let mut landed = Vec::with_capacity(marks.len());
                for (_, m) in &marks {
                    landed.push(mark_alone(store, m, timeout).await);
                }
                landed
            }
        };
        for ((i, m), landed) in marks.into_iter().zip(landed) {
            let attempt = m.claim.attempt;
            answers.push(match landed {
                Ok(()) => {
                    super::report(&biz, m.done, attempt);
                    (i, Ok((m.done, attempt)))
                }
                Err(e) => {
                    let outcome = match e {
                        IdemError::LeaseLost { .. } => Outcome::LeaseLost,
                        _ => Outcome::MarkFailed,
                    };
                    tracing::error!(attempt, error = %e, "idempotent call ran but its mark did not land");
                    super::report_error(&biz, outcome, attempt, &e);
                    (i, Err(e))
                }
            });
        }
    }
    answers
}

/// One held-back mark sent on its own, tried again on transient errors until its lease's safe
/// part ends or `timeout` (the store timeout) runs out, whichever comes first: a store gone
/// silent holds it no longer than a single call's mark.
async fn mark_alone(
    store: &dyn Store,
    m: &PendingMark,
    timeout: Duration,
) -> Result<(), IdemError> {
    let margin = (m.lease / 10).min(Duration::from_secs(1));
    let safe_end = (m.lease_sent + m.lease).checked_sub(margin);
    let until = match (safe_end, super::after(timeout)) {
        (Some(safe_end), Some(give_up)) => Some(safe_end.min(give_up)),
        (safe_end, give_up) => give_up.or(safe_end),
    };
    retry_transient(until, STORE_TIMEOUT, || match m.result_ttl {
        None => store.complete(&m.biz, &m.key, &m.claim, &m.snapshot, m.ttl),
        Some(kept) => store.complete_keeping(&m.biz, &m.key, &m.claim, &m.snapshot, m.ttl, kept),
    })
    .await
}

/// Many [`Call`]s claimed at once: the keys of one business type (with one lease and ttl) go to
/// the store in one [`Store::claim_batch`] (one round trip on every store of this crate, see
/// there), instead of one claim per call. What a broker consumer does with the messages of one
/// fetch.
///
/// [`Batch::claim`] hands back one [`Claimed`] per call, in order; running it runs the body only
/// if its claim was acquired, exactly as [`Call::run`] would have: a repeat replays the stored
/// result, one in progress elsewhere is refused, and each claim acquired is marked on its own, so
/// a body that fails frees only its own key.
///
/// ```
/// # use idem_runtime as idem;
/// # async fn demo(store: &idem::MemoryStore) -> Result<(), idem::IdemError> {
/// use idem::{Call, batch::Batch};
///
/// let orders = ["ORD-1", "ORD-2", "ORD-1"]; // a duplicate inside the batch
/// let claimed = Batch::new(orders.iter().map(|no| Call::new("SHIP", no))).claim(store).await;
/// let mut shipped = Vec::new();
/// for (claimed, no) in claimed.into_iter().zip(orders) {
///     let shipment: Result<String, idem::IdemError> =
///         claimed.run(async { Ok(format!("shipment of {no}")) }).await;
///     shipped.push(shipment?);
/// }
/// // The second ORD-1 claims when it runs, after the first was marked: a replay.
/// assert_eq!(shipped, ["shipment of ORD-1", "shipment of ORD-2", "shipment of ORD-1"]);
/// # Ok(()) }
/// ```
///
/// - **Calls**: any number. Calls of one business type, lease and ttl share a claim of at most
///   [`MAX_BATCH`] keys; a longer batch, or one that mixes them, is sent as several.
/// - **A key twice** in one batch: only its first call is in the batch claim; a repeat claims on
///   its own when it runs, so run in order it replays the first's answer (or, if the first
///   failed, retries).
/// - **Run every claim acquired** (or [`release`](Claimed::release) it): a claim dropped unrun
///   holds its key until its lease ends, as one whose holder died. Its lease runs from the batch
///   claim: a call run after its lease's safe part renews it first (fenced) and runs only if it
///   is still its own.
/// - **When the batch claim fails** (the store unreachable past the store timeout of the first
///   call), each call claims on its own when it runs, with the usual retries; a backend error
///   after part of the batch was claimed leaves those keys held until their lease ends.
/// - Lease mode only: a transaction-mode call claims inside its own transaction.
#[derive(Debug, Default)]
#[must_use = "a batch does nothing until it is claimed"]
pub struct Batch {
    calls: Vec<Call>,
}

impl Batch {
    /// A batch of `calls`, in the order their [`Claimed`] come back.
    pub fn new(calls: impl IntoIterator<Item = Call>) -> Self {
        Batch {
            calls: calls.into_iter().collect(),
        }
    }

    /// How many calls the batch holds.
    pub fn len(&self) -> usize {
        self.calls.len()
    }

    /// Whether the batch holds no call.
    pub fn is_empty(&self) -> bool {
        self.calls.is_empty()
    }

    /// Claims every call's key on `store`: one [`Store::claim_batch`] per business type, lease and
    /// ttl (of at most [`MAX_BATCH`] keys). Returns the calls in order, each with its claim
    /// decided, but a key's repeats, which claim when they run, and a call the store would refuse
    /// (a bad key, a ttl out of range), which gives its error when it runs.
    pub async fn claim(self, store: &dyn Store) -> Vec<Claimed<'_>> {
        let mut decided: Vec<Option<Prefetched>> = self.calls.iter().map(|_| None).collect();
        for (firsts, timeout) in plan(&self.calls, store) {
            for chunk in firsts.chunks(MAX_BATCH) {
                claim_chunk(store, &self.calls, chunk, timeout, &mut decided).await;
            }
        }
        self.calls
            .into_iter()
            .zip(decided)
            .map(|(call, prefetched)| Claimed {
                call,
                store,
                prefetched,
                defer: None,
            })
            .collect()
    }
}

/// The indexes of each key's first call, grouped by business type, lease and ttl (in order of
/// first appearance), with the store timeout of the group's first call. A key's repeats, and
/// calls the store refuses, are in none.
fn plan(calls: &[Call], store: &dyn Store) -> Vec<(Vec<usize>, Duration)> {
    let mut groups: Vec<(Vec<usize>, Duration)> = Vec::new();
    let mut group_of: HashMap<(&str, Duration, Duration), usize> = HashMap::new();
    let mut seen: HashSet<(&str, &str)> = HashSet::new();
    for (i, call) in calls.iter().enumerate() {
        let Ok(req) = call.request(store) else {
            continue;
        };
        if !seen.insert((call.biz(), call.key())) {
            continue;
        }
        let g = *group_of
            .entry((call.biz(), req.lease, req.ttl))
            .or_insert_with(|| {
                groups.push((Vec::new(), call.store_timeout_in_force()));
                groups.len() - 1
            });
        groups[g].0.push(i);
    }
    groups
}

/// Claims the calls at `chunk` (distinct keys of one group) in one batch claim, and keeps what the
/// store decided for each; a claim that fails leaves them undecided (each claims when it runs).
async fn claim_chunk(
    store: &dyn Store,
    calls: &[Call],
    chunk: &[usize],
    timeout: Duration,
    decided: &mut [Option<Prefetched>],
) {
    let reqs: Vec<_> = chunk
        .iter()
        .filter_map(|&i| calls[i].request(store).ok())
        .collect();
    let (Some(first), true) = (reqs.first(), reqs.len() == chunk.len()) else {
        return;
    };
    let items: Vec<BatchItem<'_>> = reqs
        .iter()
        .map(|r| BatchItem {
            key: r.key,
            fingerprint: r.fingerprint,
        })
        .collect();
    let batch = BatchClaim {
        biz: first.biz,
        items: &items,
        lease: first.lease,
        ttl: first.ttl,
    };
    let sent = Instant::now();
    let claimed = retry_transient(super::after(timeout), STORE_TIMEOUT, || {
        store.claim_batch(&batch)
    })
    .await;
    match claimed {
        Ok(outcomes) if outcomes.len() == chunk.len() => {
            for (&i, outcome) in chunk.iter().zip(outcomes) {
                decided[i] = Some(Prefetched { outcome, sent });
            }
        }
        Ok(outcomes) => tracing::warn!(
            asked = chunk.len(),
            answered = outcomes.len(),
            "a batch claim answered for another number of keys; each call claims on its own"
        ),
        Err(e) => tracing::warn!(
            keys = chunk.len(),
            error = %e,
            "a batch claim failed; each call claims on its own when it runs"
        ),
    }
}

/// One call of a [`Batch`], its claim decided: run it (or release it) as the batch docs say.
#[must_use = "a claim acquired and not run holds its key until its lease ends"]
pub struct Claimed<'s> {
    call: Call,
    store: &'s dyn Store,
    prefetched: Option<Prefetched>,
    defer: Option<Deferred>,
}

impl std::fmt::Debug for Claimed<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Claimed")
            .field("call", &self.call)
            .field("store", &self.store.backend())
            .field("outcome", &self.outcome())
            .finish()
    }
}

impl<'s> Claimed<'s> {
    /// The call.
    pub fn call(&self) -> &Call {
        &self.call
    }

    /// The same call, its mark of success held back in `sink` under `index` (the batch sends
    /// them together with [`flush_marks`]).
    pub(crate) fn deferring(mut self, sink: &MarkSink, index: usize) -> Self {
        self.defer = Some(Deferred {
            sink: sink.clone(),
            index,
        });
        self
    }

    /// This call's part of the batch, for the engine.
    fn part(prefetched: Option<Prefetched>, defer: Option<Deferred>) -> Option<Box<BatchPart>> {
        Some(Box::new(BatchPart { prefetched, defer }))
    }

    /// What the batch claim decided for this call: `None` when it was not sent (a key's repeat;
    /// a call the store refuses) or the batch claim failed; the call then claims on its own when
    /// it runs.
    pub fn outcome(&self) -> Option<&ClaimOutcome> {
        self.prefetched.as_ref().map(|p| &p.outcome)
    }

    /// Whether running the call runs its body: its claim was acquired (or is still to be made).
    pub fn runs_body(&self) -> bool {
        matches!(self.outcome(), None | Some(ClaimOutcome::Acquired { .. }))
    }

    /// Runs `body` if the call's claim was acquired, as [`Call::run`] does after its claim;
    /// otherwise answers as `Call::run` answers a repeat (the stored result, or the refusal).
    ///
    /// # Errors
    /// As [`Call::run`].
    #[inline]
    pub fn run<T, E, F>(self, body: F) -> impl Future<Output = Result<T, E>> + 's
    where
        T: Serialize + DeserializeOwned + 's,
        E: From<IdemError> + 's,
        F: Future<Output = Result<T, E>> + 's,
    {
        execute(
            Ok(StoreHandle::Borrowed(self.store)),
            self.call,
            OkType::new(),
            ErrType::new(),
            None::<NoRecover<T, E>>,
            Self::part(self.prefetched, self.defer),
            None,
            body,
        )
    }

    /// The call with a recover fn, asked first when the claim took over one whose holder did not
    /// finish: see [`Call::recover`].
    pub fn recover<R>(self, recover: R) -> ClaimedRecovering<'s, R> {
        ClaimedRecovering {
            claimed: self,
            recover,
        }
    }

    /// Gives the claim up without running the body, when it was acquired: the record stays
    /// PROCESSING with its lease ended, so the next call takes it over at once (as
    /// [`Store::release`]). Nothing is sent for a call whose claim was not acquired.
    ///
    /// # Errors
    /// As [`Store::release`]; the claim is then taken over once its lease ends.
    pub async fn release(self) -> Result<(), IdemError> {
        match self.prefetched {
            Some(Prefetched {
                outcome: ClaimOutcome::Acquired { claim, .. },
                ..
            }) => {
                self.store
                    .release(self.call.biz(), self.call.key(), &claim)
                    .await
            }
            _ => Ok(()),
        }
    }
}

/// A [`Claimed`] call with a recover fn: see [`Claimed::recover`].
#[derive(Debug)]
#[must_use = "a claim acquired and not run holds its key until its lease ends"]
pub struct ClaimedRecovering<'s, R> {
    claimed: Claimed<'s>,
    recover: R,
}

impl<'s, R> ClaimedRecovering<'s, R> {
    /// As [`Claimed::run`], asking the recover fn first after a takeover.
    ///
    /// # Errors
    /// As [`Call::run`], plus the recover fn's own error.
    #[inline]
    pub fn run<T, E, F, RF>(self, body: F) -> impl Future<Output = Result<T, E>> + 's
    where
        T: Serialize + DeserializeOwned + 's,
        E: From<IdemError> + 's,
        F: Future<Output = Result<T, E>> + 's,
        R: FnOnce() -> RF + 's,
        RF: Future<Output = Result<Option<T>, E>> + 's,
    {
        let Claimed {
            call,
            store,
            prefetched,
            defer,
        } = self.claimed;
        execute(
            Ok(StoreHandle::Borrowed(store)),
            call,
            OkType::new(),
            ErrType::new(),
            Some(self.recover),
            Claimed::part(prefetched, defer),
            None,
            body,
        )
    }
}
