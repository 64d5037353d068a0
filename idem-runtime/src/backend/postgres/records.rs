//! The statements of the Postgres store and the claim protocol's steps on one connection (a pool
//! connection in lease mode, the caller's transaction in transaction mode).
//!
//! Every statement reads the database's clock (`clock_timestamp()`, the wall clock at the moment the
//! statement reads it, never the transaction's start time) plus the test clock's offset, and binds
//! every value. A new key's claim is one statement: in lease mode the insert alone (`INSERT … ON
//! CONFLICT DO NOTHING … RETURNING`, a plain read after it only when the key exists); in
//! transaction mode one statement reads the record and, only when there is none, inserts it the
//! same way. `DO NOTHING` means a concurrent insert of the same key never raises 23505, which would
//! abort the caller's transaction.

use std::time::Duration;

use sqlx::postgres::{PgArguments, PgConnection, PgRow};
use sqlx::{Postgres, Row, SqlStr};

use super::db_error;
use super::statements::Statements;
use crate::sql::claim::{CasRecords, SeenRecord, seen_record};
use crate::store::decide::millis;
use crate::store::{Claim, ClaimRequest, Fence, Record, Status, StatusCount};
use crate::{Busy, IdemError};

/// The store's records, reached through one connection.
pub(super) struct Records<'c> {
    conn: &'c mut PgConnection,
    sql: &'c Statements,
    offset_ms: i64,
    claiming: Claiming,
    /// A transaction-mode claim found its key's lock held by another transaction.
    contended: bool,
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

fn attempt_of(row: &PgRow) -> Result<u32, IdemError> {
    let attempt: i32 = row.try_get("attempt").map_err(db_error)?;
    u32::try_from(attempt).map_err(|_| IdemError::store(format!("attempt {attempt} out of range")))
}

fn fence_of(row: &PgRow) -> Result<u64, IdemError> {
    let fence: i64 = row.try_get("fence").map_err(db_error)?;
    u64::try_from(fence).map_err(|_| IdemError::store(format!("fence {fence} out of range")))
}

/// The record `(biz, key)` from a row with the columns of `load`.
fn record_of(row: &PgRow, biz: &str, key: String) -> Result<Record, IdemError> {
    let status = Status::parse(row.try_get("status").map_err(db_error)?)?;
    let (snapshot, steps) = Record::split_blob(status, row.try_get("result").map_err(db_error)?);
    Ok(Record {
        biz: biz.to_owned(),
        key,
        status,
        attempt: attempt_of(row)?,
        fence: Fence::new(fence_of(row)?),
        fingerprint: row.try_get("fingerprint").map_err(db_error)?,
        snapshot,
        steps,
        lease_until_ms: row.try_get("lease_until").map_err(db_error)?,
        expire_at_ms: row.try_get("expire_at").map_err(db_error)?,
        result_until_ms: row.try_get("result_until").map_err(db_error)?,
    })
}

fn fence_param(claim: &Claim) -> Result<i64, IdemError> {
    i64::try_from(claim.fence.get()).map_err(|_| IdemError::LeaseLost {
        attempt: claim.attempt,
    })
}

type Query<'q> = sqlx::query::Query<'q, Postgres, PgArguments>;

impl<'c> Records<'c> {
    pub(super) fn new(
        conn: &'c mut PgConnection,
        sql: &'c Statements,
        offset_ms: i64,
        claiming: Claiming,
    ) -> Self {
        Records {
            conn,
            sql,
            offset_ms,
            claiming,
            contended: false,
        }
    }

    /// Whether a [`Claiming::Tx`] claim stopped because another transaction holds the key's lock
    /// (its error then says so; claim again with [`Claiming::TxWaiting`]).
    pub(super) fn contended(&self) -> bool {
        self.contended
    }

