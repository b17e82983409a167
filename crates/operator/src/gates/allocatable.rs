//! allocatable: per node, an extended resource (e.g. `nvidia.com/gpu`) must
//! not drop below a floor (the baseline captured before the stage, or a
//! number) nor exceed a ceiling (the baseline, a trusted discovery label such
//! as `nvidia.com/gpu.count`, or a number). Catches plugins that are Ready but
//! advertise nothing, and plugins that over-advertise.
//!
//! Judged only on nodes whose new agent pod is Ready (a dip during the restart
//! is normal), and only once the observation has held for the gate's soak.

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use saferollout_api::{AllocatableGate, GateResult, GateStatus};

use super::{Snapshot, elapsed, result};

pub fn gate_name(resource: &str) -> String {
    format!("allocatable/{resource}")
}

/// A bound resolved for one node; `None` when no trusted reference exists.
fn resolve_bound(
    bound: &IntOrString,
    baseline: Option<i64>,
    labels: &std::collections::BTreeMap<String, String>,
) -> Option<i64> {
    match bound {
        IntOrString::Int(n) => Some(i64::from(*n)),
        IntOrString::String(s) if s == "baseline" => baseline,
        IntOrString::String(s) => match s.strip_prefix("capacityLabel:") {
            Some(label) => labels.get(label).and_then(|v| v.trim().parse().ok()),
            None => s.parse().ok(),
        },
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
    /// Some node's new agent pod is not Ready yet: nothing to judge.
    AwaitingPods(String),
    InBounds,
    OutOfBounds(Violation),
}

fn observe(gate: &AllocatableGate, snap: &Snapshot) -> Observation {
    let res = &gate.resource;
    for node in snap.nodes {
        let Some(state) = snap.node_states.get(node) else {
            continue;
        };
        if !snap.target_pod(node).is_some_and(|p| p.running && p.ready) {
            return Observation::AwaitingPods(node.clone());
        }
        let observed = state.allocatable.get(res).copied().unwrap_or(0);
        // A baseline of 0 means nothing was advertised before: no floor from it, and no ceiling either.
        let baseline = snap
            .baseline
            .get(node)
            .and_then(|b| b.get(res))
            .copied()
            .filter(|b| *b > 0);
        let min = resolve_bound(&gate.min, baseline, &state.labels);
        let max = resolve_bound(&gate.max, baseline, &state.labels);
        if let Some(min) = min
            && observed < min
        {
            return Observation::OutOfBounds(Violation {
                node: node.clone(),
                reason: "BelowMinimum",
                observed,
                expected: format!(">= {min}"),
            });
        }
        if let Some(max) = max
            && observed > max
        {
            return Observation::OutOfBounds(Violation {
                node: node.clone(),
                reason: "AboveMaximum",
                observed,
                expected: format!("<= {max}"),
            });
        }
    }
    Observation::InBounds
}

pub fn evaluate(
    gate: &AllocatableGate,
    snap: &Snapshot,
    previous: Option<&GateResult>,
) -> GateResult {
    let name = gate_name(&gate.resource);
    let soak = gate
        .soak
        .to_std()
        .unwrap_or(std::time::Duration::from_secs(10));
    // The observation keeps its start time while it stays the same (same reason, same node).
    let since_for = |reason: &str, node: Option<&str>| -> Timestamp {
        previous
            .filter(|p| p.reason == reason && p.node.as_deref() == node)
            .and_then(|p| p.since.as_ref().map(|t| t.0))
            .unwrap_or(snap.now)
    };
    match observe(gate, snap) {
        Observation::AwaitingPods(node) => {
            let mut r = result(
                &name,
                GateStatus::Pending,
                "AwaitingPods",
                format!(
                    "waiting for the new agent pod on {node} to be Ready before judging {}",
                    gate.resource
                ),
            );
            r.since = Some(Time(since_for("AwaitingPods", None)));
            r
        }
        Observation::InBounds => {
            let since = since_for("WithinBounds", None);
            let held = elapsed(since, snap.now);
            let status = if held >= soak {
                GateStatus::Passed
            } else {
                GateStatus::Pending
            };
            let mut r = result(
                &name,
                status,
                "WithinBounds",
                // No elapsed time in messages: status must not change while nothing does.
                format!(
                    "{} within bounds on all {} nodes (soak {}s)",
                    gate.resource,
                    snap.nodes.len(),
                    soak.as_secs()
                ),
            );
            r.since = Some(Time(since));
            r
        }
        Observation::OutOfBounds(v) => {
            let since = since_for(v.reason, Some(&v.node));
            let held = elapsed(since, snap.now);
            let status = if held >= soak {
                GateStatus::Failed
            } else {
                GateStatus::Pending
            };
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
            r.since = Some(Time(since));
            r
        }
    }
}

#[cfg(test)]
mod tests {
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

    fn set_alloc(w: &mut World, node: &str, n: i64) {
        w.node_states
            .get_mut(node)
            .unwrap()
            .allocatable
            .insert("example.com/gpu".into(), n);
    }

    #[test]
    fn passes_only_after_the_soak() {
        let mut w = World::healthy(2, 8);
        let g = gate("baseline", "baseline", "10s");
        let first = evaluate(&g, &w.snapshot(), None);
        assert_eq!(first.status, GateStatus::Pending);
        assert_eq!(first.reason, "WithinBounds");
        w.now = ts(109);
        assert_eq!(
            evaluate(&g, &w.snapshot(), Some(&first)).status,
            GateStatus::Pending
        );
        w.now = ts(110);
        assert_eq!(
            evaluate(&g, &w.snapshot(), Some(&first)).status,
            GateStatus::Passed
        );
    }

    #[test]
    fn lost_devices_fail_after_the_soak_naming_node_and_values() {
        let mut w = World::healthy(2, 8);
        set_alloc(&mut w, "node-1", 0);
        let g = gate("baseline", "baseline", "5s");
        let first = evaluate(&g, &w.snapshot(), None);
        assert_eq!(first.status, GateStatus::Pending);
        assert_eq!(first.reason, "BelowMinimum");
        w.now = ts(105);
        let r = evaluate(&g, &w.snapshot(), Some(&first));
        assert_eq!(r.status, GateStatus::Failed);
        assert_eq!(r.node.as_deref(), Some("node-1"));
        assert_eq!(r.observed.as_deref(), Some("0"));
        assert_eq!(r.expected.as_deref(), Some(">= 8"));
        assert!(r.message.contains("lost devices"), "{}", r.message);
    }

    #[test]
    fn zero_soak_fails_at_once() {
        let mut w = World::healthy(1, 8);
        set_alloc(&mut w, "node-0", 3);
        let r = evaluate(&gate("baseline", "baseline", "0s"), &w.snapshot(), None);
        assert_eq!(r.status, GateStatus::Failed);
    }

    #[test]
    fn over_advertising_fails_against_baseline_and_capacity_label() {
        let mut w = World::healthy(1, 8);
        set_alloc(&mut w, "node-0", 16);
        let r = evaluate(&gate("baseline", "baseline", "0s"), &w.snapshot(), None);
        assert_eq!(
            (r.status, r.reason.as_str()),
            (GateStatus::Failed, "AboveMaximum")
        );
        assert_eq!(r.expected.as_deref(), Some("<= 8"));

        // The trusted label says 16 exist: fine. Says 4: over-advertised.
        w.node_states
            .get_mut("node-0")
            .unwrap()
            .labels
            .insert("example.com/gpu.count".into(), "16".into());
        let g = gate("1", "capacityLabel:example.com/gpu.count", "0s");
        assert_eq!(evaluate(&g, &w.snapshot(), None).status, GateStatus::Passed);
        w.node_states
            .get_mut("node-0")
            .unwrap()
            .labels
            .insert("example.com/gpu.count".into(), "4".into());
        assert_eq!(evaluate(&g, &w.snapshot(), None).status, GateStatus::Failed);
    }

    #[test]
    fn numeric_bounds() {
        let mut w = World::healthy(1, 8);
        assert_eq!(
            evaluate(&gate("8", "8", "0s"), &w.snapshot(), None).status,
            GateStatus::Passed
        );
        set_alloc(&mut w, "node-0", 7);
        assert_eq!(
            evaluate(&gate("8", "8", "0s"), &w.snapshot(), None).reason,
            "BelowMinimum"
        );
    }

    #[test]
    fn not_judged_until_the_new_pod_is_ready() {
        let mut w = World::healthy(2, 8);
        set_alloc(&mut w, "node-0", 0);
        w.pods.get_mut("node-0").unwrap()[0].ready = false;
        let r = evaluate(&gate("baseline", "baseline", "0s"), &w.snapshot(), None);
        assert_eq!(
            (r.status, r.reason.as_str()),
            (GateStatus::Pending, "AwaitingPods")
        );
    }

    #[test]
    fn flapping_restarts_the_soak() {
        let mut w = World::healthy(1, 8);
        let g = gate("baseline", "baseline", "10s");
        let r1 = evaluate(&g, &w.snapshot(), None); // in bounds since 100
        w.now = ts(105);
        set_alloc(&mut w, "node-0", 0);
        let r2 = evaluate(&g, &w.snapshot(), Some(&r1)); // out since 105
        assert_eq!(r2.status, GateStatus::Pending);
        w.now = ts(108);
        set_alloc(&mut w, "node-0", 8);
        let r3 = evaluate(&g, &w.snapshot(), Some(&r2)); // in again since 108
        w.now = ts(115);
        let r4 = evaluate(&g, &w.snapshot(), Some(&r3));
        assert_eq!(r4.status, GateStatus::Pending, "only 7s in bounds");
        w.now = ts(118);
        assert_eq!(
            evaluate(&g, &w.snapshot(), Some(&r4)).status,
            GateStatus::Passed
        );
    }

    #[test]
    fn no_baseline_means_no_baseline_bound() {
        let mut w = World::healthy(1, 8);
        w.baseline.clear();
        set_alloc(&mut w, "node-0", 8);
        assert_eq!(
            evaluate(&gate("baseline", "baseline", "0s"), &w.snapshot(), None).status,
            GateStatus::Passed
        );
    }
}
