//! The [`Store`] impl every SQL store shares, written once over [`SqlStore`]: each record method is
//! the record layer's ([`Records`]) on a connection the store lends. A store says only what it
//! does its own way: how it lends a connection (warm connections, SQLite's own one, Postgres's
//! failover watch), its claim (the insert step, lock waits and deadlock retries differ per
//! database), its claim steps for batches and its transaction.

use std::time::Duration;

use async_trait::async_trait;
use sqlx::Database;

use super::claim::{CasRecords, claim_many, retry_deadlocks};
use super::records::Records;
use super::tx::{SqlTx, TxDb};
use crate::IdemError;
use crate::store::order::ClaimOrder;
use crate::store::tx::TransitionTx;
use crate::store::{
    BatchClaim, BatchMark, Claim, ClaimOutcome, ClaimRequest, KeyPage, Limits, Record, StatusCount,
    Store, batch, keys,
};

/// The connection type of a SQL store's database.
pub(crate) type Conn<S> = <<S as SqlStore>::Db as Database>::Connection;

/// A connection a store lent to one statement (or one claim's few): [`Lent::settle`] gives it
/// back with the statement's result, which says whether the connection is worth keeping. Dropped
/// unsettled (the caller's future was dropped mid-statement), it is not kept.
pub trait Lent<C>: Send {
    /// The connection.
    fn conn(&mut self) -> &mut C;

    /// Gives the connection back after `done`, and passes `done` on (a store may change an
    /// error into what it means, as Postgres's failover watch does).
    fn settle<R>(self, done: Result<R, IdemError>) -> Result<R, IdemError>;
}

/// What a SQL store does its own way; [`Store`] is implemented once for every such store.
#[async_trait]
pub(crate) trait SqlStore: Send + Sync + Sized + 'static {
    /// The database, whose transaction ([`SqlTx`]) this store begins.
    type Db: TxDb<Store = Self>;

    /// A connection lent to a statement.
    type Lent<'a>: Lent<Conn<Self>>
    where
        Self: 'a;

    /// The claim's steps in lease mode on one connection (batch claims and marks).
    type Claims<'c>: CasRecords
    where
        Self: 'c;

    /// The backend's name ([`Store::backend`], the metrics' `backend` label).
    const BACKEND: &'static str;

    /// The store's limits ([`Store::limits`]).
    fn own_limits(&self) -> &Limits;

    /// What the store's claims mostly meet, which picks a claim's first step.
    fn order(&self) -> &ClaimOrder;

    /// Lends a connection: a warm one, the store's own, or one from the pool.
    async fn lend(&self) -> Result<Self::Lent<'_>, IdemError>;

    /// The store's records on `conn`.
    fn records<'c>(&'c self, conn: &'c mut Conn<Self>) -> impl Records + 'c;

    /// The claim's steps in lease mode on `conn`.
    fn lease_claims<'c>(&'c self, conn: &'c mut Conn<Self>) -> Self::Claims<'c>;

    /// Claims one key in lease mode ([`Store::claim`]).
    async fn claim_key(&self, req: &ClaimRequest<'_>) -> Result<ClaimOutcome, IdemError>;

    /// Begins a transaction, where state transitions run.
    async fn begin(&self) -> Result<SqlTx<Self::Db>, IdemError>;
}

/// Runs `work` on a connection `store` lends, and gives it back with `work`'s result.
pub(crate) async fn with_conn<S: SqlStore, R>(
    store: &S,
    work: impl AsyncFnOnce(&mut Conn<S>) -> Result<R, IdemError>,
) -> Result<R, IdemError> {
    let mut lent = store.lend().await?;
    let done = work(lent.conn()).await;
    lent.settle(done)
}

