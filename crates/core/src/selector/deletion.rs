//! A `Selector` SafeRollout's deletion: the pair is undone without
//! restarting an agent or rolling anything, one step per pass, each read
//! back from the cluster (a crash between two repeats or skips nothing).
//!
//! The canary's pods are handed to the target as the promotion hands them
//! (`promotion.rs`), but the target keeps its own template: the nodes the
//! canary holds are tainted so neither DaemonSet moves its agent there, the
//! target's handover expression is taken off (it would delete the adopted
//! pods on nodes it does not run on), the canary is deleted orphaning its
//! pods, which the target adopts; then the labels and the taints go. The
//! DaemonSet is then given back as under `InPlace`: with its own update
//! strategy it replaces the adopted pods (another template) by its own
//! rules, or keeps them under `OnDelete`. Nothing rolls a revision the
//! gates stopped: the target's template is the one it had.

use std::collections::BTreeSet;

use super::promotion::{PromotionStep, untaint_all};
use super::{Context, Owner, Step};
use crate::handover::HandoverState;

/// What the deletion does next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeletionStep {
    Step(Step),
    /// The garbage collector has not handed the orphaned pods over yet.
    Wait,
    /// Nothing of the strategy is left.
    Done,
}

/// The next step of the deletion.
pub fn next(ctx: &Context) -> DeletionStep {
    let pods = || ctx.pods.values().flatten();
    let canary_pods: BTreeSet<&str> = pods()
        .filter(|p| p.owner == Owner::Canary && !p.pod.deleting)
        .map(|p| p.pod.node)
        .collect();
    let handed: Vec<&str> = ctx
        .states
        .iter()
        .filter(|(_, s)| **s != HandoverState::Old)
        .map(|(n, _)| *n)
        .collect();
    if ctx.pair.canary.is_some() {
        let untainted: Vec<String> = canary_pods
            .iter()
            .chain(handed.iter())
            .copied()
            .collect::<BTreeSet<&str>>()
            .into_iter()
            .filter(|n| !ctx.promotion.tainted.contains(n))
            .map(str::to_string)
            .collect();
        if !untainted.is_empty() {
            return DeletionStep::Step(Step::Promote(PromotionStep::Taint { nodes: untainted }));
        }
        if !ctx.promotion.canary_held {
            return DeletionStep::Step(Step::Promote(PromotionStep::NudgeCanary));
        }
        if ctx.promotion.target_has_expression {
            return DeletionStep::Step(Step::ClearTarget);
        }
        return DeletionStep::Step(Step::Promote(PromotionStep::DeleteCanary));
    }
    if ctx.promotion.target_has_expression {
        return DeletionStep::Step(Step::ClearTarget);
    }
    if pods().any(|p| p.owner == Owner::Canary) {
        return DeletionStep::Wait;
    }
    if !handed.is_empty() {
        return DeletionStep::Step(Step::Promote(PromotionStep::RemoveLabels {
            nodes: handed.iter().map(|n| n.to_string()).collect(),
        }));
    }
    if !ctx.promotion.tainted.is_empty() {
        return DeletionStep::Step(Step::Promote(untaint_all(ctx)));
    }
    DeletionStep::Done
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::handover::HandoverOrder;
    use crate::selector::{Canary, OwnedPod, Pair, PromotionFacts};
    use crate::views::AgentPod;
    use std::collections::BTreeMap;

    fn pod<'a>(owner: Owner, node: &'a str, uid: &'a str) -> OwnedPod<'a> {
        OwnedPod {
            owner,
            pod: AgentPod {
                name: uid,
                uid,
                node,
                revision: "r",
                running: true,
                ready: true,
                ..Default::default()
            },
            hash: "h",
        }
    }

    fn ctx<'a>(pods: &[OwnedPod<'a>], canary: bool) -> Context<'a> {
        let mut by_node: BTreeMap<&str, Vec<OwnedPod>> = BTreeMap::new();
        for p in pods {
            by_node.entry(p.pod.node).or_default().push(*p);
        }
        Context {
            pair: Pair {
                target: Some("old"),
                canary: canary.then_some(Canary {
                    revision: Some("new"),
                    retiring: false,
                }),
            },
            order: HandoverOrder::BreakBeforeMake,
            states: BTreeMap::new(),
            pods: by_node,
            agents: BTreeMap::new(),
            spec_is_target: false,
            target_hash: Some("h".into()),
            stable: Some("old"),
            judged: BTreeSet::new(),
            promotion: PromotionFacts::default(),
        }
    }

    /// Plays the deletion against a tiny picture of the cluster: each step
    /// applied as the controllers would, until `Done`.
    #[test]
    fn a_canary_mid_rollout_is_undone_in_order_without_deleting_a_pod() {
        let pods = [
            pod(Owner::Canary, "n0", "c0"),
            pod(Owner::Target, "n1", "t1"),
        ];
        let mut c = ctx(&pods, true);
        c.states.insert("n0", HandoverState::New);
        c.promotion.target_has_expression = true;
        let mut seen = Vec::new();
        for _ in 0..10 {
            let step = next(&c);
            seen.push(step.clone());
            match step {
                DeletionStep::Done => break,
                DeletionStep::Wait => panic!("nothing to wait for here"),
                DeletionStep::Step(Step::Promote(PromotionStep::Taint { nodes })) => {
                    assert_eq!(nodes, ["n0"]);
                    c.promotion.tainted.insert("n0");
                }
                DeletionStep::Step(Step::Promote(PromotionStep::NudgeCanary)) => {
                    c.promotion.canary_held = true
                }
                DeletionStep::Step(Step::ClearTarget) => {
                    // Only once the node is tainted: the target must not
                    // start a second agent there, nor (with its expression)
                    // delete the pod it adopts.
                    assert!(c.promotion.tainted.contains("n0"));
                    c.promotion.target_has_expression = false
                }
                DeletionStep::Step(Step::Promote(PromotionStep::DeleteCanary)) => {
                    assert!(!c.promotion.target_has_expression);
                    c.pair.canary = None;
                    for p in c.pods.values_mut().flatten() {
                        p.owner = Owner::Target; // adopted
                    }
                }
                DeletionStep::Step(Step::Promote(PromotionStep::RemoveLabels { nodes })) => {
                    assert_eq!(nodes, ["n0"]);
                    c.states.clear();
                }
                DeletionStep::Step(Step::Promote(PromotionStep::Untaint { nodes })) => {
                    assert_eq!(nodes, ["n0"]);
                    assert!(c.states.is_empty(), "labels go before the taints");
                    c.promotion.tainted.clear();
                }
                other => panic!("unexpected {other:?}"),
            }
        }
        assert_eq!(seen.last(), Some(&DeletionStep::Done), "{seen:?}");
        assert_eq!(seen.len(), 7, "{seen:?}");
    }

    #[test]
    fn orphaned_pods_not_yet_adopted_are_waited_for() {
        let pods = [pod(Owner::Canary, "n0", "c0")];
        let mut c = ctx(&pods, false);
        c.promotion.tainted.insert("n0");
        assert_eq!(next(&c), DeletionStep::Wait);
    }

    #[test]
    fn a_pair_never_started_or_long_done_is_done_at_once() {
        let pods = [pod(Owner::Target, "n0", "t0")];
        assert_eq!(next(&ctx(&pods, false)), DeletionStep::Done);
    }
}
