//! One disruption budget across the governed rollouts: `maxDisruptedNodes`
//! (nodes with any agent being replaced, reverted or failing at once) and
//! `maxConcurrentRollouts` (rollouts holding any node at once).
//!
//! The caller gives each governed rollout, in priority order, the nodes it
//! disrupts now and the nodes it wants to take next (already limited by its
//! own stage and `maxUnavailable`); [`grant`] says which of those it may
//! take now. The rules:
//!
//! - the number of distinct disrupted nodes never grows past the budget;
//! - a node another rollout already disrupts (or was granted in this same
//!   decision) costs nothing and is taken first: a node's agents are
//!   replaced together, one disruption instead of several;
//! - a rollout that holds no node may start holding one only while fewer
//!   than `maxConcurrentRollouts` rollouts hold any;
//! - a rollout refused anything it wanted gets a [`Wait`] naming the
//!   rollouts that hold the budget or the slots.
//!
//! Deterministic: the same input gives the same grants (input order is the
//! priority; nothing iterates a hash map).

use std::collections::BTreeSet;

use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use saferollout_api::{CountError, SafeRolloutPolicySpec, resolve_count};

/// The limits of one policy, resolved against its fleet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    /// Most distinct nodes disrupted at once; `None`: no fleet-wide limit.
    pub max_disrupted_nodes: Option<usize>,
    /// Most rollouts holding any node at once; `None`: no limit.
    pub max_concurrent_rollouts: Option<usize>,
}

impl Budget {
    /// Resolves a policy's limits; `fleet_nodes` is the number of distinct
    /// nodes the governed agents run on (the union over their DaemonSets).
    /// A percentage is rounded down but is at least 1, as `maxUnavailable`
    /// is, so that a small fleet still makes progress.
    pub fn resolve(spec: &SafeRolloutPolicySpec, fleet_nodes: usize) -> Result<Self, CountError> {
        Ok(Budget {
            max_disrupted_nodes: spec
                .max_disrupted_nodes
                .as_ref()
                .map(|v| max_disrupted_nodes(v, fleet_nodes))
                .transpose()?,
            max_concurrent_rollouts: match spec.max_concurrent_rollouts {
                None => None,
                Some(n) if n >= 1 => Some(n as usize),
                Some(n) => return Err(CountError::NotPositive(n)),
            },
        })
    }
}

/// `maxDisruptedNodes` against a fleet of `fleet_nodes` nodes: a count, or
/// a percentage rounded down and at least 1 (0 only for an empty fleet).
pub fn max_disrupted_nodes(value: &IntOrString, fleet_nodes: usize) -> Result<usize, CountError> {
    match value {
        // A count is not capped at the fleet's size: capping changes
        // nothing (there are no more nodes to disrupt) and an empty fleet
        // would read as a budget of 0.
        IntOrString::Int(n) if *n >= 1 => Ok(*n as usize),
        _ => resolve_count(value, fleet_nodes, false),
    }
}

/// What one governed rollout has and wants.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Demand<'a> {
    /// The rollout, `namespace/name`.
    pub rollout: &'a str,
    /// Nodes where its agent is being replaced, reverted or failing now.
    pub disrupted: Vec<&'a str>,
    /// Nodes it wants to take next, most wanted first.
    pub wanted: Vec<&'a str>,
}

/// Why a rollout got less than it wanted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Wait<'a> {
    /// Every node of the budget is disrupted: by these rollouts (in
    /// priority order; it may include the waiting one itself).
    Budget {
        max_disrupted_nodes: usize,
        holders: Vec<&'a str>,
    },
    /// `maxConcurrentRollouts` rollouts already hold nodes: these.
    Concurrency {
        max_concurrent_rollouts: usize,
        holders: Vec<&'a str>,
    },
}

impl Wait<'_> {
    /// The reason of the waiting rollout's condition.
    pub fn reason(&self) -> &'static str {
        match self {
            Wait::Budget { .. } => "FleetBudgetFull",
            Wait::Concurrency { .. } => "FleetConcurrencyFull",
        }
    }

    /// The message of the waiting rollout's condition; `policy` names the
    /// SafeRolloutPolicy.
    pub fn message(&self, policy: &str) -> String {
        match self {
            Wait::Budget {
                max_disrupted_nodes,
                holders,
            } => format!(
                "waiting for SafeRolloutPolicy {policy}: its maxDisruptedNodes ({max_disrupted_nodes}) are all disrupted, by {}",
                holders.join(", ")
            ),
            Wait::Concurrency {
                max_concurrent_rollouts,
                holders,
            } => format!(
                "waiting for SafeRolloutPolicy {policy}: maxConcurrentRollouts ({max_concurrent_rollouts}) rollouts hold nodes: {}",
                holders.join(", ")
            ),
        }
    }
}

