//! One rollout's pass under the SafeRolloutPolicies that govern it: which of
//! the nodes it wants to start replacing now the policies let it take.
//!
//! The operator gathers, per governing policy, what the other governed
//! rollouts disrupt (their `status.disruptedNodes`, or what this operator
//! decided for them since), the policy's windows, and, for each node where
//! this rollout's agent is still to be replaced, the predecessor it waits
//! for there ([`super::ordering`]). [`admit`] applies them in order:
//!
//! 1. a policy that cannot be applied (an ordering cycle, a window in an
//!    unknown zone) holds every forward change: a rule meant to protect the
//!    fleet is never silently dropped;
//! 2. a closed window holds every node not started yet ([`super::windows`]);
//!    a node whose agent is already being replaced finishes on its own;
//! 3. the ordering holds the nodes whose predecessors have not passed there;
//! 4. the budget ([`super::budget::grant`]) grants what is left.
//!
//! A rollout governed by two policies takes a node only if both let it.
//! Only forward changes come here: a revert is never held by a policy (it
//! takes the fleet back to what was known good; it keeps its own
//! `maxUnavailable`), though the nodes it disrupts count in every budget.

use std::collections::{BTreeMap, BTreeSet};

use jiff::Timestamp;

use super::budget::{self, Budget, Demand};
use super::windows::{self, Admission, Change, Window};

/// The policies governing one rollout, as the operator found them.
#[derive(Debug, Clone, Default)]
pub struct Fleet<'a> {
    /// The rollout, `namespace/name`.
    pub rollout: &'a str,
    /// By policy name.
    pub policies: Vec<Governing<'a>>,
}

/// One policy as it applies to the rollout.
#[derive(Debug, Clone)]
pub struct Governing<'a> {
    /// The SafeRolloutPolicy's name.
    pub policy: &'a str,
    /// Why the policy cannot be applied now (an ordering cycle, an unknown
    /// time zone): its rollouts start nothing forward until it is fixed.
    pub broken: Option<&'a str>,
    pub budget: Budget,
    /// The other rollouts it governs and the nodes each disrupts now, in
    /// priority order (their `wanted` is empty: each asks in its own pass).
    pub others: Vec<Demand<'a>>,
    pub windows: &'a [Window],
    /// For the nodes where this rollout's agent is still to be replaced and
    /// an ordering rule holds it: the rollout it waits for there.
    pub waits_for: &'a BTreeMap<String, String>,
}

/// Why a rollout takes fewer nodes than it wanted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Held {
    /// The `Waiting` condition's reason: `FleetPolicyInvalid`,
    /// `MaintenanceWindow`, `FleetOrdering`, `FleetBudgetFull` or
    /// `FleetConcurrencyFull`.
    pub reason: &'static str,
    pub message: String,
}

/// What the policies let one pass take.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Admitted<'a> {
    /// The wanted nodes this pass may start replacing.
    pub nodes: BTreeSet<&'a str>,
    /// Why it got less than it wanted: the first policy (by name) that held
    /// something back, its first reason. `None` when it got all of it.
    pub held: Option<Held>,
}

/// Which of `wanted` (nodes whose agent this rollout would start replacing
/// now, most wanted first) the policies let it take, given the nodes it
/// `disrupted` already. See the module's rules.
pub fn admit<'a>(
    fleet: &Fleet<'_>,
    disrupted: &[&'a str],
    wanted: &[&'a str],
    now: Timestamp,
) -> Admitted<'a> {
    let mut nodes: BTreeSet<&'a str> = wanted.iter().copied().collect();
    let mut held = None;
    for governing in &fleet.policies {
        let (allowed, why) = admit_one(fleet.rollout, governing, disrupted, wanted, now);
        nodes.retain(|n| allowed.contains(n));
        if held.is_none() {
            held = why;
        }
    }
    Admitted { nodes, held }
}

