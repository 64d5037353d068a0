//! The statements of the SQLite store and the claim protocol's steps on one connection.
//!
//! Every statement reads the database's clock (plus the test clock's offset) and binds every value;
//! the table's name is validated ([`TableName`]) and quoted (the templates below say `{t}`).
//! A claim is one round trip: the read of the record and, only when there is none, the insert (see
//! `CLAIM`).

use std::sync::Arc;
use std::time::Duration;

use sqlx::sqlite::{SqliteArguments, SqliteConnection, SqliteRow};
use sqlx::{AssertSqlSafe, Row, Sqlite};

use super::{SqliteStore, db_error};
use crate::IdemError;
use crate::sql::claim::{CasRecords, SeenRecord, seen_record};
use crate::sql::dialect::Dialect;
use crate::sql::table::TableName;
use crate::store::decide::millis;
use crate::store::{Claim, ClaimRequest, Fence, Record, Status, StatusCount};

/// The database clock in milliseconds since the Unix epoch (`Dialect::SQLite.now_ms()`).
macro_rules! now_ms {
    () => {
        "CAST(unixepoch('subsec') * 1000 AS INTEGER)"
    };
}

/// A fence from the clock: microseconds, the sub-millisecond part random (SQLite's clock has
/// millisecond resolution).
macro_rules! clock_fence {
    () => {
        "c.n * 1000 + abs(random() % 1000)"
    };
}

/// The clock with the test clock's offset `?6`, written out where a statement needs it: SQLite
/// reads "now" once per `sqlite3_step`, so every use in one statement sees the same instant,
/// without the `FROM (SELECT …) AS c` join that costs an insert or an update a temporary table.
macro_rules! now_6 {
    () => {
        "(CAST(unixepoch('subsec') * 1000 AS INTEGER) + ?6)"
    };
}

/// The record's columns as the claim reads them.
macro_rules! record_columns {
    () => {
        "status, attempt, fence, fingerprint, result, lease_until, expire_at, "
    };
}

/// Inserts a new record unless one exists, then reads it back only if this insert really
/// happened (`changes()`): when the key exists (or another connection inserted first) the insert
/// skips on the unique key and no row comes back. (Reading the new row back with a second SELECT
/// is ~15 % faster through sqlx than `INSERT … RETURNING`.)
macro_rules! insert_then_read_back {
    () => {
        concat!(
            "INSERT INTO {t} (biz_type, idem_key, status, attempt, fence, fingerprint, result, ",
            "lease_until, created_at, updated_at, expire_at) ",
            "VALUES (?1, ?2, 'PROCESSING', 1, ",
            now_6!(),
            " * 1000 + abs(random() % 1000), ?3, NULL, ",
            now_6!(),
            " + ?4, ",
            now_6!(),
            ", ",
            now_6!(),
            ", ",
            now_6!(),
            " + ?5) ",
            "ON CONFLICT (biz_type, idem_key) DO NOTHING; ",
            "SELECT ",
            record_columns!(),
            "created_at AS now_ms, 1 AS inserted ",
            "FROM {t} WHERE biz_type = ?1 AND idem_key = ?2 AND changes() = 1"
        )
    };
}

