//! The rollout state machine: from what the cluster looks like now and what the
//! SafeRollout's status recorded so far, decide the next status and the
//! actions that bring the cluster one step closer to it.
//!
//! Pure: no API calls, no clock. The reconciler persists the returned status
//! FIRST and then performs the actions, so a crash between the two repeats an
//! idempotent action on restart instead of losing a plan or a baseline: every
//! action is derived again from status and the cluster on the next pass.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::apps::v1::DaemonSetUpdateStrategy;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use saferollout_api::{
    BlockedRevision, GateResult, GateStatus, Phase, PreflightPolicy, PreflightStatus,
    RETRY_ANNOTATION, SafeRolloutSpec, SafeRolloutStatus, StageState, StageStatus, resolve_count,
};

use crate::conditions::{self, DEGRADED, PREFLIGHT_PASSED, PROGRESSING, READY};

/// Annotation a person sets to revert a rollout now; the value is the target revision.
pub const ABORT_ANNOTATION: &str = "saferollout.dev/abort";
use crate::gates::{self, AgentPod, NodeState, Snapshot};
use crate::plan::{self, Candidate};

/// What the reconciler observed of the target DaemonSet.
#[derive(Debug, Clone, Default)]
pub struct DaemonSetView {
    pub generation: i64,
    pub observed_generation: i64,
    pub update_strategy: Option<DaemonSetUpdateStrategy>,
    /// `controller-revision-hash` of the DaemonSet's current template (its newest ControllerRevision).
    pub current_revision: Option<String>,
    /// Every revision the DaemonSet still has a ControllerRevision for.
    pub known_revisions: BTreeSet<String>,
}

impl DaemonSetView {
    pub fn is_on_delete(&self) -> bool {
        self.update_strategy
            .as_ref()
            .and_then(|s| s.type_.as_deref())
            == Some("OnDelete")
    }
}

/// Everything the machine decides from.
#[derive(Debug, Clone)]
pub struct Observed<'a> {
    pub spec: &'a SafeRolloutSpec,
    pub generation: Option<i64>,
    pub status: &'a SafeRolloutStatus,
    /// `saferollout.dev/retry` annotation value.
    pub retry: Option<&'a str>,
    /// `saferollout.dev/approve` annotation value (a stage index).
    pub approve: Option<&'a str>,
    /// `saferollout.dev/abort` annotation value (a target revision to revert now).
    pub abort: Option<&'a str>,
    /// Preflight results computed now for the DaemonSet's current revision, if asked.
    pub preflight: Option<&'a PreflightStatus>,
    /// `None` when the target DaemonSet does not exist.
    pub daemonset: Option<&'a DaemonSetView>,
    /// Hash of `spec.template` (GitOps mode), `None` in DaemonSet-edit mode.
    pub spec_template_hash: Option<&'a str>,
    /// The DaemonSet's template already equals `spec.template` (a server-side
    /// dry run of the write changed nothing): adopt it without a rollout.
    pub spec_template_in_place: bool,
    /// The revision our last-good backup holds, if the backup exists.
    pub backup_revision: Option<&'a str>,
    /// Agent pods by node.
    pub pods: &'a BTreeMap<String, Vec<AgentPod>>,
    /// Every node that exists, by name, with zone and canary eligibility.
    pub nodes: &'a BTreeMap<String, NodeInfo>,
    /// Nodes carrying this rollout's stage label now.
    pub labelled_nodes: &'a BTreeSet<String>,
    /// Resources the allocatable gates watch (for baselines).
    pub gated_resources: &'a [String],
    pub now: Timestamp,
}

/// A node as the machine needs it.
#[derive(Debug, Clone, Default)]
pub struct NodeInfo {
    pub zone: Option<String>,
    pub canary_eligible: bool,
    pub state: NodeState,
}

/// A change to the cluster, performed after the status is written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Set the DaemonSet's update strategy to OnDelete.
    TakeOverUpdates,
    /// Copy the DaemonSet's template of `revision` into the last-good backup.
    BackupTemplate { revision: String },
    /// Write `spec.template` (annotated with its hash) to the DaemonSet.
    ApplySpecTemplate,
    /// Write the last-good backup's template back to the DaemonSet.
    RestoreLastGood,
    /// Label nodes as taken by `stage`.
    LabelNodes { nodes: Vec<String>, stage: usize },
    /// Remove this rollout's labels from these nodes.
    UnlabelNodes { nodes: Vec<String> },
    /// Delete these agent pods (name, node) so the DaemonSet controller recreates them.
    DeletePods { pods: Vec<(String, String)> },
    Event {
        warning: bool,
        reason: String,
        message: String,
    },
}

