//! SQLite store (feature `sqlite`): a file (WAL) or an in-memory database, through sqlx.
//!
//! The same files as every SQL store: `statements.rs` the SQL text, `schema.rs` the migrations as
//! `migrate()` applies them, `records.rs` its part of the
//! record layer (`sql/records.rs`: its clock, the columns whose types differ, the claim's insert
//! and takeover), `tx.rs` the transactions
//! (`SqliteTx`: `tx = "…"` claims and transitions), `transition.rs` what state transitions bind,
//! `tokens.rs` the one-time submit tokens and their statements.

mod records;
mod schema;
mod statements;
mod tokens;
mod transition;
mod tx;

use std::path::Path;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use sqlx::Sqlite;
use sqlx::pool::PoolConnection;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteConnection, SqliteJournalMode, SqlitePool, SqlitePoolOptions,
    SqliteSynchronous,
};
use sqlx::{AssertSqlSafe, SqlSafeStr};
use tokio::sync::{Mutex, MutexGuard};

use crate::IdemError;
use crate::clock::ClockOffset;
use crate::sql::claim::claim_by_cas;
use crate::sql::dialect::{Dialect, Savepoint};
use crate::sql::records::RecordConn;
use crate::sql::store::{Lent, SqlStore, with_conn};
use crate::sql::table::TableName;
use crate::store::order::ClaimOrder;
use crate::store::{Acquired, ClaimOutcome, ClaimRequest, Limits};
use records::Claims;
pub(crate) use schema::migrations_named;
use statements::Statements;
pub use tokens::SqliteTokens;
pub use tx::SqliteTx;

/// The longest string or BLOB SQLite holds with its default `SQLITE_MAX_LENGTH` (a build of SQLite
/// may lower it, not raise it past 2³¹ − 1): what `SqliteStore::with_limits` checks each limit
/// against.
const SQLITE_MAX_LENGTH: usize = 1_000_000_000;

/// Keeps records in an SQLite database (table `idem_record` unless [`SqliteStore::with_table`]
/// names another; submit tokens in `idem_token` unless [`SqliteStore::with_token_table`] does).
///
/// On a database file, idem's own statements run on one connection the store keeps for itself
/// (taken from the pool once): SQLite admits one writer at a time anyway, and a connection of its
/// own spares every statement a pool checkout, which in sqlx pings the connection on its way back.
/// The pool stays for [`SqliteStore::begin`] and for the application's queries.
///
/// ```no_run
/// # use idem_runtime as idem;
/// # async fn demo() -> Result<(), idem_runtime::IdemError> {
/// let store = idem::SqliteStore::open("idem.db").await?;
/// store.migrate().await?;
/// idem::register_store("sqlite", store);
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
    table: TableName,
    token_table: TableName,
    sql: Arc<Statements>,
    token_sql: Arc<crate::sql::tokens::TokenStatements>,
    /// What its claims found, for the transaction's read before its savepoint (`store/order.rs`).
    order: Arc<ClaimOrder>,
}

/// A driver error as an [`IdemError`] of the right class.
pub(crate) fn db_error(e: sqlx::Error) -> IdemError {
    crate::sql::error::store_error(e, Dialect::SQLite)
}

impl SqliteStore {
    /// The DDL of the `idem_record` table (its fence, the tokens table and the index
    /// [`Store::stuck`](crate::Store::stuck) reads came later: first over every record, then over the PROCESSING ones
    /// only, which replaces it; then the column `result_until` and its index, for results kept
    /// shorter than their record), in order, as shipped in `migrations/sqlite/` (with the default
    /// names `idem_record` and `idem_token`); for services that apply migrations with their own
    /// tool. [`SqliteStore::migrate`] applies them with the store's table names, all but the
    /// fourth: the fifth drops the index the fourth builds, so a schema made from nothing never
    /// builds it.
    pub const MIGRATIONS: [&'static str; 7] = [
        include_str!("../../../migrations/sqlite/0001_idem_record.sql"),
        include_str!("../../../migrations/sqlite/0002_idem_record_fence.sql"),
        include_str!("../../../migrations/sqlite/0003_idem_token.sql"),
        include_str!("../../../migrations/sqlite/0004_idem_record_stuck.sql"),
        include_str!("../../../migrations/sqlite/0005_idem_record_processing.sql"),
        include_str!("../../../migrations/sqlite/0006_idem_record_result_until.sql"),
        include_str!("../../../migrations/sqlite/0007_idem_record_result_until_index.sql"),
    ];

