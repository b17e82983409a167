//! Taking a new revision through its stages. One pass:
//! 1. [`start_if_new`]: a new target (or a retried one) starts at stage 0;
//! 2. pause and preflight may hold everything;
//! 3. [`reconcile_membership`]: the stage's nodes, re-derived from status and
//!    the cluster: nodes that left or can no longer be replaced are let go
//!    (`skipped`, with why), nodes that joined on the target revision are
//!    taken into the current stage, and the stage is planned up to its size,
//!    recording each planned node's baseline (what its serving stable agent
//!    advertises) before anything touches it;
//! 4. [`sync_labels`]: the nodes carry exactly their stage's label;
//! 5. judge every gate over every node the rollout holds;
//! 6. a failed gate (or an abort) blocks the revision and restores the last
//!    good template, deleting nothing in that pass;
//! 7. otherwise replace old pods within the budget, where a node whose
//!    violation of a gate is soaking holds a slot;
//! 8. a stage whose gates all passed on all its nodes soaks, waits for its
//!    approval, then the next stage starts, or the rollout is done.

use saferollout_api::device_baseline;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use saferollout_api::{
    ABORT_ANNOTATION, BlockedRevision, GateResult, GateStatus, NodeDevices, NodeNote, OnFailure,
    Phase, PreflightPolicy, SafeRolloutStatus, Stage, StageState, StageStatus, resolve_count,
};

use super::breaker::{self, Breaker};
use super::{
    Action, Observed, approval_value, devices, labelled_nodes, maintenance, max_unavailable, phase,
    progress_deadline, record_progress, replace,
};
use crate::conditions::{self, DEGRADED, PREFLIGHT_PASSED};
use crate::eligibility::eligibility;
use crate::gates::{self, Snapshot, Verdict};
use crate::plan::{self, PlanError};
use crate::views::{DaemonSetView, live_pods};

/// One stage's baselines: per node, per resource, the allocatable before the stage.
type Baseline = BTreeMap<String, saferollout_api::ResourceCounts>;

