//! The statements of the SQLite store and the claim protocol's steps on one connection.
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
use sqlx::{AssertSqlSafe, Row, Sqlite};

use super::{SqliteStore, db_error};
use crate::IdemError;
use crate::sql::claim::{CasRecords, SeenRecord, seen_record};
use crate::sql::dialect::Dialect;
use crate::sql::table::TableName;
use crate::store::decide::millis;
use crate::store::{Claim, ClaimRequest, Fence, Record, Status, StatusCount};

/// The record's columns as the claim reads them.
macro_rules! record_columns {
    () => {
        "status, attempt, fence, fingerprint, result, lease_until, expire_at, result_until, "
    };
}

/// ?1 biz, ?2 key, ?3 fingerprint, ?4 lease ms, ?5 ttl ms, ?6 now ms, ?7 now µs (the fence):
/// inserts a new record unless one exists. The row affected says which.
macro_rules! insert_new {
    () => {
        concat!(
            "INSERT INTO {t} (biz_type, idem_key, status, attempt, fence, fingerprint, result, ",
            "lease_until, created_at, updated_at, expire_at) ",
            "VALUES (?1, ?2, 'PROCESSING', 1, ?7, ?3, NULL, ?6 + ?4, ?6, ?6, ?6 + ?5) ",
            "ON CONFLICT (biz_type, idem_key) DO NOTHING"
        )
    };
}

/// ?1–?7 as for `insert_new`.
///
/// Read the record; if there is none, insert a new one. All in one round trip: the claim fetches
/// one row, and sqlx stops a batch at the row a `fetch_optional` asked for, so when the record
/// exists (a repeat) only the first read runs: one read, no write lock. Otherwise the insert runs
/// and the last `SELECT` answers `inserted = 1` when it wrote the row (`changes()`), with no
/// other column: the claim knows the new record from what it bound. No row at all: another
/// connection inserted first, and the claim reads again.
const CLAIM: &str = concat!(
    "SELECT ",
    record_columns!(),
    "?6 AS now_ms, 0 AS inserted ",
    "FROM {t} WHERE biz_type = ?1 AND idem_key = ?2; ",
    insert_new!(),
    "; SELECT 1 AS inserted WHERE changes() = 1"
);
/// A new record's insert alone (no read before it), for a claim sent while new keys prevail
/// (`store/order.rs`): see `insert_new`.
const INSERT_NEW: &str = insert_new!();
/// ?1–?7 as for `insert_new`, then ?8 reset, ?9 seen fence, ?10 seen status, ?11 seen lease
/// end, ?12 keep the saved steps (`result` of an unfinished record). The new fence is one more
/// than the last, or the clock when that is later.
const TAKE: &str = concat!(
    "UPDATE {t} SET status = 'PROCESSING', ",
    "attempt = CASE WHEN ?8 THEN 1 ELSE attempt + 1 END, ",
    "fence = max(fence + 1, ?7), fingerprint = ?3, result = CASE WHEN ?12 THEN result END, ",
    "result_until = NULL, ",
    "lease_until = ?6 + ?4, updated_at = ?6, ",
    "created_at = CASE WHEN ?8 THEN ?6 ELSE created_at END, ",
    "expire_at = CASE WHEN ?8 THEN ?6 + ?5 ELSE max(expire_at, ?6 + ?4) END ",
    "WHERE biz_type = ?1 AND idem_key = ?2 AND fence = ?9 AND status = ?10 AND lease_until = ?11 ",
    "RETURNING attempt, fence"
);
/// ?1 biz, ?2 key, ?3 fence, ?4 result, ?5 ttl ms, ?6 now ms, ?7 result ttl ms (NULL: the result
/// is kept as long as the record). The mark moves the expiry to at least now + ttl, so a body
/// slower than its ttl still leaves a live success. A record already SUCCEEDED under the fence
/// counts as held and keeps its result and expiry: a mark sent again after a lost reply succeeds
/// (and FAILED likewise for `FAIL`).
const COMPLETE: &str = concat!(
    "UPDATE {t} SET result = CASE WHEN status = 'PROCESSING' THEN ?4 ELSE result END, ",
    "expire_at = CASE WHEN status = 'PROCESSING' THEN max(expire_at, ?6 + ?5) ELSE expire_at END, ",
    "result_until = CASE WHEN status = 'PROCESSING' THEN ?6 + ?7 ELSE result_until END, ",
    "status = 'SUCCEEDED', updated_at = ?6 ",
    "WHERE biz_type = ?1 AND idem_key = ?2 AND fence = ?3 AND status IN ('PROCESSING', 'SUCCEEDED')"
);
/// ?1 biz, ?2 key, ?3 fence, ?4 now ms. The saved steps (in `result`) stay for a retry.
const FAIL: &str = "UPDATE {t} SET status = 'FAILED', updated_at = ?4 \
    WHERE biz_type = ?1 AND idem_key = ?2 AND fence = ?3 AND status IN ('PROCESSING', 'FAILED')";
