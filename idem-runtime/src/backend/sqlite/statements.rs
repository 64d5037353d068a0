//! The SQLite store's SQL: every statement of a table, as templates (`{t}` the quoted table name)
//! made concrete once per store. Every statement binds every value, the store's clock included.

use std::sync::Arc;

use sqlx::sqlite::SqliteArguments;
use sqlx::{AssertSqlSafe, Sqlite};

use crate::sql::dialect::Dialect;
use crate::sql::records::{RecordStatements, Stmt, numbered};
use crate::sql::table::TableName;

/// The record's columns as the claim reads them.
macro_rules! record_columns {
    () => {
        "status, attempt, fence, fingerprint, result, lease_until, expire_at, result_until, "
    };
}

/// ?1 biz, ?2 key, ?3 fingerprint, ?4 lease ms, ?5 ttl ms, ?6 now ms, ?7 now µs (the fence):
/// inserts a new record unless one exists. The row affected says which.
macro_rules! insert_new {
    () => {
        concat!(
            "INSERT INTO {t} (biz_type, idem_key, status, attempt, fence, fingerprint, result, ",
            "lease_until, created_at, updated_at, expire_at) ",
            "VALUES (?1, ?2, 'PROCESSING', 1, ?7, ?3, NULL, ?6 + ?4, ?6, ?6, ?6 + ?5) ",
            "ON CONFLICT (biz_type, idem_key) DO NOTHING"
        )
    };
}

