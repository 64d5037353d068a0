//! The MySQL store's part of the record layer (`sql/records.rs`): how its columns read, and the
//! claim's insert and takeover on one connection, with the statements of `statements.rs`.
//!
//! Every statement reads the database's clock (plus the test clock's offset, bound where `now`
//! appears) and binds every value; table names are validated ((`TableName`)) and quoted.
//!
//! Round trips: a new key is one `INSERT` (its fence comes back in the OK packet) and one mark; a
//! repeat is the `INSERT` refused with 1062 and one read, or, once the store's claims mostly meet a
//! record (`store/order.rs`), the read alone; a takeover adds one conditional `UPDATE`.

use sqlx::mysql::{MySqlQueryResult, MySqlRow};
use sqlx::{AssertSqlSafe, MySql, Row};

use super::statements::{Statements, query};
use super::{db_error, error_number};
use crate::IdemError;
use crate::sql::claim::{CasRecords, SeenRecord};
use crate::sql::dialect::Dialect;
use crate::sql::records::{RecordConn, RecordDb};
use crate::store::decide::millis;
use crate::store::{Claim, ClaimRequest, Fence};

impl RecordDb for MySql {
    const DIALECT: Dialect = Dialect::MySQL;

    /// The statements add the offset, in microseconds, to `UTC_TIMESTAMP(6)`.
    fn clock(offset_us: i64) -> i64 {
        offset_us
    }

    fn attempt(row: &MySqlRow) -> Result<u32, IdemError> {
        row.try_get("attempt").map_err(db_error)
    }

    fn fence(row: &MySqlRow) -> Result<u64, IdemError> {
        row.try_get("fence").map_err(db_error)
    }

    /// With `CLIENT_FOUND_ROWS`, the rows the `WHERE` matched: a mark sent again counts as held.
    fn rows_affected(done: &MySqlQueryResult) -> u64 {
        done.rows_affected()
    }

    /// A VARBINARY column: the bytes a claim wrote from a `&str`.
    fn text(row: &MySqlRow, column: &str) -> Result<String, IdemError> {
        let bytes = row.try_get::<Vec<u8>, _>(column).map_err(db_error)?;
        String::from_utf8(bytes).map_err(IdemError::store)
    }
}

/// The claim's steps on one connection (a pool connection in lease mode, the caller's
/// transaction in tx mode): the record layer's read, and this store's insert and takeover.
pub(crate) struct Claims<'c> {
    records: RecordConn<'c, MySql>,
    sql: &'c Statements,
    /// Tx mode: reads are current reads (`LOCK IN SHARE MODE`).
    locking: bool,
    /// Statements to send in the round trip of the first insert (tx mode: the claim's savepoint).
    before_insert: Option<String>,
}

impl<'c> Claims<'c> {
    pub(super) fn new(records: RecordConn<'c, MySql>, sql: &'c Statements, locking: bool) -> Self {
        Claims {
            records,
            sql,
            locking,
            before_insert: None,
        }
    }

    /// The same records, the first insert sent in one round trip after `sql` (statements without
    /// parameters): the insert then goes as text, its values written as literals (see
    /// [`Claims::insert_text`]).
    pub(super) fn sending_first(mut self, sql: String) -> Self {
        self.before_insert = Some(sql);
        self
    }

    /// The insert statement with its values written in: strings as hexadecimal literals ([`hex`]),
    /// numbers as decimals. The statement's text has no `?` but its parameters' (its quoted parts
    /// are `'PROCESSING'`, a date, and a validated table name), so each `?` is replaced in order.
    fn insert_text(&self, req: &ClaimRequest<'_>) -> String {
        fill(&self.sql.insert, &self.insert_values(req))
    }

    /// What the insert's `?`s stand for, in order, as literals.
    fn insert_values(&self, req: &ClaimRequest<'_>) -> [String; 10] {
        let off = self.records.offset().to_string();
        [
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
        ]
    }

    /// Reads the record after its insert was refused (a current read in tx mode), or with `plain`
    /// a plain read in either mode.
    async fn read_row(
        &mut self,
        req: &ClaimRequest<'_>,
        plain: bool,
    ) -> Result<Option<SeenRecord>, IdemError> {
        if self.locking && !plain {
            self.records.read_with(&self.sql.read_locking, req).await
        } else {
            self.records.read(req).await
        }
    }
}

/// `s` as a hexadecimal string literal (only `[0-9A-F]` between the quotes, whatever the bytes).
fn hex(s: &str) -> String {
    blob(s.as_bytes())
}

/// `bytes` as a hexadecimal literal.
fn blob(bytes: &[u8]) -> String {
    format!("X'{}'", crate::sql::records::hex_digits(bytes))
}

/// `template` with each `?` replaced by the next of `values`.
fn fill(template: &str, values: &[String]) -> String {
    let mut parts = template.split('?');
    let mut text = parts.next().unwrap_or_default().to_owned();
    for (value, part) in values.iter().zip(parts) {
        text.push_str(value);
        text.push_str(part);
    }
    text
}

