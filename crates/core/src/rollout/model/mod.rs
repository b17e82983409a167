//! A model of the cluster the state machine drives, for its unit and property
//! tests, in three parts, each in its own file:
//! - [`cluster`]: the simulated cluster (the DaemonSet controller, the
//!   kubelets and agents, nodes going NotReady, tainted, deleted or joining,
//!   probe pods, and the API server's answers to writes);
//! - [`executor`]: the operator's runtime around [`crate::decide`]: lagging
//!   caches, its memory of its own writes
//!   ([`crate::expectations::Expectations`]), the pass's plan
//!   ([`crate::pass::plan`]) executed with lost writes, the label writer;
//! - [`checker`]: the safety rules, judged on every decision and on the
//!   cluster after every pass.
//!
//! This file holds them together: the model's state, the clock (one second
//! of everything) and the loops that run passes.
//!
//! Everything is deterministic given the inputs; randomness comes from the
//! property tests' choices.

mod checker;
mod cluster;
mod executor;
mod selector;

use std::collections::BTreeMap;
use std::time::Duration;

use jiff::{SignedDuration, Timestamp};
use saferollout_api::{AllocatableGate, Gates, SafeRolloutSpec, SafeRolloutStatus};

use self::checker::Checker;
use self::cluster::Cluster;
pub use self::cluster::{GPUS, Losses, RESOURCE, Release, content_of};
pub use self::executor::Lag;
use self::executor::{Caches, LabelWriter};
use super::{Action, Decision};
use crate::expectations::Expectations;

/// The SafeRollout's namespace and name, as its labels on nodes name it.
const ROLLOUT_ID: &str = "ns.plugin";

/// One SafeRollout (spec, status and requests, as the operator reads and
/// writes them) over the simulated cluster, the operator's runtime and the
/// checker.
pub struct Model {
    pub spec: SafeRolloutSpec,
    pub status: SafeRolloutStatus,
    pub retry: Option<String>,
    pub approve: Option<String>,
    pub abort: Option<String>,
    /// `spec.template`'s hash (GitOps mode); its revision is `spec-<hash>`.
    pub spec_hash: Option<String>,
    /// The operator's limits (none by default).
    pub limits: crate::limits::AdminLimits,
    /// The clock of the cluster and the operator.
    pub now: Timestamp,
    /// The simulated cluster.
    pub cluster: Cluster,
    /// How each revision's agent behaves.
    pub releases: BTreeMap<String, Release>,
    /// The operator's memory of its own writes (a restart forgets it).
    pub expectations: Expectations,
    /// When the operator last wrote the status (its memory: a restart
    /// forgets it), for the plan's deferred writes.
    pub status_written_at: Option<Timestamp>,
    /// When the operator's caches last heard from the API server, if they
    /// went silent (`None`: they vouch for now).
    pub caches_heard_at: Option<Timestamp>,
    /// What the operator's caches show.
    pub(super) caches: Caches,
    /// The promotion taints this operator wrote (its memory of its own
    /// writes, as for labels: a lagging node cache does not hide them from
    /// the next pass; a restart forgets them and lists anew).
    pub(super) taints_written: std::collections::BTreeSet<String>,
    pub label_writer: LabelWriter,
    /// Every action the passes performed.
    pub actions_log: Vec<Action>,
    /// The last passes, for a failing test's message.
    pub trace: Vec<String>,
    /// The safety rules' findings and counts.
    pub checker: Checker,
    /// A SafeRolloutPolicy governing the rollout, as the operator would
    /// gather it; `None`: none does.
    pub fleet: Option<FleetModel>,
    /// Workload pods by node, for `nodeMaintenance.drain`: listed on the
    /// nodes the rollout marked; an eviction removes a pod unless it is
    /// `refused` (a disruption budget at 0).
    pub workloads: BTreeMap<String, Vec<crate::drain::WorkloadPod>>,
    /// The DaemonSet's controller owner (apiVersion, kind): a vendor's
    /// operator, whose DaemonSet the rollout must never write.
    pub owner: Option<(String, String)>,
    /// `spec.ownerRevert` is set (and names that owner): a revert goes
    /// through the owner, which writes the stable revision's template back
    /// when its version field is put back.
    pub owner_revert: bool,
    /// The GitOps tool managing the owner, if one does.
    pub owner_gitops: Option<String>,
}

/// One policy governing the model's rollout (see [`crate::fleet::admit`]).
#[derive(Debug, Clone, Default)]
pub struct FleetModel {
    pub max_disrupted_nodes: Option<usize>,
    /// What the other governed rollouts disrupt, by rollout.
    pub others: Vec<(String, Vec<String>)>,
    pub windows: Vec<crate::fleet::windows::Window>,
    pub waits_for: BTreeMap<String, String>,
}

impl FleetModel {
    pub fn view(&self) -> crate::fleet::Fleet<'_> {
        crate::fleet::Fleet {
            rollout: "gpu/plugin",
            policies: vec![crate::fleet::Governing {
                policy: "stack",
                broken: None,
                budget: crate::fleet::budget::Budget {
                    max_disrupted_nodes: self.max_disrupted_nodes,
                    max_concurrent_rollouts: None,
                },
                others: self
                    .others
                    .iter()
                    .map(|(r, d)| crate::fleet::budget::Demand {
                        rollout: r,
                        disrupted: d.iter().map(String::as_str).collect(),
                        wanted: Vec::new(),
                    })
                    .collect(),
                windows: &self.windows,
                waits_for: &self.waits_for,
            }],
        }
    }
}

