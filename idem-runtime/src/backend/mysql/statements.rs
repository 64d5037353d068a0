//! The MySQL store's SQL: every statement of a table, built once per store. Every statement reads
//! the database's clock (plus the test clock's offset, bound where `now` appears) and binds every
//! value; table names are validated ([`TableName`]) and quoted.

use std::sync::Arc;

use sqlx::mysql::MySqlArguments;
use sqlx::{AssertSqlSafe, MySql};

use crate::sql::dialect::Dialect;
use crate::sql::records::Param::{self, *};
use crate::sql::records::{RecordStatements, Stmt};
use crate::sql::table::TableName;
use crate::sql::tokens::TokenStatements;

/// The order of each record statement's `?`s (a value appears as often as the text asks for it).
const COMPLETE: &[Param] = &[Blob, Clock, Ttl, Clock, ResultTtl, Clock, Biz, Key, Fence];
const FAIL: &[Param] = &[Clock, Biz, Key, Fence];
const SAVE_STEPS: &[Param] = &[Blob, Clock, Biz, Key, Fence];
const RENEW: &[Param] = &[Clock, Lease, Clock, Lease, Clock, Biz, Key, Fence];
const READ: &[Param] = &[Clock, Biz, Key];
const LOAD: &[Param] = &[Biz, Key];
const STUCK: &[Param] = &[Biz, Clock, Batch];
const STATS: &[Param] = &[Clock];
const KEYS_FIRST: &[Param] = &[Batch];
const KEYS_AFTER: &[Param] = &[Biz, Biz, Key, Batch];
const SWEEP: &[Param] = &[Clock, Clock, Batch];
const SHRINK: &[Param] = &[Clock, Batch];

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

/// The condition on one record's key (`?biz ?key`).
const KEY: &str = "biz_type = ? AND idem_key = ?";

/// The record's columns as the claim reads them.
pub(super) const COLUMNS: &str =
    "status, attempt, fence, fingerprint, result, lease_until, expire_at, result_until";

/// The statements for one table, built once per store (the table name is part of their text, so
/// each is prepared once per connection and cached by sqlx).
#[derive(Clone)]
pub(crate) struct Statements {
    /// ?biz ?key ?off ?fp ?off ?lease ?off ?off ?off ?ttl
    pub(super) insert: Arc<str>,
    /// ?off ?biz ?key, `LOCK IN SHARE MODE` (tx mode): a current read that waits for a writer,
    /// and whose shared lock is the one InnoDB already granted with the duplicate-key error, so
    /// concurrent duplicates reading it do not deadlock each other (`FOR UPDATE` would: each holds
    /// the shared lock the other's exclusive lock waits for). The plain read is `records.read`.
    pub(super) read_locking: Stmt,
    /// A batch claim's plain read of many keys, sent as text: the part before the keys'
    /// list (its one `?` the clock offset), each row with its `idem_key`.
    pub(super) read_many: String,
    /// ?reset ?off ?fp ?keep_steps ?reset ?off ?reset ?off ?ttl ?off ?lease ?off ?lease ?off
    /// ?biz ?key ?fence ?status ?lease_until
    pub(super) take: Arc<str>,
    /// What the record layer sends (`sql/records.rs`), each with its placeholders' order below.
    pub(super) records: RecordStatements,
    pub(super) tokens: TokenStatements,
}

