//! What one call costs the server, counted by the server itself, so that a change that adds a
//! statement or a round trip to a call's path fails here. Each figure is the change of a
//! server counter over `CALLS` sequential calls, divided by `CALLS`. The counters are the test's
//! own, so the figures hold whatever else the server serves:
//!
//! - MariaDB (`IDEM_MYSQL_URL`): the statements of a user of the test's own (the store connects
//!   as it), from `information_schema.USER_STATISTICS` (`userstat`, which the test turns on):
//!   SELECT, UPDATE and other commands, what `Questions` counts. Pings (`Com_admin_commands`:
//!   sqlx pings a connection that goes back to its pool) the server counts only globally: they
//!   are judged when no other user ran a statement meanwhile, and said to be unjudged otherwise;
//! - Postgres (`IDEM_PG_URL`): the calls `pg_stat_statements` counts for a role of the test's own
//!   (the store connects as it), by the statement's first word. The extension is loaded only at
//!   the server's start (`shared_preload_libraries`): `.ci/run` sets it and restarts the server;
//!   without it this part prints one skip line (a failure under `IDEM_REQUIRE_SERVICES=1`);
//! - Redis: `EVALSHA` calls (round trips: each step is one script) and `total_commands_processed`
//!   (what the server ran, the scripts' own commands included), from `INFO`, on a server the test
//!   starts for itself (Redis counts commands per server only).
//!
//! The budgets are today's figures: lower them when a change makes a call cheaper.

#[path = "support/redis_server.rs"]
mod redis_server;
#[path = "contract/server.rs"]
mod server;

use std::collections::BTreeMap;

use redis_server::RedisServer;

use idem::{
    Call, IdemError, Store, TransactionalStore,
    store::{BatchClaim, BatchItem, BatchMark, ClaimOutcome, StoreTx},
};

const CALLS: u32 = 50;

/// Batch claims: `BATCHES` batches of `BATCH` keys each, measured per batch.
const BATCH: usize = 25;
const BATCHES: u32 = 20;

/// What a figure of one batch (its claim and its 25 marks) may exceed today's by: half a
/// statement per batch.
const BATCH_SLACK: f64 = 0.5;

/// What a figure may exceed today's by (a statement now and then that a slow machine adds, such
/// as a ping of a connection that idled out): a tenth of a statement per call. A statement more
/// per call is ten times that.
const SLACK: f64 = 0.1;

/// The pings per lease-mode call the MariaDB part allows: none are sent while the store's warm
/// connections are reused; this leaves room for a few that idled out on a slow machine.
const PINGS: f64 = 0.5;

/// MariaDB statements of one transaction-mode call with a body that writes nothing, its BEGIN and
/// COMMIT included, today: the session's settings (lock wait and idle bound: MariaDB has no
/// transaction-local SET, so every transaction the store begins sets them), BEGIN and the claim's
/// SAVEPOINT (one round trip, while new keys prevail), the claim, the mark and COMMIT: 6
/// statements in 4 round trips (the savepoint is released by the commit, or with the next
/// claim's); a replay: the settings, BEGIN, one read, COMMIT (4 statements in 3 round trips).
const TX_FIRST: f64 = 6.0;
const TX_REPLAY: f64 = 4.0;

/// Postgres statements of one transaction-mode call with a body that writes nothing, its BEGIN and
/// COMMIT included, today: BEGIN and the claim's SAVEPOINT (one round trip, while new keys
/// prevail), the claim (which takes the key's advisory lock and sets the transaction's idle
/// bound), the mark, COMMIT: 5 statements in 4 round trips; a replay: BEGIN, one read, COMMIT.
/// (The server counts statements, not round trips: every other statement here is a round trip of
/// its own.)
const PG_TX_FIRST: f64 = 5.0;
const PG_TX_REPLAY: f64 = 3.0;

// A store's claims read first or write first by what its recent claims found (idem's
// `store/order.rs`), and turn within 32 claims: each figure is measured after `CALLS` calls of the
// same kind, so it is the settled cost of that kind.

