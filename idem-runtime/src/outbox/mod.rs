//! A producer outbox: messages written in the business transaction, published after it commits.
//!
//! A service that creates an order and must tell the world "order created" cannot publish inside
//! its transaction (a rollback after the publish announces an order that does not exist; a crash
//! between commit and publish loses the event). With the outbox the message is a row of the
//! database, inserted by [`Outbox::enqueue`] in the same transaction as the business writes (an
//! `#[idempotent(tx = "…")]` body, so a duplicate request enqueues nothing), and a [`Relay`]
//! publishes committed rows and marks them sent:
//!
//! ```no_run
//! # use idem_runtime as idem;
//! # #[cfg(feature = "sqlite")]
//! # async fn demo(store: idem_runtime::SqliteStore, publisher: impl idem_runtime::outbox::Publisher + 'static) -> Result<(), idem_runtime::IdemError> {
//! use idem::outbox::{Outbox, Relay};
//! let outbox = Outbox::new();
//! outbox.migrate(store.pool()).await?;
//! let mut tx = store.begin().await?;
//! // … the business writes, in `tx` …
//! outbox.enqueue(&mut tx, "orders.created", "ORD-1", br#"{"order_no":"ORD-1"}"#).await?;
//! tx.commit().await?;
//! let relay = Relay::builder(store.pool(), publisher).build()?;
//! let _task = relay.spawn();
//! # Ok(()) }
//! ```
//!
//! **What the relay guarantees.** Every committed row is published at least once, then marked
//! sent; a row is published again only when the relay that leased it died or paused past its
//! lease before marking it (give each message a stable id: [`OutboxMessage::message_id`], which
//! JetStream's duplicate window and the consumer's inbox use to drop the second copy). Several
//! relays may run over one table at once (in several processes): each row is leased by one with
//! a conditional update, so none is published twice while its relay lives. Messages of one
//! destination and key go out in id order, one at a time: a row is due only when it is the oldest
//! pending row of its key, so a failing message holds back the later ones of its key (and only
//! those). Two transactions that enqueue for one key at the same time are ordered by their ids,
//! among the rows committed when the relay looks; and a relay paused past its lease may send an
//! earlier message again after a later one (the consumer's inbox replays it as a duplicate).
//! A failed publish is retried with back-off; sent rows are deleted after a retention
//! ([`RelayBuilder::retention`], 7 days by default). A rollback enqueues nothing.
//!
//! Each message carries a stable id, `<table>:<row id>` ([`OutboxMessage::message_id`]): the
//! JetStream publisher sends it as `Nats-Msg-Id`, so the stream's duplicate window drops a copy
//! a relay sent again, and the RabbitMQ publisher as the AMQP `message_id`; the consumer's
//! [`inbox`](crate::inbox) replays a duplicate that gets through anyway.
//!
//! Tables: SQLite, MySQL / MariaDB and Postgres, `idem_outbox` unless [`Outbox::with_table`];
//! [`Outbox::migrate`] creates it, [`Outbox::ddl`] shows it. Publishers for RabbitMQ
//! ([`amqp::AmqpPublisher`], feature `rabbitmq`: publisher confirms, persistent, the message id)
//! and NATS JetStream ([`jetstream::JetStreamPublisher`], feature `nats`: the stream's ack,
//! `Nats-Msg-Id`) and Kafka (`kafka::KafkaPublisher`, feature `kafka`: the row's key as the
//! record's key, so order per key holds through its partition; the id in a header; an idempotent
//! producer; the broker's acknowledgement).
//!
//! In the repository, on the real brokers and databases: `tests/tests/outbox.rs` (commit and
//! rollback, order per key under failures, two relays racing over one table on SQLite, MariaDB and
//! Postgres: every row once), `outbox_brokers.rs` (ids, order, an unroutable destination, a
//! re-send dropped by the duplicate window) and `messaging_e2e.rs`: 2,000 orders over HTTP in
//! transaction mode with 12 % duplicate requests → outbox → relay → broker → inbox → shipments,
//! while the relay and the consumer are each killed and restarted 10 times and 5 poison messages
//! are sent: one shipment per order, nothing unsent, nothing unacked, exactly the poison in the
//! dead letters, on MariaDB and Postgres, RabbitMQ and JetStream.

