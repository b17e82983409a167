//! nodeConditions: on every node the rollout holds, each listed node
//! condition (a node-problem detector's or NVSentinel's `GpuHealthy`, ...)
//! must have its healthy status once the node's new agent pod is Ready,
//! judged on the node's status written after that ([`super::freshness`],
//! as allocatable: until then the node shows what it had with the old
//! agent). An observation decides once it has held for the gate's soak: an
//! unhealthy condition fails the gate, all healthy passes it.
//!
//! A condition a node does not have is not judged there, and the result
//! says so: conditions do not vanish through an agent's restart (the
//! kubelet keeps the conditions it does not own; only their writer or a
//! person removes one), so an absent one means the node has no detector
//! for it, which says nothing of the release. A gate that found none of its
//! conditions on any node judged nothing and never passes (a misspelt type
//! fails at the progress deadline, `ConditionsAbsent`, instead of passing).

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use saferollout_api::{GATE_NODE_CONDITIONS, GateResult, GateStatus, NodeConditionsGate};

use super::{Snapshot, Verdict, freshness, list_some, result, soak};
use crate::views::NodeView;

pub const NAME: &str = GATE_NODE_CONDITIONS;

/// One listed condition out of its healthy status on one node.
#[derive(Debug)]
struct Unhealthy {
    node: String,
    condition: String,
    observed: String,
    expected: &'static str,
}

#[derive(Debug, Default)]
struct Observation {
    /// Nodes whose new agent pod is not Ready yet.
    awaiting: Vec<String>,
    /// Nodes whose status was not written since their new agent's Ready.
    stale: Vec<String>,
    /// Stale nodes whose (old) status shows a condition unhealthy: they hold
    /// a slot of the budget but fail nothing.
    unconfirmed: BTreeSet<String>,
    unhealthy: Vec<Unhealthy>,
    /// `condition on node`, for each listed condition a judged node lacks.
    absent: Vec<String>,
    /// Conditions judged healthy (a condition on a node each).
    healthy: usize,
}

/// The listed conditions of `view` that are not healthy, and those it lacks.
fn judge_node(gate: &NodeConditionsGate, view: &NodeView, node: &str, o: &mut Observation) {
    for c in &gate.conditions {
        let expected = c.healthy_status.as_str();
        match view.condition(&c.type_) {
            None => o.absent.push(format!("{} on {node}", c.type_)),
            Some(seen) if seen.status == expected => o.healthy += 1,
            Some(seen) => o.unhealthy.push(Unhealthy {
                node: node.to_string(),
                condition: c.type_.clone(),
                observed: seen.status.clone(),
                expected,
            }),
        }
    }
}

fn observe(gate: &NodeConditionsGate, snap: &Snapshot) -> Observation {
    let mut o = Observation::default();
    for &node in snap.nodes {
        let Some(view) = snap.node(node) else {
            continue;
        };
        let Some(pod) = snap.target_pod(node).filter(|p| p.running && p.ready) else {
            o.awaiting.push(node.to_string());
            continue;
        };
        if !freshness::node_status_fresh(view, pod) {
            let mut shown = Observation::default();
            judge_node(gate, view, node, &mut shown);
            if !shown.unhealthy.is_empty() {
                o.unconfirmed.insert(node.to_string());
            }
            o.stale.push(node.to_string());
            continue;
        }
        judge_node(gate, view, node, &mut o);
    }
    o
}

