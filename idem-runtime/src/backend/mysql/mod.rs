//! MySQL / MariaDB store (feature `mysql`): InnoDB tables on MySQL 8 or MariaDB ≥ 10.5, through
//! sqlx.
//!
//! The same files as every SQL store: `statements.rs` the SQL text, `schema.rs` the migrations as
//! `migrate()` applies them, `records.rs` its part of the
//! record layer (`sql/records.rs`: its clock, the columns whose types differ, the claim's insert
//! and takeover), `tx.rs` the transactions
//! (`MySqlTx`: `tx = "…"` claims and transitions), `transition.rs` what state transitions bind,
//! `tokens.rs` the one-time submit tokens and their statements.
//!
//! What the SQL is written around (each checked against MariaDB 10.11 by `tests/tests/mysql_store.rs`):
//! - sqlx's MySQL client sets `CLIENT_FOUND_ROWS`, so an `INSERT … ON DUPLICATE KEY UPDATE k = k`
//!   reports a row for an unchanged duplicate, and `INSERT IGNORE` turns data errors into
//!   warnings. A claim is a plain `INSERT`; the duplicate-key error (1062) is the exact answer
//!   "the record exists".
//! - The new record's fence is returned by the `INSERT` itself, in the OK packet's last-insert id
//!   (`LAST_INSERT_ID(expr)`), so a new key is one round trip on MySQL too (no `RETURNING`).
//! - InnoDB deadlocks (1213) concurrent inserts of one key, also when a claimant rolls back while
//!   others wait (a batch whose insert met an existing key, whatever the order of its keys).
//!   Lease mode retries the claim, of one key or a batch, with bounded jittered back-off (counted
//!   in `idem_store_retries_total`); tx mode cannot (the
//!   whole transaction was rolled back) and says "restart the transaction" (see
//!   [`crate::retry_transaction`]).
//! - Times come from the database: `UTC_TIMESTAMP(6)` as microseconds since the epoch, which no
//!   session time zone or DST change shifts.

mod builder;
#[macro_use]
mod statements;
mod records;
mod schema;
mod tokens;
mod transition;
mod tx;

use std::sync::Arc;
use std::time::Duration;

use sqlx::mysql::MySqlPool;
use sqlx::{AssertSqlSafe, MySql};

use crate::IdemError;
use crate::clock::ClockOffset;
use crate::sql::claim::claim_by_cas;
use crate::sql::dialect::{Dialect, Savepoint};
use crate::sql::records::RecordConn;
use crate::sql::store::{SqlStore, with_conn};
use crate::sql::table::TableName;
use crate::sql::warm::{Warm, WarmLent};
use crate::store::order::ClaimOrder;
use crate::store::{ClaimOutcome, ClaimRequest, Limits};
pub use builder::MySqlStoreBuilder;
use records::Claims;
pub(crate) use schema::migrations_named;
use statements::Statements;
pub use tokens::MySqlTokens;
pub use tx::MySqlTx;

/// The widest values the table's columns hold: biz type and key (characters, so bytes too), and
/// the result snapshot (a `MEDIUMBLOB`).
const MAX_BIZ_COLUMN: usize = 64;
const MAX_KEY_COLUMN: usize = 255;
const MAX_RESULT_COLUMN: usize = (1 << 24) - 1;

/// How long a statement waits for a row lock held by another transaction, by default: a duplicate
/// in transaction mode waits this long for the first claimant's commit, then answers `InProgress`.
const DEFAULT_LOCK_WAIT: Duration = Duration::from_secs(2);