    /// Changes the record held under `claim` with `query` (complete, fail, renew).
    async fn held(&mut self, query: Query<'_>, claim: &Claim) -> Result<(), IdemError> {
        let done = query.execute(&mut *self.conn).await.map_err(db_error)?;
        if done.rows_affected() == 1 {
            Ok(())
        } else {
            Err(IdemError::LeaseLost {
                attempt: claim.attempt,
            })
        }
    }

    pub(super) async fn complete(
        &mut self,
        biz: &str,
        key: &str,
        claim: &Claim,
        snapshot: &[u8],
        ttl: Duration,
        result_ttl: Option<Duration>,
    ) -> Result<(), IdemError> {
        let query = sqlx::query(self.sql.complete.clone())
            .bind(biz)
            .bind(key)
            .bind(fence_param(claim)?)
            .bind(snapshot)
            .bind(millis(ttl))
            .bind(self.offset_ms)
            .bind(result_ttl.map(millis));
        self.held(query, claim).await
    }

    pub(super) async fn fail(
        &mut self,
        biz: &str,
        key: &str,
        claim: &Claim,
    ) -> Result<(), IdemError> {
        let query = sqlx::query(self.sql.fail.clone())
            .bind(biz)
            .bind(key)
            .bind(fence_param(claim)?)
            .bind(self.offset_ms);
        self.held(query, claim).await
    }

    pub(super) async fn save_steps(
        &mut self,
        biz: &str,
        key: &str,
        claim: &Claim,
        steps: &[u8],
    ) -> Result<(), IdemError> {
        let query = sqlx::query(self.sql.save_steps.clone())
            .bind(biz)
            .bind(key)
            .bind(fence_param(claim)?)
            .bind(steps)
            .bind(self.offset_ms);
        self.held(query, claim).await
    }

    pub(super) async fn renew(
        &mut self,
        biz: &str,
        key: &str,
        claim: &Claim,
        lease: Duration,
    ) -> Result<(), IdemError> {
        let query = sqlx::query(self.sql.renew.clone())
            .bind(biz)
            .bind(key)
            .bind(fence_param(claim)?)
            .bind(millis(lease))
            .bind(self.offset_ms);
        self.held(query, claim).await
    }

    pub(super) async fn load(&mut self, biz: &str, key: &str) -> Result<Option<Record>, IdemError> {
        let Some(row) = sqlx::query(self.sql.load.clone())
            .bind(biz)
            .bind(key)
            .fetch_optional(&mut *self.conn)
            .await
            .map_err(db_error)?
        else {
            return Ok(None);
        };
        record_of(&row, biz, key.to_owned()).map(Some)
    }

    pub(super) async fn stuck(
        &mut self,
        biz: &str,
        batch: usize,
    ) -> Result<Vec<Record>, IdemError> {
        let rows = sqlx::query(self.sql.stuck.clone())
            .bind(biz)
            .bind(self.offset_ms)
            .bind(i64::try_from(batch).unwrap_or(i64::MAX))
            .fetch_all(&mut *self.conn)
            .await
            .map_err(db_error)?;
        rows.iter()
            .map(|row| record_of(row, biz, row.try_get("idem_key").map_err(db_error)?))
            .collect()
    }

    pub(super) async fn stats(&mut self) -> Result<Vec<StatusCount>, IdemError> {
        let rows = sqlx::query(self.sql.stats.clone())
            .bind(self.offset_ms)
            .fetch_all(&mut *self.conn)
            .await
            .map_err(db_error)?;
        let counts = rows
            .iter()
            .map(|row| {
                StatusCount::of_row(
                    row.try_get("biz_type").map_err(db_error)?,
                    row.try_get("origin").map_err(db_error)?,
                    row.try_get("status").map_err(db_error)?,
                    row.try_get("n").map_err(db_error)?,
                    row.try_get("gone").map_err(db_error)?,
                )
            })
            .collect::<Result<Vec<_>, IdemError>>()?;
        Ok(StatusCount::tally(counts))
    }