/// Runs `CALLS` calls on keys `k-0`…: first executions the first time, replays after.
async fn lease_calls(store: &dyn Store, biz: &str) {
    for i in 0..CALLS {
        let key = format!("k-{i}");
        let value: Result<u32, IdemError> = Call::new(biz.to_owned(), &key)
            .run(store, async move { Ok(i) })
            .await;
        assert_eq!(value.unwrap(), i);
    }
}

/// Runs `CALLS` transaction-mode calls on keys `t-0`…, each in a transaction of its own (begin,
/// the call with a body that writes nothing, commit): first executions the first time, replays
/// after.
async fn tx_calls<S>(store: &S, biz: &str)
where
    S: TransactionalStore,
    S::Tx: StoreTx,
{
    for i in 0..CALLS {
        let mut tx = store.begin_tx().await.unwrap();
        let value: Result<u32, IdemError> = Call::new(biz.to_owned(), &format!("t-{i}"))
            .run_in_tx(&mut tx, async |_| Ok(i))
            .await;
        assert_eq!(value.unwrap(), i);
        Box::new(tx).commit().await.unwrap();
    }
}

/// The per-call figures of `calls` on new keys, then on the same keys again: each measured after
/// the same kind of calls on keys of another business type (`COUNT_WARM`), so the store's claim
/// order has settled on that kind (and a pool has its connections).
async fn first_then_replay(
    counters: impl AsyncFn() -> BTreeMap<String, u64>,
    calls: impl AsyncFn(&'static str),
    probe: &BTreeMap<String, u64>,
) -> (BTreeMap<String, f64>, BTreeMap<String, f64>) {
    let mut figures = Vec::new();
    for _ in 0..2 {
        calls("COUNT_WARM").await;
        let before = counters().await;
        calls("COUNT").await;
        figures.push(per_call(&before, &counters().await, probe));
    }
    let replayed = figures.pop().expect("two figures");
    (figures.pop().expect("two figures"), replayed)
}

/// Claims `BATCHES` batches of `BATCH` keys `b-<n>-<i>` with `Store::claim_batch`, and marks the
/// claims acquired with one `Store::complete_batch`: new keys the first time, replays after.
async fn batch_claims(store: &dyn Store, biz: &str) {
    for b in 0..BATCHES {
        let keys: Vec<String> = (0..BATCH).map(|i| format!("b-{b}-{i}")).collect();
        let items: Vec<BatchItem<'_>> = keys
            .iter()
            .map(|key| BatchItem {
                key,
                fingerprint: None,
            })
            .collect();
        let batch = BatchClaim {
            biz,
            items: &items,
            lease: std::time::Duration::from_secs(30),
            ttl: std::time::Duration::from_secs(3600),
        };
        let mut marks = Vec::new();
        for (key, outcome) in keys.iter().zip(store.claim_batch(&batch).await.unwrap()) {
            match outcome {
                ClaimOutcome::Acquired { claim, .. } => marks.push(BatchMark {
                    key,
                    claim,
                    snapshot: b"1",
                    result_ttl: None,
                }),
                ClaimOutcome::Replay { snapshot } => assert_eq!(snapshot, b"1"),
                other => panic!("{key}: {other:?}"),
            }
        }
        if !marks.is_empty() {
            let landed = store.complete_batch(biz, &marks, batch.ttl).await.unwrap();
            assert!(landed.iter().all(Result::is_ok), "{landed:?}");
        }
    }
}

/// The per-batch figures of [`batch_claims`] on new keys, then on the same keys again, each after
/// the same kind on another business type (so the claim order settled).
async fn batch_figures(
    counters: impl AsyncFn() -> BTreeMap<String, u64>,
    store: &dyn Store,
    probe: &BTreeMap<String, u64>,
) -> (BTreeMap<String, f64>, BTreeMap<String, f64>) {
    let mut figures = Vec::new();
    for _ in 0..2 {
        batch_claims(store, "BATCH_WARM").await;
        let before = counters().await;
        batch_claims(store, "BATCH").await;
        let after = counters().await;
        figures.push(
            per_call(&before, &after, probe)
                .into_iter()
                .map(|(name, per_call)| (name, per_call * f64::from(CALLS) / f64::from(BATCHES)))
                .collect(),
        );
    }
    let replayed = figures.pop().expect("two figures");
    (figures.pop().expect("two figures"), replayed)
}

/// The statements `user` ran (`Questions`, for that user), the statements every other user ran
/// (`others`, this reading's own included: the probe's cost is taken off each figure), and the
/// server's pings (`Com_admin_commands`, global).
async fn mysql_counters(pool: &idem::sqlx::MySqlPool, user: &str) -> BTreeMap<String, u64> {
    let (ours, others): (i64, i64) = idem::sqlx::query_as(
        "SELECT CAST(COALESCE(SUM(IF(USER = ?, SELECT_COMMANDS + UPDATE_COMMANDS + OTHER_COMMANDS, \
         0)), 0) AS SIGNED), CAST(COALESCE(SUM(IF(USER = ?, 0, SELECT_COMMANDS + UPDATE_COMMANDS + \
         OTHER_COMMANDS)), 0) AS SIGNED) FROM information_schema.USER_STATISTICS",
    )
    .bind(user)
    .bind(user)
    .fetch_one(pool)
    .await
    .unwrap();
    let (_, pings): (String, String) =
        idem::sqlx::query_as("SHOW GLOBAL STATUS WHERE Variable_name = 'Com_admin_commands'")
            .fetch_one(pool)
            .await
            .unwrap();
    BTreeMap::from([
        ("Questions".to_owned(), u64::try_from(ours).unwrap()),
        ("others".to_owned(), u64::try_from(others).unwrap()),
        ("Com_admin_commands".to_owned(), pings.parse().unwrap()),
    ])
}

/// `url` with `user` (and no password) in place of its own user.
fn with_user(url: &str, user: &str) -> String {
    let (scheme, rest) = url.split_once("://").expect("a URL");
    let host = rest.rsplit_once('@').map_or(rest, |(_, host)| host);
    format!("{scheme}://{user}@{host}")
}

/// Whether `figure`'s pings can be judged: no other user ran a statement while it was taken.
fn pings_judged(what: &str, figure: &BTreeMap<String, f64>) -> bool {
    let quiet = figure["others"] == 0.0;
    if !quiet {
        eprintln!("{what}: another client used the server meanwhile, so its pings are not judged");
    }
    quiet
}

/// Per-call deltas of `after - before`, less what reading the counters itself cost (`probe`).
fn per_call(
    before: &BTreeMap<String, u64>,
    after: &BTreeMap<String, u64>,
    probe: &BTreeMap<String, u64>,
) -> BTreeMap<String, f64> {
    after
        .iter()
        .map(|(name, value)| {
            let spent = value - before.get(name).copied().unwrap_or(0);
            let probe = probe.get(name).copied().unwrap_or(0);
            (
                name.clone(),
                spent.saturating_sub(probe) as f64 / f64::from(CALLS),
            )
        })
        .collect()
}

async fn mariadb() {
    let url = server::mysql_url();
    let Some(admin) = server::reach(
        "MariaDB",
        &url,
        idem::sqlx::mysql::MySqlPoolOptions::new()
            .max_connections(1)
            .connect(&url),
    )
    .await
    else {
        return;
    };
    // A user of this test's own, whose statements the server counts apart from everyone else's.
    let user = server::unique("idem_counts");
    let userstat: i64 = idem::sqlx::query_scalar("SELECT CAST(@@userstat AS SIGNED)")
        .fetch_one(&admin)
        .await
        .unwrap();
    for sql in [
        format!("CREATE USER '{user}'@'%'"),
        format!("GRANT ALL ON *.* TO '{user}'@'%'"),
        "SET GLOBAL userstat = 1".to_owned(),
    ] {
        idem::sqlx::query(idem::sqlx::AssertSqlSafe(sql))
            .execute(&admin)
            .await
            .unwrap();
    }
    let as_user = with_user(&url, &user);
    // Two connections, both opened before anything is measured (a pool that opened one
    // mid-measure would count its session setup): the store keeps one warm for its own statements
    // (half the pool), transactions take the other.
    let store = idem::MySqlStore::connect_with(&as_user, 2, std::time::Duration::from_secs(2))
        .await
        .unwrap();
    let table = server::unique("idemt_counts");
    let store = store.with_table(&table).unwrap();
    store.migrate().await.unwrap();
    let probe_pool = admin.clone();
    // What one reading of the counters costs, measured the same way.
    let a = mysql_counters(&probe_pool, &user).await;
    let b = mysql_counters(&probe_pool, &user).await;
    let probe: BTreeMap<_, _> = b.iter().map(|(k, v)| (k.clone(), v - a[k])).collect();

    let counters = async || mysql_counters(&probe_pool, &user).await;
    let (first, replayed) = first_then_replay(
        &counters,
        async |biz| lease_calls(&store, biz).await,
        &probe,
    )
    .await;
    eprintln!("MariaDB per lease-mode call: first {first:?}, replay {replayed:?}");
    // Today: a first execution is the claim and the mark (2 statements), a replay one read of the
    // result. No pings: each statement takes the connection the last one kept warm (sqlx pinged
    // every connection it took back, an admin command per statement, until the store kept them).
    // A warm connection that idles 100 ms goes back to the pool, pinged: a few calls in 50 may
    // meet a machine that slow, a ping per statement would be 1.0 or 2.0.
    assert!(
        first["Questions"] <= 2.0 + SLACK,
        "first execution: {first:?}"
    );
    assert!(
        !pings_judged("first execution", &first) || first["Com_admin_commands"] <= PINGS,
        "first execution: {first:?}"
    );
    assert!(replayed["Questions"] <= 1.0 + SLACK, "replay: {replayed:?}");
    assert!(
        !pings_judged("replay", &replayed) || replayed["Com_admin_commands"] <= PINGS,
        "replay: {replayed:?}"
    );

    // A batch of new keys: one multi-row insert, then its marks (one statement each, sent in one
    // round trip); a batch of repeats: one read of every key.
    let (batch_first, batch_replayed) = batch_figures(&counters, &store, &probe).await;
    eprintln!(
        "MariaDB per batch claim of {BATCH} keys: first {batch_first:?}, replay {batch_replayed:?}"
    );
    assert!(
        batch_first["Questions"] <= 1.0 + BATCH as f64 + BATCH_SLACK,
        "first batch: {batch_first:?}"
    );
    assert!(
        batch_replayed["Questions"] <= 1.0 + BATCH_SLACK,
        "replayed batch: {batch_replayed:?}"
    );

    let (tx_first, tx_replayed) =
        first_then_replay(&counters, async |biz| tx_calls(&store, biz).await, &probe).await;
    eprintln!("MariaDB per transaction-mode call: first {tx_first:?}, replay {tx_replayed:?}");
    assert!(
        tx_first["Questions"] <= TX_FIRST + SLACK,
        "tx first execution: {tx_first:?}"
    );
    assert!(
        !pings_judged("tx first execution", &tx_first)
            || tx_first["Com_admin_commands"] <= 1.0 + SLACK,
        "tx first execution: {tx_first:?}"
    );
    assert!(
        tx_replayed["Questions"] <= TX_REPLAY + SLACK,
        "tx replay: {tx_replayed:?}"
    );

    for sql in [
        format!("DROP TABLE {table}"),
        format!("DROP USER '{user}'@'%'"),
        format!("SET GLOBAL userstat = {userstat}"),
    ] {
        idem::sqlx::query(idem::sqlx::AssertSqlSafe(sql))
            .execute(&probe_pool)
            .await
            .unwrap();
    }
}

/// Calls per statement kind (its first word: `INSERT`, `SAVEPOINT`, …) and in all (`total`), as
/// `pg_stat_statements` counts them in the current database.
async fn pg_counters(pool: &idem::sqlx::PgPool, role: &str) -> BTreeMap<String, u64> {
    let rows: Vec<(String, i64)> = idem::sqlx::query_as(
        "SELECT upper(split_part(ltrim(query), ' ', 1)), sum(calls)::bigint FROM pg_stat_statements \
         WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) \
         AND userid = (SELECT oid FROM pg_roles WHERE rolname = $1) GROUP BY 1",
    )
    .bind(role)
    .fetch_all(pool)
    .await
    .unwrap();
    let mut counters: BTreeMap<String, u64> = rows
        .into_iter()
        .map(|(kind, calls)| (kind, u64::try_from(calls).unwrap()))
        .collect();
    counters.insert("total".to_owned(), counters.values().sum());
    counters
}

/// Entries `pg_stat_statements` evicted to make room (a count that lost calls).
async fn pg_evicted(pool: &idem::sqlx::PgPool) -> i64 {
    idem::sqlx::query_scalar("SELECT dealloc FROM pg_stat_statements_info")
        .fetch_one(pool)
        .await
        .unwrap()
}

async fn postgres() {
    let url = server::pg_url();
    let Some(probe_pool) = server::reach(
        "Postgres",
        &url,
        idem::sqlx::postgres::PgPoolOptions::new()
            .max_connections(1)
            .connect(&url),
    )
    .await
    else {
        return;
    };
    let preload: String = idem::sqlx::query_scalar("SHOW shared_preload_libraries")
        .fetch_one(&probe_pool)
        .await
        .unwrap();
    if !preload.contains("pg_stat_statements") {
        let why = format!(
            "Postgres at {url} does not load pg_stat_statements (shared_preload_libraries = \
             '{preload}'): ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements' and \
             restart it, as .ci/run does"
        );
        assert!(!server::required(), "{why}, and IDEM_REQUIRE_SERVICES=1");
        eprintln!("skipped: {why}");
        return;
    }
    idem::sqlx::query("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        .execute(&probe_pool)
        .await
        .unwrap();
    // A role of this test's own, whose statements the server counts apart from everyone else's.
    let role = server::unique("idem_counts");
    for sql in [
        format!("CREATE ROLE {role} LOGIN"),
        format!("GRANT ALL ON SCHEMA public TO {role}"),
    ] {
        idem::sqlx::query(idem::sqlx::AssertSqlSafe(sql))
            .execute(&probe_pool)
            .await
            .unwrap();
    }
    // Two connections, as for MariaDB.
    let store = idem::PgStore::builder()
        .max_connections(2)
        .connect(&with_user(&url, &role))
        .await
        .unwrap();
    let table = server::unique("idemt_counts");
    let store = store.with_table(&table).unwrap();
    store.migrate().await.unwrap();
    // Every savepoint has a name of its own, so each is an entry: start from an empty view, so none
    // is evicted while the figures are taken (checked below).
    idem::sqlx::query(
        "SELECT pg_stat_statements_reset((SELECT oid FROM pg_roles WHERE rolname = $1))",
    )
    .bind(&role)
    .execute(&probe_pool)
    .await
    .unwrap();
    let evicted = pg_evicted(&probe_pool).await;
    let a = pg_counters(&probe_pool, &role).await;
    let b = pg_counters(&probe_pool, &role).await;
    let probe: BTreeMap<_, _> = b
        .iter()
        .map(|(k, v)| (k.clone(), v - a.get(k).copied().unwrap_or(0)))
        .collect();

    let counters = async || pg_counters(&probe_pool, &role).await;
    let (first, replayed) = first_then_replay(
        &counters,
        async |biz| lease_calls(&store, biz).await,
        &probe,
    )
    .await;
    eprintln!("Postgres per lease-mode call: first {first:?}, replay {replayed:?}");
    // Today: a first execution is the claim (an insert while new keys prevail) and the mark; a
    // replay one read of the result.
    assert!(first["total"] <= 2.0 + SLACK, "first execution: {first:?}");
    assert!(replayed["total"] <= 1.0 + SLACK, "replay: {replayed:?}");

    // A batch of new keys: one insert of them all, then one update that marks them all; a batch
    // of repeats: one read of every key.
    let (batch_first, batch_replayed) = batch_figures(&counters, &store, &probe).await;
    eprintln!(
        "Postgres per batch claim of {BATCH} keys: first {batch_first:?}, replay {batch_replayed:?}"
    );
    assert!(
        batch_first["total"] <= 2.0 + BATCH_SLACK,
        "first batch: {batch_first:?}"
    );
    assert!(
        batch_first.get("INSERT").copied().unwrap_or(0.0) <= 1.0 + BATCH_SLACK,
        "first batch: {batch_first:?}"
    );
    assert!(
        batch_replayed["total"] <= 1.0 + BATCH_SLACK,
        "replayed batch: {batch_replayed:?}"
    );

    let (tx_first, tx_replayed) =
        first_then_replay(&counters, async |biz| tx_calls(&store, biz).await, &probe).await;
    eprintln!("Postgres per transaction-mode call: first {tx_first:?}, replay {tx_replayed:?}");
    assert_eq!(
        pg_evicted(&probe_pool).await,
        evicted,
        "pg_stat_statements evicted entries while counting: raise pg_stat_statements.max"
    );
    // The server keeps an entry per savepoint name: 200 calls in turn use one or two names, not
    // one each (which would fill the view and keep it evicting).
    let names: i64 = idem::sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_statements WHERE query LIKE 'SAVEPOINT %' \
         AND dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) \
         AND userid = (SELECT oid FROM pg_roles WHERE rolname = $1)",
    )
    .bind(&role)
    .fetch_one(&probe_pool)
    .await
    .unwrap();
    assert!(names <= 4, "{names} savepoint names for 200 calls in turn");
    assert!(
        tx_first["total"] <= PG_TX_FIRST + SLACK,
        "tx first execution: {tx_first:?}"
    );
    assert!(
        tx_replayed["total"] <= PG_TX_REPLAY + SLACK,
        "tx replay: {tx_replayed:?}"
    );

    drop(store);
    for sql in [
        format!("DROP TABLE {table}"),
        format!("DROP OWNED BY {role}"),
        format!("DROP ROLE {role}"),
    ] {
        idem::sqlx::query(idem::sqlx::AssertSqlSafe(sql))
            .execute(&probe_pool)
            .await
            .unwrap();
    }
}