/// The machine's answer.
#[derive(Debug, Clone)]
pub struct Decision {
    pub status: SafeRolloutStatus,
    pub actions: Vec<Action>,
    /// Reconcile again after this long even if nothing changes (soak and deadline timers).
    pub requeue_after: Option<Duration>,
}

/// Why nothing can proceed, as a condition reason and message.
fn stalled(st: &mut SafeRolloutStatus, o: &Observed, phase: Phase, reason: &str, message: String) {
    set_stalled(st, phase, reason, message, o.generation, o.now);
}

/// Nothing proceeds: `phase`, and Ready and Progressing False with `reason`.
pub fn set_stalled(
    st: &mut SafeRolloutStatus,
    phase: Phase,
    reason: &str,
    message: String,
    generation: Option<i64>,
    now: Timestamp,
) {
    st.phase = Some(phase);
    st.message = Some(message.clone());
    conditions::set(
        &mut st.conditions,
        READY,
        false,
        reason,
        message.clone(),
        generation,
        now,
    );
    conditions::set(
        &mut st.conditions,
        PROGRESSING,
        false,
        reason,
        message,
        generation,
        now,
    );
}

/// Every node runs `stable`, the rollout is done: Ready, idle, not degraded.
fn set_succeeded(
    st: &mut SafeRolloutStatus,
    message: String,
    generation: Option<i64>,
    now: Timestamp,
) {
    st.phase = Some(Phase::Succeeded);
    st.message = Some(message.clone());
    conditions::set(
        &mut st.conditions,
        READY,
        true,
        "Succeeded",
        message.clone(),
        generation,
        now,
    );
    conditions::set(
        &mut st.conditions,
        PROGRESSING,
        false,
        "Idle",
        message,
        generation,
        now,
    );
    conditions::set(
        &mut st.conditions,
        DEGRADED,
        false,
        "Healthy",
        "",
        generation,
        now,
    );
}

fn event(actions: &mut Vec<Action>, warning: bool, reason: &str, message: impl Into<String>) {
    actions.push(Action::Event {
        warning,
        reason: reason.into(),
        message: message.into(),
    });
}

pub fn is_blocked(st: &SafeRolloutStatus, revision: &str) -> bool {
    st.blocked_revisions.iter().any(|b| b.revision == revision)
}

fn is_source_blocked(st: &SafeRolloutStatus, source: &str) -> bool {
    st.blocked_revisions
        .iter()
        .any(|b| b.template_hash.as_deref() == Some(source))
}

/// The pods of all nodes whose agent is not of `revision` (and not already going away).
fn pods_not_on(pods: &BTreeMap<String, Vec<AgentPod>>, revision: &str) -> Vec<(String, String)> {
    pods.values()
        .flatten()
        .filter(|p| !p.deleting && p.revision != revision)
        .map(|p| (p.name.clone(), p.node.clone()))
        .collect()
}

/// Every node runs exactly one live agent pod of `revision`, Ready.
fn converged_on(pods: &BTreeMap<String, Vec<AgentPod>>, revision: &str) -> bool {
    pods.values().all(|ps| {
        let live: Vec<_> = ps.iter().filter(|p| !p.deleting).collect();
        ps.iter().all(|p| !p.deleting)
            && live.len() == 1
            && live[0].revision == revision
            && live[0].ready
    })
}

pub fn decide(o: &Observed) -> Decision {
    let mut st = o.status.clone();
    let mut actions = Vec::new();
    st.observed_generation = o.generation;
    let requeue_after = step(o, &mut st, &mut actions);
    Decision {
        status: st,
        actions,
        requeue_after,
    }
}

