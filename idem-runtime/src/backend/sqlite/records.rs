//! The claim protocol's steps on one connection, with the statements of `statements.rs`.
//!
//! Every statement binds every value, the time included: the store's clock is the clock SQLite's
//! own `unixepoch('subsec')` reads, the system clock of the process that opened the database (an
//! SQLite file is shared only by processes of one machine), read here with the microseconds SQLite
//! leaves out, plus the test clock's offset ([`Records::now`]). Bound, it costs a statement no
//! date function, and a new record needs no read-back: what the insert wrote is what it was given.
//! The table's name is validated ([`TableName`]) and quoted (the templates below say `{t}`).

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sqlx::sqlite::{SqliteArguments, SqliteConnection, SqliteRow};
use sqlx::{Row, Sqlite};

use super::statements::{Statements, query};
use super::{SqliteStore, db_error};
use crate::IdemError;
use crate::sql::claim::{CasRecords, SeenRecord, seen_record};
use crate::store::decide::millis;
use crate::store::{Claim, ClaimRequest, Fence, Record, Status, StatusCount};

/// The store's clock at one instant: what a statement is given for "now".
#[derive(Debug, Clone, Copy)]
struct Now {
    /// Microseconds since the Unix epoch: a new record's fence.
    us: i64,
    /// Milliseconds, the unit of every time column.
    ms: i64,
}

/// `sql` with the parameters every claim statement starts with bound: ?1 biz, ?2 key,
/// ?3 fingerprint, ?4 lease ms, ?5 ttl ms, ?6 now ms, ?7 now µs.
fn claim_query<'q>(
    sql: &Arc<str>,
    req: &ClaimRequest<'q>,
    now: Now,
) -> sqlx::query::Query<'q, Sqlite, SqliteArguments> {
    query(sql)
        .bind(req.biz)
        .bind(req.key)
        .bind(req.fingerprint)
        .bind(millis(req.lease))
        .bind(millis(req.ttl))
        .bind(now.ms)
        .bind(now.us)
}

/// The store's records, reached through one connection.
pub(super) struct Records<'c> {
    conn: &'c mut SqliteConnection,
    sql: &'c Statements,
    offset_ms: i64,
}

fn attempt_of(row: &SqliteRow) -> Result<u32, IdemError> {
    let attempt: i64 = row.try_get("attempt").map_err(db_error)?;
    u32::try_from(attempt).map_err(|_| IdemError::store(format!("attempt {attempt} out of range")))
}

fn fence_of(row: &SqliteRow) -> Result<u64, IdemError> {
    let fence: i64 = row.try_get("fence").map_err(db_error)?;
    u64::try_from(fence).map_err(|_| IdemError::store(format!("fence {fence} out of range")))
}

