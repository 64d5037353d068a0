//! A store's server crashes while lease-mode calls are finishing their bodies, and is back a few
//! seconds later: every call still ends as if nothing had happened. Its mark waits out the
//! restart, the call returns its own value, the record is SUCCEEDED, a repeat replays it, and no
//! body runs twice. (The mark used to be tried 4 times within ~30 ms; the call
//! then gave up, left the record PROCESSING, and once the lease ended the next call ran the body
//! again.)
//!
//! 64 callers, each with a key of its own, are released together. Each body writes its effect into
//! an independent effects table (an SQLite file, neither the store under test nor idem's counters)
//! and then waits until the test has killed the server, so every mark is sent while the server is
//! down; the server is started again a second later. Then a second round of the same 64 calls must
//! replay, and the effects table must hold exactly one effect per key.
//!
//! Postgres is stopped with `pg_ctlcluster … stop -m immediate` and MariaDB is killed with SIGKILL:
//! the machine's own services, so only under `IDEM_RESTART_SERVICES=1` (set by CI), and started
//! again whatever happens. Their stores' pools wait at most 200 ms for a connection, so each try of
//! a mark fails fast while the server is down (with sqlx's default of 30 s the pool itself redials
//! until the server is back, which hid the defect). Redis is a server the test starts itself (AOF
//! with `appendfsync always`), killed with SIGKILL and started again on the same port and
//! directory; its client redials for several seconds within one try, so there the old code passed
//! too.
//!
//! Not DynamoDB: moto, the server its suite runs on, keeps tables in memory only, so a restarted
//! server has lost the records this test needs kept.

#![cfg(any(feature = "postgres", feature = "mysql", feature = "redis"))]

mod contract;
#[cfg(feature = "mysql")]
#[path = "support/mysql_leftovers.rs"]
mod mysql_leftovers;
#[cfg(feature = "postgres")]
#[path = "support/postgres.rs"]
mod pg;
#[cfg(feature = "redis")]
#[path = "support/redis_server.rs"]
mod redis_server;

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use idem::metrics::Outcome;
use idem::sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePool};
use idem::sqlx::{self, Row};
use idem::{Call, IdemError, Store};
use idem_suite::doc_table::{SharedRows, Table};
use tokio::sync::{Barrier, watch};

#[cfg(feature = "mysql")]
use idem::sqlx::mysql::MySqlPoolOptions;

const CALLERS: usize = 64;
const BIZ: &str = "OUTAGE";
/// Far longer than the outage: a mark that keeps trying while the lease is live waits it out.
const LEASE: Duration = Duration::from_secs(40);
/// How long a mark keeps trying: longer than a restart takes, as the call's docs ask, also on a
/// loaded machine (a Postgres crash recovery has taken 13 s on two busy cores, past the default
/// 10 s).
const STORE_TIMEOUT: Duration = Duration::from_secs(30);
/// How long the server stays down after the kill before it is started again; every body's mark
/// is sent meanwhile.
const DOWN: Duration = Duration::from_secs(1);
/// The longest any one wait of this test may take: the bodies for the crash, the crash for the
/// bodies, a load for the server.
const BOUND: Duration = Duration::from_secs(60);

/// A server the test kills and starts again; both block until done.
trait Server: Send + Sync + 'static {
    /// Kills the server; returns once it is down.
    fn kill(&self);
    /// Starts it again; returns once it answers.
    fn start(&self);
}

async fn effects_pool(dir: &Path) -> SqlitePool {
    let options = SqliteConnectOptions::new()
        .filename(dir.join("effects.db"))
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .busy_timeout(Duration::from_secs(30));
    let pool = SqlitePool::connect_with(options).await.unwrap();
    sqlx::query("CREATE TABLE effects (k TEXT NOT NULL)")
        .execute(&pool)
        .await
        .unwrap();
    pool
}

/// How many effects each key has (keys without any are absent).
async fn effects_per_key(pool: &SqlitePool) -> BTreeMap<String, i64> {
    sqlx::query("SELECT k, COUNT(*) FROM effects GROUP BY k")
        .fetch_all(pool)
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
}

fn key(i: usize) -> String {
    format!("k{i:02}")
}

fn value_of(key: &str) -> String {
    format!("receipt for {key}")
}

