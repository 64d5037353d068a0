//! Transactions on Postgres: [`PgTx`], on which `tx = "…"` calls claim in a savepoint and state
//! transitions run.

use std::ops::{Deref, DerefMut};
use std::time::Duration;

use async_trait::async_trait;
use sqlx::postgres::PgConnection;
use sqlx::{AssertSqlSafe, Postgres, Row, Transaction};

use super::records::Claiming;
use super::{PgStore, db_error, lock_timeout_text};
use crate::engine::tx::IdemTx;
use crate::sql::claim::{claim_insert_first, replay_by_read};
use crate::sql::conn::{StateRow, TransitionConn};
use crate::sql::dialect::{Dialect, Savepoint};
use crate::sql::value::SqlValue;
use crate::store::tx::StoreTx;
use crate::store::{Claim, ClaimOutcome, ClaimRequest, Store};
use crate::{Busy, IdemError, TxIdleTimeout};

/// The isolation level of a transaction begun with [`PgStore::begin_with`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PgIsolation {
    /// `READ COMMITTED` (Postgres's default): each statement sees what was committed before it.
    ReadCommitted,
    /// `REPEATABLE READ`: one snapshot for the whole transaction; a claim meeting a record written
    /// after it is a serialization failure (run the transaction again).
    RepeatableRead,
    /// `SERIALIZABLE`: as REPEATABLE READ, and the commit may fail with a serialization failure.
    Serializable,
}

impl PgIsolation {
    pub(super) fn begin_statement(self) -> &'static str {
        match self {
            PgIsolation::ReadCommitted => "BEGIN ISOLATION LEVEL READ COMMITTED",
            PgIsolation::RepeatableRead => "BEGIN ISOLATION LEVEL REPEATABLE READ",
            PgIsolation::Serializable => "BEGIN ISOLATION LEVEL SERIALIZABLE",
        }
    }
}

/// A transaction on a [`PgStore`]'s database, begun with [`PgStore::begin`] or
/// [`PgStore::begin_with`].
///
/// It carries its store, so a `#[idempotent(tx = "tx")]` call claims in that store's table, on
/// that database, by construction. It derefs to the connection: run your own queries on it with
/// `query.execute(&mut **tx)`, exactly as on a `sqlx::Transaction`. Commit it (or let it drop to
/// roll back).
///
/// A claim in it is a savepoint, then one statement. While the store's claims mostly create
/// records, [`PgStore::begin`] opens the savepoint of the transaction's first claim in the round
/// trip of its `BEGIN`, and it serves that claim when nothing ran on the connection between them
/// (anything run through it, a read included, makes the claim open a savepoint of its own, so the
/// claim's undo never takes back the caller's own writes). The claim takes the key's
/// transaction-level advisory lock (`pg_try_advisory_xact_lock` on a hash of the table, business
/// type and key, held to the transaction's end). A new key is one statement: the insert (skipping
/// on a conflict) of a row kept only if that lock was free. When it inserts nothing, a second
/// statement takes the lock again, reads the record with a locking read (`FOR UPDATE`: the current
/// row, not the transaction's snapshot) and, when there is none, inserts it the same way. A
/// concurrent duplicate finds the lock taken and waits for the claimant's transaction at most the
/// store's lock timeout (`SET LOCAL lock_timeout` around that claim, the caller's own setting
/// restored after it), then answers `InProgress`; once the claimant committed it replays. A claim
/// that gets the lock at once cannot wait on another claimant, so it leaves the caller's lock
/// timeout alone. A deadlock or a serialization
/// failure is [`IdemError::StoreBusy`] with [`IdemError::restarts_transaction`]: run the whole
/// transaction again ([`crate::retry_transaction`]).
///
/// A claim also puts in force, for the rest of the transaction, its call's idle bound
/// ([`crate::TxIdleTimeout`], the lease by default):
/// `set_config('idle_in_transaction_session_timeout', …, true)` inside the claim's own statement
/// (no statement of its own), undone with the claim's savepoint when the claim takes nothing. A transaction that then sits idle longer is ended by
/// the server (25P03) and rolls back, so a client that vanished mid-transaction frees its key.
///
/// Once the store's claims mostly meet a record, a claim first reads it with a plain `SELECT`,
/// before any savepoint: a live success replays (or is a mismatch) without one. An error of that
/// read (the connection lost, the table missing, your `statement_timeout`) is not inside a
/// savepoint, so Postgres has aborted the transaction: run it again. Every other error of a claim
/// is undone to its savepoint and leaves the transaction as it was.
pub struct PgTx {
    tx: Transaction<'static, Postgres>,
    store: PgStore,
    /// A savepoint opened with the transaction's `BEGIN` after which nothing ran: the next claim
    /// takes it instead of opening one (a round trip). Gone once the connection is used.
    ready: Option<Savepoint>,
    /// The savepoint of the claim in progress (between `claim` and `complete`/`abort`).
    claim: Option<Savepoint>,
    /// The savepoint of the last claim marked done, released with the next claim's (or by the
    /// commit).
    done: Option<Savepoint>,
    /// The idle bound the next claim's call asked for (`None`: the store's).
    idle: Option<TxIdleTimeout>,
}

