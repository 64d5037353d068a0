//! Processes that die or stall while they hold a claim, on every store that outlives a process
//! (SQLite; Redis with feature `redis`; Postgres and MySQL / MariaDB with their features).
//!
//! - SIGKILL between claim and mark, 100 trials per store: before the lease ends every other
//!   caller is told "in progress"; after it, of 8 callers released together exactly one takes over
//!   and runs the business once (counted in an independent effects table).
//! - SIGKILL after the body's effect and before its mark, 20 trials per store: after the lease a
//!   repeat with a recover fn finds the effect and replays it (no second effect); without one the
//!   takeover runs the body again, as documented for lease mode alone.
//!   The same through `#[idempotent(recover = …)]` (SQLite, 10 trials), and through the HTTP
//!   layer: a service killed after its handler's effect, restarted on the same records (4 trials
//!   per store, half with the layer's `recover`).
//! - SIGKILL between two recovery points (`idem::step`), 10 trials per store: a 3-step body dies
//!   after step two; the takeover gets steps one and two from the record and runs step three only,
//!   and each step's downstream key (`idem::step_key`) is the same in both attempts, checked by a
//!   fake external API (the effects table) that counts calls per key.
//! - A service with the layer in transaction mode SIGKILLed mid-handler (its order inserted through
//!   the layer's transaction, not committed), 3 trials per SQL store: no order and no record are
//!   left, and the retry at a restarted service runs at once and creates exactly one.
//! - SIGKILL mid-transaction (tx mode), 100 trials: the claim and the business write die with the
//!   transaction: no record, no effect, and the next caller runs at once.
//! - SIGSTOP past the lease: a paused holder (heartbeat and all) is taken over; resumed, it gets
//!   `LeaseLost`, and the stored result is the newer attempt's.
//! - Clock skew: children whose clocks are 10 minutes behind and ahead (libfaketime) claim, wait,
//!   take over and replay exactly as on a true clock, because the store decides by its own clock.
//!   (Not SQLite: there the store's clock is the process's own, see docs/RELIABILITY.md.)
//!
//! The dying process is this test binary run again as a child (`child` below, which does nothing
//! unless `IDEM_CRASH_CHILD` is set).

mod contract;
#[cfg(feature = "mysql")]
#[path = "support/mysql_leftovers.rs"]
mod mysql_leftovers;
#[cfg(feature = "postgres")]
#[path = "support/postgres.rs"]
mod pg;
#[cfg(feature = "axum")]
#[path = "support/tx_orders.rs"]
mod tx_orders;

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use idem::metrics::Outcome;
use idem::sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePool};
use idem::sqlx::{self, Row};
use idem::{Call, IdemError, SqliteStore, Status, Store};
use serde::{Deserialize, Serialize};
use tokio::sync::Barrier;

/// Where the records live, as the child needs to open them again.
#[derive(Debug, Clone, Serialize, Deserialize)]
enum Backend {
    Sqlite {
        path: PathBuf,
    },
    Redis {
        url: String,
        prefix: String,
    },
    /// The records in `table`; tx trials write their effects into `<table>_fx`.
    Postgres {
        url: String,
        table: String,
    },
    /// As Postgres.
    MySql {
        url: String,
        table: String,
    },
}

/// What the child does once it holds the claim.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
enum Act {
    /// Lease mode: claim, say READY, wait to be killed.
    Hold,
    /// Lease mode: claim, write the effect, say READY, wait to be killed: a holder that dies
    /// after its effect and before its mark.
    Effect,
    /// Lease mode: a body of three steps, each a call to the fake API; after step two it says
    /// READY and waits to be killed.
    Steps,
    /// As `Effect`, through an `#[idempotent]` fn with `recover` (SQLite only).
    EffectThroughTheAttribute,
    /// Serves the Idempotency-Key layer on the site's store (says `LISTEN <port>`); its handler
    /// writes the effect, says READY and waits to be killed.
    ServeHttp,
    /// Tx mode: claim and write the effect in a transaction, say READY, wait to be killed.
    HoldTx,
    /// Serves the layer in transaction mode on the site's SQL store (says `LISTEN <port>`); its
    /// handler inserts the order through the layer's transaction, says READY and waits to be
    /// killed.
    ServeHttpTx,
    /// Lease mode with a heartbeat: claim, say READY, wait for a line on stdin (the parent
    /// pauses it meanwhile), then write the effect, finish, and print how the call ended.
    Stall,
    /// One whole call: print `RESULT <outcome> <value>`.
    Once,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Spec {
    backend: Backend,
    /// The independent effects table's database file.
    effects: PathBuf,
    biz: String,
    key: String,
    lease_ms: u64,
    ttl_ms: u64,
    act: Act,
    /// libfaketime's offset for the child's clock (`-10m`), if skewed.
    skew: Option<String>,
}

async fn open(backend: &Backend) -> Arc<dyn Store> {
    match backend {
        Backend::Sqlite { path } => Arc::new(SqliteStore::open(path).await.unwrap()),
        #[cfg(feature = "redis")]
        Backend::Redis { url, prefix } => Arc::new(
            idem::RedisStore::connect(url)
                .await
                .unwrap()
                .with_prefix(prefix)
                .unwrap(),
        ),
        #[cfg(not(feature = "redis"))]
        Backend::Redis { .. } => unreachable!("Redis trials run only with the `redis` feature"),
        #[cfg(feature = "postgres")]
        Backend::Postgres { url, table } => Arc::new(pg_store(url, table).await),
        #[cfg(not(feature = "postgres"))]
        Backend::Postgres { .. } => unreachable!("Postgres trials need the `postgres` feature"),
        #[cfg(feature = "mysql")]
        Backend::MySql { url, table } => Arc::new(my_store(url, table).await),
        #[cfg(not(feature = "mysql"))]
        Backend::MySql { .. } => unreachable!("MySQL trials need the `mysql` feature"),
    }
}

#[cfg(feature = "mysql")]
async fn my_store(url: &str, table: &str) -> idem::MySqlStore {
    idem::MySqlStore::connect_with(url, 4, Duration::from_secs(2))
        .await
        .unwrap()
        .with_table(table)
        .unwrap()
        .with_token_table(&format!("{table}_tok"))
        .unwrap()
}

#[cfg(feature = "postgres")]
async fn pg_store(url: &str, table: &str) -> idem::PgStore {
    idem::PgStore::builder()
        .table(table)
        .unwrap()
        .token_table(&format!("{table}_tok"))
        .unwrap()
        .max_connections(4)
        .connect(url)
        .await
        .unwrap()
}

async fn effects_pool(path: &PathBuf) -> SqlitePool {
    let options = SqliteConnectOptions::new()
        .filename(path)
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .busy_timeout(Duration::from_secs(30));
    let pool = SqlitePool::connect_with(options).await.unwrap();
    sqlx::query("CREATE TABLE IF NOT EXISTS effects (biz TEXT NOT NULL, k TEXT NOT NULL, who TEXT NOT NULL)")
        .execute(&pool)
        .await
        .unwrap();
    pool
}

async fn effect(pool: &SqlitePool, biz: &str, key: &str, who: &str) -> Result<(), IdemError> {
    sqlx::query("INSERT INTO effects (biz, k, who) VALUES (?, ?, ?)")
        .bind(biz)
        .bind(key)
        .bind(who)
        .execute(pool)
        .await
        .map(drop)
        .map_err(IdemError::store)
}

async fn effects_of(pool: &SqlitePool, biz: &str, key: &str) -> Vec<String> {
    sqlx::query("SELECT who FROM effects WHERE biz = ? AND k = ? ORDER BY rowid")
        .bind(biz)
        .bind(key)
        .fetch_all(pool)
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
}

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}").unwrap();
    out.flush().unwrap();
}

