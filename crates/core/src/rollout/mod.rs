//! The rollout state machine: from what the cluster looks like now and what the
//! SafeRollout's status recorded so far, decide the next status and the
//! actions that bring the cluster one step closer to it.
//!
//! Pure: no API calls, no clock. The reconciler persists the returned status
//! FIRST and then performs the actions. Every action is derived again, on each
//! pass, from status and the cluster (labels a stage's nodes should carry,
//! pods still on another revision, a template still to restore), so a crash or
//! a lost write at any point repeats an idempotent action or waits for what is
//! missing; nothing is remembered only in memory and nothing is predicted.
//!
//! One pass, in order ([`decide`]):
//! 1. refuse a DaemonSet another SafeRollout owns; report a missing one;
//! 2. take over the DaemonSet's updates (`OnDelete`);
//! 3. know which revision the DaemonSet is on (by template content) and back
//!    up the stable one before anything changes;
//! 4. apply a retry request, then `spec.template` (GitOps mode);
//! 5. then one of: converge every node on the stable revision ([`settle`]),
//!    restore the stable template over a blocked revision, or take the new
//!    revision through its stages ([`stage`]).
//!
//! Safety rules every path keeps (the property tests check them on random
//! interleavings, `tests/properties.rs` in this module):
//! - at most `maxUnavailable` of the rollout's agents are missing or not Ready
//!   because of the operator ([`replace`]); nodes whose agent itself failed a
//!   gate are the one exception, and are reverted at once;
//! - a pod is deleted only on a node the DaemonSet controller will refill
//!   ([`crate::eligibility`]);
//! - no stage passes without judging every node it holds, and a gate that
//!   judged nothing has not passed;
//! - a blocked revision is never rolled, and the last good template is backed
//!   up before anything changes.

mod breaker;
mod devices;
mod gitops;
mod maintenance;
mod phase;
mod replace;
mod settle;
mod stage;

#[cfg(test)]
mod fleet_tests;
#[cfg(test)]
mod lifecycle_tests;
#[cfg(test)]
mod maintenance_tests;
#[cfg(test)]
mod model;
#[cfg(test)]
mod owner_tests;
#[cfg(test)]
mod properties;
#[cfg(test)]
mod selector_tests;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use saferollout_api::{
    PreflightStatus, RETRY_ANNOTATION, SafeRolloutSpec, SafeRolloutStatus, resolve_count,
};

use crate::eligibility::eligibility;
use crate::views::{AgentPod, DaemonSetView, NodesByName, PodsByNode};

pub use devices::{
    NodeTaint, QuarantineRule, probe_name, quarantined_nodes, rule_name, taint_key, taint_value,
};
pub use maintenance::{DRAIN_BLOCKED, DRAIN_TIMED_OUT, DRAINING, EvictRef};
pub use phase::{CACHE_STALE, StaleCache, hold_for_stale_caches, set_stalled};

/// Requests a person made through annotations on the SafeRollout.
#[derive(Debug, Clone, Copy, Default)]
pub struct Requests<'a> {
    /// `saferollout.dev/retry`: a revision (or spec.template hash) to unblock.
    pub retry: Option<&'a str>,
    /// `saferollout.dev/approve`: `<revision>:<stage index>`.
    pub approve: Option<&'a str>,
    /// `saferollout.dev/abort`: a target revision to revert now.
    pub abort: Option<&'a str>,
}

/// `spec.template` (GitOps mode), as the reconciler found it.
#[derive(Debug, Clone, Copy)]
pub struct SpecTemplate<'a> {
    /// Hash of `spec.template` ([`crate::revision::template_hash`]).
    pub hash: &'a str,
    /// The DaemonSet's template already equals `spec.template` once the API
    /// server has defaulted it (a server-side dry run of the write changed
    /// nothing).
    pub in_place: bool,
}

