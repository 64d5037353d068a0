//! What a Postgres failover keeps (docs/RELIABILITY.md, "Postgres: failover"), on a primary and a
//! streaming replica this test starts itself (initdb, pg_basebackup, promote): with asynchronous
//! replication a call finished on the primary alone is forgotten by the promoted replica and runs
//! again; with synchronous replication (`synchronous_standby_names`, `synchronous_commit = on`)
//! every claim and mark the store acknowledged is on the replica, so after the promotion every
//! finished call replays, and a call whose commit the replica never confirmed answered
//! `StoreUnavailable` (its store timeout) without running its body.
//!
//! The replica is partitioned away deterministically: frozen (SIGSTOP), and its WAL sender on the
//! primary terminated, so nothing written afterwards reaches it. "Ran again" is counted in an
//! independent side-effect table, never by idem's counters.

mod contract;
#[path = "support/failover.rs"]
mod failover;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use contract::Effects;
use failover::pay;
use idem::sqlx::{self, Connection, PgConnection};
use idem::{IdemError, PgStore};

/// The server binaries of the installed Postgres (`/usr/lib/postgresql/<major>/bin`).
fn bin_dir() -> Option<PathBuf> {
    let mut majors: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path().join("bin")))
        .filter(|bin| bin.join("initdb").exists() && bin.join("pg_basebackup").exists())
        .collect();
    majors.sort();
    majors.pop()
}

/// Whether this machine can start private Postgres servers (its binaries, a `postgres` user to run
/// them as); one skip line when not, a failure under `IDEM_REQUIRE_SERVICES=1`.
fn tools() -> Option<PathBuf> {
    let found = bin_dir().filter(|_| {
        Command::new("runuser")
            .args(["-u", "postgres", "--", "true"])
            .status()
            .is_ok_and(|s| s.success())
    });
    if found.is_none() {
        assert!(
            std::env::var("IDEM_REQUIRE_SERVICES").as_deref() != Ok("1"),
            "Postgres server binaries or the postgres user are missing and IDEM_REQUIRE_SERVICES=1"
        );
        eprintln!(
            "skipped: no Postgres server binaries (initdb, pg_basebackup) to run as postgres"
        );
    }
    found
}

