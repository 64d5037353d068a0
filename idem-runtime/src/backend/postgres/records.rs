//! The statements of the Postgres store and the claim protocol's steps on one connection (a pool
//! connection in lease mode, the caller's transaction in transaction mode).
//!
//! Every statement reads the database's clock (`clock_timestamp()`, the wall clock at the moment the
//! statement reads it, never the transaction's start time) plus the test clock's offset, and binds
//! every value. A new key's claim is one statement: in lease mode the insert alone (`INSERT … ON
//! CONFLICT DO NOTHING … RETURNING`, a plain read after it only when the key exists); in
//! transaction mode one statement reads the record and, only when there is none, inserts it the
//! same way. `DO NOTHING` means a concurrent insert of the same key never raises 23505, which would
//! abort the caller's transaction.

use std::time::Duration;

use sqlx::postgres::{PgArguments, PgConnection, PgRow};
use sqlx::{AssertSqlSafe, Postgres, Row, SqlSafeStr, SqlStr};

use super::db_error;
use crate::sql::claim::{CasRecords, SeenRecord, seen_record};
use crate::sql::dialect::Dialect;
use crate::sql::table::TableName;
use crate::store::decide::millis;
use crate::store::{Claim, ClaimRequest, Fence, Record, Status, StatusCount};
use crate::{Busy, IdemError};

/// The database clock read once, plus the test clock's offset bound at `off`: `n` in milliseconds,
/// `us` (a fence) in microseconds.
fn clock(off: &str) -> String {
    format!(
        "SELECT FLOOR(EXTRACT(EPOCH FROM k.t) * 1000)::BIGINT + {off} AS n, \
         FLOOR(EXTRACT(EPOCH FROM k.t) * 1000000)::BIGINT + {off} * 1000 AS us \
         FROM (SELECT clock_timestamp() AS t) AS k"
    )
}

/// The statements of one store, built once for its table name.
#[derive(Debug)]
pub(super) struct Statements {
    /// The claim as one statement without locks: the read, and the insert when there is none (the
    /// own-statements floor of `benches/postgres.rs`; lease mode sends `insert`, then `read`).
    claim: SqlStr,
    /// Lease mode: the new record alone (`ON CONFLICT DO NOTHING … RETURNING`, no read first).
    insert: SqlStr,
    /// Transaction mode, first: the key's advisory lock if no other transaction holds it (a
    /// claimant's transaction holds it to its end), then the claim with the read locking the row
    /// (`FOR UPDATE`: a current read, never the transaction's old snapshot).
    claim_locking: SqlStr,
    /// Transaction mode, once another transaction holds the key's lock: the claim waits for it
    /// (bounded by `lock_timeout`), then claims as `claim_locking` does.
    claim_waiting: SqlStr,
    /// The claim's plain read, with the clock (`store/order.rs`).
    read: SqlStr,
    take: SqlStr,
    complete: SqlStr,
    fail: SqlStr,
    save_steps: SqlStr,
    renew: SqlStr,
    load: SqlStr,
    sweep: SqlStr,
    stuck: SqlStr,
    stats: SqlStr,
}

fn sql(text: String) -> SqlStr {
    AssertSqlSafe(text).into_sql_str()
}

/// A transaction-mode claim takes its key's transaction-level advisory lock first: without one
/// (`got` false) another transaction claims the key, and waiting on its row is what the caller's
/// `lock_timeout` must bound. `{key}` is [`advisory_key`].
const TRY_KEY_LOCK: &str = "SELECT pg_try_advisory_xact_lock({key}) AS got";
/// [`TRY_KEY_LOCK`], waiting for the lock (bounded by `lock_timeout`).
const WAIT_KEY_LOCK: &str = "SELECT TRUE AS got FROM (SELECT pg_advisory_xact_lock({key})) AS l";

