//! The relay: leases due outbox rows, publishes them, marks them sent or due again later, and
//! deletes sent rows after their retention.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::sql::OutboxSql;
use super::{OutboxMessage, OutboxPool, Publisher, on_pool};
use crate::{IdemError, duration};
use sqlx::AssertSqlSafe;

/// The most rows one relay pass leases: 10,000.
pub const MAX_RELAY_BATCH: usize = 10_000;

/// How often a running relay deletes sent rows past their retention.
const SWEEP_EVERY: Duration = Duration::from_secs(60);

/// What one [`Relay::run_once`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RelayPass {
    /// Rows published and marked sent.
    pub sent: u64,
    /// Rows whose publish failed: due again after their back-off.
    pub failed: u64,
    /// Rows due that another relay leased first.
    pub skipped: u64,
    /// Sent rows deleted after their retention (by this pass's sweep, at most once a minute).
    pub swept: u64,
}

/// Publishes an outbox table's committed rows; see the [module docs](super).
pub struct Relay {
    pool: OutboxPool,
    sql: OutboxSql,
    table: String,
    publisher: Arc<dyn Publisher>,
    batch: usize,
    lease: Duration,
    poll: Duration,
    retry_delay: Duration,
    max_retry_delay: Duration,
    retention: Duration,
    last_sweep: Mutex<Option<Instant>>,
}

impl std::fmt::Debug for Relay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Relay")
            .field("table", &self.table)
            .field("batch", &self.batch)
            .field("lease", &self.lease)
            .finish_non_exhaustive()
    }
}

/// Builds a [`Relay`]; every value is checked by [`build`](RelayBuilder::build).
#[must_use]
pub struct RelayBuilder {
    pool: OutboxPool,
    publisher: Arc<dyn Publisher>,
    table: Result<super::Outbox, IdemError>,
    batch: usize,
    lease: Duration,
    poll: Duration,
    retry_delay: Duration,
    max_retry_delay: Duration,
    retention: Duration,
}

impl RelayBuilder {
    /// The outbox table (default: [`Outbox::new`](super::Outbox::new)'s `idem_outbox`).
    pub fn outbox(mut self, outbox: &super::Outbox) -> Self {
        self.table = Ok(outbox.clone());
        self
    }

    /// Rows leased per pass: 1 to [`MAX_RELAY_BATCH`] (default 100).
    pub fn batch(mut self, rows: usize) -> Self {
        self.batch = rows;
        self
    }

    /// How long a leased row is this relay's before another may publish it again: 1 ms to
    /// [`MAX_DURATION`](crate::MAX_DURATION) (default 30 s). A publish that takes longer than half of it is
    /// given up (the row is due again).
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// The pause of [`Relay::spawn`]'s loop after a pass that found nothing due: 1 ms to
    /// [`MAX_DURATION`](crate::MAX_DURATION) (default 200 ms).
    pub fn poll(mut self, every: Duration) -> Self {
        self.poll = every;
        self
    }

    /// The first delay after a failed publish, doubled for each further failure of the row up to
    /// [`max_retry_delay`](Self::max_retry_delay): 0 to [`MAX_DURATION`](crate::MAX_DURATION) (default 1 s).
    pub fn retry_delay(mut self, delay: Duration) -> Self {
        self.retry_delay = delay;
        self
    }

    /// The longest delay after a failed publish: `retry_delay` to [`MAX_DURATION`](crate::MAX_DURATION)
    /// (default 5 min).
    pub fn max_retry_delay(mut self, delay: Duration) -> Self {
        self.max_retry_delay = delay;
        self
    }

    /// How long a sent row is kept before the relay deletes it: 0 to [`MAX_DURATION`](crate::MAX_DURATION)
    /// (default 7 days).
    pub fn retention(mut self, keep: Duration) -> Self {
        self.retention = keep;
        self
    }

