//! The simulated cluster: its objects (nodes, the DaemonSet, agent pods,
//! probe pods, the last-good backup), what moves them each second without
//! the operator, and how the API server answers the operator's writes.
//!
//! Each second: the DaemonSet controller creates a missing agent pod on a
//! node it covers, after the old one has terminated, from the DaemonSet's
//! current template; the kubelets start pods, which become Ready or crash as
//! their release dictates; a device plugin advertises what its release
//! advertises; terminating pods take a while to go; each node's kubelet
//! writes the node's status (stamped with its heartbeat) when what it
//! reports changes and, after an agent became Ready, in a later second (the
//! report of its registration); probe pods are scheduled only where the node
//! advertises a device and succeed where the agent still serves it.
//!
//! The API server refuses a DaemonSet write made from an older generation,
//! a pod deletion whose UID or resourceVersion no longer matches, and finds
//! nothing to write on a node that is gone; [`Losses`] are the writes of a
//! pass it loses.

use std::collections::{BTreeMap, BTreeSet};

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Taint;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use saferollout_api::{ROLLOUT_LABEL, STAGE_LABEL, ZONE_LABEL};

use super::ROLLOUT_ID;
use crate::eligibility::eligibility;
use crate::handover::HandoverOrder;
use crate::objects::Quantities;
use crate::selector::Owner;
use crate::views::{AgentPod, NodeView, Placement, RolloutLabels};

pub const GPUS: i64 = 8;
pub const RESOURCE: &str = "example.com/gpu";
/// The label the model DaemonSet selects nodes by.
pub const GPU_NODE_LABEL: &str = "gpu";

/// How a release behaves once its pod runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Release {
    Healthy,
    /// Ready, advertises nothing.
    Broken,
    /// Ready, advertises twice the devices.
    Overcount,
    /// Never runs: CrashLoopBackOff.
    Crashloop,
    /// Runs, never Ready.
    Unready,
    /// Healthy on zone-a nodes, advertises nothing on zone-b nodes: passes the
    /// canary (zone-a), fails a later stage.
    BrokenInZoneB,
    /// Healthy for this many seconds after its pod starts, then advertises nothing.
    BreaksAfter(i64),
    /// Advertises the count and nothing in turn, every this many seconds.
    Flap(i64),
    /// On zone-a nodes, advertises nothing for this many seconds after its
    /// pod starts, then the count (a healthy plugin whose node reads 0
    /// devices for a moment); on zone-b nodes, the count at once.
    LateInZoneA(i64),
}

impl Release {
    /// What a Ready pod of this release advertises in `zone` whatever its
    /// age, when that never changes.
    pub fn steady_count(self, zone: &str) -> Option<i64> {
        match self {
            Release::Healthy
            | Release::Unready
            | Release::Broken
            | Release::Crashloop
            | Release::Overcount
            | Release::BrokenInZoneB => Some(self.advertises(zone, 0)),
            Release::BreaksAfter(_) | Release::Flap(_) | Release::LateInZoneA(_) => None,
        }
    }

    /// Devices a Ready pod of this release advertises on `node` at `age` seconds.
    fn advertises(self, zone: &str, age: i64) -> i64 {
        match self {
            Release::Healthy | Release::Unready => GPUS,
            Release::Broken | Release::Crashloop => 0,
            Release::Overcount => 2 * GPUS,
            Release::BrokenInZoneB => {
                if zone == "zone-b" {
                    0
                } else {
                    GPUS
                }
            }
            Release::BreaksAfter(t) => {
                if age < t {
                    GPUS
                } else {
                    0
                }
            }
            Release::LateInZoneA(t) => {
                if zone == "zone-a" && age < t {
                    0
                } else {
                    GPUS
                }
            }
            Release::Flap(p) => {
                if (age / p.max(1)) % 2 == 0 {
                    GPUS
                } else {
                    0
                }
            }
        }
    }
}