/// How one round of calls ended.
#[derive(Default)]
struct Round {
    /// Calls that returned `Ok` with their own key's value.
    own_value: usize,
    /// Calls by outcome.
    outcomes: BTreeMap<String, usize>,
    /// Errors by kind: how many, and one message.
    errors: BTreeMap<String, (usize, String)>,
    took: Duration,
}

impl Round {
    fn outcome(&self, outcome: Outcome) -> usize {
        self.outcomes
            .get(outcome.as_str())
            .copied()
            .unwrap_or_default()
    }
}

impl fmt::Display for Round {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} of {CALLERS} returned their own value in {:.1} s; outcomes {:?}",
            self.own_value,
            self.took.as_secs_f64(),
            self.outcomes
        )?;
        for (kind, (n, example)) in &self.errors {
            write!(f, "\n    {n} × {kind}: {example}")?;
        }
        Ok(())
    }
}

/// Everything the test saw, for the assertions' messages.
struct Summary {
    store: &'static str,
    /// From the kill until the server answered again.
    down: Duration,
    first: Round,
    /// Records after the first round, by status (`absent` for none).
    records: BTreeMap<String, usize>,
    second: Round,
    /// How many keys have 0, 1, 2, … effects.
    runs: BTreeMap<i64, usize>,
}

impl Summary {
    fn records(&self, status: &str) -> usize {
        self.records.get(status).copied().unwrap_or_default()
    }

    fn keys_run(&self, times: i64) -> usize {
        self.runs.get(&times).copied().unwrap_or_default()
    }

    fn keys_run_twice_or_more(&self) -> usize {
        self.runs
            .iter()
            .filter(|(times, _)| **times >= 2)
            .map(|(_, keys)| keys)
            .sum()
    }
}

/// Every server's row, for docs/RELIABILITY.md (`tests/reliability.sh`).
static FIGURES: SharedRows = SharedRows::new();

impl Summary {
    /// This server's row of the table, with the rows of the servers done before it.
    fn emit(&self) {
        let (order, server, how) = match self.store {
            "Postgres" => (
                0,
                "Postgres",
                "`pg_ctlcluster … stop -m immediate`, then start",
            ),
            "MariaDB" => (1, "MariaDB", "SIGKILL, then start"),
            _ => (
                2,
                "Redis (own server, AOF `always`)",
                "SIGKILL, then restart",
            ),
        };
        let records = self
            .records
            .iter()
            .map(|(status, n)| format!("{n} {}", status.to_uppercase()))
            .collect::<Vec<_>>()
            .join(", ");
        Table::new(
            "holder-outage",
            &[
                "server",
                "how it went down",
                "down for",
                "first round",
                "records",
                "second round",
                "keys run twice",
            ],
        )
        .emit_shared(
            &FIGURES,
            &order.to_string(),
            [
                server.to_owned(),
                how.to_owned(),
                format!("{:.1} s", self.down.as_secs_f64()),
                format!(
                    "{} executed in {:.1} s",
                    self.first.outcome(Outcome::Executed),
                    self.first.took.as_secs_f64()
                ),
                records,
                format!("{} replayed", self.second.outcome(Outcome::Replayed)),
                self.keys_run_twice_or_more().to_string(),
            ],
        );
    }
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{}: down {:.1} s (kill to answering again)",
            self.store,
            self.down.as_secs_f64()
        )?;
        writeln!(f, "  first round: {}", self.first)?;
        writeln!(f, "  records after it: {:?}", self.records)?;
        writeln!(f, "  second round: {}", self.second)?;
        write!(
            f,
            "  effects per key: {} keys ran once, {} twice or more, {} never ({:?} keys by runs)",
            self.keys_run(1),
            self.keys_run_twice_or_more(),
            CALLERS - self.runs.values().sum::<usize>(),
            self.runs
        )
    }
}

