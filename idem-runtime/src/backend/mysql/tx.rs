//! Transactions on MySQL / MariaDB: [`MySqlTx`], on which `tx = "…"` calls claim in a savepoint and
//! state transitions run.

use std::ops::{Deref, DerefMut};
use std::time::Duration;

use async_trait::async_trait;
use sqlx::mysql::MySqlConnection;
use sqlx::{MySql, Transaction};

use super::{MySqlStore, db_error};
use crate::engine::tx::IdemTx;
use crate::sql::claim::{claim_insert_first, replay_by_read};
use crate::sql::conn::{StateRow, TransitionConn};
use crate::sql::dialect::{Dialect, Savepoint};
use crate::sql::value::SqlValue;
use crate::store::tx::StoreTx;
use crate::store::{Claim, ClaimOutcome, ClaimRequest, Store};
use crate::{Busy, IdemError, TxIdleTimeout};

/// A transaction on a [`MySqlStore`]'s database, begun with [`MySqlStore::begin`].
///
/// It carries its store, so a `#[idempotent(tx = "tx")]` call claims in that store's table, on
/// that database, by construction. It derefs to the connection: run your own queries on it with
/// `query.execute(&mut **tx)`, exactly as on a `sqlx::Transaction`. Commit it (or let it drop to
/// roll back).
///
/// A claim in it is a plain `INSERT` in a savepoint. While the store's claims mostly create
/// records, [`MySqlStore::begin`] opens the savepoint of the transaction's first claim in the round
/// trip of its `BEGIN`, and it serves that claim (whose insert then goes as a prepared statement)
/// when nothing ran on the connection between them; anything run through it, a read included,
/// makes the claim open a savepoint of its own, so the claim's undo never takes back the caller's
/// own writes. Such a savepoint is sent with the insert in one round trip (as text, its strings as
/// hexadecimal literals). Once the store's claims mostly meet a record, a plain read comes first
/// and answers a live success without a savepoint. A savepoint stays until
/// the next claim's or the commit releases it. A duplicate waits (up to the store's lock
/// wait) for the transaction that holds the key, then reads the committed record with a current
/// read and replays it, or answers `InProgress` when the wait ran out. When InnoDB picks the
/// claim as a deadlock victim it has rolled back the whole transaction: the call fails with an
/// error whose `restarts_transaction()` is true; run the transaction again
/// ([`crate::retry_transaction`]).
///
/// Once it holds a claim, MariaDB closes its connection after it sat idle longer than the call's
/// idle bound ([`crate::TxIdleTimeout`], the lease by default: `idle_write_transaction_timeout`,
/// set by [`MySqlStore::begin`] and, for a call that asks for another, in the claim's round
/// trip), and the transaction rolls back, so a client that vanished mid-transaction frees its
/// key.
pub struct MySqlTx {
    tx: Transaction<'static, MySql>,
    store: MySqlStore,
    /// A savepoint opened with the transaction's `BEGIN` after which nothing ran: the next claim
    /// takes it instead of opening one. Gone once the connection is used.
    ready: Option<Savepoint>,
    /// The savepoint of the claim in progress (between `claim` and `complete`/`abort`).
    claim: Option<Savepoint>,
    /// The savepoint of the last claim marked done, released with the next claim's (or by the
    /// commit).
    done: Option<Savepoint>,
    /// The idle bound the next claim's call asked for (`None`: the store's).
    idle: Option<TxIdleTimeout>,
    /// The session's `idle_write_transaction_timeout` as idem last set it (`begin`, or a claim).
    session_idle: String,
}

impl MySqlTx {
    pub(super) fn new(
        tx: Transaction<'static, MySql>,
        store: MySqlStore,
        ready: Option<Savepoint>,
        session_idle: String,
    ) -> Self {
        MySqlTx {
            tx,
            store,
            ready,
            claim: None,
            done: None,
            idle: None,
            session_idle,
        }
    }

    /// The statement that sets the idle bound `req`'s call asks for, when the session has
    /// another (sent in the claim's round trip).
    fn idle_settings(&mut self, req: &ClaimRequest<'_>) -> Option<String> {
        let bound = self.idle.unwrap_or(self.store.tx_idle).bound(req.lease);
        let wanted = super::idle_setting(bound);
        if wanted == self.session_idle {
            return None;
        }
        let set = self.store.session_settings(&wanted);
        self.session_idle = wanted;
        Some(set)
    }

    /// The store this transaction belongs to.
    pub fn store(&self) -> &MySqlStore {
        &self.store
    }

