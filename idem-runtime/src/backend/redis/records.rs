//! The records of the two Redis stores: the claim, the marks and the sweep as Lua scripts
//! (`scripts.rs`) sent as EVALSHA, a record read whole (`HMGET`), and how their replies are read
//! (the claim's plain read is in `read.rs`).

use std::collections::HashSet;
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

use redis::{Script, Value};

use super::conn::{Conn, Scan};
use super::eval::Eval;
use super::slots::{slot, slot_tag};
use super::stuck::{biz_of, stuck_key};
use super::{read, record_key, redis_error, scripts};
use crate::IdemError;
use crate::clock::ClockOffset;
use crate::store::decide::millis;
use crate::store::order::ClaimOrder;
use crate::store::{Acquired, Claim, ClaimOutcome, ClaimRequest, Fence, Limits, Record, Status};

static CLAIM: LazyLock<Script> = LazyLock::new(|| Script::new(scripts::CLAIM));
pub(super) static COMPLETE: LazyLock<Script> = LazyLock::new(|| Script::new(scripts::COMPLETE));
pub(super) static COMPLETE_PLAIN: LazyLock<Script> =
    LazyLock::new(|| Script::new(scripts::COMPLETE_PLAIN));
pub(super) static FAIL: LazyLock<Script> = LazyLock::new(|| Script::new(scripts::FAIL));
pub(super) static SAVE_STEPS: LazyLock<Script> = LazyLock::new(|| Script::new(scripts::SAVE_STEPS));
pub(super) static RENEW: LazyLock<Script> = LazyLock::new(|| Script::new(scripts::RENEW));
static SWEEP: LazyLock<Script> = LazyLock::new(|| Script::new(scripts::SWEEP));
static SHRINK: LazyLock<Script> = LazyLock::new(|| Script::new(scripts::SHRINK));

/// How many members of the results index one run of the shrink script walks besides the results
/// it drops (members whose record was claimed again, or expired): it blocks the server while it
/// runs.
const STALE_PER_RUN: u64 = 1000;

/// A walk of the keys under way: the SCAN, and the keys of its last reply not yet looked at.
pub(super) type Walk = (Scan, Vec<String>);

/// What the two Redis stores share.
#[derive(Clone)]
pub(super) struct Records {
    pub(super) conn: Conn,
    pub(super) limits: Limits,
    pub(super) offset: ClockOffset,
    pub(super) prefix: String,
    /// `WAIT` after every write: how many replicas must acknowledge it, and for how long to wait.
    pub(super) acks: Option<(u32, Duration)>,
    /// Which step a claim sends first (`store/order.rs`): the claim script, or (on one server) a
    /// plain `HMGET` with `TIME`.
    pub(super) order: Arc<ClaimOrder>,
    /// The indexes this process has listed in its prefix's registries (the stuck indexes in
    /// `<prefix>indexes`, by the claim script of its first claim under their business type; on a
    /// cluster the results indexes in `<prefix>results-indexes`), so each is added once per
    /// process.
    pub(super) registered: Arc<Mutex<HashSet<String>>>,
    /// A sweep's walk of the keys (under a test clock that moved) that stopped at its batch: the
    /// next sweep goes on from there instead of starting over.
    pub(super) walk: Arc<tokio::sync::Mutex<Option<Walk>>>,
}

pub(super) fn int(v: &Value, what: &str) -> Result<i64, IdemError> {
    match v {
        Value::Int(i) => Ok(*i),
        Value::BulkString(b) => std::str::from_utf8(b)
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| IdemError::store(format!("{what} is not a number in the store"))),
        Value::SimpleString(s) => s
            .parse()
            .map_err(|_| IdemError::store(format!("{what} is not a number in the store"))),
        _ => Err(IdemError::store(format!("{what} is missing in the store"))),
    }
}

