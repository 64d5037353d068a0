//! The statements of the MySQL store and the claim protocol's steps on one connection.
//!
//! Every statement reads the database's clock (plus the test clock's offset, bound where `now`
//! appears) and binds every value; table names are validated ([`TableName`]) and quoted.
//!
//! Round trips: a new key is one `INSERT` (its fence comes back in the OK packet) and one mark; a
//! repeat is the `INSERT` refused with 1062 and one read, or, once the store's claims mostly meet a
//! record (`store/order.rs`), the read alone; a takeover adds one conditional `UPDATE`.

use std::sync::Arc;
use std::time::Duration;

use sqlx::mysql::{MySqlArguments, MySqlConnection, MySqlRow};
use sqlx::{AssertSqlSafe, MySql, Row};

use super::{MySqlStore, db_error, error_number};
use crate::IdemError;
use crate::sql::claim::{CasRecords, SeenRecord, seen_record};
use crate::sql::dialect::Dialect;
use crate::sql::table::TableName;
use crate::store::decide::millis;
use crate::store::{Claim, ClaimRequest, Fence, Record, Status, StatusCount};

/// The database clock in microseconds since the Unix epoch, plus the offset bound at its `?`.
/// `UTC_TIMESTAMP` is fixed for the length of a statement, so every `now` in one statement agrees.
macro_rules! now_us {
    () => {
        "(TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) + ?)"
    };
}

/// The same clock in milliseconds (one `?`: the offset in microseconds).
macro_rules! now_ms {
    () => {
        concat!("(", now_us!(), " DIV 1000)")
    };
}

/// The record's columns as the claim reads them.
const COLUMNS: &str =
    "status, attempt, fence, fingerprint, result, lease_until, expire_at, result_until";

/// The statements for one table, built once per store (the table name is part of their text, so
/// each is prepared once per connection and cached by sqlx).
#[derive(Clone)]
pub(crate) struct Statements {
    /// ?biz ?key ?off ?fp ?off ?lease ?off ?off ?off ?ttl
    insert: Arc<str>,
    /// ?off ?biz ?key: the plain read (lease mode, autocommit: the latest committed row).
    read: Arc<str>,
    /// The same, `LOCK IN SHARE MODE` (tx mode): a current read that waits for a writer, and whose
    /// shared lock is the one InnoDB already granted with the duplicate-key error, so concurrent
    /// duplicates reading it do not deadlock each other (`FOR UPDATE` would: each holds the shared
    /// lock the other's exclusive lock waits for).
    read_locking: Arc<str>,
    /// ?reset ?off ?fp ?keep_steps ?reset ?off ?reset ?off ?ttl ?off ?lease ?off ?lease ?off
    /// ?biz ?key ?fence ?status ?lease_until
    take: Arc<str>,
    /// ?snapshot ?off ?ttl ?off ?result_ttl ?off ?biz ?key ?fence
    complete: Arc<str>,
    /// ?off ?biz ?key ?fence
    fail: Arc<str>,
    /// ?steps ?off ?biz ?key ?fence
    save_steps: Arc<str>,
    /// ?off ?lease ?off ?lease ?off ?biz ?key ?fence
    renew: Arc<str>,
    /// ?biz ?key
    load: Arc<str>,
    /// ?off ?off ?batch
    sweep: Arc<str>,
    /// ?off ?batch
    shrink: Arc<str>,
    /// ?biz ?off ?batch
    stuck: Arc<str>,
    /// ?off
    stats: Arc<str>,
    pub(super) tokens: TokenStatements,
}

/// The statements of the token table.
#[derive(Clone)]
pub(crate) struct TokenStatements {
    /// ?token ?subject ?off ?ttl
    pub issue: Arc<str>,
    /// ?to ?token ?subject ?from ?off
    pub flip: Arc<str>,
    /// ?off ?token
    pub find: Arc<str>,
    /// ?off ?batch
    pub sweep: Arc<str>,
}

