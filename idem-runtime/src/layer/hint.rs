//! An honest `Retry-After` for a repeat that finds the first request still running: about how
//! long that route's handler has taken lately, never more than what is left of the first's lease
//! (after which a repeat takes over anyway).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

/// How many routes are remembered; past it the table starts over (a service has far fewer
/// routes: this only bounds a layer that sees paths without a matched route).
const MAX_ROUTES: usize = 1024;

/// The weight of the newest duration in the running mean.
const WEIGHT: f64 = 0.2;

/// Recent handler durations per route, in this process.
#[derive(Default)]
pub(crate) struct Durations {
    routes: Mutex<HashMap<String, Seen>>,
}

#[derive(Clone, Copy)]
struct Seen {
    /// Running mean, seconds.
    mean: f64,
    /// The longest of the recent ones, decaying toward the mean.
    high: f64,
}

impl Durations {
    /// Counts one run of `route`'s handler that took `took`.
    pub(crate) fn record(&self, route: &str, took: Duration) {
        let secs = took.as_secs_f64();
        let mut routes = self.routes.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(seen) = routes.get_mut(route) {
            seen.mean += WEIGHT * (secs - seen.mean);
            seen.high = secs.max(seen.high - WEIGHT * (seen.high - seen.mean));
            return;
        }
        if routes.len() >= MAX_ROUTES {
            routes.clear();
        }
        routes.insert(
            route.to_owned(),
            Seen {
                mean: secs,
                high: secs,
            },
        );
    }

    /// What to tell a repeat of `route` that found the first request running with `lease_left`
    /// of its lease: the route's recent high duration (the first may have only just started),
    /// in whole seconds as `Retry-After` carries them, at least 1 s, at most the lease left
    /// (rounded up). 1 s for a route not seen yet.
    pub(crate) fn hint(&self, route: &str, lease_left: Duration) -> Duration {
        let high = self
            .routes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(route)
            .map_or(1.0, |seen| seen.high);
        let secs = high.ceil().max(1.0);
        let lease_secs = lease_left.as_secs_f64().ceil().max(1.0);
        Duration::from_secs_f64(secs.min(lease_secs))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn a_fast_route_is_told_one_second() {
        let d = Durations::default();
        for _ in 0..20 {
            d.record("POST /orders", ms(50));
        }
        assert_eq!(d.hint("POST /orders", Duration::from_secs(30)), ms(1000));
        assert_eq!(d.hint("POST /unseen", Duration::from_secs(30)), ms(1000));
    }

    #[test]
    fn a_slow_route_is_told_its_recent_high_bounded_by_the_lease() {
        let d = Durations::default();
        d.record("POST /report", ms(7_200));
        d.record("POST /report", ms(2_000));
        let hint = d.hint("POST /report", Duration::from_secs(30));
        assert!(hint >= ms(3_000) && hint <= ms(8_000), "{hint:?}");
        assert_eq!(d.hint("POST /report", ms(1_500)), ms(2_000));
        assert_eq!(d.hint("POST /report", ms(10)), ms(1_000));
    }

    #[test]
    fn the_table_is_bounded() {
        let d = Durations::default();
        for i in 0..(MAX_ROUTES + 10) {
            d.record(&format!("POST /p/{i}"), ms(10));
        }
        assert!(d.routes.lock().unwrap().len() <= MAX_ROUTES);
    }
}