/// Everything the machine decides from.
#[derive(Debug, Clone)]
pub struct Observed<'a> {
    pub spec: &'a SafeRolloutSpec,
    pub generation: Option<i64>,
    pub status: &'a SafeRolloutStatus,
    pub requests: Requests<'a>,
    /// The older SafeRollout (by name) that already targets the same
    /// DaemonSet: then this one touches nothing.
    pub owned_by_other: Option<&'a str>,
    /// Preflight results computed now for the DaemonSet's current revision, if asked.
    pub preflight: Option<&'a PreflightStatus>,
    /// `None` when the target DaemonSet does not exist.
    pub daemonset: Option<&'a DaemonSetView<'a>>,
    /// `None` in DaemonSet-edit mode.
    pub spec_template: Option<SpecTemplate<'a>>,
    /// This SafeRollout's name (its backups are named after it).
    pub name: &'a str,
    /// Our last-good backup of the stable revision as status names it
    /// (`<name>-last-good-<revision>`, owned by this SafeRollout), if it
    /// exists.
    pub backup: Option<BackupView<'a>>,
    /// The content hash ([`crate::revision::content_hash`]) of the template
    /// of each revision the DaemonSet has a ControllerRevision for, by
    /// revision: what a backup of that revision must hold.
    pub revision_contents: &'a BTreeMap<String, String>,
    /// The DaemonSet's agent pods, by node.
    pub pods: &'a PodsByNode<'a>,
    /// Every node of the cluster, by name.
    pub nodes: &'a NodesByName<'a>,
    /// This SafeRollout's value of the `saferollout.dev/rollout` node label.
    pub rollout_id: &'a str,
    /// What the gates beyond podsReady and allocatable observe.
    pub evidence: &'a crate::gates::Evidence<'a>,
    /// What the operator's administrator lets SafeRollouts ask for.
    pub limits: &'a crate::limits::AdminLimits,
    pub now: Timestamp,
    /// When the stalest cache this pass reads last heard from the API
    /// server (an event or a watch bookmark); `None`: as of `now`.
    pub caches_heard_at: Option<Timestamp>,
    /// The SafeRolloutPolicies governing this rollout; `None`: none does
    /// (then `status.disruptedNodes` and the `Waiting` condition are not
    /// kept).
    pub fleet: Option<&'a crate::fleet::Fleet<'a>>,
    /// Under `spec.ownerRevert`, for a DaemonSet its owner wrote: how to
    /// revert from its current template to the last good one through the
    /// owner's custom resource ([`crate::owner::revert_plan`]), or why that
    /// cannot be. `None`: no `spec.ownerRevert`, or not owned.
    pub owner_revert: Option<&'a Result<crate::owner::OwnerRevertPlan, String>>,
    /// The GitOps tool that manages the owner `spec.ownerRevert` names
    /// ([`crate::owner::gitops_manager`]): a revert written there would be
    /// undone at its next sync, so the rollout halts, saying what to revert
    /// in Git.
    pub owner_gitops: Option<&'a str>,
}

impl Observed<'_> {
    /// Up to when the caches vouch for what this pass sees.
    pub fn vouched_until(&self) -> Timestamp {
        self.caches_heard_at.map_or(self.now, |h| h.min(self.now))
    }
}

/// A last-good backup ControllerRevision as found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BackupView<'a> {
    pub name: &'a str,
    /// The revision its label says it holds.
    pub revision: &'a str,
    /// The content hash of the template it holds (`None`: it holds none).
    pub content: Option<&'a str>,
}

/// The name of the last-good backup of `revision` for SafeRollout `name`.
pub fn backup_name(name: &str, revision: &str) -> String {
    format!("{name}-last-good-{revision}")
}

/// A pod to delete; the UID is a precondition of the delete, so a pod the
/// DaemonSet controller has already recreated under the same name is never
/// deleted by a stale decision.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct PodRef {
    pub name: String,
    pub uid: String,
    pub node: String,
    /// Also a precondition when set: the pod is deleted only if it has not
    /// changed since the decision saw it. Set on deletions the budget did not
    /// pay for because the pod was not Ready: if it became Ready meanwhile
    /// (the cache lagged), deleting it would disrupt a serving agent unpaid.
    pub unchanged_since: Option<String>,
}

impl PodRef {
    fn of(p: &AgentPod, paid: bool) -> Self {
        PodRef {
            name: p.name.to_string(),
            uid: p.uid.to_string(),
            node: p.node.to_string(),
            unchanged_since: (!paid).then(|| p.resource_version.to_string()),
        }
    }
}

