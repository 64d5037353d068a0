//! The transaction every SQL store gives, written once: [`SqlTx`], on which `tx = "…"` calls claim
//! in a savepoint and state transitions run. What a database does its own way (how a claim waits
//! for another transaction and sets its idle bound, whether the store timeout bounds each step,
//! which errors take the whole transaction with them) is its [`TxDb`] impl, in its backend's
//! `tx.rs`; `PgTx`, `MySqlTx` and `SqliteTx` are this type on their database.

use std::ops::{Deref, DerefMut};
use std::time::Duration;

use async_trait::async_trait;
use sqlx::Transaction;

use super::conn::{StateRow, TransitionConn};
use super::dialect::{Dialect, Savepoint};
use super::records::{RecordDb, Records};
use super::store::SqlStore;
use super::value::SqlValue;
use crate::engine::tx::IdemTx;
use crate::engine::{TxStep, tx_step};
use crate::store::tx::StoreTx;
use crate::store::{Claim, ClaimOutcome, ClaimRequest, Store};
use crate::{IdemError, TxIdleTimeout};

/// What a database's transaction does its own way; the rest is [`SqlTx`]'s. Implemented for
/// sqlx's `Sqlite`, `MySql` and `Postgres`, each in its backend.
#[async_trait]
pub trait TxDb: RecordDb<Connection: TransitionConn> {
    /// The store whose transactions these are. (`SqlStore` is crate-private, as this trait is
    /// sealed: only idem's backends implement it.)
    #[allow(private_bounds)]
    type Store: SqlStore<Db = Self> + Store + Clone;

    /// What a transaction keeps beyond the savepoints (MySQL: the session's idle bound).
    type State: Send + Sync;

    /// The transaction's name in `Debug` output (`PgTx`).
    const TX_NAME: &'static str;

    /// Whether the store timeout in force bounds the commit, the rollback and each transition
    /// statement (the server databases; SQLite's busy timeout bounds its waits itself).
    const TIMED: bool;

    /// Whether a claim marked done keeps its savepoint, released with the next claim's or by the
    /// commit (one round trip saved per call), instead of releasing it at once.
    const KEEPS_DONE: bool;

    /// Whether undoing a claim sends its rollback and release in one round trip.
    const UNDO_BATCHED: bool;

    /// Whether a claim's mark waits to be sent with what the transaction sends next: the next
    /// claim, or the commit, in the commit's round trip
    /// ([`RecordStatements::complete_commit`](super::records::RecordStatements)). Only where
    /// nothing outside the transaction can change the claimed record before its commit (SQLite:
    /// `BEGIN IMMEDIATE` holds the database's write lock), so the mark cannot find the record
    /// taken over.
    const MARKS_AT_COMMIT: bool;

    /// Whether the claim's savepoint still exists after `e` (MySQL: an error that restarts the
    /// transaction means InnoDB rolled it all back, the savepoint with it).
    fn keeps_savepoint(e: &IdemError) -> bool {
        let _ = e;
        true
    }

    /// Claims `req` in `tx` (the backend's locking and waiting), leaving the claim's savepoint in
    /// `tx.claim` when it acquires.
    async fn claim(tx: &mut SqlTx<Self>, req: &ClaimRequest<'_>)
    -> Result<ClaimOutcome, IdemError>;
}

/// What a completing call marks: its record, claim and result.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Done<'a> {
    /// The business type.
    pub biz: &'a str,
    /// The key.
    pub key: &'a str,
    /// The claim that holds the record.
    pub claim: &'a Claim,
    /// The result kept.
    pub snapshot: &'a [u8],
    /// How long the record lives.
    pub ttl: Duration,
}

