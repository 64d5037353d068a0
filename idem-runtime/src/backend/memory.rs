//! An in-process store: one map behind a mutex. For tests, single-process services and benchmarks.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;

use crate::IdemError;
use crate::clock::ClockOffset;
use crate::store::decide::{
    Decision, RESULT_DROPPED, RecordState, decide, duration_ms, millis, taken,
};
use crate::store::{
    Acquired, Claim, ClaimOutcome, ClaimRequest, Fence, Limits, Record, Status, StatusCount, Store,
    keeps_steps,
};

#[derive(Debug, Clone)]
struct Entry {
    status: Status,
    attempt: u32,
    fence: u64,
    fingerprint: Option<Box<str>>,
    /// The result once SUCCEEDED; before that, the saved steps (as the SQL stores keep them).
    snapshot: Option<Vec<u8>>,
    lease_until: i64,
    expire_at: i64,
    /// Until when a SUCCEEDED record's result is replayed (`RESULT_DROPPED` once swept); `None`:
    /// as long as the record.
    result_until: Option<i64>,
}

impl Entry {
    fn state(&self) -> RecordState<'_> {
        RecordState {
            status: self.status,
            fingerprint: self.fingerprint.as_deref(),
            lease_until_ms: self.lease_until,
            expire_at_ms: self.expire_at,
            result_until_ms: self.result_until,
        }
    }

    fn record(&self, biz: &str, key: &str) -> Record {
        let (snapshot, steps) = Record::split_blob(self.status, self.snapshot.clone());
        Record {
            biz: biz.to_owned(),
            key: key.to_owned(),
            status: self.status,
            attempt: self.attempt,
            fence: Fence::new(self.fence),
            fingerprint: self.fingerprint.as_deref().map(Into::into),
            snapshot,
            steps,
            lease_until_ms: self.lease_until,
            expire_at_ms: self.expire_at,
            result_until_ms: self.result_until,
        }
    }

    fn claim(&self) -> Claim {
        Claim {
            attempt: self.attempt,
            fence: Fence::new(self.fence),
        }
    }
}

/// Keys come from callers, so the map is seeded per process (hashbrown's default, foldhash).
/// Shared keys: the queues below name a record by the same allocation its map holds.
type Map<V> = hashbrown::HashMap<Arc<str>, V>;

/// A record's place in a queue: when to look at it again.
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Due {
    at: i64,
    biz: Arc<str>,
    key: Arc<str>,
}

/// A min-queue by time: the earliest first.
type Queue<T> = BinaryHeap<Reverse<T>>;

/// A business type's records, and its PROCESSING ones by lease end: every claim that takes a
/// record and every renewal queues `(lease end, key)`; an item whose record has moved on (marked,
/// renewed, gone) is dropped when it comes up. What [`Store::stuck`] and a sweep read, so each
/// pass costs what it finds, not the number of records.
struct Biz {
    name: Arc<str>,
    records: Map<Entry>,
    leases: Queue<(i64, Arc<str>)>,
}

impl Biz {
    /// Queues the lease of the record `key` that was just taken or renewed, first dropping up to
    /// two items at the front whose time has come and whose record moved on (so the queue stays
    /// about as long as the leases of the last lease period, without a sweeper).
    fn queue_lease(&mut self, key: &Arc<str>, lease_until: i64, now: i64) {
        for _ in 0..2 {
            match self.leases.peek() {
                Some(Reverse((t, k))) if *t <= now && !self.holds_lease(k, *t) => {
                    self.leases.pop();
                }
                _ => break,
            }
        }
        self.leases.push(Reverse((lease_until, Arc::clone(key))));
    }

    /// Whether the queue's item `(t, key)` is still the record's: PROCESSING with that lease end.
    fn holds_lease(&self, key: &str, t: i64) -> bool {
        self.records
            .get(key)
            .is_some_and(|e| e.status == Status::Processing && e.lease_until == t)
    }