/// Take `target` through the stages.
pub(super) fn roll(
    o: &Observed,
    st: &mut SafeRolloutStatus,
    actions: &mut Vec<Action>,
    ds: &DaemonSetView,
    target: &str,
    fleet: &mut super::FleetPass,
) -> Option<Duration> {
    start_if_new(o, st, actions, target);
    if o.spec.paused && o.requests.abort != Some(target) {
        let msg = format!("paused by spec.paused while rolling out revision {target}");
        phase::paused(st, o, "Paused", msg);
        return None;
    }
    match preflight(o, st, actions, target) {
        Preflight::Go => {}
        Preflight::Blocked => return None,
        Preflight::Pending => {
            let msg = format!(
                "waiting for the preflight of revision {target} (spec.preflight.policy: Enforce): nothing is replaced before it passes"
            );
            phase::keep_working(st, o, "PreflightPending", &msg);
            return Some(PREFLIGHT_RECHECK);
        }
    }
    let stage_specs = o.spec.effective_stages();
    let index = (st.current_stage.unwrap_or(0).max(0) as usize).min(stage_specs.len() - 1);
    let stage_spec = &stage_specs[index];
    let baselines_awaited = match reconcile_membership(
        o,
        st,
        actions,
        ds,
        target,
        index,
        stage_spec,
        stage_specs.len(),
    ) {
        Ok(awaited) => awaited,
        Err(e) => {
            phase::stalled(st, o, Phase::Failed, "NoEligibleNodes", e.to_string());
            return None;
        }
    };
    let labelled = sync_labels(o, st, actions, index);
    let skipped = record_skipped(o, st, ds);

    // Every node the rollout holds now, and their baselines.
    // (Borrowed from the snapshot, not from status, which changes below.)
    let rollout_nodes: Vec<&str> = held_nodes_through(st, index)
        .into_iter()
        .filter_map(|n| o.nodes.get(n).map(|v| v.name))
        .collect();
    // The stages' baselines leave the status while the gates read them and
    // go back right after (the gates write into the status meanwhile): a
    // copy of every node's baseline on each pass costs more, at thousands of
    // nodes, than judging them.
    let taken_baselines: Vec<(usize, Baseline)> = st
        .stages
        .iter_mut()
        .enumerate()
        .filter(|(_, s)| s.index as usize <= index)
        .map(|(i, s)| (i, std::mem::take(&mut s.baseline)))
        .collect();
    let baselines: Vec<&Baseline> = taken_baselines.iter().map(|(_, b)| b).collect();
    let device_baseline: BTreeMap<String, NodeDevices> = st
        .stages
        .iter()
        .filter(|s| s.index as usize <= index)
        .flat_map(|s| s.device_baseline.clone())
        .collect();
    let probed: BTreeSet<String> = st
        .stages
        .iter()
        .filter(|s| s.index as usize <= index)
        .flat_map(|s| s.probed.iter().cloned())
        .collect();
    let on_target_ready = rollout_nodes
        .iter()
        .filter(|n| live_pods(o.pods, n).any(|p| p.revision == target && p.running && p.ready))
        .count();
    // The nodes whose agent is still to be replaced, and which of those the
    // policies governing the rollout let it start on now.
    let to_replace: Vec<&str> = rollout_nodes
        .iter()
        .copied()
        .filter(|n| live_pods(o.pods, n).any(|p| p.revision != target))
        .collect();
    let admitted = o
        .fleet
        .map(|f| admit_fleet(o, st, f, &to_replace, &labelled));
    fleet.held = admitted.as_ref().and_then(|a| a.held.clone());
    let breaker = breaker::judge(o, st, ds, target);
    let upgrading = driver_upgrades(o, &rollout_nodes);
    // Why nothing (more) is started now: the breaker, else a vendor's
    // driver upgrade on a node the stage holds, else a policy, else a
    // node's drain.
    let draining = maintenance::waiting(o, st, &to_replace);
    let hold: Option<(&str, String)> = match &breaker {
        Breaker::Open { message } => Some((breaker::OPEN, message.clone())),
        _ => upgrading
            .first()
            .map(|(node, why)| {
                (
                    crate::eligibility::DRIVER_UPGRADE,
                    format!(
                        "waiting for the driver upgrade of node {node} to end: {why}; its agent is not replaced or judged meanwhile, and the stage's gates start over once it ends"
                    ),
                )
            })
            .or_else(|| fleet.held.as_ref().map(|h| (h.reason, h.message.clone())))
            .or_else(|| draining.clone()),
    };
    if !upgrading.is_empty() {
        // What the gates saw before or during the upgrade judged another
        // driver: they judge the stage afresh once it ends.
        if let Some(stage) = st.stages.iter_mut().find(|s| s.index as usize == index) {
            stage.gates.clear();
            stage.verified_at = None;
        }
    }
    let upgrading: BTreeSet<&str> = upgrading.iter().map(|(n, _)| *n).collect();
    if matches!(breaker, Breaker::Open { .. }) && !held_for(st, breaker::OPEN) {
        let message = hold.as_ref().map(|h| h.1.clone()).unwrap_or_default();
        phase::event(actions, true, breaker::OPEN, message);
    }
    if let Some((maintenance::DRAIN_TIMED_OUT, message)) = &hold
        && !held_for(st, maintenance::DRAIN_TIMED_OUT)
    {
        phase::event(actions, true, maintenance::DRAIN_TIMED_OUT, message.clone());
    }
    // Held, the stage is not stuck: its deadline counts from when the hold
    // ends (a new subject restarts the clock), and a wait longer than the
    // deadline fails nothing.
    let held_by = match &hold {
        Some((reason, _)) if *reason == breaker::OPEN => " (held by the circuit breaker)",
        Some((reason, _)) if *reason == crate::eligibility::DRIVER_UPGRADE => {
            " (waiting on a driver upgrade)"
        }
        Some(_) if draining.is_some() && fleet.held.is_none() => " (waiting on a drain)",
        Some(_) => " (held by a SafeRolloutPolicy)",
        None => "",
    };
    let without_progress = record_progress(
        st,
        format!("stage {} of revision {target}{held_by}", index + 1),
        on_target_ready,
        o,
    );
    // ...unless its own replacements are in flight: a node it replaced (or
    // brings back) whose new agent does not serve is its own progress to
    // make, whoever holds the rest (a release whose agents never turn
    // Ready, holding the budget itself, would otherwise wait forever).
    let in_flight = rollout_nodes
        .iter()
        .filter(|n| !upgrading.contains(*n))
        .any(|n| !to_replace.contains(n) && !replace::is_available(o.pods, n))
        || st
            .converging_nodes
            .iter()
            .any(|n| o.nodes.contains_key(n.as_str()) && !replace::is_available(o.pods, n));
    let without_progress = if hold.is_some() && !in_flight {
        Duration::ZERO
    } else {
        without_progress
    };
    let deadline = progress_deadline(o);
    let stage_pos = st
        .stages
        .iter()
        .position(|s| s.index as usize == index)
        .expect("the current stage was recorded by reconcile_membership");
    // A node in a driver upgrade is judged once it ends, not meanwhile.
    let judged_nodes: Vec<&str> = rollout_nodes
        .iter()
        .copied()
        .filter(|n| !upgrading.contains(n))
        .collect();
    let snapshot = Snapshot {
        nodes: &judged_nodes,
        pods: o.pods,
        node_views: o.nodes,
        target_revision: target,
        baselines: &baselines,
        without_progress,
        progress_deadline: deadline,
        evidence: o.evidence,
        device_baseline: &device_baseline,
        probed: &probed,
        now: o.now,
    };
    let judged = gates::judge(o.spec, &snapshot, &mut st.stages, index, o.rollout_id);
    let verdicts = judged.verdicts;
    devices::warn_once(actions, &st.stages[stage_pos].gates, &verdicts);
    if !judged.probes.is_empty() {
        actions.push(Action::CreateProbePods {
            probes: judged.probes,
        });
    }
    st.stages[stage_pos].gates = verdicts.iter().map(|v| v.result.clone()).collect();
    devices::record_probes(o, &snapshot, &mut st.stages[stage_pos]);
    for (i, baseline) in taken_baselines {
        st.stages[i].baseline = baseline;
    }

    let aborted = (o.requests.abort == Some(target)).then(|| GateResult {
        gate: "manual".into(),
        status: GateStatus::Failed,
        reason: "Aborted".into(),
        message: format!("aborted by a person ({ABORT_ANNOTATION}={target})"),
        ..Default::default()
    });
    let tripped = match &breaker {
        Breaker::Tripped(result) => Some(result.clone()),
        _ => None,
    };
    if let Some(failure) = aborted
        .or(tripped)
        .or_else(|| gates::first_failure(&verdicts).cloned())
    {
        fail_stage(o, st, actions, stage_pos, target, &failure, &verdicts);
        return None;
    }

    // Replace old pods within the budget. A node that violates a gate (its
    // violation soaking) holds a slot of the budget, as an agent that does not
    // serve would: its devices are missing or wrong. So at `maxUnavailable: 1`
    // nothing more is replaced until it recovers or the gate fails, and a
    // larger budget keeps replacing around a replaced plugin's node that reads
    // 0 devices for a moment, instead of halting the whole stage on it. Its
    // own agent is left alone.
    let violating = gates::violating_nodes(&verdicts);
    fleet.violating.clone_from(&violating);
    // A node in a driver upgrade holds a slot of the budget as a violating
    // one does: the vendor takes its agent away, whatever its pod shows now.
    let down: BTreeSet<String> = violating
        .iter()
        .cloned()
        .chain(upgrading.iter().map(|n| n.to_string()))
        .collect();
    // A node's pod is replaced once the node carries its stage's label (the
    // runbook's "label the nodes, then roll out there"). Node by node, not
    // once the whole stage carries them: the label writer (beside the
    // passes) takes about 2.2 s to label a 1,000-node stage on a 2-core API
    // server, and the stage's first replacements waited for the last label
    // (at maxUnavailable 10% the last deletion now comes about 1.4 s sooner,
    // though labelling, sharing the API server, takes longer).
    let replaceable: Vec<&str> = to_replace
        .iter()
        .copied()
        .filter(|n| !down.contains(*n) && labelled.contains(*n))
        .filter(|n| admitted.as_ref().is_none_or(|a| a.nodes.contains(n)))
        .filter(|_| !matches!(breaker, Breaker::Open { .. }))
        .collect();
    if !replaceable.is_empty() {
        let held: BTreeSet<&str> = rollout_nodes
            .iter()
            .copied()
            .chain(st.converging_nodes.iter().map(String::as_str))
            .collect();
        let stable = st.stable_revision.as_deref().unwrap_or_default();
        match maintenance::configured(o) {
            None => {
                let unavailable =
                    replace::unavailable(o, ds, stable, &held, &BTreeSet::new(), &down);
                let pods = replace::deletions(
                    o.pods,
                    &replaceable,
                    target,
                    unavailable,
                    &BTreeSet::new(),
                    max_unavailable(o, ds),
                );
                if !pods.is_empty() {
                    actions.push(Action::DeletePods { pods });
                }
            }
            Some(m) => replace_in_maintenance(
                o,
                ds,
                m,
                actions,
                (stable, target),
                &held,
                &down,
                &replaceable,
            ),
        }
    }
    let maintaining = actions
        .iter()
        .any(|a| matches!(a, Action::CordonNodes { .. } | Action::EvictPods { .. }));

    let skipped_note = match skipped {
        0 => String::new(),
        n => format!(" ({n} node(s) skipped: see status.skippedNodes)"),
    };
    let progress_msg = format!(
        "stage {} of {}: rolling out revision {target}{skipped_note}",
        index + 1,
        stage_specs.len()
    );
    match &hold {
        Some((reason, message)) => phase::working(
            st,
            o,
            Phase::Progressing,
            reason,
            format!("{progress_msg}; {message}"),
        ),
        None => phase::working(st, o, Phase::Progressing, "RollingOut", progress_msg),
    }
    // A stage that could not take every node it planned (a baseline's
    // evidence awaited) is not complete, whatever its gates say.
    let passed = gates::all_passed(&verdicts)
        && to_replace.is_empty()
        && !baselines_awaited
        && upgrading.is_empty();
    if !passed {
        let stage = &mut st.stages[stage_pos];
        stage.state = if to_replace.is_empty() {
            StageState::Verifying
        } else {
            StageState::Replacing
        };
        stage.verified_at = None;
        let recheck = recheck_after(&verdicts, deadline.saturating_sub(without_progress));
        // Nothing wakes the rollout for a node it does not hold yet. A
        // policy's hold is woken when another rollout releases a node, and
        // looked at again anyway (a window opens by the clock alone).
        let recheck = if baselines_awaited {
            recheck.min(BASELINE_RECHECK)
        } else {
            recheck
        };
        // A cordon lands, an evicted pod terminates, with nothing that wakes
        // the rollout for it: look again soon.
        let recheck = if maintaining || draining.is_some() {
            recheck.min(DRAIN_RECHECK)
        } else {
            recheck
        };
        return Some(match &hold {
            Some(_) => recheck.min(HOLD_RECHECK),
            None => recheck,
        });
    }
    advance(
        o,
        st,
        actions,
        stage_pos,
        index,
        stage_spec,
        stage_specs.len(),
        target,
    )
}

