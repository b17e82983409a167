//! A rollout governed by a SafeRolloutPolicy (`crate::fleet::admit` applied
//! by `stage::roll`), against the model: the budget other rollouts hold,
//! a closed window, the ordering, and what the rollout records for the
//! others (`status.disruptedNodes`, the `Waiting` condition).

use std::collections::BTreeMap;

use saferollout_api::{DurationString, MaintenanceWindow, Phase, Weekday};

use super::model::{FleetModel, Model, Release};
use super::tests::{no_violations, settled};
use super::*;
use crate::conditions;

fn waiting(m: &Model) -> Option<(String, String)> {
    conditions::get(&m.status.conditions, conditions::WAITING)
        .filter(|c| c.status == "True")
        .map(|c| (c.reason.clone(), c.message.clone()))
}

/// Nodes where a pass deleted an agent.
fn deleted_on(m: &Model) -> BTreeSet<String> {
    m.actions_log
        .iter()
        .filter_map(|a| match a {
            Action::DeletePods { pods } => Some(pods.iter().map(|p| p.node.clone())),
            _ => None,
        })
        .flatten()
        .collect()
}

/// `n` passes a second apart (a held rollout never settles: `Model::run`
/// would wait for it).
fn ticks(m: &mut Model, n: usize) {
    for _ in 0..n {
        m.one_reconcile();
    }
}

#[test]
fn a_full_budget_holds_the_rollout_past_its_deadline_and_it_finishes_once_released() {
    let mut m = settled(4);
    m.spec.progress_deadline = DurationString::new("60s");
    m.fleet = Some(FleetModel {
        max_disrupted_nodes: Some(1),
        others: vec![("gpu/driver".into(), vec!["elsewhere".into()])],
        ..Default::default()
    });
    m.actions_log.clear();
    m.write_revision("v2", Release::Healthy);
    // Ten times the deadline: held, never failed.
    ticks(&mut m, 600);
    assert!(deleted_on(&m).is_empty(), "deleted under a full budget");
    assert!(m.status.blocked_revisions.is_empty(), "{:#?}", m.status);
    assert_eq!(m.status.phase, Some(Phase::Progressing));
    let (reason, message) = waiting(&m).expect("a Waiting condition");
    assert_eq!(reason, "FleetBudgetFull");
    assert!(message.contains("gpu/driver"), "{message}");
    let ready = conditions::get(&m.status.conditions, conditions::READY).unwrap();
    assert_eq!(ready.reason, "FleetBudgetFull");
    // The driver releases its node: the rollout goes on, one node at a time.
    m.fleet.as_mut().unwrap().others[0].1.clear();
    m.run(900);
    assert_eq!(m.status.phase, Some(Phase::Succeeded), "{:#?}", m.status);
    assert!(m.all_on("v2"));
    let w = conditions::get(&m.status.conditions, conditions::WAITING).unwrap();
    assert_eq!(w.status, "False");
    assert!(m.status.disrupted_nodes.is_empty());
    no_violations(&m);
}

#[test]
fn a_node_another_rollout_disrupts_is_taken_at_no_cost() {
    let mut m = settled(4);
    m.spec.stages = Some(vec![saferollout_api::Stage::new(
        k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::String("100%".into()),
    )]);
    m.fleet = Some(FleetModel {
        max_disrupted_nodes: Some(1),
        others: vec![("gpu/driver".into(), vec!["node-02".into()])],
        ..Default::default()
    });
    m.actions_log.clear();
    m.write_revision("v2", Release::Healthy);
    ticks(&mut m, 120);
    assert_eq!(
        deleted_on(&m),
        BTreeSet::from(["node-02".to_string()]),
        "only the node the driver disrupts"
    );
    assert_eq!(waiting(&m).map(|w| w.0).as_deref(), Some("FleetBudgetFull"));
    no_violations(&m);
}

