//! The claim protocol's steps on one connection, with the statements of `statements.rs`.
//!
//! Every statement reads the database's clock (plus the test clock's offset, bound where `now`
//! appears) and binds every value; table names are validated ([`TableName`]) and quoted.
//!
//! Round trips: a new key is one `INSERT` (its fence comes back in the OK packet) and one mark; a
//! repeat is the `INSERT` refused with 1062 and one read, or, once the store's claims mostly meet a
//! record (`store/order.rs`), the read alone; a takeover adds one conditional `UPDATE`.

use std::time::Duration;

use sqlx::mysql::{MySqlArguments, MySqlConnection, MySqlRow};
use sqlx::{AssertSqlSafe, MySql, Row};

use super::statements::{Statements, query};
use super::{MySqlStore, db_error, error_number};
use crate::IdemError;
use crate::sql::claim::{CasRecords, SeenRecord, seen_record};
use crate::store::decide::millis;
use crate::store::{Claim, ClaimRequest, Fence, Record, Status, StatusCount};

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
