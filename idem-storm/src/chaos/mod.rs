//! The fault storm (`--chaos`): a private server of the store, application processes calling it
//! through a TCP proxy, and faults injected at random and repeatedly until the time is up: an
//! application process killed (SIGKILL) and replaced, the server frozen (SIGSTOP, then SIGCONT),
//! the network silent (the proxy forwards nothing and closes nothing; then it heals, delivering
//! what it held late, or leaving every connection of the silence dead for good), the server
//! killed and started again on its data.
//!
//! Every process is this same binary: a worker is started with the hidden `--chaos-worker` flag
//! and runs the usual storm driver against the proxy, writing one line per finished request
//! (`key class latency_us run`) as it happens, since it may be killed at any moment; it stops when
//! its stdin closes. After the faults, every key any process touched is called again (directly,
//! no faults) until it answers, and the ledger is audited as in any storm: no key with two
//! effects, no answer that is not the effect the ledger holds, no SUCCEEDED record without an
//! effect; plus every answered call within its deadline (its store steps times the store timeout).

mod fleet;
mod proxy;
mod server;

pub use fleet::work;
pub use proxy::Proxy;
pub use server::available;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::Path;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::args::{Args, ChaosFault, Mode, StoreKind};
use crate::drive::{self, Class, Driven, Hooks, Sample};
use crate::plan::{Fault, Plan, Request};
use crate::summary::{self, Summary};
use crate::target::{self, Opening};
use crate::{StormError, succeeded_keys};
use fleet::Fleet;

/// Scheduling slack in a call's deadline: processes are frozen and started on a small machine.
const SLACK: Duration = Duration::from_secs(1);

/// What a fault storm adds to a storm's summary.
#[derive(Debug, Clone, Serialize)]
pub struct ChaosReport {
    /// How long faults were injected, seconds.
    pub fault_seconds: f64,
    /// Application processes at any time.
    pub workers: u32,
    /// Application processes started in all (the first ones and each killed one's successor).
    pub processes: u32,
    /// Faults injected, by kind (`kill`, `pause`, `silence`, `restart`).
    pub faults: BTreeMap<String, u64>,
    /// Each call's store timeout, ms.
    pub store_timeout_ms: u64,
    /// The longest a call may take, ms: its store steps (lease mode 2: the claim, then the mark
    /// or the release; tx mode 5: begin, claim, the business write, mark, commit) times the store
    /// timeout, plus the body's time and 1 s of scheduling slack.
    pub deadline_ms: u64,
    /// Answered calls that took longer than the deadline.
    pub over_deadline: u64,
    /// The longest answered call, ms.
    pub longest_call_ms: f64,
    /// Calls made after the faults, to bring every key to an answer.
    pub drain_calls: u64,
    /// Keys still without an answer after the drain.
    pub unresolved_keys: u64,
}

impl fmt::Display for ChaosReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let must = |n: u64| if n == 0 { "ok" } else { "BROKEN" };
        let faults = self
            .faults
            .iter()
            .map(|(k, n)| format!("{k} {n}"))
            .collect::<Vec<_>>()
            .join(", ");
        let rows = [
            ("fault time", format!("{:.1} s", self.fault_seconds)),
            (
                "processes",
                format!("{} at once, {} in all", self.workers, self.processes),
            ),
            (
                "faults",
                if faults.is_empty() {
                    "none".into()
                } else {
                    faults
                },
            ),
            (
                "deadline",
                format!(
                    "{} ms (store timeout {} ms)",
                    self.deadline_ms, self.store_timeout_ms
                ),
            ),
            ("longest call", format!("{:.0} ms", self.longest_call_ms)),
            (
                "over deadline",
                format!("{}  {}", self.over_deadline, must(self.over_deadline)),
            ),
            ("drain calls", self.drain_calls.to_string()),
            (
                "unresolved keys",
                format!("{}  {}", self.unresolved_keys, must(self.unresolved_keys)),
            ),
        ];
        for (name, value) in rows {
            writeln!(f, "  {name:<20} {value}")?;
        }
        Ok(())
    }
}

fn with_url(args: &Args, url: &str) -> Args {
    let mut args = args.clone();
    match args.store {
        StoreKind::Postgres => args.pg_url = url.to_owned(),
        StoreKind::Mysql => args.mysql_url = url.to_owned(),
        _ => args.redis_url = url.to_owned(),
    }
    args
}