impl Statements {
    pub(crate) fn new(table: &TableName, tokens: &TableName) -> Self {
        let t = table.quoted(Dialect::MySQL);
        let key = "biz_type = ? AND idem_key = ?";
        let read = format!(
            "SELECT {COLUMNS}, {now} AS now_ms FROM {t} WHERE {key}",
            now = now_ms!()
        );
        let tk = tokens.quoted(Dialect::MySQL);
        Statements {
            insert: format!(
                "INSERT INTO {t} (biz_type, idem_key, status, attempt, fence, fingerprint, result, \
                 lease_until, created_at, updated_at, expire_at) VALUES (?, ?, 'PROCESSING', 1, \
                 LAST_INSERT_ID({now_us}), ?, NULL, {now} + ?, {now}, {now}, {now} + ?)",
                now_us = now_us!(),
                now = now_ms!()
            )
            .into(),
            read_locking: format!("{read} LOCK IN SHARE MODE").into(),
            read: read.into(),
            // Assignments run left to right; each reads only its own column's old value. The
            // saved steps of an unfinished record (in `result`) stay when the take keeps them.
            take: format!(
                "UPDATE {t} SET status = 'PROCESSING', attempt = IF(?, 1, attempt + 1), \
                 fence = LAST_INSERT_ID(GREATEST(fence + 1, {now_us})), fingerprint = ?, \
                 result = IF(?, result, NULL), result_until = NULL, \
                 created_at = IF(?, {now}, created_at), \
                 expire_at = IF(?, {now} + ?, GREATEST(expire_at, {now} + ?)), \
                 lease_until = {now} + ?, updated_at = {now} \
                 WHERE {key} AND fence = ? AND status = ? AND lease_until = ?",
                now_us = now_us!(),
                now = now_ms!()
            )
            .into(),
            // The mark moves the expiry to at least now + ttl, so a body slower than its ttl still
            // leaves a live success. A record already SUCCEEDED under the fence counts as held and
            // keeps its result and expiry: a mark sent again after a lost reply succeeds (and
            // FAILED likewise for `fail`). `result`, `expire_at` and `result_until` (NULL: the
            // result is kept as long as the record) are assigned before `status`, so they see the
            // old status.
            complete: format!(
                "UPDATE {t} SET result = IF(status = 'PROCESSING', ?, result), \
                 expire_at = IF(status = 'PROCESSING', GREATEST(expire_at, {now} + ?), expire_at), \
                 result_until = IF(status = 'PROCESSING', {now} + ?, result_until), \
                 status = 'SUCCEEDED', updated_at = {now} \
                 WHERE {key} AND fence = ? AND status IN ('PROCESSING', 'SUCCEEDED')",
                now = now_ms!()
            )
            .into(),
            // The saved steps (in `result`) stay for a retry.
            fail: format!(
                "UPDATE {t} SET status = 'FAILED', updated_at = {now} \
                 WHERE {key} AND fence = ? AND status IN ('PROCESSING', 'FAILED')",
                now = now_ms!()
            )
            .into(),
            // The steps of an unfinished record live in `result` until a success replaces them.
            save_steps: format!(
                "UPDATE {t} SET result = ?, updated_at = {now} \
                 WHERE {key} AND fence = ? AND status = 'PROCESSING'",
                now = now_ms!()
            )
            .into(),
            renew: format!(
                "UPDATE {t} SET lease_until = {now} + ?, expire_at = GREATEST(expire_at, {now} + ?), \
                 updated_at = {now} WHERE {key} AND fence = ? AND status = 'PROCESSING'",
                now = now_ms!()
            )
            .into(),
            load: format!("SELECT {COLUMNS} FROM {t} WHERE {key}").into(),
            // Expired: the TTL passed and no lease is live. One short statement per batch, walking
            // the expiry index; ordered by the whole key so replicas delete the same rows.
            sweep: format!(
                "DELETE FROM {t} WHERE expire_at <= {now} \
                 AND NOT (status = 'PROCESSING' AND lease_until > {now}) \
                 ORDER BY expire_at, biz_type, idem_key LIMIT ?",
                now = now_ms!()
            )
            .into(),
            // Results past their result ttl: dropped, the records kept as tombstones
            // (`result_until` 0, out of the range looked in). A range of the index
            // `<table>_result_until (result_until)`, ordered by the whole key so replicas change
            // the same rows.
            shrink: format!(
                "UPDATE {t} SET result = NULL, result_until = 0 \
                 WHERE result_until > 0 AND result_until <= {now} AND status = 'SUCCEEDED' \
                 ORDER BY result_until, biz_type, idem_key LIMIT ?",
                now = now_ms!()
            )
            .into(),
            // PROCESSING with the lease ended, oldest lease first: a range of the index
            // `<table>_stuck (biz_type, status, lease_until)`, read in its order (no filesort),
            // that stops after the batch (`UTC_TIMESTAMP` is a constant of the statement, so it
            // bounds the range).
            stuck: format!(
                "SELECT idem_key, {COLUMNS} FROM {t} WHERE biz_type = ? AND status = 'PROCESSING' \
                 AND lease_until <= {now} ORDER BY lease_until LIMIT ?",
                now = now_ms!()
            )
            .into(),
            // Records per business type, route (`origin`: what an HTTP layer record's fingerprint
            // keeps before its digest) and status (expired ones not yet swept included), and
            // `gone`, the tombstones among them (their result ttl passed): a scan of the table
            // (an operator's query).
            stats: format!(
                "SELECT biz_type, CASE WHEN LOCATE(' ', fingerprint) > 0 THEN \
                 SUBSTRING(fingerprint, 1, CHAR_LENGTH(fingerprint) \
                 - CHAR_LENGTH(SUBSTRING_INDEX(fingerprint, ' ', -1)) - 1) END AS origin, status, \
                 COUNT(*) AS n, \
                 CAST(COUNT(CASE WHEN result_until <= {now} THEN 1 END) AS SIGNED) AS gone \
                 FROM {t} GROUP BY biz_type, origin, status",
                now = now_ms!()
            )
            .into(),
            tokens: TokenStatements {
                issue: format!(
                    "INSERT INTO {tk} (token, subject, spent, expire_at) VALUES (?, ?, 0, {now} + ?)",
                    now = now_ms!()
                )
                .into(),
                flip: format!(
                    "UPDATE {tk} SET spent = ? WHERE token = ? AND subject = ? AND spent = ? \
                     AND expire_at > {now}",
                    now = now_ms!()
                )
                .into(),
                find: format!(
                    "SELECT subject, CAST(expire_at > {now} AS SIGNED) AS live FROM {tk} WHERE token = ?",
                    now = now_ms!()
                )
                .into(),
                sweep: format!(
                    "DELETE FROM {tk} WHERE expire_at <= {now} ORDER BY expire_at, token LIMIT ?",
                    now = now_ms!()
                )
                .into(),
            },
        }
    }
}

