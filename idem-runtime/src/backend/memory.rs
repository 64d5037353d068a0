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
    /// Its place in its business type's `processing` list while PROCESSING, else `NO_SLOT`.
    slot: u32,
}

/// The `slot` of a record that is not PROCESSING.
const NO_SLOT: u32 = u32::MAX;

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
/// Shared keys: the queues and the lease index below name a record by the allocation its map holds.
type Map<V> = hashbrown::HashMap<Arc<str>, V>;

/// A min-queue of `(time, key)`: the earliest first.
type Queue = BinaryHeap<Reverse<(i64, Arc<str>)>>;

/// A business type's records, and what its background passes read, so that each costs what it
/// finds, not the number of records:
/// - `expiries`: one item per record, the earliest time it can expire; a sweep looks at the
///   record then, and deletes it or queues it again at its new expiry;
/// - `results`: one item per success marked with a result ttl, at that time;
/// - `processing`: the keys of its PROCESSING records, exactly, each record knowing its place
///   (a record enters when a claim takes it; a mark, a failure or a deletion takes it out, the
///   last key moving into its place): what [`Store::stuck`] reads, so a stuck list costs the
///   records in flight and stuck, not all of them.
struct Biz {
    records: Map<Entry>,
    expiries: Queue,
    results: Queue,
    processing: Vec<Arc<str>>,
}

impl Biz {
    fn new(capacity: usize) -> Self {
        Biz {
            records: Map::with_capacity(capacity),
            expiries: Queue::new(),
            results: Queue::new(),
            processing: Vec::new(),
        }
    }

    /// Takes the record at `slot` out of the `processing` list: the last key moves into its place.
    fn leave(&mut self, slot: u32) {
        let i = slot as usize;
        self.processing.swap_remove(i);
        if let Some(moved) = self.processing.get(i)
            && let Some(e) = self.records.get_mut(&**moved)
        {
            e.slot = slot;
        }
    }

    /// Pops the front of `queue` if its time has come by `now`.
    fn due(queue: &mut Queue, now: i64) -> Option<(i64, Arc<str>)> {
        match queue.peek() {
            Some(Reverse((at, _))) if *at <= now => queue.pop().map(|Reverse(item)| item),
            _ => None,
        }
    }

    /// Deletes at most `batch` of its records that expired by `now`.
    fn sweep(&mut self, now: i64, batch: usize) -> usize {
        let mut deleted = 0;
        while deleted < batch {
            let Some((_, key)) = Self::due(&mut self.expiries, now) else {
                break;
            };
            let Some(e) = self.records.get(&*key) else {
                continue;
            };
            if e.state().is_expired(now) {
                let slot = e.slot;
                self.records.remove(&*key);
                if slot != NO_SLOT {
                    self.leave(slot);
                }
                deleted += 1;
            } else {
                // Not yet: the earliest it can expire, later than now (its TTL, or the end of
                // the live lease that holds it past its TTL).
                let at = if e.expire_at > now {
                    e.expire_at
                } else {
                    e.lease_until
                };
                self.expiries.push(Reverse((at, key)));
            }
        }
        deleted
    }

    /// Drops the results of at most `batch` successes whose result ttl passed by `now`.
    fn shrink(&mut self, now: i64, batch: usize) -> usize {
        let mut shrunk = 0;
        while shrunk < batch {
            let Some((at, key)) = Self::due(&mut self.results, now) else {
                break;
            };
            if let Some(e) = self.records.get_mut(&*key)
                && e.status == Status::Succeeded
                && e.result_until == Some(at)
            {
                e.snapshot = None;
                e.result_until = Some(RESULT_DROPPED);
                shrunk += 1;
            }
        }
        shrunk
    }
}

/// Keeps records in this process's memory. Its clock is the wall clock read once at creation plus
/// a monotonic clock since (it never steps back), plus a test clock's offset if given ([`TestClock`](crate::TestClock), feature `test-util`). Records
/// are lost when the process ends.
pub struct MemoryStore {
    records: Mutex<Map<Biz>>,
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
            records: Mutex::new(Map::default()),
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