/// ?1 biz, ?2 key, ?3 fingerprint, ?4 lease ms, ?5 ttl ms, ?6 clock offset ms.
///
/// Read the record; if there is none, insert a new one and read that. All in one round trip: the
/// claim fetches one row, and sqlx stops a batch at the row a `fetch_optional` asked for, so when
/// the record exists (a repeat) only the first read runs: one read, no write lock. Otherwise the
/// insert runs ([`insert_then_read_back`]), and when another connection inserted first no row
/// comes back and the claim reads again.
const CLAIM: &str = concat!(
    "SELECT ",
    record_columns!(),
    now_ms!(),
    " + ?6 AS now_ms, 0 AS inserted ",
    "FROM {t} WHERE biz_type = ?1 AND idem_key = ?2; ",
    insert_then_read_back!()
);
/// ?1 biz, ?2 key, ?3 fingerprint, ?4 lease ms, ?5 ttl ms, ?6 clock offset ms: a new record's
/// insert alone (no read before it), for a claim sent while new keys prevail (`store/order.rs`):
/// the new row, or none when the key exists.
const INSERT_NEW: &str = insert_then_read_back!();
/// ?1 biz, ?2 key, ?3 fingerprint, ?4 lease ms, ?5 ttl ms, ?6 offset, ?7 reset, ?8 seen fence,
/// ?9 seen status, ?10 seen lease end, ?11 keep the saved steps (`result` of an unfinished record).
const TAKE: &str = concat!(
    "UPDATE {t} SET status = 'PROCESSING', ",
    "attempt = CASE WHEN ?7 THEN 1 ELSE attempt + 1 END, ",
    "fence = max(fence + 1, ",
    clock_fence!(),
    "), fingerprint = ?3, result = CASE WHEN ?11 THEN result END, lease_until = c.n + ?4, updated_at = c.n, ",
    "created_at = CASE WHEN ?7 THEN c.n ELSE created_at END, ",
    "expire_at = CASE WHEN ?7 THEN c.n + ?5 ELSE max(expire_at, c.n + ?4) END ",
    "FROM (SELECT ",
    now_ms!(),
    " + ?6 AS n) AS c ",
    "WHERE biz_type = ?1 AND idem_key = ?2 AND fence = ?8 AND status = ?9 AND lease_until = ?10 ",
    "RETURNING attempt, fence"
);
/// ?1 biz, ?2 key, ?3 fence, ?4 result, ?5 ttl ms, ?6 offset. The mark moves the expiry to at
/// least now + ttl, so a body slower than its ttl still leaves a live success. A record already
/// SUCCEEDED under the fence counts as held and keeps its result and expiry: a mark sent again
/// after a lost reply succeeds (and FAILED likewise for `FAIL`).
const COMPLETE: &str = concat!(
    "UPDATE {t} SET result = CASE WHEN status = 'PROCESSING' THEN ?4 ELSE result END, ",
    "expire_at = CASE WHEN status = 'PROCESSING' THEN max(expire_at, ",
    now_6!(),
    " + ?5) ELSE expire_at END, ",
    "status = 'SUCCEEDED', updated_at = ",
    now_6!(),
    " WHERE biz_type = ?1 AND idem_key = ?2 AND fence = ?3 AND status IN ('PROCESSING', 'SUCCEEDED')"
);
/// ?1 biz, ?2 key, ?3 fence, ?4 offset. The saved steps (in `result`) stay for a retry.
const FAIL: &str = concat!(
    "UPDATE {t} SET status = 'FAILED', updated_at = ",
    now_ms!(),
    " + ?4 WHERE biz_type = ?1 AND idem_key = ?2 AND fence = ?3 AND status IN ('PROCESSING', 'FAILED')"
);
/// ?1 biz, ?2 key, ?3 fence, ?4 steps, ?5 offset. The steps of an unfinished record live in
/// `result` until a success replaces them.
const SAVE_STEPS: &str = concat!(
    "UPDATE {t} SET result = ?4, updated_at = ",
    now_ms!(),
    " + ?5 WHERE biz_type = ?1 AND idem_key = ?2 AND fence = ?3 AND status = 'PROCESSING'"
);
/// ?1 biz, ?2 key, ?3 fence, ?4 lease ms, ?5 offset.
const RENEW: &str = concat!(
    "UPDATE {t} SET lease_until = c.n + ?4, expire_at = max(expire_at, c.n + ?4), ",
    "updated_at = c.n FROM (SELECT ",
    now_ms!(),
    " + ?5 AS n) AS c ",
    "WHERE biz_type = ?1 AND idem_key = ?2 AND fence = ?3 AND status = 'PROCESSING'"
);
/// ?1 biz, ?2 key, ?3 offset: the claim's plain read (`store/order.rs`).
const READ: &str = concat!(
    "SELECT ",
    record_columns!(),
    now_ms!(),
    " + ?3 AS now_ms FROM {t} WHERE biz_type = ?1 AND idem_key = ?2"
);
const LOAD: &str = "SELECT status, attempt, fence, fingerprint, result, lease_until, expire_at \
    FROM {t} WHERE biz_type = ?1 AND idem_key = ?2";
/// ?1 biz, ?2 offset, ?3 batch. PROCESSING with the lease ended, oldest lease first: a range of
/// the index `<table>_stuck (biz_type, status, lease_until)`, read in its order (no sort), that
/// stops after the batch.
const STUCK: &str = concat!(
    "SELECT idem_key, status, attempt, fence, fingerprint, result, lease_until, expire_at ",
    "FROM {t} WHERE biz_type = ?1 AND status = 'PROCESSING' AND lease_until <= ",
    now_ms!(),
    " + ?2 ORDER BY lease_until LIMIT ?3"
);
/// Records per business type and status (expired ones not yet swept included): a scan of the
/// index `<table>_stuck (biz_type, status, lease_until)`, which starts with both.
const STATS: &str = "SELECT biz_type, status, COUNT(*) AS n FROM {t} GROUP BY biz_type, status";
/// ?1 batch, ?2 offset. Expired: the TTL passed and no lease is live.
const SWEEP: &str = concat!(
    "DELETE FROM {t} WHERE (biz_type, idem_key) IN (",
    "SELECT biz_type, idem_key FROM {t}, (SELECT ",
    now_ms!(),
    " + ?2 AS n) AS c ",
    "WHERE expire_at <= c.n AND NOT (status = 'PROCESSING' AND lease_until > c.n) LIMIT ?1)"
);