impl PgTx {
    pub(super) fn new(
        tx: Transaction<'static, Postgres>,
        store: PgStore,
        ready: Option<Savepoint>,
    ) -> Self {
        PgTx {
            tx,
            store,
            ready,
            claim: None,
            done: None,
            idle: None,
        }
    }

    /// The store this transaction belongs to.
    pub fn store(&self) -> &PgStore {
        &self.store
    }

    /// The sqlx transaction underneath (`idem::sqlx`, sqlx 0.9).
    pub fn transaction(&mut self) -> &mut Transaction<'static, Postgres> {
        self.ready = None;
        &mut self.tx
    }

    /// Commits, within the store timeout in force ([`crate::store::with_store_timeout`], default
    /// [`crate::store::DEFAULT_STORE_TIMEOUT`]).
    ///
    /// # Errors
    /// The database's error, classified; [`IdemError::StoreUnavailable`] when the server did not
    /// answer in time, and then the transaction may or may not have committed (a repeat of the
    /// call replays if it did).
    pub async fn commit(self) -> Result<(), IdemError> {
        crate::engine::tx_step(crate::engine::TxStep::Commit, self.tx.commit(), db_error).await
    }

    /// Rolls back, within the store timeout in force.
    ///
    /// # Errors
    /// The database's error, classified; [`IdemError::StoreUnavailable`] when the server did not
    /// answer in time (the server rolls back a transaction whose connection ends).
    pub async fn rollback(self) -> Result<(), IdemError> {
        crate::engine::tx_step(
            crate::engine::TxStep::Rollback,
            self.tx.rollback(),
            db_error,
        )
        .await
    }

    /// Runs statements without parameters (savepoints), in one round trip.
    async fn exec(&mut self, sql: String) -> Result<(), IdemError> {
        TransitionConn::execute_unprepared(&mut *self.tx, &sql).await
    }

    /// Rolls back to the claim's savepoint and releases it (the claim, every write since, its row
    /// locks and its lock timeout go).
    async fn undo(&mut self, savepoint: &Savepoint) -> Result<(), IdemError> {
        self.exec(format!("{}; {}", savepoint.rollback(), savepoint.release()))
            .await
    }

    /// The claim itself, inside its savepoint: first under the key's advisory lock when no
    /// other transaction holds it (no wait is possible, so the caller's lock timeout stays as it
    /// is); else waiting for that transaction at most the store's lock timeout.
    async fn claim_in(
        &mut self,
        savepoint: &Savepoint,
        req: &ClaimRequest<'_>,
        opened: bool,
    ) -> Result<ClaimOutcome, IdemError> {
        if !opened {
            let open = savepoint.open_after(self.done.take());
            self.exec(open).await?;
        }
        // The idle bound goes in the claim's statements (`idle_in_transaction_session_timeout`
        // for this transaction only, undone with the savepoint when the claim takes nothing).
        let idle = self.idle.unwrap_or(self.store.tx_idle).bound(req.lease);
        let mut records = self
            .store
            .claims(&mut self.tx, Claiming::Tx)
            .bounding_idle(idle);
        let outcome = claim_insert_first(&mut records, req, &self.store.order).await;
        if !records.contended() {
            return outcome;
        }
        // One round trip: the caller's lock timeout, and the claim's.
        let rows = sqlx::raw_sql(AssertSqlSafe(format!(
            "SHOW lock_timeout; SET LOCAL lock_timeout = '{}'",
            lock_timeout_text(self.store.lock_timeout)
        )))
        .fetch_all(&mut *self.tx)
        .await
        .map_err(db_error)?;
        let callers: String = match rows.first() {
            Some(row) => row.try_get(0).map_err(db_error)?,
            None => return Err(IdemError::store("SHOW lock_timeout returned no row")),
        };
        let outcome = claim_insert_first(
            &mut self
                .store
                .claims(&mut self.tx, Claiming::TxWaiting)
                .bounding_idle(idle),
            req,
            &self.store.order,
        )
        .await?;
        if let ClaimOutcome::Acquired { .. } = outcome {
            // The body's own statements wait as long as the caller said.
            sqlx::query("SELECT set_config('lock_timeout', $1, true)")
                .bind(callers)
                .execute(&mut *self.tx)
                .await
                .map_err(db_error)?;
        }
        Ok(outcome)
    }
}