    /// The relay.
    ///
    /// # Errors
    /// [`IdemError::InvalidOptions`] naming the value out of its range, or the table's name.
    pub fn build(self) -> Result<Relay, IdemError> {
        let outbox = self.table?;
        let refuse = |reason: String| Err(IdemError::InvalidOptions { reason });
        if self.batch == 0 || self.batch > MAX_RELAY_BATCH {
            return refuse(format!(
                "relay batch is 1 to {MAX_RELAY_BATCH} rows, not {}",
                self.batch
            ));
        }
        let ms = Duration::from_millis(1);
        for (what, value, least, below) in [
            ("the relay's lease", self.lease, ms, "shorter than 1ms"),
            ("the relay's poll", self.poll, ms, "shorter than 1ms"),
            (
                "the relay's retry_delay",
                self.retry_delay,
                Duration::ZERO,
                "",
            ),
            (
                "the relay's max_retry_delay",
                self.max_retry_delay,
                Duration::ZERO,
                "",
            ),
            ("the relay's retention", self.retention, Duration::ZERO, ""),
        ] {
            duration::check(what, value, least, below)?;
        }
        if self.max_retry_delay < self.retry_delay {
            return refuse(format!(
                "relay max_retry_delay ({:?}) is shorter than retry_delay ({:?})",
                self.max_retry_delay, self.retry_delay
            ));
        }
        Ok(Relay {
            sql: OutboxSql::new(&outbox.table, self.pool.dialect()),
            table: outbox.table().to_owned(),
            pool: self.pool,
            publisher: self.publisher,
            batch: self.batch,
            lease: self.lease,
            poll: self.poll,
            retry_delay: self.retry_delay,
            max_retry_delay: self.max_retry_delay,
            retention: self.retention,
            last_sweep: Mutex::new(None),
        })
    }
}

/// A token naming one pass's leases: 16 hex digits from the OS generator.
fn owner() -> String {
    let mut bytes = [0u8; 8];
    let _ = getrandom::fill(&mut bytes);
    crate::fingerprint::hex(&bytes)
}

type DueRow = (i64, String, String, Vec<u8>, i32);

impl Relay {
    /// A builder for a relay over `pool`'s outbox that publishes through `publisher`.
    pub fn builder(
        pool: impl Into<OutboxPool>,
        publisher: impl Publisher + 'static,
    ) -> RelayBuilder {
        RelayBuilder {
            pool: pool.into(),
            publisher: Arc::new(publisher),
            table: Ok(super::Outbox::new()),
            batch: 100,
            lease: Duration::from_secs(30),
            poll: Duration::from_millis(200),
            retry_delay: Duration::from_secs(1),
            max_retry_delay: Duration::from_secs(300),
            retention: Duration::from_secs(7 * 24 * 3_600),
        }
    }

