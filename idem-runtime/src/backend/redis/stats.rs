//! [`Store::stats`](crate::Store::stats) on Redis: a SCAN of the store's record keys
//! (`<prefix>{*`), a batch of replies at a time, and the status and result-expiry fields of each
//! (`HMGET … s rx fp`), counted by the business type its key names and the route an HTTP layer
//! record's fingerprint keeps, with the tombstones among them
//! (a result expiry passed by Redis's clock, read once). On a cluster, every primary is scanned
//! in turn.

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
        let now = self.clock_ms().await.map_err(redis_error)?;
        let mut counts: Vec<StatusCount> = Vec::new();
        let mut scan = self.conn.scan(&pattern).await.map_err(redis_error)?;
        while let Some(keys) = scan.next(&self.conn).await.map_err(redis_error)? {
            if keys.is_empty() {
                continue;
            }
            let statuses = self.statuses(&keys).await.map_err(redis_error)?;
            for (key, fields) in keys.iter().zip(statuses) {
                let Value::Array(fields) = fields else {
                    continue;
                };
                let [status, rx, fp] = fields.as_slice() else {
                    continue;
                };
                let (Some(biz), Some(status)) = (biz_of(&self.prefix, key), text(status)) else {
                    continue;
                };
                let gone = text(rx)
                    .and_then(|rx| rx.parse::<i64>().ok())
                    .is_some_and(|rx| rx <= now);
                counts.push(StatusCount {
                    biz: biz.to_owned(),
                    origin: text(fp)
                        .as_deref()
                        .and_then(crate::fingerprint::origin)
                        .map(str::to_owned),
                    status: Status::parse(&status)?,
                    records: 1,
                    tombstones: u64::from(gone),
                });
            }
            // Memory stays bounded by the distinct (biz, status) pairs, not the keys.
            if counts.len() > 4096 {
                counts = StatusCount::tally(std::mem::take(&mut counts));
            }
        }
        Ok(StatusCount::tally(counts))
    }

    /// The scripts' clock: Redis's `TIME` in ms plus the test clock's offset.
    async fn clock_ms(&self) -> redis::RedisResult<i64> {
        let mut conn = self.conn.clone();
        let (secs, micros): (i64, i64) = redis::cmd("TIME").query_async(&mut conn).await?;
        Ok((secs * 1_000_000 + micros).div_euclid(1000) + self.offset.ms())
    }

    /// The status and result-expiry fields of each key (`[s, rx]`): one pipeline on a server; on
    /// a cluster one `HMGET` per key (the keys of one SCAN reply lie in many slots).
    async fn statuses(&self, keys: &[String]) -> redis::RedisResult<Vec<Value>> {
        let mut conn = self.conn.clone();
        match &self.conn {
            Conn::Single(_) => {
                let mut pipe = redis::pipe();
                for key in keys {
                    pipe.cmd("HMGET").arg(key).arg("s").arg("rx").arg("fp");
                }
                pipe.query_async(&mut conn).await
            }
            Conn::Cluster(_) => {
                let mut statuses = Vec::with_capacity(keys.len());
                for key in keys {
                    statuses.push(
                        redis::cmd("HMGET")
                            .arg(key)
                            .arg("s")
                            .arg("rx")
                            .arg("fp")
                            .query_async(&mut conn)
                            .await?,
                    );
                }
                Ok(statuses)
            }
        }
    }
}