#[derive(Debug, Clone)]
pub struct MNode {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub ready: bool,
    /// When `ready` last changed (the Ready condition's lastTransitionTime).
    pub ready_since: Timestamp,
    pub taints: Vec<Taint>,
    pub allocatable: Quantities,
    /// Seconds since the node's plugin stopped serving (allocatable drops to
    /// 0 a second later, as the kubelet device manager does).
    pub unserved_for: i64,
    /// When the kubelet last wrote the node's status (the Ready condition's
    /// lastHeartbeatTime): allocatable is what it computed then.
    pub status_written: Timestamp,
}

impl MNode {
    pub fn zone(&self) -> &str {
        self.labels
            .get(ZONE_LABEL)
            .map(String::as_str)
            .unwrap_or("")
    }

    /// The DaemonSet covers the node (its selector, readiness and taints, as
    /// core's eligibility judges them).
    pub fn is_covered(&self) -> bool {
        let sel = BTreeMap::from([(GPU_NODE_LABEL.to_string(), "true".to_string())]);
        let placement = Placement {
            node_selector: Some(&sel),
            ..Default::default()
        };
        eligibility(&self.view(), &placement).is_eligible()
    }

    pub fn view(&self) -> NodeView<'_> {
        NodeView {
            name: &self.name,
            labels: &self.labels,
            ready: self.ready,
            not_ready_since: (!self.ready).then_some(self.ready_since),
            status_written: Some(self.status_written),
            taints: &self.taints,
            allocatable: &self.allocatable,
            conditions: &[],
            ours: RolloutLabels::of(&self.labels),
        }
    }
}

#[derive(Debug, Clone)]
pub struct MPod {
    pub name: String,
    pub uid: String,
    pub node: String,
    /// The revision by content (what the agent runs).
    pub revision: String,
    /// Which DaemonSet owns it (`Selector`: the target or the canary).
    pub owner: Owner,
    /// Its `controller-revision-hash` as its owner wrote it: the revision,
    /// except under `Selector` (see `model/selector.rs`).
    pub hash: String,
    /// Seconds since the pod was created.
    pub age: i64,
    pub created: Timestamp,
    /// When the pod was deleted.
    pub deleted: Option<Timestamp>,
    pub running: bool,
    pub ready: bool,
    /// When it last became Ready (its Ready condition's lastTransitionTime).
    pub ready_since: Option<Timestamp>,
    pub waiting: Option<String>,
    pub restarts: i32,
    /// Seconds left before a terminating pod is gone.
    pub terminating: Option<i64>,
    /// Changes with every change of the pod's state (its resourceVersion).
    pub version: String,
}

impl MPod {
    /// Running and Ready, not terminating: the agent serves.
    pub fn serves(&self) -> bool {
        self.terminating.is_none() && self.running && self.ready
    }

    pub fn view(&self) -> AgentPod<'_> {
        AgentPod {
            name: &self.name,
            uid: &self.uid,
            resource_version: &self.version,
            node: &self.node,
            revision: &self.revision,
            running: self.running && self.terminating.is_none(),
            ready: self.ready && self.terminating.is_none(),
            ready_since: self
                .ready_since
                .filter(|_| self.ready && self.terminating.is_none()),
            deleting: self.terminating.is_some(),
            waiting_reason: self.waiting.as_deref(),
            waiting_message: None,
            restarts: self.restarts,
            created: Some(self.created),
            deleted: self.deleted,
        }
    }
}

#[derive(Debug, Clone)]
pub struct MDaemonSet {
    pub generation: i64,
    pub observed_generation: i64,
    pub strategy: String,
    /// The revision whose template the DaemonSet carries.
    pub template: String,
    /// Recorded revisions (ControllerRevisions) and their numbers.
    pub revisions: BTreeMap<String, i64>,
}

// The `Selector` strategy's objects (their controllers: `selector.rs`).

