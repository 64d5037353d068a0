//! Sends the planned requests, `concurrency` at a time, and records how each one ended.

use std::borrow::Cow;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use idem::metrics::{Outcome, observe};
use idem::state_machine::SqlValue;
use idem::{Call, IdemError, Store};

use crate::args::{Args, Mode};
use crate::plan::{Fault, Plan};
use crate::target::{BeginTx, Ledger, StormTx, ledger_insert};

/// How one request ended, as its caller saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum Class {
    /// The body ran on a fresh claim (or a retry after a failure) and its result was stored.
    Executed,
    /// The body ran after taking over an expired claim.
    TakenOver,
    /// A takeover whose recover fn found the effect in the ledger: answered with that run, the
    /// body did not run.
    Recovered,
    /// The stored result came back; the body did not run.
    Replayed,
    /// Refused: another attempt holds the claim.
    InProgress,
    /// Refused: the key's call finished and its result is no longer kept (`--result-ttl`); the
    /// body did not run.
    ResultExpired,
    /// The body ran, but its claim had been taken over; nothing stored.
    LeaseLost,
    /// The body ran but the mark failed; the claim waits for its lease.
    Unmarked,
    /// The body's injected business error.
    Business,
    /// The body's injected panic.
    Panicked,
    /// The caller dropped the call while the body ran.
    Dropped,
    /// Any other error, by kind.
    Error(&'static str),
}

impl Class {
    /// How a fault storm's worker process writes it.
    pub(crate) fn label(self) -> String {
        match self {
            Class::Executed => "executed".into(),
            Class::TakenOver => "taken-over".into(),
            Class::Recovered => "recovered".into(),
            Class::Replayed => "replayed".into(),
            Class::InProgress => "in-progress".into(),
            Class::ResultExpired => "result-expired".into(),
            Class::LeaseLost => "lease-lost".into(),
            Class::Unmarked => "unmarked".into(),
            Class::Business => "business".into(),
            Class::Panicked => "panicked".into(),
            Class::Dropped => "dropped".into(),
            Class::Error(kind) => format!("error:{kind}"),
        }
    }

    /// The class a [`Class::label`] names.
    pub(crate) fn from_label(label: &str) -> Option<Class> {
        Some(match label {
            "executed" => Class::Executed,
            "taken-over" => Class::TakenOver,
            "recovered" => Class::Recovered,
            "replayed" => Class::Replayed,
            "in-progress" => Class::InProgress,
            "result-expired" => Class::ResultExpired,
            "lease-lost" => Class::LeaseLost,
            "unmarked" => Class::Unmarked,
            "business" => Class::Business,
            "panicked" => Class::Panicked,
            "dropped" => Class::Dropped,
            other => {
                let kind = other.strip_prefix("error:")?;
                Class::Error(
                    ERROR_KINDS
                        .iter()
                        .find(|k| **k == kind)
                        .copied()
                        .unwrap_or("other"),
                )
            }
        })
    }
}

/// Every name [`kind`] and the storm give an error.
const ERROR_KINDS: &[&str] = &[
    "invalid-key",
    "invalid-biz",
    "invalid-options",
    "in-progress",
    "payload-mismatch",
    "result-expired",
    "lease-lost",
    "result-not-storable",
    "replay-decode",
    "fingerprint",
    "unknown-store",
    "not-supported",
    "store-unavailable",
    "store-busy",
    "store-schema",
    "store",
    "other",
    "ledger",
    "recover-failed",
    "cancelled",
];

/// One request's end.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Sample {
    /// When it started, since the storm began.
    pub at: Duration,
    pub latency: Duration,
    pub class: Class,
}

/// What the storm saw: every request's end, every answer `(key, run)` a caller got, and the keys
/// of the calls refused as result expired.
pub(crate) struct Driven {
    pub samples: Vec<Sample>,
    pub answers: Vec<(u32, i64)>,
    pub expired: Vec<u32>,
    pub elapsed: Duration,
}