/// Replaces `replaceable` under `spec.nodeMaintenance`: cordons nodes
/// within the budget (a marked node counts as down from its cordon), evicts
/// the workloads of the marked ones, and deletes the agent of those drained
/// (their slot taken at their cordon).
#[allow(clippy::too_many_arguments)]
fn replace_in_maintenance(
    o: &Observed,
    ds: &DaemonSetView,
    m: &saferollout_api::NodeMaintenance,
    actions: &mut Vec<Action>,
    (stable, target): (&str, &str),
    held: &BTreeSet<&str>,
    violating: &BTreeSet<String>,
    replaceable: &[&str],
) {
    let mut down = violating.clone();
    down.extend(maintenance::marked(o).into_iter().map(str::to_string));
    let unavailable = replace::unavailable(o, ds, stable, held, &BTreeSet::new(), &down);
    let steps = maintenance::steps(o, m, replaceable, unavailable, max_unavailable(o, ds));
    if !steps.cordon.is_empty() {
        actions.push(Action::CordonNodes {
            nodes: steps.cordon,
        });
    }
    if !steps.evict.is_empty() {
        actions.push(Action::EvictPods { pods: steps.evict });
    }
    let prepaid: BTreeSet<String> = steps.drained.iter().map(|n| n.to_string()).collect();
    let pods = replace::deletions(o.pods, &steps.drained, target, 0, &prepaid, 0);
    if !pods.is_empty() {
        actions.push(Action::DeletePods { pods });
    }
}

