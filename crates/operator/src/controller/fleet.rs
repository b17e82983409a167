//! SafeRolloutPolicies (`--fleet-policies`): which policies govern a
//! rollout, what the rollouts they govern disrupt, and the policies' own
//! status. The decisions are `saferollout_core::fleet`; this module gathers
//! what they read and keeps one thing the caches cannot: the order of the
//! governed rollouts' decisions.
//!
//! Why a turn: two governed rollouts deciding at once would each read the
//! other's `status.disruptedNodes` from before the other's pass, and both
//! take the budget's last node. So a governed rollout decides and writes
//! its status holding [`FleetPolicies::turn`], and what it decided is kept
//! in a ledger until the cache shows it: the next rollout reads the ledger
//! first. A growth of `disruptedNodes` is always written before the
//! deletions it records (`saferollout_core::durability` never lets that
//! change go behind the actions), so after a restart the statuses alone
//! are the truth, and the ledger starts empty.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector, Time};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::watcher::Event;
use kube::{Client, ResourceExt};
use saferollout_api::{
    CONDITION_WAITING, FIELD_MANAGER, SafeRollout, SafeRolloutPolicy, SafeRolloutPolicyStatus,
    StageState,
};
use saferollout_core::fleet::budget::{Budget, Demand};
use saferollout_core::fleet::ordering::{self, Dependencies, NodeAgents, Order};
use saferollout_core::fleet::windows::{self, Window};
use saferollout_core::fleet::{Fleet, Governing};
use saferollout_core::objects::SlimPod;
use saferollout_core::revision::{revision_hash, same_template};
use saferollout_core::views::AgentPod;

use super::RolloutKey;
use super::caches::Caches;
use super::caches::stores::watch_config;
use super::caches::triggers::{Cause, Triggers};
use super::freshness::{self, Freshness};
use super::snapshot::owned_by;
use crate::metrics::Metrics;

/// Most rollouts a policy's Ready message names.
const NAMED_IN_MESSAGE: usize = 10;

/// The policies, the namespaces' labels their selectors read, and the
/// governed rollouts' turn and ledger.
pub struct FleetPolicies {
    policies: Store<SafeRolloutPolicy>,
    namespaces: Store<Namespace>,
    ready: AtomicBool,
    /// What this operator decided each governed rollout disrupts, until
    /// the rollout cache shows that status.
    ledger: Mutex<HashMap<RolloutKey, Vec<String>>>,
    /// The governed rollouts whose last pass here was held (their status
    /// may not be in the cache yet when another releases a node).
    waiting: Mutex<HashSet<RolloutKey>>,
    /// Held by a governed rollout from its decision through its status
    /// write (see the module doc).
    pub turn: tokio::sync::Mutex<()>,
    /// A policy changed: its status is computed again.
    changed: tokio::sync::Notify,
}

/// Starts the policy and namespace reflectors. A policy's change wakes
/// every rollout (policies change rarely; which rollouts it governed before
/// the change is not known any more).
pub fn start(
    client: &Client,
    caches: &Arc<Caches>,
    freshness: &Arc<Freshness>,
    metrics: &Arc<Metrics>,
    triggers: &Arc<Triggers>,
) -> Arc<FleetPolicies> {
    let (policies, policies_writer) = reflector::store::<SafeRolloutPolicy>();
    let (namespaces, namespaces_writer) = reflector::store::<Namespace>();
    let fleet = Arc::new(FleetPolicies {
        policies,
        namespaces,
        ready: AtomicBool::new(false),
        ledger: Mutex::default(),
        waiting: Mutex::default(),
        turn: tokio::sync::Mutex::new(()),
        changed: tokio::sync::Notify::new(),
    });
    let (f, c, t) = (fleet.clone(), caches.clone(), triggers.clone());
    freshness::reflect(
        Api::<SafeRolloutPolicy>::all(client.clone()),
        watch_config(),
        policies_writer,
        freshness,
        metrics,
        |p: &mut SafeRolloutPolicy| p.metadata.managed_fields = None,
        move |ev| {
            if matches!(ev, Event::Apply(_) | Event::Delete(_) | Event::InitDone) {
                f.changed.notify_one();
                for sr in c.every_rollout() {
                    t.send(ObjectRef::from_obj(&*sr), Cause::Fleet);
                }
            }
        },
    );
    freshness::reflect(
        Api::<Namespace>::all(client.clone()),
        watch_config(),
        namespaces_writer,
        freshness,
        metrics,
        |n: &mut Namespace| {
            n.metadata.managed_fields = None;
            n.spec = None;
            n.status = None;
        },
        |_| {},
    );
    let f = fleet.clone();
    tokio::spawn(async move {
        let _ = f.policies.wait_until_ready().await;
        let _ = f.namespaces.wait_until_ready().await;
        f.ready.store(true, Ordering::Release);
    });
    fleet
}