/// A change to the cluster, performed after the status is written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Set the DaemonSet's update strategy to OnDelete.
    TakeOverUpdates,
    /// Copy the DaemonSet's template of `revision` into the last-good backup
    /// (its content hash is in `status.lastGoodTemplate` already). A backup
    /// that exists already under that name counts only if it holds that
    /// content.
    BackupTemplate { revision: String },
    /// Write `spec.template` to the DaemonSet.
    ApplySpecTemplate,
    /// Write the last-good backup's template back to the DaemonSet, only if
    /// it still hashes to `content` (what status recorded and this pass
    /// verified).
    RestoreLastGood { content: String },
    /// Label nodes as taken by `stage`.
    LabelNodes { nodes: Vec<String>, stage: usize },
    /// Remove this rollout's labels from these nodes.
    UnlabelNodes { nodes: Vec<String> },
    /// Delete these agent pods so the DaemonSet controller recreates them.
    DeletePods { pods: Vec<PodRef> },
    /// Create the claims probe of `node` ([`probe_name`]): a pod pinned to
    /// the node with a claim (for a DeviceClass probe, a ResourceClaim of the
    /// same name), owned by the SafeRollout; AlreadyExists is fine.
    CreateProbe {
        name: String,
        node: String,
        revision: String,
    },
    /// Delete claims probes (pods, and the claims made for them).
    DeleteProbes { names: Vec<String> },
    /// Take devices out of service: DeviceTaintRules (DRA), node taints
    /// (device plugins).
    Quarantine {
        rules: Vec<QuarantineRule>,
        taints: Vec<NodeTaint>,
    },
    /// Put them back: delete these rules (by name), remove these taints.
    LiftQuarantine {
        rules: Vec<String>,
        taints: Vec<NodeTaint>,
    },
    Event {
        warning: bool,
        reason: String,
        message: String,
    },
    /// Create these probe pods (their records are in status); one that
    /// exists already is fine.
    CreateProbePods {
        probes: Vec<crate::gates::probe::ProbeRequest>,
    },
    /// Delete these probe pods (judged, or their stage is over), by name
    /// with their UID as a precondition.
    DeleteProbePods { pods: Vec<(String, String)> },
    /// `spec.nodeMaintenance`: cordon these nodes and mark them as this
    /// rollout's ([`saferollout_api::MAINTENANCE_LABEL`]), in one write each.
    CordonNodes { nodes: Vec<String> },
    /// Uncordon these nodes and remove the mark, each only while the mark
    /// is this rollout's.
    UncordonNodes { nodes: Vec<String> },
    /// Evict these pods through the Eviction API (never a deletion), each
    /// only while its UID is the one seen; a refusal (a disruption budget)
    /// is remembered for the next pass's evidence.
    EvictPods { pods: Vec<EvictRef> },
    /// `spec.ownerRevert`: put the owner's version fields back (each only
    /// while it holds what made the failed template), for the owner to
    /// write the last good template again.
    RevertOwner { plan: crate::owner::OwnerRevertPlan },
}

/// The nodes whose agent pods `actions` delete.
pub(crate) fn nodes_deleted_on(actions: &[Action]) -> BTreeSet<&str> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::DeletePods { pods } => Some(pods.iter().map(|p| p.node.as_str())),
            _ => None,
        })
        .flatten()
        .collect()
}

/// The machine's answer.
#[derive(Debug, Clone)]
pub struct Decision {
    pub status: SafeRolloutStatus,
    pub actions: Vec<Action>,
    /// Reconcile again after this long even if nothing changes (soak and deadline timers).
    pub requeue_after: Option<Duration>,
    /// A deadline passed, but the caches last heard from the API server
    /// before it did: list again every cache of this rollout that has not
    /// heard since this instant, then judge (see [`Observed::caches_heard_at`]).
    pub refresh_caches_heard_before: Option<Timestamp>,
}

/// The `saferollout.dev/approve` value that approves stage `index` of `revision`.
pub fn approval_value(revision: &str, index: usize) -> String {
    format!("{revision}:{index}")
}

pub fn is_blocked(st: &SafeRolloutStatus, revision: &str) -> bool {
    st.blocked_revisions.iter().any(|b| b.revision == revision)
}

/// The stop that still holds while `revision` is rolled out (`None`: not
/// known, it holds): a stop of an older revision says nothing of a newer
/// template, which is a person acting.
pub(super) fn stop_in_force<'a>(
    st: &'a SafeRolloutStatus,
    revision: Option<&str>,
) -> Option<&'a saferollout_api::StoppedRollout> {
    st.stopped
        .as_ref()
        .filter(|s| revision.is_none_or(|r| r == s.revision))
}

fn is_source_blocked(st: &SafeRolloutStatus, source: &str) -> bool {
    st.blocked_revisions
        .iter()
        .any(|b| b.template_hash.as_deref() == Some(source))
}

/// One pass of the machine.
pub fn decide(o: &Observed) -> Decision {
    let mut st = o.status.clone();
    let mut actions = Vec::new();
    st.observed_generation = o.generation;
    let mut fleet = FleetPass::default();
    let requeue_after = step(o, &mut st, &mut actions, &mut fleet);
    if o.owned_by_other.is_none() {
        devices::sync(o, &st, &mut actions);
        maintenance::sync(o, &mut st, &mut actions, &fleet.violating);
    }
    probe_pods_alive_only(o, &st, &mut actions);
    record_fleet(o, &mut st, &actions, fleet);
    if st.phase != o.status.phase {
        st.phase_transition_time = Some(Time(o.now));
    }
    let refresh_caches_heard_before = refresh_caches_heard_before(o, &st);
    Decision {
        status: st,
        actions,
        requeue_after: match refresh_caches_heard_before {
            // Decided again once the caches listed again.
            Some(_) => Some(requeue_after.map_or(REFRESH_RECHECK, |r| r.min(REFRESH_RECHECK))),
            None => requeue_after,
        },
        refresh_caches_heard_before,
    }
}

/// How soon a pass that asked for its caches to list again looks again.
const REFRESH_RECHECK: Duration = Duration::from_secs(1);

