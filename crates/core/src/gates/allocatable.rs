//! allocatable: per node, an extended resource (e.g. `nvidia.com/gpu`) must
//! not drop below a floor (the baseline captured before the stage, or a
//! number) nor exceed a ceiling (the baseline, a trusted discovery label such
//! as `nvidia.com/gpu.count`, or a number). Catches plugins that are Ready but
//! advertise nothing, and plugins that over-advertise.
//!
//! Values are Kubernetes quantities (`8`, `8k`, `2Ki`), read as whole counts.
//! A node is judged once its new agent pod is Ready (a dip during the restart
//! is normal) and its kubelet wrote the node's status after that (see
//! [`super::freshness`]: until then the node may show what the old plugin
//! advertised), and a verdict stands only once the observation has held for
//! the gate's soak. Every such node is judged even while others still start,
//! so a violation stops further replacements at once.
//!
//! A node that joined the rollout on its own (a new node that got the new
//! template from the DaemonSet controller) has no baseline: `min: baseline`
//! then means "at least one device" and `max: baseline` sets no ceiling.

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use saferollout_api::{AllocatableGate, Bound, GATE_ALLOCATABLE, GateResult, GateStatus, count_of};

use super::{Snapshot, Verdict, freshness, list_some, result, soak};
use crate::views::NodeView;

pub fn gate_name(resource: &str) -> String {
    format!("{GATE_ALLOCATABLE}/{resource}")
}

/// A bound resolved for one node; `None` when it sets no limit there.
fn resolve(
    bound: &Bound,
    baseline: Option<i64>,
    node_label: impl Fn(&str) -> Option<i64>,
) -> Option<i64> {
    match bound {
        Bound::Value(n) => Some(*n),
        Bound::Baseline => baseline,
        Bound::CapacityLabel(label) => node_label(label),
    }
}

/// One node out of bounds.
struct Violation {
    node: String,
    reason: &'static str,
    observed: i64,
    expected: String,
}

enum Observation {
    /// No node out of bounds, but these nodes' new agent pods are not Ready yet.
    AwaitingPods(Vec<String>),
    /// No node out of bounds, every new agent pod Ready, but these nodes'
    /// status was not written since (it may be what the old agent left).
    AwaitingStatus(Vec<String>),
    InBounds,
    /// The violation the gate reports (see [`observe`]), and every violating node.
    OutOfBounds(Violation, BTreeSet<String>),
}

/// What the gate sees on the rollout's nodes, and the nodes whose status,
/// not written since their new agent became Ready, shows them out of bounds
/// (see [`observe`]). Of several nodes out of bounds it reports the one it
/// reported before while that one still is (same node, same reason), else the
/// first by name: its soak runs from when it started, and other nodes going
/// briefly out of bounds meanwhile (each replaced plugin's node until it
/// registers again) neither restart it nor change the status.
///
/// A node whose status was not written since its new agent became Ready is
/// not judged, in or out of bounds: what it shows may be the old plugin's (a
/// pass on it is the false pass [`super::freshness`] exists for; a failure
/// would blame the release for its predecessor). Shown out of bounds it is
/// still a node whose devices workloads cannot use now, so it holds a slot
/// of the budget (the verdict's `violating`) until its status says more.
fn observe(
    gate: &AllocatableGate,
    min: &Bound,
    max: &Bound,
    snap: &Snapshot,
    previous: Option<&GateResult>,
) -> (Observation, BTreeSet<String>) {
    let mut awaiting = Vec::new();
    let mut stale = Vec::new();
    let mut unconfirmed = BTreeSet::new();
    let mut violations: Vec<Violation> = Vec::new();
    for &node in snap.nodes {
        let Some(view) = snap.node(node) else {
            continue;
        };
        let Some(pod) = snap.target_pod(node).filter(|p| p.running && p.ready) else {
            awaiting.push(node.to_string());
            continue;
        };
        let violation = out_of_bounds(gate, min, max, snap, node, view);
        if !freshness::node_status_fresh(view, pod) {
            if violation.is_some() {
                unconfirmed.insert(node.to_string());
            }
            stale.push(node.to_string());
            continue;
        }
        violations.extend(violation);
    }
    let observation = if !violations.is_empty() {
        let nodes = violations.iter().map(|v| v.node.clone()).collect();
        let reported = previous
            .and_then(|p| {
                violations
                    .iter()
                    .position(|v| p.node.as_deref() == Some(&v.node) && p.reason == v.reason)
            })
            .unwrap_or(0);
        let first = violations.swap_remove(reported);
        Observation::OutOfBounds(first, nodes)
    } else if !awaiting.is_empty() {
        Observation::AwaitingPods(awaiting)
    } else if !stale.is_empty() {
        Observation::AwaitingStatus(stale)
    } else if snap.nodes.iter().all(|n| snap.node(n).is_none()) {
        Observation::AwaitingPods(Vec::new())
    } else {
        Observation::InBounds
    };
    (observation, unconfirmed)
}