    /// Opens (creating if missing) the database file at `path` in WAL mode.
    ///
    /// # Errors
    /// [`IdemError::InvalidOptions`] naming the directory when the file's directory does not
    /// exist; [`IdemError::StoreUnavailable`] naming the path when the file cannot be opened.
    pub async fn open(path: impl AsRef<Path>) -> Result<Self, IdemError> {
        let path = path.as_ref();
        // SQLite creates the file, never its directory, and says only "unable to open database
        // file": a directory that is not there is a mistake of the setup, named as such.
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty())
            && !dir.is_dir()
        {
            return Err(IdemError::InvalidOptions {
                reason: format!(
                    "cannot open the SQLite database {}: its directory {} does not exist (SQLite \
                     creates the file, not the directory); create the directory first",
                    path.display(),
                    dir.display()
                ),
            });
        }
        let options = SqliteConnectOptions::new()
            .filename(path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
            .busy_timeout(Duration::from_secs(10));
        let pool = Self::pool_options(4)
            .connect_with(options)
            .await
            .map_err(|e| {
                IdemError::unavailable(format!(
                    "cannot open the SQLite database {}: {e}",
                    path.display()
                ))
            })?;
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

    /// A store on an existing pool (its database must have the store's tables: see
    /// [`SqliteStore::migrate`]).
    pub fn from_pool(pool: SqlitePool) -> Self {
        let filename = pool
            .connect_options()
            .get_filename()
            .to_string_lossy()
            .into_owned();
        let in_memory = filename == ":memory:" || filename.contains("memory");
        let table = TableName::default_table();
        let token_table = TableName::new(DEFAULT_TOKEN_TABLE).expect("a valid name");
        SqliteStore {
            pool,
            limits: Limits::default(),
            offset: ClockOffset::default(),
            own: (!in_memory).then(Arc::default),
            sql: Arc::new(Statements::new(&table)),
            token_sql: Arc::new(tokens::token_statements(&token_table)),
            order: Arc::default(),
            table,
            token_table,
        }
    }

    /// The same store on another records table (`[A-Za-z_][A-Za-z0-9_]*`, at most 63 bytes):
    /// each service, or each test, may keep its records in a table of its own, also in one
    /// database file. [`SqliteStore::migrate`] creates it, with its indexes named after it
    /// (`<table>_expire_at`, `<table>_stuck`).
    ///
    /// # Errors
    /// [`IdemError::InvalidOptions`] for a name idem cannot use, or a `schema.table` name (a
    /// table of an attached database is not supported).
    ///
    /// Unless [`SqliteStore::with_token_table`] named one, the submit tokens move with it, to
    /// `<name>_tok` (`idem_token` beside the default `idem_record`): the rule of the URL's
    /// `idem_table` option too.
    pub fn with_table(mut self, name: &str) -> Result<Self, IdemError> {
        let table = plain_table(name)?;
        if self.token_table == self.table.tokens_table() {
            self.token_table = table.tokens_table();
            self.token_sql = Arc::new(tokens::token_statements(&self.token_table));
        }
        self.table = table;
        self.sql = Arc::new(Statements::new(&self.table));
        Ok(self)
    }

    /// The same store with its submit tokens in another table (default: `<table>_tok` beside a
    /// records table of another name, `idem_token` beside `idem_record`; same rules as
    /// [`SqliteStore::with_table`]), whatever `with_table` names after.
    ///
    /// # Errors
    /// [`IdemError::InvalidOptions`] for a name idem cannot use.
    pub fn with_token_table(mut self, name: &str) -> Result<Self, IdemError> {
        self.token_table = plain_table(name)?;
        self.token_sql = Arc::new(tokens::token_statements(&self.token_table));
        Ok(self)
    }

    /// The same store with other limits, checked against what SQLite holds: a biz type, a key and
    /// a snapshot each of at most `SQLITE_MAX_LENGTH` (1,000,000,000) bytes, SQLite's default
    /// longest string or BLOB.
    ///
    /// # Errors
    /// [`IdemError::InvalidOptions`] naming the limit SQLite cannot hold and the bound.
    pub fn with_limits(mut self, limits: Limits) -> Result<Self, IdemError> {
        let bounds = Limits {
            max_key_len: SQLITE_MAX_LENGTH,
            max_biz_len: SQLITE_MAX_LENGTH,
            max_snapshot_len: SQLITE_MAX_LENGTH,
        };
        crate::store::check_limits("an SQLite database", &limits, &bounds)?;
        self.limits = limits;
        Ok(self)
    }

    /// The same store on a [`TestClock`](crate::TestClock) (feature `test-util`): every statement is given the store's clock (the system
    /// clock SQLite's `unixepoch()` reads) plus the test clock's offset.
    #[cfg(any(test, feature = "test-util"))]
    pub fn with_test_clock(mut self, clock: crate::clock::TestClock) -> Self {
        self.offset = ClockOffset::new(clock);
        self
    }

    /// Closes the store: gives back the connection it keeps for its own statements, then closes
    /// the pool, waiting for the connections the application still holds (as
    /// [`SqlitePool::close`]). Close a store with this rather than with its pool's `close`, which
    /// would wait for the store's own connection as long as the store lives. Calls made after it
    /// fail as [`IdemError::StoreUnavailable`].
    pub async fn close(&self) {
        if let Some(own) = &self.own {
            own.lock().await.take();
        }
        self.pool.close().await;
    }

    /// The pool, for the application's own queries. Close the store with
    /// [`SqliteStore::close`].
    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    /// The records table's name.
    pub fn table(&self) -> &str {
        self.table.as_str()
    }

    /// The tokens table's name.
    pub fn token_table(&self) -> &str {
        self.token_table.as_str()
    }

    /// Begins a write transaction (`BEGIN IMMEDIATE`) for `tx = "…"` calls and state transitions.
    /// It takes SQLite's write lock up front, so a concurrent duplicate waits for this one to commit
    /// and then replays, instead of failing with "database is locked" when a deferred transaction
    /// that already read tries to write. The transaction carries this store: a `tx = "…"` call
    /// claims in this store's table by construction.
    ///
    /// While the store's claims mostly create records, the savepoint of the transaction's first
    /// claim is opened with the `BEGIN`, in the same statement batch, and that claim takes it when
    /// nothing ran on the connection between them (see [`SqliteTx`]).
    ///
    /// # Errors
    /// [`IdemError::StoreUnavailable`] when no connection can be had, [`IdemError::StoreBusy`]
    /// when the lock is not granted within the busy timeout.
    pub async fn begin(&self) -> Result<SqliteTx, IdemError> {
        let (ready, open) = Savepoint::with_begin(&self.order);
        let tx = self
            .pool
            .begin_with(AssertSqlSafe(format!("BEGIN IMMEDIATE{open}")).into_sql_str())
            .await
            .map_err(db_error)?;
        Ok(SqliteTx::new(tx, self.clone(), ready, ()))
    }

    /// Milliseconds the test clock adds to the store's clock.
    fn offset_ms(&self) -> i64 {
        self.offset.ms()
    }
}

/// The default tokens table.
const DEFAULT_TOKEN_TABLE: &str = "idem_token";

/// `name` as an SQLite store's table: a valid [`TableName`] without a schema.
pub(crate) fn plain_table(name: &str) -> Result<TableName, IdemError> {
    let table = TableName::new(name)?;
    if table.as_str().contains('.') {
        return Err(IdemError::InvalidOptions {
            reason: format!(
                "`{name}` names a table of another schema: an SQLite store's table is a plain \
                 name (`[A-Za-z_][A-Za-z0-9_]*`), in the store's own database"
            ),
        });
    }
    Ok(table)
}

impl crate::TransactionalStore for SqliteStore {
    type Tx = SqliteTx;

