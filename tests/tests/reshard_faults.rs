//! Holders that die, stall, or lose a shard's server while a sharded store moves from two shards
//! to three (docs/DESIGN.md, "Resharding"), on Redis servers this test starts itself (AOF with
//! `appendfsync always`, so a restart keeps every acknowledged write).
//!
//! A child process (this binary run again, `child` below) claims every key on the old list and
//! holds it: its body writes the key's effect, says so, and waits. Then the reshard runs while
//! callers on a process with the old list and on one with every shard call the keys (with a
//! recover fn that finds the effect), and:
//!
//! - **killed**: the child gets SIGKILL while the tool stands for its claims on the new shard;
//!   its leases end during the move, and callers take its keys over beside the tool;
//! - **paused**: the child gets SIGSTOP before the move and SIGCONT after `done`, with no other
//!   caller during the move, so the tool alone must fence it out of the old shard: after every
//!   key was taken over on the new list, each of its late renewals and marks must be refused;
//! - **shard restarted**: the child marks its keys during the copy while the new shard's server
//!   is killed (SIGKILL) and started again; the tool, run again after its error, finishes.
//!
//! Effects are lines appended to a file by both processes (independent of the stores and of
//! idem's counters): every key's effect happens exactly once, and every key then replays the
//! first answer (the holder's receipt, or the recovered one) on the new list.

#![cfg(feature = "redis")]

#[path = "support/redis_server.rs"]
mod redis_server;

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use idem::sharding::{Phase, Reshard};
use idem::{Call, IdemError, RedisStore, ShardedStore};
use idem_suite::doc_table::{SharedRows, Table, rate};
use redis_server::RedisServer;

const BIZ: &str = "MOVE";
const KEYS: usize = 48;
const LEASE: Duration = Duration::from_secs(3);

fn key(i: usize) -> String {
    format!("held-{i}")
}

/// Appends `key` to the effects file (one short `O_APPEND` write: whole lines, whichever process
/// writes).
fn record(effects: &Path, key: &str) {
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(effects)
        .unwrap();
    f.write_all(format!("{key}\n").as_bytes()).unwrap();
}

fn counts(effects: &Path) -> HashMap<String, usize> {
    let mut n = HashMap::new();
    for line in std::fs::read_to_string(effects).unwrap_or_default().lines() {
        *n.entry(line.to_owned()).or_default() += 1;
    }
    n
}

async fn open(urls: &[String]) -> ShardedStore<RedisStore> {
    let mut shards = Vec::new();
    for url in urls {
        shards.push(RedisStore::connect(url).await.unwrap());
    }
    ShardedStore::new(shards).unwrap()
}

/// One call of `key` as the callers make it: a takeover finds the effect and answers without
/// running the body; a body that runs writes the effect.
async fn call(
    store: &ShardedStore<RedisStore>,
    effects: &Path,
    key: &str,
) -> Result<String, IdemError> {
    let recovered = format!("recovered {key}");
    Call::new(BIZ, key)
        .lease(LEASE)
        .ttl(Duration::from_secs(3600))
        .recover(|| async move { Ok(counts(effects).contains_key(key).then_some(recovered)) })
        .run(store, async {
            record(effects, key);
            Ok(format!("ran {key}"))
        })
        .await
}

/// The child: claims every key on the shards `IDEM_RESHARD_CHILD` names and holds each for its
/// hold time after writing the effect; prints `held K` once each body runs, and `answer K …`
/// when each call returns. Does nothing when the variable is not set.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn child() {
    let Ok(spec) = std::env::var("IDEM_RESHARD_CHILD") else {
        return;
    };
    // Never outlive the parent: exit when its end of stdin closes, and after two minutes.
    std::thread::spawn(|| {
        let _ = std::io::Read::read_to_end(&mut std::io::stdin(), &mut Vec::new());
        std::process::exit(3);
    });
    std::thread::spawn(|| {
        std::thread::sleep(Duration::from_secs(120));
        std::process::exit(4);
    });
    let mut parts = spec.split(' ');
    let effects = PathBuf::from(parts.next().unwrap());
    let hold = Duration::from_millis(parts.next().unwrap().parse().unwrap());
    let urls: Vec<String> = parts.map(str::to_owned).collect();
    let store = open(&urls).await;
    // The test harness printed "test child ... " without a line end.
    println!();
    let calls = (0..KEYS).map(|i| {
        let (store, effects, k) = (store.clone(), effects.clone(), key(i));
        tokio::spawn(async move {
            let answer: Result<String, IdemError> = Call::new(BIZ, &k)
                .lease(LEASE)
                .ttl(Duration::from_secs(3600))
                .run(&store, async {
                    record(&effects, &k);
                    println!("held {k}");
                    tokio::time::sleep(hold).await;
                    Ok(format!("receipt of {k}"))
                })
                .await;
            match answer {
                Ok(a) => println!("answer {k} ok {a}"),
                Err(IdemError::LeaseLost { .. }) => println!("answer {k} lease-lost"),
                Err(e) => println!("answer {k} error {e}"),
            }
        })
    });
    for c in futures_util::future::join_all(calls.collect::<Vec<_>>()).await {
        c.unwrap();
    }
}