/// The body's error.
#[derive(Debug, thiserror::Error)]
enum BodyError {
    #[error("injected business error")]
    Business,
    #[error("ledger write failed: {0}")]
    Ledger(String),
    #[error("ledger read failed: {0}")]
    Recover(String),
    #[error(transparent)]
    Idem(#[from] IdemError),
}

/// Told of each request's end as it happens: its key, how it ended, its latency, its answer.
pub(crate) type Report = Arc<dyn Fn(u32, Class, Duration, Option<i64>) + Send + Sync>;

/// What a fault storm's worker process adds to a storm: runs numbered from `run_base` (unique
/// across processes), a flag that ends it early, and a report of each request as it ends (a
/// process may be killed before the storm would return anything).
#[derive(Default)]
pub(crate) struct Hooks {
    pub run_base: i64,
    pub stop: Option<Arc<AtomicBool>>,
    pub report: Option<Report>,
}

struct Ctx {
    store: Arc<dyn Store>,
    tx: Option<Arc<dyn BeginTx>>,
    ledger: Arc<Ledger>,
    biz: Arc<str>,
    plan: Arc<Plan>,
    lease: Duration,
    ttl: Duration,
    result_ttl: Option<Duration>,
    body: Duration,
    heartbeat: bool,
    recover: bool,
    store_timeout: Option<Duration>,
    hooks: Hooks,
    start: Instant,
}

impl Ctx {
    fn call(&self, key: &str) -> Call {
        let mut call = Call::new(self.biz.to_string(), key)
            .ttl(self.ttl)
            .lease(self.lease);
        if let Some(kept) = self.result_ttl {
            call = call.result_ttl(kept);
        }
        if let Some(timeout) = self.store_timeout {
            call = call.store_timeout(timeout);
        }
        // The default heartbeat renews every third of the lease.
        if self.heartbeat {
            call
        } else {
            call.no_heartbeat()
        }
    }

    /// How long a dropping caller waits before giving up.
    fn give_up_after(&self) -> Duration {
        self.body + Duration::from_millis(2)
    }

    /// The body's work before its effect: its time, then its fault.
    async fn work(&self, fault: Fault) -> Result<(), BodyError> {
        let nap = match fault {
            Fault::Slow => self.lease * 3 / 2,
            Fault::Drop => self.give_up_after() * 4 + Duration::from_millis(50),
            _ => self.body,
        };
        if !nap.is_zero() {
            tokio::time::sleep(nap).await;
        }
        match fault {
            Fault::Error => Err(BodyError::Business),
            Fault::Panic => panic!("idem-storm: injected panic"),
            _ => Ok(()),
        }
    }

    /// The body's time after its effect, before it returns: a stalled holder's pause.
    async fn after_effect(&self, fault: Fault) {
        if fault == Fault::Stall {
            tokio::time::sleep(self.lease * 3 / 2).await;
        }
    }

    /// `--recover`'s answer for `key`: the run of the ledger's first effect for it, which is what
    /// that run's body returned (its body returns its own run).
    async fn recovered(&self, key: &str) -> Result<Option<i64>, BodyError> {
        self.ledger
            .first_run(&self.biz, key)
            .await
            .map_err(BodyError::Recover)
    }
}

/// A short name for an error kind, for the summary.
pub(crate) fn kind(e: &IdemError) -> &'static str {
    match e {
        IdemError::InvalidKey { .. } => "invalid-key",
        IdemError::InvalidBiz { .. } => "invalid-biz",
        IdemError::InvalidOptions { .. } => "invalid-options",
        IdemError::InProgress { .. } => "in-progress",
        IdemError::PayloadMismatch => "payload-mismatch",
        IdemError::ResultExpired => "result-expired",
        IdemError::LeaseLost { .. } => "lease-lost",
        IdemError::ResultNotStorable { .. } => "result-not-storable",
        IdemError::ReplayDecode { .. } => "replay-decode",
        IdemError::Fingerprint { .. } => "fingerprint",
        IdemError::UnknownStore { .. } => "unknown-store",
        IdemError::NotSupported { .. } => "not-supported",
        IdemError::StoreUnavailable { .. } => "store-unavailable",
        IdemError::StoreBusy { .. } => "store-busy",
        IdemError::StoreSchema { .. } => "store-schema",
        IdemError::Store { .. } => "store",
        _ => "other",
    }
}

