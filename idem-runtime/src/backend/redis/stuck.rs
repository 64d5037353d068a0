//! The reconciler's index on one Redis server: a sorted set per business type of its PROCESSING
//! records by lease end, kept by the record scripts, read by [`Store::stuck`](crate::Store::stuck)
//! through one script (no SCAN), with the members of records Redis expired by itself dropped as
//! they are met.

use std::sync::LazyLock;

use redis::{Script, Value};

use super::{Records, int, record_key, record_of, redis_error, scripts, text};
use crate::IdemError;
use crate::store::Record;

static STUCK: LazyLock<Script> = LazyLock::new(|| Script::new(scripts::STUCK));

/// How many members one run of the stuck script walks besides the records it returns: it blocks
/// the server while it runs, so stale members (records Redis expired by itself) are dropped this
/// many at a time, and the walk starts again after them.
const STALE_PER_RUN: u64 = 1000;

/// The key of business type `biz`'s stuck index: `<prefix>stuck:<n>:<biz>`, `n` its length in
/// bytes as in [`record_key`], so two business types never share one (`("PAY")` is
/// `idem:stuck:3:PAY`, `("PAY:x")` is `idem:stuck:5:PAY:x`). After the prefix a record key has
/// `{` and a token key `tok:`, so an index never meets either. A sorted set: its members are the
/// record keys of `biz` that are PROCESSING, scored by their lease end (ms, store clock); Redis
/// deletes it when its last member leaves.
pub(crate) fn stuck_key(prefix: &str, biz: &str) -> String {
    let mut len = itoa::Buffer::new();
    let len = len.format(biz.len());
    let mut k = String::with_capacity(prefix.len() + 7 + len.len() + biz.len());
    k.push_str(prefix);
    k.push_str("stuck:");
    k.push_str(len);
    k.push(':');
    k.push_str(biz);
    k
}

/// The business type of a record key written by [`record_key`] under `prefix`, if it is one.
pub(super) fn biz_of<'k>(prefix: &str, record: &'k str) -> Option<&'k str> {
    let rest = record.strip_prefix(prefix)?.strip_prefix('{')?;
    let (len, rest) = rest.split_once(':')?;
    if len.is_empty() || !len.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let len: usize = len.parse().ok()?;
    let biz = rest.get(..len)?;
    rest[len..].starts_with(':').then_some(biz)
}

/// The idempotency key of a member of `biz`'s index: the record key between
/// `<prefix>{<n>:<biz>:` and the closing brace.
pub(super) fn key_of<'k>(prefix: &str, biz: &str, record: &'k str) -> Option<&'k str> {
    let head = record_key(prefix, biz, "");
    let head = &head[..head.len() - 1];
    record.strip_prefix(head)?.strip_suffix('}')
}

/// What one run of the stuck script found.
struct Walked {
    /// It stopped at its budget: there may be more members to walk.
    more: bool,
    /// How many stuck records it passed.
    kept: u64,
    /// (When records were wanted) each stuck member followed by its record's 8 fields.
    found: Vec<Value>,
}

/// The business type whose stuck index is `index` (a member of the registry), if it is one.
fn biz_of_index<'k>(prefix: &str, index: &'k str) -> Option<&'k str> {
    let rest = index.strip_prefix(prefix)?.strip_prefix("stuck:")?;
    let (len, biz) = rest.split_once(':')?;
    (len.parse::<usize>().ok()? == biz.len()).then_some(biz)
}

impl Records {
    /// The business types whose stuck indexes the registry lists (one server; a cluster has no
    /// stuck index).
    pub(super) async fn processing_biz_types(&self) -> Result<Vec<String>, IdemError> {
        if self.index("").is_none() {
            return Err(IdemError::NotSupported {
                backend: "redis-cluster",
                what: "listing stuck records (the reconciler)",
            });
        }
        let mut conn = self.conn.clone();
        let indexes: Vec<String> = redis::cmd("SMEMBERS")
            .arg(self.registry())
            .query_async(&mut conn)
            .await
            .map_err(redis_error)?;
        let mut bizes: Vec<String> = indexes
            .iter()
            .filter_map(|index| biz_of_index(&self.prefix, index))
            .map(str::to_owned)
            .collect();
        bizes.sort_unstable();
        bizes.dedup();
        Ok(bizes)
    }