fn step(o: &Observed, st: &mut SafeRolloutStatus, actions: &mut Vec<Action>) -> Option<Duration> {
    let Some(ds) = o.daemonset else {
        stalled(
            st,
            o,
            Phase::Pending,
            "TargetNotFound",
            format!(
                "DaemonSet {:?} not found in this namespace",
                o.spec.target_ref.name
            ),
        );
        return None; // the DaemonSet watch wakes us when it appears
    };

    // 1. Take over the DaemonSet's updates, remembering how it was set.
    if st.original_update_strategy.is_none() {
        st.original_update_strategy = ds
            .update_strategy
            .clone()
            .or_else(|| Some(Default::default()));
    }
    if !ds.is_on_delete() {
        actions.push(Action::TakeOverUpdates);
        // Every DaemonSet write is guarded by its generation, so a successful
        // one produces exactly the next generation.
        st.daemon_set_generation = Some(ds.generation + 1);
        stalled(
            st,
            o,
            Phase::Pending,
            "TakingOver",
            "setting the DaemonSet's updateStrategy to OnDelete".into(),
        );
        return None;
    }
    if st.daemon_set_generation.is_some_and(|g| g > ds.generation) {
        // Our last write never landed (crash between status and write, or a
        // cache that lags): forget it, so it is decided again.
        st.applied_template_hash = None;
        st.daemon_set_generation = Some(ds.generation);
    }
    let Some(current) = ds
        .current_revision
        .as_deref()
        .filter(|_| ds.observed_generation >= ds.generation)
    else {
        // A rollout or revert in flight stays in its phase while the DaemonSet controller catches up.
        let phase = match &st.phase {
            Some(p @ (Phase::Progressing | Phase::RollingBack)) => *p,
            _ => Phase::Pending,
        };
        stalled(
            st,
            o,
            phase,
            "WaitingForDaemonSet",
            "waiting for the DaemonSet controller".into(),
        );
        return None;
    };

    // 2. Know the last good template before anything changes.
    let stable = match st.stable_revision.clone() {
        Some(s) => s,
        None => {
            let adopted = adopt_stable(o.pods, current);
            st.stable_revision = Some(adopted.clone());
            adopted
        }
    };
    if o.backup_revision != Some(stable.as_str()) && ds.known_revisions.contains(&stable) {
        actions.push(Action::BackupTemplate {
            revision: stable.clone(),
        });
    }
    if o.backup_revision.is_none() && !ds.known_revisions.contains(&stable) {
        stalled(
            st,
            o,
            Phase::Failed,
            "NoLastGoodTemplate",
            format!(
                "the DaemonSet no longer has revision {stable} and no backup exists; refusing to change anything"
            ),
        );
        return None;
    }

    // 3. A person asked to retry a blocked revision.
    if let Some(retry) = o.retry
        && st.last_retry.as_deref() != Some(retry)
    {
        st.last_retry = Some(retry.to_string());
        let before = st.blocked_revisions.len();
        let unblocked_sources: Vec<String> = st
            .blocked_revisions
            .iter()
            .filter(|b| b.revision == retry || b.template_hash.as_deref() == Some(retry))
            .filter_map(|b| b.template_hash.clone())
            .collect();
        st.blocked_revisions
            .retain(|b| b.revision != retry && b.template_hash.as_deref() != Some(retry));
        if st
            .applied_template_hash
            .as_ref()
            .is_some_and(|h| unblocked_sources.contains(h))
        {
            // Apply that spec.template again.
            st.applied_template_hash = None;
        }
        if st.blocked_revisions.len() != before {
            event(
                actions,
                false,
                "RetryRequested",
                format!("revision {retry} unblocked by the retry annotation"),
            );
        }
    }

    // 4. GitOps mode: spec.template is the desired template, and the operator
    // is the only writer of the DaemonSet's template.
    let known = current == stable || st.target_revision.as_deref() == Some(current);
    if o.spec_template_hash.is_some() && st.daemon_set_generation != Some(ds.generation) {
        if known || st.daemon_set_generation.is_none() {
            // A change outside the template (or a first look): accept it.
            st.daemon_set_generation = Some(ds.generation);
        } else {
            stalled(
                st,
                o,
                Phase::Paused,
                "TemplateConflict",
                format!(
                    "the DaemonSet's template was changed outside the SafeRollout (revision {current}); \
                     revert that edit or delete the SafeRollout: nothing was overwritten"
                ),
            );
            return None;
        }
    }
    if let Some(want) = o.spec_template_hash
        && st.applied_template_hash.as_deref() != Some(want)
        && !is_source_blocked(st, want)
    {
        st.applied_template_hash = Some(want.to_string());
        // Already on the DaemonSet (first adoption, or Git caught up with a
        // change made there): adopt it as it is, no write and no rollout.
        if !o.spec_template_in_place {
            // A new spec.template, not on the DaemonSet yet: write it (once).
            actions.push(Action::ApplySpecTemplate);
            st.daemon_set_generation = Some(ds.generation + 1);
            st.target_revision = None;
            st.current_stage = None;
            st.stages.clear();
            stalled(
                st,
                o,
                Phase::Progressing,
                "ApplyingTemplate",
                "writing spec.template to the DaemonSet".into(),
            );
            conditions::set(
                &mut st.conditions,
                PROGRESSING,
                true,
                "ApplyingTemplate",
                "writing spec.template to the DaemonSet",
                o.generation,
                o.now,
            );
            return None;
        }
    }
    if current == stable {
        return settle(o, st, actions, &stable);
    }
    if is_blocked(st, current) {
        // A blocked revision is on the DaemonSet: written again by a person or
        // Helm, or left by a crash mid-revert. Never roll it; restore the last good.
        restore_last_good(o, st, actions);
        let msg = format!(
            "revision {current} is blocked (retry with the {RETRY_ANNOTATION} annotation); restoring {stable}"
        );
        stalled(st, o, Phase::Degraded, "BlockedRevision", msg);
        return None;
    }
    roll(o, st, actions, current)
}

