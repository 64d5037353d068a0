//! The limits a store enforces before it writes anything, and their check against what a
//! backend can hold.

use crate::IdemError;
use crate::key::{DEFAULT_MAX_BIZ_LEN, DEFAULT_MAX_KEY_LEN};

/// Limits a store enforces before it writes anything.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Longest key in bytes (default 128).
    pub max_key_len: usize,
    /// Longest business type in bytes (default 32).
    pub max_biz_len: usize,
    /// Largest stored result snapshot in bytes (default 64 KiB).
    pub max_snapshot_len: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_key_len: DEFAULT_MAX_KEY_LEN,
            max_biz_len: DEFAULT_MAX_BIZ_LEN,
            max_snapshot_len: 64 * 1024,
        }
    }
}

impl Limits {
    /// The widest limits: no bound on any length (what a store that holds anything reports
    /// before it is narrowed).
    pub(crate) const UNBOUNDED: Limits = Limits {
        max_key_len: usize::MAX,
        max_biz_len: usize::MAX,
        max_snapshot_len: usize::MAX,
    };

    /// Each limit the smaller of `self`'s and `other`'s.
    pub(crate) fn strictest(&self, other: &Limits) -> Limits {
        Limits {
            max_key_len: self.max_key_len.min(other.max_key_len),
            max_biz_len: self.max_biz_len.min(other.max_biz_len),
            max_snapshot_len: self.max_snapshot_len.min(other.max_snapshot_len),
        }
    }
}

/// Checks `limits` against `bounds`, what `holder` (say "an SQLite database") can store: the
/// first limit past its bound is refused, naming both. What every store's `with_limits` runs.
///
/// # Errors
/// [`IdemError::InvalidOptions`] naming the limit, its value and the bound.
pub(crate) fn check_limits(
    holder: &str,
    limits: &Limits,
    bounds: &Limits,
) -> Result<(), IdemError> {
    for (field, what, value, bound) in [
        (
            "max_biz_len",
            "business type",
            limits.max_biz_len,
            bounds.max_biz_len,
        ),
        ("max_key_len", "key", limits.max_key_len, bounds.max_key_len),
        (
            "max_snapshot_len",
            "snapshot",
            limits.max_snapshot_len,
            bounds.max_snapshot_len,
        ),
    ] {
        if value > bound {
            return Err(IdemError::InvalidOptions {
                reason: format!(
                    "{field} = {value} is more than {holder} holds: a {what} of at most {bound} \
                     bytes"
                ),
            });
        }
    }
    Ok(())
}

/// [`check_limits`] for a store that keeps a record under one key holding both the business type
/// and the key, in `key_room` bytes (after its own framing), and a snapshot of at most
/// `max_snapshot` bytes: each limit within its bound, and the business type and the key together
/// within the room. `key` names that key for people ("a Redis key"), `why` says where the room
/// comes from (may be empty).
///
/// # Errors
/// [`IdemError::InvalidOptions`] naming the limit past its bound.
#[cfg_attr(not(any(feature = "redis", feature = "dynamodb")), allow(dead_code))]
pub(crate) fn check_one_key_limits(
    holder: &str,
    key: &str,
    limits: &Limits,
    key_room: usize,
    max_snapshot: usize,
    why: &str,
) -> Result<(), IdemError> {
    let bounds = Limits {
        max_key_len: key_room,
        max_biz_len: key_room,
        max_snapshot_len: max_snapshot,
    };
    check_limits(holder, limits, &bounds)?;
    let both = limits.max_biz_len.saturating_add(limits.max_key_len);
    if both > key_room {
        return Err(IdemError::InvalidOptions {
            reason: format!(
                "max_biz_len + max_key_len = {both} is more than {key} holds: a business type and \
                 a key of at most {key_room} bytes together{why}"
            ),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_limit_past_its_bound_is_named_with_the_bound() {
        let bounds = Limits {
            max_key_len: 255,
            max_biz_len: 64,
            max_snapshot_len: 1000,
        };
        assert!(check_limits("x", &Limits::default().strictest(&bounds), &bounds).is_ok());
        let err = check_limits(
            "the table",
            &Limits {
                max_key_len: 256,
                ..Limits::default()
            },
            &bounds,
        )
        .unwrap_err();
        assert!(matches!(err, IdemError::InvalidOptions { .. }));
        assert!(
            err.to_string().contains(
                "max_key_len = 256 is more than the table holds: a key of at most 255 bytes"
            ),
            "{err}"
        );
        assert!(check_limits("x", &Limits::UNBOUNDED, &Limits::UNBOUNDED).is_ok());
    }
}
