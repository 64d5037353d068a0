//! The options of a [`PgStore`] and how it connects.

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};

use super::statements::Statements;
use super::{
    DEFAULT_PG_LOCK_TIMEOUT, MAX_PG_LOCK_TIMEOUT, PgStore, check_pg_limits, lock_timeout_text,
};
use crate::IdemError;
use crate::clock::ClockOffset;
use crate::sql::table::TableName;
use crate::sql::warm::Warm;
use crate::store::Limits;

/// Options of a [`PgStore`]: its table names, its pool, its limits and its lock timeout.
///
/// ```no_run
/// # use idem_runtime as idem;
/// # async fn demo() -> Result<(), idem_runtime::IdemError> {
/// let store = idem::PgStore::builder()
///     .table("billing.idem_record")?
///     .max_connections(32)
///     .connect("postgres://postgres@127.0.0.1:5432/test")
///     .await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct PgStoreBuilder {
    table: TableName,
    token_table: Option<TableName>,
    limits: Limits,
    max_connections: u32,
    acquire_timeout: Duration,
    connect_timeout: Duration,
    lock_timeout: Duration,
    tx_idle: crate::TxIdleTimeout,
}

impl Default for PgStoreBuilder {
    fn default() -> Self {
        PgStoreBuilder {
            table: TableName::default_table(),
            token_table: None,
            limits: Limits::default(),
            max_connections: 16,
            acquire_timeout: Duration::from_secs(30),
            connect_timeout: crate::DEFAULT_CONNECT_TIMEOUT,
            lock_timeout: DEFAULT_PG_LOCK_TIMEOUT,
            tx_idle: crate::TxIdleTimeout::Lease,
        }
    }
}

impl PgStoreBuilder {
    /// The records' table: `[A-Za-z_][A-Za-z0-9_]*`, optionally `schema.table` (the schema must
    /// exist); quoted in every statement. Default `idem_record`.
    ///
    /// # Errors
    /// [`IdemError::InvalidOptions`] for a name idem cannot use.
    pub fn table(mut self, name: &str) -> Result<Self, IdemError> {
        self.table = TableName::new(name)?;
        Ok(self)
    }

    /// The submit tokens' table (same rules). Default `<table>_tok` in the records' schema
    /// (`idem_token` beside the default `idem_record`), as the URL's `idem_table` option names it.
    ///
    /// # Errors
    /// [`IdemError::InvalidOptions`] for a name idem cannot use.
    pub fn token_table(mut self, name: &str) -> Result<Self, IdemError> {
        self.token_table = Some(TableName::new(name)?);
        Ok(self)
    }

    /// The limits the store enforces before it writes; checked by [`PgStoreBuilder::connect`] and
    /// [`PgStoreBuilder::build`] as [`PgStore::with_limits`] checks them.
    pub fn limits(mut self, limits: Limits) -> Self {
        self.limits = limits;
        self
    }

    /// Connections of the pool [`PgStoreBuilder::connect`] opens (default 16).
    pub fn max_connections(mut self, n: u32) -> Self {
        self.max_connections = n.max(1);
        self
    }

    /// How long [`PgStoreBuilder::connect`] and every later checkout wait for a connection
    /// (default 30 s; 1 ms ..= [`crate::MAX_DURATION`], checked by `connect`).
    pub fn acquire_timeout(mut self, timeout: Duration) -> Self {
        self.acquire_timeout = timeout;
        self
    }

    /// How long [`PgStoreBuilder::connect`] may take to open its first connection (default
    /// [`crate::connect::DEFAULT_CONNECT_TIMEOUT`], 5 s; 1 ms ..= [`crate::MAX_DURATION`], checked by
    /// `connect`). A refused connection fails at once; a server that does not answer fails after
    /// this long; either way the error names the server (`host:port`) and the cause.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// How long a claim waits for a row lock held by another transaction (a claimant in
    /// transaction mode whose business is still running) before it answers `InProgress`
    /// (default 3 s). Set in transaction mode for a claim that waits for another transaction
    /// (`SET LOCAL lock_timeout`, restored after it; a claim that finds its key's lock free sets
    /// nothing), and as the session's `lock_timeout` of the pool [`PgStoreBuilder::connect`] opens.
    ///
    /// Range: 1 ms ..= 2,147,483,647 ms (about 24.8 days, the largest `lock_timeout` Postgres
    /// accepts); a value outside it is clamped to it.
    pub fn lock_timeout(mut self, timeout: Duration) -> Self {
        self.lock_timeout = timeout.clamp(Duration::from_millis(1), MAX_PG_LOCK_TIMEOUT);
        self
    }

    /// How long a transaction that holds a transaction-mode claim may sit idle (no statement)
    /// before Postgres ends its session and rolls it back, freeing the key for a repeat, for the
    /// calls that set none of their own ([`crate::Call::tx_idle_timeout`]). Default: each call's
    /// lease. Range 1 ms ..= [`MAX_TX_IDLE_TIMEOUT`](crate::MAX_TX_IDLE_TIMEOUT), checked by
    /// [`PgStoreBuilder::connect`] and [`PgStoreBuilder::build`]. See
    /// [`PgStore::with_tx_idle_timeout`].
    pub fn tx_idle_timeout(mut self, idle: Duration) -> Self {
        self.tx_idle = crate::TxIdleTimeout::After(idle);
        self
    }