/// `namespace/name`, as the decisions and messages name rollouts.
fn full_name(sr: &SafeRollout) -> String {
    format!("{}/{}", sr.namespace().unwrap_or_default(), sr.name_any())
}

fn key_of(sr: &SafeRollout) -> RolloutKey {
    (sr.namespace().unwrap_or_default(), sr.name_any())
}

/// A selector that does not parse selects nothing (the schema refuses most).
fn matches(selector: Option<&LabelSelector>, labels: &BTreeMap<String, String>) -> bool {
    use kube::core::{Selector, SelectorExt};
    match selector {
        None => true,
        Some(s) => Selector::try_from(s.clone()).is_ok_and(|s| s.matches(labels)),
    }
}

/// What one policy resolved to for the rollouts it governs.
struct Resolved {
    /// `Err`: why the policy cannot be applied.
    budget: Result<Budget, String>,
    windows: Result<Vec<Window>, String>,
}

impl FleetPolicies {
    /// Both stores have listed: before, no rollout decides (it could not
    /// tell whether a policy governs it).
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }

    fn governs(&self, policy: &SafeRolloutPolicy, sr: &SafeRollout) -> bool {
        let selector = &policy.spec.selector;
        let ns = sr.namespace().unwrap_or_default();
        let ns_labels = self
            .namespaces
            .get(&ObjectRef::new(&ns))
            .map(|n| n.labels().clone())
            .unwrap_or_default();
        matches(selector.namespace_selector.as_ref(), &ns_labels)
            && matches(selector.rollout_selector.as_ref(), sr.labels())
    }

    /// The policies governing `sr`, by name.
    pub fn governing(&self, sr: &SafeRollout) -> Vec<Arc<SafeRolloutPolicy>> {
        let mut policies: Vec<_> = self
            .policies
            .state()
            .into_iter()
            .filter(|p| self.governs(p, sr))
            .collect();
        policies.sort_by_key(|p| p.name_any());
        policies
    }

    /// The rollouts `policy` governs, oldest first.
    fn governed(&self, policy: &SafeRolloutPolicy, caches: &Caches) -> Vec<Arc<SafeRollout>> {
        let mut rollouts: Vec<_> = caches
            .every_rollout()
            .into_iter()
            .filter(|sr| sr.metadata.deletion_timestamp.is_none() && self.governs(policy, sr))
            .collect();
        rollouts.sort_by_key(|sr| (sr.creation_timestamp().map(|t| t.0), full_name(sr)));
        rollouts
    }

    /// What `sr` disrupts: what this operator decided last, else its status.
    fn disrupted(&self, sr: &SafeRollout) -> Vec<String> {
        let ledger = self.ledger.lock().unwrap_or_else(|e| e.into_inner());
        match ledger.get(&key_of(sr)) {
            Some(nodes) => nodes.clone(),
            None => sr
                .status
                .as_ref()
                .map(|s| s.disrupted_nodes.clone())
                .unwrap_or_default(),
        }
    }

    /// Records what `key`'s pass decided (its status is written); when it
    /// released a node, or its stages moved, every other rollout waiting on
    /// a policy is woken.
    pub fn record(
        &self,
        caches: &Caches,
        triggers: &Triggers,
        key: &RolloutKey,
        before: &saferollout_api::SafeRolloutStatus,
        after: &saferollout_api::SafeRolloutStatus,
    ) {
        self.ledger
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key.clone(), after.disrupted_nodes.clone());
        let held = is_waiting(after);
        let waiting: HashSet<RolloutKey> = {
            let mut w = self.waiting.lock().unwrap_or_else(|e| e.into_inner());
            if held {
                w.insert(key.clone());
            } else {
                w.remove(key);
            }
            w.clone()
        };
        let released = before
            .disrupted_nodes
            .iter()
            .any(|n| !after.disrupted_nodes.contains(n));
        let stages_moved = before
            .stages
            .iter()
            .map(|s| s.state)
            .ne(after.stages.iter().map(|s| s.state))
            || before.phase != after.phase;
        if !released && !stages_moved {
            return;
        }
        for sr in caches.every_rollout() {
            let other = key_of(&sr);
            let held = waiting.contains(&other) || sr.status.as_ref().is_some_and(is_waiting);
            if held && other != *key {
                triggers.send(ObjectRef::from_obj(&*sr), Cause::Fleet);
            }
        }
    }

    /// This replica starts leading: forgets what it decided when it led
    /// before (another replica may have decided since; the statuses say).
    pub fn start_leading(&self) {
        self.ledger
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
        self.waiting
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
    }

    /// Forgets a rollout that is gone.
    pub fn forget(&self, key: &RolloutKey) {
        self.ledger
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(key);
        self.waiting
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(key);
    }

    fn resolve(
        &self,
        policy: &SafeRolloutPolicy,
        governed: &[Arc<SafeRollout>],
        caches: &Caches,
    ) -> Resolved {
        let fleet_nodes = match &policy.spec.max_disrupted_nodes {
            Some(IntOrString::String(_)) => agents_nodes(governed, caches).len(),
            _ => 0,
        };
        Resolved {
            budget: Budget::resolve(&policy.spec, fleet_nodes).map_err(|e| e.to_string()),
            windows: windows::parse(&policy.spec.maintenance_windows).map_err(|e| e.to_string()),
        }
    }

    /// What `policies` (those [`Self::governing`] `sr`) read in this pass.
    /// `pods` are `sr`'s agent pods, `current` its DaemonSet's revision.
    pub fn gather(
        &self,
        sr: &SafeRollout,
        policies: &[Arc<SafeRolloutPolicy>],
        caches: &Caches,
        pods: &[Arc<SlimPod>],
        current: Option<&str>,
    ) -> Gathered {
        let me = full_name(sr);
        let mut gathered = Gathered {
            rollout: me.clone(),
            policies: Vec::with_capacity(policies.len()),
        };
        // The nodes where this rollout's agent is still to be replaced: the
        // only ones the ordering is asked about.
        let to_replace: BTreeSet<&str> = pods
            .iter()
            .filter_map(|p| AgentPod::of(p))
            .filter(|p| current.is_some_and(|c| p.revision != c))
            .map(|p| p.node)
            .collect();
        for policy in policies {
            let governed = self.governed(policy, caches);
            let resolved = self.resolve(policy, &governed, caches);
            let mut broken = resolved.budget.as_ref().err().cloned();
            let windows = match resolved.windows {
                Ok(w) => w,
                Err(e) => {
                    broken.get_or_insert(e);
                    Vec::new()
                }
            };
            let mut others: Vec<(String, Vec<String>, Option<Time>)> = governed
                .iter()
                .filter(|o| full_name(o) != me)
                .map(|o| (full_name(o), self.disrupted(o), o.creation_timestamp()))
                .collect();
            // Priority: the rollouts holding nodes first (they finish what
            // they started), then the oldest.
            others.sort_by_key(|(name, d, created)| {
                (d.is_empty(), created.as_ref().map(|t| t.0), name.clone())
            });
            let waits_for = match ordering_waits(policy, &governed, &me, &to_replace, caches) {
                Ok(w) => w,
                Err(e) => {
                    broken.get_or_insert(e);
                    BTreeMap::new()
                }
            };
            gathered.policies.push(GatheredPolicy {
                name: policy.name_any(),
                broken,
                budget: resolved.budget.unwrap_or(Budget {
                    max_disrupted_nodes: None,
                    max_concurrent_rollouts: None,
                }),
                others: others.into_iter().map(|(n, d, _)| (n, d)).collect(),
                windows,
                waits_for,
            });
        }
        gathered
    }

    /// Writes every policy's status where it changed: `observedGeneration`
    /// and `Ready` (the rollouts it governs, or why it cannot be applied).
    /// Runs while this replica leads, on each policy change and every
    /// `every` (the governed rollouts change without the policy).
    pub async fn write_statuses(
        self: Arc<Self>,
        client: Client,
        caches: Arc<Caches>,
        fence: Arc<crate::leader::Fence>,
        every: Duration,
    ) {
        let api = Api::<SafeRolloutPolicy>::all(client);
        let params = PatchParams {
            field_manager: Some(FIELD_MANAGER.into()),
            ..Default::default()
        };
        loop {
            tokio::select! {
                _ = self.changed.notified() => {}
                _ = tokio::time::sleep(every) => {}
            }
            if !fence.is_open() || !self.is_ready() || !caches.is_synced() {
                continue;
            }
            for policy in self.policies.state() {
                let status = self.policy_status(&policy, &caches);
                if policy.status.as_ref() == Some(&status) {
                    continue;
                }
                let patch = serde_json::json!({"status": status});
                if let Err(e) = api
                    .patch_status(&policy.name_any(), &params, &Patch::Merge(&patch))
                    .await
                {
                    tracing::warn!(policy = %policy.name_any(), error = %e, "could not write the SafeRolloutPolicy's status");
                }
            }
        }
    }

    /// What `policy`'s status should say now.
    fn policy_status(
        &self,
        policy: &SafeRolloutPolicy,
        caches: &Caches,
    ) -> SafeRolloutPolicyStatus {
        let governed = self.governed(policy, caches);
        let resolved = self.resolve(policy, &governed, caches);
        let names: Vec<String> = governed.iter().map(|g| full_name(g)).collect();
        let cycle = cycle_of(policy, &governed, &names);
        let problem = resolved
            .budget
            .err()
            .or(resolved.windows.err())
            .map(|e| ("InvalidPolicy", e))
            .or(cycle.map(|c| ("OrderingCycle", c)));
        let (status, reason, message) = match problem {
            Some((reason, why)) => (
                "False",
                reason.to_string(),
                format!("{why}; the rollouts it governs replace nothing until it is fixed"),
            ),
            None => {
                let shown: Vec<&str> = names
                    .iter()
                    .take(NAMED_IN_MESSAGE)
                    .map(String::as_str)
                    .collect();
                let more = names.len().saturating_sub(NAMED_IN_MESSAGE);
                let more = if more > 0 {
                    format!(" and {more} more")
                } else {
                    String::new()
                };
                (
                    "True",
                    "Applied".to_string(),
                    format!(
                        "governs {} SafeRollout(s): {}{more}",
                        names.len(),
                        shown.join(", ")
                    ),
                )
            }
        };
        let previous = policy
            .status
            .as_ref()
            .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Ready"));
        let last_transition_time = match previous {
            Some(p) if p.status == status => p.last_transition_time.clone(),
            _ => Time(jiff::Timestamp::now()),
        };
        SafeRolloutPolicyStatus {
            observed_generation: policy.metadata.generation,
            conditions: vec![Condition {
                type_: "Ready".into(),
                status: status.into(),
                reason,
                message,
                observed_generation: policy.metadata.generation,
                last_transition_time,
            }],
        }
    }
}