#[cfg(feature = "rabbitmq")]
pub mod amqp;
#[cfg(feature = "nats")]
pub mod jetstream;
#[cfg(feature = "kafka")]
pub mod kafka;
mod relay;
mod sql;

use std::sync::Arc;

use async_trait::async_trait;

pub use relay::{MAX_RELAY_BATCH, Relay, RelayBuilder, RelayPass};
use sql::OutboxSql;

use crate::sql::dialect::Dialect;
use crate::sql::table::TableName;
use crate::{BoxError, IdemError};

/// The longest destination and key [`Outbox::enqueue`] takes, in bytes (what MySQL's columns
/// hold).
pub const MAX_NAME_LEN: usize = 255;

/// The largest payload [`Outbox::enqueue`] takes: 16 MiB − 1 (a MySQL `MEDIUMBLOB`).
pub const MAX_PAYLOAD_LEN: usize = 16 * 1024 * 1024 - 1;

/// A message as the relay hands it to a [`Publisher`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxMessage {
    /// The row's id: increasing in enqueue order.
    pub id: i64,
    /// Where it goes: a queue (RabbitMQ's default exchange routes by it) or a subject.
    pub destination: String,
    /// The business key it is about (`ORD-1`): order holds per destination and key.
    pub key: String,
    /// The message body.
    pub payload: Vec<u8>,
    /// Publishes before this one that failed.
    pub attempts: u32,
    message_id: String,
}

impl OutboxMessage {
    /// The message's id for the broker, the same for every publish of this row:
    /// `<table>:<id>` (as `Nats-Msg-Id` on JetStream, `message_id` on RabbitMQ).
    pub fn message_id(&self) -> &str {
        &self.message_id
    }
}

/// Publishes one outbox message to a broker and returns once the broker has it (a publisher
/// confirm, a stream's ack). An error leaves the row pending, for a retry after a back-off.
#[async_trait]
pub trait Publisher: Send + Sync {
    /// Publishes `message`.
    ///
    /// # Errors
    /// Whatever kept the broker from taking it; the relay logs it and retries later.
    async fn publish(&self, message: &OutboxMessage) -> Result<(), BoxError>;
}

#[async_trait]
impl<P: Publisher + ?Sized> Publisher for Arc<P> {
    async fn publish(&self, message: &OutboxMessage) -> Result<(), BoxError> {
        (**self).publish(message).await
    }
}

/// The outbox table: where [`enqueue`](Outbox::enqueue) writes and a [`Relay`] reads.
#[derive(Debug, Clone)]
pub struct Outbox {
    table: TableName,
}

impl Default for Outbox {
    fn default() -> Self {
        Outbox::new()
    }
}

impl Outbox {
    /// The table `idem_outbox`.
    pub fn new() -> Self {
        Outbox {
            table: TableName::new("idem_outbox").expect("a valid table name"),
        }
    }

    /// Another table (`[A-Za-z_][A-Za-z0-9_]*`, optionally `schema.table`).
    ///
    /// # Errors
    /// [`IdemError::InvalidOptions`] for a name idem cannot use.
    pub fn with_table(name: &str) -> Result<Self, IdemError> {
        Ok(Outbox {
            table: TableName::new(name)?,
        })
    }

    /// The table's name.
    pub fn table(&self) -> &str {
        self.table.as_str()
    }

    /// The statements that create the table and its index in `dialect`, for services that apply
    /// migrations with their own tool.
    pub fn ddl(&self, dialect: Dialect) -> Vec<String> {
        OutboxSql::new(&self.table, dialect).ddl
    }

    /// Creates the table and its index if they are missing.
    ///
    /// # Errors
    /// The database's error.
    pub async fn migrate(&self, pool: impl Into<OutboxPool>) -> Result<(), IdemError> {
        let pool = pool.into();
        for ddl in self.ddl(pool.dialect()) {
            pool.execute(&ddl).await?;
        }
        Ok(())
    }