fn classify(result: Result<i64, BodyError>, outcome: Option<Outcome>) -> (Class, Option<i64>) {
    match result {
        Ok(run) => {
            let class = match outcome {
                Some(Outcome::Replayed) => Class::Replayed,
                Some(Outcome::TakenOver) => Class::TakenOver,
                Some(Outcome::Recovered) => Class::Recovered,
                _ => Class::Executed,
            };
            (class, Some(run))
        }
        Err(BodyError::Business) => (Class::Business, None),
        Err(BodyError::Ledger(_)) => (Class::Error("ledger"), None),
        Err(BodyError::Recover(_)) => (Class::Error("recover-failed"), None),
        Err(BodyError::Idem(e)) => {
            let class = match (&e, outcome) {
                (IdemError::InProgress { .. }, _) => Class::InProgress,
                (IdemError::ResultExpired, _) => Class::ResultExpired,
                (IdemError::LeaseLost { .. }, _) => Class::LeaseLost,
                (_, Some(Outcome::MarkFailed)) => Class::Unmarked,
                _ => Class::Error(kind(&e)),
            };
            (class, None)
        }
    }
}

async fn lease_request(ctx: &Ctx, i: usize) -> (Class, Option<i64>) {
    let request = ctx.plan.requests[i];
    let key = format!("ORD-{}", request.key);
    let run = ctx.hooks.run_base + i as i64;
    let body = async {
        ctx.work(request.fault).await?;
        ctx.ledger
            .record(&ctx.biz, &key, run)
            .await
            .map_err(BodyError::Ledger)?;
        ctx.after_effect(request.fault).await;
        Ok(run)
    };
    let call = async {
        if ctx.recover {
            let recover = || ctx.recovered(&key);
            observe(ctx.call(&key).recover(recover).run(&*ctx.store, body)).await
        } else {
            observe(ctx.call(&key).run(&*ctx.store, body)).await
        }
    };
    let (result, report) = if request.fault == Fault::Drop {
        match tokio::time::timeout(ctx.give_up_after(), call).await {
            Ok(done) => done,
            Err(_) => return (Class::Dropped, None),
        }
    } else {
        call.await
    };
    classify(result, report.map(|r| r.outcome))
}

async fn tx_request(ctx: Arc<Ctx>, begin: Arc<dyn BeginTx>, i: usize) -> (Class, Option<i64>) {
    let request = ctx.plan.requests[i];
    let key = format!("ORD-{}", request.key);
    let run = ctx.hooks.run_base + i as i64;
    let work = async {
        let mut tx = match begin.begin(&ctx.biz, &key).await {
            Ok(tx) => tx,
            Err(e) => return (Class::Error(kind(&e)), None),
        };
        let body = async |tx: &mut dyn StormTx| {
            ctx.work(request.fault).await?;
            let args = [
                SqlValue::Text(Cow::Borrowed(&ctx.biz)),
                SqlValue::Text(Cow::Borrowed(&key)),
                SqlValue::Int(run),
            ];
            tx.execute(ledger_insert(tx.dialect()), &args).await?;
            ctx.after_effect(request.fault).await;
            Ok::<_, BodyError>(run)
        };
        let (result, report) = observe(ctx.call(&key).run_in_tx(&mut *tx, body)).await;
        let ended = if result.is_ok() {
            tx.commit().await
        } else {
            tx.rollback().await
        };
        match ended {
            Ok(()) => classify(result, report.map(|r| r.outcome)),
            Err(e) => (Class::Error(kind(&e)), None),
        }
    };
    // The store timeout bounds the transaction's begin and commit too.
    let timeout = ctx
        .store_timeout
        .unwrap_or(idem::store::DEFAULT_STORE_TIMEOUT);
    let work = idem::store::with_store_timeout(timeout, work);
    if request.fault == Fault::Drop {
        match tokio::time::timeout(ctx.give_up_after(), work).await {
            Ok(done) => done,
            Err(_) => (Class::Dropped, None),
        }
    } else {
        work.await
    }
}

