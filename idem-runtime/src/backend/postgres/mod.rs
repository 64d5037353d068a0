//! PostgreSQL store (feature `postgres`), through sqlx.
//!
//! The same files as every SQL store: `statements.rs` the SQL text, `schema.rs` the migrations as
//! `migrate()` applies them, `records.rs` its part of the
//! record layer (`sql/records.rs`: its clock, the columns whose types differ, the claim's insert
//! and takeover), `tx.rs` the transactions
//! (`PgTx`: `tx = "…"` claims and transitions), `transition.rs` what state transitions bind,
//! `tokens.rs` the one-time submit tokens and their statements; and `builder.rs` the store's
//! options (`PgStoreBuilder`).

mod builder;
mod hosts;
mod records;
mod schema;
mod statements;
mod tokens;
mod transition;
mod tx;

use std::sync::Arc;
use std::time::Duration;

use sqlx::Postgres;
use sqlx::postgres::PgPool;
use sqlx::{AssertSqlSafe, SqlSafeStr};

use crate::clock::ClockOffset;
use crate::sql::claim::claim_by_cas;
use crate::sql::dialect::{Dialect, Savepoint};
use crate::sql::records::RecordConn;
use crate::sql::store::{Lent, SqlStore, with_conn};
use crate::sql::table::TableName;
use crate::sql::warm::{Warm, WarmLent};
use crate::store::order::ClaimOrder;
use crate::store::{ClaimOutcome, ClaimRequest, Limits};
use crate::{Busy, IdemError};
pub use builder::PgStoreBuilder;
use records::{Claiming, Claims};
pub(crate) use schema::migrations_named;
use statements::Statements;
pub use tokens::PgTokens;
pub use tx::{PgIsolation, PgTx};

/// A driver error as an [`IdemError`] of the right class.
pub(crate) fn db_error(e: sqlx::Error) -> IdemError {
    crate::sql::error::store_error(e, Dialect::Postgres)
}

/// How long a claim waits by default for a row lock another transaction holds (a claimant in
/// transaction mode) before it answers `InProgress`.
pub const DEFAULT_PG_LOCK_TIMEOUT: Duration = Duration::from_secs(3);

/// The longest `bytea` or `text` value Postgres holds: 1 GiB. What `PgStore::with_limits`
/// checks each limit against.
const PG_MAX_FIELD_LEN: usize = 1 << 30;

/// Keeps records in a PostgreSQL table (`idem_record` by default; any name, schema-qualified or
/// not, with [`PgStore::with_table`] or [`PgStoreBuilder::table`]).
///
/// Times come from the database's clock (`clock_timestamp()`), never the application's. A claim is
/// one statement (`INSERT … ON CONFLICT DO NOTHING` behind a read of the record, so a concurrent
/// insert of the same key neither raises 23505 nor aborts a transaction); a takeover is a
/// compare-and-set `UPDATE` on the record's fence. Transaction mode ([`PgStore::begin`]) claims in a
/// savepoint of the caller's transaction with a locking read, under the key's transaction-level
/// advisory lock, and bounds how long a duplicate waits for the claimant's transaction (`SET LOCAL
/// lock_timeout`, [`PgStoreBuilder::lock_timeout`]).
///
/// Several servers: a URL with a list of hosts,
/// `postgres://app@db1:5432,db2:5432/orders?target_session_attrs=read-write` (libpq's form, the
/// one pg_auto_failover's `pg_autoctl show uri --formation default` prints), connects to the
/// server that takes writes (`transaction_read_only` off), whatever its place in the list, and
/// follows it: when a statement finds its server gone or read-only, the store looks in the
/// background for the server that takes writes now and moves its pool there (each new
/// connection is checked; those opened before the move are closed). Until then statements answer
/// [`IdemError::StoreUnavailable`], which callers retry: a read-only server writes nothing, and
/// its refusal of the store's statements (SQLSTATE 25006) counts as unavailable for such a store,
/// never as success.
/// `target_session_attrs` may be `read-write`, `primary` or `any` (every call writes, so the store
/// uses the server that takes writes whichever is given); `read-only`, `standby` and
/// `prefer-standby` are refused. A body that finished while no server took writes is marked once
/// one does if its call's store timeout and lease outlast the failover (else its key waits out
/// the lease and may run again); with synchronous replication, pg_auto_failover's default for a
/// primary and a secondary, no claim or mark the store acknowledged is lost in the failover
/// (docs/RELIABILITY.md, "Growing and scaling out").
///
/// ```no_run
/// # use idem_runtime as idem;
/// # async fn demo() -> Result<(), idem_runtime::IdemError> {
/// let store = idem::PgStore::connect("postgres://postgres@127.0.0.1:5432/test").await?;
/// store.migrate().await?;
/// idem::register_store("postgres", store);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct PgStore {
    pool: PgPool,
    /// The connections the store's own statements keep between them (`sql/warm.rs`).
    warm: Warm<Postgres>,
    limits: Limits,
    offset: ClockOffset,
    table: TableName,
    token_table: TableName,
    sql: Arc<Statements>,
    token_sql: Arc<crate::sql::tokens::TokenStatements>,
    lock_timeout: Duration,
    /// The idle bound of a transaction that holds a transaction-mode claim, unless its call sets
    /// one (see [`crate::TxIdleTimeout`]).
    tx_idle: crate::TxIdleTimeout,
    /// Which step a claim sends first (`store/order.rs`).
    order: Arc<ClaimOrder>,
    /// The servers of a multi-host URL the pool follows (`hosts.rs`); `None` for one server.
    following: Option<Arc<hosts::Following>>,
}

