//! What a MariaDB failover keeps (docs/RELIABILITY.md, "MySQL / MariaDB: failover"), on a primary
//! and a replica this test starts itself (`mariadb-install-db`, binary-log replication, GTID):
//! with asynchronous replication a call finished on the primary alone is forgotten by the promoted
//! replica and runs again; with semi-synchronous replication (`rpl_semi_sync_master_enabled`,
//! `rpl_semi_sync_master_wait_point = AFTER_SYNC`, a timeout longer than any call) every claim and
//! mark the store acknowledged is on the replica, so after the promotion every finished call
//! replays, and a call the replica never acknowledged answered `StoreUnavailable` (its store
//! timeout) without running its body.
//!
//! The replica is partitioned away deterministically: frozen (SIGSTOP), and its binlog dump
//! thread on the primary killed, so nothing written afterwards reaches it. "Ran again" is counted
//! in an independent side-effect table, never by idem's counters.

mod contract;
#[path = "support/failover.rs"]
mod failover;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use contract::Effects;
use failover::pay;
use idem::{IdemError, MySqlStore};

/// Whether this machine can start private MariaDB servers; one skip line when not, a failure
/// under `IDEM_REQUIRE_SERVICES=1`.
fn installed() -> bool {
    let found = ["mariadbd", "mariadb-install-db", "mariadb"]
        .iter()
        .all(|bin| {
            Command::new(bin)
                .arg("--version")
                .output()
                .is_ok_and(|o| o.status.success())
        });
    if !found {
        assert!(
            std::env::var("IDEM_REQUIRE_SERVICES").as_deref() != Ok("1"),
            "mariadbd / mariadb-install-db / mariadb are not installed and IDEM_REQUIRE_SERVICES=1"
        );
        eprintln!("skipped: mariadbd / mariadb-install-db / mariadb are not installed");
    }
    found
}

/// A free loopback port from `base`, picked by the process id.
fn port(base: u16) -> u16 {
    let pid = std::process::id() as u16;
    (0..900u16)
        .map(|k| base + (pid.wrapping_add(k) % 900))
        .find(|&p| std::net::TcpListener::bind(("127.0.0.1", p)).is_ok())
        .expect("a free port")
}

/// One private server.
struct Server {
    child: Child,
    dir: PathBuf,
    port: u16,
}