/// Keeps records in a MySQL or MariaDB table (`idem_record` unless [`MySqlStore::with_table`]
/// names another).
///
/// ```no_run
/// # use idem_runtime as idem;
/// # async fn demo() -> Result<(), idem_runtime::IdemError> {
/// let store = idem::MySqlStore::connect("mysql://root@127.0.0.1:3306/test").await?;
/// store.migrate().await?;
/// idem::register_store("mysql", store);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct MySqlStore {
    pool: MySqlPool,
    /// The connections the store's own statements keep between them (`sql/warm.rs`).
    warm: Warm<MySql>,
    limits: Limits,
    offset: ClockOffset,
    table: TableName,
    token_table: TableName,
    lock_wait_secs: u64,
    /// The idle bound of a transaction that holds a transaction-mode claim, unless its call sets
    /// one (see [`crate::TxIdleTimeout`]).
    tx_idle: crate::TxIdleTimeout,
    sql: Statements,
    /// Which step a claim sends first (`store/order.rs`).
    order: Arc<ClaimOrder>,
}

/// A driver error as an [`IdemError`] of the right class.
pub(crate) fn db_error(e: sqlx::Error) -> IdemError {
    crate::sql::error::store_error(e, Dialect::MySQL)
}

/// The server's error number, when `e` is a MySQL / MariaDB error.
pub(crate) fn error_number(e: &sqlx::Error) -> Option<u16> {
    match e {
        sqlx::Error::Database(db) => database_error_number(&**db),
        _ => None,
    }
}

/// The server's error number, when `db` is a MySQL / MariaDB refusal (their SQLSTATE is too
/// coarse: a lock wait timeout is `HY000`); `sql/error.rs` sorts the refusal by it.
pub(crate) fn database_error_number(db: &dyn sqlx::error::DatabaseError) -> Option<u16> {
    db.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
        .map(|e| e.number())
}

impl MySqlStore {
    /// The DDL of the `idem_record` and `idem_token` tables, of the records' later index (the
    /// one [`Store::stuck`](crate::Store::stuck) reads), and of the column `result_until` and its index, for results
    /// kept shorter than their record (each of the last three applied once), in order, as shipped in `migrations/mysql/`; for
    /// services that apply migrations with their own tool.
    /// [`MySqlStore::migrate`] applies them with the store's table names.
    pub const MIGRATIONS: [&'static str; 5] = [
        include_str!("../../../migrations/mysql/0001_idem_record.sql"),
        include_str!("../../../migrations/mysql/0002_idem_token.sql"),
        include_str!("../../../migrations/mysql/0003_idem_record_stuck.sql"),
        include_str!("../../../migrations/mysql/0004_idem_record_result_until.sql"),
        include_str!("../../../migrations/mysql/0005_idem_record_result_until_index.sql"),
    ];

    /// Connects a pool of up to 16 connections to `url` (`mysql://user:pass@host:3306/db`), each
    /// session with a lock wait of 2 s (see [`MySqlStore::connect_with`]).
    ///
    /// # Errors
    /// [`IdemError::StoreUnavailable`] when the server cannot be reached.
    pub async fn connect(url: &str) -> Result<Self, IdemError> {
        Self::connect_with(url, 16, DEFAULT_LOCK_WAIT).await
    }

    /// Connects a pool of up to `max_connections` to `url`. Every session gets
    /// `innodb_lock_wait_timeout = lock_wait` (whole seconds, at least 1): how long a statement
    /// waits for a row another transaction holds before it gives up. A duplicate in transaction
    /// mode waits that long for the first claimant's commit, then answers `InProgress`, so a
    /// retry storm cannot hold the pool for InnoDB's default of 50 s.
    ///
    /// # Errors
    /// [`IdemError::StoreUnavailable`] when the server cannot be reached;
    /// [`IdemError::InvalidOptions`] for a malformed URL.
    pub async fn connect_with(
        url: &str,
        max_connections: u32,
        lock_wait: Duration,
    ) -> Result<Self, IdemError> {
        Self::builder()
            .max_connections(max_connections)
            .lock_wait(lock_wait)
            .connect(url)
            .await
    }

    /// The options of the pool [`MySqlStoreBuilder::connect`] opens: its size, lock wait, acquire
    /// and connect timeouts.
    pub fn builder() -> MySqlStoreBuilder {
        MySqlStoreBuilder::default()
    }

