//! The order of agents on each node (`spec.ordering` of a policy): a
//! rollout replaces its agent on a node only once the rollouts it goes
//! after have passed their gates on that node: the driver, then the
//! container toolkit, then the device plugin and the DRA driver (a plugin
//! started against a driver that is still reloading caches stale NVML
//! handles).
//!
//! [`Dependencies::resolve`] turns the policy's label selectors into edges
//! between the governed rollouts; [`may_replace`] decides for one rollout
//! on one node. Ordering rules that form a cycle would make every rollout
//! in it wait forever, so a cycle is an error ([`OrderingError::Cycle`]),
//! for the rollouts in it and for those that wait on them, which the
//! operator reports on the policy and those rollouts: never a silent wait.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube_core::{Selector, SelectorExt};
use saferollout_api::OrderingRule;

/// Which rollouts each rollout goes after (direct edges only), by name
/// (`namespace/name`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Dependencies<'a> {
    after: BTreeMap<&'a str, BTreeSet<&'a str>>,
}

/// A governed rollout as the ordering rules see it.
#[derive(Debug, Clone, Copy)]
pub struct Governed<'a> {
    /// `namespace/name`.
    pub name: &'a str,
    pub labels: &'a BTreeMap<String, String>,
}

/// A selector that fails to parse (the API server's schema refuses most)
/// selects nothing rather than everything.
fn matcher(selector: &LabelSelector) -> Option<Selector> {
    Selector::try_from(selector.clone()).ok()
}

impl<'a> Dependencies<'a> {
    /// The edges the `rules` give among `rollouts`. A rollout matching both
    /// sides of a rule does not go after itself (a rule `rollouts: {}` means
    /// "every other agent").
    pub fn resolve(rules: &[OrderingRule], rollouts: &[Governed<'a>]) -> Self {
        let mut deps = Dependencies::default();
        for rule in rules {
            let Some(dependent) = matcher(&rule.rollouts) else {
                continue;
            };
            let afters: Vec<Selector> = rule.after.iter().filter_map(matcher).collect();
            for r in rollouts.iter().filter(|r| dependent.matches(r.labels)) {
                for a in rollouts
                    .iter()
                    .filter(|a| a.name != r.name && afters.iter().any(|s| s.matches(a.labels)))
                {
                    deps.add(r.name, a.name);
                }
            }
        }
        deps
    }

    /// `rollout` goes after `after`.
    pub fn add(&mut self, rollout: &'a str, after: &'a str) {
        self.after.entry(rollout).or_default().insert(after);
    }

    /// The rollouts `rollout` goes after directly.
    pub fn after(&self, rollout: &str) -> impl Iterator<Item = &'a str> + '_ {
        self.after.get(rollout).into_iter().flatten().copied()
    }

    /// A cycle among the edges, as the rollouts on it with the first
    /// repeated at the end (`a -> b -> a`); the same cycle whatever the
    /// order the edges were added in. `None` when there is none.
    pub fn cycle(&self) -> Option<Vec<&'a str>> {
        // Depth-first from each rollout in name order; a rollout on the
        // current path seen again closes a cycle.
        let mut done = BTreeSet::new();
        for &start in self.after.keys() {
            let mut path = Vec::new();
            if let Some(c) = self.find_cycle(start, &mut path, &mut done) {
                return Some(c);
            }
        }
        None
    }

    fn find_cycle(
        &self,
        at: &'a str,
        path: &mut Vec<&'a str>,
        done: &mut BTreeSet<&'a str>,
    ) -> Option<Vec<&'a str>> {
        if let Some(i) = path.iter().position(|p| *p == at) {
            let mut cycle = path[i..].to_vec();
            cycle.push(at);
            return Some(cycle);
        }
        if done.contains(at) {
            return None;
        }
        path.push(at);
        for next in self.after(at) {
            if let Some(c) = self.find_cycle(next, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(at);
        None
    }

    /// The cycle `rollout` is on or waits on, if any.
    fn cycle_reached_from(&self, rollout: &'a str) -> Option<Vec<&'a str>> {
        let mut path = Vec::new();
        let mut done = BTreeSet::new();
        self.find_cycle(rollout, &mut path, &mut done)
    }
}

/// What one node has of the governed agents.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeAgents<'a> {
    /// The governed rollouts whose DaemonSet runs an agent on the node.
    pub present: BTreeSet<&'a str>,
    /// Those whose agent on the node runs the revision they roll out (or
    /// have nothing to roll out there) and has passed their gates.
    pub passed: BTreeSet<&'a str>,
}

/// Whether a rollout may replace its agent on a node now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Order<'a> {
    Go,
    /// Not before this rollout has passed its gates on the node.
    WaitFor(&'a str),
}

/// Ordering rules that can never be satisfied.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OrderingError {
    /// The rules form a cycle that the rollout is on or waits on.
    #[error("the policy's ordering rules form a cycle: {}", .0.join(" -> "))]
    Cycle(Vec<String>),
}

