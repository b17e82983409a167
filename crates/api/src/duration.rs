//! Durations as people write them in manifests: `30s`, `5m`, `1h30m`, `1.5h`,
//! `250ms`. The grammar is one or more `<number><unit>` terms, where the number is
//! decimal digits with an optional fraction and the unit is `ms`, `s`, `m` or
//! `h`; no sign, no spaces. The same grammar is enforced by the CRD schema
//! ([`DURATION_REGEX`]) and by [`parse_duration`], so a value the API server
//! accepted always parses (except absurd overflows, reported as an error).

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The duration grammar as an RE2 regular expression (used in CEL rules).
/// Written without backslashes so it needs no escaping in CEL or YAML.
pub const DURATION_REGEX: &str = "^([0-9]+([.][0-9]+)?(ms|s|m|h))+$";

/// Longest duration string the schema accepts.
pub const DURATION_MAX_LENGTH: u32 = 32;

/// Why a duration string did not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    #[error("empty duration")]
    Empty,
    #[error(
        "invalid duration {input:?}: {reason} (expected e.g. 30s, 5m, 1h30m; units ms, s, m, h)"
    )]
    Malformed { input: String, reason: &'static str },
    #[error("duration {0:?} is too large")]
    Overflow(String),
}

const NANOS_PER_MS: u128 = 1_000_000;
const NANOS_PER_S: u128 = 1_000_000_000;
const NANOS_PER_M: u128 = 60 * NANOS_PER_S;
const NANOS_PER_H: u128 = 60 * NANOS_PER_M;

/// Parses a duration written as in [`DURATION_REGEX`] (`"10m"`, `"1h30m"`, `"1.5s"`,
/// `"0s"`). Fractions finer than a nanosecond are truncated.
pub fn parse_duration(input: &str) -> Result<Duration, DurationError> {
    if input.is_empty() {
        return Err(DurationError::Empty);
    }
    let malformed = |reason| DurationError::Malformed {
        input: input.to_string(),
        reason,
    };
    let overflow = || DurationError::Overflow(input.to_string());
    let bytes = input.as_bytes();
    let mut i = 0;
    let mut total: u128 = 0;
    let mut overflowed = false;
    while i < bytes.len() {
        // Whole part.
        let start = i;
        while i < bytes.len() && bytes[i].is_ascii_digit() {
            i += 1;
        }
        if i == start {
            return Err(malformed(if bytes[i] == b'-' || bytes[i] == b'+' {
                "a sign is not allowed"
            } else {
                "expected a number"
            }));
        }
        let whole = &input[start..i];
        // Optional fraction.
        let mut frac = "";
        if i < bytes.len() && bytes[i] == b'.' {
            i += 1;
            let fstart = i;
            while i < bytes.len() && bytes[i].is_ascii_digit() {
                i += 1;
            }
            if i == fstart {
                return Err(malformed("expected digits after '.'"));
            }
            frac = &input[fstart..i];
        }
        // Unit.
        let unit = if input[i..].starts_with("ms") {
            i += 2;
            NANOS_PER_MS
        } else {
            let unit = match bytes.get(i) {
                Some(b's') => NANOS_PER_S,
                Some(b'm') => NANOS_PER_M,
                Some(b'h') => NANOS_PER_H,
                Some(_) => return Err(malformed("unknown unit")),
                None => return Err(malformed("missing unit")),
            };
            i += 1;
            unit
        };
        // A term too large is reported once the whole input is known to be
        // in the grammar: found by fuzzing, "340300000000000000000000000000s0"
        // was an Overflow, not Malformed (the schema refuses it).
        match term_nanos(whole, frac, unit).and_then(|t| total.checked_add(t)) {
            Some(t) => total = t,
            None => overflowed = true,
        }
    }
    if overflowed {
        return Err(overflow());
    }
    let secs = u64::try_from(total / NANOS_PER_S).map_err(|_| overflow())?;
    Ok(Duration::new(secs, (total % NANOS_PER_S) as u32))
}

/// Nanoseconds of one term (`whole.frac` of `unit`), `None` beyond `u128`.
fn term_nanos(whole: &str, frac: &str, unit: u128) -> Option<u128> {
    let whole: u128 = whole.parse().ok()?;
    let mut term = whole.checked_mul(unit)?;
    // Fraction: digits beyond 1ns precision of the hour unit (13 digits) add nothing.
    let frac = &frac[..frac.len().min(20)];
    if !frac.is_empty() {
        let digits: u128 = frac.parse().ok()?;
        let scale = 10u128.pow(frac.len() as u32);
        term = term.checked_add(digits * unit / scale)?;
    }
    Some(term)
}

/// Formats a duration in the manifest grammar, e.g. `1h30m`, `45s`, `1s500ms`
/// (`0s` for zero). Precision below a millisecond is dropped.
pub fn format_duration(d: Duration) -> String {
    let mut ms = d.as_millis();
    if ms == 0 {
        return "0s".to_string();
    }
    let mut out = String::new();
    for (unit, name) in [(3_600_000u128, "h"), (60_000, "m"), (1_000, "s"), (1, "ms")] {
        if ms >= unit {
            out.push_str(&format!("{}{name}", ms / unit));
            ms %= unit;
        }
    }
    out
}

