//! The DaemonSet's template is the stable one: bring every node it covers to
//! the stable revision (after a revert, an abandoned rollout, an adoption or
//! a success), then rest.
//!
//! - Pods not on the stable revision are replaced within the disruption
//!   budget ([`super::replace`]); the nodes whose agent failed a gate go first
//!   and outside it.
//! - A node the DaemonSet controller would not refill (NotReady, an
//!   untolerated taint, no longer selected) is never emptied: it is named in
//!   `stuckNodes` and in the conditions, and waited for.
//! - Convergence covers every node the DaemonSet should run on, including
//!   nodes that have no pod at all; a node the rollout never touched is not
//!   required to be Ready (its agent's health is not the rollout's doing).
//! - When nothing converges for `progressDeadline`, the nodes holding the
//!   revert up are named, with why, and the phase says Degraded; the revert
//!   goes on as soon as they move.

use std::collections::BTreeSet;
use std::time::Duration;

use saferollout_api::{NodeNote, Phase, SafeRolloutStatus};

use super::{
    Action, Observed, is_blocked, labelled_nodes, max_unavailable, phase, progress_deadline,
    record_progress, replace,
};
use crate::conditions::{self, DEGRADED};
use crate::eligibility::eligibility;
use crate::gates::list_some;
use crate::views::{DaemonSetView, live_pods};

/// At most this many stuck nodes are kept in status (all are counted).
const MAX_STUCK: usize = 20;

/// Where each covered node stands.
#[derive(Default)]
struct Survey<'a> {
    /// Covered nodes with a live pod not on the stable revision.
    to_replace: Vec<&'a str>,
    /// Covered nodes not converged yet, with why.
    pending: Vec<NodeNote>,
    /// Nodes not covered now that still run another revision: never emptied.
    blocked: Vec<NodeNote>,
    /// Nodes the rollout never took that are NotReady or going out of
    /// service, with another revision: left as they are, not waited for
    /// (brought back once they return), named in `status.skippedNodes`.
    skipped: Vec<NodeNote>,
    covered: usize,
    converged: usize,
}

/// Nodes any stage of the last rollout took (or let go), and nodes being
/// brought back to the stable revision.
fn touched(st: &SafeRolloutStatus) -> BTreeSet<&str> {
    st.stages
        .iter()
        .flat_map(|s| s.nodes.iter().chain(s.skipped.iter().map(|n| &n.node)))
        .chain(st.converging_nodes.iter())
        .map(String::as_str)
        .collect()
}

fn survey<'a>(
    o: &Observed<'a>,
    st: &SafeRolloutStatus,
    ds: &DaemonSetView,
    stable: &str,
    reverted: bool,
) -> Survey<'a> {
    let touched = touched(st);
    let quarantined = super::quarantined_nodes(st);
    let mut s = Survey::default();
    for node in o.nodes.values() {
        let live: Vec<_> = live_pods(o.pods, node.name).collect();
        let off: Vec<_> = live.iter().filter(|p| p.revision != stable).collect();
        // Out of service by no doing of the rollout, which never took it:
        // what it runs was not put there by the rollout, so it is left as
        // it is (a revert still brings back what it can reach).
        if let (Some(p), Some((reason, why))) = (off.first(), crate::eligibility::left_out(node))
            && !touched.contains(node.name)
            && !reverted
            && crate::eligibility::is_selected(node, &ds.placement)
        {
            s.skipped.push(NodeNote {
                node: node.name.to_string(),
                reason: reason.to_string(),
                message: format!(
                    "{why}; runs revision {}, brought to revision {stable} once it is back",
                    p.revision
                ),
            });
            continue;
        }
        let elig = eligibility(node, &ds.placement);
        if !elig.is_eligible() {
            // A quarantined node is out of service on purpose: left alone.
            if quarantined.contains(node.name) {
                continue;
            }
            if let Some(p) = off.first() {
                s.blocked.push(NodeNote {
                    node: node.name.to_string(),
                    reason: elig.reason().to_string(),
                    message: format!(
                        "runs revision {}; not replaced because {elig} (its agent would not come back)",
                        p.revision
                    ),
                });
            }
            continue;
        }
        s.covered += 1;
        let ours = touched.contains(node.name) || !off.is_empty();
        let available = replace::is_available(o.pods, node.name);
        let why = if live.is_empty() {
            Some(("NoAgentPod", "no agent pod on the node".to_string()))
        } else if let Some(p) = off.first() {
            Some((
                "OtherRevision",
                format!("still runs revision {}", p.revision),
            ))
        } else if live.len() > 1 {
            Some(("ExtraPods", format!("{} live agent pods", live.len())))
        } else if ours && !available {
            let p = live[0];
            Some((
                "AgentNotReady",
                format!(
                    "agent pod {} is not Ready{}",
                    p.name,
                    p.waiting_reason
                        .map(|r| format!(" ({r})"))
                        .unwrap_or_default()
                ),
            ))
        } else {
            None
        };
        match why {
            None => s.converged += 1,
            Some((reason, message)) => s.pending.push(NodeNote {
                node: node.name.to_string(),
                reason: reason.to_string(),
                message,
            }),
        }
        if !off.is_empty() {
            s.to_replace.push(node.name);
        }
    }
    s
}