/// A transaction on a SQL store's database, begun with the store's `begin()`: an
/// `idem::PgTx`, `idem::MySqlTx` or `idem::SqliteTx` (their pages say how a claim runs on each
/// database).
///
/// It carries its store, so a `#[idempotent(tx = "tx")]` call claims in that store's table, on
/// that database, by construction. It derefs to the connection: run your own queries on it with
/// `query.execute(&mut **tx)`, exactly as on a `sqlx::Transaction`. Commit it (or let it drop to
/// roll back).
pub struct SqlTx<D: TxDb> {
    pub(crate) tx: Transaction<'static, D>,
    pub(crate) store: D::Store,
    /// A savepoint opened with the transaction's `BEGIN` after which nothing ran: the next claim
    /// takes it instead of opening one (a round trip). Gone once the connection is used.
    pub(crate) ready: Option<Savepoint>,
    /// The savepoint of the claim in progress (between `claim` and `complete`/`abort`).
    pub(crate) claim: Option<Savepoint>,
    /// The savepoint of the last claim marked done, released with the next claim's (or by the
    /// commit).
    pub(crate) done: Option<Savepoint>,
    /// The idle bound the next claim's call asked for (`None`: the store's). SQLite's claim has
    /// none to set.
    #[cfg_attr(not(any(feature = "postgres", feature = "mysql")), allow(dead_code))]
    pub(crate) idle: Option<TxIdleTimeout>,
    /// What the database's transaction keeps of its own (only MySQL keeps anything).
    #[cfg_attr(not(feature = "mysql"), allow(dead_code))]
    pub(crate) state: D::State,
    /// The mark of the last claim done, not sent yet ([`TxDb::MARKS_AT_COMMIT`]): written before
    /// the next claim, or with the commit.
    pending: Option<PendingMark>,
    /// A mark sent late that did not land: the call that made it was answered as done, so the
    /// transaction must not commit.
    lost: Option<u32>,
}

/// A mark kept for the commit's round trip ([`TxDb::MARKS_AT_COMMIT`]).
struct PendingMark {
    biz: String,
    key: String,
    claim: Claim,
    snapshot: Vec<u8>,
    ttl: Duration,
    result_ttl: Option<Duration>,
}

impl<D: TxDb> SqlTx<D> {
    pub(crate) fn new(
        tx: Transaction<'static, D>,
        store: D::Store,
        ready: Option<Savepoint>,
        state: D::State,
    ) -> Self {
        SqlTx {
            tx,
            store,
            ready,
            claim: None,
            done: None,
            idle: None,
            state,
            pending: None,
            lost: None,
        }
    }

    /// The store this transaction belongs to.
    pub fn store(&self) -> &D::Store {
        &self.store
    }

