//! The writes of a claim's holder: the mark of success or failure, the lease moved (renewed or
//! given up) and the steps saved, each on condition that the record is still PROCESSING under the
//! holder's fence.

use std::collections::HashMap;
use std::time::Duration;

use aws_sdk_dynamodb::types::AttributeValue;

use super::DynamoStore;
use super::item::{self, Stored, b, n, s};
use super::requests::{Item, Written};
use crate::IdemError;
use crate::store::decide::millis;
use crate::store::{Claim, Status};

/// `LeaseLost` for `claim`.
fn lost(claim: &Claim) -> IdemError {
    IdemError::LeaseLost {
        attempt: claim.attempt,
    }
}

/// The values every write by `claim`'s holder binds (`:p` PROCESSING, `:f` its fence, `:one`),
/// and `more`.
fn holder_values<const N: usize>(claim: &Claim, more: [(&str, AttributeValue); N]) -> Item {
    let mut values = HashMap::from([
        (":p".to_owned(), s(Status::Processing.as_str())),
        (":f".to_owned(), n(claim.fence.get())),
        (":one".to_owned(), n(1)),
    ]);
    values.extend(more.into_iter().map(|(k, v)| (k.to_owned(), v)));
    values
}

impl DynamoStore {
    /// Whether a refused mark is one that landed before (the record is `done` under the claim's
    /// fence: the same mark sent again), else `LeaseLost`.
    pub(super) fn settled(
        found: Option<&Stored>,
        claim: &Claim,
        done: Status,
    ) -> Result<(), IdemError> {
        match found {
            Some(f) if f.record.fence == claim.fence && f.record.status == done => Ok(()),
            _ => Err(lost(claim)),
        }
    }

    /// The mark of success; the result kept until `result_ttl` from now, or as long as the
    /// record.
    pub(super) async fn mark(
        &self,
        biz: &str,
        key: &str,
        claim: &Claim,
        snapshot: &[u8],
        ttl: Duration,
        result_ttl: Option<Duration>,
    ) -> Result<(), IdemError> {
        let now = self.now_ms();
        let expire_at = now.saturating_add(millis(ttl));
        let mut values = holder_values(
            claim,
            [(":s", s(Status::Succeeded.as_str())), (":r", b(snapshot))],
        );
        let (kept_set, kept_remove) = match result_ttl {
            Some(kept) => {
                values.insert(":u".to_owned(), n(now.saturating_add(millis(kept))));
                (", ru = :u", "")
            }
            None => ("", ", ru"),
        };
        // The expiry moves to now + ttl unless it is later already: one write when it is not (the
        // usual case), a second without the expiry when the first finds it later.
        let mut with_expiry = values.clone();
        with_expiry.insert(":e".to_owned(), n(expire_at));
        with_expiry.insert(
            ":x".to_owned(),
            n(item::delete_after(expire_at, 0, self.skew_ms)),
        );
        let update = format!(
            "SET rs = :s, rr = :r, re = :e, rx = :x, rv = rv + :one{kept_set} REMOVE sb, sl{kept_remove}"
        );
        let found = match self
            .update(
                biz,
                key,
                &update,
                "rs = :p AND rf = :f AND re <= :e",
                with_expiry,
            )
            .await?
        {
            Written::Done => return Ok(()),
            Written::Refused(found) => found,
        };
        let later = found.as_ref().is_some_and(|f| {
            f.record.fence == claim.fence
                && f.record.status == Status::Processing
                && f.record.expire_at_ms > expire_at
        });
        if !later {
            return Self::settled(found.as_ref(), claim, Status::Succeeded);
        }
        let update =
            format!("SET rs = :s, rr = :r, rv = rv + :one{kept_set} REMOVE sb, sl{kept_remove}");
        match self
            .update(biz, key, &update, "rs = :p AND rf = :f", values)
            .await?
        {
            Written::Done => Ok(()),
            Written::Refused(found) => Self::settled(found.as_ref(), claim, Status::Succeeded),
        }
    }

    /// Moves the lease of a claim still held to end at `lease_until` (ms), and the record's
    /// expiry with it when it would end first.
    pub(super) async fn lease_to(
        &self,
        biz: &str,
        key: &str,
        claim: &Claim,
        lease_until: i64,
    ) -> Result<(), IdemError> {
        let values = holder_values(claim, [(":l", n(lease_until))]);
        let found = match self
            .update(
                biz,
                key,
                "SET rl = :l, sl = :l, rv = rv + :one",
                "rs = :p AND rf = :f AND re >= :l",
                values.clone(),
            )
            .await?
        {
            Written::Done => return Ok(()),
            Written::Refused(found) => found,
        };
        let held = found.as_ref().is_some_and(|f| {
            f.record.fence == claim.fence && f.record.status == Status::Processing
        });
        if !held {
            return Err(lost(claim));
        }
        let mut values = values;
        values.insert(
            ":x".to_owned(),
            n(item::delete_after(lease_until, lease_until, self.skew_ms)),
        );
        match self
            .update(
                biz,
                key,
                "SET rl = :l, sl = :l, re = :l, rx = :x, rv = rv + :one",
                "rs = :p AND rf = :f",
                values,
            )
            .await?
        {
            Written::Done => Ok(()),
            Written::Refused(_) => Err(lost(claim)),
        }
    }

    /// Marks the record FAILED.
    pub(super) async fn fail_one(
        &self,
        biz: &str,
        key: &str,
        claim: &Claim,
    ) -> Result<(), IdemError> {
        let values = holder_values(claim, [(":s", s(Status::Failed.as_str()))]);
        let update = "SET rs = :s, rv = rv + :one REMOVE sb, sl";
        match self
            .update(biz, key, update, "rs = :p AND rf = :f", values)
            .await?
        {
            Written::Done => Ok(()),
            Written::Refused(found) => Self::settled(found.as_ref(), claim, Status::Failed),
        }
    }

    /// Keeps the steps done so far in the record.
    pub(super) async fn save_steps_of(
        &self,
        biz: &str,
        key: &str,
        claim: &Claim,
        steps: &[u8],
    ) -> Result<(), IdemError> {
        let values = holder_values(claim, [(":r", b(steps))]);
        let update = "SET rr = :r, rv = rv + :one";
        match self
            .update(biz, key, update, "rs = :p AND rf = :f", values)
            .await?
        {
            Written::Done => Ok(()),
            Written::Refused(_) => Err(lost(claim)),
        }
    }
}
