//! `strategy: Selector` scenarios against the model (`model/selector.rs`):
//! the engine over the target and canary DaemonSets, through
//! [`crate::selector`]'s translation, with both DaemonSet controllers'
//! rules. Each asserts what it names and that no safety rule broke.

use std::collections::BTreeMap;

use saferollout_api::Phase;

use super::model::{Model, Release};
use crate::handover::HandoverOrder;
use crate::selector::Owner;
use crate::selector::promotion::PROMOTING_TAINT;

fn settled(nodes: usize, order: HandoverOrder) -> Model {
    let mut m = Model::new_selector(nodes, order);
    m.run(200);
    assert_eq!(m.status.phase, Some(Phase::Succeeded), "{:#?}", m.status);
    assert!(m.all_on("spec-g1"));
    m
}

fn no_violations(m: &Model) {
    assert!(
        m.checker.violations.is_empty(),
        "safety rules broken: {:#?}\ntrace:\n{}",
        m.checker.violations,
        m.trace.join("\n")
    );
}

/// The agent pods each node got since `before` (the checker's counts then).
fn creations_since(m: &Model, before: &BTreeMap<String, usize>) -> BTreeMap<String, usize> {
    m.checker
        .created
        .iter()
        .map(|(n, c)| (n.clone(), c - before.get(n).copied().unwrap_or(0)))
        .filter(|(_, c)| *c > 0)
        .collect()
}

fn uids(m: &Model) -> BTreeMap<String, usize> {
    m.checker.created.clone()
}

/// Nothing of the strategy is left: no canary, no handover label, no
/// promotion taint, the target's template without the expression, every
/// pod the target's with its current hash.
fn nothing_left(m: &Model) {
    let sel = m.cluster.selector.as_ref().unwrap();
    assert!(sel.canary.is_none(), "canary left: {:#?}", sel.canary);
    assert!(!sel.target_expression, "the target keeps the expression");
    for n in m.cluster.nodes.values() {
        assert!(
            !n.labels.contains_key(&sel.key),
            "{} keeps its label",
            n.name
        );
        assert!(
            !n.taints.iter().any(|t| t.key == PROMOTING_TAINT),
            "{} keeps the promotion taint",
            n.name
        );
    }
    for p in m.cluster.pods.values() {
        assert_eq!(p.owner, Owner::Target, "{p:#?}");
        assert_eq!(p.hash, m.cluster.ds.template, "{p:#?}");
    }
}

fn healthy_release_once_per_node(order: HandoverOrder) {
    let mut m = settled(6, order);
    let before = uids(&m);
    m.releases.insert("spec-g2".into(), Release::Healthy);
    m.spec_hash = Some("g2".into());
    assert!(
        m.run_woken("spec-g2", 600),
        "{:#?}\n{}",
        m.status,
        m.trace.join("\n")
    );
    // The promotion ends once the rollout has succeeded.
    m.run(200);
    assert_eq!(m.status.phase, Some(Phase::Succeeded));
    assert_eq!(m.status.stable_revision.as_deref(), Some("spec-g2"));
    assert!(m.all_on("spec-g2"));
    assert_eq!(m.cluster.ds.template, "spec-g2");
    nothing_left(&m);
    let created = creations_since(&m, &before);
    assert_eq!(created.len(), 6, "{created:?}");
    assert!(
        created.values().all(|c| *c == 1),
        "a node's agent restarted twice: {created:?}"
    );
    no_violations(&m);
}

#[test]
fn a_healthy_release_replaces_each_agent_once_break_before_make() {
    healthy_release_once_per_node(HandoverOrder::BreakBeforeMake);
}

#[test]
fn a_healthy_release_replaces_each_agent_once_make_before_break() {
    healthy_release_once_per_node(HandoverOrder::MakeBeforeBreak);
}