/// The outcome a claim script's reply (the fence alone for a fresh claim, `{'A', attempt, fence,
/// how}`, `{'R', result}`, `{'G'}`, `{'M'}`, `{'P', ms}`) says; the reply is ours, so a stored
/// result moves out of it uncopied.
pub(super) fn claim_reply(reply: &mut Value) -> Result<ClaimOutcome, IdemError> {
    let fence = |v: &Value| {
        u64::try_from(int(v, "fence")?).map_err(|_| IdemError::store("fence out of range"))
    };
    let reply = match reply {
        Value::Int(_) => {
            return Ok(ClaimOutcome::Acquired {
                claim: Claim {
                    attempt: 1,
                    fence: Fence::new(fence(reply)?),
                },
                how: Acquired::Fresh,
            });
        }
        Value::Array(items) => items.as_mut_slice(),
        other => {
            return Err(IdemError::store(format!(
                "unexpected reply from the claim script: {other:?}"
            )));
        }
    };
    // The script's tag: one letter.
    let tag = match reply.first().map(bytes) {
        Some(&[letter]) => letter,
        _ => 0,
    };
    match (tag, &mut *reply) {
        (b'A', [_, attempt, f, how]) => {
            let attempt = u32::try_from(int(attempt, "attempt")?)
                .map_err(|_| IdemError::store("attempt out of range"))?;
            let how = match bytes(how) {
                b"retry" => Acquired::RetryAfterFailure,
                b"takeover" => Acquired::TakeOver,
                _ => Acquired::Fresh,
            };
            Ok(ClaimOutcome::Acquired {
                claim: Claim {
                    attempt,
                    fence: Fence::new(fence(f)?),
                },
                how,
            })
        }
        (b'R', [_, result]) => Ok(ClaimOutcome::Replay {
            snapshot: match std::mem::replace(result, Value::Nil) {
                Value::BulkString(b) => b,
                _ => Vec::new(),
            },
        }),
        (b'G', _) => Ok(ClaimOutcome::ResultGone),
        (b'M', _) => Ok(ClaimOutcome::Mismatch),
        (b'P', [_, left]) => Ok(ClaimOutcome::InProgress {
            retry_after: Duration::from_millis(u64::try_from(int(left, "lease")?).unwrap_or(0)),
        }),
        _ => Err(IdemError::store(format!(
            "unexpected reply from the claim script: {reply:?}"
        ))),
    }
}

pub(super) fn text(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    }
}

/// A reply's string, borrowed (empty for anything else): the tags a script answers with are
/// compared, not kept.
pub(super) fn bytes(v: &Value) -> &[u8] {
    match v {
        Value::BulkString(b) => b,
        Value::SimpleString(s) => s.as_bytes(),
        _ => b"",
    }
}

/// A record from its fields as `HMGET s a f fp lu ex r rx d` answers them (`d` may be left out: a
/// record that is not a success has none); `None` when it has no status (no such record).
pub(super) fn record_of(
    biz: &str,
    key: &str,
    fields: &[Value],
) -> Result<Option<Record>, IdemError> {
    let (head, d) = match fields {
        [head @ .., d] if fields.len() == 9 => (head, d),
        all => (all, &Value::Nil),
    };
    let [s, a, f, fp, lu, ex, r, rx] = head else {
        return Err(IdemError::store("HMGET returned an unexpected reply"));
    };
    let Some(status) = text(s) else {
        return Ok(None);
    };
    let status = Status::parse(&status)?;
    let blob = match (d, r) {
        (Value::BulkString(done), _) => Some(read::after_digest(done.clone())),
        (_, Value::BulkString(b)) => Some(b.clone()),
        _ => None,
    };
    let (snapshot, steps) = Record::split_blob(status, blob);
    Ok(Some(Record {
        biz: biz.to_owned(),
        key: key.to_owned(),
        status,
        attempt: u32::try_from(int(a, "attempt")?).unwrap_or(0),
        fence: Fence::new(u64::try_from(int(f, "fence")?).unwrap_or(0)),
        fingerprint: text(fp).filter(|fp| !fp.is_empty()),
        snapshot,
        steps,
        lease_until_ms: int(lu, "lease")?,
        expire_at_ms: int(ex, "expiry")?,
        result_until_ms: match rx {
            Value::Nil => None,
            rx => Some(int(rx, "result expiry")?),
        },
    }))
}

impl Records {
    pub(super) fn key(&self, biz: &str, key: &str) -> String {
        record_key(&self.prefix, biz, key)
    }

    /// `biz`'s stuck index, on one server; none on a cluster (it would lie in another slot than
    /// the records, and a script touches one slot).
    pub(super) fn index(&self, biz: &str) -> Option<String> {
        match self.conn {
            Conn::Single(_) => Some(stuck_key(&self.prefix, biz)),
            Conn::Cluster(_) => None,
        }
    }