    /// No idle bound from idem for transactions that hold a claim, for calls that set none of
    /// their own: the server's `idle_in_transaction_session_timeout` applies (none by default).
    pub fn no_tx_idle_timeout(mut self) -> Self {
        self.tx_idle = crate::TxIdleTimeout::Off;
        self
    }

    /// Opens a pool on `url` (`postgres://user@host:port/db`, or several servers,
    /// `postgres://user@h1:port,h2:port/db?target_session_attrs=read-write`, followed as
    /// [`PgStore`] says) and makes the store.
    ///
    /// # Errors
    /// [`IdemError::InvalidOptions`] for a malformed URL (for several servers also an empty host,
    /// a port out of range or a `target_session_attrs` that asks for a server taking no writes),
    /// an acquire timeout or a transaction idle timeout out of range or limits a column cannot
    /// hold (before any connection is opened), or a server at the URL's address that answers in
    /// another protocol than Postgres's (another database's port);
    /// [`IdemError::StoreUnavailable`] when the server cannot be reached, or, for several, when
    /// none of them takes writes.
    pub async fn connect(self, url: &str) -> Result<PgStore, IdemError> {
        check_pg_limits(&self.limits)?;
        self.tx_idle.check()?;
        crate::net::check_pool_timeouts(self.acquire_timeout, self.connect_timeout)?;
        if let Some(servers) = super::hosts::parse(url)? {
            return self.connect_following(servers).await;
        }
        let options = PgConnectOptions::from_str(url)
            .map_err(|e| IdemError::InvalidOptions {
                reason: format!("not a Postgres URL: {e}"),
            })?
            .options([("lock_timeout", lock_timeout_text(self.lock_timeout))]);
        let server = crate::net::server(
            options.get_host(),
            options.get_port(),
            options.get_socket().map(|p| p.as_path()),
        );
        let dialect = crate::sql::dialect::Dialect::Postgres;
        crate::net::reach::<sqlx::PgConnection>(
            "Postgres",
            dialect,
            &server,
            &options,
            self.connect_timeout,
        )
        .await?;
        let pool = self.pool_options().connect_with(options);
        let pool =
            crate::net::within_connect("Postgres", &server, self.connect_timeout, pool).await?;
        Ok(self.store(pool))
    }

    /// The pool's options. A statement on a dead connection fails as unavailable and idem tries
    /// again on another, so the pool does not ping every connection it hands out (a round trip
    /// per statement).
    fn pool_options(&self) -> PgPoolOptions {
        PgPoolOptions::new()
            .max_connections(self.max_connections)
            .acquire_timeout(self.acquire_timeout)
            .test_before_acquire(false)
    }

    /// [`PgStoreBuilder::connect`] on a URL with several servers (or `target_session_attrs`):
    /// the pool on the one that takes writes, following it when it moves (`hosts.rs`).
    async fn connect_following(self, servers: Vec<PgConnectOptions>) -> Result<PgStore, IdemError> {
        let lock_timeout = lock_timeout_text(self.lock_timeout);
        let servers = servers
            .into_iter()
            .map(|options| options.options([("lock_timeout", lock_timeout.as_str())]))
            .collect();
        let hosts = super::hosts::Hosts::new(servers, self.connect_timeout);
        let first = hosts.find().await?;
        let pool = hosts
            .watched(first, self.pool_options())
            .connect_with(hosts.options(first).clone());
        let pool =
            crate::net::within_connect("Postgres", hosts.name(first), self.connect_timeout, pool)
                .await?;
        let following = super::hosts::Following::new(hosts, pool.clone());
        let mut store = self.store(pool);
        store.following = Some(following);
        Ok(store)
    }

    /// The store on an existing pool (its database must have the tables: see
    /// [`PgStore::migrate`]).
    ///
    /// # Errors
    /// [`IdemError::InvalidOptions`] for limits a column cannot hold (see
    /// [`PgStore::with_limits`]), or a transaction idle timeout out of range.
    pub fn build(self, pool: PgPool) -> Result<PgStore, IdemError> {
        check_pg_limits(&self.limits)?;
        self.tx_idle.check()?;
        Ok(self.store(pool))
    }

    /// The store on `pool`, its options already checked.
    pub(super) fn store(self, pool: PgPool) -> PgStore {
        let token_table = self
            .token_table
            .unwrap_or_else(|| self.table.tokens_table());
        PgStore {
            warm: Warm::new(pool.clone()),
            pool,
            limits: self.limits,
            offset: ClockOffset::default(),
            sql: Arc::new(Statements::new(&self.table)),
            token_sql: Arc::new(super::tokens::token_statements(&token_table)),
            table: self.table,
            token_table,
            lock_timeout: self.lock_timeout,
            tx_idle: self.tx_idle,
            order: Arc::default(),
            following: None,
        }
    }
}