    /// The sqlx transaction underneath (`idem::sqlx`, sqlx 0.9).
    pub fn transaction(&mut self) -> &mut Transaction<'static, D> {
        self.ready = None;
        &mut self.tx
    }

    /// The connection, for your own queries: `query.execute(tx.conn())` (the same as
    /// `&mut **tx`, and the same method as on the other transactions idem gives).
    pub fn conn(&mut self) -> &mut D::Connection {
        self
    }

    /// Commits; on a server database within the store timeout in force
    /// ([`crate::store::with_store_timeout`], default [`crate::store::DEFAULT_STORE_TIMEOUT`]).
    ///
    /// # Errors
    /// The database's error, classified; [`IdemError::StoreUnavailable`] when the server did not
    /// answer in time, and then the transaction may or may not have committed (a repeat of the
    /// call replays if it did). On SQLite, where a call's mark is sent with the commit:
    /// [`IdemError::LeaseLost`] when that mark (or one sent ahead of a later claim) changed
    /// nothing, and then nothing was committed.
    pub async fn commit(mut self) -> Result<(), IdemError> {
        if let Some(attempt) = self.lost {
            // Dropped: rolled back.
            return Err(IdemError::LeaseLost { attempt });
        }
        if self.pending.is_some() {
            // The mark, its check and the COMMIT in one round trip. Once it returns, the
            // transaction has committed (or, on an error, is still open and rolls back when
            // dropped here); sqlx's handle, which did not send the COMMIT, finds no transaction
            // left to roll back when it is dropped.
            return self.send_pending(true).await;
        }
        if D::TIMED {
            tx_step(TxStep::Commit, self.tx.commit(), D::error).await
        } else {
            self.tx.commit().await.map_err(D::error)
        }
    }

    /// Rolls back; on a server database within the store timeout in force.
    ///
    /// # Errors
    /// The database's error, classified; [`IdemError::StoreUnavailable`] when the server did not
    /// answer in time (the server rolls back a transaction whose connection ends).
    pub async fn rollback(self) -> Result<(), IdemError> {
        if D::TIMED {
            tx_step(TxStep::Rollback, self.tx.rollback(), D::error).await
        } else {
            self.tx.rollback().await.map_err(D::error)
        }
    }

    /// Runs statements without parameters (savepoints), in one round trip.
    pub(crate) async fn exec(&mut self, sql: String) -> Result<(), IdemError> {
        TransitionConn::execute_unprepared(&mut *self.tx, &sql).await
    }

    /// Rolls back to `savepoint` and releases it (the claim, every write since, its row locks and
    /// what it set go).
    pub(crate) async fn undo(&mut self, savepoint: &Savepoint) -> Result<(), IdemError> {
        if D::UNDO_BATCHED {
            self.exec(format!("{}; {}", savepoint.rollback(), savepoint.release()))
                .await
        } else {
            self.exec(savepoint.rollback()).await?;
            self.exec(savepoint.release()).await
        }
    }

    /// The mark of success in the claim's savepoint, the result kept `result_ttl` (or as long as
    /// the record). The savepoint is kept (released with the next claim's or by the commit) or
    /// released ([`TxDb::KEEPS_DONE`]); on an error the claim is rolled back.
    async fn mark(
        &mut self,
        done: Done<'_>,
        result_ttl: Option<Duration>,
    ) -> Result<(), IdemError> {
        if D::MARKS_AT_COMMIT {
            self.pending = Some(PendingMark {
                biz: done.biz.to_owned(),
                key: done.key.to_owned(),
                claim: *done.claim,
                snapshot: done.snapshot.to_vec(),
                ttl: done.ttl,
                result_ttl,
            });
            // Its savepoint is released with the next claim's, or by the commit.
            if let Some(savepoint) = self.claim.take() {
                self.done = Some(savepoint);
            }
            return Ok(());
        }
        let marked = self
            .store
            .records(&mut self.tx)
            .complete(
                done.biz,
                done.key,
                done.claim,
                done.snapshot,
                done.ttl,
                result_ttl,
            )
            .await;
        match marked {
            Ok(()) => match self.claim.take() {
                Some(savepoint) if D::KEEPS_DONE => {
                    self.done = Some(savepoint);
                    Ok(())
                }
                Some(savepoint) => self.exec(savepoint.release()).await,
                None => Ok(()),
            },
            Err(e) if !D::keeps_savepoint(&e) => {
                self.claim = None;
                Err(e)
            }
            Err(e) => {
                let _ = IdemTx::abort(self).await;
                Err(e)
            }
        }
    }

    /// Sends the mark kept for the commit: ahead of a claim (which may be of the same key), or
    /// with the `COMMIT` (`commit`). One that does not land ahead of a claim leaves the
    /// transaction unable to commit: its call was answered as done.
    async fn send_pending(&mut self, commit: bool) -> Result<(), IdemError> {
        let Some(mark) = self.pending.take() else {
            return Ok(());
        };
        let PendingMark {
            biz,
            key,
            claim,
            snapshot,
            ttl,
            result_ttl,
        } = &mark;
        let mut records = self.store.records(&mut self.tx);
        let sent = if commit {
            records
                .complete_and_commit(biz, key, claim, snapshot, *ttl, *result_ttl)
                .await
        } else {
            records
                .complete(biz, key, claim, snapshot, *ttl, *result_ttl)
                .await
        };
        if sent.is_err() {
            self.lost = Some(claim.attempt);
        }
        sent
    }

    /// `statement` run on the connection, bounded by the store timeout on a server database.
    async fn step<T>(
        statement: impl Future<Output = Result<T, IdemError>>,
    ) -> Result<T, IdemError> {
        if D::TIMED {
            tx_step(TxStep::Statement, statement, |e| e).await
        } else {
            statement.await
        }
    }

    /// [`TransitionConn::execute`] on the connection.
    pub(crate) async fn execute_step(
        &mut self,
        sql: &'static str,
        args: &[SqlValue<'_>],
    ) -> Result<u64, IdemError> {
        self.ready = None;
        Self::step(TransitionConn::execute(&mut *self.tx, sql, args)).await
    }

    /// [`TransitionConn::execute_unprepared`] on the connection.
    pub(crate) async fn unprepared_step(&mut self, sql: &str) -> Result<(), IdemError> {
        self.ready = None;
        Self::step(TransitionConn::execute_unprepared(&mut *self.tx, sql)).await
    }

    /// [`TransitionConn::read_state`] on the connection.
    pub(crate) async fn read_state_step(
        &mut self,
        sql: &'static str,
        args: &[SqlValue<'_>],
        versioned: bool,
    ) -> Result<Option<StateRow>, IdemError> {
        self.ready = None;
        TransitionConn::read_state(&mut *self.tx, sql, args, versioned).await
    }
}

impl<D: TxDb> Deref for SqlTx<D> {
    type Target = D::Connection;

    fn deref(&self) -> &D::Connection {
        &self.tx
    }
}

impl<D: TxDb> DerefMut for SqlTx<D> {
    fn deref_mut(&mut self) -> &mut D::Connection {
        // What runs on the connection now lies after the savepoint opened with BEGIN.
        self.ready = None;
        &mut self.tx
    }
}

impl<D: TxDb> std::fmt::Debug for SqlTx<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct(D::TX_NAME).finish_non_exhaustive()
    }
}