    /// The sqlx transaction underneath (`idem::sqlx`, sqlx 0.9).
    pub fn transaction(&mut self) -> &mut Transaction<'static, MySql> {
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

    /// Runs a savepoint statement.
    async fn exec(&mut self, sql: String) -> Result<(), IdemError> {
        TransitionConn::execute_unprepared(&mut *self.tx, &sql).await
    }
}

impl Deref for MySqlTx {
    type Target = MySqlConnection;

    fn deref(&self) -> &MySqlConnection {
        &self.tx
    }
}

impl DerefMut for MySqlTx {
    fn deref_mut(&mut self) -> &mut MySqlConnection {
        // What runs on the connection now lies after the savepoint opened with BEGIN.
        self.ready = None;
        &mut self.tx
    }
}

impl MySqlTx {
    /// The connection, for your own queries: `query.execute(tx.conn())` (the same as
    /// `&mut **tx`, and the same method as on the other transactions idem gives).
    pub fn conn(&mut self) -> &mut MySqlConnection {
        self
    }
}

impl std::fmt::Debug for MySqlTx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MySqlTx").finish_non_exhaustive()
    }
}

#[async_trait]
impl IdemTx for MySqlTx {
    fn store(&self) -> &dyn Store {
        &self.store
    }

    fn idle_timeout(&mut self, call: Option<TxIdleTimeout>) {
        self.idle = call;
    }

    async fn claim(&mut self, req: &ClaimRequest<'_>) -> Result<ClaimOutcome, IdemError> {
        // A live success needs no savepoint: one plain read answers it (once repeats prevail).
        let order = self.store.order.clone();
        if let Some(outcome) =
            replay_by_read(&mut self.store.claims(&mut self.tx, true), req, &order).await?
        {
            return Ok(outcome);
        }
        // The savepoint opened with BEGIN, if nothing ran since; else one of its own, which goes
        // in the round trip of the claim's insert. So does the idle bound, when the call asks for
        // another than the session has (MariaDB has no transaction-local setting).
        let set = self.idle_settings(req);
        let outcome = if let Some(ready) = self.ready.take() {
            self.claim = Some(ready);
            let records = self.store.claims(&mut self.tx, true);
            let mut records = match set {
                Some(set) => records.sending_first(set),
                None => records,
            };
            claim_insert_first(&mut records, req, &order).await
        } else {
            let savepoint = Savepoint::claim();
            let mut open = savepoint.open_after(self.done.take());
            if let Some(set) = set {
                open = format!("{set}; {open}");
            }
            self.claim = Some(savepoint);
            let mut records = self.store.claims(&mut self.tx, true).sending_first(open);
            claim_insert_first(&mut records, req, &order).await
        };
        match outcome {
            Ok(outcome @ ClaimOutcome::Acquired { .. }) => Ok(outcome),
            Ok(outcome) => {
                // Nothing was written in it: released with the next claim's, or by the commit.
                self.done = self.claim.take();
                Ok(outcome)
            }
            Err(e) if e.restarts_transaction() => {
                // InnoDB rolled the whole transaction back (the savepoint is gone with it).
                self.claim = None;
                Err(e)
            }
            Err(IdemError::StoreBusy {
                reason: Busy::LockTimeout,
                ..
            }) => {
                // Another transaction still holds the record; only the statement was undone.
                IdemTx::abort(self).await?;
                Ok(ClaimOutcome::InProgress {
                    retry_after: self.store.lock_wait(),
                })
            }
            Err(e) => {
                let _ = IdemTx::abort(self).await;
                Err(e)
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
        self.exec(savepoint.rollback()).await?;
        self.exec(savepoint.release()).await
    }
}

// Not listed in the "other types implement" help of a wrong `tx`: the compile errors read the
// same whichever backends are built.
#[diagnostic::do_not_recommend]
#[async_trait]
impl TransitionConn for MySqlTx {
    fn dialect(&self) -> Dialect {
        Dialect::MySQL
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
impl StoreTx for MySqlTx {
    async fn commit(self: Box<Self>) -> Result<(), IdemError> {
        MySqlTx::commit(*self).await
    }

    async fn rollback(self: Box<Self>) -> Result<(), IdemError> {
        MySqlTx::rollback(*self).await
    }
}

impl MySqlTx {
    /// The mark of success in the claim's savepoint, the result kept `result_ttl` (or as long as
    /// the record), which it keeps (released with the next claim's or by the commit); on an
    /// error the claim is rolled back.
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
            Err(e) if e.restarts_transaction() => {
                self.claim = None;
                Err(e)
            }
            Err(e) => {
                let _ = IdemTx::abort(self).await;
                Err(e)
            }
        }
    }
}