/// Writes the last good template back; the guarded write yields the next generation.
fn restore_last_good(o: &Observed, st: &mut SafeRolloutStatus, actions: &mut Vec<Action>) {
    actions.push(Action::RestoreLastGood);
    if let Some(ds) = o.daemonset {
        st.daemon_set_generation = Some(ds.generation + 1);
    }
}

/// The revision most agent pods run: the stable one when first adopting a DaemonSet.
fn adopt_stable(pods: &BTreeMap<String, Vec<AgentPod>>, current: &str) -> String {
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for p in pods.values().flatten().filter(|p| !p.deleting) {
        *counts.entry(p.revision.as_str()).or_default() += 1;
    }
    let best = counts
        .iter()
        .max_by_key(|(rev, n)| (**n, *rev == &current))
        .map(|(r, _)| r.to_string());
    best.unwrap_or_else(|| current.to_string())
}

/// The DaemonSet's template is the stable one: converge every node on it (after
/// a revert or an abandoned rollout), then rest.
fn settle(
    o: &Observed,
    st: &mut SafeRolloutStatus,
    actions: &mut Vec<Action>,
    stable: &str,
) -> Option<Duration> {
    let now = o.now;
    let reverted = st
        .target_revision
        .as_deref()
        .is_some_and(|t| t != stable && is_blocked(st, t));
    let off = pods_not_on(o.pods, stable);
    if !off.is_empty() {
        // Every node that got a bad or abandoned revision is replaced at once:
        // they are not serving anyway, and waiting only prolongs the outage.
        actions.push(Action::DeletePods { pods: off });
    }
    if !converged_on(o.pods, stable) {
        let msg = if reverted {
            format!("reverting to revision {stable}")
        } else {
            format!("bringing every node back to revision {stable}")
        };
        st.phase = Some(if reverted {
            Phase::RollingBack
        } else {
            Phase::Progressing
        });
        st.message = Some(msg.clone());
        let cs = &mut st.conditions;
        conditions::set(
            cs,
            PROGRESSING,
            true,
            "RollingBack",
            msg.clone(),
            o.generation,
            now,
        );
        conditions::set(cs, READY, false, "RollingBack", msg, o.generation, now);
        return None; // pod events wake us
    }
    if !o.labelled_nodes.is_empty() {
        actions.push(Action::UnlabelNodes {
            nodes: o.labelled_nodes.iter().cloned().collect(),
        });
    }
    let cs = &mut st.conditions;
    if reverted {
        let target = st.target_revision.clone().unwrap_or_default();
        let reason = st
            .blocked_revisions
            .iter()
            .find(|b| b.revision == target)
            .map(|b| b.message.clone())
            .unwrap_or_default();
        if st.phase != Some(Phase::Degraded) {
            event(
                actions,
                true,
                "RolledBack",
                format!("every node is back on revision {stable}"),
            );
        }
        let msg =
            format!("revision {target} was reverted; every node runs revision {stable}: {reason}");
        st.phase = Some(Phase::Degraded);
        st.message = Some(msg.clone());
        conditions::set(
            cs,
            PROGRESSING,
            false,
            "RolledBack",
            msg.clone(),
            o.generation,
            now,
        );
        conditions::set(cs, READY, false, "RolledBack", msg, o.generation, now);
        // Degraded stays True (set when the gate failed) until a new revision or a retry.
    } else {
        set_succeeded(
            st,
            format!("every node runs revision {stable}"),
            o.generation,
            now,
        );
    }
    None
}

