//! The promotion: once the last stage passed, the target DaemonSet takes
//! the new template and the canary's pods without restarting any
//! (`docs/design/selector-strategy.md`, "Promotion without a second
//! restart"; the mechanics are proven against the real DaemonSet controller
//! by `crates/testkit/tests/selector_handover.rs`).
//!
//! Every step is read back from the cluster, so a crash between any two
//! repeats or skips nothing:
//! 1. taint the canary's nodes `saferollout.dev/promoting=<id>:NoSchedule`:
//!    neither DaemonSet creates a pod there nor deletes one;
//! 2. make the DaemonSet controller see the taints (an update of the canary
//!    re-syncs it; its status then desires 0 pods);
//! 3. write the canary's template to the target (OnDelete: no pod moves);
//! 4. release each canary pod to the target: its hash label set to the
//!    target's new revision, without the canary label;
//! 5. delete the canary (orphaning anything it still owns, which the
//!    target then adopts);
//! 6. untaint, 7. remove the handover labels.

use std::collections::BTreeSet;

use super::{Context, Owner};
use crate::handover::HandoverState;
use crate::rollout::PodRef;

pub use saferollout_api::PROMOTING_TAINT;

/// What the promotion reads of the cluster besides pods and labels.
#[derive(Debug, Clone, Default)]
pub struct PromotionFacts<'a> {
    /// Nodes carrying this rollout's promoting taint.
    pub tainted: BTreeSet<&'a str>,
    /// The canary's status (observed after its latest spec) desires no pod:
    /// its controller has seen every taint.
    pub canary_held: bool,
    /// The target's template is the canary's (without the handover
    /// expression and the canary label) and its controller observed it.
    pub target_on_canary: bool,
    /// The target's template is the canary's, observed or not: written
    /// already (its controller has not caught up yet).
    pub target_written: bool,
    /// The target's template carries the handover expression.
    pub target_has_expression: bool,
}

/// One step of the promotion.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PromotionStep {
    Taint {
        nodes: Vec<String>,
    },
    /// Update the canary (an annotation) so its controller syncs it again
    /// and sees the taints.
    NudgeCanary,
    /// Write the canary's template (without the handover expression and
    /// the canary label) to the target.
    WriteTarget,
    /// Hand these canary pods to the target, with its current hash.
    Release {
        pods: Vec<PodRef>,
        hash: String,
    },
    /// Delete the canary, orphaning what it still owns.
    DeleteCanary,
    Untaint {
        nodes: Vec<String>,
    },
    RemoveLabels {
        nodes: Vec<String>,
    },
}

/// The next promotion step while the canary exists; `None` while nodes are
/// still handed over (the engine settles joining nodes first) or the
/// target's controller has not observed its template yet.
pub(super) fn next(ctx: &Context) -> Option<PromotionStep> {
    let promoted = ctx.pair.canary.and_then(|c| c.revision)?;
    let pods = ctx.pods.values().flatten();
    let (target_pods, canary_pods): (Vec<&super::OwnedPod>, Vec<&super::OwnedPod>) =
        pods.partition(|p| p.owner == Owner::Target);
    // The target's pods leaving handed-over nodes go first (the target,
    // without its expression, would keep them beside the released ones).
    // Its pods on nodes never handed over (NotReady during the stages, or
    // joined since) stay: the target is OnDelete, and once promoted the
    // engine replaces them like any node behind the stable revision.
    // (Released pods are the target's already, on the promoted revision.)
    let old_agents = target_pods.iter().any(|p| {
        p.pod.deleting
            || (p.pod.revision != promoted && ctx.state(p.pod.node) != HandoverState::Old)
    });
    let all_new = ctx
        .states
        .values()
        .all(|s| matches!(s, HandoverState::Old | HandoverState::New));
    if old_agents || !all_new || canary_pods.iter().any(|p| p.pod.deleting) {
        return None;
    }
    // A canary pod of an older canary template (the canary is OnDelete) is
    // never released: relabelled with the target's hash it would pass for
    // the promoted revision. It stays the canary's until the canary's
    // orphaning deletion, keeps its own hash under the target, and is
    // replaced after the promotion like any node behind (not waited for: on
    // a quarantined or NotReady node nothing would replace it, and the
    // promotion, holding every new template back, would never end).
    let releasable: Vec<&&super::OwnedPod> = canary_pods
        .iter()
        .filter(|p| p.pod.revision == promoted)
        .collect();
    let untainted: Vec<String> = ctx
        .states
        .iter()
        .filter(|(_, s)| **s == HandoverState::New)
        .map(|(n, _)| *n)
        .chain(canary_pods.iter().map(|p| p.pod.node))
        .filter(|n| !ctx.promotion.tainted.contains(n))
        .collect::<BTreeSet<_>>()
        .into_iter()
        .map(str::to_string)
        .collect();
    if !untainted.is_empty() {
        return Some(PromotionStep::Taint { nodes: untainted });
    }
    if !ctx.promotion.canary_held {
        return Some(PromotionStep::NudgeCanary);
    }
    if !ctx.promotion.target_on_canary {
        // Written once: the same write again changes nothing while the
        // target's controller catches up.
        return (!ctx.promotion.target_written).then_some(PromotionStep::WriteTarget);
    }
    let hash = ctx.target_hash.as_deref()?;
    // Released already (the target's hash): in transit until the canary's
    // controller lets it go and the target's adopts it.
    let releasable: Vec<&&super::OwnedPod> =
        releasable.into_iter().filter(|p| p.hash != hash).collect();
    if !releasable.is_empty() {
        return Some(PromotionStep::Release {
            pods: releasable
                .iter()
                .map(|p| PodRef {
                    name: p.pod.name.to_string(),
                    uid: p.pod.uid.to_string(),
                    node: p.pod.node.to_string(),
                    unchanged_since: None,
                })
                .collect(),
            hash: hash.to_string(),
        });
    }
    Some(PromotionStep::DeleteCanary)
}

/// Removes the promotion taint from every node that carries it.
pub(super) fn untaint_all(ctx: &Context) -> PromotionStep {
    PromotionStep::Untaint {
        nodes: ctx
            .promotion
            .tainted
            .iter()
            .map(|n| n.to_string())
            .collect(),
    }
}

/// What is left of a promotion once the canary is gone: the taints (only
/// when every agent pod is the target's), then the handover labels. (A
/// retired canary is deleted only once no node is labelled; labels without
/// a canary otherwise mean it was deleted under them, and removing them is
/// what brings the target's agents back.)
pub(super) fn finish(ctx: &Context) -> Option<PromotionStep> {
    if !ctx.promotion.tainted.is_empty() {
        if ctx
            .pods
            .values()
            .flatten()
            .any(|p| p.owner == Owner::Canary)
        {
            return None; // still to be adopted
        }
        return Some(untaint_all(ctx));
    }
    let labelled: Vec<String> = ctx
        .states
        .iter()
        .filter(|(_, s)| **s != HandoverState::Old)
        .map(|(n, _)| n.to_string())
        .collect();
    (!labelled.is_empty()).then_some(PromotionStep::RemoveLabels { nodes: labelled })
}