    /// One pass: leases up to `batch` due rows (each the oldest pending row of its destination
    /// and key), publishes them in id order, and marks each sent or due again after its back-off.
    /// Then, at most once a minute, deletes sent rows past the retention.
    ///
    /// # Errors
    /// The database's error (rows leased before it are published by a later pass, after their
    /// lease). A publisher's error is not one: the row is counted in [`RelayPass::failed`].
    pub async fn run_once(&self) -> Result<RelayPass, IdemError> {
        let due: Vec<DueRow> = on_pool!(&self.pool, pool => sqlx::query_as(AssertSqlSafe(self.sql.due.as_str()))
            .bind(i64::try_from(self.batch).unwrap_or(i64::MAX))
            .fetch_all(pool)
            .await
            .map_err(|e| self.pool_error(e)))?;
        let owner = owner();
        let mut pass = RelayPass::default();
        for (id, destination, key, payload, attempts) in due {
            let leased = on_pool!(&self.pool, pool => sqlx::query(AssertSqlSafe(self.sql.lease.as_str()))
                .bind(&owner)
                .bind(duration::clamped_millis(self.lease))
                .bind(id)
                .execute(pool)
                .await
                .map(|done| done.rows_affected())
                .map_err(|e| self.pool_error(e)))?;
            if leased != 1 {
                pass.skipped += 1;
                continue;
            }
            let attempts = u32::try_from(attempts).unwrap_or(0);
            let message = OutboxMessage {
                id,
                message_id: format!("{}:{id}", self.table),
                destination,
                key,
                payload,
                attempts,
            };
            let published =
                tokio::time::timeout(self.lease / 2, self.publisher.publish(&message)).await;
            match published {
                Ok(Ok(())) => {
                    on_pool!(&self.pool, pool => sqlx::query(AssertSqlSafe(self.sql.sent.as_str()))
                        .bind(id)
                        .bind(&owner)
                        .execute(pool)
                        .await
                        .map(|done| done.rows_affected())
                        .map_err(|e| self.pool_error(e)))?;
                    pass.sent += 1;
                }
                failed => {
                    let error = match failed {
                        Ok(Err(e)) => e.to_string(),
                        _ => format!("the publish took longer than {:?}", self.lease / 2),
                    };
                    tracing::warn!(
                        table = %self.table,
                        id,
                        destination = %message.destination,
                        attempts = attempts + 1,
                        error = %error,
                        "outbox publish failed; due again after its back-off"
                    );
                    let mut error = error;
                    error.truncate(1_000);
                    on_pool!(&self.pool, pool => sqlx::query(AssertSqlSafe(self.sql.failed.as_str()))
                        .bind(duration::clamped_millis(self.back_off(attempts + 1)))
                        .bind(&error)
                        .bind(id)
                        .bind(&owner)
                        .execute(pool)
                        .await
                        .map(|done| done.rows_affected())
                        .map_err(|e| self.pool_error(e)))?;
                    pass.failed += 1;
                }
            }
        }
        let sweep_due = {
            let last = self.last_sweep.lock().unwrap_or_else(|p| p.into_inner());
            last.is_none_or(|at| at.elapsed() >= SWEEP_EVERY)
        };
        if sweep_due {
            pass.swept = self.sweep_once().await?;
        }
        Ok(pass)
    }

    /// Deletes up to 10,000 sent rows older than the retention; returns how many.
    ///
    /// # Errors
    /// The database's error.
    pub async fn sweep_once(&self) -> Result<u64, IdemError> {
        let deleted = on_pool!(&self.pool, pool => sqlx::query(AssertSqlSafe(self.sql.sweep.as_str()))
            .bind(duration::clamped_millis(self.retention))
            .bind(10_000i64)
            .execute(pool)
            .await
            .map(|done| done.rows_affected())
            .map_err(|e| self.pool_error(e)))?;
        *self.last_sweep.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
        Ok(deleted)
    }

    /// Rows not yet sent (leased, failed or waiting).
    ///
    /// # Errors
    /// The database's error.
    pub async fn pending(&self) -> Result<u64, IdemError> {
        let n: i64 = on_pool!(&self.pool, pool => sqlx::query_scalar(AssertSqlSafe(self.sql.pending.as_str()))
            .fetch_one(pool)
            .await
            .map_err(|e| self.pool_error(e)))?;
        Ok(u64::try_from(n).unwrap_or(0))
    }

    /// Runs passes until the task is aborted: the next pass at once after one that sent or
    /// failed rows, after the poll interval otherwise (and after a database error, which is
    /// logged).
    pub fn spawn(self) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            loop {
                match self.run_once().await {
                    Ok(pass) if pass.sent + pass.failed > 0 => {}
                    Ok(_) => tokio::time::sleep(self.poll).await,
                    Err(e) => {
                        tracing::warn!(table = %self.table, error = %e, "outbox relay pass failed");
                        tokio::time::sleep(self.poll).await;
                    }
                }
            }
        })
    }

    /// `retry_delay × 2^(failures − 1)`, at most `max_retry_delay`.
    fn back_off(&self, failures: u32) -> Duration {
        duration::doubling(self.retry_delay, failures, self.max_retry_delay)
    }

    fn pool_error(&self, e: sqlx::Error) -> IdemError {
        self.pool.error(e)
    }
}