/// The advisory lock's key for `$1` (biz) and `$2` (key) in `table`: a 64-bit hash of the three
/// (two keys that share a hash only wait for each other; they are never confused).
fn advisory_key(table: &TableName) -> String {
    // The name is `[A-Za-z0-9_.]` (checked by `TableName::new`): safe inside quotes.
    format!(
        "hashtextextended($1 || chr(31) || $2, hashtext('{}'))",
        table.as_str()
    )
}

/// The record's columns as the claim reads them.
const COLUMNS: &str = "status, attempt, fence, fingerprint, result, lease_until, expire_at";

impl Statements {
    pub(super) fn new(table: &TableName) -> Self {
        let t = table.quoted(Dialect::Postgres);
        // $1 biz, $2 key, $3 fingerprint, $4 lease ms, $5 ttl ms, $6 clock offset ms. With a
        // `gate` (transaction mode) the statement first takes the key's advisory lock (`g`, read
        // by the others as a one-time filter, so before any row is read or locked); a row with
        // `got` false (every other column NULL) says the lock is another transaction's.
        let claim = |lock: &str, gate: Option<&str>| {
            let (g, only, got, not_got) = match gate {
                None => (String::new(), "", "", String::new()),
                Some(gate) => (
                    format!(
                        "g AS MATERIALIZED ({gate}), ",
                        gate = gate.replace("{key}", &advisory_key(table))
                    ),
                    "(SELECT got FROM g) AND ",
                    ", TRUE AS got",
                    " UNION ALL SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, FALSE, FALSE \
                     FROM g WHERE NOT g.got"
                        .to_owned(),
                ),
            };
            format!(
                "WITH c AS ({clock}), {g}\
                 old AS (SELECT {COLUMNS} FROM {t} WHERE {only}biz_type = $1 AND idem_key = $2{lock}), \
                 ins AS (INSERT INTO {t} (biz_type, idem_key, status, attempt, fence, fingerprint, \
                 result, lease_until, created_at, updated_at, expire_at) \
                 SELECT $1, $2, 'PROCESSING', 1, c.us, $3, NULL, c.n + $4, c.n, c.n, c.n + $5 \
                 FROM c WHERE {only}NOT EXISTS (SELECT 1 FROM old) \
                 ON CONFLICT (biz_type, idem_key) DO NOTHING \
                 RETURNING {COLUMNS}, created_at) \
                 SELECT old.status, old.attempt, old.fence, old.fingerprint, old.result, \
                 old.lease_until, old.expire_at, c.n AS now_ms, FALSE AS inserted{got} FROM old, c \
                 UNION ALL \
                 SELECT ins.status, ins.attempt, ins.fence, ins.fingerprint, ins.result, \
                 ins.lease_until, ins.expire_at, ins.created_at AS now_ms, TRUE AS inserted{got} \
                 FROM ins{not_got}",
                clock = clock("$6"),
            )
        };
        // $1 biz, $2 key, $3 fingerprint, $4 lease ms, $5 ttl ms, $6 clock offset ms: a new
        // record or nothing.
        let insert = format!(
            "INSERT INTO {t} (biz_type, idem_key, status, attempt, fence, fingerprint, result, \
             lease_until, created_at, updated_at, expire_at) \
             SELECT $1, $2, 'PROCESSING', 1, c.us, $3, NULL, c.n + $4, c.n, c.n, c.n + $5 \
             FROM ({clock}) AS c ON CONFLICT (biz_type, idem_key) DO NOTHING \
             RETURNING attempt, fence",
            clock = clock("$6"),
        );
        // $1 biz, $2 key, $3 fingerprint, $4 lease ms, $5 ttl ms, $6 offset, $7 reset,
        // $8 seen fence, $9 seen status, $10 seen lease end, $11 keep the saved steps (`result`
        // of an unfinished record).
        let take = format!(
            "WITH c AS ({clock}) \
             UPDATE {t} AS r SET status = 'PROCESSING', \
             attempt = CASE WHEN $7 THEN 1 ELSE r.attempt + 1 END, \
             fence = GREATEST(r.fence + 1, c.us), fingerprint = $3, \
             result = CASE WHEN $11 THEN r.result END, \
             lease_until = c.n + $4, updated_at = c.n, \
             created_at = CASE WHEN $7 THEN c.n ELSE r.created_at END, \
             expire_at = CASE WHEN $7 THEN c.n + $5 ELSE GREATEST(r.expire_at, c.n + $4) END \
             FROM c WHERE r.biz_type = $1 AND r.idem_key = $2 AND r.fence = $8 AND r.status = $9 \
             AND r.lease_until = $10 \
             RETURNING r.attempt, r.fence",
            clock = clock("$6"),
        );
        // $1 biz, $2 key, $3 fence, $4 result, $5 ttl ms, $6 offset. The mark moves the expiry to
        // at least now + ttl, so a body slower than its ttl still leaves a live success. A record
        // already SUCCEEDED under the fence counts as held and keeps its result and expiry: a mark
        // sent again after a lost reply succeeds (FAILED likewise).
        let complete = format!(
            "WITH c AS ({clock}) \
             UPDATE {t} AS r SET result = CASE WHEN r.status = 'PROCESSING' THEN $4 ELSE r.result END, \
             expire_at = CASE WHEN r.status = 'PROCESSING' \
             THEN GREATEST(r.expire_at, c.n + $5) ELSE r.expire_at END, \
             status = 'SUCCEEDED', updated_at = c.n FROM c \
             WHERE r.biz_type = $1 AND r.idem_key = $2 AND r.fence = $3 \
             AND r.status IN ('PROCESSING', 'SUCCEEDED')",
            clock = clock("$6"),
        );
        // $1 biz, $2 key, $3 fence, $4 offset. The saved steps (in `result`) stay for a retry.
        let fail = format!(
            "WITH c AS ({clock}) \
             UPDATE {t} AS r SET status = 'FAILED', updated_at = c.n FROM c \
             WHERE r.biz_type = $1 AND r.idem_key = $2 AND r.fence = $3 \
             AND r.status IN ('PROCESSING', 'FAILED')",
            clock = clock("$4"),
        );
        // $1 biz, $2 key, $3 fence, $4 steps, $5 offset. The steps of an unfinished record live in
        // `result` until a success replaces them.
        let save_steps = format!(
            "WITH c AS ({clock}) \
             UPDATE {t} AS r SET result = $4, updated_at = c.n FROM c \
             WHERE r.biz_type = $1 AND r.idem_key = $2 AND r.fence = $3 \
             AND r.status = 'PROCESSING'",
            clock = clock("$5"),
        );
        // $1 biz, $2 key, $3 fence, $4 lease ms, $5 offset.
        let renew = format!(
            "WITH c AS ({clock}) \
             UPDATE {t} AS r SET lease_until = c.n + $4, \
             expire_at = GREATEST(r.expire_at, c.n + $4), updated_at = c.n FROM c \
             WHERE r.biz_type = $1 AND r.idem_key = $2 AND r.fence = $3 AND r.status = 'PROCESSING'",
            clock = clock("$5"),
        );
        let load = format!("SELECT {COLUMNS} FROM {t} WHERE biz_type = $1 AND idem_key = $2");
        // $1 biz, $2 key, $3 offset.
        let read = format!(
            "SELECT {COLUMNS}, c.n AS now_ms FROM {t}, ({clock}) AS c \
             WHERE biz_type = $1 AND idem_key = $2",
            clock = clock("$3"),
        );
        // $1 biz, $2 offset, $3 batch. PROCESSING with the lease ended, oldest lease first: a range
        // of the index `<table>_processing (biz_type, lease_until) WHERE status = 'PROCESSING'`,
        // read in its order (no sort), that stops after the batch. The `status` term is a literal:
        // a parameter could not prove the partial index's predicate. The clock is a scalar subquery, read once before the
        // scan (an InitPlan): `clock_timestamp()` is volatile, so written into the comparison it
        // could not bound the index range, and joined as a CTE the rows would come out of a
        // nested loop in no order and be sorted whole.
        let stuck = format!(
            "SELECT idem_key, {COLUMNS} FROM {t} \
             WHERE biz_type = $1 AND status = 'PROCESSING' \
             AND lease_until <= (SELECT c.n FROM ({clock}) AS c) \
             ORDER BY lease_until LIMIT $3",
            clock = clock("$2"),
        );
        // $1 batch, $2 offset. Expired: the TTL passed and no lease is live. The batch's rows are
        // locked as they are picked (rows another transaction holds are skipped, never waited
        // for), so the delete removes exactly what was picked, and no statement runs long.
        let sweep = format!(
            "WITH c AS ({clock}), \
             doomed AS (SELECT r.biz_type, r.idem_key FROM {t} AS r, c \
             WHERE r.expire_at <= c.n AND NOT (r.status = 'PROCESSING' AND r.lease_until > c.n) \
             LIMIT $1 FOR UPDATE OF r SKIP LOCKED) \
             DELETE FROM {t} AS d USING doomed \
             WHERE d.biz_type = doomed.biz_type AND d.idem_key = doomed.idem_key",
            clock = clock("$2"),
        );
        // Records per business type and status (expired ones not yet swept included): a scan of
        // the table (an operator's query; no index is kept for it).
        let stats =
            format!("SELECT biz_type, status, COUNT(*) AS n FROM {t} GROUP BY biz_type, status");
        Statements {
            claim: sql(claim("", None)),
            insert: sql(insert),
            claim_locking: sql(claim(" FOR UPDATE", Some(TRY_KEY_LOCK))),
            claim_waiting: sql(claim(" FOR UPDATE", Some(WAIT_KEY_LOCK))),
            read: sql(read),
            take: sql(take),
            complete: sql(complete),
            fail: sql(fail),
            save_steps: sql(save_steps),
            renew: sql(renew),
            load: sql(load),
            sweep: sql(sweep),
            stuck: sql(stuck),
            stats: sql(stats),
        }
    }
}

