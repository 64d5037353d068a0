//! Per-outcome counters (global and per business type), per-call reports, and, with the `metrics`
//! feature, the same events through the [`metrics`](https://docs.rs/metrics) facade for any
//! exporter a service installs (Prometheus, StatsD, …). The names are in [`names`]. Without the
//! feature the counters, [`observe`] and the spans are all there and nothing reaches a recorder.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::future::Future;
#[cfg(feature = "metrics")]
use std::sync::OnceLock;
#[cfg(feature = "metrics")]
use std::sync::atomic::AtomicPtr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{LazyLock, RwLock};

/// Whether this build exports through the `metrics` facade (feature `metrics`): without it, what
/// only an exporter reads (a claim's latency) is not even measured.
pub(crate) const ENABLED: bool = cfg!(feature = "metrics");

/// How one idempotent call (or state transition) ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Outcome {
    /// The body ran on a fresh claim (or a retry after a failure) and its result was stored; for a
    /// state transition: the row moved and the body ran.
    Executed,
    /// The body ran after taking over a claim whose lease had expired, and its result was stored.
    TakenOver,
    /// A claim whose lease had expired was taken over, and the call's recover fn found that the
    /// earlier attempt's action had happened: its result was stored and returned, and the body did
    /// not run.
    Recovered,
    /// A claim whose lease had expired was taken over, and the call's recover fn failed: the body
    /// did not run, the record stays PROCESSING (its lease released) and a retry asks again.
    RecoverFailed,
    /// The stored result was replayed (the body did not run); for a state transition: the row was
    /// already in the target state.
    Replayed,
    /// Refused: another attempt holds the lease.
    InProgress,
    /// Refused: the key was used with another payload.
    Mismatch,
    /// The body ran but another attempt had taken the claim over; nothing was stored.
    LeaseLost,
    /// The body returned an error; the record is FAILED (or the transaction rolled back) and a
    /// retry may run.
    Failed,
    /// Refused before anything was written (bad key, unknown store), or the store failed.
    Rejected,
    /// The body ran (now, or in the call being repeated) but its result could not be stored
    /// (it failed to serialize or is over the snapshot limit); the claim is kept as done.
    Unstorable,
    /// The body ran but the record could not be marked done (the store failed, also after
    /// retries): the claim stays PROCESSING until its lease expires.
    MarkFailed,
    /// State transition refused: the row is in a state the transition does not start from.
    WrongState,
    /// State transition refused: the row is at another version.
    VersionConflict,
    /// State transition refused: no row has the key.
    NotFound,
    /// Refused: the key was used and finished, but its result is no longer kept (its result ttl
    /// passed; the record is a tombstone until its ttl ends). The body did not run.
    ResultExpired,
}

impl Outcome {
    /// All outcomes, in counter order.
    pub const ALL: [Outcome; 16] = [
        Outcome::Executed,
        Outcome::TakenOver,
        Outcome::Recovered,
        Outcome::RecoverFailed,
        Outcome::Replayed,
        Outcome::InProgress,
        Outcome::Mismatch,
        Outcome::LeaseLost,
        Outcome::Failed,
        Outcome::Rejected,
        Outcome::Unstorable,
        Outcome::MarkFailed,
        Outcome::WrongState,
        Outcome::VersionConflict,
        Outcome::NotFound,
        Outcome::ResultExpired,
    ];

    /// The name used in tracing spans, counters and reports.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Executed => "executed",
            Outcome::TakenOver => "taken_over",
            Outcome::Recovered => "recovered",
            Outcome::RecoverFailed => "recover_failed",
            Outcome::Replayed => "replayed",
            Outcome::InProgress => "in_progress",
            Outcome::Mismatch => "mismatch",
            Outcome::LeaseLost => "lease_lost",
            Outcome::Failed => "failed",
            Outcome::Rejected => "rejected",
            Outcome::Unstorable => "unstorable",
            Outcome::MarkFailed => "mark_failed",
            Outcome::WrongState => "wrong_state",
            Outcome::VersionConflict => "version_conflict",
            Outcome::NotFound => "not_found",
            Outcome::ResultExpired => "result_expired",
        }
    }

    fn index(self) -> usize {
        self as usize
    }

    /// Whether this outcome means the call was a duplicate of one already seen.
    pub fn is_duplicate(self) -> bool {
        matches!(
            self,
            Outcome::Replayed
                | Outcome::Recovered
                | Outcome::InProgress
                | Outcome::Mismatch
                | Outcome::ResultExpired
        )
    }
}