impl Server {
    /// Installs a data directory under `dir/name` and starts a server on it.
    fn start(dir: &Path, name: &str, port: u16, server_id: u32, extra: &[&str]) -> Server {
        let data = dir.join(name);
        // Each server's temporary files in a folder of its own, and one install at a time: two
        // bootstraps at once in one temporary folder have been seen to collide on a file name.
        let tmp = dir.join(format!("{name}-tmp"));
        std::fs::create_dir_all(&tmp).unwrap();
        static INSTALL: std::sync::Mutex<()> = std::sync::Mutex::new(());
        let out = {
            let _one = INSTALL.lock().unwrap_or_else(|p| p.into_inner());
            Command::new("mariadb-install-db")
                .args([
                    "--no-defaults",
                    &format!("--datadir={}", data.display()),
                    "--user=root",
                    "--auth-root-authentication-method=normal",
                    "--skip-test-db",
                    &format!("--tmpdir={}", tmp.display()),
                ])
                .output()
                .unwrap()
        };
        assert!(
            out.status.success(),
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let child = Command::new("mariadbd")
            .args([
                "--no-defaults".to_owned(),
                format!("--datadir={}", data.display()),
                format!("--port={port}"),
                format!("--socket={}", data.with_extension("sock").display()),
                "--bind-address=127.0.0.1".to_owned(),
                format!("--server-id={server_id}"),
                format!("--log-bin={}", dir.join(format!("{name}-bin")).display()),
                "--binlog-format=ROW".to_owned(),
                "--user=root".to_owned(),
                format!("--pid-file={}", data.with_extension("pid").display()),
                format!("--log-error={}", data.with_extension("err").display()),
                format!("--tmpdir={}", tmp.display()),
                "--innodb-flush-log-at-trx-commit=2".to_owned(),
                "--skip-name-resolve".to_owned(),
            ])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let server = Server {
            child,
            dir: data,
            port,
        };
        for _ in 0..200 {
            if server.try_sql("SELECT 1").is_some() {
                return server;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("mariadbd {name} does not answer");
    }

    /// `sql`'s output without column names (a `\G` statement's output keeps them).
    fn try_sql(&self, sql: &str) -> Option<String> {
        let bare: &[&str] = if sql.ends_with("\\G") {
            &[]
        } else {
            &["-N", "-B"]
        };
        let out = Command::new("mariadb")
            .args([
                "--no-defaults",
                "-S",
                self.dir.with_extension("sock").to_str().unwrap(),
                "-u",
                "root",
            ])
            .args(bare)
            .args(["-e", sql])
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Runs `sql` as root over the server's socket; its output.
    fn sql(&self, sql: &str) -> String {
        self.try_sql(sql)
            .unwrap_or_else(|| panic!("`{sql}` failed on the server on {}", self.port))
    }

    fn url(&self) -> String {
        format!("mysql://idem@127.0.0.1:{}/test", self.port)
    }

    fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args([signal, &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success(), "kill {signal}");
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-CONT", &self.child.id().to_string()])
            .stderr(Stdio::null())
            .status();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A primary and a replica streaming its binary log; removed when dropped.
struct Pair {
    primary: Server,
    replica: Server,
    dir: PathBuf,
}

impl Drop for Pair {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-CONT", &self.replica.child.id().to_string()])
            .stderr(Stdio::null())
            .status();
        let _ = self.primary.child.kill();
        let _ = self.replica.child.kill();
        let _ = self.primary.child.wait();
        let _ = self.replica.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Starts the pair, the replica replicating, semi-synchronously when `semi_sync` (and then only
/// once the primary counts the replica as a semi-synchronous client).
fn pair(name: &str, semi_sync: bool) -> Pair {
    let dir = std::env::temp_dir().join(format!("idem-myfo-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let base = if semi_sync { 23_100 } else { 21_300 };
    let primary = Server::start(&dir, "primary", port(base), 1, &[]);
    primary.sql(
        "CREATE DATABASE test; CREATE USER 'idem'@'%'; GRANT ALL ON *.* TO 'idem'@'%' WITH GRANT OPTION",
    );
    let replica = Server::start(
        &dir,
        "replica",
        port(base + 900),
        2,
        &["--rpl-semi-sync-slave-enabled=ON"],
    );
    replica.sql(&format!(
        "CHANGE MASTER TO MASTER_HOST='127.0.0.1', MASTER_PORT={}, MASTER_USER='idem', \
         MASTER_USE_GTID=slave_pos; START SLAVE",
        primary.port
    ));
    let pair = Pair {
        primary,
        replica,
        dir,
    };
    let streaming = || {
        let status = pair.replica.sql("SHOW SLAVE STATUS\\G");
        status.contains("Slave_IO_Running: Yes") && status.contains("Slave_SQL_Running: Yes")
    };
    wait_until(&format!("{name}: the replica replicates"), streaming);
    if semi_sync {
        pair.primary.sql(
            "SET GLOBAL rpl_semi_sync_master_wait_point = 'AFTER_SYNC'; \
             SET GLOBAL rpl_semi_sync_master_timeout = 100000000; \
             SET GLOBAL rpl_semi_sync_master_enabled = ON",
        );
        // The replica registers as semi-synchronous when its I/O thread connects.
        pair.replica
            .sql("STOP SLAVE IO_THREAD; START SLAVE IO_THREAD");
        wait_until(&format!("{name}: the replica acknowledges"), || {
            pair.primary
                .sql("SHOW STATUS LIKE 'Rpl_semi_sync_master_clients'")
                .trim()
                .ends_with('1')
        });
    }
    pair
}

fn wait_until(what: &str, done: impl Fn() -> bool) {
    for _ in 0..200 {
        if done() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("{what}: not within 10 s");
}

/// Promotes the replica as a failover tool does: its I/O thread stopped, everything it received
/// applied (`MASTER_GTID_WAIT` on its `Gtid_IO_Pos`), then replication removed. Stopping the SQL
/// thread first would drop what the replica received but had not applied yet (the relay log),
/// acknowledged or not.
fn promote(replica: &Server) {
    replica.sql("STOP SLAVE IO_THREAD");
    let status = replica.sql("SHOW SLAVE STATUS\\G");
    let received = status
        .lines()
        .find_map(|l| l.trim().strip_prefix("Gtid_IO_Pos:"))
        .map(str::trim)
        .unwrap_or_default()
        .to_owned();
    let applied = replica.sql(&format!("SELECT MASTER_GTID_WAIT('{received}', 60)"));
    assert_eq!(
        applied.trim(),
        "0",
        "the replica applied {received} within 60 s"
    );
    replica.sql("STOP SLAVE; RESET SLAVE ALL");
}

/// 8 calls while the replica replicates, the replica cut off, 8 more calls, the primary killed,
/// the replica promoted, all 16 repeated there: the effects, and what the cut-off calls answered.
async fn failover(pair: &Pair) -> (Effects, Vec<Result<String, IdemError>>) {
    let fx = Effects::new().await;
    let store = MySqlStore::builder()
        .max_connections(4)
        .connect_timeout(Duration::from_secs(2))
        .connect(&pair.primary.url())
        .await
        .unwrap();
    store.migrate().await.unwrap();
    for k in 0..8 {
        pay(&store, &fx, &format!("before-{k}")).await.unwrap();
    }
    pair.replica.signal("-STOP");
    let dumps = pair
        .primary
        .sql("SELECT ID FROM information_schema.PROCESSLIST WHERE COMMAND LIKE 'Binlog Dump%'");
    for id in dumps.split_whitespace() {
        pair.primary.sql(&format!("KILL {id}"));
    }
    let mut cut_off = Vec::new();
    for k in 0..8 {
        cut_off.push(pay(&store, &fx, &format!("after-{k}")).await);
    }
    pair.primary.signal("-KILL");
    pair.replica.signal("-CONT");
    promote(&pair.replica);
    let promoted = MySqlStore::connect(&pair.replica.url()).await.unwrap();
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
    if !installed() {
        return;
    }
    let pair = pair("async", false);
    let (fx, cut_off) = failover(&pair).await;
    failover::forgotten(&fx, &cut_off).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn semi_synchronous_replication_keeps_every_acknowledged_call() {
    if !installed() {
        return;
    }
    let pair = pair("semisync", true);
    let (fx, cut_off) = failover(&pair).await;
    failover::kept(&fx, &cut_off).await;
}
