//! `spec.nodeMaintenance` against the model (issue 38's drain): a node is
//! cordoned before its agent is replaced and drained first; a budget that
//! refuses an eviction holds the stage without failing it; every node is
//! uncordoned once its agent serves, after a pass and after a revert.

use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use saferollout_api::{Drain, MAINTENANCE_LABEL, MaintenanceStep, NodeMaintenance, Phase, Stage};

use super::model::{Lag, Losses, Model, Release};
use super::tests::{no_violations, settled};
use super::{Action, DRAIN_BLOCKED};
use crate::conditions;
use crate::drain::WorkloadPod;

fn cordoned(m: &Model) -> Vec<String> {
    m.cluster
        .nodes
        .values()
        .filter(|n| n.labels.contains_key(MAINTENANCE_LABEL))
        .map(|n| n.name.clone())
        .collect()
}

fn workload(node: &str, refused: bool) -> WorkloadPod {
    WorkloadPod {
        namespace: "apps".into(),
        name: format!("train-{node}"),
        uid: format!("uid-train-{node}"),
        controller: Some("ReplicaSet".into()),
        refused: refused
            .then(|| "Cannot evict pod as it would violate the pod's disruption budget.".into()),
        ..Default::default()
    }
}

fn with_maintenance(m: &mut Model, drain: bool) {
    m.spec.node_maintenance = Some(NodeMaintenance {
        cordon: true,
        drain: drain.then(Drain::default),
    });
    m.spec.stages = Some(vec![
        Stage::new(IntOrString::Int(1)),
        Stage::new(IntOrString::String("100%".into())),
    ]);
}

/// Runs passes until the rollout settles, checking after each that every
/// agent deletion of a rollout forward was on a node cordoned and drained
/// by the rollout, and that at most `max` nodes are cordoned at once.
fn run_checked(m: &mut Model, ticks: usize, max: usize) {
    for _ in 0..ticks {
        if let Some(d) = m.reconcile(Lag::default(), Losses::default()) {
            for a in &d.actions {
                if let Action::DeletePods { pods } = a {
                    for p in pods {
                        let node = &m.cluster.nodes[&p.node];
                        assert!(
                            node.labels.contains_key(MAINTENANCE_LABEL),
                            "the agent of {} was deleted on a node not cordoned",
                            p.node
                        );
                        assert!(
                            m.workloads.get(&p.node).is_none_or(Vec::is_empty),
                            "the agent of {} was deleted before its node was drained",
                            p.node
                        );
                    }
                }
            }
        }
        assert!(
            cordoned(m).len() <= max,
            "cordoned at once: {:?}",
            cordoned(m)
        );
        m.advance();
        if m.status.phase == Some(Phase::Succeeded) && m.all_on("v2") && cordoned(m).is_empty() {
            break;
        }
    }
}

#[test]
fn each_node_is_cordoned_and_drained_before_its_agent_goes_and_uncordoned_after() {
    let mut m = settled(5);
    with_maintenance(&mut m, true);
    for n in ["node-00", "node-02", "node-04"] {
        m.workloads.insert(n.into(), vec![workload(n, false)]);
    }
    m.write_revision("v2", Release::Healthy);
    run_checked(&mut m, 600, 1);
    assert_eq!(m.status.phase, Some(Phase::Succeeded), "{:#?}", m.status);
    assert!(m.all_on("v2"));
    assert!(cordoned(&m).is_empty(), "left cordoned: {:?}", cordoned(&m));
    assert!(m.status.node_maintenance.is_empty());
    assert!(
        m.workloads.values().all(Vec::is_empty),
        "every workload evicted"
    );
    let cordons: usize = m
        .actions_log
        .iter()
        .map(|a| match a {
            Action::CordonNodes { nodes } => nodes.len(),
            _ => 0,
        })
        .sum();
    assert_eq!(cordons, 5, "each node cordoned once");
    no_violations(&m);
}

