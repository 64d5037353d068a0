//! A record as a DynamoDB item: its key, its attributes, and the item read back as a [`Record`].
//!
//! One item per record, keyed by `pk = <n>:<biz>:<key>` (`n` the business type's length in bytes,
//! so `("PAY", "x:y")` and `("PAY:x", "y")` are two items). Attribute names are two letters that
//! are no reserved word of DynamoDB's expressions, so every expression names them as they are.

use std::collections::HashMap;

use aws_sdk_dynamodb::types::AttributeValue;

use crate::IdemError;
use crate::store::decide::RecordState;
use crate::store::{Fence, Record, Status};

/// The partition key: `<n>:<biz>:<key>`.
pub(crate) const PK: &str = "pk";
/// Business type and key, as given (for `load`, `stats`, `list_keys`).
pub(crate) const BIZ: &str = "rb";
pub(crate) const KEY: &str = "rk";
/// Status: `PROCESSING`, `SUCCEEDED`, `FAILED`.
pub(crate) const STATUS: &str = "rs";
pub(crate) const ATTEMPT: &str = "ra";
pub(crate) const FENCE: &str = "rf";
pub(crate) const FINGERPRINT: &str = "rp";
/// The result snapshot of a SUCCEEDED record, the saved steps of an unfinished one.
pub(crate) const BLOB: &str = "rr";
/// Lease end, expiry and result end, ms since the Unix epoch by the writer's clock.
pub(crate) const LEASE_UNTIL: &str = "rl";
pub(crate) const EXPIRE_AT: &str = "re";
pub(crate) const RESULT_UNTIL: &str = "ru";
/// DynamoDB's TTL attribute: epoch seconds after which DynamoDB may delete the item.
pub(crate) const DELETE_AFTER: &str = "rx";
/// Goes up by one with every write: what a take read is the condition of its write.
pub(crate) const VERSION: &str = "rv";
/// A random number each taking write carries: a write whose reply was lost and that the SDK sent
/// again finds its own item by it.
pub(crate) const WRITER: &str = "ro";
/// The stuck index (a sparse global secondary index): business type and lease end, present only
/// while the record is PROCESSING.
pub(crate) const STUCK_BIZ: &str = "sb";
pub(crate) const STUCK_LEASE: &str = "sl";
/// The stuck index's name.
pub(crate) const STUCK_INDEX: &str = "idem_stuck";

/// The partition key of `(biz, key)`.
pub(crate) fn record_key(biz: &str, key: &str) -> String {
    let mut len = itoa::Buffer::new();
    let len = len.format(biz.len());
    let mut pk = String::with_capacity(len.len() + biz.len() + key.len() + 2);
    pk.push_str(len);
    pk.push(':');
    pk.push_str(biz);
    pk.push(':');
    pk.push_str(key);
    pk
}

/// The `(biz, key)` a partition key names; `None` for text no [`record_key`] gave.
pub(crate) fn parse_record_key(pk: &str) -> Option<(&str, &str)> {
    let (len, rest) = pk.split_once(':')?;
    let canonical = !len.is_empty()
        && len.bytes().all(|b| b.is_ascii_digit())
        && (len == "0" || !len.starts_with('0'));
    if !canonical {
        return None;
    }
    let len: usize = len.parse().ok()?;
    let biz = rest.get(..len)?;
    let key = rest.get(len..)?.strip_prefix(':')?;
    Some((biz, key))
}

pub(crate) fn s(v: impl Into<String>) -> AttributeValue {
    AttributeValue::S(v.into())
}

pub(crate) fn n(v: impl itoa::Integer) -> AttributeValue {
    AttributeValue::N(itoa::Buffer::new().format(v).to_owned())
}

pub(crate) fn b(v: &[u8]) -> AttributeValue {
    AttributeValue::B(aws_sdk_dynamodb::primitives::Blob::new(v))
}

/// DynamoDB's TTL for a record whose expiry and lease end are these (ms): the later of the two
/// plus the skew margin, in whole seconds rounded up. DynamoDB deletes the item some time after
/// it (hours or days, by its own clock); the store's own checks treat it as absent before that.
pub(crate) fn delete_after(expire_at_ms: i64, lease_until_ms: i64, skew_ms: i64) -> i64 {
    let last = expire_at_ms.max(lease_until_ms).saturating_add(skew_ms);
    last.saturating_add(999).div_euclid(1000)
}

/// A record as read back, with what its next write conditions on.
#[derive(Debug, Clone)]
pub(crate) struct Stored {
    pub record: Record,
    pub version: i64,
    pub writer: Option<String>,
}

impl Stored {
    pub(crate) fn state(&self) -> RecordState<'_> {
        RecordState {
            status: self.record.status,
            fingerprint: self.record.fingerprint.as_deref(),
            lease_until_ms: self.record.lease_until_ms,
            expire_at_ms: self.record.expire_at_ms,
            result_until_ms: self.record.result_until_ms,
        }
    }
}

fn bad(what: &str) -> IdemError {
    IdemError::store(format!(
        "a DynamoDB item of idem's table has no valid `{what}`: the table holds items idem did \
         not write"
    ))
}