const OUTCOMES: usize = Outcome::ALL.len();

#[derive(Default)]
struct Counters([AtomicU64; OUTCOMES]);

impl Counters {
    fn snapshot(&self) -> Counts {
        Counts(std::array::from_fn(|i| self.0[i].load(Ordering::Relaxed)))
    }
}

/// A copy of the counters at one moment.
#[derive(Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts([u64; OUTCOMES]);

impl std::fmt::Debug for Counts {
    /// `Counts { executed: 3, taken_over: 0, replayed: 5, … }`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut s = f.debug_struct("Counts");
        for outcome in Outcome::ALL {
            s.field(outcome.as_str(), &self.get(outcome));
        }
        s.finish()
    }
}

impl Counts {
    /// The count for one outcome.
    pub fn get(&self, outcome: Outcome) -> u64 {
        self.0[outcome.index()]
    }

    /// All calls counted.
    pub fn total(&self) -> u64 {
        self.0.iter().sum()
    }

    /// Duplicates (replayed, in progress, mismatch) over all calls; 0 when there were none.
    pub fn duplicate_rate(&self) -> f64 {
        let total = self.total();
        if total == 0 {
            return 0.0;
        }
        let dup: u64 = Outcome::ALL
            .iter()
            .filter(|o| o.is_duplicate())
            .map(|o| self.get(*o))
            .sum();
        dup as f64 / total as f64
    }

    /// The difference `self - earlier`, for counting one stretch of work.
    pub fn since(&self, earlier: &Counts) -> Counts {
        Counts(std::array::from_fn(|i| {
            self.0[i].saturating_sub(earlier.0[i])
        }))
    }
}

static GLOBAL: LazyLock<Counters> = LazyLock::new(Counters::default);
/// What each business type keeps. It lives as long as the process (like the map itself), so it is
/// leaked once per business type and handed out as `&'static`.
static PER_BIZ: LazyLock<RwLock<HashMap<&'static str, &'static Biz>>> =
    LazyLock::new(Default::default);

/// One business type: its name, its counters, and its handles in the installed `metrics`
/// recorder.
struct Biz {
    name: &'static str,
    counts: Counters,
    #[cfg(feature = "metrics")]
    /// Handles registered with the recorder whose address they carry; registered again when
    /// another recorder is in charge (one installed later, a thread-local one in a test).
    exported: AtomicPtr<Exported>,
}

#[cfg(feature = "metrics")]
/// The metric handles of one business type, registered once with one recorder: a call then costs
/// an atomic add per metric instead of building and hashing a labelled key.
struct Exported {
    recorder: usize,
    calls: [metrics::Counter; OUTCOMES],
    duplicates: metrics::Counter,
    takeovers: metrics::Counter,
    /// The claim histogram per backend in [`STORES`], registered on first use.
    claims: [OnceLock<metrics::Histogram>; STORES.len()],
}

#[cfg(feature = "metrics")]
/// Backends whose claim histograms are kept as handles (others are looked up per call).
const STORES: [&str; 7] = [
    "memory",
    "sqlite",
    "mysql",
    "postgres",
    "redis",
    "redis-cluster",
    "sharded",
];

/// The address of the recorder `metrics` hands out on this thread now.
#[cfg(feature = "metrics")]
fn recorder_id() -> usize {
    metrics::with_recorder(|r| std::ptr::from_ref(r).cast::<()>() as usize)
}

#[cfg(feature = "metrics")]
impl Biz {
    fn exported(&self) -> &Exported {
        let recorder = recorder_id();
        let current = self.exported.load(Ordering::Acquire);
        // SAFETY: a non-null pointer was leaked from a `Box` below and is never freed.
        if let Some(handles) = unsafe { current.as_ref() }
            && handles.recorder == recorder
        {
            return handles;
        }
        let biz = self.name;
        let fresh = Exported {
            recorder,
            calls: std::array::from_fn(|i| {
                let outcome = Outcome::ALL[i].as_str();
                metrics::counter!(names::CALLS, "biz" => biz, "outcome" => outcome)
            }),
            duplicates: metrics::counter!(names::DUPLICATES, "biz" => biz),
            takeovers: metrics::counter!(names::LEASE_TAKEOVERS, "biz" => biz),
            claims: Default::default(),
        };
        // Leaked: handles live as long as the process, and a recorder changes rarely.
        let fresh: &'static Exported = Box::leak(Box::new(fresh));
        self.exported
            .store(std::ptr::from_ref(fresh).cast_mut(), Ordering::Release);
        fresh
    }
}

