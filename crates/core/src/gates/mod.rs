//! Health gates: pure judgements of a rollout's nodes from a snapshot of the
//! cluster. Each gate is one module exposing `evaluate(&Snapshot, ...) ->
//! Verdict`; adding a gate is one new module plus one line in
//! [`evaluate_all`] (every file it touches: `docs/development.md`, "Adding
//! a gate"; `complete.rs` checks each field of `Gates` has them).
//!
//! A gate answers Pending (not decided yet), Passed or Failed, and names the
//! nodes whose agent violates it right now (a Ready plugin advertising
//! nothing, a crash-looping pod), soaking or not: while any gate has such a
//! violation the stage replaces no further pod, and when the stage fails those
//! nodes are reverted first. Gates with a soak time only pass (or fail) once
//! their observation has held for the whole soak: a plugin restart makes
//! allocatable dip for a moment, and a flapping plugin must not pass on a lucky
//! sample. A gate that has no node to judge never passes. When the progress
//! deadline passes, every gate still pending fails. A node is judged only on
//! evidence written after its new agent became Ready ([`freshness`]): what
//! the old agent left never passes a gate, whatever its soak.

pub mod allocatable;
pub mod claims;
#[cfg(test)]
mod complete;
pub mod device_health;
pub mod device_taints;
pub mod evidence;
pub mod freshness;
pub mod log_reader;
pub mod logs;
pub mod node_conditions;
pub mod pods_ready;
pub mod probe;
pub mod prometheus;
pub mod proof;
pub mod resource_slices;
pub mod soak;

pub use evidence::Evidence;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use jiff::Timestamp;
use saferollout_api::{GateResult, GateStatus, NodeDevices, SafeRolloutSpec};

use crate::views::{AgentPod, NodeView, NodesByName, PodsByNode};

/// A stage's view of the cluster at one instant.
#[derive(Debug, Clone, Copy)]
pub struct Snapshot<'a> {
    /// Every node the rollout holds now (this stage and earlier ones, without
    /// the skipped ones), sorted.
    pub nodes: &'a [&'a str],
    pub pods: &'a PodsByNode<'a>,
    pub node_views: &'a NodesByName<'a>,
    pub target_revision: &'a str,
    /// The baselines of the rollout's stages so far, in stage order (see
    /// [`Snapshot::baseline`]).
    pub baselines: &'a [&'a BTreeMap<String, saferollout_api::ResourceCounts>],
    /// How long the rollout has gone without progress.
    pub without_progress: Duration,
    /// `spec.progressDeadline`.
    pub progress_deadline: Duration,
    /// What the other gates observe.
    pub evidence: &'a Evidence<'a>,
    /// Per node: what the gated DRA driver published and the claims
    /// allocated there before the stage touched the node.
    pub device_baseline: &'a BTreeMap<String, NodeDevices>,
    /// Nodes whose claims probe passed in this rollout.
    pub probed: &'a BTreeSet<String>,
    pub now: Timestamp,
}

impl<'a> Snapshot<'a> {
    /// The live pod of the target revision on `node`.
    pub fn target_pod(&self, node: &str) -> Option<&'a AgentPod<'a>> {
        self.pods
            .get(node)?
            .iter()
            .find(|p| !p.deleting && p.revision == self.target_revision)
    }

    /// Per resource: the allocatable of `node` captured before the stage
    /// touched it (`None` for a node that joined the rollout on its own). A
    /// node is in one stage; were it in two, the later stage's record counts.
    pub fn baseline(&self, node: &str) -> Option<&'a saferollout_api::ResourceCounts> {
        self.baselines.iter().rev().find_map(|b| b.get(node))
    }

    pub fn node(&self, name: &str) -> Option<&'a NodeView<'a>> {
        self.node_views.get(name)
    }

    /// The progress deadline has passed.
    pub fn deadline_passed(&self) -> bool {
        self.without_progress >= self.progress_deadline
    }
}

