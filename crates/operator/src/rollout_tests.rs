//! State-machine tests: a small model of the DaemonSet controller and the
//! kubelet/agents executes the machine's actions, so every transition is
//! exercised the way the reconciler drives it (status written, then actions).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::apps::v1::DaemonSetUpdateStrategy;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use saferollout_api::{
    AllocatableGate, BlockedRevision, DurationString, Gates, Phase, SafeRolloutSpec,
    SafeRolloutStatus, Stage, StageState,
};

use super::*;
use crate::conditions;

/// How a release behaves once its pod runs.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Release {
    Healthy,
    Broken,
    Overcount,
    Crashloop,
    Unready,
}

struct Model {
    spec: SafeRolloutSpec,
    status: SafeRolloutStatus,
    ds: DaemonSetView,
    releases: BTreeMap<String, Release>,
    pods: BTreeMap<String, Vec<AgentPod>>,
    nodes: BTreeMap<String, NodeInfo>,
    labelled: BTreeSet<String>,
    backup: Option<String>,
    retry: Option<String>,
    approve: Option<String>,
    abort: Option<String>,
    spec_hash: Option<String>,
    now: Timestamp,
    pod_counter: usize,
    /// Largest number of nodes seen on the target revision, per stage index.
    max_on_target: BTreeMap<usize, usize>,
    /// Nodes whose pod was ever replaced with a non-stable revision.
    touched: BTreeSet<String>,
    actions_log: Vec<Action>,
    gated: Vec<String>,
}

const GPUS: i64 = 8;

impl Model {
    fn new(nodes: usize) -> Self {
        let mut m = Model {
            spec: SafeRolloutSpec::for_daemonset("plugin"),
            status: SafeRolloutStatus::default(),
            ds: DaemonSetView {
                generation: 1,
                observed_generation: 1,
                update_strategy: Some(DaemonSetUpdateStrategy {
                    type_: Some("RollingUpdate".into()),
                    ..Default::default()
                }),
                current_revision: Some("v1".into()),
                known_revisions: BTreeSet::from(["v1".to_string()]),
            },
            releases: BTreeMap::from([("v1".to_string(), Release::Healthy)]),
            pods: BTreeMap::new(),
            nodes: BTreeMap::new(),
            labelled: BTreeSet::new(),
            backup: None,
            retry: None,
            approve: None,
            abort: None,
            spec_hash: None,
            now: Timestamp::from_second(1_800_000_000).unwrap(),
            pod_counter: 0,
            max_on_target: BTreeMap::new(),
            touched: BTreeSet::new(),
            actions_log: Vec::new(),
            gated: vec!["example.com/gpu".to_string()],
        };
        m.spec.gates = Some(Gates {
            allocatable: vec![AllocatableGate::new("example.com/gpu")],
            ..Default::default()
        });
        for i in 0..nodes {
            let name = format!("node-{i:02}");
            m.nodes.insert(
                name.clone(),
                NodeInfo {
                    zone: Some(if i % 2 == 0 { "a" } else { "b" }.into()),
                    canary_eligible: true,
                    state: NodeState {
                        allocatable: BTreeMap::from([("example.com/gpu".to_string(), GPUS)]),
                        labels: BTreeMap::new(),
                    },
                },
            );
            m.start_pod(&name, "v1");
        }
        m
    }

    fn start_pod(&mut self, node: &str, revision: &str) {
        self.pod_counter += 1;
        let release = self.releases[revision];
        let pod = AgentPod {
            name: format!("plugin-{}", self.pod_counter),
            node: node.into(),
            revision: revision.into(),
            running: release != Release::Crashloop,
            ready: matches!(
                release,
                Release::Healthy | Release::Broken | Release::Overcount
            ),
            deleting: false,
            waiting_reason: (release == Release::Crashloop).then(|| "CrashLoopBackOff".to_string()),
            waiting_message: None,
            restarts: if release == Release::Crashloop { 2 } else { 0 },
        };
        let gpus = match release {
            Release::Healthy | Release::Unready => GPUS,
            Release::Overcount => 2 * GPUS,
            Release::Broken | Release::Crashloop => 0,
        };
        self.nodes
            .get_mut(node)
            .unwrap()
            .state
            .allocatable
            .insert("example.com/gpu".into(), gpus);
        self.pods.insert(node.into(), vec![pod]);
    }