/// A statement of the store as a sqlx query.
pub(super) fn query(sql: &Arc<str>) -> sqlx::query::Query<'static, MySql, MySqlArguments> {
    sqlx::query(AssertSqlSafe(sql.clone()))
}

/// The store's records, reached through one connection (a pool connection in lease mode, the
/// caller's transaction in tx mode).
pub(super) struct Records<'c> {
    conn: &'c mut MySqlConnection,
    sql: &'c Statements,
    off: i64,
    /// Tx mode: reads are current reads (`LOCK IN SHARE MODE`).
    locking: bool,
    /// Statements to send in the round trip of the first insert (tx mode: the claim's savepoint).
    before_insert: Option<String>,
}

fn attempt_of(row: &MySqlRow) -> Result<u32, IdemError> {
    row.try_get("attempt").map_err(db_error)
}

/// The record `(biz, key)` from a row with the columns of `load`.
fn record_of(row: &MySqlRow, biz: &str, key: String) -> Result<Record, IdemError> {
    let status = Status::parse(row.try_get("status").map_err(db_error)?)?;
    let (snapshot, steps) = Record::split_blob(status, row.try_get("result").map_err(db_error)?);
    Ok(Record {
        biz: biz.to_owned(),
        key,
        status,
        attempt: attempt_of(row)?,
        fence: Fence::new(row.try_get("fence").map_err(db_error)?),
        fingerprint: row.try_get("fingerprint").map_err(db_error)?,
        snapshot,
        steps,
        lease_until_ms: row.try_get("lease_until").map_err(db_error)?,
        expire_at_ms: row.try_get("expire_at").map_err(db_error)?,
        result_until_ms: row.try_get("result_until").map_err(db_error)?,
    })
}

fn fence_param(claim: &Claim) -> u64 {
    claim.fence.get()
}

impl<'c> Records<'c> {
    pub(super) fn new(conn: &'c mut MySqlConnection, store: &'c MySqlStore, locking: bool) -> Self {
        Records {
            conn,
            sql: &store.sql,
            off: store.offset_us(),
            locking,
            before_insert: None,
        }
    }

    /// The same records, the first insert sent in one round trip after `sql` (statements without
    /// parameters): the insert then goes as text, its values written as literals (see
    /// [`Records::insert_text`]).
    pub(super) fn sending_first(mut self, sql: String) -> Self {
        self.before_insert = Some(sql);
        self
    }