#[test]
fn a_budget_that_refuses_holds_the_stage_without_failing_it_until_it_allows() {
    let mut m = settled(3);
    with_maintenance(&mut m, true);
    // The canary is the first node by name.
    m.workloads
        .insert("node-00".into(), vec![workload("node-00", true)]);
    m.spec.progress_deadline = "30s".into();
    m.write_revision("v2", Release::Healthy);
    // Four times the progress deadline.
    for _ in 0..120 {
        m.reconcile(Lag::default(), Losses::default());
        m.advance();
    }
    assert_eq!(m.status.phase, Some(Phase::Progressing), "{:#?}", m.status);
    let ready = conditions::get(&m.status.conditions, conditions::READY).unwrap();
    assert_eq!(ready.reason, DRAIN_BLOCKED, "{:#?}", m.status.conditions);
    assert!(
        ready.message.contains("apps/train-node-00"),
        "{}",
        ready.message
    );
    assert!(
        ready.message.contains("disruption budget"),
        "{}",
        ready.message
    );
    let entry = &m.status.node_maintenance[0];
    assert_eq!(
        (entry.node.as_str(), entry.step),
        ("node-00", MaintenanceStep::Draining)
    );
    assert!(
        m.cluster
            .pods
            .values()
            .filter(|p| p.node == "node-00")
            .all(|p| p.revision == "v1" && p.ready),
        "the agent is not touched"
    );
    assert_eq!(cordoned(&m), ["node-00"]);
    // The budget allows it now.
    m.workloads.get_mut("node-00").unwrap()[0].refused = None;
    run_checked(&mut m, 600, 1);
    assert_eq!(m.status.phase, Some(Phase::Succeeded), "{:#?}", m.status);
    assert!(cordoned(&m).is_empty());
    no_violations(&m);
}

#[test]
fn a_reverted_release_leaves_no_node_cordoned() {
    let mut m = settled(4);
    with_maintenance(&mut m, false);
    m.write_revision("v2", Release::Broken);
    m.run(600);
    assert_eq!(m.status.phase, Some(Phase::Degraded), "{:#?}", m.status);
    assert!(m.all_on("v1"));
    assert!(cordoned(&m).is_empty(), "left cordoned: {:?}", cordoned(&m));
    assert!(
        m.actions_log.iter().any(
            |a| matches!(a, Action::UncordonNodes { nodes } if nodes == &["node-00".to_string()])
        ),
        "the canary was uncordoned after the revert"
    );
    no_violations(&m);
}

#[test]
fn a_quarantined_release_keeps_only_its_failed_nodes_cordoned() {
    let mut m = settled(6);
    m.spec.node_maintenance = Some(NodeMaintenance {
        cordon: true,
        drain: None,
    });
    m.spec.on_failure = saferollout_api::OnFailure::Quarantine;
    m.write_revision("v2", Release::Broken);
    m.run(600);
    let stopped = m.status.stopped.clone().expect("stopped");
    let quarantined = stopped.quarantine.map(|q| q.nodes).unwrap_or_default();
    assert!(
        cordoned(&m).iter().all(|n| quarantined.contains(n)),
        "cordoned {:?}, quarantined {:?}\n{:#?}\n{:#?}",
        cordoned(&m),
        quarantined,
        m.status.node_maintenance,
        m.cluster.pods
    );
    no_violations(&m);
}

/// Found by the property tests: the DaemonSet loses a node while two are
/// cordoned at `maxUnavailable: 25%` of 8, so the budget drops to 1; the
/// agents of both cordoned nodes must not go at once.
#[test]
fn a_budget_that_shrank_under_the_cordons_deletes_only_what_it_allows() {
    let mut m = settled(8);
    with_maintenance(&mut m, false);
    m.spec.max_unavailable = IntOrString::String("25%".into());
    m.spec.stages = Some(vec![
        Stage::new(IntOrString::Int(1)),
        Stage::new(IntOrString::Int(3)),
        Stage::new(IntOrString::String("100%".into())),
    ]);
    m.write_revision("v2", Release::Healthy);
    let mut deleted_node = false;
    for _ in 0..600 {
        if let Some(d) = m.reconcile(Lag::default(), Losses::default()) {
            for a in &d.actions {
                match a {
                    Action::DeletePods { pods } if deleted_node => {
                        assert!(pods.len() <= 1, "{pods:?} deleted at a budget of 1");
                    }
                    // Two cordoned at once: a node outside the stage leaves
                    // the cluster before the next pass.
                    Action::CordonNodes { nodes } if nodes.len() == 2 && !deleted_node => {
                        m.delete_node("node-07");
                        deleted_node = true;
                    }
                    _ => {}
                }
            }
        }
        no_violations(&m);
        m.advance();
        if m.status.phase == Some(Phase::Succeeded) && m.all_on("v2") && cordoned(&m).is_empty() {
            break;
        }
    }
    assert!(deleted_node, "two nodes were cordoned at once");
    assert_eq!(m.status.phase, Some(Phase::Succeeded), "{:#?}", m.status);
    assert!(m.all_on("v2"));
    assert!(cordoned(&m).is_empty(), "left cordoned: {:?}", cordoned(&m));
}
