//! A model of the cluster the state machine drives, for its unit and property
//! tests: the DaemonSet controller (creates a missing agent pod on a node it
//! covers, after the old one has terminated, from the DaemonSet's current
//! template, with a delay), the kubelets and agents (pods start, become Ready
//! or crash as their release dictates; a device plugin advertises what its
//! release advertises; terminating pods take a while to go), nodes (NotReady,
//! tainted, deleted, joining), each node's kubelet writing the node's status
//! (stamped with its heartbeat) when what it reports changes and, after an
//! agent became Ready, in a later second (the report of its registration),
//! probe pods (scheduled only where the node
//! advertises a device, succeeding where the agent still serves it), and the
//! operator's runtime around
//! [`decide`]: caches that lag behind the cluster (each resource on its own,
//! never going backwards), its memory of its own writes
//! ([`Expectations`]), the DaemonSet write guarded by generation, status
//! written before the actions, and writes that get lost.
//!
//! Everything is deterministic given the inputs; randomness comes from the
//! property tests' choices.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::apps::v1::DaemonSetUpdateStrategy;
use k8s_openapi::api::core::v1::Taint;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use saferollout_api::{
    AllocatableGate, Gates, ROLLOUT_LABEL, STAGE_LABEL, SafeRolloutSpec, SafeRolloutStatus,
    StageState, ZONE_LABEL,
};

use super::{Action, BackupView, Decision, Observed, Requests, SpecTemplate, decide};
use crate::eligibility::eligibility;
use crate::expectations::Expectations;
use crate::pass::StatusWrite;
use crate::views::{
    AgentPod, DaemonSetView, NodeView, NodesByName, Placement, PodsByNode, RolloutLabels,
};

pub const GPUS: i64 = 8;
pub const RESOURCE: &str = "example.com/gpu";
const ROLLOUT_ID: &str = "ns.plugin";
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
    pub allocatable: crate::objects::Quantities,
    /// Seconds since the node's plugin stopped serving (allocatable drops to
    /// 0 a second later, as the kubelet device manager does).
    pub unserved_for: i64,
    /// When the kubelet last wrote the node's status (the Ready condition's
    /// lastHeartbeatTime): allocatable is what it computed then.
    pub status_written: Timestamp,
}

impl MNode {
    fn zone(&self) -> &str {
        self.labels
            .get(ZONE_LABEL)
            .map(String::as_str)
            .unwrap_or("")
    }
}

#[derive(Debug, Clone)]
pub struct MPod {
    pub name: String,
    pub uid: String,
    pub node: String,
    pub revision: String,
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
}

/// The content hash of revision `revision`'s template, in the model.
pub fn content_of(revision: &str) -> String {
    format!("sha256:{revision}")
}

/// How many seconds behind the cluster each cache is for the next pass.
#[derive(Debug, Clone, Copy, Default)]
pub struct Lag {
    pub pods: usize,
    pub nodes: usize,
    pub daemonset: usize,
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

pub struct Model {
    pub spec: SafeRolloutSpec,
    /// When the operator last wrote the status (its memory: a restart
    /// forgets it), for the plan's deferred writes.
    pub status_written_at: Option<Timestamp>,
    /// When the operator's caches last heard from the API server, if they
    /// went silent (`None`: they vouch for now).
    pub caches_heard_at: Option<Timestamp>,
    /// The operator's limits (none by default).
    pub limits: crate::limits::AdminLimits,
    pub status: SafeRolloutStatus,
    pub cluster: Cluster,
    /// Cluster states of the last seconds, newest last: what lagging caches show.
    history: Vec<Cluster>,
    /// What each cache showed last (caches never go backwards).
    shown: [usize; 3],
    pub expectations: Expectations,
    pub releases: BTreeMap<String, Release>,
    pub retry: Option<String>,
    pub approve: Option<String>,
    pub abort: Option<String>,
    /// `spec.template`'s hash (GitOps mode); its revision is `spec-<hash>`.
    pub spec_hash: Option<String>,
    pub now: Timestamp,
    counter: usize,
    pub actions_log: Vec<Action>,
    /// Nodes whose Ready agent the operator deleted and that have not served
    /// since (the disruption the budget limits).
    pub disrupted: BTreeSet<String>,
    /// Nodes whose agent failed a gate of a revert and has not served since.
    /// They stay outside the budget until their agent is Ready again, even
    /// when a new revision resets the stages that recorded the failure: the
    /// node is down because of its agent, not of the operator.
    failed_agents: BTreeSet<String>,
    /// Per revision: the nodes that ever got a pod of it.
    pub touched: BTreeMap<String, BTreeSet<String>>,
    /// Per stage index: most nodes seen on the target at once.
    pub max_on_target: BTreeMap<usize, usize>,
    /// Violations of the safety rules seen so far.
    pub violations: Vec<String>,
    /// The last passes, for a failing test's message.
    pub trace: Vec<String>,
    /// The budget (`maxUnavailable` resolved against the covered nodes) the
    /// last pass that deleted pods decided with: a percentage shrinks when
    /// nodes go NotReady, which the operator cannot undo.
    budget_at_last_delete: usize,
    /// Per probe pod: passes in a row it existed while its probe was not
    /// pending in the current stage (it should be deleted).
    pub probe_orphaned: BTreeMap<String, usize>,
    /// Node label writes (labelled or unlabelled), one per node and action.
    pub label_writes: usize,
    /// Label writes queued (nodes, stage; `None`: removal), written at the
    /// next tick.
    label_queue: Vec<(Vec<String>, Option<usize>)>,
    /// The API server's answers to label writes arrive a second after the
    /// watch shows them (the operator's writer records a write only once its
    /// response is in; the node watch may deliver the label first).
    pub label_responses_lag: bool,
    /// Label writes made whose answers the writer records next second
    /// (`Some` once a job's writes are made, with `label_responses_lag`).
    label_responses: Option<Vec<(String, Option<usize>)>>,
    /// The writer recorded the answers of a queued job: as the operator's
    /// writer does, it wakes the rollout for a pass.
    writer_woke: bool,
}

impl Model {
    /// `nodes` GPU nodes, alternating zones, each running a Ready `v1` agent.
    pub fn new(nodes: usize) -> Self {
        let mut spec = SafeRolloutSpec::for_daemonset("plugin");
        spec.gates = Some(Gates {
            allocatable: vec![AllocatableGate::new(RESOURCE)],
            ..Default::default()
        });
        let mut m = Model {
            spec,
            limits: crate::limits::AdminLimits::unlimited(),
            status: SafeRolloutStatus::default(),
            cluster: Cluster {
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
            },
            history: Vec::new(),
            shown: [0; 3],
            expectations: Expectations::default(),
            releases: BTreeMap::from([("v1".to_string(), Release::Healthy)]),
            retry: None,
            approve: None,
            abort: None,
            spec_hash: None,
            now: Timestamp::from_second(1_800_000_000).unwrap(),
            caches_heard_at: None,
            status_written_at: None,
            counter: 0,
            actions_log: Vec::new(),
            disrupted: BTreeSet::new(),
            failed_agents: BTreeSet::new(),
            touched: BTreeMap::new(),
            max_on_target: BTreeMap::new(),
            violations: Vec::new(),
            trace: Vec::new(),
            budget_at_last_delete: 0,
            probe_orphaned: BTreeMap::new(),
            label_writes: 0,
            label_queue: Vec::new(),
            label_responses_lag: false,
            label_responses: None,
            writer_woke: false,
        };
        for i in 0..nodes {
            m.add_node(&format!("node-{i:02}"), i);
        }
        for name in m.cluster.nodes.keys().cloned().collect::<Vec<_>>() {
            m.create_pod(&name, "v1");
            let p = m
                .cluster
                .pods
                .values_mut()
                .find(|p| p.node == name)
                .unwrap();
            p.running = true;
            p.ready = true;
            p.ready_since = Some(m.now);
            p.age = 100;
        }
        m.advertise();
        m.history.push(m.cluster.clone());
        m
    }

