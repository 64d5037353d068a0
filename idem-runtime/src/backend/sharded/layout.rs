//! The layout of a sharded store: which shards its keys are routed over, kept as records in the
//! shards themselves so that every process reads the same one.
//!
//! Each shard carries an identity (`idem.shard` / `id`, written once by the reshard tool), and
//! the layout is a numbered sequence of steps (`idem.layout` / the step number), each a finished
//! record holding [`Layout`] as JSON, written to every shard of the step and never changed. A
//! process reads the next step number on the shards it was given; the newest it finds is its
//! layout. No layout written: the process routes over its shards in the order it was given them.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::IdemError;
use crate::store::{Acquired, ClaimOutcome, ClaimRequest, Store};

/// The business type of the layout steps.
pub(crate) const LAYOUT_BIZ: &str = "idem.layout";
/// The business type of a shard's identity (its one key is [`ID_KEY`]).
pub(crate) const SHARD_BIZ: &str = "idem.shard";
const ID_KEY: &str = "id";

/// Whether `biz` is one of the sharded store's own records (never copied, never counted).
pub(crate) fn reserved(biz: &str) -> bool {
    biz == LAYOUT_BIZ || biz == SHARD_BIZ
}

/// Where a reshard from [`Layout::from`] to [`Layout::to`] stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Phase {
    /// Announced: keys still live on their `from` shard.
    Planned,
    /// A moving key is claimed on its `from` shard, then on its `to` shard; it is marked on the
    /// `from` shard first. Processes may still be in `Planned`.
    DualOld,
    /// As `DualOld`, but marked on the `to` shard first. The tool copies the records of the
    /// moving keys once every process is here.
    DualNew,
    /// Keys live on their `to` shard (and the `from` list is history). Processes may still be in
    /// `DualNew`.
    Done,
}

impl Phase {
    /// The phase's name as `idem reshard` prints it.
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Planned => "planned",
            Phase::DualOld => "dual-old",
            Phase::DualNew => "dual-new",
            Phase::Done => "done",
        }
    }
}

/// One step of a sharded store's layout.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Layout {
    /// The step's number: 1 for the first, one more for each.
    pub step: u64,
    /// Where the reshard stands.
    pub phase: Phase,
    /// The shards keys are routed over before the reshard, by identity, in routing order.
    pub from: Vec<String>,
    /// The shards keys are routed over after it.
    pub to: Vec<String>,
}

impl Layout {
    /// The text kept in the step's record.
    pub(crate) fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a layout serializes")
    }

    pub(crate) fn decode(bytes: &[u8]) -> Result<Layout, IdemError> {
        serde_json::from_slice(bytes).map_err(|e| {
            IdemError::store(format!(
                "a sharded store's layout record is not one idem wrote ({e})"
            ))
        })
    }
}

/// The record key of step `step`: zero-padded, so that the steps sort in order.
pub(crate) fn step_key(step: u64) -> String {
    format!("{step:020}")
}

/// A step's or identity's record lives as long as a record can.
const FOREVER: Duration = crate::MAX_DURATION;
/// How long a writer of such a record holds its claim before another may take it over.
const WRITE_LEASE: Duration = Duration::from_secs(10);

/// Step `step` as `shard` holds it, if it does.
pub(crate) async fn read_step<S: Store + ?Sized>(
    shard: &S,
    step: u64,
) -> Result<Option<Layout>, IdemError> {
    match shard.load(LAYOUT_BIZ, &step_key(step)).await? {
        Some(r) => match r.snapshot {
            Some(bytes) if r.status == crate::Status::Succeeded => Layout::decode(&bytes).map(Some),
            // Being written (a tool claimed it and has not marked it yet): not there yet.
            _ => Ok(None),
        },
        None => Ok(None),
    }
}