/// How often a stage with a node being cordoned or drained looks again.
const DRAIN_RECHECK: Duration = Duration::from_secs(2);

/// Most nodes `status.skippedNodes` names.
const MAX_SKIPPED: usize = 20;

/// `status.skippedNodes`: the DaemonSet's nodes (its placement selects
/// them) that planning leaves out now, and why; returns how many there are.
/// Nodes the stages hold are not listed: they are judged, or let go with
/// their reason in their stage.
fn record_skipped(o: &Observed, st: &mut SafeRolloutStatus, ds: &DaemonSetView) -> usize {
    let held: BTreeSet<&str> = st
        .stages
        .iter()
        .flat_map(|s| s.nodes.iter().map(String::as_str))
        .collect();
    let mut notes = Vec::new();
    let mut count = 0;
    for node in o.nodes.values() {
        if held.contains(node.name) || !crate::eligibility::is_selected(node, &ds.placement) {
            continue;
        }
        if let Err((reason, why)) = crate::eligibility::plannable(node, &ds.placement) {
            count += 1;
            if notes.len() < MAX_SKIPPED {
                notes.push(NodeNote {
                    node: node.name.to_string(),
                    reason: reason.to_string(),
                    message: format!("{why}; left out of the rollout while so"),
                });
            }
        }
    }
    // `o.nodes` is sorted by name.
    st.skipped_nodes = notes;
    count
}

/// What the governing policies let this pass start replacing, of the
/// stage's nodes whose agent is still to be replaced and that carry their
/// label. What the rollout disrupts already (held nodes whose agent does not
/// serve) costs nothing more.
fn admit_fleet<'a>(
    o: &Observed<'a>,
    st: &SafeRolloutStatus,
    fleet: &crate::fleet::Fleet<'_>,
    to_replace: &[&'a str],
    labelled: &HashSet<&'a str, foldhash::fast::FixedState>,
) -> crate::fleet::Admitted<'a> {
    let wanted: Vec<&'a str> = to_replace
        .iter()
        .copied()
        .filter(|n| labelled.contains(n))
        .collect();
    // The nodes the rollout holds whose agent does not serve, or that are
    // in maintenance (cordoned, serving or not). Leaving a cordoned node
    // out would grant the budget's last slot to another node and never
    // this one, whose cordon holds the rollout's last slot of
    // `maxUnavailable`: neither could go on. Only the held ones: a node a
    // stop quarantined, left cordoned, and skipped by a newer template is
    // out of service and holds no budget, or it would hold every later
    // release (both found by the property tests).
    let in_maintenance: BTreeSet<&str> = st
        .node_maintenance
        .iter()
        .map(|e| e.node.as_str())
        .collect();
    let disrupted: Vec<&'a str> = held_nodes_through(st, usize::MAX)
        .into_iter()
        .chain(st.converging_nodes.iter().map(String::as_str))
        .filter(|n| in_maintenance.contains(n) || !replace::is_available(o.pods, n))
        .filter_map(|n| o.nodes.get(n).map(|v| v.name))
        .collect();
    crate::fleet::admit(fleet, &disrupted, &wanted, o.now)
}

/// A new revision, or one tried before and unblocked by a retry: start over.
fn start_if_new(o: &Observed, st: &mut SafeRolloutStatus, actions: &mut Vec<Action>, target: &str) {
    let retried = st.stages.iter().any(|s| s.state == StageState::Failed);
    if st.target_revision.as_deref() == Some(target) && !retried {
        return;
    }
    st.target_revision = Some(target.to_string());
    st.current_stage = Some(0);
    carry_replacements_in_flight(o, st);
    st.stages.clear();
    st.progress = None;
    st.stuck_nodes.clear();
    phase::event(
        actions,
        false,
        "RolloutStarted",
        format!(
            "rolling out revision {target} (stable: {})",
            st.stable_revision.as_deref().unwrap_or("")
        ),
    );
    conditions::set(
        &mut st.conditions,
        DEGRADED,
        false,
        "NewRevision",
        format!("rolling out revision {target}"),
        o.generation,
        o.now,
    );
}

/// The stages about to be dropped may have replacements in flight: nodes
/// whose agent a stage emptied and that do not serve again yet. They keep
/// counting against `maxUnavailable` (as `convergingNodes`, until their agent
/// serves) whatever revision the replacement comes back on. Without this, a
/// replacement that comes back on the stable revision (the template reverted
/// while the cache showed another new one) looked like nobody's doing, and
/// the new revision's canary took a second agent down with
/// `maxUnavailable: 1`. A node counts when it has no live agent, or one
/// created since its stage started (whole seconds, as creation times are):
/// an agent that failed on its own before the stage is not the operator's.
fn carry_replacements_in_flight(o: &Observed, st: &mut SafeRolloutStatus) {
    for stage in &st.stages {
        let since = stage
            .started_at
            .as_ref()
            .and_then(|t| jiff::Timestamp::from_second(t.0.as_second()).ok());
        let nodes = stage
            .nodes
            .iter()
            .chain(stage.skipped.iter().map(|n| &n.node));
        for node in nodes {
            if !o.nodes.contains_key(node.as_str()) || replace::is_available(o.pods, node) {
                continue;
            }
            let mut live = live_pods(o.pods, node).peekable();
            let replaced = live.peek().is_none()
                || live.any(|p| match (p.created, since) {
                    (Some(created), Some(since)) => created >= since,
                    _ => true,
                });
            if replaced {
                st.converging_nodes.push(node.clone());
            }
        }
    }
    st.converging_nodes.sort();
    st.converging_nodes.dedup();
}