/// What one rollout may do now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant<'a> {
    pub rollout: &'a str,
    /// The wanted nodes it may take now, already-disrupted ones first.
    pub nodes: Vec<&'a str>,
    /// Why it got less than it wanted; `None` when it got all of it.
    pub wait: Option<Wait<'a>>,
}

/// The grants of one decision, in the demands' order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grants<'a> {
    pub grants: Vec<Grant<'a>>,
    /// Distinct nodes disrupted once the grants are taken.
    pub disrupted_nodes: usize,
}

/// Grants each rollout (in `demands` order, the priority) the wanted nodes
/// it may take now under `budget`. See the module's rules.
pub fn grant<'a>(budget: Budget, demands: &[Demand<'a>]) -> Grants<'a> {
    // Every node disrupted now or granted in this decision, and by whom.
    let mut disrupted: BTreeSet<&'a str> = demands
        .iter()
        .flat_map(|d| d.disrupted.iter().copied())
        .collect();
    let mut holding: Vec<bool> = demands.iter().map(|d| !d.disrupted.is_empty()).collect();
    let mut grants = Vec::with_capacity(demands.len());

    for (i, demand) in demands.iter().enumerate() {
        let own: BTreeSet<&str> = demand.disrupted.iter().copied().collect();
        let mut seen = BTreeSet::new();
        let wanted: Vec<&'a str> = demand
            .wanted
            .iter()
            .copied()
            .filter(|n| !own.contains(n) && seen.insert(*n))
            .collect();
        if wanted.is_empty() {
            grants.push(Grant {
                rollout: demand.rollout,
                nodes: Vec::new(),
                wait: None,
            });
            continue;
        }
        let holders_now = holding.iter().filter(|h| **h).count();
        if !holding[i]
            && let Some(max) = budget.max_concurrent_rollouts
            && holders_now >= max
        {
            grants.push(Grant {
                rollout: demand.rollout,
                nodes: Vec::new(),
                wait: Some(Wait::Concurrency {
                    max_concurrent_rollouts: max,
                    holders: holder_names(demands, &holding),
                }),
            });
            continue;
        }
        // Nodes already disrupted first (free), then fresh ones, each group
        // in the rollout's own order.
        let (free, fresh): (Vec<&'a str>, Vec<&'a str>) =
            wanted.iter().partition(|n| disrupted.contains(*n));
        let mut nodes = free;
        let mut refused = false;
        for node in fresh {
            if budget
                .max_disrupted_nodes
                .is_none_or(|max| disrupted.len() < max)
            {
                disrupted.insert(node);
                nodes.push(node);
            } else {
                refused = true;
            }
        }
        if !nodes.is_empty() {
            holding[i] = true;
        }
        let wait = match (refused, budget.max_disrupted_nodes) {
            (true, Some(max)) => Some(Wait::Budget {
                max_disrupted_nodes: max,
                holders: holder_names(demands, &holding),
            }),
            _ => None,
        };
        grants.push(Grant {
            rollout: demand.rollout,
            nodes,
            wait,
        });
    }
    Grants {
        disrupted_nodes: disrupted.len(),
        grants,
    }
}

