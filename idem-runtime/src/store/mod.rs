//! The store trait every backend implements, what a claim asks and gets, and the records it keeps.
//! The decision table they share is in `decide.rs`.

use std::any::Any;
use std::time::Duration;

use async_trait::async_trait;

use crate::IdemError;
use crate::key::{DEFAULT_MAX_BIZ_LEN, DEFAULT_MAX_KEY_LEN};

pub(crate) mod decide;

/// The state of a dedup record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Status {
    /// A call holds the claim; its lease protects it until `lease_until`.
    Processing,
    /// The call finished; its result snapshot is stored and replayed to repeats.
    Succeeded,
    /// The call returned an error; the next call with this key runs again.
    Failed,
}

impl Status {
    /// The stored name: `PROCESSING`, `SUCCEEDED`, `FAILED`.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Processing => "PROCESSING",
            Status::Succeeded => "SUCCEEDED",
            Status::Failed => "FAILED",
        }
    }

    /// Parses a stored name.
    ///
    /// # Errors
    /// [`IdemError::Store`] for a name idem never writes.
    pub fn parse(s: &str) -> Result<Self, IdemError> {
        match s {
            "PROCESSING" => Ok(Status::Processing),
            "SUCCEEDED" => Ok(Status::Succeeded),
            "FAILED" => Ok(Status::Failed),
            other => Err(IdemError::store(format!(
                "unknown record status `{other}` in the store"
            ))),
        }
    }
}

/// Limits a store enforces before it writes anything.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Longest key in bytes (default 128).
    pub max_key_len: usize,
    /// Longest business type in bytes (default 32).
    pub max_biz_len: usize,
    /// Largest stored result snapshot in bytes (default 64 KiB).
    pub max_snapshot_len: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_key_len: DEFAULT_MAX_KEY_LEN,
            max_biz_len: DEFAULT_MAX_BIZ_LEN,
            max_snapshot_len: 64 * 1024,
        }
    }
}

/// What a call asks of the store when it claims `(biz, key)`.
#[derive(Debug, Clone, Copy)]
pub struct ClaimRequest<'a> {
    /// Business type: the first half of the record's identity.
    pub biz: &'a str,
    /// Idempotency key: the second half.
    pub key: &'a str,
    /// Fingerprint of the request payload, if the call has one.
    pub fingerprint: Option<&'a str>,
    /// How long a PROCESSING claim protects itself before another attempt may take over.
    pub lease: Duration,
    /// How long the record lives (from its creation) before it counts as absent and is swept.
    pub ttl: Duration,
}

/// How a claim that runs the body came about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Acquired {
    /// No record (or an expired one): a new record with a new attempt.
    Fresh,
    /// The record was FAILED: this is a retry.
    RetryAfterFailure,
    /// The record was PROCESSING with an expired lease: the earlier attempt is presumed dead.
    TakeOver,
}

/// What the store decided for a claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimOutcome {
    /// The caller holds the claim as `attempt` and must run the body, then complete or fail.
    Acquired {
        /// Fencing token: only this attempt may complete the record.
        attempt: u32,
        /// How the claim came about.
        how: Acquired,
    },
    /// The record SUCCEEDED with the same fingerprint: replay this snapshot.
    Replay {
        /// The stored result snapshot.
        snapshot: Vec<u8>,
    },
    /// The record was made from another payload.
    Mismatch,
    /// Another attempt holds a valid lease.
    InProgress {
        /// Remaining lease by the store's clock.
        retry_after: Duration,
    },
}

/// A stored record as read back, for inspection and tests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// Business type.
    pub biz: String,
    /// Idempotency key.
    pub key: String,
    /// Current status.
    pub status: Status,
    /// Attempt number (fencing token), starting at 1.
    pub attempt: u32,
    /// Request fingerprint, if the call had one.
    pub fingerprint: Option<String>,
    /// Result snapshot, once SUCCEEDED.
    pub snapshot: Option<Vec<u8>>,
    /// End of the current lease, ms since the Unix epoch (by the store's clock; the memory store
    /// counts from its creation).
    pub lease_until_ms: i64,
    /// When the record expires, same clock.
    pub expire_at_ms: i64,
}

/// A backend that keeps dedup records.
///
/// Every method is atomic on its own: `claim` decides the whole table of DESIGN §3 in one atomic
/// step (a unique insert, a compare-and-set update, a Lua script, a lock), and `complete`/`fail`
/// change the record only while it is still PROCESSING under the caller's `attempt`.
/// Every backend passes the same contract test suite.
#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// The backend's name: `memory`, `sqlite`, …
    fn backend(&self) -> &'static str;

    /// The limits this store enforces.
    fn limits(&self) -> &Limits;

    /// Claims `(req.biz, req.key)` as described by the decision table.
    ///
    /// # Errors
    /// [`IdemError::StoreUnavailable`] when the backend cannot be reached, [`IdemError::Store`]
    /// when it answers with an error. Nothing is claimed then.
    async fn claim(&self, req: &ClaimRequest<'_>) -> Result<ClaimOutcome, IdemError>;

    /// Marks the record SUCCEEDED with `snapshot`, only if it is still PROCESSING under `attempt`.
    ///
    /// # Errors
    /// [`IdemError::LeaseLost`] when another attempt took the record over (nothing is changed);
    /// backend errors as for [`Store::claim`].
    async fn complete(
        &self,
        biz: &str,
        key: &str,
        attempt: u32,
        snapshot: Vec<u8>,
    ) -> Result<(), IdemError>;

    /// Marks the record FAILED (a retry may run), only if it is still PROCESSING under `attempt`.
    ///
    /// # Errors
    /// [`IdemError::LeaseLost`] when another attempt took the record over (nothing is changed);
    /// backend errors as for [`Store::claim`].
    async fn fail(&self, biz: &str, key: &str, attempt: u32) -> Result<(), IdemError>;

    /// Reads the record for `(biz, key)`, expired or not.
    ///
    /// # Errors
    /// Backend errors as for [`Store::claim`].
    async fn load(&self, biz: &str, key: &str) -> Result<Option<Record>, IdemError>;

    /// Deletes at most `batch` expired records; returns how many were deleted.
    ///
    /// # Errors
    /// Backend errors as for [`Store::claim`].
    async fn sweep_expired(&self, batch: usize) -> Result<u64, IdemError>;

    /// The store as `Any`, so a transactional call can reach its backend's concrete type.
    fn as_any(&self) -> &dyn Any;
}
