//! `ShardedStore`: records spread over N stores of one backend, each key on the shard a stable hash
//! of `(biz, key)` picks. Beyond one database: several MySQL or Postgres databases (or engines that
//! speak their dialects), or several SQLite files.

mod route;
mod tx;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use crate::store::{Claim, ClaimOutcome, ClaimRequest, Limits, Record, Store};
use crate::{IdemError, TransactionalStore};
pub use tx::ShardedTx;

/// Records spread over several stores of one kind.
///
/// Each `(biz, key)` lives on one shard, picked by a hash that is stable across processes, builds
/// and versions of idem: SHA-256 of the business type's length (4 bytes, little-endian), the business
/// type and the key; its first 8 bytes (big-endian) go through jump consistent hashing (Lamping and
/// Veach, 2014) to a shard index. So every instance of a service, whatever its build, finds a key on
/// the same shard; and adding a shard at the end moves only about 1/N of the keys. Those keys
/// then look absent on their new shard: **a repeat of one of them runs again, and one under a live
/// lease on its old shard can be claimed a second time on its new one.** So change the list of
/// shards (its length or its order, which is part of the routing) only when the records of the
/// keys that move can be given up: no caller left on the old list, and their TTL passed (or their
/// records copied over first).
///
/// Its limits are the strictest of its shards' ([`ShardedStore::with_limits`] narrows them).
/// Lease-mode calls route by themselves; a
/// transactional call begins its transaction on the key's own shard with
/// [`ShardedStore::begin_for`], and a claim for a key of another shard in it is refused before
/// anything is written.
///
/// ```
/// # use idem_runtime as idem;
/// # async fn demo() -> Result<(), idem_runtime::IdemError> {
/// use idem::{Call, IdemError, ShardedStore, SqliteStore, Store};
/// let mut shards = Vec::new();
/// for _ in 0..4 {
///     let shard = SqliteStore::in_memory().await?;
///     shard.migrate().await?;
///     shards.push(shard);
/// }
/// let store = ShardedStore::new(shards)?;
/// let n: Result<u8, IdemError> = Call::new("PAY", "order-1").run(&store, async { Ok(1) }).await;
/// assert_eq!(n?, 1);
/// assert!(store.shard_of("PAY", "order-1").load("PAY", "order-1").await?.is_some());
/// # Ok(()) }
/// ```
pub struct ShardedStore<S> {
    inner: Arc<Inner<S>>,
    limits: Limits,
}

struct Inner<S> {
    shards: Vec<S>,
}

impl<S> Clone for ShardedStore<S> {
    fn clone(&self) -> Self {
        ShardedStore {
            inner: self.inner.clone(),
            limits: self.limits.clone(),
        }
    }
}

impl<S: Store> ShardedStore<S> {
    /// A store over `shards`, in this order (the order is part of the routing).
    ///
    /// # Errors
    /// [`IdemError::InvalidOptions`] for no shards, or more than 2³¹.
    pub fn new(shards: impl IntoIterator<Item = S>) -> Result<Self, IdemError> {
        let shards: Vec<S> = shards.into_iter().collect();
        if shards.is_empty() || shards.len() > i32::MAX as usize {
            return Err(IdemError::InvalidOptions {
                reason: format!(
                    "a sharded store needs 1 to 2^31 shards; it was given {}",
                    shards.len()
                ),
            });
        }
        let limits = strictest(&shards);
        Ok(ShardedStore {
            inner: Arc::new(Inner { shards }),
            limits,
        })
    }

    /// The same store with other limits, checked against every shard's: at most the strictest
    /// shard's limits, since a record may land on any shard.
    ///
    /// It narrows; it does not set the shards' limits. The shards are any [`Store`], which has no
    /// way to change its limits, and each was made (with its own `with_limits`) before it was
    /// given here: to raise the limits, give each shard its `with_limits(…)?` before
    /// [`ShardedStore::new`]. (A sharded [`AnyStore`](crate::AnyStore) does that for you: its
    /// `with_limits` is applied to every shard.)
    ///
    /// # Errors
    /// [`IdemError::InvalidOptions`] naming the limit some shard cannot hold and the bound.
    pub fn with_limits(mut self, limits: Limits) -> Result<Self, IdemError> {
        let room = strictest(&self.inner.shards);
        crate::store::check_limits("the strictest shard", &limits, &room)?;
        self.limits = limits;
        Ok(self)
    }

