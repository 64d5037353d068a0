//! Durations written in attributes: a positive integer followed by a unit, `"500ms"`, `"30s"`, `"5m"`,
//! `"1h"`, `"7d"`. Parsed at compile time into milliseconds.

use std::fmt;

/// The units, in the order the error message lists them, with their length in milliseconds.
const UNITS: [(&str, u64); 5] = [
    ("ms", 1),
    ("s", 1_000),
    ("m", 60_000),
    ("h", 3_600_000),
    ("d", 86_400_000),
];

/// Why a duration literal was refused.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum DurationError {
    /// No leading digits (`""`, `"s"`, `"-5s"`, `" 5s"`).
    NoNumber,
    /// Digits but no unit (`"30"`).
    NoUnit,
    /// A unit that is not one of `ms`, `s`, `m`, `h`, `d` (`"7x"`, `"5 s"`).
    UnknownUnit(String),
    /// `"0s"`: a zero duration protects nothing.
    Zero,
    /// Longer than [`MAX_MILLIS`] (or does not fit in `u64` milliseconds).
    TooLong,
}

impl fmt::Display for DurationError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let units = "`ms`, `s`, `m`, `h` or `d`";
        match self {
            DurationError::NoNumber => write!(
                f,
                "write a positive integer followed by a unit ({units}), e.g. `\"30s\"` or `\"7d\"`"
            ),
            DurationError::NoUnit => write!(
                f,
                "add a unit after the number ({units}), e.g. `\"30s\"` or `\"7d\"`"
            ),
            DurationError::UnknownUnit(unit) => write!(
                f,
                "unknown unit `{unit}`; the units are {units}, e.g. `\"30s\"` or `\"7d\"`"
            ),
            DurationError::Zero => write!(f, "a duration must be greater than zero"),
            DurationError::TooLong => write!(
                f,
                "the duration is longer than idem's maximum of 3650 days (`idem::MAX_DURATION`); write at most `\"3650d\"`"
            ),
        }
    }
}

/// The longest duration idem takes, in milliseconds: 3650 days, the runtime's `MAX_DURATION`
/// (tests/tests/idempotent_macro.rs checks that the two agree).
pub(crate) const MAX_MILLIS: u64 = 3650 * 86_400_000;

/// Parses `"7d"` into milliseconds, at most [`MAX_MILLIS`].
pub(crate) fn parse_millis(text: &str) -> Result<u64, DurationError> {
    let digits_end = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(digits_end);
    if number.is_empty() {
        return Err(DurationError::NoNumber);
    }
    if unit.is_empty() {
        return Err(DurationError::NoUnit);
    }
    let Some(&(_, unit_ms)) = UNITS.iter().find(|(name, _)| *name == unit) else {
        return Err(DurationError::UnknownUnit(unit.to_owned()));
    };
    let number: u64 = number.parse().map_err(|_| DurationError::TooLong)?;
    if number == 0 {
        return Err(DurationError::Zero);
    }
    number
        .checked_mul(unit_ms)
        .filter(|ms| *ms <= MAX_MILLIS)
        .ok_or(DurationError::TooLong)
}

/// Milliseconds back into the largest whole unit, for messages: `604800000` → `"7d"`.
pub(crate) fn format_millis(ms: u64) -> String {
    UNITS
        .iter()
        .rev()
        .find(|(_, unit_ms)| ms.is_multiple_of(*unit_ms))
        .map(|(name, unit_ms)| format!("{}{name}", ms / unit_ms))
        .unwrap_or_else(|| format!("{ms}ms"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_unit() {
        assert_eq!(parse_millis("500ms"), Ok(500));
        assert_eq!(parse_millis("30s"), Ok(30_000));
        assert_eq!(parse_millis("5m"), Ok(300_000));
        assert_eq!(parse_millis("1h"), Ok(3_600_000));
        assert_eq!(parse_millis("7d"), Ok(604_800_000));
    }

    #[test]
    fn refuses_bad_input_with_a_reason() {
        assert_eq!(
            parse_millis("7x"),
            Err(DurationError::UnknownUnit("x".into()))
        );
        assert_eq!(
            parse_millis("5 s"),
            Err(DurationError::UnknownUnit(" s".into()))
        );
        assert_eq!(parse_millis("30"), Err(DurationError::NoUnit));
        assert_eq!(parse_millis(""), Err(DurationError::NoNumber));
        assert_eq!(parse_millis("s"), Err(DurationError::NoNumber));
        assert_eq!(parse_millis("-5s"), Err(DurationError::NoNumber));
        assert_eq!(
            parse_millis("1.5h"),
            Err(DurationError::UnknownUnit(".5h".into()))
        );
        assert_eq!(parse_millis("0s"), Err(DurationError::Zero));
        assert_eq!(
            parse_millis("99999999999999999999d"),
            Err(DurationError::TooLong)
        );
        assert_eq!(
            parse_millis("999999999999999d"),
            Err(DurationError::TooLong)
        );
        // The maximum itself, in any unit, and one millisecond more.
        assert_eq!(parse_millis("3650d"), Ok(MAX_MILLIS));
        assert_eq!(parse_millis("87600h"), Ok(MAX_MILLIS));
        assert_eq!(parse_millis("315360000000ms"), Ok(MAX_MILLIS));
        assert_eq!(parse_millis("315360000001ms"), Err(DurationError::TooLong));
        assert_eq!(parse_millis("3651d"), Err(DurationError::TooLong));
        let message = parse_millis("7x").unwrap_err().to_string();
        assert!(message.contains("`ms`, `s`, `m`, `h` or `d`"), "{message}");
    }

    #[test]
    fn formats_in_the_largest_unit() {
        assert_eq!(format_millis(604_800_000), "7d");
        assert_eq!(format_millis(30_000), "30s");
        assert_eq!(format_millis(90_000), "90s");
        assert_eq!(format_millis(1_500), "1500ms");
    }
}