/// Whether `rollout` may replace its agent on the node `node` describes.
///
/// It waits for the first (by name) rollout it goes after that runs an
/// agent on the node and has not passed its gates there. A rollout it goes
/// after that has no agent on the node is looked through: its own
/// predecessors are waited for instead (a plugin goes after the toolkit
/// after the driver; on a node without the toolkit it still goes after the
/// driver). A cycle the rollout is on or reaches is an error whatever the
/// node, so that it is reported the first time it is asked, not once a
/// node happens to reach it.
pub fn may_replace<'a>(
    deps: &Dependencies<'a>,
    rollout: &'a str,
    node: &NodeAgents<'_>,
) -> Result<Order<'a>, OrderingError> {
    if let Some(cycle) = deps.cycle_reached_from(rollout) {
        return Err(OrderingError::Cycle(
            cycle.into_iter().map(str::to_string).collect(),
        ));
    }
    // No cycle is reachable, so this walk ends.
    let mut todo: Vec<&'a str> = deps.after(rollout).collect();
    todo.reverse();
    let mut seen = BTreeSet::new();
    while let Some(before) = todo.pop() {
        if !seen.insert(before) {
            continue;
        }
        if node.present.contains(before) {
            if !node.passed.contains(before) {
                return Ok(Order::WaitFor(before));
            }
        } else {
            let mut next: Vec<&'a str> = deps.after(before).collect();
            next.reverse();
            todo.extend(next);
        }
    }
    Ok(Order::Go)
}

