//! Nodes going out of service before or during a rollout (issue 38's
//! lifecycle-aware budgets), against the model: NotReady, cordoned or being
//! scaled down, they are left out of the plan with the reason in
//! `status.skippedNodes`, do not count in `maxUnavailable`, and the rollout
//! finishes on the others rather than waiting for them.

use k8s_openapi::api::core::v1::Taint;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use saferollout_api::{Phase, Stage};

use super::model::{Model, Release};
use super::tests::{no_violations, settled};
use crate::conditions;

fn skipped(m: &Model) -> Vec<(String, String)> {
    m.status
        .skipped_nodes
        .iter()
        .map(|n| (n.node.clone(), n.reason.clone()))
        .collect()
}

#[test]
fn twenty_nodes_with_four_not_ready_roll_on_the_sixteen_at_ten_percent() {
    let mut m = settled(20);
    m.spec.max_unavailable = IntOrString::String("10%".into());
    m.spec.stages = Some(vec![
        Stage::new(IntOrString::Int(1)),
        Stage::new(IntOrString::String("100%".into())),
    ]);
    let down = ["node-03", "node-07", "node-11", "node-15"];
    for n in down {
        m.set_node_ready(n, false);
    }
    m.run(60);
    m.write_revision("v2", Release::Healthy);
    m.run(1800);
    assert_eq!(m.status.phase, Some(Phase::Succeeded), "{:#?}", m.status);
    assert!(m.all_on("v2"), "every Ready node on v2");
    let names: Vec<(String, String)> = down
        .iter()
        .map(|n| (n.to_string(), "NodeNotReady".to_string()))
        .collect();
    assert_eq!(skipped(&m), names);
    let held: usize = m.status.stages.iter().map(|s| s.nodes.len()).sum();
    assert_eq!(held, 16);
    no_violations(&m);
}

#[test]
fn a_cordoned_node_or_a_scale_down_candidate_is_left_out() {
    let mut m = settled(4);
    // Both taints are ones daemon pods run under: a cordon's is tolerated
    // by every daemon pod, a scale-down candidate's only prefers.
    m.cluster.taint(
        "node-01",
        Taint {
            key: "node.kubernetes.io/unschedulable".into(),
            effect: "NoSchedule".into(),
            ..Default::default()
        },
    );
    m.cluster.taint(
        "node-02",
        Taint {
            key: "DeletionCandidateOfClusterAutoscaler".into(),
            value: Some("1700000000".into()),
            effect: "PreferNoSchedule".into(),
            ..Default::default()
        },
    );
    m.write_revision("v2", Release::Healthy);
    m.run(900);
    assert_eq!(m.status.phase, Some(Phase::Succeeded), "{:#?}", m.status);
    assert_eq!(
        skipped(&m),
        [
            ("node-01".to_string(), "NodeOutOfService".to_string()),
            ("node-02".to_string(), "NodeOutOfService".to_string()),
        ]
    );
    assert!(
        m.status.skipped_nodes[0].message.contains("cordoned")
            && m.status.skipped_nodes[1].message.contains("scale-down"),
        "{:?}",
        m.status.skipped_nodes
    );
    // Their agents were left alone; the other two were replaced.
    let on = |node: &str| {
        m.cluster
            .pods
            .values()
            .filter(|p| p.node == node)
            .map(|p| p.revision.clone())
            .collect::<Vec<_>>()
    };
    assert_eq!(on("node-01"), ["v1"]);
    assert_eq!(on("node-02"), ["v1"]);
    assert_eq!(on("node-00"), ["v2"]);
    assert_eq!(on("node-03"), ["v2"]);
    let ready = conditions::get(&m.status.conditions, conditions::READY).unwrap();
    assert_eq!(ready.status, "True");
    no_violations(&m);
}

/// Passes a second apart until `done` holds (at most `max`).
fn until(m: &mut Model, max: usize, done: impl Fn(&Model) -> bool) {
    for _ in 0..max {
        if done(m) {
            return;
        }
        m.one_reconcile();
    }
    assert!(done(m), "not reached in {max} passes: {:#?}", m.status);
}

