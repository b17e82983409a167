//! Helpers for the int-or-string fields of the spec: node counts and
//! percentages (`stages[].nodes`, `maxUnavailable`) and the allocatable gate's
//! bounds (`min`, `max`).

use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::consts::{BASELINE, CAPACITY_LABEL_PREFIX};

/// Why an int-or-string count could not be resolved.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CountError {
    #[error("count {0} must be at least 1")]
    NotPositive(i32),
    #[error("{0:?} is neither a count nor a percentage between 1% and 100%")]
    NotAPercentage(String),
}

/// Parses a percentage written as `"N%"`, N an integer from 1 to 100 without
/// sign, spaces or leading zeros (the same set the CRD schema accepts).
pub fn parse_percent(s: &str) -> Option<u32> {
    let digits = s.strip_suffix('%')?;
    if digits.is_empty()
        || digits.len() > 3
        || digits.starts_with('0')
        || !digits.bytes().all(|b| b.is_ascii_digit())
    {
        return None;
    }
    let n: u32 = digits.parse().ok()?;
    (1..=100).contains(&n).then_some(n)
}

/// Resolves a count-or-percentage against `total` (the number of nodes, or
/// pods, it applies to).
///
/// - An integer must be at least 1 and is capped at `total`.
/// - A percentage is `total * p / 100`, rounded up when `round_up` (stage
///   sizes: "10%" of 5 nodes is 1 node) and down otherwise (`maxUnavailable`,
///   like the DaemonSet controller), but never below 1 when `total > 0`, so a
///   rollout always makes progress.
///
/// The result is 0 only when `total` is 0.
pub fn resolve_count(
    value: &IntOrString,
    total: usize,
    round_up: bool,
) -> Result<usize, CountError> {
    let wanted = match value {
        IntOrString::Int(n) => {
            if *n < 1 {
                return Err(CountError::NotPositive(*n));
            }
            *n as usize
        }
        IntOrString::String(s) => {
            let p = parse_percent(s).ok_or_else(|| CountError::NotAPercentage(s.clone()))? as usize;
            let scaled = total * p;
            let n = if round_up {
                scaled.div_ceil(100)
            } else {
                scaled / 100
            };
            n.max(1)
        }
    };
    Ok(wanted.min(total))
}

/// A bound of the allocatable gate, as written in `min` or `max`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Bound {
    /// The node's value captured before the stage touched it.
    Baseline,
    /// The integer value of this node label (e.g. `nvidia.com/gpu.count`).
    CapacityLabel(String),
    /// A fixed number.
    Value(i64),
}

/// Why an allocatable bound is invalid.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BoundError {
    #[error("bound {0} must not be negative")]
    Negative(i32),
    #[error(
        "invalid bound {0:?}: expected \"baseline\", \"capacityLabel:<label-key>\" (max only) or an integer >= 0"
    )]
    Invalid(String),
}

/// Parses a `min`/`max` value. `allow_label` admits `capacityLabel:<key>` (only
/// `max` takes it).
pub fn parse_bound(value: &IntOrString, allow_label: bool) -> Result<Bound, BoundError> {
    match value {
        IntOrString::Int(n) if *n < 0 => Err(BoundError::Negative(*n)),
        IntOrString::Int(n) => Ok(Bound::Value(i64::from(*n))),
        IntOrString::String(s) if s == BASELINE => Ok(Bound::Baseline),
        IntOrString::String(s) => match s.strip_prefix(CAPACITY_LABEL_PREFIX) {
            Some(key) if allow_label && !key.is_empty() && !key.contains(char::is_whitespace) => {
                Ok(Bound::CapacityLabel(key.to_string()))
            }
            _ => Err(BoundError::Invalid(s.clone())),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &str) -> IntOrString {
        IntOrString::String(v.to_string())
    }

    #[test]
    fn percent_parsing() {
        assert_eq!(parse_percent("1%"), Some(1));
        assert_eq!(parse_percent("10%"), Some(10));
        assert_eq!(parse_percent("100%"), Some(100));
        for bad in [
            "0%", "101%", "10", "10 %", " 10%", "abc", "%", "-5%", "+5%", "05%", "1.5%", "1000%",
            "10%%",
        ] {
            assert_eq!(parse_percent(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn counts_are_capped_at_total() {
        assert_eq!(resolve_count(&IntOrString::Int(1), 10, true), Ok(1));
        assert_eq!(resolve_count(&IntOrString::Int(15), 10, true), Ok(10));
        assert_eq!(resolve_count(&IntOrString::Int(3), 0, true), Ok(0));
        assert_eq!(
            resolve_count(&IntOrString::Int(0), 10, true),
            Err(CountError::NotPositive(0))
        );
        assert_eq!(
            resolve_count(&IntOrString::Int(-2), 10, false),
            Err(CountError::NotPositive(-2))
        );
    }

    #[test]
    fn stage_percentages_round_up() {
        assert_eq!(resolve_count(&s("10%"), 5, true), Ok(1));
        assert_eq!(resolve_count(&s("10%"), 10, true), Ok(1));
        assert_eq!(resolve_count(&s("10%"), 11, true), Ok(2));
        assert_eq!(resolve_count(&s("50%"), 3, true), Ok(2));
        assert_eq!(resolve_count(&s("100%"), 7, true), Ok(7));
        assert_eq!(resolve_count(&s("1%"), 1000, true), Ok(10));
        assert_eq!(resolve_count(&s("50%"), 0, true), Ok(0));
    }

    #[test]
    fn max_unavailable_rounds_down_but_at_least_one() {
        assert_eq!(resolve_count(&s("10%"), 5, false), Ok(1));
        assert_eq!(resolve_count(&s("10%"), 19, false), Ok(1));
        assert_eq!(resolve_count(&s("10%"), 20, false), Ok(2));
        assert_eq!(resolve_count(&s("50%"), 3, false), Ok(1));
        assert_eq!(resolve_count(&s("100%"), 3, false), Ok(3));
        assert_eq!(resolve_count(&s("25%"), 0, false), Ok(0));
    }

    #[test]
    fn bad_percentages_are_errors() {
        for bad in ["0%", "150%", "abc", "10 %", ""] {
            assert_eq!(
                resolve_count(&s(bad), 10, true),
                Err(CountError::NotAPercentage(bad.to_string())),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn bounds() {
        assert_eq!(parse_bound(&s("baseline"), false), Ok(Bound::Baseline));
        assert_eq!(
            parse_bound(&IntOrString::Int(0), false),
            Ok(Bound::Value(0))
        );
        assert_eq!(parse_bound(&IntOrString::Int(8), true), Ok(Bound::Value(8)));
        assert_eq!(
            parse_bound(&IntOrString::Int(-1), true),
            Err(BoundError::Negative(-1))
        );
        assert_eq!(
            parse_bound(&s("capacityLabel:nvidia.com/gpu.count"), true),
            Ok(Bound::CapacityLabel("nvidia.com/gpu.count".into()))
        );
        assert!(parse_bound(&s("capacityLabel:nvidia.com/gpu.count"), false).is_err());
        assert!(parse_bound(&s("capacityLabel:"), true).is_err());
        assert!(parse_bound(&s("Baseline"), true).is_err());
        assert!(parse_bound(&s("8"), true).is_err());
    }
}