/// ?1 biz, ?2 key, ?3 fence, ?4 steps, ?5 now ms. The steps of an unfinished record live in
/// `result` until a success replaces them.
const SAVE_STEPS: &str = "UPDATE {t} SET result = ?4, updated_at = ?5 \
    WHERE biz_type = ?1 AND idem_key = ?2 AND fence = ?3 AND status = 'PROCESSING'";
/// ?1 biz, ?2 key, ?3 fence, ?4 lease ms, ?5 now ms.
const RENEW: &str = "UPDATE {t} SET lease_until = ?5 + ?4, expire_at = max(expire_at, ?5 + ?4), \
    updated_at = ?5 WHERE biz_type = ?1 AND idem_key = ?2 AND fence = ?3 AND status = 'PROCESSING'";
/// ?1 biz, ?2 key, ?3 now ms: the claim's plain read (`store/order.rs`).
const READ: &str = concat!(
    "SELECT ",
    record_columns!(),
    "?3 AS now_ms FROM {t} WHERE biz_type = ?1 AND idem_key = ?2"
);
const LOAD: &str = concat!(
    "SELECT ",
    record_columns!(),
    "0 AS now_ms FROM {t} WHERE biz_type = ?1 AND idem_key = ?2"
);
/// ?1 biz, ?2 now ms, ?3 batch. PROCESSING with the lease ended, oldest lease first: a range of
/// the index `<table>_processing (biz_type, lease_until) WHERE status = 'PROCESSING'`, read in its
/// order (no sort), that stops after the batch. The `status` term is written as a literal: it
/// is what lets SQLite use the partial index.
const STUCK: &str = "SELECT idem_key, status, attempt, fence, fingerprint, result, lease_until, \
    expire_at, result_until FROM {t} WHERE biz_type = ?1 AND status = 'PROCESSING' AND lease_until <= ?2 \
    ORDER BY lease_until LIMIT ?3";
/// ?1 now ms. Records per business type and status (expired ones not yet swept included), and
/// the tombstones among them (`gone`: their result ttl passed): a scan of the table (an
/// operator's query; no index is kept for it).
/// `origin`: what an HTTP layer record's fingerprint keeps before its digest (its method and route):
/// the digest is hex after the last space, so trimming hex digits, then the space, leaves it.
const STATS: &str = "SELECT biz_type, \
    CASE WHEN instr(fingerprint, ' ') > 0 THEN rtrim(rtrim(fingerprint, '0123456789abcdef'), ' ') END AS origin, \
    status, COUNT(*) AS n, \
    COUNT(CASE WHEN result_until <= ?1 THEN 1 END) AS gone FROM {t} GROUP BY biz_type, origin, status";
/// ?1 batch, ?2 now ms. Expired: the TTL passed and no lease is live.
const SWEEP: &str = "DELETE FROM {t} WHERE (biz_type, idem_key) IN (\
    SELECT biz_type, idem_key FROM {t} \
    WHERE expire_at <= ?2 AND NOT (status = 'PROCESSING' AND lease_until > ?2) LIMIT ?1)";

/// ?1 batch, ?2 now ms. Results past their result ttl: dropped, the records kept as tombstones
/// (`result_until` 0, out of the range looked in): a range of the partial index
/// `<table>_result_until (result_until) WHERE result_until > 0`, the results still to drop.
const SHRINK: &str = "UPDATE {t} SET result = NULL, result_until = 0 WHERE (biz_type, idem_key) IN (\
    SELECT biz_type, idem_key FROM {t} \
    WHERE result_until > 0 AND result_until <= ?2 AND status = 'SUCCEEDED' LIMIT ?1)";

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
    shrink: Arc<str>,
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
            shrink: named(SHRINK),
        }
    }
}

/// A statement of the store as a sqlx query.
pub(super) fn query(sql: &Arc<str>) -> sqlx::query::Query<'static, Sqlite, SqliteArguments> {
    sqlx::query(AssertSqlSafe(sql.clone()))
}

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