pub fn evaluate(
    gate: &NodeConditionsGate,
    snap: &Snapshot,
    previous: Option<&GateResult>,
) -> Verdict {
    let soak = gate.soak.to_std().unwrap_or(Duration::from_secs(30));
    let since_for =
        |reason: &str, node: Option<&str>| soak::since(previous, reason, node, snap.now);
    let deadline_passed = snap.deadline_passed();
    let mut o = observe(gate, snap);
    let mut verdict = if !o.unhealthy.is_empty() {
        // Keep reporting (and soaking) the node reported before while it is
        // still unhealthy, as allocatable does.
        let reported = previous
            .filter(|p| p.reason == "ConditionUnhealthy")
            .and_then(|p| {
                o.unhealthy
                    .iter()
                    .position(|u| p.node.as_deref() == Some(&u.node))
            })
            .unwrap_or(0);
        let violating = o.unhealthy.iter().map(|u| u.node.clone()).collect();
        let u = o.unhealthy.swap_remove(reported);
        unhealthy(u, violating, soak, previous, snap)
    } else if !o.awaiting.is_empty() {
        let mut r = result(
            NAME,
            GateStatus::Pending,
            "AwaitingPods",
            format!(
                "waiting for the new agent pod to be Ready before judging node conditions on {}",
                list_some(&o.awaiting)
            ),
        );
        r.since = Some(Time(since_for("AwaitingPods", None)));
        Verdict::new(r)
    } else if !o.stale.is_empty() {
        let (status, reason) = if deadline_passed {
            (GateStatus::Failed, "NoFreshStatus")
        } else {
            (GateStatus::Pending, "AwaitingNodeStatus")
        };
        let mut r = result(
            NAME,
            status,
            reason,
            format!(
                "waiting for the node's status written after the new agent became Ready before judging node conditions on {}",
                list_some(&o.stale)
            ),
        );
        r.node = o.stale.first().cloned();
        r.since = Some(Time(if deadline_passed {
            snap.now
        } else {
            since_for("AwaitingNodeStatus", None)
        }));
        Verdict::new(r)
    } else if o.healthy == 0 {
        // Nothing judged: no node to judge yet, or none has any listed condition.
        let status = if deadline_passed {
            GateStatus::Failed
        } else {
            GateStatus::Pending
        };
        let message = if o.absent.is_empty() {
            "no node of the rollout to judge yet".to_string()
        } else {
            format!(
                "no node of the rollout has any of the listed conditions: {}",
                list_some(&o.absent)
            )
        };
        let mut r = result(NAME, status, "ConditionsAbsent", message);
        r.since = Some(Time(if deadline_passed {
            snap.now
        } else {
            since_for("ConditionsAbsent", None)
        }));
        Verdict::new(r)
    } else {
        healthy(gate, &o, soak, since_for("Healthy", None), snap)
    };
    verdict.violating.extend(std::mem::take(&mut o.unconfirmed));
    verdict
}

/// An unhealthy condition: fails once it held for the soak (or at the
/// progress deadline), pending until then; the node holds a slot meanwhile.
fn unhealthy(
    u: Unhealthy,
    violating: BTreeSet<String>,
    soak: Duration,
    previous: Option<&GateResult>,
    snap: &Snapshot,
) -> Verdict {
    let since = soak::since(previous, "ConditionUnhealthy", Some(&u.node), snap.now);
    let (status, recheck) = soak::outcome(
        since,
        snap.now,
        soak,
        snap.deadline_passed(),
        GateStatus::Failed,
    );
    let mut r = result(
        NAME,
        status,
        "ConditionUnhealthy",
        format!(
            "node {}: condition {} is {}, expected {} (soak {}s)",
            u.node,
            u.condition,
            u.observed,
            u.expected,
            soak.as_secs()
        ),
    );
    r.node = Some(u.node);
    r.observed = Some(format!("{}={}", u.condition, u.observed));
    r.expected = Some(format!("{}={}", u.condition, u.expected));
    Verdict {
        violating,
        ..soak::verdict(r, since, recheck)
    }
}

/// Every listed condition a judged node has is healthy: passes once that
/// held for the soak; still soaking at the deadline, it fails (flapping).
fn healthy(
    gate: &NodeConditionsGate,
    o: &Observation,
    soak: Duration,
    since: jiff::Timestamp,
    snap: &Snapshot,
) -> Verdict {
    let (status, recheck) = soak::outcome(
        since,
        snap.now,
        soak,
        snap.deadline_passed(),
        GateStatus::Passed,
    );
    let types: Vec<&str> = gate.conditions.iter().map(|c| c.type_.as_str()).collect();
    if status == GateStatus::Failed {
        let message = format!(
            "{} did not stay healthy for {}s on every node before the progress deadline (flapping)",
            list_some(&types),
            soak.as_secs()
        );
        return soak::verdict(result(NAME, status, "Unstable", message), snap.now, None);
    }
    // No elapsed time in messages: status must not change while nothing does.
    let mut message = format!(
        "{} healthy on all {} nodes (soak {}s)",
        list_some(&types),
        snap.nodes.len(),
        soak.as_secs()
    );
    if !o.absent.is_empty() {
        message.push_str(&format!(
            "; not judged where absent: {}",
            list_some(&o.absent)
        ));
    }
    soak::verdict(result(NAME, status, "Healthy", message), since, recheck)
}