fn is_waiting(st: &saferollout_api::SafeRolloutStatus) -> bool {
    st.condition(CONDITION_WAITING)
        .is_some_and(|c| c.status == "True")
}

/// The ordering rules' cycle among `governed`, if any, as a message.
fn cycle_of(
    policy: &SafeRolloutPolicy,
    governed: &[Arc<SafeRollout>],
    names: &[String],
) -> Option<String> {
    let views: Vec<ordering::Governed> = governed
        .iter()
        .zip(names)
        .map(|(sr, name)| ordering::Governed {
            name,
            labels: sr.labels(),
        })
        .collect();
    let deps = Dependencies::resolve(&policy.spec.ordering, &views);
    deps.cycle().map(|c| {
        ordering::OrderingError::Cycle(c.into_iter().map(str::to_string).collect()).to_string()
    })
}

/// The nodes the governed rollouts' agents run on.
fn agents_nodes(governed: &[Arc<SafeRollout>], caches: &Caches) -> BTreeSet<String> {
    governed
        .iter()
        .flat_map(|sr| agent_pods(sr, caches))
        .filter_map(|p| AgentPod::of(&p).map(|a| a.node.to_string()))
        .collect()
}

/// The agent pods of the DaemonSet `sr` targets.
fn agent_pods(sr: &SafeRollout, caches: &Caches) -> Vec<Arc<SlimPod>> {
    let Some(uid) = caches
        .target_daemonset(sr)
        .and_then(|d| d.metadata.uid.clone())
    else {
        return Vec::new();
    };
    caches
        .pods
        .in_namespace(&sr.namespace().unwrap_or_default())
        .into_iter()
        .filter(|p| owned_by(&p.metadata, &uid))
        .collect()
}

