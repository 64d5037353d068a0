//! The SQLite store's part of the record layer (`sql/records.rs`): its clock, how its columns
//! read, and the claim's insert and takeover on one connection, with the statements of
//! `statements.rs`.
//!
//! Every statement binds every value, the time included: the store's clock is the clock SQLite's
//! own `unixepoch('subsec')` reads, the system clock of the process that opened the database (an
//! SQLite file is shared only by processes of one machine), read here with the microseconds SQLite
//! leaves out, plus the test clock's offset (`Now::read`). Bound, it costs a statement no
//! date function, and a new record needs no read-back: what the insert wrote is what it was given.
//! The table's name is validated (`TableName`) and quoted (the templates below say `{t}`).

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use sqlx::sqlite::{SqliteArguments, SqliteQueryResult, SqliteRow};
use sqlx::{Row, Sqlite};

use super::db_error;
use super::statements::{Statements, query};
use crate::IdemError;
use crate::sql::claim::{CasRecords, SeenRecord};
use crate::sql::dialect::Dialect;
use crate::sql::records::{RecordConn, RecordDb, in_range};
use crate::store::decide::millis;
use crate::store::{Claim, ClaimRequest, Status};

/// The store's clock at one instant: what a statement is given for "now".
#[derive(Debug, Clone, Copy)]
struct Now {
    /// Microseconds since the Unix epoch: a new record's fence.
    us: i64,
    /// Milliseconds, the unit of every time column.
    ms: i64,
}

impl Now {
    /// The store's clock now: the system clock, which SQLite's `unixepoch()` reads too, plus
    /// the test clock's offset.
    fn read(offset_ms: i64) -> Now {
        let wall = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX));
        let us = wall.saturating_add(offset_ms.saturating_mul(1000));
        Now {
            us,
            ms: us.div_euclid(1000),
        }
    }
}

impl RecordDb for Sqlite {
    const DIALECT: Dialect = Dialect::SQLite;

    /// The statements are given the time itself.
    fn clock(offset_ms: i64) -> i64 {
        Now::read(offset_ms).ms
    }

    fn attempt(row: &SqliteRow) -> Result<u32, IdemError> {
        in_range(row.try_get("attempt").map_err(db_error)?, "attempt")
    }

    fn fence(row: &SqliteRow) -> Result<u64, IdemError> {
        in_range(row.try_get("fence").map_err(db_error)?, "fence")
    }

    fn rows_affected(done: &SqliteQueryResult) -> u64 {
        done.rows_affected()
    }
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

/// The claim's steps on one connection: the record layer's read, and this store's insert and
/// takeover.
pub(crate) struct Claims<'c> {
    records: RecordConn<'c, Sqlite>,
    sql: &'c Statements,
}

impl<'c> Claims<'c> {
    pub(super) fn new(records: RecordConn<'c, Sqlite>, sql: &'c Statements) -> Self {
        Claims { records, sql }
    }

    fn now(&self) -> Now {
        Now::read(self.records.offset())
    }

