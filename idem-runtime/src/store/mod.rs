//! Stores: the [`Store`] trait every backend implements (also at the crate root), what a claim
//! asks and gets ([`ClaimRequest`], [`ClaimOutcome`], [`Claim`], [`Acquired`], [`Fence`]), the
//! records a store keeps and an operator reads ([`Record`], [`Status`], [`StatusCount`],
//! [`KeyPage`]), batches of claims ([`BatchClaim`], [`BatchItem`], [`BatchMark`], [`MAX_BATCH`]),
//! a store's [`Limits`] and its transaction ([`StoreTx`]), what [`register_store`](crate::register_store)
//! takes ([`IntoSharedStore`]), and the time a store call may take ([`with_store_timeout`],
//! [`DEFAULT_STORE_TIMEOUT`]).

// The decision table the backends share is in `decide.rs`; a store's transaction (`StoreTx`, and
// `TransitionTx`, the one state transitions run in) in `tx.rs`. The store depends on the SQL
// layer's statement surface, never on the engine or on transitions, which build on it.

use std::time::Duration;

use async_trait::async_trait;

use crate::IdemError;

pub(crate) mod batch;
pub(crate) mod decide;
pub(crate) mod keys;
mod limits;
#[cfg(test)]
mod model_check;
#[cfg(any(
    feature = "sqlite",
    feature = "mysql",
    feature = "postgres",
    feature = "redis",
    feature = "dynamodb"
))]
pub(crate) mod order;
mod status;
pub(crate) mod tx;

pub use batch::{BatchClaim, BatchItem, BatchMark, MAX_BATCH};
pub use keys::KeyPage;
pub use limits::Limits;
pub use tx::StoreTx;

pub use crate::engine::{DEFAULT_STORE_TIMEOUT, with_store_timeout};
pub use crate::registry::IntoSharedStore;
/// The transaction of every SQL store (`idem::PgTx`, `idem::MySqlTx` and `idem::SqliteTx` are it on
/// their database).
#[cfg(any(feature = "sqlite", feature = "mysql", feature = "postgres"))]
pub use crate::sql::tx::SqlTx;
pub(crate) use limits::check_limits;
#[cfg(any(feature = "redis", feature = "dynamodb"))]
pub(crate) use limits::check_one_key_limits;
pub use status::{Status, StatusCount};
use tx::TransitionTx;

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
    /// A record whose lease is still running never counts as expired.
    pub ttl: Duration,
}

/// How a claim that runs the body came about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Acquired {
    /// No record (or an expired one): a new record with attempt 1.
    Fresh,
    /// The record was FAILED: this is a retry.
    RetryAfterFailure,
    /// The record was PROCESSING with an expired lease: the earlier attempt is presumed dead.
    TakeOver,
}

/// A fencing token: issued with every claim, compared on every write that finishes the claim.
///
/// For one `(biz, key)` a fence never repeats and only grows, also after the record expired, was
/// swept and was created again: it is the store's clock in microseconds, raised to one more than
/// the record's previous fence when that is larger. (The one caveat is a store clock that steps
/// back by more than a lease.) So a body may pass it to its own downstream writes, and a storage
/// service may refuse any write that carries a smaller fence than one it has seen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Fence(u64);

impl Fence {
    /// A fence with this value (stores use it to hand back what they stored).
    pub const fn new(value: u64) -> Self {
        Fence(value)
    }

    /// The value, to store next to downstream writes or send to another service.
    pub const fn get(self) -> u64 {
        self.0
    }
}

impl std::fmt::Display for Fence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(&self.0, f)
    }
}

/// The claim a caller holds while its body runs: what it must show to finish it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Claim {
    /// Attempt number, for people: 1 for a new record, one more for each retry or takeover.
    pub attempt: u32,
    /// The fencing token: only the holder of this fence may complete, fail or renew the record.
    pub fence: Fence,
}

