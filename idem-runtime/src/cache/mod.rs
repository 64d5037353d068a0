//! An optional in-process replay cache in front of any store (feature `cache`): [`CachedStore`].
//!
//! A repeat of a key this process marked done is answered from memory, with no round trip: the
//! cheapest replay there is, for the retries that come back to the instance that ran the call (a
//! client retrying a slow request, a double click behind a sticky load balancer, a consumer
//! redelivered the message it just handled).
//!
//! It never answers what the store would not. It holds only successes, each with the fingerprint
//! of the claim that made it and an expiry no later than the record's: a SUCCEEDED record is
//! immutable until it expires (no operation of idem changes or deletes a live success), so until
//! then the store would answer the same replay, or the same mismatch for another payload. The
//! expiry is taken on the process's monotonic clock from the moment the mark was sent: the store
//! moved the record's expiry to at least its own now + ttl when the mark arrived, which is later.
//! Everything else (first executions, in-progress claims, failures, takeovers, records other
//! processes marked) goes to the store as before.
//!
//! Its bounds: the bytes it holds (each entry weighs its key, fingerprint and snapshot plus
//! [`ENTRY_OVERHEAD`]), and how long an entry may live ([`ReplayCache::with_max_age`], 60 s by
//! default), whatever its ttl. It counts its hits ([`CachedStore::hits`], and with the feature
//! `metrics` the counter `idem_replay_cache_hits_total`, labelled by the inner store's backend).
//!
//! Not for a store on a [`crate::TestClock`]: moving the test clock expires records without the
//! process's clock moving, and the cache would still answer them.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use crate::IdemError;
use crate::store::tx::TransitionTx;
use crate::store::{Claim, ClaimOutcome, ClaimRequest, Limits, Record, StatusCount, Store};

/// What one entry weighs besides its key, fingerprint and snapshot (its expiry, lengths and the
/// cache's own bookkeeping), in bytes.
pub const ENTRY_OVERHEAD: usize = 96;

/// The fewest bytes a cache may hold: 1 KiB.
pub const MIN_CACHE_BYTES: usize = 1024;

/// The most bytes a cache may hold: 16 GiB.
pub const MAX_CACHE_BYTES: usize = 16 << 30;

/// How many claims in flight the cache keeps the fingerprint of (to cache their success when they
/// are marked done); a claim it forgot is marked as usual, only not cached.
const PENDING: usize = 4096;

/// The bounds of a [`CachedStore`]'s cache.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplayCache {
    max_bytes: usize,
    max_age: Duration,
}

impl ReplayCache {
    /// A cache that holds at most `max_bytes` (in [`MIN_CACHE_BYTES`] `..=` [`MAX_CACHE_BYTES`]),
    /// entries at most 60 s.
    ///
    /// # Errors
    /// [`IdemError::InvalidOptions`] for a size out of its range.
    pub fn new(max_bytes: usize) -> Result<Self, IdemError> {
        if !(MIN_CACHE_BYTES..=MAX_CACHE_BYTES).contains(&max_bytes) {
            return Err(IdemError::InvalidOptions {
                reason: format!(
                    "a replay cache of {max_bytes} bytes: it holds {MIN_CACHE_BYTES} to \
                     {MAX_CACHE_BYTES} bytes"
                ),
            });
        }
        Ok(ReplayCache {
            max_bytes,
            max_age: Duration::from_secs(60),
        })
    }

    /// How long an entry may live, whatever its record's ttl: 1 ms to [`crate::MAX_DURATION`].
    ///
    /// # Errors
    /// [`IdemError::InvalidOptions`] for an age out of its range.
    pub fn with_max_age(mut self, max_age: Duration) -> Result<Self, IdemError> {
        crate::duration::check(
            "the replay cache's max age",
            max_age,
            Duration::from_millis(1),
            "shorter than 1 ms",
        )?;
        self.max_age = max_age;
        Ok(self)
    }

    /// The most bytes it holds.
    pub fn max_bytes(&self) -> usize {
        self.max_bytes
    }