/// The canary DaemonSet.
#[derive(Debug, Clone)]
pub struct MCanary {
    pub ds: MDaemonSet,
    pub retiring: bool,
    /// Its status desires no pod: its controller synced while every node it
    /// has a pod on carried the promotion taint.
    pub held: bool,
    /// An update asks its controller to sync it (and its status) again.
    pub(super) sync_pending: bool,
}

/// The `Selector` strategy's objects in the cluster.
#[derive(Debug, Clone)]
pub struct SelectorCluster {
    /// The rollout's handover label key.
    pub key: String,
    pub order: HandoverOrder,
    /// The target's template carries the handover expression.
    pub target_expression: bool,
    pub canary: Option<MCanary>,
}

impl SelectorCluster {
    pub fn new(order: HandoverOrder) -> Self {
        SelectorCluster {
            key: crate::selector::handover_label_key(ROLLOUT_ID),
            order,
            target_expression: false,
            canary: None,
        }
    }
}

/// A probe pod of the probe gate.
#[derive(Debug, Clone, PartialEq)]
pub struct MProbe {
    pub uid: String,
    pub node: String,
    /// Pending, Running, Succeeded or Failed.
    pub phase: String,
    /// Pending because the node advertises no device.
    pub unschedulable: bool,
    /// Seconds since it was scheduled.
    pub running_for: i64,
}

/// The cluster as it is (and, lagging, as the caches show it).
#[derive(Debug, Clone)]
pub struct Cluster {
    pub nodes: BTreeMap<String, MNode>,
    pub pods: BTreeMap<String, MPod>,
    /// Probe pods by name.
    pub probes: BTreeMap<String, MProbe>,
    pub ds: MDaemonSet,
    /// The revision the last-good backup holds (by its name and label).
    pub backup: Option<String>,
    /// The content hash of the template it holds: the revision's own
    /// ([`content_of`]) when the operator wrote it, anything when someone
    /// else created it first.
    pub backup_content: Option<String>,
    /// Under `Selector`: the canary DaemonSet and the target's handover
    /// expression; `None` under `InPlace`.
    pub selector: Option<SelectorCluster>,
    /// Objects the API server has created, for the next one's name and UID
    /// (and, for a deleted pod, its grace period).
    created: usize,
}

/// The content hash of revision `revision`'s template, in the model.
pub fn content_of(revision: &str) -> String {
    format!("sha256:{revision}")
}

/// A write the model refuses (guard failed) or drops (lost).
#[derive(Debug, Clone, Copy, Default)]
pub struct Losses {
    /// The status write fails. Written before the actions (the plan's
    /// [`crate::pass::StatusWrite::Before`]), nothing of the pass happens;
    /// written behind them, the actions land and the status is lost.
    pub status: bool,
    /// The first action of the pass that changes the cluster (after the
    /// status write) is lost.
    pub first_action: bool,
}

/// How the API server answers the deletion of an agent pod.
pub enum Deletion {
    /// 404: gone already.
    Gone,
    /// 409: the pod changed since the version the deletion was conditioned on.
    Changed,
    /// Terminating already: nothing changes.
    Terminating,
    /// The pod terminates now; `served`: its agent served until now.
    Started { node: String, served: bool },
}

impl Cluster {
    /// A DaemonSet of `v1` that covers the GPU nodes, with updates
    /// RollingUpdate, and no node yet.
    pub fn new() -> Self {
        Cluster {
            nodes: BTreeMap::new(),
            pods: BTreeMap::new(),
            probes: BTreeMap::new(),
            ds: MDaemonSet {
                generation: 1,
                observed_generation: 1,
                strategy: "RollingUpdate".into(),
                template: "v1".into(),
                revisions: BTreeMap::from([("v1".to_string(), 1)]),
            },
            backup: None,
            backup_content: None,
            selector: None,
            created: 0,
        }
    }