impl Model {
    /// `nodes` GPU nodes, alternating zones, each running a Ready `v1` agent.
    pub fn new(nodes: usize) -> Self {
        let mut spec = SafeRolloutSpec::for_daemonset("plugin");
        spec.gates = Some(Gates {
            allocatable: vec![AllocatableGate::new(RESOURCE)],
            ..Default::default()
        });
        let now = Timestamp::from_second(1_800_000_000).unwrap();
        let releases = BTreeMap::from([("v1".to_string(), Release::Healthy)]);
        let mut cluster = Cluster::new();
        let mut checker = Checker::default();
        for i in 0..nodes {
            cluster.add_node(&format!("node-{i:02}"), i, now);
        }
        for name in cluster.nodes.keys().cloned().collect::<Vec<_>>() {
            cluster.create_pod(&name, "v1", now);
            checker.record_pod(&name, "v1");
            let p = cluster.pods.values_mut().find(|p| p.node == name).unwrap();
            p.running = true;
            p.ready = true;
            p.ready_since = Some(now);
            p.age = 100;
        }
        cluster.advertise(now, &releases);
        Model {
            spec,
            status: SafeRolloutStatus::default(),
            retry: None,
            approve: None,
            abort: None,
            spec_hash: None,
            limits: crate::limits::AdminLimits::unlimited(),
            now,
            caches: Caches::new(&cluster),
            taints_written: Default::default(),
            cluster,
            releases,
            expectations: Expectations::default(),
            status_written_at: None,
            caches_heard_at: None,
            label_writer: LabelWriter::default(),
            actions_log: Vec::new(),
            trace: Vec::new(),
            checker,
            fleet: None,
            workloads: BTreeMap::new(),
            owner: None,
            owner_revert: false,
            owner_gitops: None,
        }
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

    /// A Ready GPU node joins, in zone-a for even `i`, zone-b for odd.
    pub fn add_node(&mut self, name: &str, i: usize) {
        self.cluster.add_node(name, i, self.now);
    }

    /// A person (or Helm) writes the template of `revision` to the DaemonSet.
    pub fn write_revision(&mut self, revision: &str, release: Release) {
        self.releases.insert(revision.into(), release);
        self.cluster.write_revision(revision);
    }

    /// Makes a node NotReady (the node lifecycle controller taints it) or Ready again.
    pub fn set_node_ready(&mut self, node: &str, ready: bool) {
        self.cluster.set_node_ready(node, ready, self.now);
    }

    /// The node is deleted, and its pods with it.
    pub fn delete_node(&mut self, node: &str) {
        self.cluster.delete_node(node);
        self.checker.node_deleted(node);
    }

    /// One second: the label writer makes what the last pass queued, then
    /// the cluster moves, and the caches may show it.
    pub fn advance(&mut self) {
        self.write_labels();
        self.now += SignedDuration::from_secs(1);
        for (node, revision) in self.cluster.advance(self.now, &self.releases) {
            self.checker.record_pod(&node, &revision);
        }
        self.checker.after_second(&self.cluster);
        self.caches.record(&self.cluster);
    }

    /// Passes and seconds until nothing changes and nothing is pending, with
    /// fresh caches and no loss. Panics after `max_ticks`.
    pub fn run(&mut self, max_ticks: usize) {
        // Quiet twice in a row: the second pass saw every change of the first
        // second through its caches.
        let mut quiet_passes = 0;
        for _ in 0..max_ticks {
            let before = (self.status.clone(), self.cluster.fingerprint());
            let d = self.reconcile(Lag::default(), Losses::default());
            self.advance();
            let after = (self.status.clone(), self.cluster.fingerprint());
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
            "did not settle in {max_ticks} ticks; status: {:#?}\ncluster: {:#?}\ntrace:\n{}",
            self.status,
            (
                &self.cluster.selector,
                &self.cluster.pods,
                &self.cluster.nodes
            ),
            self.trace[self.trace.len().saturating_sub(8)..].join("\n")
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
            let watched = format!(
                "{}{:?}",
                self.cluster.fingerprint(),
                self.cluster.allocatable()
            );
            let writer_woke = std::mem::take(&mut self.label_writer.woke);
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

    pub fn one_reconcile(&mut self) -> Decision {
        let d = self
            .reconcile(Lag::default(), Losses::default())
            .expect("caches are fresh");
        self.advance();
        d
    }

    /// Every covered node runs one Ready pod of `revision`.
    pub fn all_on(&self, revision: &str) -> bool {
        self.cluster.all_on(revision)
    }

    /// Nodes the DaemonSet covers now.
    pub fn covered_nodes(&self) -> usize {
        self.cluster.covered_nodes().len()
    }

    pub fn pods_on(&self, revision: &str) -> usize {
        self.cluster.pods_on(revision)
    }

    pub fn labelled(&self) -> Vec<&String> {
        self.cluster.labelled()
    }
}