/// Per node of `to_replace`, the rollout `me` waits for there under
/// `policy`'s ordering; `Err`: the rules form a cycle `me` is on or reaches.
fn ordering_waits(
    policy: &SafeRolloutPolicy,
    governed: &[Arc<SafeRollout>],
    me: &str,
    to_replace: &BTreeSet<&str>,
    caches: &Caches,
) -> Result<BTreeMap<String, String>, String> {
    if policy.spec.ordering.is_empty() || to_replace.is_empty() {
        return Ok(BTreeMap::new());
    }
    let names: Vec<String> = governed.iter().map(|g| full_name(g)).collect();
    let views: Vec<ordering::Governed> = governed
        .iter()
        .zip(&names)
        .map(|(sr, name)| ordering::Governed {
            name,
            labels: sr.labels(),
        })
        .collect();
    let deps = Dependencies::resolve(&policy.spec.ordering, &views);
    // Every rollout `me` may wait on, directly or through one with no
    // agent on a node.
    let mut before: BTreeSet<&str> = BTreeSet::new();
    let mut todo: Vec<&str> = deps.after(me).collect();
    while let Some(b) = todo.pop() {
        if before.insert(b) {
            todo.extend(deps.after(b));
        }
    }
    // Per predecessor: the nodes it has an agent on, and those it passed.
    let mut present: BTreeMap<&str, BTreeSet<String>> = BTreeMap::new();
    let mut passed: BTreeMap<&str, BTreeSet<String>> = BTreeMap::new();
    for (sr, name) in governed.iter().zip(&names) {
        if !before.contains(name.as_str()) {
            continue;
        }
        let passed_nodes = passed_nodes(sr, caches);
        // Its agent is on a node while it has a pod there, even one being
        // replaced, and while it holds or disrupts the node (the pod
        // deleted, its replacement not created yet): a predecessor caught
        // between its deletion and its new pod is not looked through as
        // absent (seen end to end: the DRA driver replaced on a node 150 ms
        // after the driver's deletion there).
        if let Some(st) = sr.status.as_ref() {
            let holds = st
                .stages
                .iter()
                .flat_map(|s| s.nodes.iter())
                .chain(&st.disrupted_nodes);
            present.entry(name).or_default().extend(holds.cloned());
        }
        for pod in agent_pods(sr, caches) {
            let Some(agent) = AgentPod::of(&pod) else {
                continue;
            };
            present
                .entry(name)
                .or_default()
                .insert(agent.node.to_string());
            if agent.deleting {
                continue;
            }
            let serving = agent.running && agent.ready;
            let gates_passed = match &passed_nodes {
                Passed::Everywhere(stable) => stable.is_none_or(|s| agent.revision == s),
                Passed::Nowhere => false,
                Passed::On(nodes) => nodes.contains(agent.node),
            };
            if serving && gates_passed {
                passed
                    .entry(name)
                    .or_default()
                    .insert(agent.node.to_string());
            }
        }
    }
    let me: &str = names
        .iter()
        .find(|n| *n == me)
        .map(String::as_str)
        .unwrap_or(me);
    let mut waits = BTreeMap::new();
    for node in to_replace {
        let agents = NodeAgents {
            present: before
                .iter()
                .copied()
                .filter(|b| present.get(b).is_some_and(|n| n.contains(*node)))
                .collect(),
            passed: before
                .iter()
                .copied()
                .filter(|b| passed.get(b).is_some_and(|n| n.contains(*node)))
                .collect(),
        };
        match ordering::may_replace(&deps, me, &agents) {
            Ok(Order::Go) => {}
            Ok(Order::WaitFor(b)) => {
                waits.insert(node.to_string(), b.to_string());
            }
            Err(e) => return Err(e.to_string()),
        }
    }
    Ok(waits)
}