    /// The longest an entry lives.
    pub fn max_age(&self) -> Duration {
        self.max_age
    }
}

/// A success as the cache holds it.
#[derive(Clone)]
struct Entry {
    fingerprint: Option<Arc<str>>,
    snapshot: Arc<[u8]>,
    /// No later than the record's expiry.
    until: Instant,
}

/// A claim held by a call of this process: what its success is cached under.
#[derive(Clone)]
struct Pending {
    fence: u64,
    fingerprint: Option<Arc<str>>,
}

#[derive(Clone)]
struct Weight;

impl quick_cache::Weighter<String, Entry> for Weight {
    fn weight(&self, key: &String, entry: &Entry) -> u64 {
        let fp = entry.fingerprint.as_ref().map_or(0, |fp| fp.len());
        (key.len() + fp + entry.snapshot.len() + ENTRY_OVERHEAD) as u64
    }
}

struct Shared {
    done: quick_cache::sync::Cache<String, Entry, Weight>,
    pending: quick_cache::sync::Cache<String, Pending>,
    max_age: Duration,
    hits: AtomicU64,
}

/// The cache's key for `(biz, key)`: the business type's length first, so no two pairs share one.
fn slot(biz: &str, key: &str) -> String {
    let mut s = String::with_capacity(biz.len() + key.len() + 4);
    s.push_str(itoa::Buffer::new().format(biz.len()));
    s.push(':');
    s.push_str(biz);
    s.push_str(key);
    s
}

/// A store with an in-process replay cache in front of it (feature `cache`, off by default): a
/// lease-mode repeat of a key this process marked done is answered from memory, with no round
/// trip, until its record could have expired.
///
/// It never answers what the store would not. It holds only successes, each with the fingerprint
/// of the claim that made it, until the moment its record could expire (the mark's send time + ttl
/// on the process's monotonic clock, and at most [`ReplayCache::with_max_age`], 60 s by default,
/// 1 ms ..= [`MAX_DURATION`](crate::MAX_DURATION)): a SUCCEEDED record is immutable until it
/// expires, so until then the store would give the same replay, or the same mismatch for another
/// payload. Everything else (first executions, in-progress claims, failures, takeovers, records
/// other processes marked) goes to the store as before. The cache holds at most its byte bound
/// ([`MIN_CACHE_BYTES`] ..= [`MAX_CACHE_BYTES`], 1 KiB to 16 GiB; each entry weighs its key,
/// fingerprint and snapshot plus [`ENTRY_OVERHEAD`]). [`hits`](CachedStore::hits) counts its
/// answers (`idem_replay_cache_hits_total` with the feature `metrics`). Not for a store on a
/// [`TestClock`](crate::TestClock): moving the test clock expires records without the process's
/// clock moving, and the cache would still answer them.
///
/// ```
/// # use idem_runtime as idem;
/// # async fn demo() -> Result<(), idem_runtime::IdemError> {
/// use idem::{Call, IdemError, MemoryStore};
/// use idem::cache::{CachedStore, ReplayCache};
/// let store = CachedStore::new(MemoryStore::new(), ReplayCache::new(64 << 20)?);
/// let first: Result<u32, IdemError> = Call::new("PAY", "o-1").run(&store, async { Ok(7) }).await;
/// let again: Result<u32, IdemError> = Call::new("PAY", "o-1").run(&store, async { Ok(8) }).await;
/// assert_eq!((first?, again?), (7, 7));
/// assert_eq!(store.hits(), 1);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct CachedStore<S> {
    inner: S,
    shared: Arc<Shared>,
}

impl<S: Store> CachedStore<S> {
    /// `inner` with a replay cache of `cache`'s bounds.
    pub fn new(inner: S, cache: ReplayCache) -> Self {
        let estimated = (cache.max_bytes / 512).max(16);
        CachedStore {
            inner,
            shared: Arc::new(Shared {
                done: quick_cache::sync::Cache::with_weighter(
                    estimated,
                    cache.max_bytes as u64,
                    Weight,
                ),
                pending: quick_cache::sync::Cache::new(PENDING),
                max_age: cache.max_age,
                hits: AtomicU64::new(0),
            }),
        }
    }