impl CasRecords for Claims<'_> {
    /// A batch of marks: each mark's statement (the record layer's `complete`) with its values
    /// written in as literals, all sent in one round trip; each statement's matched rows say
    /// whether its claim still held.
    async fn complete_many(
        &mut self,
        biz: &str,
        marks: &[crate::store::BatchMark<'_>],
        ttl: std::time::Duration,
    ) -> Result<Vec<Result<(), IdemError>>, IdemError> {
        use crate::sql::records::Param;
        use futures_util::TryStreamExt;
        let stmt = &self.sql.records.complete;
        let off = self.records.offset().to_string();
        let mut text = String::new();
        for m in marks {
            let values: Vec<String> = stmt
                .params()
                .iter()
                .map(|p| match p {
                    Param::Biz => hex(biz),
                    Param::Key => hex(m.key),
                    Param::Fence => m.claim.fence.get().to_string(),
                    Param::Blob => blob(m.snapshot),
                    Param::Ttl => millis(ttl).to_string(),
                    Param::ResultTtl => m
                        .result_ttl
                        .map_or_else(|| "NULL".to_owned(), |kept| millis(kept).to_string()),
                    Param::Clock => off.clone(),
                    Param::Lease | Param::Batch => "NULL".to_owned(),
                })
                .collect();
            text.push_str(&fill(stmt.as_str(), &values));
            text.push_str(";\n");
        }
        let done: Vec<u64> = sqlx::raw_sql(AssertSqlSafe(text))
            .execute_many(self.records.conn())
            .map_ok(|done| done.rows_affected())
            .try_collect()
            .await
            .map_err(db_error)?;
        if done.len() != marks.len() {
            return Err(IdemError::store(format!(
                "{} answers to {} marks sent at once",
                done.len(),
                marks.len()
            )));
        }
        Ok(marks
            .iter()
            .zip(done)
            .map(|(m, rows)| match rows {
                1 => Ok(()),
                _ => Err(IdemError::LeaseLost {
                    attempt: m.claim.attempt,
                }),
            })
            .collect())
    }

    /// One multi-row `INSERT` as text (no statement to prepare for each batch size). A key that
    /// exists refuses the whole statement (1062; InnoDB rolls the statement back): `None`. Every
    /// row of one statement reads the same clock, so each inserted record's fence is the one
    /// `LAST_INSERT_ID` returns.
    async fn insert_many(
        &mut self,
        reqs: &[ClaimRequest<'_>],
    ) -> Result<Option<Vec<Option<Claim>>>, IdemError> {
        if reqs.is_empty() {
            return Ok(Some(Vec::new()));
        }
        let (head, row) = self
            .sql
            .insert
            .split_once("VALUES ")
            .ok_or_else(|| IdemError::store("the insert statement has no VALUES"))?;
        let mut text = format!("{head}VALUES ");
        // In key order, as every batch inserts: two batches with keys in common lock them in
        // the same order. That does not spare every deadlock: a batch whose insert meets an
        // existing key rolls back while others wait on its new keys, each waiter then holds a
        // shared lock the other's insert needs, and InnoDB picks a victim, whose batch the
        // store runs again (`retry_deadlocks`).
        let mut sorted: Vec<&ClaimRequest<'_>> = reqs.iter().collect();
        sorted.sort_unstable_by_key(|r| r.key);
        for (i, req) in sorted.into_iter().enumerate() {
            if i > 0 {
                text.push_str(", ");
            }
            text.push_str(&fill(row, &self.insert_values(req)));
        }
        match sqlx::raw_sql(AssertSqlSafe(text))
            .execute(self.records.conn())
            .await
        {
            Ok(done) => {
                let claim = Claim {
                    attempt: 1,
                    fence: Fence::new(done.last_insert_id()),
                };
                Ok(Some(reqs.iter().map(|_| Some(claim)).collect()))
            }
            Err(e) if error_number(&e) == Some(1062) => Ok(None),
            Err(e) => Err(db_error(e)),
        }
    }

    /// One `SELECT … IN (…)` as text.
    async fn read_many(
        &mut self,
        reqs: &[ClaimRequest<'_>],
    ) -> Result<Vec<Option<SeenRecord>>, IdemError> {
        let Some(first) = reqs.first() else {
            return Ok(Vec::new());
        };
        let mut text = fill(&self.sql.read_many, &[self.records.offset().to_string()]);
        text.push_str(&hex(first.biz));
        text.push_str(" AND idem_key IN (");
        for (i, req) in reqs.iter().enumerate() {
            if i > 0 {
                text.push_str(", ");
            }
            text.push_str(&hex(req.key));
        }
        text.push(')');
        let rows = sqlx::raw_sql(AssertSqlSafe(text))
            .fetch_all(self.records.conn())
            .await
            .map_err(db_error)?;
        RecordConn::<MySql>::seen_by_key(&rows, reqs)
    }

    async fn read(&mut self, req: &ClaimRequest<'_>) -> Result<Option<SeenRecord>, IdemError> {
        self.read_row(req, true).await
    }

    async fn insert_or_read(
        &mut self,
        req: &ClaimRequest<'_>,
    ) -> Result<(bool, Option<SeenRecord>), IdemError> {
        let (lease, ttl, off) = (millis(req.lease), millis(req.ttl), self.records.offset());
        let inserted = match self.before_insert.take() {
            // One round trip: the statements before, then the insert (the batch stops at an error;
            // the last statement's insert id is the result's).
            Some(before) => {
                let batch = format!("{before}; {}", self.insert_text(req));
                sqlx::raw_sql(AssertSqlSafe(batch))
                    .execute(self.records.conn())
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
                    .execute(self.records.conn())
                    .await
            }
        };
        match inserted {
            Ok(done) => Ok((true, Some(SeenRecord::inserted(1, done.last_insert_id())))),
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
        let (lease, ttl, off) = (millis(req.lease), millis(req.ttl), self.records.offset());
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
            .execute(self.records.conn())
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