/// A gate's verdict: the result recorded in status and the nodes that
/// violate the gate right now.
#[derive(Debug, Clone, PartialEq)]
pub struct Verdict {
    pub result: GateResult,
    pub violating: BTreeSet<String>,
    /// When a pending verdict may change with nothing else changing (a soak
    /// ending): the reconciler looks again then.
    pub recheck_after: Option<Duration>,
    /// Something a person should hear about although the gate does not fail
    /// (e.g. health taints a release cleared): a Warning Event when the
    /// gate's reason first says so.
    pub warning: Option<String>,
}

impl Verdict {
    pub fn new(result: GateResult) -> Self {
        Verdict {
            result,
            violating: BTreeSet::new(),
            recheck_after: None,
            warning: None,
        }
    }
}

pub fn elapsed(since: Timestamp, now: Timestamp) -> Duration {
    now.duration_since(since)
        .try_into()
        .unwrap_or(Duration::ZERO)
}

/// Runs every configured gate; results in a stable order.
pub fn evaluate_all(
    spec: &SafeRolloutSpec,
    snap: &Snapshot,
    previous: &[GateResult],
) -> Vec<Verdict> {
    let prev = |name: &str| previous.iter().find(|g| g.gate == name);
    let pods_ready_deadline = spec.pods_ready_timeout().unwrap_or(snap.progress_deadline);
    let mut verdicts = vec![pods_ready::evaluate(snap, pods_ready_deadline)];
    for gate in spec.allocatable_gates() {
        let name = allocatable::gate_name(&gate.resource);
        verdicts.push(allocatable::evaluate(gate, snap, prev(&name)));
    }
    if let Some(g) = spec.gates.as_ref() {
        if let Some(gate) = &g.node_conditions {
            verdicts.push(node_conditions::evaluate(
                gate,
                snap,
                prev(node_conditions::NAME),
            ));
        }
        if let Some(gate) = &g.resource_slices {
            verdicts.push(resource_slices::evaluate(
                gate,
                snap,
                prev(resource_slices::NAME),
            ));
        }
        if let Some(gate) = &g.claims {
            verdicts.push(claims::evaluate(gate, snap, prev(claims::NAME)));
        }
        if let Some(gate) = &g.device_health {
            verdicts.push(device_health::evaluate(
                gate,
                snap,
                prev(device_health::NAME),
            ));
        }
        if let Some(gate) = &g.device_taints {
            verdicts.push(device_taints::evaluate(
                gate,
                snap,
                prev(device_taints::NAME),
            ));
        }
    }
    if let Some(gate) = spec.logs_gate() {
        verdicts.push(logs::evaluate(gate, snap));
    }
    for gate in spec.prometheus_gates() {
        let name = prometheus::gate_name(&gate.name);
        verdicts.push(prometheus::evaluate(gate, snap, prev(&name)));
    }
    // (probe is judged after these, by the stage: it needs their verdicts
    // and asks for pods; see `probe::step`.)
    verdicts
}

/// Every gate of a stage judged: its verdicts, in the order status records
/// them, and the probe pods to create.
#[derive(Debug)]
pub struct Judged {
    pub verdicts: Vec<Verdict>,
    pub probes: Vec<probe::ProbeRequest>,
}

/// Judges every configured gate of stage `index` (`stages`: the rollout's
/// stage records, the current one among them): [`evaluate_all`], then the
/// gates that need the others' verdicts (probe: it probes only nodes the
/// others find nothing wrong with, and records its probes in `stages`).
/// What it returns is what status records under each gate's name.
pub fn judge(
    spec: &SafeRolloutSpec,
    snap: &Snapshot,
    stages: &mut [saferollout_api::StageStatus],
    index: usize,
    rollout_id: &str,
) -> Judged {
    let previous = stages
        .iter()
        .find(|s| s.index as usize == index)
        .map(|s| s.gates.as_slice())
        .unwrap_or_default();
    let mut verdicts = evaluate_all(spec, snap, previous);
    let mut probes = Vec::new();
    if let Some(gate) = spec.probe_gate() {
        let step = probe::step(gate, snap, stages, index, rollout_id, &verdicts);
        probes = step.create;
        verdicts.push(step.verdict);
    }
    Judged { verdicts, probes }
}

