//! `spec.nodeMaintenance`: a node's cordon, drain and uncordon around its
//! agent's replacement.
//!
//! What a node is at is re-derived on each pass from the node itself (the
//! [`MAINTENANCE_LABEL`] the cordon writes with it) and the pods listed on
//! it, never remembered: a lost write repeats an idempotent cordon, an
//! eviction or an uncordon.
//!
//! - A stage starts on a node by cordoning it, which takes one slot of
//!   `maxUnavailable` (the node stops taking workloads) until its uncordon;
//!   a node whose agent does not serve already costs nothing more.
//! - A cordoned node is drained ([`crate::drain`]); its agent is deleted
//!   only once nothing is left to evict or wait for. While a drain waits,
//!   the stage's progress deadline does not run (a PodDisruptionBudget is
//!   not the release's doing): the rollout says what it waits on
//!   (`Draining`, `DrainBlocked`), and past `drain.timeout` reports it stuck
//!   (`DrainTimedOut`, one Warning Event) without forcing anything.
//! - A node is uncordoned once its agent serves the revision it should run
//!   (the new one while the rollout goes on, once the node reported after
//!   the new agent turned Ready, so its node-level gates judged fresh
//!   evidence, with no gate violated on it; the last good one after a
//!   revert) and no deletion of this pass touches it. A node whose agent failed a gate stays cordoned until it is
//!   reverted (or, under Halt or Quarantine, until a person acts).
//! - A revert never drains: it is never held, by a budget or anything else.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use saferollout_api::{
    MAINTENANCE_LABEL, MaintenanceStep, NodeMaintenance, NodeMaintenanceStatus, SafeRolloutStatus,
};

use super::{Action, Observed, is_blocked, replace};
use crate::drain::{self, NodeDrain};
use crate::views::live_pods;

/// Why a stage waits on a drain (the `Ready` condition's reason).
pub const DRAINING: &str = "Draining";
/// A drain waits on something only a person can lift: a budget refused an
/// eviction, a pod without a controller, emptyDir data.
pub const DRAIN_BLOCKED: &str = "DrainBlocked";
/// A drain has waited longer than `drain.timeout`.
pub const DRAIN_TIMED_OUT: &str = "DrainTimedOut";

/// A pod to evict, with its UID as the eviction's precondition.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct EvictRef {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub node: String,
}

/// `spec.nodeMaintenance`, when it cordons.
pub(super) fn configured<'a>(o: &Observed<'a>) -> Option<&'a NodeMaintenance> {
    o.spec.node_maintenance.as_ref().filter(|m| m.cordon)
}

/// Whether `node` carries this rollout's maintenance mark.
pub(super) fn is_ours(o: &Observed, node: &str) -> bool {
    o.nodes
        .get(node)
        .and_then(|n| n.label(MAINTENANCE_LABEL))
        .is_some_and(|v| v == o.rollout_id)
}

/// The nodes carrying this rollout's maintenance mark.
pub(super) fn marked<'a>(o: &Observed<'a>) -> BTreeSet<&'a str> {
    o.nodes
        .values()
        .filter(|n| n.label(MAINTENANCE_LABEL) == Some(o.rollout_id))
        .map(|n| n.name)
        .collect()
}

/// The drain of a marked node, judged from the pods listed on it.
fn judge(o: &Observed, m: &NodeMaintenance, node: &str) -> NodeDrain {
    match &m.drain {
        None => NodeDrain {
            done: true,
            ..Default::default()
        },
        Some(d) => {
            let pods = o
                .evidence
                .drain
                .and_then(|e| e.nodes.get(node))
                .map(Vec::as_slice);
            drain::judge(pods, d)
        }
    }
}

/// What a stage does on the nodes it replaces, under `nodeMaintenance`.
#[derive(Debug, Default)]
pub(super) struct Steps<'a> {
    /// Nodes to cordon now (each took a slot, or cost nothing).
    pub cordon: Vec<String>,
    /// Drained nodes whose agent may go now (their slot is paid already).
    pub drained: Vec<&'a str>,
    pub evict: Vec<EvictRef>,
}

