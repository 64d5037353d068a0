//! Processes that die or stall while they hold a claim, on every store that outlives a process
//! (SQLite; Redis with feature `redis`; Postgres and MySQL / MariaDB with their features;
//! DynamoDB with feature `dynamodb`, on the DynamoDB-compatible server at `IDEM_DYNAMO_URL`, in
//! lease mode, the only mode it has).
//!
//! - SIGKILL between claim and mark, 100 trials per store: before the lease ends every other
//!   caller is told "in progress"; after it, of 8 callers released together exactly one takes over
//!   and runs the business once (counted in an independent effects table).
//! - SIGKILL after the body's effect and before its mark, 20 trials per store: after the lease a
//!   repeat with a recover fn finds the effect and replays it (no second effect); without one the
//!   takeover runs the body again, as documented for lease mode alone.
//!   The same through `#[idempotent(recover = …)]` (SQLite, 10 trials), and through the HTTP
//!   layer: a service killed after its handler's effect, restarted on the same records (4 trials
//!   per store, half with the layer's `recover`); the same through the gRPC layer with a tonic
//!   client (grpc.rs).
//! - SIGKILL while a consumer holds a batch (`Inbox::handle_batch`, 6 keys per store): right after
//!   its batch claim, and after every body's effect with the batch's marks held back. Nothing is
//!   marked done; until the leases end another batch is told "in progress"; then two batches
//!   released together take each key over once (batch.rs).
//! - SIGKILL between two recovery points (`idem::step`), 10 trials per store: a 3-step body dies
//!   after step two; the takeover gets steps one and two from the record and runs step three only,
//!   and each step's downstream key (`idem::steps::step_key`) is the same in both attempts, checked by a
//!   fake external API (the effects table) that counts calls per key.
//! - A service with the layer in transaction mode SIGKILLed mid-handler (its order inserted through
//!   the layer's transaction, not committed), 3 trials per SQL store: no order and no record are
//!   left, and the retry at a restarted service runs at once and creates exactly one; the same
//!   through the gRPC layer.
//! - SIGKILL mid-transaction (tx mode), 100 trials: the claim and the business write die with the
//!   transaction: no record, no effect, and the next caller runs at once.
//! - SIGSTOP past the lease: a paused holder (heartbeat and all) is taken over; resumed, it gets
//!   `LeaseLost`, and the stored result is the newer attempt's.
//! - Clock skew: children whose clocks are 10 minutes behind and ahead (libfaketime) claim, wait,
//!   take over and replay exactly as on a true clock, because the store decides by its own clock.
//!   (Not SQLite: there the store's clock is the process's own, see docs/RELIABILITY.md; nor
//!   DynamoDB, whose callers decide by their own clocks within a skew margin.)
//!
//! The dying process is this test binary run again as a child (`child` below, which does nothing
//! unless `IDEM_CRASH_CHILD` is set).
//!
//! One module per kind of trial (`lease`, `steps`, `attribute`, `service`, `mid_transaction`,
//! `skew`), over the child, its specs and the sites here.

#[path = "../contract/mod.rs"]
mod contract;
#[cfg(feature = "grpc")]
#[path = "../support/grpc_shop.rs"]
mod grpc_shop;
#[cfg(feature = "mysql")]
#[path = "../support/mysql_leftovers.rs"]
mod mysql_leftovers;
#[cfg(feature = "postgres")]
#[path = "../support/postgres.rs"]
mod pg;
#[cfg(feature = "axum")]
#[path = "../support/tx_orders.rs"]
mod tx_orders;

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use idem::metrics::Outcome;
use idem::sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePool};
use idem::sqlx::{self, Row};
use idem::{Call, IdemError, SqliteStore, Store, store::Status};
use serde::{Deserialize, Serialize};
use tokio::sync::Barrier;

use attribute::{attribute_site, charge};
#[cfg(feature = "axum")]
use service::{http_layer, http_shop, tx_service};
use steps::three_steps;

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
    /// The records in a table of their own: `url` is its `dynamodb://` store URL.
    Dynamo {
        url: String,
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
    /// Serves the gRPC layer on the site's store (says `LISTEN <port>`); its `Create` writes the
    /// effect, says READY and waits to be killed.
    ServeGrpc,
    /// Serves the gRPC layer in transaction mode on the site's SQL store (says `LISTEN <port>`);
    /// its `Create` inserts the order through the layer's transaction, says READY and waits to be
    /// killed.
    ServeGrpcTx,
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
    /// A batch of keys through `Inbox::handle_batch`: says READY after every body wrote its
    /// effect, before the batch's marks are sent, and waits to be killed.
    BatchAfterBodies,
    /// The same batch, saying READY in its first body before any effect (its claims made).
    BatchBeforeBodies,
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
        #[cfg(feature = "dynamodb")]
        Backend::Dynamo { url } => Arc::new(idem::DynamoStore::connect(url).await.unwrap()),
        #[cfg(not(feature = "dynamodb"))]
        Backend::Dynamo { .. } => unreachable!("DynamoDB trials need the `dynamodb` feature"),
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
        #[cfg(feature = "grpc")]
        Act::ServeGrpc => grpc::serve_effect_child(&spec).await,
        #[cfg(feature = "grpc")]
        Act::ServeGrpcTx => grpc::serve_tx_child(&spec).await,
        #[cfg(not(feature = "grpc"))]
        Act::ServeGrpc | Act::ServeGrpcTx => {
            unreachable!("the gRPC trials need the `grpc` feature")
        }
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
        Act::BatchAfterBodies => batch::hold_a_batch(&spec, false).await,
        Act::BatchBeforeBodies => batch::hold_a_batch(&spec, true).await,
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
    let url = contract::server::redis_url();
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
    let url = contract::server::mysql_url();
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

/// DynamoDB records in a table of this test alone (`idemc_<pid>_<n>`, which `migrate()` creates)
/// on the DynamoDB-compatible server at `IDEM_DYNAMO_URL`.
#[cfg(feature = "dynamodb")]
async fn dynamo_site() -> Option<Site> {
    let endpoint = contract::server::dynamo_url();
    let url = format!(
        "dynamodb://{}?endpoint={endpoint}",
        contract::server::unique("idemc")
    );
    let store = contract::server::reach("DynamoDB", &endpoint, async {
        let store = idem::DynamoStore::connect(&url).await?;
        store.migrate().await?;
        Ok::<_, IdemError>(store)
    })
    .await?;
    let dir = tempfile::tempdir().unwrap();
    let effects_path = dir.path().join("effects.db");
    Some(Site {
        backend: Backend::Dynamo { url },
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

/// libfaketime's preload library (`IDEM_LIBFAKETIME`, or Debian's path), if installed.
fn libfaketime() -> Option<String> {
    let path = std::env::var("IDEM_LIBFAKETIME")
        .unwrap_or_else(|_| "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1".to_owned());
    std::path::Path::new(&path).exists().then_some(path)
}

mod attribute;
mod batch;
#[cfg(feature = "grpc")]
mod grpc;
mod lease;
mod mid_transaction;
#[cfg(feature = "axum")]
mod service;
#[cfg(any(feature = "redis", feature = "postgres", feature = "mysql"))]
mod skew;
mod steps;