impl Statements {
    /// A statement by name, for the benchmark's hand-written floor.
    pub(super) fn get(&self, name: &str) -> Option<&str> {
        let sql = match name {
            "claim" => &self.claim,
            "insert" => &self.insert,
            "claim_locking" => &self.claim_locking,
            "claim_waiting" => &self.claim_waiting,
            "take" => &self.take,
            "complete" => &self.complete,
            "fail" => &self.fail,
            "save_steps" => &self.save_steps,
            "renew" => &self.renew,
            "load" => &self.load,
            "sweep" => &self.sweep,
            "stuck" => &self.stuck,
            "stats" => &self.stats,
            _ => return None,
        };
        Some(sql.as_str())
    }
}

/// The store's records, reached through one connection.
pub(super) struct Records<'c> {
    conn: &'c mut PgConnection,
    sql: &'c Statements,
    offset_ms: i64,
    claiming: Claiming,
    /// A transaction-mode claim found its key's lock held by another transaction.
    contended: bool,
}

/// How a claim's insert step locks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Claiming {
    /// Lease mode: no lock (each statement commits on its own).
    Lease,
    /// Transaction mode: the key's advisory lock if it is free, then the row (`claim_locking`).
    Tx,
    /// Transaction mode, waiting for the key's lock (`claim_waiting`).
    TxWaiting,
}