    /// A Ready GPU node, in zone-a for even `i`, zone-b for odd.
    pub fn add_node(&mut self, name: &str, i: usize, now: Timestamp) {
        let labels = BTreeMap::from([
            (
                ZONE_LABEL.to_string(),
                if i.is_multiple_of(2) {
                    "zone-a"
                } else {
                    "zone-b"
                }
                .to_string(),
            ),
            (GPU_NODE_LABEL.to_string(), "true".to_string()),
        ]);
        self.nodes.insert(
            name.to_string(),
            MNode {
                name: name.to_string(),
                labels,
                ready: true,
                ready_since: now,
                taints: Vec::new(),
                allocatable: Quantities::new(),
                unserved_for: 0,
                status_written: now,
            },
        );
    }

    /// An agent pod of `revision` on `node`, just created.
    pub fn create_pod(&mut self, node: &str, revision: &str, now: Timestamp) {
        self.create_owned_pod(node, revision, Owner::Target, revision, now);
    }

    /// An agent pod of `revision` owned by `owner`, labelled `hash`.
    pub fn create_owned_pod(
        &mut self,
        node: &str,
        revision: &str,
        owner: Owner,
        hash: &str,
        now: Timestamp,
    ) {
        self.created += 1;
        let uid = format!("uid-{}", self.created);
        self.pods.insert(
            uid.clone(),
            MPod {
                name: format!("plugin-{}", self.created),
                uid,
                node: node.to_string(),
                revision: revision.to_string(),
                owner,
                hash: hash.to_string(),
                age: 0,
                created: now,
                deleted: None,
                running: false,
                ready: false,
                ready_since: None,
                waiting: None,
                restarts: 0,
                terminating: None,
                version: "0".into(),
            },
        );
    }

    /// The template of `revision` written to the DaemonSet.
    pub fn write_revision(&mut self, revision: &str) {
        self.ds.template = revision.into();
        self.ds.generation += 1;
    }

    /// Makes a node NotReady (the node lifecycle controller taints it) or Ready again.
    pub fn set_node_ready(&mut self, node: &str, ready: bool, now: Timestamp) {
        if let Some(n) = self.nodes.get_mut(node) {
            if n.ready != ready {
                n.ready_since = now;
            }
            n.ready = ready;
            n.taints
                .retain(|t| !t.key.starts_with("node.kubernetes.io/not-ready"));
            if !ready {
                for effect in ["NoSchedule", "NoExecute"] {
                    n.taints.push(Taint {
                        key: "node.kubernetes.io/not-ready".into(),
                        effect: effect.into(),
                        ..Default::default()
                    });
                }
            }
        }
    }

    /// The node and its pods are gone.
    pub fn delete_node(&mut self, node: &str) {
        self.nodes.remove(node);
        self.pods.retain(|_, p| p.node != node);
    }

    /// The nodes the DaemonSet covers now.
    pub fn covered_nodes(&self) -> BTreeSet<String> {
        self.nodes
            .values()
            .filter(|n| n.is_covered())
            .map(|n| n.name.clone())
            .collect()
    }