pub(super) fn settle(
    o: &Observed,
    st: &mut SafeRolloutStatus,
    actions: &mut Vec<Action>,
    ds: &DaemonSetView,
    stable: &str,
) -> Option<Duration> {
    let reverted = st
        .target_revision
        .as_deref()
        .is_some_and(|t| t != stable && is_blocked(st, t));
    // Nodes whose agent failed a gate are reverted at once (outside the
    // budget), when the revert is the operator's own (onFailure: Revert).
    let stopped = st
        .stopped
        .as_ref()
        .is_some_and(|s| st.target_revision.as_deref() == Some(s.revision.as_str()));
    let exempt: BTreeSet<String> = if reverted && !stopped {
        st.stages
            .iter()
            .flat_map(|s| s.failed_nodes.iter().cloned())
            .collect()
    } else {
        BTreeSet::new()
    };
    let s = survey(o, st, ds, stable, reverted);
    st.skipped_nodes = s.skipped.iter().take(MAX_STUCK).cloned().collect();
    let unavailable = replace::unavailable(o, ds, stable, &touched(st), &exempt, &BTreeSet::new());
    let pods = replace::deletions(
        o.pods,
        &s.to_replace,
        stable,
        unavailable,
        &exempt,
        max_unavailable(o, ds),
    );
    if !pods.is_empty() {
        // Recorded before the deletes run (status is written first).
        st.converging_nodes
            .extend(pods.iter().map(|p| p.node.clone()));
        st.converging_nodes.sort();
        st.converging_nodes.dedup();
        actions.push(Action::DeletePods { pods });
    }
    let mut stuck = s.blocked.clone();

    if !s.pending.is_empty() {
        let subject = if reverted {
            format!("revert to revision {stable}")
        } else {
            format!("return to revision {stable}")
        };
        let without_progress = record_progress(st, subject.clone(), s.converged, o);
        let deadline = progress_deadline(o);
        if without_progress >= deadline {
            stuck.extend(s.pending.iter().cloned());
            set_stuck(st, stuck);
            let names: Vec<String> = st
                .stuck_nodes
                .iter()
                .map(|n| format!("{} ({})", n.node, n.message))
                .collect();
            let msg = format!(
                "{subject}: no progress for {deadline:?}; {} of {} node(s) converged; stuck: {}",
                s.converged,
                s.covered,
                list_some(&names)
            );
            if !is_stalled_by(st, "ConvergenceStuck") {
                phase::event(actions, true, "ConvergenceStuck", msg.clone());
            }
            degrade(st, o, "ConvergenceStuck", msg);
            return None; // pod and node events wake us
        }
        set_stuck(st, stuck);
        let msg = if reverted {
            format!(
                "reverting to revision {stable}: {} of {} node(s) done",
                s.converged, s.covered
            )
        } else {
            format!(
                "bringing every node back to revision {stable}: {} of {} node(s) done",
                s.converged, s.covered
            )
        };
        let phase = if reverted {
            Phase::RollingBack
        } else {
            Phase::Progressing
        };
        phase::working(st, o, phase, "RollingBack", msg);
        return Some(
            deadline
                .saturating_sub(without_progress)
                .max(Duration::from_millis(100)),
        );
    }

    // Every covered node runs the stable revision.
    st.progress = None;
    let labelled: Vec<String> = labelled_nodes(o).keys().map(|n| n.to_string()).collect();
    if !labelled.is_empty() {
        actions.push(Action::UnlabelNodes { nodes: labelled });
    }
    set_stuck(st, stuck);
    if !st.stuck_nodes.is_empty() {
        let names: Vec<String> = st
            .stuck_nodes
            .iter()
            .map(|n| format!("{} ({})", n.node, n.message))
            .collect();
        let msg = format!(
            "every node the DaemonSet covers runs revision {stable}, except node(s) it cannot reach now: {}",
            list_some(&names)
        );
        if !is_stalled_by(st, "NodesStuck") {
            phase::event(actions, true, "NodesStuck", msg.clone());
        }
        degrade(st, o, "NodesStuck", msg);
        return None;
    }
    if reverted {
        let target = st.target_revision.clone().unwrap_or_default();
        let reason = st
            .blocked_revisions
            .iter()
            .find(|b| b.revision == target)
            .map(|b| b.message.clone())
            .unwrap_or_default();
        if st.phase != Some(Phase::Degraded) {
            phase::event(
                actions,
                true,
                "RolledBack",
                format!("every node is back on revision {stable}"),
            );
        }
        let msg =
            format!("revision {target} was reverted; every node runs revision {stable}: {reason}");
        // Degraded stays True (set when the gate failed) until a new revision or a retry.
        phase::stalled(st, o, Phase::Degraded, "RolledBack", msg);
        return None;
    }
    if !s.skipped.is_empty() {
        let names: Vec<String> = s.skipped.iter().map(|n| n.node.clone()).collect();
        let msg = format!(
            "every node runs revision {stable} but {} skipped while NotReady or going out of service ({}; see status.skippedNodes), brought to it once back",
            s.skipped.len(),
            list_some(&names)
        );
        phase::succeeded(st, o, msg);
        return None;
    }
    phase::succeeded(st, o, format!("every node runs revision {stable}"));
    None
}

fn set_stuck(st: &mut SafeRolloutStatus, mut nodes: Vec<NodeNote>) {
    nodes.sort_by(|a, b| a.node.cmp(&b.node));
    nodes.dedup_by(|a, b| a.node == b.node);
    nodes.truncate(MAX_STUCK);
    st.stuck_nodes = nodes;
}

fn is_stalled_by(st: &SafeRolloutStatus, reason: &str) -> bool {
    conditions::get(&st.conditions, conditions::STALLED)
        .is_some_and(|c| c.status == "True" && c.reason == reason)
}

/// Stalled on nodes: phase Degraded, Stalled=True with `reason`, and
/// Degraded=True (a gate failure that caused a revert keeps its own reason).
fn degrade(st: &mut SafeRolloutStatus, o: &Observed, reason: &str, msg: String) {
    phase::stalled(st, o, Phase::Degraded, reason, msg.clone());
    if !conditions::is_true(&st.conditions, DEGRADED) {
        conditions::set(
            &mut st.conditions,
            DEGRADED,
            true,
            reason,
            msg,
            o.generation,
            o.now,
        );
    }
}