fn attempt_of(row: &PgRow) -> Result<u32, IdemError> {
    let attempt: i32 = row.try_get("attempt").map_err(db_error)?;
    u32::try_from(attempt).map_err(|_| IdemError::store(format!("attempt {attempt} out of range")))
}

fn fence_of(row: &PgRow) -> Result<u64, IdemError> {
    let fence: i64 = row.try_get("fence").map_err(db_error)?;
    u64::try_from(fence).map_err(|_| IdemError::store(format!("fence {fence} out of range")))
}

/// The record `(biz, key)` from a row with the columns of `load`.
fn record_of(row: &PgRow, biz: &str, key: String) -> Result<Record, IdemError> {
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
    })
}

fn fence_param(claim: &Claim) -> Result<i64, IdemError> {
    i64::try_from(claim.fence.get()).map_err(|_| IdemError::LeaseLost {
        attempt: claim.attempt,
    })
}

type Query<'q> = sqlx::query::Query<'q, Postgres, PgArguments>;

impl<'c> Records<'c> {
    pub(super) fn new(
        conn: &'c mut PgConnection,
        sql: &'c Statements,
        offset_ms: i64,
        claiming: Claiming,
    ) -> Self {
        Records {
            conn,
            sql,
            offset_ms,
            claiming,
            contended: false,
        }
    }

