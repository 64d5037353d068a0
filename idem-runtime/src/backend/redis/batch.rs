//! Batch claims and batch marks on the two Redis stores: one script for every key of a batch on
//! one server, one per hash slot on a cluster (sent at once), with the replicas waited for once.

use std::sync::LazyLock;
use std::time::Duration;

use redis::{Script, Value};

use super::conn::Conn;
use super::eval::Eval;
use super::records::{Records, claim_reply};
use super::slots::slot;
use super::{redis_error, scripts};
use crate::IdemError;
use crate::store::decide::millis;
use crate::store::{Claim, ClaimOutcome};

static CLAIM_MANY: LazyLock<Script> = LazyLock::new(|| Script::new(scripts::CLAIM_MANY));
static COMPLETE_MANY: LazyLock<Script> = LazyLock::new(|| Script::new(scripts::COMPLETE_MANY));

impl Records {
    /// The indexes of `records` grouped by the script that may touch them together: all of them on
    /// one server, one group per hash slot on a cluster.
    fn by_slot(&self, records: &[String]) -> Vec<Vec<usize>> {
        match self.conn {
            Conn::Single(_) => vec![(0..records.len()).collect()],
            Conn::Cluster(_) => {
                let mut by_slot: std::collections::BTreeMap<u16, Vec<usize>> = Default::default();
                for (i, record) in records.iter().enumerate() {
                    by_slot.entry(slot(record.as_bytes())).or_default().push(i);
                }
                by_slot.into_values().collect()
            }
        }
    }

