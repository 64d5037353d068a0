//! A claim's plain read on one Redis server: no script for a replay (see `store/order.rs`).

use redis::Value;

use super::{Records, int, redis_error, text};
use crate::IdemError;
use crate::store::decide::{Decision, RecordState, decide, duration_ms};
use crate::store::{ClaimOutcome, ClaimRequest, Status};

impl Records {
    /// The claim's plain read, no script: the record's fields (`HMGET`), and Redis's clock
    /// (`TIME`, in the same round trip) when a test clock has moved. A record that is a live
    /// success, a mismatch or in progress is decided here by the decision table (a SUCCEEDED
    /// record is immutable until it expires, and `TIME`, read after the fields, is no earlier than
    /// the moment they were read); `None` for any other (none, FAILED, expired, a lease that
    /// ended): the claim script decides and takes it atomically.
    ///
    /// Without a test clock's offset the read is the `HMGET` alone, and decides a SUCCEEDED record
    /// whose expiry is no earlier than its lease end: its key expires (`PEXPIREAT`) at its expiry,
    /// and Redis never returns a key past its expiry, so a key that is there is a record that is
    /// live. (The offset only grows, so at 0 it was 0 when the expiry was set.) Any other record
    /// needs the clock: the script decides it.
    pub(super) async fn decided_by_read(
        &self,
        req: &ClaimRequest<'_>,
    ) -> Result<Option<ClaimOutcome>, IdemError> {
        let mut conn = self.conn.clone();
        let offset = self.offset.ms();
        let key = self.key(req.biz, req.key);
        let fields = ["s", "fp", "lu", "ex", "r", "rx"];
        let (mut fields, now_ms): (Vec<Value>, Option<i64>) = if offset == 0 {
            let fields = redis::cmd("HMGET")
                .arg(&key)
                .arg(&fields)
                .query_async(&mut conn)
                .await
                .map_err(redis_error)?;
            (fields, None)
        } else {
            let (fields, (secs, micros)): (Vec<Value>, (i64, i64)) = redis::pipe()
                .cmd("HMGET")
                .arg(&key)
                .arg(&fields)
                .cmd("TIME")
                .query_async(&mut conn)
                .await
                .map_err(redis_error)?;
            // The scripts' clock: Redis time in µs plus the offset, floored to ms.
            (
                fields,
                Some((secs * 1_000_000 + micros).div_euclid(1000) + offset),
            )
        };
        let [s, fp, lu, ex, r, rx] = fields.as_mut_slice() else {
            return Err(IdemError::store("HMGET returned an unexpected reply"));
        };
        let Some(status) = text(s) else {
            return Ok(None);
        };
        let stored_fp = text(fp).filter(|fp| !fp.is_empty());
        let state = RecordState {
            status: Status::parse(&status)?,
            fingerprint: stored_fp.as_deref(),
            lease_until_ms: int(lu, "lease")?,
            expire_at_ms: int(ex, "expiry")?,
            result_until_ms: match rx {
                Value::Nil => None,
                rx => Some(int(rx, "result expiry")?),
            },
        };
        let now_ms = match now_ms {
            Some(now) => now,
            // Live, by its key: any moment before its expiry decides it alike.
            None if state.status == Status::Succeeded
                && state.expire_at_ms >= state.lease_until_ms
                && state.result_until_ms.is_none() =>
            {
                state.expire_at_ms - 1
            }
            None => return Ok(None),
        };
        // The scripts take an empty fingerprint for none.
        let asked = req.fingerprint.filter(|fp| !fp.is_empty());
        Ok(match decide(&state, asked, now_ms) {
            Decision::Replay => Some(ClaimOutcome::Replay {
                snapshot: match std::mem::replace(r, Value::Nil) {
                    Value::BulkString(b) => b,
                    _ => Vec::new(),
                },
            }),
            Decision::ResultGone => Some(ClaimOutcome::ResultGone),
            Decision::Mismatch => Some(ClaimOutcome::Mismatch),
            Decision::InProgress(ms) => Some(ClaimOutcome::InProgress {
                retry_after: duration_ms(ms),
            }),
            Decision::Take { .. } => None,
        })
    }
}
