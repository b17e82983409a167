//! A small cluster for fuzzing the state machine ([`saferollout_core::decide`]):
//! six GPU nodes, a DaemonSet whose pods the "cluster" replaces at once when
//! deleted, with Ready pods that advertise 8 GPUs (0 for a broken
//! revision). Enough to walk a rollout through every phase (adoption,
//! stages, soak, failure, revert) and keep the statuses it went through:
//! the seeds that the fuzzers mutate. Shared by `tests/fuzz_decide.rs` and
//! the coverage-guided target `fuzz/fuzz_targets/decide.rs`.

use std::collections::BTreeMap;

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::apps::v1::DaemonSetUpdateStrategy;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use saferollout_api::{ROLLOUT_LABEL, STAGE_LABEL, SafeRolloutSpec, SafeRolloutStatus};
use saferollout_core::gates::Evidence;
use saferollout_core::limits::AdminLimits;
use saferollout_core::objects::Quantities;
use saferollout_core::rollout::{Action, BackupView, Decision, Observed, Requests, backup_name};
use saferollout_core::views::NodeView;
use saferollout_core::views::{
    AgentPod, DaemonSetView, NodesByName, Placement, PodsByNode, RolloutLabels,
};

pub const RESOURCE: &str = "example.com/gpu";
pub const ROLLOUT_ID: &str = "ns.plugin";

#[derive(Debug, Clone)]
pub struct Node {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub ready: bool,
    pub allocatable: Quantities,
}

#[derive(Debug, Clone)]
pub struct Pod {
    pub name: String,
    pub uid: String,
    pub node: String,
    pub revision: String,
    pub ready: bool,
}

#[derive(Debug, Clone)]
pub struct World {
    pub spec: SafeRolloutSpec,
    pub status: SafeRolloutStatus,
    pub nodes: Vec<Node>,
    pub pods: Vec<Pod>,
    pub strategy: String,
    pub generation: i64,
    /// The revision the DaemonSet's template is.
    pub template: String,
    pub revisions: Vec<String>,
    pub backup: Option<String>,
    /// Revisions whose agents advertise no GPU.
    pub broken: Vec<String>,
    pub requests: (Option<String>, Option<String>, Option<String>),
    pub now: Timestamp,
    pub counter: u64,
}

/// The spec the seeds roll: short stages and soaks, an allocatable gate.
pub fn spec() -> SafeRolloutSpec {
    serde_json::from_value(serde_json::json!({
        "targetRef": {"name": "plugin"},
        "stages": [{"nodes": 1, "soak": "40s"}, {"nodes": "50%", "soak": "20s"}, {"nodes": "100%"}],
        "maxUnavailable": 1,
        "progressDeadline": "3m",
        "gates": {"allocatable": [{"resource": RESOURCE, "min": "baseline", "max": 8, "soak": "20s"}]}
    }))
    .expect("the seed spec deserialises")
}

impl World {
    pub fn new() -> Self {
        let mut w = World {
            spec: spec(),
            status: SafeRolloutStatus::default(),
            nodes: Vec::new(),
            pods: Vec::new(),
            strategy: "RollingUpdate".into(),
            generation: 1,
            template: "v1".into(),
            revisions: vec!["v1".into()],
            backup: None,
            broken: vec!["v3".into()],
            requests: (None, None, None),
            now: Timestamp::from_second(1_800_000_000).expect("a valid time"),
            counter: 0,
        };
        for i in 0..6 {
            let labels = BTreeMap::from([(
                "topology.kubernetes.io/zone".to_string(),
                format!("zone-{}", i % 2),
            )]);
            w.nodes.push(Node {
                name: format!("node-{i}"),
                labels,
                ready: true,
                allocatable: Quantities::new(),
            });
            w.start_pod(&format!("node-{i}"));
        }
        w
    }

    /// A Ready pod of the template on `node`, and what it advertises.
    fn start_pod(&mut self, node: &str) {
        self.counter += 1;
        let revision = self.template.clone();
        let gpus = if self.broken.contains(&revision) {
            "0"
        } else {
            "8"
        };
        if let Some(n) = self.nodes.iter_mut().find(|n| n.name == node) {
            n.allocatable
                .insert(RESOURCE.to_string(), Quantity(gpus.to_string()));
        }
        self.pods.retain(|p| p.node != node);
        self.pods.push(Pod {
            name: format!("plugin-{}", self.counter),
            uid: format!("uid-{}", self.counter),
            node: node.to_string(),
            revision,
            ready: true,
        });
    }

    /// A new template (Helm writes the DaemonSet).
    pub fn write_template(&mut self, revision: &str) {
        self.template = revision.to_string();
        if !self.revisions.iter().any(|r| r == revision) {
            self.revisions.push(revision.to_string());
        }
        self.generation += 1;
    }