    /// The insert statement with its values written in: strings as hexadecimal literals (only
    /// `[0-9A-F]` between the quotes, whatever the bytes), numbers as decimals. The statement's text
    /// has no `?` but its parameters' (its quoted parts are `'PROCESSING'`, a date, and a validated
    /// table name), so each `?` is replaced in order.
    fn insert_text(&self, req: &ClaimRequest<'_>) -> String {
        fn hex(s: &str) -> String {
            use std::fmt::Write;
            let mut out = String::with_capacity(s.len() * 2 + 3);
            out.push_str("X'");
            for b in s.bytes() {
                let _ = write!(out, "{b:02X}");
            }
            out.push('\'');
            out
        }
        let off = self.off.to_string();
        let values = [
            hex(req.biz),
            hex(req.key),
            off.clone(),
            req.fingerprint.map_or_else(
                || "NULL".to_owned(),
                |fp| format!("CONVERT({} USING utf8mb4)", hex(fp)),
            ),
            off.clone(),
            millis(req.lease).to_string(),
            off.clone(),
            off.clone(),
            off,
            millis(req.ttl).to_string(),
        ];
        let mut parts = self.sql.insert.split('?');
        let mut text = parts.next().unwrap_or_default().to_owned();
        for (value, part) in values.iter().zip(parts) {
            text.push_str(value);
            text.push_str(part);
        }
        text
    }

    /// Runs a statement that changes the record held under `claim` (complete, fail, renew).
    async fn held(
        &mut self,
        query: sqlx::query::Query<'_, MySql, MySqlArguments>,
        claim: &Claim,
    ) -> Result<(), IdemError> {
        // CLIENT_FOUND_ROWS: the rows the WHERE matched, so a mark sent again counts as held.
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
        result_ttl: Option<Duration>,
    ) -> Result<(), IdemError> {
        let q = query(&self.sql.complete)
            .bind(snapshot)
            .bind(self.off)
            .bind(millis(ttl))
            .bind(self.off)
            .bind(result_ttl.map(millis))
            .bind(self.off)
            .bind(biz)
            .bind(key)
            .bind(fence_param(claim));
        self.held(q, claim).await
    }

    pub(super) async fn fail(
        &mut self,
        biz: &str,
        key: &str,
        claim: &Claim,
    ) -> Result<(), IdemError> {
        let q = query(&self.sql.fail)
            .bind(self.off)
            .bind(biz)
            .bind(key)
            .bind(fence_param(claim));
        self.held(q, claim).await
    }

    pub(super) async fn save_steps(
        &mut self,
        biz: &str,
        key: &str,
        claim: &Claim,
        steps: &[u8],
    ) -> Result<(), IdemError> {
        let q = query(&self.sql.save_steps)
            .bind(steps)
            .bind(self.off)
            .bind(biz)
            .bind(key)
            .bind(fence_param(claim));
        self.held(q, claim).await
    }

    pub(super) async fn renew(
        &mut self,
        biz: &str,
        key: &str,
        claim: &Claim,
        lease: Duration,
    ) -> Result<(), IdemError> {
        let lease = millis(lease);
        let q = query(&self.sql.renew)
            .bind(self.off)
            .bind(lease)
            .bind(self.off)
            .bind(lease)
            .bind(self.off)
            .bind(biz)
            .bind(key)
            .bind(fence_param(claim));
        self.held(q, claim).await
    }

    pub(super) async fn load(&mut self, biz: &str, key: &str) -> Result<Option<Record>, IdemError> {
        let Some(row) = query(&self.sql.load)
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
        let rows = query(&self.sql.stuck)
            .bind(biz)
            .bind(self.off)
            .bind(u64::try_from(batch).unwrap_or(u64::MAX))
            .fetch_all(&mut *self.conn)
            .await
            .map_err(db_error)?;
        rows.iter()
            .map(|row| {
                // A VARBINARY column: the bytes of the key, which a claim wrote from a `&str`.
                let key = row.try_get::<Vec<u8>, _>("idem_key").map_err(db_error)?;
                record_of(row, biz, String::from_utf8(key).map_err(IdemError::store)?)
            })
            .collect()
    }

    pub(super) async fn stats(&mut self) -> Result<Vec<StatusCount>, IdemError> {
        let rows = query(&self.sql.stats)
            .bind(self.off)
            .fetch_all(&mut *self.conn)
            .await
            .map_err(db_error)?;
        let counts = rows
            .iter()
            .map(|row| {
                // A VARBINARY column: the bytes of the business type, which a claim wrote from a `&str`.
                let biz = row.try_get::<Vec<u8>, _>("biz_type").map_err(db_error)?;
                StatusCount::of_row(
                    String::from_utf8(biz).map_err(IdemError::store)?,
                    row.try_get("origin").map_err(db_error)?,
                    row.try_get("status").map_err(db_error)?,
                    row.try_get("n").map_err(db_error)?,
                    row.try_get("gone").map_err(db_error)?,
                )
            })
            .collect::<Result<Vec<_>, IdemError>>()?;
        Ok(StatusCount::tally(counts))
    }