    /// The results index that `record`'s success enters when it is marked with a result ttl: a
    /// sorted set of record keys scored by when their result is dropped. On one server one per
    /// prefix, `<prefix>results`; on a cluster one per hash slot, `<prefix>results{<tag>}` with a
    /// tag that lies in the record's slot (`slots.rs`), so the mark's script touches one slot.
    /// After the prefix a record key has `{`, a token key `tok:` and a stuck index `stuck:`, so
    /// it meets none of them.
    pub(super) fn results_for(&self, record: &str) -> String {
        match self.conn {
            Conn::Single(_) => format!("{}results", self.prefix),
            Conn::Cluster(_) => format!(
                "{}results{{{}}}",
                self.prefix,
                slot_tag(slot(record.as_bytes()))
            ),
        }
    }

    /// The registry of the prefix's stuck indexes: a set `<prefix>indexes` of their keys.
    pub(super) fn registry(&self) -> String {
        format!("{}indexes", self.prefix)
    }

    /// On a cluster, the registry of the prefix's results indexes (one per slot in use): a set
    /// `<prefix>results-indexes` of their keys.
    fn results_registry(&self) -> String {
        format!("{}results-indexes", self.prefix)
    }

    /// Whether this process has listed `member` in its registry already.
    pub(super) fn is_registered(&self, member: &str) -> bool {
        self.registered
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(member)
    }

    pub(super) fn mark_registered(&self, member: &str) {
        self.registered
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(member.to_owned());
    }

    /// On a cluster, lists the results index `results` in its registry, once per process, after
    /// a mark put a record in it (on one server there is one, found by name). A registry that
    /// cannot be written is logged, not the mark's error: the mark landed, and the next one
    /// tries again; until then that slot's due results are dropped when a claim meets them or
    /// with their records.
    pub(super) async fn listed(&self, results: &str) {
        if matches!(self.conn, Conn::Single(_)) || self.is_registered(results) {
            return;
        }
        let mut conn = self.conn.clone();
        let added: redis::RedisResult<i64> = redis::cmd("SADD")
            .arg(self.results_registry())
            .arg(results)
            .query_async(&mut conn)
            .await;
        match added {
            Ok(_) => self.mark_registered(results),
            Err(e) => {
                tracing::warn!(error = %e, "could not list a results index for the sweeper; the next mark tries again")
            }
        }
    }

    /// With [`RedisStore::with_replica_acks`]: waits until the configured number of replicas
    /// acknowledged every write this connection made so far (the one to `key` included), and
    /// fails as unavailable when fewer did in time.
    pub(super) async fn replicated(&self, key: &str) -> Result<(), IdemError> {
        let Some((replicas, timeout)) = self.acks else {
            return Ok(());
        };
        let acked = self
            .conn
            .wait_for_replicas(key, replicas, timeout)
            .await
            .map_err(redis_error)?;
        if acked >= i64::from(replicas) {
            return Ok(());
        }
        Err(IdemError::unavailable(format!(
            "the write reached {acked} of {replicas} replicas within {timeout:?}: a failover now \
             could lose it"
        )))
    }

    pub(super) async fn claim(&self, req: &ClaimRequest<'_>) -> Result<ClaimOutcome, IdemError> {
        // On a cluster only without a test clock's offset: the read with one has `TIME` beside it,
        // a command of no key, which a cluster would send to another node.
        if self.order.read_first()
            && (matches!(self.conn, Conn::Single(_)) || self.offset.ms() == 0)
            && let Some(outcome) = self.decided_by_read(req).await?
        {
            self.order.observe(&outcome);
            return Ok(outcome);
        }
        let outcome = self.claim_by_script(req).await;
        if let Ok(outcome) = &outcome {
            self.order.observe(outcome);
        }
        outcome
    }