fn holder_names<'a>(demands: &[Demand<'a>], holding: &[bool]) -> Vec<&'a str> {
    demands
        .iter()
        .zip(holding)
        .filter(|(_, h)| **h)
        .map(|(d, _)| d.rollout)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn demand<'a>(rollout: &'a str, disrupted: &[&'a str], wanted: &[&'a str]) -> Demand<'a> {
        Demand {
            rollout,
            disrupted: disrupted.to_vec(),
            wanted: wanted.to_vec(),
        }
    }

    fn budget(max_disrupted_nodes: Option<usize>, max_concurrent: Option<usize>) -> Budget {
        Budget {
            max_disrupted_nodes,
            max_concurrent_rollouts: max_concurrent,
        }
    }

    #[test]
    fn a_percentage_rounds_down_to_at_least_one_and_a_count_is_taken_as_is() {
        let pct = |s: &str| IntOrString::String(s.into());
        assert_eq!(max_disrupted_nodes(&pct("10%"), 288), Ok(28));
        assert_eq!(max_disrupted_nodes(&pct("10%"), 5), Ok(1));
        assert_eq!(max_disrupted_nodes(&pct("100%"), 7), Ok(7));
        assert_eq!(max_disrupted_nodes(&pct("50%"), 0), Ok(0));
        assert_eq!(max_disrupted_nodes(&IntOrString::Int(3), 2), Ok(3));
        assert_eq!(max_disrupted_nodes(&IntOrString::Int(3), 0), Ok(3));
        assert!(max_disrupted_nodes(&IntOrString::Int(0), 10).is_err());
        assert!(max_disrupted_nodes(&pct("0%"), 10).is_err());
    }

    #[test]
    fn a_policy_resolves_and_refuses_what_its_schema_refuses() {
        let mut spec: SafeRolloutPolicySpec = serde_json::from_value(serde_json::json!({
            "selector": {}, "maxDisruptedNodes": "25%", "maxConcurrentRollouts": 2
        }))
        .unwrap();
        assert_eq!(Budget::resolve(&spec, 20), Ok(budget(Some(5), Some(2))));
        spec.max_concurrent_rollouts = Some(0);
        assert!(Budget::resolve(&spec, 20).is_err());
        spec.max_concurrent_rollouts = None;
        spec.max_disrupted_nodes = None;
        assert_eq!(Budget::resolve(&spec, 20), Ok(budget(None, None)));
    }

    #[test]
    fn three_agents_on_a_budget_of_one_take_the_same_node() {
        // Driver, device plugin and DRA driver all want node a first.
        let demands = [
            demand("gpu/driver", &[], &["a", "b"]),
            demand("gpu/plugin", &[], &["b", "a"]),
            demand("gpu/dra", &[], &["c", "a"]),
        ];
        let g = grant(budget(Some(1), None), &demands);
        assert_eq!(g.disrupted_nodes, 1);
        assert_eq!(g.grants[0].nodes, ["a"]);
        // a is free for the others: preferred over their own first choice.
        assert_eq!(g.grants[1].nodes, ["a"]);
        assert_eq!(g.grants[2].nodes, ["a"]);
        let holders = ["gpu/driver", "gpu/plugin", "gpu/dra"];
        for (i, grant) in g.grants.iter().enumerate() {
            // Each refused its other node; the holders named are those
            // holding the budget when it was refused, itself included.
            assert_eq!(
                grant.wait,
                Some(Wait::Budget {
                    max_disrupted_nodes: 1,
                    holders: holders[..=i].to_vec(),
                }),
                "{}",
                grant.rollout
            );
        }
    }

    #[test]
    fn a_full_budget_grants_only_nodes_already_disrupted_and_names_the_holders() {
        let demands = [
            demand("gpu/driver", &["a", "b"], &["c"]),
            demand("gpu/plugin", &[], &["d", "b"]),
        ];
        let g = grant(budget(Some(2), None), &demands);
        assert_eq!(g.grants[0].nodes, Vec::<&str>::new());
        assert_eq!(
            g.grants[0].wait,
            Some(Wait::Budget {
                max_disrupted_nodes: 2,
                holders: vec!["gpu/driver"],
            })
        );
        assert_eq!(g.grants[1].nodes, ["b"]);
        assert_eq!(
            g.grants[1].wait.as_ref().map(|w| w.message("gpu-stack")),
            Some(
                "waiting for SafeRolloutPolicy gpu-stack: its maxDisruptedNodes (2) are all disrupted, by gpu/driver, gpu/plugin"
                    .to_string()
            )
        );
        assert_eq!(g.disrupted_nodes, 2);
    }

    #[test]
    fn a_budget_lowered_below_what_is_disrupted_grants_no_fresh_node() {
        let demands = [
            demand("a/x", &["n1", "n2", "n3"], &["n4"]),
            demand("a/y", &[], &["n5", "n3"]),
        ];
        let g = grant(budget(Some(1), None), &demands);
        assert!(g.grants[0].nodes.is_empty());
        assert_eq!(g.grants[1].nodes, ["n3"]);
        assert_eq!(g.disrupted_nodes, 3);
    }

    #[test]
    fn concurrency_lets_holders_go_on_and_makes_newcomers_wait() {
        let demands = [
            demand("ns/one", &[], &["a"]),
            demand("ns/two", &[], &["b"]),
            demand("ns/three", &["c"], &["d"]),
        ];
        let g = grant(budget(None, Some(2)), &demands);
        // three holds c already: it keeps its slot; one takes the other.
        assert_eq!(g.grants[0].nodes, ["a"]);
        assert_eq!(g.grants[1].nodes, Vec::<&str>::new());
        assert_eq!(
            g.grants[1].wait,
            Some(Wait::Concurrency {
                max_concurrent_rollouts: 2,
                holders: vec!["ns/one", "ns/three"],
            })
        );
        assert_eq!(
            g.grants[1].wait.as_ref().unwrap().reason(),
            "FleetConcurrencyFull"
        );
        assert_eq!(g.grants[2].nodes, ["d"]);
        assert_eq!(g.grants[2].wait, None);
    }

    #[test]
    fn own_and_repeated_nodes_are_not_granted_twice() {
        let demands = [demand("ns/one", &["a"], &["a", "b", "b"])];
        let g = grant(budget(Some(5), None), &demands);
        assert_eq!(g.grants[0].nodes, ["b"]);
        assert_eq!(g.disrupted_nodes, 2);
    }

    #[test]
    fn no_limits_grant_everything() {
        let demands = [
            demand("ns/one", &[], &["a", "b"]),
            demand("ns/two", &[], &["c"]),
        ];
        let g = grant(budget(None, None), &demands);
        assert_eq!(g.grants[0].nodes, ["a", "b"]);
        assert_eq!(g.grants[1].nodes, ["c"]);
        assert!(g.grants.iter().all(|g| g.wait.is_none()));
    }

    const NODES: [&str; 8] = ["n0", "n1", "n2", "n3", "n4", "n5", "n6", "n7"];
    const ROLLOUTS: [&str; 5] = ["r0", "r1", "r2", "r3", "r4"];

    fn arb_demands() -> impl Strategy<Value = Vec<(Vec<usize>, Vec<usize>)>> {
        proptest::collection::vec(
            (
                proptest::collection::vec(0..NODES.len(), 0..3),
                proptest::collection::vec(0..NODES.len(), 0..5),
            ),
            1..ROLLOUTS.len(),
        )
    }

    proptest! {
        #[test]
        fn budget_and_concurrency_are_never_exceeded(
            raw in arb_demands(),
            max_disrupted in proptest::option::of(1usize..5),
            max_concurrent in proptest::option::of(1usize..4),
        ) {
            let demands: Vec<Demand> = raw
                .iter()
                .enumerate()
                .map(|(i, (d, w))| Demand {
                    rollout: ROLLOUTS[i],
                    disrupted: d.iter().map(|n| NODES[*n]).collect(),
                    wanted: w.iter().map(|n| NODES[*n]).collect(),
                })
                .collect();
            let b = budget(max_disrupted, max_concurrent);
            let g = grant(b, &demands);
            prop_assert_eq!(&g, &grant(b, &demands), "deterministic");

            let before: BTreeSet<&str> =
                demands.iter().flat_map(|d| d.disrupted.iter().copied()).collect();
            let mut after = before.clone();
            for (d, gr) in demands.iter().zip(&g.grants) {
                prop_assert_eq!(d.rollout, gr.rollout);
                for n in &gr.nodes {
                    prop_assert!(d.wanted.contains(n), "granted {} it did not want", n);
                    prop_assert!(!d.disrupted.contains(n), "granted {} it holds", n);
                }
                after.extend(gr.nodes.iter().copied());
            }
            prop_assert_eq!(after.len(), g.disrupted_nodes);
            if let Some(max) = max_disrupted {
                // Never more than the budget, except what was disrupted before.
                prop_assert!(after.len() <= max.max(before.len()));
                if before.len() >= max {
                    // A full budget: only nodes already disrupted are granted.
                    prop_assert_eq!(&after, &before);
                }
            }
            let holders_before = demands.iter().filter(|d| !d.disrupted.is_empty()).count();
            let holders_after = demands
                .iter()
                .zip(&g.grants)
                .filter(|(d, gr)| !d.disrupted.is_empty() || !gr.nodes.is_empty())
                .count();
            if let Some(max) = max_concurrent {
                prop_assert!(holders_after <= max.max(holders_before));
            }
            // A rollout waits on the budget only when it is full, and on
            // concurrency only when the slots are.
            for gr in &g.grants {
                match &gr.wait {
                    Some(Wait::Budget { max_disrupted_nodes, holders }) => {
                        prop_assert!(after.len() >= *max_disrupted_nodes);
                        prop_assert!(!holders.is_empty());
                    }
                    Some(Wait::Concurrency { max_concurrent_rollouts, holders }) => {
                        prop_assert!(gr.nodes.is_empty());
                        prop_assert!(holders.len() >= *max_concurrent_rollouts);
                    }
                    None => {}
                }
            }
        }
    }
}