    /// One decision on the world as it is (nothing applied).
    pub fn decide(&self) -> Decision {
        let node_views: NodesByName = self
            .nodes
            .iter()
            .map(|n| {
                (
                    n.name.as_str(),
                    NodeView {
                        name: &n.name,
                        labels: &n.labels,
                        ready: n.ready,
                        not_ready_since: (!n.ready).then_some(self.now),
                        // Written after every agent became Ready (below).
                        status_written: Some(self.now),
                        taints: &[],
                        allocatable: &n.allocatable,
                        conditions: &[],
                        ours: RolloutLabels::of(&n.labels),
                    },
                )
            })
            .collect();
        let mut pods = PodsByNode::default();
        for p in &self.pods {
            pods.entry(p.node.as_str()).or_default().push(AgentPod {
                name: &p.name,
                uid: &p.uid,
                resource_version: "1",
                node: &p.node,
                revision: &p.revision,
                running: true,
                ready: p.ready,
                ready_since: p.ready.then(|| self.now - SignedDuration::from_secs(29)),
                created: Some(self.now - SignedDuration::from_secs(30)),
                ..Default::default()
            });
        }
        let strategy = DaemonSetUpdateStrategy {
            type_: Some(self.strategy.clone()),
            ..Default::default()
        };
        let ds = DaemonSetView {
            generation: self.generation,
            observed_generation: self.generation,
            update_strategy: Some(&strategy),
            current_revision: Some(self.template.as_str()),
            known_revisions: self.revisions.iter().map(String::as_str).collect(),
            placement: Placement::default(),
            owner: None,
        };
        let evidence = Evidence::default();
        let limits = AdminLimits::unlimited();
        // A revision's content hash, as the operator computes it from the
        // DaemonSet's ControllerRevisions.
        let content_of = |r: &str| format!("sha256:{r}");
        let contents: BTreeMap<String, String> = self
            .revisions
            .iter()
            .map(|r| (r.clone(), content_of(r)))
            .collect();
        let backup_name = backup_name("plugin", self.backup.as_deref().unwrap_or_default());
        let backup_content = content_of(self.backup.as_deref().unwrap_or_default());
        let o = Observed {
            spec: &self.spec,
            generation: Some(1),
            status: &self.status,
            requests: Requests {
                retry: self.requests.0.as_deref(),
                approve: self.requests.1.as_deref(),
                abort: self.requests.2.as_deref(),
            },
            owned_by_other: None,
            preflight: None,
            daemonset: Some(&ds),
            spec_template: None,
            name: "plugin",
            // As the operator finds it: by the name of status's stable
            // revision, holding what the world wrote there.
            backup: self
                .backup
                .as_deref()
                .filter(|b| self.status.stable_revision.as_deref() == Some(*b))
                .map(|revision| BackupView {
                    name: &backup_name,
                    revision,
                    content: Some(&backup_content),
                }),
            revision_contents: &contents,
            pods: &pods,
            nodes: &node_views,
            rollout_id: ROLLOUT_ID,
            evidence: &evidence,
            limits: &limits,
            now: self.now,
            caches_heard_at: None,
            fleet: None,
            owner_revert: None,
            owner_gitops: None,
        };
        saferollout_core::decide(&o)
    }

    /// One pass: decide, keep the status, let the cluster do what was
    /// asked at once, and let 10 seconds go by.
    pub fn pass(&mut self) -> Decision {
        let d = self.decide();
        self.status = d.status.clone();
        for action in &d.actions {
            self.perform(action);
        }
        self.now += SignedDuration::from_secs(10);
        d
    }

    fn perform(&mut self, action: &Action) {
        match action {
            Action::TakeOverUpdates => {
                self.strategy = "OnDelete".into();
                self.generation += 1;
            }
            Action::BackupTemplate { revision } => self.backup = Some(revision.clone()),
            Action::RestoreLastGood { .. } => {
                if let Some(b) = self.backup.clone() {
                    self.write_template(&b);
                }
            }
            Action::LabelNodes { nodes, stage } => {
                for n in self.nodes.iter_mut().filter(|n| nodes.contains(&n.name)) {
                    n.labels.insert(ROLLOUT_LABEL.into(), ROLLOUT_ID.into());
                    n.labels.insert(STAGE_LABEL.into(), stage.to_string());
                }
            }
            Action::UnlabelNodes { nodes } => {
                for n in self.nodes.iter_mut().filter(|n| nodes.contains(&n.name)) {
                    n.labels.remove(ROLLOUT_LABEL);
                    n.labels.remove(STAGE_LABEL);
                }
            }
            Action::DeletePods { pods } => {
                for r in pods {
                    if self.pods.iter().any(|p| p.uid == r.uid) {
                        self.start_pod(&r.node.clone());
                    }
                }
            }
            _ => {}
        }
    }
}

impl Default for World {
    fn default() -> Self {
        Self::new()
    }
}

/// The worlds a rollout goes through, pass by pass: adoption, a healthy
/// revision through every stage, a broken one failed and reverted. Each is
/// a seed: a status the operator wrote, and the cluster it wrote it on.
pub fn seeds() -> Vec<World> {
    let mut w = World::new();
    let mut out = Vec::new();
    let keep = |w: &World, out: &mut Vec<World>| {
        let last = out.last().map(|l: &World| &l.status);
        if last != Some(&w.status) {
            out.push(w.clone());
        }
    };
    for _ in 0..10 {
        w.pass();
        keep(&w, &mut out);
    }
    for revision in ["v2", "v3"] {
        w.write_template(revision);
        for _ in 0..80 {
            w.pass();
            keep(&w, &mut out);
        }
    }
    out
}