/// A duration string as written in the manifest (`"10m"`). It is kept as text so
/// that what a person wrote round-trips unchanged; [`DurationString::to_std`]
/// parses it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct DurationString(String);

impl DurationString {
    /// Wraps a string without validating it; see [`DurationString::to_std`].
    pub fn new(s: impl Into<String>) -> Self {
        Self(s.into())
    }

    /// The text as written.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Parses the text.
    pub fn to_std(&self) -> Result<Duration, DurationError> {
        parse_duration(&self.0)
    }

    /// The duration written in the manifest grammar (see [`format_duration`]).
    pub fn from_std(d: Duration) -> Self {
        Self(format_duration(d))
    }
}

impl fmt::Display for DurationString {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<&str> for DurationString {
    fn from(s: &str) -> Self {
        Self(s.to_string())
    }
}

impl From<String> for DurationString {
    fn from(s: String) -> Self {
        Self(s)
    }
}

impl From<Duration> for DurationString {
    fn from(d: Duration) -> Self {
        Self::from_std(d)
    }
}

impl FromStr for DurationString {
    type Err = DurationError;

    /// Validating constructor.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        parse_duration(s)?;
        Ok(Self(s.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn parses_simple_units() {
        assert_eq!(parse_duration("0s"), Ok(Duration::ZERO));
        assert_eq!(parse_duration("250ms"), Ok(ms(250)));
        assert_eq!(parse_duration("30s"), Ok(ms(30_000)));
        assert_eq!(parse_duration("10m"), Ok(ms(600_000)));
        assert_eq!(parse_duration("2h"), Ok(ms(7_200_000)));
    }

    #[test]
    fn parses_compound_and_fractions() {
        assert_eq!(parse_duration("1h30m"), Ok(ms(5_400_000)));
        assert_eq!(parse_duration("1m30s500ms"), Ok(ms(90_500)));
        assert_eq!(parse_duration("1.5h"), Ok(ms(5_400_000)));
        assert_eq!(parse_duration("0.5s"), Ok(ms(500)));
        assert_eq!(parse_duration("1.25m"), Ok(ms(75_000)));
        assert_eq!(parse_duration("1.000000001s"), Ok(Duration::new(1, 1)));
        // Units may repeat, as in Go's time.ParseDuration.
        assert_eq!(parse_duration("1s1s"), Ok(ms(2_000)));
        // Leading zeros are fine.
        assert_eq!(parse_duration("007s"), Ok(ms(7_000)));
        // Very long fractions are truncated, not an error.
        assert_eq!(
            parse_duration("1.0000000000000000000000000001s"),
            Ok(ms(1_000))
        );
    }

    #[test]
    fn rejects_malformed() {
        assert_eq!(parse_duration(""), Err(DurationError::Empty));
        for bad in [
            "-5s", "+5s", "5", "s", "5 s", " 5s", "5s ", "5sec", "5d", "1.s", ".5s", "5S", "abc",
            "5us", "1h-30m", "ms", "1,5s", "5ns",
        ] {
            assert!(
                matches!(parse_duration(bad), Err(DurationError::Malformed { .. })),
                "{bad:?} should be malformed, got {:?}",
                parse_duration(bad)
            );
        }
        let err = parse_duration("-5s").unwrap_err().to_string();
        assert!(err.contains("sign"), "{err}");
    }

    #[test]
    fn rejects_overflow() {
        assert!(matches!(
            parse_duration("99999999999999999999999999999999999999999h"),
            Err(DurationError::Overflow(_))
        ));
        assert!(matches!(
            parse_duration("9999999999999999999h"),
            Err(DurationError::Overflow(_))
        ));
    }

    /// Found by fuzzing (crates/api/tests/fuzz.rs): a term too large
    /// followed by text outside the grammar is Malformed, as the schema
    /// refuses it, not Overflow.
    #[test]
    fn malformed_after_an_overflowing_term() {
        for bad in [
            "340300000000000000000000000000s0",
            "99999999999999999999999999999999999999999hx",
        ] {
            assert!(
                matches!(parse_duration(bad), Err(DurationError::Malformed { .. })),
                "{bad:?}: {:?}",
                parse_duration(bad)
            );
        }
    }

    #[test]
    fn formats_round_trip() {
        for (d, s) in [
            (Duration::ZERO, "0s"),
            (ms(500), "500ms"),
            (ms(1_500), "1s500ms"),
            (ms(600_000), "10m"),
            (ms(5_400_000), "1h30m"),
            (ms(3_600_000 + 1_000), "1h1s"),
        ] {
            assert_eq!(format_duration(d), s);
            assert_eq!(parse_duration(s), Ok(d));
        }
    }

    #[test]
    fn newtype_serde_is_transparent() {
        let d: DurationString = serde_json::from_str("\"1h30m\"").unwrap();
        assert_eq!(d.as_str(), "1h30m");
        assert_eq!(d.to_std(), Ok(ms(5_400_000)));
        assert_eq!(serde_json::to_string(&d).unwrap(), "\"1h30m\"");
        assert!("5 m".parse::<DurationString>().is_err());
        assert_eq!(
            "5m".parse::<DurationString>().unwrap(),
            DurationString::from("5m")
        );
        assert_eq!(DurationString::from(ms(90_000)).as_str(), "1m30s");
    }
}