/// Checks `limits` against what the table's `text` and `bytea` columns hold.
fn check_pg_limits(limits: &Limits) -> Result<(), IdemError> {
    let bounds = Limits {
        max_key_len: PG_MAX_FIELD_LEN,
        max_biz_len: PG_MAX_FIELD_LEN,
        max_snapshot_len: PG_MAX_FIELD_LEN,
    };
    crate::store::check_limits("a Postgres `text` or `bytea` column", limits, &bounds)
}

/// The largest `lock_timeout` Postgres accepts: `i32::MAX` milliseconds.
const MAX_PG_LOCK_TIMEOUT: Duration = Duration::from_millis(i32::MAX as u64);

/// A lock timeout as Postgres reads it: whole milliseconds.
fn lock_timeout_text(timeout: Duration) -> String {
    format!("{}ms", timeout.as_millis().max(1))
}

impl PgStore {
    /// The DDL of the records and tokens tables and of the records' later indexes (the one
    /// [`Store::stuck`](crate::Store::stuck) reads: first over every record, then over the PROCESSING ones only, which
    /// replaces it; then the column `result_until` and its index, for results kept shorter than
    /// their record), in order, as shipped in `migrations/postgres/` (with the default names
    /// `idem_record` and `idem_token`); for services that apply migrations with their own tool.
    /// [`PgStore::migrate`] applies them with the store's names, all but the third: the fourth
    /// drops the index the third builds, so a schema made from nothing never builds it.
    pub const MIGRATIONS: [&'static str; 5] = [
        include_str!("../../../migrations/postgres/0001_idem_record.sql"),
        include_str!("../../../migrations/postgres/0002_idem_token.sql"),
        include_str!("../../../migrations/postgres/0003_idem_record_stuck.sql"),
        include_str!("../../../migrations/postgres/0004_idem_record_processing.sql"),
        include_str!("../../../migrations/postgres/0005_idem_record_result_until.sql"),
    ];

    /// Rows per sweep statement to give [`crate::Sweeper::new`] for this store: 1,000, small
    /// enough that no statement locks for long, large enough to keep up with a busy table.
    pub const SWEEP_BATCH: usize = 1_000;

    /// Options: table names, pool size, limits, lock timeout.
    pub fn builder() -> PgStoreBuilder {
        PgStoreBuilder::default()
    }

    /// Opens a pool on `url` with the default options (table `idem_record`).
    ///
    /// # Errors
    /// As [`PgStoreBuilder::connect`].
    pub async fn connect(url: &str) -> Result<Self, IdemError> {
        Self::builder().connect(url).await
    }

    /// A store on an existing pool with the default options.
    pub fn from_pool(pool: PgPool) -> Self {
        Self::builder().store(pool)
    }

    /// The same store on another records table (`[A-Za-z_][A-Za-z0-9_]*`, optionally
    /// `schema.table`; the schema must exist): each service, or each test, may keep its records in
    /// a table of its own. Unless [`PgStore::with_token_table`] named one, the submit tokens move
    /// with it, to `<name>_tok` in the same schema (`idem_token` beside the default `idem_record`):
    /// the rule of the URL's `idem_table` option too.
    ///
    /// # Errors
    /// [`IdemError::InvalidOptions`] for a name idem cannot use.
    pub fn with_table(mut self, name: &str) -> Result<Self, IdemError> {
        let table = TableName::new(name)?;
        if self.token_table == self.table.tokens_table() {
            self.token_table = table.tokens_table();
            self.token_sql = Arc::new(tokens::token_statements(&self.token_table));
        }
        self.table = table;
        self.sql = Arc::new(Statements::new(&self.table));
        Ok(self)
    }