    /// Takes the items whose lease ended by `now`, oldest first, until `want` records are stuck
    /// (PROCESSING under that lease end): those are returned and stay queued, the others are
    /// dropped.
    fn stuck(&mut self, now: i64, want: usize) -> Vec<Arc<str>> {
        let mut stuck: Vec<(i64, Arc<str>)> = Vec::new();
        while stuck.len() < want {
            match self.leases.peek() {
                Some(Reverse((t, _))) if *t <= now => {}
                _ => break,
            }
            let Some(Reverse((t, key))) = self.leases.pop() else {
                break;
            };
            // The same lease queued twice (a renewal to the same millisecond) is one record.
            if self.holds_lease(&key, t) && stuck.last() != Some(&(t, Arc::clone(&key))) {
                stuck.push((t, key));
            }
        }
        let keys = stuck.iter().map(|(_, k)| Arc::clone(k)).collect();
        self.leases.extend(stuck.into_iter().map(Reverse));
        keys
    }
}

/// Everything behind the store's lock.
#[derive(Default)]
struct Records {
    by_biz: Map<Biz>,
    /// One item per record: the earliest time it can expire; a sweep looks at it then, deletes
    /// it if it expired, or queues it again at its new expiry.
    expiries: Queue<Due>,
    /// One item per success marked with a result ttl, at that time.
    results: Queue<Due>,
}

impl Records {
    fn get(&self, biz: &str, key: &str) -> Option<&Entry> {
        self.by_biz.get(biz).and_then(|b| b.records.get(key))
    }

    fn get_mut(&mut self, biz: &str, key: &str) -> Option<&mut Entry> {
        self.by_biz
            .get_mut(biz)
            .and_then(|b| b.records.get_mut(key))
    }

    /// Pops the front of `queue` if its time has come by `now`.
    fn due(queue: &mut Queue<Due>, now: i64) -> Option<Due> {
        match queue.peek() {
            Some(Reverse(d)) if d.at <= now => queue.pop().map(|Reverse(d)| d),
            _ => None,
        }
    }
}

