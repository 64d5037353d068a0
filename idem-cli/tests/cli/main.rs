//! The real `idem` binary against SQLite (a temp file), MariaDB (`IDEM_MYSQL_URL`), Postgres
//! (`IDEM_PG_URL`) and Redis (`IDEM_REDIS_URL`): every command on each, on records made through
//! the library in a table, file or key prefix of the test's own (dropped after, also when the test
//! fails); and `idem release` racing a takeover claim, one winner each time. A server that cannot
//! be reached is one skip line, or a failure under `IDEM_REQUIRE_SERVICES=1`.
//!
//! `commands` runs every command on a store, `race` the release against a takeover, `usage` what
//! needs no server; the stores, the runs of the binary and the records they read are here.

#[path = "../../../tests/tests/contract/server.rs"]
mod server;

use std::process::{Command, Output};
use std::time::Duration;

use idem::{
    Call, IdemError, Store,
    store::{Acquired, Claim, ClaimOutcome, ClaimRequest, Status},
};

use commands::every_command;
use race::release_races_a_takeover;

/// One store under test: its URL (with the test's own table or prefix) and how to clean up.
struct Target {
    name: &'static str,
    url: String,
    /// The records' table (SQL servers) or key prefix (Redis), for the DDL and the clean-up.
    place: String,
    _cleanup: Cleanup,
}

/// Drops the test's tables or keys when dropped, even when the test panicked.
enum Cleanup {
    /// The temp folder, deleted with it.
    File(#[allow(dead_code)] tempfile::TempDir),
    MySql {
        base: String,
        table: String,
    },
    Postgres {
        base: String,
        table: String,
    },
    Redis {
        base: String,
        prefix: String,
    },
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        let work = match self {
            Cleanup::File(_) => return,
            Cleanup::MySql { base, table } => {
                let (base, table) = (base.clone(), table.clone());
                Box::new(move || drop_tables(&base, &table, true)) as Box<dyn FnOnce() + Send>
            }
            Cleanup::Postgres { base, table } => {
                let (base, table) = (base.clone(), table.clone());
                Box::new(move || drop_tables(&base, &table, false))
            }
            Cleanup::Redis { base, prefix } => {
                let (base, prefix) = (base.clone(), prefix.clone());
                Box::new(move || delete_keys(&base, &prefix))
            }
        };
        // A thread of its own: this may run inside the test's runtime, or while it unwinds.
        let _ = std::thread::spawn(work).join();
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn drop_tables(base: &str, table: &str, mysql: bool) {
    use idem::sqlx::{AssertSqlSafe, raw_sql};
    runtime().block_on(async {
        for t in [table.to_owned(), format!("{table}_tok")] {
            let sql = if mysql {
                format!("DROP TABLE IF EXISTS `{t}`")
            } else {
                format!("DROP TABLE IF EXISTS \"{t}\"")
            };
            if mysql {
                if let Ok(pool) = idem::sqlx::MySqlPool::connect(base).await {
                    let _ = raw_sql(AssertSqlSafe(sql)).execute(&pool).await;
                }
            } else if let Ok(pool) = idem::sqlx::PgPool::connect(base).await {
                let _ = raw_sql(AssertSqlSafe(sql)).execute(&pool).await;
            }
        }
    });
}

fn delete_keys(base: &str, prefix: &str) {
    runtime().block_on(async {
        let Ok(client) = ::redis::Client::open(base) else {
            return;
        };
        let Ok(mut conn) = client.get_multiplexed_async_connection().await else {
            return;
        };
        let keys: Vec<String> = ::redis::cmd("KEYS")
            .arg(format!("{prefix}*"))
            .query_async(&mut conn)
            .await
            .unwrap_or_default();
        for key in keys {
            let _: Result<i64, _> = ::redis::cmd("DEL").arg(key).query_async(&mut conn).await;
        }
    });
}

async fn sqlite() -> Option<Target> {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite:{}", dir.path().join("idem.db").display());
    Some(Target {
        name: "sqlite",
        url,
        place: "idem_record".to_owned(),
        _cleanup: Cleanup::File(dir),
    })
}

async fn mysql() -> Option<Target> {
    let base = server::mysql_url();
    // `idem_<…>_<pid>_<n>`: the MySQL suites drop such tables once this process is gone.
    let table = server::unique("idem_cli");
    let url = format!("{base}?idem_table={table}");
    server::reach("MariaDB", &base, idem::connect(&url)).await?;
    Some(Target {
        name: "mysql",
        url,
        place: table.clone(),
        _cleanup: Cleanup::MySql { base, table },
    })
}

async fn postgres() -> Option<Target> {
    let base = server::pg_url();
    // `idemt_<pid>_<n>`: the Postgres suites drop such tables once this process is gone.
    let table = server::unique("idemt");
    let url = format!("{base}?idem_table={table}");
    server::reach("Postgres", &base, idem::connect(&url)).await?;
    Some(Target {
        name: "postgres",
        url,
        place: table.clone(),
        _cleanup: Cleanup::Postgres { base, table },
    })
}

async fn redis_target() -> Option<Target> {
    let base = server::redis_url();
    let prefix = format!("{}:", server::unique("idemcli"));
    let url = format!("{base}?idem_prefix={}", prefix.replace(':', "%3A"));
    server::reach("Redis", &base, idem::connect(&url)).await?;
    Some(Target {
        name: "redis",
        url,
        place: prefix.clone(),
        _cleanup: Cleanup::Redis { base, prefix },
    })
}

/// What a run of the binary gave.
struct Ran {
    code: i32,
    stdout: String,
    stderr: String,
}

impl std::fmt::Debug for Ran {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "exit {}\n--- stdout\n{}--- stderr\n{}",
            self.code, self.stdout, self.stderr
        )
    }
}

