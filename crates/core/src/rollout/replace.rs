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
use crate::eligibility::{eligibility, uncovered_only_by_readiness};
use crate::views::{DaemonSetView, NodeView, PodsByNode, live_pods};

/// Is the node's agent serving (a live pod Running and Ready)?
pub(super) fn is_available(pods: &PodsByNode, node: &str) -> bool {
    live_pods(pods, node).any(|p| p.running && p.ready)
}

/// How many covered nodes the budget counts as unavailable now: those the
/// operator touched (`touched`: held by a stage) or that are off the stable
/// revision or without any agent pod (a replacement in flight, from this
/// rollout or one abandoned a moment ago), and whose agent does not serve.
/// Nodes in `violating` (a gate's violation soaking on them) count whatever
/// their agent's state: their devices do not serve as they should. Nodes in
/// `exempt` (their agent failed a gate) are left out, and so are nodes the
/// DaemonSet does not cover ([`counts_while_not_covered`] says when a
/// NotReady one still counts).
pub(super) fn unavailable(
    o: &Observed,
    ds: &DaemonSetView,
    stable: &str,
    touched: &BTreeSet<&str>,
    exempt: &BTreeSet<String>,
    violating: &BTreeSet<String>,
) -> usize {
    o.nodes
        .values()
        .filter(|n| !exempt.contains(n.name))
        .filter(|n| {
            violating.contains(n.name) || {
                !is_available(o.pods, n.name) && {
                    let mut live = live_pods(o.pods, n.name).peekable();
                    let gap = live.peek().is_none();
                    touched.contains(n.name) || gap || live.any(|p| p.revision != stable)
                }
            }
        })
        .filter(|n| {
            eligibility(n, &ds.placement).is_eligible()
                || (uncovered_only_by_readiness(n, &ds.placement)
                    && counts_while_not_covered(o.pods, n))
        })
        .count()
}

/// Does a node the node cache shows NotReady still count in the budget?
///
/// A node that went NotReady leaves the budget, as it leaves the DaemonSet
/// controller's: its agent comes back when the node does, outside the
/// operator's hands. But the node cache may lag the pod cache: a node that
/// went NotReady and came back moments ago still looks NotReady, while its
/// agent, replaced by the operator, is starting. Counting it out then would
/// let one more Ready agent go (two down with `maxUnavailable: 1`). So the
/// node counts while its agent changed at or after the moment the cache says
/// it went NotReady (a pod created or deleted since, or one the operator
/// deleted moments ago): such a change shows the cached NotReady is older
/// than the agent. A node that went NotReady after its agent was replaced
/// (hardware that died mid-rollout) holds no slot. Without a transition time
/// it counts. Timestamps have whole seconds, so a change in the same second
/// counts too.
fn counts_while_not_covered(pods: &PodsByNode, node: &NodeView) -> bool {
    let Some(since) = node.not_ready_since else {
        return true;
    };
    pods.get(node.name).into_iter().flatten().any(|p| {
        let moments_ago = p.deleting && p.deleted.is_none();
        moments_ago
            || p.created.is_some_and(|t| t >= since)
            || p.deleted.is_some_and(|t| t >= since)
    })
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
    use crate::views::{AgentPod, Placement, RolloutLabels, pods_by_node};

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

    /// The budget's view of a node the node cache shows NotReady since
    /// second 100 (with the not-ready taint that comes with it).
    fn not_ready_node<'a>(
        labels: &'a std::collections::BTreeMap<String, String>,
        taints: &'a [k8s_openapi::api::core::v1::Taint],
        alloc: &'a crate::objects::Quantities,
    ) -> NodeView<'a> {
        NodeView {
            name: "n1",
            labels,
            ready: false,
            not_ready_since: Some(at(100)),
            status_written: None,
            taints,
            allocatable: alloc,
            conditions: &[],
            ours: RolloutLabels::of(labels),
        }
    }

    fn at(second: i64) -> jiff::Timestamp {
        jiff::Timestamp::from_second(1_800_000_000 + second).unwrap()
    }

    fn taint(key: &str, effect: &str) -> k8s_openapi::api::core::v1::Taint {
        k8s_openapi::api::core::v1::Taint {
            key: key.into(),
            effect: effect.into(),
            ..Default::default()
        }
    }

    #[test]
    fn a_not_ready_node_counts_while_its_agent_changed_after_it_went_not_ready() {
        let labels = Default::default();
        let alloc = Default::default();
        let taints = [taint("node.kubernetes.io/not-ready", "NoSchedule")];
        let node = not_ready_node(&labels, &taints, &alloc);
        assert!(uncovered_only_by_readiness(&node, &Placement::default()));
        let starting = |created| AgentPod {
            created: Some(at(created)),
            ..pod("new", "n1", "new", false)
        };
        // The replacement was created after the cached NotReady (the node
        // cache lags: the node is back, its agent starting): it counts.
        assert!(counts_while_not_covered(
            &pods_by_node([starting(103)]),
            &node
        ));
        // Within the same second too: timestamps have whole seconds.
        assert!(counts_while_not_covered(
            &pods_by_node([starting(100)]),
            &node
        ));
        // The node went NotReady after its agent was replaced (it died
        // mid-rollout): it holds no slot.
        assert!(!counts_while_not_covered(
            &pods_by_node([starting(90)]),
            &node
        ));
        // An old pod deleted after the cached NotReady, or by the operator
        // moments ago (not in the cache yet): it counts.
        let deleted = |when| AgentPod {
            created: Some(at(10)),
            deleting: true,
            deleted: when,
            ..pod("old", "n1", "old", false)
        };
        assert!(counts_while_not_covered(
            &pods_by_node([deleted(Some(at(101)))]),
            &node
        ));
        assert!(counts_while_not_covered(
            &pods_by_node([deleted(None)]),
            &node
        ));
        assert!(!counts_while_not_covered(
            &pods_by_node([deleted(Some(at(99)))]),
            &node
        ));
        // No pod at all, and nothing says when: no change after the NotReady.
        assert!(!counts_while_not_covered(&pods_by_node([]), &node));
        // A node whose Ready condition has no transition time counts.
        let unknown = NodeView {
            not_ready_since: None,
            ..node
        };
        assert!(counts_while_not_covered(&pods_by_node([]), &unknown));
    }

    #[test]
    fn only_readiness_is_forgiven_by_the_transition_rule() {
        let labels = Default::default();
        let alloc = Default::default();
        let tainted = [
            taint("node.kubernetes.io/unreachable", "NoExecute"),
            taint("maintenance", "NoSchedule"),
        ];
        let node = not_ready_node(&labels, &tainted, &alloc);
        assert!(
            !uncovered_only_by_readiness(&node, &Placement::default()),
            "an untolerated taint keeps the node out whatever its readiness"
        );
        let ready = NodeView {
            ready: true,
            not_ready_since: None,
            taints: &[],
            ..node
        };
        assert!(!uncovered_only_by_readiness(&ready, &Placement::default()));
    }

    #[test]
    fn pods_on_the_desired_revision_or_terminating_are_left_alone() {
        let mut terminating = pod("t", "n2", "old", true);
        terminating.deleting = true;
        let pods = pods_by_node([pod("a", "n1", "new", true), terminating]);
        assert!(deletions(&pods, &["n1", "n2"], "new", 0, &BTreeSet::new(), 5).is_empty());
    }
}
