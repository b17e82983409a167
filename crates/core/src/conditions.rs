//! kstatus-compatible conditions (`Ready`, `Progressing`, `Degraded`,
//! `Reconciling`, `Stalled`, ...).
//!
//! `lastTransitionTime` moves only when a condition's status changes, and the
//! list is kept sorted by type, so writing the same state twice writes the same
//! bytes and the controller never wakes itself up.

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

pub use saferollout_api::{
    CONDITION_DEGRADED as DEGRADED, CONDITION_PREFLIGHT_PASSED as PREFLIGHT_PASSED,
    CONDITION_PROGRESSING as PROGRESSING, CONDITION_READY as READY,
    CONDITION_RECONCILING as RECONCILING, CONDITION_STALLED as STALLED,
    CONDITION_WAITING as WAITING,
};

/// Sets one condition, keeping its transition time when the status is unchanged.
pub fn set(
    conditions: &mut Vec<Condition>,
    type_: &str,
    status: bool,
    reason: &str,
    message: impl Into<String>,
    generation: Option<i64>,
    now: Timestamp,
) {
    let status = if status { "True" } else { "False" };
    let message = message.into();
    match conditions.iter_mut().find(|c| c.type_ == type_) {
        Some(c) => {
            if c.status != status {
                c.last_transition_time = Time(now);
            }
            c.status = status.into();
            c.reason = reason.into();
            c.message = message;
            c.observed_generation = generation;
        }
        None => {
            conditions.push(Condition {
                type_: type_.into(),
                status: status.into(),
                reason: reason.into(),
                message,
                observed_generation: generation,
                last_transition_time: Time(now),
            });
            conditions.sort_by(|a, b| a.type_.cmp(&b.type_));
        }
    }
}

pub fn get<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

pub fn is_true(conditions: &[Condition], type_: &str) -> bool {
    get(conditions, type_).is_some_and(|c| c.status == "True")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + s).unwrap()
    }

    #[test]
    fn transition_time_moves_only_on_status_change() {
        let mut cs = Vec::new();
        set(
            &mut cs,
            READY,
            false,
            "Progressing",
            "stage 1",
            Some(1),
            t(0),
        );
        set(
            &mut cs,
            READY,
            false,
            "Progressing",
            "stage 2",
            Some(2),
            t(10),
        );
        assert_eq!(cs[0].last_transition_time, Time(t(0)));
        assert_eq!(cs[0].message, "stage 2");
        assert_eq!(cs[0].observed_generation, Some(2));
        set(&mut cs, READY, true, "Succeeded", "done", Some(2), t(20));
        assert_eq!(cs[0].last_transition_time, Time(t(20)));
        assert!(is_true(&cs, READY));
    }

    #[test]
    fn kept_sorted_by_type() {
        let mut cs = Vec::new();
        set(&mut cs, READY, true, "R", "", None, t(0));
        set(&mut cs, DEGRADED, false, "D", "", None, t(0));
        set(&mut cs, PROGRESSING, false, "P", "", None, t(0));
        let types: Vec<_> = cs.iter().map(|c| c.type_.as_str()).collect();
        assert_eq!(types, ["Degraded", "Progressing", "Ready"]);
    }
}