fn ran(out: Output) -> Ran {
    Ran {
        code: out.status.code().expect("exited"),
        stdout: String::from_utf8(out.stdout).unwrap(),
        stderr: String::from_utf8(out.stderr).unwrap(),
    }
}

fn idem_cmd(url: &str, args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_idem"));
    cmd.env_remove("IDEM_STORE_URL")
        .arg("--url")
        .arg(url)
        .args(args);
    cmd
}

/// Runs `idem args…` without `--url`, with `IDEM_STORE_URL` set to `env_url` or unset, to its
/// end (off the async threads).
async fn idem_bare(args: &[&str], env_url: Option<&str>) -> Ran {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_idem"));
    match env_url {
        Some(url) => cmd.env("IDEM_STORE_URL", url),
        None => cmd.env_remove("IDEM_STORE_URL"),
    };
    cmd.args(args);
    tokio::task::spawn_blocking(move || ran(cmd.output().unwrap()))
        .await
        .unwrap()
}

/// Runs `idem --url URL args…` to its end (off the async threads).
async fn idem(url: &str, args: &[&str]) -> Ran {
    let mut cmd = idem_cmd(url, args);
    tokio::task::spawn_blocking(move || ran(cmd.output().unwrap()))
        .await
        .unwrap()
}

fn req<'a>(biz: &'a str, key: &'a str, lease: Duration, ttl: Duration) -> ClaimRequest<'a> {
    ClaimRequest {
        biz,
        key,
        fingerprint: None,
        lease,
        ttl,
    }
}

async fn acquire(store: &dyn Store, r: &ClaimRequest<'_>) -> (Claim, Acquired) {
    match store.claim(r).await.unwrap() {
        ClaimOutcome::Acquired { claim, how } => (claim, how),
        other => panic!("expected to acquire ({}, {}), got {other:?}", r.biz, r.key),
    }
}

const HOUR: Duration = Duration::from_secs(3600);

/// The fingerprint the HTTP layer keeps for a request to the route `POST /orders/{id}`: the route,
/// then the digest.
const LAYER_FINGERPRINT: &str =
    "POST /orders/{id} 0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

/// A PROCESSING record whose lease ended now (its holder gave it up without finishing): stuck.
/// Its fingerprint is an HTTP layer request's, so the listing shows where it came from.
async fn stuck_record(store: &dyn Store, biz: &str, key: &str) -> Claim {
    let mut r = req(biz, key, Duration::from_secs(60), HOUR);
    r.fingerprint = Some(LAYER_FINGERPRINT);
    let (claim, _) = acquire(store, &r).await;
    store.release(biz, key, &claim).await.unwrap();
    claim
}

macro_rules! on_every_store {
    ($($name:ident => $target:ident),* $(,)?) => {$(
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn every_command() {
                if let Some(t) = super::$target().await {
                    super::every_command(t).await;
                }
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn release_races_a_takeover() {
                if let Some(t) = super::$target().await {
                    super::release_races_a_takeover(t).await;
                }
            }
        }
    )*};
}

on_every_store!(
    sqlite => sqlite,
    mariadb => mysql,
    postgres => postgres,
    redis => redis_target,
);

mod commands;
mod race;
mod reshard;
mod usage;
