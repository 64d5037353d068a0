//! `PgStore` on a pg_auto_failover formation this test starts itself (a monitor, a primary and a
//! secondary, each `pg_autoctl run` as the postgres user on loopback ports, in a folder of its
//! own), connected through the formation's URL (`pg_autoctl show uri`: both nodes,
//! `target_session_attrs=read-write`). 16 callers call one keyed function over a fixed set of
//! keys while the primary is killed (SIGKILL to its pg_autoctl and its postmaster at once), the
//! monitor promotes the secondary, and the store moves its pool to it. With a primary and a
//! secondary the formation replicates synchronously, so every claim and mark the store
//! acknowledged is on the promoted node: every key's body ran once, every call was answered, and
//! the keys finished before the kill replay their first answer after it. "Ran" is counted in an
//! independent side-effect table, never by idem's counters. docs/RELIABILITY.md, "Growing and
//! scaling out", gives the figures.

#[path = "support/callers.rs"]
mod callers;
mod contract;

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use callers::{Seen, all_answers, answered, ran_again, spawn_callers};
use contract::Effects;
use idem::sqlx::{self, Connection, PgConnection};
use idem::{Call, IdemError, PgStore};
use idem_suite::doc_table::{SharedRows, Table, rate};
use tokio::sync::Barrier;

/// What the formation is started with: the Postgres binaries and the user to run them as.
struct Tools {
    bin: PathBuf,
    uid: u32,
    gid: u32,
}

/// The binaries of the newest installed Postgres that has pg_auto_failover's extension.
fn bin_dir() -> Option<PathBuf> {
    let mut majors: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|major| {
            major.join("bin/pg_ctl").exists() && major.join("lib/pgautofailover.so").exists()
        })
        .collect();
    majors.sort();
    majors.pop().map(|major| major.join("bin"))
}

fn id(flag: &str) -> Option<u32> {
    let out = Command::new("id").args([flag, "postgres"]).output().ok()?;
    String::from_utf8_lossy(&out.stdout).trim().parse().ok()
}

/// Whether this machine can start a formation (pg_autoctl, the monitor's extension, a `postgres`
/// user); one skip line when not, a failure under `IDEM_REQUIRE_SERVICES=1`.
fn tools() -> Option<Tools> {
    let autoctl = Command::new("pg_autoctl")
        .arg("version")
        .output()
        .is_ok_and(|o| o.status.success());
    let found = match (autoctl, bin_dir(), id("-u"), id("-g")) {
        (true, Some(bin), Some(uid), Some(gid)) => Some(Tools { bin, uid, gid }),
        _ => None,
    };
    if found.is_none() {
        assert!(
            std::env::var("IDEM_REQUIRE_SERVICES").as_deref() != Ok("1"),
            "pg_autoctl, pg_auto_failover's extension (postgresql-<major>-auto-failover) or the \
             postgres user are missing and IDEM_REQUIRE_SERVICES=1"
        );
        eprintln!("skipped: pg_auto_failover (pg_autoctl) is not installed");
    }
    found
}

/// Three consecutive free loopback ports from `base`, picked by the process id.
fn ports(base: u16) -> u16 {
    let pid = std::process::id() as u16;
    (0..400u16)
        .map(|k| base + (pid.wrapping_add(k) % 400) * 3)
        .find(|&first| {
            (first..first + 3).all(|p| std::net::TcpListener::bind(("127.0.0.1", p)).is_ok())
        })
        .expect("free ports")
}

/// One node of the formation: its data directory, port and `pg_autoctl run`.
struct Node {
    name: &'static str,
    data: PathBuf,
    port: u16,
    run: Option<Child>,
}

impl Node {
    fn url(&self, db: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{db}", self.port)
    }