thread_local! {
    /// The last business type this thread counted: a call site counts the same one every time,
    /// so most calls skip the shared map.
    static LAST_BIZ: Cell<Option<&'static Biz>> = const { Cell::new(None) };
}

fn biz_entry(biz: &str) -> &'static Biz {
    if let Some(entry) = LAST_BIZ.get()
        && entry.name == biz
    {
        return entry;
    }
    let found = PER_BIZ
        .read()
        .unwrap_or_else(|p| p.into_inner())
        .get(biz)
        .copied();
    let entry = found.unwrap_or_else(|| {
        let mut map = PER_BIZ.write().unwrap_or_else(|p| p.into_inner());
        if let Some(entry) = map.get(biz) {
            return entry;
        }
        let name: &'static str = Box::leak(biz.to_owned().into_boxed_str());
        let entry: &'static Biz = Box::leak(Box::new(Biz {
            name,
            counts: Counters::default(),
            #[cfg(feature = "metrics")]
            exported: AtomicPtr::new(std::ptr::null_mut()),
        }));
        map.insert(name, entry);
        entry
    });
    LAST_BIZ.set(Some(entry));
    entry
}

/// Counts one call in the process counters and (feature `metrics`) through the `metrics` facade.
pub(crate) fn record(biz: &str, outcome: Outcome) {
    GLOBAL.0[outcome.index()].fetch_add(1, Ordering::Relaxed);
    let biz = biz_entry(biz);
    biz.counts.0[outcome.index()].fetch_add(1, Ordering::Relaxed);
    #[cfg(feature = "metrics")]
    export_call(biz, outcome);
}

#[cfg(feature = "metrics")]
fn export_call(biz: &Biz, outcome: Outcome) {
    let exported = biz.exported();
    exported.calls[outcome.index()].increment(1);
    if outcome.is_duplicate() {
        exported.duplicates.increment(1);
    }
    if outcome == Outcome::TakenOver {
        exported.takeovers.increment(1);
    }
}

pub mod names;

/// Records one claim's latency, `elapsed` (feature `metrics`; without it nothing, not even the
/// clock read `elapsed` would make).
#[cfg(not(feature = "metrics"))]
#[inline(always)]
pub(crate) fn claim_latency(_: &str, _: &'static str, _: impl FnOnce() -> std::time::Duration) {}

/// Records one claim's latency.
#[cfg(feature = "metrics")]
pub(crate) fn claim_latency(
    biz: &str,
    store: &'static str,
    elapsed: impl FnOnce() -> std::time::Duration,
) {
    let biz = biz_entry(biz);
    let seconds = elapsed().as_secs_f64();
    match STORES.iter().position(|s| *s == store) {
        Some(i) => biz.exported().claims[i]
            .get_or_init(
                || metrics::histogram!(names::CLAIM_SECONDS, "biz" => biz.name, "store" => store),
            )
            .record(seconds),
        None => {
            metrics::histogram!(names::CLAIM_SECONDS, "biz" => biz.name, "store" => store)
                .record(seconds);
        }
    }
}

/// Counts rows a sweeper deleted.
pub(crate) fn swept(store: &'static str, kind: &'static str, rows: u64) {
    #[cfg(not(feature = "metrics"))]
    let _ = (store, kind, rows);
    #[cfg(feature = "metrics")]
    if rows > 0 {
        metrics::counter!(names::SWEPT, "store" => store, "kind" => kind).increment(rows);
    }
}

/// Counts a store's retry of a statement the database refused for a reason that passes
/// (`reason`: `deadlock`).
#[cfg_attr(
    not(any(feature = "sqlite", feature = "mysql", feature = "postgres")),
    allow(dead_code)
)]
pub(crate) fn store_retry(store: &'static str, reason: &'static str) {
    #[cfg(not(feature = "metrics"))]
    let _ = (store, reason);
    #[cfg(feature = "metrics")]
    metrics::counter!(names::STORE_RETRIES, "store" => store, "reason" => reason).increment(1);
}

