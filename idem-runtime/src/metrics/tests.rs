//! The metrics' unit tests: handles follow the recorder in charge, and every outcome has its counter.

use super::*;
use std::sync::{Arc, Mutex};

/// A recorder keeping counters by their full key (name and labels).
#[derive(Default)]
struct Keep(Mutex<HashMap<String, Arc<AtomicU64>>>);

impl Keep {
    fn get(&self, key: &str) -> u64 {
        let map = self.0.lock().unwrap();
        map.get(key).map_or(0, |c| c.load(Ordering::Relaxed))
    }
}

impl metrics::Recorder for Keep {
    fn describe_counter(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn describe_gauge(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn describe_histogram(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn register_counter(&self, key: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Counter {
        let labels: Vec<String> = key
            .labels()
            .map(|l| format!("{}={}", l.key(), l.value()))
            .collect();
        let name = format!("{}{{{}}}", key.name(), labels.join(","));
        let counter = Arc::clone(self.0.lock().unwrap().entry(name).or_default());
        metrics::Counter::from_arc(counter)
    }
    fn register_gauge(&self, _: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Gauge {
        metrics::Gauge::noop()
    }
    fn register_histogram(
        &self,
        _: &metrics::Key,
        _: &metrics::Metadata<'_>,
    ) -> metrics::Histogram {
        metrics::Histogram::noop()
    }
}

#[test]
fn handles_follow_the_recorder_in_charge() {
    let biz = "METRICS_HANDLES";
    record(biz, Outcome::Executed); // before any recorder: goes nowhere
    let first = Keep::default();
    metrics::with_local_recorder(&first, || {
        record(biz, Outcome::Executed);
        record(biz, Outcome::Replayed);
        record(biz, Outcome::TakenOver);
    });
    assert_eq!(
        first.get("idem_calls_total{biz=METRICS_HANDLES,outcome=executed}"),
        1
    );
    assert_eq!(
        first.get("idem_calls_total{biz=METRICS_HANDLES,outcome=replayed}"),
        1
    );
    assert_eq!(first.get("idem_duplicates_total{biz=METRICS_HANDLES}"), 1);
    assert_eq!(
        first.get("idem_lease_takeovers_total{biz=METRICS_HANDLES}"),
        1
    );
    let second = Keep::default();
    metrics::with_local_recorder(&second, || record(biz, Outcome::Mismatch));
    assert_eq!(
        second.get("idem_calls_total{biz=METRICS_HANDLES,outcome=mismatch}"),
        1
    );
    assert_eq!(
        first.get("idem_calls_total{biz=METRICS_HANDLES,outcome=mismatch}"),
        0
    );
    assert_eq!(counts_for(biz).get(Outcome::Executed), 2);
}

#[test]
fn counts_debug_names_every_outcome() {
    let mut counts = Counts::default();
    counts.0[Outcome::Replayed.index()] = 5;
    let text = format!("{counts:?}");
    assert!(
        text.starts_with(
            "Counts { executed: 0, taken_over: 0, recovered: 0, recover_failed: 0, replayed: 5,"
        ),
        "{text}"
    );
    assert!(
        text.ends_with("not_found: 0, result_expired: 0 }"),
        "{text}"
    );
}