/// The 64 calls, released together by a barrier. Each body writes its effect, counts itself in
/// `inside` and waits (bounded) until `crashed` says the server was killed.
async fn round(
    store: &Arc<dyn Store>,
    effects: &SqlitePool,
    inside: &Arc<watch::Sender<usize>>,
    crashed: &watch::Receiver<bool>,
) -> Round {
    let barrier = Arc::new(Barrier::new(CALLERS));
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..CALLERS {
        let (store, effects, barrier) = (store.clone(), effects.clone(), barrier.clone());
        let (inside, mut crashed) = (inside.clone(), crashed.clone());
        tasks.spawn(async move {
            let key = key(i);
            barrier.wait().await;
            let body = async {
                sqlx::query("INSERT INTO effects (k) VALUES (?)")
                    .bind(&key)
                    .execute(&effects)
                    .await
                    .map_err(IdemError::store)?;
                inside.send_modify(|n| *n += 1);
                let crash = tokio::time::timeout(BOUND, crashed.wait_for(|c| *c)).await;
                assert!(
                    crash.is_ok_and(|seen| seen.is_ok()),
                    "{key}: the server was not crashed within {BOUND:?} of the body starting"
                );
                Ok::<_, IdemError>(value_of(&key))
            };
            let call = Call::new(BIZ, &key)
                .lease(LEASE)
                .store_timeout(STORE_TIMEOUT);
            let (result, report) = idem::metrics::observe(call.run(&*store, body)).await;
            (key, result, report.map(|r| r.outcome))
        });
    }
    let started = Instant::now();
    let mut round = Round::default();
    for (key, result, outcome) in tasks.join_all().await {
        let outcome = outcome.map_or("no report", Outcome::as_str);
        *round.outcomes.entry(outcome.to_owned()).or_default() += 1;
        match result {
            Ok(value) if value == value_of(&key) => round.own_value += 1,
            Ok(value) => {
                let seen = round.errors.entry("another value".to_owned()).or_default();
                seen.0 += 1;
                seen.1 = format!("{key} got {value:?}");
            }
            Err(e) => {
                let debug = format!("{e:?}");
                let kind = debug
                    .split(|c: char| !c.is_alphanumeric())
                    .next()
                    .unwrap_or_default();
                let seen = round.errors.entry(format!("{outcome}/{kind}")).or_default();
                seen.0 += 1;
                seen.1 = format!("{key}: {e}");
            }
        }
    }
    round.took = started.elapsed();
    round
}