/// What a pass learnt for the policies governing the rollout (see
/// [`record_fleet`]) and for its nodes in maintenance.
#[derive(Debug, Default)]
struct FleetPass {
    /// Why a policy held back nodes the stage wanted to replace.
    held: Option<crate::fleet::Held>,
    /// Nodes whose agent violates a gate (its violation soaking): failing,
    /// so disrupted, whatever their agent's readiness (and not uncordoned).
    violating: BTreeSet<String>,
}

/// Under a SafeRolloutPolicy: `status.disruptedNodes` (the nodes this
/// pass's deletions empty, and those the rollout holds whose agent does
/// not serve or fails a gate) and the `Waiting` condition. Without one,
/// both are cleared (a policy that stopped governing the rollout leaves
/// nothing behind that others would read).
fn record_fleet(o: &Observed, st: &mut SafeRolloutStatus, actions: &[Action], fleet: FleetPass) {
    if o.fleet.is_none() {
        st.disrupted_nodes.clear();
        st.conditions
            .retain(|c| c.type_ != crate::conditions::WAITING);
        return;
    }
    let mut disrupted = fleet.violating;
    let current = o.daemonset.and_then(|d| d.current_revision);
    let in_force = stop_in_force(st, current);
    // The nodes an older stop failed, once a newer template is rolled:
    // out of service (below), even while they stay cordoned.
    let stopped_before: BTreeSet<&str> = st
        .stopped
        .iter()
        .filter(|_| in_force.is_none())
        .flat_map(|s| s.nodes.iter().map(String::as_str))
        .collect();
    // A node in maintenance takes no workload: disrupted from its cordon
    // to its uncordon.
    disrupted.extend(
        st.node_maintenance
            .iter()
            .filter(|e| !stopped_before.contains(e.node.as_str()))
            .map(|e| e.node.clone()),
    );
    disrupted.extend(nodes_deleted_on(actions).into_iter().map(str::to_string));
    let target = st.target_revision.as_deref();
    let held = st
        .stages
        .iter()
        .filter(|_| target.is_some())
        .flat_map(|s| s.nodes.iter().chain(&s.failed_nodes))
        .chain(&st.converging_nodes);
    // A stopped rollout's failed nodes fail until someone acts, whatever
    // their agent's readiness (a plugin Ready with 0 devices). Once a newer
    // template is rolled (someone acted), a node the stop quarantined is
    // out of service, as a cordoned one, and holds no budget: counting it
    // would let an old stop hold every later release of the rollout.
    if let Some(stopped) = in_force {
        disrupted.extend(
            stopped
                .nodes
                .iter()
                .filter(|n| o.nodes.contains_key(n.as_str()))
                .cloned(),
        );
    }
    for node in held {
        if o.nodes.contains_key(node.as_str()) && !replace::is_available(o.pods, node) {
            disrupted.insert(node.clone());
        }
    }
    st.disrupted_nodes = disrupted.into_iter().collect();
    match fleet.held {
        Some(held) => crate::conditions::set(
            &mut st.conditions,
            crate::conditions::WAITING,
            true,
            held.reason,
            held.message,
            o.generation,
            o.now,
        ),
        None => crate::conditions::set(
            &mut st.conditions,
            crate::conditions::WAITING,
            false,
            "NotHeld",
            "no SafeRolloutPolicy holds this rollout back now",
            o.generation,
            o.now,
        ),
    }
}