    /// One second, ending at `now`: the DaemonSet controller, the kubelets
    /// and the agents move. Returns the agent pods created, as (node,
    /// revision).
    pub fn advance(
        &mut self,
        now: Timestamp,
        releases: &BTreeMap<String, Release>,
    ) -> Vec<(String, String)> {
        let ds = &mut self.ds;
        if ds.observed_generation < ds.generation {
            ds.observed_generation = ds.generation;
            let next = ds.revisions.values().max().copied().unwrap_or(0) + 1;
            // A template seen before keeps its hash and gets the newest number.
            ds.revisions.insert(ds.template.clone(), next);
        }
        // Terminating pods go.
        for p in self.pods.values_mut() {
            if let Some(t) = p.terminating.as_mut() {
                *t -= 1;
            }
        }
        self.pods.retain(|_, p| p.terminating.is_none_or(|t| t > 0));
        // Kubelets: pods start, become Ready or crash.
        for p in self.pods.values_mut().filter(|p| p.terminating.is_none()) {
            let before = (p.running, p.ready, p.waiting.clone());
            p.age += 1;
            let release = releases
                .get(&p.revision)
                .copied()
                .unwrap_or(Release::Healthy);
            match release {
                Release::Crashloop => {
                    if p.age >= 2 {
                        p.waiting = Some("CrashLoopBackOff".into());
                        p.restarts = (p.age / 2) as i32;
                    }
                }
                Release::Unready => p.running = p.age >= 1,
                _ => {
                    p.running = p.age >= 1;
                    p.ready = p.age >= 2;
                }
            }
            if before != (p.running, p.ready, p.waiting.clone()) {
                p.version = format!("{}", p.version.parse::<u64>().unwrap_or(0) + 1);
            }
            if p.ready != before.1 {
                p.ready_since = p.ready.then_some(now);
            }
        }
        if self.selector.is_some() {
            let created = self.selector_controllers(now);
            self.advertise(now, releases);
            self.run_probes();
            return created;
        }
        // The DaemonSet controller: a pod on every covered node without one,
        // once the old one has terminated, only with updates OnDelete.
        let mut created = Vec::new();
        for node in self.covered_nodes() {
            let has_pod = self.pods.values().any(|p| p.node == node);
            if !has_pod {
                let template = self.ds.template.clone();
                self.create_pod(&node, &template, now);
                created.push((node, template));
            }
        }
        self.advertise(now, releases);
        self.run_probes();
        created
    }

    /// The scheduler and kubelet of probe pods: a probe is scheduled once its
    /// node advertises a device (else it stays Pending, unschedulable), runs
    /// a second, and succeeds if the node still advertises one.
    fn run_probes(&mut self) {
        let nodes = self.nodes.clone();
        let devices = |node: &str| {
            nodes
                .get(node)
                .and_then(|n| n.allocatable.get(RESOURCE))
                .and_then(saferollout_api::quantity_count)
                .unwrap_or(0)
        };
        for p in self.probes.values_mut() {
            match p.phase.as_str() {
                "Pending" => {
                    p.unschedulable = devices(&p.node) < 1;
                    if !p.unschedulable {
                        p.phase = "Running".into();
                    }
                }
                "Running" => {
                    p.running_for += 1;
                    if p.running_for >= 1 {
                        p.phase = if devices(&p.node) >= 1 {
                            "Succeeded"
                        } else {
                            "Failed"
                        }
                        .into();
                    }
                }
                _ => {}
            }
        }
        // A deleted node takes its probes with it.
        self.probes.retain(|_, p| nodes.contains_key(&p.node));
    }

    /// Device plugins: allocatable follows the Ready agent's release, and
    /// the kubelet writes the node's status (stamped with its heartbeat)
    /// when that changes; and, as the report of a plugin's registration, in
    /// the second after its pod became Ready if it has not written since
    /// (a status written in the Ready's own second does not count as after
    /// it: the API keeps whole seconds).
    pub fn advertise(&mut self, now: Timestamp, releases: &BTreeMap<String, Release>) {
        let pods: Vec<MPod> = self.pods.values().cloned().collect();
        for node in self.nodes.values_mut() {
            // With two agents on a node (a make-before-break handover), the
            // kubelet uses the newer one.
            let serving = pods
                .iter()
                .filter(|p| p.node == node.name && p.serves())
                .max_by_key(|p| p.created);
            if let Some(ready) = serving.and_then(|p| p.ready_since)
                && node.status_written.as_second() <= ready.as_second()
                && now.as_second() > ready.as_second()
            {
                node.status_written = now;
            }
            let count = match serving {
                Some(p) => {
                    node.unserved_for = 0;
                    let release = releases
                        .get(&p.revision)
                        .copied()
                        .unwrap_or(Release::Healthy);
                    release.advertises(node.zone(), p.age)
                }
                None => {
                    node.unserved_for += 1;
                    if node.unserved_for > 1 {
                        0
                    } else {
                        continue;
                    }
                }
            };
            let shown = node.allocatable.get(RESOURCE).map(|q| q.0.as_str());
            if shown != Some(count.to_string().as_str()) {
                node.allocatable
                    .insert(RESOURCE.to_string(), Quantity(count.to_string()));
                node.status_written = now;
            }
        }
    }

