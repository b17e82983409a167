//! Phase and conditions, kept in step in one place, with the kstatus meaning
//! of each state:
//! - working (taking over, rolling out, reverting): Reconciling=True;
//! - paused (spec.paused, a stage awaiting approval): Reconciling=True too,
//!   since the rollout is not done;
//! - stalled (a reverted revision, a failed preflight, a conflict, a stuck
//!   node): Stalled=True, so GitOps tools report it instead of waiting;
//! - succeeded: Ready=True, neither Reconciling nor Stalled.

use jiff::Timestamp;
use saferollout_api::{Phase, SafeRolloutStatus};

use super::{Action, Observed};
use crate::conditions::{self, DEGRADED, PROGRESSING, READY, RECONCILING, STALLED};

pub(crate) fn event(
    actions: &mut Vec<Action>,
    warning: bool,
    reason: &str,
    message: impl Into<String>,
) {
    actions.push(Action::Event {
        warning,
        reason: reason.into(),
        message: message.into(),
    });
}

#[allow(clippy::too_many_arguments)]
fn set_all(
    st: &mut SafeRolloutStatus,
    phase: Phase,
    (ready, ready_reason): (bool, &str),
    (progressing, progressing_reason): (bool, &str),
    reconciling: bool,
    stalled: bool,
    message: String,
    generation: Option<i64>,
    now: Timestamp,
) {
    st.phase = Some(phase);
    st.message = Some(message.clone());
    let cs = &mut st.conditions;
    conditions::set(
        cs,
        READY,
        ready,
        ready_reason,
        message.clone(),
        generation,
        now,
    );
    conditions::set(
        cs,
        PROGRESSING,
        progressing,
        progressing_reason,
        message.clone(),
        generation,
        now,
    );
    let reason = if ready { "Succeeded" } else { ready_reason };
    let (rec_msg, stall_msg) = match (reconciling, stalled) {
        (true, _) => (message.clone(), String::new()),
        (_, true) => (String::new(), message),
        _ => (String::new(), String::new()),
    };
    conditions::set(
        cs,
        RECONCILING,
        reconciling,
        reason,
        rec_msg,
        generation,
        now,
    );
    conditions::set(cs, STALLED, stalled, reason, stall_msg, generation, now);
}

/// The operator is working towards the desired state.
pub(crate) fn working(
    st: &mut SafeRolloutStatus,
    o: &Observed,
    phase: Phase,
    reason: &str,
    message: String,
) {
    set_all(
        st,
        phase,
        (false, reason),
        (true, reason),
        true,
        false,
        message,
        o.generation,
        o.now,
    );
}

/// Waiting for a person (spec.paused, an approval): not done, not stuck.
pub(crate) fn paused(st: &mut SafeRolloutStatus, o: &Observed, reason: &str, message: String) {
    set_all(
        st,
        Phase::Paused,
        (false, reason),
        (true, reason),
        true,
        false,
        message,
        o.generation,
        o.now,
    );
}

/// Nothing proceeds without a person or a new spec.
pub(crate) fn stalled(
    st: &mut SafeRolloutStatus,
    o: &Observed,
    phase: Phase,
    reason: &str,
    message: String,
) {
    set_stalled(st, phase, reason, message, o.generation, o.now);
}

/// Nothing proceeds: `phase`, Ready and Progressing False with `reason`, Stalled True.
pub fn set_stalled(
    st: &mut SafeRolloutStatus,
    phase: Phase,
    reason: &str,
    message: String,
    generation: Option<i64>,
    now: Timestamp,
) {
    set_all(
        st,
        phase,
        (false, reason),
        (false, reason),
        false,
        true,
        message,
        generation,
        now,
    );
}

/// A cache of the operator's that has heard nothing from the API server,
/// not even a bookmark, for longer than the operator's bound.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StaleCache {
    /// What it holds, e.g. `pods in namespace gpu (labels ...)`.
    pub store: String,
    /// When it last heard anything.
    pub since: Timestamp,
}

/// The condition reason of a pass held by stale caches.
pub const CACHE_STALE: &str = "CacheStale";