fn step(
    o: &Observed,
    st: &mut SafeRolloutStatus,
    actions: &mut Vec<Action>,
    fleet: &mut FleetPass,
) -> Option<Duration> {
    if let Some(owner) = o.owned_by_other {
        phase::stalled(
            st,
            o,
            st.phase.unwrap_or_default(),
            "TargetConflict",
            format!(
                "DaemonSet {:?} is already rolled out by SafeRollout {owner:?} in this namespace; \
                 this one changes nothing while that one exists",
                o.spec.target_ref.name
            ),
        );
        return None;
    }
    let Some(ds) = o.daemonset else {
        phase::stalled(
            st,
            o,
            saferollout_api::Phase::Pending,
            "TargetNotFound",
            format!(
                "DaemonSet {:?} not found in this namespace",
                o.spec.target_ref.name
            ),
        );
        return None; // the DaemonSet watch wakes us when it appears
    };
    let refused = crate::limits::refusals(o.spec, o.limits, ds.placement.tolerations);
    if !refused.is_empty() && st.original_update_strategy.is_none() {
        // Never adopted: a refused SafeRollout touches nothing of the DaemonSet.
        refuse(o, st, &refused);
        return None;
    }
    if let Some(owner) = ds.owner
        && !owner_allows(o, st, actions, ds, owner)
    {
        return None;
    }
    if !take_over(o, st, actions, ds) {
        return None;
    }
    let Some(current) = ds.current_revision.filter(|_| ds.is_observed()) else {
        // The DaemonSet controller has not recorded the template yet. A rollout
        // or revert in flight keeps its phase meanwhile.
        phase::keep_working(
            st,
            o,
            "WaitingForDaemonSet",
            "waiting for the DaemonSet controller",
        );
        return None;
    };
    // (No requeue while the backup is recorded: its watch event wakes us.)
    let stable = ensure_backup(o, st, actions, ds, current)?;
    // A node brought back to the stable revision is done once its agent serves.
    st.converging_nodes
        .retain(|n| o.nodes.contains_key(n.as_str()) && !replace::is_available(o.pods, n));
    handle_retry(o, st, actions);
    if !refused.is_empty() && rolls_forward(st, current, &stable) {
        refuse(o, st, &refused);
        return None;
    }
    // A refused spec.template is never written, not even during a revert
    // (which goes on below).
    if let Some(t) = o.spec_template.filter(|_| refused.is_empty())
        && let Some(wait) = gitops::apply_spec_template(o, st, actions, current, &stable, t)
    {
        return wait;
    }
    if st.stopped.as_ref().is_some_and(|s| s.revision == current) {
        // onFailure Quarantine or Halt: nothing more changes on this revision.
        devices::hold(o, st);
        return None;
    }
    if current == stable {
        let before = (st.phase, st.conditions.clone());
        let wait = settle::settle(o, st, actions, ds, &stable);
        if !refused.is_empty() && st.phase == Some(saferollout_api::Phase::Succeeded) {
            // Nothing to roll now, but the next release would be refused:
            // say so, from the conditions as they were (so they move only
            // when something changes).
            (st.phase, st.conditions) = before;
            refuse(o, st, &refused);
        }
        return wait;
    }
    if is_blocked(st, current) {
        restore_blocked(o, st, actions, current, &stable);
        return None;
    }
    stage::roll(o, st, actions, ds, current, fleet)
}

/// Owner-aware mode ([`crate::owner`]): false (with the condition saying
/// why, and nothing touched) while the owner would fight the rollout: it
/// reconciles the update strategy and its own setting does not make the
/// DaemonSet `OnDelete`, or the SafeRollout carries `spec.template`, which
/// only the owner may write.
fn owner_allows(
    o: &Observed,
    st: &mut SafeRolloutStatus,
    actions: &mut Vec<Action>,
    ds: &DaemonSetView,
    owner: crate::owner::OwnerView,
) -> bool {
    if o.spec.strategy == saferollout_api::Strategy::Selector {
        phase::stalled(
            st,
            o,
            saferollout_api::Phase::Failed,
            "InvalidSpec",
            format!(
                "spec.strategy: DaemonSet {:?} is owned by {}, which reconciles its spec: strategy Selector would write a node-affinity term there; use InPlace",
                o.spec.target_ref.name,
                owner.describe()
            ),
        );
        return false;
    }
    if o.spec.template.is_some() {
        phase::stalled(
            st,
            o,
            saferollout_api::Phase::Failed,
            "InvalidSpec",
            format!(
                "spec.template: DaemonSet {:?} is owned by {}, which writes its template; a release is made in the owner ({}), and this SafeRollout stages and gates it: remove spec.template",
                o.spec.target_ref.name,
                owner.describe(),
                owner.version_fields()
            ),
        );
        return false;
    }
    if owner.reconciles_strategy() && !ds.is_on_delete() {
        let message = format!(
            "DaemonSet {:?} is owned by {}, which reconciles its update strategy: set {} (saferollout writes nothing its owner reconciles, and touches nothing until then)",
            o.spec.target_ref.name,
            owner.describe(),
            owner.on_delete_field()
        );
        stall_with_event(o, st, actions, "OwnerNotOnDelete", message);
        return false;
    }
    true
}

/// Whether this pass would roll the DaemonSet's revision forward: one that
/// is neither stable, blocked nor stopped. A spec beyond the operator's
/// limits never does (and its `spec.template` is never written); a revert
/// (a blocked revision, or the stable one with nodes still to bring back)
/// or a stopped rollout's hold goes on.
fn rolls_forward(st: &SafeRolloutStatus, current: &str, stable: &str) -> bool {
    let stopped = st.stopped.as_ref().is_some_and(|s| s.revision == current);
    current != stable && !is_blocked(st, current) && !stopped
}

/// `InvalidSpec`: the SafeRollout asks for what the operator's limits
/// refuse; nothing moves forward until the spec or the limits change.
fn refuse(o: &Observed, st: &mut SafeRolloutStatus, refused: &[crate::limits::Refusal]) {
    let list = crate::limits::describe_all(refused);
    phase::stalled(
        st,
        o,
        saferollout_api::Phase::Failed,
        "InvalidSpec",
        format!(
            "the operator refuses this SafeRollout, and rolls nothing forward until it changes: {list}"
        ),
    );
}