fn text<'i>(item: &'i HashMap<String, AttributeValue>, name: &str) -> Result<&'i str, IdemError> {
    match item.get(name) {
        Some(AttributeValue::S(v)) => Ok(v),
        _ => Err(bad(name)),
    }
}

fn opt_text(item: &HashMap<String, AttributeValue>, name: &str) -> Option<String> {
    match item.get(name) {
        Some(AttributeValue::S(v)) => Some(v.clone()),
        _ => None,
    }
}

pub(crate) fn int(item: &HashMap<String, AttributeValue>, name: &str) -> Result<i64, IdemError> {
    match item.get(name) {
        Some(AttributeValue::N(v)) => v.parse().map_err(|_| bad(name)),
        _ => Err(bad(name)),
    }
}

fn opt_int(item: &HashMap<String, AttributeValue>, name: &str) -> Result<Option<i64>, IdemError> {
    match item.get(name) {
        None | Some(AttributeValue::Null(_)) => Ok(None),
        Some(_) => int(item, name).map(Some),
    }
}

/// The item as a record (and its version).
///
/// # Errors
/// [`IdemError::Store`] for an item idem did not write.
pub(crate) fn stored(item: &HashMap<String, AttributeValue>) -> Result<Stored, IdemError> {
    let status = Status::parse(text(item, STATUS)?)?;
    let blob = match item.get(BLOB) {
        Some(AttributeValue::B(v)) => Some(v.as_ref().to_vec()),
        _ => None,
    };
    let (snapshot, steps) = Record::split_blob(status, blob);
    let record = Record {
        biz: text(item, BIZ)?.to_owned(),
        key: text(item, KEY)?.to_owned(),
        status,
        attempt: u32::try_from(int(item, ATTEMPT)?).map_err(|_| bad(ATTEMPT))?,
        fence: Fence::new(u64::try_from(int(item, FENCE)?).map_err(|_| bad(FENCE))?),
        fingerprint: opt_text(item, FINGERPRINT),
        snapshot,
        steps,
        lease_until_ms: int(item, LEASE_UNTIL)?,
        expire_at_ms: int(item, EXPIRE_AT)?,
        result_until_ms: opt_int(item, RESULT_UNTIL)?,
    };
    Ok(Stored {
        record,
        version: int(item, VERSION)?,
        writer: opt_text(item, WRITER),
    })
}

/// The whole item of a record just taken (PROCESSING, in the stuck index).
pub(crate) struct NewItem<'a> {
    pub biz: &'a str,
    pub key: &'a str,
    pub attempt: u32,
    pub fence: u64,
    pub fingerprint: Option<&'a str>,
    pub steps: Option<&'a [u8]>,
    pub lease_until_ms: i64,
    pub expire_at_ms: i64,
    pub version: i64,
    pub writer: &'a str,
    pub skew_ms: i64,
}

impl NewItem<'_> {
    pub(crate) fn item(&self) -> HashMap<String, AttributeValue> {
        let mut item = HashMap::with_capacity(16);
        item.insert(PK.to_owned(), s(record_key(self.biz, self.key)));
        item.insert(BIZ.to_owned(), s(self.biz));
        item.insert(KEY.to_owned(), s(self.key));
        item.insert(STATUS.to_owned(), s(Status::Processing.as_str()));
        item.insert(ATTEMPT.to_owned(), n(self.attempt));
        item.insert(FENCE.to_owned(), n(self.fence));
        if let Some(fp) = self.fingerprint {
            item.insert(FINGERPRINT.to_owned(), s(fp));
        }
        if let Some(steps) = self.steps {
            item.insert(BLOB.to_owned(), b(steps));
        }
        item.insert(LEASE_UNTIL.to_owned(), n(self.lease_until_ms));
        item.insert(EXPIRE_AT.to_owned(), n(self.expire_at_ms));
        item.insert(
            DELETE_AFTER.to_owned(),
            n(delete_after(
                self.expire_at_ms,
                self.lease_until_ms,
                self.skew_ms,
            )),
        );
        item.insert(VERSION.to_owned(), n(self.version));
        item.insert(WRITER.to_owned(), s(self.writer));
        item.insert(STUCK_BIZ.to_owned(), s(self.biz));
        item.insert(STUCK_LEASE.to_owned(), n(self.lease_until_ms));
        item
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_key_names_one_pair() {
        for (biz, key) in [
            ("PAY", "x:y"),
            ("PAY:x", "y"),
            ("支付", "ключ"),
            ("B", "1:2"),
        ] {
            let pk = record_key(biz, key);
            assert_eq!(parse_record_key(&pk), Some((biz, key)), "{pk}");
        }
        assert_ne!(record_key("PAY", "x:y"), record_key("PAY:x", "y"));
        for bad in ["", "PAY", "9:PAY:k", "03:PAY:k", "3:PAYk", "x:PAY:k"] {
            assert_eq!(parse_record_key(bad), None, "{bad}");
        }
    }

    #[test]
    fn the_ttl_attribute_covers_expiry_lease_and_margin() {
        assert_eq!(delete_after(10_000, 5_000, 0), 10);
        assert_eq!(delete_after(10_001, 5_000, 0), 11);
        assert_eq!(delete_after(10_000, 20_000, 500), 21);
        assert_eq!(delete_after(i64::MAX, 0, 500), i64::MAX / 1000);
    }
}