    /// The shards, in routing order.
    pub fn shards(&self) -> &[S] {
        &self.inner.shards
    }

    /// The index of the shard `(biz, key)` lives on.
    pub fn shard_index(&self, biz: &str, key: &str) -> usize {
        route::shard(biz, key, self.inner.shards.len())
    }

    /// The shard `(biz, key)` lives on.
    pub fn shard_of(&self, biz: &str, key: &str) -> &S {
        &self.inner.shards[self.shard_index(biz, key)]
    }
}

/// Each limit the smallest among `shards`'.
fn strictest<S: Store>(shards: &[S]) -> Limits {
    shards
        .iter()
        .fold(Limits::UNBOUNDED, |l, s| l.strictest(s.limits()))
}

impl<S: TransactionalStore> ShardedStore<S> {
    /// Begins a transaction on the shard of `(biz, key)`, for a `tx = "…"` call with that key (its
    /// `biz` and its key as the attribute computes it, e.g. `idem::IdemKey::to_key(&order_no)`).
    ///
    /// # Errors
    /// The shard's error.
    pub async fn begin_for(&self, biz: &str, key: &str) -> Result<ShardedTx<S>, IdemError> {
        let shard = self.shard_index(biz, key);
        let tx = self.inner.shards[shard].begin_tx().await?;
        Ok(ShardedTx::new(tx, self.clone(), shard))
    }
}