    /// Stops it as `pg_autoctl stop --immediate` does (SIGQUIT: Postgres stopped in immediate
    /// mode, its children with it), or kills it after 15 s.
    fn stop(&mut self) {
        let Some(run) = &mut self.run else {
            return;
        };
        let _ = Command::new("kill")
            .args(["-QUIT", &run.id().to_string()])
            .status();
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(15) {
            if run.try_wait().is_ok_and(|done| done.is_some()) {
                self.run = None;
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        self.kill();
    }

    /// SIGKILL to its `pg_autoctl run` and everything in its process group (the services it
    /// forks and the postmaster they start) at once, so no service starts Postgres again.
    fn kill(&mut self) {
        if let Some(mut run) = self.run.take() {
            let _ = Command::new("kill")
                .args(["-KILL", "--", &format!("-{}", run.id())])
                .status();
            let _ = run.wait();
        }
    }
}

/// A monitor and two Postgres nodes, killed and removed when dropped.
struct Formation {
    tools: Tools,
    dir: PathBuf,
    monitor: Node,
    nodes: [Node; 2],
}

impl Formation {
    /// A `pg_autoctl` command as the postgres user, with the folder as its home and
    /// configuration directories (so it reads nothing of the machine's own).
    fn autoctl(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new("pg_autoctl");
        cmd.args(args)
            .env_clear()
            .env(
                "PATH",
                format!("{}:/usr/bin:/bin", self.tools.bin.display()),
            )
            .env("HOME", &self.dir)
            .env("XDG_CONFIG_HOME", self.dir.join("config"))
            .env("XDG_DATA_HOME", self.dir.join("share"))
            .env("XDG_RUNTIME_DIR", self.dir.join("run"))
            .env("LC_ALL", "C.UTF-8")
            .current_dir(&self.dir)
            .uid(self.tools.uid)
            .gid(self.tools.gid);
        cmd
    }

    /// Runs `pg_autoctl args` to its end; its output, or a panic with it.
    fn run(&self, args: &[&str]) -> String {
        let out = self.autoctl(args).output().unwrap();
        assert!(
            out.status.success(),
            "pg_autoctl {args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `pg_autoctl create …` for `node`, with the options every node takes.
    fn create(&self, node: &Node, kind: &str, extra: &[&str]) {
        let (data, port) = (node.data.to_str().unwrap(), node.port.to_string());
        let pg_ctl = self.tools.bin.join("pg_ctl");
        let mut args = vec![
            "create",
            kind,
            "--pgdata",
            data,
            "--pgport",
            &port,
            "--pgctl",
            pg_ctl.to_str().unwrap(),
            "--hostname",
            "127.0.0.1",
            "--auth",
            "trust",
            "--no-ssl",
        ];
        args.extend(extra);
        self.run(&args);
        // pg_autoctl sizes Postgres for the whole machine (gigabytes of shared buffers); a test
        // node needs little. Process kills lose nothing the operating system holds, so no fsync.
        append(
            &node.data.join("postgresql.auto.conf"),
            "shared_buffers = '128MB'\nfsync = off\n",
        );
    }

    /// Starts `pg_autoctl run` for node `which` in a process group of its own, its output in
    /// `<name>.log` beside it.
    fn start(&self, node: &Node) -> Child {
        let log = std::fs::File::create(self.dir.join(format!("{}.log", node.name))).unwrap();
        self.autoctl(&["run", "--pgdata", node.data.to_str().unwrap()])
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .process_group(0)
            .spawn()
            .unwrap()
    }

    /// The monitor, then the primary, then the secondary (a base backup of the primary), each
    /// running; returns once the monitor reports a primary and a secondary.
    async fn start_all(tools: Tools) -> Formation {
        let dir = std::env::temp_dir().join(format!("idem-pgaf-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let owned = Command::new("chown")
            .arg(format!("{}:{}", tools.uid, tools.gid))
            .arg(&dir)
            .status()
            .unwrap();
        assert!(owned.success());
        let base = ports(32_000);
        let node = |name, port| Node {
            name,
            data: dir.join(name),
            port,
            run: None,
        };
        let (monitor, nodes) = (
            node("monitor", base),
            [node("node_1", base + 1), node("node_2", base + 2)],
        );
        let mut formation = Formation {
            tools,
            dir,
            monitor,
            nodes,
        };
        formation.create(&formation.monitor, "monitor", &[]);
        let run = formation.start(&formation.monitor);
        formation.monitor.run = Some(run);
        let mut monitor = connect(&formation.monitor.url("pg_auto_failover"), 30).await;
        fast_failover(&mut monitor).await;
        let monitor_uri = formation
            .run(&[
                "show",
                "uri",
                "--pgdata",
                formation.monitor.data.to_str().unwrap(),
                "--formation",
                "monitor",
            ])
            .trim()
            .to_owned();
        for (i, state) in [(0, "single"), (1, "secondary")] {
            let node = &formation.nodes[i];
            let extra = [
                "--name",
                node.name,
                "--listen",
                "127.0.0.1",
                "--dbname",
                "test",
                "--monitor",
                &monitor_uri,
            ];
            formation.create(node, "postgres", &extra);
            let run = formation.start(node);
            formation.nodes[i].run = Some(run);
            formation
                .wait_for(&mut monitor, formation.nodes[i].name, state)
                .await;
        }
        formation.wait_for(&mut monitor, "node_1", "primary").await;
        formation
    }

    /// Waits (up to 90 s) until the monitor reports `node` in `state`, reached and assigned.
    async fn wait_for(&self, monitor: &mut PgConnection, node: &str, state: &str) {
        let start = Instant::now();
        loop {
            let states: Option<(String, String)> = sqlx::query_as(
                "SELECT reportedstate::text, goalstate::text FROM pgautofailover.node \
                 WHERE nodename = $1",
            )
            .bind(node)
            .fetch_optional(&mut *monitor)
            .await
            .unwrap();
            if states
                .as_ref()
                .is_some_and(|(reported, goal)| reported == state && goal == state)
            {
                return;
            }
            assert!(
                start.elapsed() < Duration::from_secs(90),
                "{node} is not {state} after 90 s: {states:?}\n{}",
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The last lines of each node's log, for a failure's message.
    fn logs(&self) -> String {
        let mut text = String::new();
        for node in [&self.monitor, &self.nodes[0], &self.nodes[1]] {
            let log = std::fs::read_to_string(self.dir.join(format!("{}.log", node.name)))
                .unwrap_or_default();
            let lines: Vec<&str> = log.lines().collect();
            text += &format!("--- {}.log\n", node.name);
            for line in &lines[lines.len().saturating_sub(20)..] {
                text += line;
                text += "\n";
            }
        }
        text
    }
}

impl Drop for Formation {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("{}", self.logs());
        }
        let [first, second] = &mut self.nodes;
        for node in [first, second, &mut self.monitor] {
            node.stop();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn append(path: &Path, text: &str) {
    use std::io::Write;
    let mut file = std::fs::OpenOptions::new().append(true).open(path).unwrap();
    file.write_all(text.as_bytes()).unwrap();
}

/// A connection to `url`, tried for up to `secs` seconds (a server still starting).
async fn connect(url: &str, secs: u64) -> PgConnection {
    let start = Instant::now();
    loop {
        match PgConnection::connect(url).await {
            Ok(conn) => return conn,
            Err(e) => assert!(start.elapsed() < Duration::from_secs(secs), "{url}: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The monitor's timing, shortened from pg_auto_failover's defaults (a health check every 5 s, a
/// node unhealthy after 20 s without news, a promoted node held read-only 30 s): a check every
/// second and a node unhealthy after 3 s. The promoted node waits 5 s for its old primary to
/// demote itself before it takes writes: enough here, where that primary is killed; a deployment
/// keeps it above the nodes' network partition timeout (20 s).
async fn fast_failover(monitor: &mut PgConnection) {
    for (setting, value) in [
        ("health_check_period", "1000"),
        ("health_check_timeout", "1000"),
        ("health_check_max_retries", "1"),
        ("health_check_retry_delay", "500"),
        ("node_considered_unhealthy_timeout", "3000"),
        ("primary_demote_timeout", "5000"),
    ] {
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "ALTER SYSTEM SET pgautofailover.{setting} = {value}"
        )))
        .execute(&mut *monitor)
        .await
        .unwrap();
    }
    sqlx::raw_sql("SELECT pg_reload_conf()")
        .execute(&mut *monitor)
        .await
        .unwrap();
}

/// Keys the callers call, every caller each of them once.
const KEYS: usize = 300;
const CALLERS: usize = 16;
/// Answered calls before the primary is killed.
const KILL_AFTER: u64 = 1_000;

/// One call of `key`, tried again on an answer that says so (the primary gone, no server taking
/// writes yet); its body records one side effect and answers a receipt numbered by execution, so a
/// replay is told from a second run.
async fn call(store: &PgStore, fx: &Effects, key: &str, seen: &Seen, runs: &AtomicU64) -> String {
    answered(seen, key, |_| {
        let (fx, key) = (fx.clone(), key.to_owned());
        async move {
            Call::new("PGAF", &key)
                .lease(Duration::from_secs(45))
                .wait(Duration::from_secs(5))
                // Longer than the failover (the kill seen, the secondary promoted and taking
                // writes, the pool moved): a mark sent to the dead primary is tried again until
                // the promoted node takes it. A mark that gave up before would leave its record
                // PROCESSING, taken over once its lease ended, and the body would run again.
                .store_timeout(Duration::from_secs(30))
                .run(store, async {
                    fx.record("PGAF", &key).await;
                    let run = runs.fetch_add(1, Ordering::Relaxed);
                    Ok::<_, IdemError>(format!("receipt {run} for {key}"))
                })
                .await
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_follows_a_promotion_and_runs_each_key_once() {
    let Some(tools) = tools() else {
        return;
    };
    let started = Instant::now();
    let mut formation = Formation::start_all(tools).await;
    let setup = started.elapsed();
    let mut monitor = connect(&formation.monitor.url("pg_auto_failover"), 10).await;

    // Synchronous replication, as pg_auto_failover sets it for a primary and a secondary.
    let mut primary = connect(&formation.nodes[0].url("test"), 10).await;
    let (standbys, sync): (String, String) = sqlx::query_as(
        "SELECT current_setting('synchronous_standby_names'), \
         (SELECT string_agg(sync_state, ',') FROM pg_stat_replication)",
    )
    .fetch_one(&mut primary)
    .await
    .unwrap();
    assert!(
        sync == "quorum" || sync == "sync",
        "the secondary replicates synchronously: {standbys} {sync}"
    );
    drop(primary);

    // The formation's URL, as pg_autoctl gives it (both nodes, read-write), with a user.
    let uri = formation.run(&[
        "show",
        "uri",
        "--pgdata",
        formation.monitor.data.to_str().unwrap(),
        "--formation",
        "default",
    ]);
    let uri = uri
        .trim()
        .replacen("postgres://", "postgres://postgres@", 1);
    for node in &formation.nodes {
        assert!(uri.contains(&format!("127.0.0.1:{}", node.port)), "{uri}");
    }
    assert!(uri.contains("target_session_attrs=read-write"), "{uri}");

    // The server that takes writes, wherever the URL lists it; a URL of the secondary alone that
    // asks for writes is refused as unavailable.
    let (first, second) = (formation.nodes[0].port, formation.nodes[1].port);
    let reversed = uri.replace(
        &format!("127.0.0.1:{first},127.0.0.1:{second}"),
        &format!("127.0.0.1:{second},127.0.0.1:{first}"),
    );
    assert_ne!(reversed, uri);
    for url in [&uri, &reversed] {
        let store = PgStore::connect(url).await.unwrap();
        store.migrate().await.unwrap();
        let answer = Call::new("PGAF-ORDER", url.as_str())
            .run(&store, async { Ok::<_, IdemError>(7) })
            .await;
        assert_eq!(answer.unwrap(), 7, "{url}");
    }
    let standby = format!(
        "{}?target_session_attrs=read-write",
        formation.nodes[1].url("test")
    );
    match PgStore::connect(&standby).await {
        Err(IdemError::StoreUnavailable { source }) => {
            assert!(source.to_string().contains("is read-only"), "{source}");
        }
        other => panic!("{standby}: {:?}", other.map(|_| ())),
    }

    let store = PgStore::builder()
        .connect_timeout(Duration::from_secs(2))
        .acquire_timeout(Duration::from_secs(5))
        .connect(&uri)
        .await
        .unwrap();
    let store = Arc::new(store);
    let fx = Effects::new().await;
    let seen = Arc::new(Seen::default());
    let runs = Arc::new(AtomicU64::new(0));
    let killed = Arc::new(AtomicBool::new(false));
    // The first answer of each key answered before the kill.
    let before: Arc<Mutex<Vec<(String, String)>>> = Arc::default();
    let keys: Vec<String> = (0..KEYS).map(|k| format!("k{k}")).collect();

    let barrier = Arc::new(Barrier::new(CALLERS + 1));
    let tasks = spawn_callers(CALLERS, &barrier, |caller| {
        let (store, fx, keys, seen) = (store.clone(), fx.clone(), keys.clone(), seen.clone());
        let (runs, killed, before) = (runs.clone(), killed.clone(), before.clone());
        async move {
            let mut answers = Vec::new();
            // Each caller starts at another place in the keys, so keys are contended throughout.
            for k in 0..keys.len() {
                let key = &keys[(k + caller * 19) % keys.len()];
                let receipt = call(&store, &fx, key, &seen, &runs).await;
                if !killed.load(Ordering::SeqCst) {
                    before.lock().unwrap().push((key.clone(), receipt.clone()));
                }
                answers.push((key.clone(), receipt));
            }
            answers
        }
    });
    barrier.wait().await;
    while seen.answered.load(Ordering::Relaxed) < KILL_AFTER {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }

    // The primary killed: its pg_autoctl (so the monitor hears nothing from it) and its
    // postmaster, at once.
    killed.store(true, Ordering::SeqCst);
    let answered_before = seen.answered.load(Ordering::Relaxed);
    let kill = Instant::now();
    formation.nodes[0].kill();

    // The secondary promoted and taking writes, as a client sees it.
    let promoted_url = formation.nodes[1].url("test");
    let writable = loop {
        if let Ok(Ok(mut conn)) =
            tokio::time::timeout(Duration::from_secs(1), PgConnection::connect(&promoted_url)).await
        {
            let read_only: Option<String> =
                sqlx::query_scalar("SELECT current_setting('transaction_read_only')")
                    .fetch_optional(&mut conn)
                    .await
                    .ok()
                    .flatten();
            if read_only.as_deref() == Some("off") {
                break kill.elapsed();
            }
        }
        assert!(
            kill.elapsed() < Duration::from_secs(90),
            "node_2 takes no writes 90 s after the primary's kill\n{}",
            formation.logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    // The store answering again: the first call answered after the promoted node took writes.
    let answered_at_writable = seen.answered.load(Ordering::Relaxed);
    let resumed = loop {
        if seen.answered.load(Ordering::Relaxed) > answered_at_writable {
            break kill.elapsed();
        }
        assert!(
            kill.elapsed() < writable + Duration::from_secs(60),
            "no call answered 60 s after node_2 took writes"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };

    let answers = all_answers(tasks).await;
    let total = seen.answered.load(Ordering::Relaxed);
    assert_eq!(total, (KEYS * CALLERS) as u64);
    assert!(
        answered_before < total,
        "the primary was killed while the callers were still calling"
    );
    let again = ran_again(&fx, "PGAF", &keys, &answers).await;
    assert!(again.is_empty(), "keys run more than once: {again:?}");

    // Every key finished before the kill replays its first answer on the promoted node.
    let before = std::mem::take(&mut *before.lock().unwrap());
    let replay = Seen::default();
    for (key, receipt) in &before {
        let now = call(&store, &fx, key, &replay, &runs).await;
        assert_eq!(
            &now, receipt,
            "{key}: the answer finished before the failover"
        );
    }
    let replayed: std::collections::HashSet<&str> =
        before.iter().map(|(key, _)| key.as_str()).collect();
    assert_eq!(
        runs.load(Ordering::Relaxed),
        KEYS as u64,
        "one execution per key"
    );
    let (reported, goal): (String, String) = sqlx::query_as(
        "SELECT reportedstate::text, goalstate::text FROM pgautofailover.node \
         WHERE nodename = 'node_2'",
    )
    .fetch_one(&mut monitor)
    .await
    .unwrap();
    eprintln!(
        "pg_auto_failover: formation up in {:.1} s ({standbys}, {sync}); {total} calls on {KEYS} \
         keys by {CALLERS} callers through `{uri}`; the primary killed after {answered_before} \
         answered calls; 1 failover: node_2 took writes {:.1} s after the kill (now \
         {reported}/{goal}), the store answered again at {:.1} s; {}; {} double executions; {} \
         keys finished before the kill replayed their first answer after it",
        setup.as_secs_f64(),
        writable.as_secs_f64(),
        resumed.as_secs_f64(),
        seen.report(),
        again.len(),
        replayed.len(),
    );
    Table::new(
        "pg-auto-failover",
        &[
            "primary killed after",
            "node 2 took writes (after the kill)",
            "the store answered again (after the kill)",
            "answers retried",
            "longest call",
            "keys run twice",
            "keys finished before the kill, replayed after it",
        ],
    )
    .emit_shared(
        &SharedRows::new(),
        "",
        [
            format!("{} answers", rate(answered_before as f64)),
            format!("{:.1} s", writable.as_secs_f64()),
            format!("{:.1} s", resumed.as_secs_f64()),
            rate(seen.retried.load(Ordering::Relaxed) as f64),
            format!(
                "{:.1} s",
                seen.longest_ms.load(Ordering::Relaxed) as f64 / 1000.0
            ),
            again.len().to_string(),
            rate(replayed.len() as f64),
        ],
    );
    drop(store);
    drop(formation);
}