    async fn begin_tx(&self) -> Result<SqliteTx, IdemError> {
        self.begin().await
    }
}

impl SqliteStore {
    /// The claim of `req` on `conn`. While new keys prevail, the insert alone (two statements,
    /// not the claim's three); when the key exists, or repeats prevail, the claim protocol (a plain
    /// read first, then the claim statement, which reads before it inserts).
    async fn claim_on(
        &self,
        conn: &mut SqliteConnection,
        req: &ClaimRequest<'_>,
    ) -> Result<ClaimOutcome, IdemError> {
        let mut records = Claims::new(self.records(conn), &self.sql);
        if !self.order.read_first()
            && let Some(seen) = records.insert_new(req).await?
        {
            let outcome = ClaimOutcome::Acquired {
                claim: seen.claim(),
                how: Acquired::Fresh,
            };
            self.order.observe(&outcome);
            return Ok(outcome);
        }
        claim_by_cas(&mut records, req, &self.order).await
    }
}

/// A connection a [`SqliteStore`] lent: its own (taken from the pool on first use, and again
/// after one that failed), or a pool connection for an in-memory database.
pub(crate) enum SqliteLent<'a> {
    /// The store's own connection, held for the statement.
    Own(MutexGuard<'a, Option<PoolConnection<Sqlite>>>),
    /// A pool connection (an in-memory database).
    Pooled(PoolConnection<Sqlite>),
}

impl Lent<SqliteConnection> for SqliteLent<'_> {
    fn conn(&mut self) -> &mut SqliteConnection {
        match self {
            SqliteLent::Own(slot) => match &mut **slot {
                Some(conn) => conn,
                None => unreachable!("filled when lent"),
            },
            SqliteLent::Pooled(conn) => conn,
        }
    }

