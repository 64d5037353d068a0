//! The memory store's records of one business type, and what its background passes read: an
//! expiry queue, a result queue and the list of PROCESSING records.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::Arc;

use crate::store::decide::{RESULT_DROPPED, RecordState};
use crate::store::{Claim, Fence, Record, Status};

#[derive(Debug, Clone)]
pub(super) struct Entry {
    pub(super) status: Status,
    pub(super) attempt: u32,
    pub(super) fence: u64,
    pub(super) fingerprint: Option<Box<str>>,
    /// The result once SUCCEEDED; before that, the saved steps (as the SQL stores keep them).
    pub(super) snapshot: Option<Vec<u8>>,
    pub(super) lease_until: i64,
    pub(super) expire_at: i64,
    /// Until when a SUCCEEDED record's result is replayed (`RESULT_DROPPED` once swept); `None`:
    /// as long as the record.
    pub(super) result_until: Option<i64>,
    /// Its place in its business type's `processing` list while PROCESSING, else `NO_SLOT`.
    pub(super) slot: u32,
}

/// The `slot` of a record that is not PROCESSING.
pub(super) const NO_SLOT: u32 = u32::MAX;

impl Entry {
    pub(super) fn state(&self) -> RecordState<'_> {
        RecordState {
            status: self.status,
            fingerprint: self.fingerprint.as_deref(),
            lease_until_ms: self.lease_until,
            expire_at_ms: self.expire_at,
            result_until_ms: self.result_until,
        }
    }

    pub(super) fn record(&self, biz: &str, key: &str) -> Record {
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

    /// The earliest time it can expire: its TTL, or the end of a live lease that holds it past
    /// its TTL (only a PROCESSING record's lease holds it).
    pub(super) fn earliest_expiry(&self) -> i64 {
        match self.status {
            Status::Processing => self.expire_at.max(self.lease_until),
            _ => self.expire_at,
        }
    }

    pub(super) fn claim(&self) -> Claim {
        Claim {
            attempt: self.attempt,
            fence: Fence::new(self.fence),
        }
    }
}

/// Keys come from callers, so the map is seeded per process (hashbrown's default, foldhash).
/// Shared keys: the queues and the lease index below name a record by the allocation its map holds.
pub(super) type Map<V> = hashbrown::HashMap<Arc<str>, V>;

/// A min-queue of `(time, key)`: the earliest first.
pub(super) type Queue = BinaryHeap<Reverse<(i64, Arc<str>)>>;

/// A business type's records, and what its background passes read, so that each costs what it
/// finds, not the number of records:
/// - `expiries`: one item per record, the earliest time it can expire; a sweep looks at the
///   record then, and deletes it or queues it again at its new expiry;
/// - `results`: one item per success marked with a result ttl, at that time;
/// - `processing`: the keys of its PROCESSING records, exactly, each record knowing its place
///   (a record enters when a claim takes it; a mark, a failure or a deletion takes it out, the
///   last key moving into its place): what [`Store::stuck`] reads, so a stuck list costs the
///   records in flight and stuck, not all of them.
pub(super) struct Biz {
    pub(super) records: Map<Entry>,
    pub(super) expiries: Queue,
    pub(super) results: Queue,
    pub(super) processing: Vec<Arc<str>>,
}

impl Biz {
    pub(super) fn new(capacity: usize) -> Self {
        Biz {
            records: Map::with_capacity(capacity),
            expiries: Queue::new(),
            results: Queue::new(),
            processing: Vec::new(),
        }
    }

    /// Takes the record at `slot` out of the `processing` list: the last key moves into its place.
    pub(super) fn leave(&mut self, slot: u32) {
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
    pub(super) fn sweep(&mut self, now: i64, batch: usize) -> usize {
        let mut deleted = 0;
        while deleted < batch {
            let Some((at, key)) = Self::due(&mut self.expiries, now) else {
                break;
            };
            // The same record queued twice at the same time (queued again sooner, then both
            // queued again at its expiry): one item is enough.
            while let Some(Reverse((next, next_key))) = self.expiries.peek()
                && *next == at
                && **next_key == *key
            {
                self.expiries.pop();
            }
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
                self.expiries.push(Reverse((e.earliest_expiry(), key)));
            }
        }
        deleted
    }

    /// Drops the results of at most `batch` successes whose result ttl passed by `now`.
    pub(super) fn shrink(&mut self, now: i64, batch: usize) -> usize {
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