/// Claims in a transaction of a server store and writes the effect (`insert`, in the driver's
/// placeholders), says READY and waits to be killed: the drivers' types differ, the code does not.
#[cfg(any(feature = "postgres", feature = "mysql"))]
macro_rules! hold_tx {
    ($spec:expr, $call:expr, $store:expr, $insert:expr) => {{
        let store = $store;
        let insert = $insert;
        let mut tx = store.begin().await.unwrap();
        let _: Result<(), IdemError> = $call
            .run_in_tx(&mut tx, async |tx| {
                sqlx::query(sqlx::AssertSqlSafe(insert.clone()))
                    .bind(&$spec.biz)
                    .bind(&$spec.key)
                    .execute(&mut **tx)
                    .await
                    .map_err(IdemError::store)?;
                say("READY");
                std::future::pending().await
            })
            .await;
    }};
}

/// The child: does `IDEM_CRASH_CHILD`'s act, or nothing when it is not set.
#[tokio::test]
async fn child() {
    let Ok(spec) = std::env::var("IDEM_CRASH_CHILD") else {
        return;
    };
    let spec: Spec = serde_json::from_str(&spec).unwrap();
    // Never outlive the parent (a failed test must not leave children holding its output open):
    // exit when its end of stdin closes, and after two minutes whatever happens.
    if spec.act != Act::Stall {
        std::thread::spawn(|| {
            let _ = std::io::Read::read_to_end(&mut std::io::stdin(), &mut Vec::new());
            std::process::exit(3);
        });
    }
    std::thread::spawn(|| {
        std::thread::sleep(Duration::from_secs(120));
        std::process::exit(4);
    });
    let lease = Duration::from_millis(spec.lease_ms);
    let ttl = Duration::from_millis(spec.ttl_ms);
    let call = || Call::new(spec.biz.clone(), &spec.key).lease(lease).ttl(ttl);
    match spec.act {
        Act::Hold => {
            let store = open(&spec.backend).await;
            let _: Result<(), IdemError> = call()
                .run(&*store, async {
                    say("READY");
                    std::future::pending().await
                })
                .await;
        }
        Act::Effect => {
            let store = open(&spec.backend).await;
            let effects = effects_pool(&spec.effects).await;
            let _: Result<String, IdemError> = call()
                .run(&*store, async {
                    effect(&effects, &spec.biz, &spec.key, "child").await?;
                    say("READY");
                    std::future::pending().await
                })
                .await;
        }
        Act::Steps => {
            let store = open(&spec.backend).await;
            let effects = effects_pool(&spec.effects).await;
            let _: Result<Vec<String>, IdemError> = call()
                .run(&*store, three_steps(&effects, &spec.biz, "child", true))
                .await;
        }
        Act::EffectThroughTheAttribute => {
            let Backend::Sqlite { path } = &spec.backend else {
                unreachable!("the attribute trial runs on SQLite")
            };
            attribute_site(path, &spec.effects).await;
            let _ = charge(&spec.key, "child", true).await;
        }
        #[cfg(feature = "axum")]
        Act::ServeHttp => {
            let store = open(&spec.backend).await;
            let effects = effects_pool(&spec.effects).await;
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            say(&format!("LISTEN {}", listener.local_addr().unwrap().port()));
            let app = http_shop(effects, "child", true).layer(http_layer(store, lease, None));
            axum::serve(listener, app).await.unwrap();
        }
        #[cfg(not(feature = "axum"))]
        Act::ServeHttp => unreachable!("the HTTP trial needs the `axum` feature"),
        #[cfg(feature = "axum")]
        Act::ServeHttpTx => {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            say(&format!("LISTEN {}", listener.local_addr().unwrap().port()));
            let app = tx_service(&spec.backend, "child", true).await;
            axum::serve(listener, app).await.unwrap();
        }
        #[cfg(not(feature = "axum"))]
        Act::ServeHttpTx => unreachable!("the HTTP trial needs the `axum` feature"),
        Act::HoldTx => match &spec.backend {
            Backend::Sqlite { path } => {
                let store = SqliteStore::open(path).await.unwrap();
                let mut tx = store.begin().await.unwrap();
                let _: Result<(), IdemError> = call()
                    .run_in_tx(&mut tx, async |tx| {
                        sqlx::query("INSERT INTO effects (biz, k, who) VALUES (?, ?, 'child')")
                            .bind(&spec.biz)
                            .bind(&spec.key)
                            .execute(&mut **tx)
                            .await
                            .map_err(IdemError::store)?;
                        say("READY");
                        std::future::pending().await
                    })
                    .await;
            }
            #[cfg(feature = "postgres")]
            Backend::Postgres { url, table } => hold_tx!(
                spec,
                call(),
                pg_store(url, table).await,
                format!("INSERT INTO {table}_fx (biz, k, who) VALUES ($1, $2, 'child')")
            ),
            #[cfg(feature = "mysql")]
            Backend::MySql { url, table } => hold_tx!(
                spec,
                call(),
                my_store(url, table).await,
                format!("INSERT INTO {table}_fx (biz, k, who) VALUES (?, ?, 'child')")
            ),
            _ => unreachable!("tx trials run on SQL stores"),
        },
        Act::Once => {
            let store = open(&spec.backend).await;
            let effects = effects_pool(&spec.effects).await;
            let who = spec.skew.clone().unwrap_or_else(|| "true clock".to_owned());
            let (result, report) = idem::metrics::observe(call().run(&*store, async {
                effect(&effects, &spec.biz, &spec.key, &who).await?;
                Ok::<_, IdemError>(who.clone())
            }))
            .await;
            let outcome = report.map_or("none", |r| r.outcome.as_str());
            match result {
                Ok(v) => say(&format!("RESULT {outcome} {v}")),
                Err(e) => say(&format!("RESULT {outcome} error {e}")),
            }
        }
        Act::Stall => {
            let store = open(&spec.backend).await;
            let effects = effects_pool(&spec.effects).await;
            let result: Result<String, IdemError> = call()
                .heartbeat(lease / 4)
                .run(&*store, async {
                    say("READY");
                    // Blocks until the parent writes a line (it pauses this process meanwhile).
                    tokio::task::spawn_blocking(|| {
                        std::io::stdin().lock().read_line(&mut String::new())
                    })
                    .await
                    .unwrap()
                    .unwrap();
                    effect(&effects, &spec.biz, &spec.key, "A").await?;
                    Ok("A".to_owned())
                })
                .await;
            match result {
                Ok(v) => say(&format!("RESULT ok {v}")),
                Err(IdemError::LeaseLost { .. }) => say("RESULT lease-lost"),
                Err(e) => say(&format!("RESULT error {e}")),
            }
        }
    }
}