/// The nodes stages up to `index` hold now, sorted. Not
/// [`SafeRolloutStatus::held_nodes`]: `index` is the stage this pass works
/// on (stage 0 while status names none, the spec's last stage while status
/// names one beyond it), and a sorted list is cheaper here than a set (below).
fn held_nodes_through(st: &SafeRolloutStatus, index: usize) -> Vec<&str> {
    let mut held: Vec<&str> = st
        .stages
        .iter()
        .filter(|s| s.index as usize <= index)
        .flat_map(|s| s.nodes.iter().map(String::as_str))
        .collect();
    // Each stage's list is sorted already (one run per stage): an unstable
    // sort checks that in one comparison per node, where building a sorted
    // set compared every name about ten times (at 1,000 nodes, twice a pass).
    held.sort_unstable();
    held.dedup();
    held
}

fn note(list: &mut Vec<NodeNote>, node: &str, reason: &str, message: String) {
    list.retain(|n| n.node != node);
    list.push(NodeNote {
        node: node.to_string(),
        reason: reason.to_string(),
        message,
    });
    list.sort_by(|a, b| a.node.cmp(&b.node));
}

/// How often a stage held by a SafeRolloutPolicy or the circuit breaker
/// looks again.
const HOLD_RECHECK: Duration = Duration::from_secs(5);

/// The rollout's Ready condition says it is held for `reason` already.
/// The nodes of `nodes` in a vendor's driver upgrade, with why.
fn driver_upgrades<'a>(o: &Observed, nodes: &[&'a str]) -> Vec<(&'a str, String)> {
    nodes
        .iter()
        .filter_map(|n| {
            let view = o.nodes.get(n)?;
            crate::eligibility::driver_upgrade(view).map(|why| (*n, why))
        })
        .collect()
}

fn held_for(st: &SafeRolloutStatus, reason: &str) -> bool {
    conditions::get(&st.conditions, conditions::READY).is_some_and(|c| c.reason == reason)
}

/// How often a stage that waits for a planned node's baseline evidence looks
/// again (the node is not held yet, so its status writes wake nobody).
const BASELINE_RECHECK: Duration = Duration::from_secs(1);

