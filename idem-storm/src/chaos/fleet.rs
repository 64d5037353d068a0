//! A fault storm's application processes: what each is told, the worker itself (the storm
//! driver against the proxy, one line per finished request), and the fleet the storm starts, kills
//! and replaces.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::{store_timeout, with_url};
use crate::StormError;
use crate::args::Args;
use crate::drive::{self, Class, Hooks};
use crate::plan;
use crate::target::{self, Opening};

/// What a worker process is told, as JSON in its `--chaos-worker` flag.
#[derive(Debug, Serialize, Deserialize)]
struct WorkerSpec {
    /// Numbers the process's runs: `id << 40` and up.
    id: u32,
    biz: String,
    /// The store's URL through the proxy.
    url: String,
    /// The lease-mode ledger file every process shares.
    ledger: Option<PathBuf>,
}

/// A worker process: the storm driver against the proxy until its stdin closes, one line per
/// finished request on stdout.
///
/// # Errors
/// [`StormError::Setup`] for a malformed spec; the store's error when it cannot be opened within
/// a minute (it may be paused, silent or restarting as the process starts, so it keeps trying).
pub async fn work(args: &Args, spec: &str) -> Result<(), StormError> {
    let spec: WorkerSpec = serde_json::from_str(spec)
        .map_err(|e| StormError::Setup(format!("--chaos-worker: {e}")))?;
    let args = with_url(args, &spec.url);
    let opening = Opening {
        ledger: spec.ledger.clone(),
        migrate: false,
    };
    let started = Instant::now();
    let target = loop {
        match target::open_with(&args, &opening).await {
            Ok(target) => break target,
            Err(_) if started.elapsed() < Duration::from_secs(60) => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => return Err(e),
        }
    };
    let stop = Arc::new(AtomicBool::new(false));
    let stopping = stop.clone();
    std::thread::spawn(move || {
        let _ = std::io::copy(&mut std::io::stdin().lock(), &mut std::io::sink());
        stopping.store(true, Ordering::Relaxed);
    });
    let report: drive::Report = Arc::new(|key, class, latency, run| {
        let mut out = std::io::stdout().lock();
        let run = run.map_or_else(|| "-".to_owned(), |r| r.to_string());
        let _ = writeln!(out, "{key} {} {} {run}", class.label(), latency.as_micros());
        let _ = out.flush();
    });
    let seed = args.seed.unwrap_or_else(|| fastrand::u64(..));
    let plan = Arc::new(plan::plan(&args, seed));
    drive::drive(
        &args,
        plan,
        &target,
        target.ledger.clone(),
        spec.biz.into(),
        Arc::new(AtomicU64::new(0)),
        Hooks {
            run_base: i64::from(spec.id) << 40,
            stop: Some(stop),
            report: Some(report),
        },
    )
    .await;
    Ok(())
}

/// One request's end as a worker reported it.
pub(super) struct Seen {
    pub(super) key: u32,
    pub(super) class: Class,
    pub(super) latency: Duration,
    pub(super) run: Option<i64>,
    /// When it started, since the storm began.
    pub(super) at: Duration,
}

fn parse(line: &str, now: Duration) -> Option<Seen> {
    let mut parts = line.split_whitespace();
    let key = parts.next()?.parse().ok()?;
    let class = Class::from_label(parts.next()?)?;
    let latency = Duration::from_micros(parts.next()?.parse().ok()?);
    let run = match parts.next()? {
        "-" => None,
        r => Some(r.parse().ok()?),
    };
    Some(Seen {
        key,
        class,
        latency,
        run,
        at: now.saturating_sub(latency),
    })
}

/// One worker process and the thread reading its lines.
pub(super) struct Worker {
    child: Child,
    stdin: Option<ChildStdin>,
    reader: Option<std::thread::JoinHandle<()>>,
}

/// The application processes of a fault storm.
pub(super) struct Fleet<'a> {
    pub(super) args: &'a Args,
    pub(super) exe: &'a Path,
    pub(super) via: String,
    pub(super) biz: String,
    pub(super) ledger: Option<PathBuf>,
    pub(super) seed: u64,
    pub(super) start: Instant,
    pub(super) seen: Arc<Mutex<Vec<Seen>>>,
    pub(super) workers: Vec<Worker>,
    pub(super) started: u32,
}