/// Runs the storm: `args.concurrency` workers take the next planned request until none is left.
pub(crate) async fn drive(
    args: &Args,
    plan: Arc<Plan>,
    target: &crate::target::Target,
    ledger: Arc<Ledger>,
    biz: Arc<str>,
    done: Arc<AtomicU64>,
    hooks: Hooks,
) -> Driven {
    let ctx = Arc::new(Ctx {
        store: target.store.clone(),
        tx: target.tx.clone(),
        ledger,
        biz,
        plan,
        lease: args.lease,
        ttl: args.ttl,
        result_ttl: args.result_ttl,
        body: args.body,
        heartbeat: !args.no_heartbeat,
        recover: args.recover,
        store_timeout: args.store_timeout,
        hooks,
        start: Instant::now(),
    });
    let tx_mode = args.mode == Mode::Tx;
    let next = Arc::new(AtomicUsize::new(0));
    // Tx mode runs on this thread (a `LocalSet`): the engine's transaction future borrows the
    // transaction through an `async` closure, which rustc cannot yet prove `Send` for every
    // borrow. Lease mode spreads over the runtime's threads.
    let local = tokio::task::LocalSet::new();
    local
        .run_until(async move {
            let mut workers = tokio::task::JoinSet::new();
            for _ in 0..args.concurrency {
                let w = worker(ctx.clone(), next.clone(), done.clone(), tx_mode);
                if tx_mode {
                    workers.spawn_local(w);
                } else {
                    workers.spawn(w);
                }
            }
            let mut driven = Driven {
                samples: Vec::new(),
                answers: Vec::new(),
                expired: Vec::new(),
                elapsed: Duration::ZERO,
            };
            while let Some(joined) = workers.join_next().await {
                let (samples, answers, expired) = joined.expect("a storm worker never panics");
                driven.samples.extend(samples);
                driven.answers.extend(answers);
                driven.expired.extend(expired);
            }
            driven.elapsed = ctx.start.elapsed();
            driven
        })
        .await
}

/// Takes the next planned request until none is left; each request is a task of its own, so an
/// injected panic ends only that request.
async fn worker(
    ctx: Arc<Ctx>,
    next: Arc<AtomicUsize>,
    done: Arc<AtomicU64>,
    tx_mode: bool,
) -> (Vec<Sample>, Vec<(u32, i64)>, Vec<u32>) {
    let mut samples = Vec::new();
    let mut answers = Vec::new();
    let mut expired = Vec::new();
    loop {
        if ctx
            .hooks
            .stop
            .as_ref()
            .is_some_and(|stop| stop.load(Ordering::Relaxed))
        {
            break;
        }
        let i = next.fetch_add(1, Ordering::Relaxed);
        if i >= ctx.plan.requests.len() {
            break;
        }
        let at = ctx.start.elapsed();
        let one = match (&ctx.tx, tx_mode) {
            (Some(begin), true) => {
                tokio::task::spawn_local(tx_request(ctx.clone(), begin.clone(), i))
            }
            _ => {
                let ctx = ctx.clone();
                tokio::spawn(async move { lease_request(&ctx, i).await })
            }
        };
        let (class, answer) = match one.await {
            Ok(end) => end,
            Err(e) if e.is_panic() => (Class::Panicked, None),
            Err(_) => (Class::Error("cancelled"), None),
        };
        let latency = ctx.start.elapsed() - at;
        if let Some(report) = &ctx.hooks.report {
            report(ctx.plan.requests[i].key, class, latency, answer);
        }
        samples.push(Sample { at, latency, class });
        if let Some(run) = answer {
            answers.push((ctx.plan.requests[i].key, run));
        }
        if class == Class::ResultExpired {
            expired.push(ctx.plan.requests[i].key);
        }
        done.fetch_add(1, Ordering::Relaxed);
    }
    (samples, answers, expired)
}
