//! SQLite store (feature `sqlite`): a file (WAL) or an in-memory database, through sqlx.
//!
//! `records.rs` holds the statements and the claim protocol's steps, `tx.rs` the transactions
//! (`SqliteTx`: `tx = "…"` claims and transitions), `transition.rs` what state transitions bind.

mod records;
mod tokens;
mod transition;
mod tx;

use std::path::Path;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::pool::PoolConnection;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteConnection, SqliteJournalMode, SqlitePool, SqlitePoolOptions,
    SqliteSynchronous,
};
use sqlx::{Row, Sqlite};
use tokio::sync::Mutex;

use crate::IdemError;
use crate::clock::{ClockOffset, TestClock};
use crate::sql::claim::claim_by_cas;
use crate::sql::dialect::Dialect;
use crate::store::{Claim, ClaimOutcome, ClaimRequest, Limits, Record, StatusCount, Store};
use crate::transition::TransitionTx;
use records::Records;
pub use tokens::SqliteTokens;
pub use tx::SqliteTx;

/// Keeps records in an SQLite database (table `idem_record`).
///
/// On a database file, idem's own statements run on one connection the store keeps for itself
/// (taken from the pool once): SQLite admits one writer at a time anyway, and a connection of its
/// own spares every statement a pool checkout, which in sqlx pings the connection on its way back.
/// The pool stays for [`SqliteStore::begin`] and for the application's queries.
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
    offset: ClockOffset,
    /// The connection idem's statements run on (`None` until first use, or after it broke); absent
    /// for an in-memory database, whose statements go through the pool's one connection.
    own: Option<Arc<Mutex<Option<PoolConnection<Sqlite>>>>>,
}

/// A driver error as an [`IdemError`] of the right class.
pub(crate) fn db_error(e: sqlx::Error) -> IdemError {
    crate::sql::error::store_error(e, Dialect::SQLite)
}

impl SqliteStore {
    /// The DDL of the `idem_record` table (its fence, the tokens table and the index
    /// [`Store::stuck`] reads came later), in order, as shipped in `migrations/sqlite/`; for
    /// services that apply migrations with their own tool. [`SqliteStore::migrate`] applies them.
    pub const MIGRATIONS: [&'static str; 4] = [
        include_str!("../../../migrations/sqlite/0001_idem_record.sql"),
        include_str!("../../../migrations/sqlite/0002_idem_record_fence.sql"),
        include_str!("../../../migrations/sqlite/0003_idem_token.sql"),
        include_str!("../../../migrations/sqlite/0004_idem_record_stuck.sql"),
    ];

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
        let pool = Self::pool_options(4)
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
        let pool = Self::pool_options(1)
            .min_connections(1)
            .idle_timeout(None)
            .max_lifetime(None)
            .connect_with(options)
            .await
            .map_err(IdemError::unavailable)?;
        let mut store = Self::from_pool(pool);
        store.own = None;
        Ok(store)
    }

    /// The pool settings idem uses: an SQLite connection is a file handle in this process, so the
    /// pool does not ping it before handing it out (a round trip per statement for nothing).
    fn pool_options(max: u32) -> SqlitePoolOptions {
        SqlitePoolOptions::new()
            .max_connections(max)
            .test_before_acquire(false)
    }

    /// A store on an existing pool (its database must have the `idem_record` table: see
    /// [`SqliteStore::migrate`]).
    pub fn from_pool(pool: SqlitePool) -> Self {
        let filename = pool
            .connect_options()
            .get_filename()
            .to_string_lossy()
            .into_owned();
        let in_memory = filename == ":memory:" || filename.contains("memory");
        SqliteStore {
            pool,
            limits: Limits::default(),
            offset: ClockOffset::default(),
            own: (!in_memory).then(Arc::default),
        }
    }

    /// Runs `work` on the store's own connection (taken from the pool on first use, and again
    /// after one that failed), or on a pool connection for an in-memory database.
    async fn with_conn<R>(
        &self,
        work: impl AsyncFnOnce(&mut SqliteConnection) -> Result<R, IdemError>,
    ) -> Result<R, IdemError> {
        let Some(own) = &self.own else {
            let mut conn = self.pool.acquire().await.map_err(db_error)?;
            return work(&mut conn).await;
        };
        let mut slot = own.lock().await;
        let conn = match &mut *slot {
            Some(conn) => conn,
            empty => empty.insert(self.pool.acquire().await.map_err(db_error)?),
        };
        let result = work(conn).await;
        if let Err(IdemError::StoreUnavailable { .. }) = &result {
            // A broken connection goes back to the pool, which tests it; the next call takes another.
            *slot = None;
        }
        result
    }

    /// The same store with other limits.
    pub fn with_limits(mut self, limits: Limits) -> Self {
        self.limits = limits;
        self
    }

    /// The same store on a [`TestClock`]: every statement reads the database's clock plus the
    /// clock's offset.
    pub fn with_test_clock(mut self, clock: TestClock) -> Self {
        self.offset = ClockOffset::new(clock);
        self
    }

    /// The pool, for the application's own queries.
    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    /// Begins a write transaction (`BEGIN IMMEDIATE`) for `tx = "…"` calls and state transitions.
    /// It takes SQLite's write lock up front, so a concurrent duplicate waits for this one to commit
    /// and then replays, instead of failing with "database is locked" when a deferred transaction
    /// that already read tries to write. The transaction carries this store: a `tx = "…"` call
    /// claims in this store's table by construction.
    ///
    /// # Errors
    /// [`IdemError::StoreUnavailable`] when no connection can be had, [`IdemError::StoreBusy`]
    /// when the lock is not granted within the busy timeout.
    pub async fn begin(&self) -> Result<SqliteTx, IdemError> {
        let tx = self
            .pool
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(db_error)?;
        Ok(SqliteTx::new(tx, self.clone()))
    }

    /// Creates the `idem_record` table (and `idem_token`, for submit tokens) and their indexes if
    /// they do not exist, and adds the columns and indexes of later versions to a table made by an
    /// earlier one.
    ///
    /// # Errors
    /// The database's error.
    pub async fn migrate(&self) -> Result<(), IdemError> {
        let [v1, v2, v3, v4] = Self::MIGRATIONS;
        sqlx::raw_sql(v1)
            .execute(&self.pool)
            .await
            .map_err(db_error)?;
        let has_fence: i64 = sqlx::query(
            "SELECT COUNT(*) FROM pragma_table_info('idem_record') WHERE name = 'fence'",
        )
        .fetch_one(&self.pool)
        .await
        .and_then(|row| row.try_get(0))
        .map_err(db_error)?;
        if has_fence == 0 {
            sqlx::raw_sql(v2)
                .execute(&self.pool)
                .await
                .map_err(db_error)?;
        }
        for ddl in [v3, v4] {
            sqlx::raw_sql(ddl)
                .execute(&self.pool)
                .await
                .map_err(db_error)?;
        }
        Ok(())
    }

    /// Milliseconds the test clock adds to the database's clock.
    fn offset_ms(&self) -> i64 {
        self.offset.ms()
    }
}

