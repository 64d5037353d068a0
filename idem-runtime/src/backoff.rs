//! The pause between tries of a step that met contention or a transient store error: shared by the
//! engine's retries and by the stores' own (a claim that lost an insert race, a MySQL deadlock).

use std::time::Duration;

/// The pause before try number `tried + 1` of a step that hit contention: exponential from 2 ms
/// up to about half a second, with jitter (50–150 %), so callers that collided do not collide
/// again in lockstep.
pub(crate) fn back_off_pause(tried: u32) -> Duration {
    let base = 2u64.saturating_mul(1 << tried.min(8)).min(500);
    // The OS generator (already linked for tokens and nonces): a pause is rare, so a syscall
    // per pause costs nothing measurable; should it fail, the pause has no jitter.
    let jitter = getrandom::u64().map_or(base * 1000 / 2, |r| r % (base * 1000 + 1));
    Duration::from_micros(base * 1000 / 2 + jitter)
}

/// Sleeps for [`back_off_pause`].
pub(crate) async fn back_off(tried: u32) {
    tokio::time::sleep(back_off_pause(tried)).await;
}