    /// A person (or Helm) writes a new template to the DaemonSet.
    fn new_revision(&mut self, revision: &str, release: Release) {
        self.releases.insert(revision.into(), release);
        self.ds.current_revision = Some(revision.into());
        self.ds.known_revisions.insert(revision.into());
        self.bump_generation();
    }

    fn bump_generation(&mut self) {
        self.ds.generation += 1;
        self.ds.observed_generation += 1;
    }

    fn observed(&self) -> Observed<'_> {
        Observed {
            spec: &self.spec,
            generation: Some(1),
            status: &self.status,
            retry: self.retry.as_deref(),
            approve: self.approve.as_deref(),
            abort: self.abort.as_deref(),
            preflight: None,
            daemonset: Some(&self.ds),
            spec_template_hash: self.spec_hash.as_deref(),
            spec_template_in_place: self.spec_hash.as_ref().map(|h| format!("spec-{h}"))
                == self.ds.current_revision,
            backup_revision: self.backup.as_deref(),
            pods: &self.pods,
            nodes: &self.nodes,
            labelled_nodes: &self.labelled,
            gated_resources: &self.gated,
            now: self.now,
        }
    }

    /// One reconcile: decide, persist status, act; then time passes.
    fn tick(&mut self) -> Decision {
        let d = decide(&self.observed());
        self.status = d.status.clone();
        for a in &d.actions {
            self.actions_log.push(a.clone());
            match a {
                Action::TakeOverUpdates => {
                    self.ds.update_strategy = Some(DaemonSetUpdateStrategy {
                        type_: Some("OnDelete".into()),
                        ..Default::default()
                    });
                    self.bump_generation();
                }
                Action::BackupTemplate { revision } => self.backup = Some(revision.clone()),
                Action::ApplySpecTemplate => {
                    let rev = format!("spec-{}", self.spec_hash.clone().unwrap());
                    self.new_revision(&rev, *self.releases.get(&rev).unwrap_or(&Release::Healthy));
                }
                Action::RestoreLastGood => {
                    let stable = self.backup.clone().expect("restore needs a backup");
                    self.ds.current_revision = Some(stable);
                    self.bump_generation();
                }
                Action::LabelNodes { nodes, .. } => self.labelled.extend(nodes.iter().cloned()),
                Action::UnlabelNodes { nodes } => nodes.iter().for_each(|n| {
                    self.labelled.remove(n);
                }),
                Action::DeletePods { pods } => {
                    // The DaemonSet controller recreates each at once with the current template.
                    let current = self.ds.current_revision.clone().unwrap();
                    for (_, node) in pods {
                        if Some(&current) != self.status.stable_revision.as_ref() {
                            self.touched.insert(node.clone());
                        }
                        self.start_pod(node, &current);
                    }
                }
                Action::Event { .. } => {}
            }
        }
        if let (Some(target), Some(stage)) =
            (&self.status.target_revision, self.status.current_stage)
        {
            let on_target = self
                .pods
                .values()
                .flatten()
                .filter(|p| &p.revision == target)
                .count();
            let e = self.max_on_target.entry(stage as usize).or_default();
            *e = (*e).max(on_target);
        }
        self.now += jiff::SignedDuration::from_secs(1);
        d
    }

    /// Ticks until nothing changes and nothing is pending.
    fn run(&mut self, max_ticks: usize) {
        for _ in 0..max_ticks {
            let before = (
                self.status.clone(),
                self.pods.clone(),
                self.ds.current_revision.clone(),
            );
            let d = self.tick();
            let after = (
                self.status.clone(),
                self.pods.clone(),
                self.ds.current_revision.clone(),
            );
            if d.actions.is_empty() && d.requeue_after.is_none() && before == after {
                return;
            }
        }
        panic!(
            "did not settle in {max_ticks} ticks; status: {:#?}",
            self.status
        );
    }

    fn all_on(&self, revision: &str) -> bool {
        self.pods
            .values()
            .all(|ps| ps.len() == 1 && ps[0].revision == revision)
    }

    fn degraded_reason(&self) -> Option<String> {
        conditions::get(&self.status.conditions, conditions::DEGRADED)
            .filter(|c| c.status == "True")
            .map(|c| c.reason.clone())
    }
}