#[cfg(test)]
mod tests {
    use saferollout_api::{DurationString, HealthyStatus, NodeCondition};

    use super::super::test_support::*;
    use super::*;
    use crate::objects::SlimCondition;

    fn gate(soak: &str) -> NodeConditionsGate {
        NodeConditionsGate {
            conditions: vec![
                NodeCondition {
                    type_: "GpuHealthy".into(),
                    healthy_status: HealthyStatus::True,
                },
                NodeCondition {
                    type_: "KernelDeadlock".into(),
                    healthy_status: HealthyStatus::False,
                },
            ],
            soak: DurationString::new(soak),
        }
    }

    /// `node`'s status (written at [`STATUS_WRITTEN_AT`] unless set) has `type_` at `status`.
    fn set(w: &mut World, node: &str, type_: &str, status: &str) {
        let n = w.node_states.get_mut(node).unwrap();
        n.conditions.retain(|c| c.type_ != type_);
        n.conditions.push(SlimCondition {
            type_: type_.into(),
            status: status.into(),
            ..Default::default()
        });
    }

    fn healthy_world(n: usize) -> World {
        let mut w = World::healthy(n, 8);
        for i in 0..n {
            set(&mut w, &format!("node-{i}"), "GpuHealthy", "True");
            set(&mut w, &format!("node-{i}"), "KernelDeadlock", "False");
        }
        w
    }

    fn eval(g: &NodeConditionsGate, w: &World, prev: Option<&GateResult>) -> Verdict {
        w.with_snapshot(|s| evaluate(g, s, prev))
    }

    #[test]
    fn healthy_conditions_pass_after_the_soak() {
        let mut w = healthy_world(2);
        let g = gate("10s");
        let first = eval(&g, &w, None).result;
        assert_eq!(
            (first.status, first.reason.as_str()),
            (GateStatus::Pending, "Healthy")
        );
        w.now = ts(109);
        assert_eq!(
            eval(&g, &w, Some(&first)).result.status,
            GateStatus::Pending
        );
        w.now = ts(110);
        let r = eval(&g, &w, Some(&first)).result;
        assert_eq!(r.status, GateStatus::Passed);
        assert_eq!(r.gate, "nodeConditions");
        assert!(
            r.message
                .contains("GpuHealthy, KernelDeadlock healthy on all 2 nodes"),
            "{}",
            r.message
        );
    }

    #[test]
    fn an_unhealthy_condition_fails_after_the_soak_naming_node_and_condition() {
        let mut w = healthy_world(3);
        set(&mut w, "node-1", "GpuHealthy", "False");
        let g = gate("5s");
        let first = eval(&g, &w, None);
        assert_eq!(
            (first.result.status, first.result.reason.as_str()),
            (GateStatus::Pending, "ConditionUnhealthy")
        );
        assert_eq!(first.violating.iter().collect::<Vec<_>>(), ["node-1"]);
        // Another node going unhealthy meanwhile does not restart the soak.
        w.now = ts(103);
        set(&mut w, "node-0", "KernelDeadlock", "True");
        let second = eval(&g, &w, Some(&first.result));
        assert_eq!(second.result.node.as_deref(), Some("node-1"));
        assert_eq!(second.result.since, first.result.since);
        assert_eq!(second.violating.len(), 2);
        w.now = ts(105);
        let r = eval(&g, &w, Some(&second.result)).result;
        assert_eq!(r.status, GateStatus::Failed);
        assert_eq!(r.node.as_deref(), Some("node-1"));
        assert_eq!(r.observed.as_deref(), Some("GpuHealthy=False"));
        assert_eq!(r.expected.as_deref(), Some("GpuHealthy=True"));
        assert!(
            r.message
                .contains("node node-1: condition GpuHealthy is False, expected True"),
            "{}",
            r.message
        );
        // Unknown is never healthy; a condition healthy when False fails on True.
        let mut w = healthy_world(1);
        set(&mut w, "node-0", "KernelDeadlock", "Unknown");
        let r = eval(&gate("0s"), &w, None).result;
        assert_eq!(r.observed.as_deref(), Some("KernelDeadlock=Unknown"));
        assert_eq!(r.expected.as_deref(), Some("KernelDeadlock=False"));
    }