/// Whether `node`'s allocatable is out of the gate's bounds, and how.
fn out_of_bounds(
    gate: &AllocatableGate,
    min: &Bound,
    max: &Bound,
    snap: &Snapshot,
    node: &str,
    view: &NodeView,
) -> Option<Violation> {
    let res = &gate.resource;
    let observed = view.allocatable_count(res);
    let recorded = snap.baseline(node).and_then(|b| b.get(res)).copied();
    let label = |key: &str| view.label(key).and_then(count_of);
    // A baseline of 0 means nothing was advertised before: no floor or ceiling from it.
    let (floor, ceiling) = match recorded {
        Some(b) => {
            let b = Some(b).filter(|b| *b > 0);
            (resolve(min, b, label), resolve(max, b, label))
        }
        None => {
            // Joined on its own: no "before". At least one device.
            let floor = match min {
                Bound::Baseline => Some(1),
                other => resolve(other, None, label),
            };
            (floor, resolve(max, None, label))
        }
    };
    if let Some(min) = floor
        && observed < min
    {
        return Some(Violation {
            node: node.to_string(),
            reason: "BelowMinimum",
            observed,
            expected: format!(">= {min}"),
        });
    }
    if let Some(max) = ceiling
        && observed > max
    {
        return Some(Violation {
            node: node.to_string(),
            reason: "AboveMaximum",
            observed,
            expected: format!("<= {max}"),
        });
    }
    None
}