fn healthy_settled(nodes: usize) -> Model {
    let mut m = Model::new(nodes);
    m.run(50);
    assert_eq!(m.status.phase, Some(Phase::Succeeded));
    m
}

#[test]
fn adopting_records_the_original_strategy_and_backs_up_first() {
    let mut m = Model::new(4);
    let d = m.tick();
    assert_eq!(d.actions, vec![Action::TakeOverUpdates]);
    assert_eq!(
        m.status
            .original_update_strategy
            .as_ref()
            .and_then(|s| s.type_.as_deref()),
        Some("RollingUpdate")
    );
    m.tick();
    assert_eq!(m.status.stable_revision.as_deref(), Some("v1"));
    assert_eq!(m.backup.as_deref(), Some("v1"));
    m.run(10);
    assert!(conditions::is_true(&m.status.conditions, conditions::READY));
    assert!(m.labelled.is_empty());
}

#[test]
fn a_healthy_revision_goes_through_every_stage_within_its_size() {
    let mut m = healthy_settled(20);
    m.new_revision("v2", Release::Healthy);
    m.run(500);
    assert_eq!(m.status.phase, Some(Phase::Succeeded), "{:#?}", m.status);
    assert_eq!(m.status.stable_revision.as_deref(), Some("v2"));
    assert_eq!(m.backup.as_deref(), Some("v2"));
    assert!(m.all_on("v2"));
    assert!(m.labelled.is_empty(), "labels must be removed at the end");
    // Default stages 1, 10%, 50%, 100% of 20 nodes: 1, 2, 10, 20.
    let sizes: Vec<usize> = m.status.stages.iter().map(|s| s.nodes.len()).collect();
    assert_eq!(sizes, vec![1, 1, 8, 10]);
    for (stage, limit) in [(0, 1), (1, 2), (2, 10), (3, 20)] {
        assert!(
            m.max_on_target[&stage] <= limit,
            "stage {stage}: {} on target",
            m.max_on_target[&stage]
        );
    }
    assert!(
        m.status
            .stages
            .iter()
            .all(|s| s.state == StageState::Passed)
    );
    // Canary and second stage landed in different zones.
    let canary = &m.status.stages[0].nodes[0];
    let second = &m.status.stages[1].nodes[0];
    assert_ne!(m.nodes[canary].zone, m.nodes[second].zone);
}

#[test]
fn max_unavailable_limits_pods_replaced_at_once() {
    let mut m = healthy_settled(10);
    m.spec.stages = Some(vec![Stage::new(IntOrString::String("100%".into()))]);
    m.spec.max_unavailable = IntOrString::Int(3);
    // Pods of v2 become Ready only when we let them: model it as Unready first.
    m.new_revision("v2", Release::Unready);
    let d = m.tick(); // plans the stage
    let deleted: usize = d
        .actions
        .iter()
        .map(|a| {
            if let Action::DeletePods { pods } = a {
                pods.len()
            } else {
                0
            }
        })
        .sum();
    assert_eq!(deleted, 3);
    let d = m.tick();
    assert!(
        !d.actions
            .iter()
            .any(|a| matches!(a, Action::DeletePods { .. })),
        "3 in flight, none Ready"
    );
}