/// The child process and the lines it printed.
struct Holder {
    child: Child,
    lines: std::sync::mpsc::Receiver<String>,
}

impl Holder {
    fn start(effects: &Path, hold: Duration, urls: &[String]) -> Holder {
        let spec = format!(
            "{} {} {}",
            effects.display(),
            hold.as_millis(),
            urls.join(" ")
        );
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "child", "--nocapture", "--test-threads=1"])
            .env("IDEM_RESHARD_CHILD", spec)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let out = BufReader::new(child.stdout.take().unwrap());
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in out.lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        Holder { child, lines }
    }

    /// Waits for the lines starting with `prefix`, one per key; returns them.
    fn expect(&self, prefix: &str, within: Duration) -> Vec<String> {
        let until = Instant::now() + within;
        let mut got = Vec::new();
        while got.len() < KEYS {
            let left = until.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) if line.starts_with(prefix) => got.push(line),
                Ok(_) => {}
                Err(e) => panic!("{} of {KEYS} `{prefix}` lines, then {e}", got.len()),
            }
        }
        got
    }

    fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args([signal, &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success(), "kill {signal}");
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What is done to the holders or the shards during the move.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Fault {
    Killed,
    Paused,
    ShardRestarted,
}

/// Calls random keys on `store` until `stop`; how many calls were answered.
async fn caller(
    store: ShardedStore<RedisStore>,
    effects: PathBuf,
    stop: Arc<AtomicBool>,
    answered: Arc<AtomicU64>,
    seed: u64,
) {
    let mut x = seed | 1;
    while !stop.load(Ordering::Relaxed) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let k = key((x % KEYS as u64) as usize);
        match call(&store, &effects, &k).await {
            Ok(answer) => {
                assert!(answer.ends_with(&k), "{k}: {answer}");
                answered.fetch_add(1, Ordering::Relaxed);
            }
            // In progress under the holder; a key the old list's process cannot serve; a shard
            // being restarted.
            Err(IdemError::InProgress { .. } | IdemError::StoreUnavailable { .. }) => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("{k}: {e:?}"),
        }
    }
}

