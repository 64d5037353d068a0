//! The storm binary as a user runs it: 12.3 % duplicates and 64 callers on every store this build
//! has, the audit catching real double executions, `--recover` preventing the ones it can, the JSON
//! and SVG outputs, and bad flags.

use std::process::{Command, Output};

#[cfg(feature = "redis")]
#[path = "../../tests/tests/support/redis_cluster.rs"]
mod redis_cluster;
#[cfg(feature = "redis")]
#[path = "../../tests/tests/support/redis_server.rs"]
mod redis_server;

fn storm(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_idem-storm"))
        .args(args)
        .env_remove("IDEM_STORM_SQLITE")
        .output()
        .expect("idem-storm runs")
}

fn json(out: &Output) -> serde_json::Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): {}\nstderr: {}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// A 12.3 % duplicate storm with 64 callers and every fault but slow bodies, on `store` in
/// `mode`: the audit holds and the counts add up.
fn storm_holds(store: &str, mode: &str, extra: &[&str]) {
    let mut args = vec![
        "--store",
        store,
        "--mode",
        mode,
        "-n",
        "2000",
        "-c",
        "64",
        "--dup-rate",
        "0.123",
        "--lease",
        "300ms",
        "--error-rate",
        "0.03",
        "--panic-rate",
        "0.01",
        "--drop-rate",
        "0.01",
        "--json",
    ];
    args.extend_from_slice(extra);
    let out = storm(&args);
    let s = json(&out);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{store}/{mode}: {s:#}\nstderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(s["invariants_hold"], true);
    assert_eq!(s["double_executions"], 0);
    assert_eq!(s["foreign_answers"], 0);
    assert_eq!(s["false_successes"], 0);
    assert_eq!(s["requests"], 2000);
    let n = |f: &str| s[f].as_u64().unwrap();
    // Every request ended one way or another.
    let errors: u64 = s["errors"]
        .as_object()
        .unwrap()
        .values()
        .map(|v| v.as_u64().unwrap())
        .sum();
    let ends = n("executed")
        + n("takeovers")
        + n("recovered")
        + n("replays")
        + n("in_progress")
        + n("result_expired")
        + n("lease_lost")
        + n("unmarked")
        + n("business_errors")
        + n("panics")
        + n("dropped")
        + errors;
    assert_eq!(ends, 2000, "{s:#}");
    // Each body that reached its effect was answered as executed or taken over, exactly once.
    assert_eq!(n("executions"), n("executed") + n("takeovers"), "{s:#}");
    assert!(n("replays") > 0, "a storm with duplicates replays: {s:#}");
    assert!(n("business_errors") > 0 && n("panics") > 0, "{s:#}");
    let rate = s["duplicate_rate"].as_f64().unwrap();
    assert!((0.09..0.16).contains(&rate), "duplicate rate {rate}");
}

#[test]
fn memory_lease() {
    storm_holds("memory", "lease", &[]);
}

#[test]
fn sqlite_lease() {
    storm_holds("sqlite", "lease", &[]);
}

#[test]
fn sqlite_tx() {
    storm_holds("sqlite", "tx", &[]);
}

#[test]
fn sharded_lease() {
    storm_holds("sharded", "lease", &[]);
}

#[test]
fn sharded_tx() {
    storm_holds("sharded", "tx", &[]);
}

/// Results kept 5 ms under keys kept the default 10 minutes, duplicates reaching far back (no
/// skew): late duplicates are refused as result expired, never run, and every refusal is of a
/// key whose effect the ledger holds.
#[test]
fn late_duplicates_after_the_result_ttl_are_refused_not_run() {
    for mode in ["lease", "tx"] {
        let out = storm(&[
            "--store",
            "sqlite",
            "--mode",
            mode,
            "-n",
            "1500",
            "-c",
            "16",
            "--dup-rate",
            "0.4",
            "--skew",
            "0",
            "--result-ttl",
            "5ms",
            "--body",
            "2ms",
            "--seed",
            "5",
            "--json",
        ]);
        let s = json(&out);
        assert_eq!(out.status.code(), Some(0), "{mode}: {s:#}");
        assert_eq!(s["invariants_hold"], true, "{mode}: {s:#}");
        assert_eq!(s["double_executions"], 0, "{mode}: {s:#}");
        assert_eq!(s["false_refusals"], 0, "{mode}: {s:#}");
        assert!(
            s["result_expired"].as_u64().unwrap() > 0,
            "{mode}: late duplicates meet tombstones: {s:#}"
        );
    }
}

/// Whether the service at `host:port` answers; a skip line (or, under
/// `IDEM_REQUIRE_SERVICES=1`, a failure) when it does not.
#[cfg(any(feature = "redis", feature = "postgres", feature = "mysql"))]
fn reachable(name: &str, addr: &str) -> bool {
    let up = addr
        .parse()
        .ok()
        .and_then(|a| {
            std::net::TcpStream::connect_timeout(&a, std::time::Duration::from_secs(2)).ok()
        })
        .is_some();
    if !up {
        assert!(
            std::env::var("IDEM_REQUIRE_SERVICES").as_deref() != Ok("1"),
            "{name} at {addr} is unreachable and IDEM_REQUIRE_SERVICES=1"
        );
        eprintln!(
            "skipped: {name} at {addr} is unreachable; set IDEM_REQUIRE_SERVICES=1 to fail instead"
        );
    }
    up
}

#[cfg(feature = "redis")]
#[test]
fn redis_lease() {
    if std::env::var("IDEM_REDIS_URL").is_err() && !reachable("Redis", "127.0.0.1:6379") {
        return;
    }
    storm_holds("redis", "lease", &[]);
}

/// A 3-master cluster this test starts itself: the same storm, every key on its own slot's node.
#[cfg(feature = "redis")]
#[test]
fn redis_cluster_lease() {
    let Some(cluster) = redis_cluster::Cluster::start() else {
        return;
    };
    let nodes = cluster.urls().join(",");
    storm_holds("redis-cluster", "lease", &["--cluster-nodes", &nodes]);
}

/// Without a heartbeat a body slower than its lease is taken over while it still runs: both
/// bodies reach their effect. The audit must see it and the exit status must say so.
#[test]
fn the_audit_catches_double_executions() {
    let out = storm(&[
        "--store",
        "sqlite",
        "-n",
        "1500",
        "-c",
        "64",
        "--dup-rate",
        "0.5",
        "--skew",
        "0.2",
        "--lease",
        "100ms",
        "--slow-rate",
        "0.5",
        "--no-heartbeat",
        "--seed",
        "11",
        "--json",
    ]);
    let s = json(&out);
    assert_eq!(out.status.code(), Some(1), "{s:#}");
    assert_eq!(s["invariants_hold"], false);
    assert!(s["double_executions"].as_u64().unwrap() > 0, "{s:#}");
    assert!(s["lease_lost"].as_u64().unwrap() > 0, "{s:#}");
}

/// Slow bodies (one and a half leases each) with the heartbeat (the default): no double execution.
///
/// The lease is 400 ms, not the 100 ms above: a renewal sent a third of a lease in has to land
/// before the lease ends, and in CI (two cores shared with the rest of the suite, 64 callers queued
/// on SQLite's one writer) one renewal once took longer than the 67 ms that left, the lease was
/// taken over and the body ran twice. The heartbeat keeps a live holder's lease; it cannot fence a
/// holder whose renewal does not land in time, and the audit counts that as a double execution.
#[test]
fn the_heartbeat_keeps_slow_bodies_single() {
    let out = storm(&[
        "--store",
        "sqlite",
        "-n",
        "1500",
        "-c",
        "64",
        "--dup-rate",
        "0.5",
        "--skew",
        "0.2",
        "--lease",
        "400ms",
        "--slow-rate",
        "0.5",
        "--seed",
        "11",
        "--json",
    ]);
    let s = json(&out);
    assert_eq!(out.status.code(), Some(0), "{s:#}");
    assert_eq!(s["double_executions"], 0);
    assert_eq!(s["lease_lost"], 0);
}

/// A storm without the heartbeat like `the_audit_catches_double_executions` (its seed, 50 %
/// duplicates), with duplicates reaching anywhere back (`--skew 0`), so that more of them arrive
/// while a body outlives its 200 ms lease; the fault and `--recover` in `extra`.
fn no_heartbeat_storm(store: &str, extra: &[&str]) -> (Option<i32>, serde_json::Value) {
    let mut args = vec![
        "--store",
        store,
        "-n",
        "2000",
        "-c",
        "64",
        "--dup-rate",
        "0.5",
        "--skew",
        "0",
        "--lease",
        "200ms",
        "--no-heartbeat",
        "--seed",
        "11",
        "--json",
    ];
    args.extend_from_slice(extra);
    let out = storm(&args);
    (out.status.code(), json(&out))
}

/// Bodies that write their effect and then stall 1.5 leases without a heartbeat (a holder paused
/// between its effect and its mark) are taken over while they stall. Without `--recover` the
/// takeover runs the effect again: the scenario bites. With it, the takeover's recover fn reads the
/// ledger, finds the effect and answers with that run: no key runs twice, every answer is the run
/// the ledger holds, and the stalled holder wakes to a lost lease.
fn recover_prevents_the_double_executions_of_stalled_holders(store: &str, extra: &[&str]) {
    let stall: Vec<&str> = ["--stall-rate", "0.5"]
        .iter()
        .chain(extra)
        .copied()
        .collect();
    let (code, s) = no_heartbeat_storm(store, &stall);
    assert_eq!(code, Some(1), "{store} without --recover: {s:#}");
    assert!(s["double_executions"].as_u64().unwrap() > 0, "{s:#}");
    assert_eq!(s["recovered"], 0, "{s:#}");

    let recover: Vec<&str> = stall.iter().copied().chain(["--recover"]).collect();
    let (code, s) = no_heartbeat_storm(store, &recover);
    assert_eq!(code, Some(0), "{store} with --recover: {s:#}");
    assert_eq!(s["invariants_hold"], true);
    assert_eq!(s["double_executions"], 0, "{s:#}");
    assert_eq!(s["foreign_answers"], 0, "{s:#}");
    assert_eq!(s["split_answers"], 0, "{s:#}");
    assert_eq!(s["false_successes"], 0, "{s:#}");
    let n = |f: &str| s[f].as_u64().unwrap();
    assert!(n("recovered") > 0, "no takeover found an effect: {s:#}");
    // Each recovered takeover left a stalled holder behind, which finds its claim gone.
    assert!(n("lease_lost") >= n("recovered"), "{s:#}");
    // One effect per key; each answered once: to its own caller, or (its caller's lease lost) to
    // the takeover that recovered it.
    assert_eq!(n("executions"), n("distinct_keys"), "{s:#}");
    assert_eq!(
        n("executions"),
        n("executed") + n("takeovers") + n("lease_lost"),
        "{s:#}"
    );
}

#[test]
fn recover_memory() {
    recover_prevents_the_double_executions_of_stalled_holders("memory", &[]);
}

#[test]
fn recover_sqlite() {
    recover_prevents_the_double_executions_of_stalled_holders("sqlite", &[]);
}

#[test]
fn recover_sharded() {
    recover_prevents_the_double_executions_of_stalled_holders("sharded", &[]);
}

#[cfg(feature = "redis")]
#[test]
fn recover_redis() {
    if std::env::var("IDEM_REDIS_URL").is_err() && !reachable("Redis", "127.0.0.1:6379") {
        return;
    }
    recover_prevents_the_double_executions_of_stalled_holders("redis", &[]);
}

#[cfg(feature = "postgres")]
#[test]
fn recover_postgres() {
    if postgres_up() {
        recover_prevents_the_double_executions_of_stalled_holders("postgres", &[]);
    }
}

#[cfg(feature = "mysql")]
#[test]
fn recover_mysql() {
    if mysql_up() {
        recover_prevents_the_double_executions_of_stalled_holders("mysql", &[]);
    }
}

/// `--slow-rate` bodies are slow *before* their effect: a takeover's recover fn finds nothing, the
/// takeover runs the body, and the slow holder writes its effect afterwards. That is a real double
/// execution no recover fn can prevent (only the heartbeat does): the audit still reports it, and
/// still accepts no wrong answer.
#[test]
fn recover_cannot_prevent_a_takeover_before_the_effect() {
    let (code, s) = no_heartbeat_storm("sqlite", &["--slow-rate", "0.5", "--recover"]);
    assert_eq!(code, Some(1), "{s:#}");
    assert_eq!(s["invariants_hold"], false);
    assert!(s["double_executions"].as_u64().unwrap() > 0, "{s:#}");
    assert_eq!(s["foreign_answers"], 0, "{s:#}");
    assert_eq!(s["split_answers"], 0, "{s:#}");
    assert_eq!(s["false_successes"], 0, "{s:#}");
}

#[test]
fn the_table_and_the_plot() {
    let dir = tempfile::tempdir().unwrap();
    let svg = dir.path().join("storm.svg");
    let out = storm(&[
        "--store",
        "memory",
        "-n",
        "500",
        "--plot",
        svg.to_str().unwrap(),
        "--quiet",
    ]);
    assert_eq!(out.status.code(), Some(0));
    let table = String::from_utf8(out.stdout).unwrap();
    for row in [
        "requests",
        "recovered            0",
        "double executions",
        "throughput",
        "latency p99",
        "invariants           hold",
    ] {
        assert!(table.contains(row), "no `{row}` in\n{table}");
    }
    let picture = std::fs::read_to_string(&svg).unwrap();
    assert!(
        picture.starts_with("<svg"),
        "{}",
        &picture[..100.min(picture.len())]
    );
    for caption in ["Throughput", "Outcome mix", "Latency"] {
        assert!(picture.contains(caption), "no `{caption}` in the plot");
    }
}

/// Flags that cannot work: a clear message naming the flag, exit status 2, no storm.
#[test]
fn bad_flags_are_refused() {
    let cases: &[(&[&str], &str)] = &[
        (&["--dup-rate", "1.5"], "not between 0 and 1"),
        (&["--dup-rate", "x"], "not a number"),
        (&["-c", "0"], "0 is not in 1..=10000"),
        (&["-n", "0"], "0 is not in 1..=100000000"),
        (&["--lease", "soon"], "not a duration"),
        (
            &["--lease", "1s", "--ttl", "1s"],
            "--ttl (1s) must be longer than --lease (1s)",
        ),
        (&["--lease", "1ms"], "--lease must be at least 10ms"),
        (
            &["--error-rate", "0.6", "--panic-rate", "0.6"],
            "add up to 1.200",
        ),
        (
            &["--store", "memory", "--mode", "tx"],
            "--mode tx needs a store with transactions",
        ),
        (&["--store", "redis-cluster"], "needs --cluster-nodes"),
        (
            &["--store", "nosuch"],
            "invalid value 'nosuch' for '--store",
        ),
        (&["--skew", "-1"], "unexpected argument '-1'"),
        (
            &["--store", "sqlite", "--mode", "tx", "--recover"],
            "--recover needs --mode lease",
        ),
        (
            &["--slow-rate", "0.6", "--stall-rate", "0.6"],
            "--stall-rate, --panic-rate and --drop-rate add up to 1.200",
        ),
    ];
    for (args, says) in cases {
        let out = storm(args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(
            err.contains(says),
            "{args:?} should say `{says}`, said: {err}"
        );
        assert!(out.stdout.is_empty(), "{args:?} printed a summary");
    }
}

#[cfg(feature = "postgres")]
fn postgres_up() -> bool {
    std::env::var("IDEM_PG_URL").is_ok() || reachable("Postgres", "127.0.0.1:5432")
}

#[cfg(feature = "postgres")]
#[test]
fn postgres_lease() {
    if postgres_up() {
        storm_holds("postgres", "lease", &[]);
    }
}

#[cfg(feature = "postgres")]
#[test]
fn postgres_tx() {
    if postgres_up() {
        storm_holds("postgres", "tx", &[]);
    }
}

#[cfg(feature = "mysql")]
fn mysql_up() -> bool {
    std::env::var("IDEM_MYSQL_URL").is_ok() || reachable("MariaDB", "127.0.0.1:3306")
}

#[cfg(feature = "mysql")]
#[test]
fn mysql_lease() {
    if mysql_up() {
        storm_holds("mysql", "lease", &[]);
    }
}

#[cfg(feature = "mysql")]
#[test]
fn mysql_tx() {
    if mysql_up() {
        storm_holds("mysql", "tx", &[]);
    }
}