async fn redis_counters(conn: &mut redis::aio::MultiplexedConnection) -> BTreeMap<String, u64> {
    let info: String = redis::cmd("INFO")
        .arg("all")
        .query_async(conn)
        .await
        .unwrap();
    let mut counters = BTreeMap::new();
    for line in info.lines() {
        if let Some(total) = line.strip_prefix("total_commands_processed:") {
            counters.insert("total".to_owned(), total.trim().parse().unwrap());
        }
        if let Some(rest) = line.strip_prefix("cmdstat_")
            && let Some((name, stats)) = rest.split_once(':')
            && let Some(calls) = stats.split(',').find_map(|f| f.strip_prefix("calls="))
        {
            counters.insert(name.to_owned(), calls.parse().unwrap());
        }
    }
    counters
}

async fn redis() {
    if !redis_server::installed() {
        return;
    }
    let dir = redis_server::scratch_dir("counts");
    let port = redis_server::ports(22_000, 1).next().unwrap();
    let server = RedisServer::start(port, &dir, &["--save", "", "--appendonly", "no"]);
    let url = server.url();
    let store = idem::RedisStore::connect(&url).await.unwrap();
    let prefix = server::unique("idemt_counts");
    let store = store.with_prefix(&prefix).unwrap();
    let client = redis::Client::open(url.as_str()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let a = redis_counters(&mut conn).await;
    let b = redis_counters(&mut conn).await;
    let probe: BTreeMap<_, _> = b
        .iter()
        .map(|(k, v)| (k.clone(), v - a.get(k).copied().unwrap_or(0)))
        .collect();

    let counters = async || redis_counters(&mut conn.clone()).await;
    let (first, replayed) = first_then_replay(
        &counters,
        async |biz| lease_calls(&store, biz).await,
        &probe,
    )
    .await;
    let nonzero = |m: &BTreeMap<String, f64>| -> BTreeMap<String, f64> {
        m.iter()
            .filter(|(_, v)| **v > 0.0)
            .map(|(k, v)| (k.clone(), *v))
            .collect()
    };
    eprintln!(
        "Redis per lease-mode call: first {:?}, replay {:?}",
        nonzero(&first),
        nonzero(&replayed)
    );
    // Today: a first execution is two round trips, one script for the claim and one for the
    // mark, which run 12 commands between them (TIME, HMGET, HSET, PEXPIREAT each, and the
    // reconciler's index: ZADD, then ZREM); a replay is no script, one HGET of the success's
    // digest and result (the key's own expiry says the success is live; with a test clock that
    // moved, an HMGET of the fields and TIME in one round trip). `total_commands_processed`
    // counts the commands a script runs as well as the script.
    assert!(
        first["evalsha"] <= 2.0 + SLACK,
        "first execution: {first:?}"
    );
    assert!(first["total"] <= 12.0 + SLACK, "first execution: {first:?}");
    assert!(
        replayed.get("evalsha").copied().unwrap_or(0.0) < SLACK,
        "replay: {replayed:?}"
    );
    assert!(replayed["total"] <= 1.0 + SLACK, "replay: {replayed:?}");
    assert!(replayed["hget"] >= 1.0 - SLACK, "replay: {replayed:?}");

    // A sweep pass costs what it finds, with the 2 × CALLS records above present: no SCAN, and
    // a few commands (the results index's script: EVALSHA, TIME, ZRANGEBYSCORE; the registry's
    // SMEMBERS; for each of the 2 stuck indexes the stuck script: EVALSHA, TIME, ZRANGEBYSCORE),
    // then 4 more per due result (HMGET, ZREM, HDEL, HSET).
    let sweep = async |due: usize| {
        let before = counters().await;
        let swept = idem::Sweeper::new(store.clone(), 500)
            .sweep_once()
            .await
            .unwrap();
        let after = counters().await;
        let spent = |name: &str| {
            let d = after.get(name).copied().unwrap_or(0) - before.get(name).copied().unwrap_or(0);
            d.saturating_sub(probe.get(name).copied().unwrap_or(0))
        };
        assert_eq!(swept, due as u64, "the due results are dropped");
        (spent("scan"), spent("total"))
    };
    // The counters are the server's: another client's commands during a pass land in them too,
    // so an idle pass is measured up to three times and the least taken.
    let (mut scans, mut idle) = sweep(0).await;
    for _ in 0..2 {
        if scans == 0 && idle <= 11 {
            break;
        }
        let (s, i) = sweep(0).await;
        (scans, idle) = (scans.min(s), idle.min(i));
    }
    eprintln!("Redis sweep pass with nothing due: {idle} commands");
    assert_eq!(scans, 0, "a sweep does not walk the keys");
    assert!(idle <= 11, "a sweep pass with nothing due: {idle} commands");
    const DUE: usize = 20;
    for i in 0..DUE {
        let value: Result<usize, IdemError> = Call::new("COUNT_RESULT", &format!("r-{i}"))
            .result_ttl(std::time::Duration::from_millis(30))
            .run(&store, async move { Ok(i) })
            .await;
        assert_eq!(value.unwrap(), i);
    }
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    let (scans, busy) = sweep(DUE).await;
    eprintln!("Redis sweep pass with {DUE} due results: {busy} commands");
    assert_eq!(scans, 0, "a sweep does not walk the keys");
    assert!(
        busy <= 14 + 4 * DUE as u64,
        "a sweep pass with {DUE} due results: {busy} commands"
    );

    // A batch is one script (its claims: TIME, then HMGET, HSET, PEXPIREAT and the index's ZADD
    // per new key; HMGET per repeat), and its marks one more.
    let (batch_first, batch_replayed) = batch_figures(&counters, &store, &probe).await;
    eprintln!(
        "Redis per batch claim of {BATCH} keys: first {:?}, replay {:?}",
        nonzero(&batch_first),
        nonzero(&batch_replayed)
    );
    assert!(
        batch_first["evalsha"] <= 2.0 + BATCH_SLACK,
        "first batch: {batch_first:?}"
    );
    assert!(
        batch_replayed["evalsha"] <= 1.0 + BATCH_SLACK,
        "replayed batch: {batch_replayed:?}"
    );
    assert!(
        batch_replayed["total"] <= 2.0 + BATCH as f64 + BATCH_SLACK,
        "replayed batch: {batch_replayed:?}"
    );

    server.shutdown_nosave();
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_costs_the_server_no_more_statements_than_today() {
    mariadb().await;
    postgres().await;
    redis().await;
}
