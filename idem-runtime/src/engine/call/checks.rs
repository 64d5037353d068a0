//! The ranges a call's durations must fall in, checked before anything is written.

use std::time::Duration;

use super::{DEFAULT_LEASE, DEFAULT_STORE_TIMEOUT, DEFAULT_TTL};
use crate::{IdemError, duration};

/// The range of a store timeout: 1 ms ..= [`MAX_DURATION`](crate::MAX_DURATION).
pub(crate) fn check_store_timeout(timeout: Duration) -> Result<(), IdemError> {
    if timeout == DEFAULT_STORE_TIMEOUT {
        return Ok(());
    }
    duration::check(
        "the store timeout",
        timeout,
        Duration::from_millis(1),
        "shorter than 1 ms: no store could answer in time",
    )
}

/// The range of a result ttl: 1 ms ..= the call's ttl.
pub(crate) fn check_result_ttl(result_ttl: Duration, ttl: Duration) -> Result<(), IdemError> {
    duration::check(
        "the result ttl",
        result_ttl,
        Duration::from_millis(1),
        "shorter than 1 ms, the stores' unit of time: the result would be gone before a repeat \
         could read it",
    )?;
    if result_ttl > ttl {
        return Err(IdemError::InvalidOptions {
            reason: format!(
                "the result ttl {result_ttl:?} is longer than the ttl {ttl:?}: a result cannot \
                 outlive its record (make the ttl at least as long)"
            ),
        });
    }
    Ok(())
}

/// The ranges of a call's durations, checked before anything is written (the same for `Call`,
/// `#[idempotent]`, whose literals the macro has checked already, and the HTTP layer's `build()`):
/// the lease 1 ms ..= [`MAX_DURATION`](crate::MAX_DURATION), the ttl longer than the lease and at
/// most the maximum, a wait 0 ..= the maximum, a heartbeat of at least 1 ms and shorter than the lease.
pub(crate) fn check_durations(
    ttl: Duration,
    lease: Duration,
    wait: Option<Duration>,
    heartbeat: Option<Duration>,
) -> Result<(), IdemError> {
    if (ttl, lease, wait, heartbeat) == (DEFAULT_TTL, DEFAULT_LEASE, None, None) {
        return Ok(());
    }
    duration::check(
        "the lease",
        lease,
        Duration::from_millis(1),
        "shorter than 1 ms, the stores' unit of time: the claim would expire before the body starts",
    )?;
    duration::check_max("the ttl", ttl)?;
    if ttl <= lease {
        return Err(IdemError::InvalidOptions {
            reason: format!("ttl {ttl:?} must be longer than the lease {lease:?}"),
        });
    }
    if let Some(wait) = wait {
        duration::check_max("the wait", wait)?;
    }
    if let Some(every) = heartbeat
        && (every < Duration::from_millis(1) || every >= lease)
    {
        return Err(IdemError::InvalidOptions {
            reason: format!(
                "the heartbeat {every:?} must be at least 1 ms and shorter than the lease {lease:?} (a third of it is usual)"
            ),
        });
    }
    Ok(())
}