    /// Adds a probe gate (one device of the model's resource, 10 s timeout)
    /// probing `sample` nodes of each later stage.
    pub fn add_probe_gate(&mut self, sample: i32) {
        let gates = self.spec.gates.get_or_insert_with(Default::default);
        gates.probe = Some(
            serde_json::from_value(serde_json::json!({
                "image": "probe:v1", "resource": RESOURCE, "sample": sample,
                "delay": "1s", "timeout": "10s",
            }))
            .expect("a probe gate"),
        );
    }

    pub fn add_node(&mut self, name: &str, i: usize) {
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
        self.cluster.nodes.insert(
            name.to_string(),
            MNode {
                name: name.to_string(),
                labels,
                ready: true,
                ready_since: self.now,
                taints: Vec::new(),
                allocatable: crate::objects::Quantities::new(),
                unserved_for: 0,
                status_written: self.now,
            },
        );
    }

    fn create_pod(&mut self, node: &str, revision: &str) {
        self.counter += 1;
        let uid = format!("uid-{}", self.counter);
        self.touched
            .entry(revision.to_string())
            .or_default()
            .insert(node.to_string());
        self.cluster.pods.insert(
            uid.clone(),
            MPod {
                name: format!("plugin-{}", self.counter),
                uid,
                node: node.to_string(),
                revision: revision.to_string(),
                age: 0,
                created: self.now,
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

    /// A person (or Helm) writes the template of `revision` to the DaemonSet.
    pub fn write_revision(&mut self, revision: &str, release: Release) {
        self.releases.insert(revision.into(), release);
        self.cluster.ds.template = revision.into();
        self.cluster.ds.generation += 1;
    }

    /// Makes a node NotReady (the node lifecycle controller taints it) or Ready again.
    pub fn set_node_ready(&mut self, node: &str, ready: bool) {
        if let Some(n) = self.cluster.nodes.get_mut(node) {
            if n.ready != ready {
                n.ready_since = self.now;
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

    pub fn delete_node(&mut self, node: &str) {
        self.cluster.nodes.remove(node);
        self.cluster.pods.retain(|_, p| p.node != node);
        self.disrupted.remove(node);
    }

    fn eligible_truth(&self, node: &MNode) -> bool {
        let sel = BTreeMap::from([(GPU_NODE_LABEL.to_string(), "true".to_string())]);
        let placement = Placement {
            node_selector: Some(&sel),
            ..Default::default()
        };
        eligibility(&node_view(node), &placement).is_eligible()
    }

    /// The nodes the DaemonSet covers now (truth).
    fn covered_node_set(&self) -> BTreeSet<String> {
        self.cluster
            .nodes
            .values()
            .filter(|n| self.eligible_truth(n))
            .map(|n| n.name.clone())
            .collect()
    }

    /// Queues label writes, remembered at once, as the operator's pass does
    /// (`labels::queue`); the writer makes them at the next second.
    fn queue_labels(&mut self, nodes: &[String], stage: Option<usize>) {
        for n in nodes {
            self.expectations.label_queued(n, stage, self.now);
        }
        self.label_queue.push((nodes.to_vec(), stage));
    }

    /// The label writer's work: every queued write, in order.
    fn write_labels(&mut self) {
        // Answers of last second's writes (when they lag behind the watch):
        // the writer wakes the rollout once it has recorded them.
        if let Some(answers) = self.label_responses.take() {
            for (n, stage) in answers {
                self.expectations.label_written(&n, stage, self.now);
            }
            self.writer_woke = true;
        }
        for (nodes, stage) in std::mem::take(&mut self.label_queue) {
            for n in &nodes {
                if self.expectations.label_superseded(n, stage) {
                    continue; // as the operator's writer: a later write is queued
                }
                self.label_writes += 1;
                let Some(node) = self.cluster.nodes.get_mut(n) else {
                    self.expectations.label_failed(n, stage); // 404
                    continue;
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
                if self.label_responses_lag {
                    let answers = self.label_responses.get_or_insert_default();
                    answers.push((n.clone(), stage));
                } else {
                    self.expectations.label_written(n, stage, self.now);
                }
            }
            if self.label_responses_lag {
                self.label_responses.get_or_insert_default();
            } else {
                self.writer_woke = true;
            }
        }
    }

    /// One second of the cluster: the DaemonSet controller, the kubelets and
    /// the agents move.
    pub fn advance(&mut self) {
        self.write_labels();
        self.now += SignedDuration::from_secs(1);
        let ds = &mut self.cluster.ds;
        if ds.observed_generation < ds.generation {
            ds.observed_generation = ds.generation;
            let next = ds.revisions.values().max().copied().unwrap_or(0) + 1;
            // A template seen before keeps its hash and gets the newest number.
            ds.revisions.insert(ds.template.clone(), next);
        }
        // Terminating pods go.
        for p in self.cluster.pods.values_mut() {
            if let Some(t) = p.terminating.as_mut() {
                *t -= 1;
            }
        }
        self.cluster
            .pods
            .retain(|_, p| p.terminating.is_none_or(|t| t > 0));
        // Kubelets: pods start, become Ready or crash.
        let releases = self.releases.clone();
        for p in self
            .cluster
            .pods
            .values_mut()
            .filter(|p| p.terminating.is_none())
        {
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
                p.ready_since = p.ready.then_some(self.now);
            }
        }
        // The DaemonSet controller: a pod on every covered node without one,
        // once the old one has terminated, only with updates OnDelete.
        for node in self.covered_node_set() {
            let has_pod = self.cluster.pods.values().any(|p| p.node == node);
            if !has_pod {
                let template = self.cluster.ds.template.clone();
                self.create_pod(&node, &template);
            }
        }
        self.advertise();
        self.run_probes();
        // A node that stops being covered (NotReady, tainted, gone) leaves the
        // budget: the DaemonSet controller does not count it either, and its
        // agent comes back when the node does, outside the operator's hands.
        let covered = self.covered_node_set();
        self.disrupted.retain(|n| covered.contains(n));
        // A node whose agent serves again is no longer disrupted.
        let serving: BTreeSet<String> = self
            .cluster
            .pods
            .values()
            .filter(|p| p.terminating.is_none() && p.running && p.ready)
            .map(|p| p.node.clone())
            .collect();
        self.disrupted.retain(|n| !serving.contains(n));
        self.failed_agents
            .retain(|n| covered.contains(n) && !serving.contains(n));
        self.history.push(self.cluster.clone());
        if self.history.len() > 8 {
            self.history.remove(0);
            for s in &mut self.shown {
                *s = s.saturating_sub(1);
            }
        }
    }

    /// The scheduler and kubelet of probe pods: a probe is scheduled once its
    /// node advertises a device (else it stays Pending, unschedulable), runs
    /// a second, and succeeds if the node still advertises one.
    fn run_probes(&mut self) {
        let nodes = self.cluster.nodes.clone();
        let devices = |node: &str| {
            nodes
                .get(node)
                .and_then(|n| n.allocatable.get(RESOURCE))
                .and_then(saferollout_api::quantity_count)
                .unwrap_or(0)
        };
        for p in self.cluster.probes.values_mut() {
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
        self.cluster
            .probes
            .retain(|_, p| nodes.contains_key(&p.node));
    }

    /// Device plugins: allocatable follows the Ready agent's release, and
    /// the kubelet writes the node's status (stamped with its heartbeat)
    /// when that changes; and, as the report of a plugin's registration, in
    /// the second after its pod became Ready if it has not written since
    /// (a status written in the Ready's own second does not count as after
    /// it: the API keeps whole seconds).
    fn advertise(&mut self) {
        let pods: Vec<MPod> = self.cluster.pods.values().cloned().collect();
        let now = self.now;
        for node in self.cluster.nodes.values_mut() {
            let serving = pods
                .iter()
                .find(|p| p.node == node.name && p.terminating.is_none() && p.running && p.ready);
            if let Some(ready) = serving.and_then(|p| p.ready_since)
                && node.status_written.as_second() <= ready.as_second()
                && now.as_second() > ready.as_second()
            {
                node.status_written = now;
            }
            let count = match serving {
                Some(p) => {
                    node.unserved_for = 0;
                    let release = self
                        .releases
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

    fn cache(&mut self, which: usize, lag: usize) -> Cluster {
        let newest = self.history.len() - 1;
        let pick = newest
            .saturating_sub(lag)
            .max(self.shown[which])
            .min(newest);
        self.shown[which] = pick;
        self.history[pick].clone()
    }

    /// Drops the caches' lag and the operator's memory: a restarted operator.
    pub fn restart_operator(&mut self) {
        self.expectations = Expectations::default();
        self.status_written_at = None;
        // Label writes still queued die with the process.
        self.label_queue.clear();
        self.label_responses = None;
        let newest = self.history.len() - 1;
        self.shown = [newest; 3];
    }

    /// One reconcile with caches `lag` seconds behind and `losses`: decide,
    /// write status, act. `None` when the pass waited for the DaemonSet cache.
    pub fn reconcile(&mut self, lag: Lag, losses: Losses) -> Option<Decision> {
        let pods_c = self.cache(0, lag.pods);
        let nodes_c = self.cache(1, lag.nodes);
        let ds_c = self.cache(2, lag.daemonset);
        if !self.expectations.daemonset_caught_up(ds_c.ds.generation) {
            return None;
        }
        let decision = self.decide_on(&pods_c, &nodes_c, &ds_c);
        self.check_decision(&decision, &pods_c, &nodes_c, &ds_c);
        let pods: Vec<String> = self
            .cluster
            .pods
            .values()
            .map(|p| {
                let state = if p.terminating.is_some() {
                    "T"
                } else if p.ready {
                    "R"
                } else {
                    "-"
                };
                format!("{}:{}{}", &p.node[5..], p.revision, state)
            })
            .collect();
        self.trace.push(format!(
            "t={} lag={lag:?} loss={losses:?} ds={} target={:?} phase={:?} stage={:?} held={:?} actions={:?} pods=[{}] disrupted={:?}",
            self.now.as_second() % 10_000,
            ds_c.ds.template,
            decision.status.target_revision,
            decision.status.phase,
            decision.status.current_stage,
            decision.status.stages.iter().map(|s| s.nodes.clone()).collect::<Vec<_>>(),
            decision
                .actions
                .iter()
                .filter(|a| !matches!(a, Action::Event { .. }))
                .collect::<Vec<_>>(),
            pods.join(" "),
            self.disrupted,
        ));
        if self.violations.is_empty() && self.trace.len() > 60 {
            self.trace.remove(0);
        }
        // The operator's own plan of the pass, executed here as there.
        let since_last_write = self
            .status_written_at
            .map(|t| crate::gates::elapsed(t, self.now));
        let plan = crate::pass::plan(Some(&self.status), decision.clone(), since_last_write);
        if plan.write == StatusWrite::Before {
            if losses.status {
                return Some(decision);
            }
            self.write_status(&plan.status);
        }
        let covered = nodes_c
            .nodes
            .values()
            .filter(|n| self.eligible_truth(n))
            .count();
        let budget = self.budget(covered);
        let mut lose = losses.first_action;
        for a in &plan.actions {
            if lose {
                lose = false;
                continue;
            }
            self.perform(a, ds_c.ds.generation, budget);
        }
        for e in &plan.events {
            self.perform(e, ds_c.ds.generation, budget);
        }
        if plan.write == StatusWrite::Behind && !losses.status {
            self.write_status(&plan.status);
        }
        self.check_cluster();
        Some(decision)
    }

    fn write_status(&mut self, status: &SafeRolloutStatus) {
        self.status = status.clone();
        self.status_written_at = Some(self.now);
    }

    fn decide_on(&mut self, pods_c: &Cluster, nodes_c: &Cluster, ds_c: &Cluster) -> Decision {
        let mut node_views: NodesByName = nodes_c
            .nodes
            .values()
            .map(|n| (n.name.as_str(), node_view(n)))
            .collect();
        self.expectations
            .apply_labels(&mut node_views, ROLLOUT_ID, self.now);
        let mut pods = PodsByNode::default();
        for p in pods_c.pods.values() {
            pods.entry(p.node.as_str()).or_default().push(pod_view(p));
        }
        self.expectations.apply(&mut pods, self.now);
        let sel = BTreeMap::from([(GPU_NODE_LABEL.to_string(), "true".to_string())]);
        let strategy = DaemonSetUpdateStrategy {
            type_: Some(ds_c.ds.strategy.clone()),
            ..Default::default()
        };
        let current =
            Some(ds_c.ds.template.as_str()).filter(|t| ds_c.ds.revisions.contains_key(*t));
        let ds = DaemonSetView {
            generation: ds_c.ds.generation,
            observed_generation: ds_c.ds.observed_generation,
            update_strategy: Some(&strategy),
            current_revision: current,
            known_revisions: ds_c.ds.revisions.keys().map(String::as_str).collect(),
            placement: Placement {
                node_selector: Some(&sel),
                ..Default::default()
            },
        };
        let spec_revision = self.spec_hash.as_ref().map(|h| format!("spec-{h}"));
        let spec_template = self.spec_hash.as_deref().map(|hash| SpecTemplate {
            hash,
            in_place: spec_revision.as_deref() == Some(ds_c.ds.template.as_str()),
        });
        let proof = crate::gates::proof::ProofEvidence {
            probe_pods: pods_c
                .probes
                .iter()
                .map(|(name, p)| crate::gates::proof::ProbePod {
                    name: name.clone(),
                    uid: p.uid.clone(),
                    node: p.node.clone(),
                    phase: p.phase.clone(),
                    unschedulable: p.unschedulable.then(|| {
                        (
                            "Unschedulable".to_string(),
                            format!("0/1 nodes are available: 1 Insufficient {RESOURCE}"),
                        )
                    }),
                    exit_code: match p.phase.as_str() {
                        "Succeeded" => Some(0),
                        "Failed" => Some(1),
                        _ => None,
                    },
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        };
        let evidence = crate::gates::Evidence::default().with_proof(&proof);
        let contents: BTreeMap<String, String> = ds_c
            .ds
            .revisions
            .keys()
            .map(|r| (r.clone(), content_of(r)))
            .collect();
        let backup_name = super::backup_name("plugin", ds_c.backup.as_deref().unwrap_or_default());
        let o = Observed {
            spec: &self.spec,
            generation: Some(1),
            status: &self.status,
            requests: Requests {
                retry: self.retry.as_deref(),
                approve: self.approve.as_deref(),
                abort: self.abort.as_deref(),
            },
            owned_by_other: None,
            preflight: None,
            daemonset: Some(&ds),
            spec_template,
            name: "plugin",
            // As the operator finds it: by the name of status's stable revision.
            backup: ds_c
                .backup
                .as_deref()
                .filter(|b| self.status.stable_revision.as_deref() == Some(*b))
                .map(|revision| BackupView {
                    name: &backup_name,
                    revision,
                    content: ds_c.backup_content.as_deref(),
                }),
            revision_contents: &contents,
            pods: &pods,
            nodes: &node_views,
            rollout_id: ROLLOUT_ID,
            evidence: &evidence,
            limits: &self.limits,
            now: self.now,
            caches_heard_at: self.caches_heard_at,
        };
        decide(&o)
    }

    /// `budget`: maxUnavailable as the pass resolved it.
    fn perform(&mut self, action: &Action, decided_generation: i64, budget: usize) {
        self.actions_log.push(action.clone());
        let ds = &mut self.cluster.ds;
        // DaemonSet writes are JSON patches guarded by the generation decided from.
        let guarded = |ds: &MDaemonSet| ds.generation == decided_generation;
        match action {
            Action::TakeOverUpdates => {
                if guarded(ds) {
                    ds.strategy = "OnDelete".into();
                    ds.generation += 1;
                    self.expectations.daemonset_written(ds.generation);
                }
            }
            Action::ApplySpecTemplate => {
                if guarded(ds) {
                    let rev = format!("spec-{}", self.spec_hash.clone().expect("GitOps mode"));
                    ds.template = rev;
                    ds.generation += 1;
                    self.expectations.daemonset_written(ds.generation);
                    // The runtime records the generation the write returned.
                    if let Some(a) = self.status.applied_template.as_mut() {
                        a.generation = Some(ds.generation);
                    }
                }
            }
            Action::RestoreLastGood { content } => {
                let Some(backup) = self.cluster.backup.clone() else {
                    self.violations.push("restore without a backup".into());
                    return;
                };
                if *content != content_of(&backup) {
                    self.violations.push(format!(
                        "a revert asked to write {content}, not what the operator backed up of {backup}"
                    ));
                }
                // As the operator does: only a backup holding that content is written.
                if self.cluster.backup_content.as_deref() != Some(content.as_str()) {
                    return;
                }
                if guarded(ds) && ds.template != backup {
                    ds.template = backup;
                    ds.generation += 1;
                    self.expectations.daemonset_written(ds.generation);
                }
            }
            Action::BackupTemplate { revision } => {
                // One that exists already (409) is kept, whatever it holds.
                if ds.revisions.contains_key(revision)
                    && self.cluster.backup.as_ref() != Some(revision)
                {
                    self.cluster.backup = Some(revision.clone());
                    self.cluster.backup_content = Some(content_of(revision));
                }
            }
            // As the operator does: queued (and remembered) now, written by
            // the label writer later (at the next tick).
            Action::LabelNodes { nodes, stage } => self.queue_labels(nodes, Some(*stage)),
            Action::UnlabelNodes { nodes } => self.queue_labels(nodes, None),
            Action::DeletePods { pods } => {
                let exempt = self.exempt_nodes();
                for r in pods {
                    // As the operator does: remembered before the call.
                    self.expectations.pod_deleted(&r.uid, self.now);
                    // The UID is a precondition of the delete.
                    let Some(p) = self.cluster.pods.get_mut(&r.uid) else {
                        continue; // 404: gone already
                    };
                    if r.unchanged_since.as_ref().is_some_and(|v| *v != p.version) {
                        // The resourceVersion precondition failed (409).
                        self.expectations.delete_refused(&r.uid);
                        continue;
                    }
                    if p.terminating.is_some() {
                        continue;
                    }
                    if p.running && p.ready && !exempt.contains(&p.node) {
                        self.disrupted.insert(p.node.clone());
                        self.budget_at_last_delete = budget;
                    }
                    p.terminating = Some(1 + (self.counter % 2) as i64);
                    p.deleted = Some(self.now);
                    p.ready = false;
                    p.ready_since = None;
                }
            }
            Action::Quarantine { taints, .. } => {
                for t in taints {
                    if let Some(node) = self.cluster.nodes.get_mut(&t.node) {
                        node.taints.retain(|x| x.key != t.key);
                        node.taints.push(Taint {
                            key: t.key.clone(),
                            value: Some(t.value.clone()),
                            effect: t.effect.clone(),
                            ..Default::default()
                        });
                    }
                }
            }
            Action::LiftQuarantine { taints, .. } => {
                for t in taints {
                    if let Some(node) = self.cluster.nodes.get_mut(&t.node) {
                        node.taints.retain(|x| x.key != t.key);
                    }
                }
            }
            // The model has no device evidence: no probe is asked for.
            Action::CreateProbe { .. } | Action::DeleteProbes { .. } => {
                self.violations
                    .push(format!("a probe action without a probe gate: {action:?}"));
            }
            Action::Event { .. } => {}
            Action::CreateProbePods { probes } => {
                for p in probes {
                    if self.cluster.probes.contains_key(&p.name)
                        || !self.cluster.nodes.contains_key(&p.node)
                    {
                        continue; // AlreadyExists, or the node is gone
                    }
                    self.counter += 1;
                    self.cluster.probes.insert(
                        p.name.clone(),
                        MProbe {
                            uid: format!("probe-uid-{}", self.counter),
                            node: p.node.clone(),
                            phase: "Pending".into(),
                            unschedulable: false,
                            running_for: 0,
                        },
                    );
                }
            }
            Action::DeleteProbePods { pods } => {
                for (name, uid) in pods {
                    // The UID is a precondition of the delete.
                    if self.cluster.probes.get(name).is_some_and(|p| &p.uid == uid) {
                        self.cluster.probes.remove(name);
                    }
                }
            }
        }
    }

    /// The nodes whose agent failed a gate, when the operator reverts them
    /// itself (outside the budget): not under Quarantine or Halt, which keep
    /// the budget. A node stays exempt until its agent serves again.
    fn exempt_nodes(&self) -> BTreeSet<String> {
        let mut exempt = self.failed_agents.clone();
        exempt.extend(self.failed_in_status());
        exempt
    }

    /// The nodes the status records as failing a gate of the target, when
    /// the operator reverts them itself.
    fn failed_in_status(&self) -> BTreeSet<String> {
        let stopped =
            self.status.stopped.as_ref().is_some_and(|s| {
                self.status.target_revision.as_deref() == Some(s.revision.as_str())
            });
        if stopped {
            return BTreeSet::new();
        }
        self.status
            .stages
            .iter()
            .flat_map(|s| s.failed_nodes.iter().cloned())
            .collect()
    }

    /// Rules on what a decision may do, judged on the snapshot it was made from.
    fn check_decision(
        &mut self,
        d: &Decision,
        pods_c: &Cluster,
        nodes_c: &Cluster,
        ds_c: &Cluster,
    ) {
        let old = &self.status;
        let new = &d.status;
        // A blocked revision never progresses (one a retry unblocks in this
        // very pass is free again).
        for b in old.blocked_revisions.iter().filter(|b| {
            new.blocked_revisions
                .iter()
                .any(|n| n.revision == b.revision)
        }) {
            if new.stable_revision.as_deref() == Some(b.revision.as_str())
                && old.stable_revision != new.stable_revision
            {
                self.violations
                    .push(format!("blocked revision {} became stable", b.revision));
            }
            if ds_c.ds.template == b.revision
                && d.actions
                    .iter()
                    .any(|a| matches!(a, Action::DeletePods { .. }))
            {
                self.violations.push(format!(
                    "pods deleted while the DaemonSet carries blocked revision {}",
                    b.revision
                ));
            }
            if let (Some(h), Some(bh)) = (&self.spec_hash, &b.template_hash)
                && h == bh
                && d.actions.contains(&Action::ApplySpecTemplate)
            {
                self.violations
                    .push(format!("blocked spec.template {h} written again"));
            }
        }
        // A revision stopped by Quarantine or Halt never progresses: while
        // the DaemonSet carries it nothing is replaced, restored or
        // relabelled. (A retry of it in this very pass unblocks it; a new
        // spec.template from Git is written over it, and the check above
        // holds that the stopped one is never written again.)
        if let Some(stopped) = old
            .stopped
            .as_ref()
            .filter(|s| s.revision == ds_c.ds.template && new.stopped.as_ref() == Some(*s))
        {
            for a in &d.actions {
                if matches!(
                    a,
                    Action::DeletePods { .. }
                        | Action::RestoreLastGood { .. }
                        | Action::LabelNodes { .. }
                        | Action::UnlabelNodes { .. }
                ) {
                    self.violations.push(format!(
                        "revision {} stopped by {:?}, yet {a:?}",
                        stopped.revision, stopped.policy
                    ));
                }
            }
        }
        // Every pod a pass deletes:
        // - only where the DaemonSet controller will refill it;
        // - while a stage rolls, only once the node carries its stage's
        //   label (the node itself, not the cache the pass read: the
        //   writer's answer may come before the watch shows the label).
        //   Rolling: the pass saw the DaemonSet on a target not yet stable.
        //   (Returning nodes to the stable revision labels nothing.)
        let rolling = new.phase == Some(saferollout_api::Phase::Progressing)
            && new.target_revision.as_deref() == Some(ds_c.ds.template.as_str())
            && new.target_revision != new.stable_revision;
        for a in &d.actions {
            let Action::DeletePods { pods } = a else {
                continue;
            };
            for p in pods {
                let eligible = nodes_c
                    .nodes
                    .get(&p.node)
                    .is_some_and(|n| self.eligible_truth(n));
                if !eligible {
                    self.violations
                        .push(format!("deleted the agent of ineligible node {}", p.node));
                }
                // (A node gone meanwhile takes its pods with it.)
                let Some(node) = self.cluster.nodes.get(&p.node).filter(|_| rolling) else {
                    continue;
                };
                // A node listed by two stages belongs to the later one.
                let stage = new
                    .stages
                    .iter()
                    .filter(|s| s.nodes.contains(&p.node))
                    .map(|s| s.index.to_string())
                    .next_back();
                let carries = node.labels.get(ROLLOUT_LABEL).map(String::as_str)
                    == Some(ROLLOUT_ID)
                    && stage.is_some()
                    && node.labels.get(STAGE_LABEL) == stage.as_ref();
                if !carries {
                    self.violations.push(format!(
                        "deleted the agent of node {} before it carried the label of stage {}",
                        p.node,
                        stage.as_deref().unwrap_or("(none)")
                    ));
                }
            }
        }
        // A baseline is taken only from a status written after the node's
        // (stable) agent became Ready: right after a revert the node may
        // still show what the reverted release left.
        for s in &new.stages {
            for n in s.baseline.keys() {
                let recorded_before = old
                    .stage(s.index)
                    .is_some_and(|o| o.baseline.contains_key(n))
                    && old.target_revision == new.target_revision;
                if recorded_before {
                    continue;
                }
                let ready_since = pods_c
                    .pods
                    .values()
                    .filter(|p| &p.node == n && p.terminating.is_none())
                    .filter_map(|p| p.ready_since)
                    .max();
                let written = nodes_c.nodes.get(n).map(|node| node.status_written);
                if !crate::gates::freshness::written_after(written, ready_since) {
                    self.violations.push(format!(
                        "baseline of node {n} taken from its status written at {written:?}, not after its agent became Ready at {ready_since:?}"
                    ));
                }
            }
        }
        // No stage passes without judging every node it holds, on the target.
        let target = new.target_revision.clone().unwrap_or_default();
        for s in &new.stages {
            let was = old
                .stage(s.index)
                .is_some_and(|o| o.state == StageState::Passed);
            if s.state != StageState::Passed || was || old.target_revision != new.target_revision {
                continue;
            }
            let held: Vec<&String> = new
                .stages
                .iter()
                .filter(|x| x.index <= s.index)
                .flat_map(|x| x.nodes.iter())
                .collect();
            if held.is_empty() {
                self.violations
                    .push(format!("stage {} passed holding no node", s.index));
            }
            for n in held {
                let ok = pods_c.pods.values().any(|p| {
                    &p.node == n && p.revision == target && p.terminating.is_none() && p.ready
                });
                let alloc = nodes_c
                    .nodes
                    .get(n)
                    .and_then(|node| node.allocatable.get(RESOURCE))
                    .map(|q| q.0.clone());
                let baseline = new
                    .stages
                    .iter()
                    .find_map(|x| x.baseline.get(n))
                    .and_then(|b| b.get(RESOURCE).copied());
                let count = alloc
                    .as_deref()
                    .and_then(saferollout_api::count_of)
                    .unwrap_or(0);
                // A node with a baseline must advertise it (a baseline of 0 sets no
                // bound: the node had no device); one without, at least one device.
                let in_bounds = match baseline {
                    Some(0) => true,
                    Some(b) => count == b,
                    None => count >= 1,
                };
                if !ok || !in_bounds {
                    self.violations.push(format!(
                        "stage {} passed with node {n} not proven (ready on target: {ok}, allocatable {alloc:?})",
                        s.index
                    ));
                }
                // ... on what the node's kubelet wrote after the new agent
                // became Ready (a later whole second), never on what the old
                // agent left, whatever the soak; so a release that never
                // advertises within bounds there never passes.
                if self.spec.allocatable_gates().is_empty() {
                    continue;
                }
                let ready_since = pods_c
                    .pods
                    .values()
                    .find(|p| {
                        &p.node == n && p.revision == target && p.terminating.is_none() && p.ready
                    })
                    .and_then(|p| p.ready_since);
                let written = nodes_c.nodes.get(n).map(|node| node.status_written);
                if !crate::gates::freshness::written_after(written, ready_since) {
                    self.violations.push(format!(
                        "stage {} passed on node {n}'s status written at {written:?}, not after its agent became Ready at {ready_since:?}",
                        s.index
                    ));
                }
                let zone = nodes_c.nodes.get(n).map(|node| node.zone()).unwrap_or("");
                let steady = self
                    .releases
                    .get(&target)
                    .and_then(|r| r.steady_count(zone));
                if let Some(c) = steady {
                    let steady_in_bounds = match baseline {
                        Some(0) => true,
                        Some(b) => c == b,
                        None => c >= 1,
                    };
                    if !steady_in_bounds {
                        self.violations.push(format!(
                            "stage {} passed with node {n}, where release {target} never advertises within bounds ({c} devices, baseline {baseline:?})",
                            s.index
                        ));
                    }
                }
            }
            // With a probe gate: every probe of the stages passed, and every
            // canary node was probed.
            if self.spec.probe_gate().is_some() {
                for x in new.stages.iter().filter(|x| x.index <= s.index) {
                    for r in &x.probes {
                        if r.status != saferollout_api::GateStatus::Passed {
                            self.violations.push(format!(
                                "stage {} passed with the probe of node {} {:?}",
                                s.index, r.node, r.status
                            ));
                        }
                    }
                }
                if let Some(canary) = new.stages.iter().find(|x| x.index == 0) {
                    for n in &canary.nodes {
                        if !canary.probes.iter().any(|r| &r.node == n) {
                            self.violations.push(format!(
                                "stage {} passed with canary {n} not probed",
                                s.index
                            ));
                        }
                    }
                }
            }
        }
    }

    /// Rules on the cluster after each pass.
    fn check_cluster(&mut self) {
        // A probe pod outlives its stage only until the caches show it.
        let alive = crate::gates::probe::alive(&self.status);
        let mut orphaned = BTreeMap::new();
        for name in self.cluster.probes.keys() {
            if !alive.contains(name) {
                let passes = self.probe_orphaned.get(name).copied().unwrap_or(0) + 1;
                if passes > 15 {
                    self.violations.push(format!(
                        "probe pod {name} outlived its stage for {passes} passes"
                    ));
                }
                orphaned.insert(name.clone(), passes);
            }
        }
        self.probe_orphaned = orphaned;
        // Remembered from now on: with them, the failed agents are every
        // exempt node (`exempt_nodes`).
        let failed = self.failed_in_status();
        self.failed_agents.extend(failed);
        let counted: Vec<&String> = self
            .disrupted
            .iter()
            .filter(|n| !self.failed_agents.contains(*n))
            .filter(|n| {
                self.cluster
                    .nodes
                    .get(*n)
                    .is_some_and(|node| self.eligible_truth(node))
            })
            .collect();
        let budget = self
            .budget(self.covered_node_set().len())
            .max(self.budget_at_last_delete);
        if counted.len() > budget {
            self.violations.push(format!(
                "{} agents down because of the operator ({counted:?}), maxUnavailable {budget}",
                counted.len()
            ));
        }
        if let (Some(target), Some(stage)) =
            (&self.status.target_revision, self.status.current_stage)
        {
            let on_target = self
                .cluster
                .pods
                .values()
                .filter(|p| &p.revision == target && p.terminating.is_none())
                .count();
            let e = self.max_on_target.entry(stage as usize).or_default();
            *e = (*e).max(on_target);
        }
    }

    fn budget(&self, covered: usize) -> usize {
        saferollout_api::resolve_count(&self.spec.max_unavailable, covered.max(1), false)
            .unwrap_or(1)
            .max(1)
    }

    /// Passes and seconds until nothing changes and nothing is pending, with
    /// fresh caches and no loss. Panics after `max_ticks`.
    pub fn run(&mut self, max_ticks: usize) {
        // Quiet twice in a row: the second pass saw every change of the first
        // second through its caches.
        let mut quiet_passes = 0;
        for _ in 0..max_ticks {
            let before = (self.status.clone(), self.fingerprint());
            let d = self.reconcile(Lag::default(), Losses::default());
            self.advance();
            let after = (self.status.clone(), self.fingerprint());
            let quiet = d.as_ref().is_some_and(|d| {
                d.actions.iter().all(|a| matches!(a, Action::Event { .. }))
                    && d.requeue_after.is_none()
            }) && before == after;
            quiet_passes = if quiet { quiet_passes + 1 } else { 0 };
            if quiet_passes == 2 {
                return;
            }
        }
        panic!(
            "did not settle in {max_ticks} ticks; status: {:#?}",
            self.status
        );
    }

    /// Runs passes only when the operator would: a watched object changed
    /// (the cluster, with fresh caches, or the status the last pass wrote), a
    /// requeue the last pass asked for is due (its decision's, or a
    /// remembered write's expiry), or the label writer finished a job. Every
    /// second, until the rollout has succeeded with every covered node on
    /// `revision`: false if it has not after `max_ticks` seconds (a pass that
    /// waited for something whose arrival wakes nothing).
    pub fn run_woken(&mut self, revision: &str, max_ticks: usize) -> bool {
        let mut seen: Option<String> = None;
        let mut due: Option<Timestamp> = Some(self.now);
        for _ in 0..max_ticks {
            if self.status.phase == Some(saferollout_api::Phase::Succeeded) && self.all_on(revision)
            {
                return true;
            }
            let watched = format!("{}{:?}", self.fingerprint(), self.allocatable());
            let writer_woke = std::mem::take(&mut self.writer_woke);
            let woken = writer_woke
                || seen.as_ref() != Some(&watched)
                || due.is_some_and(|t| t <= self.now);
            if woken {
                seen = Some(watched);
                let status_before = self.status.clone();
                let d = self.reconcile(Lag::default(), Losses::default());
                let requeue = match &d {
                    // Waited for the DaemonSet cache: 200 ms.
                    None => Some(Duration::ZERO),
                    Some(d) => [d.requeue_after, self.expectations.next_expiry(self.now)]
                        .into_iter()
                        .flatten()
                        .min(),
                };
                // The status write comes back through the watch.
                let requeue = if self.status != status_before {
                    Some(Duration::ZERO)
                } else {
                    requeue
                };
                due = requeue
                    .map(|r| self.now + SignedDuration::from_secs(r.as_secs_f64().ceil() as i64));
            }
            self.advance();
        }
        false
    }

    /// Every node's allocatable: the node watch delivers its changes.
    fn allocatable(&self) -> Vec<(&String, &crate::objects::Quantities)> {
        self.cluster
            .nodes
            .values()
            .map(|n| (&n.name, &n.allocatable))
            .collect()
    }

    /// What of the cluster a settled rollout would react to.
    fn fingerprint(&self) -> String {
        let c = &self.cluster;
        let pods: Vec<_> = c
            .pods
            .values()
            .map(|p| {
                (
                    &p.uid,
                    &p.revision,
                    p.running,
                    p.ready,
                    &p.waiting,
                    p.terminating.is_some(),
                )
            })
            .collect();
        let nodes: Vec<_> = c
            .nodes
            .values()
            // Not allocatable: a flapping plugin that became stable changes it
            // forever, and a rollout that watches it has a timer pending anyway.
            .map(|n| (&n.name, &n.labels, n.ready))
            .collect();
        format!(
            "{:?}{:?}{:?}{:?}{:?}{:?}",
            c.ds.template,
            c.ds.observed_generation,
            c.ds.revisions,
            pods,
            (nodes, &c.backup, &c.backup_content),
            c.probes
        )
    }

    pub fn one_reconcile(&mut self) -> Decision {
        let d = self
            .reconcile(Lag::default(), Losses::default())
            .expect("caches are fresh");
        self.advance();
        d
    }

    /// Every covered node runs one Ready pod of `revision`.
    pub fn all_on(&self, revision: &str) -> bool {
        self.cluster
            .nodes
            .values()
            .filter(|n| self.eligible_truth(n))
            .all(|n| {
                let pods: Vec<&MPod> = self
                    .cluster
                    .pods
                    .values()
                    .filter(|p| p.node == n.name)
                    .collect();
                pods.len() == 1 && pods[0].revision == revision && pods[0].ready
            })
    }

    /// Nodes the DaemonSet covers now.
    pub fn covered_nodes(&self) -> usize {
        self.cluster
            .nodes
            .values()
            .filter(|n| self.eligible_truth(n))
            .count()
    }

    pub fn pods_on(&self, revision: &str) -> usize {
        self.cluster
            .pods
            .values()
            .filter(|p| p.revision == revision)
            .count()
    }

    pub fn labelled(&self) -> Vec<&String> {
        self.cluster
            .nodes
            .values()
            .filter(|n| n.labels.contains_key(ROLLOUT_LABEL))
            .map(|n| &n.name)
            .collect()
    }
}

pub fn node_view(n: &MNode) -> NodeView<'_> {
    NodeView {
        name: &n.name,
        labels: &n.labels,
        ready: n.ready,
        not_ready_since: (!n.ready).then_some(n.ready_since),
        status_written: Some(n.status_written),
        taints: &n.taints,
        allocatable: &n.allocatable,
        ours: RolloutLabels::of(&n.labels),
    }
}

fn pod_view(p: &MPod) -> AgentPod<'_> {
    AgentPod {
        name: &p.name,
        uid: &p.uid,
        resource_version: &p.version,
        node: &p.node,
        revision: &p.revision,
        running: p.running && p.terminating.is_none(),
        ready: p.ready && p.terminating.is_none(),
        ready_since: p.ready_since.filter(|_| p.ready && p.terminating.is_none()),
        deleting: p.terminating.is_some(),
        waiting_reason: p.waiting.as_deref(),
        waiting_message: None,
        restarts: p.restarts,
        created: Some(p.created),
        deleted: p.deleted,
    }
}

/// The budget check itself: it must see an over-budget deletion, and a node
/// whose agent failed a gate stays outside the count only until it serves.
#[cfg(test)]
mod checker_tests {
    use saferollout_api::StageStatus;

    use super::*;

    fn delete_agent_on(m: &mut Model, node: &str) {
        let pod = m.cluster.pods.values().find(|p| p.node == node).unwrap();
        let pods = vec![super::super::PodRef {
            name: pod.name.clone(),
            uid: pod.uid.clone(),
            node: node.to_string(),
            unchanged_since: None,
        }];
        m.perform(&Action::DeletePods { pods }, 1, 1);
    }

    fn budget_violations(m: &Model) -> Vec<&String> {
        m.violations
            .iter()
            .filter(|v| v.contains("because of the operator"))
            .collect()
    }

    #[test]
    fn two_ready_agents_deleted_at_max_unavailable_one_is_a_violation() {
        let mut m = Model::new(3);
        delete_agent_on(&mut m, "node-00");
        m.check_cluster();
        assert!(budget_violations(&m).is_empty(), "{:?}", m.violations);
        delete_agent_on(&mut m, "node-01");
        m.check_cluster();
        assert_eq!(budget_violations(&m).len(), 1, "{:?}", m.violations);
    }

    #[test]
    fn a_failed_agent_stays_outside_the_budget_until_it_serves_again() {
        let mut m = Model::new(3);
        // The operator replaces node-00's agent; the new one fails a gate and
        // the revert (outside the budget for node-00) replaces node-01's.
        delete_agent_on(&mut m, "node-00");
        m.status.target_revision = Some("v2".into());
        m.status.stages = vec![StageStatus {
            failed_nodes: vec!["node-00".into()],
            ..Default::default()
        }];
        delete_agent_on(&mut m, "node-01");
        m.check_cluster();
        assert!(budget_violations(&m).is_empty(), "{:?}", m.violations);
        // A new revision resets the stages: node-00 is still down because of
        // its agent, not of the operator.
        m.status.target_revision = Some("v3".into());
        m.status.stages.clear();
        m.check_cluster();
        assert!(budget_violations(&m).is_empty(), "{:?}", m.violations);
        // The exemption covers node-00 only: one more Ready agent deleted
        // is over the budget.
        delete_agent_on(&mut m, "node-02");
        m.check_cluster();
        assert_eq!(budget_violations(&m).len(), 1, "{:?}", m.violations);
    }
}