#[async_trait]
impl<S: Store> Store for ShardedStore<S> {
    fn backend(&self) -> &'static str {
        "sharded"
    }

    fn limits(&self) -> &Limits {
        &self.limits
    }

    async fn claim(&self, req: &ClaimRequest<'_>) -> Result<ClaimOutcome, IdemError> {
        self.shard_of(req.biz, req.key).claim(req).await
    }

    /// One batch claim per shard the items live on, sent at once.
    async fn claim_batch(
        &self,
        batch: &crate::store::BatchClaim<'_>,
    ) -> Result<Vec<ClaimOutcome>, IdemError> {
        batch.check()?;
        let shards = self.inner.shards.len();
        let mut per_shard: Vec<(Vec<usize>, Vec<crate::store::BatchItem<'_>>)> =
            vec![(Vec::new(), Vec::new()); shards];
        for (i, item) in batch.items.iter().enumerate() {
            let (at, items) = &mut per_shard[self.shard_index(batch.biz, item.key)];
            at.push(i);
            items.push(*item);
        }
        let claims = per_shard
            .iter()
            .enumerate()
            .filter(|(_, (at, _))| !at.is_empty())
            .map(|(shard, (at, items))| async move {
                let part = crate::store::BatchClaim { items, ..*batch };
                let outcomes = self.inner.shards[shard].claim_batch(&part).await?;
                Ok::<_, IdemError>(at.iter().copied().zip(outcomes).collect::<Vec<_>>())
            });
        let mut outcomes: Vec<Option<ClaimOutcome>> = vec![None; batch.items.len()];
        for part in futures_util::future::join_all(claims).await {
            for (i, outcome) in part? {
                outcomes[i] = Some(outcome);
            }
        }
        crate::store::batch::all_answered(outcomes, "a shard")
    }

    /// Every shard's, together.
    async fn processing_biz_types(&self) -> Result<Vec<String>, IdemError> {
        let mut bizes = Vec::new();
        for shard in &self.inner.shards {
            bizes.extend(shard.processing_biz_types().await?);
        }
        bizes.sort_unstable();
        bizes.dedup();
        Ok(bizes)
    }

    /// One batch of marks per shard the records live on, sent at once.
    async fn complete_batch(
        &self,
        biz: &str,
        marks: &[crate::store::BatchMark<'_>],
        ttl: Duration,
    ) -> Result<Vec<Result<(), IdemError>>, IdemError> {
        crate::store::batch::check_marks(marks)?;
        let mut per_shard: Vec<(Vec<usize>, Vec<crate::store::BatchMark<'_>>)> =
            vec![(Vec::new(), Vec::new()); self.inner.shards.len()];
        for (i, m) in marks.iter().enumerate() {
            let (at, part) = &mut per_shard[self.shard_index(biz, m.key)];
            at.push(i);
            part.push(*m);
        }
        let sends = per_shard
            .iter()
            .enumerate()
            .filter(|(_, (at, _))| !at.is_empty())
            .map(|(shard, (at, part))| async move {
                let answers = self.inner.shards[shard]
                    .complete_batch(biz, part, ttl)
                    .await?;
                Ok::<_, IdemError>(at.iter().copied().zip(answers).collect::<Vec<_>>())
            });
        let mut answers: Vec<Option<Result<(), IdemError>>> = marks.iter().map(|_| None).collect();
        for part in futures_util::future::join_all(sends).await {
            for (i, answer) in part? {
                answers[i] = Some(answer);
            }
        }
        crate::store::batch::all_answered(answers, "a shard")
    }

    async fn complete(
        &self,
        biz: &str,
        key: &str,
        claim: &Claim,
        snapshot: &[u8],
        ttl: Duration,
    ) -> Result<(), IdemError> {
        self.shard_of(biz, key)
            .complete(biz, key, claim, snapshot, ttl)
            .await
    }

    async fn complete_keeping(
        &self,
        biz: &str,
        key: &str,
        claim: &Claim,
        snapshot: &[u8],
        ttl: Duration,
        result_ttl: Duration,
    ) -> Result<(), IdemError> {
        self.shard_of(biz, key)
            .complete_keeping(biz, key, claim, snapshot, ttl, result_ttl)
            .await
    }

    async fn fail(&self, biz: &str, key: &str, claim: &Claim) -> Result<(), IdemError> {
        self.shard_of(biz, key).fail(biz, key, claim).await
    }

    async fn renew(
        &self,
        biz: &str,
        key: &str,
        claim: &Claim,
        lease: Duration,
    ) -> Result<(), IdemError> {
        self.shard_of(biz, key).renew(biz, key, claim, lease).await
    }

    async fn save_steps(
        &self,
        biz: &str,
        key: &str,
        claim: &Claim,
        steps: &[u8],
    ) -> Result<(), IdemError> {
        self.shard_of(biz, key)
            .save_steps(biz, key, claim, steps)
            .await
    }

    async fn load(&self, biz: &str, key: &str) -> Result<Option<Record>, IdemError> {
        self.shard_of(biz, key).load(biz, key).await
    }

    /// Sweeps the shards in turn, at most `batch` records in all.
    async fn sweep_expired(&self, batch: usize) -> Result<u64, IdemError> {
        let mut deleted = 0u64;
        for shard in &self.inner.shards {
            let left = batch.saturating_sub(usize::try_from(deleted).unwrap_or(usize::MAX));
            if left == 0 {
                break;
            }
            deleted += shard.sweep_expired(left).await?;
        }
        Ok(deleted)
    }

    /// Asks every shard in turn for its `batch` oldest, and keeps the `batch` oldest of them all
    /// (so the answer is what one store holding every shard's records would give).
    async fn stuck(&self, biz: &str, batch: usize) -> Result<Vec<Record>, IdemError> {
        let mut stuck = Vec::new();
        for shard in &self.inner.shards {
            stuck.extend(shard.stuck(biz, batch).await?);
        }
        // Stable: ties keep their shard's order.
        stuck.sort_by_key(|r| r.lease_until_ms);
        stuck.truncate(batch);
        Ok(stuck)
    }

    /// Every shard's counts, summed.
    async fn stats(&self) -> Result<Vec<crate::StatusCount>, IdemError> {
        let mut counts = Vec::new();
        for shard in &self.inner.shards {
            counts.extend(shard.stats().await?);
        }
        Ok(crate::StatusCount::tally(counts))
    }
}