/// Loads a record, trying again (bounded) while the store is unavailable.
async fn status_of(store: &dyn Store, key: &str) -> String {
    let started = Instant::now();
    loop {
        match store.load(BIZ, key).await {
            Ok(Some(record)) => return format!("{:?}", record.status),
            Ok(None) => return "absent".to_owned(),
            Err(e @ (IdemError::StoreUnavailable { .. } | IdemError::StoreBusy { .. }))
                if started.elapsed() < BOUND =>
            {
                eprintln!("loading {key}: {e}; trying again");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("loading {key}: {e}"),
        }
    }
}

/// The scenario of this file on `store`, whose server is `server`; `prepare` runs before each
/// round.
async fn crashed_while_bodies_finish(
    name: &'static str,
    store: Arc<dyn Store>,
    server: Arc<dyn Server>,
    prepare: impl AsyncFn(),
) {
    let dir = tempfile::tempdir().unwrap();
    let effects = effects_pool(dir.path()).await;
    let (inside, mut bodies_inside) = watch::channel(0usize);
    let inside = Arc::new(inside);
    let (crash, crashed) = watch::channel(false);

    // Once all 64 bodies are inside: kill the server, let the bodies finish (their marks meet the
    // dead server), and start it again after DOWN.
    let crasher = {
        let server = server.clone();
        async move {
            let all_in = tokio::time::timeout(BOUND, bodies_inside.wait_for(|n| *n >= CALLERS))
                .await
                .is_ok();
            assert!(
                all_in,
                "{name}: only {} of {CALLERS} bodies were inside after {BOUND:?}",
                *bodies_inside.borrow()
            );
            let killed_at = Instant::now();
            let s = server.clone();
            tokio::task::spawn_blocking(move || s.kill()).await.unwrap();
            eprintln!("{name}: killed with {CALLERS} bodies inside");
            crash.send_replace(true);
            tokio::time::sleep(DOWN).await;
            tokio::task::spawn_blocking(move || server.start())
                .await
                .unwrap();
            let down = killed_at.elapsed();
            eprintln!(
                "{name}: answering again {:.1} s after the kill",
                down.as_secs_f64()
            );
            down
        }
    };
    prepare().await;
    let (first, down) = tokio::time::timeout(3 * BOUND, async {
        tokio::join!(round(&store, &effects, &inside, &crashed), crasher)
    })
    .await
    .unwrap_or_else(|_| panic!("{name}: the first round did not end within {:?}", 3 * BOUND));

    let mut records = BTreeMap::new();
    for i in 0..CALLERS {
        *records
            .entry(status_of(&*store, &key(i)).await)
            .or_default() += 1;
    }

    // The same 64 calls again: every one must replay its record (the body would add an effect).
    prepare().await;
    let second = tokio::time::timeout(2 * BOUND, round(&store, &effects, &inside, &crashed))
        .await
        .unwrap_or_else(|_| {
            panic!(
                "{name}: the second round did not end within {:?}",
                2 * BOUND
            )
        });

    let mut runs = BTreeMap::new();
    for times in effects_per_key(&effects).await.into_values() {
        *runs.entry(times).or_default() += 1;
    }
    let s = Summary {
        store: name,
        down,
        first,
        records,
        second,
        runs,
    };
    eprintln!("{s}");
    s.emit();

    assert_eq!(
        (s.first.own_value, s.first.outcome(Outcome::MarkFailed)),
        (CALLERS, 0),
        "not every call of the first round returned its own value (own value, mark failed):\n{s}"
    );
    assert_eq!(
        s.records("Succeeded"),
        CALLERS,
        "not every record is SUCCEEDED after the first round ({} PROCESSING):\n{s}",
        s.records("Processing")
    );
    assert_eq!(
        (s.second.own_value, s.second.outcome(Outcome::Replayed)),
        (CALLERS, CALLERS),
        "not every call of the second round replayed its own value (own value, replayed):\n{s}"
    );
    assert_eq!(
        (s.keys_run(1), s.keys_run_twice_or_more()),
        (CALLERS, 0),
        "the effects table does not hold exactly one effect per key (keys run once, twice or more):\n{s}"
    );
}

/// How long the SQL stores' pools wait for a connection. The pool redials a refused connection
/// until then, so with sqlx's default (30 s) a mark sent while the server is down waits in the pool
/// and each of its tries outlasts a short outage; 200 ms makes each try fail as fast as a mark on a
/// dead connection does (4 tries end within a second), as a service that sheds load early sets it.
#[cfg(any(feature = "postgres", feature = "mysql"))]
const ACQUIRE: Duration = Duration::from_millis(200);

/// Opens `CALLERS` connections of `pool` (held all at once, then returned to it), so no claim waits
/// for a connection to be opened within the short [`ACQUIRE`]; what timed out is tried again.
#[cfg(any(feature = "postgres", feature = "mysql"))]
async fn warm<DB: sqlx::Database>(pool: &sqlx::Pool<DB>) {
    let started = Instant::now();
    let mut held = Vec::new();
    while held.len() < CALLERS {
        assert!(
            started.elapsed() < BOUND,
            "only {} of {CALLERS} connections opened in {BOUND:?}",
            held.len()
        );
        let mut opening = tokio::task::JoinSet::new();
        for _ in held.len()..CALLERS {
            let pool = pool.clone();
            opening.spawn(async move { pool.acquire().await });
        }
        held.extend(opening.join_all().await.into_iter().flatten());
    }
}

/// Whether this run may kill and start the machine's database services (`IDEM_RESTART_SERVICES=1`,
/// set by CI); a developer's own servers are left alone otherwise.
#[cfg(any(feature = "postgres", feature = "mysql"))]
fn may_restart(service: &str) -> bool {
    let may = std::env::var("IDEM_RESTART_SERVICES").as_deref() == Ok("1");
    if !may {
        eprintln!("skipped: restarting {service} needs IDEM_RESTART_SERVICES=1 (CI sets it)");
    }
    may
}

/// Runs `sh -c command`; whether it succeeded.
#[cfg(any(feature = "postgres", feature = "mysql"))]
fn try_sh(command: &str) -> bool {
    std::process::Command::new("sh")
        .args(["-c", command])
        .status()
        .is_ok_and(|s| s.success())
}

/// `check` every quarter of a second until it succeeds, for 60 s at most.
#[cfg(any(feature = "postgres", feature = "mysql"))]
fn until(check: &str) -> String {
    format!("for i in $(seq 1 240); do {check} && exit 0; sleep 0.25; done; exit 1")
}

/// One of the machine's services, killed and started by shell commands; started again when
/// dropped if it does not answer, whatever happened to the test.
#[cfg(any(feature = "postgres", feature = "mysql"))]
struct Service {
    name: &'static str,
    /// Kills it and returns once it is gone.
    kill: String,
    /// Starts it (returning at once or once it runs).
    start: String,
    /// Succeeds once when it answers.
    answers: String,
}

#[cfg(any(feature = "postgres", feature = "mysql"))]
impl Server for Service {
    fn kill(&self) {
        assert!(try_sh(&self.kill), "{}: `{}` failed", self.name, self.kill);
    }

    fn start(&self) {
        assert!(
            try_sh(&self.start),
            "{}: `{}` failed",
            self.name,
            self.start
        );
        assert!(
            try_sh(&until(&self.answers)),
            "{} did not answer within 60 s of `{}`",
            self.name,
            self.start
        );
    }
}

#[cfg(any(feature = "postgres", feature = "mysql"))]
impl Drop for Service {
    fn drop(&mut self) {
        if !try_sh(&self.answers) {
            eprintln!("{} is down; starting it again", self.name);
            try_sh(&self.start);
            if !try_sh(&until(&self.answers)) {
                eprintln!("{} did not come back: `{}`", self.name, self.start);
            }
        }
    }
}

/// The machine's Postgres stopped in immediate mode (no checkpoint, every connection cut: what a
/// crash leaves) while the bodies are inside.
#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_crashed_while_bodies_finish() {
    let builder = idem::PgStore::builder().acquire_timeout(ACQUIRE);
    let Some(store) = pg::store_with(builder, CALLERS as u32).await else {
        return;
    };
    if !may_restart("Postgres") {
        return;
    }
    let ctl = "pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main";
    let server = Arc::new(Service {
        name: "Postgres",
        kill: format!("{ctl} stop -m immediate"),
        start: format!("{ctl} start"),
        answers: "pg_isready -q -h 127.0.0.1 -p 5432".to_owned(),
    });
    let pool = store.pool().clone();
    crashed_while_bodies_finish("Postgres", Arc::new(store), server, async || {
        warm(&pool).await
    })
    .await;
}