/// A child process doing `spec`'s act, once it said READY.
struct Running {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Running {
    fn start(spec: &Spec) -> Running {
        let mut running = Running::spawn(spec);
        running.wait_for("READY");
        running
    }

    /// Starts the child without waiting for it.
    fn spawn(spec: &Spec) -> Running {
        let mut command = Command::new(std::env::current_exe().unwrap());
        if let Some(skew) = &spec.skew {
            // The wall clock only: tokio's timers run on the monotonic clock, left true.
            command
                .env("LD_PRELOAD", libfaketime().expect("checked by the test"))
                .env("FAKETIME", skew)
                .env("FAKETIME_DONT_FAKE_MONOTONIC", "1");
        }
        let mut child = command
            .args(["--exact", "child", "--nocapture", "--test-threads=1"])
            .env("IDEM_CRASH_CHILD", serde_json::to_string(spec).unwrap())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        Running {
            child,
            stdin,
            stdout,
        }
    }

    /// Reads the child's lines until one starts with `prefix`; that line.
    fn wait_for(&mut self, prefix: &str) -> String {
        let mut line = String::new();
        loop {
            line.clear();
            let n = self.stdout.read_line(&mut line).unwrap();
            assert!(n > 0, "the child ended before saying {prefix}");
            // libtest may have written `test child ... ` on the same line first.
            if let Some(at) = line.find(prefix) {
                return line[at..].trim().to_owned();
            }
        }
    }

    fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .args([sig, &self.child.id().to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill {sig} failed");
    }

    fn kill(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }
}

const TRIALS: usize = 100;

struct Site {
    backend: Backend,
    store: Arc<dyn Store>,
    effects_path: PathBuf,
    effects: SqlitePool,
    _dir: tempfile::TempDir,
}

async fn sqlite_site() -> Site {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("records.db");
    let store = SqliteStore::open(&path).await.unwrap();
    store.migrate().await.unwrap();
    let effects_path = dir.path().join("effects.db");
    Site {
        backend: Backend::Sqlite { path },
        store: Arc::new(store),
        effects: effects_pool(&effects_path).await,
        effects_path,
        _dir: dir,
    }
}

#[cfg(feature = "redis")]
async fn redis_site() -> Option<Site> {
    let url = contract::server::url("IDEM_REDIS_URL", "redis://127.0.0.1:6379");
    let prefix = format!("{}:", contract::server::unique("crash"));
    let store = contract::server::reach("Redis", &url, idem::RedisStore::connect(&url)).await?;
    let dir = tempfile::tempdir().unwrap();
    let effects_path = dir.path().join("effects.db");
    Some(Site {
        backend: Backend::Redis {
            url,
            prefix: prefix.clone(),
        },
        store: Arc::new(store.with_prefix(&prefix).unwrap()),
        effects: effects_pool(&effects_path).await,
        effects_path,
        _dir: dir,
    })
}

/// Postgres records on tables of this test alone (`idemt_<pid>_<n>`, dropped by the next run's
/// clean-up once this process is gone).
#[cfg(feature = "postgres")]
async fn pg_site() -> Option<Site> {
    let store = pg::store(8).await?;
    let table = store.table().to_owned();
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "CREATE TABLE {table}_fx (biz TEXT NOT NULL, k TEXT NOT NULL, who TEXT NOT NULL)"
    )))
    .execute(store.pool())
    .await
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let effects_path = dir.path().join("effects.db");
    Some(Site {
        backend: Backend::Postgres {
            url: pg::url(),
            table,
        },
        store: Arc::new(store),
        effects: effects_pool(&effects_path).await,
        effects_path,
        _dir: dir,
    })
}

/// MySQL / MariaDB records on tables of this test alone (`idem_c_<pid>_<n>`, dropped by a later
/// run's clean-up once this process is gone).
#[cfg(feature = "mysql")]
async fn my_site() -> Option<Site> {
    let url = contract::server::url("IDEM_MYSQL_URL", "mysql://root@127.0.0.1:3306/test");
    let connect = idem::MySqlStore::connect_with(&url, 8, Duration::from_secs(2));
    let store = contract::server::reach("MySQL", &url, connect).await?;
    mysql_leftovers::drop_leftovers(store.pool(), false).await;
    let table = contract::server::unique("idem_c");
    let store = store
        .with_table(&table)
        .unwrap()
        .with_token_table(&format!("{table}_tok"))
        .unwrap();
    store.migrate().await.unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "CREATE TABLE {table}_fx (biz VARCHAR(64) NOT NULL, k VARCHAR(64) NOT NULL, who VARCHAR(64) NOT NULL)"
    )))
    .execute(store.pool())
    .await
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let effects_path = dir.path().join("effects.db");
    Some(Site {
        backend: Backend::MySql { url, table },
        store: Arc::new(store),
        effects: effects_pool(&effects_path).await,
        effects_path,
        _dir: dir,
    })
}

impl Site {
    fn spec(&self, biz: &str, key: &str, lease: Duration, act: Act) -> Spec {
        Spec {
            backend: self.backend.clone(),
            effects: self.effects_path.clone(),
            biz: biz.to_owned(),
            key: key.to_owned(),
            lease_ms: lease.as_millis() as u64,
            ttl_ms: 7 * 24 * 3600 * 1000,
            act,
            skew: None,
        }
    }

    /// Runs [`TRIALS`] children doing `act` on keys `k0`, `k1`, …, `batch` at a time, and kills
    /// each batch once all of it said READY; `after_kill` checks each batch's keys right away.
    async fn kill_trials(
        &self,
        biz: &str,
        lease: Duration,
        act: Act,
        batch: usize,
        after_kill: impl AsyncFnMut(&str),
    ) -> Vec<String> {
        self.kill_n(TRIALS, biz, lease, act, batch, after_kill)
            .await
    }

    /// [`Site::kill_trials`] with `trials` children.
    async fn kill_n(
        &self,
        trials: usize,
        biz: &str,
        lease: Duration,
        act: Act,
        batch: usize,
        mut after_kill: impl AsyncFnMut(&str),
    ) -> Vec<String> {
        let keys: Vec<String> = (0..trials).map(|i| format!("k{i}")).collect();
        for group in keys.chunks(batch) {
            let specs: Vec<Spec> = group
                .iter()
                .map(|k| self.spec(biz, k, lease, act))
                .collect();
            let children = tokio::task::spawn_blocking(move || {
                let mut children: Vec<Running> = specs.iter().map(Running::spawn).collect();
                for c in &mut children {
                    c.wait_for("READY");
                }
                for c in children {
                    c.kill();
                }
            });
            children.await.unwrap();
            for key in group {
                after_kill(key).await;
            }
        }
        keys
    }

