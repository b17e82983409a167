//! Stage planning: which nodes each stage of a rollout takes.
//!
//! Pure: the reconciler builds [`Candidate`]s from its caches and persists the
//! result in status before touching any node, so a restarted operator resumes
//! with the same plan rather than recomputing a different one.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube_core::{Selector, SelectorExt};

use crate::eligibility::plannable;
use crate::views::{NodesByName, Placement, PodsByNode, live_pods};

/// A node that runs (or should run) the target DaemonSet's agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    pub name: String,
    /// `topology.kubernetes.io/zone`, when the node has one.
    pub zone: Option<String>,
    /// Matches `spec.canary.nodeSelector` (true for every node when there is none).
    pub canary_eligible: bool,
    /// Its agent pod already runs the target revision.
    pub on_target: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    #[error("no node runs the DaemonSet's agent, so there is nothing to roll out to")]
    NoNodes,
    #[error("no node that runs the agent matches spec.canary.nodeSelector")]
    NoCanaryNode,
}

/// The canary selector, parsed; an invalid one (refused by the API server's
/// schema for a real SafeRollout) selects nothing rather than everything.
pub fn canary_selector(selector: Option<&LabelSelector>) -> CanarySelector {
    match selector {
        None => CanarySelector::Any,
        Some(s) => match Selector::try_from(s.clone()) {
            Ok(sel) => CanarySelector::Matching(sel),
            Err(_) => CanarySelector::Nothing,
        },
    }
}

/// Which nodes the first stage may take.
#[derive(Debug, Clone)]
pub enum CanarySelector {
    Any,
    Matching(Selector),
    Nothing,
}

impl CanarySelector {
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        match self {
            CanarySelector::Any => true,
            CanarySelector::Matching(s) => s.matches(labels),
            CanarySelector::Nothing => false,
        }
    }
}

/// How many nodes [`candidates`] gives, without building them.
pub fn candidate_count(nodes: &NodesByName, pods: &PodsByNode, placement: &Placement) -> usize {
    nodes
        .values()
        .filter(|n| live_pods(pods, n.name).next().is_some())
        .filter(|n| plannable(n, placement).is_ok())
        .count()
}

/// The nodes a stage may take: every node whose agent the operator may
/// replace now and that is not going out of service (see
/// [`crate::eligibility::plannable`]) and that runs a live agent pod,
/// sorted by name. A node where the DaemonSet has no pod yet is not a
/// candidate: its pod comes from the DaemonSet controller, on the current
/// template, and is judged as a node joining the rollout.
pub fn candidates(
    nodes: &NodesByName,
    pods: &PodsByNode,
    placement: &Placement,
    canary: &CanarySelector,
    target: &str,
) -> Vec<Candidate> {
    nodes
        .values()
        .filter(|n| plannable(n, placement).is_ok())
        .filter_map(|n| {
            let mut live = live_pods(pods, n.name).peekable();
            live.peek()?;
            let on_target = live.any(|p| p.revision == target);
            Some(Candidate {
                name: n.name.to_string(),
                zone: n.zone().map(str::to_string),
                canary_eligible: canary.matches(n.labels),
                on_target,
            })
        })
        .collect()
}

/// How many nodes (cumulative, across all stages so far) stage `wanted` asks
/// for out of `total`: a count, or a percentage rounded up; never 0 when there
/// are nodes, never more than `total`.
pub fn cumulative_target(wanted: usize, total: usize) -> usize {
    wanted.clamp(1, total.max(1)).min(total)
}