/// Every storm flag a worker needs, with its own seed.
fn worker_flags(args: &Args, seed: u64, requests: u64) -> Vec<String> {
    let d = |d: Duration| humantime::format_duration(d).to_string();
    let mut flags = vec![
        "--store".to_owned(),
        args.store.name().to_owned(),
        "--mode".to_owned(),
        args.mode.name().to_owned(),
        "-n".to_owned(),
        requests.to_string(),
        "--dup-rate".to_owned(),
        args.dup_rate.to_string(),
        "--skew".to_owned(),
        args.skew.to_string(),
        "-c".to_owned(),
        args.concurrency.to_string(),
        "--lease".to_owned(),
        d(args.lease),
        "--ttl".to_owned(),
        d(args.ttl),
        "--body".to_owned(),
        d(args.body),
        "--store-timeout".to_owned(),
        d(store_timeout(args)),
        "--seed".to_owned(),
        seed.to_string(),
        "--quiet".to_owned(),
    ];
    if let Some(kept) = args.result_ttl {
        flags.extend(["--result-ttl".to_owned(), d(kept)]);
    }
    if args.recover {
        flags.push("--recover".to_owned());
    }
    if args.no_heartbeat {
        flags.push("--no-heartbeat".to_owned());
    }
    flags
}

impl Fleet<'_> {
    /// Starts one more worker process.
    pub(super) fn spawn(&mut self) -> Result<(), StormError> {
        self.started += 1;
        let spec = WorkerSpec {
            id: self.started,
            biz: self.biz.clone(),
            url: self.via.clone(),
            ledger: self.ledger.clone(),
        };
        let secs = self.args.chaos.unwrap_or_default().as_secs().max(1);
        let requests = (secs * 1000).clamp(10_000, 2_000_000);
        let mut child = Command::new(self.exe)
            .arg("--chaos-worker")
            .arg(serde_json::to_string(&spec).expect("a spec serializes"))
            .args(worker_flags(
                self.args,
                self.seed.wrapping_add(u64::from(self.started)),
                requests,
            ))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| {
                StormError::Setup(format!(
                    "cannot start a worker process ({}): {e}",
                    self.exe.display()
                ))
            })?;
        let stdout = child.stdout.take().expect("piped");
        let (seen, start) = (self.seen.clone(), self.start);
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if let Some(one) = parse(&line, start.elapsed()) {
                    seen.lock().unwrap_or_else(|p| p.into_inner()).push(one);
                }
            }
        });
        self.workers.push(Worker {
            stdin: child.stdin.take(),
            child,
            reader: Some(reader),
        });
        Ok(())
    }

    /// Kills a worker picked at random (SIGKILL: its calls in flight never answer).
    pub(super) fn kill_one(&mut self, rng: &mut fastrand::Rng) {
        let mut worker = self.workers.swap_remove(rng.usize(..self.workers.len()));
        let _ = worker.child.kill();
        let _ = worker.child.wait();
        if let Some(reader) = worker.reader.take() {
            let _ = reader.join();
        }
    }

    /// Tells every worker to stop (stdin closed), waits until each has finished its calls in
    /// flight (at most `within`), and kills the ones that have not.
    pub(super) async fn stop(&mut self, within: Duration) {
        for worker in &mut self.workers {
            worker.stdin.take();
        }
        let until = Instant::now() + within;
        for worker in &mut self.workers {
            while Instant::now() < until && matches!(worker.child.try_wait(), Ok(None)) {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            let _ = worker.child.kill();
            let _ = worker.child.wait();
            if let Some(reader) = worker.reader.take() {
                let _ = reader.join();
            }
        }
    }
}

impl Drop for Fleet<'_> {
    fn drop(&mut self) {
        for worker in &mut self.workers {
            let _ = worker.child.kill();
            let _ = worker.child.wait();
        }
    }
}
