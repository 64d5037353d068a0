//! SQLite store (feature `sqlite`): a file (WAL) or an in-memory database, through sqlx.

use std::any::Any;
use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteConnection, SqliteJournalMode, SqlitePool, SqlitePoolOptions,
    SqliteRow, SqliteSynchronous,
};
use sqlx::{Row, Sqlite, Transaction};

use crate::IdemError;
use crate::sql::claim::{CasRecords, SeenRecord, claim_by_cas};
use crate::store::decide::millis;
use crate::store::{ClaimOutcome, ClaimRequest, Limits, Record, Status, Store};

/// The DDL of the `idem_record` table, as shipped in `migrations/sqlite/`.
pub const MIGRATION: &str = include_str!("../../../migrations/sqlite/0001_idem_record.sql");

/// The database clock in milliseconds since the Unix epoch.
macro_rules! now_ms {
    () => {
        "CAST(unixepoch('subsec') * 1000 AS INTEGER)"
    };
}

const INSERT: &str = concat!(
    "INSERT INTO idem_record (biz_type, idem_key, status, attempt, fingerprint, result, lease_until, created_at, updated_at, expire_at) ",
    "SELECT ?1, ?2, 'PROCESSING', 1, ?3, NULL, clock.n + ?4, clock.n, clock.n, clock.n + ?5 ",
    "FROM (SELECT ",
    now_ms!(),
    " AS n) AS clock WHERE true ",
    "ON CONFLICT (biz_type, idem_key) DO NOTHING"
);
const READ: &str = concat!(
    "SELECT status, attempt, fingerprint, result, lease_until, expire_at, ",
    now_ms!(),
    " AS now_ms ",
    "FROM idem_record WHERE biz_type = ?1 AND idem_key = ?2"
);
const TAKE: &str = concat!(
    "UPDATE idem_record SET status = 'PROCESSING', attempt = attempt + 1, fingerprint = ?3, result = NULL, ",
    "lease_until = clock.n + ?4, updated_at = clock.n, ",
    "created_at = CASE WHEN ?6 THEN clock.n ELSE created_at END, ",
    "expire_at = CASE WHEN ?6 THEN clock.n + ?5 ELSE expire_at END ",
    "FROM (SELECT ",
    now_ms!(),
    " AS n) AS clock ",
    "WHERE biz_type = ?1 AND idem_key = ?2 AND attempt = ?7 AND status = ?8"
);
pub(crate) const COMPLETE: &str = concat!(
    "UPDATE idem_record SET status = 'SUCCEEDED', result = ?4, updated_at = ",
    now_ms!(),
    " ",
    "WHERE biz_type = ?1 AND idem_key = ?2 AND attempt = ?3 AND status = 'PROCESSING'"
);
const FAIL: &str = concat!(
    "UPDATE idem_record SET status = 'FAILED', result = NULL, updated_at = ",
    now_ms!(),
    " ",
    "WHERE biz_type = ?1 AND idem_key = ?2 AND attempt = ?3 AND status = 'PROCESSING'"
);
const LOAD: &str = "SELECT status, attempt, fingerprint, result, lease_until, expire_at \
    FROM idem_record WHERE biz_type = ?1 AND idem_key = ?2";
const SWEEP: &str = concat!(
    "DELETE FROM idem_record WHERE (biz_type, idem_key) IN ",
    "(SELECT biz_type, idem_key FROM idem_record WHERE expire_at <= ",
    now_ms!(),
    " LIMIT ?1)"
);

/// Keeps records in an SQLite database (table `idem_record`).
///
/// ```no_run
/// # async fn demo() -> Result<(), idem_runtime::IdemError> {
/// let store = idem_runtime::SqliteStore::open("idem.db").await?;
/// store.migrate().await?;
/// idem_runtime::register_store("sqlite", store);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct SqliteStore {
    pool: SqlitePool,
    limits: Limits,
}