pub fn evaluate(gate: &AllocatableGate, snap: &Snapshot, previous: Option<&GateResult>) -> Verdict {
    let name = gate_name(&gate.resource);
    let soak = gate.soak.to_std().unwrap_or(Duration::from_secs(10));
    let (min, max) = match (gate.min_bound(), gate.max_bound()) {
        (Ok(min), Ok(max)) => (min, max),
        (Err(e), _) | (_, Err(e)) => {
            // The CRD's schema refuses such a bound; fail closed if one slips through.
            return Verdict::new(result(
                &name,
                GateStatus::Failed,
                "InvalidBound",
                e.to_string(),
            ));
        }
    };
    // The observation keeps its start time while it stays the same (same
    // reason, same node); a new one starts at the next whole second, which
    // the status keeps exactly (see `soak::since`: started at now, it was
    // written as the whole second before and the soak cut short by up to a
    // second, a 2 s soak passing after 1.0-1.6 s in the benchmark).
    let since_for =
        |reason: &str, node: Option<&str>| soak::since(previous, reason, node, snap.now);
    let deadline_passed = snap.deadline_passed();
    let (observation, unconfirmed) = observe(gate, &min, &max, snap, previous);
    let mut verdict = match observation {
        Observation::AwaitingPods(nodes) => {
            let message = if nodes.is_empty() {
                "no node of the rollout to judge yet".to_string()
            } else {
                format!(
                    "waiting for the new agent pod to be Ready before judging {} on {}",
                    gate.resource,
                    list_some(&nodes)
                )
            };
            // podsReady fails for those nodes at the deadline; this gate waits.
            let mut r = result(&name, GateStatus::Pending, "AwaitingPods", message);
            r.since = Some(Time(since_for("AwaitingPods", None)));
            Verdict::new(r)
        }
        Observation::AwaitingStatus(nodes) => {
            // Woken by the status write (a node's heartbeat wakes the
            // SafeRollout that holds it); never a pass, and at the deadline
            // a failure like any pending gate's.
            let message = format!(
                "waiting for the node's status written after the new agent became Ready before judging {} on {}",
                gate.resource,
                list_some(&nodes)
            );
            let (status, reason) = if deadline_passed {
                (GateStatus::Failed, "NoFreshStatus")
            } else {
                (GateStatus::Pending, "AwaitingNodeStatus")
            };
            let mut r = result(&name, status, reason, message);
            r.node = nodes.first().cloned();
            r.since = Some(Time(if deadline_passed {
                snap.now
            } else {
                since_for("AwaitingNodeStatus", None)
            }));
            Verdict::new(r)
        }
        Observation::InBounds => {
            let since = since_for("WithinBounds", None);
            let (status, recheck) =
                soak::outcome(since, snap.now, soak, deadline_passed, GateStatus::Passed);
            if status == GateStatus::Failed {
                let message = format!(
                    "{} did not stay within bounds for {}s on every node before the progress deadline (flapping)",
                    gate.resource,
                    soak.as_secs()
                );
                let r = result(&name, status, "Unstable", message);
                soak::verdict(r, snap.now, recheck)
            } else {
                // No elapsed time in messages: status must not change while nothing does.
                let message = format!(
                    "{} within bounds on all {} nodes (soak {}s)",
                    gate.resource,
                    snap.nodes.len(),
                    soak.as_secs()
                );
                soak::verdict(
                    result(&name, status, "WithinBounds", message),
                    since,
                    recheck,
                )
            }
        }
        Observation::OutOfBounds(v, violating) => {
            let since = since_for(v.reason, Some(&v.node));
            let (status, recheck) =
                soak::outcome(since, snap.now, soak, deadline_passed, GateStatus::Failed);
            let what = if v.reason == "BelowMinimum" {
                "lost devices"
            } else {
                "over-advertises devices"
            };
            let mut r = result(
                &name,
                status,
                v.reason,
                format!(
                    "node {} {what}: allocatable {} is {}, expected {} (soak {}s)",
                    v.node,
                    gate.resource,
                    v.observed,
                    v.expected,
                    soak.as_secs()
                ),
            );
            r.node = Some(v.node);
            r.observed = Some(v.observed.to_string());
            r.expected = Some(v.expected);
            Verdict {
                violating,
                ..soak::verdict(r, since, recheck)
            }
        }
    };
    verdict.violating.extend(unconfirmed);
    verdict
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
    use saferollout_api::DurationString;

    use super::super::test_support::*;
    use super::*;

    fn gate(min: &str, max: &str, soak: &str) -> AllocatableGate {
        let bound = |s: &str| match s.parse::<i32>() {
            Ok(n) => IntOrString::Int(n),
            Err(_) => IntOrString::String(s.into()),
        };
        AllocatableGate {
            resource: "example.com/gpu".into(),
            min: bound(min),
            max: bound(max),
            soak: DurationString::new(soak),
        }
    }

    fn eval(g: &AllocatableGate, w: &World, prev: Option<&GateResult>) -> Verdict {
        w.with_snapshot(|s| evaluate(g, s, prev))
    }

    #[test]
    fn passes_only_after_the_soak() {
        let mut w = World::healthy(2, 8);
        let g = gate("baseline", "baseline", "10s");
        let first = eval(&g, &w, None).result;
        assert_eq!(first.status, GateStatus::Pending);
        assert_eq!(first.reason, "WithinBounds");
        w.now = ts(109);
        assert_eq!(
            eval(&g, &w, Some(&first)).result.status,
            GateStatus::Pending
        );
        w.now = ts(110);
        assert_eq!(eval(&g, &w, Some(&first)).result.status, GateStatus::Passed);
    }

    #[test]
    fn a_soak_read_back_from_the_status_lasts_its_full_length() {
        // Regression: a soak that started at 100.7 s was stored as 100 s (the
        // status keeps whole seconds) and a 2 s soak passed at 102.0 s.
        let mut w = World::healthy(2, 8);
        let g = gate("baseline", "baseline", "2s");
        let start = ts(100) + jiff::SignedDuration::from_millis(700);
        w.now = start;
        let mut prev = as_stored(&eval(&g, &w, None).result);
        let mut passed_after = None;
        for ms in (100..=4_000).step_by(100) {
            w.now = start + jiff::SignedDuration::from_millis(ms);
            let v = eval(&g, &w, Some(&prev));
            if v.result.status == GateStatus::Passed {
                passed_after = Some(ms);
                break;
            }
            assert_eq!(v.result.status, GateStatus::Pending);
            // The pass asks to be woken when the soak ends, not before.
            let wake = w.now + jiff::SignedDuration::try_from(v.recheck_after.unwrap()).unwrap();
            assert_eq!(wake, ts(103), "at +{ms} ms");
            prev = as_stored(&v.result);
        }
        assert_eq!(
            passed_after,
            Some(2_300),
            "passes at the first whole second 2 s on"
        );
    }

    #[test]
    fn lost_devices_fail_after_the_soak_naming_node_and_values() {
        let mut w = World::healthy(2, 8);
        w.set_alloc("node-1", "0");
        let g = gate("baseline", "baseline", "5s");
        let first = eval(&g, &w, None);
        assert_eq!(first.result.status, GateStatus::Pending);
        assert_eq!(first.result.reason, "BelowMinimum");
        assert!(
            first.violating.contains("node-1"),
            "a soaking violation is a violation"
        );
        w.now = ts(105);
        let r = eval(&g, &w, Some(&first.result)).result;
        assert_eq!(r.status, GateStatus::Failed);
        assert_eq!(r.node.as_deref(), Some("node-1"));
        assert_eq!(r.observed.as_deref(), Some("0"));
        assert_eq!(r.expected.as_deref(), Some(">= 8"));
        assert!(r.message.contains("lost devices"), "{}", r.message);
    }

    #[test]
    fn quantities_in_any_notation_are_counts() {
        // Intel's millicores: 8 GPUs advertise "8k".
        let mut w = World::healthy(2, 8000);
        w.set_alloc("node-0", "8k");
        w.set_alloc("node-1", "8000");
        let g = gate("baseline", "baseline", "0s");
        assert_eq!(eval(&g, &w, None).result.status, GateStatus::Passed);
        w.set_alloc("node-1", "0");
        let v = eval(&g, &w, None);
        assert_eq!(v.result.status, GateStatus::Failed);
        assert_eq!(v.result.expected.as_deref(), Some(">= 8000"));
    }

    #[test]
    fn zero_soak_fails_at_once() {
        let mut w = World::healthy(1, 8);
        w.set_alloc("node-0", "3");
        let r = eval(&gate("baseline", "baseline", "0s"), &w, None).result;
        assert_eq!(r.status, GateStatus::Failed);
    }

    #[test]
    fn over_advertising_fails_against_baseline_and_capacity_label() {
        let mut w = World::healthy(1, 8);
        w.set_alloc("node-0", "16");
        let r = eval(&gate("baseline", "baseline", "0s"), &w, None).result;
        assert_eq!(
            (r.status, r.reason.as_str()),
            (GateStatus::Failed, "AboveMaximum")
        );
        assert_eq!(r.expected.as_deref(), Some("<= 8"));

        // The trusted label says 16 exist: fine. Says 4: over-advertised.
        let labels = &mut w.node_states.get_mut("node-0").unwrap().labels;
        labels.insert("example.com/gpu.count".into(), "16".into());
        let g = gate("1", "capacityLabel:example.com/gpu.count", "0s");
        assert_eq!(eval(&g, &w, None).result.status, GateStatus::Passed);
        let labels = &mut w.node_states.get_mut("node-0").unwrap().labels;
        labels.insert("example.com/gpu.count".into(), "4".into());
        assert_eq!(eval(&g, &w, None).result.status, GateStatus::Failed);
    }

    #[test]
    fn numeric_bounds() {
        let mut w = World::healthy(1, 8);
        assert_eq!(
            eval(&gate("8", "8", "0s"), &w, None).result.status,
            GateStatus::Passed
        );
        w.set_alloc("node-0", "7");
        assert_eq!(
            eval(&gate("8", "8", "0s"), &w, None).result.reason,
            "BelowMinimum"
        );
    }

    #[test]
    fn a_ready_node_is_judged_while_another_still_starts() {
        let mut w = World::healthy(2, 8);
        w.set_alloc("node-1", "0");
        w.pod("node-0").ready = false;
        let v = eval(&gate("baseline", "baseline", "10s"), &w, None);
        assert_eq!(v.result.reason, "BelowMinimum");
        assert_eq!(v.violating.iter().collect::<Vec<_>>(), ["node-1"]);
        // Only starting nodes: nothing judged yet.
        w.set_alloc("node-1", "8");
        w.pod("node-1").ready = false;
        let r = eval(&gate("baseline", "baseline", "0s"), &w, None).result;
        assert_eq!(
            (r.status, r.reason.as_str()),
            (GateStatus::Pending, "AwaitingPods")
        );
    }

    #[test]
    fn other_nodes_going_out_of_bounds_do_not_restart_a_soaking_violation() {
        let mut w = World::healthy(3, 8);
        let g = gate("baseline", "baseline", "10s");
        w.set_alloc("node-2", "0");
        let r1 = eval(&g, &w, None).result;
        assert_eq!(r1.node.as_deref(), Some("node-2"));
        // node-0 (first by name) loses its devices for a moment, as a
        // replaced plugin's node does until the plugin registers again.
        w.now = ts(104);
        w.set_alloc("node-0", "0");
        let r2 = eval(&g, &w, Some(&r1));
        assert_eq!(r2.result.node.as_deref(), Some("node-2"), "still node-2");
        assert_eq!(r2.result.since, r1.since, "its soak goes on");
        assert!(r2.violating.contains("node-0") && r2.violating.contains("node-2"));
        w.now = ts(107);
        w.set_alloc("node-0", "8");
        let r3 = eval(&g, &w, Some(&r2.result)).result;
        w.now = ts(110);
        let r4 = eval(&g, &w, Some(&r3)).result;
        assert_eq!(
            (r4.status, r4.node.as_deref()),
            (GateStatus::Failed, Some("node-2")),
            "failed after its own 10 s"
        );
        // Once the reported node recovers, the next violating one is reported.
        let mut w = World::healthy(3, 8);
        w.set_alloc("node-0", "0");
        w.set_alloc("node-2", "0");
        let r = eval(&g, &w, Some(&r1)).result;
        assert_eq!(r.node.as_deref(), Some("node-2"));
        w.set_alloc("node-2", "8");
        let r = eval(&g, &w, Some(&r)).result;
        assert_eq!(r.node.as_deref(), Some("node-0"));
    }

    #[test]
    fn flapping_restarts_the_soak_and_fails_at_the_deadline() {
        let mut w = World::healthy(1, 8);
        let g = gate("baseline", "baseline", "10s");
        let r1 = eval(&g, &w, None).result; // in bounds since 100
        w.now = ts(105);
        w.set_alloc("node-0", "0");
        let r2 = eval(&g, &w, Some(&r1)).result; // out since 105
        assert_eq!(r2.status, GateStatus::Pending);
        w.now = ts(108);
        w.set_alloc("node-0", "8");
        let r3 = eval(&g, &w, Some(&r2)).result; // in again since 108
        w.now = ts(115);
        let r4 = eval(&g, &w, Some(&r3)).result;
        assert_eq!(r4.status, GateStatus::Pending, "only 7s in bounds");
        // Without progress for the deadline, a gate that never settled fails.
        w.without_progress = Duration::from_secs(600);
        let r5 = eval(&g, &w, Some(&r4)).result;
        assert_eq!(
            (r5.status, r5.reason.as_str()),
            (GateStatus::Failed, "Unstable")
        );
        w.without_progress = Duration::ZERO;
        w.now = ts(118);
        assert_eq!(eval(&g, &w, Some(&r4)).result.status, GateStatus::Passed);
    }

    #[test]
    fn a_node_without_baseline_needs_at_least_one_device() {
        let mut w = World::healthy(1, 8);
        w.baseline.clear();
        w.set_alloc("node-0", "8");
        let g = gate("baseline", "baseline", "0s");
        assert_eq!(eval(&g, &w, None).result.status, GateStatus::Passed);
        w.set_alloc("node-0", "0");
        let r = eval(&g, &w, None).result;
        assert_eq!(
            (r.status, r.expected.as_deref()),
            (GateStatus::Failed, Some(">= 1"))
        );
    }

    #[test]
    fn a_zero_baseline_sets_no_bound() {
        let mut w = World::healthy(1, 0);
        w.set_alloc("node-0", "4");
        assert_eq!(
            eval(&gate("baseline", "baseline", "0s"), &w, None)
                .result
                .status,
            GateStatus::Passed
        );
    }

    #[test]
    fn a_status_not_written_since_the_new_agent_became_ready_is_not_judged() {
        // The canary's plugin is Ready at 100.7 s; the node still shows what
        // the old plugin advertised, written at 90 s. Soak 0: judged on that,
        // a plugin that advertises nothing passed (the benchmark's false pass).
        let mut w = World::healthy(1, 8);
        w.pod("node-0").ready_since = Some(ts(100));
        let written = |w: &mut World, at: i64, gpus: &str| {
            w.set_alloc("node-0", gpus);
            w.node_states.get_mut("node-0").unwrap().status_written = Some(ts(at));
        };
        let g = gate("baseline", "baseline", "0s");
        written(&mut w, 90, "8");
        let v = eval(&g, &w, None);
        assert_eq!(
            (v.result.status, v.result.reason.as_str()),
            (GateStatus::Pending, "AwaitingNodeStatus"),
            "{:?}",
            v.result
        );
        assert!(
            v.result
                .message
                .contains("status written after the new agent became Ready"),
            "{}",
            v.result.message
        );
        assert!(v.violating.is_empty(), "in bounds as shown: holds no slot");
        // Written in the Ready's own second: it may have been computed before
        // the Ready (the API keeps whole seconds), so it does not count.
        written(&mut w, 100, "8");
        assert_eq!(eval(&g, &w, None).result.reason, "AwaitingNodeStatus");
        // The kubelet's next write: what the new plugin advertises.
        written(&mut w, 101, "0");
        let r = eval(&g, &w, None).result;
        assert_eq!(
            (r.status, r.reason.as_str()),
            (GateStatus::Failed, "BelowMinimum")
        );
        written(&mut w, 101, "8");
        assert_eq!(eval(&g, &w, None).result.status, GateStatus::Passed);
        // A stale status showing the node out of bounds (the old plugin gone,
        // the new one not reported yet) fails nothing but holds a slot: the
        // node's devices are not usable now.
        written(&mut w, 95, "0");
        let v = eval(&g, &w, None);
        assert_eq!(v.result.status, GateStatus::Pending);
        assert_eq!(v.violating.iter().collect::<Vec<_>>(), ["node-0"]);
        // Never written since, until the progress deadline: that fails.
        written(&mut w, 95, "8");
        w.without_progress = Duration::from_secs(600);
        let r = eval(&g, &w, None).result;
        assert_eq!(
            (r.status, r.reason.as_str(), r.node.as_deref()),
            (GateStatus::Failed, "NoFreshStatus", Some("node-0"))
        );
    }

    #[test]
    fn a_soak_passes_only_on_fresh_status() {
        // Whatever the soak: a status from before the Ready never passes.
        let mut w = World::healthy(2, 8);
        w.pod("node-1").ready_since = Some(ts(100));
        w.node_states.get_mut("node-1").unwrap().status_written = Some(ts(50));
        let g = gate("baseline", "baseline", "10s");
        let mut prev = None;
        for now in [100, 110, 200, 500] {
            w.now = ts(now);
            let r = eval(&g, &w, prev.as_ref()).result;
            assert_eq!(r.reason, "AwaitingNodeStatus", "at {now}");
            assert_eq!(r.node.as_deref(), Some("node-1"));
            prev = Some(r);
        }
    }
}