    /// Eight callers released together on `key`; how many ran the business, and their outcomes.
    async fn burst(&self, biz: &str, key: &str, lease: Duration) -> Vec<Outcome> {
        let barrier = Arc::new(Barrier::new(8));
        let mut tasks = tokio::task::JoinSet::new();
        for i in 0..8 {
            let (store, barrier, effects) =
                (self.store.clone(), barrier.clone(), self.effects.clone());
            let (biz, key) = (biz.to_owned(), key.to_owned());
            tasks.spawn(async move {
                barrier.wait().await;
                let call = Call::new(biz.clone(), &key).lease(lease);
                let (_, report) = idem::metrics::observe(call.run(&*store, async {
                    effect(&effects, &biz, &key, &format!("burst{i}")).await?;
                    Ok::<_, IdemError>(i)
                }))
                .await;
                report.expect("an idempotent call ran").outcome
            });
        }
        tasks.join_all().await
    }
}

async fn killed_between_claim_and_mark(site: Site) {
    let biz = "CRASH";
    // Long enough that every key of a batch is checked before its lease ends.
    let lease = Duration::from_secs(5);
    let keys = site
        .kill_trials(biz, lease, Act::Hold, 10, async |key| {
            // The claim outlives its holder: until the lease ends every caller is told so.
            let record = site.store.load(biz, key).await.unwrap().expect("claimed");
            assert_eq!(record.status, Status::Processing, "{key}");
            let outcomes = site.burst(biz, key, lease).await;
            assert!(
                outcomes.iter().all(|o| *o == Outcome::InProgress),
                "{key} before its lease ended: {outcomes:?}"
            );
        })
        .await;
    // Once every lease has ended: exactly one caller of each burst takes over, once.
    tokio::time::sleep(lease + Duration::from_millis(200)).await;
    for key in &keys {
        let outcomes = site.burst(biz, key, lease).await;
        let took_over = outcomes
            .iter()
            .filter(|o| **o == Outcome::TakenOver)
            .count();
        assert_eq!(took_over, 1, "{key}: {outcomes:?}");
        assert!(
            outcomes.iter().all(|o| matches!(
                o,
                Outcome::TakenOver | Outcome::InProgress | Outcome::Replayed
            )),
            "{key}: {outcomes:?}"
        );
        assert_eq!(effects_of(&site.effects, biz, key).await.len(), 1, "{key}");
        let record = site.store.load(biz, key).await.unwrap().unwrap();
        assert_eq!(
            (record.status, record.attempt),
            (Status::Succeeded, 2),
            "{key}"
        );
    }
}

/// Children killed after their effect and before their mark (a crash between the payment and its
/// record), 20 trials. After the lease, a repeat with a recover fn (which reads the effects table,
/// the "real business result") finds the effect and stores it: 0 double effects, the repeat and
/// every later one get the recovered result. Without a recover fn, the documented behaviour of
/// lease mode alone: the takeover runs the body again, a second effect.
async fn killed_after_its_effect(site: Site) {
    let biz = "CRASHFX";
    let lease = Duration::from_secs(3);
    let keys = site
        .kill_n(20, biz, lease, Act::Effect, 10, async |key| {
            let record = site.store.load(biz, key).await.unwrap().expect("claimed");
            assert_eq!(record.status, Status::Processing, "{key}");
        })
        .await;
    tokio::time::sleep(lease + Duration::from_millis(200)).await;
    let recover = |key: String| {
        let effects = site.effects.clone();
        move || async move {
            let seen = effects_of(&effects, biz, &key).await;
            Ok::<_, IdemError>(seen.first().map(|who| format!("recovered {who}")))
        }
    };
    for (i, key) in keys.iter().enumerate() {
        let effects = site.effects.clone();
        let body = async move {
            effect(&effects, biz, key, "repeat").await?;
            Ok::<_, IdemError>("ran again".to_owned())
        };
        let call = Call::new(biz, key).lease(lease);
        if i % 2 == 0 {
            let (res, report) =
                idem::metrics::observe(call.recover(recover(key.clone())).run(&*site.store, body))
                    .await;
            assert_eq!(res.unwrap(), "recovered child", "{key}");
            assert_eq!(report.unwrap().outcome, Outcome::Recovered, "{key}");
            assert_eq!(
                effects_of(&site.effects, biz, key).await,
                ["child"],
                "{key}"
            );
            let again: String = Call::new(biz, key)
                .recover(recover(key.clone()))
                .run(&*site.store, async {
                    Ok::<_, IdemError>("third".to_owned())
                })
                .await
                .unwrap();
            assert_eq!(again, "recovered child", "{key}: a repeat replays it");
        } else {
            let (res, report) = idem::metrics::observe(call.run(&*site.store, body)).await;
            assert_eq!(res.unwrap(), "ran again", "{key}");
            assert_eq!(report.unwrap().outcome, Outcome::TakenOver, "{key}");
            assert_eq!(
                effects_of(&site.effects, biz, key).await,
                ["child", "repeat"],
                "{key}: without recover, lease mode runs the body again"
            );
        }
        let record = site.store.load(biz, key).await.unwrap().unwrap();
        assert_eq!(record.status, Status::Succeeded, "{key}");
    }
}

/// The fake external API of the steps trials: one row per call, under the downstream key the step
/// passes (its `step_key`) and who called; it answers with that key.
async fn api(effects: &SqlitePool, biz: &str, step: &str, who: &str) -> Result<String, IdemError> {
    let key = idem::step_key(step).expect("inside an idempotent body");
    effect(effects, biz, &key, who).await?;
    Ok(key)
}

/// Three steps, each one API call; with `die`, it says READY after step two and waits to be
/// killed. Answers each step's result and the step key the attempt itself computed for it.
async fn three_steps(
    effects: &SqlitePool,
    biz: &str,
    who: &str,
    die: bool,
) -> Result<Vec<String>, IdemError> {
    let mut out = Vec::new();
    for (i, name) in ["one", "two", "three"].into_iter().enumerate() {
        if die && i == 2 {
            say("READY");
            std::future::pending::<()>().await;
        }
        out.push(idem::step(name, api(effects, biz, name, who)).await?);
        out.push(idem::step_key(name).expect("inside the body"));
    }
    Ok(out)
}