    /// A store on an existing pool. Its sessions keep the lock wait they have (InnoDB's default is
    /// 50 s); [`MySqlStore::begin`] sets the store's (2 s) on each transaction it begins.
    pub fn from_pool(pool: MySqlPool) -> Self {
        let table = TableName::default_table();
        let token_table = TableName::new("idem_token").expect("a valid name");
        MySqlStore {
            sql: Statements::new(&table, &token_table),
            order: Arc::default(),
            warm: Warm::new(pool.clone()),
            pool,
            limits: Limits::default(),
            offset: ClockOffset::default(),
            table,
            token_table,
            lock_wait_secs: lock_wait_secs(DEFAULT_LOCK_WAIT),
            tx_idle: crate::TxIdleTimeout::Lease,
        }
    }

    /// The same store on another table (`[A-Za-z_][A-Za-z0-9_]*`, optionally `schema.table`):
    /// each service, or each test, may keep its records in a table of its own. Unless
    /// [`MySqlStore::with_token_table`] named one, the submit tokens move with it, to `<name>_tok`
    /// (`idem_token` beside the default `idem_record`): the rule of the URL's `idem_table` option
    /// too.
    ///
    /// # Errors
    /// [`IdemError::InvalidOptions`] for a name idem cannot use.
    pub fn with_table(mut self, name: &str) -> Result<Self, IdemError> {
        let table = TableName::new(name)?;
        if self.token_table == self.table.tokens_table() {
            self.token_table = table.tokens_table();
        }
        self.table = table;
        self.sql = Statements::new(&self.table, &self.token_table);
        Ok(self)
    }

    /// The same store with its submit tokens in another table (default: `<table>_tok` beside a
    /// records table of another name, `idem_token` beside `idem_record`), whatever `with_table`
    /// names after.
    ///
    /// # Errors
    /// [`IdemError::InvalidOptions`] for a name idem cannot use.
    pub fn with_token_table(mut self, name: &str) -> Result<Self, IdemError> {
        self.token_table = TableName::new(name)?;
        self.sql = Statements::new(&self.table, &self.token_table);
        Ok(self)
    }

    /// The same store with other limits, checked against what the table's columns hold: a biz
    /// type of at most 64 bytes, a key of at most 255 bytes, a snapshot under 16 MiB (a
    /// `MEDIUMBLOB`; the server's `max_allowed_packet` must let it through too).
    ///
    /// # Errors
    /// [`IdemError::InvalidOptions`] naming the limit the table cannot hold and the bound.
    pub fn with_limits(mut self, limits: Limits) -> Result<Self, IdemError> {
        let bounds = Limits {
            max_key_len: MAX_KEY_COLUMN,
            max_biz_len: MAX_BIZ_COLUMN,
            max_snapshot_len: MAX_RESULT_COLUMN,
        };
        crate::store::check_limits("the MySQL table", &limits, &bounds)?;
        self.limits = limits;
        Ok(self)
    }

    /// The same store with another lock wait for the transactions it begins (whole seconds,
    /// 1 ..= 1,073,741,824, InnoDB's range; a value outside it is clamped to it; see
    /// [`MySqlStore::connect_with`]).
    pub fn with_lock_wait(mut self, lock_wait: Duration) -> Self {
        self.lock_wait_secs = lock_wait_secs(lock_wait);
        self
    }

    /// The same store with another idle bound for the transactions it begins that hold a
    /// transaction-mode claim, for calls that set none of their own
    /// ([`crate::Call::tx_idle_timeout`]): by default
    /// [`TxIdleTimeout::Lease`](crate::TxIdleTimeout::Lease), the call's lease. MariaDB closes
    /// the connection of such a transaction once it sat idle (no statement) this long after it
    /// wrote (`idle_write_transaction_timeout`, whole seconds, rounded up), rolling it back, so a
    /// repeat can take the key of a client that vanished mid-transaction. MySQL 8 has no such
    /// variable: there it is not bounded (see [`MySqlStore::begin`]).
    ///
    /// # Errors
    /// [`IdemError::InvalidOptions`] for a duration outside 1 ms ..=
    /// [`MAX_TX_IDLE_TIMEOUT`](crate::MAX_TX_IDLE_TIMEOUT).
    pub fn with_tx_idle_timeout(mut self, idle: crate::TxIdleTimeout) -> Result<Self, IdemError> {
        self.tx_idle = idle.check()?;
        Ok(self)
    }