#[test]
fn disrupted_nodes_are_recorded_in_the_status_of_the_pass_that_deletes() {
    let mut m = settled(4);
    m.fleet = Some(FleetModel {
        max_disrupted_nodes: Some(2),
        ..Default::default()
    });
    m.write_revision("v2", Release::Healthy);
    let mut seen = 0;
    for _ in 0..600 {
        let d = m.one_reconcile();
        for a in &d.actions {
            if let Action::DeletePods { pods } = a {
                for p in pods {
                    seen += 1;
                    assert!(
                        d.status.disrupted_nodes.contains(&p.node),
                        "{} deleted without being recorded: {:?}",
                        p.node,
                        d.status.disrupted_nodes
                    );
                }
            }
        }
        assert!(
            d.status.disrupted_nodes.len() <= 2,
            "{:?}",
            d.status.disrupted_nodes
        );
        if m.status.phase == Some(Phase::Succeeded) && m.all_on("v2") {
            break;
        }
    }
    assert_eq!(seen, 4);
    assert_eq!(m.status.phase, Some(Phase::Succeeded));
    no_violations(&m);
}

#[test]
fn a_closed_window_holds_a_new_revision_but_never_a_revert() {
    let mut m = settled(4);
    // The model's clock is on a Friday (2027-01-15T08:00:00Z); the window
    // opens on Mondays only.
    let windows = crate::fleet::windows::parse(&[MaintenanceWindow {
        days: vec![Weekday::Monday],
        start: "01:00".into(),
        end: "02:00".into(),
        time_zone: "UTC".into(),
    }])
    .unwrap();
    assert!(!crate::fleet::windows::is_open(&windows, m.now));
    m.fleet = Some(FleetModel {
        windows,
        ..Default::default()
    });
    m.actions_log.clear();
    m.write_revision("v2", Release::Broken);
    ticks(&mut m, 120);
    assert!(deleted_on(&m).is_empty());
    let (reason, message) = waiting(&m).expect("a Waiting condition");
    assert_eq!(reason, "MaintenanceWindow");
    assert!(message.contains("Monday"), "{message}");
    // A person aborts: the revert is not held by the window.
    m.abort = Some(m.status.target_revision.clone().unwrap());
    m.run(300);
    assert!(is_blocked(&m.status, "v2"), "{:#?}", m.status);
    assert!(m.all_on("v1"));
    no_violations(&m);
}

#[test]
fn the_ordering_holds_only_the_nodes_whose_predecessor_has_not_passed() {
    let mut m = settled(4);
    m.spec.stages = Some(vec![saferollout_api::Stage::new(
        k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::String("100%".into()),
    )]);
    let waits: BTreeMap<String, String> = ["node-00", "node-01"]
        .into_iter()
        .map(|n| (n.to_string(), "gpu/driver".to_string()))
        .collect();
    m.fleet = Some(FleetModel {
        waits_for: waits,
        ..Default::default()
    });
    m.actions_log.clear();
    m.write_revision("v2", Release::Healthy);
    ticks(&mut m, 300);
    assert_eq!(
        deleted_on(&m),
        BTreeSet::from(["node-02".to_string(), "node-03".to_string()])
    );
    let (reason, message) = waiting(&m).expect("a Waiting condition");
    assert_eq!(reason, "FleetOrdering");
    assert!(message.contains("gpu/driver"), "{message}");
    m.fleet.as_mut().unwrap().waits_for.clear();
    m.run(600);
    assert_eq!(m.status.phase, Some(Phase::Succeeded), "{:#?}", m.status);
    no_violations(&m);
}

#[test]
fn an_ungoverned_rollout_keeps_neither_field() {
    let mut m = settled(4);
    m.fleet = Some(FleetModel::default());
    m.write_revision("v2", Release::Healthy);
    ticks(&mut m, 5);
    assert!(conditions::get(&m.status.conditions, conditions::WAITING).is_some());
    m.fleet = None;
    m.run(600);
    assert!(conditions::get(&m.status.conditions, conditions::WAITING).is_none());
    assert!(m.status.disrupted_nodes.is_empty());
    assert_eq!(m.status.phase, Some(Phase::Succeeded));
}
