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
