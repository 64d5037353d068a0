//! Time as the CLI reads and shows it: `--store-timeout`'s durations, this machine's clock,
//! times relative to it and as RFC 3339 UTC.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The longest `--store-timeout` takes.
const MAX_STORE_TIMEOUT: Duration = Duration::from_secs(24 * 3600);

/// `--store-timeout`: `500ms`, `30s`, `5m`, `1h`; 1 ms ..= 24 h.
pub(crate) fn store_timeout(text: &str) -> Result<Duration, String> {
    let digits = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(digits);
    let unit_ms: u64 = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        _ => {
            return Err(format!(
                "`{text}` is not a duration: write a number and a unit, ms, s, m or h (`30s`)"
            ));
        }
    };
    let number: u64 = number
        .parse()
        .map_err(|_| format!("`{text}` is not a duration: it starts with no number (`30s`)"))?;
    let timeout = Duration::from_millis(number.saturating_mul(unit_ms));
    if timeout.is_zero() || timeout > MAX_STORE_TIMEOUT {
        return Err(format!("`{text}` is outside 1ms ..= 24h"));
    }
    Ok(timeout)
}

/// This machine's clock in milliseconds since the Unix epoch.
pub(crate) fn wall_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// `at` relative to `now`: "in 12s", or `past` and "… ago" ("ended 3m5s ago").
pub(crate) fn relative(at: i64, now: i64, past: &str) -> String {
    let d = Duration::from_millis(at.abs_diff(now));
    if at >= now {
        format!("in {}", human(d))
    } else {
        format!("{past} {} ago", human(d))
    }
}

/// A duration in its two largest units: `850ms`, `12s`, `3m5s`, `2h7m`, `4d3h`.
pub(crate) fn human(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0 => format!("{}ms", d.as_millis()),
        1..60 => format!("{s}s"),
        60..3600 => format!("{}m{}s", s / 60, s % 60),
        3600..86_400 => format!("{}h{}m", s / 3600, s % 3600 / 60),
        _ => format!("{}d{}h", s / 86_400, s % 86_400 / 3600),
    }
}

/// Milliseconds since the Unix epoch as RFC 3339 UTC, `2026-12-01T17:04:45.123Z`.
pub(crate) fn rfc3339(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        ms.rem_euclid(1000)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_read_as_people_read_them() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(951_782_400_123), "2000-02-29T00:00:00.123Z");
        assert_eq!(rfc3339(1_796_143_485_007), "2026-12-01T16:44:45.007Z");
        assert_eq!(relative(12_000, 0, "ended"), "in 12s");
        assert_eq!(relative(0, 185_000, "ended"), "ended 3m5s ago");
        assert_eq!(human(Duration::from_millis(850)), "850ms");
        assert_eq!(human(Duration::from_secs(2 * 86_400 + 7200)), "2d2h");
    }

    #[test]
    fn store_timeouts_are_read_within_their_range() {
        assert_eq!(store_timeout("1ms"), Ok(Duration::from_millis(1)));
        assert_eq!(store_timeout("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(store_timeout("24h"), Ok(Duration::from_secs(24 * 3600)));
        for bad in ["0s", "25h", "5", "s", "1d", "99999999999999999999h"] {
            assert!(store_timeout(bad).is_err(), "{bad}");
        }
    }
}