    /// The store behind the cache.
    pub fn inner(&self) -> &S {
        &self.inner
    }

    /// How many claims the cache answered.
    pub fn hits(&self) -> u64 {
        self.shared.hits.load(Ordering::Relaxed)
    }

    /// How many successes it holds now.
    pub fn len(&self) -> usize {
        self.shared.done.len()
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.shared.done.is_empty()
    }

    /// After a mark (`done` its answer): the success this process claimed under `claim`, kept
    /// for replay until `until`.
    fn remember(
        &self,
        biz: &str,
        key: &str,
        claim: &Claim,
        snapshot: &[u8],
        until: Instant,
        done: Result<(), IdemError>,
    ) -> Result<(), IdemError> {
        let slot = slot(biz, key);
        let pending = self.shared.pending.remove(&slot).map(|(_, p)| p);
        if done.is_ok()
            && let Some(pending) = pending.filter(|p| p.fence == claim.fence.get())
        {
            self.shared.done.insert(
                slot,
                Entry {
                    fingerprint: pending.fingerprint,
                    snapshot: Arc::from(snapshot),
                    until,
                },
            );
        }
        done
    }

    /// The answer the cache has for `req`, if it holds a live success of its key.
    fn cached(&self, req: &ClaimRequest<'_>) -> Option<ClaimOutcome> {
        let entry = self.shared.done.get(&slot(req.biz, req.key))?;
        if Instant::now() >= entry.until {
            return None;
        }
        let outcome = match (entry.fingerprint.as_deref(), req.fingerprint) {
            (Some(stored), Some(asked)) if stored != asked => ClaimOutcome::Mismatch,
            _ => ClaimOutcome::Replay {
                snapshot: entry.snapshot.to_vec(),
            },
        };
        self.shared.hits.fetch_add(1, Ordering::Relaxed);
        #[cfg(feature = "metrics")]
        metrics::counter!(crate::metrics::names::REPLAY_CACHE_HITS, "store" => self.inner.backend())
            .increment(1);
        Some(outcome)
    }
}

