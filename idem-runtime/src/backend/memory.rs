//! An in-process store: one map behind a mutex. For tests, single-process services and benchmarks.

use std::any::Any;
use std::sync::Mutex;
use std::time::Instant;

use async_trait::async_trait;

use crate::IdemError;
use crate::store::decide::{Decision, RecordState, decide, duration_ms, millis};
use crate::store::{Acquired, ClaimOutcome, ClaimRequest, Limits, Record, Status, Store};

#[derive(Debug, Clone)]
struct Entry {
    status: Status,
    attempt: u32,
    fingerprint: Option<Box<str>>,
    snapshot: Option<Vec<u8>>,
    lease_until: i64,
    expire_at: i64,
}

/// Keys come from callers, so the map is seeded per process (hashbrown's default, foldhash).
type Map<V> = hashbrown::HashMap<String, V>;
type Records = Map<Map<Entry>>;

/// Keeps records in this process's memory; its clock is a monotonic clock started with the store.
/// Records are lost when the process ends.
pub struct MemoryStore {
    records: Mutex<Records>,
    epoch: Instant,
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
        Self::with_limits(Limits::default())
    }

    /// An empty store with the given limits.
    pub fn with_limits(limits: Limits) -> Self {
        MemoryStore {
            records: Mutex::new(Records::default()),
            epoch: Instant::now(),
            limits,
            capacity: 0,
        }
    }

    /// The same store, reserving room for `records` keys per business type up front, so a
    /// known volume never pays for growing the map while calls wait on its lock.
    pub fn with_capacity(mut self, records: usize) -> Self {
        self.capacity = records;
        self
    }

    fn now(&self) -> i64 {
        millis(self.epoch.elapsed())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Records> {
        // A panic while holding the lock cannot leave an entry half-updated (every update is a
        // single assignment), so a poisoned lock is still consistent.
        self.records.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Changes the record to `to` only if it is PROCESSING under `attempt`.
    fn finish(
        &self,
        biz: &str,
        key: &str,
        attempt: u32,
        to: Status,
        snapshot: Option<Vec<u8>>,
    ) -> Result<(), IdemError> {
        let mut records = self.lock();
        match records.get_mut(biz).and_then(|m| m.get_mut(key)) {
            Some(e) if e.attempt == attempt && e.status == Status::Processing => {
                e.status = to;
                e.snapshot = snapshot;
                Ok(())
            }
            _ => Err(IdemError::LeaseLost { attempt }),
        }
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
        let now = self.now();
        let fresh = |attempt| Entry {
            status: Status::Processing,
            attempt,
            fingerprint: req.fingerprint.map(Into::into),
            snapshot: None,
            lease_until: now + millis(req.lease),
            expire_at: now + millis(req.ttl),
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
                v.insert(fresh(1));
                return Ok(ClaimOutcome::Acquired {
                    attempt: 1,
                    how: Acquired::Fresh,
                });
            }
        };
        let state = RecordState {
            status: entry.status,
            fingerprint: entry.fingerprint.as_deref(),
            lease_until_ms: entry.lease_until,
            expire_at_ms: entry.expire_at,
        };
        Ok(match decide(&state, req.fingerprint, now) {
            Decision::Take { how, reset } => {
                let mut next = fresh(entry.attempt + 1);
                if !reset {
                    next.expire_at = entry.expire_at;
                }
                *entry = next;
                ClaimOutcome::Acquired {
                    attempt: entry.attempt,
                    how,
                }
            }
            Decision::Replay => ClaimOutcome::Replay {
                snapshot: entry.snapshot.as_deref().unwrap_or_default().to_vec(),
            },
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
        attempt: u32,
        snapshot: Vec<u8>,
    ) -> Result<(), IdemError> {
        self.finish(biz, key, attempt, Status::Succeeded, Some(snapshot))
    }

    async fn fail(&self, biz: &str, key: &str, attempt: u32) -> Result<(), IdemError> {
        self.finish(biz, key, attempt, Status::Failed, None)
    }

    async fn load(&self, biz: &str, key: &str) -> Result<Option<Record>, IdemError> {
        let records = self.lock();
        Ok(records.get(biz).and_then(|m| m.get(key)).map(|e| Record {
            biz: biz.to_owned(),
            key: key.to_owned(),
            status: e.status,
            attempt: e.attempt,
            fingerprint: e.fingerprint.as_deref().map(Into::into),
            snapshot: e.snapshot.clone(),
            lease_until_ms: e.lease_until,
            expire_at_ms: e.expire_at,
        }))
    }

    async fn sweep_expired(&self, batch: usize) -> Result<u64, IdemError> {
        let now = self.now();
        let mut records = self.lock();
        let mut deleted = 0usize;
        for by_key in records.values_mut() {
            if deleted == batch {
                break;
            }
            let expired: Vec<String> = by_key
                .iter()
                .filter(|(_, e)| e.expire_at <= now)
                .map(|(k, _)| k.clone())
                .take(batch - deleted)
                .collect();
            for k in expired {
                by_key.remove(&k);
                deleted += 1;
            }
        }
        records.retain(|_, m| !m.is_empty());
        Ok(deleted as u64)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}