impl Statements {
    pub(crate) fn new(table: &TableName, tokens: &TableName) -> Self {
        let t = table.quoted(Dialect::MySQL);
        let read = format!(
            "SELECT {COLUMNS}, {now} AS now_ms FROM {t} WHERE {KEY}",
            now = now_ms!()
        );
        Statements {
            insert: format!(
                "INSERT INTO {t} (biz_type, idem_key, status, attempt, fence, fingerprint, result, \
         lease_until, created_at, updated_at, expire_at) VALUES (?, ?, 'PROCESSING', 1, \
         LAST_INSERT_ID({now_us}), ?, NULL, {now} + ?, {now}, {now}, {now} + ?)",
                now_us = now_us!(),
                now = now_ms!()
            )
            .into(),
            read_locking: Stmt::new(format!("{read} LOCK IN SHARE MODE"), READ),
            read_many: format!(
                "SELECT idem_key, {COLUMNS}, {now} AS now_ms FROM {t} WHERE biz_type = ",
                now = now_ms!()
            ),
            // Assignments run left to right; each reads only its own column's old value. The
            // saved steps of an unfinished record (in `result`) stay when the take keeps them.
            take: format!(
                "UPDATE {t} SET status = 'PROCESSING', attempt = IF(?, 1, attempt + 1), \
         fence = LAST_INSERT_ID(GREATEST(fence + 1, {now_us})), fingerprint = ?, \
         result = IF(?, result, NULL), result_until = NULL, \
         created_at = IF(?, {now}, created_at), \
         expire_at = IF(?, {now} + ?, GREATEST(expire_at, {now} + ?)), \
         lease_until = {now} + ?, updated_at = {now} \
         WHERE {KEY} AND fence = ? AND status = ? AND lease_until = ?",
                now_us = now_us!(),
                now = now_ms!()
            )
            .into(),
            records: records(&t, read),
            tokens: super::tokens::token_statements(tokens),
        }
    }
}

/// What the record layer sends (`sql/records.rs`), each with its placeholders' order.
fn records(t: &str, read: String) -> RecordStatements {
    RecordStatements {
        complete_commit: None,
        read: Stmt::new(read, READ),
        complete: Stmt::new(complete(t), COMPLETE),
        fail: Stmt::new(fail(t), FAIL),
        save_steps: Stmt::new(save_steps(t), SAVE_STEPS),
        renew: Stmt::new(renew(t), RENEW),
        load: Stmt::new(format!("SELECT {COLUMNS} FROM {t} WHERE {KEY}"), LOAD),
        sweep: Stmt::new(sweep(t), SWEEP),
        shrink: Stmt::new(shrink(t), SHRINK),
        stuck: Stmt::new(stuck(t), STUCK),
        // The business types with PROCESSING records: the stuck index
        // `(biz_type, status, lease_until)` read a business type at a time (a loose index
        // scan), not the table.
        processing_biz: Stmt::new(
            format!("SELECT DISTINCT biz_type FROM {t} WHERE status = 'PROCESSING'"),
            &[],
        ),
        keys_first: Stmt::new(keys_first(t), KEYS_FIRST),
        keys_after: Stmt::new(keys_after(t), KEYS_AFTER),
        stats: Stmt::new(stats(t), STATS),
    }
}

/// The mark moves the expiry to at least now + ttl, so a body slower than its ttl still
/// leaves a live success. A record already SUCCEEDED under the fence counts as held and
/// keeps its result and expiry: a mark sent again after a lost reply succeeds (and
/// FAILED likewise for `fail`). `result`, `expire_at` and `result_until` (NULL: the
/// result is kept as long as the record) are assigned before `status`, so they see the
/// old status.
fn complete(t: &str) -> String {
    format!(
        "UPDATE {t} SET result = IF(status = 'PROCESSING', ?, result), \
         expire_at = IF(status = 'PROCESSING', GREATEST(expire_at, {now} + ?), expire_at), \
         result_until = IF(status = 'PROCESSING', {now} + ?, result_until), \
         status = 'SUCCEEDED', updated_at = {now} \
         WHERE {KEY} AND fence = ? AND status IN ('PROCESSING', 'SUCCEEDED')",
        now = now_ms!()
    )
}

/// The saved steps (in `result`) stay for a retry.
fn fail(t: &str) -> String {
    format!(
        "UPDATE {t} SET status = 'FAILED', updated_at = {now} \
         WHERE {KEY} AND fence = ? AND status IN ('PROCESSING', 'FAILED')",
        now = now_ms!()
    )
}

/// The steps of an unfinished record live in `result` until a success replaces them.
fn save_steps(t: &str) -> String {
    format!(
        "UPDATE {t} SET result = ?, updated_at = {now} \
         WHERE {KEY} AND fence = ? AND status = 'PROCESSING'",
        now = now_ms!()
    )
}

