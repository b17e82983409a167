//! The translation on hand-built contexts: what one engine action and one
//! pass's follow-ups become. (The model's scenarios and property tests in
//! `rollout/` run it against both DaemonSet controllers.)

use std::collections::BTreeMap;

use super::*;
use crate::handover::NodeAgents;

fn pod(node: &'static str, uid: &'static str, revision: &'static str) -> AgentPod<'static> {
    AgentPod {
        name: uid,
        uid,
        node,
        revision,
        running: true,
        ready: true,
        ..AgentPod::default()
    }
}

/// One node `n1` at `state`, its target pod (`old`, revision r1) and/or
/// canary pod (`new`, revision r2) Ready; the canary active on r2.
fn ctx(state: HandoverState, old: bool, new: bool, order: HandoverOrder) -> Context<'static> {
    let mut pods = Vec::new();
    if old {
        pods.push(OwnedPod {
            owner: Owner::Target,
            pod: pod("n1", "old", "r1"),
            hash: "h1",
        });
    }
    if new {
        pods.push(OwnedPod {
            owner: Owner::Canary,
            pod: pod("n1", "new", "r2"),
            hash: "c2",
        });
    }
    let agents = node_agents(&pods, |_| true);
    Context {
        pair: Pair {
            target: Some("r1"),
            canary: Some(Canary {
                revision: Some("r2"),
                retiring: false,
            }),
        },
        order,
        states: BTreeMap::from([("n1", state)]),
        pods: BTreeMap::from([("n1", pods)]),
        agents: BTreeMap::from([("n1", agents)]),
        spec_is_target: false,
        target_hash: Some("h1+x".into()),
        stable: Some("r1"),
        judged: Default::default(),
        promotion: PromotionFacts {
            target_has_expression: true,
            ..PromotionFacts::default()
        },
    }
}

fn delete(uid: &str) -> Action {
    Action::DeletePods {
        pods: vec![PodRef {
            name: uid.into(),
            uid: uid.into(),
            node: "n1".into(),
            unchanged_since: None,
        }],
    }
}

fn handover(to: HandoverState) -> Step {
    Step::Handover {
        node: "n1".into(),
        to,
        unless_changed: Vec::new(),
    }
}

#[test]
fn deleting_the_old_agent_is_the_nodes_first_handover_move() {
    let bbm = ctx(
        HandoverState::Old,
        true,
        false,
        HandoverOrder::BreakBeforeMake,
    );
    assert_eq!(
        translate(delete("old"), &bbm),
        [handover(HandoverState::Drain)]
    );
    let mbb = ctx(
        HandoverState::Old,
        true,
        false,
        HandoverOrder::MakeBeforeBreak,
    );
    assert_eq!(
        translate(delete("old"), &mbb),
        [handover(HandoverState::Surge)]
    );
}

/// A deletion the budget did not pay for (the pod was not Ready) is
/// conditioned on the pod as the pass saw it; a label write cannot be, so
/// the handover carries the pod for the executor to read first.
#[test]
fn an_unpaid_deletion_hands_its_pod_to_the_handover_to_be_read_first() {
    let bbm = ctx(
        HandoverState::Old,
        true,
        false,
        HandoverOrder::BreakBeforeMake,
    );
    let Action::DeletePods { mut pods } = delete("old") else {
        unreachable!()
    };
    pods[0].unchanged_since = Some("7".into());
    let unpaid = pods[0].clone();
    assert_eq!(
        translate(Action::DeletePods { pods }, &bbm),
        [Step::Handover {
            node: "n1".into(),
            to: HandoverState::Drain,
            unless_changed: vec![unpaid],
        }]
    );
    // Paid for: written whatever the pod's state.
    assert_eq!(
        translate(delete("old"), &bbm),
        [handover(HandoverState::Drain)]
    );
}

/// The promotion holds the nodes it tainted: neither controller would
/// create a pod there, so a deletion or a move waits for its end.
#[test]
fn nothing_is_deleted_or_moved_on_a_node_the_promotion_tainted() {
    for (state, old, new) in [
        (HandoverState::Old, true, false),
        (HandoverState::New, false, true),
    ] {
        let mut c = ctx(state, old, new, HandoverOrder::MakeBeforeBreak);
        let uid = if old { "old" } else { "new" };
        assert!(!translate(delete(uid), &c).is_empty(), "{state:?}");
        c.promotion.tainted.insert("n1");
        assert_eq!(translate(delete(uid), &c), [], "{state:?}");
    }
}

#[test]
fn a_canary_pod_of_a_stale_canary_template_is_deleted_in_place() {
    let c = ctx(
        HandoverState::New,
        false,
        true,
        HandoverOrder::BreakBeforeMake,
    );
    assert_eq!(translate(delete("new"), &c), [Step::Engine(delete("new"))]);
}

#[test]
fn a_promoted_target_no_longer_follows_labels() {
    let mut c = ctx(
        HandoverState::Old,
        true,
        false,
        HandoverOrder::BreakBeforeMake,
    );
    c.promotion.target_has_expression = false;
    assert_eq!(translate(delete("old"), &c), [Step::Engine(delete("old"))]);
    // A node left at `drain` with only the target's pod loses the label.
    let mut c = ctx(
        HandoverState::Drain,
        true,
        false,
        HandoverOrder::BreakBeforeMake,
    );
    c.promotion.target_has_expression = false;
    assert_eq!(follow_ups(&c, &[]), [handover(HandoverState::Old)]);
}

