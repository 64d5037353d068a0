//! `ShardedStore`: records spread over N stores of one backend, each key on the shard a stable hash
//! of `(biz, key)` picks. Beyond one database: several MySQL or Postgres databases (or engines that
//! speak their dialects), or several SQLite files.

mod layout;
#[cfg(test)]
mod model_check;
mod moving;
mod reshard;
mod route;
#[cfg(all(test, feature = "sqlite"))]
mod tests;
mod tx;
mod view;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use crate::store::{Claim, ClaimOutcome, ClaimRequest, Limits, Record, Store};
use crate::{IdemError, TransactionalStore};
pub use layout::{Layout, Phase};
use moving::Write;
pub use reshard::{Reshard, ReshardProgress};
pub use tx::ShardedTx;
pub use view::{REFRESH_EVERY, STALE_AFTER};
use view::{Route, View};

/// Records spread over several stores of one kind.
///
/// Each `(biz, key)` lives on one shard, picked by a hash that is stable across processes, builds
/// and versions of idem: SHA-256 of the business type's length (4 bytes, little-endian), the business
/// type and the key; its first 8 bytes (big-endian) go through jump consistent hashing (Lamping and
/// Veach, 2014) to a shard index. So every instance of a service, whatever its build, finds a key on
/// the same shard; and adding a shard at the end moves only about 1/N of the keys.
///
/// The keys that move would look absent on their new shard: **a repeat of one would run again,
/// and one under a live lease on its old shard could be claimed a second time on its new one.**
/// So do not change the list by hand: grow, shrink or replace shards with
/// [`Reshard`](crate::sharding::Reshard) (`idem reshard`), which moves them while the service
/// serves. It writes a layout into the shards (docs/DESIGN.md, *Resharding*); from then on
/// every process routes by that layout, whatever the order of its list or the extra shards it was
/// given, reads it again every [`REFRESH_EVERY`], and refuses
/// ([`IdemError::StoreUnavailable`]) a key the layout routes to a shard it was not given rather
/// than routing it elsewhere. With no layout written the list's order is the routing.
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
    /// The layout as this process last read it.
    view: std::sync::RwLock<Arc<View>>,
    /// Held by the one call that reads the layout again.
    refreshing: Arc<tokio::sync::Mutex<()>>,
    /// The shards' identities, as far as known.
    ids: std::sync::Mutex<Vec<Option<String>>>,
    /// The claims this process holds on two shards (a moving key's, in a dual phase).
    held: moving::Held,
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
    /// A store over `shards`, in this order. The order is the routing until a layout is written
    /// ([`Reshard`]); from then on the layout routes, whatever the order.
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
        let ids = vec![None; shards.len()];
        Ok(ShardedStore {
            inner: Arc::new(Inner {
                shards,
                view: Default::default(),
                refreshing: Default::default(),
                ids: std::sync::Mutex::new(ids),
                held: Default::default(),
            }),
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

    /// The shards, in the order given.
    pub fn shards(&self) -> &[S] {
        &self.inner.shards
    }

    /// The index of the shard `(biz, key)` lives on, by the layout this process last read (no
    /// reading: a process that has not served a call yet routes by the order of its shards). While
    /// a reshard moves the key: its old shard until the records are being copied, then its new one.
    pub fn shard_index(&self, biz: &str, key: &str) -> usize {
        let shards = self.inner.shards.len();
        self.view_now()
            .home(biz, key, shards)
            .unwrap_or_else(|| route::shard(biz, key, shards))
    }

    /// The shard `(biz, key)` lives on (see [`ShardedStore::shard_index`]).
    pub fn shard_of(&self, biz: &str, key: &str) -> &S {
        &self.inner.shards[self.shard_index(biz, key)]
    }

    /// The layout step this process last read: `None` when none was written (keys route over
    /// the shards in the order given).
    pub fn layout(&self) -> Option<Layout> {
        self.view_now().layout.clone()
    }

    /// Where `(biz, key)` goes now, the layout read again if it is due.
    async fn route_of(&self, biz: &str, key: &str) -> Result<Route, IdemError> {
        self.view().await?.route(biz, key, self.inner.shards.len())
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
    /// The shard's error; [`IdemError::StoreUnavailable`] while a reshard moves the key between
    /// two shards (a transaction lives on one: retry once the move is done).
    pub async fn begin_for(&self, biz: &str, key: &str) -> Result<ShardedTx<S>, IdemError> {
        let shard = self.tx_shard(biz, key).await?;
        let tx = self.inner.shards[shard].begin_tx().await?;
        Ok(ShardedTx::new(tx, self.clone(), shard))
    }

    /// The one shard a transaction for `(biz, key)` may claim on now.
    pub(crate) async fn tx_shard(&self, biz: &str, key: &str) -> Result<usize, IdemError> {
        match self.route_of(biz, key).await? {
            Route::One(s) => Ok(s),
            Route::Move { .. } => Err(IdemError::unavailable(format!(
                "({biz}, {key}) is moving between two shards (a reshard is under way): a \
                 transaction lives on one shard, so it is refused until the move is done"
            ))),
        }
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
        match self.route_of(req.biz, req.key).await? {
            Route::One(s) => {
                let outcome = self.inner.shards[s].claim(req).await?;
                if let ClaimOutcome::Acquired { claim, .. } = &outcome {
                    let one = moving::Holds::One(s);
                    self.inner
                        .held
                        .insert(req.biz, req.key, claim, one, req.lease);
                }
                Ok(outcome)
            }
            Route::Move { a, b, .. } => self.claim_moving(req, a, b).await,
        }
    }

    /// One batch claim per shard the items live on, sent at once (a key a reshard is moving is
    /// claimed on its own).
    async fn claim_batch(
        &self,
        batch: &crate::store::BatchClaim<'_>,
    ) -> Result<Vec<ClaimOutcome>, IdemError> {
        batch.check()?;
        let view = self.view().await?;
        let shards = self.inner.shards.len();
        let mut outcomes: Vec<Option<ClaimOutcome>> = vec![None; batch.items.len()];
        let mut per_shard: Vec<(Vec<usize>, Vec<crate::store::BatchItem<'_>>)> =
            vec![(Vec::new(), Vec::new()); shards];
        for (i, item) in batch.items.iter().enumerate() {
            match view.route(batch.biz, item.key, shards)? {
                Route::One(s) => {
                    per_shard[s].0.push(i);
                    per_shard[s].1.push(*item);
                }
                Route::Move { a, b, .. } => {
                    outcomes[i] = Some(self.claim_moving(&batch.request(i), a, b).await?);
                }
            }
        }
        let claims = per_shard
            .iter()
            .enumerate()
            .filter(|(_, (at, _))| !at.is_empty())
            .map(|(shard, (at, items))| async move {
                let part = crate::store::BatchClaim { items, ..*batch };
                let outcomes = self.inner.shards[shard].claim_batch(&part).await?;
                for (item, outcome) in items.iter().zip(&outcomes) {
                    if let ClaimOutcome::Acquired { claim, .. } = outcome {
                        let one = moving::Holds::One(shard);
                        self.inner
                            .held
                            .insert(batch.biz, item.key, claim, one, batch.lease);
                    }
                }
                Ok::<_, IdemError>(at.iter().copied().zip(outcomes).collect::<Vec<_>>())
            });
        for part in futures_util::future::join_all(claims).await {
            for (i, outcome) in part? {
                outcomes[i] = Some(outcome);
            }
        }
        crate::store::batch::all_answered(outcomes, "a shard")
    }

    /// Every shard's, together (the sharded store's own records left out).
    async fn processing_biz_types(&self) -> Result<Vec<String>, IdemError> {
        let mut bizes = Vec::new();
        for shard in &self.inner.shards {
            bizes.extend(shard.processing_biz_types().await?);
        }
        bizes.retain(|b| !layout::reserved(b));
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
        self.complete_marks(biz, marks, ttl).await
    }

    async fn complete(
        &self,
        biz: &str,
        key: &str,
        claim: &Claim,
        snapshot: &[u8],
        ttl: Duration,
    ) -> Result<(), IdemError> {
        let write = Write::Complete {
            snapshot,
            ttl,
            result_ttl: None,
        };
        self.write(biz, key, claim, write).await
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
        let write = Write::Complete {
            snapshot,
            ttl,
            result_ttl: Some(result_ttl),
        };
        self.write(biz, key, claim, write).await
    }

    async fn fail(&self, biz: &str, key: &str, claim: &Claim) -> Result<(), IdemError> {
        self.write(biz, key, claim, Write::Fail).await
    }

    async fn release(&self, biz: &str, key: &str, claim: &Claim) -> Result<(), IdemError> {
        self.write(biz, key, claim, Write::Release).await
    }

    async fn renew(
        &self,
        biz: &str,
        key: &str,
        claim: &Claim,
        lease: Duration,
    ) -> Result<(), IdemError> {
        self.write(biz, key, claim, Write::Renew(lease)).await
    }

    async fn save_steps(
        &self,
        biz: &str,
        key: &str,
        claim: &Claim,
        steps: &[u8],
    ) -> Result<(), IdemError> {
        self.write(biz, key, claim, Write::Steps(steps)).await
    }

    /// The record where the key lives; while a reshard moves it, on its old shard until the
    /// records are being copied, then on its new shard (or its old one, not copied yet).
    async fn load(&self, biz: &str, key: &str) -> Result<Option<Record>, IdemError> {
        let shards = &self.inner.shards;
        match self.route_of(biz, key).await? {
            Route::One(s) => shards[s].load(biz, key).await,
            Route::Move { a, phase, .. } if phase < Phase::DualNew => {
                shards[a].load(biz, key).await
            }
            Route::Move { a, b, .. } => match shards[b].load(biz, key).await? {
                Some(r) => Ok(Some(r)),
                None => shards[a].load(biz, key).await,
            },
        }
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
    /// (so the answer is what one store holding every shard's records would give; a key a
    /// reshard copied is listed once).
    async fn stuck(&self, biz: &str, batch: usize) -> Result<Vec<Record>, IdemError> {
        let mut stuck = Vec::new();
        for shard in &self.inner.shards {
            stuck.extend(shard.stuck(biz, batch).await?);
        }
        // Stable: ties keep their shard's order.
        stuck.sort_by_key(|r| r.lease_until_ms);
        let mut seen = std::collections::HashSet::new();
        stuck.retain(|r| seen.insert(r.key.clone()));
        stuck.truncate(batch);
        Ok(stuck)
    }

    /// Every shard's counts, summed (the sharded store's own records left out; while a reshard
    /// copies records, a copied one counts on both its shards).
    async fn stats(&self) -> Result<Vec<crate::StatusCount>, IdemError> {
        let mut counts = Vec::new();
        for shard in &self.inner.shards {
            counts.extend(shard.stats().await?);
        }
        counts.retain(|c| !layout::reserved(&c.biz));
        Ok(crate::StatusCount::tally(counts))
    }
}
