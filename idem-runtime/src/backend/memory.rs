//! An in-process store: one map behind a mutex. For tests, single-process services and benchmarks.

use std::sync::Mutex;
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
type Map<V> = hashbrown::HashMap<String, V>;
type Records = Map<Map<Entry>>;

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
        let mut records = self.lock();
        match records.get_mut(biz).and_then(|m| m.get_mut(key)) {
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
        self.with_held(biz, key, claim, Status::Succeeded, |e| {
            e.status = Status::Succeeded;
            e.snapshot = Some(snapshot.to_vec());
            e.expire_at = e.expire_at.max(now.saturating_add(millis(ttl)));
            e.result_until = result_ttl.map(|keep| now.saturating_add(millis(keep)));
        })
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
        let mut records = self.lock();
        let by_key = match records.get_mut(req.biz) {
            Some(m) => m,
            None => records
                .entry(req.biz.into())
                .or_insert_with(|| Map::with_capacity(self.capacity)),
        };
        let entry = match by_key.entry_ref(req.key) {
            hashbrown::hash_map::EntryRef::Occupied(e) => e.into_mut(),
            hashbrown::hash_map::EntryRef::Vacant(v) => {
                let entry = v.insert(fresh(None, true, None));
                return Ok(ClaimOutcome::Acquired {
                    claim: entry.claim(),
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
        self.with_held(biz, key, claim, Status::Processing, |e| {
            e.lease_until = now.saturating_add(millis(lease));
            e.expire_at = e.expire_at.max(e.lease_until);
        })
    }

    async fn load(&self, biz: &str, key: &str) -> Result<Option<Record>, IdemError> {
        let records = self.lock();
        Ok(records
            .get(biz)
            .and_then(|m| m.get(key))
            .map(|e| e.record(biz, key)))
    }

    async fn stuck(&self, biz: &str, batch: usize) -> Result<Vec<Record>, IdemError> {
        let now = self.now_ms();
        let records = self.lock();
        let Some(by_key) = records.get(biz) else {
            return Ok(Vec::new());
        };
        let mut stuck: Vec<(&String, &Entry)> = by_key
            .iter()
            .filter(|(_, e)| e.status == Status::Processing && e.lease_until <= now)
            .collect();
        stuck.sort_by_key(|(_, e)| e.lease_until);
        Ok(stuck
            .into_iter()
            .take(batch)
            .map(|(key, e)| e.record(biz, key))
            .collect())
    }

    async fn stats(&self) -> Result<Vec<StatusCount>, IdemError> {
        let now = self.now_ms();
        let records = self.lock();
        Ok(StatusCount::tally(records.iter().flat_map(
            |(biz, by_key)| {
                by_key.values().map(|e| StatusCount {
                    biz: biz.clone(),
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

    async fn sweep_expired(&self, batch: usize) -> Result<u64, IdemError> {
        let now = self.now_ms();
        let mut records = self.lock();
        let mut deleted = 0usize;
        for by_key in records.values_mut() {
            if deleted == batch {
                break;
            }
            let expired: Vec<String> = by_key
                .iter()
                .filter(|(_, e)| e.state().is_expired(now))
                .map(|(k, _)| k.clone())
                .take(batch - deleted)
                .collect();
            for k in expired {
                by_key.remove(&k);
                deleted += 1;
            }
        }
        records.retain(|_, m| !m.is_empty());
        // Results past their result ttl: dropped, the records kept as tombstones.
        let mut shrunk = 0usize;
        for e in records.values_mut().flat_map(|m| m.values_mut()) {
            if shrunk == batch {
                break;
            }
            if e.result_until
                .is_some_and(|t| t != RESULT_DROPPED && t <= now)
            {
                e.snapshot = None;
                e.result_until = Some(RESULT_DROPPED);
                shrunk += 1;
            }
        }
        Ok((deleted + shrunk) as u64)
    }
}