/// Children killed after step two of three (10 trials). After the lease the takeover gets steps
/// one and two from the record (the child's keys, the same as its own) and runs step three only:
/// the API saw each downstream key once.
async fn killed_between_steps(site: Site) {
    let biz = "CRASHSTEP";
    let lease = Duration::from_secs(3);
    let keys = site
        .kill_n(10, biz, lease, Act::Steps, 10, async |key| {
            let record = site.store.load(biz, key).await.unwrap().expect("claimed");
            assert_eq!(record.status, Status::Processing, "{key}");
            assert!(record.steps.is_some(), "{key}: steps one and two saved");
        })
        .await;
    tokio::time::sleep(lease + Duration::from_millis(200)).await;
    for key in &keys {
        let (res, report) = idem::metrics::observe(Call::new(biz, key).lease(lease).run(
            &*site.store,
            three_steps(&site.effects, biz, "repeat", false),
        ))
        .await;
        let got = res.unwrap();
        assert_eq!(report.unwrap().outcome, Outcome::TakenOver, "{key}");
        for (step, pair) in got.chunks(2).enumerate() {
            assert_eq!(
                pair[0], pair[1],
                "{key} step {step}: the same downstream key"
            );
            let expected: &[&str] = if step < 2 { &["child"] } else { &["repeat"] };
            assert_eq!(
                effects_of(&site.effects, biz, &pair[0]).await,
                expected,
                "{key} step {step}: one API call per downstream key"
            );
        }
        let record = site.store.load(biz, key).await.unwrap().unwrap();
        assert_eq!(record.status, Status::Succeeded, "{key}");
    }
    let (calls,): (i64,) = sqlx::query_as("SELECT COUNT(*) FROM effects WHERE biz = ?")
        .bind(biz)
        .fetch_one(&site.effects)
        .await
        .unwrap();
    assert_eq!(
        calls,
        3 * keys.len() as i64,
        "three API calls per key in all"
    );
}

/// The effects table the attribute trial's fns use (one per process: only that trial sets it).
static ATTRIBUTE_EFFECTS: std::sync::OnceLock<SqlitePool> = std::sync::OnceLock::new();

/// Registers the attribute trial's store (`crash_attribute`) and effects table in this process.
async fn attribute_site(records: &PathBuf, effects: &PathBuf) {
    idem::register_store("crash_attribute", SqliteStore::open(records).await.unwrap());
    let _ = ATTRIBUTE_EFFECTS.set(effects_pool(effects).await);
}

/// The "real business result": the first effect recorded for the order.
async fn payment_of(order: &str) -> Result<Option<String>, IdemError> {
    let seen = effects_of(ATTRIBUTE_EFFECTS.get().unwrap(), "CRASHATTR", order).await;
    Ok(seen.first().map(|who| format!("recovered {who}")))
}

/// Writes the effect, then (when `hang`) says READY and waits to be killed.
#[idem::idempotent(
    biz = "CRASHATTR",
    key = "order",
    store = "crash_attribute",
    lease = "3s",
    recover = "payment_of(order)"
)]
async fn charge(order: &str, who: &str, hang: bool) -> Result<String, IdemError> {
    effect(ATTRIBUTE_EFFECTS.get().unwrap(), "CRASHATTR", order, who).await?;
    if hang {
        say("READY");
        std::future::pending::<()>().await;
    }
    Ok(format!("charged by {who}"))
}

/// `killed_after_its_effect` through `#[idempotent(recover = …)]`: 10 children killed after their
/// effect; after the lease each repeat is recovered, and the body never runs twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_killed_after_its_effect_through_the_attribute() {
    if std::env::var("IDEM_CRASH_CHILD").is_ok() {
        return;
    }
    let site = sqlite_site().await;
    let Backend::Sqlite { path } = &site.backend else {
        unreachable!()
    };
    attribute_site(path, &site.effects_path).await;
    let lease = Duration::from_secs(3);
    let keys = site
        .kill_n(
            10,
            "CRASHATTR",
            lease,
            Act::EffectThroughTheAttribute,
            10,
            async |key| {
                let record = site
                    .store
                    .load("CRASHATTR", key)
                    .await
                    .unwrap()
                    .expect("claimed");
                assert_eq!(record.status, Status::Processing, "{key}");
            },
        )
        .await;
    tokio::time::sleep(lease + Duration::from_millis(200)).await;
    for key in &keys {
        let (res, report) = idem::metrics::observe(charge(key, "repeat", false)).await;
        assert_eq!(res.unwrap(), "recovered child", "{key}");
        assert_eq!(report.unwrap().outcome, Outcome::Recovered, "{key}");
        assert_eq!(
            effects_of(&site.effects, "CRASHATTR", key).await,
            ["child"],
            "{key}"
        );
        let again = charge(key, "third", false).await.unwrap();
        assert_eq!(again, "recovered child", "{key}: replayed");
    }
}

/// `POST /orders` with an Idempotency-Key: writes the effect under the key as `who`, then (when
/// `hang`) says READY and waits to be killed; else answers 201 `ordered by <who>`.
#[cfg(feature = "axum")]
fn http_shop(effects: SqlitePool, who: &'static str, hang: bool) -> axum::Router {
    let order = move |headers: axum::http::HeaderMap| {
        let effects = effects.clone();
        async move {
            let key = headers["idempotency-key"].to_str().unwrap().to_owned();
            effect(&effects, "CRASHHTTP", &key, who).await.unwrap();
            if hang {
                say("READY");
                std::future::pending::<()>().await;
            }
            (axum::http::StatusCode::CREATED, format!("ordered by {who}"))
        }
    };
    axum::Router::new().route("/orders", axum::routing::post(order))
}

/// The layer on `store`, with `recover` reading the effects table when given.
#[cfg(feature = "axum")]
fn http_layer(
    store: Arc<dyn Store>,
    lease: Duration,
    recover: Option<SqlitePool>,
) -> idem::http::IdempotencyLayer {
    let builder = idem::http::IdempotencyLayer::builder(store)
        .principal(idem::http::Principal::unscoped(
            "a test service with one caller",
        ))
        .lease(lease);
    let builder = match recover {
        None => builder,
        Some(effects) => builder.recover(move |req: idem::http::RecoverRequest| {
            let effects = effects.clone();
            async move {
                use axum::response::IntoResponse;
                let seen = effects_of(&effects, "CRASHHTTP", &req.key).await;
                Ok(seen.first().map(|who| {
                    (axum::http::StatusCode::CREATED, format!("ordered by {who}")).into_response()
                }))
            }
        }),
    };
    builder.build().unwrap()
}

/// Starts the child service `spec` serves (it says `LISTEN <port>`), sends it `POST /orders`
/// with `key`, and kills it (SIGKILL) once its handler says READY: the request dies with it.
#[cfg(feature = "axum")]
async fn killed_mid_request(spec: Spec, client: &reqwest::Client, key: &str) {
    let mut child = tokio::task::spawn_blocking(move || {
        let mut child = Running::spawn(&spec);
        let port = child.wait_for("LISTEN");
        (
            child,
            port.trim_start_matches("LISTEN ").parse::<u16>().unwrap(),
        )
    })
    .await
    .unwrap();
    let first = {
        let (client, key, port) = (client.clone(), key.to_owned(), child.1);
        tokio::spawn(async move {
            client
                .post(format!("http://127.0.0.1:{port}/orders"))
                .header("idempotency-key", key)
                .send()
                .await
        })
    };
    child = tokio::task::spawn_blocking(move || {
        child.0.wait_for("READY");
        child
    })
    .await
    .unwrap();
    child.0.kill();
    assert!(
        first.await.unwrap().is_err(),
        "the service died mid-request"
    );
}