/// [`admit`] under one policy.
fn admit_one<'a>(
    rollout: &str,
    governing: &Governing<'_>,
    disrupted: &[&'a str],
    wanted: &[&'a str],
    now: Timestamp,
) -> (BTreeSet<&'a str>, Option<Held>) {
    let policy = governing.policy;
    if wanted.is_empty() {
        return (BTreeSet::new(), None);
    }
    if let Some(why) = governing.broken {
        let held = Held {
            reason: "FleetPolicyInvalid",
            message: format!(
                "SafeRolloutPolicy {policy} cannot be applied ({why}): nothing is replaced until it is fixed"
            ),
        };
        return (BTreeSet::new(), Some(held));
    }
    let admission = windows::may_start(Change::Forward, governing.windows, now);
    if let Some(message) = admission.message(policy) {
        debug_assert!(matches!(admission, Admission::Wait { .. }));
        let held = Held {
            reason: "MaintenanceWindow",
            message,
        };
        return (BTreeSet::new(), Some(held));
    }
    let mut held = None;
    let ordered: Vec<&'a str> = wanted
        .iter()
        .copied()
        .filter(|n| match governing.waits_for.get(*n) {
            None => true,
            Some(before) => {
                held.get_or_insert_with(|| Held {
                    reason: "FleetOrdering",
                    message: format!(
                        "waiting on node {n} for SafeRollout {before} to pass its gates there first (ordering of SafeRolloutPolicy {policy})"
                    ),
                });
                false
            }
        })
        .collect();
    if ordered.is_empty() {
        return (BTreeSet::new(), held);
    }
    let mut demands = governing.others.clone();
    demands.push(Demand {
        rollout,
        disrupted: disrupted.to_vec(),
        wanted: ordered,
    });
    let grants = budget::grant(governing.budget, &demands);
    let mine = grants.grants.last().expect("one grant per demand");
    if held.is_none()
        && let Some(wait) = &mine.wait
    {
        held = Some(Held {
            reason: wait.reason(),
            message: wait.message(policy),
        });
    }
    // The grant's names, as `wanted`'s (whose lifetime the caller keeps).
    // A node the rollout disrupts already costs nothing more: it is always
    // its own to go on with (the grant leaves it out of what it counts as
    // wanted; leaving it out of what may be replaced would hold a crashing
    // agent's node forever under a full budget, found by the property tests).
    let granted = wanted
        .iter()
        .copied()
        .filter(|n| mine.nodes.contains(n) || disrupted.contains(n))
        .collect();
    (granted, held)
}

#[cfg(test)]
mod tests {
    use super::*;
    use saferollout_api::{MaintenanceWindow, Weekday};

    const ME: &str = "gpu/plugin";

    fn governing<'a>(
        others: Vec<Demand<'a>>,
        max: usize,
        windows: &'a [Window],
        waits_for: &'a BTreeMap<String, String>,
    ) -> Governing<'a> {
        Governing {
            policy: "stack",
            broken: None,
            budget: Budget {
                max_disrupted_nodes: Some(max),
                max_concurrent_rollouts: None,
            },
            others,
            windows,
            waits_for,
        }
    }

    fn now() -> Timestamp {
        "2026-12-06T23:00:00Z".parse().unwrap()
    }

    fn nodes<'a>(a: &Admitted<'a>) -> Vec<&'a str> {
        a.nodes.iter().copied().collect()
    }

    #[test]
    fn a_node_another_rollout_disrupts_is_free_and_others_wait_on_a_full_budget() {
        let none = BTreeMap::new();
        let others = vec![Demand {
            rollout: "gpu/driver",
            disrupted: vec!["n1"],
            wanted: vec![],
        }];
        let fleet = Fleet {
            rollout: ME,
            policies: vec![governing(others, 1, &[], &none)],
        };
        let a = admit(&fleet, &[], &["n2", "n1"], now());
        assert_eq!(nodes(&a), ["n1"]);
        let held = a.held.unwrap();
        assert_eq!(held.reason, "FleetBudgetFull");
        assert!(held.message.contains("gpu/driver"), "{}", held.message);
    }

    #[test]
    fn a_node_the_rollout_disrupts_already_is_its_own_under_a_full_budget() {
        let none = BTreeMap::new();
        let others = vec![Demand {
            rollout: "gpu/driver",
            disrupted: vec!["n9"],
            wanted: vec![],
        }];
        let fleet = Fleet {
            rollout: ME,
            policies: vec![governing(others, 1, &[], &none)],
        };
        // n1's agent crashes (disrupted by this rollout); replacing it costs
        // nothing, whereas n2 would be a fresh node.
        let a = admit(&fleet, &["n1"], &["n1", "n2"], now());
        assert_eq!(nodes(&a), ["n1"]);
        assert_eq!(a.held.unwrap().reason, "FleetBudgetFull");
    }

    #[test]
    fn nothing_wanted_is_never_held() {
        let none = BTreeMap::new();
        let fleet = Fleet {
            rollout: ME,
            policies: vec![governing(vec![], 1, &[], &none)],
        };
        assert_eq!(admit(&fleet, &[], &[], now()), Admitted::default());
    }

    #[test]
    fn the_ordering_holds_a_node_before_the_budget_is_asked() {
        let waits: BTreeMap<String, String> = [("n1".to_string(), "gpu/driver".to_string())].into();
        let fleet = Fleet {
            rollout: ME,
            policies: vec![governing(vec![], 1, &[], &waits)],
        };
        let a = admit(&fleet, &[], &["n1", "n2"], now());
        // n1 waits for the driver; n2 takes the one node of the budget.
        assert_eq!(nodes(&a), ["n2"]);
        let held = a.held.unwrap();
        assert_eq!(held.reason, "FleetOrdering");
        assert!(held.message.contains("node n1") && held.message.contains("gpu/driver"));
    }

    #[test]
    fn a_closed_window_holds_every_node_and_names_the_next_opening() {
        let none = BTreeMap::new();
        // Sunday 2026-12-06 23:00 UTC; the window opens on Mondays at 08:00 UTC.
        let windows = windows::parse(&[MaintenanceWindow {
            days: vec![Weekday::Monday],
            start: "08:00".into(),
            end: "10:00".into(),
            time_zone: "UTC".into(),
        }])
        .unwrap();
        let fleet = Fleet {
            rollout: ME,
            policies: vec![governing(vec![], 5, &windows, &none)],
        };
        let a = admit(&fleet, &[], &["n1"], now());
        assert!(a.nodes.is_empty());
        let held = a.held.unwrap();
        assert_eq!(held.reason, "MaintenanceWindow");
        assert!(
            held.message.contains("2026-12-07 08:00"),
            "{}",
            held.message
        );
        // Inside it, the node is taken.
        let a = admit(
            &fleet,
            &[],
            &["n1"],
            "2026-12-07T08:30:00Z".parse().unwrap(),
        );
        assert_eq!(nodes(&a), ["n1"]);
        assert_eq!(a.held, None);
    }

    #[test]
    fn a_broken_policy_holds_everything_and_says_why() {
        let none = BTreeMap::new();
        let mut g = governing(vec![], 5, &[], &none);
        g.broken = Some("the ordering rules form a cycle: a -> b -> a");
        let fleet = Fleet {
            rollout: ME,
            policies: vec![g],
        };
        let a = admit(&fleet, &[], &["n1"], now());
        assert!(a.nodes.is_empty());
        let held = a.held.unwrap();
        assert_eq!(held.reason, "FleetPolicyInvalid");
        assert!(held.message.contains("cycle"));
    }

    #[test]
    fn two_policies_must_both_grant_a_node() {
        let none = BTreeMap::new();
        let roomy = governing(vec![], 5, &[], &none);
        let mut tight = governing(
            vec![Demand {
                rollout: "gpu/driver",
                disrupted: vec!["n9"],
                wanted: vec![],
            }],
            1,
            &[],
            &none,
        );
        tight.policy = "tight";
        let fleet = Fleet {
            rollout: ME,
            policies: vec![roomy, tight],
        };
        let a = admit(&fleet, &[], &["n1", "n2"], now());
        assert!(a.nodes.is_empty());
        assert_eq!(a.held.unwrap().reason, "FleetBudgetFull");
    }

    #[test]
    fn a_rollout_already_disrupting_a_node_keeps_replacing_within_its_share() {
        let none = BTreeMap::new();
        let fleet = Fleet {
            rollout: ME,
            policies: vec![governing(vec![], 2, &[], &none)],
        };
        // It disrupts n1; n2 fits, n3 would be a third node.
        let a = admit(&fleet, &["n1"], &["n2", "n3"], now());
        assert_eq!(nodes(&a), ["n2"]);
        assert_eq!(a.held.unwrap().reason, "FleetBudgetFull");
    }
}