/// ?1–?7 as for `insert_new`.
///
/// Read the record; if there is none, insert a new one. All in one round trip: the claim fetches
/// one row, and sqlx stops a batch at the row a `fetch_optional` asked for, so when the record
/// exists (a repeat) only the first read runs: one read, no write lock. Otherwise the insert runs
/// and the last `SELECT` answers `inserted = 1` when it wrote the row (`changes()`), with no
/// other column: the claim knows the new record from what it bound. No row at all: another
/// connection inserted first, and the claim reads again.
const CLAIM: &str = concat!(
    "SELECT ",
    record_columns!(),
    "?6 AS now_ms, 0 AS inserted ",
    "FROM {t} WHERE biz_type = ?1 AND idem_key = ?2; ",
    insert_new!(),
    "; SELECT 1 AS inserted WHERE changes() = 1"
);
/// A new record's insert alone (no read before it), for a claim sent while new keys prevail
/// (`store/order.rs`): see `insert_new`.
const INSERT_NEW: &str = insert_new!();
/// ?1 biz, ?2 the keys and fingerprints as a JSON array of `[key, fingerprint or null]`, ?4 lease
/// ms, ?5 ttl ms, ?6 now ms, ?7 now µs (every new record's fence): a batch claim's insert of every
/// key that has no record, in one statement, returning the keys it inserted. (`WHERE true` tells
/// SQLite's parser that `ON CONFLICT` belongs to the insert, not to a join.)
const INSERT_MANY: &str = concat!(
    "INSERT INTO {t} (biz_type, idem_key, status, attempt, fence, fingerprint, result, ",
    "lease_until, created_at, updated_at, expire_at) ",
    "SELECT ?1, json_extract(j.value, '$[0]'), 'PROCESSING', 1, ?7, json_extract(j.value, '$[1]'), ",
    "NULL, ?6 + ?4, ?6, ?6, ?6 + ?5 FROM json_each(?2) AS j WHERE true ",
    "ON CONFLICT (biz_type, idem_key) DO NOTHING RETURNING idem_key"
);
/// ?1 biz, ?2 ttl ms, ?3 now ms, ?4 the marks as a JSON array of `[key, fence, result in hex,
/// result ttl ms or null]`: a batch of marks in one statement, each as `COMPLETE` marks one under
/// its own fence, returning the keys it marked. The marks are materialized once and drive the
/// join, each finding its record through the primary key (without `MATERIALIZED` and the `IN`,
/// SQLite walks every record of the business type for each mark).
const COMPLETE_MANY: &str = concat!(
    "WITH m AS MATERIALIZED (SELECT json_extract(value, '$[0]') AS k, ",
    "json_extract(value, '$[1]') AS f, json_extract(value, '$[2]') AS r, ",
    "json_extract(value, '$[3]') AS rt FROM json_each(?4)) ",
    "UPDATE {t} SET result = CASE WHEN status = 'PROCESSING' THEN unhex(m.r) ELSE result END, ",
    "expire_at = CASE WHEN status = 'PROCESSING' THEN max(expire_at, ?3 + ?2) ELSE expire_at END, ",
    "result_until = CASE WHEN status = 'PROCESSING' THEN ?3 + m.rt ELSE result_until END, ",
    "status = 'SUCCEEDED', updated_at = ?3 FROM m ",
    "WHERE biz_type = ?1 AND idem_key IN (SELECT k FROM m) AND idem_key = m.k AND fence = m.f ",
    "AND status IN ('PROCESSING', 'SUCCEEDED') RETURNING idem_key"
);
/// ?1 biz, ?2 the keys as a JSON array, ?3 now ms: a batch claim's plain read of many keys.
const READ_MANY: &str = concat!(
    "SELECT idem_key, ",
    record_columns!(),
    "?3 AS now_ms FROM {t} WHERE biz_type = ?1 AND idem_key IN (SELECT value FROM json_each(?2))"
);
/// ?1–?7 as for `insert_new`, then ?8 reset, ?9 seen fence, ?10 seen status, ?11 seen lease
/// end, ?12 keep the saved steps (`result` of an unfinished record). The new fence is one more
/// than the last, or the clock when that is later.
const TAKE: &str = concat!(
    "UPDATE {t} SET status = 'PROCESSING', ",
    "attempt = CASE WHEN ?8 THEN 1 ELSE attempt + 1 END, ",
    "fence = max(fence + 1, ?7), fingerprint = ?3, result = CASE WHEN ?12 THEN result END, ",
    "result_until = NULL, ",
    "lease_until = ?6 + ?4, updated_at = ?6, ",
    "created_at = CASE WHEN ?8 THEN ?6 ELSE created_at END, ",
    "expire_at = CASE WHEN ?8 THEN ?6 + ?5 ELSE max(expire_at, ?6 + ?4) END ",
    "WHERE biz_type = ?1 AND idem_key = ?2 AND fence = ?9 AND status = ?10 AND lease_until = ?11 ",
    "RETURNING attempt, fence"
);
/// ?1 biz, ?2 key, ?3 fence, ?4 result, ?5 ttl ms, ?6 now ms, ?7 result ttl ms (NULL: the result
/// is kept as long as the record). The mark moves the expiry to at least now + ttl, so a body
/// slower than its ttl still leaves a live success. A record already SUCCEEDED under the fence
/// counts as held and keeps its result and expiry: a mark sent again after a lost reply succeeds
/// (and FAILED likewise for `FAIL`).
const COMPLETE: &str = concat!(
    "UPDATE {t} SET result = CASE WHEN status = 'PROCESSING' THEN ?4 ELSE result END, ",
    "expire_at = CASE WHEN status = 'PROCESSING' THEN max(expire_at, ?6 + ?5) ELSE expire_at END, ",
    "result_until = CASE WHEN status = 'PROCESSING' THEN ?6 + ?7 ELSE result_until END, ",
    "status = 'SUCCEEDED', updated_at = ?6 ",
    "WHERE biz_type = ?1 AND idem_key = ?2 AND fence = ?3 AND status IN ('PROCESSING', 'SUCCEEDED')"
);
/// Sent right after `COMPLETE` in a transaction's last round trip, ahead of its `COMMIT`: fails
/// (the record's `NOT NULL` columns refuse the row it would insert) unless the mark changed the
/// record, so the statements after it, the `COMMIT` among them, do not run.
const COMPLETE_GUARD: &str = "INSERT INTO {t} (biz_type) SELECT NULL WHERE changes() <> 1";
/// ?1 biz, ?2 key, ?3 fence, ?4 now ms. The saved steps (in `result`) stay for a retry.
const FAIL: &str = "UPDATE {t} SET status = 'FAILED', updated_at = ?4 \
    WHERE biz_type = ?1 AND idem_key = ?2 AND fence = ?3 AND status IN ('PROCESSING', 'FAILED')";
