//! `MySqlStore` on a 3-node MariaDB Galera cluster (multi-primary, `galera-4`) this test starts
//! itself on loopback ports: callers on every node claim the same keys at once (Galera certifies
//! each write set cluster-wide, so two nodes inserting one key make one of them fail with 1213 at
//! commit, which the store retries and then reads the winner's record), a repeat on another node
//! right after a mark replays it, and a node killed (SIGKILL) under load and started again (it
//! rejoins by incremental state transfer) leaves every key run once. "Run" is counted in an
//! independent side-effect table, never by idem's counters. docs/RELIABILITY.md, "Growing and
//! scaling out", gives the figures.

#[path = "support/callers.rs"]
mod callers;
mod contract;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use callers::{Seen, all_answers, answered, ran_again, spawn_callers};
use contract::Effects;
use idem::metrics::Outcome;
use idem::{Call, IdemError, MySqlStore};
use idem_suite::doc_table::{Table, rate};
use tokio::sync::Barrier;

const PROVIDER: &str = "/usr/lib/galera/libgalera_smm.so";

/// Whether this machine can start a Galera cluster; one skip line when not, a failure under
/// `IDEM_REQUIRE_SERVICES=1`.
fn installed() -> bool {
    let tools = ["mariadbd", "mariadb-install-db", "mariadb", "rsync"]
        .iter()
        .all(|bin| Command::new(bin).arg("--version").output().is_ok());
    let found = tools && Path::new(PROVIDER).exists() && user_exists("mysql");
    if !found {
        assert!(
            std::env::var("IDEM_REQUIRE_SERVICES").as_deref() != Ok("1"),
            "mariadbd, mariadb-install-db, rsync, galera-4 ({PROVIDER}) and the mysql user are \
             needed for the Galera test and IDEM_REQUIRE_SERVICES=1"
        );
        eprintln!("skipped: galera-4, mariadbd or rsync is not installed");
    }
    found
}

fn user_exists(name: &str) -> bool {
    Command::new("id")
        .arg(name)
        .output()
        .is_ok_and(|o| o.status.success())
}

/// `n` consecutive free loopback ports from `base`, picked by the process id.
fn ports(base: u16, n: u16) -> u16 {
    let pid = std::process::id() as u16;
    (0..400u16)
        .map(|k| base + (pid.wrapping_add(k) % 400) * n)
        .find(|&first| {
            (first..first + n).all(|p| std::net::TcpListener::bind(("127.0.0.1", p)).is_ok())
        })
        .expect("free ports")
}

/// Three `mariadbd` with wsrep on loopback ports, in a folder of their own (owned by the `mysql`
/// user the servers run as: the state transfer's rsync daemon writes as that user); stopped and
/// removed when dropped.
struct Galera {
    dir: PathBuf,
    /// The SQL port of each node.
    sql: [u16; 3],
    /// The first of each node's three group ports (replication, incremental and full transfer).
    group: [u16; 3],
    nodes: [Option<Child>; 3],
}

