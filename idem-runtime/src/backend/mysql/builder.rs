//! The options of a [`MySqlStore`]'s pool and how it connects.

use std::str::FromStr;
use std::time::Duration;

use sqlx::mysql::{MySqlConnectOptions, MySqlPoolOptions};
use sqlx::{AssertSqlSafe, Executor};

use super::{DEFAULT_LOCK_WAIT, MySqlStore, lock_wait_secs};
use crate::IdemError;
use crate::sql::dialect::Dialect;

/// Options of the pool a [`MySqlStore`] opens: its size, its lock wait and its timeouts.
///
/// ```no_run
/// # use idem_runtime as idem;
/// # async fn demo() -> Result<(), idem_runtime::IdemError> {
/// use std::time::Duration;
/// let store = idem::MySqlStore::builder()
///     .max_connections(32)
///     .connect_timeout(Duration::from_secs(2))
///     .connect("mysql://root@127.0.0.1:3306/test")
///     .await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
#[must_use]
pub struct MySqlStoreBuilder {
    max_connections: u32,
    lock_wait: Duration,
    acquire_timeout: Duration,
    connect_timeout: Duration,
    tx_idle: crate::TxIdleTimeout,
}

impl Default for MySqlStoreBuilder {
    fn default() -> Self {
        MySqlStoreBuilder {
            max_connections: 16,
            lock_wait: DEFAULT_LOCK_WAIT,
            acquire_timeout: Duration::from_secs(30),
            connect_timeout: crate::DEFAULT_CONNECT_TIMEOUT,
            tx_idle: crate::TxIdleTimeout::Lease,
        }
    }
}

impl MySqlStoreBuilder {
    /// Connections of the pool (default 16; 0 is taken as 1).
    pub fn max_connections(mut self, n: u32) -> Self {
        self.max_connections = n.max(1);
        self
    }

    /// Every session's `innodb_lock_wait_timeout` (default 2 s; whole seconds, at least 1): see
    /// [`MySqlStore::connect_with`].
    pub fn lock_wait(mut self, lock_wait: Duration) -> Self {
        self.lock_wait = lock_wait;
        self
    }

    /// How long a checkout waits for a connection once the pool is open (default 30 s;
    /// 1 ms ..= [`crate::MAX_DURATION`], checked by `connect`).
    pub fn acquire_timeout(mut self, timeout: Duration) -> Self {
        self.acquire_timeout = timeout;
        self
    }

    /// How long [`MySqlStoreBuilder::connect`] may take to open its first connection (default
    /// [`crate::connect::DEFAULT_CONNECT_TIMEOUT`], 5 s; 1 ms ..= [`crate::MAX_DURATION`], checked by
    /// `connect`). A refused connection fails at once; a server that does not answer fails after
    /// this long; either way the error names the server (`host:port`) and the cause.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// How long a transaction the store begins may sit idle (no statement) once it holds a
    /// transaction-mode claim before MariaDB closes its connection and rolls it back, freeing
    /// the key for a repeat, for the calls that set none of their own
    /// ([`crate::Call::tx_idle_timeout`]). Default: each call's lease. Range 1 ms ..=
    /// [`MAX_TX_IDLE_TIMEOUT`](crate::MAX_TX_IDLE_TIMEOUT) (MariaDB counts whole seconds,
    /// rounded up), checked by [`MySqlStoreBuilder::connect`]. See
    /// [`MySqlStore::with_tx_idle_timeout`].
    pub fn tx_idle_timeout(mut self, idle: Duration) -> Self {
        self.tx_idle = crate::TxIdleTimeout::After(idle);
        self
    }

    /// No idle bound from idem for transactions that hold a claim, for calls that set none of
    /// their own: the server's `idle_write_transaction_timeout` applies (none by default).
    pub fn no_tx_idle_timeout(mut self) -> Self {
        self.tx_idle = crate::TxIdleTimeout::Off;
        self
    }

    /// Opens a pool on `url` (`mysql://user:pass@host:3306/db`) and makes the store.
    ///
    /// # Errors
    /// [`IdemError::InvalidOptions`] for a malformed URL or a timeout (the transaction idle
    /// timeout included) out of range (before any connection is opened);
    /// [`IdemError::StoreUnavailable`] naming the server when it cannot be reached.
    pub async fn connect(self, url: &str) -> Result<MySqlStore, IdemError> {
        crate::net::check_pool_timeouts(self.acquire_timeout, self.connect_timeout)?;
        self.tx_idle.check()?;
        let options =
            MySqlConnectOptions::from_str(url).map_err(|e| IdemError::InvalidOptions {
                reason: format!("not a MySQL URL: {e}"),
            })?;
        let server = crate::net::server(
            options.get_host(),
            options.get_port(),
            options.get_socket().map(|p| p.as_path()),
        );
        crate::net::reach::<sqlx::MySqlConnection>(
            "MySQL",
            Dialect::MySQL,
            &server,
            &options,
            self.connect_timeout,
        )
        .await?;
        let secs = lock_wait_secs(self.lock_wait);
        let set = format!("SET SESSION innodb_lock_wait_timeout = {secs}");
        let pool = MySqlPoolOptions::new()
            .max_connections(self.max_connections)
            .acquire_timeout(self.acquire_timeout)
            // The server is across a network, but a broken connection fails its statement with a
            // retryable error, and the pool drops it: no ping before every statement.
            .test_before_acquire(false)
            .after_connect(move |conn, _| {
                let set = set.clone();
                Box::pin(async move {
                    conn.execute(AssertSqlSafe(set)).await?;
                    Ok(())
                })
            })
            .connect_with(options);
        let pool = crate::net::within_connect("MySQL", &server, self.connect_timeout, pool).await?;
        let mut store = MySqlStore::from_pool(pool);
        store.lock_wait_secs = secs;
        store.tx_idle = self.tx_idle;
        Ok(store)
    }
}
