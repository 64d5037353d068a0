//! The Postgres store's part of the record layer (`sql/records.rs`): how its columns read, and
//! the claim's insert and takeover on one connection (a pool connection in lease mode, the
//! caller's transaction in transaction mode).
//!
//! Every statement reads the database's clock (`clock_timestamp()`, the wall clock at the moment the
//! statement reads it, never the transaction's start time) plus the test clock's offset, and binds
//! every value. A new key's claim is one statement: in lease mode the insert alone (`INSERT … ON
//! CONFLICT DO NOTHING … RETURNING`, a plain read after it only when the key exists); in
//! transaction mode the same insert under the key's advisory lock, then, only when it inserted
//! nothing, one statement that reads the record with a row lock and inserts it when there is none.
//! `DO NOTHING` means a concurrent insert of the same key never raises 23505, which would
//! abort the caller's transaction.

use sqlx::postgres::{PgArguments, PgQueryResult, PgRow};
use sqlx::{Postgres, Row, SqlStr};

use super::db_error;
use super::statements::Statements;
use crate::sql::claim::{CasRecords, SeenRecord};
use crate::sql::dialect::Dialect;
use crate::sql::records::{RecordConn, RecordDb, in_range};
use crate::store::decide::millis;
use crate::store::{Claim, ClaimRequest};
use crate::{Busy, IdemError};

impl RecordDb for Postgres {
    const DIALECT: Dialect = Dialect::Postgres;

    /// The statements add the offset to `clock_timestamp()`.
    fn clock(offset_ms: i64) -> i64 {
        offset_ms
    }

    fn attempt(row: &PgRow) -> Result<u32, IdemError> {
        in_range(
            row.try_get::<i32, _>("attempt").map_err(db_error)?.into(),
            "attempt",
        )
    }

    fn fence(row: &PgRow) -> Result<u64, IdemError> {
        in_range(row.try_get("fence").map_err(db_error)?, "fence")
    }

    fn rows_affected(done: &PgQueryResult) -> u64 {
        done.rows_affected()
    }

    /// `text` cannot hold NUL.
    fn holds(text: &str) -> bool {
        !text.contains('\0')
    }
}

/// The claim's steps on one connection: the record layer's read, and this store's insert and
/// takeover.
pub(crate) struct Claims<'c> {
    records: RecordConn<'c, Postgres>,
    sql: &'c Statements,
    claiming: Claiming,
    /// A transaction-mode claim found its key's lock held by another transaction.
    contended: bool,
    /// Transaction mode: the idle bound the claim puts in force, in milliseconds as text
    /// (`None`: none, the transaction's setting left as it is).
    idle_ms: Option<String>,
}

/// How a claim's insert step locks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Claiming {
    /// Lease mode: no lock (each statement commits on its own).
    Lease,
    /// Transaction mode: the key's advisory lock if it is free, then the row (`claim_locking`).
    Tx,
    /// Transaction mode, waiting for the key's lock (`claim_waiting`).
    TxWaiting,
}

type Query<'q> = sqlx::query::Query<'q, Postgres, PgArguments>;

impl<'c> Claims<'c> {
    pub(super) fn new(
        records: RecordConn<'c, Postgres>,
        sql: &'c Statements,
        claiming: Claiming,
    ) -> Self {
        Claims {
            records,
            sql,
            claiming,
            contended: false,
            idle_ms: None,
        }
    }

    /// The same claim, putting `idle` in force for the rest of the transaction when it runs in
    /// transaction mode (`idle_in_transaction_session_timeout`, whole milliseconds rounded up).
    pub(super) fn bounding_idle(mut self, idle: Option<std::time::Duration>) -> Self {
        self.idle_ms = idle.map(|d| d.as_micros().div_ceil(1000).max(1).to_string());
        self
    }

