//! Health gates: pure judgements of a stage's nodes from a snapshot of the
//! cluster. Each gate is one module exposing `evaluate(&Snapshot, ...)`; adding a
//! gate is one new module plus one line in [`evaluate_all`].
//!
//! A gate answers Pending (not decided yet), Passed or Failed. Gates with a soak
//! time only pass (or fail) when their observation has held for the whole soak:
//! a plugin restart makes allocatable dip for a moment, and a flapping plugin
//! must not pass on a lucky sample.

pub mod allocatable;
pub mod pods_ready;

use std::collections::BTreeMap;
use std::time::Duration;

use jiff::Timestamp;
use saferollout_api::{GateResult, GateStatus, SafeRolloutSpec};

/// What the gates see of one agent pod.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct AgentPod {
    pub name: String,
    pub node: String,
    /// The pod's `controller-revision-hash` label.
    pub revision: String,
    pub running: bool,
    pub ready: bool,
    pub deleting: bool,
    /// `state.waiting.reason` of the first container that waits (CrashLoopBackOff, ...).
    pub waiting_reason: Option<String>,
    pub waiting_message: Option<String>,
    pub restarts: i32,
}

/// What the gates see of one node.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NodeState {
    pub allocatable: BTreeMap<String, i64>,
    pub labels: BTreeMap<String, String>,
}

/// A stage's view of the cluster at one instant.
#[derive(Debug, Clone)]
pub struct Snapshot<'a> {
    /// Every node the rollout has taken so far (this stage and earlier ones).
    pub nodes: &'a [String],
    /// Agent pods by node name.
    pub pods: &'a BTreeMap<String, Vec<AgentPod>>,
    /// Node states by name; a node missing here has been deleted.
    pub node_states: &'a BTreeMap<String, NodeState>,
    pub target_revision: &'a str,
    /// Per node, per resource: allocatable captured before the stage touched the node.
    pub baseline: &'a BTreeMap<String, BTreeMap<String, i64>>,
    pub stage_started: Timestamp,
    pub progress_deadline: Duration,
    pub now: Timestamp,
}

impl Snapshot<'_> {
    /// The pod of the target revision on `node`, if it exists and is not being deleted.
    pub fn target_pod(&self, node: &str) -> Option<&AgentPod> {
        self.pods
            .get(node)?
            .iter()
            .find(|p| !p.deleting && p.revision == self.target_revision)
    }

    pub fn deadline_passed(&self) -> bool {
        elapsed(self.stage_started, self.now) >= self.progress_deadline
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
) -> Vec<GateResult> {
    let prev = |name: &str| previous.iter().find(|g| g.gate == name);
    let mut results = vec![pods_ready::evaluate(snap)];
    if let Some(gates) = &spec.gates {
        for gate in gates.allocatable.iter() {
            let name = allocatable::gate_name(&gate.resource);
            results.push(allocatable::evaluate(gate, snap, prev(&name)));
        }
    }
    results
}

/// The first failed gate, if any.
pub fn first_failure(results: &[GateResult]) -> Option<&GateResult> {
    results.iter().find(|g| g.status == GateStatus::Failed)
}

pub fn all_passed(results: &[GateResult]) -> bool {
    results.iter().all(|g| g.status == GateStatus::Passed)
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

#[cfg(test)]
pub(crate) mod test_support {
    use super::*;

    pub fn ts(secs: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + secs).unwrap()
    }

    pub fn ready_pod(node: &str, revision: &str) -> AgentPod {
        AgentPod {
            name: format!("agent-{node}"),
            node: node.into(),
            revision: revision.into(),
            running: true,
            ready: true,
            ..Default::default()
        }
    }

    /// Owns the data a [`Snapshot`] borrows.
    pub struct World {
        pub nodes: Vec<String>,
        pub pods: BTreeMap<String, Vec<AgentPod>>,
        pub node_states: BTreeMap<String, NodeState>,
        pub baseline: BTreeMap<String, BTreeMap<String, i64>>,
        pub now: Timestamp,
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
                now: ts(100),
            };
            for n in &nodes {
                w.pods.insert(n.clone(), vec![ready_pod(n, "new")]);
                let alloc = BTreeMap::from([("example.com/gpu".to_string(), gpus)]);
                w.node_states.insert(
                    n.clone(),
                    NodeState {
                        allocatable: alloc.clone(),
                        labels: BTreeMap::new(),
                    },
                );
                w.baseline.insert(n.clone(), alloc);
            }
            w
        }

        pub fn snapshot(&self) -> Snapshot<'_> {
            Snapshot {
                nodes: &self.nodes,
                pods: &self.pods,
                node_states: &self.node_states,
                target_revision: "new",
                baseline: &self.baseline,
                stage_started: ts(0),
                progress_deadline: Duration::from_secs(600),
                now: self.now,
            }
        }
    }
}