/// Nodes to add in the stage whose cumulative size is `target`.
///
/// - `already`: nodes taken by earlier stages; they stay in the rollout and count.
/// - nodes already on the target revision count too (someone deleted a pod by
///   hand, or the operator restarted mid-stage): they are taken first.
/// - the rest are spread across zones: each pick goes to the zone with the
///   fewest nodes in the rollout so far, then by node name, so the plan is
///   deterministic.
/// - the first stage (`canary`) only takes canary-eligible nodes.
///
/// Never returns more nodes than `target - already.len()` unless more nodes are
/// already on the target revision than the stage asks for (they cannot be
/// un-updated; they are reported so gates judge them).
pub fn plan_stage(
    candidates: &[Candidate],
    already: &BTreeSet<String>,
    target: usize,
    canary: bool,
) -> Result<Vec<String>, PlanError> {
    if candidates.is_empty() {
        return Err(PlanError::NoNodes);
    }
    let pool: Vec<&Candidate> = candidates
        .iter()
        .filter(|c| !already.contains(&c.name))
        .filter(|c| !canary || c.canary_eligible)
        .collect();
    if canary && pool.is_empty() && already.is_empty() {
        return Err(PlanError::NoCanaryNode);
    }

    let mut picked: Vec<String> = Vec::new();
    // Nodes already on the target revision are part of the rollout whether we like it or not.
    picked.extend(pool.iter().filter(|c| c.on_target).map(|c| c.name.clone()));
    let mut room = target.saturating_sub(already.len() + picked.len());

    // Zone counts of what the rollout holds so far, for spreading.
    let zone_of: BTreeMap<&str, &str> = candidates
        .iter()
        .map(|c| (c.name.as_str(), c.zone.as_deref().unwrap_or("")))
        .collect();
    let mut per_zone: BTreeMap<&str, usize> = BTreeMap::new();
    for name in already.iter().chain(picked.iter()) {
        if let Some(z) = zone_of.get(name.as_str()) {
            *per_zone.entry(z).or_default() += 1;
        }
    }
    let mut remaining: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for c in pool.iter().filter(|c| !c.on_target) {
        remaining
            .entry(c.zone.as_deref().unwrap_or(""))
            .or_default()
            .push(&c.name);
    }
    for names in remaining.values_mut() {
        names.sort_unstable();
        names.reverse(); // pop() yields names in ascending order
    }
    while room > 0 {
        let Some(zone) = remaining
            .iter()
            .filter(|(_, names)| !names.is_empty())
            .min_by_key(|(zone, _)| (per_zone.get(*zone).copied().unwrap_or(0), **zone))
            .map(|(zone, _)| *zone)
        else {
            break;
        };
        let name = remaining
            .get_mut(zone)
            .and_then(Vec::pop)
            .expect("non-empty zone");
        *per_zone.entry(zone).or_default() += 1;
        picked.push(name.to_string());
        room -= 1;
    }
    picked.sort();
    Ok(picked)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, zone: &str) -> Candidate {
        Candidate {
            name: name.into(),
            zone: Some(zone.into()),
            canary_eligible: true,
            on_target: false,
        }
    }

    fn set(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn the_candidate_count_is_the_number_of_candidates() {
        use crate::views::{AgentPod, NodeView, RolloutLabels, pods_by_node};
        use k8s_openapi::api::core::v1::Taint;
        let labels = BTreeMap::new();
        let taints = [Taint {
            key: "example.com/dedicated".into(),
            effect: "NoSchedule".into(),
            ..Default::default()
        }];
        let alloc = crate::objects::Quantities::new();
        let view = |name, tainted: bool| NodeView {
            name,
            labels: &labels,
            ready: true,
            not_ready_since: None,
            status_written: None,
            taints: if tainted { &taints[..] } else { &[] },
            allocatable: &alloc,
            conditions: &[],
            ours: RolloutLabels::of(&labels),
        };
        // With a pod, without one, with only a terminating one, tainted.
        let nodes: NodesByName = [
            view("n1", false),
            view("n2", false),
            view("n3", false),
            view("n4", true),
        ]
        .into_iter()
        .map(|v| (v.name, v))
        .collect();
        let pod = |node, deleting| AgentPod {
            name: node,
            node,
            revision: "old",
            running: true,
            ready: true,
            deleting,
            ..Default::default()
        };
        let pods = pods_by_node([pod("n1", false), pod("n3", true), pod("n4", false)]);
        let placement = Placement::default();
        let all = candidates(&nodes, &pods, &placement, &CanarySelector::Any, "new");
        assert_eq!(
            all.iter().map(|c| c.name.as_str()).collect::<Vec<_>>(),
            ["n1"]
        );
        assert_eq!(candidate_count(&nodes, &pods, &placement), all.len());
    }

    #[test]
    fn cumulative_target_is_at_least_one_and_at_most_total() {
        assert_eq!(cumulative_target(0, 10), 1);
        assert_eq!(cumulative_target(3, 10), 3);
        assert_eq!(cumulative_target(30, 10), 10);
        assert_eq!(cumulative_target(1, 0), 0);
    }

    #[test]
    fn canary_takes_one_node_from_the_first_zone() {
        let nodes = [node("b-1", "b"), node("a-2", "a"), node("a-1", "a")];
        assert_eq!(
            plan_stage(&nodes, &BTreeSet::new(), 1, true).unwrap(),
            vec!["a-1"]
        );
    }

    #[test]
    fn stages_spread_across_zones() {
        let nodes = [
            node("a-1", "a"),
            node("a-2", "a"),
            node("a-3", "a"),
            node("b-1", "b"),
            node("b-2", "b"),
        ];
        let canary = plan_stage(&nodes, &BTreeSet::new(), 1, true).unwrap();
        assert_eq!(canary, vec!["a-1"]);
        // Next stage to 3 in total: b first (fewest so far), then a/b alternate.
        let next = plan_stage(&nodes, &set(&["a-1"]), 3, false).unwrap();
        assert_eq!(next, vec!["a-2", "b-1"]);
        let rest = plan_stage(&nodes, &set(&["a-1", "a-2", "b-1"]), 5, false).unwrap();
        assert_eq!(rest, vec!["a-3", "b-2"]);
    }

    #[test]
    fn never_takes_more_than_the_stage_asks() {
        let nodes: Vec<_> = (0..10)
            .map(|i| node(&format!("n-{i}"), if i % 2 == 0 { "a" } else { "b" }))
            .collect();
        for target in 1..=10 {
            let picked = plan_stage(&nodes, &BTreeSet::new(), target, false).unwrap();
            assert_eq!(picked.len(), target);
        }
        // Earlier stages count toward the cumulative target.
        let picked = plan_stage(&nodes, &set(&["n-0", "n-1", "n-2"]), 4, false).unwrap();
        assert_eq!(picked.len(), 1);
        // A target already met adds nothing.
        assert!(
            plan_stage(&nodes, &set(&["n-0", "n-1"]), 2, false)
                .unwrap()
                .is_empty()
        );
    }

    #[test]
    fn already_updated_nodes_count_and_come_first() {
        let mut nodes = vec![node("a-1", "a"), node("a-2", "a"), node("b-1", "b")];
        nodes[2].on_target = true;
        assert_eq!(
            plan_stage(&nodes, &BTreeSet::new(), 1, false).unwrap(),
            vec!["b-1"]
        );
        assert_eq!(
            plan_stage(&nodes, &BTreeSet::new(), 2, false).unwrap(),
            vec!["a-1", "b-1"]
        );
        // More already updated than asked: reported, nothing else added.
        nodes[0].on_target = true;
        assert_eq!(
            plan_stage(&nodes, &BTreeSet::new(), 1, false).unwrap(),
            vec!["a-1", "b-1"]
        );
    }

    #[test]
    fn canary_selector_limits_the_first_stage_only() {
        let mut nodes = vec![node("a-1", "a"), node("b-1", "b"), node("b-2", "b")];
        nodes[0].canary_eligible = false;
        nodes[1].canary_eligible = false;
        assert_eq!(
            plan_stage(&nodes, &BTreeSet::new(), 1, true).unwrap(),
            vec!["b-2"]
        );
        assert_eq!(
            plan_stage(&nodes, &set(&["b-2"]), 3, false).unwrap(),
            vec!["a-1", "b-1"]
        );
        nodes[2].canary_eligible = false;
        assert_eq!(
            plan_stage(&nodes, &BTreeSet::new(), 1, true),
            Err(PlanError::NoCanaryNode)
        );
    }

    #[test]
    fn nodes_without_zone_form_their_own_group() {
        let nodes = [
            Candidate {
                name: "x".into(),
                zone: None,
                canary_eligible: true,
                on_target: false,
            },
            node("a-1", "a"),
        ];
        assert_eq!(
            plan_stage(&nodes, &BTreeSet::new(), 2, false).unwrap(),
            vec!["a-1", "x"]
        );
    }

    #[test]
    fn canary_selectors_parse_once_and_fail_closed() {
        let labels: BTreeMap<String, String> = [("canary".to_string(), "yes".to_string())].into();
        assert!(canary_selector(None).matches(&labels));
        let sel: LabelSelector = serde_json::from_value(serde_json::json!(
            {"matchLabels": {"canary": "yes"}, "matchExpressions": [{"key": "zone", "operator": "DoesNotExist"}]}
        ))
        .unwrap();
        assert!(canary_selector(Some(&sel)).matches(&labels));
        let bad: LabelSelector = serde_json::from_value(serde_json::json!(
            {"matchExpressions": [{"key": "zone", "operator": "Sideways"}]}
        ))
        .unwrap();
        assert!(!canary_selector(Some(&bad)).matches(&labels));
    }

    #[test]
    fn no_nodes_is_an_error() {
        assert_eq!(
            plan_stage(&[], &BTreeSet::new(), 1, true),
            Err(PlanError::NoNodes)
        );
    }
}
