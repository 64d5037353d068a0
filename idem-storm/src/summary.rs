//! The storm's result: counts by outcome, the ledger audit, throughput and latency, as a table or
//! JSON.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::time::Duration;

use serde::Serialize;

use crate::drive::{Class, Driven, Sample};

/// Everything one storm measured. The invariants come from the ledger and the store's records,
/// never from idem's own counters.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    /// The store driven.
    pub store: String,
    /// `lease` or `tx`.
    pub mode: String,
    /// The plan's seed (`--seed` repeats the run).
    pub seed: u64,
    /// Requests sent.
    pub requests: u64,
    /// Distinct keys among them.
    pub distinct_keys: u64,
    /// `1 - distinct_keys / requests`.
    pub duplicate_rate: f64,
    /// Requests in flight at once.
    pub concurrency: u32,
    /// Rows in the ledger: bodies that reached their effect.
    pub executions: u64,
    /// Calls answered by running the body on a fresh claim or after a failure.
    pub executed: u64,
    /// Calls that ran the body after taking over an expired claim.
    pub takeovers: u64,
    /// Calls that took over an expired claim and whose recover fn (`--recover`) found its effect
    /// in the ledger: answered with that run, the body not run again.
    pub recovered: u64,
    /// Calls answered with the stored result.
    pub replays: u64,
    /// Calls refused because another attempt held the claim.
    pub in_progress: u64,
    /// Calls refused because their key's call finished and its result is no longer kept
    /// (`--result-ttl`): the body did not run.
    pub result_expired: u64,
    /// Calls whose claim was taken over while the body ran.
    pub lease_lost: u64,
    /// Calls whose body ran but whose mark failed.
    pub unmarked: u64,
    /// Injected business errors.
    pub business_errors: u64,
    /// Injected panics.
    pub panics: u64,
    /// Calls their caller dropped.
    pub dropped: u64,
    /// Other errors, by kind.
    pub errors: BTreeMap<String, u64>,
    /// Ledger rows beyond the first per key: must be 0.
    pub double_executions: u64,
    /// Answers that are not a run the ledger holds for their key: must be 0.
    pub foreign_answers: u64,
    /// Keys whose callers got different answers: must be 0.
    pub split_answers: u64,
    /// Records marked SUCCEEDED with no effect in the ledger: must be 0.
    pub false_successes: u64,
    /// Keys refused as result expired with no effect in the ledger (a refusal of work that never
    /// happened): must be 0.
    pub false_refusals: u64,
    /// Keys with an effect whose record is not SUCCEEDED: must be 0 in tx mode (the effect and
    /// the mark commit together); in lease mode a body that ran but could not be marked.
    pub unmarked_effects: u64,
    /// Wall time of the storm, seconds.
    pub elapsed_s: f64,
    /// Requests per second.
    pub throughput_rps: f64,
    /// Median latency, milliseconds.
    pub p50_ms: f64,
    /// 99th percentile latency, milliseconds.
    pub p99_ms: f64,
    /// Slowest request, milliseconds.
    pub max_ms: f64,
    /// Every invariant held.
    pub invariants_hold: bool,
    /// What a fault storm (`--chaos`) injected and how long its calls took against their
    /// deadline; none for a storm of `-n` requests.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub chaos: Option<crate::chaos::ChaosReport>,
    /// Outcome counts per time slice, for the plot.
    #[serde(skip)]
    pub timeline: Vec<Slice>,
    /// Every request's latency, microseconds, for the plot.
    #[serde(skip)]
    pub latencies_us: Vec<u64>,
}

/// Outcome counts of the requests that started in one time slice.
#[derive(Debug, Clone, Default)]
pub struct Slice {
    /// Start of the slice, seconds since the storm began.
    pub at_s: f64,
    /// Length of the slice, seconds.
    pub width_s: f64,
    /// Bodies run (fresh, retried or taken over).
    pub executed: u64,
    /// Replays, takeovers answered by the recover fn, and repeats refused as result expired.
    pub replayed: u64,
    /// In-progress answers.
    pub in_progress: u64,
    /// Injected faults and lost leases.
    pub faulted: u64,
    /// Errors.
    pub errors: u64,
}