/// Probe pods exist only while their probe is pending in the current stage
/// of a rollout in progress: whatever path this pass took (a verdict, a
/// failed stage, a revert, success), every other probe pod of the rollout is
/// deleted, and none is created that would not survive the pass.
fn probe_pods_alive_only(o: &Observed, st: &SafeRolloutStatus, actions: &mut Vec<Action>) {
    let alive = crate::gates::probe::alive(st);
    actions.retain_mut(|a| match a {
        Action::CreateProbePods { probes } => {
            probes.retain(|p| alive.contains(&p.name));
            !probes.is_empty()
        }
        _ => true,
    });
    let stale: Vec<(String, String)> = o
        .evidence
        .proof
        .map(|p| {
            p.probe_pods
                .iter()
                .filter(|p| !p.deleting && !alive.contains(&p.name))
                .map(|p| (p.name.clone(), p.uid.clone()))
                .collect()
        })
        .unwrap_or_default();
    if !stale.is_empty() {
        actions.push(Action::DeleteProbePods { pods: stale });
    }
}

/// Takes over the DaemonSet's updates, remembering how it was set; false
/// while the DaemonSet is not on OnDelete yet.
fn take_over(
    o: &Observed,
    st: &mut SafeRolloutStatus,
    actions: &mut Vec<Action>,
    ds: &DaemonSetView,
) -> bool {
    if st.original_update_strategy.is_none() {
        st.original_update_strategy = Some(ds.update_strategy.cloned().unwrap_or_default());
    }
    if ds.is_on_delete() {
        return true;
    }
    actions.push(Action::TakeOverUpdates);
    phase::working(
        st,
        o,
        saferollout_api::Phase::Pending,
        "TakingOver",
        "setting the DaemonSet's updateStrategy to OnDelete".into(),
    );
    false
}

/// The stable revision, once its template is backed up and the backup
/// verified; `None` (after asking for the backup, or reporting that none
/// can exist or that the one there is not ours) until then.
///
/// Whoever creates `<name>-last-good-<revision>` first, owned by this
/// SafeRollout, decides what a revert writes; so the content hash of what
/// the operator writes there is recorded in status
/// (`lastGoodTemplate.templateHash`) with the pass that asks for the backup,
/// before the write, and a backup is used only while it hashes to that. A
/// backup with other content stops everything (`BackupMismatch`, naming it,
/// with a Warning Event): neither rolling on nor reverting to content the
/// operator did not write. Deleting it lets the operator record it again.
fn ensure_backup(
    o: &Observed,
    st: &mut SafeRolloutStatus,
    actions: &mut Vec<Action>,
    ds: &DaemonSetView,
    current: &str,
) -> Option<String> {
    let stable = st
        .stable_revision
        .get_or_insert_with(|| adopt_stable(o.pods, current))
        .clone();
    let name = backup_name(o.name, &stable);
    let recorded = st
        .last_good_template
        .as_ref()
        .filter(|l| l.revision == stable)
        .and_then(|l| l.template_hash.clone());
    // What the DaemonSet's own ControllerRevision of the stable revision holds.
    let intended = o.revision_contents.get(&stable).cloned();
    let record = |st: &mut SafeRolloutStatus, hash: String| {
        st.last_good_template = Some(saferollout_api::LastGoodTemplate {
            controller_revision: name.clone(),
            revision: stable.clone(),
            template_hash: Some(hash),
        });
    };
    if let Some(backup) = o.backup.filter(|b| b.revision == stable) {
        // Status records what the operator wrote; a status written before
        // the hash existed records nothing, and then the backup is checked
        // against the DaemonSet's own revision while it has it. When the
        // DaemonSet no longer has it, the backup is the only copy: refusing
        // it would strand a rollout (or a revert) an older operator started,
        // so its hash is recorded as found (trust on first use, the trust an
        // older operator gave it), and from then on it may not change.
        let expected = recorded.clone().or(intended);
        let verdict = match (expected, backup.content) {
            (Some(e), Some(c)) if e == c => Ok((e, false)),
            (None, Some(c)) => Ok((c.to_string(), true)),
            (Some(e), found) => Err(format!(
                "ControllerRevision {} holds a template with content hash {}, not {e}, the one the operator wrote",
                backup.name,
                found.unwrap_or("(none)")
            )),
            (None, None) => Err(format!(
                "ControllerRevision {} holds no template",
                backup.name
            )),
        };
        return match verdict {
            Ok((hash, adopted)) => {
                if recorded.as_deref() != Some(hash.as_str()) {
                    if adopted {
                        phase::event(
                            actions,
                            false,
                            "BackupAdopted",
                            format!(
                                "recorded the content hash {hash} of ControllerRevision {} as found: the status, written by an older operator, recorded none, and the DaemonSet no longer has revision {stable} to check it against",
                                backup.name
                            ),
                        );
                    }
                    record(st, hash);
                }
                Some(stable)
            }
            Err(why) => {
                backup_mismatch(o, st, actions, &why);
                None
            }
        };
    }
    if let Some(intended) = o
        .revision_contents
        .get(&stable)
        .filter(|_| ds.knows(&stable))
    {
        // Nothing changes before the last good template is recorded; what it
        // must hold is recorded first.
        if recorded.as_ref().is_some_and(|r| r != intended) {
            let why = format!(
                "the DaemonSet's revision {stable} now holds a template with content hash {intended}, not {}, the one the operator backed up",
                recorded.as_deref().unwrap_or_default()
            );
            backup_mismatch(o, st, actions, &why);
            return None;
        }
        record(st, intended.clone());
        actions.push(Action::BackupTemplate {
            revision: stable.clone(),
        });
        phase::keep_working(
            st,
            o,
            "RecordingLastGood",
            &format!("recording revision {stable} as the last good template"),
        );
        return None;
    }
    phase::stalled(
        st,
        o,
        saferollout_api::Phase::Failed,
        "NoLastGoodTemplate",
        format!(
            "the DaemonSet no longer has revision {stable} and no backup of it exists; refusing to change anything"
        ),
    );
    None
}