fn v2_ready_on(m: &Model) -> Vec<String> {
    m.cluster
        .pods
        .values()
        .filter(|p| p.revision == "v2" && p.ready)
        .map(|p| p.node.clone())
        .collect()
}

#[test]
fn nodes_going_not_ready_with_the_new_agent_trip_the_breaker_and_revert() {
    let mut m = settled(8);
    m.spec.stages = Some(vec![
        Stage::new(IntOrString::Int(4)),
        Stage::new(IntOrString::String("100%".into())),
    ]);
    m.spec.max_unavailable = IntOrString::Int(4);
    m.write_revision("v2", Release::Healthy);
    until(&mut m, 300, |m| v2_ready_on(m).len() == 4);
    // Two of the four go NotReady with v2 on them: more than 10% of 8
    // (rounded down, at least 1).
    let down = v2_ready_on(&m);
    m.set_node_ready(&down[0], false);
    m.set_node_ready(&down[1], false);
    until(&mut m, 60, |m| !m.status.blocked_revisions.is_empty());
    let blocked = &m.status.blocked_revisions[0];
    assert_eq!(blocked.reason, "NodesNotReadyAfterReplacement");
    assert!(
        blocked.message.contains(&down[0]) && blocked.message.contains(&down[1]),
        "{}",
        blocked.message
    );
    m.set_node_ready(&down[0], true);
    m.set_node_ready(&down[1], true);
    m.run(900);
    assert!(m.all_on("v1"), "reverted: {:#?}", m.cluster.pods);
    no_violations(&m);
}

#[test]
fn nodes_going_not_ready_elsewhere_hold_the_rollout_until_they_are_back() {
    let mut m = settled(10);
    m.spec.stages = Some(vec![
        Stage::new(IntOrString::Int(1)),
        Stage::new(IntOrString::String("100%".into())),
    ]);
    m.write_revision("v2", Release::Healthy);
    until(&mut m, 300, |m| v2_ready_on(m).len() == 1);
    let canary = v2_ready_on(&m)[0].clone();
    let others: Vec<String> = m
        .cluster
        .nodes
        .keys()
        .filter(|n| **n != canary)
        .take(2)
        .cloned()
        .collect();
    for n in &others {
        m.set_node_ready(n, false);
    }
    // Held: far past the progress deadline, nothing more replaced.
    for _ in 0..900 {
        m.one_reconcile();
    }
    assert!(
        m.cluster.pods_on("v2") <= 2,
        "replaced while held: {:#?}",
        m.cluster.pods
    );
    assert!(m.status.blocked_revisions.is_empty(), "{:#?}", m.status);
    let ready = conditions::get(&m.status.conditions, conditions::READY).unwrap();
    assert_eq!(ready.reason, "CircuitBreakerOpen", "{ready:?}");
    let opened = m
        .actions_log
        .iter()
        .filter(
            |a| matches!(a, super::Action::Event { reason, .. } if reason == "CircuitBreakerOpen"),
        )
        .count();
    assert_eq!(opened, 1, "one Warning Event when it opens");
    // Back: the rollout finishes.
    for n in &others {
        m.set_node_ready(n, true);
    }
    m.run(1800);
    assert_eq!(m.status.phase, Some(Phase::Succeeded), "{:#?}", m.status);
    assert!(m.all_on("v2"));
    no_violations(&m);
}

fn label(m: &mut Model, node: &str, key: &str, value: &str) {
    m.cluster
        .nodes
        .get_mut(node)
        .unwrap()
        .labels
        .insert(key.into(), value.into());
}

