//! Per-outcome counters (global and per business type) and per-call reports.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{LazyLock, RwLock};

/// How one idempotent call ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// The body ran on a fresh claim (or a retry after a failure) and its result was stored.
    Executed,
    /// The body ran after taking over a claim whose lease had expired.
    TakenOver,
    /// The stored result was replayed; the body did not run.
    Replayed,
    /// Refused: another attempt holds the lease.
    InProgress,
    /// Refused: the key was used with another payload.
    Mismatch,
    /// The body ran but another attempt had taken the claim over; nothing was stored.
    LeaseLost,
    /// The body returned an error; the record is FAILED and a retry may run.
    Failed,
    /// Refused before anything was written (bad key, unknown store, store error).
    Rejected,
}

impl Outcome {
    /// All outcomes, in counter order.
    pub const ALL: [Outcome; 8] = [
        Outcome::Executed,
        Outcome::TakenOver,
        Outcome::Replayed,
        Outcome::InProgress,
        Outcome::Mismatch,
        Outcome::LeaseLost,
        Outcome::Failed,
        Outcome::Rejected,
    ];

    /// The name used in tracing spans and reports.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Executed => "executed",
            Outcome::TakenOver => "taken_over",
            Outcome::Replayed => "replayed",
            Outcome::InProgress => "in_progress",
            Outcome::Mismatch => "mismatch",
            Outcome::LeaseLost => "lease_lost",
            Outcome::Failed => "failed",
            Outcome::Rejected => "rejected",
        }
    }

    fn index(self) -> usize {
        self as usize
    }

    /// Whether this outcome means the call was a duplicate of one already seen.
    pub fn is_duplicate(self) -> bool {
        matches!(
            self,
            Outcome::Replayed | Outcome::InProgress | Outcome::Mismatch
        )
    }
}

#[derive(Default)]
struct Counters([AtomicU64; 8]);

impl Counters {
    fn snapshot(&self) -> Counts {
        Counts(std::array::from_fn(|i| self.0[i].load(Ordering::Relaxed)))
    }
}

/// A copy of the counters at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts([u64; 8]);

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
/// Counters per business type. They live as long as the process (like the map itself), so they
/// are leaked once per business type and handed out as `&'static`.
static PER_BIZ: LazyLock<RwLock<HashMap<&'static str, &'static Counters>>> =
    LazyLock::new(Default::default);

thread_local! {
    /// The last business type this thread counted: a call site counts the same one every time,
    /// so most calls skip the shared map.
    static LAST_BIZ: Cell<Option<(&'static str, &'static Counters)>> = const { Cell::new(None) };
}

fn biz_counters(biz: &str) -> &'static Counters {
    if let Some((name, counters)) = LAST_BIZ.get()
        && name == biz
    {
        return counters;
    }
    let found = PER_BIZ
        .read()
        .unwrap_or_else(|p| p.into_inner())
        .get_key_value(biz)
        .map(|(k, v)| (*k, *v));
    let entry = found.unwrap_or_else(|| {
        let mut map = PER_BIZ.write().unwrap_or_else(|p| p.into_inner());
        if let Some((k, v)) = map.get_key_value(biz) {
            return (*k, *v);
        }
        let name: &'static str = Box::leak(biz.to_owned().into_boxed_str());
        let counters: &'static Counters = Box::leak(Box::default());
        map.insert(name, counters);
        (name, counters)
    });
    LAST_BIZ.set(Some(entry));
    entry.1
}

pub(crate) fn record(biz: &str, outcome: Outcome) {
    GLOBAL.0[outcome.index()].fetch_add(1, Ordering::Relaxed);
    biz_counters(biz).0[outcome.index()].fetch_add(1, Ordering::Relaxed);
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
        .map(|c| c.snapshot())
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
/// # async fn demo() {
/// let (result, report) = idem_runtime::observe(async { 42 }).await;
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

pub(crate) fn report(biz: &str, outcome: Outcome, attempt: u32) {
    record(biz, outcome);
    let _ = REPORT.try_with(|r| {
        *r.borrow_mut() = Some(CallReport {
            biz: biz.to_owned(),
            outcome,
            attempt,
        });
    });
}