/// Counts one token operation (`op`: `issue`, `consume`, `restore`) by how it ended.
pub fn count_token_op<T>(op: &'static str, result: &Result<T, crate::IdemError>) {
    let outcome = match result {
        Ok(_) => "ok",
        Err(crate::IdemError::TokenUsed) => "used",
        Err(crate::IdemError::TokenInvalid { .. }) => "invalid",
        Err(_) => "error",
    };
    #[cfg(not(feature = "metrics"))]
    let _ = (op, outcome);
    #[cfg(feature = "metrics")]
    metrics::counter!(names::TOKENS, "op" => op, "outcome" => outcome).increment(1);
}

/// A reconciler pass over `biz`: how many stuck records it found, and how it resolved them
/// (`how`, count) (feature `metrics`; nothing without it).
pub(crate) fn reconciled(biz: &str, found: u64, resolved: [(&'static str, u64); 3]) {
    #[cfg(not(feature = "metrics"))]
    let _ = (biz, found, resolved);
    #[cfg(feature = "metrics")]
    {
        metrics::gauge!(names::STUCK, "biz" => biz.to_string()).set(found as f64);
        for (how, n) in resolved {
            if n > 0 {
                metrics::counter!(names::RECOVERED, "biz" => biz.to_string(), "how" => how)
                    .increment(n);
            }
        }
    }
}

/// Counters over every call in this process.
pub fn counts() -> Counts {
    GLOBAL.snapshot()
}

/// Counters for one business type (zero if it never ran).
pub fn counts_for(biz: &str) -> Counts {
    PER_BIZ
        .read()
        .unwrap_or_else(|p| p.into_inner())
        .get(biz)
        .map(|b| b.counts.snapshot())
        .unwrap_or_default()
}

/// What one idempotent call did, as seen by [`observe`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallReport {
    /// Business type.
    pub biz: String,
    /// How the call ended.
    pub outcome: Outcome,
    /// The attempt that ran the body (0 when the body did not run).
    pub attempt: u32,
    /// Set when an error of idem's own ended the call before its body ran or instead of its
    /// answer (a refusal, a store error, a stored result that cannot be read): whether the same
    /// call may succeed later ([`IdemError::is_retryable`](crate::IdemError::is_retryable)).
    /// `None` when the call returned the body's value or the body's own error, or a replay.
    pub retryable: Option<bool>,
}

impl CallReport {
    /// Whether the result was replayed from the store (for an `Idempotent-Replayed` header).
    pub fn replayed(&self) -> bool {
        self.outcome == Outcome::Replayed
    }
}

tokio::task_local! {
    static REPORT: RefCell<Option<CallReport>>;
}

/// Runs `fut` and reports the last idempotent call that finished inside it.
///
/// ```
/// # use idem_runtime as idem;
/// # async fn demo() {
/// let (result, report) = idem::metrics::observe(async { 42 }).await;
/// assert_eq!(result, 42);
/// assert!(report.is_none()); // no idempotent call ran inside
/// # }
/// ```
pub async fn observe<F: Future>(fut: F) -> (F::Output, Option<CallReport>) {
    REPORT
        .scope(RefCell::new(None), async move {
            let out = fut.await;
            let report = REPORT.with(|r| r.borrow_mut().take());
            (out, report)
        })
        .await
}

/// Counts a finished call (or state transition) and hands it to an enclosing [`observe`]; the
/// engine writes a call's outcome into its span itself.
pub(crate) fn report(biz: &str, outcome: Outcome, attempt: u32) {
    report_with(biz, outcome, attempt, None);
}

/// [`report`] for a call that idem's own `error` ended.
pub(crate) fn report_error(biz: &str, outcome: Outcome, attempt: u32, error: &crate::IdemError) {
    report_with(biz, outcome, attempt, Some(error.is_retryable()));
}

fn report_with(biz: &str, outcome: Outcome, attempt: u32, retryable: Option<bool>) {
    record(biz, outcome);
    let _ = REPORT.try_with(|r| {
        *r.borrow_mut() = Some(CallReport {
            biz: biz.to_owned(),
            outcome,
            attempt,
            retryable,
        });
    });
}

#[cfg(all(test, feature = "metrics"))]
mod tests;