/// The steps on `replaceable` (sorted, admitted, not violating), given
/// `unavailable` nodes down already (marked nodes among them) and
/// `max_unavailable`.
pub(super) fn steps<'a>(
    o: &Observed<'a>,
    m: &NodeMaintenance,
    replaceable: &[&'a str],
    unavailable: usize,
    max_unavailable: usize,
) -> Steps<'a> {
    let mut free = max_unavailable.saturating_sub(unavailable);
    let mut out = Steps::default();
    // Drained nodes whose agent still serves: deleting it is what takes
    // the slot their cordon reserved.
    let mut serving_drained = Vec::new();
    for &node in replaceable {
        if is_ours(o, node) {
            let judged = judge(o, m, node);
            if judged.done {
                out.drained.push(node);
                if replace::is_available(o.pods, node) {
                    serving_drained.push(node);
                }
            }
            out.evict.extend(
                judged
                    .evict
                    .into_iter()
                    .map(|(namespace, name, uid)| EvictRef {
                        namespace,
                        name,
                        uid,
                        node: node.to_string(),
                    }),
            );
            continue;
        }
        if replace::is_available(o.pods, node) {
            if free == 0 {
                continue;
            }
            free -= 1;
        }
        out.cordon.push(node.to_string());
    }
    // The budget shrank under the cordons (the DaemonSet lost nodes since):
    // more nodes are marked than it allows, so not every reserved slot is
    // still there. The agents of the last `over` drained nodes stay until
    // it is (their nodes stay cordoned).
    let over = unavailable.saturating_sub(max_unavailable);
    for node in serving_drained.iter().rev().take(over) {
        out.drained.retain(|n| n != node);
    }
    out
}