    /// The claim script: the whole decision table, and the take, in one atomic step.
    async fn claim_by_script(&self, req: &ClaimRequest<'_>) -> Result<ClaimOutcome, IdemError> {
        let mut conn = self.conn.clone();
        let record = self.key(req.biz, req.key);
        let index = self.index(req.biz);
        // The first claim of this process under the business type also lists its stuck index in
        // the registry, in the same script (no command of its own, no failure of its own).
        let registry = index
            .as_deref()
            .filter(|index| !self.is_registered(index))
            .map(|_| self.registry());
        let fingerprint = req.fingerprint.unwrap_or("");
        let keys = [Some(&record), index.as_ref(), registry.as_ref()];
        let keys = keys.iter().filter_map(|k| *k);
        let mut eval = Eval::new(
            &CLAIM,
            keys.clone().count(),
            4,
            keys.clone().map(String::len).sum::<usize>() + fingerprint.len(),
        );
        for key in keys {
            eval.arg(key);
        }
        let mut reply: Value = eval
            .arg(fingerprint)
            .arg(millis(req.lease))
            .arg(millis(req.ttl))
            .arg(self.offset.ms())
            .invoke(&mut conn)
            .await
            .map_err(redis_error)?;
        if let (Some(index), Some(_)) = (&index, &registry) {
            self.mark_registered(index);
        }
        let outcome = claim_reply(&mut reply)?;
        if let ClaimOutcome::Acquired { claim, .. } = &outcome {
            // A claim the replicas did not get is refused: the body must not run on a claim a
            // failover can forget. It is released (FAILED under its own fence: the body did not
            // run), so a retry once the replicas answer is not told "in progress".
            if let Err(e) = self.replicated(&record).await {
                self.release_unreplicated(&record, index.as_deref(), claim)
                    .await;
                return Err(e);
            }
        }
        Ok(outcome)
    }

    /// Releases a claim the replicas did not acknowledge (FAILED under its own fence); a release
    /// that fails is logged, and the claim is taken over when its lease ends.
    pub(super) async fn release_unreplicated(
        &self,
        record: &str,
        index: Option<&str>,
        claim: &Claim,
    ) {
        let mut conn = self.conn.clone();
        let mut release = FAIL.key(record);
        if let Some(index) = index {
            release.key(index);
        }
        let released: Result<i64, _> = release
            .arg(claim.fence.get())
            .arg(self.offset.ms())
            .invoke_async(&mut conn)
            .await;
        if let Err(release) = released {
            tracing::warn!(error = %release, "could not release a claim the replicas did not acknowledge; it is taken over when its lease ends");
        }
    }

    /// Runs a script that changes the record only under `claim`'s fence.
    pub(super) async fn held(
        &self,
        script: &Script,
        biz: &str,
        key: &str,
        claim: &Claim,
        extra: &[&[u8]],
    ) -> Result<(), IdemError> {
        self.held_with(script, biz, key, claim, extra, None).await
    }

    /// [`Records::held`] with one more key after the record's stuck index (if any).
    pub(super) async fn held_with(
        &self,
        script: &Script,
        biz: &str,
        key: &str,
        claim: &Claim,
        extra: &[&[u8]],
        third: Option<&str>,
    ) -> Result<(), IdemError> {
        let mut conn = self.conn.clone();
        let record = self.key(biz, key);
        let index = self.index(biz);
        let keys = [Some(record.as_str()), index.as_deref(), third];
        let keys = keys.iter().filter_map(|k| *k);
        let mut eval = Eval::new(
            script,
            keys.clone().count(),
            2 + extra.len(),
            keys.clone().map(str::len).sum::<usize>()
                + extra.iter().map(|a| a.len()).sum::<usize>(),
        );
        for key in keys {
            eval.arg(key);
        }
        // The same decimal text as `to_string()`, written straight into the command.
        eval.arg(claim.fence.get());
        for arg in extra {
            eval.arg(*arg);
        }
        let changed: i64 = eval
            .arg(self.offset.ms())
            .invoke(&mut conn)
            .await
            .map_err(redis_error)?;
        if changed == 1 {
            self.replicated(&record).await
        } else {
            Err(IdemError::LeaseLost {
                attempt: claim.attempt,
            })
        }
    }

    pub(super) async fn load(&self, biz: &str, key: &str) -> Result<Option<Record>, IdemError> {
        let mut conn = self.conn.clone();
        let fields: Vec<Value> = redis::cmd("HMGET")
            .arg(self.key(biz, key))
            .arg(&["s", "a", "f", "fp", "lu", "ex", "r", "rx", "d"])
            .query_async(&mut conn)
            .await
            .map_err(redis_error)?;
        record_of(biz, key, &fields)
    }