    fn settle<R>(self, done: Result<R, IdemError>) -> Result<R, IdemError> {
        if let (SqliteLent::Own(mut slot), Err(IdemError::StoreUnavailable { .. })) = (self, &done)
        {
            // A broken connection goes back to the pool, which tests it; the next call takes
            // another.
            *slot = None;
        }
        done
    }
}

#[async_trait::async_trait]
impl SqlStore for SqliteStore {
    type Db = Sqlite;
    type Lent<'a> = SqliteLent<'a>;
    type Claims<'c> = Claims<'c>;
    const BACKEND: &'static str = "sqlite";

    fn own_limits(&self) -> &Limits {
        &self.limits
    }

    fn order(&self) -> &ClaimOrder {
        &self.order
    }

    async fn lend(&self) -> Result<SqliteLent<'_>, IdemError> {
        let Some(own) = &self.own else {
            return Ok(SqliteLent::Pooled(
                self.pool.acquire().await.map_err(db_error)?,
            ));
        };
        let mut slot = own.lock().await;
        if slot.is_none() {
            *slot = Some(self.pool.acquire().await.map_err(db_error)?);
        }
        Ok(SqliteLent::Own(slot))
    }

    #[allow(refining_impl_trait)]
    fn records<'c>(&'c self, conn: &'c mut SqliteConnection) -> RecordConn<'c, Sqlite> {
        RecordConn::new(conn, &self.sql.records, self.offset_ms())
    }

    fn lease_claims<'c>(&'c self, conn: &'c mut SqliteConnection) -> Claims<'c> {
        Claims::new(self.records(conn), &self.sql)
    }

    async fn claim_key(&self, req: &ClaimRequest<'_>) -> Result<ClaimOutcome, IdemError> {
        with_conn(self, async |conn| self.claim_on(conn, req).await).await
    }

    async fn begin(&self) -> Result<SqliteTx, IdemError> {
        SqliteStore::begin(self).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Store;

    #[tokio::test]
    async fn close_gives_back_the_stores_own_connection() {
        let path = std::env::temp_dir().join(format!("idem-close-{}.db", std::process::id()));
        let store = SqliteStore::open(&path).await.unwrap();
        store.migrate().await.unwrap();
        let req = ClaimRequest {
            biz: "B",
            key: "k",
            fingerprint: None,
            lease: std::time::Duration::from_secs(5),
            ttl: std::time::Duration::from_secs(60),
        };
        // The claim takes the store's own connection; closing must not wait for it.
        assert!(matches!(
            store.claim(&req).await.unwrap(),
            ClaimOutcome::Acquired { .. }
        ));
        tokio::time::timeout(std::time::Duration::from_secs(5), store.close())
            .await
            .expect("close returns while the store lives");
        assert!(matches!(
            store.claim(&req).await,
            Err(IdemError::StoreUnavailable { .. })
        ));
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
        }
    }

    #[test]
    fn statements_name_the_table() {
        let sql = Statements::new(&TableName::new("t1").unwrap());
        let text = format!("{sql:?}");
        assert!(
            !text.contains("{t}") && !text.contains("idem_record"),
            "{text}"
        );
        assert!(text.contains("FROM \\\"t1\\\""), "{text}");
    }

    #[tokio::test]
    async fn names_and_limits_sqlite_cannot_take_are_refused() {
        let store = SqliteStore::in_memory().await.unwrap();
        for bad in ["", "a-b", "main.idem_record", "x; DROP TABLE y"] {
            for refused in [
                store.clone().with_table(bad).err(),
                store.clone().with_token_table(bad).err(),
            ] {
                assert!(
                    matches!(refused, Some(IdemError::InvalidOptions { .. })),
                    "{bad}"
                );
            }
        }
        for (limits, names) in [
            (
                Limits {
                    max_snapshot_len: SQLITE_MAX_LENGTH + 1,
                    ..Limits::default()
                },
                "max_snapshot_len = 1000000001",
            ),
            (
                Limits {
                    max_key_len: usize::MAX,
                    ..Limits::default()
                },
                "max_key_len",
            ),
            (
                Limits {
                    max_biz_len: SQLITE_MAX_LENGTH + 1,
                    ..Limits::default()
                },
                "max_biz_len",
            ),
        ] {
            let err = store.clone().with_limits(limits).err().unwrap();
            let text = err.to_string();
            assert!(matches!(err, IdemError::InvalidOptions { .. }), "{err:?}");
            assert!(
                text.contains(names) && text.contains("1000000000"),
                "{text}"
            );
        }
        let at_bound = Limits {
            max_key_len: SQLITE_MAX_LENGTH,
            max_biz_len: SQLITE_MAX_LENGTH,
            max_snapshot_len: SQLITE_MAX_LENGTH,
        };
        let store = store.with_limits(at_bound.clone()).unwrap();
        assert_eq!(store.limits(), &at_bound);
    }

    /// Two stores on one database, each on its own tables, migrated side by side: neither sees
    /// the other's records.
    #[tokio::test]
    async fn two_tables_in_one_database_stay_apart() {
        let base = SqliteStore::in_memory().await.unwrap();
        let a = base.clone().with_table("idem_a").unwrap();
        let b = base
            .clone()
            .with_table("idem_b")
            .unwrap()
            .with_token_table("idem_b_tok")
            .unwrap();
        a.migrate().await.unwrap();
        b.migrate().await.unwrap();
        b.migrate().await.unwrap();
        let req = ClaimRequest {
            biz: "PAY",
            key: "k1",
            fingerprint: None,
            lease: Duration::from_secs(30),
            ttl: Duration::from_secs(3600),
        };
        let ClaimOutcome::Acquired { claim, .. } = a.claim(&req).await.unwrap() else {
            panic!("a fresh key")
        };
        a.complete("PAY", "k1", &claim, b"{\"Ok\":1}", req.ttl)
            .await
            .unwrap();
        assert!(b.load("PAY", "k1").await.unwrap().is_none());
        assert!(matches!(
            b.claim(&req).await.unwrap(),
            ClaimOutcome::Acquired { .. }
        ));
        assert!(matches!(
            a.claim(&req).await.unwrap(),
            ClaimOutcome::Replay { .. }
        ));
        let indexes: Vec<String> = sqlx::query_scalar(
            "SELECT name FROM sqlite_master WHERE type = 'index' AND name LIKE 'idem_b%' ORDER BY name",
        )
        .fetch_all(base.pool())
        .await
        .unwrap();
        assert_eq!(
            indexes,
            [
                "idem_b_expire_at",
                "idem_b_processing",
                "idem_b_result_until",
                "idem_b_tok_expire_at"
            ]
        );
    }
}