/// Re-derives which nodes the stages hold (see the module doc) and plans the
/// current stage up to its size, recording each new node's baseline before
/// anything touches it. A baseline is taken only from evidence written after
/// the node's serving stable agent became Ready ([`gates::freshness`]): right
/// after a revert the node may still show what the reverted release left (a
/// broken plugin's 0, which as a baseline would bound nothing, or a driver's
/// cleared taints). A planned node whose evidence is not there yet is not
/// taken this pass; `Ok(true)` says so (the stage is then not complete).
#[allow(clippy::too_many_arguments)]
fn reconcile_membership(
    o: &Observed,
    st: &mut SafeRolloutStatus,
    actions: &mut Vec<Action>,
    ds: &DaemonSetView,
    target: &str,
    index: usize,
    stage_spec: &Stage,
    stage_count: usize,
) -> Result<bool, PlanError> {
    let placement = &ds.placement;
    // Let go of nodes that left or can no longer have their agent replaced.
    for stage in st.stages.iter_mut().filter(|s| s.index as usize <= index) {
        let mut kept = Vec::with_capacity(stage.nodes.len());
        for n in std::mem::take(&mut stage.nodes) {
            match o.nodes.get(n.as_str()) {
                None => note(
                    &mut stage.skipped,
                    &n,
                    "NodeDeleted",
                    "the node left the cluster".into(),
                ),
                Some(view) => match eligibility(view, placement) {
                    e if e.is_eligible() => kept.push(n),
                    e => note(
                        &mut stage.skipped,
                        &n,
                        e.reason(),
                        format!("{e}; its agent is not replaced or judged while so"),
                    ),
                },
            }
        }
        stage.nodes = kept;
    }
    let stage_pos = match st.stages.iter().position(|s| s.index as usize == index) {
        Some(p) => p,
        None => {
            st.stages.push(StageStatus {
                index: index as i32,
                state: StageState::Replacing,
                started_at: Some(Time(o.now)),
                ..Default::default()
            });
            st.stages.sort_by_key(|s| s.index);
            st.stages
                .iter()
                .position(|s| s.index as usize == index)
                .expect("just pushed")
        }
    };
    // Names borrowed from the snapshot (every node still held is in it, see
    // above), so the status can change below; hashed, as every node of the
    // cluster is looked up in it on every pass.
    let mut held: HashSet<&str, foldhash::fast::FixedState> = held_nodes_through(st, index)
        .into_iter()
        .filter_map(|n| o.nodes.get(n).map(|v| v.name))
        .collect();

    // Nodes that joined on the target revision by themselves (a new node, a
    // pod deleted by someone else) are judged with the current stage.
    let joiners: Vec<&str> = o
        .nodes
        .values()
        .filter(|n| !held.contains(n.name))
        .filter(|n| live_pods(o.pods, n.name).any(|p| p.revision == target))
        .filter(|n| eligibility(n, placement).is_eligible())
        .map(|n| n.name)
        .collect();
    let mut added: Vec<String> = joiners.iter().map(|n| n.to_string()).collect();

    // Plan up to the stage's cumulative size.
    let canary = plan::canary_selector(
        o.spec
            .canary
            .as_ref()
            .and_then(|c| c.node_selector.as_ref()),
    );
    // Counted first: most passes find the stage planned already, and only a
    // stage still to fill needs each candidate's zone and canary match.
    let candidate_count = plan::candidate_count(o.nodes, o.pods, placement);
    let wanted = resolve_count(&stage_spec.nodes, candidate_count, true).unwrap_or(1);
    let size = plan::cumulative_target(wanted, candidate_count);
    held.extend(joiners.iter().copied());
    let mut planned = Vec::new();
    if held.len() < size {
        let candidates = plan::candidates(o.nodes, o.pods, placement, &canary, target);
        let already: BTreeSet<String> = held.iter().map(|n| n.to_string()).collect();
        planned = plan::plan_stage(&candidates, &already, size, index == 0)?;
        planned.retain(|n| !held.contains(n.as_str()));
    } else if held.is_empty() {
        return Err(PlanError::NoNodes);
    }
    added.extend(planned.iter().cloned());

    let gated: Vec<&str> = o
        .spec
        .allocatable_gates()
        .iter()
        .map(|g| g.resource.as_str())
        .collect();
    let stable = st.stable_revision.clone().unwrap_or_default();
    let awaited: BTreeSet<String> = planned
        .iter()
        .filter(|n| !baseline_evidence_fresh(o, n, &stable, &gated))
        .cloned()
        .collect();
    planned.retain(|n| !awaited.contains(n));
    added.retain(|n| !awaited.contains(n));
    // Claim names recorded so far: past the status's budget, a node's claims
    // are counted only (see saferollout_api::device_baseline).
    let mut claim_names: usize = st
        .stages
        .iter()
        .flat_map(|s| s.device_baseline.values())
        .map(|d| d.claims.len())
        .sum();
    let stage = &mut st.stages[stage_pos];
    for n in &planned {
        // A baseline is what a serving agent of the stable revision advertises:
        // a node still on an abandoned revision, or whose agent does not
        // serve, has none (and is judged like a node that joined by itself).
        let mut live = live_pods(o.pods, n).peekable();
        let serving_stable =
            live.peek().is_some() && live.all(|p| p.revision == stable && p.running && p.ready);
        if !serving_stable {
            continue;
        }
        let view = &o.nodes[n.as_str()];
        let per_res = gated
            .iter()
            .map(|r| (r.to_string(), view.allocatable_count(r)))
            .collect();
        stage.baseline.insert(n.clone(), per_res);
        if let Some(devices) = devices::capture_baseline(o, n) {
            device_baseline::record(&mut stage.device_baseline, n, devices, &mut claim_names);
        }
    }
    for n in &added {
        stage.skipped.retain(|s| &s.node != n);
    }
    for s in st.stages.iter_mut() {
        s.skipped.retain(|skip| !added.contains(&skip.node));
    }
    let stage = &mut st.stages[stage_pos];
    stage.nodes.extend(added.iter().cloned());
    stage.nodes.sort();
    stage.nodes.dedup();
    if !planned.is_empty() || !joiners.is_empty() {
        let what = if joiners.is_empty() {
            String::new()
        } else {
            format!(
                " (joined on revision {target} by themselves: {})",
                joiners.join(", ")
            )
        };
        phase::event(
            actions,
            false,
            "StageStarted",
            format!(
                "stage {} of {}: {} node(s): {}{what}",
                index + 1,
                stage_count,
                stage.nodes.len(),
                stage.nodes.join(", ")
            ),
        );
    }
    Ok(!awaited.is_empty())
}

/// Whether a baseline of `node` may be taken now: its live agents are of the
/// stable revision and serve, and what they advertise was written after they
/// became Ready (the node's status for the gated resources, the driver's
/// pools for the device gates). A node whose agent does not serve the stable
/// revision gets no baseline at all (judged as one that joined by itself),
/// so there is nothing to wait for.
fn baseline_evidence_fresh(o: &Observed, node: &str, stable: &str, gated: &[&str]) -> bool {
    let live: Vec<_> = live_pods(o.pods, node).collect();
    let serving_stable = !live.is_empty()
        && live
            .iter()
            .all(|p| p.revision == stable && p.running && p.ready);
    let (Some(view), true) = (o.nodes.get(node), serving_stable) else {
        return true;
    };
    live.iter().all(|pod| {
        let status = gated.is_empty() || gates::freshness::node_status_fresh(view, pod);
        let pools = match (o.spec.device_driver(), o.evidence.devices) {
            (Some(driver), Some(ev)) if ev.unavailable.is_none() => {
                let slices = ev.node_slices(node, driver);
                gates::freshness::publication(&slices, driver, pod.ready_since)
                    != gates::freshness::Publication::Stale
            }
            _ => true,
        };
        status && pools
    })
}