/// Where a predecessor has passed its gates.
enum Passed<'a> {
    /// Nothing to roll out: wherever its agent serves the stable revision
    /// (`None`: not known yet, any).
    Everywhere(Option<&'a str>),
    /// Stopped by `onFailure: Quarantine` or `Halt`: nowhere, until a
    /// person acts (its dependents wait, named in their condition). Also
    /// while its status is behind its spec, or it has none yet.
    Nowhere,
    /// Rolling out: the nodes of its stages whose gates passed (and soaked).
    On(BTreeSet<&'a str>),
}

fn passed_nodes<'a>(sr: &'a SafeRollout, caches: &Caches) -> Passed<'a> {
    let Some(st) = sr.status.as_ref() else {
        return Passed::Nowhere;
    };
    // Its spec changed since its last pass (a new spec.template it has not
    // started yet): its stages say nothing of the release to come, so its
    // dependents wait for that pass rather than run ahead of it.
    if st.stopped.is_some() || st.observed_generation != sr.metadata.generation {
        return Passed::Nowhere;
    }
    let rolling = st.current_stage.is_some()
        && st.target_revision.is_some()
        && st.target_revision != st.stable_revision
        && !st
            .blocked_revisions
            .iter()
            .any(|b| Some(&b.revision) == st.target_revision.as_ref());
    if !rolling {
        if release_not_started(sr, caches) {
            return Passed::Nowhere;
        }
        return Passed::Everywhere(st.stable_revision.as_deref());
    }
    Passed::On(
        st.stages
            .iter()
            .filter(|s| matches!(s.state, StageState::Passed | StageState::Paused))
            .flat_map(|s| s.nodes.iter().map(String::as_str))
            .collect(),
    )
}

