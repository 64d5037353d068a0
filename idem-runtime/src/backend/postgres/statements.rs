//! The Postgres store's statements, built once per table name: each reads the database's clock
//! and binds every value (the module doc of `records.rs`, which sends them, says how).

use std::sync::Arc;

use sqlx::{AssertSqlSafe, SqlSafeStr, SqlStr};

use crate::sql::dialect::Dialect;
use crate::sql::records::{RecordStatements, Stmt, numbered};
use crate::sql::table::TableName;

/// The database clock read once, plus the test clock's offset bound at `off`: `n` in milliseconds,
/// `us` (a fence) in microseconds.
fn clock(off: &str) -> String {
    format!(
        "SELECT FLOOR(EXTRACT(EPOCH FROM k.t) * 1000)::BIGINT + {off} AS n, \
         FLOOR(EXTRACT(EPOCH FROM k.t) * 1000000)::BIGINT + {off} * 1000 AS us \
         FROM (SELECT clock_timestamp() AS t) AS k"
    )
}

/// [`clock`], which also puts in force for the rest of the transaction the idle bound `idle`
/// (`text`, milliseconds; NULL: none, the setting left as it is): transaction mode's claims, so
/// the bound costs no statement of its own. A volatile filter on the clock's one row, so it runs
/// whenever the clock is read; `set_config(…, true)` is `SET LOCAL`, so it is undone with the
/// claim's savepoint when the claim takes nothing.
fn clock_bounding(off: &str, idle: &str) -> String {
    format!(
        "{clock} WHERE CASE WHEN {idle}::text IS NULL THEN TRUE \
         ELSE set_config('idle_in_transaction_session_timeout', {idle}::text, true) IS NOT NULL END",
        clock = clock(off)
    )
}

/// The statements of one store, built once for its table name.
#[derive(Debug)]
pub(super) struct Statements {
    /// The claim as one statement without locks: the read, and the insert when there is none (the
    /// own-statements floor of `benches/postgres.rs`; lease mode sends `insert`, then `read`).
    #[cfg(any(test, feature = "test-util"))]
    pub(super) claim: SqlStr,
    /// Lease mode: the new record alone (`ON CONFLICT DO NOTHING … RETURNING`, no read first).
    pub(super) insert: SqlStr,
    /// Transaction mode while new keys prevail: `insert` under the key's advisory lock, taken only
    /// if no other transaction holds it. No row back: the key exists, or the lock is another
    /// transaction's; `claim_locking` then says which.
    pub(super) insert_locking: SqlStr,
    /// Transaction mode, first: the key's advisory lock if no other transaction holds it (a
    /// claimant's transaction holds it to its end), then the claim with the read locking the row
    /// (`FOR UPDATE`: a current read, never the transaction's old snapshot).
    pub(super) claim_locking: SqlStr,
    /// Transaction mode, once another transaction holds the key's lock: the claim waits for it
    /// (bounded by `lock_timeout`), then claims as `claim_locking` does.
    pub(super) claim_waiting: SqlStr,
    pub(super) take: SqlStr,
    /// A batch claim's insert: a new record for each key that has none, the ones inserted
    /// returned with their fence.
    pub(super) insert_many: SqlStr,
    /// A batch claim's plain read of many keys, each row with its `idem_key`.
    pub(super) read_many: SqlStr,
    /// A batch of marks, each under its own fence, returning the keys marked.
    pub(super) complete_many: SqlStr,
    /// What the record layer sends (`sql/records.rs`), placeholders numbered as it expects.
    pub(super) records: RecordStatements,
}

/// A statement's text, shared by every query made of it.
fn sql(text: String) -> SqlStr {
    AssertSqlSafe(Arc::<str>::from(text)).into_sql_str()
}

/// A transaction-mode claim takes its key's transaction-level advisory lock first: without one
/// (`got` false) another transaction claims the key, and waiting on its row is what the caller's
/// `lock_timeout` must bound. `{key}` is [`advisory_key`].
const TRY_KEY_LOCK: &str = "SELECT pg_try_advisory_xact_lock({key}) AS got";
/// [`TRY_KEY_LOCK`]'s call alone, as a filter.
const TRY_KEY_LOCK_CALL: &str = "pg_try_advisory_xact_lock({key})";
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
const COLUMNS: &str =
    "status, attempt, fence, fingerprint, result, lease_until, expire_at, result_until";