/// The store timeout the calls run with.
fn store_timeout(args: &Args) -> Duration {
    args.store_timeout
        .unwrap_or(idem::store::DEFAULT_STORE_TIMEOUT)
}

/// The longest a call may take (see [`ChaosReport::deadline_ms`]).
fn deadline(args: &Args) -> Duration {
    let steps = if args.mode == Mode::Tx { 5 } else { 2 };
    store_timeout(args) * steps + args.body + SLACK
}

/// The ledger's rows, read again when the first connection tried was one the server's restart
/// closed.
async fn ledger_rows(target: &target::Target, biz: &str) -> Result<Vec<(String, i64)>, StormError> {
    let mut tries = 0;
    loop {
        match target.ledger.rows(biz).await {
            Err(_) if tries < 5 => {
                tries += 1;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            read => return read,
        }
    }
}

/// Runs a fault storm as `args` describe it (`args.chaos` set), its worker processes started
/// from `worker_exe` (the `idem-storm` binary), and audits it.
///
/// # Errors
/// [`StormError`] when the options contradict each other, the machine cannot run a private
/// server of the store, or the store or ledger cannot be opened or read.
pub async fn storm(args: &Args, worker_exe: &Path) -> Result<Summary, StormError> {
    args.check().map_err(StormError::Setup)?;
    let Some(chaos) = args.chaos else {
        return Err(StormError::Setup("a fault storm needs --chaos".into()));
    };
    let kind = args.store;
    let joined = |e: tokio::task::JoinError| StormError::Setup(e.to_string());
    let mut server = tokio::task::spawn_blocking(move || server::Server::start(kind))
        .await
        .map_err(joined)??;
    let proxy = Proxy::start(server.addr())
        .await
        .map_err(|e| StormError::Setup(format!("cannot start the proxy: {e}")))?;
    let via = proxy.url(&server.url(), server.addr());
    let dir = tempfile::Builder::new()
        .prefix("idem-storm-chaos")
        .tempdir()
        .map_err(|e| StormError::Setup(format!("cannot make a temporary directory: {e}")))?;
    let ledger = (args.mode == Mode::Lease).then(|| dir.path().join("ledger.db"));
    let direct = with_url(args, &server.url());
    let target = target::open_with(
        &direct,
        &Opening {
            ledger: ledger.clone(),
            migrate: true,
        },
    )
    .await?;
    let biz = format!("CHAOS{:x}", fastrand::u64(..) & 0xffff_ffff_ffff);
    let seed = args.seed.unwrap_or_else(|| fastrand::u64(..));
    let mut rng = fastrand::Rng::with_seed(seed);
    let start = Instant::now();
    let mut fleet = Fleet {
        args,
        exe: worker_exe,
        via,
        biz: biz.clone(),
        ledger,
        seed,
        start,
        seen: Arc::new(Mutex::new(Vec::new())),
        workers: Vec::new(),
        started: 0,
    };
    for _ in 0..args.workers {
        fleet.spawn()?;
    }

    // Faults, one at a time, until the time is up. A pause or a silence lasts up to 1.25 times
    // the longer of the lease and two store timeouts: some end within a call's deadline, some
    // outlast it, some outlast the lease (so claims are taken over, and recovered).
    let longest = (store_timeout(args) * 2).max(args.lease) * 5 / 4;
    let mut faults: BTreeMap<String, u64> = BTreeMap::new();
    // Drawn from a shuffled bag of every kind asked for, refilled when empty: a short storm still
    // meets each kind, in a random order.
    let mut bag: Vec<ChaosFault> = Vec::new();
    while start.elapsed() < chaos {
        tokio::time::sleep(Duration::from_millis(rng.u64(300..1500))).await;
        if bag.is_empty() {
            bag.clone_from(&args.faults);
            bag.sort();
            bag.dedup();
            rng.shuffle(&mut bag);
        }
        let fault = bag.pop().expect("refilled");
        let hold = Duration::from_millis(rng.u64(100..=longest.as_millis().max(101) as u64));
        match fault {
            ChaosFault::Kill => {
                fleet.kill_one(&mut rng);
                fleet.spawn()?;
            }
            ChaosFault::Pause => {
                server.pause();
                tokio::time::sleep(hold).await;
                server.resume();
            }
            ChaosFault::Silence => {
                proxy.silence();
                tokio::time::sleep(hold).await;
                if rng.bool() {
                    proxy.heal();
                } else {
                    proxy.heal_new_only();
                }
            }
            ChaosFault::Restart => {
                let down = Duration::from_millis(rng.u64(0..1000));
                server = tokio::task::spawn_blocking(move || server.restart(down).map(|()| server))
                    .await
                    .map_err(joined)??;
            }
        }
        *faults.entry(fault.name().to_owned()).or_insert(0) += 1;
    }
    let fault_seconds = start.elapsed().as_secs_f64();
    fleet
        .stop(deadline(args) + args.lease + Duration::from_secs(5))
        .await;
    let processes = fleet.started;
    let seen = std::mem::take(&mut *fleet.seen.lock().unwrap_or_else(|p| p.into_inner()));
    drop(fleet);

    let key_of = |k: &str| k.strip_prefix("ORD-").and_then(|n| n.parse::<u32>().ok());
    let ledger_keys: Vec<u32> = ledger_rows(&target, &biz)
        .await?
        .iter()
        .filter_map(|(k, _)| key_of(k))
        .collect();
    let mut samples = Vec::with_capacity(seen.len());
    let mut answers = Vec::new();
    let mut expired = Vec::new();
    let mut pending = BTreeSet::new();
    for one in &seen {
        samples.push(Sample {
            at: one.at,
            latency: one.latency,
            class: one.class,
        });
        if let Some(run) = one.run {
            answers.push((one.key, run));
        }
        if one.class == Class::ResultExpired {
            expired.push(one.key);
        }
        pending.insert(one.key);
    }
    pending.extend(ledger_keys);
    let distinct_keys = pending.last().map_or(0, |k| k + 1);

    // The drain: every key again, without faults, until each has an answer (a claim a killed
    // process held is taken over once its lease ends).
    let drain_until =
        Instant::now() + args.lease * 2 + store_timeout(args) * 4 + Duration::from_secs(30);
    let mut drain_calls = 0u64;
    let mut round = 0i64;
    while !pending.is_empty() && Instant::now() < drain_until {
        round += 1;
        let plan = Plan {
            requests: pending
                .iter()
                .map(|&key| Request {
                    key,
                    fault: Fault::None,
                })
                .collect(),
            distinct_keys,
        };
        let driven = drive::drive(
            &direct,
            Arc::new(plan),
            &target,
            target.ledger.clone(),
            biz.clone().into(),
            Arc::new(AtomicU64::new(0)),
            Hooks {
                run_base: (i64::from(processes) + round) << 40,
                ..Hooks::default()
            },
        )
        .await;
        drain_calls += driven.samples.len() as u64;
        let offset = start.elapsed().saturating_sub(driven.elapsed);
        samples.extend(driven.samples.iter().map(|s| Sample {
            at: offset + s.at,
            ..*s
        }));
        for &(key, run) in &driven.answers {
            pending.remove(&key);
            answers.push((key, run));
        }
        for &key in &driven.expired {
            pending.remove(&key);
            expired.push(key);
        }
        if !pending.is_empty() {
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }

    let ledger_rows = ledger_rows(&target, &biz)
        .await?
        .into_iter()
        .filter_map(|(k, run)| key_of(&k).map(|k| (k, run)))
        .collect();
    let succeeded = succeeded_keys(&target, &biz, distinct_keys).await?;
    let deadline = deadline(args);
    let over_deadline = samples.iter().filter(|s| s.latency > deadline).count() as u64;
    let longest_call_ms = samples
        .iter()
        .map(|s| s.latency.as_secs_f64() * 1000.0)
        .fold(0.0, f64::max);
    let driven = Driven {
        samples,
        answers,
        expired,
        elapsed: start.elapsed(),
    };
    let mut summary = summary::summarize(
        summary::Setup {
            store: args.store.name(),
            mode: args.mode.name(),
            seed,
            concurrency: args.concurrency * args.workers,
            distinct_keys,
            tx_mode: args.mode == Mode::Tx,
        },
        &driven,
        &summary::Audit {
            ledger: ledger_rows,
            succeeded,
        },
    );
    let unresolved_keys = pending.len() as u64;
    summary.invariants_hold &= over_deadline == 0 && unresolved_keys == 0;
    summary.chaos = Some(ChaosReport {
        fault_seconds,
        workers: args.workers,
        processes,
        faults,
        store_timeout_ms: store_timeout(args).as_millis() as u64,
        deadline_ms: deadline.as_millis() as u64,
        over_deadline,
        longest_call_ms,
        drain_calls,
        unresolved_keys,
    });
    Ok(summary)
}