    /// Whether a [`Claiming::Tx`] claim stopped because another transaction holds the key's lock
    /// (its error then says so; claim again with [`Claiming::TxWaiting`]).
    pub(super) fn contended(&self) -> bool {
        self.contended
    }

    /// Changes the record held under `claim` with `query` (complete, fail, renew).
    async fn held(&mut self, query: Query<'_>, claim: &Claim) -> Result<(), IdemError> {
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
    ) -> Result<(), IdemError> {
        let query = sqlx::query(self.sql.complete.clone())
            .bind(biz)
            .bind(key)
            .bind(fence_param(claim)?)
            .bind(snapshot)
            .bind(millis(ttl))
            .bind(self.offset_ms);
        self.held(query, claim).await
    }

    pub(super) async fn fail(
        &mut self,
        biz: &str,
        key: &str,
        claim: &Claim,
    ) -> Result<(), IdemError> {
        let query = sqlx::query(self.sql.fail.clone())
            .bind(biz)
            .bind(key)
            .bind(fence_param(claim)?)
            .bind(self.offset_ms);
        self.held(query, claim).await
    }

    pub(super) async fn save_steps(
        &mut self,
        biz: &str,
        key: &str,
        claim: &Claim,
        steps: &[u8],
    ) -> Result<(), IdemError> {
        let query = sqlx::query(self.sql.save_steps.clone())
            .bind(biz)
            .bind(key)
            .bind(fence_param(claim)?)
            .bind(steps)
            .bind(self.offset_ms);
        self.held(query, claim).await
    }

    pub(super) async fn renew(
        &mut self,
        biz: &str,
        key: &str,
        claim: &Claim,
        lease: Duration,
    ) -> Result<(), IdemError> {
        let query = sqlx::query(self.sql.renew.clone())
            .bind(biz)
            .bind(key)
            .bind(fence_param(claim)?)
            .bind(millis(lease))
            .bind(self.offset_ms);
        self.held(query, claim).await
    }

    pub(super) async fn load(&mut self, biz: &str, key: &str) -> Result<Option<Record>, IdemError> {
        let Some(row) = sqlx::query(self.sql.load.clone())
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
        let rows = sqlx::query(self.sql.stuck.clone())
            .bind(biz)
            .bind(self.offset_ms)
            .bind(i64::try_from(batch).unwrap_or(i64::MAX))
            .fetch_all(&mut *self.conn)
            .await
            .map_err(db_error)?;
        rows.iter()
            .map(|row| record_of(row, biz, row.try_get("idem_key").map_err(db_error)?))
            .collect()
    }

    pub(super) async fn stats(&mut self) -> Result<Vec<StatusCount>, IdemError> {
        let rows = sqlx::query(self.sql.stats.clone())
            .fetch_all(&mut *self.conn)
            .await
            .map_err(db_error)?;
        let counts = rows
            .iter()
            .map(|row| {
                StatusCount::of_row(
                    row.try_get("biz_type").map_err(db_error)?,
                    row.try_get("status").map_err(db_error)?,
                    row.try_get("n").map_err(db_error)?,
                )
            })
            .collect::<Result<Vec<_>, IdemError>>()?;
        Ok(StatusCount::tally(counts))
    }

    pub(super) async fn sweep(&mut self, batch: usize) -> Result<u64, IdemError> {
        let done = sqlx::query(self.sql.sweep.clone())
            .bind(i64::try_from(batch).unwrap_or(i64::MAX))
            .bind(self.offset_ms)
            .execute(&mut *self.conn)
            .await
            .map_err(db_error)?;
        Ok(done.rows_affected())
    }
}

