//! The soak bookkeeping the device gates share with allocatable: an
//! observation keeps its start time (the previous result's `since`) while it
//! stays the same (same reason, same node), and decides once it has held for
//! the soak, or at the progress deadline.

use std::time::Duration;

use jiff::Timestamp;
use saferollout_api::GateResult;

use super::elapsed;

/// Since when the observation `(reason, node)` holds: the previous result's
/// `since` when it said the same, else now.
pub fn since(
    previous: Option<&GateResult>,
    reason: &str,
    node: Option<&str>,
    now: Timestamp,
) -> Timestamp {
    previous
        .filter(|p| p.reason == reason && p.node.as_deref() == node)
        .and_then(|p| p.since.as_ref().map(|t| t.0))
        .unwrap_or(now)
}

/// How long is left of `soak` for an observation held since `since`, or
/// `None` once it has held long enough.
pub fn remaining(since: Timestamp, now: Timestamp, soak: Duration) -> Option<Duration> {
    let held = elapsed(since, now);
    (held < soak).then(|| soak - held)
}
