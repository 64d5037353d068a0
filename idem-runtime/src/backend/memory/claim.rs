//! What the memory store does on its map, locked by the caller: the claim decision (one key, or
//! each key of a batch under one lock) and the mark of success.

use std::cmp::Reverse;
use std::sync::Arc;
use std::time::Duration;

use super::records::{Biz, Entry, Map, NO_SLOT};
use super::{Lender, MemoryStore};
use crate::IdemError;
use crate::store::decide::{Decision, decide, duration_ms, millis, taken};
use crate::store::{Acquired, Claim, ClaimOutcome, ClaimRequest, Status, keeps_steps};

impl MemoryStore {
    /// The claim decision for `req` on `records` (the store's map, locked by the caller) at
    /// `now_us`: what `claim` does for one key and `claim_batch` for each of its keys, under one
    /// lock.
    ///
    /// A replay's result of up to [`MemoryStore::LENT_REPLAY_MAX`] bytes is lent to `lend` if
    /// given (see [`Store::__claim_now_lending`]), else copied into the outcome.
    ///
    /// [`Store::__claim_now_lending`]: crate::store::Store::__claim_now_lending
    #[inline(always)]
    pub(super) fn claim_in(
        &self,
        records: &mut Map<Biz>,
        req: &ClaimRequest<'_>,
        now_us: i64,
        lend: Option<Lender<'_>>,
    ) -> ClaimOutcome {
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
        let biz = match records.get_mut(req.biz) {
            Some(biz) => biz,
            None => records
                .entry(Arc::from(req.biz))
                .or_insert_with(|| Biz::new(self.capacity)),
        };
        let occupied = match biz.records.entry_ref(req.key) {
            hashbrown::hash_map::EntryRef::Occupied(e) => e,
            hashbrown::hash_map::EntryRef::Vacant(v) => {
                let mut entry = fresh(None, true, None);
                entry.slot = u32::try_from(biz.processing.len()).unwrap_or(NO_SLOT);
                let (expire_at, claim) = (entry.expire_at, entry.claim());
                let key: Arc<str> = req.key.into();
                v.insert_with_key(Arc::clone(&key), entry);
                biz.expiries.push(Reverse((expire_at, Arc::clone(&key))));
                biz.processing.push(key);
                return ClaimOutcome::Acquired {
                    claim,
                    how: Acquired::Fresh,
                };
            }
        };
        let entry = occupied.get();
        match decide(&entry.state(), req.fingerprint, now) {
            Decision::Take { how, reset } => {
                // The key's allocation is shared only on a take (the processing list names it).
                let key = Arc::clone(occupied.key());
                let entry = occupied.into_mut();
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
            Decision::Replay => {
                let stored = entry.snapshot.as_deref().unwrap_or_default();
                match lend {
                    Some(lend) if stored.len() <= Self::LENT_REPLAY_MAX => {
                        lend(stored);
                        ClaimOutcome::Replay {
                            snapshot: Vec::new(),
                        }
                    }
                    _ => ClaimOutcome::Replay {
                        snapshot: stored.to_vec(),
                    },
                }
            }
            Decision::ResultGone => ClaimOutcome::ResultGone,
            Decision::Mismatch => ClaimOutcome::Mismatch,
            Decision::InProgress(ms) => ClaimOutcome::InProgress {
                retry_after: duration_ms(ms),
            },
        }
    }

    /// The mark of success, the result kept `result_ttl` (or as long as the record); `snapshot`
    /// gives the bytes to keep, called only when the mark lands.
    pub(super) fn mark_succeeded(
        &self,
        biz: &str,
        key: &str,
        claim: &Claim,
        snapshot: impl FnOnce() -> Vec<u8>,
        ttl: Duration,
        result_ttl: Option<Duration>,
    ) -> Result<(), IdemError> {
        let now = self.now_ms();
        Self::mark_in(
            &mut self.lock(),
            now,
            biz,
            key,
            claim,
            snapshot,
            ttl,
            result_ttl,
        )
    }

    /// [`MemoryStore::mark_succeeded`] on `records` (locked by the caller) at `now` (ms).
    #[allow(clippy::too_many_arguments)]
    #[inline]
    pub(super) fn mark_in(
        records: &mut Map<Biz>,
        now: i64,
        biz: &str,
        key: &str,
        claim: &Claim,
        snapshot: impl FnOnce() -> Vec<u8>,
        ttl: Duration,
        result_ttl: Option<Duration>,
    ) -> Result<(), IdemError> {
        let result_until = result_ttl.map(|keep| now.saturating_add(millis(keep)));
        let held = Self::held(records, biz, key, claim, Status::Succeeded, |e| {
            e.status = Status::Succeeded;
            e.snapshot = Some(snapshot());
            e.expire_at = e.expire_at.max(now.saturating_add(millis(ttl)));
            e.result_until = result_until;
        })?;
        if let (Some(at), Some((by_biz, key))) = (result_until, held) {
            by_biz.results.push(Reverse((at, key)));
        }
        Ok(())
    }
}