/// Whether `sr`'s DaemonSet already carries a template other than its
/// stable revision's that `sr`'s status does not roll out yet: a release
/// written a moment ago, before `sr`'s next pass. Its agents still serve the
/// stable revision, so without this its dependents would see it passed
/// everywhere and replace theirs ahead of it (seen end to end: three
/// releases written at once, the plugin replaced on a node 40 ms before the
/// driver's first pass took that node). Unknown (no DaemonSet, no stable
/// revision, its ControllerRevision gone): not pending, as before.
fn release_not_started(sr: &SafeRollout, caches: &Caches) -> bool {
    let Some(stable) = sr
        .status
        .as_ref()
        .and_then(|s| s.stable_revision.as_deref())
    else {
        return false;
    };
    let Some(ds) = caches.target_daemonset(sr) else {
        return false;
    };
    let ds_uid = ds.metadata.uid.as_deref().unwrap_or_default();
    let ns = sr.namespace().unwrap_or_default();
    let stable_template = caches
        .revisions
        .in_namespace(&ns)
        .into_iter()
        .filter(|cr| owned_by(&cr.metadata, ds_uid))
        .filter(|cr| revision_hash(cr) == Some(stable))
        .find_map(|cr| caches.templates.get(&cr).map(|(t, _)| t));
    stable_template.is_some_and(|t| !same_template(&t, &ds.spec.template))
}

/// The owned inputs of one pass's [`Fleet`].
pub struct Gathered {
    rollout: String,
    policies: Vec<GatheredPolicy>,
}

struct GatheredPolicy {
    name: String,
    broken: Option<String>,
    budget: Budget,
    others: Vec<(String, Vec<String>)>,
    windows: Vec<Window>,
    waits_for: BTreeMap<String, String>,
}

impl Gathered {
    /// The decisions' view.
    pub fn view(&self) -> Fleet<'_> {
        Fleet {
            rollout: &self.rollout,
            policies: self
                .policies
                .iter()
                .map(|p| Governing {
                    policy: &p.name,
                    broken: p.broken.as_deref(),
                    budget: p.budget,
                    others: p
                        .others
                        .iter()
                        .map(|(rollout, disrupted)| Demand {
                            rollout,
                            disrupted: disrupted.iter().map(String::as_str).collect(),
                            wanted: Vec::new(),
                        })
                        .collect(),
                    windows: &p.windows,
                    waits_for: &p.waits_for,
                })
                .collect(),
        }
    }
}