/// A service killed (SIGKILL) after its handler's effect and before the layer stored the
/// response, 4 times (half of them with `recover`): after the lease, a retry at a restarted service
/// with `recover` gets the first order's response and no second effect; without `recover`, the
/// documented behaviour of lease mode alone: the handler runs again.
#[cfg(feature = "axum")]
async fn service_killed_after_its_handlers_effect(site: Site) {
    let lease = Duration::from_secs(2);
    let client = reqwest::Client::new();
    for trial in 0..4 {
        let with_recover = trial % 2 == 0;
        let key = format!("order-{trial}");
        let spec = site.spec("CRASHHTTP", &key, lease, Act::ServeHttp);
        killed_mid_request(spec, &client, &key).await;
        assert_eq!(
            effects_of(&site.effects, "CRASHHTTP", &key).await,
            ["child"]
        );

        // The service comes back (in this process) on the same records.
        let recover = with_recover.then(|| site.effects.clone());
        let app = http_shop(site.effects.clone(), "repeat", false).layer(http_layer(
            open(&site.backend).await,
            lease,
            recover,
        ));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/orders", listener.local_addr().unwrap());
        let server = tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        let early = client
            .post(&url)
            .header("idempotency-key", &key)
            .send()
            .await
            .unwrap();
        assert_eq!(
            early.status(),
            409,
            "{key}: in progress until the lease ends"
        );
        tokio::time::sleep(lease + Duration::from_millis(200)).await;
        let retry = client
            .post(&url)
            .header("idempotency-key", &key)
            .send()
            .await
            .unwrap();
        assert_eq!(retry.status(), 201, "{key}");
        let effects = effects_of(&site.effects, "CRASHHTTP", &key).await;
        if with_recover {
            assert_eq!(retry.headers()["idempotent-replayed"], "true", "{key}");
            assert_eq!(retry.text().await.unwrap(), "ordered by child", "{key}");
            assert_eq!(effects, ["child"], "{key}: no second effect");
        } else {
            assert_eq!(retry.text().await.unwrap(), "ordered by repeat", "{key}");
            assert_eq!(
                effects,
                ["child", "repeat"],
                "{key}: lease mode alone runs it again"
            );
        }
        server.abort();
    }
}

/// The layer in transaction mode on the site's SQL store, with a handler that inserts the order
/// (`who`) through the layer's transaction and then (when `hang`) says READY and waits to be
/// killed, else answers 201 `ordered by <who>`.
#[cfg(feature = "axum")]
async fn tx_service(backend: &Backend, who: &'static str, hang: bool) -> axum::Router {
    match backend {
        Backend::Sqlite { path } => tx_router(
            SqliteStore::open(path).await.unwrap(),
            orders_table(backend),
            who,
            hang,
        ),
        #[cfg(feature = "postgres")]
        Backend::Postgres { url, table } => {
            tx_router(pg_store(url, table).await, orders_table(backend), who, hang)
        }
        #[cfg(feature = "mysql")]
        Backend::MySql { url, table } => {
            tx_router(my_store(url, table).await, orders_table(backend), who, hang)
        }
        _ => unreachable!("transaction mode runs on SQL stores"),
    }
}

/// The handler's order table in the store's database.
#[cfg(feature = "axum")]
fn orders_table(backend: &Backend) -> String {
    match backend {
        Backend::Postgres { table, .. } | Backend::MySql { table, .. } => format!("{table}_orders"),
        _ => "orders".to_owned(),
    }
}

#[cfg(feature = "axum")]
fn tx_router<S>(store: S, table: String, who: &'static str, hang: bool) -> axum::Router
where
    S: idem::TransactionalStore,
    S::Tx: idem::TransitionTx + tx_orders::Orders,
{
    use tx_orders::Orders;
    let layer = idem::http::IdempotencyLayer::builder_tx(store)
        .principal(idem::http::Principal::unscoped(
            "a test service with one caller",
        ))
        .build()
        .unwrap();
    let order = move |headers: axum::http::HeaderMap, mut tx: idem::http::LayerTx<S::Tx>| {
        let table = table.clone();
        async move {
            let key = headers["idempotency-key"].to_str().unwrap().to_owned();
            tx.insert_order(&table, &key, who).await.unwrap();
            if hang {
                say("READY");
                std::future::pending::<()>().await;
            }
            (axum::http::StatusCode::CREATED, format!("ordered by {who}"))
        }
    };
    axum::Router::new()
        .route("/orders", axum::routing::post(order))
        .layer(layer)
}

/// Runs `sql` (one statement, binding `key` when it has a placeholder) on the site's SQL
/// database; the first column of its row, if any.
#[cfg(feature = "axum")]
async fn on_db(backend: &Backend, sql: String, key: Option<&str>) -> Option<i64> {
    macro_rules! run {
        ($pool:expr) => {{
            let q = sqlx::query_scalar(sqlx::AssertSqlSafe(sql));
            let q = match key {
                Some(key) => q.bind(key.to_owned()),
                None => q,
            };
            q.fetch_optional($pool).await.unwrap()
        }};
    }
    match backend {
        Backend::Sqlite { path } => run!(SqliteStore::open(path).await.unwrap().pool()),
        #[cfg(feature = "postgres")]
        Backend::Postgres { url, table } => run!(pg_store(url, table).await.pool()),
        #[cfg(feature = "mysql")]
        Backend::MySql { url, table } => run!(my_store(url, table).await.pool()),
        _ => unreachable!("transaction mode runs on SQL stores"),
    }
}

/// A service with the layer in transaction mode killed (SIGKILL) mid-handler, after its insert
/// and before the commit, 3 times: the database rolls the transaction back, so no order and no
/// record are left; a retry at a restarted service runs at once (no lease to wait for) and
/// creates exactly one order, and a repeat replays it.
#[cfg(feature = "axum")]
async fn service_killed_mid_transaction(site: Site) {
    let table = orders_table(&site.backend);
    on_db(&site.backend, tx_orders::create_table(&table), None).await;
    let placeholder = match site.backend {
        Backend::Postgres { .. } => "$1",
        _ => "?",
    };
    let count = format!("SELECT COUNT(*) FROM {table} WHERE k = {placeholder}");
    let client = reqwest::Client::new();
    for trial in 0..3 {
        let key = format!("tx-order-{trial}");
        let spec = site.spec("HTTP", &key, Duration::from_secs(30), Act::ServeHttpTx);
        killed_mid_request(spec, &client, &key).await;

        let app = tx_service(&site.backend, "repeat", false).await;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/orders", listener.local_addr().unwrap());
        let server = tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        // The server may take a moment to see the connection die and roll back: the retry waits
        // for the lock meanwhile, never for a lease.
        let retry = client
            .post(&url)
            .header("idempotency-key", &key)
            .send()
            .await
            .unwrap();
        assert_eq!(retry.status(), 201, "{key}");
        assert!(
            !retry.headers().contains_key("idempotent-replayed"),
            "{key}"
        );
        assert_eq!(retry.text().await.unwrap(), "ordered by repeat", "{key}");
        let orders = on_db(&site.backend, count.clone(), Some(&key)).await;
        assert_eq!(
            orders,
            Some(1),
            "{key}: the killed insert rolled back, the retry's stayed"
        );
        let again = client
            .post(&url)
            .header("idempotency-key", &key)
            .send()
            .await
            .unwrap();
        assert_eq!(again.headers()["idempotent-replayed"], "true", "{key}");
        assert_eq!(
            on_db(&site.backend, count.clone(), Some(&key)).await,
            Some(1)
        );
        server.abort();
    }
}

#[cfg(feature = "axum")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_service_killed_mid_transaction() {
    if std::env::var("IDEM_CRASH_CHILD").is_ok() {
        return;
    }
    service_killed_mid_transaction(sqlite_site().await).await;
}