#[test]
fn a_node_in_a_vendor_driver_upgrade_is_left_out_before_the_rollout_takes_it() {
    let mut m = settled(4);
    label(
        &mut m,
        "node-02",
        crate::eligibility::NVIDIA_DRIVER_UPGRADE_LABEL,
        "cordon-required",
    );
    // A finished upgrade is no upgrade.
    label(
        &mut m,
        "node-03",
        crate::eligibility::NVIDIA_DRIVER_UPGRADE_LABEL,
        "upgrade-done",
    );
    m.write_revision("v2", Release::Healthy);
    m.run(900);
    assert_eq!(m.status.phase, Some(Phase::Succeeded), "{:#?}", m.status);
    assert_eq!(
        skipped(&m),
        [(
            "node-02".to_string(),
            crate::eligibility::DRIVER_UPGRADE.to_string()
        )]
    );
    assert!(
        m.status.skipped_nodes[0]
            .message
            .contains("nvidia.com/gpu-driver-upgrade-state=cordon-required"),
        "{:?}",
        m.status.skipped_nodes
    );
    no_violations(&m);
}

/// A driver upgrade by the vendor's upgrade controller starts on a node the
/// stage holds, before its agent is replaced: the controller deletes the
/// node's agent (the DaemonSet, OnDelete, brings it back on its current
/// template). The stage waits, far past its progress deadline, without
/// failing, replacing or judging that node, and keeps its budget; once the
/// upgrade ends it judges afresh and finishes.
#[test]
fn a_driver_upgrade_starting_mid_stage_is_waited_for_within_the_budget() {
    let mut m = settled(6);
    m.spec.max_unavailable = IntOrString::Int(1);
    m.spec.progress_deadline = "30s".into();
    m.spec.stages = Some(vec![
        Stage::new(IntOrString::Int(1)),
        Stage::new(IntOrString::String("100%".into())),
    ]);
    m.write_revision("v2", Release::Healthy);
    until(&mut m, 300, |m| {
        m.status.stages.len() == 2 && v2_ready_on(m).len() == 2
    });
    let upgraded = m.status.stages[1]
        .nodes
        .iter()
        .find(|n| {
            m.cluster
                .pods
                .values()
                .any(|p| &p.node == *n && p.revision == "v1")
        })
        .cloned()
        .expect("a node of stage 2 still on v1");
    label(
        &mut m,
        &upgraded,
        crate::eligibility::NVIDIA_DRIVER_UPGRADE_LABEL,
        "pod-restart-required",
    );
    // The caches show the label before the upgrade controller goes on.
    m.advance();
    let uid = m
        .cluster
        .pods
        .values()
        .find(|p| p.node == upgraded)
        .map(|p| p.uid.clone())
        .unwrap();
    let now = m.now;
    m.cluster.delete_pod(&uid, None, now);
    let logged = m.actions_log.len();
    // Ten progress deadlines.
    for _ in 0..300 {
        m.one_reconcile();
        no_violations(&m);
    }
    assert_eq!(m.status.phase, Some(Phase::Progressing), "{:#?}", m.status);
    assert!(m.status.stopped.is_none() && m.status.blocked_revisions.is_empty());
    let ready = conditions::get(&m.status.conditions, conditions::READY).unwrap();
    assert_eq!(ready.reason, crate::eligibility::DRIVER_UPGRADE);
    assert!(
        ready.message.contains(&upgraded) && ready.message.contains("pod-restart-required"),
        "{}",
        ready.message
    );
    assert_eq!(m.status.current_stage, Some(1), "the stage does not pass");
    let touched: Vec<_> = m.actions_log[logged..]
        .iter()
        .filter_map(|a| match a {
            super::Action::DeletePods { pods } => {
                Some(pods.iter().filter(|p| p.node == upgraded).count())
            }
            _ => None,
        })
        .filter(|n| *n > 0)
        .collect();
    assert!(
        touched.is_empty(),
        "the operator deleted {upgraded}'s agent: {:?}",
        &m.actions_log[logged..]
    );
    label(
        &mut m,
        &upgraded,
        crate::eligibility::NVIDIA_DRIVER_UPGRADE_LABEL,
        "upgrade-done",
    );
    m.run(900);
    assert_eq!(m.status.phase, Some(Phase::Succeeded), "{:#?}", m.status);
    assert!(m.all_on("v2"));
    no_violations(&m);
}
