//! **idem-storm**: drives an idem store with a retry storm — duplicates at a rate, many callers at
//! once, injected faults — and audits the side effects in a ledger of its own.
//!
//! Every request calls one idempotent function whose body writes one row into the ledger (a
//! separate SQLite file in lease mode; a table of the store's database, inside the call's
//! transaction, in tx mode). After the storm the ledger decides: a key with two rows is a double
//! execution; an answer that is not the run the ledger holds for its key is a foreign answer; a
//! record marked SUCCEEDED without a ledger row is a false success. idem's own counters are used
//! only to label outcomes, never to judge them.
//!
//! The binary is the usual way in (`cargo run -p idem-storm --release -- --help`); [`run`] is the
//! same storm for tests, and [`chaos::storm`] the fault storm of `--chaos` (a private server,
//! application processes killed and replaced, the server frozen and restarted, the network silent).

mod args;
pub mod chaos;
mod drive;
mod plan;
mod plot;
mod summary;
mod target;

use std::collections::HashSet;
use std::io::IsTerminal;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use idem::{IdemError, store::Status};

pub use args::{Args, ChaosFault, Mode, StoreKind};
pub use chaos::{ChaosReport, Proxy};
pub use plot::draw;
pub use summary::{Slice, Summary};

/// Why a storm could not run (an invariant that breaks is not an error: see
/// [`Summary::invariants_hold`]).
#[derive(Debug, thiserror::Error)]
pub enum StormError {
    /// The options or the environment do not allow the storm.
    #[error("{0}")]
    Setup(String),
    /// The store failed while it was opened or audited.
    #[error("the store failed: {0}")]
    Store(#[source] IdemError),
    /// The ledger database failed.
    #[error("the ledger failed: {0}")]
    Ledger(String),
}

impl StormError {
    fn store(e: IdemError) -> Self {
        StormError::Store(e)
    }

    fn ledger(e: impl std::fmt::Display) -> Self {
        StormError::Ledger(e.to_string())
    }
}

/// Runs one storm as `args` describe it and audits it.
///
/// # Errors
/// [`StormError`] when the options contradict each other or the store or ledger cannot be
/// opened or read.
pub async fn run(args: &Args) -> Result<Summary, StormError> {
    args.check().map_err(StormError::Setup)?;
    let seed = args.seed.unwrap_or_else(|| fastrand::u64(..));
    let plan = Arc::new(plan::plan(args, seed));
    let target = target::open(args).await?;
    // A business type of this run only, so runs on one database never see each other's records.
    let biz: Arc<str> = format!("STORM{:x}", fastrand::u64(..) & 0xffff_ffff_ffff).into();
    let ledger = target.ledger.clone();
    let done = Arc::new(AtomicU64::new(0));
    let progress = progress(args, done.clone());
    let driven = drive::drive(
        args,
        plan.clone(),
        &target,
        ledger.clone(),
        biz.clone(),
        done,
        drive::Hooks::default(),
    )
    .await;
    progress.abort();
    let _ = progress.await;

    let key_of = |k: &str| k.strip_prefix("ORD-").and_then(|n| n.parse::<u32>().ok());
    let ledger_rows = ledger
        .rows(&biz)
        .await?
        .into_iter()
        .filter_map(|(k, run)| key_of(&k).map(|k| (k, run)))
        .collect();
    let succeeded = succeeded_keys(&target, &biz, plan.distinct_keys).await?;
    let audit = summary::Audit {
        ledger: ledger_rows,
        succeeded,
    };
    Ok(summary::summarize(
        summary::Setup {
            store: args.store.name(),
            mode: args.mode.name(),
            seed,
            concurrency: args.concurrency,
            distinct_keys: plan.distinct_keys,
            tx_mode: args.mode == Mode::Tx,
        },
        &driven,
        &audit,
    ))
}

/// The keys whose record the store holds as SUCCEEDED, read 16 at a time.
pub(crate) async fn succeeded_keys(
    target: &target::Target,
    biz: &str,
    keys: u32,
) -> Result<HashSet<u32>, StormError> {
    let mut out = HashSet::new();
    let mut next = 0u32;
    while next < keys {
        let mut reads = tokio::task::JoinSet::new();
        for k in next..(next + 16).min(keys) {
            let (store, biz) = (target.store.clone(), biz.to_owned());
            reads.spawn(async move { (k, store.load(&biz, &format!("ORD-{k}")).await) });
        }
        next = (next + 16).min(keys);
        while let Some(read) = reads.join_next().await {
            let (k, record) = read.map_err(|e| StormError::Setup(e.to_string()))?;
            if record
                .map_err(StormError::store)?
                .is_some_and(|r| r.status == Status::Succeeded)
            {
                out.insert(k);
            }
        }
    }
    Ok(out)
}

/// Shows progress: a bar on a terminal, a plain line every 10 % otherwise, nothing with `--quiet`
/// or `--json`.
fn progress(args: &Args, done: Arc<AtomicU64>) -> tokio::task::JoinHandle<()> {
    let total = args.requests;
    let quiet = args.quiet || args.json;
    let tty = std::io::stderr().is_terminal();
    tokio::spawn(async move {
        if quiet {
            return;
        }
        if tty {
            let bar = indicatif::ProgressBar::new(total).with_style(
                indicatif::ProgressStyle::with_template(
                    "{spinner} [{elapsed_precise}] {wide_bar} {pos}/{len} ({per_sec})",
                )
                .expect("a valid template"),
            );
            loop {
                bar.set_position(done.load(Ordering::Relaxed));
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        let mut shown = 0;
        loop {
            let now = done.load(Ordering::Relaxed);
            let tenth = now * 10 / total.max(1);
            if tenth > shown {
                shown = tenth;
                eprintln!("idem-storm: {now}/{total} requests");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
}