#[test]
fn a_broken_release_is_reverted_at_the_canary() {
    let mut m = healthy_settled(8);
    m.new_revision("v2", Release::Broken);
    m.run(200);
    assert_eq!(m.status.phase, Some(Phase::Degraded), "{:#?}", m.status);
    assert_eq!(m.degraded_reason().as_deref(), Some("AllocatableFailed"));
    assert_eq!(
        m.touched.len(),
        1,
        "only the canary node got the new revision: {:?}",
        m.touched
    );
    assert!(m.all_on("v1"));
    assert_eq!(m.ds.current_revision.as_deref(), Some("v1"));
    assert!(
        m.nodes
            .values()
            .all(|n| n.state.allocatable["example.com/gpu"] == GPUS)
    );
    let blocked: &BlockedRevision = &m.status.blocked_revisions[0];
    assert_eq!(blocked.revision, "v2");
    assert_eq!(blocked.reason, "BelowMinimum");
    assert!(
        blocked.message.contains("is 0, expected >= 8"),
        "{}",
        blocked.message
    );
    assert!(m.labelled.is_empty());
    assert!(!conditions::is_true(
        &m.status.conditions,
        conditions::READY
    ));
}

#[test]
fn an_overcounting_release_is_reverted_by_the_ceiling() {
    let mut m = healthy_settled(4);
    m.new_revision("v2", Release::Overcount);
    m.run(200);
    assert_eq!(m.status.blocked_revisions[0].reason, "AboveMaximum");
    assert!(m.all_on("v1"));
}

#[test]
fn a_crashlooping_release_fails_fast() {
    let mut m = healthy_settled(4);
    m.new_revision("v2", Release::Crashloop);
    let start = m.now;
    m.run(200);
    assert_eq!(m.status.blocked_revisions[0].reason, "CrashLoopBackOff");
    assert_eq!(m.degraded_reason().as_deref(), Some("PodsReadyFailed"));
    let took = m.status.blocked_revisions[0]
        .blocked_at
        .0
        .duration_since(start);
    assert!(took < jiff::SignedDuration::from_secs(10), "took {took:?}");
    assert!(m.all_on("v1"));
}

#[test]
fn a_never_ready_release_fails_at_the_deadline() {
    let mut m = healthy_settled(4);
    m.spec.progress_deadline = DurationString::new("30s");
    m.new_revision("v2", Release::Unready);
    for _ in 0..25 {
        m.tick();
    }
    assert!(
        m.status.blocked_revisions.is_empty(),
        "not before the deadline"
    );
    m.run(200);
    assert_eq!(
        m.status.blocked_revisions[0].reason,
        "ProgressDeadlineExceeded"
    );
}

#[test]
fn a_blocked_revision_written_again_is_not_rolled() {
    let mut m = healthy_settled(4);
    m.new_revision("v2", Release::Broken);
    m.run(200);
    let touched = m.touched.clone();
    // Helm applies the same template again.
    m.new_revision("v2", Release::Broken);
    m.run(50);
    assert_eq!(
        m.ds.current_revision.as_deref(),
        Some("v1"),
        "restored again"
    );
    assert_eq!(m.touched, touched, "no node replaced");
    assert_eq!(m.status.blocked_revisions.len(), 1);
}

#[test]
fn a_retry_unblocks_the_revision() {
    let mut m = healthy_settled(4);
    m.new_revision("v2", Release::Broken);
    m.run(200);
    m.retry = Some("v2".into());
    // The release was fixed in place (same revision, now healthy) and applied again.
    m.releases.insert("v2".into(), Release::Healthy);
    m.new_revision("v2", Release::Healthy);
    m.run(300);
    assert!(m.status.blocked_revisions.is_empty());
    assert_eq!(m.status.phase, Some(Phase::Succeeded), "{:#?}", m.status);
    assert!(m.all_on("v2"));
    assert_eq!(m.status.last_retry.as_deref(), Some("v2"));
}