/// `BackupMismatch`: the last-good backup is not what the operator wrote.
/// Nothing changes (no rollout goes on, no revert writes it) until a person
/// deletes it (the operator then records it again) or it matches again.
fn backup_mismatch(o: &Observed, st: &mut SafeRolloutStatus, actions: &mut Vec<Action>, why: &str) {
    let message = format!(
        "the last good backup is not the one the operator wrote: {why}; nothing changes (no rollout, no revert) until it is deleted, after which the operator records it again"
    );
    stall_with_event(o, st, actions, "BackupMismatch", message);
}

/// Stalls the rollout (Failed) with `reason`, with one Warning Event when
/// the `Ready` condition did not say so already.
fn stall_with_event(
    o: &Observed,
    st: &mut SafeRolloutStatus,
    actions: &mut Vec<Action>,
    reason: &str,
    message: String,
) {
    let first = st
        .condition(crate::conditions::READY)
        .is_none_or(|c| c.reason != reason);
    if first {
        phase::event(actions, true, reason, message.clone());
    }
    phase::stalled(st, o, saferollout_api::Phase::Failed, reason, message);
}

/// The revert's write of the last good template, verified by
/// [`ensure_backup`] in this pass (its content hash is in status).
fn restore_last_good(st: &SafeRolloutStatus) -> Action {
    Action::RestoreLastGood {
        content: st
            .last_good_template
            .as_ref()
            .and_then(|l| l.template_hash.clone())
            .unwrap_or_default(),
    }
}

/// The revision most live agent pods run: the stable one when first adopting a DaemonSet.
fn adopt_stable(pods: &PodsByNode, current: &str) -> String {
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for p in pods.values().flatten().filter(|p| !p.deleting) {
        *counts.entry(p.revision).or_default() += 1;
    }
    counts
        .iter()
        .max_by_key(|(rev, n)| (**n, **rev == current))
        .map(|(r, _)| r.to_string())
        .unwrap_or_else(|| current.to_string())
}

/// A person asked to retry a blocked revision (or spec.template hash).
fn handle_retry(o: &Observed, st: &mut SafeRolloutStatus, actions: &mut Vec<Action>) {
    let Some(retry) = o.requests.retry else {
        return;
    };
    if st.last_retry.as_deref() == Some(retry) {
        return;
    }
    st.last_retry = Some(retry.to_string());
    let before = st.blocked_revisions.len();
    st.blocked_revisions
        .retain(|b| b.revision != retry && b.template_hash.as_deref() != Some(retry));
    if st.blocked_revisions.len() != before {
        phase::event(
            actions,
            false,
            "RetryRequested",
            format!("revision {retry} unblocked by the {RETRY_ANNOTATION} annotation"),
        );
    }
    if let Some(stopped) = st.stopped.take_if(|s| s.revision == retry) {
        let lifted = if stopped.quarantine.is_some() {
            "; its quarantine is lifted"
        } else {
            ""
        };
        phase::event(
            actions,
            false,
            "RetryRequested",
            format!(
                "revision {retry} (stopped by onFailure: {}) retried{lifted}",
                stopped.policy.as_str()
            ),
        );
    }
}

