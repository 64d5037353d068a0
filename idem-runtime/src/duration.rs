//! The one rule for every duration idem takes (a call's ttl, lease, wait and heartbeat, the HTTP
//! layer's, a token's ttl, the sweeper's period, a store's timeouts): each has a documented lower
//! bound, and none may be longer than [`MAX_DURATION`]. A duration outside its range is refused
//! with [`IdemError::InvalidOptions`] where it is first seen (compile time for an attribute's
//! literal, `build()` for a builder, the call for [`Call`](crate::Call)), before anything is
//! written; nothing ever wraps, overflows into another type or panics.
//!
//! Inside, the stores also clamp every duration they are handed to the maximum (a [`Store`]
//! called directly with `Duration::MAX` saturates instead of overflowing), so the check above is
//! the rule and the clamp only a guard.
//!
//! [`Store`]: crate::Store

use std::time::Duration;

use crate::IdemError;

/// The longest duration any idem API accepts: 3650 days (about ten years). Every store can add it
/// to its clock without overflow (Redis keeps times as Lua numbers, the SQL stores as 64-bit
/// milliseconds), and `Instant::now()` plus it never overflows.
pub const MAX_DURATION: Duration = Duration::from_secs(3650 * 24 * 3600);

/// How the maximum reads in messages.
const MAX_TEXT: &str = "3650 days (idem::MAX_DURATION)";

/// Checks that `what` (`"the ttl"`, `"a token's ttl"`…) lies in `min ..= MAX_DURATION`; `min`
/// says why in `below` when it does not.
pub(crate) fn check(
    what: &str,
    value: Duration,
    min: Duration,
    below: &str,
) -> Result<(), IdemError> {
    if value < min {
        return Err(IdemError::InvalidOptions {
            reason: format!("{what} {value:?} is {below}"),
        });
    }
    check_max(what, value)
}

/// Checks that `what` is at most [`MAX_DURATION`].
pub(crate) fn check_max(what: &str, value: Duration) -> Result<(), IdemError> {
    if value > MAX_DURATION {
        return Err(IdemError::InvalidOptions {
            reason: format!(
                "{what} {} is longer than the maximum of {MAX_TEXT}",
                shown(value)
            ),
        });
    }
    Ok(())
}

/// A duration for a message: `Duration::MAX` by name (its `Debug` form is 30 digits).
fn shown(value: Duration) -> String {
    if value == Duration::MAX {
        "Duration::MAX".to_owned()
    } else {
        format!("{value:?}")
    }
}

/// A duration as whole store-clock milliseconds, clamped to [`MAX_DURATION`] (see the module
/// docs): always small enough to add to any clock.
pub(crate) fn clamped_millis(d: Duration) -> i64 {
    // MAX_DURATION in ms is about 3.2e11, far inside i64.
    d.min(MAX_DURATION).as_millis() as i64
}

/// The back-off before retry number `failures` (1 for the first): `base × 2^(failures − 1)`, at
/// most `cap`; saturating, so no count of failures overflows.
pub(crate) fn doubling(base: Duration, failures: u32, cap: Duration) -> Duration {
    base.saturating_mul(1 << failures.saturating_sub(1).min(30))
        .min(cap)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_range_holds_at_its_edges() {
        let ms = Duration::from_millis(1);
        assert!(check("the lease", Duration::ZERO, ms, "shorter than 1 ms").is_err());
        assert!(
            check(
                "the lease",
                Duration::from_nanos(1),
                ms,
                "shorter than 1 ms"
            )
            .is_err()
        );
        assert!(check("the lease", ms, ms, "shorter than 1 ms").is_ok());
        assert!(check("the lease", MAX_DURATION, ms, "shorter than 1 ms").is_ok());
        let err = check("the lease", MAX_DURATION + Duration::from_nanos(1), ms, "x").unwrap_err();
        assert!(err.to_string().contains("3650 days"), "{err}");
        assert!(check("the lease", Duration::MAX, ms, "x").is_err());
    }

    #[test]
    fn clamped_millis_never_exceeds_the_maximum() {
        assert_eq!(clamped_millis(Duration::ZERO), 0);
        assert_eq!(clamped_millis(Duration::from_nanos(1)), 0);
        assert_eq!(clamped_millis(Duration::from_millis(7)), 7);
        let max = MAX_DURATION.as_millis() as i64;
        assert_eq!(clamped_millis(MAX_DURATION), max);
        assert_eq!(clamped_millis(Duration::MAX), max);
        // Any store clock (ms since 1970, with room to spare) plus the maximum stays an i64.
        assert!(i64::MAX - max > 4_102_444_800_000 * 1000);
    }
}