    #[test]
    fn a_status_not_written_since_the_new_agent_became_ready_is_not_judged() {
        let mut w = healthy_world(1);
        w.pod("node-0").ready_since = Some(ts(100));
        let written = |w: &mut World, at: i64, status: &str| {
            set(w, "node-0", "GpuHealthy", status);
            w.node_states.get_mut("node-0").unwrap().status_written = Some(ts(at));
        };
        let g = gate("0s");
        // Healthy as the old agent left it: not a pass.
        written(&mut w, 90, "True");
        let v = eval(&g, &w, None);
        assert_eq!(
            (v.result.status, v.result.reason.as_str()),
            (GateStatus::Pending, "AwaitingNodeStatus")
        );
        assert!(v.violating.is_empty());
        // In the Ready's own second: still not after it.
        written(&mut w, 100, "True");
        assert_eq!(eval(&g, &w, None).result.reason, "AwaitingNodeStatus");
        // Unhealthy in a stale status: holds a slot, fails nothing.
        written(&mut w, 95, "False");
        let v = eval(&g, &w, None);
        assert_eq!(v.result.status, GateStatus::Pending);
        assert_eq!(v.violating.iter().collect::<Vec<_>>(), ["node-0"]);
        // Fresh: judged.
        written(&mut w, 101, "False");
        assert_eq!(eval(&g, &w, None).result.status, GateStatus::Failed);
        written(&mut w, 101, "True");
        assert_eq!(eval(&g, &w, None).result.status, GateStatus::Passed);
        // Never fresh until the deadline: fails, naming the node.
        written(&mut w, 95, "True");
        w.without_progress = Duration::from_secs(600);
        let failed = eval(&g, &w, None).result;
        assert_eq!(failed.reason, "NoFreshStatus");
        assert_eq!(failed.status, GateStatus::Failed);
        assert_eq!(failed.node.as_deref(), Some("node-0"));
    }

    #[test]
    fn an_absent_condition_is_not_judged_and_a_gate_that_judged_none_never_passes() {
        let mut w = healthy_world(2);
        w.node_states.get_mut("node-1").unwrap().conditions.clear();
        let r = eval(&gate("0s"), &w, None).result;
        assert_eq!(r.status, GateStatus::Passed);
        assert!(
            r.message.contains(
                "not judged where absent: GpuHealthy on node-1, KernelDeadlock on node-1"
            ),
            "{}",
            r.message
        );
        // A misspelt type is on no node: nothing judged, never a pass.
        let g = NodeConditionsGate::healthy_when_true(["GPUHealthy"]);
        let r = eval(&g, &w, None).result;
        assert_eq!(
            (r.status, r.reason.as_str()),
            (GateStatus::Pending, "ConditionsAbsent")
        );
        assert!(r.message.contains("GPUHealthy on node-0"), "{}", r.message);
        w.without_progress = Duration::from_secs(600);
        assert_eq!(eval(&g, &w, None).result.status, GateStatus::Failed);
    }

    #[test]
    fn a_node_whose_agent_is_not_ready_waits() {
        let mut w = healthy_world(2);
        w.pod("node-0").ready = false;
        let r = eval(&gate("0s"), &w, None).result;
        assert_eq!(
            (r.status, r.reason.as_str()),
            (GateStatus::Pending, "AwaitingPods")
        );
        // An unhealthy node is judged while another still starts.
        set(&mut w, "node-1", "GpuHealthy", "False");
        let v = eval(&gate("0s"), &w, None);
        assert_eq!(v.result.status, GateStatus::Failed);
        assert_eq!(v.result.node.as_deref(), Some("node-1"));
    }
}