#[test]
fn a_broken_release_is_reverted_by_the_labels_and_the_canary_goes() {
    for order in [
        HandoverOrder::BreakBeforeMake,
        HandoverOrder::MakeBeforeBreak,
    ] {
        let mut m = settled(6, order);
        let before = uids(&m);
        m.releases.insert("spec-bad".into(), Release::Broken);
        m.spec_hash = Some("bad".into());
        m.run(600);
        assert_eq!(m.status.phase, Some(Phase::Degraded), "{:#?}", m.status);
        assert!(m.status.is_blocked("spec-bad"));
        assert!(m.all_on("spec-g1"));
        assert_eq!(m.cluster.ds.template, "spec-g1");
        nothing_left(&m);
        // Only the canary node's agent changed (twice: there and back);
        // make-before-break never deleted the old one.
        let created = creations_since(&m, &before);
        assert_eq!(created.len(), 1, "{order:?}: {created:?}");
        let expected = match order {
            HandoverOrder::BreakBeforeMake => 2,
            HandoverOrder::MakeBeforeBreak => 1,
        };
        assert_eq!(
            created.values().next(),
            Some(&expected),
            "{order:?}: {created:?}"
        );
        no_violations(&m);
    }
}

#[test]
fn make_before_break_never_leaves_a_node_without_a_serving_agent() {
    let mut m = settled(4, HandoverOrder::MakeBeforeBreak);
    m.releases.insert("spec-g2".into(), Release::Healthy);
    m.spec_hash = Some("g2".into());
    for _ in 0..400 {
        m.one_reconcile();
        for n in m.cluster.nodes.keys() {
            let serving = m.cluster.pods.values().any(|p| &p.node == n && p.serves());
            let state = m.cluster.handover_state(n);
            assert!(
                serving,
                "{n} ({state:?}) without a serving agent\n{}",
                m.trace.join("\n")
            );
        }
        if m.status.phase == Some(Phase::Succeeded)
            && m.all_on("spec-g2")
            && m.cluster.selector.as_ref().unwrap().canary.is_none()
        {
            break;
        }
    }
    m.run(100);
    nothing_left(&m);
    assert_eq!(m.checker.disrupted.len(), 0);
    no_violations(&m);
}

/// A node joins as the last stage passes (found by the property tests):
/// the engine's move of its old agent and the promotion's template write
/// must not happen in one pass, or the node stays half handed over.
#[test]
fn a_node_joining_as_the_last_stage_passes_is_replaced_and_nothing_is_left() {
    use super::model::{Lag, Losses};
    let mut m = Model::new_selector(2, HandoverOrder::BreakBeforeMake);
    m.spec.progress_deadline = saferollout_api::DurationString::new("20s");
    if let Some(g) = m.spec.gates.as_mut() {
        for a in &mut g.allocatable {
            a.soak = saferollout_api::DurationString::new("3s");
        }
    }
    m.run(200);
    m.releases.insert("spec-g2".into(), Release::Healthy);
    m.spec_hash = Some("g2".into());
    // Seconds after each pass, as the property test that found it ran them.
    let secs = [
        0, 0, 1, 0, 1, 1, 0, 0, 0, 0, 2, 0, 1, 0, 0, 0, 2, 1, 2, 0, 0, 0, 1, 0, 0, 0, 0,
    ];
    for (k, s) in secs.iter().enumerate() {
        if k == 20 {
            m.add_node("node-new-1", 1);
        }
        let nodes = match k {
            21 => 1,
            22 => 2,
            _ => 0,
        };
        let lag = Lag {
            nodes,
            ..Lag::default()
        };
        m.reconcile(lag, Losses::default());
        for _ in 0..=*s {
            m.advance();
        }
    }
    m.restart_operator();
    m.run(400);
    assert!(m.all_on("spec-g2"));
    nothing_left(&m);
    no_violations(&m);
}

/// A node joins while the promotion holds the canary's nodes.
#[test]
fn a_node_joining_during_the_promotion_is_replaced_after_it() {
    let mut m = settled(2, HandoverOrder::BreakBeforeMake);
    m.releases.insert("spec-g2".into(), Release::Healthy);
    m.spec_hash = Some("g2".into());
    let mut joined = false;
    for _ in 0..200 {
        m.one_reconcile();
        let promoting = m
            .cluster
            .nodes
            .values()
            .any(|n| n.taints.iter().any(|t| t.key == PROMOTING_TAINT));
        if promoting && !joined {
            m.add_node("node-new-1", 1);
            joined = true;
        }
    }
    assert!(joined, "the promotion never tainted a node");
    m.run(400);
    assert!(m.all_on("spec-g2"));
    nothing_left(&m);
    no_violations(&m);
}