    /// A DaemonSet write, a JSON patch guarded by the generation the pass
    /// decided from: the generation it made, `None` when the guard failed.
    pub fn patch_daemonset(
        &mut self,
        decided_generation: i64,
        patch: impl FnOnce(&mut MDaemonSet),
    ) -> Option<i64> {
        if self.ds.generation != decided_generation {
            return None;
        }
        patch(&mut self.ds);
        self.ds.generation += 1;
        Some(self.ds.generation)
    }

    /// Creates the last-good backup of `revision`; one that exists already
    /// (409) is kept, whatever it holds.
    pub fn create_backup(&mut self, revision: &str) {
        // Under Selector, the canary's revisions are the DaemonSet's too.
        let canary_knows = self
            .selector
            .as_ref()
            .and_then(|s| s.canary.as_ref())
            .is_some_and(|c| c.ds.revisions.contains_key(revision));
        let known = self.ds.revisions.contains_key(revision) || canary_knows;
        if known && self.backup.as_deref() != Some(revision) {
            self.backup = Some(revision.to_string());
            self.backup_content = Some(content_of(revision));
        }
    }

    /// Writes the rollout's labels on `node` (`stage`), or removes them
    /// (`None`); false when the node is gone (404).
    pub fn label_node(&mut self, node: &str, stage: Option<usize>) -> bool {
        let Some(node) = self.nodes.get_mut(node) else {
            return false;
        };
        match stage {
            Some(stage) => {
                node.labels.insert(ROLLOUT_LABEL.into(), ROLLOUT_ID.into());
                node.labels.insert(STAGE_LABEL.into(), stage.to_string());
            }
            None => {
                node.labels.remove(ROLLOUT_LABEL);
                node.labels.remove(STAGE_LABEL);
            }
        }
        true
    }

    /// Whether the agent pod `uid` is no longer at resourceVersion
    /// `unchanged_since` (`None`: no condition, never); a pod gone has not
    /// changed.
    pub fn pod_changed_since(&self, uid: &str, unchanged_since: Option<&str>) -> bool {
        self.pods
            .get(uid)
            .is_some_and(|p| unchanged_since.is_some_and(|v| v != p.version))
    }

    /// Deletes the agent pod `uid` (the UID is a precondition of the
    /// delete), only if its resourceVersion is still `unchanged_since` when
    /// that is set.
    pub fn delete_pod(
        &mut self,
        uid: &str,
        unchanged_since: Option<&str>,
        now: Timestamp,
    ) -> Deletion {
        let grace = 1 + (self.created % 2) as i64;
        if self.pod_changed_since(uid, unchanged_since) {
            return Deletion::Changed;
        }
        let Some(p) = self.pods.get_mut(uid) else {
            return Deletion::Gone;
        };
        if p.terminating.is_some() {
            return Deletion::Terminating;
        }
        let served = p.running && p.ready;
        p.terminating = Some(grace);
        p.deleted = Some(now);
        p.ready = false;
        p.ready_since = None;
        Deletion::Started {
            node: p.node.clone(),
            served,
        }
    }

    /// Sets taint `taint` on `node`, replacing one of the same key.
    pub fn taint(&mut self, node: &str, taint: Taint) {
        if let Some(node) = self.nodes.get_mut(node) {
            node.taints.retain(|x| x.key != taint.key);
            node.taints.push(taint);
        }
    }

