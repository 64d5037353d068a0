//! Which step a claim sends first: the write that creates a record, or a plain read.
//!
//! A claim on a new key is cheapest as a write first (an insert, or a script that inserts): one
//! round trip. A claim on a key that already has a record (a replay above all, the duplicate path a
//! retry storm hammers) is cheapest as a read first: a SUCCEEDED record is immutable until it
//! expires, so one plain read by primary key decides the replay, with no write, no lock and no
//! script. Written first, that repeat costs the refused write and then the read.
//!
//! Neither order is right for every workload, so a store keeps a [`ClaimOrder`]: a counter of what
//! its recent claims found, which goes up by one for a claim that met a record and down by one for
//! a claim that created one, within ±[`ClaimOrder::SPAN`]. A claim reads first while it is above
//! zero. Per claim a read first costs `2 - p` round trips and a write first `1 + p`, where `p` is the
//! share of claims that meet a record; the counter drifts up when `p > ½` and down when `p < ½`, so
//! a store follows its traffic: write first for new keys, read first in a storm of repeats, and
//! within 2·SPAN claims of a change. The order only chooses which step comes first: both are the
//! same protocol, decided by the same table (`decide.rs`), and the write that claims is always the
//! atomic one.

use std::sync::atomic::{AtomicI32, Ordering};

use super::{Acquired, ClaimOutcome};

/// What a store's recent claims found (see the module's text). Shared by a store's clones.
#[derive(Debug, Default)]
pub(crate) struct ClaimOrder(AtomicI32);

impl ClaimOrder {
    /// How far the counter goes each way: how many claims of the other kind it takes to turn.
    pub(crate) const SPAN: i32 = 16;

    /// Whether the next claim should read first.
    pub(crate) fn read_first(&self) -> bool {
        self.0.load(Ordering::Relaxed) > 0
    }

    /// Counts what a claim found: a record (any outcome but a fresh claim) or none. A fresh claim
    /// of an expired record counts as none: either order pays one statement more for it.
    pub(crate) fn observe(&self, outcome: &ClaimOutcome) {
        let met = !matches!(
            outcome,
            ClaimOutcome::Acquired {
                how: Acquired::Fresh,
                ..
            }
        );
        // No write once the counter is at its end: a steady workload costs one load per claim.
        let _ = self
            .0
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                let next = if met {
                    (n + 1).min(Self::SPAN)
                } else {
                    (n - 1).max(-Self::SPAN)
                };
                (next != n).then_some(next)
            });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{Claim, Fence};

    fn fresh() -> ClaimOutcome {
        ClaimOutcome::Acquired {
            claim: Claim {
                attempt: 1,
                fence: Fence::new(1),
            },
            how: Acquired::Fresh,
        }
    }

    fn replay() -> ClaimOutcome {
        ClaimOutcome::Replay {
            snapshot: Vec::new(),
        }
    }

    #[test]
    fn it_writes_first_until_repeats_outnumber_new_keys() {
        let order = ClaimOrder::default();
        assert!(!order.read_first(), "a new store writes first");
        order.observe(&replay());
        assert!(order.read_first(), "one repeat turns it");
        order.observe(&fresh());
        assert!(!order.read_first());
        // 60 % repeats: reads first; 40 %: writes first.
        for i in 0..100 {
            order.observe(&if i % 5 < 3 { replay() } else { fresh() });
        }
        assert!(order.read_first());
        for i in 0..100 {
            order.observe(&if i % 5 < 2 { replay() } else { fresh() });
        }
        assert!(!order.read_first());
    }

    #[test]
    fn it_turns_within_two_spans() {
        let order = ClaimOrder::default();
        for _ in 0..1000 {
            order.observe(&fresh());
        }
        for n in 1..=2 * ClaimOrder::SPAN {
            order.observe(&ClaimOutcome::Mismatch);
            if order.read_first() {
                assert_eq!(n, ClaimOrder::SPAN + 1);
                return;
            }
        }
        panic!("never turned");
    }
}
