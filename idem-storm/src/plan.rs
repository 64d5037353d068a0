//! The request plan: which key each request uses and which fault it carries, drawn from the seed
//! before the storm starts, so a run can be repeated exactly.

use crate::args::Args;

/// What goes wrong in one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fault {
    None,
    /// The body returns a business error before its effect.
    Error,
    /// The body runs 1.5 leases long.
    Slow,
    /// The body writes its effect, then stalls 1.5 leases before it returns.
    Stall,
    /// The body panics before its effect.
    Panic,
    /// The caller drops the call's future while the body runs, before its effect.
    Drop,
}

/// One request: its key (an index into the run's keys) and its fault.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Request {
    pub key: u32,
    pub fault: Fault,
}

pub(crate) struct Plan {
    pub requests: Vec<Request>,
    pub distinct_keys: u32,
}

pub(crate) fn plan(args: &Args, seed: u64) -> Plan {
    let mut rng = fastrand::Rng::with_seed(seed);
    let n = args.requests as usize;
    let mut requests: Vec<Request> = Vec::with_capacity(n);
    let mut next_key = 0u32;
    for i in 0..n {
        let key = if i > 0 && rng.f64() < args.dup_rate {
            requests[i - 1 - back(args.skew, rng.f64(), i)].key
        } else {
            next_key += 1;
            next_key - 1
        };
        requests.push(Request {
            key,
            fault: fault(args, rng.f64()),
        });
    }
    Plan {
        requests,
        distinct_keys: next_key,
    }
}

/// How far back from the newest of `i` earlier requests a duplicate reaches: uniform when `skew`
/// is 0; otherwise a power law, `P(back >= x) = (x + 1)^-skew`, so a larger skew repeats more
/// recent requests (in flight at once) and a smaller one reaches further into the past.
fn back(skew: f64, draw: f64, i: usize) -> usize {
    let back = if skew == 0.0 {
        draw * i as f64
    } else {
        (1.0 - draw).powf(-1.0 / skew) - 1.0
    };
    (back as usize).min(i - 1)
}

fn fault(args: &Args, draw: f64) -> Fault {
    let mut edge = args.error_rate;
    if draw < edge {
        return Fault::Error;
    }
    edge += args.slow_rate;
    if draw < edge {
        return Fault::Slow;
    }
    edge += args.panic_rate;
    if draw < edge {
        return Fault::Panic;
    }
    edge += args.drop_rate;
    if draw < edge {
        return Fault::Drop;
    }
    // Last, so a plan without stalls is the one a seed drew before stalls existed.
    edge += args.stall_rate;
    if draw < edge {
        return Fault::Stall;
    }
    Fault::None
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    fn args(extra: &[&str]) -> Args {
        let mut argv = vec!["idem-storm"];
        argv.extend_from_slice(extra);
        Args::parse_from(argv)
    }

    #[test]
    fn the_duplicate_rate_comes_out_near_the_asked_one() {
        let a = args(&["-n", "100000", "--dup-rate", "0.123"]);
        let p = plan(&a, 7);
        let rate = 1.0 - f64::from(p.distinct_keys) / p.requests.len() as f64;
        assert!((rate - 0.123).abs() < 0.01, "duplicate rate {rate}");
    }

    #[test]
    fn the_same_seed_gives_the_same_plan() {
        let a = args(&["-n", "1000", "--error-rate", "0.2"]);
        let (x, y) = (plan(&a, 42), plan(&a, 42));
        let keys = |p: &Plan| {
            p.requests
                .iter()
                .map(|r| (r.key, r.fault))
                .collect::<Vec<_>>()
        };
        assert_eq!(keys(&x), keys(&y));
        assert_ne!(keys(&x), keys(&plan(&a, 43)));
    }

    #[test]
    fn faults_come_at_their_rates() {
        let a = args(&["-n", "50000", "--error-rate", "0.1", "--panic-rate", "0.05"]);
        let p = plan(&a, 1);
        let share = |f| p.requests.iter().filter(|r| r.fault == f).count() as f64 / 50_000.0;
        assert!((share(Fault::Error) - 0.1).abs() < 0.01);
        assert!((share(Fault::Panic) - 0.05).abs() < 0.01);
        assert_eq!(share(Fault::Drop), 0.0);
        assert_eq!(share(Fault::Stall), 0.0);
    }

    #[test]
    fn stalls_come_at_their_rate_and_leave_the_other_faults_alone() {
        let without = plan(&args(&["-n", "50000", "--slow-rate", "0.2"]), 5);
        let with = plan(
            &args(&["-n", "50000", "--slow-rate", "0.2", "--stall-rate", "0.3"]),
            5,
        );
        let share =
            |p: &Plan, f| p.requests.iter().filter(|r| r.fault == f).count() as f64 / 50_000.0;
        assert!((share(&with, Fault::Stall) - 0.3).abs() < 0.01);
        // The same keys, and the same requests slow: stalls only replace fault-free requests.
        for (a, b) in without.requests.iter().zip(&with.requests) {
            assert_eq!(a.key, b.key);
            assert_eq!(a.fault == Fault::Slow, b.fault == Fault::Slow);
        }
    }

    #[test]
    fn a_high_skew_repeats_recent_keys() {
        let a = args(&["-n", "20000", "--dup-rate", "0.5", "--skew", "8"]);
        let p = plan(&a, 3);
        let mut last_seen = std::collections::HashMap::new();
        let mut gaps = Vec::new();
        for (i, r) in p.requests.iter().enumerate() {
            if let Some(j) = last_seen.insert(r.key, i) {
                gaps.push(i - j);
            }
        }
        gaps.sort_unstable();
        assert!(
            gaps[gaps.len() / 2] <= 4,
            "median gap {}",
            gaps[gaps.len() / 2]
        );
    }

    #[test]
    fn no_skew_reaches_anywhere_back() {
        let a = args(&["-n", "20000", "--dup-rate", "0.2", "--skew", "0"]);
        let p = plan(&a, 3);
        let mut first_seen = std::collections::HashMap::new();
        let mut gaps = Vec::new();
        for (i, r) in p.requests.iter().enumerate() {
            if let Some(&j) = first_seen.get(&r.key) {
                gaps.push(i - j);
            } else {
                first_seen.insert(r.key, i);
            }
        }
        gaps.sort_unstable();
        assert!(
            gaps[gaps.len() / 2] > 1000,
            "median gap {}",
            gaps[gaps.len() / 2]
        );
    }
}
