//! The soak bookkeeping the device gates share with allocatable: an
//! observation keeps its start time (the previous result's `since`) while it
//! stays the same (same reason, same node), and decides once it has held for
//! the soak, or at the progress deadline.

use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use saferollout_api::{GateResult, GateStatus};

use super::{Verdict, elapsed};

/// Since when the observation `(reason, node)` holds: the previous result's
/// `since` when it said the same, else now rounded up to the next whole
/// second. (Status keeps whole seconds: a `since` of 12:00:00.7 written as
/// 12:00:00 would cut the soak short by 0.7 s; rounded up, a soak lasts at
/// least as long as it says, and at most a second longer.)
pub fn since(
    previous: Option<&GateResult>,
    reason: &str,
    node: Option<&str>,
    now: Timestamp,
) -> Timestamp {
    previous
        .filter(|p| p.reason == reason && p.node.as_deref() == node)
        .and_then(|p| p.since.as_ref().map(|t| t.0))
        .unwrap_or_else(|| whole_second_up(now))
}

/// `t` rounded up to the next whole second (unchanged when whole): the
/// status keeps times in whole seconds, so a soak or a wait that starts at a
/// time the status records must start at one it can keep.
pub fn whole_second_up(t: Timestamp) -> Timestamp {
    if t.subsec_nanosecond() == 0 {
        return t;
    }
    Timestamp::from_second(t.as_second() + 1).unwrap_or(t)
}

/// How long is left of `soak` for an observation held since `since`, or
/// `None` once it has held long enough. A `since` still ahead (rounded up to
/// its whole second) counts in full: the soak ends at `since + soak`.
pub fn remaining(since: Timestamp, now: Timestamp, soak: Duration) -> Option<Duration> {
    let ahead = elapsed(now, since);
    let held = elapsed(since, now);
    (held < soak).then(|| soak - held + ahead)
}

/// What an observation held since `since` comes to at `now`: `held` (Passed
/// for a good observation, Failed for a violation) once it has held for
/// `soak`; else Failed once the progress deadline passed; else Pending,
/// with how long until the soak ends (when to look again).
pub fn outcome(
    since: Timestamp,
    now: Timestamp,
    soak: Duration,
    deadline_passed: bool,
    held: GateStatus,
) -> (GateStatus, Option<Duration>) {
    let left = remaining(since, now, soak);
    let status = match left {
        None => held,
        Some(_) if deadline_passed => GateStatus::Failed,
        Some(_) => GateStatus::Pending,
    };
    (status, left.filter(|_| status == GateStatus::Pending))
}

/// `result` as a verdict, its observation recorded as held since `since`,
/// looked at again after `recheck_after` (from [`outcome`]).
pub fn verdict(
    mut result: GateResult,
    since: Timestamp,
    recheck_after: Option<Duration>,
) -> Verdict {
    result.since = Some(Time(since));
    Verdict {
        recheck_after,
        ..Verdict::new(result)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_observation_starts_at_the_next_whole_second() {
        let now =
            Timestamp::from_second(1_800_000_000).unwrap() + jiff::SignedDuration::from_millis(300);
        let s = since(None, "X", None, now);
        assert_eq!(s, Timestamp::from_second(1_800_000_001).unwrap());
        // Not held yet: the soak runs for its length from that second.
        assert_eq!(
            remaining(s, now, Duration::from_secs(2)),
            Some(Duration::from_millis(2_700))
        );
        let at = |ms| now + jiff::SignedDuration::from_millis(ms);
        assert_eq!(
            remaining(s, at(2_600), Duration::from_secs(2)),
            Some(Duration::from_millis(100))
        );
        assert_eq!(remaining(s, at(2_700), Duration::from_secs(2)), None);
        let whole = Timestamp::from_second(1_800_000_005).unwrap();
        assert_eq!(since(None, "X", None, whole), whole);
    }
}