    /// `query` with the idle bound bound as its `$7`, for a transaction-mode claim's statements.
    fn bound<'q>(&self, query: Query<'q>) -> Query<'q> {
        match self.claiming {
            Claiming::Lease => query,
            Claiming::Tx | Claiming::TxWaiting => query.bind(self.idle_ms.clone()),
        }
    }

    /// Whether a [`Claiming::Tx`] claim stopped because another transaction holds the key's lock
    /// (its error then says so; claim again with [`Claiming::TxWaiting`]).
    pub(super) fn contended(&self) -> bool {
        self.contended
    }
}

/// `sql` (a claim or the insert) with its binds: $1 biz, $2 key, $3 fingerprint, $4 lease ms,
/// $5 ttl ms, $6 clock offset ms.
fn claim_query<'q>(sql: &SqlStr, req: &ClaimRequest<'q>, offset_ms: i64) -> Query<'q> {
    sqlx::query(sql.clone())
        .bind(req.biz)
        .bind(req.key)
        .bind(req.fingerprint)
        .bind(millis(req.lease))
        .bind(millis(req.ttl))
        .bind(offset_ms)
}

impl Claims<'_> {
    /// Lease mode's insert step: the new record, or (the key exists) a plain read of it. While new
    /// keys prevail (the claim order) that is one statement, with no read in it; a key that
    /// exists costs two.
    async fn insert_then_read(
        &mut self,
        req: &ClaimRequest<'_>,
    ) -> Result<(bool, Option<SeenRecord>), IdemError> {
        let sql = self.sql;
        match self.inserted(&sql.insert, req).await? {
            Some(seen) => Ok((true, Some(seen))),
            // The key exists (or was deleted since: then the protocol inserts again).
            None => Ok((false, self.records.read(req).await?)),
        }
    }

    /// `sql` (`insert` or `insert_locking`): the new record's claim, or `None` when it inserted
    /// nothing.
    async fn inserted(
        &mut self,
        sql: &SqlStr,
        req: &ClaimRequest<'_>,
    ) -> Result<Option<SeenRecord>, IdemError> {
        let offset = self.records.offset();
        let row = self
            .bound(claim_query(sql, req, offset))
            .fetch_optional(self.records.conn())
            .await
            .map_err(db_error)?;
        let Some(row) = row else {
            return Ok(None);
        };
        Ok(Some(SeenRecord::inserted(
            Postgres::attempt(&row)?,
            Postgres::fence(&row)?,
        )))
    }
}

