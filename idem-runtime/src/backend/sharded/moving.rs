//! A moving key during a reshard's dual phases: claimed on its old shard, then on its new one;
//! marked on both, the old first in `DualOld` and the new first from `DualNew` on.
//!
//! Why the order: processes in `Planned` (old shard only) may still run beside `DualOld`, and
//! processes in `Done` (new shard only) beside `DualNew`. Claiming the old shard first makes it
//! decide between every pair of callers until `Done`; from `DualNew` on, a mark lands on the new
//! shard before the old, so a holder that dies between the two leaves the new shard, which
//! decides from `Done` on, finished. (The tool copies the records between the two dual phases'
//! processes and `Done`'s, so every record finished before `DualNew` is on the new shard by then.)

use std::collections::HashMap;
use std::time::{Duration, Instant};

use super::ShardedStore;
use super::layout::Phase;
use crate::IdemError;
use crate::store::{Acquired, BatchMark, Claim, ClaimOutcome, ClaimRequest, Store};

/// The claims this process holds, by `(biz, key, fence)` of the claim the caller holds: the
/// shard it was made on, or both claims of a moving key. A write under a claim goes where the
/// claim was made, with no need to read the layout (it may change while a body runs).
#[derive(Default)]
pub(crate) struct Held {
    claims: std::sync::Mutex<HashMap<(String, String, u64), Entry>>,
    inserted: std::sync::atomic::AtomicU64,
}

#[derive(Clone, Copy)]
pub(crate) enum Holds {
    One(usize),
    Pair {
        a: (usize, Claim),
        b: (usize, Claim),
    },
}

struct Entry {
    holds: Holds,
    /// When its lease ends, as far as this process knows.
    until: Instant,
}

/// How long past its lease a claim is remembered: a mark after that goes by the layout.
const REMEMBERED: Duration = Duration::from_secs(60);

impl Held {
    pub(crate) fn insert(
        &self,
        biz: &str,
        key: &str,
        claim: &Claim,
        holds: Holds,
        lease: Duration,
    ) {
        let now = Instant::now();
        let mut claims = self.claims.lock().unwrap_or_else(|p| p.into_inner());
        if self
            .inserted
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            % 4096
            == 4095
        {
            // Claims never finished (a caller dropped mid-call): forgotten a while after their lease.
            claims.retain(|_, e| e.until.checked_add(REMEMBERED).is_none_or(|t| t > now));
        }
        // A lease too long for the clock: remembered until the claim ends.
        let until = now
            .checked_add(lease)
            .unwrap_or(now + REMEMBERED * 1_000_000);
        claims.insert(
            (biz.to_owned(), key.to_owned(), claim.fence.get()),
            Entry { holds, until },
        );
    }

    fn get(&self, biz: &str, key: &str, claim: &Claim) -> Option<Holds> {
        let claims = self.claims.lock().unwrap_or_else(|p| p.into_inner());
        claims
            .get(&(biz.to_owned(), key.to_owned(), claim.fence.get()))
            .map(|e| e.holds)
    }

    /// After `write` under `claim` answered `answer`: forgets a claim that ended (not one whose
    /// write may be sent again after a transient error), or moves its lease end.
    fn after(
        &self,
        biz: &str,
        key: &str,
        claim: &Claim,
        write: Write<'_>,
        answer: &Result<(), IdemError>,
    ) {
        let k = (biz.to_owned(), key.to_owned(), claim.fence.get());
        let mut claims = self.claims.lock().unwrap_or_else(|p| p.into_inner());
        match (write, answer) {
            (_, Err(IdemError::StoreUnavailable { .. } | IdemError::StoreBusy { .. })) => {}
            (Write::Renew(lease), Ok(())) => {
                if let Some(e) = claims.get_mut(&k) {
                    let now = Instant::now();
                    e.until = now
                        .checked_add(lease)
                        .unwrap_or(now + REMEMBERED * 1_000_000);
                }
            }
            (w, _) if w.ends() => {
                claims.remove(&k);
            }
            (_, Err(IdemError::LeaseLost { .. })) => {
                claims.remove(&k);
            }
            _ => {}
        }
    }
}