    /// Cordons `node` for the rollout's maintenance: its mark and the
    /// taint the node lifecycle controller adds (at once, in the model).
    pub fn cordon(&mut self, node: &str) {
        if let Some(n) = self.nodes.get_mut(node) {
            n.labels
                .insert(saferollout_api::MAINTENANCE_LABEL.into(), ROLLOUT_ID.into());
        }
        self.taint(
            node,
            Taint {
                key: "node.kubernetes.io/unschedulable".into(),
                effect: "NoSchedule".into(),
                ..Default::default()
            },
        );
    }

    /// Uncordons `node` if the rollout's mark is on it.
    pub fn uncordon(&mut self, node: &str) {
        let Some(n) = self.nodes.get_mut(node) else {
            return;
        };
        if n.labels
            .get(saferollout_api::MAINTENANCE_LABEL)
            .map(String::as_str)
            != Some(ROLLOUT_ID)
        {
            return;
        }
        n.labels.remove(saferollout_api::MAINTENANCE_LABEL);
        self.untaint(node, "node.kubernetes.io/unschedulable");
    }

    /// Removes the taints of `key` from `node`.
    pub fn untaint(&mut self, node: &str, key: &str) {
        if let Some(node) = self.nodes.get_mut(node) {
            node.taints.retain(|x| x.key != key);
        }
    }

    /// Creates probe pod `name` on `node`, unless it exists already or the
    /// node is gone.
    pub fn create_probe(&mut self, name: &str, node: &str) {
        if self.probes.contains_key(name) || !self.nodes.contains_key(node) {
            return;
        }
        self.created += 1;
        self.probes.insert(
            name.to_string(),
            MProbe {
                uid: format!("probe-uid-{}", self.created),
                node: node.to_string(),
                phase: "Pending".into(),
                unschedulable: false,
                running_for: 0,
            },
        );
    }

    /// Deletes probe pod `name` if its UID is still `uid`.
    pub fn delete_probe(&mut self, name: &str, uid: &str) {
        if self.probes.get(name).is_some_and(|p| p.uid == uid) {
            self.probes.remove(name);
        }
    }

    /// Every covered node runs one Ready pod of `revision`.
    pub fn all_on(&self, revision: &str) -> bool {
        self.nodes.values().filter(|n| n.is_covered()).all(|n| {
            let pods: Vec<&MPod> = self.pods.values().filter(|p| p.node == n.name).collect();
            pods.len() == 1 && pods[0].revision == revision && pods[0].ready
        })
    }

    pub fn pods_on(&self, revision: &str) -> usize {
        self.pods
            .values()
            .filter(|p| p.revision == revision)
            .count()
    }

    pub fn labelled(&self) -> Vec<&String> {
        self.nodes
            .values()
            .filter(|n| n.labels.contains_key(ROLLOUT_LABEL))
            .map(|n| &n.name)
            .collect()
    }

    /// Every node's allocatable: the node watch delivers its changes.
    pub fn allocatable(&self) -> Vec<(&String, &Quantities)> {
        self.nodes
            .values()
            .map(|n| (&n.name, &n.allocatable))
            .collect()
    }

    /// What of the cluster a settled rollout would react to.
    pub fn fingerprint(&self) -> String {
        let pods: Vec<_> = self
            .pods
            .values()
            .map(|p| {
                (
                    &p.uid,
                    &p.revision,
                    (p.owner, &p.hash),
                    p.running,
                    p.ready,
                    &p.waiting,
                    p.terminating.is_some(),
                )
            })
            .collect();
        let nodes: Vec<_> = self
            .nodes
            .values()
            // Not allocatable: a flapping plugin that became stable changes it
            // forever, and a rollout that watches it has a timer pending anyway.
            .map(|n| (&n.name, &n.labels, n.ready, &n.taints))
            .collect();
        format!(
            "{:?}{:?}{:?}{:?}{:?}{:?}{:?}",
            self.ds.template,
            self.ds.observed_generation,
            self.ds.revisions,
            pods,
            (nodes, &self.backup, &self.backup_content),
            self.probes,
            self.selector,
        )
    }
}
