//! An in-process store: one map behind a mutex. For tests, single-process services and benchmarks.

use std::cmp::Reverse;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;

use crate::IdemError;
use crate::clock::ClockOffset;
use crate::store::decide::millis;
use crate::store::keys::{after_key, check_batch, parse_after_key};
use crate::store::{
    BatchClaim, BatchMark, Claim, ClaimOutcome, ClaimRequest, KeyPage, Limits, Record, Status,
    StatusCount, Store,
};

mod claim;
mod records;
#[cfg(test)]
mod tests;

use records::{Biz, Entry, Map, NO_SLOT};

/// What a replay's stored result is lent to ([`Store::__claim_now_lending`]).
type Lender<'a> = &'a mut dyn FnMut(&[u8]);

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
    /// The longest stored result a replay decodes where the store keeps it, under its lock
    /// ([`Store::__claim_now_lending`]): a result this short decodes in about the time its copy
    /// would take. A longer one is copied out and decoded after the lock is released, so
    /// other calls do not wait on its decoding.
    pub const LENT_REPLAY_MAX: usize = 1024;

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
    #[inline]
    fn now_us(&self) -> i64 {
        // In 64-bit steps (`as_micros` is a 128-bit product): a process's uptime in whole
        // seconds fits an i64 many times over, and the sum saturates.
        let elapsed = self.epoch.elapsed();
        let elapsed = i64::try_from(elapsed.as_secs())
            .unwrap_or(i64::MAX)
            .saturating_mul(1_000_000)
            .saturating_add(i64::from(elapsed.subsec_micros()));
        let now = self.epoch_us.saturating_add(elapsed);
        match self.offset.ms() {
            0 => now,
            ms => now.saturating_add(ms.saturating_mul(1000)),
        }
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
    #[inline]
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
        let could_expire = e.earliest_expiry();
        change(e);
        let key = Arc::clone(k);
        // Sooner than the expiry queue has it (a lease released or shortened, a failure or a
        // mark that ends a lease holding the record past its TTL): queued again at the new time,
        // so a sweep then finds it.
        let expires = e.earliest_expiry();
        if expires < could_expire {
            by_biz.expiries.push(Reverse((expires, Arc::clone(&key))));
        }
        if e.status != Status::Processing && e.slot != NO_SLOT {
            let slot = std::mem::replace(&mut e.slot, NO_SLOT);
            by_biz.leave(slot);
        }
        Ok(Some((by_biz, key)))
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
        Ok(self.claim_in(&mut self.lock(), req, now_us, None))
    }

    /// Always: the claim is a map look-up under the lock.
    #[inline]
    fn __claim_now(&self, req: &ClaimRequest<'_>) -> Option<Result<ClaimOutcome, IdemError>> {
        let now_us = self.now_us();
        Some(Ok(self.claim_in(&mut self.lock(), req, now_us, None)))
    }

    /// Always, lending a result of up to [`MemoryStore::LENT_REPLAY_MAX`] bytes.
    #[inline]
    fn __claim_now_lending(
        &self,
        req: &ClaimRequest<'_>,
        replay: &mut dyn FnMut(&[u8]),
    ) -> Option<Result<ClaimOutcome, IdemError>> {
        let now_us = self.now_us();
        Some(Ok(self.claim_in(
            &mut self.lock(),
            req,
            now_us,
            Some(replay),
        )))
    }

    /// Always: the mark is a map update under the lock, which keeps the snapshot's bytes.
    #[inline]
    fn __complete_now(
        &self,
        biz: &str,
        key: &str,
        claim: &Claim,
        snapshot: &mut Vec<u8>,
        ttl: Duration,
        result_ttl: Option<Duration>,
    ) -> Option<Result<(), IdemError>> {
        // The bytes themselves when their buffer has little to spare (no more than an
        // allocator's size class rounds a copy up to), else a copy at their length: a record
        // keeps no spare capacity of the encoder's.
        let keep = || match snapshot.capacity() - snapshot.len() {
            0..=16 => std::mem::take(snapshot),
            _ => snapshot.as_slice().to_vec(),
        };
        Some(self.mark_succeeded(biz, key, claim, keep, ttl, result_ttl))
    }

    /// Every key under one lock, at one clock reading.
    async fn claim_batch(&self, batch: &BatchClaim<'_>) -> Result<Vec<ClaimOutcome>, IdemError> {
        batch.check()?;
        let now_us = self.now_us();
        let mut records = self.lock();
        Ok(batch
            .requests()
            .map(|req| self.claim_in(&mut records, &req, now_us, None))
            .collect())
    }

    /// The business types whose PROCESSING lists are not empty.
    async fn processing_biz_types(&self) -> Result<Vec<String>, IdemError> {
        let records = self.lock();
        let mut bizes: Vec<String> = records
            .iter()
            .filter(|(_, biz)| !biz.processing.is_empty())
            .map(|(name, _)| name.to_string())
            .collect();
        bizes.sort_unstable();
        Ok(bizes)
    }

    /// Every mark under one lock, at one clock reading.
    async fn complete_batch(
        &self,
        biz: &str,
        marks: &[BatchMark<'_>],
        ttl: Duration,
    ) -> Result<Vec<Result<(), IdemError>>, IdemError> {
        crate::store::batch::check_marks(marks)?;
        let now = self.now_ms();
        let mut records = self.lock();
        Ok(marks
            .iter()
            .map(|m| {
                Self::mark_in(
                    &mut records,
                    now,
                    biz,
                    m.key,
                    &m.claim,
                    || m.snapshot.to_vec(),
                    ttl,
                    m.result_ttl,
                )
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
        self.mark_succeeded(biz, key, claim, || snapshot.to_vec(), ttl, None)
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
        self.mark_succeeded(biz, key, claim, || snapshot.to_vec(), ttl, Some(result_ttl))
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

    /// In `(biz, key)` order (of their bytes), under the lock: a page reads every key of the
    /// business types it lists from (the records are kept by hash, not in order), so it costs the
    /// size of those business types, not of the page.
    async fn list_keys(&self, after: Option<&str>, batch: usize) -> Result<KeyPage, IdemError> {
        check_batch(batch)?;
        let after = after.map(parse_after_key).transpose()?;
        let records = self.lock();
        let mut bizes: Vec<(&str, &Biz)> = records
            .iter()
            .map(|(name, by_biz)| (&**name, by_biz))
            .filter(|(name, _)| after.is_none_or(|(from, _)| *name >= from))
            .collect();
        bizes.sort_unstable_by_key(|(name, _)| *name);
        let mut keys = Vec::with_capacity(batch);
        let mut more = false;
        for (name, by_biz) in bizes {
            let room = batch - keys.len();
            if room == 0 {
                more = !by_biz.records.is_empty();
                if more {
                    break;
                }
                continue;
            }
            let from = after.and_then(|(biz, key)| (biz == name).then_some(key));
            let mut found: Vec<&str> = by_biz
                .records
                .keys()
                .map(|k| &**k)
                .filter(|k| from.is_none_or(|from| *k > from))
                .collect();
            if found.len() > room {
                // The `room` smallest, without sorting the rest.
                found.select_nth_unstable(room);
                found.truncate(room);
                more = true;
            }
            found.sort_unstable();
            keys.extend(found.into_iter().map(|k| (name.to_owned(), k.to_owned())));
            if more {
                break;
            }
        }
        let next = match keys.last() {
            Some((biz, key)) if more => Some(after_key(biz, key)),
            _ => None,
        };
        Ok(KeyPage { keys, next })
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