#[test]
fn spec_paused_replaces_nothing() {
    let mut m = healthy_settled(4);
    m.spec.paused = true;
    m.new_revision("v2", Release::Healthy);
    m.run(20);
    assert_eq!(m.status.phase, Some(Phase::Paused));
    assert!(m.all_on("v1"));
    m.spec.paused = false;
    m.run(300);
    assert!(m.all_on("v2"));
}

#[test]
fn a_pausing_stage_waits_for_approval() {
    let mut m = healthy_settled(4);
    let mut stages = vec![
        Stage::new(IntOrString::Int(1)),
        Stage::new(IntOrString::String("100%".into())),
    ];
    stages[0].pause = true;
    m.spec.stages = Some(stages);
    m.new_revision("v2", Release::Healthy);
    m.run(100);
    assert_eq!(m.status.phase, Some(Phase::Paused));
    assert_eq!(m.status.stages[0].state, StageState::Paused);
    assert_eq!(
        m.pods
            .values()
            .flatten()
            .filter(|p| p.revision == "v2")
            .count(),
        1
    );
    m.approve = Some("0".into());
    m.run(20);
    assert_eq!(
        m.status.phase,
        Some(Phase::Paused),
        "a bare index approves nothing"
    );
    m.approve = Some(approval_value("v2", 0));
    m.run(200);
    assert!(m.all_on("v2"));
}

#[test]
fn stage_soak_holds_the_next_stage() {
    let mut m = healthy_settled(4);
    m.spec.stages = Some(vec![
        Stage {
            soak: DurationString::new("30s"),
            ..Stage::new(IntOrString::Int(1))
        },
        Stage::new(IntOrString::String("100%".into())),
    ]);
    m.new_revision("v2", Release::Healthy);
    for _ in 0..25 {
        m.tick();
    }
    assert_eq!(m.status.current_stage, Some(0));
    assert_eq!(m.status.stages[0].state, StageState::Soaking);
    m.run(200);
    assert!(m.all_on("v2"));
}

#[test]
fn a_missing_daemonset_is_a_condition() {
    let m = Model::new(1);
    let mut o = m.observed();
    o.daemonset = None;
    let d = decide(&o);
    assert!(d.actions.is_empty());
    assert_eq!(d.status.phase, Some(Phase::Pending));
    let ready = conditions::get(&d.status.conditions, conditions::READY).unwrap();
    assert_eq!(ready.reason, "TargetNotFound");
    assert!(ready.message.contains("\"plugin\""));
}

#[test]
fn gitops_applies_spec_template_and_rolls_it() {
    let mut m = healthy_settled(4);
    m.spec_hash = Some("h2".into());
    m.run(300);
    assert_eq!(m.ds.current_revision.as_deref(), Some("spec-h2"));
    assert!(m.all_on("spec-h2"));
    assert_eq!(m.status.phase, Some(Phase::Succeeded));
}

#[test]
fn gitops_blocked_spec_template_is_not_reapplied() {
    let mut m = healthy_settled(4);
    m.releases.insert("spec-bad".into(), Release::Broken);
    m.spec_hash = Some("bad".into());
    m.run(300);
    assert_eq!(
        m.status.blocked_revisions[0].template_hash.as_deref(),
        Some("bad")
    );
    let applies = m
        .actions_log
        .iter()
        .filter(|a| **a == Action::ApplySpecTemplate)
        .count();
    m.run(50);
    assert_eq!(
        m.actions_log
            .iter()
            .filter(|a| **a == Action::ApplySpecTemplate)
            .count(),
        applies
    );
    assert!(m.all_on("v1"));
    // A new spec.template is rolled.
    m.spec_hash = Some("good".into());
    m.run(300);
    assert!(m.all_on("spec-good"));
}