impl Galera {
    /// Bootstraps node 0, makes the `test` database and a passwordless `root@127.0.0.1`, stops it
    /// cleanly and gives the two others a copy of its data directory (so they join by an
    /// incremental transfer), then starts all three.
    fn start() -> Galera {
        let dir = std::env::temp_dir().join(format!("idem-galera-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("n0")).unwrap();
        let sql_base = ports(23_000, 3);
        let group_base = ports(24_000, 9);
        let mut galera = Galera {
            sql: [sql_base, sql_base + 1, sql_base + 2],
            group: [group_base, group_base + 3, group_base + 6],
            nodes: [None, None, None],
            dir,
        };
        chown(&galera.dir);
        let out = Command::new("mariadb-install-db")
            .args([
                "--no-defaults",
                &format!("--datadir={}", galera.data(0).display()),
                "--user=mysql",
                "--auth-root-authentication-method=normal",
                "--skip-test-db",
            ])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        galera.launch(0, true);
        galera.sql_on(
            0,
            "CREATE USER IF NOT EXISTS root@'127.0.0.1'; \
             GRANT ALL ON *.* TO root@'127.0.0.1' WITH GRANT OPTION; \
             CREATE DATABASE IF NOT EXISTS test",
        );
        galera.stop(0);
        for i in 1..3 {
            std::fs::create_dir_all(galera.dir.join(format!("n{i}"))).unwrap();
            chown(&galera.dir.join(format!("n{i}")));
            let copied = Command::new("cp")
                .arg("-a")
                .arg(galera.data(0))
                .arg(galera.dir.join(format!("n{i}")))
                .status()
                .unwrap();
            assert!(copied.success());
            let state = galera.data(i).join("grastate.dat");
            let text = std::fs::read_to_string(&state).unwrap();
            std::fs::write(
                &state,
                text.replace("safe_to_bootstrap: 1", "safe_to_bootstrap: 0"),
            )
            .unwrap();
        }
        galera.launch(0, true);
        galera.launch(1, false);
        galera.launch(2, false);
        for i in 0..3 {
            galera.wait_synced(i);
        }
        galera
    }

    fn data(&self, i: usize) -> PathBuf {
        self.dir.join(format!("n{i}")).join("data")
    }

    fn socket(&self, i: usize) -> PathBuf {
        self.dir.join(format!("n{i}")).join("sock")
    }

    /// Starts node `i` (`bootstrap`: a new cluster from its state) and waits until it answers.
    fn launch(&mut self, i: usize, bootstrap: bool) {
        self.launch_at(i, bootstrap, None);
    }

    /// Starts node `i` again after it was killed, from the position its storage engine recovers
    /// (`uuid:seqno`), as `galera_recovery` (the systemd unit's step) and `mysqld_safe` do: a
    /// node killed with SIGKILL leaves seqno -1 in its `grastate.dat`, and started without its
    /// position it asks for a full state transfer, not an incremental one. An rsync transfer
    /// holds the donor's backup lock while it copies the data directory: every write on the
    /// donor waits seconds, and MariaDB discards a write whose client closed its connection while
    /// it waited, as a call's store timeout does.
    fn restart(&mut self, i: usize) {
        let log = self.dir.join(format!("n{i}")).join("recover.log");
        let out = Command::new("mariadbd")
            .args(self.args(i))
            .arg(format!("--log-error={}", log.display()))
            .arg("--wsrep-recover")
            .output()
            .unwrap();
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let position = text
            .lines()
            .rev()
            .find_map(|l| l.split("WSREP: Recovered position: ").nth(1))
            .map(|p| p.trim().to_owned())
            .filter(|p| !p.ends_with(":-1"))
            .unwrap_or_else(|| {
                panic!(
                    "node {i} recovered no position ({}): {text}",
                    String::from_utf8_lossy(&out.stderr)
                )
            });
        self.launch_at(i, false, Some(&position));
    }

    /// The options node `i` runs with (but the error log's).
    fn args(&self, i: usize) -> Vec<String> {
        let members: Vec<String> = self
            .group
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect();
        let g = self.group[i];
        let node = self.dir.join(format!("n{i}"));
        vec![
            "--no-defaults".to_owned(),
            "--user=mysql".to_owned(),
            format!("--datadir={}", self.data(i).display()),
            format!("--port={}", self.sql[i]),
            "--bind-address=127.0.0.1".to_owned(),
            format!("--socket={}", self.socket(i).display()),
            format!("--pid-file={}", node.join("pid").display()),
            "--wsrep-on=ON".to_owned(),
            format!("--wsrep-provider={PROVIDER}"),
            "--wsrep-cluster-name=idem".to_owned(),
            format!("--wsrep-cluster-address=gcomm://{}", members.join(",")),
            format!("--wsrep-node-address=127.0.0.1:{g}"),
            format!(
                "--wsrep-provider-options=base_port={g};ist.recv_addr=127.0.0.1:{};gcache.size=128M",
                g + 1
            ),
            format!("--wsrep-sst-receive-address=127.0.0.1:{}", g + 2),
            "--wsrep-sst-method=rsync".to_owned(),
            "--binlog-format=ROW".to_owned(),
            "--default-storage-engine=InnoDB".to_owned(),
            "--innodb-autoinc-lock-mode=2".to_owned(),
            "--innodb-buffer-pool-size=64M".to_owned(),
            "--innodb-flush-log-at-trx-commit=2".to_owned(),
            "--skip-name-resolve".to_owned(),
            "--max-connections=200".to_owned(),
        ]
    }

    /// Starts node `i`, from `position` when given, and waits until it answers.
    fn launch_at(&mut self, i: usize, bootstrap: bool, position: Option<&str>) {
        let node = self.dir.join(format!("n{i}"));
        let mut cmd = Command::new("mariadbd");
        cmd.args(self.args(i))
            .arg(format!("--log-error={}", node.join("err.log").display()));
        if bootstrap {
            cmd.arg("--wsrep-new-cluster");
        }
        if let Some(position) = position {
            cmd.arg(format!("--wsrep-start-position={position}"));
        }
        let child = cmd
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        self.nodes[i] = Some(child);
        for _ in 0..600 {
            if self.try_sql(i, "SELECT 1").is_some() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!(
            "Galera node {i} does not answer: {}",
            std::fs::read_to_string(node.join("err.log")).unwrap_or_default()
        );
    }

    fn try_sql(&self, i: usize, sql: &str) -> Option<String> {
        let out = Command::new("mariadb")
            .args(["--no-defaults", "-N", "-B", "-uroot", "-S"])
            .arg(self.socket(i))
            .args(["-e", sql])
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
    }

    fn sql_on(&self, i: usize, sql: &str) -> String {
        self.try_sql(i, sql)
            .unwrap_or_else(|| panic!("`{sql}` failed on Galera node {i}"))
    }

    /// Waits until node `i` is a synced member of a 3-node primary component.
    fn wait_synced(&self, i: usize) {
        let start = Instant::now();
        loop {
            let status = self.try_sql(
                i,
                "SELECT VARIABLE_VALUE FROM information_schema.GLOBAL_STATUS WHERE VARIABLE_NAME \
                 IN ('wsrep_local_state_comment', 'wsrep_cluster_size') ORDER BY VARIABLE_NAME",
            );
            if status
                .as_deref()
                .map(str::split_whitespace)
                .is_some_and(|mut s| s.next() == Some("3") && s.next() == Some("Synced"))
            {
                return;
            }
            assert!(
                start.elapsed() < Duration::from_secs(90),
                "Galera node {i} is not synced in a 3-node cluster: {status:?}"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Node `i`'s error log from byte `from` on, and its length.
    fn log_from(&self, i: usize, from: usize) -> (String, usize) {
        let log = std::fs::read(self.dir.join(format!("n{i}")).join("err.log")).unwrap_or_default();
        let text = String::from_utf8_lossy(log.get(from..).unwrap_or_default()).into_owned();
        (text, log.len())
    }

    /// The cluster's write sets that lost to another node's (certification failures and
    /// transactions aborted to apply another's), summed over the nodes up, as a line.
    fn conflicts(&self) -> String {
        let (cert, bf) = self.conflict_counts();
        format!("since each node's start: {cert} certification failures, {bf} brute-force aborts")
    }

    /// The certification failures and brute-force aborts the live nodes counted since their start.
    fn conflict_counts(&self) -> (u64, u64) {
        let sum = |name: &str| -> u64 {
            (0..3)
                .filter(|&i| self.nodes[i].is_some())
                .filter_map(|i| {
                    self.try_sql(
                        i,
                        &format!(
                            "SELECT VARIABLE_VALUE FROM information_schema.GLOBAL_STATUS \
                             WHERE VARIABLE_NAME = '{name}'"
                        ),
                    )
                })
                .filter_map(|v| v.trim().parse::<u64>().ok())
                .sum()
        };
        (
            sum("WSREP_LOCAL_CERT_FAILURES"),
            sum("WSREP_LOCAL_BF_ABORTS"),
        )
    }

    /// Stops node `i` cleanly (its state saved for a restart).
    fn stop(&mut self, i: usize) {
        if let Some(mut child) = self.nodes[i].take() {
            let _ = Command::new("kill")
                .args(["-TERM", &child.id().to_string()])
                .status();
            let _ = child.wait();
        }
    }

    /// SIGKILL: the node dies mid-write, its connections cut.
    fn kill(&mut self, i: usize) {
        if let Some(mut child) = self.nodes[i].take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Galera {
    fn drop(&mut self) {
        for node in self.nodes.iter_mut().flatten() {
            let _ = node.kill();
            let _ = node.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Gives the `mysql` user the folder (the servers and their transfer daemon write there).
fn chown(dir: &Path) {
    let status = Command::new("chown")
        .args(["-R", "mysql:mysql"])
        .arg(dir)
        .status()
        .unwrap();
    assert!(status.success(), "chown mysql {}", dir.display());
}

/// A TCP balancer in front of the cluster, as a Galera deployment has one (HAProxy or MaxScale
/// with a health check): each connection goes to the first node in its order that the health
/// check marks up, so a client keeps its preferred node while it is up and moves when it is not.
struct Balancer {
    addr: std::net::SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

/// Which nodes the health check marks up.
type Health = Arc<[std::sync::atomic::AtomicBool; 3]>;

impl Balancer {
    /// A balancer preferring node `first`, then the next ones in turn.
    async fn start(galera: &Galera, first: usize, health: Health) -> Balancer {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let order: Vec<(usize, u16)> = (0..3)
            .map(|k| (first + k) % 3)
            .map(|i| (i, galera.sql[i]))
            .collect();
        let task = tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                let (order, health) = (order.clone(), health.clone());
                tokio::spawn(async move {
                    for (i, port) in order {
                        if !health[i].load(Ordering::SeqCst) {
                            continue;
                        }
                        if let Ok(mut node) =
                            tokio::net::TcpStream::connect(("127.0.0.1", port)).await
                        {
                            let _ = tokio::io::copy_bidirectional(&mut client, &mut node).await;
                            return;
                        }
                    }
                });
            }
        });
        Balancer { addr, task }
    }

    fn url(&self) -> String {
        format!("mysql://root@{}/test", self.addr)
    }
}

impl Drop for Balancer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// One call of `key` by a client whose store is `stores[first]`: its body records one side
/// effect; on an answer that says "try again" it tries again on the next client's store.
///
/// The lease and the store timeout are idem's defaults (30 s, 10 s), which outlast the cluster's
/// write outages around a member's death and return: no node commits while the dead member is
/// suspected (`evs.suspect_timeout`, 5 s), and under CPU load the view change that lets it back
/// in went through a non-primary component for seconds (1047 on every node). A mark must land
/// within its store timeout and its lease: with 2 s and 10 s, a body that ran just before such an
/// outage had its mark fail (the record stays PROCESSING), and the takeover after its lease ran
/// the key a second time, which is what lease mode does with a mark that cannot land
/// (docs/DESIGN.md, *The store timeout*).
async fn call(stores: &[MySqlStore], first: usize, fx: &Effects, key: &str, seen: &Seen) -> String {
    answered(seen, key, |tries| {
        let node = (first + tries) % stores.len();
        let (fx, key, store) = (fx.clone(), key.to_owned(), &stores[node]);
        async move {
            let call = Call::new("GALERA", &key)
                .lease(Duration::from_secs(30))
                .wait(Duration::from_secs(5))
                .store_timeout(Duration::from_secs(10))
                .run(store, async {
                    fx.record("GALERA", &key).await;
                    Ok::<_, IdemError>(format!("receipt for {key} from node {node}"))
                });
            let (out, report) = idem::metrics::observe(call).await;
            if report.is_some_and(|r| r.outcome == Outcome::MarkFailed) {
                MARKS_CUT.lock().unwrap().push(key);
            }
            out
        }
    })
    .await
}

/// Keys whose call ran its body but whose mark was not answered within the store timeout (outcome
/// `mark_failed`; the caller is told to try again). A mark the cluster commits after its client
/// gave up (one that waited for replication) leaves the key run once; one it discards (a write
/// set its node could not replicate before losing the primary component, or a write that waited
/// for a lock, such as an rsync donor's backup lock, when its connection closed) leaves the
/// record PROCESSING, and the key runs again once the claim's lease ends.
static MARKS_CUT: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// Every key ran once, and every caller got that run's receipt.
async fn once_each(fx: &Effects, keys: &[String], answers: &[(String, String)]) {
    let again = ran_again(fx, "GALERA", keys, answers).await;
    let cut = MARKS_CUT.lock().unwrap().clone();
    assert!(
        again.is_empty(),
        "keys run more than once: {again:?}; calls whose mark the store timeout cut off: {cut:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn galera_runs_each_key_once_across_nodes_and_a_node_restart() {
    if !installed() {
        return;
    }
    let mut galera = tokio::task::spawn_blocking(Galera::start).await.unwrap();
    let health: Health = Arc::new(std::array::from_fn(|_| true.into()));
    let mut balancers = Vec::new();
    let mut stores = Vec::new();
    for i in 0..3 {
        // Each client's store connects through a balancer preferring node i.
        let balancer = Balancer::start(&galera, i, health.clone()).await;
        let store = MySqlStore::connect_with(&balancer.url(), 8, Duration::from_secs(2))
            .await
            .unwrap()
            .with_table("idem_galera")
            .unwrap();
        stores.push(store);
        balancers.push(balancer);
    }
    stores[0].migrate().await.unwrap();
    let stores = Arc::new(stores);
    let fx = Effects::new().await;

    // 1. Every node at once: 40 keys, 8 callers on each node, released together, each calling
    //    every key in the same order.
    let seen = Arc::new(Seen::default());
    let keys: Vec<String> = (0..40).map(|k| format!("k{k}")).collect();
    let barrier = Arc::new(Barrier::new(25));
    let tasks = spawn_callers(24, &barrier, |caller| {
        let (stores, fx, keys, seen) = (stores.clone(), fx.clone(), keys.clone(), seen.clone());
        async move {
            let mut answers = Vec::new();
            for key in &keys {
                let receipt = call(&stores, caller % 3, &fx, key, &seen).await;
                answers.push((key.clone(), receipt));
            }
            answers
        }
    });
    barrier.wait().await;
    let answers = all_answers(tasks).await;
    once_each(&fx, &keys, &answers).await;
    assert_eq!(seen.answered.load(Ordering::Relaxed), 40 * 24);
    eprintln!(
        "galera: every node at once: {} calls on 40 keys, {}; {}",
        seen.answered.load(Ordering::Relaxed),
        seen.report(),
        galera.conflicts()
    );
    // The table for docs/RELIABILITY.md (`tests/reliability.sh`): one row a step.
    let mut table = Table::new(
        "galera",
        &[
            "what",
            "calls",
            "answers retried",
            "longest call",
            "certification failures / brute-force aborts so far",
            "marks cut off by the store timeout",
        ],
    );
    let row = |what: String, seen: &Seen, conflicts: String, cut: usize| {
        [
            what,
            rate(seen.answered.load(Ordering::Relaxed) as f64),
            rate(seen.retried.load(Ordering::Relaxed) as f64),
            format!(
                "{} ms",
                rate(seen.longest_ms.load(Ordering::Relaxed) as f64)
            ),
            conflicts,
            cut.to_string(),
        ]
    };
    let (cert, bf) = galera.conflict_counts();
    let mut cut = MARKS_CUT.lock().unwrap().len();
    table.row(row(
        "24 callers (8 per node) released together on 40 keys, each calling every key".to_owned(),
        &seen,
        format!("{cert} / {bf}"),
        cut,
    ));

    // 2. A repeat on the next node right after the first call's mark: the first answer.
    let seen = Seen::default();
    let mut answers = Vec::new();
    let keys: Vec<String> = (0..60).map(|k| format!("r{k}")).collect();
    for (k, key) in keys.iter().enumerate() {
        let first = call(&stores, k % 3, &fx, key, &seen).await;
        let again = call(&stores, (k + 1) % 3, &fx, key, &seen).await;
        answers.push((key.clone(), first));
        answers.push((key.clone(), again));
    }
    once_each(&fx, &keys, &answers).await;
    eprintln!(
        "galera: a repeat on another node right after the mark: 60 keys replayed, {}",
        seen.report()
    );
    table.row(row(
        "a repeat on the next node right after the first call's mark (60 keys, 2 calls each)"
            .to_owned(),
        &seen,
        "–".to_owned(),
        MARKS_CUT.lock().unwrap().len() - cut,
    ));
    cut = MARKS_CUT.lock().unwrap().len();

    // 3. Node 2 killed (SIGKILL) while 12 callers (4 a node) call 300 keys, then started again:
    //    it rejoins, and every key ran once.
    let seen = Arc::new(Seen::default());
    let keys: Vec<String> = (0..600).map(|k| format!("d{k}")).collect();
    let barrier = Arc::new(Barrier::new(13));
    let tasks = spawn_callers(12, &barrier, |caller| {
        let (stores, fx, keys, seen) = (stores.clone(), fx.clone(), keys.clone(), seen.clone());
        async move {
            let mut answers = Vec::new();
            // Each caller starts at another place in the keys, so keys are contended throughout.
            for k in 0..keys.len() {
                let key = &keys[(k + caller * 50) % keys.len()];
                let receipt = call(&stores, caller % 3, &fx, key, &seen).await;
                answers.push((key.clone(), receipt));
            }
            answers
        }
    });
    barrier.wait().await;
    while seen.answered.load(Ordering::Relaxed) < 400 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let before = seen.answered.load(Ordering::Relaxed);
    galera.kill(2);
    health[2].store(false, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let galera = tokio::task::spawn_blocking(move || {
        let (_, from) = galera.log_from(2, 0);
        galera.restart(2);
        galera.wait_synced(2);
        // The incremental transfer the test is about: a full one would hold the donor's writes.
        let (log, _) = galera.log_from(2, from);
        assert!(
            log.contains("rsync IST completed on joiner")
                && !log.contains("rsync SST completed on joiner"),
            "node 2 rejoined by a full state transfer: {log}"
        );
        galera
    })
    .await
    .unwrap();
    health[2].store(true, Ordering::SeqCst);
    let answers = all_answers(tasks).await;
    once_each(&fx, &keys, &answers).await;
    assert!(
        before < 600 * 12,
        "the node was killed while the callers were still calling"
    );
    eprintln!(
        "galera: node 2 killed after {before} of {} calls and restarted (by incremental \
         transfer): every key ran once, {}, {} marks not answered within the store timeout; {}",
        600 * 12,
        seen.report(),
        MARKS_CUT.lock().unwrap().len(),
        galera.conflicts()
    );
    let (cert, bf) = galera.conflict_counts();
    table.row(row(
        format!(
            "12 callers on 600 keys; node 2 killed (SIGKILL) after {before} answers, started \
             again 2 s later from the position its storage engine recovered (`mariadbd \
             --wsrep-recover`, as `galera_recovery` does), so it rejoins by incremental state \
             transfer (the test checks it)"
        ),
        &seen,
        format!("{cert} / {bf}"),
        MARKS_CUT.lock().unwrap().len() - cut,
    ));
    table.emit();
    drop(galera);
}