/// One move at a time: each starts three servers and a child, and picks its ports by the
/// process id.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn move_with(fault: Fault) {
    if !redis_server::installed() {
        return;
    }
    let _alone = ONE_AT_A_TIME.lock().await;
    let dir = redis_server::scratch_dir(&format!("reshard-{fault:?}"));
    let servers: Vec<RedisServer> = redis_server::ports(29_000, 3)
        .map(|port| {
            let at = dir.join(port.to_string());
            std::fs::create_dir_all(&at).unwrap();
            RedisServer::start_durable(port, &at)
        })
        .collect();
    let urls: Vec<String> = servers.iter().map(RedisServer::url).collect();
    let effects = dir.join("effects");
    let started = Instant::now();
    // A killed holder never marks; a paused one sleeps through its hold and marks as soon as it
    // wakes; the others mark about 20 s in, during the copy.
    let hold = match fault {
        Fault::Killed => Duration::from_secs(100),
        Fault::Paused => Duration::from_secs(5),
        Fault::ShardRestarted => Duration::from_secs(20),
    };
    let holder = Holder::start(&effects, hold, &urls[..2]);
    holder.expect("held ", Duration::from_secs(30));
    if fault == Fault::Paused {
        holder.signal("-STOP");
    }
    let (from, to) = (open(&urls[..2]).await, open(&urls).await);
    // Announced first, as the guide says: a process given every shard then routes by the layout.
    Reshard::new(&from, &to)
        .plan_only()
        .run(|_| {})
        .await
        .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let answered = Arc::new(AtomicU64::new(0));
    let mut callers = Vec::new();
    // No caller beside a paused holder: the tool alone must fence it out of the old shard.
    let lists: &[&[String]] = match fault {
        Fault::Paused => &[],
        _ => &[&urls[..2], &urls[..], &urls[..]],
    };
    for (n, list) in lists.iter().enumerate() {
        callers.push(tokio::spawn(caller(
            open(list).await,
            effects.clone(),
            stop.clone(),
            answered.clone(),
            11 + n as u64 * 7_919,
        )));
    }
    // Whether the fault was done (once).
    let mut restarted = false;
    let mut runs = 0;
    let done = loop {
        runs += 1;
        assert!(runs <= 5, "the reshard did not finish in 5 runs");
        let holder = &holder;
        let servers = &servers;
        let restarted = &mut restarted;
        let tool = Reshard::new(&from, &to);
        let run = tool.run(|p| match fault {
            Fault::Killed if p.waiting > 0 && !*restarted => {
                *restarted = true;
                let _ = Command::new("kill")
                    .args(["-KILL", &holder.child.id().to_string()])
                    .status();
            }
            Fault::ShardRestarted if p.waiting > 0 && !*restarted => {
                *restarted = true;
                servers[2].kill();
                std::thread::sleep(Duration::from_secs(1));
                servers[2].start_again();
            }
            _ => {}
        });
        match run.await {
            Ok(done) => break done,
            Err(e) => {
                assert!(
                    matches!(e, IdemError::StoreUnavailable { .. }),
                    "{fault:?}: the reshard failed with {e:?}"
                );
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    };
    assert_eq!(done.phase, Some(Phase::Done));
    if fault == Fault::ShardRestarted {
        assert!(
            restarted,
            "the tool waited for a holder, and the shard was restarted then"
        );
    }
    // Every key called once more on the new list: a takeover for every key the holder did not
    // mark (the callers may have missed some).
    for i in 0..KEYS {
        let k = key(i);
        let answer = loop {
            match call(&to, &effects, &k).await {
                Err(IdemError::InProgress { .. } | IdemError::StoreUnavailable { .. }) => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                other => break other.unwrap(),
            }
        };
        let want = match fault {
            Fault::ShardRestarted => format!("receipt of {k}"),
            _ => format!("recovered {k}"),
        };
        assert_eq!(
            answer,
            want,
            "{fault:?}: effects {:?}",
            counts(&effects).get(&k)
        );
    }
    let mut late_marks = "—".to_owned();
    if fault == Fault::Paused {
        // Woken after every key was taken over: not one renewal or mark of it is taken.
        holder.signal("-CONT");
        let answers = holder.expect("answer ", Duration::from_secs(30));
        let taken = answers
            .iter()
            .filter(|a| !a.ends_with("lease-lost"))
            .count();
        late_marks = format!("{taken} of {}", answers.len());
        for a in &answers {
            assert!(
                a.ends_with("lease-lost"),
                "a paused holder's late mark: {a}"
            );
        }
    }
    stop.store(true, Ordering::Relaxed);
    for c in callers {
        c.await.unwrap();
    }
    let ran = counts(&effects);
    for i in 0..KEYS {
        let k = key(i);
        assert_eq!(ran.get(&k), Some(&1), "{fault:?}: {k}'s effect");
        // Replayed, not run, on the new list and on any order of it.
        let again = call(
            &open(&[urls[2].clone(), urls[0].clone(), urls[1].clone()]).await,
            &effects,
            &k,
        )
        .await
        .unwrap();
        assert!(again.ends_with(&k) && !again.starts_with("ran"), "{again}");
    }
    println!(
        "{fault:?}: {KEYS} held keys, {} answered calls beside the move, {runs} tool run(s), \
         copied {} of {} moving records, {:?}; every effect once",
        answered.load(Ordering::Relaxed),
        done.copied,
        done.walked,
        started.elapsed()
    );
    let (order, said) = match fault {
        Fault::Killed => (0, "holder killed"),
        Fault::Paused => (1, "holder paused through the move"),
        Fault::ShardRestarted => (2, "new shard's server restarted"),
    };
    Table::new(
        "reshard-faults",
        &[
            "fault",
            "calls answered beside the move",
            "tool runs",
            "moving records copied / walked",
            "took",
            "effects twice",
            "late marks taken",
        ],
    )
    .emit_shared(
        &FIGURES,
        &order.to_string(),
        [
            said.to_owned(),
            rate(answered.load(Ordering::Relaxed) as f64),
            runs.to_string(),
            format!("{} / {}", done.copied, done.walked),
            format!("{:.1} s", started.elapsed().as_secs_f64()),
            ran.values().filter(|n| **n > 1).count().to_string(),
            late_marks,
        ],
    );
    drop(holder);
    for s in &servers {
        s.shutdown_nosave();
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_holder_killed_during_the_move_is_taken_over_once() {
    move_with(Fault::Killed).await;
}

/// Every fault's row, for docs/RELIABILITY.md (`tests/reliability.sh`).
static FIGURES: SharedRows = SharedRows::new();

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_holder_paused_through_the_move_is_refused_when_it_wakes() {
    move_with(Fault::Paused).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_new_shard_restarted_during_the_copy_loses_nothing() {
    move_with(Fault::ShardRestarted).await;
}