/// Take `target` through the stages.
fn roll(
    o: &Observed,
    st: &mut SafeRolloutStatus,
    actions: &mut Vec<Action>,
    target: &str,
) -> Option<Duration> {
    let now = o.now;
    // A new revision, or one tried before and unblocked by a retry: start over.
    let retried = st.stages.iter().any(|s| s.state == StageState::Failed);
    if st.target_revision.as_deref() != Some(target) || retried {
        st.target_revision = Some(target.to_string());
        st.current_stage = Some(0);
        st.stages.clear();
        event(
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
            now,
        );
    }
    if o.spec.paused && o.abort != Some(target) {
        let msg = format!("paused by spec.paused while rolling out revision {target}");
        stalled(st, o, Phase::Paused, "Paused", msg);
        return None;
    }

    if preflight_blocks(o, st, actions, target) {
        return None;
    }

    let stage_specs = o.spec.effective_stages();
    // The schema rejects malformed durations; a default stands in for one that slipped through.
    let progress_deadline = o
        .spec
        .progress_deadline_duration()
        .unwrap_or(Duration::from_secs(600));
    let index = st.current_stage.unwrap_or(0) as usize;
    let index = index.min(stage_specs.len().saturating_sub(1));
    let stage_spec = &stage_specs[index];
    let stages = &mut st.stages;

    // Plan the stage: nodes and baselines are written to status before any node is touched.
    if stages.len() <= index {
        // Nodes of earlier stages count, unless they have left the cluster.
        let taken: BTreeSet<String> = stages
            .iter()
            .flat_map(|s| s.nodes.iter().cloned())
            .filter(|n| o.nodes.contains_key(n))
            .collect();
        let candidates: Vec<Candidate> = o
            .pods
            .iter()
            .filter(|(_, ps)| ps.iter().any(|p| !p.deleting))
            .filter_map(|(node, ps)| {
                let info = o.nodes.get(node)?;
                Some(Candidate {
                    name: node.clone(),
                    zone: info.zone.clone(),
                    canary_eligible: info.canary_eligible,
                    on_target: ps.iter().any(|p| !p.deleting && p.revision == target),
                })
            })
            .collect();
        let wanted = resolve_count(&stage_spec.nodes, candidates.len(), true).unwrap_or(1);
        let size = plan::cumulative_target(wanted, candidates.len());
        let picked = match plan::plan_stage(&candidates, &taken, size, index == 0) {
            Ok(p) => p,
            Err(e) => {
                stalled(st, o, Phase::Failed, "NoEligibleNodes", e.to_string());
                return None;
            }
        };
        let baseline: BTreeMap<String, BTreeMap<String, i64>> = picked
            .iter()
            .map(|n| {
                let alloc = &o.nodes[n].state.allocatable;
                let per_res = o
                    .gated_resources
                    .iter()
                    .map(|r| (r.clone(), alloc.get(r).copied().unwrap_or(0)))
                    .collect();
                (n.clone(), per_res)
            })
            .collect();
        event(
            actions,
            false,
            "StageStarted",
            format!(
                "stage {} of {}: {} node(s): {}",
                index + 1,
                stage_specs.len(),
                picked.len(),
                picked.join(", ")
            ),
        );
        actions.push(Action::LabelNodes {
            nodes: picked.clone(),
            stage: index,
        });
        stages.push(StageStatus {
            index: index as i32,
            nodes: picked,
            state: StageState::Replacing,
            started_at: Some(Time(now)),
            baseline,
            ..Default::default()
        });
    }

    // Nodes of this stage and all earlier ones that still exist.
    let rollout_nodes: Vec<String> = stages
        .iter()
        .take(index + 1)
        .flat_map(|s| s.nodes.iter().cloned())
        .filter(|n| o.nodes.contains_key(n))
        .collect();
    let baseline: BTreeMap<String, BTreeMap<String, i64>> = stages
        .iter()
        .take(index + 1)
        .flat_map(|s| s.baseline.clone())
        .collect();
    let stage = &mut stages[index];
    let stage_started = stage.started_at.as_ref().map(|t| t.0).unwrap_or(now);

    // Replace old pods, at most maxUnavailable nodes down at a time.
    let in_flight = rollout_nodes
        .iter()
        .filter(|n| {
            let ps = o.pods.get(*n).map(Vec::as_slice).unwrap_or_default();
            let live: Vec<_> = ps.iter().filter(|p| !p.deleting).collect();
            let replaced_ok = live.iter().any(|p| p.revision == target && p.ready);
            let untouched =
                live.iter().any(|p| p.revision != target) && !ps.iter().any(|p| p.deleting);
            !replaced_ok && !untouched
        })
        .count();
    let max_unavailable = resolve_count(&o.spec.max_unavailable, stage.nodes.len().max(1), false);
    let budget = max_unavailable
        .unwrap_or(1)
        .max(1)
        .saturating_sub(in_flight);
    let mut to_delete: Vec<(String, String)> = rollout_nodes
        .iter()
        .filter_map(|n| o.pods.get(n))
        .flatten()
        .filter(|p| !p.deleting && p.revision != target)
        .map(|p| (p.name.clone(), p.node.clone()))
        .collect();
    let waiting_to_replace = to_delete.len();
    to_delete.truncate(budget);
    if !to_delete.is_empty() {
        actions.push(Action::DeletePods {
            pods: to_delete.clone(),
        });
    }

    // Judge.
    let snapshot = Snapshot {
        nodes: &rollout_nodes,
        pods: o.pods,
        node_states: &o
            .nodes
            .iter()
            .map(|(k, v)| (k.clone(), v.state.clone()))
            .collect(),
        target_revision: target,
        baseline: &baseline,
        stage_started,
        progress_deadline,
        now,
    };
    let results = gates::evaluate_all(o.spec, &snapshot, &stage.gates);
    let aborted = (o.abort == Some(target)).then(|| GateResult {
        gate: "manual".into(),
        status: GateStatus::Failed,
        reason: "Aborted".into(),
        message: format!("aborted by a person ({ABORT_ANNOTATION}={target})"),
        ..Default::default()
    });
    let failure = aborted.or_else(|| gates::first_failure(&results).cloned());
    let passed = gates::all_passed(&results) && waiting_to_replace == 0;
    let next_soak_check = results
        .iter()
        .filter(|g| g.status == GateStatus::Pending)
        .filter_map(|g| g.since.as_ref().map(|s| s.0))
        .map(|since| gates::elapsed(since, now))
        .min();
    stage.gates = results;

    if let Some(f) = failure {
        let node = f.node.clone().unwrap_or_default();
        let detail = match (&f.observed, &f.expected) {
            (Some(obs), Some(exp)) if !f.message.contains(exp.as_str()) => {
                format!(" (observed {obs}, expected {exp})")
            }
            _ => String::new(),
        };
        let message = format!(
            "gate {} failed on node {node}: {}{detail}",
            f.gate, f.message
        );
        stage.state = StageState::Failed;
        st.blocked_revisions.push(BlockedRevision {
            revision: target.to_string(),
            template_hash: o.spec_template_hash.and(st.applied_template_hash.clone()),
            reason: f.reason.clone(),
            message: message.clone(),
            blocked_at: Time(now),
        });
        st.phase = Some(Phase::RollingBack);
        st.message = Some(message.clone());
        let cs = &mut st.conditions;
        conditions::set(
            cs,
            DEGRADED,
            true,
            &format!("{}Failed", gate_reason(&f.gate)),
            message.clone(),
            o.generation,
            now,
        );
        conditions::set(
            cs,
            PROGRESSING,
            true,
            "RollingBack",
            format!("reverting revision {target}"),
            o.generation,
            now,
        );
        conditions::set(
            cs,
            READY,
            false,
            "RollingBack",
            message.clone(),
            o.generation,
            now,
        );
        event(actions, true, "GateFailed", message);
        restore_last_good(o, st, actions);
        return None;
    }

    let cs = &mut st.conditions;
    let progress_msg = format!(
        "stage {} of {}: rolling out revision {target}",
        index + 1,
        stage_specs.len()
    );
    conditions::set(
        cs,
        PROGRESSING,
        true,
        "RollingOut",
        progress_msg.clone(),
        o.generation,
        now,
    );
    conditions::set(
        cs,
        READY,
        false,
        "RollingOut",
        progress_msg.clone(),
        o.generation,
        now,
    );
    st.phase = Some(Phase::Progressing);
    st.message = Some(progress_msg);

    if !passed {
        stage.state = if waiting_to_replace > 0 {
            StageState::Replacing
        } else {
            StageState::Verifying
        };
        stage.verified_at = None;
        // Wake for the deadline, or when a soaking gate may have soaked.
        let to_deadline = progress_deadline.saturating_sub(gates::elapsed(stage_started, now));
        let soak_wake = next_soak_check.map(|_| Duration::from_secs(1));
        return Some(
            soak_wake
                .map_or(to_deadline, |s| s.min(to_deadline))
                .max(Duration::from_millis(500)),
        );
    }

    // Gates passed: soak the stage, maybe wait for approval, then go on.
    let verified_at = stage.verified_at.get_or_insert(Time(now)).clone();
    let soak = stage_spec.soak.to_std().unwrap_or_default();
    let soaked = gates::elapsed(verified_at.0, now);
    if soaked < soak {
        stage.state = StageState::Soaking;
        return Some(soak - soaked);
    }
    // An approval names the revision and the stage, so one left on the object
    // never approves a later rollout.
    let approval = approval_value(target, index);
    if stage_spec.pause && o.approve != Some(approval.as_str()) {
        stage.state = StageState::Paused;
        let msg = format!(
            "stage {} passed; waiting for approval (kubectl saferollout approve, or annotate saferollout.dev/approve={approval})",
            index + 1
        );
        st.phase = Some(Phase::Paused);
        st.message = Some(msg.clone());
        conditions::set(
            cs,
            PROGRESSING,
            true,
            "AwaitingApproval",
            msg,
            o.generation,
            now,
        );
        return None;
    }
    stage.state = StageState::Passed;
    event(
        actions,
        false,
        "StagePassed",
        format!("stage {} of {} passed", index + 1, stage_specs.len()),
    );
    if index + 1 < stage_specs.len() {
        st.current_stage = Some(index as i32 + 1);
        return Some(Duration::ZERO);
    }

    // Every stage passed: the target is the new last good revision.
    st.stable_revision = Some(target.to_string());
    st.current_stage = None;
    actions.push(Action::BackupTemplate {
        revision: target.to_string(),
    });
    let labelled: Vec<String> = o.labelled_nodes.iter().cloned().collect();
    if !labelled.is_empty() {
        actions.push(Action::UnlabelNodes { nodes: labelled });
    }
    let msg = format!("revision {target} rolled out to every node");
    set_succeeded(st, msg.clone(), o.generation, now);
    event(actions, false, "RolloutSucceeded", msg);
    None
}

