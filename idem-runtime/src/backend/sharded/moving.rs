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
use std::time::Duration;

use super::ShardedStore;
use super::layout::Phase;
use crate::IdemError;
use crate::store::{Acquired, BatchMark, Claim, ClaimOutcome, ClaimRequest, Store};

/// The claims this process holds on two shards, by `(biz, key)`: the old shard's claim (what the
/// caller holds) and the new shard's.
#[derive(Default)]
pub(crate) struct Held(std::sync::Mutex<HashMap<(String, String), Pair>>);

#[derive(Clone, Copy)]
pub(crate) struct Pair {
    a: (usize, Claim),
    b: (usize, Claim),
}

impl Held {
    fn insert(&self, biz: &str, key: &str, pair: Pair) {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert((biz.to_owned(), key.to_owned()), pair);
    }

    /// The pair whose old-shard claim is `claim`.
    fn get(&self, biz: &str, key: &str, claim: &Claim) -> Option<Pair> {
        let held = self.0.lock().unwrap_or_else(|p| p.into_inner());
        held.get(&(biz.to_owned(), key.to_owned()))
            .filter(|p| p.a.1 == *claim)
            .copied()
    }

    fn remove(&self, biz: &str, key: &str, claim: &Claim) {
        let mut held = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let k = (biz.to_owned(), key.to_owned());
        if held.get(&k).is_some_and(|p| p.a.1 == *claim) {
            held.remove(&k);
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
    Renew(Duration),
    Steps(&'a [u8]),
}

impl Write<'_> {
    /// Whether the write ends the claim.
    fn ends(self) -> bool {
        matches!(self, Write::Complete { .. } | Write::Fail)
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
            self.inner.held.insert(
                req.biz,
                req.key,
                Pair {
                    a: (a, ca),
                    b: (b, cb),
                },
            );
            return Ok(ClaimOutcome::Acquired {
                claim: ca,
                how: stronger(how, hb),
            });
        }
        let undo = match how {
            Acquired::TakeOver => shards[a].release(req.biz, req.key, &ca).await,
            Acquired::Fresh | Acquired::RetryAfterFailure => {
                shards[a].fail(req.biz, req.key, &ca).await
            }
        };
        if let Err(e) = undo {
            tracing::warn!(error = %e, biz = req.biz, key = req.key,
                "could not give back a moving key's claim on its old shard; it is taken over when its lease ends");
        }
        on_b
    }

    /// `write` under `claim`, on the shards the claim holds: both of a moving key's claims, in
    /// the order of the phase (the first one's answer is the call's; a failure of the second is
    /// logged), or the one shard the key was claimed on.
    pub(crate) async fn write(
        &self,
        biz: &str,
        key: &str,
        claim: &Claim,
        write: Write<'_>,
    ) -> Result<(), IdemError> {
        let view = self.view().await?;
        let shards = &self.inner.shards;
        let Some(pair) = self.inner.held.get(biz, key, claim) else {
            // Claimed on one shard: the key's shard, or, while it moves, its old one (it was
            // claimed before the dual phases).
            let at = view.claimed_on(biz, key, shards.len())?;
            return write.to(&shards[at], biz, key, claim).await;
        };
        let old_first = view
            .layout
            .as_ref()
            .is_none_or(|l| l.phase < Phase::DualNew);
        let (first, second) = if old_first {
            (pair.a, pair.b)
        } else {
            (pair.b, pair.a)
        };
        let answer = write.to(&shards[first.0], biz, key, &first.1).await;
        if let Err(e) = &answer {
            // A transient error may be retried with the same claim: keep the pair for it.
            if !matches!(
                e,
                IdemError::StoreUnavailable { .. } | IdemError::StoreBusy { .. }
            ) && write.ends()
            {
                self.inner.held.remove(biz, key, claim);
            }
            return answer;
        }
        if let Err(e) = write.to(&shards[second.0], biz, key, &second.1).await {
            tracing::warn!(error = %e, biz, key,
                "a moving key's second shard did not take a write its first took");
        }
        if write.ends() {
            self.inner.held.remove(biz, key, claim);
        }
        Ok(())
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
            if self.inner.held.get(biz, m.key, &m.claim).is_some() {
                let write = Write::Complete {
                    snapshot: m.snapshot,
                    ttl,
                    result_ttl: m.result_ttl,
                };
                answers[i] = Some(self.write(biz, m.key, &m.claim, write).await);
                continue;
            }
            let at = self.view().await?.claimed_on(biz, m.key, shards)?;
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
