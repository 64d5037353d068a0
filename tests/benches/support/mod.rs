//! What every bench shares: the stored result, the settings read from the environment, medians
//! over rounds, the client's CPU time, and the tables `docs/BENCHMARKS.md` is generated from
//! (`idem_suite::doc_table`).
#![allow(dead_code, unused_imports)]

pub use idem_suite::doc_table::{Table, r3, rate};
use serde::{Deserialize, Serialize};

/// The stored result of the server benches: a string and two integers.
#[derive(Debug, Serialize, Deserialize)]
pub struct Receipt {
    pub id: String,
    pub amount: u64,
    pub seq: u64,
}

/// The body every contender runs for key `k`.
pub fn receipt(k: u64) -> Receipt {
    Receipt {
        id: format!("order-{k}"),
        amount: k * 100 + 7,
        seq: k,
    }
}

/// The business type every bench claims under.
pub const BIZ: &str = "BENCH";

/// `IDEM_BENCH_SCALE`: the size of a round, relative to the bench's own (default 1).
pub fn scale() -> f64 {
    std::env::var("IDEM_BENCH_SCALE")
        .ok()
        .and_then(|s| s.parse().ok())
        .filter(|s: &f64| *s > 0.0)
        .unwrap_or(1.0)
}

/// `IDEM_BENCH_ROUNDS`: how many rounds (default `default`, at least 1).
pub fn rounds(default: usize) -> usize {
    std::env::var("IDEM_BENCH_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
        .max(1)
}

/// `IDEM_BENCH_ONLY`, split at commas (empty when unset).
pub fn only() -> Vec<String> {
    std::env::var("IDEM_BENCH_ONLY")
        .map(|s| {
            s.split(',')
                .map(|t| t.trim().to_owned())
                .filter(|t| !t.is_empty())
                .collect()
        })
        .unwrap_or_default()
}

/// The median of `v` (NaN when empty).
pub fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// The median of the per-round ratios `a[i] / b[i]`.
pub fn ratio(a: &[f64], b: &[f64]) -> f64 {
    median(a.iter().zip(b).map(|(x, y)| x / y).collect())
}

/// The client's clock in ms since the epoch.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// CPU time this process has used (user + system, all threads), from `/proc/self/stat`, in
/// seconds (10 ms resolution); 0 where there is no `/proc`.
pub fn cpu_seconds() -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return 0.0;
    };
    // The fields after the command name (which may hold spaces) start after its closing ')'.
    let rest = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name.
    let ticks: f64 = [11, 12]
        .iter()
        .filter_map(|&i| fields.get(i).and_then(|f| f.parse::<f64>().ok()))
        .sum();
    ticks / 100.0
}