impl Deref for PgTx {
    type Target = PgConnection;

    fn deref(&self) -> &PgConnection {
        &self.tx
    }
}

impl DerefMut for PgTx {
    fn deref_mut(&mut self) -> &mut PgConnection {
        // What runs on the connection now lies after the savepoint opened with BEGIN.
        self.ready = None;
        &mut self.tx
    }
}

impl PgTx {
    /// The connection, for your own queries: `query.execute(tx.conn())` (the same as
    /// `&mut **tx`, and the same method as on the other transactions idem gives).
    pub fn conn(&mut self) -> &mut PgConnection {
        self
    }
}

impl std::fmt::Debug for PgTx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgTx").finish_non_exhaustive()
    }
}

/// Transaction mode: the claim lives in a savepoint of this transaction; a concurrent duplicate
/// waits (bounded) on the claimant's row, then replays.
#[async_trait]
impl IdemTx for PgTx {
    fn store(&self) -> &dyn Store {
        &self.store
    }

    fn idle_timeout(&mut self, call: Option<TxIdleTimeout>) {
        self.idle = call;
    }

    async fn claim(&mut self, req: &ClaimRequest<'_>) -> Result<ClaimOutcome, IdemError> {
        // A live success needs no savepoint: one plain read answers it (once repeats prevail).
        let order = self.store.order.clone();
        let mut records = self.store.claims(&mut self.tx, Claiming::Tx);
        if let Some(outcome) = replay_by_read(&mut records, req, &order).await? {
            return Ok(outcome);
        }
        // The savepoint opened with BEGIN, if nothing ran since; else one of its own.
        let (savepoint, opened) = match self.ready.take() {
            Some(ready) => (ready, true),
            None => (Savepoint::claim(), false),
        };
        let outcome = self.claim_in(&savepoint, req, opened).await;
        match outcome {
            Ok(outcome @ ClaimOutcome::Acquired { .. }) => {
                self.claim = Some(savepoint);
                Ok(outcome)
            }
            Ok(outcome) => {
                // Nothing was written; the read's row lock and the lock timeout go with it.
                self.undo(&savepoint).await?;
                Ok(outcome)
            }
            Err(e) => {
                // After an error Postgres refuses every statement until the savepoint is rolled
                // back; that also leaves the caller's transaction as it was before the call.
                let _ = self.undo(&savepoint).await;
                match e {
                    IdemError::StoreBusy {
                        reason: Busy::LockTimeout,
                        ..
                    } => Ok(ClaimOutcome::InProgress {
                        retry_after: self.store.lock_timeout,
                    }),
                    e => Err(e),
                }
            }
        }
    }