/// The `saferollout.dev/approve` value that approves stage `index` of `revision`.
pub fn approval_value(revision: &str, index: usize) -> String {
    format!("{revision}:{index}")
}

/// Records preflight results for `target`; true when they block the rollout
/// (policy Enforce, an error finding, no stage started yet).
fn preflight_blocks(
    o: &Observed,
    st: &mut SafeRolloutStatus,
    actions: &mut Vec<Action>,
    target: &str,
) -> bool {
    let policy = o
        .spec
        .preflight
        .as_ref()
        .map(|p| p.policy)
        .unwrap_or_default();
    if policy == PreflightPolicy::Skip {
        return false;
    }
    if let Some(fresh) = o.preflight.filter(|p| p.revision == target) {
        st.preflight = Some(fresh.clone());
    }
    let Some(p) = st.preflight.as_ref().filter(|p| p.revision == target) else {
        return false;
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
            event(actions, true, "PreflightFailed", msg.clone());
        }
        stalled(
            st,
            o,
            Phase::Failed,
            "PreflightFailed",
            format!("{msg} (spec.preflight.policy: Enforce)"),
        );
    }
    blocked
}

/// `allocatable/nvidia.com/gpu` -> `Allocatable`, `podsReady` -> `PodsReady`: condition reasons are CamelCase words.
fn gate_reason(gate: &str) -> String {
    let base = gate.split('/').next().unwrap_or(gate);
    let mut chars = base.chars();
    chars
        .next()
        .map(|c| c.to_ascii_uppercase().to_string() + chars.as_str())
        .unwrap_or_default()
}

#[cfg(test)]
#[path = "rollout_tests.rs"]
mod tests;