    /// The same store with its submit tokens in another table (default: `<table>_tok` beside a
    /// records table of another name, `idem_token` beside `idem_record`; same rules), whatever
    /// [`PgStore::with_table`] names after.
    ///
    /// # Errors
    /// [`IdemError::InvalidOptions`] for a name idem cannot use.
    pub fn with_token_table(mut self, name: &str) -> Result<Self, IdemError> {
        self.token_table = TableName::new(name)?;
        self.token_sql = Arc::new(tokens::token_statements(&self.token_table));
        Ok(self)
    }

    /// The same store with other limits, checked against what the columns hold: a biz type, a key
    /// (`text`) and a snapshot (`bytea`) each of at most 1 GiB. (The
    /// primary key's B-tree index holds a business type and key of about 2.7 kB together, after
    /// compression; a longer pair is refused by the database when it is written.)
    ///
    /// # Errors
    /// [`IdemError::InvalidOptions`] naming the limit a column cannot hold and the bound.
    pub fn with_limits(mut self, limits: Limits) -> Result<Self, IdemError> {
        check_pg_limits(&limits)?;
        self.limits = limits;
        Ok(self)
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
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// The records' table, as configured.
    pub fn table(&self) -> &str {
        self.table.as_str()
    }

    /// The tokens' table, as configured.
    pub fn token_table(&self) -> &str {
        self.token_table.as_str()
    }

    /// How long a claim waits for a row lock held by another transaction.
    pub fn lock_timeout(&self) -> Duration {
        self.lock_timeout
    }

    /// The same store with another idle bound for the transactions that hold a transaction-mode
    /// claim, for calls that set none of their own ([`crate::Call::tx_idle_timeout`]): by
    /// default [`TxIdleTimeout::Lease`](crate::TxIdleTimeout::Lease), the call's lease. Postgres
    /// ends the session of such a transaction once it sat idle (no statement) this long
    /// (`idle_in_transaction_session_timeout`, set for that transaction only, in the claim's own
    /// statement), rolling it back, so a repeat can take the key of a client that vanished
    /// mid-transaction.
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

    /// The text of one of the store's statements (`claim`, `claim_locking`, `take`, `read`,
    /// `complete`, `fail`, `renew`, `load`, `sweep`, `stuck`), for a benchmark that sends the same
    /// statements by hand and a test that reads their plans: behind `test-util`, not API.
    #[cfg(any(test, feature = "test-util"))]
    #[doc(hidden)]
    pub fn __statement(&self, name: &str) -> Option<&str> {
        self.sql.get(name)
    }

    /// Milliseconds the test clock adds to the database's clock.
    fn offset_ms(&self) -> i64 {
        self.offset.ms()
    }

    /// Begins a transaction (the database's default isolation, usually READ COMMITTED) for
    /// `tx = "…"` calls and state transitions. It carries this store: a `tx = "…"` call claims in
    /// this store's table by construction.
    ///
    /// # Errors
    /// [`IdemError::StoreUnavailable`] when no connection can be had, or when the server does not
    /// answer within the store timeout in force ([`crate::store::with_store_timeout`], default
    /// [`crate::store::DEFAULT_STORE_TIMEOUT`]).
    pub async fn begin(&self) -> Result<PgTx, IdemError> {
        self.begin_sending("BEGIN").await
    }

    /// Begins a transaction at `isolation`. Under REPEATABLE READ and SERIALIZABLE a claim that
    /// meets a record written after the transaction's snapshot fails with a serialization failure
    /// ([`IdemError::restarts_transaction`]): run the transaction again
    /// ([`crate::retry_transaction`]).
    ///
    /// # Errors
    /// [`IdemError::StoreUnavailable`] when no connection can be had, or when the server does not
    /// answer within the store timeout in force.
    pub async fn begin_with(&self, isolation: PgIsolation) -> Result<PgTx, IdemError> {
        self.begin_sending(isolation.begin_statement()).await
    }

    /// Begins with `begin` and, while the store's claims mostly create records (`store/order.rs`),
    /// opens in the same round trip the savepoint the transaction's first claim takes when nothing
    /// ran on the connection before it (see [`PgTx`]). While they mostly meet one, a claim reads
    /// first and a replay needs no savepoint: none is opened.
    async fn begin_sending(&self, begin: &str) -> Result<PgTx, IdemError> {
        let (ready, open) = Savepoint::with_begin(&self.order);
        let statement = format!("{begin}{open}");
        let mut watch = self.following.as_ref().map(|f| f.watch());
        let tx = crate::engine::tx_step(
            crate::engine::TxStep::Begin,
            self.pool
                .begin_with(AssertSqlSafe(statement).into_sql_str()),
            db_error,
        )
        .await;
        let tx = match &mut watch {
            Some(watch) => watch.settled(tx),
            None => tx,
        }?;
        Ok(PgTx::new(tx, self.clone(), ready, ()))
    }

    /// The claim's steps on `conn`, its insert locking as `claiming` says.
    fn claims<'c>(&'c self, conn: &'c mut sqlx::PgConnection, claiming: Claiming) -> Claims<'c> {
        Claims::new(self.records(conn), &self.sql, claiming)
    }

    /// `done` as the failover watch (if the store follows its primary) reads it: a read-only
    /// server's refusal is unavailability, and an unavailable server sends every warm connection
    /// back to the pool.
    fn watched<R>(
        &self,
        watch: Option<hosts::Watch<'_>>,
        done: Result<R, IdemError>,
    ) -> Result<R, IdemError> {
        let Some(mut watch) = watch else {
            return done;
        };
        let done = watch.settled(done);
        if done.is_err() && watch.armed() {
            // The server went, or stopped taking writes: none of the warm connections is kept.
            self.warm.cool();
        }
        done
    }

    /// A lock wait that timed out while claiming: the record is held by a transaction still
    /// running, so the key is in progress.
    fn lock_timed_out(
        &self,
        outcome: Result<ClaimOutcome, IdemError>,
    ) -> Result<ClaimOutcome, IdemError> {
        match outcome {
            Err(IdemError::StoreBusy {
                reason: Busy::LockTimeout,
                ..
            }) => Ok(ClaimOutcome::InProgress {
                retry_after: self.lock_timeout,
            }),
            other => other,
        }
    }
}

impl crate::TransactionalStore for PgStore {
    type Tx = PgTx;