/// ?1 biz, ?2 key, ?3 fence, ?4 steps, ?5 now ms. The steps of an unfinished record live in
/// `result` until a success replaces them.
const SAVE_STEPS: &str = "UPDATE {t} SET result = ?4, updated_at = ?5 \
    WHERE biz_type = ?1 AND idem_key = ?2 AND fence = ?3 AND status = 'PROCESSING'";
/// ?1 biz, ?2 key, ?3 fence, ?4 lease ms, ?5 now ms.
const RENEW: &str = "UPDATE {t} SET lease_until = ?5 + ?4, expire_at = max(expire_at, ?5 + ?4), \
    updated_at = ?5 WHERE biz_type = ?1 AND idem_key = ?2 AND fence = ?3 AND status = 'PROCESSING'";
/// ?1 biz, ?2 key, ?3 now ms: the claim's plain read (`store/order.rs`).
const READ: &str = concat!(
    "SELECT ",
    record_columns!(),
    "?3 AS now_ms FROM {t} WHERE biz_type = ?1 AND idem_key = ?2"
);
const LOAD: &str = concat!(
    "SELECT ",
    record_columns!(),
    "0 AS now_ms FROM {t} WHERE biz_type = ?1 AND idem_key = ?2"
);
/// ?1 biz, ?2 now ms, ?3 batch. PROCESSING with the lease ended, oldest lease first: a range of
/// the index `<table>_processing (biz_type, lease_until) WHERE status = 'PROCESSING'`, read in its
/// order (no sort), that stops after the batch. The `status` term is written as a literal: it
/// is what lets SQLite use the partial index.
const STUCK: &str = "SELECT idem_key, status, attempt, fence, fingerprint, result, lease_until, \
    expire_at, result_until FROM {t} WHERE biz_type = ?1 AND status = 'PROCESSING' AND lease_until <= ?2 \
    ORDER BY lease_until LIMIT ?3";
/// The business types with PROCESSING records: the partial index `<table>_processing`, which holds
/// only them (the `status` term a literal, as in `STUCK`), not the table.
const PROCESSING_BIZ: &str = "SELECT DISTINCT biz_type FROM {t} WHERE status = 'PROCESSING'";
/// ?1 now ms. Records per business type and status (expired ones not yet swept included), and
/// the tombstones among them (`gone`: their result ttl passed): a scan of the table (an
/// operator's query; no index is kept for it).
/// `origin`: what an HTTP layer record's fingerprint keeps before its digest (its method and route):
/// the digest is hex after the last space, so trimming hex digits, then the space, leaves it.
const STATS: &str = "SELECT biz_type, \
    CASE WHEN instr(fingerprint, ' ') > 0 THEN rtrim(rtrim(fingerprint, '0123456789abcdef'), ' ') END AS origin, \
    status, COUNT(*) AS n, \
    COUNT(CASE WHEN result_until <= ?1 THEN 1 END) AS gone FROM {t} GROUP BY biz_type, origin, status";
/// ?1 batch. The first page of a walk of every record's key: the primary key read in its order
/// (the table is the primary key's b-tree, `WITHOUT ROWID`).
const KEYS_FIRST: &str = "SELECT biz_type, idem_key FROM {t} ORDER BY biz_type, idem_key LIMIT ?1";
/// ?1 biz, ?2 key, ?3 batch. A later page: the range of the primary key after the last pair of the
/// page before. Written as a row value, which SQLite reads as one range of the key (the same
/// test as `biz_type > ?1 OR (biz_type = ?1 AND idem_key > ?2)`, which it would read as a range
/// of `biz_type` alone, every key of the last business type read again and skipped).
const KEYS_AFTER: &str = "SELECT biz_type, idem_key FROM {t} \
    WHERE (biz_type, idem_key) > (?1, ?2) ORDER BY biz_type, idem_key LIMIT ?3";