/// What the audit read: the ledger's `(key, run)` rows and the keys whose record is SUCCEEDED.
pub(crate) struct Audit {
    pub ledger: Vec<(u32, i64)>,
    pub succeeded: HashSet<u32>,
}

pub(crate) struct Setup<'a> {
    pub store: &'a str,
    pub mode: &'a str,
    pub seed: u64,
    pub concurrency: u32,
    pub distinct_keys: u32,
    pub tx_mode: bool,
}

pub(crate) fn summarize(setup: Setup<'_>, driven: &Driven, audit: &Audit) -> Summary {
    let count = |c: Class| driven.samples.iter().filter(|s| s.class == c).count() as u64;
    let mut errors = BTreeMap::new();
    for s in &driven.samples {
        if let Class::Error(kind) = s.class {
            *errors.entry(kind.to_owned()).or_insert(0) += 1;
        }
    }

    let mut runs: HashMap<u32, Vec<i64>> = HashMap::new();
    for &(key, run) in &audit.ledger {
        runs.entry(key).or_default().push(run);
    }
    let double_executions = runs.values().map(|r| r.len() as u64 - 1).sum();
    let held: HashSet<(u32, i64)> = audit.ledger.iter().copied().collect();
    let foreign_answers = driven.answers.iter().filter(|a| !held.contains(a)).count() as u64;
    let mut answered: HashMap<u32, HashSet<i64>> = HashMap::new();
    for &(key, run) in &driven.answers {
        answered.entry(key).or_default().insert(run);
    }
    let split_answers = answered.values().filter(|a| a.len() > 1).count() as u64;
    let false_successes = audit
        .succeeded
        .iter()
        .filter(|k| !runs.contains_key(k))
        .count() as u64;
    let unmarked_effects = runs.keys().filter(|k| !audit.succeeded.contains(k)).count() as u64;
    let false_refusals = driven
        .expired
        .iter()
        .collect::<HashSet<_>>()
        .into_iter()
        .filter(|k| !runs.contains_key(k))
        .count() as u64;

    let mut latencies_us: Vec<u64> = driven
        .samples
        .iter()
        .map(|s| s.latency.as_micros() as u64)
        .collect();
    latencies_us.sort_unstable();
    let pick = |q: f64| -> f64 {
        if latencies_us.is_empty() {
            return 0.0;
        }
        let i = ((latencies_us.len() - 1) as f64 * q).round() as usize;
        latencies_us[i] as f64 / 1000.0
    };
    let requests = driven.samples.len() as u64;
    let elapsed_s = driven.elapsed.as_secs_f64();
    let invariants_hold = double_executions == 0
        && foreign_answers == 0
        && split_answers == 0
        && false_successes == 0
        && false_refusals == 0
        && (!setup.tx_mode || unmarked_effects == 0);
    Summary {
        store: setup.store.to_owned(),
        mode: setup.mode.to_owned(),
        seed: setup.seed,
        requests,
        distinct_keys: u64::from(setup.distinct_keys),
        duplicate_rate: 1.0 - f64::from(setup.distinct_keys) / requests.max(1) as f64,
        concurrency: setup.concurrency,
        executions: audit.ledger.len() as u64,
        executed: count(Class::Executed),
        takeovers: count(Class::TakenOver),
        recovered: count(Class::Recovered),
        replays: count(Class::Replayed),
        in_progress: count(Class::InProgress),
        result_expired: count(Class::ResultExpired),
        lease_lost: count(Class::LeaseLost),
        unmarked: count(Class::Unmarked),
        business_errors: count(Class::Business),
        panics: count(Class::Panicked),
        dropped: count(Class::Dropped),
        errors,
        double_executions,
        foreign_answers,
        split_answers,
        false_successes,
        false_refusals,
        unmarked_effects,
        elapsed_s,
        throughput_rps: requests as f64 / elapsed_s.max(1e-9),
        p50_ms: pick(0.50),
        p99_ms: pick(0.99),
        max_ms: pick(1.0),
        invariants_hold,
        chaos: None,
        timeline: timeline(&driven.samples, driven.elapsed),
        latencies_us,
    }
}