    /// The new record `INSERT_NEW` made, or `None` when the key exists (the claim protocol then
    /// decides it).
    pub(super) async fn insert_new(
        &mut self,
        req: &ClaimRequest<'_>,
    ) -> Result<Option<SeenRecord>, IdemError> {
        let now = self.now();
        let done = claim_query(&self.sql.insert_new, req, now)
            .execute(self.records.conn())
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

impl CasRecords for Claims<'_> {
    /// A batch of marks in one statement (`COMPLETE_MANY`).
    async fn complete_many(
        &mut self,
        biz: &str,
        marks: &[crate::store::BatchMark<'_>],
        ttl: std::time::Duration,
    ) -> Result<Vec<Result<(), IdemError>>, IdemError> {
        let items: Vec<(&str, u64, String, Option<i64>)> = marks
            .iter()
            .map(|m| {
                (
                    m.key,
                    m.claim.fence.get(),
                    crate::sql::records::hex_digits(m.snapshot),
                    m.result_ttl.map(millis),
                )
            })
            .collect();
        let items = serde_json::to_string(&items).map_err(IdemError::store)?;
        let rows = query(&self.sql.complete_many)
            .bind(biz)
            .bind(millis(ttl))
            .bind(self.now().ms)
            .bind(items)
            .fetch_all(self.records.conn())
            .await
            .map_err(db_error)?;
        RecordConn::<Sqlite>::marked(&rows, marks)
    }

    async fn read(&mut self, req: &ClaimRequest<'_>) -> Result<Option<SeenRecord>, IdemError> {
        self.records.read(req).await
    }

    /// One `INSERT … SELECT … FROM json_each(…) … RETURNING idem_key`: every new record has the
    /// same fence, the clock bound.
    async fn insert_many(
        &mut self,
        reqs: &[ClaimRequest<'_>],
    ) -> Result<Option<Vec<Option<Claim>>>, IdemError> {
        let Some(first) = reqs.first() else {
            return Ok(Some(Vec::new()));
        };
        let items: Vec<(&str, Option<&str>)> =
            reqs.iter().map(|r| (r.key, r.fingerprint)).collect();
        let items = serde_json::to_string(&items).map_err(IdemError::store)?;
        let now = self.now();
        let rows = query(&self.sql.insert_many)
            .bind(first.biz)
            .bind(items)
            .bind(None::<i64>)
            .bind(millis(first.lease))
            .bind(millis(first.ttl))
            .bind(now.ms)
            .bind(now.us)
            .fetch_all(self.records.conn())
            .await
            .map_err(db_error)?;
        let mut inserted = std::collections::HashSet::with_capacity(rows.len());
        for row in &rows {
            inserted.insert(row.try_get::<String, _>("idem_key").map_err(db_error)?);
        }
        let claim = Claim {
            attempt: 1,
            fence: crate::store::Fence::new(u64::try_from(now.us).unwrap_or(0)),
        };
        Ok(Some(
            reqs.iter()
                .map(|r| inserted.contains(r.key).then_some(claim))
                .collect(),
        ))
    }

    /// One `SELECT … WHERE idem_key IN (SELECT value FROM json_each(…))`.
    async fn read_many(
        &mut self,
        reqs: &[ClaimRequest<'_>],
    ) -> Result<Vec<Option<SeenRecord>>, IdemError> {
        let Some(first) = reqs.first() else {
            return Ok(Vec::new());
        };
        let keys: Vec<&str> = reqs.iter().map(|r| r.key).collect();
        let keys = serde_json::to_string(&keys).map_err(IdemError::store)?;
        let rows = query(&self.sql.read_many)
            .bind(first.biz)
            .bind(keys)
            .bind(self.now().ms)
            .fetch_all(self.records.conn())
            .await
            .map_err(db_error)?;
        RecordConn::<Sqlite>::seen_by_key(&rows, reqs)
    }

    async fn insert_or_read(
        &mut self,
        req: &ClaimRequest<'_>,
    ) -> Result<(bool, Option<SeenRecord>), IdemError> {
        let now = self.now();
        let Some(row) = claim_query(&self.sql.claim, req, now)
            .fetch_optional(self.records.conn())
            .await
            .map_err(db_error)?
        else {
            return Ok((false, None));
        };
        let inserted_now: i64 = row.try_get("inserted").map_err(db_error)?;
        Ok(if inserted_now == 1 {
            (true, Some(inserted(req, now)))
        } else {
            (false, Some(RecordConn::<Sqlite>::seen(&row)?))
        })
    }

    async fn take(
        &mut self,
        req: &ClaimRequest<'_>,
        seen: &SeenRecord,
        reset: bool,
        keep_steps: bool,
    ) -> Result<Option<Claim>, IdemError> {
        let query = claim_query(&self.sql.take, req, self.now());
        self.records
            .take_returning(query, seen, reset, keep_steps)
            .await
    }
}