/// A pass that reads a stale cache decides nothing (a fault in the cluster
/// pauses a rollout, never fails it): the status says which caches and
/// since when, and that it resumes on its own, so Reconciling, not
/// Stalled; the phase and everything else stay as they are. The message
/// names fixed instants only, so passes held for minutes write it once.
/// Also returns whether the hold is new (for a Warning Event).
pub fn hold_for_stale_caches(
    st: &SafeRolloutStatus,
    stale: &[StaleCache],
    stale_after: std::time::Duration,
    generation: Option<i64>,
    now: Timestamp,
) -> (SafeRolloutStatus, bool) {
    let mut held = st.clone();
    let names: Vec<String> = stale
        .iter()
        .map(|c| format!("{} (silent since {})", c.store, c.since))
        .collect();
    let message = format!(
        "holding: the operator's cache of {} has heard nothing from the API server, not even a bookmark, for more than {} s; nothing is deleted, judged or quarantined until it does (its watch is started again meanwhile), then the rollout resumes",
        names.join(", "),
        stale_after.as_secs()
    );
    let was_held =
        crate::conditions::get(&st.conditions, READY).is_some_and(|c| c.reason == CACHE_STALE);
    set_all(
        &mut held,
        st.phase.unwrap_or(Phase::Pending),
        (false, CACHE_STALE),
        (false, CACHE_STALE),
        true,
        false,
        message,
        generation,
        now,
    );
    (held, !was_held)
}

/// A short wait inside work under way (the DaemonSet controller catching up,
/// the backup being recorded): a rollout, revert or finished state keeps its
/// phase and conditions untouched, so status does not flicker; only a first
/// adoption reports it.
pub(crate) fn keep_working(st: &mut SafeRolloutStatus, o: &Observed, reason: &str, message: &str) {
    if matches!(st.phase, None | Some(Phase::Pending)) {
        working(st, o, Phase::Pending, reason, message.to_string());
    }
}

/// Every node runs the desired revision, every gate passed.
pub(crate) fn succeeded(st: &mut SafeRolloutStatus, o: &Observed, message: String) {
    set_all(
        st,
        Phase::Succeeded,
        (true, "Succeeded"),
        (false, "Idle"),
        false,
        false,
        message,
        o.generation,
        o.now,
    );
    conditions::set(
        &mut st.conditions,
        DEGRADED,
        false,
        "Healthy",
        "",
        o.generation,
        o.now,
    );
}

/// `allocatable/nvidia.com/gpu` -> `Allocatable`, `podsReady` -> `PodsReady`:
/// condition reasons are CamelCase words.
pub(crate) fn gate_reason(gate: &str) -> String {
    let base = gate.split('/').next().unwrap_or(gate);
    let mut chars = base.chars();
    chars
        .next()
        .map(|c| c.to_ascii_uppercase().to_string() + chars.as_str())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn t(s: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + s).unwrap()
    }

    #[test]
    fn a_hold_keeps_the_phase_names_the_caches_and_writes_the_same_status_twice() {
        let mut st = SafeRolloutStatus {
            phase: Some(Phase::Progressing),
            current_stage: Some(1),
            ..Default::default()
        };
        set_all(
            &mut st,
            Phase::Progressing,
            (false, "RollingOut"),
            (true, "RollingOut"),
            true,
            false,
            "stage 2 of 3".into(),
            Some(3),
            t(0),
        );
        let stale = [StaleCache {
            store: "pods in namespace gpu".into(),
            since: t(5),
        }];
        let (held, new) =
            hold_for_stale_caches(&st, &stale, Duration::from_secs(90), Some(3), t(100));
        assert!(new);
        assert_eq!(held.phase, Some(Phase::Progressing));
        assert_eq!(held.current_stage, Some(1));
        let ready = conditions::get(&held.conditions, READY).unwrap();
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("False", CACHE_STALE)
        );
        assert!(
            ready
                .message
                .contains("pods in namespace gpu (silent since 2027-01-15T08:00:05Z)"),
            "{}",
            ready.message
        );
        assert!(conditions::is_true(&held.conditions, RECONCILING));
        assert!(!conditions::is_true(&held.conditions, STALLED));
        assert!(!conditions::is_true(&held.conditions, PROGRESSING));
        // Held again later: the same bytes, and no second Event.
        let (again, new) =
            hold_for_stale_caches(&held, &stale, Duration::from_secs(90), Some(3), t(160));
        assert!(!new);
        assert_eq!(again, held);
    }
}
