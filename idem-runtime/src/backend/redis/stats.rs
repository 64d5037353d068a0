//! [`Store::stats`](crate::Store::stats) on Redis: a SCAN of the store's record keys
//! (`<prefix>{*`), a batch of replies at a time, and the status field of each (`HGET … s`), counted
//! by the business type its key names. On a cluster, every primary is scanned in turn.

use redis::Value;

use super::conn::Conn;
use super::stuck::biz_of;
use super::{Records, redis_error, text};
use crate::IdemError;
use crate::store::{Status, StatusCount};

impl Records {
    /// Counts the records of this prefix per business type and status. A record that vanishes
    /// between the SCAN and its read (expired, swept, deleted) is not counted; one written during
    /// the SCAN may or may not be (SCAN's own guarantee).
    pub(super) async fn stats(&self) -> Result<Vec<StatusCount>, IdemError> {
        // Record keys are `<prefix>{…`; the prefix's characters (letters, digits, `:`, `_`, `-`)
        // are none of SCAN's pattern characters, and `{` ends it, so another prefix never matches.
        let pattern = format!("{}{{*", self.prefix);
        let mut counts: Vec<StatusCount> = Vec::new();
        let mut scan = self.conn.scan(&pattern).await.map_err(redis_error)?;
        while let Some(keys) = scan.next(&self.conn).await.map_err(redis_error)? {
            if keys.is_empty() {
                continue;
            }
            let statuses = self.statuses(&keys).await.map_err(redis_error)?;
            for (key, status) in keys.iter().zip(statuses) {
                let (Some(biz), Some(status)) = (biz_of(&self.prefix, key), text(&status)) else {
                    continue;
                };
                counts.push(StatusCount {
                    biz: biz.to_owned(),
                    status: Status::parse(&status)?,
                    records: 1,
                });
            }
            // Memory stays bounded by the distinct (biz, status) pairs, not the keys.
            if counts.len() > 4096 {
                counts = StatusCount::tally(std::mem::take(&mut counts));
            }
        }
        Ok(StatusCount::tally(counts))
    }

    /// The status field of each key: one pipeline on a server; on a cluster one `HGET` per key
    /// (the keys of one SCAN reply lie in many slots).
    async fn statuses(&self, keys: &[String]) -> redis::RedisResult<Vec<Value>> {
        let mut conn = self.conn.clone();
        match &self.conn {
            Conn::Single(_) => {
                let mut pipe = redis::pipe();
                for key in keys {
                    pipe.cmd("HGET").arg(key).arg("s");
                }
                pipe.query_async(&mut conn).await
            }
            Conn::Cluster(_) => {
                let mut statuses = Vec::with_capacity(keys.len());
                for key in keys {
                    statuses.push(
                        redis::cmd("HGET")
                            .arg(key)
                            .arg("s")
                            .query_async(&mut conn)
                            .await?,
                    );
                }
                Ok(statuses)
            }
        }
    }
}