/// Why the stage waits on a drain of one of `to_replace`, if it does:
/// (reason, message). Judged before the gates: while it waits, the stage's
/// deadline does not run.
pub(super) fn waiting(
    o: &Observed,
    st: &SafeRolloutStatus,
    to_replace: &[&str],
) -> Option<(&'static str, String)> {
    let m = configured(o)?;
    let drain = m.drain.as_ref()?;
    let timeout = drain.timeout.to_std().ok();
    let mut worst: Option<(&'static str, String)> = None;
    for &node in to_replace.iter().filter(|n| is_ours(o, n)) {
        let judged = judge(o, m, node);
        if judged.done {
            continue;
        }
        let started = st
            .node_maintenance
            .iter()
            .find(|e| e.node == node)
            .and_then(|e| e.started_at.as_ref())
            .map(|t| t.0);
        let timed_out = match (started, timeout) {
            (Some(s), Some(t)) => crate::gates::elapsed(s, o.vouched_until()) > t,
            _ => false,
        };
        let reason = if timed_out {
            DRAIN_TIMED_OUT
        } else if judged.held {
            DRAIN_BLOCKED
        } else {
            DRAINING
        };
        let message = format!("draining node {node}: {}", judged.waiting_on);
        let rank = |r: &str| {
            [DRAINING, DRAIN_BLOCKED, DRAIN_TIMED_OUT]
                .iter()
                .position(|x| *x == r)
        };
        if worst.as_ref().is_none_or(|(w, _)| rank(reason) > rank(w)) {
            worst = Some((reason, message));
        }
    }
    worst
}

/// `status.nodeMaintenance` and the uncordons of this pass: every node the
/// rollout marked (or cordons now), at its step. `violating`: the nodes
/// whose agent violates a gate now.
pub(super) fn sync(
    o: &Observed,
    st: &mut SafeRolloutStatus,
    actions: &mut Vec<Action>,
    violating: &BTreeSet<String>,
) {
    let cordoning: BTreeSet<String> = actions
        .iter()
        .filter_map(|a| match a {
            Action::CordonNodes { nodes } => Some(nodes.iter().cloned()),
            _ => None,
        })
        .flatten()
        .collect();
    let deleting = super::nodes_deleted_on(actions);
    let before: BTreeMap<String, NodeMaintenanceStatus> = std::mem::take(&mut st.node_maintenance)
        .into_iter()
        .map(|e| (e.node.clone(), e))
        .collect();
    let started = |node: &str| {
        before
            .get(node)
            .and_then(|e| e.started_at.clone())
            .or(Some(Time(o.now)))
    };
    let mut entries = Vec::new();
    let mut uncordon = Vec::new();
    for node in marked(o)
        .into_iter()
        .map(str::to_string)
        .chain(cordoning.iter().cloned())
    {
        if entries
            .iter()
            .any(|e: &NodeMaintenanceStatus| e.node == node)
        {
            continue;
        }
        let (step, message) = if cordoning.contains(&node) {
            (MaintenanceStep::Draining, "cordoning".to_string())
        } else if !deleting.contains(node.as_str())
            && !violating.contains(&node)
            && done_with(o, st, &node)
        {
            uncordon.push(node.clone());
            (MaintenanceStep::Uncordoning, String::new())
        } else {
            let judged = o
                .spec
                .node_maintenance
                .as_ref()
                .map(|m| judge(o, m, &node))
                .unwrap_or_else(|| NodeDrain {
                    done: true,
                    ..Default::default()
                });
            if judged.done {
                (MaintenanceStep::Drained, String::new())
            } else {
                (MaintenanceStep::Draining, judged.waiting_on)
            }
        };
        entries.push(NodeMaintenanceStatus {
            started_at: started(&node),
            node,
            step,
            message,
        });
    }
    entries.sort_by(|a, b| a.node.cmp(&b.node));
    st.node_maintenance = entries;
    if !uncordon.is_empty() {
        actions.push(Action::UncordonNodes { nodes: uncordon });
    }
}

/// Whether the rollout is done with a node it marked: it no longer holds
/// it (a new template started over, a retry, the node let go) and no stop
/// keeps it failed, or its agent serves what it should
/// ([`serves_what_it_should`]). Only the nodes it works on stay cordoned:
/// a marked node it let go would otherwise keep a slot of the budget (and
/// of a policy's) with nothing to bring it back.
fn done_with(o: &Observed, st: &SafeRolloutStatus, node: &str) -> bool {
    let held = st.target_revision.is_some()
        && st
            .stages
            .iter()
            .any(|s| s.nodes.iter().chain(&s.failed_nodes).any(|n| n == node));
    let failed = st
        .stopped
        .as_ref()
        .is_some_and(|s| s.nodes.iter().any(|n| n == node));
    if !held && !failed {
        return true;
    }
    serves_what_it_should(o, st, node)
}

/// The node's agent serves the revision it should run now: the target
/// while the rollout holds the node and goes on (the DaemonSet on it);
/// otherwise the last good
/// revision (after a revert, or a success that made the target stable),
/// or, once a failure stopped the rollout (Halt, Quarantine), on a node
/// whose agent did not fail, the target or any revision not blocked.
fn serves_what_it_should(o: &Observed, st: &SafeRolloutStatus, node: &str) -> bool {
    let mut live = live_pods(o.pods, node).peekable();
    let Some(revision) = live.peek().map(|p| p.revision) else {
        return false;
    };
    if !live.all(|p| p.revision == revision) || !replace::is_available(o.pods, node) {
        return false;
    }
    let stable = st.stable_revision.as_deref();
    let target = st.target_revision.as_deref();
    // A stop of an older revision says nothing of the one rolled now: its
    // nodes pass or fail afresh.
    if let Some(stopped) = super::stop_in_force(st, target) {
        // Nothing is replaced until a person acts: a node whose agent did
        // not fail is given back on what it runs, the target it passed on
        // or any revision no gate stopped (an older one its stage had not
        // replaced yet: kept cordoned, it would take no workload for as
        // long as the stop lasts, found by the property tests).
        let failed = stopped.nodes.iter().any(|n| n == node);
        return Some(revision) == stable
            || (!failed && (Some(revision) == target || !is_blocked(st, revision)));
    }
    // Rolling on: the DaemonSet is (still) on the target, which is neither
    // blocked nor stable (a template written back by a person ends it).
    let current = o.daemonset.and_then(|d| d.current_revision);
    let rolling =
        target.is_some_and(|t| !is_blocked(st, t) && Some(t) != stable && Some(t) == current);
    if !rolling {
        return Some(revision) == stable;
    }
    // On the target, the node has also reported since its new agent became
    // Ready: the node-level gates (allocatable, node conditions, device
    // health) then judged fresh evidence of it, and found no violation
    // (checked by the caller); a release that strips the node's devices is
    // caught while it is still cordoned.
    Some(revision) == target
        && o.nodes.get(node).is_some_and(|view| {
            live_pods(o.pods, node)
                .any(|p| p.ready && crate::gates::freshness::node_status_fresh(view, p))
        })
}