/// The record `(biz, key)` from a row with the columns of `LOAD`.
fn record_of(row: &SqliteRow, biz: &str, key: String) -> Result<Record, IdemError> {
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

impl<'c> Records<'c> {
    pub(super) fn new(conn: &'c mut SqliteConnection, store: &'c SqliteStore) -> Self {
        Records {
            conn,
            sql: &store.sql,
            offset_ms: store.offset_ms(),
        }
    }

    /// The store's clock now: the system clock, which SQLite's `unixepoch()` reads too, plus
    /// the test clock's offset.
    fn now(&self) -> Now {
        let wall = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX));
        let us = wall.saturating_add(self.offset_ms.saturating_mul(1000));
        Now {
            us,
            ms: us.div_euclid(1000),
        }
    }

    /// Changes the record held under `claim` with `sql` (complete, fail, renew).
    async fn held(
        &mut self,
        query: sqlx::query::Query<'_, Sqlite, SqliteArguments>,
        claim: &Claim,
    ) -> Result<(), IdemError> {
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
        let query = query(&self.sql.complete)
            .bind(biz)
            .bind(key)
            .bind(fence_param(claim)?)
            .bind(snapshot)
            .bind(millis(ttl))
            .bind(self.now().ms)
            .bind(result_ttl.map(millis));
        self.held(query, claim).await
    }

    pub(super) async fn fail(
        &mut self,
        biz: &str,
        key: &str,
        claim: &Claim,
    ) -> Result<(), IdemError> {
        let query = query(&self.sql.fail)
            .bind(biz)
            .bind(key)
            .bind(fence_param(claim)?)
            .bind(self.now().ms);
        self.held(query, claim).await
    }

    pub(super) async fn save_steps(
        &mut self,
        biz: &str,
        key: &str,
        claim: &Claim,
        steps: &[u8],
    ) -> Result<(), IdemError> {
        let query = query(&self.sql.save_steps)
            .bind(biz)
            .bind(key)
            .bind(fence_param(claim)?)
            .bind(steps)
            .bind(self.now().ms);
        self.held(query, claim).await
    }

    pub(super) async fn renew(
        &mut self,
        biz: &str,
        key: &str,
        claim: &Claim,
        lease: Duration,
    ) -> Result<(), IdemError> {
        let query = query(&self.sql.renew)
            .bind(biz)
            .bind(key)
            .bind(fence_param(claim)?)
            .bind(millis(lease))
            .bind(self.now().ms);
        self.held(query, claim).await
    }

    pub(super) async fn load(&mut self, biz: &str, key: &str) -> Result<Option<Record>, IdemError> {
        let Some(row) = query(&self.sql.load)
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
        let rows = query(&self.sql.stuck)
            .bind(biz)
            .bind(self.now().ms)
            .bind(i64::try_from(batch).unwrap_or(i64::MAX))
            .fetch_all(&mut *self.conn)
            .await
            .map_err(db_error)?;
        rows.iter()
            .map(|row| record_of(row, biz, row.try_get("idem_key").map_err(db_error)?))
            .collect()
    }

    pub(super) async fn stats(&mut self) -> Result<Vec<StatusCount>, IdemError> {
        let rows = query(&self.sql.stats)
            .bind(self.now().ms)
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
        let done = query(&self.sql.sweep)
            .bind(i64::try_from(batch).unwrap_or(i64::MAX))
            .bind(self.now().ms)
            .execute(&mut *self.conn)
            .await
            .map_err(db_error)?;
        let shrunk = query(&self.sql.shrink)
            .bind(i64::try_from(batch).unwrap_or(i64::MAX))
            .bind(self.now().ms)
            .execute(&mut *self.conn)
            .await
            .map_err(db_error)?;
        Ok(done.rows_affected() + shrunk.rows_affected())
    }

    /// The new record `INSERT_NEW` made, or `None` when the key exists (the claim protocol then
    /// decides it).
    pub(super) async fn insert_new(
        &mut self,
        req: &ClaimRequest<'_>,
    ) -> Result<Option<SeenRecord>, IdemError> {
        let now = self.now();
        let done = claim_query(&self.sql.insert_new, req, now)
            .execute(&mut *self.conn)
            .await
            .map_err(db_error)?;
        Ok((done.rows_affected() == 1).then(|| inserted(req, now)))
    }
}

/// The record a claim's insert wrote, from what it bound (`insert_new`).
fn inserted(req: &ClaimRequest<'_>, now: Now) -> SeenRecord {
    SeenRecord {
        status: Status::Processing,
        attempt: 1,
        fence: u64::try_from(now.us).unwrap_or(0),
        fingerprint: req.fingerprint.map(str::to_owned),
        snapshot: None,
        lease_until_ms: now.ms + millis(req.lease),
        expire_at_ms: now.ms + millis(req.ttl),
        result_until_ms: None,
        now_ms: now.ms,
    }
}

/// The claim's view of a row with the columns of `CLAIM`, `INSERT_NEW` or `READ`.
fn seen_of(row: &SqliteRow) -> Result<SeenRecord, IdemError> {
    Ok(seen_record!(
        row,
        attempt_of(row)?,
        fence_of(row)?,
        db_error
    ))
}

impl CasRecords for Records<'_> {
    async fn read(&mut self, req: &ClaimRequest<'_>) -> Result<Option<SeenRecord>, IdemError> {
        let row = query(&self.sql.read)
            .bind(req.biz)
            .bind(req.key)
            .bind(self.now().ms)
            .fetch_optional(&mut *self.conn)
            .await
            .map_err(db_error)?;
        row.as_ref().map(seen_of).transpose()
    }

    async fn insert_or_read(
        &mut self,
        req: &ClaimRequest<'_>,
    ) -> Result<(bool, Option<SeenRecord>), IdemError> {
        let now = self.now();
        let Some(row) = claim_query(&self.sql.claim, req, now)
            .fetch_optional(&mut *self.conn)
            .await
            .map_err(db_error)?
        else {
            return Ok((false, None));
        };
        let inserted_now: i64 = row.try_get("inserted").map_err(db_error)?;
        Ok(if inserted_now == 1 {
            (true, Some(inserted(req, now)))
        } else {
            (false, Some(seen_of(&row)?))
        })
    }

    async fn take(
        &mut self,
        req: &ClaimRequest<'_>,
        seen: &SeenRecord,
        reset: bool,
        keep_steps: bool,
    ) -> Result<Option<Claim>, IdemError> {
        let Some(row) = claim_query(&self.sql.take, req, self.now())
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