/// The lease moved on from now, and the expiry to at least its end.
fn renew(t: &str) -> String {
    format!(
        "UPDATE {t} SET lease_until = {now} + ?, expire_at = GREATEST(expire_at, {now} + ?), \
         updated_at = {now} WHERE {KEY} AND fence = ? AND status = 'PROCESSING'",
        now = now_ms!()
    )
}

/// Expired: the TTL passed and no lease is live. One short statement per batch, walking
/// the expiry index; ordered by the whole key so replicas delete the same rows.
fn sweep(t: &str) -> String {
    format!(
        "DELETE FROM {t} WHERE expire_at <= {now} \
         AND NOT (status = 'PROCESSING' AND lease_until > {now}) \
         ORDER BY expire_at, biz_type, idem_key LIMIT ?",
        now = now_ms!()
    )
}

/// Results past their result ttl: dropped, the records kept as tombstones
/// (`result_until` 0, out of the range looked in). A range of the index
/// `<table>_result_until (result_until)`, ordered by the whole key so replicas change
/// the same rows.
fn shrink(t: &str) -> String {
    format!(
        "UPDATE {t} SET result = NULL, result_until = 0 \
         WHERE result_until > 0 AND result_until <= {now} AND status = 'SUCCEEDED' \
         ORDER BY result_until, biz_type, idem_key LIMIT ?",
        now = now_ms!()
    )
}

/// PROCESSING with the lease ended, oldest lease first: a range of the index
/// `<table>_stuck (biz_type, status, lease_until)`, read in its order (no filesort),
/// that stops after the batch (`UTC_TIMESTAMP` is a constant of the statement, so it
/// bounds the range).
fn stuck(t: &str) -> String {
    format!(
        "SELECT idem_key, {COLUMNS} FROM {t} WHERE biz_type = ? AND status = 'PROCESSING' \
         AND lease_until <= {now} ORDER BY lease_until LIMIT ?",
        now = now_ms!()
    )
}

/// The first page of a walk of every record's key: the primary key read in its
/// order (the clustered index), stopping after the batch.
fn keys_first(t: &str) -> String {
    format!("SELECT biz_type, idem_key FROM {t} ORDER BY biz_type, idem_key LIMIT ?")
}

/// A later page: the range of the primary key after the last pair of the page
/// before (VARBINARY: byte order). Written as `OR`, which the range optimizer turns
/// into two ranges of the whole key (MariaDB reads a row value `(biz_type,
/// idem_key) > (?, ?)` as a filter on a scan of the whole index).
fn keys_after(t: &str) -> String {
    format!(
        "SELECT biz_type, idem_key FROM {t} \
         WHERE biz_type > ? OR (biz_type = ? AND idem_key > ?) \
         ORDER BY biz_type, idem_key LIMIT ?"
    )
}

/// Records per business type, route (`origin`: what an HTTP layer record's fingerprint
/// keeps before its digest) and status (expired ones not yet swept included), and
/// `gone`, the tombstones among them (their result ttl passed): a scan of the table
/// (an operator's query).
fn stats(t: &str) -> String {
    format!(
        "SELECT biz_type, CASE WHEN LOCATE(' ', fingerprint) > 0 THEN \
         SUBSTRING(fingerprint, 1, CHAR_LENGTH(fingerprint) \
         - CHAR_LENGTH(SUBSTRING_INDEX(fingerprint, ' ', -1)) - 1) END AS origin, status, \
         COUNT(*) AS n, \
         CAST(COUNT(CASE WHEN result_until <= {now} THEN 1 END) AS SIGNED) AS gone \
         FROM {t} GROUP BY biz_type, origin, status",
        now = now_ms!()
    )
}

/// A statement of the store as a sqlx query.
pub(super) fn query(sql: &Arc<str>) -> sqlx::query::Query<'static, MySql, MySqlArguments> {
    sqlx::query(AssertSqlSafe(sql.clone()))
}
