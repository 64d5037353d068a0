//! Redis: a server loading, busy with a script, a replica, without replicas, out of memory,
//! and the replies no local server gives from a stand-in.

use super::*;

/// Whether the server's reply `code` is named in `e` (the client spells the codes it knows its own
/// way: `BusyLoading`, `ReadOnly`, `MasterDown`).
fn says(e: &IdemError, code: &str) -> bool {
    e.to_string().to_lowercase().contains(&code.to_lowercase())
}

/// A call on `store` whose body counts its runs in `ran`.
async fn redis_call(store: &RedisStore, key: &str, ran: &AtomicU32) -> Result<u32, IdemError> {
    counted_call("a Redis call", store, "EC", key, 1, ran).await
}

async fn redis_connect(server: &RedisServer) -> RedisStore {
    bounded("connect", RedisStore::connect(&server.url()))
        .await
        .unwrap()
        .with_prefix("idemec:")
        .unwrap()
}

/// A scratch directory of this test, removed when dropped (after the servers in it: declare it
/// first).
struct Scratch(std::path::PathBuf);

impl Scratch {
    fn new(name: &str) -> Scratch {
        Scratch(redis_server::scratch_dir(name))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A `redis-cli` child of this test (a long-running command), reaped and, if still running,
/// killed when dropped.
struct Cli(std::process::Child);

impl Cli {
    fn spawn(server: &RedisServer, args: &[&str]) -> Cli {
        let child = std::process::Command::new("redis-cli")
            .args(["-p", &server.port.to_string()])
            .args(args)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("redis-cli runs");
        Cli(child)
    }

    /// Waits (bounded) for it to end.
    fn wait(mut self) {
        let start = Instant::now();
        while self.0.try_wait().unwrap().is_none() {
            assert!(start.elapsed() < BOUND, "redis-cli did not end");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Cli {
    fn drop(&mut self) {
        if self.0.try_wait().ok().flatten().is_none() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// Polls (bounded) until `PING` answers with `reply`.
/// A redis-server of this test's own in `dir`, on a free port from `base`, without persistence,
/// with `extra` options (declare `dir` first, so it is removed after the server stops).
fn own_server(dir: &Scratch, base: u16, extra: &[&str]) -> RedisServer {
    let port = redis_server::ports(base, 1).next().unwrap();
    let mut args = vec!["--save", "", "--appendonly", "no"];
    args.extend_from_slice(extra);
    RedisServer::start(port, &dir.0, &args)
}

/// A call on `store` refused with the server's `code`, of the class `check` asserts, before its
/// body ran.
async fn refused(store: &RedisStore, ran: &AtomicU32, code: &str, check: impl Fn(&IdemError)) {
    let before = ran.load(Ordering::Relaxed);
    let e = redis_call(store, "k", ran).await.unwrap_err();
    assert!(says(&e, code), "{e}");
    check(&e);
    assert_eq!(
        ran.load(Ordering::Relaxed),
        before,
        "the body ran on a refused claim"
    );
}

fn wait_for_ping(server: &RedisServer, reply: &str) {
    server.wait_for(|r| r.contains(reply), &["PING"]);
}

/// LOADING: the server is loading its dataset (`DEBUG RELOAD` with a delay per key, on a server
/// of this test): `StoreUnavailable` (503); once loaded, the call runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_loading_is_unavailable() {
    if !redis_server::installed() {
        return;
    }
    let dir = Scratch::new("ec-loading");
    let server = own_server(&dir, 15_000, &["--enable-debug-command", "yes"]);
    let store = redis_connect(&server).await;
    server.cli(&["DEBUG", "POPULATE", "20000", "fill", "10"]);
    server.cli(&["CONFIG", "SET", "key-load-delay", "250"]);
    server.cli(&[
        "CONFIG",
        "SET",
        "loading-process-events-interval-bytes",
        "1024",
    ]);
    let reload = Cli::spawn(&server, &["DEBUG", "RELOAD"]);
    wait_for_ping(&server, "LOADING");
    let ran = AtomicU32::new(0);
    refused(&store, &ran, "LOADING", assert_unavailable).await;
    reload.wait();
    server.cli(&["CONFIG", "SET", "key-load-delay", "0"]);
    assert_eq!(redis_call(&store, "k", &ran).await.unwrap(), 1);
}

/// BUSY: a script runs past `busy-reply-threshold`: the server answers nothing but BUSY until it
/// ends: `StoreBusy(Locked)` (503); after `SCRIPT KILL` the call runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_busy_script_is_busy() {
    if !redis_server::installed() {
        return;
    }
    let dir = Scratch::new("ec-busy");
    let server = own_server(&dir, 16_000, &["--busy-reply-threshold", "50"]);
    let store = redis_connect(&server).await;
    // A read-only script that spins for up to 20 s (so SCRIPT KILL can end it).
    let spin = Cli::spawn(
        &server,
        &[
            "EVAL",
            "local s = tonumber(redis.call('TIME')[1]) \
             while tonumber(redis.call('TIME')[1]) < s + 20 do end return 1",
            "0",
        ],
    );
    wait_for_ping(&server, "BUSY");
    let ran = AtomicU32::new(0);
    refused(&store, &ran, "BUSY", |e| assert_busy(e, Busy::Locked, 503)).await;
    server.cli(&["SCRIPT", "KILL"]);
    spin.wait();
    assert_eq!(redis_call(&store, "k", &ran).await.unwrap(), 1);
}

/// A primary and its replica, both of this test; the replica with `replica_args` on top.
fn redis_pair(
    dir: &std::path::Path,
    base: u16,
    replica_args: &[&str],
) -> (RedisServer, RedisServer) {
    let mut ports = redis_server::ports(base, 2);
    let plain = ["--save", "", "--appendonly", "no"];
    let primary = RedisServer::start(ports.next().unwrap(), dir, &plain);
    let primary_port = primary.port.to_string();
    let mut args = plain.to_vec();
    args.extend(["--replicaof", "127.0.0.1", &primary_port]);
    args.extend(replica_args);
    let replica = RedisServer::start(ports.next().unwrap(), dir, &args);
    replica.wait_for(
        |info| info.contains("master_link_status:up"),
        &["INFO", "replication"],
    );
    (primary, replica)
}

/// READONLY: a store pointed at a replica (a failover demoted its server, or the URL names a
/// replica): `StoreUnavailable` (503), nothing written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_readonly_replica_is_unavailable() {
    if !redis_server::installed() {
        return;
    }
    let dir = Scratch::new("ec-readonly");
    let (_primary, replica) = redis_pair(&dir.0, 18_000, &[]);
    let store = redis_connect(&replica).await;
    let ran = AtomicU32::new(0);
    refused(&store, &ran, "READONLY", assert_unavailable).await;
    // Promoted, the same server takes the call.
    assert!(replica.cli(&["REPLICAOF", "NO", "ONE"]).contains("OK"));
    assert_eq!(redis_call(&store, "k", &ran).await.unwrap(), 1);
}

/// MASTERDOWN: a replica with `replica-serve-stale-data no` whose primary is gone:
/// `StoreUnavailable` (503), and the body does not run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_masterdown_is_unavailable() {
    if !redis_server::installed() {
        return;
    }
    let dir = Scratch::new("ec-masterdown");
    let (primary, replica) = redis_pair(&dir.0, 20_000, &["--replica-serve-stale-data", "no"]);
    let store = redis_connect(&replica).await;
    primary.shutdown_nosave();
    replica.wait_for(
        |info| info.contains("master_link_status:down"),
        &["INFO", "replication"],
    );
    let ran = AtomicU32::new(0);
    refused(&store, &ran, "MASTERDOWN", assert_unavailable).await;
}

/// NOREPLICAS: `min-replicas-to-write 1` and no replica: the server refuses writes:
/// `StoreUnavailable` (503), as when `with_replica_acks` finds too few replicas.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_noreplicas_is_unavailable() {
    if !redis_server::installed() {
        return;
    }
    let dir = Scratch::new("ec-noreplicas");
    let server = own_server(&dir, 17_000, &["--min-replicas-to-write", "1"]);
    let store = redis_connect(&server).await;
    let ran = AtomicU32::new(0);
    refused(&store, &ran, "NOREPLICAS", assert_unavailable).await;
    server.cli(&["CONFIG", "SET", "min-replicas-to-write", "0"]);
    assert_eq!(redis_call(&store, "k", &ran).await.unwrap(), 1);
}

/// OOM: `maxmemory` reached under `noeviction`: the server refuses writes: `StoreUnavailable`
/// (503); with memory again, the call runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_oom_is_unavailable() {
    if !redis_server::installed() {
        return;
    }
    let dir = Scratch::new("ec-oom");
    let server = own_server(&dir, 30_000, &["--enable-debug-command", "yes"]);
    let store = redis_connect(&server).await;
    let ran = AtomicU32::new(0);
    assert_eq!(redis_call(&store, "warm", &ran).await.unwrap(), 1);
    server.cli(&["DEBUG", "POPULATE", "20000", "fill", "10"]);
    server.cli(&["CONFIG", "SET", "maxmemory-policy", "noeviction"]);
    server.cli(&["CONFIG", "SET", "maxmemory", "1mb"]);
    refused(&store, &ran, "OOM", assert_unavailable).await;
    server.cli(&["CONFIG", "SET", "maxmemory", "0"]);
    assert_eq!(redis_call(&store, "k", &ran).await.unwrap(), 1);
}

/// A stand-in Redis on a loopback port: answers `+OK` / `+PONG` to the connection's set-up and
/// `error` (a whole RESP error line, without CRLF) to every script.
async fn fake_redis(error: &'static str) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((sock, _)) = listener.accept().await {
            tokio::spawn(async move {
                let (read, mut write) = sock.into_split();
                let mut read = BufReader::new(read);
                loop {
                    // One command: *<n>, then n bulk strings ($<len>, the bytes).
                    let mut line = String::new();
                    if read.read_line(&mut line).await.unwrap_or(0) == 0 {
                        return;
                    }
                    let n: usize = line.trim().trim_start_matches('*').parse().unwrap_or(0);
                    let mut parts = Vec::new();
                    for _ in 0..n {
                        line.clear();
                        if read.read_line(&mut line).await.unwrap_or(0) == 0 {
                            return;
                        }
                        let len: usize = line.trim().trim_start_matches('$').parse().unwrap_or(0);
                        let mut bytes = vec![0u8; len + 2];
                        if read.read_exact(&mut bytes).await.is_err() {
                            return;
                        }
                        bytes.truncate(len);
                        parts.push(String::from_utf8_lossy(&bytes).to_uppercase());
                    }
                    let reply = match parts.first().map(String::as_str) {
                        Some("EVALSHA" | "EVAL" | "FCALL") => format!("{error}\r\n"),
                        Some("PING") => "+PONG\r\n".to_owned(),
                        _ => "+OK\r\n".to_owned(),
                    };
                    if write.write_all(reply.as_bytes()).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    format!("redis://127.0.0.1:{port}")
}

/// TRYAGAIN, CLUSTERDOWN, MISCONF: replies no server of this machine gives idem's one-key scripts
/// (TRYAGAIN answers a multi-key command during a resharding; CLUSTERDOWN a cluster with an
/// unserved slot, which the cluster client waits out itself; MISCONF a server that cannot write
/// its snapshot, which root on this machine cannot be kept from doing). A stand-in sends the
/// server's bytes to the real client and store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_tryagain_clusterdown_misconf_from_a_stand_in() {
    let cases: [(&str, Option<Busy>); 3] = [
        (
            "-TRYAGAIN Multiple keys request during rehashing of slot",
            Some(Busy::Locked),
        ),
        ("-CLUSTERDOWN The cluster is down", None),
        (
            "-MISCONF Redis is configured to save RDB snapshots, but it's currently unable to \
             persist to disk. Commands that may modify the data set are disabled",
            None,
        ),
    ];
    for (error, busy) in cases {
        let url = fake_redis(error).await;
        let store = bounded("connect", RedisStore::connect(&url)).await.unwrap();
        let ran = AtomicU32::new(0);
        let e = redis_call(&store, "k", &ran).await.unwrap_err();
        match busy {
            Some(reason) => assert_busy(&e, reason, 503),
            None => assert_unavailable(&e),
        }
        assert_eq!(ran.load(Ordering::Relaxed), 0, "{error}");
    }
}