    async fn complete(
        &mut self,
        biz: &str,
        key: &str,
        claim: &Claim,
        snapshot: &[u8],
        ttl: Duration,
    ) -> Result<(), IdemError> {
        self.mark(biz, key, claim, snapshot, ttl, None).await
    }

    async fn complete_keeping(
        &mut self,
        biz: &str,
        key: &str,
        claim: &Claim,
        snapshot: &[u8],
        ttl: Duration,
        result_ttl: Duration,
    ) -> Result<(), IdemError> {
        self.mark(biz, key, claim, snapshot, ttl, Some(result_ttl))
            .await
    }

    async fn abort(&mut self) -> Result<(), IdemError> {
        // A done savepoint opened after this claim's goes with the rollback.
        self.done = None;
        let Some(savepoint) = self.claim.take() else {
            return Ok(());
        };
        self.undo(&savepoint).await
    }
}

impl PgTx {
    /// The mark of success in the claim's savepoint, the result kept `result_ttl` (or as long as
    /// the record), which it keeps (released with the next claim's or by the commit); on an error
    /// the claim is rolled back.
    async fn mark(
        &mut self,
        biz: &str,
        key: &str,
        claim: &Claim,
        snapshot: &[u8],
        ttl: Duration,
        result_ttl: Option<Duration>,
    ) -> Result<(), IdemError> {
        let done = self
            .store
            .records(&mut self.tx)
            .complete(biz, key, claim, snapshot, ttl, result_ttl)
            .await;
        match done {
            Ok(()) => {
                // Kept: released with the next claim's savepoint, or by the commit.
                if let Some(savepoint) = self.claim.take() {
                    self.done = Some(savepoint);
                }
                Ok(())
            }
            Err(e) => {
                let _ = IdemTx::abort(self).await;
                Err(e)
            }
        }
    }
}

// Left out of rustc's list of implementors, as every SQL backend's impls are: the list in
// the "not a transaction" error stays the same whichever backends are built.
#[diagnostic::do_not_recommend]
#[async_trait]
impl TransitionConn for PgTx {
    fn dialect(&self) -> Dialect {
        Dialect::Postgres
    }

    async fn execute(
        &mut self,
        sql: &'static str,
        args: &[SqlValue<'_>],
    ) -> Result<u64, IdemError> {
        self.ready = None;
        let statement = TransitionConn::execute(&mut *self.tx, sql, args);
        crate::engine::tx_step(crate::engine::TxStep::Statement, statement, |e| e).await
    }

    async fn execute_unprepared(&mut self, sql: &str) -> Result<(), IdemError> {
        self.ready = None;
        let statement = TransitionConn::execute_unprepared(&mut *self.tx, sql);
        crate::engine::tx_step(crate::engine::TxStep::Statement, statement, |e| e).await
    }

    async fn read_state(
        &mut self,
        sql: &'static str,
        args: &[SqlValue<'_>],
        versioned: bool,
    ) -> Result<Option<StateRow>, IdemError> {
        self.ready = None;
        TransitionConn::read_state(&mut *self.tx, sql, args, versioned).await
    }
}

#[async_trait]
impl StoreTx for PgTx {
    async fn commit(self: Box<Self>) -> Result<(), IdemError> {
        PgTx::commit(*self).await
    }

    async fn rollback(self: Box<Self>) -> Result<(), IdemError> {
        PgTx::rollback(*self).await
    }
}