/// Makes exactly the nodes the stages hold carry this rollout's labels;
/// returns those that carry their stage's label already (written, not just
/// queued).
///
/// Runs on every pass over every node the stages hold: hash lookups, and the
/// stages' own (sorted) node lists give the order, rather than sorted maps
/// of every node rebuilt per pass.
fn sync_labels<'a>(
    o: &Observed<'a>,
    st: &SafeRolloutStatus,
    actions: &mut Vec<Action>,
    index: usize,
) -> HashSet<&'a str, foldhash::fast::FixedState> {
    let held = || st.stages.iter().filter(|s| s.index as usize <= index);
    // A node listed by two stages belongs to the later one.
    let mut desired: HashMap<&str, usize, foldhash::fast::FixedState> = HashMap::default();
    for s in held() {
        for n in &s.nodes {
            desired.insert(n, s.index as usize);
        }
    }
    let mut by_stage: BTreeMap<usize, Vec<String>> = BTreeMap::new();
    let mut in_place = HashSet::with_capacity_and_hasher(desired.len(), Default::default());
    for s in held() {
        let stage = s.index as usize;
        for n in &s.nodes {
            if desired.get(n.as_str()) != Some(&stage) {
                continue;
            }
            let Some(view) = o.nodes.get(n) else { continue };
            let labelled =
                view.ours.rollout == Some(o.rollout_id) && view.ours.stage == Some(stage);
            if !labelled {
                by_stage.entry(stage).or_default().push(n.clone());
            } else if !view.ours.queued {
                in_place.insert(view.name);
            }
        }
    }
    for (stage, mut nodes) in by_stage {
        nodes.sort();
        nodes.dedup();
        actions.push(Action::LabelNodes { nodes, stage });
    }
    let extra: Vec<String> = o
        .nodes
        .values()
        .filter(|n| n.ours.rollout == Some(o.rollout_id))
        .filter(|n| !desired.contains_key(n.name))
        .map(|n| n.name.to_string())
        .collect();
    if !extra.is_empty() {
        actions.push(Action::UnlabelNodes { nodes: extra });
    }
    in_place
}

/// A gate failed (or a person aborted): block the revision, record which
/// nodes' agents failed, restore the last good template. No pod is deleted in
/// this pass; the revert replaces them from the next one.
fn fail_stage(
    o: &Observed,
    st: &mut SafeRolloutStatus,
    actions: &mut Vec<Action>,
    stage_pos: usize,
    target: &str,
    failure: &GateResult,
    verdicts: &[Verdict],
) {
    let node = failure.node.clone().unwrap_or_default();
    let detail = match (&failure.observed, &failure.expected) {
        (Some(obs), Some(exp)) if !failure.message.contains(exp.as_str()) => {
            format!(" (observed {obs}, expected {exp})")
        }
        _ => String::new(),
    };
    let on = if node.is_empty() {
        String::new()
    } else {
        format!(" on node {node}")
    };
    let message = format!(
        "gate {} failed{on}: {}{detail}",
        failure.gate, failure.message
    );
    // A person's abort reverts whatever the policy says.
    let policy = if failure.reason == "Aborted" && failure.gate == "manual" {
        OnFailure::Revert
    } else {
        o.spec.on_failure
    };
    // Owner-aware mode: the last good template cannot be written over what
    // the owner reconciles; the rollout stops, naming what to put back.
    // Under `spec.ownerRevert` it is reverted through the owner's version
    // fields, when the release is theirs.
    let owner = o.daemonset.and_then(|d| d.owner);
    let mut through_owner = None;
    let (policy, message) = match (owner, o.owner_revert) {
        (Some(owner), Some(Ok(plan)))
            if policy == OnFailure::Revert && o.owner_gitops.is_some() =>
        {
            (
                OnFailure::Halt,
                format!(
                    "{message}; DaemonSet {:?} is owned by {}, which is managed by {}, whose next sync would undo a revert written there: revert {} in Git",
                    o.spec.target_ref.name,
                    owner.describe(),
                    o.owner_gitops.unwrap_or_default(),
                    plan.describe()
                ),
            )
        }
        (Some(owner), Some(Ok(plan))) if policy == OnFailure::Revert => {
            through_owner = Some(plan.clone());
            (
                OnFailure::Revert,
                format!(
                    "{message}; DaemonSet {:?} is owned by {}: reverting through {} (spec.ownerRevert), its operator writes revision {}'s template back",
                    o.spec.target_ref.name,
                    owner.describe(),
                    plan.describe(),
                    st.stable_revision.as_deref().unwrap_or_default()
                ),
            )
        }
        (Some(owner), revert) if policy == OnFailure::Revert => (
            OnFailure::Halt,
            format!(
                "{message}; DaemonSet {:?} is owned by {}, so it is not reverted by saferollout{}: put back {} as they were for revision {}",
                o.spec.target_ref.name,
                owner.describe(),
                match revert {
                    Some(Err(why)) => format!(" (spec.ownerRevert: {why})"),
                    _ => String::new(),
                },
                owner.version_fields(),
                st.stable_revision.as_deref().unwrap_or_default()
            ),
        ),
        _ => (policy, message),
    };
    let stage = &mut st.stages[stage_pos];
    stage.state = StageState::Failed;
    stage.finished_at = Some(Time(o.now));
    let mut failed: BTreeSet<String> = gates::violating_nodes(verdicts);
    if !node.is_empty() {
        failed.insert(node);
    }
    stage.failed_nodes = failed.into_iter().collect();
    st.blocked_revisions.push(BlockedRevision {
        revision: target.to_string(),
        template_hash: o
            .spec_template
            .filter(|t| t.in_place)
            .map(|t| t.hash.to_string()),
        reason: failure.reason.clone(),
        message: message.clone(),
        blocked_at: Time(o.now),
    });
    phase::working(st, o, Phase::RollingBack, "RollingBack", message.clone());
    conditions::set(
        &mut st.conditions,
        DEGRADED,
        true,
        &format!("{}Failed", phase::gate_reason(&failure.gate)),
        message.clone(),
        o.generation,
        o.now,
    );
    st.progress = None;
    phase::event(actions, true, "GateFailed", message.clone());
    match policy {
        OnFailure::Revert => match through_owner {
            Some(plan) => actions.push(Action::RevertOwner { plan }),
            None => actions.push(super::restore_last_good(st)),
        },
        OnFailure::Quarantine | OnFailure::Halt => {
            let nodes = st.stages[stage_pos].failed_nodes.clone();
            devices::stop(o, st, actions, target, policy, message, nodes);
        }
    }
}