impl<S> std::fmt::Debug for CachedStore<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CachedStore")
            .field("entries", &self.shared.done.len())
            .field("max_age", &self.shared.max_age)
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl<S: Store> Store for CachedStore<S> {
    fn backend(&self) -> &'static str {
        self.inner.backend()
    }

    fn limits(&self) -> &Limits {
        self.inner.limits()
    }

    async fn claim(&self, req: &ClaimRequest<'_>) -> Result<ClaimOutcome, IdemError> {
        if let Some(outcome) = self.cached(req) {
            return Ok(outcome);
        }
        let outcome = self.inner.claim(req).await?;
        if let ClaimOutcome::Acquired { claim, .. } = &outcome {
            self.shared.pending.insert(
                slot(req.biz, req.key),
                Pending {
                    fence: claim.fence.get(),
                    fingerprint: req.fingerprint.map(Arc::from),
                },
            );
        }
        Ok(outcome)
    }

    /// The items this process saw succeed answered here; the rest in one batch claim on the
    /// inner store.
    async fn claim_batch(
        &self,
        batch: &crate::store::BatchClaim<'_>,
    ) -> Result<Vec<ClaimOutcome>, IdemError> {
        batch.check()?;
        let mut outcomes: Vec<Option<ClaimOutcome>> =
            batch.requests().map(|req| self.cached(&req)).collect();
        let (at, rest): (Vec<usize>, Vec<crate::store::BatchItem<'_>>) = outcomes
            .iter()
            .zip(batch.items)
            .enumerate()
            .filter(|(_, (cached, _))| cached.is_none())
            .map(|(i, (_, item))| (i, *item))
            .unzip();
        if !rest.is_empty() {
            let part = crate::store::BatchClaim {
                items: &rest,
                ..*batch
            };
            let claimed = self.inner.claim_batch(&part).await?;
            for ((i, outcome), req) in at.into_iter().zip(claimed).zip(part.requests()) {
                if let ClaimOutcome::Acquired { claim, .. } = &outcome {
                    self.shared.pending.insert(
                        slot(req.biz, req.key),
                        Pending {
                            fence: claim.fence.get(),
                            fingerprint: req.fingerprint.map(Arc::from),
                        },
                    );
                }
                outcomes[i] = Some(outcome);
            }
        }
        crate::store::batch::all_answered(outcomes, "the store")
    }

    async fn processing_biz_types(&self) -> Result<Vec<String>, IdemError> {
        self.inner.processing_biz_types().await
    }

    /// One batch of marks on the inner store; each success is remembered as `complete`'s is.
    async fn complete_batch(
        &self,
        biz: &str,
        marks: &[crate::store::BatchMark<'_>],
        ttl: Duration,
    ) -> Result<Vec<Result<(), IdemError>>, IdemError> {
        let sent = Instant::now();
        let answers = self.inner.complete_batch(biz, marks, ttl).await?;
        Ok(marks
            .iter()
            .zip(answers)
            .map(|(m, done)| {
                let kept = m.result_ttl.unwrap_or(ttl).min(ttl);
                let until = sent + kept.min(self.shared.max_age);
                self.remember(biz, m.key, &m.claim, m.snapshot, until, done)
            })
            .collect())
    }

    async fn complete(
        &self,
        biz: &str,
        key: &str,
        claim: &Claim,
        snapshot: &[u8],
        ttl: Duration,
    ) -> Result<(), IdemError> {
        // Before the mark leaves: the store's expiry is at least its now + ttl on arrival.
        let sent = Instant::now();
        let done = self.inner.complete(biz, key, claim, snapshot, ttl).await;
        self.remember(
            biz,
            key,
            claim,
            snapshot,
            sent + ttl.min(self.shared.max_age),
            done,
        )
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
        // The result is replayed until the store's now + result_ttl on arrival: no longer here.
        let sent = Instant::now();
        let done = self
            .inner
            .complete_keeping(biz, key, claim, snapshot, ttl, result_ttl)
            .await;
        let until = sent + result_ttl.min(self.shared.max_age);
        self.remember(biz, key, claim, snapshot, until, done)
    }

    async fn fail(&self, biz: &str, key: &str, claim: &Claim) -> Result<(), IdemError> {
        self.shared.pending.remove(&slot(biz, key));
        self.inner.fail(biz, key, claim).await
    }

    async fn renew(
        &self,
        biz: &str,
        key: &str,
        claim: &Claim,
        lease: Duration,
    ) -> Result<(), IdemError> {
        self.inner.renew(biz, key, claim, lease).await
    }

    async fn release(&self, biz: &str, key: &str, claim: &Claim) -> Result<(), IdemError> {
        self.shared.pending.remove(&slot(biz, key));
        self.inner.release(biz, key, claim).await
    }

    async fn save_steps(
        &self,
        biz: &str,
        key: &str,
        claim: &Claim,
        steps: &[u8],
    ) -> Result<(), IdemError> {
        self.inner.save_steps(biz, key, claim, steps).await
    }

    async fn load(&self, biz: &str, key: &str) -> Result<Option<Record>, IdemError> {
        self.inner.load(biz, key).await
    }

    async fn sweep_expired(&self, batch: usize) -> Result<u64, IdemError> {
        self.inner.sweep_expired(batch).await
    }

    async fn stuck(&self, biz: &str, batch: usize) -> Result<Vec<Record>, IdemError> {
        self.inner.stuck(biz, batch).await
    }

    async fn stats(&self) -> Result<Vec<StatusCount>, IdemError> {
        self.inner.stats().await
    }

    /// The inner store's walk (the cache holds no record the inner store does not).
    async fn list_keys(
        &self,
        after: Option<&str>,
        batch: usize,
    ) -> Result<crate::store::KeyPage, IdemError> {
        self.inner.list_keys(after, batch).await
    }

    async fn begin_transition(&self) -> Result<Box<dyn TransitionTx>, IdemError> {
        self.inner.begin_transition().await
    }
}

#[cfg(test)]
mod tests;
