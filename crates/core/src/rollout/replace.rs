//! Which agent pods to delete now, within the disruption budget.
//!
//! A node is *unavailable* when no live agent pod on it is Running and Ready
//! (missing, terminating, starting, crashing). Of the nodes the operator is
//! responsible for (the rollout's, or those being brought back), at most
//! `maxUnavailable` may be unavailable at once, counting the ones the operator
//! is about to empty:
//! - deleting a pod that is not Ready costs nothing: its node is unavailable
//!   already and stays so until the replacement is Ready (the delete is
//!   conditional on the pod being as seen, so one that became Ready while the
//!   cache lagged is not deleted);
//! - deleting a Ready pod takes one free slot;
//! - nodes whose agent itself failed a gate are the documented exception:
//!   they are reverted at once and do not count.
//!
//! Nodes are taken in name order, so the same snapshot always yields the same
//! deletions: a decision repeated on a stale cache deletes the same pod again
//! (a no-op, guarded by its UID), never one more.

use std::collections::BTreeSet;

use super::{Observed, PodRef};
use crate::eligibility::eligibility;
use crate::views::{DaemonSetView, PodsByNode, live_pods};

/// Is the node's agent serving (a live pod Running and Ready)?
pub(super) fn is_available(pods: &PodsByNode, node: &str) -> bool {
    live_pods(pods, node).any(|p| p.running && p.ready)
}

/// How many covered nodes the budget counts as unavailable now: those the
/// operator touched (`touched`: held by a stage) or that are off the stable
/// revision or without any agent pod (a replacement in flight, from this
/// rollout or one abandoned a moment ago), and whose agent does not serve.
/// Nodes in `exempt` (their agent failed a gate) are left out.
pub(super) fn unavailable(
    o: &Observed,
    ds: &DaemonSetView,
    stable: &str,
    touched: &BTreeSet<&str>,
    exempt: &BTreeSet<String>,
) -> usize {
    o.nodes
        .values()
        .filter(|n| !exempt.contains(n.name))
        .filter(|n| !is_available(o.pods, n.name))
        .filter(|n| {
            let mut live = live_pods(o.pods, n.name).peekable();
            let gap = live.peek().is_none();
            touched.contains(n.name) || gap || live.any(|p| p.revision != stable)
        })
        .filter(|n| eligibility(n, &ds.placement).is_eligible())
        .count()
}

/// The pods to delete now so the nodes in `to_replace` (sorted) move to
/// `desired`, given `unavailable` nodes already unavailable among those the
/// budget covers, `exempt` nodes outside it, and `max_unavailable`.
pub(super) fn deletions(
    pods: &PodsByNode,
    to_replace: &[&str],
    desired: &str,
    unavailable: usize,
    exempt: &BTreeSet<String>,
    max_unavailable: usize,
) -> Vec<PodRef> {
    let mut free = max_unavailable.saturating_sub(unavailable);
    let mut out = Vec::new();
    for &node in to_replace {
        let old: Vec<_> = live_pods(pods, node)
            .filter(|p| p.revision != desired)
            .collect();
        if old.is_empty() {
            continue;
        }
        // A node also running a Ready pod of the desired revision loses nothing.
        let serving_desired =
            live_pods(pods, node).any(|p| p.revision == desired && p.ready && p.running);
        let costs = is_available(pods, node) && !serving_desired && !exempt.contains(node);
        if costs {
            if free == 0 {
                continue;
            }
            free -= 1;
        }
        // An exempt node's agent is reverted whatever its state; an unpaid
        // deletion holds only while the pod is as seen (not Ready).
        let paid = costs || exempt.contains(node) || serving_desired;
        out.extend(old.into_iter().map(|p| PodRef::of(p, paid)));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::views::{AgentPod, pods_by_node};

    fn pod<'a>(name: &'a str, node: &'a str, revision: &'a str, ready: bool) -> AgentPod<'a> {
        AgentPod {
            name,
            uid: name,
            resource_version: "7",
            node,
            revision,
            running: true,
            ready,
            ..Default::default()
        }
    }

    #[test]
    fn ready_pods_take_slots_unready_ones_are_free() {
        let pods = pods_by_node([
            pod("a", "n1", "old", true),
            pod("b", "n2", "old", false),
            pod("c", "n3", "old", true),
            pod("d", "n4", "old", true),
        ]);
        let nodes = ["n1", "n2", "n3", "n4"];
        let none = BTreeSet::new();
        let names = |v: Vec<PodRef>| v.into_iter().map(|p| p.name).collect::<Vec<_>>();
        // One node (n2) is unavailable already: with 2 allowed, one Ready pod may go.
        assert_eq!(
            names(deletions(&pods, &nodes, "new", 1, &none, 2)),
            ["a", "b"]
        );
        // With 1 allowed and n2 down, only the unready pod is replaced, and
        // only if it is still as seen (not Ready).
        let free = deletions(&pods, &nodes, "new", 1, &none, 1);
        assert_eq!(free[0].name, "b");
        assert_eq!(free[0].unchanged_since.as_deref(), Some("7"));
        assert_eq!(free.len(), 1);
        let paid = deletions(&pods, &nodes, "new", 0, &none, 1);
        assert_eq!(
            paid[0].unchanged_since, None,
            "a paid deletion holds whatever the pod's state"
        );
        // A failed node is exempt from the budget.
        let exempt: BTreeSet<String> = ["n3".to_string()].into();
        assert_eq!(
            names(deletions(&pods, &nodes, "new", 1, &exempt, 1)),
            ["b", "c"]
        );
    }

    #[test]
    fn pods_on_the_desired_revision_or_terminating_are_left_alone() {
        let mut terminating = pod("t", "n2", "old", true);
        terminating.deleting = true;
        let pods = pods_by_node([pod("a", "n1", "new", true), terminating]);
        assert!(deletions(&pods, &["n1", "n2"], "new", 0, &BTreeSet::new(), 5).is_empty());
    }
}