/// The first failed gate, if any.
pub fn first_failure(verdicts: &[Verdict]) -> Option<&GateResult> {
    verdicts
        .iter()
        .map(|v| &v.result)
        .find(|g| g.status == GateStatus::Failed)
}

pub fn all_passed(verdicts: &[Verdict]) -> bool {
    verdicts
        .iter()
        .all(|v| v.result.status == GateStatus::Passed)
}

/// Every node some gate finds violated now.
pub fn violating_nodes(verdicts: &[Verdict]) -> BTreeSet<String> {
    verdicts
        .iter()
        .flat_map(|v| v.violating.iter().cloned())
        .collect()
}

/// A result with the fields every gate fills.
pub(crate) fn result(gate: &str, status: GateStatus, reason: &str, message: String) -> GateResult {
    GateResult {
        gate: gate.to_string(),
        status,
        reason: reason.to_string(),
        message,
        ..Default::default()
    }
}

/// `a, b, c, ...` of at most five names.
pub(crate) fn list_some<S: AsRef<str>>(names: &[S]) -> String {
    let shown: Vec<&str> = names.iter().take(5).map(AsRef::as_ref).collect();
    let more = if names.len() > shown.len() {
        ", ..."
    } else {
        ""
    };
    format!("{}{more}", shown.join(", "))
}

#[cfg(test)]
pub(crate) mod test_support {
    use std::collections::BTreeMap;

    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    use super::*;
    use crate::views::RolloutLabels;

