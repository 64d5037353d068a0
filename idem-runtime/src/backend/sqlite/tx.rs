//! Transactions on SQLite: [`SqliteTx`], on which `tx = "…"` calls claim in a savepoint and state
//! transitions run.

use std::ops::{Deref, DerefMut};
use std::time::Duration;

use async_trait::async_trait;
use sqlx::sqlite::SqliteConnection;
use sqlx::{Sqlite, Transaction};

use super::records::Claims;
use super::{SqliteStore, db_error};
use crate::IdemError;
use crate::engine::tx::IdemTx;
use crate::sql::claim::{claim_insert_first, replay_by_read};
use crate::sql::conn::{StateRow, TransitionConn};
use crate::sql::dialect::{Dialect, Savepoint};
use crate::sql::value::SqlValue;
use crate::store::tx::StoreTx;
use crate::store::{Claim, ClaimOutcome, ClaimRequest, Store};

/// A transaction on a [`SqliteStore`]'s database, begun with [`SqliteStore::begin`]
/// (`BEGIN IMMEDIATE`).
///
/// It carries its store, so a `#[idempotent(tx = "tx")]` call claims in that store's table, on
/// that database, by construction. It derefs to the connection: run your own queries on it with
/// `query.execute(&mut **tx)`, exactly as on a `sqlx::Transaction`. Commit it (or let it drop to
/// roll back).
pub struct SqliteTx {
    tx: Transaction<'static, Sqlite>,
    store: SqliteStore,
    /// The savepoint of the claim in progress (between `claim` and `complete`/`abort`).
    claim: Option<Savepoint>,
}

impl SqliteTx {
    pub(super) fn new(tx: Transaction<'static, Sqlite>, store: SqliteStore) -> Self {
        SqliteTx {
            tx,
            store,
            claim: None,
        }
    }

    /// The store this transaction belongs to.
    pub fn store(&self) -> &SqliteStore {
        &self.store
    }

    /// The sqlx transaction underneath (`idem::sqlx`, sqlx 0.9).
    pub fn transaction(&mut self) -> &mut Transaction<'static, Sqlite> {
        &mut self.tx
    }

    /// Commits.
    ///
    /// # Errors
    /// The database's error, classified.
    pub async fn commit(self) -> Result<(), IdemError> {
        self.tx.commit().await.map_err(db_error)
    }

    /// Rolls back.
    ///
    /// # Errors
    /// The database's error, classified.
    pub async fn rollback(self) -> Result<(), IdemError> {
        self.tx.rollback().await.map_err(db_error)
    }

    /// Runs a savepoint statement.
    async fn exec(&mut self, sql: String) -> Result<(), IdemError> {
        TransitionConn::execute_unprepared(&mut *self.tx, &sql).await
    }
}

impl Deref for SqliteTx {
    type Target = SqliteConnection;

    fn deref(&self) -> &SqliteConnection {
        &self.tx
    }
}

impl DerefMut for SqliteTx {
    fn deref_mut(&mut self) -> &mut SqliteConnection {
        &mut self.tx
    }
}

impl SqliteTx {
    /// The connection, for your own queries: `query.execute(tx.conn())` (the same as
    /// `&mut **tx`, and the same method as on the other transactions idem gives).
    pub fn conn(&mut self) -> &mut SqliteConnection {
        self
    }
}

impl std::fmt::Debug for SqliteTx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteTx").finish_non_exhaustive()
    }
}

/// Transaction mode: the claim lives in a savepoint of this transaction. `BEGIN IMMEDIATE` holds
/// SQLite's write lock, so a concurrent duplicate's `begin()` waits for this one to commit, then
/// replays.
#[async_trait]
impl IdemTx for SqliteTx {
    fn store(&self) -> &dyn Store {
        &self.store
    }

    async fn claim(&mut self, req: &ClaimRequest<'_>) -> Result<ClaimOutcome, IdemError> {
        // A live success needs no savepoint: one plain read answers it (once repeats prevail).
        let order = self.store.order.clone();
        if let Some(outcome) = replay_by_read(
            &mut Claims::new(self.store.records(&mut self.tx), &self.store.sql),
            req,
            &order,
        )
        .await?
        {
            return Ok(outcome);
        }
        let savepoint = Savepoint::claim();
        self.exec(savepoint.open()).await?;
        let release = savepoint.release();
        self.claim = Some(savepoint);
        let outcome = claim_insert_first(
            &mut Claims::new(self.store.records(&mut self.tx), &self.store.sql),
            req,
            &order,
        )
        .await;
        match outcome {
            Ok(outcome @ ClaimOutcome::Acquired { .. }) => Ok(outcome),
            Ok(outcome) => {
                self.claim = None;
                self.exec(release).await?;
                Ok(outcome)
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
        let Some(savepoint) = self.claim.take() else {
            return Ok(());
        };
        self.exec(savepoint.rollback()).await?;
        self.exec(savepoint.release()).await
    }
}

#[async_trait]
impl TransitionConn for SqliteTx {
    fn dialect(&self) -> Dialect {
        Dialect::SQLite
    }

    async fn execute(
        &mut self,
        sql: &'static str,
        args: &[SqlValue<'_>],
    ) -> Result<u64, IdemError> {
        TransitionConn::execute(&mut *self.tx, sql, args).await
    }

    async fn execute_unprepared(&mut self, sql: &str) -> Result<(), IdemError> {
        TransitionConn::execute_unprepared(&mut *self.tx, sql).await
    }

    async fn read_state(
        &mut self,
        sql: &'static str,
        args: &[SqlValue<'_>],
        versioned: bool,
    ) -> Result<Option<StateRow>, IdemError> {
        TransitionConn::read_state(&mut *self.tx, sql, args, versioned).await
    }
}

#[async_trait]
impl StoreTx for SqliteTx {
    async fn commit(self: Box<Self>) -> Result<(), IdemError> {
        SqliteTx::commit(*self).await
    }

    async fn rollback(self: Box<Self>) -> Result<(), IdemError> {
        SqliteTx::rollback(*self).await
    }
}

impl SqliteTx {
    /// The mark of success in the claim's savepoint, the result kept `result_ttl` (or as long as
    /// the record); the savepoint is released, or the claim rolled back on an error.
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
            Ok(()) => match self.claim.take() {
                Some(savepoint) => self.exec(savepoint.release()).await,
                None => Ok(()),
            },
            Err(e) => {
                let _ = IdemTx::abort(self).await;
                Err(e)
            }
        }
    }
}