/// ?1 batch, ?2 now ms. Expired: the TTL passed and no lease is live.
const SWEEP: &str = "DELETE FROM {t} WHERE (biz_type, idem_key) IN (\
    SELECT biz_type, idem_key FROM {t} \
    WHERE expire_at <= ?2 AND NOT (status = 'PROCESSING' AND lease_until > ?2) LIMIT ?1)";

/// ?1 batch, ?2 now ms. Results past their result ttl: dropped, the records kept as tombstones
/// (`result_until` 0, out of the range looked in): a range of the partial index
/// `<table>_result_until (result_until) WHERE result_until > 0`, the results still to drop.
const SHRINK: &str = "UPDATE {t} SET result = NULL, result_until = 0 WHERE (biz_type, idem_key) IN (\
    SELECT biz_type, idem_key FROM {t} \
    WHERE result_until > 0 AND result_until <= ?2 AND status = 'SUCCEEDED' LIMIT ?1)";

/// The statements for one records table, built once per store from the templates above with
/// the table's quoted name in place of `{t}` (each is prepared once per connection and cached by
/// sqlx, so a name in their text costs nothing per call).
#[derive(Debug)]
pub(super) struct Statements {
    pub(super) claim: Arc<str>,
    pub(super) insert_new: Arc<str>,
    pub(super) take: Arc<str>,
    pub(super) insert_many: Arc<str>,
    pub(super) read_many: Arc<str>,
    pub(super) complete_many: Arc<str>,
    /// What the record layer sends (`sql/records.rs`), placeholders numbered as it expects.
    pub(super) records: RecordStatements,
}

impl Statements {
    pub(super) fn new(table: &TableName) -> Self {
        let t = table.quoted(Dialect::SQLite);
        let text = |template: &str| template.replace("{t}", &t);
        let named = |template: &str| -> Arc<str> { text(template).into() };
        Statements {
            claim: named(CLAIM),
            insert_new: named(INSERT_NEW),
            take: named(TAKE),
            insert_many: named(INSERT_MANY),
            read_many: named(READ_MANY),
            complete_many: named(COMPLETE_MANY),
            records: RecordStatements {
                complete: Stmt::new(text(COMPLETE), numbered::COMPLETE),
                complete_commit: Some(Stmt::new(
                    text(&[COMPLETE, COMPLETE_GUARD, "COMMIT"].join("; ")),
                    numbered::COMPLETE,
                )),
                fail: Stmt::new(text(FAIL), numbered::FAIL),
                save_steps: Stmt::new(text(SAVE_STEPS), numbered::SAVE_STEPS),
                renew: Stmt::new(text(RENEW), numbered::RENEW),
                read: Stmt::new(text(READ), numbered::READ),
                load: Stmt::new(text(LOAD), numbered::LOAD),
                stuck: Stmt::new(text(STUCK), numbered::STUCK),
                processing_biz: Stmt::new(text(PROCESSING_BIZ), &[]),
                keys_first: Stmt::new(text(KEYS_FIRST), numbered::KEYS_FIRST),
                keys_after: Stmt::new(text(KEYS_AFTER), numbered::KEYS_AFTER),
                stats: Stmt::new(text(STATS), numbered::STATS),
                sweep: Stmt::new(text(SWEEP), numbered::SWEEP),
                shrink: Stmt::new(text(SHRINK), numbered::SHRINK),
            },
        }
    }
}

/// A statement of the store as a sqlx query.
pub(super) fn query(sql: &Arc<str>) -> sqlx::query::Query<'static, Sqlite, SqliteArguments> {
    sqlx::query(AssertSqlSafe(sql.clone()))
}
