//! The fault storm (`--chaos`) on real servers: Postgres, MariaDB and Redis in lease mode with
//! `--recover`, and Postgres and MariaDB in tx mode. Each run starts a private server, three
//! application processes (this package's `idem-storm` binary), and for `IDEM_CHAOS_SECS` seconds
//! (default 12) injects, one after another at random, a killed application process, a frozen
//! server (SIGSTOP), a silent network (a proxy that forwards nothing and closes nothing) and a
//! server killed and restarted. Then every key is called again until it answers, and the ledger
//! (the business's own table, never idem's counters) must show no key run twice, no answer that
//! is not the run the ledger holds, no SUCCEEDED record without its effect, every answered call
//! within its deadline, and no key left without an answer.
//!
//! The runs take turns: each loads both cores of a small machine by itself.

#![cfg(any(feature = "redis", feature = "postgres", feature = "mysql"))]

use std::path::Path;
use std::time::Duration;

use clap::Parser;
use idem_storm::{Args, StoreKind, Summary};

/// One storm at a time.
static TURN: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn seconds() -> u64 {
    std::env::var("IDEM_CHAOS_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(12)
}

/// Whether this machine can start the store's private server; one skip line when not, a
/// failure under `IDEM_REQUIRE_SERVICES=1`.
fn can_run(kind: StoreKind) -> bool {
    match idem_storm::chaos::available(kind) {
        Ok(()) => true,
        Err(missing) => {
            assert!(
                std::env::var("IDEM_REQUIRE_SERVICES").as_deref() != Ok("1"),
                "{missing} and IDEM_REQUIRE_SERVICES=1"
            );
            eprintln!("skipped: {missing}");
            false
        }
    }
}

async fn storm(store: &str, mode: &str, seed: u64) -> Option<Summary> {
    let mut argv = vec![
        "idem-storm".to_owned(),
        "--chaos".to_owned(),
        format!("{}s", seconds()),
        "--store".to_owned(),
        store.to_owned(),
        "--mode".to_owned(),
        mode.to_owned(),
        "--workers".to_owned(),
        "3".to_owned(),
        "-c".to_owned(),
        "8".to_owned(),
        "--dup-rate".to_owned(),
        "0.5".to_owned(),
        "--lease".to_owned(),
        "2s".to_owned(),
        "--store-timeout".to_owned(),
        "1s".to_owned(),
        "--seed".to_owned(),
        seed.to_string(),
    ];
    if mode == "lease" {
        argv.push("--recover".to_owned());
    }
    let args = Args::parse_from(argv);
    if !can_run(args.store) {
        return None;
    }
    let _turn = TURN.lock().await;
    let exe = Path::new(env!("CARGO_BIN_EXE_idem-storm"));
    let summary = tokio::time::timeout(
        Duration::from_secs(seconds() + 240),
        idem_storm::chaos::storm(&args, exe),
    )
    .await
    .expect("the fault storm ends")
    .expect("the fault storm runs");
    println!("{summary}");
    Some(summary)
}

/// Every invariant of the audit, and proof that the faults really met the calls.
fn held(s: &Summary) {
    let chaos = s.chaos.as_ref().expect("a fault storm's report");
    assert_eq!(s.double_executions, 0, "{s}");
    assert_eq!(s.foreign_answers, 0, "no success lost or foreign:\n{s}");
    assert_eq!(s.split_answers, 0, "{s}");
    assert_eq!(s.false_successes, 0, "{s}");
    assert_eq!(
        chaos.over_deadline, 0,
        "every call answered within its deadline:\n{s}"
    );
    assert_eq!(chaos.unresolved_keys, 0, "{s}");
    assert!(s.invariants_hold, "{s}");
    for kind in ["kill", "pause", "silence", "restart"] {
        assert!(
            chaos.faults.get(kind).is_some_and(|n| *n > 0),
            "no `{kind}` injected:\n{s}"
        );
    }
    assert!(
        chaos.processes > chaos.workers,
        "a killed process was replaced:\n{s}"
    );
    assert!(
        s.errors.get("store-unavailable").is_some_and(|n| *n > 0),
        "the faults met the calls:\n{s}"
    );
    assert!(s.executions > 50, "the storm did work:\n{s}");
}

#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_lease_mode_with_recover_through_a_fault_storm() {
    if let Some(s) = storm("postgres", "lease", 101).await {
        held(&s);
    }
}

#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_tx_mode_through_a_fault_storm() {
    if let Some(s) = storm("postgres", "tx", 102).await {
        held(&s);
        assert_eq!(s.unmarked_effects, 0, "{s}");
    }
}

#[cfg(feature = "mysql")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_lease_mode_with_recover_through_a_fault_storm() {
    if let Some(s) = storm("mysql", "lease", 103).await {
        held(&s);
    }
}

#[cfg(feature = "mysql")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_tx_mode_through_a_fault_storm() {
    if let Some(s) = storm("mysql", "tx", 104).await {
        held(&s);
        assert_eq!(s.unmarked_effects, 0, "{s}");
    }
}

#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_lease_mode_with_recover_through_a_fault_storm() {
    if let Some(s) = storm("redis", "lease", 105).await {
        held(&s);
    }
}