/// The statements for one records table, built once per store from the templates above with
/// the table's quoted name in place of `{t}` (each is prepared once per connection and cached by
/// sqlx, so a name in their text costs nothing per call).
#[derive(Debug)]
pub(super) struct Statements {
    claim: Arc<str>,
    insert_new: Arc<str>,
    read: Arc<str>,
    take: Arc<str>,
    complete: Arc<str>,
    fail: Arc<str>,
    save_steps: Arc<str>,
    renew: Arc<str>,
    load: Arc<str>,
    stuck: Arc<str>,
    stats: Arc<str>,
    sweep: Arc<str>,
}

impl Statements {
    pub(super) fn new(table: &TableName) -> Self {
        let t = table.quoted(Dialect::SQLite);
        let named = |template: &str| -> Arc<str> { template.replace("{t}", &t).into() };
        Statements {
            claim: named(CLAIM),
            insert_new: named(INSERT_NEW),
            read: named(READ),
            take: named(TAKE),
            complete: named(COMPLETE),
            fail: named(FAIL),
            save_steps: named(SAVE_STEPS),
            renew: named(RENEW),
            load: named(LOAD),
            stuck: named(STUCK),
            stats: named(STATS),
            sweep: named(SWEEP),
        }
    }
}

/// A statement of the store as a sqlx query.
pub(super) fn query(sql: &Arc<str>) -> sqlx::query::Query<'static, Sqlite, SqliteArguments> {
    sqlx::query(AssertSqlSafe(sql.clone()))
}

/// `sql` with the parameters every claim statement starts with bound: ?1 biz, ?2 key,
/// ?3 fingerprint, ?4 lease ms, ?5 ttl ms, ?6 clock offset ms.
fn claim_query<'q>(
    sql: &Arc<str>,
    req: &ClaimRequest<'q>,
    offset_ms: i64,
) -> sqlx::query::Query<'q, Sqlite, SqliteArguments> {
    query(sql)
        .bind(req.biz)
        .bind(req.key)
        .bind(req.fingerprint)
        .bind(millis(req.lease))
        .bind(millis(req.ttl))
        .bind(offset_ms)
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
    ) -> Result<(), IdemError> {
        let query = query(&self.sql.complete)
            .bind(biz)
            .bind(key)
            .bind(fence_param(claim)?)
            .bind(snapshot)
            .bind(millis(ttl))
            .bind(self.offset_ms);
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
        let query = query(&self.sql.save_steps)
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
        let query = query(&self.sql.renew)
            .bind(biz)
            .bind(key)
            .bind(fence_param(claim)?)
            .bind(millis(lease))
            .bind(self.offset_ms);
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
        let rows = query(&self.sql.stats)
            .fetch_all(&mut *self.conn)
            .await
            .map_err(db_error)?;
        let counts = rows
            .iter()
            .map(|row| {
                StatusCount::of_row(
                    row.try_get("biz_type").map_err(db_error)?,
                    row.try_get("status").map_err(db_error)?,
                    row.try_get("n").map_err(db_error)?,
                )
            })
            .collect::<Result<Vec<_>, IdemError>>()?;
        Ok(StatusCount::tally(counts))
    }

    pub(super) async fn sweep(&mut self, batch: usize) -> Result<u64, IdemError> {
        let done = query(&self.sql.sweep)
            .bind(i64::try_from(batch).unwrap_or(i64::MAX))
            .bind(self.offset_ms)
            .execute(&mut *self.conn)
            .await
            .map_err(db_error)?;
        Ok(done.rows_affected())
    }

    /// The new record `INSERT_NEW` made, or `None` when the key exists (the claim protocol then
    /// decides it).
    pub(super) async fn insert_new(
        &mut self,
        req: &ClaimRequest<'_>,
    ) -> Result<Option<SeenRecord>, IdemError> {
        let sql = self.sql.insert_new.clone();
        Ok(self.claiming(&sql, req).await?.1)
    }

    /// `CLAIM` or `INSERT_NEW`: `(inserted, record)`, `None` when no row came back.
    async fn claiming(
        &mut self,
        sql: &Arc<str>,
        req: &ClaimRequest<'_>,
    ) -> Result<(bool, Option<SeenRecord>), IdemError> {
        let Some(row) = claim_query(sql, req, self.offset_ms)
            .fetch_optional(&mut *self.conn)
            .await
            .map_err(db_error)?
        else {
            return Ok((false, None));
        };
        let inserted: i64 = row.try_get("inserted").map_err(db_error)?;
        Ok((inserted == 1, Some(seen_of(&row)?)))
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
        let sql = self.sql.claim.clone();
        self.claiming(&sql, req).await
    }

    async fn take(
        &mut self,
        req: &ClaimRequest<'_>,
        seen: &SeenRecord,
        reset: bool,
        keep_steps: bool,
    ) -> Result<Option<Claim>, IdemError> {
        let Some(row) = claim_query(&self.sql.take, req, self.offset_ms)
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
