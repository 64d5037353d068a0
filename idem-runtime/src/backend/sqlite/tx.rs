//! Transaction support on SQLite: savepoints, and `tx = "…"` claims in the caller's transaction.

use async_trait::async_trait;
use sqlx::sqlite::SqliteConnection;
use sqlx::{Sqlite, Transaction};

use super::{COMPLETE, db_error, finish_on};
use crate::IdemError;
use crate::engine::tx_conn::TxConnection;
use crate::sql::claim::claim_by_cas;
use crate::store::{ClaimOutcome, ClaimRequest, Store};

/// A named savepoint inside the caller's transaction: what `tx = "…"` claims and state
/// transitions run in, so their writes and the caller's commit or roll back together.
pub(crate) struct Savepoint {
    open: &'static str,
    release: &'static str,
    rollback: &'static str,
}

impl Savepoint {
    /// The savepoint of a transactional `#[idempotent]` claim.
    pub(crate) const CLAIM: Savepoint = Savepoint {
        open: "SAVEPOINT idem_claim",
        release: "RELEASE SAVEPOINT idem_claim",
        rollback: "ROLLBACK TO SAVEPOINT idem_claim",
    };
    /// The savepoint of a `#[state_transition]` update and its body.
    pub(crate) const TRANSITION: Savepoint = Savepoint {
        open: "SAVEPOINT idem_transition",
        release: "RELEASE SAVEPOINT idem_transition",
        rollback: "ROLLBACK TO SAVEPOINT idem_transition",
    };

    async fn exec(conn: &mut SqliteConnection, sql: &'static str) -> Result<(), IdemError> {
        sqlx::query(sql).execute(conn).await.map_err(db_error)?;
        Ok(())
    }

    /// Opens it.
    pub(crate) async fn open(&self, conn: &mut SqliteConnection) -> Result<(), IdemError> {
        Self::exec(conn, self.open).await
    }

    /// Keeps what was written since it opened (the enclosing transaction decides the rest).
    pub(crate) async fn release(&self, conn: &mut SqliteConnection) -> Result<(), IdemError> {
        Self::exec(conn, self.release).await
    }

    /// Undoes everything written since it opened, and closes it.
    pub(crate) async fn abort(&self, conn: &mut SqliteConnection) -> Result<(), IdemError> {
        Self::exec(conn, self.rollback).await?;
        Self::exec(conn, self.release).await
    }
}

/// Transaction mode on SQLite: the claim lives in a savepoint of the caller's transaction.
///
/// Begin such transactions with [`SqliteStore::begin`] (`BEGIN IMMEDIATE`): a deferred transaction that
/// read before it writes cannot wait for a concurrent writer in WAL mode and fails with "database
/// is locked" instead.
#[async_trait]
impl TxConnection for SqliteConnection {
    async fn idem_claim(
        &mut self,
        store: &dyn Store,
        req: &ClaimRequest<'_>,
    ) -> Result<ClaimOutcome, IdemError> {
        if store.backend() != "sqlite" {
            return Err(IdemError::TxStoreMismatch {
                store: store.backend().to_owned(),
                backend: store.backend(),
                expected: "sqlite",
            });
        }
        Savepoint::CLAIM.open(self).await?;
        let outcome = match claim_by_cas(self, req).await {
            Ok(outcome) => outcome,
            Err(e) => {
                let _ = self.idem_abort().await;
                return Err(e);
            }
        };
        if !matches!(outcome, ClaimOutcome::Acquired { .. }) {
            Savepoint::CLAIM.release(self).await?;
        }
        Ok(outcome)
    }

    async fn idem_complete(
        &mut self,
        _store: &dyn Store,
        biz: &str,
        key: &str,
        attempt: u32,
        snapshot: &[u8],
    ) -> Result<(), IdemError> {
        match finish_on(self, COMPLETE, biz, key, attempt, Some(snapshot)).await {
            Ok(()) => Savepoint::CLAIM.release(self).await,
            Err(e) => {
                let _ = self.idem_abort().await;
                Err(e)
            }
        }
    }

    async fn idem_abort(&mut self) -> Result<(), IdemError> {
        Savepoint::CLAIM.abort(self).await
    }
}

/// Transaction mode through the transaction itself (`&mut sqlx::Transaction<'_, Sqlite>`).
#[async_trait]
impl TxConnection for Transaction<'_, Sqlite> {
    async fn idem_claim(
        &mut self,
        store: &dyn Store,
        req: &ClaimRequest<'_>,
    ) -> Result<ClaimOutcome, IdemError> {
        (**self).idem_claim(store, req).await
    }

    async fn idem_complete(
        &mut self,
        store: &dyn Store,
        biz: &str,
        key: &str,
        attempt: u32,
        snapshot: &[u8],
    ) -> Result<(), IdemError> {
        (**self)
            .idem_complete(store, biz, key, attempt, snapshot)
            .await
    }

    async fn idem_abort(&mut self) -> Result<(), IdemError> {
        (**self).idem_abort().await
    }
}