#[test]
fn gitops_detects_a_human_edit_and_overwrites_nothing() {
    let mut m = healthy_settled(4);
    m.spec_hash = Some("h2".into());
    m.run(300);
    m.new_revision("hand", Release::Healthy);
    for _ in 0..5 {
        let d = m.tick();
        assert!(
            d.actions.iter().all(|a| matches!(a, Action::Event { .. })),
            "{:?}",
            d.actions
        );
    }
    assert_eq!(m.status.phase, Some(Phase::Paused));
    let ready = conditions::get(&m.status.conditions, conditions::READY).unwrap();
    assert_eq!(ready.reason, "TemplateConflict");
    assert!(m.all_on("spec-h2"));
    // Reverting the edit resumes: the DaemonSet is back on a known revision.
    m.new_revision("spec-h2", Release::Healthy);
    m.run(50);
    assert_eq!(m.status.phase, Some(Phase::Succeeded), "{:#?}", m.status);
}

#[test]
fn gitops_adopts_a_daemonset_already_on_spec_template_without_a_rollout() {
    let mut m = Model::new(4);
    m.releases.insert("spec-same".into(), Release::Healthy);
    m.ds.current_revision = Some("spec-same".into());
    m.ds.known_revisions.insert("spec-same".into());
    for p in m.pods.values_mut().flatten() {
        p.revision = "spec-same".into();
    }
    m.spec_hash = Some("same".into());
    m.run(50);
    assert_eq!(m.status.phase, Some(Phase::Succeeded));
    assert!(!m.actions_log.contains(&Action::ApplySpecTemplate));
    assert!(
        !m.actions_log
            .iter()
            .any(|a| matches!(a, Action::DeletePods { .. }))
    );
    assert_eq!(m.status.applied_template_hash.as_deref(), Some("same"));
}

#[test]
fn a_lost_template_write_is_made_again() {
    let mut m = healthy_settled(4);
    m.spec_hash = Some("h2".into());
    let d = decide(&m.observed());
    assert!(d.actions.contains(&Action::ApplySpecTemplate));
    // The status was written, then the operator died before writing the DaemonSet.
    m.status = d.status;
    m.run(300);
    assert!(m.all_on("spec-h2"), "{:#?}", m.status);
}

#[test]
fn a_node_vanishing_mid_stage_does_not_stall_the_rollout() {
    let mut m = healthy_settled(6);
    m.new_revision("v2", Release::Unready);
    m.tick();
    let canary = m.status.stages[0].nodes[0].clone();
    m.nodes.remove(&canary);
    m.pods.remove(&canary);
    m.releases.insert("v2".into(), Release::Healthy);
    m.run(300);
    assert_eq!(m.status.phase, Some(Phase::Succeeded), "{:#?}", m.status);
    assert!(m.all_on("v2"));
}

#[test]
fn decisions_are_deterministic() {
    let mut m = healthy_settled(5);
    m.new_revision("v2", Release::Healthy);
    m.tick();
    let a = decide(&m.observed());
    let b = decide(&m.observed());
    assert_eq!(a.status, b.status);
    assert_eq!(a.actions, b.actions);
    assert_eq!(a.requeue_after, b.requeue_after);
    let _ = Duration::ZERO;
}

#[test]
fn abort_reverts_at_once_and_blocks_the_revision() {
    let mut m = healthy_settled(6);
    m.new_revision("v2", Release::Healthy);
    m.tick();
    m.tick();
    m.abort = Some("v2".into());
    m.run(100);
    assert_eq!(m.status.phase, Some(Phase::Degraded));
    assert_eq!(m.status.blocked_revisions[0].reason, "Aborted");
    assert_eq!(m.degraded_reason().as_deref(), Some("ManualFailed"));
    assert!(m.all_on("v1"));
}