impl crate::TransactionalStore for SqliteStore {
    type Tx = SqliteTx;

    async fn begin_tx(&self) -> Result<SqliteTx, IdemError> {
        self.begin().await
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
        self.with_conn(async |conn| claim_by_cas(&mut Records::new(conn, self), req).await)
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
        self.with_conn(async |conn| {
            Records::new(conn, self)
                .complete(biz, key, claim, snapshot, ttl)
                .await
        })
        .await
    }

    async fn fail(&self, biz: &str, key: &str, claim: &Claim) -> Result<(), IdemError> {
        self.with_conn(async |conn| Records::new(conn, self).fail(biz, key, claim).await)
            .await
    }

    async fn renew(
        &self,
        biz: &str,
        key: &str,
        claim: &Claim,
        lease: Duration,
    ) -> Result<(), IdemError> {
        self.with_conn(async |conn| Records::new(conn, self).renew(biz, key, claim, lease).await)
            .await
    }

    async fn save_steps(
        &self,
        biz: &str,
        key: &str,
        claim: &Claim,
        steps: &[u8],
    ) -> Result<(), IdemError> {
        self.with_conn(async |conn| {
            Records::new(conn, self)
                .save_steps(biz, key, claim, steps)
                .await
        })
        .await
    }

    async fn load(&self, biz: &str, key: &str) -> Result<Option<Record>, IdemError> {
        self.with_conn(async |conn| Records::new(conn, self).load(biz, key).await)
            .await
    }

    async fn sweep_expired(&self, batch: usize) -> Result<u64, IdemError> {
        self.with_conn(async |conn| Records::new(conn, self).sweep(batch).await)
            .await
    }

    async fn stuck(&self, biz: &str, batch: usize) -> Result<Vec<Record>, IdemError> {
        self.with_conn(async |conn| Records::new(conn, self).stuck(biz, batch).await)
            .await
    }

    async fn stats(&self) -> Result<Vec<StatusCount>, IdemError> {
        self.with_conn(async |conn| Records::new(conn, self).stats().await)
            .await
    }

    async fn begin_transition(&self) -> Result<Box<dyn TransitionTx>, IdemError> {
        Ok(Box::new(self.begin().await?))
    }
}