    pub(super) async fn sweep(&mut self, batch: usize) -> Result<u64, IdemError> {
        let done = sqlx::query(self.sql.sweep.clone())
            .bind(i64::try_from(batch).unwrap_or(i64::MAX))
            .bind(self.offset_ms)
            .execute(&mut *self.conn)
            .await
            .map_err(db_error)?;
        let shrunk = sqlx::query(self.sql.shrink.clone())
            .bind(i64::try_from(batch).unwrap_or(i64::MAX))
            .bind(self.offset_ms)
            .execute(&mut *self.conn)
            .await
            .map_err(db_error)?;
        Ok(done.rows_affected() + shrunk.rows_affected())
    }
}

/// The claim's view of a row with the columns of the claim or the read.
fn seen_of(row: &PgRow) -> Result<SeenRecord, IdemError> {
    Ok(seen_record!(
        row,
        attempt_of(row)?,
        fence_of(row)?,
        db_error
    ))
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

impl Records<'_> {
    /// Lease mode's insert step: the new record, or (the key exists) a plain read of it. While new
    /// keys prevail (the claim order) that is one statement, with no read in it; a key that
    /// exists costs two.
    async fn insert_then_read(
        &mut self,
        req: &ClaimRequest<'_>,
    ) -> Result<(bool, Option<SeenRecord>), IdemError> {
        let row = claim_query(&self.sql.insert, req, self.offset_ms)
            .fetch_optional(&mut *self.conn)
            .await
            .map_err(db_error)?;
        let Some(row) = row else {
            // The key exists (or was deleted since: then the protocol inserts again).
            return Ok((false, self.read(req).await?));
        };
        Ok((
            true,
            Some(SeenRecord {
                status: Status::Processing,
                attempt: attempt_of(&row)?,
                fence: fence_of(&row)?,
                fingerprint: None,
                snapshot: None,
                lease_until_ms: 0,
                expire_at_ms: 0,
                result_until_ms: None,
                now_ms: 0,
            }),
        ))
    }
}

impl CasRecords for Records<'_> {
    async fn read(&mut self, req: &ClaimRequest<'_>) -> Result<Option<SeenRecord>, IdemError> {
        let row = sqlx::query(self.sql.read.clone())
            .bind(req.biz)
            .bind(req.key)
            .bind(self.offset_ms)
            .fetch_optional(&mut *self.conn)
            .await
            .map_err(db_error)?;
        row.as_ref().map(seen_of).transpose()
    }

    async fn insert_or_read(
        &mut self,
        req: &ClaimRequest<'_>,
    ) -> Result<(bool, Option<SeenRecord>), IdemError> {
        let sql = match self.claiming {
            Claiming::Lease => return self.insert_then_read(req).await,
            Claiming::Tx => &self.sql.claim_locking,
            Claiming::TxWaiting => &self.sql.claim_waiting,
        };
        let Some(row) = claim_query(sql, req, self.offset_ms)
            .fetch_optional(&mut *self.conn)
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
        Ok((inserted, Some(seen_of(&row)?)))
    }

    async fn take(
        &mut self,
        req: &ClaimRequest<'_>,
        seen: &SeenRecord,
        reset: bool,
        keep_steps: bool,
    ) -> Result<Option<Claim>, IdemError> {
        let Some(row) = sqlx::query(self.sql.take.clone())
            .bind(req.biz)
            .bind(req.key)
            .bind(req.fingerprint)
            .bind(millis(req.lease))
            .bind(millis(req.ttl))
            .bind(self.offset_ms)
            .bind(reset)
            .bind(i64::try_from(seen.fence).unwrap_or(i64::MAX))
            .bind(seen.status.as_str())
            .bind(seen.lease_until_ms)
            .bind(keep_steps)
            .fetch_optional(&mut *self.conn)
            .await
            .map_err(db_error)?
        else {
            return Ok(None);
        };
        Ok(Some(Claim {
            attempt: attempt_of(&row)?,
            fence: Fence::new(fence_of(&row)?),
        }))
    }
}