impl CasRecords for Claims<'_> {
    /// A batch of marks in one statement.
    async fn complete_many(
        &mut self,
        biz: &str,
        marks: &[crate::store::BatchMark<'_>],
        ttl: std::time::Duration,
    ) -> Result<Vec<Result<(), IdemError>>, IdemError> {
        let keys: Vec<&str> = marks.iter().map(|m| m.key).collect();
        let fences: Vec<i64> = marks
            .iter()
            .map(|m| i64::try_from(m.claim.fence.get()).unwrap_or(i64::MAX))
            .collect();
        let results: Vec<&[u8]> = marks.iter().map(|m| m.snapshot).collect();
        let kept: Vec<Option<i64>> = marks.iter().map(|m| m.result_ttl.map(millis)).collect();
        let rows = sqlx::query(self.sql.complete_many.clone())
            .bind(biz)
            .bind(&keys)
            .bind(&fences)
            .bind(&results)
            .bind(&kept)
            .bind(millis(ttl))
            .bind(self.records.offset())
            .fetch_all(self.records.conn())
            .await
            .map_err(db_error)?;
        RecordConn::<Postgres>::marked(&rows, marks)
    }

    async fn read(&mut self, req: &ClaimRequest<'_>) -> Result<Option<SeenRecord>, IdemError> {
        self.records.read(req).await
    }

    async fn insert_or_read(
        &mut self,
        req: &ClaimRequest<'_>,
    ) -> Result<(bool, Option<SeenRecord>), IdemError> {
        let sql = match self.claiming {
            Claiming::Lease => return self.insert_then_read(req).await,
            Claiming::Tx => {
                // A new key, the common case while new keys prevail: the plain insert under the
                // key's lock. Nothing inserted: the full claim below reads the record (or finds the
                // lock another transaction's; this transaction may hold it already, which a second
                // try grants again).
                let statements = self.sql;
                if let Some(seen) = self.inserted(&statements.insert_locking, req).await? {
                    return Ok((true, Some(seen)));
                }
                &statements.claim_locking
            }
            Claiming::TxWaiting => &self.sql.claim_waiting,
        };
        let offset = self.records.offset();
        let Some(row) = self
            .bound(claim_query(sql, req, offset))
            .fetch_optional(self.records.conn())
            .await
            .map_err(db_error)?
        else {
            // Another transaction inserted the key after this statement's snapshot was taken (the
            // insert waited for it and skipped): read again.
            return Ok((false, None));
        };
        if self.claiming != Claiming::Lease && !row.try_get::<bool, _>("got").map_err(db_error)? {
            self.contended = true;
            return Err(IdemError::busy(
                Busy::LockTimeout,
                "another transaction holds this key's claim",
            ));
        }
        let inserted: bool = row.try_get("inserted").map_err(db_error)?;
        Ok((inserted, Some(RecordConn::<Postgres>::seen(&row)?)))
    }

    async fn insert_many(
        &mut self,
        reqs: &[ClaimRequest<'_>],
    ) -> Result<Option<Vec<Option<Claim>>>, IdemError> {
        let Some(first) = reqs.first() else {
            return Ok(Some(Vec::new()));
        };
        // In key order, as every batch inserts: two batches with keys in common lock them in
        // the same order, so they wait for each other rather than deadlock.
        let mut sorted: Vec<&ClaimRequest<'_>> = reqs.iter().collect();
        sorted.sort_unstable_by_key(|r| r.key);
        let keys: Vec<&str> = sorted.iter().map(|r| r.key).collect();
        let fingerprints: Vec<Option<&str>> = sorted.iter().map(|r| r.fingerprint).collect();
        let rows = sqlx::query(self.sql.insert_many.clone())
            .bind(first.biz)
            .bind(&keys)
            .bind(&fingerprints)
            .bind(millis(first.lease))
            .bind(millis(first.ttl))
            .bind(self.records.offset())
            .fetch_all(self.records.conn())
            .await
            .map_err(db_error)?;
        let mut inserted = std::collections::HashMap::with_capacity(rows.len());
        for row in &rows {
            let key: String = row.try_get("idem_key").map_err(db_error)?;
            let claim = Claim {
                attempt: Postgres::attempt(row)?,
                fence: crate::store::Fence::new(Postgres::fence(row)?),
            };
            inserted.insert(key, claim);
        }
        Ok(Some(reqs.iter().map(|r| inserted.remove(r.key)).collect()))
    }

    async fn read_many(
        &mut self,
        reqs: &[ClaimRequest<'_>],
    ) -> Result<Vec<Option<SeenRecord>>, IdemError> {
        let Some(first) = reqs.first() else {
            return Ok(Vec::new());
        };
        // A key Postgres cannot hold (NUL) was never stored: not asked.
        let keys: Vec<&str> = reqs
            .iter()
            .map(|r| r.key)
            .filter(|k| Postgres::holds(k))
            .collect();
        if !Postgres::holds(first.biz) || keys.is_empty() {
            return Ok(reqs.iter().map(|_| None).collect());
        }
        let rows = sqlx::query(self.sql.read_many.clone())
            .bind(first.biz)
            .bind(&keys)
            .bind(self.records.offset())
            .fetch_all(self.records.conn())
            .await
            .map_err(db_error)?;
        RecordConn::<Postgres>::seen_by_key(&rows, reqs)
    }

    async fn take(
        &mut self,
        req: &ClaimRequest<'_>,
        seen: &SeenRecord,
        reset: bool,
        keep_steps: bool,
    ) -> Result<Option<Claim>, IdemError> {
        let query = claim_query(&self.sql.take, req, self.records.offset());
        self.records
            .take_returning(query, seen, reset, keep_steps)
            .await
    }
}
