//! The claim: a conditional write, and on a refusal the decision table on the item that refused
//! it, until one write lands or the table answers without one.

use std::collections::HashMap;
use std::time::{SystemTime, UNIX_EPOCH};

use super::DynamoStore;
use super::item::{NewItem, Stored, n};
use super::requests::Written;
use crate::store::decide::{Decision, decide, duration_ms, taken};
use crate::store::{Acquired, Claim, ClaimOutcome, ClaimRequest, Fence, keeps_steps};
use crate::{Busy, IdemError};

/// How many times a claim reads and writes again when another caller's write came between.
const CLAIM_ROUNDS: usize = 16;

/// A random tag for one taking write.
fn new_writer() -> String {
    let r = getrandom::u64().unwrap_or_else(|_| {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
    });
    format!("{r:016x}")
}

fn acquired(attempt: u32, fence: u64, how: Acquired) -> ClaimOutcome {
    ClaimOutcome::Acquired {
        claim: Claim {
            attempt,
            fence: Fence::new(fence),
        },
        how,
    }
}

/// One round of a claim: its answer, or the record (none: no record) to decide on next.
enum Round {
    Answer(ClaimOutcome),
    Again(Option<Stored>),
}

/// What the decision table said to take, and the clock it decided at (µs).
struct Taking {
    how: Acquired,
    reset: bool,
    now_us: i64,
}

/// What a taking write's answer means: acquired, also when the refusing item is this claim's own
/// write (sent again by the SDK after its reply was lost); else the record to decide on next.
fn landed(written: Written, writer: &str, attempt: u32, fence: u64, how: Acquired) -> Round {
    match written {
        Written::Done => Round::Answer(acquired(attempt, fence, how)),
        Written::Refused(Some(found)) if found.writer.as_deref() == Some(writer) => {
            Round::Answer(acquired(attempt, fence, how))
        }
        Written::Refused(found) => Round::Again(found),
    }
}

impl DynamoStore {
    /// The claim of one key (see the module's text). It reads first when recent claims mostly
    /// met a record, so a replay is then one read.
    pub(super) async fn claim_one(
        &self,
        req: &ClaimRequest<'_>,
    ) -> Result<ClaimOutcome, IdemError> {
        let writer = new_writer();
        // `None`: not read yet; `Some(None)`: no record.
        let mut known: Option<Option<Stored>> = if self.order.read_first() {
            Some(self.get(req.biz, req.key).await?)
        } else {
            None
        };
        for _ in 0..CLAIM_ROUNDS {
            let now_us = self.now_us();
            let round = match known.take() {
                Some(Some(old)) => self.on_record(req, old, &writer, now_us).await?,
                _ => self.insert(req, &writer, now_us).await?,
            };
            match round {
                Round::Answer(outcome) => return Ok(outcome),
                Round::Again(found) => known = Some(found),
            }
        }
        Err(IdemError::busy(
            Busy::Locked,
            format!(
                "DynamoDB {}: the record changed under {CLAIM_ROUNDS} claims in a row",
                self.place
            ),
        ))
    }

    /// No record (or not read yet): inserts one, if there still is none.
    async fn insert(
        &self,
        req: &ClaimRequest<'_>,
        writer: &str,
        now_us: i64,
    ) -> Result<Round, IdemError> {
        let t = taken(None, true, now_us, req.lease, req.ttl);
        let item = NewItem {
            biz: req.biz,
            key: req.key,
            attempt: t.attempt,
            fence: t.fence,
            fingerprint: req.fingerprint,
            steps: None,
            lease_until_ms: t.lease_until_ms,
            expire_at_ms: t.expire_at_ms,
            version: 1,
            writer,
            skew_ms: self.skew_ms,
        };
        let written = self
            .put(item.item(), "attribute_not_exists(pk)", None)
            .await?;
        Ok(
            match landed(written, writer, t.attempt, t.fence, Acquired::Fresh) {
                // Refused with no item: it is gone again, or the server did not hand it back.
                Round::Again(None) => Round::Again(self.get(req.biz, req.key).await?),
                round => round,
            },
        )
    }

    /// A record: the decision table, by this caller's clock less the skew margin.
    async fn on_record(
        &self,
        req: &ClaimRequest<'_>,
        old: Stored,
        writer: &str,
        now_us: i64,
    ) -> Result<Round, IdemError> {
        let now_ms = now_us.div_euclid(1000);
        let answer = match decide(&old.state(), req.fingerprint, self.judged_at(now_ms)) {
            Decision::Take { how, reset } => {
                let taking = Taking { how, reset, now_us };
                return self.take(req, &old, writer, taking).await;
            }
            Decision::Replay => ClaimOutcome::Replay {
                snapshot: old.record.snapshot.unwrap_or_default(),
            },
            Decision::ResultGone => ClaimOutcome::ResultGone,
            Decision::Mismatch => ClaimOutcome::Mismatch,
            Decision::InProgress(_) => {
                // The lease left by this caller's clock; past its end, the margin left.
                let lu = old.record.lease_until_ms;
                let left = if lu > now_ms {
                    lu - now_ms
                } else {
                    lu.saturating_add(self.skew_ms) - now_ms
                };
                ClaimOutcome::InProgress {
                    retry_after: duration_ms(left.max(1)),
                }
            }
        };
        Ok(Round::Answer(answer))
    }

    /// Takes `old` over (or starts it again): a put on condition that the record is still the
    /// fence and version read.
    async fn take(
        &self,
        req: &ClaimRequest<'_>,
        old: &Stored,
        writer: &str,
        Taking { how, reset, now_us }: Taking,
    ) -> Result<Round, IdemError> {
        let rec = &old.record;
        let steps = if keeps_steps(reset, rec.fingerprint.as_deref(), req.fingerprint) {
            rec.steps.as_deref()
        } else {
            None
        };
        let t = taken(
            Some((rec.attempt, rec.fence.get(), rec.expire_at_ms)),
            reset,
            now_us,
            req.lease,
            req.ttl,
        );
        let item = NewItem {
            biz: req.biz,
            key: req.key,
            attempt: t.attempt,
            fence: t.fence,
            fingerprint: req.fingerprint,
            steps,
            lease_until_ms: t.lease_until_ms,
            expire_at_ms: t.expire_at_ms,
            version: old.version.saturating_add(1),
            writer,
            skew_ms: self.skew_ms,
        };
        let values = HashMap::from([
            (":f".to_owned(), n(rec.fence.get())),
            (":v".to_owned(), n(old.version)),
        ]);
        let written = self
            .put(item.item(), "rf = :f AND rv = :v", Some(values))
            .await?;
        Ok(landed(written, writer, t.attempt, t.fence, how))
    }
}