/// A write that finishes or keeps a claim.
#[derive(Clone, Copy)]
pub(crate) enum Write<'a> {
    Complete {
        snapshot: &'a [u8],
        ttl: Duration,
        result_ttl: Option<Duration>,
    },
    Fail,
    Release,
    Renew(Duration),
    Steps(&'a [u8]),
}

impl Write<'_> {
    /// Whether the write ends the claim.
    fn ends(self) -> bool {
        matches!(self, Write::Complete { .. } | Write::Fail | Write::Release)
    }

    pub(crate) async fn to<S: Store + ?Sized>(
        self,
        shard: &S,
        biz: &str,
        key: &str,
        claim: &Claim,
    ) -> Result<(), IdemError> {
        match self {
            Write::Complete {
                snapshot,
                ttl,
                result_ttl: None,
            } => shard.complete(biz, key, claim, snapshot, ttl).await,
            Write::Complete {
                snapshot,
                ttl,
                result_ttl: Some(keep),
            } => {
                shard
                    .complete_keeping(biz, key, claim, snapshot, ttl, keep)
                    .await
            }
            Write::Fail => shard.fail(biz, key, claim).await,
            Write::Release => shard.release(biz, key, claim).await,
            Write::Renew(lease) => shard.renew(biz, key, claim, lease).await,
            Write::Steps(steps) => shard.save_steps(biz, key, claim, steps).await,
        }
    }
}

/// The stronger of two ways a claim came about: a takeover anywhere means an earlier attempt
/// may have done part of the work.
pub(super) fn stronger(a: Acquired, b: Acquired) -> Acquired {
    match (a, b) {
        (Acquired::TakeOver, _) | (_, Acquired::TakeOver) => Acquired::TakeOver,
        (Acquired::RetryAfterFailure, _) | (_, Acquired::RetryAfterFailure) => {
            Acquired::RetryAfterFailure
        }
        _ => Acquired::Fresh,
    }
}

/// Gives back a claim acquired as `how` without running anything under it: a takeover released
/// (the next call takes it over and asks recover, as it would have), a new or retried claim
/// failed (the next call retries).
pub(super) async fn give_back<S: Store + ?Sized>(
    shard: &S,
    biz: &str,
    key: &str,
    claim: &Claim,
    how: Acquired,
) -> Result<(), IdemError> {
    match how {
        Acquired::TakeOver => shard.release(biz, key, claim).await,
        Acquired::Fresh | Acquired::RetryAfterFailure => shard.fail(biz, key, claim).await,
    }
}

impl<S: Store> ShardedStore<S> {
    /// Claims a moving key: on its old shard `a`, and, if that is acquired, on its new shard `b`.
    /// The body runs only with both; otherwise the old shard's claim is given back as it was
    /// found (a takeover released, a new or retried claim failed) and the new shard's answer is
    /// the call's.
    pub(crate) async fn claim_moving(
        &self,
        req: &ClaimRequest<'_>,
        a: usize,
        b: usize,
    ) -> Result<ClaimOutcome, IdemError> {
        let shards = &self.inner.shards;
        let (ca, how) = match shards[a].claim(req).await? {
            ClaimOutcome::Acquired { claim, how } => (claim, how),
            other => return Ok(other),
        };
        let on_b = shards[b].claim(req).await;
        if let Ok(ClaimOutcome::Acquired { claim: cb, how: hb }) = on_b {
            let pair = Holds::Pair {
                a: (a, ca),
                b: (b, cb),
            };
            self.inner
                .held
                .insert(req.biz, req.key, &ca, pair, req.lease);
            return Ok(ClaimOutcome::Acquired {
                claim: ca,
                how: stronger(how, hb),
            });
        }
        if let Err(e) = give_back(&shards[a], req.biz, req.key, &ca, how).await {
            tracing::warn!(error = %e, biz = req.biz, key = req.key,
                "could not give back a moving key's claim on its old shard; it is taken over when its lease ends");
        }
        on_b
    }