/// When to look again: when a soaking gate may have soaked, or at the deadline.
fn recheck_after(verdicts: &[Verdict], to_deadline: Duration) -> Duration {
    verdicts
        .iter()
        .filter_map(|v| v.recheck_after)
        .fold(to_deadline, Duration::min)
        .max(Duration::from_millis(100))
}

/// Every gate passed on every node of the stage: soak, wait for approval,
/// then go on (or finish).
#[allow(clippy::too_many_arguments)]
fn advance(
    o: &Observed,
    st: &mut SafeRolloutStatus,
    actions: &mut Vec<Action>,
    stage_pos: usize,
    index: usize,
    stage_spec: &Stage,
    stage_count: usize,
    target: &str,
) -> Option<Duration> {
    let stage = &mut st.stages[stage_pos];
    // Rounded up: the status keeps whole seconds, and a soak started at now
    // would read back as started up to a second earlier and end that much
    // too soon.
    let verified_at = stage
        .verified_at
        .get_or_insert_with(|| Time(gates::soak::whole_second_up(o.now)))
        .clone();
    let soak = stage_spec.soak.to_std().unwrap_or_default();
    if let Some(left) = gates::soak::remaining(verified_at.0, o.now, soak) {
        stage.state = StageState::Soaking;
        return Some(left);
    }
    // An approval names the revision and the stage, so one left on the object
    // never approves a later rollout.
    let approval = approval_value(target, index);
    if stage_spec.pause && o.requests.approve != Some(approval.as_str()) {
        stage.state = StageState::Paused;
        let msg = format!(
            "stage {} passed; waiting for approval (kubectl saferollout approve, or annotate saferollout.dev/approve={approval})",
            index + 1
        );
        phase::paused(st, o, "AwaitingApproval", msg);
        return None;
    }
    stage.state = StageState::Passed;
    stage.finished_at.get_or_insert(Time(o.now));
    phase::event(
        actions,
        false,
        "StagePassed",
        format!("stage {} of {stage_count} passed", index + 1),
    );
    if index + 1 < stage_count {
        st.current_stage = Some(index as i32 + 1);
        return Some(Duration::ZERO);
    }

    // Every stage passed: the target is the new last good revision.
    st.stable_revision = Some(target.to_string());
    st.current_stage = None;
    st.progress = None;
    actions.push(Action::BackupTemplate {
        revision: target.to_string(),
    });
    let labelled: Vec<String> = labelled_nodes(o).keys().map(|n| n.to_string()).collect();
    if !labelled.is_empty() {
        actions.push(Action::UnlabelNodes { nodes: labelled });
    }
    let msg = match st.skipped_nodes.len() {
        0 => format!("revision {target} rolled out to every node"),
        n => {
            let more = if n >= MAX_SKIPPED { " or more" } else { "" };
            format!(
                "revision {target} rolled out to every node but {n}{more} skipped while NotReady or going out of service (see status.skippedNodes), brought to it once back"
            )
        }
    };
    phase::succeeded(st, o, msg.clone());
    phase::event(actions, false, "RolloutSucceeded", msg);
    None
}

/// Whether a rollout of `target` may start, as far as preflight goes.
enum Preflight {
    Go,
    /// Policy Enforce, an error finding, no stage started yet.
    Blocked,
    /// Policy Enforce, no stage started yet, and no results for `target`
    /// in this pass (the operator read the cluster before the DaemonSet's
    /// revision of it existed): an Enforce policy never lets a rollout start
    /// unchecked.
    Pending,
}

/// How soon a rollout waiting for its preflight looks again.
const PREFLIGHT_RECHECK: Duration = Duration::from_secs(1);

/// Records preflight results for `target` and says whether they let the
/// rollout start.
fn preflight(
    o: &Observed,
    st: &mut SafeRolloutStatus,
    actions: &mut Vec<Action>,
    target: &str,
) -> Preflight {
    let policy = o
        .spec
        .preflight
        .as_ref()
        .map(|p| p.policy)
        .unwrap_or_default();
    if policy == PreflightPolicy::Skip {
        return Preflight::Go;
    }
    if let Some(fresh) = o.preflight.filter(|p| p.revision == target) {
        st.preflight = Some(fresh.clone());
    }
    let Some(p) = st.preflight.as_ref().filter(|p| p.revision == target) else {
        let unchecked = policy == PreflightPolicy::Enforce
            && st.stages.is_empty()
            && crate::preflight::needed(o.spec, o.status, target);
        return if unchecked {
            Preflight::Pending
        } else {
            Preflight::Go
        };
    };
    let mut msg = format!(
        "preflight of revision {target}: {} error(s), {} warning(s)",
        p.errors, p.warnings
    );
    if let Some(f) = p.findings.first().filter(|f| f.severity == "Error") {
        msg.push_str(&format!("; {} {}: {}", f.code, f.object, f.message));
    }
    let (passed, reason) = if p.passed {
        (true, "Passed")
    } else {
        (false, "ErrorsFound")
    };
    let blocked = !p.passed && policy == PreflightPolicy::Enforce && st.stages.is_empty();
    conditions::set(
        &mut st.conditions,
        PREFLIGHT_PASSED,
        passed,
        reason,
        msg.clone(),
        o.generation,
        o.now,
    );
    if blocked {
        if o.status.phase != Some(Phase::Failed) {
            phase::event(actions, true, "PreflightFailed", msg.clone());
        }
        phase::stalled(
            st,
            o,
            Phase::Failed,
            "PreflightFailed",
            format!("{msg} (spec.preflight.policy: Enforce)"),
        );
        return Preflight::Blocked;
    }
    Preflight::Go
}