pub(crate) fn db_error(e: sqlx::Error) -> IdemError {
    match e {
        sqlx::Error::Io(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::Tls(_) => IdemError::unavailable(e),
        other => IdemError::store(other),
    }
}

impl SqliteStore {
    /// Opens (creating if missing) the database file at `path` in WAL mode.
    ///
    /// # Errors
    /// [`IdemError::StoreUnavailable`] when the file cannot be opened.
    pub async fn open(path: impl AsRef<Path>) -> Result<Self, IdemError> {
        let options = SqliteConnectOptions::new()
            .filename(path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
            .busy_timeout(Duration::from_secs(10));
        let pool = SqlitePoolOptions::new()
            .max_connections(4)
            .connect_with(options)
            .await
            .map_err(IdemError::unavailable)?;
        Ok(Self::from_pool(pool))
    }

    /// A private in-memory database (one connection, kept open for the store's life).
    ///
    /// # Errors
    /// [`IdemError::StoreUnavailable`] when SQLite cannot open it.
    pub async fn in_memory() -> Result<Self, IdemError> {
        let options =
            SqliteConnectOptions::from_str("sqlite::memory:").map_err(IdemError::unavailable)?;
        let pool = SqlitePoolOptions::new()
            .max_connections(1)
            .min_connections(1)
            .idle_timeout(None)
            .max_lifetime(None)
            .connect_with(options)
            .await
            .map_err(IdemError::unavailable)?;
        Ok(Self::from_pool(pool))
    }

    /// A store on an existing pool (its database must have the `idem_record` table: see
    /// [`SqliteStore::migrate`]).
    pub fn from_pool(pool: SqlitePool) -> Self {
        SqliteStore {
            pool,
            limits: Limits::default(),
        }
    }

    /// The same store with other limits.
    pub fn with_limits(mut self, limits: Limits) -> Self {
        self.limits = limits;
        self
    }

    /// The pool, for the application's own queries and transactions.
    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    /// Begins a write transaction (`BEGIN IMMEDIATE`) for a `tx = "…"` call: it takes SQLite's
    /// write lock up front, so a concurrent duplicate waits for this one to commit and then
    /// replays, instead of failing with "database is locked" when a deferred transaction that
    /// already read tries to write.
    ///
    /// # Errors
    /// [`IdemError::StoreUnavailable`] when no connection can be had or the lock is not granted
    /// within the busy timeout.
    pub async fn begin(&self) -> Result<Transaction<'static, Sqlite>, IdemError> {
        self.pool
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(IdemError::unavailable)
    }

    /// Creates the `idem_record` table and its expiry index if they do not exist.
    ///
    /// # Errors
    /// The database's error.
    pub async fn migrate(&self) -> Result<(), IdemError> {
        sqlx::raw_sql(MIGRATION)
            .execute(&self.pool)
            .await
            .map_err(db_error)?;
        Ok(())
    }

    async fn finish(
        &self,
        sql: &'static str,
        biz: &str,
        key: &str,
        attempt: u32,
        snapshot: Option<&[u8]>,
    ) -> Result<(), IdemError> {
        let mut conn = self.pool.acquire().await.map_err(db_error)?;
        finish_on(&mut conn, sql, biz, key, attempt, snapshot).await
    }
}

pub(crate) async fn finish_on(
    conn: &mut SqliteConnection,
    sql: &'static str,
    biz: &str,
    key: &str,
    attempt: u32,
    snapshot: Option<&[u8]>,
) -> Result<(), IdemError> {
    let done = sqlx::query(sql)
        .bind(biz)
        .bind(key)
        .bind(i64::from(attempt))
        .bind(snapshot)
        .execute(conn)
        .await
        .map_err(db_error)?;
    if done.rows_affected() == 1 {
        Ok(())
    } else {
        Err(IdemError::LeaseLost { attempt })
    }
}

fn attempt_of(row: &SqliteRow) -> Result<u32, IdemError> {
    let attempt: i64 = row.try_get("attempt").map_err(db_error)?;
    u32::try_from(attempt).map_err(|_| IdemError::store(format!("attempt {attempt} out of range")))
}

/// The CAS primitives on one SQLite connection (a pool connection or the caller's transaction).
impl CasRecords for SqliteConnection {
    async fn insert_new(&mut self, req: &ClaimRequest<'_>) -> Result<bool, IdemError> {
        let done = sqlx::query(INSERT)
            .bind(req.biz)
            .bind(req.key)
            .bind(req.fingerprint)
            .bind(millis(req.lease))
            .bind(millis(req.ttl))
            .execute(&mut *self)
            .await
            .map_err(db_error)?;
        Ok(done.rows_affected() == 1)
    }

    async fn read(&mut self, req: &ClaimRequest<'_>) -> Result<Option<SeenRecord>, IdemError> {
        let Some(row) = sqlx::query(READ)
            .bind(req.biz)
            .bind(req.key)
            .fetch_optional(&mut *self)
            .await
            .map_err(db_error)?
        else {
            return Ok(None);
        };
        Ok(Some(SeenRecord {
            status: Status::parse(row.try_get("status").map_err(db_error)?)?,
            attempt: attempt_of(&row)?,
            fingerprint: row.try_get("fingerprint").map_err(db_error)?,
            snapshot: row.try_get("result").map_err(db_error)?,
            lease_until_ms: row.try_get("lease_until").map_err(db_error)?,
            expire_at_ms: row.try_get("expire_at").map_err(db_error)?,
            now_ms: row.try_get("now_ms").map_err(db_error)?,
        }))
    }

    async fn take(
        &mut self,
        req: &ClaimRequest<'_>,
        seen_attempt: u32,
        seen_status: Status,
        reset: bool,
    ) -> Result<bool, IdemError> {
        let done = sqlx::query(TAKE)
            .bind(req.biz)
            .bind(req.key)
            .bind(req.fingerprint)
            .bind(millis(req.lease))
            .bind(millis(req.ttl))
            .bind(reset)
            .bind(i64::from(seen_attempt))
            .bind(seen_status.as_str())
            .execute(&mut *self)
            .await
            .map_err(db_error)?;
        Ok(done.rows_affected() == 1)
    }
}

#[async_trait]
impl Store for SqliteStore {
    fn backend(&self) -> &'static str {
        "sqlite"
    }

    fn limits(&self) -> &Limits {
        &self.limits
    }

    async fn claim(&self, req: &ClaimRequest<'_>) -> Result<ClaimOutcome, IdemError> {
        let mut conn = self.pool.acquire().await.map_err(db_error)?;
        claim_by_cas(&mut *conn, req).await
    }

    async fn complete(
        &self,
        biz: &str,
        key: &str,
        attempt: u32,
        snapshot: Vec<u8>,
    ) -> Result<(), IdemError> {
        self.finish(COMPLETE, biz, key, attempt, Some(&snapshot))
            .await
    }

    async fn fail(&self, biz: &str, key: &str, attempt: u32) -> Result<(), IdemError> {
        self.finish(FAIL, biz, key, attempt, None).await
    }

    async fn load(&self, biz: &str, key: &str) -> Result<Option<Record>, IdemError> {
        let Some(row) = sqlx::query(LOAD)
            .bind(biz)
            .bind(key)
            .fetch_optional(&self.pool)
            .await
            .map_err(db_error)?
        else {
            return Ok(None);
        };
        Ok(Some(Record {
            biz: biz.to_owned(),
            key: key.to_owned(),
            status: Status::parse(row.try_get("status").map_err(db_error)?)?,
            attempt: attempt_of(&row)?,
            fingerprint: row.try_get("fingerprint").map_err(db_error)?,
            snapshot: row.try_get("result").map_err(db_error)?,
            lease_until_ms: row.try_get("lease_until").map_err(db_error)?,
            expire_at_ms: row.try_get("expire_at").map_err(db_error)?,
        }))
    }

    async fn sweep_expired(&self, batch: usize) -> Result<u64, IdemError> {
        let batch = i64::try_from(batch).unwrap_or(i64::MAX);
        let done = sqlx::query(SWEEP)
            .bind(batch)
            .execute(&self.pool)
            .await
            .map_err(db_error)?;
        Ok(done.rows_affected())
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

pub(crate) mod transition;
mod tx;
pub(crate) use tx::Savepoint;