    /// Inserts a message for `destination` about `key` in the caller's transaction: it is
    /// published after the transaction commits, and never if it rolls back. Returns the row's id.
    ///
    /// # Errors
    /// [`IdemError::InvalidOptions`] for an empty or too long destination or key (1 to
    /// [`MAX_NAME_LEN`] bytes) or a payload over [`MAX_PAYLOAD_LEN`], before anything is written;
    /// the database's error (the transaction is then the caller's to roll back).
    pub async fn enqueue<C: OutboxConn + ?Sized>(
        &self,
        conn: &mut C,
        destination: &str,
        key: &str,
        payload: &[u8],
    ) -> Result<i64, IdemError> {
        for (what, value) in [("destination", destination), ("key", key)] {
            if value.is_empty() || value.len() > MAX_NAME_LEN {
                return Err(IdemError::InvalidOptions {
                    reason: format!(
                        "an outbox message's {what} is 1 to {MAX_NAME_LEN} bytes, this one is {}; \
                         nothing was enqueued",
                        value.len()
                    ),
                });
            }
        }
        if payload.len() > MAX_PAYLOAD_LEN {
            return Err(IdemError::InvalidOptions {
                reason: format!(
                    "an outbox payload is at most {MAX_PAYLOAD_LEN} bytes, this one is {}; \
                     nothing was enqueued",
                    payload.len()
                ),
            });
        }
        let sql = OutboxSql::new(&self.table, conn.dialect());
        conn.insert(&sql.insert, destination, key, payload).await
    }
}

/// A connection (or an open transaction) [`Outbox::enqueue`] writes through: idem's
/// `SqliteTx` / `MySqlTx` / `PgTx`, or sqlx's connections (so a `sqlx::Transaction` works with
/// `&mut *tx`).
#[async_trait]
pub trait OutboxConn: Send {
    /// The connection's dialect.
    fn dialect(&self) -> Dialect;

    #[doc(hidden)]
    async fn insert(
        &mut self,
        sql: &str,
        destination: &str,
        key: &str,
        payload: &[u8],
    ) -> Result<i64, IdemError>;
}

macro_rules! outbox_conn {
    ($feature:literal, $conn:ty, $dialect:expr, $last_id:expr) => {
        #[cfg(feature = $feature)]
        #[async_trait]
        impl OutboxConn for $conn {
            fn dialect(&self) -> Dialect {
                $dialect
            }

            async fn insert(
                &mut self,
                sql: &str,
                destination: &str,
                key: &str,
                payload: &[u8],
            ) -> Result<i64, IdemError> {
                let query = sqlx::query(sqlx::AssertSqlSafe(sql))
                    .bind(destination)
                    .bind(key)
                    .bind(payload);
                let last_id: fn(_) -> _ = $last_id;
                last_id(query.fetch_optional(&mut *self).await)
                    .map_err(|e| crate::sql::error::store_error(e, $dialect))
            }
        }
    };
}

#[cfg(any(feature = "sqlite", feature = "postgres"))]
fn returned_id<R: sqlx::Row>(row: Result<Option<R>, sqlx::Error>) -> Result<i64, sqlx::Error>
where
    for<'r> i64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    usize: sqlx::ColumnIndex<R>,
{
    match row? {
        Some(row) => row.try_get(0),
        None => Err(sqlx::Error::RowNotFound),
    }
}

outbox_conn!(
    "sqlite",
    sqlx::SqliteConnection,
    Dialect::SQLite,
    returned_id::<sqlx::sqlite::SqliteRow>
);
outbox_conn!(
    "postgres",
    sqlx::PgConnection,
    Dialect::Postgres,
    returned_id::<sqlx::postgres::PgRow>
);

#[cfg(feature = "mysql")]
#[async_trait]
impl OutboxConn for sqlx::MySqlConnection {
    fn dialect(&self) -> Dialect {
        Dialect::MySQL
    }