impl Statements {
    pub(super) fn new(table: &TableName) -> Self {
        let t = &table.quoted(Dialect::Postgres);
        Statements {
            #[cfg(any(test, feature = "test-util"))]
            claim: sql(claim(t, table, "", None)),
            insert: sql(insert(t)),
            insert_locking: sql(insert_locking(t, table)),
            claim_locking: sql(claim(t, table, " FOR UPDATE", Some(TRY_KEY_LOCK))),
            claim_waiting: sql(claim(t, table, " FOR UPDATE", Some(WAIT_KEY_LOCK))),
            take: sql(take(t)),
            insert_many: sql(insert_many(t)),
            read_many: sql(read_many(t)),
            complete_many: sql(complete_many(t)),
            records: records(t),
        }
    }
}

/// What the record layer sends (`sql/records.rs`), each with its parameters' order.
fn records(t: &str) -> RecordStatements {
    RecordStatements {
        complete_commit: None,
        complete: Stmt::new(complete(t), numbered::COMPLETE),
        fail: Stmt::new(fail(t), numbered::FAIL),
        save_steps: Stmt::new(save_steps(t), numbered::SAVE_STEPS),
        renew: Stmt::new(renew(t), numbered::RENEW),
        read: Stmt::new(read(t), numbered::READ),
        load: Stmt::new(load(t), numbered::LOAD),
        stuck: Stmt::new(stuck(t), numbered::STUCK),
        // The business types with PROCESSING records: the partial index
        // `<table>_processing`, which holds only them, not the table.
        processing_biz: Stmt::new(
            format!("SELECT DISTINCT biz_type FROM {t} WHERE status = 'PROCESSING'"),
            &[],
        ),
        keys_first: Stmt::new(keys_first(t), numbered::KEYS_FIRST),
        keys_after: Stmt::new(keys_after(t), numbered::KEYS_AFTER),
        stats: Stmt::new(stats(t), numbered::STATS),
        sweep: Stmt::new(sweep(t), numbered::SWEEP),
        shrink: Stmt::new(shrink(t), numbered::SHRINK),
    }
}

