//! A cap on the records one caller may create per window (abuse bound: a client cannot fill the
//! store with keys).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// At most `max` new records per caller per fixed `window`, counted in this process.
#[derive(Debug)]
pub(crate) struct Cap {
    max: u32,
    window: Duration,
    state: Mutex<Window>,
}

#[derive(Debug)]
struct Window {
    started: Instant,
    used: HashMap<[u8; 16], u32>,
}

/// A slot taken before a claim; [`Reservation::refund`] gives it back when no record was made.
#[derive(Debug)]
pub(crate) struct Reservation {
    cap: Arc<Cap>,
    who: [u8; 16],
    window: Instant,
}

impl Cap {
    pub(crate) fn new(max: u32, window: Duration) -> Self {
        Cap {
            max,
            window,
            state: Mutex::new(Window {
                started: Instant::now(),
                used: HashMap::new(),
            }),
        }
    }

    /// Takes a slot for `who`, or says how long until the window ends.
    pub(crate) fn reserve(self: &Arc<Self>, who: [u8; 16]) -> Result<Reservation, Duration> {
        let now = Instant::now();
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if now.duration_since(state.started) >= self.window {
            state.started = now;
            state.used.clear();
        }
        let used = state.used.entry(who).or_insert(0);
        if *used >= self.max {
            return Err(self
                .window
                .saturating_sub(now.duration_since(state.started)));
        }
        *used += 1;
        Ok(Reservation {
            cap: Arc::clone(self),
            who,
            window: state.started,
        })
    }
}

impl Reservation {
    /// Gives the slot back (the request replayed, or was refused before a record was written).
    pub(crate) fn refund(self) {
        let mut state = self.cap.state.lock().unwrap_or_else(|p| p.into_inner());
        if state.started == self.window
            && let Some(used) = state.used.get_mut(&self.who)
        {
            *used = used.saturating_sub(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caps_each_caller_and_refunds() {
        let cap = Arc::new(Cap::new(2, Duration::from_secs(60)));
        let (a, b) = ([1; 16], [2; 16]);
        let first = cap.reserve(a).unwrap();
        let _second = cap.reserve(a).unwrap();
        let wait = cap.reserve(a).unwrap_err();
        assert!(wait > Duration::from_secs(58) && wait <= Duration::from_secs(60));
        assert!(cap.reserve(b).is_ok(), "another caller has its own budget");
        first.refund();
        assert!(cap.reserve(a).is_ok(), "a refunded slot can be used again");
        assert!(cap.reserve(a).is_err());
    }

    #[test]
    fn a_new_window_starts_afresh() {
        let cap = Arc::new(Cap::new(1, Duration::from_millis(20)));
        cap.reserve([0; 16]).unwrap();
        assert!(cap.reserve([0; 16]).is_err());
        std::thread::sleep(Duration::from_millis(25));
        assert!(cap.reserve([0; 16]).is_ok());
    }
}
