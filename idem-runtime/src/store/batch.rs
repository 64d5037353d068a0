//! Batch claims: what [`Store::claim_batch`](super::Store::claim_batch) is asked, and the checks
//! every store runs on it first. How the engine splits a batch into such claims (one per business
//! type, lease and ttl; a key that repeats in a later round) is in `engine/batch.rs`.

use std::collections::HashSet;
use std::time::Duration;

use super::{Claim, ClaimRequest};
use crate::IdemError;

/// The most keys one [`BatchClaim`] holds. [`crate::batch::Batch`] splits a longer batch into claims of
/// at most this many.
pub const MAX_BATCH: usize = 1_000;

/// One key of a [`BatchClaim`].
#[derive(Debug, Clone, Copy)]
pub struct BatchItem<'a> {
    /// Idempotency key.
    pub key: &'a str,
    /// Fingerprint of the item's payload, if it has one.
    pub fingerprint: Option<&'a str>,
}

/// What a call asks of the store when it claims many keys of one business type at once: for each
/// item, what [`ClaimRequest`] asks for one.
#[derive(Debug, Clone, Copy)]
pub struct BatchClaim<'a> {
    /// Business type of every item.
    pub biz: &'a str,
    /// The keys, 1 to [`MAX_BATCH`] of them, each at most once.
    pub items: &'a [BatchItem<'a>],
    /// The lease of every claim made.
    pub lease: Duration,
    /// The ttl of every record made.
    pub ttl: Duration,
}

impl<'a> BatchClaim<'a> {
    /// The claim of item `i` on its own.
    ///
    /// # Panics
    /// When `i` is not an item's index.
    pub fn request(&self, i: usize) -> ClaimRequest<'a> {
        let item = self.items[i];
        ClaimRequest {
            biz: self.biz,
            key: item.key,
            fingerprint: item.fingerprint,
            lease: self.lease,
            ttl: self.ttl,
        }
    }

    /// The claims of every item on its own, in order.
    pub fn requests(&self) -> impl ExactSizeIterator<Item = ClaimRequest<'a>> + '_ {
        (0..self.items.len()).map(|i| self.request(i))
    }

    /// Refuses a batch no store claims: more than [`MAX_BATCH`] items, or a key given twice (the
    /// second would be decided against the first's claim, which [`crate::batch::Batch`] does in a later
    /// round). What every store's `claim_batch` runs first.
    ///
    /// # Errors
    /// [`IdemError::InvalidOptions`] saying which.
    pub fn check(&self) -> Result<(), IdemError> {
        if self.items.len() > MAX_BATCH {
            return Err(IdemError::InvalidOptions {
                reason: format!(
                    "a batch claim holds at most {MAX_BATCH} keys, this one {}; split it \
                     (idem::batch::Batch does)",
                    self.items.len()
                ),
            });
        }
        let mut seen = HashSet::with_capacity(self.items.len());
        if let Some(twice) = self.items.iter().find(|item| !seen.insert(item.key)) {
            return Err(IdemError::InvalidOptions {
                reason: format!(
                    "a batch claim names each key once; a key of {} bytes is given twice (claim \
                     it again after the first is decided: idem::batch::Batch does)",
                    twice.key.len()
                ),
            });
        }
        Ok(())
    }
}

/// One mark of a batch ([`Store::complete_batch`](super::Store::complete_batch)): the record held
/// under `claim`, its result, and how long the result is kept.
#[derive(Debug, Clone, Copy)]
pub struct BatchMark<'a> {
    /// Idempotency key.
    pub key: &'a str,
    /// The claim that holds the record.
    pub claim: Claim,
    /// The result snapshot.
    pub snapshot: &'a [u8],
    /// How long the result is kept (as [`Store::complete_keeping`](super::Store::complete_keeping));
    /// `None`: as long as the record.
    pub result_ttl: Option<Duration>,
}

/// The answers of a batch gathered from its parts (shards, hash slots, the items a cache did not
/// answer), in order; an error naming `whose` when a part left an item unanswered.
pub(crate) fn all_answered<T>(answers: Vec<Option<T>>, whose: &str) -> Result<Vec<T>, IdemError> {
    answers
        .into_iter()
        .map(|a| a.ok_or_else(|| IdemError::store(format!("{whose} answered a batch short"))))
        .collect()
}

/// Refuses marks no store makes in one batch: more than [`MAX_BATCH`], or a key given twice.
pub(crate) fn check_marks(marks: &[BatchMark<'_>]) -> Result<(), IdemError> {
    if marks.len() > MAX_BATCH {
        return Err(IdemError::InvalidOptions {
            reason: format!(
                "a batch of marks holds at most {MAX_BATCH} keys, this one {}",
                marks.len()
            ),
        });
    }
    let mut seen = HashSet::with_capacity(marks.len());
    if marks.iter().any(|m| !seen.insert(m.key)) {
        return Err(IdemError::InvalidOptions {
            reason: "a batch of marks names each key once".to_owned(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch<'a>(items: &'a [BatchItem<'a>]) -> BatchClaim<'a> {
        BatchClaim {
            biz: "B",
            items,
            lease: Duration::from_secs(1),
            ttl: Duration::from_secs(2),
        }
    }

    #[test]
    fn a_repeated_key_and_an_oversized_batch_are_refused() {
        let item = |key| BatchItem {
            key,
            fingerprint: None,
        };
        assert!(batch(&[item("a"), item("b")]).check().is_ok());
        assert!(batch(&[]).check().is_ok());
        let err = batch(&[item("a"), item("b"), item("a")])
            .check()
            .unwrap_err();
        assert!(err.to_string().contains("given twice"), "{err}");
        let keys: Vec<String> = (0..=MAX_BATCH).map(|i| i.to_string()).collect();
        let items: Vec<BatchItem<'_>> = keys.iter().map(|k| item(k)).collect();
        let err = batch(&items).check().unwrap_err();
        assert!(err.to_string().contains("at most 1000 keys"), "{err}");
        assert!(batch(&items[..MAX_BATCH]).check().is_ok());
        let req = batch(&items).request(3);
        assert_eq!(
            (req.biz, req.key, req.ttl),
            ("B", "3", Duration::from_secs(2))
        );
    }
}
