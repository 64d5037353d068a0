//! A claim's plain read: no script for a replay (see `store/order.rs`). On one server, and on a
//! cluster while no test clock moved (the read is then one command on the record's key).

use redis::Value;

use super::{Records, int, redis_error, text};
use crate::IdemError;
use crate::fingerprint;
use crate::store::decide::{Decision, RecordState, decide, duration_ms};
use crate::store::{ClaimOutcome, ClaimRequest, Status};

impl Records {
    /// The claim's plain read, no script. A record that is a live success, a mismatch or in
    /// progress is decided here by the decision table (a SUCCEEDED record is immutable until it
    /// expires); `None` for any other (none, FAILED, expired, a lease that ended): the claim
    /// script decides and takes it atomically.
    ///
    /// Without a test clock's offset the read is one `HGET` of the record's `d`: a success kept
    /// as long as its record, whose expiry is no earlier than its lease end, holds its result
    /// there after its fingerprint's digest (`scripts.rs`). Its key expires (`PEXPIREAT`) at its
    /// expiry, and Redis never returns a key past its expiry, so a `d` that is there is a live
    /// success: a replay, or a mismatch when the digests differ. (The offset only grows, so at 0
    /// it was 0 when the expiry was set.) A record without `d` (any other, or a success marked
    /// before `d` existed) needs the clock: the script decides it.
    ///
    /// With an offset the read is the record's fields (`HMGET`) and Redis's clock (`TIME`), in
    /// one round trip; `TIME`, read after the fields, is no earlier than the moment they were
    /// read.
    pub(super) async fn decided_by_read(
        &self,
        req: &ClaimRequest<'_>,
    ) -> Result<Option<ClaimOutcome>, IdemError> {
        let mut conn = self.conn.clone();
        let offset = self.offset.ms();
        let key = self.key(req.biz, req.key);
        if offset == 0 {
            // Sized ahead: the command is written once, with no buffer grown on the way.
            let mut hget = redis::Cmd::with_capacity(3, key.len() + 32);
            let done: Option<Vec<u8>> = hget
                .arg("HGET")
                .arg(&key)
                .arg("d")
                .query_async(&mut conn)
                .await
                .map_err(redis_error)?;
            return Ok(done.and_then(|done| done_outcome(done, req.fingerprint)));
        }
        let fields = ["s", "fp", "lu", "ex", "r", "rx", "d"];
        let (mut fields, (secs, micros)): (Vec<Value>, (i64, i64)) = redis::pipe()
            .cmd("HMGET")
            .arg(&key)
            .arg(&fields)
            .cmd("TIME")
            .query_async(&mut conn)
            .await
            .map_err(redis_error)?;
        // The scripts' clock: Redis time in µs plus the offset, floored to ms.
        let now_ms = (secs * 1_000_000 + micros).div_euclid(1000) + offset;
        let [s, fp, lu, ex, r, rx, d] = fields.as_mut_slice() else {
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
        // The scripts take an empty fingerprint for none.
        let asked = req.fingerprint.filter(|fp| !fp.is_empty());
        Ok(match decide(&state, asked, now_ms) {
            Decision::Replay => Some(ClaimOutcome::Replay {
                snapshot: match (
                    std::mem::replace(d, Value::Nil),
                    std::mem::replace(r, Value::Nil),
                ) {
                    (Value::BulkString(done), _) => after_digest(done),
                    (_, Value::BulkString(result)) => result,
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

/// What a live success's `d` (`<digest>\n<result>`) decides for a claim asking with
/// `asked`: a replay of its result, or a mismatch when both have a digest and they differ, as the
/// decision table says of a SUCCEEDED record. `None` for a `d` without its newline (never
/// written so): the script decides.
fn done_outcome(mut done: Vec<u8>, asked: Option<&str>) -> Option<ClaimOutcome> {
    let split = done.iter().position(|&b| b == b'\n')?;
    let stored = &done[..split];
    let differs = match asked.map(fingerprint::digest) {
        Some(asked) => !asked.is_empty() && !stored.is_empty() && asked.as_bytes() != stored,
        None => false,
    };
    if differs {
        return Some(ClaimOutcome::Mismatch);
    }
    done.drain(..=split);
    Some(ClaimOutcome::Replay { snapshot: done })
}

/// The result a `d` holds: its bytes after the first newline (in place: no copy of the result
/// into a new buffer).
pub(super) fn after_digest(mut done: Vec<u8>) -> Vec<u8> {
    let start = done.iter().position(|&b| b == b'\n').map_or(0, |i| i + 1);
    done.drain(..start);
    done
}

#[cfg(test)]
mod tests {
    use super::*;

    fn replayed(outcome: Option<ClaimOutcome>) -> Option<Vec<u8>> {
        match outcome {
            Some(ClaimOutcome::Replay { snapshot }) => Some(snapshot),
            _ => None,
        }
    }

    #[test]
    fn a_done_field_replays_its_result_unless_the_digests_differ() {
        let done = |s: &str| s.as_bytes().to_vec();
        assert_eq!(
            replayed(done_outcome(done("abc\n{\"Ok\":1}"), Some("POST /x abc"))),
            Some(b"{\"Ok\":1}".to_vec())
        );
        assert_eq!(
            replayed(done_outcome(done("abc\n{\"Ok\":1}"), None)),
            Some(b"{\"Ok\":1}".to_vec())
        );
        // A success without a fingerprint replays for any payload, as the decision table has it,
        // and a result with newlines of its own is kept whole.
        assert_eq!(
            replayed(done_outcome(done("\n{\"Ok\":\"a\nb\"}"), Some("abc"))),
            Some(b"{\"Ok\":\"a\nb\"}".to_vec())
        );
        assert!(replayed(done_outcome(done("abc\n1"), Some(""))).is_some());
        assert!(matches!(
            done_outcome(done("abc\n1"), Some("abd")),
            Some(ClaimOutcome::Mismatch)
        ));
        assert!(done_outcome(done("no newline"), None).is_none());
    }
}