/// What the store decided for a claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimOutcome {
    /// The caller holds `claim` and must run the body, then complete or fail.
    Acquired {
        /// The claim to show when finishing.
        claim: Claim,
        /// How the claim came about.
        how: Acquired,
    },
    /// The record SUCCEEDED with the same fingerprint: replay this snapshot.
    Replay {
        /// The stored result snapshot.
        snapshot: Vec<u8>,
    },
    /// The record SUCCEEDED with the same fingerprint, but its result is no longer kept: its
    /// result ttl passed (see [`Call::result_ttl`](crate::Call::result_ttl)) and it is a
    /// tombstone until its ttl ends. Nothing runs; the caller is told so.
    ResultGone,
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
    /// Attempt number (for people), starting at 1.
    pub attempt: u32,
    /// The fence of the current (or last) claim.
    pub fence: Fence,
    /// Request fingerprint, if the call had one.
    pub fingerprint: Option<String>,
    /// Result snapshot, once SUCCEEDED.
    pub snapshot: Option<Vec<u8>>,
    /// The saved recovery points of an unfinished record (PROCESSING or FAILED): what
    /// [`crate::step`] saved under it, opaque bytes the engine reads back after a takeover or a
    /// retry. `None` when no step was saved (and always once SUCCEEDED).
    pub steps: Option<Vec<u8>>,
    /// End of the current lease, ms since the Unix epoch by the store's clock.
    pub lease_until_ms: i64,
    /// When the record expires, same clock (never before its lease ends).
    pub expire_at_ms: i64,
    /// For a SUCCEEDED record marked with a result ttl shorter than its ttl: until when its
    /// result is replayed, same clock. From then on the record is a tombstone (`snapshot` is
    /// `None` once a sweep dropped it, and this is 0) that refuses repeats with
    /// [`IdemError::ResultExpired`] until `expire_at_ms`. `None`: the result is kept as long as
    /// the record.
    pub result_until_ms: Option<i64>,
}

impl Record {
    /// The method and route an HTTP layer record came from (`POST /orders/{id}`: axum's matched
    /// route, or the request's path when the layer runs outside a router), as kept with its
    /// fingerprint; `None` for every other record, and for layer records written before it was
    /// kept. What `idem stuck` and `idem inspect` show as its request.
    pub fn origin(&self) -> Option<&str> {
        self.fingerprint
            .as_deref()
            .and_then(crate::fingerprint::origin)
    }

    /// Where a stored blob goes: the result snapshot of a SUCCEEDED record, the saved steps of an
    /// unfinished one. The SQL and Redis stores keep both in one column (`result`, field `r`): a
    /// record has steps only until it has a result, and its result replaces them.
    pub(crate) fn split_blob(
        status: Status,
        blob: Option<Vec<u8>>,
    ) -> (Option<Vec<u8>>, Option<Vec<u8>>) {
        match status {
            Status::Succeeded => (blob, None),
            Status::Processing | Status::Failed => (None, blob),
        }
    }
}

/// Whether a take keeps the record's saved steps: a takeover or a retry of the same payload
/// resumes from them; a record that starts a new life (`reset`), or a retry with another payload
/// (both fingerprinted and different), starts with none.
pub(crate) fn keeps_steps(reset: bool, stored_fp: Option<&str>, asked_fp: Option<&str>) -> bool {
    !reset
        && match (stored_fp, asked_fp) {
            (Some(stored), Some(asked)) => crate::fingerprint::same(stored, asked),
            _ => true,
        }
}