fn timeline(samples: &[Sample], elapsed: Duration) -> Vec<Slice> {
    let width = (elapsed / 60).max(Duration::from_millis(50));
    let n = (elapsed.as_secs_f64() / width.as_secs_f64())
        .ceil()
        .max(1.0) as usize;
    let mut slices: Vec<Slice> = (0..n)
        .map(|i| Slice {
            at_s: i as f64 * width.as_secs_f64(),
            width_s: width.as_secs_f64(),
            ..Slice::default()
        })
        .collect();
    for s in samples {
        let i = ((s.at.as_secs_f64() / width.as_secs_f64()) as usize).min(n - 1);
        let slice = &mut slices[i];
        match s.class {
            Class::Executed | Class::TakenOver => slice.executed += 1,
            Class::Replayed | Class::Recovered | Class::ResultExpired => slice.replayed += 1,
            Class::InProgress => slice.in_progress += 1,
            Class::LeaseLost
            | Class::Unmarked
            | Class::Business
            | Class::Panicked
            | Class::Dropped => slice.faulted += 1,
            Class::Error(_) => slice.errors += 1,
        }
    }
    slices
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let must = |n: u64| if n == 0 { "ok" } else { "BROKEN" };
        writeln!(
            f,
            "idem-storm: {} store, {} mode, seed {}",
            self.store, self.mode, self.seed
        )?;
        let rows: [(&str, String); 27] = [
            ("requests", self.requests.to_string()),
            (
                "distinct keys",
                format!(
                    "{} (duplicate rate {:.1} %)",
                    self.distinct_keys,
                    self.duplicate_rate * 100.0
                ),
            ),
            ("concurrency", self.concurrency.to_string()),
            ("executions (ledger)", self.executions.to_string()),
            ("executed", self.executed.to_string()),
            ("taken over", self.takeovers.to_string()),
            ("recovered", self.recovered.to_string()),
            ("replays", self.replays.to_string()),
            ("in progress", self.in_progress.to_string()),
            ("result expired", self.result_expired.to_string()),
            ("lease lost", self.lease_lost.to_string()),
            ("unmarked", self.unmarked.to_string()),
            ("business errors", self.business_errors.to_string()),
            ("panics", self.panics.to_string()),
            ("dropped", self.dropped.to_string()),
            (
                "errors",
                if self.errors.is_empty() {
                    "none".to_owned()
                } else {
                    self.errors
                        .iter()
                        .map(|(k, n)| format!("{k} {n}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                },
            ),
            (
                "double executions",
                format!(
                    "{}  {}",
                    self.double_executions,
                    must(self.double_executions)
                ),
            ),
            (
                "foreign answers",
                format!("{}  {}", self.foreign_answers, must(self.foreign_answers)),
            ),
            (
                "split answers",
                format!("{}  {}", self.split_answers, must(self.split_answers)),
            ),
            (
                "false successes",
                format!("{}  {}", self.false_successes, must(self.false_successes)),
            ),
            (
                "false refusals",
                format!("{}  {}", self.false_refusals, must(self.false_refusals)),
            ),
            (
                "unmarked effects",
                if self.mode == "tx" {
                    format!("{}  {}", self.unmarked_effects, must(self.unmarked_effects))
                } else {
                    self.unmarked_effects.to_string()
                },
            ),
            ("elapsed", format!("{:.2} s", self.elapsed_s)),
            ("throughput", format!("{:.0} req/s", self.throughput_rps)),
            ("latency p50", format!("{:.2} ms", self.p50_ms)),
            ("latency p99", format!("{:.2} ms", self.p99_ms)),
            ("latency max", format!("{:.2} ms", self.max_ms)),
        ];
        for (name, value) in rows {
            writeln!(f, "  {name:<20} {value}")?;
        }
        if let Some(chaos) = &self.chaos {
            write!(f, "{chaos}")?;
        }
        write!(
            f,
            "  {:<20} {}",
            "invariants",
            if self.invariants_hold {
                "hold"
            } else {
                "BROKEN"
            }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn setup() -> Setup<'static> {
        Setup {
            store: "memory",
            mode: "lease",
            seed: 0,
            concurrency: 1,
            distinct_keys: 2,
            tx_mode: false,
        }
    }

    /// Key 0's effect is run 0, whose caller lost its lease; the takeover recovered with
    /// `recovered`, a repeat replayed `replayed`. Key 1 has its own clean execution.
    fn audit_of(recovered: (u32, i64), replayed: (u32, i64), succeeded: &[u32]) -> Summary {
        let sample = |class| Sample {
            at: Duration::ZERO,
            latency: Duration::from_millis(1),
            class,
        };
        let driven = Driven {
            samples: vec![
                sample(Class::LeaseLost),
                sample(Class::Recovered),
                sample(Class::Replayed),
                sample(Class::Executed),
            ],
            answers: vec![recovered, replayed, (1, 3)],
            expired: Vec::new(),
            elapsed: Duration::from_millis(10),
        };
        let audit = Audit {
            ledger: vec![(0, 0), (1, 3)],
            succeeded: succeeded.iter().copied().collect(),
        };
        summarize(setup(), &driven, &audit)
    }

    #[test]
    fn a_recovered_answer_passes_only_when_it_is_the_ledgers_run() {
        let right = audit_of((0, 0), (0, 0), &[0, 1]);
        assert_eq!(right.recovered, 1);
        assert_eq!(right.lease_lost, 1);
        assert!(right.invariants_hold, "{right}");

        // A run the ledger does not hold for the key (another key's run, or none at all).
        let foreign = audit_of((0, 3), (0, 3), &[0, 1]);
        assert_eq!(foreign.foreign_answers, 2);
        assert!(!foreign.invariants_hold);

        // Not what the key's other callers got.
        let split = audit_of((0, 0), (0, 7), &[0, 1]);
        assert_eq!(split.split_answers, 1);
        assert!(!split.invariants_hold);

        // Recovered for a key with no effect: its SUCCEEDED record is a false success.
        let invented = audit_of((2, 9), (2, 9), &[0, 1, 2]);
        assert_eq!(invented.false_successes, 1);
        assert_eq!(invented.foreign_answers, 2);
        assert!(!invented.invariants_hold);
    }

    #[test]
    fn a_result_expired_refusal_holds_only_for_a_key_the_ledger_has() {
        let sample = |class| Sample {
            at: Duration::ZERO,
            latency: Duration::from_millis(1),
            class,
        };
        let storm = |expired: Vec<u32>| {
            let driven = Driven {
                samples: vec![
                    sample(Class::Executed),
                    sample(Class::ResultExpired),
                    sample(Class::ResultExpired),
                ],
                answers: vec![(0, 0)],
                expired,
                elapsed: Duration::from_millis(10),
            };
            let audit = Audit {
                ledger: vec![(0, 0)],
                succeeded: [0].into_iter().collect(),
            };
            summarize(setup(), &driven, &audit)
        };
        let held = storm(vec![0, 0]);
        assert_eq!((held.result_expired, held.false_refusals), (2, 0));
        assert!(held.invariants_hold, "{held}");
        // Key 1 never ran: refusing it as done would be a lie.
        let lied = storm(vec![0, 1]);
        assert_eq!(lied.false_refusals, 1);
        assert!(!lied.invariants_hold);
        assert!(
            lied.to_string().contains("false refusals       1  BROKEN"),
            "{lied}"
        );
    }
}