/// The machine's MariaDB killed with SIGKILL while the bodies are inside.
#[cfg(feature = "mysql")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_crashed_while_bodies_finish() {
    let url = contract::server::mysql_url();
    // The store's own pool, but for the acquire timeout (its sessions' lock wait matters only to
    // transaction mode).
    let connect = MySqlPoolOptions::new()
        .max_connections(CALLERS as u32)
        .acquire_timeout(ACQUIRE)
        .test_before_acquire(false)
        .connect(&url);
    let Some(pool) = contract::server::reach("MySQL", &url, connect).await else {
        return;
    };
    let store = idem::MySqlStore::from_pool(pool);
    if !may_restart("MariaDB") {
        return;
    }
    mysql_leftovers::drop_leftovers(store.pool(), false).await;
    let table = contract::server::unique("idem_ho");
    let store = store
        .with_table(&table)
        .unwrap()
        .with_token_table(&format!("{table}_tok"))
        .unwrap();
    store.migrate().await.unwrap();
    let server = Arc::new(Service {
        name: "MariaDB",
        // The start command does nothing while the old process is still there.
        kill: format!(
            "pkill -9 -x mariadbd; {}",
            until("! pgrep -x mariadbd >/dev/null")
        ),
        start: "start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd"
            .to_owned(),
        answers: "mysqladmin --protocol=tcp -h 127.0.0.1 -P 3306 -uroot ping >/dev/null 2>&1"
            .to_owned(),
    });
    let pool = store.pool().clone();
    crashed_while_bodies_finish("MariaDB", Arc::new(store), server, async || {
        warm(&pool).await
    })
    .await;
}

#[cfg(feature = "redis")]
impl Server for redis_server::RedisServer {
    fn kill(&self) {
        redis_server::RedisServer::kill(self);
    }

    fn start(&self) {
        self.start_again();
    }
}

/// A Redis of this test's own (AOF, `appendfsync always`: every claim it acknowledged is on disk)
/// killed with SIGKILL while the bodies are inside, and started again on the same port and
/// directory.
#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_crashed_while_bodies_finish() {
    if !redis_server::installed() {
        return;
    }
    let dir = redis_server::scratch_dir("holder-outage");
    let port = redis_server::ports(31_000, 1).next().unwrap();
    let server = Arc::new(redis_server::RedisServer::start_durable(port, &dir));
    let store = idem::RedisStore::connect(&server.url())
        .await
        .unwrap()
        .with_prefix("idemho:")
        .unwrap();
    crashed_while_bodies_finish("Redis", Arc::new(store), server.clone(), async || {}).await;
    server.shutdown_nosave();
    let _ = std::fs::remove_dir_all(&dir);
}