    fn lock(&self) -> std::sync::MutexGuard<'_, Map<Biz>> {
        // A panic while holding the lock cannot leave an entry half-updated (every update is a
        // single assignment), so a poisoned lock is still consistent.
        self.records.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs `change` on the record if it is PROCESSING under `claim`'s fence; a record already
    /// `done` under it (the same mark again) is left as it is. A record that leaves PROCESSING
    /// leaves the business type's `processing` set. Returns the business type's records and the
    /// record's key, for what the caller queues.
    fn held<'r>(
        records: &'r mut Map<Biz>,
        biz: &str,
        key: &str,
        claim: &Claim,
        done: Status,
        change: impl FnOnce(&mut Entry),
    ) -> Result<Option<(&'r mut Biz, Arc<str>)>, IdemError> {
        let lost = || IdemError::LeaseLost {
            attempt: claim.attempt,
        };
        let by_biz = records.get_mut(biz).ok_or_else(lost)?;
        let (k, e) = by_biz.records.get_key_value_mut(key).ok_or_else(lost)?;
        if e.fence != claim.fence.get() {
            return Err(lost());
        }
        if e.status == done && done != Status::Processing {
            return Ok(None);
        }
        if e.status != Status::Processing {
            return Err(lost());
        }
        change(e);
        let key = Arc::clone(k);
        if e.status != Status::Processing && e.slot != NO_SLOT {
            let slot = std::mem::replace(&mut e.slot, NO_SLOT);
            by_biz.leave(slot);
        }
        Ok(Some((by_biz, key)))
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
        let held = Self::held(&mut records, biz, key, claim, Status::Succeeded, |e| {
            e.status = Status::Succeeded;
            e.snapshot = Some(snapshot.to_vec());
            e.expire_at = e.expire_at.max(now.saturating_add(millis(ttl)));
            e.result_until = result_until;
        })?;
        if let (Some(at), Some((by_biz, key))) = (result_until, held) {
            by_biz.results.push(Reverse((at, key)));
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
                slot: NO_SLOT,
            }
        };
        let mut records = self.lock();
        let biz = match records.get_mut(req.biz) {
            Some(biz) => biz,
            None => records
                .entry(Arc::from(req.biz))
                .or_insert_with(|| Biz::new(self.capacity)),
        };
        let (key, entry) = match biz.records.entry_ref(req.key) {
            hashbrown::hash_map::EntryRef::Occupied(e) => {
                let key = Arc::clone(e.key());
                (key, e.into_mut())
            }
            hashbrown::hash_map::EntryRef::Vacant(v) => {
                let mut entry = fresh(None, true, None);
                entry.slot = u32::try_from(biz.processing.len()).unwrap_or(NO_SLOT);
                let (expire_at, claim) = (entry.expire_at, entry.claim());
                let key: Arc<str> = req.key.into();
                v.insert_with_key(Arc::clone(&key), entry);
                biz.expiries.push(Reverse((expire_at, Arc::clone(&key))));
                biz.processing.push(key);
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
                let slot = match entry.slot {
                    NO_SLOT => {
                        biz.processing.push(key);
                        u32::try_from(biz.processing.len() - 1).unwrap_or(NO_SLOT)
                    }
                    slot => slot,
                };
                *entry = fresh(
                    Some((entry.attempt, entry.fence, entry.expire_at)),
                    reset,
                    steps,
                );
                entry.slot = slot;
                ClaimOutcome::Acquired {
                    claim: entry.claim(),
                    how,
                }
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
        Self::held(&mut self.lock(), biz, key, claim, Status::Failed, |e| {
            e.status = Status::Failed;
        })
        .map(drop)
    }

    async fn save_steps(
        &self,
        biz: &str,
        key: &str,
        claim: &Claim,
        steps: &[u8],
    ) -> Result<(), IdemError> {
        Self::held(&mut self.lock(), biz, key, claim, Status::Processing, |e| {
            e.snapshot = Some(steps.to_vec());
        })
        .map(drop)
    }

    async fn renew(
        &self,
        biz: &str,
        key: &str,
        claim: &Claim,
        lease: Duration,
    ) -> Result<(), IdemError> {
        let lease_until = self.now_ms().saturating_add(millis(lease));
        Self::held(&mut self.lock(), biz, key, claim, Status::Processing, |e| {
            e.lease_until = lease_until;
            e.expire_at = e.expire_at.max(e.lease_until);
        })
        .map(drop)
    }

    async fn load(&self, biz: &str, key: &str) -> Result<Option<Record>, IdemError> {
        let records = self.lock();
        Ok(records
            .get(biz)
            .and_then(|b| b.records.get(key))
            .map(|e| e.record(biz, key)))
    }

    /// From the business type's PROCESSING records: a call costs the records in flight and
    /// stuck, not a walk of all of them.
    async fn stuck(&self, biz: &str, batch: usize) -> Result<Vec<Record>, IdemError> {
        let now = self.now_ms();
        let records = self.lock();
        let Some(by_biz) = records.get(biz) else {
            return Ok(Vec::new());
        };
        let mut stuck: Vec<(i64, &str, &Entry)> = by_biz
            .processing
            .iter()
            .filter_map(|key| {
                let e = by_biz.records.get(&**key)?;
                (e.status == Status::Processing && e.lease_until <= now).then_some((
                    e.lease_until,
                    &**key,
                    e,
                ))
            })
            .collect();
        stuck.sort_unstable_by(|a, b| (a.0, a.1).cmp(&(b.0, b.1)));
        Ok(stuck
            .into_iter()
            .take(batch)
            .map(|(_, key, e)| e.record(biz, key))
            .collect())
    }

    async fn stats(&self) -> Result<Vec<StatusCount>, IdemError> {
        let now = self.now_ms();
        let records = self.lock();
        Ok(StatusCount::tally(records.iter().flat_map(
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

    /// From each business type's expiry and result queues: a call costs the records whose time
    /// came (deleted, shrunk, or queued again at a later expiry), never a walk of the records.
    async fn sweep_expired(&self, batch: usize) -> Result<u64, IdemError> {
        let now = self.now_ms();
        let mut records = self.lock();
        let (mut deleted, mut shrunk) = (0usize, 0usize);
        for by_biz in records.values_mut() {
            deleted += by_biz.sweep(now, batch - deleted);
            shrunk += by_biz.shrink(now, batch - shrunk);
        }
        records.retain(|_, b| !b.records.is_empty());
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

    /// Every PROCESSING record is in its business type's `processing` list at its own slot, and
    /// nothing else is.
    fn check_slots(store: &MemoryStore) {
        for by_biz in store.lock().values() {
            for (i, key) in by_biz.processing.iter().enumerate() {
                let e = &by_biz.records[&**key];
                assert_eq!(e.status, super::Status::Processing, "{key}");
                assert_eq!(e.slot as usize, i, "{key}");
            }
            let processing = by_biz
                .records
                .values()
                .filter(|e| e.status == super::Status::Processing)
                .count();
            assert_eq!(processing, by_biz.processing.len());
        }
    }

    /// Claims, marks, failures, takeovers and sweeps interleaved over many keys keep the slots.
    #[tokio::test]
    async fn slots_follow_every_change() {
        let clock = TestClock::new();
        let store = MemoryStore::new().with_test_clock(clock.clone());
        let ttl = Duration::from_secs(60);
        let mut held = Vec::new();
        for round in 0..20u32 {
            for k in 0..50u32 {
                let key = format!("k-{}", (k * 7 + round) % 60);
                if let ClaimOutcome::Acquired { claim, .. } =
                    store.claim(&req("B", &key, ttl)).await.unwrap()
                {
                    held.push((key, claim));
                }
            }
            // Finish some in an order other than they came: the last slot moves each time.
            let mut i = 0;
            held.retain(|_| {
                i += 1;
                i % 3 == 0
            });
            for (n, (key, claim)) in held.drain(..).enumerate() {
                if n % 2 == 0 {
                    let _ = store.complete("B", &key, &claim, b"ok", ttl).await;
                } else {
                    let _ = store.fail("B", &key, &claim).await;
                }
            }
            check_slots(&store);
            clock.advance(Duration::from_secs(11 + u64::from(round % 3) * 30));
            store.sweep_expired(7).await.unwrap();
            check_slots(&store);
        }
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
        assert_eq!(store.lock()["B"].expiries.len(), 1010);
        clock.advance(Duration::from_secs(31));
        assert_eq!(store.sweep_expired(4).await.unwrap(), 4);
        assert_eq!(store.sweep_expired(100).await.unwrap(), 6);
        let records = store.lock();
        assert_eq!(records["B"].expiries.len(), 1000);
        assert_eq!(records["B"].records.len(), 1000);
        assert!(!records["B"].records.contains_key("due-0"));
        assert!(records["B"].records.contains_key("live-0"));
    }

    /// The `processing` set holds the PROCESSING records and nothing else: a failure and a mark
    /// take a record out, a takeover keeps it in once.
    #[tokio::test]
    async fn the_processing_set_holds_only_processing_records() {
        let clock = TestClock::new();
        let store = MemoryStore::new().with_test_clock(clock.clone());
        let ttl = Duration::from_secs(3600);
        for _ in 0..100 {
            let ClaimOutcome::Acquired { claim, .. } =
                store.claim(&req("B", "k", ttl)).await.unwrap()
            else {
                panic!("not acquired");
            };
            assert_eq!(store.lock()["B"].processing.len(), 1);
            store.fail("B", "k", &claim).await.unwrap();
            assert_eq!(store.lock()["B"].processing.len(), 0);
        }
        // A takeover moves the record's entry; a mark takes it out.
        store.claim(&req("B", "k", ttl)).await.unwrap();
        clock.advance(Duration::from_secs(11));
        let ClaimOutcome::Acquired { claim, .. } = store.claim(&req("B", "k", ttl)).await.unwrap()
        else {
            panic!("not taken over");
        };
        assert_eq!(store.lock()["B"].processing.len(), 1);
        store.complete("B", "k", &claim, b"ok", ttl).await.unwrap();
        assert_eq!(store.lock()["B"].processing.len(), 0);
    }

    /// The stuck list reads the `processing` set: a renewal moves a record later, a mark takes it
    /// out, and the stuck ones stay for the next pass.
    #[tokio::test]
    async fn stuck_records_come_from_the_processing_set() {
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
            store.lock()["B"].processing.len(),
            2,
            "the sweep keeps the stuck"
        );
    }
}