    pub fn ts(secs: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + secs).unwrap()
    }

    /// `value` as the API server stores it and the next pass reads it back:
    /// through JSON, where times keep whole seconds.
    pub fn as_stored<T: serde::Serialize + serde::de::DeserializeOwned>(value: &T) -> T {
        serde_json::from_value(serde_json::to_value(value).unwrap()).unwrap()
    }

    /// A pod as the tests describe it, owning its strings.
    #[derive(Debug, Clone)]
    pub struct TestPod {
        pub name: String,
        pub node: String,
        pub revision: String,
        pub running: bool,
        pub ready: bool,
        pub deleting: bool,
        pub waiting_reason: Option<String>,
        pub restarts: i32,
        /// Since when it is Ready (its Ready condition's lastTransitionTime).
        pub ready_since: Option<Timestamp>,
    }

    /// When the test pods became Ready: before anything the tests write.
    pub const READY_AT: i64 = 0;
    /// When the test nodes' kubelets wrote their status: after the pods
    /// became Ready, so what a test node shows is fresh evidence.
    pub const STATUS_WRITTEN_AT: i64 = 1;

    pub fn ready_pod(node: &str, revision: &str) -> TestPod {
        TestPod {
            name: format!("agent-{node}"),
            node: node.into(),
            revision: revision.into(),
            running: true,
            ready: true,
            deleting: false,
            waiting_reason: None,
            restarts: 0,
            ready_since: Some(ts(READY_AT)),
        }
    }

    /// A node as the tests describe it.
    #[derive(Debug, Clone, Default)]
    pub struct TestNode {
        pub labels: BTreeMap<String, String>,
        pub allocatable: crate::objects::Quantities,
        /// When its kubelet last wrote its status (`None`: never).
        pub status_written: Option<Timestamp>,
        /// Its conditions but Ready (whose heartbeat is `status_written`).
        pub conditions: Vec<crate::objects::SlimCondition>,
    }

    /// Owns the data a [`Snapshot`] borrows.
    pub struct World {
        pub nodes: Vec<String>,
        pub pods: BTreeMap<String, Vec<TestPod>>,
        pub node_states: BTreeMap<String, TestNode>,
        pub baseline: BTreeMap<String, saferollout_api::ResourceCounts>,
        pub device_baseline: BTreeMap<String, NodeDevices>,
        pub probed: BTreeSet<String>,
        pub now: Timestamp,
        pub without_progress: Duration,
    }

    impl World {
        /// `n` nodes, each with a Ready target-revision pod and `gpus` allocatable (also the baseline).
        pub fn healthy(n: usize, gpus: i64) -> Self {
            let nodes: Vec<String> = (0..n).map(|i| format!("node-{i}")).collect();
            let mut w = World {
                nodes: nodes.clone(),
                pods: BTreeMap::new(),
                node_states: BTreeMap::new(),
                baseline: BTreeMap::new(),
                device_baseline: BTreeMap::new(),
                probed: BTreeSet::new(),
                now: ts(100),
                without_progress: Duration::ZERO,
            };
            for n in &nodes {
                w.pods.insert(n.clone(), vec![ready_pod(n, "new")]);
                w.set_alloc(n, &gpus.to_string());
                w.baseline.insert(
                    n.clone(),
                    [("example.com/gpu".to_string(), gpus)]
                        .into_iter()
                        .collect(),
                );
            }
            w
        }

        /// The node's kubelet writes `quantity` as the node's allocatable
        /// (its status written at [`STATUS_WRITTEN_AT`]).
        pub fn set_alloc(&mut self, node: &str, quantity: &str) {
            let n = self.node_states.entry(node.to_string()).or_default();
            n.allocatable
                .insert("example.com/gpu".into(), Quantity(quantity.into()));
            n.status_written.get_or_insert(ts(STATUS_WRITTEN_AT));
        }

        pub fn pod(&mut self, node: &str) -> &mut TestPod {
            &mut self.pods.get_mut(node).unwrap()[0]
        }

        /// Borrows the world as views and runs `f` on its snapshot.
        pub fn with_snapshot<R>(&self, f: impl FnOnce(&Snapshot) -> R) -> R {
            self.with_evidence(&Evidence::default(), f)
        }

        /// [`World::with_snapshot`] with device evidence.
        pub fn with_devices<R>(
            &self,
            devices: Option<&crate::devices::DeviceEvidence>,
            f: impl FnOnce(&Snapshot) -> R,
        ) -> R {
            let mut evidence = Evidence::default();
            evidence.devices = devices;
            self.with_evidence(&evidence, f)
        }

        /// [`World::with_snapshot`] with what the proof gates observe.
        pub fn with_proof<R>(
            &self,
            proof: &crate::gates::proof::ProofEvidence,
            f: impl FnOnce(&Snapshot) -> R,
        ) -> R {
            let evidence = Evidence::default().with_proof(proof);
            self.with_evidence(&evidence, f)
        }

        fn with_evidence<R>(&self, evidence: &Evidence, f: impl FnOnce(&Snapshot) -> R) -> R {
            let pods: PodsByNode = self
                .pods
                .iter()
                .map(|(node, ps)| {
                    let views = ps
                        .iter()
                        .map(|p| AgentPod {
                            name: &p.name,
                            uid: &p.name,
                            resource_version: "1",
                            node: &p.node,
                            revision: &p.revision,
                            running: p.running,
                            ready: p.ready,
                            deleting: p.deleting,
                            waiting_reason: p.waiting_reason.as_deref(),
                            waiting_message: None,
                            restarts: p.restarts,
                            ready_since: p.ready_since.filter(|_| p.ready),
                            created: None,
                            deleted: None,
                        })
                        .collect();
                    (node.as_str(), views)
                })
                .collect();
            let node_views: NodesByName = self
                .node_states
                .iter()
                .map(|(name, n)| {
                    (
                        name.as_str(),
                        NodeView {
                            name,
                            labels: &n.labels,
                            ready: true,
                            not_ready_since: None,
                            status_written: n.status_written,
                            taints: &[],
                            allocatable: &n.allocatable,
                            conditions: &n.conditions,
                            ours: RolloutLabels::of(&n.labels),
                        },
                    )
                })
                .collect();
            let nodes: Vec<&str> = self
                .nodes
                .iter()
                .map(String::as_str)
                .filter(|n| self.node_states.contains_key(*n))
                .collect();
            let baselines = [&self.baseline];
            let snap = Snapshot {
                nodes: &nodes,
                pods: &pods,
                node_views: &node_views,
                target_revision: "new",
                baselines: &baselines,
                without_progress: self.without_progress,
                progress_deadline: Duration::from_secs(600),
                evidence,
                device_baseline: &self.device_baseline,
                probed: &self.probed,
                now: self.now,
            };
            f(&snap)
        }
    }
}