/// Runs `bin/<tool> args` as the `postgres` user; panics with its output when it fails.
fn run(bin: &Path, tool: &str, args: &[&str]) {
    let out = Command::new("runuser")
        .args(["-u", "postgres", "--"])
        .arg(bin.join(tool))
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{tool} {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A free loopback port from `base`, picked by the process id.
fn port(base: u16) -> u16 {
    let pid = std::process::id() as u16;
    (0..900u16)
        .map(|k| base + (pid.wrapping_add(k) % 900))
        .find(|&p| std::net::TcpListener::bind(("127.0.0.1", p)).is_ok())
        .expect("a free port")
}

/// One private server: its data directory, port and postmaster pid.
struct Server {
    bin: PathBuf,
    data: PathBuf,
    port: u16,
}

impl Server {
    fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    fn start(&self) {
        let log = self.data.with_extension("log");
        run(
            &self.bin,
            "pg_ctl",
            &[
                "-D",
                self.data.to_str().unwrap(),
                "-l",
                log.to_str().unwrap(),
                "-w",
                "-o",
                &format!("-p {} -k /tmp -c listen_addresses=127.0.0.1", self.port),
                "start",
            ],
        );
    }

    fn pid(&self) -> i32 {
        let text = std::fs::read_to_string(self.data.join("postmaster.pid")).unwrap();
        text.lines().next().unwrap().trim().parse().unwrap()
    }

    fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args([signal, &self.pid().to_string()])
            .status()
            .unwrap();
        assert!(status.success(), "kill {signal}");
    }

    /// Stops the server whatever state it is in (a test that failed midway leaves none behind).
    fn stop(&self) {
        let _ = Command::new("runuser")
            .args(["-u", "postgres", "--"])
            .arg(self.bin.join("pg_ctl"))
            .args(["-D", self.data.to_str().unwrap(), "-m", "immediate", "stop"])
            .output();
    }
}

/// A primary and a streaming replica, both stopped and removed when dropped.
struct Pair {
    primary: Server,
    replica: Server,
    dir: PathBuf,
}

impl Drop for Pair {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-CONT", &self.replica.pid().to_string()])
            .status();
        self.primary.stop();
        self.replica.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Starts a primary on a fresh cluster (replication allowed from loopback, `synchronous` or not)
/// and a replica streaming from it, and waits until the replica streams.
async fn pair(bin: &Path, name: &str, synchronous: bool) -> Pair {
    // Each test its own range of ports: they run at once.
    let base = if synchronous { 27_100 } else { 25_300 };
    let dir = std::env::temp_dir().join(format!("idem-pgfo-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let chown = Command::new("chown")
        .args(["postgres:postgres", dir.to_str().unwrap()])
        .status()
        .unwrap();
    assert!(chown.success());
    let primary = Server {
        bin: bin.to_owned(),
        data: dir.join("primary"),
        port: port(base),
    };
    run(
        bin,
        "initdb",
        &[
            "-D",
            primary.data.to_str().unwrap(),
            "-A",
            "trust",
            "-U",
            "postgres",
            "--no-sync",
        ],
    );
    let conf = format!(
        "\nwal_level = replica\nmax_wal_senders = 4\nfsync = off\nsynchronous_commit = on\n\
         synchronous_standby_names = '{}'\n",
        if synchronous { "*" } else { "" }
    );
    append(&primary.data.join("postgresql.conf"), &conf);
    append(
        &primary.data.join("pg_hba.conf"),
        "\nhost replication postgres 127.0.0.1/32 trust\n",
    );
    primary.start();
    let replica = Server {
        bin: bin.to_owned(),
        data: dir.join("replica"),
        port: port(base + 900),
    };
    run(
        bin,
        "pg_basebackup",
        &[
            "-h",
            "127.0.0.1",
            "-p",
            &primary.port.to_string(),
            "-U",
            "postgres",
            "-D",
            replica.data.to_str().unwrap(),
            "-R",
            "-X",
            "stream",
        ],
    );
    replica.start();
    let pair = Pair {
        primary,
        replica,
        dir,
    };
    // Streaming (and, when synchronous, the synchronous standby) before anything is written.
    let mut conn = PgConnection::connect(&pair.primary.url()).await.unwrap();
    for _ in 0..200 {
        let state: Option<String> = sqlx::query_scalar(
            "SELECT sync_state FROM pg_stat_replication WHERE state = 'streaming'",
        )
        .fetch_optional(&mut conn)
        .await
        .unwrap();
        if state.is_some_and(|s| !synchronous || s == "sync") {
            return pair;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the replica of {name} does not stream");
}

fn append(path: &Path, text: &str) {
    use std::io::Write;
    let mut file = std::fs::OpenOptions::new().append(true).open(path).unwrap();
    file.write_all(text.as_bytes()).unwrap();
}

/// Partitions the replica away (frozen, its WAL sender gone), then finishes calls on the primary,
/// kills the primary, promotes the replica and repeats every call there: how many effects each
/// key has in the end, for the keys `before` (finished while the replica streamed) and `after`
/// (tried while it was cut off), and what the calls cut off answered.
async fn failover(pair: &Pair) -> (Effects, Vec<Result<String, IdemError>>) {
    let fx = Effects::new().await;
    let store = PgStore::builder()
        .connect_timeout(Duration::from_secs(2))
        .connect(&pair.primary.url())
        .await
        .unwrap();
    store.migrate().await.unwrap();
    for k in 0..8 {
        pay(&store, &fx, &format!("before-{k}")).await.unwrap();
    }
    pair.replica.signal("-STOP");
    let mut admin = PgConnection::connect(&pair.primary.url()).await.unwrap();
    sqlx::query("SELECT pg_terminate_backend(pid) FROM pg_stat_replication")
        .execute(&mut admin)
        .await
        .unwrap();
    let mut cut_off = Vec::new();
    for k in 0..8 {
        cut_off.push(pay(&store, &fx, &format!("after-{k}")).await);
    }
    pair.primary.signal("-KILL");
    pair.replica.signal("-CONT");
    run(
        &pair.replica.bin,
        "pg_ctl",
        &["-D", pair.replica.data.to_str().unwrap(), "-w", "promote"],
    );
    // The promoted server has the primary's configuration (from the base backup) and no standby
    // of its own yet: it commits on its own, as a promoted server does until a new replica joins.
    let mut admin = PgConnection::connect(&pair.replica.url()).await.unwrap();
    for sql in [
        "ALTER SYSTEM SET synchronous_standby_names = ''",
        "SELECT pg_reload_conf()",
    ] {
        sqlx::raw_sql(sql).execute(&mut admin).await.unwrap();
    }
    let promoted = PgStore::connect(&pair.replica.url()).await.unwrap();
    for k in 0..8 {
        for key in [format!("before-{k}"), format!("after-{k}")] {
            assert_eq!(
                pay(&promoted, &fx, &key).await.unwrap(),
                format!("receipt for {key}"),
                "{key}"
            );
        }
    }
    (fx, cut_off)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn asynchronous_replication_forgets_what_the_replica_never_got() {
    let Some(bin) = tools() else {
        return;
    };
    let pair = pair(&bin, "async", false).await;
    let (fx, cut_off) = failover(&pair).await;
    failover::forgotten(&fx, &cut_off).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn synchronous_replication_keeps_every_acknowledged_call() {
    let Some(bin) = tools() else {
        return;
    };
    let pair = pair(&bin, "sync", true).await;
    let (fx, cut_off) = failover(&pair).await;
    failover::kept(&fx, &cut_off).await;
}