    async fn begin_tx(&self) -> Result<PgTx, IdemError> {
        self.begin().await
    }
}

/// A connection a [`PgStore`] lent: a warm one, and the failover watch of a store that follows
/// its primary across hosts.
pub(crate) struct PgLent<'a> {
    lent: WarmLent<'a, Postgres>,
    watch: Option<hosts::Watch<'a>>,
    store: &'a PgStore,
}

impl Lent<sqlx::PgConnection> for PgLent<'_> {
    fn conn(&mut self) -> &mut sqlx::PgConnection {
        self.lent.conn()
    }

    fn settle<R>(self, done: Result<R, IdemError>) -> Result<R, IdemError> {
        let done = self.lent.settle(done);
        self.store.watched(self.watch, done)
    }
}

#[async_trait::async_trait]
impl SqlStore for PgStore {
    type Db = Postgres;
    type Lent<'a> = PgLent<'a>;
    type Claims<'c> = Claims<'c>;
    const BACKEND: &'static str = "postgres";

    fn own_limits(&self) -> &Limits {
        &self.limits
    }

    fn order(&self) -> &ClaimOrder {
        &self.order
    }

    async fn lend(&self) -> Result<PgLent<'_>, IdemError> {
        let watch = self.following.as_ref().map(|f| f.watch());
        match self.warm.lend(db_error).await {
            Ok(lent) => Ok(PgLent {
                lent,
                watch,
                store: self,
            }),
            Err(e) => self.watched(watch, Err(e)),
        }
    }

    #[allow(refining_impl_trait)]
    fn records<'c>(&'c self, conn: &'c mut sqlx::PgConnection) -> RecordConn<'c, Postgres> {
        RecordConn::new(conn, &self.sql.records, self.offset_ms())
    }

    fn lease_claims<'c>(&'c self, conn: &'c mut sqlx::PgConnection) -> Claims<'c> {
        self.claims(conn, Claiming::Lease)
    }

    async fn claim_key(&self, req: &ClaimRequest<'_>) -> Result<ClaimOutcome, IdemError> {
        let outcome = with_conn(self, async |conn| {
            claim_by_cas(&mut self.claims(conn, Claiming::Lease), req, &self.order).await
        })
        .await;
        self.lock_timed_out(outcome)
    }

    async fn begin(&self) -> Result<PgTx, IdemError> {
        PgStore::begin(self).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn limits_past_a_column_are_refused_before_connecting() {
        let big = Limits {
            max_snapshot_len: PG_MAX_FIELD_LEN + 1,
            ..Limits::default()
        };
        let err = check_pg_limits(&big).unwrap_err();
        assert!(
            err.to_string().contains("max_snapshot_len = 1073741825")
                && err.to_string().contains("1073741824"),
            "{err}"
        );
        // Nothing listens there: the limits are refused before any connection is tried.
        let refused = PgStore::builder()
            .limits(big)
            .connect("postgres://nobody@127.0.0.1:9/none")
            .await
            .err()
            .unwrap();
        assert!(
            matches!(refused, IdemError::InvalidOptions { .. }),
            "{refused:?}"
        );
        let at_bound = Limits {
            max_key_len: PG_MAX_FIELD_LEN,
            max_biz_len: PG_MAX_FIELD_LEN,
            max_snapshot_len: PG_MAX_FIELD_LEN,
        };
        assert!(check_pg_limits(&at_bound).is_ok());
    }
}