impl Order<'_> {
    /// The message of a waiting rollout's condition.
    pub fn message(&self, node: &str) -> Option<String> {
        match self {
            Order::Go => None,
            Order::WaitFor(r) => Some(format!(
                "waiting on node {node} for SafeRollout {r} to pass its gates there first (policy ordering)"
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DRIVER: &str = "gpu/driver";
    const TOOLKIT: &str = "gpu/toolkit";
    const PLUGIN: &str = "gpu/plugin";
    const DRA: &str = "gpu/dra";

    fn chain() -> Dependencies<'static> {
        let mut d = Dependencies::default();
        d.add(TOOLKIT, DRIVER);
        d.add(PLUGIN, TOOLKIT);
        d.add(DRA, TOOLKIT);
        d
    }

    fn node<'a>(present: &[&'a str], passed: &[&'a str]) -> NodeAgents<'a> {
        NodeAgents {
            present: present.iter().copied().collect(),
            passed: passed.iter().copied().collect(),
        }
    }

    #[test]
    fn driver_then_toolkit_then_plugin_on_each_node() {
        let d = chain();
        let all = [DRIVER, TOOLKIT, PLUGIN, DRA];
        let fresh = node(&all, &[]);
        assert_eq!(may_replace(&d, DRIVER, &fresh), Ok(Order::Go));
        assert_eq!(may_replace(&d, TOOLKIT, &fresh), Ok(Order::WaitFor(DRIVER)));
        assert_eq!(may_replace(&d, PLUGIN, &fresh), Ok(Order::WaitFor(TOOLKIT)));

        let driver_done = node(&all, &[DRIVER]);
        assert_eq!(may_replace(&d, TOOLKIT, &driver_done), Ok(Order::Go));
        assert_eq!(
            may_replace(&d, PLUGIN, &driver_done),
            Ok(Order::WaitFor(TOOLKIT))
        );

        let toolkit_done = node(&all, &[DRIVER, TOOLKIT]);
        assert_eq!(may_replace(&d, PLUGIN, &toolkit_done), Ok(Order::Go));
        assert_eq!(may_replace(&d, DRA, &toolkit_done), Ok(Order::Go));
        assert_eq!(
            Order::WaitFor(TOOLKIT).message("gpu-7").unwrap(),
            "waiting on node gpu-7 for SafeRollout gpu/toolkit to pass its gates there first (policy ordering)"
        );
    }

    #[test]
    fn an_agent_absent_from_the_node_is_looked_through_to_its_own_predecessors() {
        let d = chain();
        // No toolkit on this node: the plugin still goes after the driver.
        let no_toolkit = node(&[DRIVER, PLUGIN], &[]);
        assert_eq!(
            may_replace(&d, PLUGIN, &no_toolkit),
            Ok(Order::WaitFor(DRIVER))
        );
        let no_toolkit_driver_done = node(&[DRIVER, PLUGIN], &[DRIVER]);
        assert_eq!(
            may_replace(&d, PLUGIN, &no_toolkit_driver_done),
            Ok(Order::Go)
        );
        // Nothing before it on the node: go.
        assert_eq!(
            may_replace(&d, PLUGIN, &node(&[PLUGIN], &[])),
            Ok(Order::Go)
        );
    }

    #[test]
    fn a_cycle_is_an_error_for_the_rollouts_on_it_and_those_waiting_on_it() {
        let mut d = chain();
        d.add(DRIVER, PLUGIN); // driver -> toolkit -> plugin -> driver
        let n = node(&[DRIVER, TOOLKIT, PLUGIN, DRA], &[]);
        for r in [DRIVER, TOOLKIT, PLUGIN, DRA] {
            let err = may_replace(&d, r, &n).unwrap_err();
            let OrderingError::Cycle(cycle) = &err;
            assert_eq!(cycle.first(), cycle.last(), "{r}: {err}");
            for on in [DRIVER, TOOLKIT, PLUGIN] {
                assert!(cycle.iter().any(|c| c == on), "{r}: {err}");
            }
            assert!(!cycle.iter().any(|c| c == DRA), "{r}: {err}");
        }
        // Even on a node where nothing is left to wait for.
        let passed = node(&[DRIVER, TOOLKIT, PLUGIN], &[DRIVER, TOOLKIT, PLUGIN]);
        assert!(may_replace(&d, DRIVER, &passed).is_err());
        // Found from gpu/dra, the first name, which waits on the cycle.
        assert_eq!(d.cycle(), Some(vec![TOOLKIT, DRIVER, PLUGIN, TOOLKIT]));
        // A rollout with no ordering edge is unaffected.
        assert_eq!(may_replace(&d, "gpu/exporter", &n), Ok(Order::Go));
    }

    #[test]
    fn a_two_rule_cycle_and_no_cycle() {
        let mut d = Dependencies::default();
        d.add(PLUGIN, DRIVER);
        assert_eq!(d.cycle(), None);
        d.add(DRIVER, PLUGIN);
        assert_eq!(d.cycle(), Some(vec![DRIVER, PLUGIN, DRIVER]));
        assert_eq!(
            may_replace(&d, PLUGIN, &NodeAgents::default())
                .unwrap_err()
                .to_string(),
            "the policy's ordering rules form a cycle: gpu/plugin -> gpu/driver -> gpu/plugin"
        );
    }

    #[test]
    fn rules_resolve_by_labels_and_never_make_a_rollout_wait_for_itself() {
        let labels = |agent: &str| -> BTreeMap<String, String> {
            [("agent".to_string(), agent.to_string())].into()
        };
        let (driver, toolkit, plugin) = (labels("driver"), labels("toolkit"), labels("plugin"));
        let governed = [
            Governed {
                name: DRIVER,
                labels: &driver,
            },
            Governed {
                name: TOOLKIT,
                labels: &toolkit,
            },
            Governed {
                name: PLUGIN,
                labels: &plugin,
            },
        ];
        let rules: Vec<OrderingRule> = serde_json::from_value(serde_json::json!([
            {"rollouts": {"matchLabels": {"agent": "toolkit"}},
             "after": [{"matchLabels": {"agent": "driver"}}]},
            // Every agent but the driver goes after the driver: the driver
            // matches both sides and is not made to wait for itself.
            {"rollouts": {},
             "after": [{"matchLabels": {"agent": "driver"}}]},
            {"rollouts": {"matchExpressions": [{"key": "agent", "operator": "In", "values": ["plugin"]}]},
             "after": [{"matchLabels": {"agent": "toolkit"}}]},
        ]))
        .unwrap();
        let d = Dependencies::resolve(&rules, &governed);
        assert_eq!(d.after(DRIVER).count(), 0);
        assert_eq!(d.after(TOOLKIT).collect::<Vec<_>>(), [DRIVER]);
        assert_eq!(d.after(PLUGIN).collect::<Vec<_>>(), [DRIVER, TOOLKIT]);
        assert_eq!(d.cycle(), None);
        let n = node(&[DRIVER, TOOLKIT, PLUGIN], &[DRIVER]);
        assert_eq!(may_replace(&d, PLUGIN, &n), Ok(Order::WaitFor(TOOLKIT)));
    }
}