/// A blocked revision is on the DaemonSet: written again by a person or Helm,
/// or the restore after a failed gate has not landed yet. Never roll it.
fn restore_blocked(
    o: &Observed,
    st: &mut SafeRolloutStatus,
    actions: &mut Vec<Action>,
    current: &str,
    stable: &str,
) {
    if let (Some(Ok(plan)), None) = (o.owner_revert, o.owner_gitops) {
        // The owner wrote it: it takes it back once its fields are.
        actions.push(Action::RevertOwner { plan: plan.clone() });
        let msg = format!(
            "revision {current} is blocked: reverting through {} (spec.ownerRevert); its operator writes revision {stable}'s template back",
            plan.describe()
        );
        report_restore(o, st, current, msg.clone(), msg);
        return;
    }
    if let Some(owner) = o.daemonset.and_then(|d| d.owner) {
        // The owner wrote it: only the owner (or Git) can take it back.
        let msg = match (o.owner_revert, o.owner_gitops) {
            (Some(Ok(plan)), Some(tool)) => format!(
                "revision {current} is blocked (retry with the {RETRY_ANNOTATION} annotation) and its owner {} is managed by {tool}, whose next sync would undo a revert written there: revert {} in Git; nothing more is replaced meanwhile",
                owner.describe(),
                plan.describe()
            ),
            _ => format!(
                "revision {current} is blocked (retry with the {RETRY_ANNOTATION} annotation) and its owner {} wrote it: put back {} as they were for revision {stable}; nothing more is replaced meanwhile",
                owner.describe(),
                owner.version_fields()
            ),
        };
        phase::stalled(
            st,
            o,
            saferollout_api::Phase::Degraded,
            "BlockedRevision",
            msg,
        );
        return;
    }
    actions.push(restore_last_good(st));
    report_restore(
        o,
        st,
        current,
        format!("restoring revision {stable} over revision {current}"),
        format!(
            "revision {current} is blocked (retry with the {RETRY_ANNOTATION} annotation); restoring {stable}"
        ),
    );
}

/// The phase while blocked revision `current` is being restored over: the
/// revert under way keeps its phase while the restore lands
/// (`rolling_back`); a blocked revision written again stalls (`blocked`).
fn report_restore(
    o: &Observed,
    st: &mut SafeRolloutStatus,
    current: &str,
    rolling_back: String,
    blocked: String,
) {
    if st.target_revision.as_deref() == Some(current) {
        phase::keep_working(st, o, "RollingBack", &rolling_back);
    } else {
        phase::stalled(
            st,
            o,
            saferollout_api::Phase::Degraded,
            "BlockedRevision",
            blocked,
        );
    }
}

/// The disruption budget: `maxUnavailable` resolved against the nodes the
/// DaemonSet covers (rounded down, at least 1).
fn max_unavailable(o: &Observed, ds: &DaemonSetView) -> usize {
    let covered = o
        .nodes
        .values()
        .filter(|n| eligibility(n, &ds.placement).is_eligible())
        .count();
    resolve_count(&o.spec.max_unavailable, covered.max(1), false)
        .unwrap_or(1)
        .max(1)
}

/// Records progress of `subject` (more nodes done than ever before resets the
/// clock; another subject starts afresh) and returns how long it has gone
/// without progress as far as the caches vouch: up to when the stalest of
/// them last heard from the API server ([`Observed::caches_heard_at`]), not
/// up to now. A deadline is only ever missed on evidence that was current
/// after it passed; a cache that went silent cannot run the clock out.
fn record_progress(
    st: &mut SafeRolloutStatus,
    subject: String,
    nodes: usize,
    o: &Observed,
) -> Duration {
    let now = o.now;
    let nodes = nodes as i32;
    match &mut st.progress {
        Some(p) if p.subject == subject => {
            if nodes > p.nodes {
                p.nodes = nodes;
                p.last_progress_time = Time(now);
            }
        }
        other => {
            *other = Some(saferollout_api::Progress {
                subject,
                nodes,
                last_progress_time: Time(now),
            });
        }
    }
    let since = st
        .progress
        .as_ref()
        .map(|p| p.last_progress_time.0)
        .unwrap_or(now);
    crate::gates::elapsed(since, o.vouched_until())
}

/// The instant before which the caches must have heard from the API server
/// for this pass's deadline to be judged: the deadline has passed by the
/// clock but not by the caches (see [`record_progress`]). The operator then
/// lists those caches again, which vouches for them at once.
fn refresh_caches_heard_before(o: &Observed, st: &SafeRolloutStatus) -> Option<Timestamp> {
    let heard = o.caches_heard_at?;
    let since = st.progress.as_ref()?.last_progress_time.0;
    let due = since.checked_add(progress_deadline(o)).ok()?;
    (heard < due && due <= o.now).then_some(due)
}

/// `spec.progressDeadline`; the schema rejects malformed durations, a default
/// stands in for one that slipped through.
fn progress_deadline(o: &Observed) -> Duration {
    o.spec
        .progress_deadline_duration()
        .unwrap_or(Duration::from_secs(600))
}

/// The nodes carrying this rollout's label now, with their stage label.
fn labelled_nodes<'a>(o: &Observed<'a>) -> BTreeMap<&'a str, Option<usize>> {
    o.nodes
        .values()
        .filter(|n| n.ours.rollout == Some(o.rollout_id))
        .map(|n| (n.name, n.ours.stage))
        .collect()
}