/// Keeps records in this process's memory. Its clock is the wall clock read once at creation plus
/// a monotonic clock since (it never steps back), plus a test clock's offset if given ([`TestClock`](crate::TestClock), feature `test-util`). Records
/// are lost when the process ends.
pub struct MemoryStore {
    records: Mutex<Records>,
    epoch: Instant,
    epoch_us: i64,
    offset: ClockOffset,
    limits: Limits,
    capacity: usize,
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryStore {
    /// An empty store with default limits.
    pub fn new() -> Self {
        let epoch_us = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX));
        MemoryStore {
            records: Mutex::new(Records::default()),
            epoch: Instant::now(),
            epoch_us,
            offset: ClockOffset::default(),
            limits: Limits::default(),
            capacity: 0,
        }
    }

    /// The same store with other limits (`MemoryStore::new().with_limits(limits)?`). Memory holds
    /// any length, so no limit is refused; the `Result` is the shape every store's `with_limits`
    /// has, so code written for one backend moves to another unchanged.
    ///
    /// # Errors
    /// None today.
    pub fn with_limits(mut self, limits: Limits) -> Result<Self, IdemError> {
        self.limits = limits;
        Ok(self)
    }

    /// The same store, reserving room for `records` keys per business type up front, so a
    /// known volume never pays for growing the map while calls wait on its lock.
    pub fn with_capacity(mut self, records: usize) -> Self {
        self.capacity = records;
        self
    }

    /// The same store on a [`TestClock`](crate::TestClock) (feature `test-util`): its clock reads the clock's offset on top of its own.
    #[cfg(any(test, feature = "test-util"))]
    pub fn with_test_clock(mut self, clock: crate::clock::TestClock) -> Self {
        self.offset = ClockOffset::new(clock);
        self
    }

    /// The store's clock in microseconds since the Unix epoch.
    fn now_us(&self) -> i64 {
        let elapsed = i64::try_from(self.epoch.elapsed().as_micros()).unwrap_or(i64::MAX);
        self.epoch_us
            .saturating_add(elapsed)
            .saturating_add(self.offset.ms().saturating_mul(1000))
    }

    fn now_ms(&self) -> i64 {
        self.now_us().div_euclid(1000)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Records> {
        // A panic while holding the lock cannot leave an entry half-updated (every update is a
        // single assignment), so a poisoned lock is still consistent.
        self.records.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs `change` on the record if it is PROCESSING under `claim`'s fence; a record already
    /// `done` under it (the same mark again) is left as it is.
    fn with_held(
        &self,
        biz: &str,
        key: &str,
        claim: &Claim,
        done: Status,
        change: impl FnOnce(&mut Entry),
    ) -> Result<(), IdemError> {
        Self::held(&mut self.lock(), biz, key, claim, done, change)
    }

    /// [`MemoryStore::with_held`] under a lock already taken.
    fn held(
        records: &mut Records,
        biz: &str,
        key: &str,
        claim: &Claim,
        done: Status,
        change: impl FnOnce(&mut Entry),
    ) -> Result<(), IdemError> {
        match records.get_mut(biz, key) {
            Some(e) if e.fence == claim.fence.get() && e.status == Status::Processing => {
                change(e);
                Ok(())
            }
            Some(e) if e.fence == claim.fence.get() && e.status == done => Ok(()),
            _ => Err(IdemError::LeaseLost {
                attempt: claim.attempt,
            }),
        }
    }
}

impl MemoryStore {
    /// The mark of success, the result kept `result_ttl` (or as long as the record).
    fn mark_succeeded(
        &self,
        biz: &str,
        key: &str,
        claim: &Claim,
        snapshot: &[u8],
        ttl: Duration,
        result_ttl: Option<Duration>,
    ) -> Result<(), IdemError> {
        let now = self.now_ms();
        let result_until = result_ttl.map(|keep| now.saturating_add(millis(keep)));
        let mut records = self.lock();
        Self::held(&mut records, biz, key, claim, Status::Succeeded, |e| {
            e.status = Status::Succeeded;
            e.snapshot = Some(snapshot.to_vec());
            e.expire_at = e.expire_at.max(now.saturating_add(millis(ttl)));
            e.result_until = result_until;
        })?;
        if let Some(at) = result_until
            && let Some((biz, by_biz)) = records.by_biz.get_key_value(biz)
            && let Some((key, _)) = by_biz.records.get_key_value(key)
        {
            let due = Due {
                at,
                biz: Arc::clone(biz),
                key: Arc::clone(key),
            };
            records.results.push(Reverse(due));
        }
        Ok(())
    }
}

#[async_trait]
impl Store for MemoryStore {
    fn backend(&self) -> &'static str {
        "memory"
    }

    fn limits(&self) -> &Limits {
        &self.limits
    }

    async fn claim(&self, req: &ClaimRequest<'_>) -> Result<ClaimOutcome, IdemError> {
        let now_us = self.now_us();
        let now = now_us.div_euclid(1000);
        let fresh = |old: Option<(u32, u64, i64)>, reset: bool, steps: Option<Vec<u8>>| {
            let t = taken(old, reset, now_us, req.lease, req.ttl);
            Entry {
                status: Status::Processing,
                attempt: t.attempt,
                fence: t.fence,
                fingerprint: req.fingerprint.map(Into::into),
                snapshot: steps,
                lease_until: t.lease_until_ms,
                expire_at: t.expire_at_ms,
                result_until: None,
            }
        };
        let mut guard = self.lock();
        let records = &mut *guard;
        let biz = match records.by_biz.get_mut(req.biz) {
            Some(biz) => biz,
            None => {
                let name: Arc<str> = req.biz.into();
                records.by_biz.entry(Arc::clone(&name)).or_insert(Biz {
                    name,
                    records: Map::with_capacity(self.capacity),
                    leases: Queue::new(),
                })
            }
        };
        let (key, entry) = match biz.records.entry_ref(req.key) {
            hashbrown::hash_map::EntryRef::Occupied(e) => {
                let key = Arc::clone(e.key());
                (key, e.into_mut())
            }
            hashbrown::hash_map::EntryRef::Vacant(v) => {
                let entry = fresh(None, true, None);
                let (lease_until, expire_at, claim) =
                    (entry.lease_until, entry.expire_at, entry.claim());
                let key: Arc<str> = req.key.into();
                v.insert_with_key(Arc::clone(&key), entry);
                records.expiries.push(Reverse(Due {
                    at: expire_at,
                    biz: Arc::clone(&biz.name),
                    key: Arc::clone(&key),
                }));
                biz.queue_lease(&key, lease_until, now);
                return Ok(ClaimOutcome::Acquired {
                    claim,
                    how: Acquired::Fresh,
                });
            }
        };
        Ok(match decide(&entry.state(), req.fingerprint, now) {
            Decision::Take { how, reset } => {
                let steps = if keeps_steps(reset, entry.fingerprint.as_deref(), req.fingerprint) {
                    entry.snapshot.take()
                } else {
                    None
                };
                *entry = fresh(
                    Some((entry.attempt, entry.fence, entry.expire_at)),
                    reset,
                    steps,
                );
                let (claim, lease_until) = (entry.claim(), entry.lease_until);
                biz.queue_lease(&key, lease_until, now);
                ClaimOutcome::Acquired { claim, how }
            }
            Decision::Replay => ClaimOutcome::Replay {
                snapshot: entry.snapshot.as_deref().unwrap_or_default().to_vec(),
            },
            Decision::ResultGone => ClaimOutcome::ResultGone,
            Decision::Mismatch => ClaimOutcome::Mismatch,
            Decision::InProgress(ms) => ClaimOutcome::InProgress {
                retry_after: duration_ms(ms),
            },
        })
    }

    async fn complete(
        &self,
        biz: &str,
        key: &str,
        claim: &Claim,
        snapshot: &[u8],
        ttl: Duration,
    ) -> Result<(), IdemError> {
        self.mark_succeeded(biz, key, claim, snapshot, ttl, None)
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
        self.mark_succeeded(biz, key, claim, snapshot, ttl, Some(result_ttl))
    }

    async fn fail(&self, biz: &str, key: &str, claim: &Claim) -> Result<(), IdemError> {
        self.with_held(biz, key, claim, Status::Failed, |e| {
            e.status = Status::Failed;
        })
    }

    async fn save_steps(
        &self,
        biz: &str,
        key: &str,
        claim: &Claim,
        steps: &[u8],
    ) -> Result<(), IdemError> {
        self.with_held(biz, key, claim, Status::Processing, |e| {
            e.snapshot = Some(steps.to_vec());
        })
    }

    async fn renew(
        &self,
        biz: &str,
        key: &str,
        claim: &Claim,
        lease: Duration,
    ) -> Result<(), IdemError> {
        let now = self.now_ms();
        let lease_until = now.saturating_add(millis(lease));
        let mut records = self.lock();
        Self::held(&mut records, biz, key, claim, Status::Processing, |e| {
            e.lease_until = lease_until;
            e.expire_at = e.expire_at.max(e.lease_until);
        })?;
        if let Some(by_biz) = records.by_biz.get_mut(biz)
            && let Some((key, _)) = by_biz.records.get_key_value(key)
        {
            let key = Arc::clone(key);
            by_biz.queue_lease(&key, lease_until, now);
        }
        Ok(())
    }

    async fn load(&self, biz: &str, key: &str) -> Result<Option<Record>, IdemError> {
        Ok(self.lock().get(biz, key).map(|e| e.record(biz, key)))
    }

    /// From the business type's lease queue: a call costs the stuck records it returns and the
    /// items of records that moved on since (dropped as they come up), not a walk of the records.
    async fn stuck(&self, biz: &str, batch: usize) -> Result<Vec<Record>, IdemError> {
        let now = self.now_ms();
        let mut records = self.lock();
        let Some(by_biz) = records.by_biz.get_mut(biz) else {
            return Ok(Vec::new());
        };
        let keys = by_biz.stuck(now, batch);
        Ok(keys
            .iter()
            .filter_map(|key| by_biz.records.get(&**key).map(|e| e.record(biz, key)))
            .collect())
    }

    async fn stats(&self) -> Result<Vec<StatusCount>, IdemError> {
        let now = self.now_ms();
        let records = self.lock();
        Ok(StatusCount::tally(records.by_biz.iter().flat_map(
            |(biz, by_biz)| {
                by_biz.records.values().map(|e| StatusCount {
                    biz: biz.to_string(),
                    origin: e
                        .fingerprint
                        .as_deref()
                        .and_then(crate::fingerprint::origin)
                        .map(str::to_owned),
                    status: e.status,
                    records: 1,
                    tombstones: u64::from(e.state().result_is_gone(now)),
                })
            },
        )))
    }

    /// From the expiry and result queues: a call costs the records whose time came (deleted,
    /// shrunk, or queued again at a later expiry), then, once it did less than a batch of either,
    /// the lease items whose time came (the stuck records stay, the rest are dropped). Never a
    /// walk of the records.
    async fn sweep_expired(&self, batch: usize) -> Result<u64, IdemError> {
        let now = self.now_ms();
        let mut guard = self.lock();
        let records = &mut *guard;
        let mut deleted = 0usize;
        while deleted < batch {
            let Some(due) = Records::due(&mut records.expiries, now) else {
                break;
            };
            let Some(by_biz) = records.by_biz.get_mut(&*due.biz) else {
                continue;
            };
            let Some(e) = by_biz.records.get(&*due.key) else {
                continue;
            };
            if e.state().is_expired(now) {
                by_biz.records.remove(&*due.key);
                deleted += 1;
                if by_biz.records.is_empty() {
                    records.by_biz.remove(&*due.biz);
                }
            } else {
                // Not yet: the earliest it can expire, later than now (its TTL, or the end of
                // the live lease that holds it past its TTL).
                let at = if e.expire_at > now {
                    e.expire_at
                } else {
                    e.lease_until
                };
                records.expiries.push(Reverse(Due { at, ..due }));
            }
        }
        // Results past their result ttl: dropped, the records kept as tombstones.
        let mut shrunk = 0usize;
        while shrunk < batch {
            let Some(due) = Records::due(&mut records.results, now) else {
                break;
            };
            if let Some(e) = records.get_mut(&due.biz, &due.key)
                && e.status == Status::Succeeded
                && e.result_until == Some(due.at)
            {
                e.snapshot = None;
                e.result_until = Some(RESULT_DROPPED);
                shrunk += 1;
            }
        }
        if deleted < batch && shrunk < batch {
            // The pass is ending (a sweeper calls again while a batch is full): the lease items
            // of records that moved on go.
            for by_biz in records.by_biz.values_mut() {
                by_biz.stuck(now, usize::MAX);
            }
        }
        Ok((deleted + shrunk) as u64)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::MemoryStore;
    use crate::TestClock;
    use crate::store::{ClaimOutcome, ClaimRequest, Store};

    fn req<'a>(biz: &'a str, key: &'a str, ttl: Duration) -> ClaimRequest<'a> {
        ClaimRequest {
            biz,
            key,
            fingerprint: None,
            lease: Duration::from_secs(10),
            ttl,
        }
    }

    async fn done(store: &MemoryStore, biz: &str, key: &str, ttl: Duration) {
        let ClaimOutcome::Acquired { claim, .. } = store.claim(&req(biz, key, ttl)).await.unwrap()
        else {
            panic!("{key}: not acquired");
        };
        store.complete(biz, key, &claim, b"ok", ttl).await.unwrap();
    }

    /// A sweep takes the records whose time came and leaves the others where they are queued:
    /// one expiry item per record, none popped early.
    #[tokio::test]
    async fn a_sweep_takes_only_what_is_due() {
        let clock = TestClock::new();
        let store = MemoryStore::new().with_test_clock(clock.clone());
        for i in 0..1000 {
            done(&store, "B", &format!("live-{i}"), Duration::from_secs(3600)).await;
        }
        for i in 0..10 {
            done(&store, "B", &format!("due-{i}"), Duration::from_secs(30)).await;
        }
        assert_eq!(store.lock().expiries.len(), 1010);
        clock.advance(Duration::from_secs(31));
        assert_eq!(store.sweep_expired(4).await.unwrap(), 4);
        assert_eq!(store.sweep_expired(100).await.unwrap(), 6);
        let records = store.lock();
        assert_eq!(records.expiries.len(), 1000);
        assert_eq!(records.by_biz["B"].records.len(), 1000);
        assert!(records.get("B", "due-0").is_none());
        assert!(records.get("B", "live-0").is_some());
    }

    /// Every acquisition queues its lease; without a sweeper or a reconciler the queue still
    /// stays about as long as the leases of one lease period, not one item per acquisition.
    #[tokio::test]
    async fn the_lease_queue_stays_short_without_a_sweeper() {
        let clock = TestClock::new();
        let store = MemoryStore::new().with_test_clock(clock.clone());
        for _ in 0..1000 {
            let ClaimOutcome::Acquired { claim, .. } = store
                .claim(&req("B", "k", Duration::from_secs(3600)))
                .await
                .unwrap()
            else {
                panic!("not acquired");
            };
            store.fail("B", "k", &claim).await.unwrap();
            clock.advance(Duration::from_secs(11));
        }
        let leases = store.lock().by_biz["B"].leases.len();
        assert!(leases <= 3, "{leases} lease items for one record");
    }

    /// The stuck list reads the lease queue: a renewal moves a record later, a mark takes it
    /// out, and the queue keeps the stuck ones for the next pass.
    #[tokio::test]
    async fn stuck_records_come_from_the_lease_queue() {
        let clock = TestClock::new();
        let store = MemoryStore::new().with_test_clock(clock.clone());
        let ttl = Duration::from_secs(3600);
        let mut claims = Vec::new();
        for key in ["a", "b", "c"] {
            let ClaimOutcome::Acquired { claim, .. } =
                store.claim(&req("B", key, ttl)).await.unwrap()
            else {
                panic!("{key}: not acquired");
            };
            claims.push(claim);
            clock.advance(Duration::from_millis(5));
        }
        store
            .complete("B", "b", &claims[1], b"ok", ttl)
            .await
            .unwrap();
        clock.advance(Duration::from_secs(11));
        store
            .renew("B", "a", &claims[0], Duration::from_secs(10))
            .await
            .unwrap();
        let keys = |v: Vec<crate::store::Record>| v.into_iter().map(|r| r.key).collect::<Vec<_>>();
        assert_eq!(keys(store.stuck("B", 10).await.unwrap()), ["c"]);
        assert_eq!(
            keys(store.stuck("B", 10).await.unwrap()),
            ["c"],
            "still stuck"
        );
        clock.advance(Duration::from_secs(11));
        assert_eq!(keys(store.stuck("B", 10).await.unwrap()), ["c", "a"]);
        assert_eq!(keys(store.stuck("B", 1).await.unwrap()), ["c"]);
        store.sweep_expired(10).await.unwrap();
        assert_eq!(
            store.lock().by_biz["B"].leases.len(),
            2,
            "the sweep keeps the stuck"
        );
    }
}