/// The newest step the `shards` hold after `known` (the steps read one after another, each from
/// every shard at once, until none holds the next). With `every`, a shard's error is the answer
/// (the reshard tool, which must not miss a step); otherwise one shard answering is enough (a
/// process, which goes on serving with a shard down).
pub(crate) async fn newest<S: Store + ?Sized>(
    shards: &[&S],
    known: Option<Layout>,
    every: bool,
) -> Result<Option<Layout>, IdemError> {
    let mut newest = known;
    loop {
        let next = newest.as_ref().map_or(1, |l| l.step + 1);
        let reads =
            futures_util::future::join_all(shards.iter().map(|s| read_step(*s, next))).await;
        let (mut answered, mut found, mut failed) = (false, None, None);
        for read in reads {
            match read {
                Ok(step) => {
                    answered = true;
                    found = found.or(step);
                }
                Err(e) => failed = Some(e),
            }
        }
        if let Some(e) = failed.take_if(|_| every || !answered) {
            return Err(e);
        }
        if !answered {
            return Err(IdemError::unavailable("no shard answered"));
        }
        match found {
            Some(step) => newest = Some(step),
            None => return Ok(newest),
        }
    }
}

/// The identity of `shard`, if it has one.
pub(crate) async fn read_id<S: Store + ?Sized>(shard: &S) -> Result<Option<String>, IdemError> {
    Ok(shard
        .load(SHARD_BIZ, ID_KEY)
        .await?
        .filter(|r| r.status == crate::Status::Succeeded)
        .and_then(|r| r.snapshot)
        .and_then(|s| String::from_utf8(s).ok()))
}

/// Writes `value` as the finished record `(biz, key)` of `shard`, unless it holds one already:
/// then that one's value is returned (the caller compares). A claim left by a writer that died is
/// taken over after its lease; one held by a live writer is waited for.
pub(crate) async fn write_once<S: Store + ?Sized>(
    shard: &S,
    biz: &str,
    key: &str,
    value: &[u8],
) -> Result<Vec<u8>, IdemError> {
    let req = ClaimRequest {
        biz,
        key,
        fingerprint: None,
        lease: WRITE_LEASE,
        ttl: FOREVER,
    };
    loop {
        match shard.claim(&req).await? {
            ClaimOutcome::Acquired { claim, how } => {
                debug_assert!(matches!(
                    how,
                    Acquired::Fresh | Acquired::TakeOver | Acquired::RetryAfterFailure
                ));
                shard.complete(biz, key, &claim, value, FOREVER).await?;
                return Ok(value.to_vec());
            }
            ClaimOutcome::Replay { snapshot } => return Ok(snapshot),
            ClaimOutcome::InProgress { retry_after } => {
                tokio::time::sleep(
                    retry_after.clamp(Duration::from_millis(10), Duration::from_millis(500)),
                )
                .await;
            }
            ClaimOutcome::ResultGone | ClaimOutcome::Mismatch => {
                return Err(IdemError::store(format!(
                    "the sharded store's record ({biz}, {key}) is not one idem wrote"
                )));
            }
        }
    }
}

/// Gives `shard` an identity unless it has one; returns it.
pub(crate) async fn ensure_id<S: Store + ?Sized>(shard: &S) -> Result<String, IdemError> {
    if let Some(id) = read_id(shard).await? {
        return Ok(id);
    }
    let id = new_id();
    let kept = write_once(shard, SHARD_BIZ, ID_KEY, id.as_bytes()).await?;
    String::from_utf8(kept).map_err(|_| IdemError::store("a shard's identity is not text"))
}

/// A new identity: 16 hex digits from the time, the process and a counter.
fn new_id() -> String {
    use sha2::{Digest, Sha256};
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let mut h = Sha256::new();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    h.update(now.as_nanos().to_le_bytes());
    h.update(std::process::id().to_le_bytes());
    h.update(N.fetch_add(1, Ordering::Relaxed).to_le_bytes());
    h.finalize()[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_layout_reads_back_as_written() {
        let l = Layout {
            step: 7,
            phase: Phase::DualNew,
            from: vec!["a".into(), "b".into()],
            to: vec!["a".into(), "b".into(), "c".into()],
        };
        assert_eq!(Layout::decode(&l.encode()).unwrap(), l);
        assert!(Layout::decode(b"{}").is_err());
        assert!(step_key(2) < step_key(10));
        assert!(Phase::Planned < Phase::DualOld && Phase::DualNew < Phase::Done);
    }
}