    /// Marks every item of `marks` (records of `biz`): on one server one script for all of them; on
    /// a cluster one per hash slot, sent at once. Then, with replica acks, one `WAIT`.
    pub(super) async fn complete_many(
        &self,
        biz: &str,
        marks: &[crate::store::BatchMark<'_>],
        ttl: Duration,
    ) -> Result<Vec<Result<(), IdemError>>, IdemError> {
        let records: Vec<String> = marks.iter().map(|m| self.key(biz, m.key)).collect();
        let groups = self.by_slot(&records);
        let index = self.index(biz);
        let sends = groups.iter().filter(|g| !g.is_empty()).map(|group| {
            let (records, index) = (&records, index.as_deref());
            async move {
                let results = group
                    .iter()
                    .any(|&i| marks[i].result_ttl.is_some())
                    .then(|| self.results_for(&records[group[0]]));
                let mut conn = self.conn.clone();
                let mut invocation = COMPLETE_MANY.prepare_invoke();
                for &i in group {
                    invocation.key(&records[i]);
                }
                if let Some(index) = index {
                    invocation.key(index);
                }
                if let Some(results) = &results {
                    invocation.key(results);
                }
                invocation
                    .arg(group.len())
                    .arg(if index.is_some() { "1" } else { "0" })
                    .arg(if results.is_some() { "1" } else { "0" })
                    .arg(millis(ttl));
                for &i in group {
                    let m = &marks[i];
                    invocation.arg(m.claim.fence.get()).arg(m.snapshot).arg(
                        m.result_ttl
                            .map(|kept| millis(kept).to_string())
                            .unwrap_or_default(),
                    );
                }
                let done: Vec<i64> = invocation
                    .arg(self.offset.ms())
                    .invoke_async(&mut conn)
                    .await
                    .map_err(redis_error)?;
                if let Some(results) = &results {
                    self.listed(results).await;
                }
                if done.len() != group.len() {
                    return Err(IdemError::store("the batch mark script answered short"));
                }
                Ok::<_, IdemError>(group.iter().copied().zip(done).collect::<Vec<_>>())
            }
        });
        let mut answers: Vec<Option<Result<(), IdemError>>> = marks.iter().map(|_| None).collect();
        for part in futures_util::future::join_all(sends).await {
            for (i, done) in part? {
                answers[i] = Some(match done {
                    1 => Ok(()),
                    _ => Err(IdemError::LeaseLost {
                        attempt: marks[i].claim.attempt,
                    }),
                });
            }
        }
        if let Some(first) = records.first() {
            self.replicated(first).await?;
        }
        crate::store::batch::all_answered(answers, "the batch mark script")
    }

    /// Claims every item of `batch`: on one server one script for all of them; on a cluster one
    /// per hash slot the records live in, sent at once.
    pub(super) async fn claim_many(
        &self,
        batch: &crate::store::BatchClaim<'_>,
    ) -> Result<Vec<ClaimOutcome>, IdemError> {
        let records: Vec<String> = batch
            .items
            .iter()
            .map(|item| self.key(batch.biz, item.key))
            .collect();
        let groups = self.by_slot(&records);
        let index = self.index(batch.biz);
        let claims = groups.iter().filter(|g| !g.is_empty()).map(|group| {
            let (records, index) = (&records, index.as_deref());
            async move {
                let outcomes = self.claim_group(batch, records, group, index).await?;
                Ok::<_, IdemError>(group.iter().copied().zip(outcomes).collect::<Vec<_>>())
            }
        });
        let mut outcomes: Vec<Option<ClaimOutcome>> = vec![None; records.len()];
        let mut failed = None;
        for part in futures_util::future::join_all(claims).await {
            match part {
                Ok(part) => part.into_iter().for_each(|(i, o)| outcomes[i] = Some(o)),
                Err(e) => failed = Some(e),
            }
        }
        let acquired: Vec<(usize, Claim)> = outcomes
            .iter()
            .enumerate()
            .filter_map(|(i, o)| match o {
                Some(ClaimOutcome::Acquired { claim, .. }) => Some((i, *claim)),
                _ => None,
            })
            .collect();
        // The claims made are released when the batch fails (another slot's script failed, or the
        // replicas did not acknowledge them), so none is left held by no one.
        let failed = match (failed, acquired.first()) {
            (Some(e), _) => Some(e),
            (None, Some(&(i, _))) => self.replicated(&records[i]).await.err(),
            (None, None) => None,
        };
        if let Some(e) = failed {
            for (i, claim) in &acquired {
                self.release_unreplicated(&records[*i], index.as_deref(), claim)
                    .await;
            }
            return Err(e);
        }
        crate::store::batch::all_answered(outcomes, "the batch claim script")
    }

    /// The batch claim script on the records at `group` (one hash slot on a cluster).
    async fn claim_group(
        &self,
        batch: &crate::store::BatchClaim<'_>,
        records: &[String],
        group: &[usize],
        index: Option<&str>,
    ) -> Result<Vec<ClaimOutcome>, IdemError> {
        let mut conn = self.conn.clone();
        let registry = index
            .filter(|index| !self.is_registered(index))
            .map(|_| self.registry());
        let extra = [index, registry.as_deref()];
        let extra = extra.iter().filter_map(|k| *k);
        let fingerprints = group
            .iter()
            .map(|&i| batch.items[i].fingerprint.unwrap_or(""));
        let mut eval = Eval::new(
            &CLAIM_MANY,
            group.len() + extra.clone().count(),
            group.len() + 4,
            group.iter().map(|&i| records[i].len()).sum::<usize>()
                + extra.clone().map(str::len).sum::<usize>()
                + fingerprints.clone().map(str::len).sum::<usize>(),
        );
        for &i in group {
            eval.arg(&records[i]);
        }
        for key in extra {
            eval.arg(key);
        }
        eval.arg(group.len());
        for fingerprint in fingerprints {
            eval.arg(fingerprint);
        }
        let replies: Vec<Value> = eval
            .arg(millis(batch.lease))
            .arg(millis(batch.ttl))
            .arg(self.offset.ms())
            .invoke(&mut conn)
            .await
            .map_err(redis_error)?;
        if let (Some(index), Some(_)) = (index, &registry) {
            self.mark_registered(index);
        }
        if replies.len() != group.len() {
            return Err(IdemError::store(format!(
                "the batch claim script answered {} claims for {}",
                replies.len(),
                group.len()
            )));
        }
        replies
            .into_iter()
            .map(|mut r| claim_reply(&mut r))
            .collect()
    }
}