    /// `write` under `claim`, on the shards the claim holds: both of a moving key's claims, in
    /// the order of the phase, or the one shard the key was claimed on. A mark's answer is the
    /// first shard's (a failure of the second is logged: the first decides from then on). A
    /// renewal holds only when both shards take it: a pair whose claim on either shard was taken
    /// over must not run on, since the other shard's callers may be running beside it.
    pub(crate) async fn write(
        &self,
        biz: &str,
        key: &str,
        claim: &Claim,
        write: Write<'_>,
    ) -> Result<(), IdemError> {
        let shards = &self.inner.shards;
        let (a, b) = match self.inner.held.get(biz, key, claim) {
            Some(Holds::One(at)) => {
                let answer = write.to(&shards[at], biz, key, claim).await;
                self.inner.held.after(biz, key, claim, write, &answer);
                return answer;
            }
            Some(Holds::Pair { a, b }) => (a, b),
            None => {
                // Not remembered (claimed long ago): where the layout says it was claimed.
                let at = self.view().await?.claimed_on(biz, key, shards.len())?;
                return write.to(&shards[at], biz, key, claim).await;
            }
        };
        let old_first = self
            .view()
            .await?
            .layout
            .as_ref()
            .is_none_or(|l| l.phase < Phase::DualNew);
        let (first, second) = if old_first { (a, b) } else { (b, a) };
        let mut answer = write.to(&shards[first.0], biz, key, &first.1).await;
        if answer.is_ok()
            && let Err(e) = write.to(&shards[second.0], biz, key, &second.1).await
        {
            if matches!(write, Write::Renew(_)) {
                answer = Err(e);
            } else {
                tracing::warn!(error = %e, biz, key,
                    "a moving key's second shard did not take a write its first took");
            }
        }
        self.inner.held.after(biz, key, claim, write, &answer);
        answer
    }

    /// Marks `marks` of `biz`: those held on two shards one by one, the others batched per shard.
    pub(crate) async fn complete_marks(
        &self,
        biz: &str,
        marks: &[BatchMark<'_>],
        ttl: Duration,
    ) -> Result<Vec<Result<(), IdemError>>, IdemError> {
        let shards = self.inner.shards.len();
        let mut answers: Vec<Option<Result<(), IdemError>>> = marks.iter().map(|_| None).collect();
        let mut per_shard: Vec<(Vec<usize>, Vec<BatchMark<'_>>)> =
            vec![(Vec::new(), Vec::new()); shards];
        for (i, m) in marks.iter().enumerate() {
            let at = match self.inner.held.get(biz, m.key, &m.claim) {
                Some(Holds::One(at)) => Some(at),
                Some(Holds::Pair { .. }) => None,
                None => Some(self.view().await?.claimed_on(biz, m.key, shards)?),
            };
            let Some(at) = at else {
                let write = Write::Complete {
                    snapshot: m.snapshot,
                    ttl,
                    result_ttl: m.result_ttl,
                };
                answers[i] = Some(self.write(biz, m.key, &m.claim, write).await);
                continue;
            };
            per_shard[at].0.push(i);
            per_shard[at].1.push(*m);
        }
        let sends = per_shard
            .iter()
            .enumerate()
            .filter(|(_, (at, _))| !at.is_empty())
            .map(|(shard, (at, part))| async move {
                let got = self.inner.shards[shard]
                    .complete_batch(biz, part, ttl)
                    .await?;
                for (m, answer) in part.iter().zip(&got) {
                    let write = Write::Complete {
                        snapshot: m.snapshot,
                        ttl,
                        result_ttl: m.result_ttl,
                    };
                    self.inner.held.after(biz, m.key, &m.claim, write, answer);
                }
                Ok::<_, IdemError>(at.iter().copied().zip(got).collect::<Vec<_>>())
            });
        for part in futures_util::future::join_all(sends).await {
            for (i, answer) in part? {
                answers[i] = Some(answer);
            }
        }
        crate::store::batch::all_answered(answers, "a shard")
    }
}