    pub(super) async fn sweep(&mut self, batch: usize) -> Result<u64, IdemError> {
        let done = query(&self.sql.sweep)
            .bind(self.off)
            .bind(self.off)
            .bind(u64::try_from(batch).unwrap_or(u64::MAX))
            .execute(&mut *self.conn)
            .await
            .map_err(db_error)?;
        let shrunk = query(&self.sql.shrink)
            .bind(self.off)
            .bind(u64::try_from(batch).unwrap_or(u64::MAX))
            .execute(&mut *self.conn)
            .await
            .map_err(db_error)?;
        Ok(done.rows_affected() + shrunk.rows_affected())
    }

    /// Reads the record after its insert was refused (a current read in tx mode), or with `plain`
    /// a plain read in either mode.
    async fn read_row(
        &mut self,
        req: &ClaimRequest<'_>,
        plain: bool,
    ) -> Result<Option<SeenRecord>, IdemError> {
        let sql = if self.locking && !plain {
            &self.sql.read_locking
        } else {
            &self.sql.read
        };
        let Some(row) = query(sql)
            .bind(self.off)
            .bind(req.biz)
            .bind(req.key)
            .fetch_optional(&mut *self.conn)
            .await
            .map_err(db_error)?
        else {
            return Ok(None);
        };
        let fence = row.try_get("fence").map_err(db_error)?;
        Ok(Some(seen_record!(row, attempt_of(&row)?, fence, db_error)))
    }
}

impl CasRecords for Records<'_> {
    async fn read(&mut self, req: &ClaimRequest<'_>) -> Result<Option<SeenRecord>, IdemError> {
        self.read_row(req, true).await
    }

    async fn insert_or_read(
        &mut self,
        req: &ClaimRequest<'_>,
    ) -> Result<(bool, Option<SeenRecord>), IdemError> {
        let (lease, ttl, off) = (millis(req.lease), millis(req.ttl), self.off);
        let inserted = match self.before_insert.take() {
            // One round trip: the statements before, then the insert (the batch stops at an error;
            // the last statement's insert id is the result's).
            Some(before) => {
                let batch = format!("{before}; {}", self.insert_text(req));
                sqlx::raw_sql(AssertSqlSafe(batch))
                    .execute(&mut *self.conn)
                    .await
            }
            None => {
                query(&self.sql.insert)
                    .bind(req.biz)
                    .bind(req.key)
                    .bind(off)
                    .bind(req.fingerprint)
                    .bind(off)
                    .bind(lease)
                    .bind(off)
                    .bind(off)
                    .bind(off)
                    .bind(ttl)
                    .execute(&mut *self.conn)
                    .await
            }
        };
        match inserted {
            Ok(done) => Ok((
                true,
                Some(SeenRecord {
                    status: Status::Processing,
                    attempt: 1,
                    fence: done.last_insert_id(),
                    fingerprint: None,
                    snapshot: None,
                    lease_until_ms: 0,
                    expire_at_ms: 0,
                    result_until_ms: None,
                    now_ms: 0,
                }),
            )),
            // ER_DUP_ENTRY: the record exists (and InnoDB holds a shared lock on it for us).
            Err(e) if error_number(&e) == Some(1062) => {
                Ok((false, self.read_row(req, false).await?))
            }
            Err(e) => Err(db_error(e)),
        }
    }

    async fn take(
        &mut self,
        req: &ClaimRequest<'_>,
        seen: &SeenRecord,
        reset: bool,
        keep_steps: bool,
    ) -> Result<Option<Claim>, IdemError> {
        let (lease, ttl, off) = (millis(req.lease), millis(req.ttl), self.off);
        let done = query(&self.sql.take)
            .bind(reset)
            .bind(off)
            .bind(req.fingerprint)
            .bind(keep_steps)
            .bind(reset)
            .bind(off)
            .bind(reset)
            .bind(off)
            .bind(ttl)
            .bind(off)
            .bind(lease)
            .bind(off)
            .bind(lease)
            .bind(off)
            .bind(req.biz)
            .bind(req.key)
            .bind(seen.fence)
            .bind(seen.status.as_str())
            .bind(seen.lease_until_ms)
            .execute(&mut *self.conn)
            .await
            .map_err(db_error)?;
        if done.rows_affected() != 1 {
            return Ok(None);
        }
        Ok(Some(Claim {
            attempt: if reset {
                1
            } else {
                seen.attempt.saturating_add(1)
            },
            fence: Fence::new(done.last_insert_id()),
        }))
    }
}