    /// The idle bound of transactions that hold a claim, for calls that set none.
    pub fn tx_idle_timeout(&self) -> crate::TxIdleTimeout {
        self.tx_idle
    }

    /// The same store on a [`TestClock`](crate::TestClock) (feature `test-util`): every statement reads the database's clock plus the
    /// clock's offset.
    #[cfg(any(test, feature = "test-util"))]
    pub fn with_test_clock(mut self, clock: crate::clock::TestClock) -> Self {
        self.offset = ClockOffset::new(clock);
        self
    }

    /// The pool, for the application's own queries.
    ///
    /// The store's own statements keep a connection that answered for their next one, up to half
    /// the pool's connections (sqlx would ping it on its way back to the pool, a round trip per
    /// statement); one left idle 100 ms goes back to the pool within the next 100 ms. So your
    /// queries may wait up to 200 ms for one when the pool is otherwise full.
    pub fn pool(&self) -> &MySqlPool {
        &self.pool
    }

    /// The record table's name.
    pub fn table(&self) -> &str {
        self.table.as_str()
    }

    /// The submit tokens' table, as configured.
    pub fn token_table(&self) -> &str {
        self.token_table.as_str()
    }

    /// Begins a transaction for `tx = "…"` calls and state transitions, with the store's lock wait
    /// and idle bound on its session, set in the round trip of its `BEGIN` (`SET SESSION
    /// innodb_lock_wait_timeout = n /*M! , idle_write_transaction_timeout = s */; BEGIN`: one
    /// statement more, no round trip).
    ///
    /// The idle bound ([`crate::TxIdleTimeout`]) is MariaDB's `idle_write_transaction_timeout`:
    /// once the transaction has written (a claim), the server closes a connection that sits idle
    /// longer than it, and the transaction rolls back. MariaDB has no transaction-local `SET`, so
    /// it is a session variable: `begin` sets it on every transaction it begins (the store's
    /// bound with the default lease of 30 s, or `DEFAULT`, the server's own, when off), and a
    /// claim whose call asks for another bound sets that one in its own round trip. So an idem
    /// transaction never runs with a value a previous user of the connection left, and it is
    /// bounded from its first write, a claim's or not (a state transition's too). Your own
    /// transactions on [`MySqlStore::pool`] are not idem's: a connection keeps the value after
    /// it goes back to the pool (as it keeps `innodb_lock_wait_timeout`, which the store sets on
    /// every session it connects), so set it yourself in those if they run long idle gaps. The
    /// setting is written inside a MariaDB-only comment, which MySQL skips: MySQL 8 has no such
    /// variable, and there the idle transaction stays unbounded.
    ///
    /// The transaction carries this store: a `tx = "…"` call claims in this store's table by
    /// construction.
    ///
    /// # Errors
    /// [`IdemError::StoreUnavailable`] when no connection can be had, or when the server does not
    /// answer within the store timeout in force ([`crate::store::with_store_timeout`], default
    /// [`crate::store::DEFAULT_STORE_TIMEOUT`]).
    pub async fn begin(&self) -> Result<MySqlTx, IdemError> {
        // While claims mostly create records (`store/order.rs`), the first claim's savepoint goes
        // in this round trip too (see `MySqlTx`); while they mostly meet one, a claim reads first
        // and a replay needs none.
        let (ready, open) = Savepoint::with_begin(&self.order);
        // The bound of a call with the default lease: most claims need not set their own.
        let idle = idle_setting(self.tx_idle.bound(crate::DEFAULT_LEASE));
        let set = self.session_settings(&idle);
        let tx = crate::engine::tx_step(
            crate::engine::TxStep::Begin,
            self.pool
                .begin_with(AssertSqlSafe(format!("{set}; BEGIN{open}"))),
            db_error,
        )
        .await?;
        Ok(MySqlTx::new(tx, self.clone(), ready, idle))
    }