    async fn insert(
        &mut self,
        sql: &str,
        destination: &str,
        key: &str,
        payload: &[u8],
    ) -> Result<i64, IdemError> {
        let done = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(destination)
            .bind(key)
            .bind(payload)
            .execute(&mut *self)
            .await
            .map_err(|e| crate::sql::error::store_error(e, Dialect::MySQL))?;
        i64::try_from(done.last_insert_id()).map_err(|_| IdemError::store("outbox id over i64"))
    }
}

macro_rules! outbox_tx {
    ($feature:literal, $tx:ty) => {
        #[cfg(feature = $feature)]
        #[async_trait]
        impl OutboxConn for $tx {
            fn dialect(&self) -> Dialect {
                (**self).dialect()
            }

            async fn insert(
                &mut self,
                sql: &str,
                destination: &str,
                key: &str,
                payload: &[u8],
            ) -> Result<i64, IdemError> {
                (**self).insert(sql, destination, key, payload).await
            }
        }
    };
}

outbox_tx!("sqlite", crate::SqliteTx);
outbox_tx!("mysql", crate::MySqlTx);
outbox_tx!("postgres", crate::PgTx);

/// The database a [`Relay`] reads: a pool of one of the SQL backends (`From` a pool, or a
/// store's: `store.pool()`).
#[derive(Debug, Clone)]
pub struct OutboxPool(Pool);

// Private, so its variants' names (`Sqlite`, …) are not public items: rustc would otherwise print
// sqlx's `Sqlite` with its full path in every diagnostic that names it.
#[derive(Debug, Clone)]
enum Pool {
    #[cfg(feature = "sqlite")]
    Sqlite(sqlx::SqlitePool),
    #[cfg(feature = "mysql")]
    MySql(sqlx::MySqlPool),
    #[cfg(feature = "postgres")]
    Postgres(sqlx::PgPool),
}

macro_rules! pool_from {
    ($feature:literal, $pool:ty, $variant:ident) => {
        #[cfg(feature = $feature)]
        impl From<$pool> for OutboxPool {
            fn from(pool: $pool) -> Self {
                OutboxPool(Pool::$variant(pool))
            }
        }

        #[cfg(feature = $feature)]
        impl From<&$pool> for OutboxPool {
            fn from(pool: &$pool) -> Self {
                OutboxPool(Pool::$variant(pool.clone()))
            }
        }
    };
}

pool_from!("sqlite", sqlx::SqlitePool, Sqlite);
pool_from!("mysql", sqlx::MySqlPool, MySql);
pool_from!("postgres", sqlx::PgPool, Postgres);

/// Runs `$body` with `$pool` bound to the variant's pool, the same code for every backend.
macro_rules! on_pool {
    ($outbox_pool:expr, $pool:ident => $body:expr) => {
        match &($outbox_pool).0 {
            #[cfg(feature = "sqlite")]
            $crate::outbox::Pool::Sqlite($pool) => $body,
            #[cfg(feature = "mysql")]
            $crate::outbox::Pool::MySql($pool) => $body,
            #[cfg(feature = "postgres")]
            $crate::outbox::Pool::Postgres($pool) => $body,
        }
    };
}
pub(crate) use on_pool;

impl OutboxPool {
    /// The pool's dialect.
    pub fn dialect(&self) -> Dialect {
        match &self.0 {
            #[cfg(feature = "sqlite")]
            Pool::Sqlite(_) => Dialect::SQLite,
            #[cfg(feature = "mysql")]
            Pool::MySql(_) => Dialect::MySQL,
            #[cfg(feature = "postgres")]
            Pool::Postgres(_) => Dialect::Postgres,
        }
    }

    fn error(&self, e: sqlx::Error) -> IdemError {
        crate::sql::error::store_error(e, self.dialect())
    }

    async fn execute(&self, sql: &str) -> Result<u64, IdemError> {
        on_pool!(self, pool => sqlx::query(sqlx::AssertSqlSafe(sql))
            .execute(pool)
            .await
            .map(|done| done.rows_affected())
            .map_err(|e| self.error(e)))
    }
}