/// $1 biz, $2 key, $3 fingerprint, $4 lease ms, $5 ttl ms, $6 clock offset ms. With a
/// `gate` (transaction mode) the statement first takes the key's advisory lock (`g`, read
/// by the others as a one-time filter, so before any row is read or locked); a row with
/// `got` false (every other column NULL) says the lock is another transaction's; and $7 is
/// the idle bound the claim puts in force (see `clock_bounding`).
fn claim(t: &str, table: &TableName, lock: &str, gate: Option<&str>) -> String {
    let (g, only, got, not_got) = match gate {
        None => (String::new(), "", "", String::new()),
        Some(gate) => (
            format!(
                "g AS MATERIALIZED ({gate}), ",
                gate = gate.replace("{key}", &advisory_key(table))
            ),
            "(SELECT got FROM g) AND ",
            ", TRUE AS got",
            " UNION ALL SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, FALSE, FALSE \
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
         old.lease_until, old.expire_at, old.result_until, c.n AS now_ms, \
         FALSE AS inserted{got} FROM old, c \
         UNION ALL \
         SELECT ins.status, ins.attempt, ins.fence, ins.fingerprint, ins.result, \
         ins.lease_until, ins.expire_at, ins.result_until, ins.created_at AS now_ms, \
         TRUE AS inserted{got} \
         FROM ins{not_got}",
        clock = match gate {
            None => clock("$6"),
            Some(_) => clock_bounding("$6", "$7"),
        },
    )
}

/// $1 biz, $2 key, $3 fingerprint, $4 lease ms, $5 ttl ms, $6 clock offset ms: a new
/// record or nothing.
fn insert(t: &str) -> String {
    format!(
        "INSERT INTO {t} (biz_type, idem_key, status, attempt, fence, fingerprint, result, \
         lease_until, created_at, updated_at, expire_at) \
         SELECT $1, $2, 'PROCESSING', 1, c.us, $3, NULL, c.n + $4, c.n, c.n, c.n + $5 \
         FROM ({clock}) AS c ON CONFLICT (biz_type, idem_key) DO NOTHING \
         RETURNING attempt, fence",
        clock = clock("$6"),
    )
}

/// The same under the key's advisory lock, tried before the row is: a row kept by the
/// filter is one whose lock this transaction holds, so the insert never waits for another
/// claimant's transaction (that is what `claim_waiting` bounds). $7: the idle bound, as the
/// claims' (`clock_bounding`).
fn insert_locking(t: &str, table: &TableName) -> String {
    format!(
        "INSERT INTO {t} (biz_type, idem_key, status, attempt, fence, fingerprint, result, \
         lease_until, created_at, updated_at, expire_at) \
         SELECT $1, $2, 'PROCESSING', 1, c.us, $3, NULL, c.n + $4, c.n, c.n, c.n + $5 \
         FROM ({clock}) AS c WHERE {lock} \
         ON CONFLICT (biz_type, idem_key) DO NOTHING \
         RETURNING attempt, fence",
        clock = clock_bounding("$6", "$7"),
        lock = TRY_KEY_LOCK_CALL.replace("{key}", &advisory_key(table)),
    )
}

/// $1 biz, $2 keys, $3 their fingerprints (NULL: none), $4 lease ms, $5 ttl ms, $6 clock
/// offset ms: the new records, one statement for the batch (the clock read once).
fn insert_many(t: &str) -> String {
    format!(
        "INSERT INTO {t} (biz_type, idem_key, status, attempt, fence, fingerprint, result, \
         lease_until, created_at, updated_at, expire_at) \
         SELECT $1, u.k, 'PROCESSING', 1, c.us, u.f, NULL, c.n + $4, c.n, c.n, c.n + $5 \
         FROM UNNEST($2::text[], $3::text[]) AS u(k, f), ({clock}) AS c \
         ON CONFLICT (biz_type, idem_key) DO NOTHING \
         RETURNING idem_key, attempt, fence",
        clock = clock("$6"),
    )
}

/// $1 biz, $2 keys, $3 fences, $4 results, $5 result ttls ms (NULL: kept as long as the
/// record), $6 ttl ms, $7 offset: a batch of marks, each as `complete` marks one under its
/// own fence, returning the keys it marked.
fn complete_many(t: &str) -> String {
    format!(
        "WITH c AS ({clock}) \
         UPDATE {t} AS x SET result = CASE WHEN x.status = 'PROCESSING' THEN m.r ELSE x.result END, \
         expire_at = CASE WHEN x.status = 'PROCESSING' \
         THEN GREATEST(x.expire_at, c.n + $6) ELSE x.expire_at END, \
         result_until = CASE WHEN x.status = 'PROCESSING' THEN c.n + m.rt ELSE x.result_until END, \
         status = 'SUCCEEDED', updated_at = c.n \
         FROM c, UNNEST($2::text[], $3::bigint[], $4::bytea[], $5::bigint[]) AS m(k, f, r, rt) \
         WHERE x.biz_type = $1 AND x.idem_key = m.k AND x.fence = m.f \
         AND x.status IN ('PROCESSING', 'SUCCEEDED') \
         RETURNING x.idem_key",
        clock = clock("$7"),
    )
}

/// $1 biz, $2 keys, $3 offset.
fn read_many(t: &str) -> String {
    format!(
        "SELECT idem_key, {COLUMNS}, c.n AS now_ms FROM {t}, ({clock}) AS c \
         WHERE biz_type = $1 AND idem_key = ANY($2::text[])",
        clock = clock("$3"),
    )
}

/// $1 biz, $2 key, $3 fingerprint, $4 lease ms, $5 ttl ms, $6 offset, $7 reset,
/// $8 seen fence, $9 seen status, $10 seen lease end, $11 keep the saved steps (`result`
/// of an unfinished record).
fn take(t: &str) -> String {
    format!(
        "WITH c AS ({clock}) \
         UPDATE {t} AS r SET status = 'PROCESSING', \
         attempt = CASE WHEN $7 THEN 1 ELSE r.attempt + 1 END, \
         fence = GREATEST(r.fence + 1, c.us), fingerprint = $3, \
         result = CASE WHEN $11 THEN r.result END, result_until = NULL, \
         lease_until = c.n + $4, updated_at = c.n, \
         created_at = CASE WHEN $7 THEN c.n ELSE r.created_at END, \
         expire_at = CASE WHEN $7 THEN c.n + $5 ELSE GREATEST(r.expire_at, c.n + $4) END \
         FROM c WHERE r.biz_type = $1 AND r.idem_key = $2 AND r.fence = $8 AND r.status = $9 \
         AND r.lease_until = $10 \
         RETURNING r.attempt, r.fence",
        clock = clock("$6"),
    )
}

/// $1 biz, $2 key, $3 fence, $4 result, $5 ttl ms, $6 offset, $7 result ttl ms (NULL: the
/// result is kept as long as the record). The mark moves the expiry to at least now + ttl,
/// so a body slower than its ttl still leaves a live success. A record already SUCCEEDED
/// under the fence counts as held and keeps its result and expiry: a mark sent again after
/// a lost reply succeeds (FAILED likewise).
fn complete(t: &str) -> String {
    format!(
        "WITH c AS ({clock}) \
         UPDATE {t} AS r SET result = CASE WHEN r.status = 'PROCESSING' THEN $4 ELSE r.result END, \
         expire_at = CASE WHEN r.status = 'PROCESSING' \
         THEN GREATEST(r.expire_at, c.n + $5) ELSE r.expire_at END, \
         result_until = CASE WHEN r.status = 'PROCESSING' THEN c.n + $7::BIGINT \
         ELSE r.result_until END, \
         status = 'SUCCEEDED', updated_at = c.n FROM c \
         WHERE r.biz_type = $1 AND r.idem_key = $2 AND r.fence = $3 \
         AND r.status IN ('PROCESSING', 'SUCCEEDED')",
        clock = clock("$6"),
    )
}

/// $1 biz, $2 key, $3 fence, $4 offset. The saved steps (in `result`) stay for a retry.
fn fail(t: &str) -> String {
    format!(
        "WITH c AS ({clock}) \
         UPDATE {t} AS r SET status = 'FAILED', updated_at = c.n FROM c \
         WHERE r.biz_type = $1 AND r.idem_key = $2 AND r.fence = $3 \
         AND r.status IN ('PROCESSING', 'FAILED')",
        clock = clock("$4"),
    )
}

/// $1 biz, $2 key, $3 fence, $4 steps, $5 offset. The steps of an unfinished record live in
/// `result` until a success replaces them.
fn save_steps(t: &str) -> String {
    format!(
        "WITH c AS ({clock}) \
         UPDATE {t} AS r SET result = $4, updated_at = c.n FROM c \
         WHERE r.biz_type = $1 AND r.idem_key = $2 AND r.fence = $3 \
         AND r.status = 'PROCESSING'",
        clock = clock("$5"),
    )
}

/// $1 biz, $2 key, $3 fence, $4 lease ms, $5 offset.
fn renew(t: &str) -> String {
    format!(
        "WITH c AS ({clock}) \
         UPDATE {t} AS r SET lease_until = c.n + $4, \
         expire_at = GREATEST(r.expire_at, c.n + $4), updated_at = c.n FROM c \
         WHERE r.biz_type = $1 AND r.idem_key = $2 AND r.fence = $3 AND r.status = 'PROCESSING'",
        clock = clock("$5"),
    )
}

fn load(t: &str) -> String {
    format!("SELECT {COLUMNS} FROM {t} WHERE biz_type = $1 AND idem_key = $2")
}

/// $1 biz, $2 key, $3 offset.
fn read(t: &str) -> String {
    format!(
        "SELECT {COLUMNS}, c.n AS now_ms FROM {t}, ({clock}) AS c \
         WHERE biz_type = $1 AND idem_key = $2",
        clock = clock("$3"),
    )
}

/// $1 biz, $2 offset, $3 batch. PROCESSING with the lease ended, oldest lease first: a range
/// of the index `<table>_processing (biz_type, lease_until) WHERE status = 'PROCESSING'`,
/// read in its order (no sort), that stops after the batch. The `status` term is a literal:
/// a parameter could not prove the partial index's predicate. The clock is a scalar subquery, read once before the
/// scan (an InitPlan): `clock_timestamp()` is volatile, so written into the comparison it
/// could not bound the index range, and joined as a CTE the rows would come out of a
/// nested loop in no order and be sorted whole.
fn stuck(t: &str) -> String {
    format!(
        "SELECT idem_key, {COLUMNS} FROM {t} \
         WHERE biz_type = $1 AND status = 'PROCESSING' \
         AND lease_until <= (SELECT c.n FROM ({clock}) AS c) \
         ORDER BY lease_until LIMIT $3",
        clock = clock("$2"),
    )
}

/// $1 batch, $2 offset. Expired: the TTL passed and no lease is live. The batch's rows are
/// locked as they are picked (rows another transaction holds are skipped, never waited
/// for), so the delete removes exactly what was picked, and no statement runs long.
fn sweep(t: &str) -> String {
    format!(
        "WITH c AS ({clock}), \
         doomed AS (SELECT r.biz_type, r.idem_key FROM {t} AS r, c \
         WHERE r.expire_at <= c.n AND NOT (r.status = 'PROCESSING' AND r.lease_until > c.n) \
         LIMIT $1 FOR UPDATE OF r SKIP LOCKED) \
         DELETE FROM {t} AS d USING doomed \
         WHERE d.biz_type = doomed.biz_type AND d.idem_key = doomed.idem_key",
        clock = clock("$2"),
    )
}

/// $1 batch, $2 offset. Results past their result ttl: dropped, the records kept as
/// tombstones (`result_until` 0, out of the range looked in). A range of the partial index
/// `<table>_result_until (result_until) WHERE result_until > 0`, which holds only the
/// results still to drop; rows other transactions hold are skipped.
fn shrink(t: &str) -> String {
    format!(
        "WITH c AS ({clock}), \
         gone AS (SELECT r.biz_type, r.idem_key FROM {t} AS r, c \
         WHERE r.result_until > 0 AND r.result_until <= c.n AND r.status = 'SUCCEEDED' \
         LIMIT $1 FOR UPDATE OF r SKIP LOCKED) \
         UPDATE {t} AS d SET result = NULL, result_until = 0 FROM gone \
         WHERE d.biz_type = gone.biz_type AND d.idem_key = gone.idem_key",
        clock = clock("$2"),
    )
}

/// $1 batch. The first page of a walk of every record's key: the primary key's index read
/// in its order (an index-only scan), stopping after the batch.
fn keys_first(t: &str) -> String {
    format!("SELECT biz_type, idem_key FROM {t} ORDER BY biz_type, idem_key LIMIT $1")
}

/// $1 biz, $2 key, $3 batch. A later page: the range of the primary key after the last
/// pair of the page before, in the database's order of `text` (its collation; `>` and the
/// index agree on it). Written as a row value, which is one index condition; the same test
/// as `biz_type > $1 OR (biz_type = $1 AND idem_key > $2)` would be a filter on a scan
/// from the index's start.
fn keys_after(t: &str) -> String {
    format!(
        "SELECT biz_type, idem_key FROM {t} WHERE (biz_type, idem_key) > ($1, $2) \
         ORDER BY biz_type, idem_key LIMIT $3"
    )
}

/// Records per business type and status (expired ones not yet swept included): a scan of
/// the table (an operator's query; no index is kept for it).
/// $1 offset. `gone`: the tombstones among them, whose result ttl passed.
/// `origin`: what an HTTP layer record's fingerprint keeps before its digest (its method and
/// route), for a count per route.
fn stats(t: &str) -> String {
    format!(
        "SELECT biz_type, substring(fingerprint from '^(.*) [^ ]*$') AS origin, status, \
         COUNT(*) AS n, COUNT(*) FILTER (WHERE result_until <= c.n) AS gone \
         FROM {t}, ({clock}) AS c GROUP BY biz_type, origin, status",
        clock = clock("$1"),
    )
}

impl Statements {
    /// A statement by name, for the benchmark's hand-written floor.
    #[cfg(any(test, feature = "test-util"))]
    pub(super) fn get(&self, name: &str) -> Option<&str> {
        let r = &self.records;
        Some(match name {
            "claim" => self.claim.as_str(),
            "insert" => self.insert.as_str(),
            "insert_locking" => self.insert_locking.as_str(),
            "claim_locking" => self.claim_locking.as_str(),
            "claim_waiting" => self.claim_waiting.as_str(),
            "take" => self.take.as_str(),
            "read" => r.read.as_str(),
            "complete" => r.complete.as_str(),
            "fail" => r.fail.as_str(),
            "save_steps" => r.save_steps.as_str(),
            "renew" => r.renew.as_str(),
            "load" => r.load.as_str(),
            "sweep" => r.sweep.as_str(),
            "shrink" => r.shrink.as_str(),
            "stuck" => r.stuck.as_str(),
            "stats" => r.stats.as_str(),
            "keys_first" => r.keys_first.as_str(),
            "keys_after" => r.keys_after.as_str(),
            _ => return None,
        })
    }
}