    /// The statement that sets a transaction's session: the store's lock wait, and (MariaDB
    /// only, in a comment MySQL skips) the idle bound `idle` ([`idle_setting`]).
    fn session_settings(&self, idle: &str) -> String {
        format!(
            "SET SESSION innodb_lock_wait_timeout = {} \
             /*M!100300 , idle_write_transaction_timeout = {idle} */",
            self.lock_wait_secs
        )
    }

    /// Milliseconds the test clock adds to the database's clock, in microseconds.
    fn offset_us(&self) -> i64 {
        self.offset.ms().saturating_mul(1000)
    }

    /// The lock wait as a duration (what a duplicate that timed out is told to wait).
    fn lock_wait(&self) -> Duration {
        Duration::from_secs(self.lock_wait_secs)
    }

    /// The claim's steps on `conn`, its reads current reads when `locking` (tx mode).
    fn claims<'c>(&'c self, conn: &'c mut sqlx::MySqlConnection, locking: bool) -> Claims<'c> {
        Claims::new(self.records(conn), &self.sql, locking)
    }
}

/// An idle bound as MariaDB's `idle_write_transaction_timeout` reads it: whole seconds, rounded
/// up, or `DEFAULT` (the server's own setting) for none.
fn idle_setting(bound: Option<Duration>) -> String {
    match bound {
        Some(d) => d.as_millis().div_ceil(1000).max(1).to_string(),
        None => "DEFAULT".to_owned(),
    }
}

fn lock_wait_secs(d: Duration) -> u64 {
    d.as_secs().clamp(1, 1_073_741_824)
}

impl crate::TransactionalStore for MySqlStore {
    type Tx = MySqlTx;

    async fn begin_tx(&self) -> Result<MySqlTx, IdemError> {
        self.begin().await
    }
}

#[async_trait::async_trait]
impl SqlStore for MySqlStore {
    type Db = MySql;
    type Lent<'a> = WarmLent<'a, MySql>;
    type Claims<'c> = Claims<'c>;
    const BACKEND: &'static str = "mysql";

    fn own_limits(&self) -> &crate::store::Limits {
        &self.limits
    }

    fn order(&self) -> &ClaimOrder {
        &self.order
    }

    async fn lend(&self) -> Result<WarmLent<'_, MySql>, IdemError> {
        self.warm.lend(db_error).await
    }

    #[allow(refining_impl_trait)]
    fn records<'c>(&'c self, conn: &'c mut sqlx::MySqlConnection) -> RecordConn<'c, MySql> {
        RecordConn::new(conn, &self.sql.records, self.offset_us())
    }

    fn lease_claims<'c>(&'c self, conn: &'c mut sqlx::MySqlConnection) -> Claims<'c> {
        self.claims(conn, false)
    }

    async fn claim_key(&self, req: &ClaimRequest<'_>) -> Result<ClaimOutcome, IdemError> {
        with_conn(self, async |conn| {
            let outcome = crate::sql::claim::retry_deadlocks!(
                "mysql",
                claim_by_cas(&mut self.claims(conn, false), req, &self.order).await
            );
            match outcome {
                Err(IdemError::StoreBusy {
                    reason: crate::Busy::LockTimeout,
                    ..
                }) => {
                    // A transaction holds the record (a tx-mode claimant not committed yet).
                    Ok(ClaimOutcome::InProgress {
                        retry_after: self.lock_wait(),
                    })
                }
                done => done,
            }
        })
        .await
    }

    async fn begin(&self) -> Result<MySqlTx, IdemError> {
        MySqlStore::begin(self).await
    }
}