/// Transaction mode: the claim lives in a savepoint of this transaction; a concurrent duplicate
/// waits (bounded) for the claimant's transaction, then replays.
#[async_trait]
impl<D: TxDb> IdemTx for SqlTx<D> {
    fn store(&self) -> &dyn Store {
        &self.store
    }

    fn idle_timeout(&mut self, call: Option<TxIdleTimeout>) {
        self.idle = call;
    }

    async fn claim(&mut self, req: &ClaimRequest<'_>) -> Result<ClaimOutcome, IdemError> {
        self.send_pending(false).await?;
        D::claim(self, req).await
    }

    async fn complete(
        &mut self,
        biz: &str,
        key: &str,
        claim: &Claim,
        snapshot: &[u8],
        ttl: Duration,
    ) -> Result<(), IdemError> {
        let done = Done {
            biz,
            key,
            claim,
            snapshot,
            ttl,
        };
        self.mark(done, None).await
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
        let done = Done {
            biz,
            key,
            claim,
            snapshot,
            ttl,
        };
        self.mark(done, Some(result_ttl)).await
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

/// Every statement of a state transition through the transaction's own steps (timed on the
/// server databases, [`TxDb::TIMED`]). One impl for every database: the "not a transaction" error
/// lists it as `SqlTx<D>`, whichever backends are built.
#[async_trait]
impl<D: TxDb> TransitionConn for SqlTx<D> {
    fn dialect(&self) -> Dialect {
        D::DIALECT
    }

    async fn execute(
        &mut self,
        sql: &'static str,
        args: &[SqlValue<'_>],
    ) -> Result<u64, IdemError> {
        self.execute_step(sql, args).await
    }

    async fn execute_unprepared(&mut self, sql: &str) -> Result<(), IdemError> {
        self.unprepared_step(sql).await
    }

    async fn read_state(
        &mut self,
        sql: &'static str,
        args: &[SqlValue<'_>],
        versioned: bool,
    ) -> Result<Option<StateRow>, IdemError> {
        self.read_state_step(sql, args, versioned).await
    }
}

#[async_trait]
impl<D: TxDb> StoreTx for SqlTx<D> {
    async fn commit(self: Box<Self>) -> Result<(), IdemError> {
        SqlTx::commit(*self).await
    }

    async fn rollback(self: Box<Self>) -> Result<(), IdemError> {
        SqlTx::rollback(*self).await
    }
}