#[cfg(feature = "axum")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_service_killed_after_its_handlers_effect() {
    if std::env::var("IDEM_CRASH_CHILD").is_ok() {
        return;
    }
    service_killed_after_its_handlers_effect(sqlite_site().await).await;
}

/// A scenario on a server store's site, as a test of its own under `cfg` (skipped when the server
/// is unreachable, or in the child).
macro_rules! on_server {
    ($($cfg:meta: $name:ident = $scenario:ident on $site:ident;)*) => {$(
        #[cfg($cfg)]
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $name() {
            if std::env::var("IDEM_CRASH_CHILD").is_ok() {
                return;
            }
            if let Some(site) = $site().await {
                $scenario(site).await;
            }
        }
    )*};
}

on_server! {
    all(feature = "axum", feature = "mysql"): mysql_service_killed_mid_transaction = service_killed_mid_transaction on my_site;
    all(feature = "axum", feature = "postgres"): postgres_service_killed_mid_transaction = service_killed_mid_transaction on pg_site;
}

on_server! {
    all(feature = "axum", feature = "mysql"): mysql_service_killed_after_its_handlers_effect = service_killed_after_its_handlers_effect on my_site;
    all(feature = "axum", feature = "postgres"): postgres_service_killed_after_its_handlers_effect = service_killed_after_its_handlers_effect on pg_site;
    all(feature = "axum", feature = "redis"): redis_service_killed_after_its_handlers_effect = service_killed_after_its_handlers_effect on redis_site;
}