#[async_trait]
impl<S: SqlStore> Store for S {
    fn backend(&self) -> &'static str {
        S::BACKEND
    }

    fn limits(&self) -> &Limits {
        self.own_limits()
    }

    async fn claim(&self, req: &ClaimRequest<'_>) -> Result<ClaimOutcome, IdemError> {
        self.claim_key(req).await
    }

    /// One statement inserts every new key (and, once repeats prevail, one reads them all
    /// first); the keys that exist are read in one more. A batch the database picks as a
    /// deadlock victim runs again, as a claim of one key does.
    async fn claim_batch(&self, batch: &BatchClaim<'_>) -> Result<Vec<ClaimOutcome>, IdemError> {
        batch.check()?;
        let reqs: Vec<ClaimRequest<'_>> = batch.requests().collect();
        with_conn(self, async |conn| {
            retry_deadlocks!(
                S::BACKEND,
                claim_many(&mut self.lease_claims(conn), &reqs, self.order()).await
            )
        })
        .await
    }

    /// Every mark in one round trip.
    async fn complete_batch(
        &self,
        biz: &str,
        marks: &[BatchMark<'_>],
        ttl: Duration,
    ) -> Result<Vec<Result<(), IdemError>>, IdemError> {
        batch::check_marks(marks)?;
        if marks.is_empty() {
            return Ok(Vec::new());
        }
        with_conn(self, async |conn| {
            self.lease_claims(conn).complete_many(biz, marks, ttl).await
        })
        .await
    }

    async fn complete(
        &self,
        biz: &str,
        key: &str,
        claim: &Claim,
        snapshot: &[u8],
        ttl: Duration,
    ) -> Result<(), IdemError> {
        with_conn(self, async |conn| {
            self.records(conn)
                .complete(biz, key, claim, snapshot, ttl, None)
                .await
        })
        .await
    }

    async fn complete_keeping(
        &self,
        biz: &str,
        key: &str,
        claim: &Claim,
        snapshot: &[u8],
        ttl: Duration,
        result_ttl: Duration,
    ) -> Result<(), IdemError> {
        with_conn(self, async |conn| {
            self.records(conn)
                .complete(biz, key, claim, snapshot, ttl, Some(result_ttl))
                .await
        })
        .await
    }

    async fn fail(&self, biz: &str, key: &str, claim: &Claim) -> Result<(), IdemError> {
        with_conn(self, async |conn| {
            self.records(conn).fail(biz, key, claim).await
        })
        .await
    }

    async fn renew(
        &self,
        biz: &str,
        key: &str,
        claim: &Claim,
        lease: Duration,
    ) -> Result<(), IdemError> {
        with_conn(self, async |conn| {
            self.records(conn).renew(biz, key, claim, lease).await
        })
        .await
    }

    async fn save_steps(
        &self,
        biz: &str,
        key: &str,
        claim: &Claim,
        steps: &[u8],
    ) -> Result<(), IdemError> {
        with_conn(self, async |conn| {
            self.records(conn).save_steps(biz, key, claim, steps).await
        })
        .await
    }

    async fn load(&self, biz: &str, key: &str) -> Result<Option<Record>, IdemError> {
        with_conn(self, async |conn| self.records(conn).load(biz, key).await).await
    }

    async fn sweep_expired(&self, batch: usize) -> Result<u64, IdemError> {
        with_conn(self, async |conn| self.records(conn).sweep(batch).await).await
    }

    async fn stuck(&self, biz: &str, batch: usize) -> Result<Vec<Record>, IdemError> {
        with_conn(self, async |conn| {
            self.records(conn).stuck(biz, batch).await
        })
        .await
    }

    async fn processing_biz_types(&self) -> Result<Vec<String>, IdemError> {
        with_conn(self, async |conn| {
            self.records(conn).processing_biz_types().await
        })
        .await
    }

    /// A range of the primary key per page, in its order. The batch and the cursor are checked
    /// before a connection is taken.
    async fn list_keys(&self, after: Option<&str>, batch: usize) -> Result<KeyPage, IdemError> {
        keys::check_batch(batch)?;
        if let Some(after) = after {
            keys::parse_after_key(after)?;
        }
        with_conn(self, async |conn| {
            self.records(conn).list_keys(after, batch).await
        })
        .await
    }

    async fn stats(&self) -> Result<Vec<StatusCount>, IdemError> {
        with_conn(self, async |conn| self.records(conn).stats().await).await
    }

    async fn begin_transition(&self) -> Result<Box<dyn TransitionTx>, IdemError> {
        Ok(Box::new(SqlStore::begin(self).await?))
    }
}