    /// A sweep's work, in proportion to what it finds: at most `batch` results past their result
    /// ttl dropped, and (under a test clock that moved) at most `batch` records expired by the
    /// store's clock deleted.
    ///
    /// Redis deletes every record by itself when it expires (`PEXPIREAT` at the end of its TTL or
    /// lease, whichever is later, which is the store clock's expiry), so there is nothing to walk
    /// for: the results to drop come from the results indexes (one on a server, one per slot in
    /// use on a cluster, listed in a registry), and on one server the stuck indexes listed in the
    /// registry lose the members of records Redis expired (as the reconciler's walk drops them). A
    /// test clock that moved ahead of Redis's puts records past their expiry that Redis still
    /// keeps: then the sweep also walks the keys with SCAN, one reply at a time, going on from
    /// where the last sweep stopped.
    pub(super) async fn sweep(&self, batch: usize) -> Result<u64, IdemError> {
        let batch = u64::try_from(batch).unwrap_or(u64::MAX).min(1 << 31);
        let indexes = match self.conn {
            Conn::Single(_) => vec![format!("{}results", self.prefix)],
            Conn::Cluster(_) => {
                let mut conn = self.conn.clone();
                redis::cmd("SMEMBERS")
                    .arg(self.results_registry())
                    .query_async(&mut conn)
                    .await
                    .map_err(redis_error)?
            }
        };
        let mut dropped = 0u64;
        for index in &indexes {
            if dropped >= batch {
                break;
            }
            dropped += self.shrink(index, batch - dropped).await?;
        }
        let deleted = if self.offset.ms() != 0 {
            self.walk_keys(batch).await?
        } else {
            0
        };
        if dropped < batch && deleted < batch && matches!(self.conn, Conn::Single(_)) {
            // The pass is ending (a sweeper calls again while a batch is full).
            self.trim_registered().await?;
        }
        Ok(dropped + deleted)
    }

    /// Drops at most `want` results whose result ttl passed, from the results index `results`.
    async fn shrink(&self, results: &str, want: u64) -> Result<u64, IdemError> {
        let mut dropped = 0u64;
        while dropped < want {
            let mut conn = self.conn.clone();
            let left = want - dropped;
            let reply: Vec<i64> = SHRINK
                .key(results)
                .arg(left)
                .arg(left + STALE_PER_RUN)
                .arg(self.offset.ms())
                .invoke_async(&mut conn)
                .await
                .map_err(redis_error)?;
            let [d, more] = reply[..] else {
                return Err(IdemError::store("unexpected reply from the shrink script"));
            };
            dropped += u64::try_from(d).unwrap_or(0);
            if more == 0 {
                break;
            }
        }
        Ok(dropped)
    }

    /// Trims every stuck index in the prefix's registry.
    async fn trim_registered(&self) -> Result<(), IdemError> {
        let mut conn = self.conn.clone();
        let indexes: Vec<String> = redis::cmd("SMEMBERS")
            .arg(self.registry())
            .query_async(&mut conn)
            .await
            .map_err(redis_error)?;
        for index in &indexes {
            self.trim(index).await?;
        }
        Ok(())
    }

    /// Walks the record keys with SCAN, one reply at a time, running the sweep script on each,
    /// until `batch` of them changed (where the next call goes on, the reply's rest first) or
    /// every key was walked.
    async fn walk_keys(&self, batch: u64) -> Result<u64, IdemError> {
        let mut walk = self.walk.lock().await;
        let (mut scan, mut keys) = match walk.take() {
            Some(walk) => walk,
            // Record keys only: `<prefix>{…` (see `stats`).
            None => (
                self.conn
                    .scan(&format!("{}{{*", self.prefix))
                    .await
                    .map_err(redis_error)?,
                Vec::new(),
            ),
        };
        let mut changed = 0u64;
        loop {
            while let Some(key) = keys.pop() {
                let mut conn = self.conn.clone();
                let mut invocation = SWEEP.key(&key);
                if let Some(index) = biz_of(&self.prefix, &key).and_then(|biz| self.index(biz)) {
                    invocation.key(index);
                }
                let gone: i64 = invocation
                    .arg(self.offset.ms())
                    .invoke_async(&mut conn)
                    .await
                    .map_err(redis_error)?;
                changed += u64::try_from(gone).unwrap_or(0);
                if changed >= batch {
                    *walk = Some((scan, keys));
                    return Ok(changed);
                }
            }
            match scan.next(&self.conn).await.map_err(redis_error)? {
                Some(next) => keys = next,
                None => return Ok(changed),
            }
        }
    }
}