async fn paused_past_the_lease(site: Site) {
    let (biz, key) = ("PAUSE", "order-1");
    let lease = Duration::from_millis(600);
    let spec = site.spec(biz, key, lease, Act::Stall);
    let mut a = tokio::task::spawn_blocking(move || Running::start(&spec))
        .await
        .unwrap();
    a.signal("-STOP");
    // While A is paused its lease runs out (its heartbeat is paused too); B takes over.
    tokio::time::sleep(lease + Duration::from_millis(300)).await;
    let effects = site.effects.clone();
    let (b, report) =
        idem::metrics::observe(Call::new(biz, key).lease(lease).run(&*site.store, async {
            effect(&effects, biz, key, "B").await?;
            Ok::<_, IdemError>("B".to_owned())
        }))
        .await;
    assert_eq!(b.unwrap(), "B");
    assert_eq!(report.unwrap().outcome, Outcome::TakenOver);
    // A resumes and finishes its body: it is told it lost the claim.
    a.signal("-CONT");
    let said = tokio::task::spawn_blocking(move || {
        writeln!(a.stdin, "go").unwrap();
        let said = a.wait_for("RESULT");
        a.child.wait().unwrap();
        said
    })
    .await
    .unwrap();
    assert_eq!(said, "RESULT lease-lost");
    // The stored result is B's: a repeat replays it, and A's is never seen.
    let (again, report) = idem::metrics::observe(
        Call::new(biz, key)
            .lease(lease)
            .run(&*site.store, async { Ok::<_, IdemError>("C".to_owned()) }),
    )
    .await;
    assert_eq!(again.unwrap(), "B");
    assert_eq!(report.unwrap().outcome, Outcome::Replayed);
    // Both bodies ran (a paused process cannot be un-run); only B's result was stored.
    assert_eq!(effects_of(&site.effects, biz, key).await, ["B", "A"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_killed_between_claim_and_mark() {
    if std::env::var("IDEM_CRASH_CHILD").is_ok() {
        return;
    }
    killed_between_claim_and_mark(sqlite_site().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_killed_mid_transaction() {
    if std::env::var("IDEM_CRASH_CHILD").is_ok() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("records.db");
    let store = Arc::new(SqliteStore::open(&path).await.unwrap());
    store.migrate().await.unwrap();
    // Effects live in the records' database, written inside the call's transaction.
    let effects = effects_pool(&path).await;
    let site = Site {
        backend: Backend::Sqlite { path: path.clone() },
        store: store.clone(),
        effects_path: path,
        effects: effects.clone(),
        _dir: dir,
    };
    let (biz, lease) = ("CRASHTX", Duration::from_secs(60));
    // One child at a time: an SQLite write transaction holds the database's write lock.
    site.kill_trials(biz, lease, Act::HoldTx, 1, async |key| {
        // The transaction died with its process: no record, no effect...
        assert!(store.load(biz, key).await.unwrap().is_none(), "{key}");
        assert!(effects_of(&effects, biz, key).await.is_empty(), "{key}");
        // ...and the next caller runs at once, without waiting for any lease.
        let mut tx = store.begin().await.unwrap();
        let (ran, report) = idem::metrics::observe(Call::new(biz, key).lease(lease).run_in_tx(
            &mut tx,
            async |tx| {
                sqlx::query("INSERT INTO effects (biz, k, who) VALUES (?, ?, 'next')")
                    .bind(biz)
                    .bind(key)
                    .execute(&mut **tx)
                    .await
                    .map_err(IdemError::store)?;
                Ok::<_, IdemError>(1)
            },
        ))
        .await;
        tx.commit().await.unwrap();
        assert_eq!(ran.unwrap(), 1);
        assert_eq!(report.unwrap().outcome, Outcome::Executed, "{key}");
        assert_eq!(effects_of(&effects, biz, key).await, ["next"], "{key}");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_killed_after_its_effect() {
    if std::env::var("IDEM_CRASH_CHILD").is_ok() {
        return;
    }
    killed_after_its_effect(sqlite_site().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_killed_between_steps() {
    if std::env::var("IDEM_CRASH_CHILD").is_ok() {
        return;
    }
    killed_between_steps(sqlite_site().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_paused_past_the_lease() {
    if std::env::var("IDEM_CRASH_CHILD").is_ok() {
        return;
    }
    paused_past_the_lease(sqlite_site().await).await;
}

/// libfaketime's preload library (`IDEM_LIBFAKETIME`, or Debian's path), if installed.
fn libfaketime() -> Option<String> {
    let path = std::env::var("IDEM_LIBFAKETIME")
        .unwrap_or_else(|_| "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1".to_owned());
    std::path::Path::new(&path).exists().then_some(path)
}

/// Runs one whole call in a child (its spec adjusted by `spec_of`); its `RESULT` line.
#[cfg(any(feature = "redis", feature = "postgres", feature = "mysql"))]
async fn once_at(site: &Site, biz: &str, key: &str, spec_of: impl Fn(Spec) -> Spec) -> String {
    let spec = spec_of(site.spec(biz, key, Duration::from_secs(2), Act::Once));
    tokio::task::spawn_blocking(move || {
        let mut child = Running::spawn(&spec);
        let said = child.wait_for("RESULT");
        child.child.wait().unwrap();
        said
    })
    .await
    .unwrap()
}

/// Callers 10 minutes behind and ahead of the store see the same outcomes as on a true clock: a
/// live claim is in progress for both, it expires after its lease (not 10 minutes early or late),
/// a record within its TTL replays for both.
#[cfg(any(feature = "redis", feature = "postgres", feature = "mysql"))]
async fn skewed_clocks_change_no_outcome(site: Site) {
    if libfaketime().is_none() {
        assert!(
            !contract::server::required(),
            "libfaketime is missing (apt-get install faketime) and IDEM_REQUIRE_SERVICES=1"
        );
        eprintln!("skipped: libfaketime is not installed (apt-get install faketime)");
        return;
    }
    let (biz, key) = ("SKEW", "order-1");
    let lease = Duration::from_secs(2);
    // A short TTL: a caller deciding by its own clock 10 minutes ahead would find it expired.
    let ttl = Duration::from_secs(300);
    let skewed = |skew: &'static str| {
        move |mut spec: Spec| {
            spec.lease_ms = lease.as_millis() as u64;
            spec.ttl_ms = ttl.as_millis() as u64;
            spec.skew = Some(skew.to_owned());
            spec
        }
    };
    // A, 10 minutes behind, claims and hangs.
    let mut hold = skewed("-10m")(site.spec(biz, key, lease, Act::Hold));
    hold.ttl_ms = ttl.as_millis() as u64;
    let a = tokio::task::spawn_blocking(move || Running::start(&hold))
        .await
        .unwrap();
    // B, 10 minutes ahead, finds the claim live (by its own clock A's lease ended 10 minutes ago).
    let said = once_at(&site, biz, key, skewed("+10m")).await;
    assert!(
        said.starts_with("RESULT in_progress error a call with this key is still in progress"),
        "{said}"
    );
    a.kill();
    tokio::time::sleep(lease + Duration::from_millis(300)).await;
    // After the lease (by the store's clock) B takes over, once.
    assert_eq!(
        once_at(&site, biz, key, skewed("+10m")).await,
        "RESULT taken_over +10m"
    );
    // C, 10 minutes behind, and a caller on the true clock replay B's result.
    assert_eq!(
        once_at(&site, biz, key, skewed("-10m")).await,
        "RESULT replayed +10m"
    );
    assert_eq!(
        once_at(&site, biz, key, |s| s).await,
        "RESULT replayed +10m"
    );
    assert_eq!(effects_of(&site.effects, biz, key).await, ["+10m"]);
}

/// Server-store children killed inside their transaction (claim and effect written, not
/// committed), 10 at a time: the server rolls each back when its connection dies, and the next
/// caller runs at once.
macro_rules! server_killed_mid_transaction {
    ($name:ident, $feature:literal, $site:ident, $Backend:ident, $open:ident, $insert:literal, $count:literal) => {
        #[cfg(feature = $feature)]
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $name() {
            if std::env::var("IDEM_CRASH_CHILD").is_ok() {
                return;
            }
            let Some(site) = $site().await else {
                return;
            };
            let Backend::$Backend { url, table } = site.backend.clone() else {
                unreachable!()
            };
            let store = $open(&url, &table).await;
            let (biz, lease) = ("CRASHTX", Duration::from_secs(60));
            let insert = format!($insert, table = table);
            let count = format!($count, table = table);
            site.kill_trials(biz, lease, Act::HoldTx, 10, async |key| {
                let mut tx = store.begin().await.unwrap();
                let (ran, report) = idem::metrics::observe(
                    Call::new(biz, key)
                        .lease(lease)
                        .run_in_tx(&mut tx, async |tx| {
                            sqlx::query(sqlx::AssertSqlSafe(insert.clone()))
                                .bind(biz)
                                .bind(key)
                                .execute(&mut **tx)
                                .await
                                .map_err(IdemError::store)?;
                            Ok::<_, IdemError>(1)
                        }),
                )
                .await;
                tx.commit().await.unwrap();
                // No record and no effect survived the child: this caller ran at once, first.
                assert_eq!(ran.unwrap(), 1, "{key}");
                assert_eq!(report.unwrap().outcome, Outcome::Executed, "{key}");
                let effects: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(count.clone()))
                    .bind(biz)
                    .bind(key)
                    .fetch_one(store.pool())
                    .await
                    .unwrap();
                assert_eq!(effects, 1, "{key}");
            })
            .await;
        }
    };
}

server_killed_mid_transaction!(
    postgres_killed_mid_transaction,
    "postgres",
    pg_site,
    Postgres,
    pg_store,
    "INSERT INTO {table}_fx (biz, k, who) VALUES ($1, $2, 'next')",
    "SELECT COUNT(*) FROM {table}_fx WHERE biz = $1 AND k = $2"
);

server_killed_mid_transaction!(
    mysql_killed_mid_transaction,
    "mysql",
    my_site,
    MySql,
    my_store,
    "INSERT INTO {table}_fx (biz, k, who) VALUES (?, ?, 'next')",
    "SELECT COUNT(*) FROM {table}_fx WHERE biz = ? AND k = ?"
);

on_server! {
    feature = "redis": redis_killed_between_claim_and_mark = killed_between_claim_and_mark on redis_site;
    feature = "redis": redis_paused_past_the_lease = paused_past_the_lease on redis_site;
    feature = "redis": redis_killed_after_its_effect = killed_after_its_effect on redis_site;
    feature = "postgres": postgres_killed_after_its_effect = killed_after_its_effect on pg_site;
    feature = "mysql": mysql_killed_after_its_effect = killed_after_its_effect on my_site;
    feature = "redis": redis_killed_between_steps = killed_between_steps on redis_site;
    feature = "postgres": postgres_killed_between_steps = killed_between_steps on pg_site;
    feature = "mysql": mysql_killed_between_steps = killed_between_steps on my_site;
    feature = "redis": redis_skewed_clocks_change_no_outcome = skewed_clocks_change_no_outcome on redis_site;
    feature = "postgres": postgres_killed_between_claim_and_mark = killed_between_claim_and_mark on pg_site;
    feature = "postgres": postgres_paused_past_the_lease = paused_past_the_lease on pg_site;
    feature = "postgres": postgres_skewed_clocks_change_no_outcome = skewed_clocks_change_no_outcome on pg_site;
    feature = "mysql": mysql_killed_between_claim_and_mark = killed_between_claim_and_mark on my_site;
    feature = "mysql": mysql_paused_past_the_lease = paused_past_the_lease on my_site;
    feature = "mysql": mysql_skewed_clocks_change_no_outcome = skewed_clocks_change_no_outcome on my_site;
}