/// The claim's view of a row with the columns of the claim or the read.
fn seen_of(row: &PgRow) -> Result<SeenRecord, IdemError> {
    Ok(seen_record!(
        row,
        attempt_of(row)?,
        fence_of(row)?,
        db_error
    ))
}

/// `sql` (a claim or the insert) with its binds: $1 biz, $2 key, $3 fingerprint, $4 lease ms,
/// $5 ttl ms, $6 clock offset ms.
fn claim_query<'q>(sql: &SqlStr, req: &ClaimRequest<'q>, offset_ms: i64) -> Query<'q> {
    sqlx::query(sql.clone())
        .bind(req.biz)
        .bind(req.key)
        .bind(req.fingerprint)
        .bind(millis(req.lease))
        .bind(millis(req.ttl))
        .bind(offset_ms)
}

impl Records<'_> {
    /// Lease mode's insert step: the new record, or (the key exists) a plain read of it. While new
    /// keys prevail (the claim order) that is one statement, with no read in it; a key that
    /// exists costs two.
    async fn insert_then_read(
        &mut self,
        req: &ClaimRequest<'_>,
    ) -> Result<(bool, Option<SeenRecord>), IdemError> {
        let row = claim_query(&self.sql.insert, req, self.offset_ms)
            .fetch_optional(&mut *self.conn)
            .await
            .map_err(db_error)?;
        let Some(row) = row else {
            // The key exists (or was deleted since: then the protocol inserts again).
            return Ok((false, self.read(req).await?));
        };
        Ok((
            true,
            Some(SeenRecord {
                status: Status::Processing,
                attempt: attempt_of(&row)?,
                fence: fence_of(&row)?,
                fingerprint: None,
                snapshot: None,
                lease_until_ms: 0,
                expire_at_ms: 0,
                now_ms: 0,
            }),
        ))
    }
}

impl CasRecords for Records<'_> {
    async fn read(&mut self, req: &ClaimRequest<'_>) -> Result<Option<SeenRecord>, IdemError> {
        let row = sqlx::query(self.sql.read.clone())
            .bind(req.biz)
            .bind(req.key)
            .bind(self.offset_ms)
            .fetch_optional(&mut *self.conn)
            .await
            .map_err(db_error)?;
        row.as_ref().map(seen_of).transpose()
    }

    async fn insert_or_read(
        &mut self,
        req: &ClaimRequest<'_>,
    ) -> Result<(bool, Option<SeenRecord>), IdemError> {
        let sql = match self.claiming {
            Claiming::Lease => return self.insert_then_read(req).await,
            Claiming::Tx => &self.sql.claim_locking,
            Claiming::TxWaiting => &self.sql.claim_waiting,
        };
        let Some(row) = claim_query(sql, req, self.offset_ms)
            .fetch_optional(&mut *self.conn)
            .await
            .map_err(db_error)?
        else {
            // Another transaction inserted the key after this statement's snapshot was taken (the
            // insert waited for it and skipped): read again.
            return Ok((false, None));
        };
        if self.claiming != Claiming::Lease && !row.try_get::<bool, _>("got").map_err(db_error)? {
            self.contended = true;
            return Err(IdemError::busy(
                Busy::LockTimeout,
                "another transaction holds this key's claim",
            ));
        }
        let inserted: bool = row.try_get("inserted").map_err(db_error)?;
        Ok((inserted, Some(seen_of(&row)?)))
    }

    async fn take(
        &mut self,
        req: &ClaimRequest<'_>,
        seen: &SeenRecord,
        reset: bool,
        keep_steps: bool,
    ) -> Result<Option<Claim>, IdemError> {
        let Some(row) = sqlx::query(self.sql.take.clone())
            .bind(req.biz)
            .bind(req.key)
            .bind(req.fingerprint)
            .bind(millis(req.lease))
            .bind(millis(req.ttl))
            .bind(self.offset_ms)
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