#[test]
fn a_revert_goes_where_the_stable_revision_is() {
    let restore = Action::RestoreLastGood {
        content: "sha256:r1".into(),
    };
    let c = ctx(
        HandoverState::New,
        false,
        true,
        HandoverOrder::BreakBeforeMake,
    );
    assert_eq!(translate(restore.clone(), &c), [Step::RetireCanary]);
    // The stable revision passed in the canary and was not promoted: the
    // canary's template goes back to it.
    let mut c = ctx(
        HandoverState::New,
        false,
        true,
        HandoverOrder::BreakBeforeMake,
    );
    c.stable = Some("r0");
    assert_eq!(
        translate(restore, &c),
        [Step::RestoreCanary {
            content: "sha256:r1".into()
        }]
    );
}

#[test]
fn template_writes_wait_for_a_promotion_under_way() {
    let mut c = ctx(
        HandoverState::New,
        false,
        true,
        HandoverOrder::BreakBeforeMake,
    );
    assert_eq!(
        translate(Action::ApplySpecTemplate, &c),
        [Step::WriteCanary]
    );
    c.promotion.tainted.insert("n1");
    assert_eq!(translate(Action::ApplySpecTemplate, &c), []);
    c.promotion.tainted.clear();
    c.spec_is_target = true;
    assert_eq!(
        translate(Action::ApplySpecTemplate, &c),
        [Step::RetireCanary]
    );
}

#[test]
fn break_before_make_creates_the_new_agent_once_the_old_one_is_gone() {
    let leaving = ctx(
        HandoverState::Drain,
        true,
        false,
        HandoverOrder::BreakBeforeMake,
    );
    assert_eq!(follow_ups(&leaving, &[]), []);
    let gone = ctx(
        HandoverState::Drain,
        false,
        false,
        HandoverOrder::BreakBeforeMake,
    );
    assert_eq!(follow_ups(&gone, &[]), [handover(HandoverState::New)]);
}

#[test]
fn make_before_break_keeps_the_old_agent_until_the_node_is_judged() {
    let mut c = ctx(
        HandoverState::Surge,
        true,
        true,
        HandoverOrder::MakeBeforeBreak,
    );
    assert_eq!(
        follow_ups(&c, &[]),
        [],
        "new agent serving, node not judged"
    );
    c.judged.insert("n1");
    assert_eq!(follow_ups(&c, &[]), [handover(HandoverState::New)]);
    // A new agent that does not serve never takes over, judged or not.
    c.agents.insert(
        "n1",
        NodeAgents {
            new_serving: false,
            ..c.agents["n1"]
        },
    );
    assert_eq!(follow_ups(&c, &[]), []);
}

#[test]
fn the_engine_sees_the_pod_a_node_leaves_as_being_deleted() {
    let c = ctx(
        HandoverState::Surge,
        true,
        true,
        HandoverOrder::MakeBeforeBreak,
    );
    let pods: Vec<OwnedPod> = c.pods["n1"].clone();
    let seen = engine_pods(&pods, &c);
    let by_uid: BTreeMap<&str, bool> = seen["n1"].iter().map(|p| (p.uid, p.deleting)).collect();
    assert_eq!(by_uid, BTreeMap::from([("old", true), ("new", false)]));
}

#[test]
fn names_fit_kubernetes_limits() {
    let long = "x".repeat(200);
    assert!(handover_label_key(&long).len() <= HANDOVER_LABEL_PREFIX.len() + 63);
    assert!(canary_name(&long).len() <= 58);
    assert_eq!(canary_name("plugin"), "plugin-saferollout-canary");
    assert_ne!(canary_name(&long), canary_name(&"y".repeat(200)));
}

/// A promotion at its release: node n1 and n2 on the canary (r2, passed),
/// tainted, the canary held, the target's template the canary's (hash h2).
/// `released`: the canary pods already carrying the target's hash, which
/// their controller has not let go of yet.
fn releasing(released: &[&'static str]) -> Context<'static> {
    let canary_pod = |node: &'static str, uid: &'static str| OwnedPod {
        owner: Owner::Canary,
        pod: pod(node, uid, "r2"),
        hash: if released.contains(&uid) { "h2" } else { "c2" },
    };
    let pods = BTreeMap::from([
        ("n1", vec![canary_pod("n1", "p1")]),
        ("n2", vec![canary_pod("n2", "p2")]),
    ]);
    let agents = pods
        .iter()
        .map(|(n, ps)| (*n, node_agents(ps, |_| true)))
        .collect();
    Context {
        pair: Pair {
            target: Some("r2"),
            canary: Some(Canary {
                revision: Some("r2"),
                retiring: false,
            }),
        },
        order: HandoverOrder::BreakBeforeMake,
        states: BTreeMap::from([("n1", HandoverState::New), ("n2", HandoverState::New)]),
        pods,
        agents,
        spec_is_target: false,
        target_hash: Some("h2".into()),
        stable: Some("r2"),
        judged: Default::default(),
        promotion: PromotionFacts {
            tainted: ["n1", "n2"].into(),
            canary_held: true,
            target_on_canary: true,
            target_written: true,
            target_has_expression: false,
        },
    }
}

#[test]
fn a_released_pod_is_not_released_again_and_the_canary_goes_once_all_are() {
    let release = |uids: &[&str]| {
        Step::Promote(PromotionStep::Release {
            pods: uids
                .iter()
                .map(|u| PodRef {
                    name: u.to_string(),
                    uid: u.to_string(),
                    node: if *u == "p1" { "n1" } else { "n2" }.into(),
                    unchanged_since: None,
                })
                .collect(),
            hash: "h2".into(),
        })
    };
    assert_eq!(follow_ups(&releasing(&[]), &[]), [release(&["p1", "p2"])]);
    assert_eq!(follow_ups(&releasing(&["p1"]), &[]), [release(&["p2"])]);
    assert_eq!(
        follow_ups(&releasing(&["p1", "p2"]), &[]),
        [Step::Promote(PromotionStep::DeleteCanary)]
    );
}