    /// Lists at most `batch` stuck records of `biz`, oldest lease first: one run of the stuck
    /// script on `biz`'s index (no SCAN), again when it stopped at its budget of stale members.
    pub(super) async fn stuck(&self, biz: &str, batch: usize) -> Result<Vec<Record>, IdemError> {
        let Some(index) = self.index(biz) else {
            return Err(IdemError::NotSupported {
                backend: "redis-cluster",
                what: "listing stuck records (the reconciler)",
            });
        };
        if batch == 0 {
            return Ok(Vec::new());
        }
        // Well inside what the script's `%d` writes exactly.
        let want = u64::try_from(batch).unwrap_or(u64::MAX).min(1 << 31);
        loop {
            let walked = self.walk(&index, want, 0, want + STALE_PER_RUN).await?;
            if walked.more {
                // STALE_PER_RUN stale members were dropped before `want` stuck records were found:
                // the next run starts where the records are.
                continue;
            }
            let mut records = Vec::with_capacity(walked.found.len() / 8);
            for fields in walked.found.chunks(9) {
                let [member, fields @ ..] = fields else {
                    return Err(IdemError::store("unexpected reply from the stuck script"));
                };
                let member = text(member).unwrap_or_default();
                let key = key_of(&self.prefix, biz, &member).ok_or_else(|| {
                    IdemError::store(format!(
                        "`{}` in the stuck index of `{biz}` is not one of its records",
                        member.escape_default()
                    ))
                })?;
                if let Some(record) = record_of(biz, key, fields)? {
                    records.push(record);
                }
            }
            return Ok(records);
        }
    }

    /// One run of the stuck script on `index`.
    async fn walk(
        &self,
        index: &str,
        want: u64,
        skip: u64,
        budget: u64,
    ) -> Result<Walked, IdemError> {
        let mut conn = self.conn.clone();
        let reply: Vec<Value> = STUCK
            .key(index)
            .arg(want)
            .arg(skip)
            .arg(budget)
            .arg(self.offset.ms())
            .invoke_async(&mut conn)
            .await
            .map_err(redis_error)?;
        let mut reply = reply.into_iter();
        let (Some(more), Some(kept)) = (reply.next(), reply.next()) else {
            return Err(IdemError::store("unexpected reply from the stuck script"));
        };
        Ok(Walked {
            more: int(&more, "more")? == 1,
            kept: u64::try_from(int(&kept, "kept")?).unwrap_or(0),
            found: reply.collect(),
        })
    }

    /// Drops the stale members of `index` (records gone or not PROCESSING) whose lease end has
    /// passed, a budget at a time, passing over the stuck ones.
    pub(super) async fn trim(&self, index: &str) -> Result<(), IdemError> {
        let mut skip = 0u64;
        loop {
            let walked = self.walk(index, 0, skip, STALE_PER_RUN).await?;
            if !walked.more {
                return Ok(());
            }
            skip += walked.kept;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::record_key;
    use super::{biz_of, key_of, stuck_key};

    #[test]
    fn an_index_key_names_one_business_type_and_meets_no_record_or_token() {
        assert_eq!(stuck_key("idem:", "PAY"), "idem:stuck:3:PAY");
        assert_ne!(stuck_key("idem:", "PAY:x"), stuck_key("idem:", "PAY"));
        assert_eq!(stuck_key("idem:", "PAY:x"), "idem:stuck:5:PAY:x");
        let index = stuck_key("p:", "tok");
        assert!(!index.starts_with("p:{") && !index.starts_with("p:tok:"));
    }

    #[test]
    fn a_record_key_reads_back_as_its_business_type_and_key() {
        for (biz, key) in [
            ("PAY", "x:y"),
            ("PAY:x", "y"),
            ("B", "}{"),
            ("支付", "k"),
            ("A", ""),
        ] {
            let record = record_key("idem:", biz, key);
            assert_eq!(biz_of("idem:", &record), Some(biz), "{record}");
            assert_eq!(key_of("idem:", biz, &record), Some(key), "{record}");
        }
        assert_eq!(biz_of("idem:", "idem:tok:00"), None);
        assert_eq!(biz_of("idem:", "idem:{PAY:x}"), None, "0.1.0's keys");
        assert_eq!(biz_of("idem:", "idem:{9:PAY:x}"), None);
        assert_eq!(biz_of("other:", &record_key("idem:", "PAY", "x")), None);
        assert_eq!(
            key_of("idem:", "PAY", &record_key("idem:", "PAY:x", "y")),
            None
        );
    }
}