/// A backend that keeps dedup records.
///
/// Every method is atomic on its own: `claim` decides the whole decision table in one atomic
/// step (a unique insert, a compare-and-set update, a Lua script, a lock), and
/// `complete`/`fail`/`renew` change the record only while it is still PROCESSING under the
/// caller's fence. Times come from the store's own clock. Every backend passes the same contract
/// test suite (`tests/tests/contract`).
#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// The backend's name: `memory`, `sqlite`, …
    fn backend(&self) -> &'static str;

    /// The limits this store enforces.
    fn limits(&self) -> &Limits;

    /// Claims `(req.biz, req.key)` as described by the decision table.
    ///
    /// # Errors
    /// [`IdemError::StoreUnavailable`] when the backend cannot be reached,
    /// [`IdemError::StoreBusy`] when it is contended, [`IdemError::StoreSchema`] when its table is
    /// missing, [`IdemError::Store`] for any other backend error. Nothing is claimed then.
    async fn claim(&self, req: &ClaimRequest<'_>) -> Result<ClaimOutcome, IdemError>;

    // The three `__…_now` methods are the engine's fast path to a store that holds its records in
    // this process (the memory store): internal, not part of the API a store implements.

    /// [`Store::claim`] answered at once, by a store that holds its records in this process (no
    /// I/O, no lock held across an await): `Some` spares the call the boxed future of `claim` and
    /// the timer that bounds it. A store that answers here answers exactly as its `claim` would.
    /// The default, `None`, sends the call through `claim`.
    #[doc(hidden)]
    fn __claim_now(&self, req: &ClaimRequest<'_>) -> Option<Result<ClaimOutcome, IdemError>> {
        let _ = req;
        None
    }

    /// [`Store::__claim_now`], a replay's stored result lent to `replay` (called once; the
    /// outcome's snapshot is then empty) instead of copied; no other outcome calls it. The default
    /// lends nothing; the memory store up to [`crate::MemoryStore::LENT_REPLAY_MAX`] bytes.
    #[doc(hidden)]
    fn __claim_now_lending(
        &self,
        req: &ClaimRequest<'_>,
        replay: &mut dyn FnMut(&[u8]),
    ) -> Option<Result<ClaimOutcome, IdemError>> {
        let _ = replay;
        self.__claim_now(req)
    }

    /// Claims every item of `batch` as [`Store::claim`] claims one, each decided by the same
    /// table, in order: one round trip on the stores of this crate where the database allows it
    /// (one script on Redis, one per hash slot on a cluster, one statement on Postgres and MySQL
    /// while every key is new, one more for the keys that exist; one transaction on SQLite; one
    /// lock on the memory store). The outcomes come in the items' order. Each claim acquired is
    /// then finished on its own (`complete`, `fail`, `release`), so a failed item frees only its
    /// own key.
    ///
    /// The default claims the items one by one.
    ///
    /// # Errors
    /// [`IdemError::InvalidOptions`] for a batch [`BatchClaim::check`] refuses (nothing is
    /// claimed); backend errors as for [`Store::claim`]. After a backend error some items may have
    /// been claimed without being handed out: each stays PROCESSING until its lease ends and is
    /// then taken over, as a claim whose holder died.
    async fn claim_batch(&self, batch: &BatchClaim<'_>) -> Result<Vec<ClaimOutcome>, IdemError> {
        batch.check()?;
        let mut outcomes = Vec::with_capacity(batch.items.len());
        for req in batch.requests() {
            outcomes.push(self.claim(&req).await?);
        }
        Ok(outcomes)
    }

    /// Marks the record SUCCEEDED with `snapshot`, only if it is still PROCESSING under `claim`'s
    /// fence, and moves its expiry to at least now + `ttl` by the store's clock. Marking again a
    /// record already SUCCEEDED under the same fence succeeds and changes nothing (a mark sent
    /// again after its reply was lost), so a transient error can be retried safely.
    ///
    /// `ttl` is the call's ttl: the record's expiry is moved to at least now + ttl, so a body
    /// slower than its ttl still leaves a live success.
    ///
    /// # Errors
    /// [`IdemError::LeaseLost`] when another attempt took the record over or it was swept
    /// (nothing is changed); backend errors as for [`Store::claim`].
    async fn complete(
        &self,
        biz: &str,
        key: &str,
        claim: &Claim,
        snapshot: &[u8],
        ttl: Duration,
    ) -> Result<(), IdemError>;

    /// As [`Store::complete`], but the result is kept only `result_ttl` from now (by the store's
    /// clock), shorter than the record's `ttl`: from then on the record is a tombstone (its
    /// biz, key, fingerprint, attempt and expiry) whose repeats are refused with
    /// [`ClaimOutcome::ResultGone`] until the record expires, and a sweep drops the result
    /// ([`Store::sweep_expired`]). What [`Call::result_ttl`](crate::Call::result_ttl) asks for.
    ///
    /// # Errors
    /// As [`Store::complete`]; [`IdemError::NotSupported`] for a store that keeps every result
    /// as long as its record (the default). Every store of this crate supports it.
    async fn complete_keeping(
        &self,
        biz: &str,
        key: &str,
        claim: &Claim,
        snapshot: &[u8],
        ttl: Duration,
        result_ttl: Duration,
    ) -> Result<(), IdemError> {
        let _ = (biz, key, claim, snapshot, ttl, result_ttl);
        Err(IdemError::NotSupported {
            backend: self.backend(),
            what: "keeping a result for less than its record (result_ttl)",
        })
    }

    /// [`Store::complete`] (with a `result_ttl`, [`Store::complete_keeping`]) done at once, by a
    /// store that holds its records in this process, as [`Store::__claim_now`]: a store that
    /// answers here answers exactly as those would. The store may take the snapshot's bytes
    /// (leaving `snapshot` empty) when the mark lands, instead of copying them; it leaves them
    /// otherwise. The default, `None`, sends the mark through `complete`.
    #[doc(hidden)]
    fn __complete_now(
        &self,
        biz: &str,
        key: &str,
        claim: &Claim,
        snapshot: &mut Vec<u8>,
        ttl: Duration,
        result_ttl: Option<Duration>,
    ) -> Option<Result<(), IdemError>> {
        let _ = (biz, key, claim, snapshot, ttl, result_ttl);
        None
    }

    /// Marks every item of `marks` (records of `biz`, each key once, at most [`MAX_BATCH`])
    /// SUCCEEDED as [`Store::complete`] (or, with a result ttl, [`Store::complete_keeping`]) marks
    /// one, each under its own claim's fence: one round trip on the stores of this crate (one
    /// statement on SQLite and Postgres, one script on Redis and one per hash slot on a cluster,
    /// one lock on the memory store; MySQL sends its statements in one round trip). Returns each
    /// mark's own answer, in order: a record another attempt took over is
    /// [`IdemError::LeaseLost`] and the others are marked all the same.
    ///
    /// The default marks them one by one.
    ///
    /// # Errors
    /// [`IdemError::InvalidOptions`] for more than [`MAX_BATCH`] marks or a key twice (nothing is
    /// marked); backend errors as for [`Store::claim`]: then any of the marks may have landed, and
    /// sending them again is safe (a mark sent again succeeds).
    async fn complete_batch(
        &self,
        biz: &str,
        marks: &[BatchMark<'_>],
        ttl: Duration,
    ) -> Result<Vec<Result<(), IdemError>>, IdemError> {
        batch::check_marks(marks)?;
        let mut answers = Vec::with_capacity(marks.len());
        for m in marks {
            let answer = match m.result_ttl {
                None => self.complete(biz, m.key, &m.claim, m.snapshot, ttl).await,
                Some(kept) => {
                    self.complete_keeping(biz, m.key, &m.claim, m.snapshot, ttl, kept)
                        .await
                }
            };
            match answer {
                Err(e @ IdemError::LeaseLost { .. }) => answers.push(Err(e)),
                Err(e) => return Err(e),
                Ok(()) => answers.push(Ok(())),
            }
        }
        Ok(answers)
    }

    /// Marks the record FAILED (a retry may run), only if it is still PROCESSING under `claim`'s
    /// fence (or already FAILED under it).
    ///
    /// # Errors
    /// [`IdemError::LeaseLost`] when another attempt took the record over (nothing is changed);
    /// backend errors as for [`Store::claim`].
    async fn fail(&self, biz: &str, key: &str, claim: &Claim) -> Result<(), IdemError>;

    /// Extends the lease of a claim still held (PROCESSING under `claim`'s fence) to `lease` from
    /// now, and the record's life with it, so a slow but healthy body is not taken over.
    ///
    /// # Errors
    /// [`IdemError::LeaseLost`] when the claim is no longer held; backend errors as for
    /// [`Store::claim`].
    async fn renew(
        &self,
        biz: &str,
        key: &str,
        claim: &Claim,
        lease: Duration,
    ) -> Result<(), IdemError>;

    /// Gives up a claim still held without finishing it: the record stays PROCESSING under the
    /// claim's fence with its lease ended now, so the next call takes it over at once (and asks
    /// its recover fn again). The default renews the lease for zero time.
    ///
    /// # Errors
    /// As [`Store::renew`].
    async fn release(&self, biz: &str, key: &str, claim: &Claim) -> Result<(), IdemError> {
        self.renew(biz, key, claim, Duration::ZERO).await
    }

    /// Saves `steps`, the log of the body's recovery points ([`crate::step`]), under the record,
    /// replacing the log saved before, only while it is PROCESSING under `claim`'s fence. Saving
    /// the same log again succeeds (a save sent again after its reply was lost). A takeover or a
    /// retry of the same payload keeps the log ([`Store::load`] reads it as [`Record::steps`]);
    /// a mark of success replaces it with the result; a new life of the record starts without.
    ///
    /// # Errors
    /// [`IdemError::LeaseLost`] when the claim is no longer held (nothing is changed);
    /// [`IdemError::NotSupported`] for a store that cannot save steps (the default); backend
    /// errors as for [`Store::claim`].
    async fn save_steps(
        &self,
        biz: &str,
        key: &str,
        claim: &Claim,
        steps: &[u8],
    ) -> Result<(), IdemError> {
        let _ = (biz, key, claim, steps);
        Err(IdemError::NotSupported {
            backend: self.backend(),
            what: "saving recovery points (idem::step)",
        })
    }

    /// Reads the record for `(biz, key)`, expired or not.
    ///
    /// # Errors
    /// Backend errors as for [`Store::claim`].
    async fn load(&self, biz: &str, key: &str) -> Result<Option<Record>, IdemError>;

    /// Deletes at most `batch` expired records (TTL passed and no live lease), and drops the
    /// results of at most `batch` records whose result ttl passed (they shrink to tombstones);
    /// returns how many records were deleted or shrunk.
    ///
    /// # Errors
    /// Backend errors as for [`Store::claim`].
    async fn sweep_expired(&self, batch: usize) -> Result<u64, IdemError>;

    /// Lists at most `batch` records of `biz` that are PROCESSING with a lease that has ended
    /// (their holder died, paused, or never marked), oldest lease first, by the store's clock:
    /// what [`crate::Reconciler`] resolves. An index serves it on every store that has one
    /// (`(biz_type, status, lease_until)` on SQL, a sorted set per business type on Redis), so a
    /// pass reads only the records it returns.
    ///
    /// # Errors
    /// [`IdemError::NotSupported`] for a store that cannot list them (the default); backend errors
    /// as for [`Store::claim`].
    async fn stuck(&self, biz: &str, batch: usize) -> Result<Vec<Record>, IdemError> {
        let _ = (biz, batch);
        Err(IdemError::NotSupported {
            backend: self.backend(),
            what: "listing stuck records (the reconciler)",
        })
    }

    /// The business types that have PROCESSING records (stuck or not), sorted: where
    /// [`crate::admin::stuck_all`] looks for stuck records. Read from the index the reconciler
    /// reads (the SQL stores' index of PROCESSING records, one Redis server's registry of stuck
    /// indexes, the memory store's PROCESSING lists), so it costs what is in flight, not the
    /// store's size. A store may list one whose PROCESSING records have all finished since; on
    /// one Redis server a business type is listed once a process of this version has claimed
    /// under it. The default reads them from [`Store::stats`].
    ///
    /// # Errors
    /// As [`Store::stats`].
    async fn processing_biz_types(&self) -> Result<Vec<String>, IdemError> {
        let mut bizes: Vec<String> = self
            .stats()
            .await?
            .into_iter()
            .filter(|c| c.status == Status::Processing)
            .map(|c| c.biz)
            .collect();
        bizes.dedup();
        Ok(bizes)
    }

    /// Walks the keys of every record the store holds, at most `batch` (1 ..= [`MAX_BATCH`]) per
    /// page, starting after `after` (the [`KeyPage::next`] of an earlier page; `None` to start):
    /// what a resharding tool reads to find the records whose home moves. A record present for
    /// the whole walk is listed at least once; one written or deleted during it may or may not be.
    /// Expired records not yet swept may be listed. A page may hold fewer than `batch` keys (even
    /// none) before the walk is done: only a `next` of `None` ends it.
    ///
    /// The cursor is opaque text, valid across processes for the same store (so a tool can stop
    /// and resume): the SQL stores and the memory store walk in `(biz, key)` order (the database's
    /// order on SQL) and their cursor names the last pair listed; a Redis store walks with SCAN and
    /// its cursor names the node and SCAN's place there. It reads the whole store, a page at a
    /// time: for operators and tools, not for a request path.
    ///
    /// # Errors
    /// [`IdemError::InvalidOptions`] for a `batch` of 0 or more than [`MAX_BATCH`], or an `after`
    /// that is not a cursor this store gave; [`IdemError::NotSupported`] for a store that cannot
    /// walk its records (the default); [`IdemError::Store`] from a Redis store whose node
    /// restarted, or whose cluster failed a primary over, since the walk began there (the cursor
    /// can no longer keep its promise: start the walk again); backend errors as for
    /// [`Store::claim`].
    async fn list_keys(&self, after: Option<&str>, batch: usize) -> Result<KeyPage, IdemError> {
        let _ = (after, batch);
        Err(IdemError::NotSupported {
            backend: self.backend(),
            what: "walking the keys of every record (list_keys)",
        })
    }

    /// Counts the records per business type and status, sorted by business type then status (see
    /// [`StatusCount::tally`]): what an operator reads first (`idem stats`, [`crate::admin`]).
    /// Records whose TTL passed but that no sweep deleted yet are counted under their status (a
    /// claim treats them as absent); Redis deletes its expired records by itself, so there they
    /// mostly are not. It reads the whole table (a `GROUP BY`) or SCANs the whole prefix: for
    /// operators, not for a request path.
    ///
    /// # Errors
    /// [`IdemError::NotSupported`] for a store that cannot count them (the default); backend errors
    /// as for [`Store::claim`].
    async fn stats(&self) -> Result<Vec<StatusCount>, IdemError> {
        Err(IdemError::NotSupported {
            backend: self.backend(),
            what: "counting records per status (stats)",
        })
    }

    /// Begins a transaction on the store's database, for `#[state_transition(store = "…")]`.
    ///
    /// # Errors
    /// [`IdemError::NotSupported`] for a store without a SQL database (the default); backend
    /// errors as for [`Store::claim`].
    async fn begin_transition(&self) -> Result<Box<dyn TransitionTx>, IdemError> {
        Err(IdemError::NotSupported {
            backend: self.backend(),
            what: "state transitions",
        })
    }
}
