//! resourceSlices: per node, once the new driver pod is Ready, the driver's
//! ResourceSlices for the node's pools are published and complete (every
//! slice of the newest pool generation there, as many as
//! `resourceSliceCount` says; older generations do not count) and within
//! bounds: the device count against `minDevices`/`maxDevices`, and, when a
//! bound is `baseline`, every shared counter and device capacity total
//! against the node's baseline (so a release that publishes the right
//! number of devices with twice their memory is caught by its counters).
//!
//! A node's pools are judged only once published after the new driver pod
//! became Ready (some slice of each pool's newest generation written since;
//! see [`super::freshness`]): until then they may be what the old driver
//! published. A node with no slice of the driver at all is judged as seen.
//!
//! Decided like allocatable: an observation stands once it held for `soak`
//! (a driver restart withdraws and republishes), fails at the progress
//! deadline if it never settles, and every violation stops further
//! replacements at once. A node without a baseline (it joined on its own)
//! needs at least one device with `minDevices: baseline`, and has no
//! ceiling with `maxDevices: baseline`.

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use saferollout_api::{Bound, GATE_RESOURCE_SLICES, GateResult, GateStatus, ResourceSlicesGate};

use super::freshness::{self, Publication};
use super::{Snapshot, Verdict, list_some, result, soak};
use crate::devices::{format_amount, pool_state};

pub const NAME: &str = GATE_RESOURCE_SLICES;

/// One node out of bounds.
#[derive(Debug)]
struct Violation {
    node: String,
    reason: &'static str,
    observed: String,
    expected: String,
    message: String,
}

enum Observation {
    /// No device evidence at all, and why.
    Unavailable(String),
    /// Nothing out of bounds, but these nodes are not judged yet.
    Awaiting(Vec<String>),
    /// Nothing out of bounds, every new driver pod Ready, but these nodes'
    /// pools were not published since.
    AwaitingPublication(Vec<String>),
    InBounds,
    OutOfBounds(Violation, BTreeSet<String>),
}

/// What the gate sees, and the nodes whose pools, not published since their
/// new driver pod became Ready, show them out of bounds: not judged (what
/// they show may be the old driver's), but holding a slot of the budget (the
/// verdict's `violating`) as a node whose devices are not usable now does.
fn observe(
    gate: &ResourceSlicesGate,
    min: &Bound,
    max: &Bound,
    snap: &Snapshot,
) -> (Observation, BTreeSet<String>) {
    let Some(ev) = snap.evidence.devices else {
        let why = "the operator observes no ResourceSlices".to_string();
        return (Observation::Unavailable(why), BTreeSet::new());
    };
    if let Some(why) = ev.unavailable {
        return (Observation::Unavailable(why.to_string()), BTreeSet::new());
    }
    let driver = gate.driver.as_str();
    let mut awaiting = Vec::new();
    let mut stale = Vec::new();
    let mut violations = Vec::new();
    for &node in snap.nodes {
        let Some(pod) = snap.target_pod(node).filter(|p| p.running && p.ready) else {
            awaiting.push(node.to_string());
            continue;
        };
        let slices = ev.node_slices(node, driver);
        // Judged below as any node, then set aside (see after the loop).
        if freshness::publication(&slices, driver, pod.ready_since) == Publication::Stale {
            stale.push(node.to_string());
        }
        let state = pool_state(&slices, driver);
        let base = snap.device_baseline.get(node);
        let bound = |b: &Bound, floor: bool| -> Option<i64> {
            match (b, base) {
                (Bound::Value(n), _) => Some(*n),
                (Bound::Baseline, Some(base)) => Some(base.devices).filter(|d| *d > 0),
                (Bound::Baseline, None) => floor.then_some(1),
                (Bound::CapacityLabel(_), _) => None,
            }
        };
        let (floor, ceiling) = (bound(min, true), bound(max, false));
        let pools = if state.pools.is_empty() {
            base.map(|b| b.pools.join(", ")).unwrap_or_default()
        } else {
            state.pools.join(", ")
        };
        let at = if pools.is_empty() {
            format!("node {node}")
        } else {
            format!("node {node} pool {pools}")
        };
        let mut v = |reason, observed: String, expected: String, message: String| {
            violations.push(Violation {
                node: node.to_string(),
                reason,
                observed,
                expected,
                message,
            })
        };
        if state.pools.is_empty() && floor.is_some_and(|f| f > 0) {
            let f = floor.unwrap_or_default();
            v(
                "SlicesWithdrawn",
                "0".into(),
                format!(">= {f}"),
                format!(
                    "{at}: driver {driver} publishes no ResourceSlice for the node: 0 devices, expected >= {f}"
                ),
            );
            continue;
        }
        if let Some(incomplete) = &state.incomplete {
            v(
                "PoolIncomplete",
                "incomplete".into(),
                "every slice of the newest generation".into(),
                format!("node {node}: driver {driver}: {incomplete}"),
            );
            continue;
        }
        if let Some(f) = floor
            && state.devices < f
        {
            v(
                "BelowMinimum",
                state.devices.to_string(),
                format!(">= {f}"),
                format!(
                    "{at}: driver {driver} publishes {} devices, expected >= {f}",
                    state.devices
                ),
            );
            continue;
        }
        if let Some(c) = ceiling
            && state.devices > c
        {
            v(
                "AboveMaximum",
                state.devices.to_string(),
                format!("<= {c}"),
                format!(
                    "{at}: driver {driver} publishes {} devices, expected <= {c}",
                    state.devices
                ),
            );
            continue;
        }
        let Some(base) = base else { continue };
        // Counters and capacities against the baseline, in the directions
        // the device bounds say "baseline".
        let totals = [
            ("shared counter", "Counter", &base.counters, &state.counters),
            (
                "device capacity",
                "Capacity",
                &base.capacity,
                &state.capacity,
            ),
        ];
        'totals: for (what, kind, before, now) in totals {
            for (name, &b) in before {
                let n = now.get(name).copied().unwrap_or(0);
                let (reason, op) = if *min == Bound::Baseline && n < b {
                    (
                        if kind == "Counter" {
                            "CounterBelowBaseline"
                        } else {
                            "CapacityBelowBaseline"
                        },
                        ">=",
                    )
                } else if *max == Bound::Baseline && n > b {
                    (
                        if kind == "Counter" {
                            "CounterAboveBaseline"
                        } else {
                            "CapacityAboveBaseline"
                        },
                        "<=",
                    )
                } else {
                    continue;
                };
                v(
                    reason,
                    format!("{name} {}", format_amount(n)),
                    format!("{name} {op} {}", format_amount(b)),
                    format!(
                        "{at}: driver {driver} publishes a {what} {name} total of {}, baseline {}",
                        format_amount(n),
                        format_amount(b)
                    ),
                );
                break 'totals;
            }
        }
    }
    let (unconfirmed, mut violations): (Vec<Violation>, Vec<Violation>) = violations
        .into_iter()
        .partition(|v| stale.contains(&v.node));
    let unconfirmed = unconfirmed.into_iter().map(|v| v.node).collect();
    let observation = if !violations.is_empty() {
        let nodes = violations.iter().map(|v| v.node.clone()).collect();
        Observation::OutOfBounds(violations.swap_remove(0), nodes)
    } else if !awaiting.is_empty() || snap.nodes.is_empty() {
        Observation::Awaiting(awaiting)
    } else if !stale.is_empty() {
        Observation::AwaitingPublication(stale)
    } else {
        Observation::InBounds
    };
    (observation, unconfirmed)
}

pub fn evaluate(
    gate: &ResourceSlicesGate,
    snap: &Snapshot,
    previous: Option<&GateResult>,
) -> Verdict {
    let soak_for = gate.soak.to_std().unwrap_or(Duration::from_secs(40));
    let (min, max) = match (gate.min_bound(), gate.max_bound()) {
        (Ok(min), Ok(max)) => (min, max),
        (Err(e), _) | (_, Err(e)) => {
            // The schema refuses such a bound; fail closed if one slips through.
            return Verdict::new(result(
                NAME,
                GateStatus::Failed,
                "InvalidBound",
                e.to_string(),
            ));
        }
    };
    let deadline = snap.deadline_passed();
    let (observation, unconfirmed) = observe(gate, &min, &max, snap);
    let mut verdict = match observation {
        Observation::Unavailable(why) => {
            let status = if deadline {
                GateStatus::Failed
            } else {
                GateStatus::Pending
            };
            Verdict::new(result(
                NAME,
                status,
                "NoEvidence",
                format!(
                    "cannot judge the ResourceSlices of driver {}: {why}",
                    gate.driver
                ),
            ))
        }
        Observation::Awaiting(nodes) => {
            let message = if nodes.is_empty() {
                "no node of the rollout to judge yet".to_string()
            } else {
                format!(
                    "waiting for the new driver pod to be Ready before judging the ResourceSlices of {} on {}",
                    gate.driver,
                    list_some(&nodes)
                )
            };
            let mut r = result(NAME, GateStatus::Pending, "AwaitingPods", message);
            r.since = Some(Time(soak::since(previous, "AwaitingPods", None, snap.now)));
            Verdict::new(r)
        }
        Observation::AwaitingPublication(nodes) => {
            let message = format!(
                "waiting for the ResourceSlices of {} published after the new driver pod became Ready on {}",
                gate.driver,
                list_some(&nodes)
            );
            let since = soak::since(previous, "AwaitingPublication", None, snap.now);
            let mut r = if deadline {
                let mut r = result(NAME, GateStatus::Failed, "NoFreshPublication", message);
                r.since = Some(Time(snap.now));
                r
            } else {
                let mut r = result(NAME, GateStatus::Pending, "AwaitingPublication", message);
                r.since = Some(Time(since));
                r
            };
            r.node = nodes.first().cloned();
            Verdict::new(r)
        }
        Observation::InBounds => {
            let since = soak::since(previous, "SlicesPublished", None, snap.now);
            let (status, recheck) =
                soak::outcome(since, snap.now, soak_for, deadline, GateStatus::Passed);
            if status == GateStatus::Failed {
                let message = format!(
                    "the ResourceSlices of driver {} did not stay complete and within bounds for {}s before the progress deadline",
                    gate.driver,
                    soak_for.as_secs()
                );
                soak::verdict(result(NAME, status, "Unstable", message), snap.now, recheck)
            } else {
                let message = format!(
                    "driver {} publishes complete pools within bounds on all {} nodes (soak {}s)",
                    gate.driver,
                    snap.nodes.len(),
                    soak_for.as_secs()
                );
                soak::verdict(
                    result(NAME, status, "SlicesPublished", message),
                    since,
                    recheck,
                )
            }
        }
        Observation::OutOfBounds(v, violating) => {
            let since = soak::since(previous, v.reason, Some(&v.node), snap.now);
            let (status, recheck) =
                soak::outcome(since, snap.now, soak_for, deadline, GateStatus::Failed);
            let mut r = result(
                NAME,
                status,
                v.reason,
                format!("{} (soak {}s)", v.message, soak_for.as_secs()),
            );
            r.node = Some(v.node);
            r.observed = Some(v.observed);
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
    use k8s_openapi::api::resource::v1::ResourceSlice;
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
    use saferollout_api::{DurationString, NodeDevices};

    use super::super::test_support::*;
    use super::*;
    use crate::devices::test_objects::{counter_slice, slice};
    use crate::devices::{DeviceEvidence, capture};

    const D: &str = "gpu.example.com";

    fn gate(min: &str, max: &str, soak: &str) -> ResourceSlicesGate {
        let b = |s: &str| {
            s.parse::<i32>()
                .map(IntOrString::Int)
                .unwrap_or(IntOrString::String(s.into()))
        };
        ResourceSlicesGate {
            driver: D.into(),
            min_devices: b(min),
            max_devices: b(max),
            soak: DurationString::new(soak),
        }
    }

    fn gpus(n: usize) -> Vec<(String, bool)> {
        (0..n).map(|i| (format!("gpu-{i}"), false)).collect()
    }

    fn pool(node: &str, generation: i64, n: usize) -> ResourceSlice {
        let g = gpus(n);
        let d: Vec<(&str, bool)> = g.iter().map(|(n, t)| (n.as_str(), *t)).collect();
        slice(node, D, generation, 1, &d)
    }

    /// `w` with `slices`, baselines from `before`, judged by `g`.
    fn eval_with(
        g: &ResourceSlicesGate,
        w: &mut World,
        before: &[ResourceSlice],
        slices: &[ResourceSlice],
        prev: Option<&GateResult>,
    ) -> Verdict {
        let mut ev = DeviceEvidence::default();
        ev.add_slices(before);
        if !before.is_empty() {
            w.device_baseline = w
                .nodes
                .iter()
                .map(|n| (n.clone(), capture(&ev, n, D)))
                .collect();
        }
        let mut ev = DeviceEvidence::default();
        ev.add_slices(slices);
        w.with_devices(Some(&ev), |s| evaluate(g, s, prev))
    }

    #[test]
    fn a_republished_pool_passes_after_the_soak() {
        let mut w = World::healthy(2, 8);
        let before = [pool("node-0", 1, 8), pool("node-1", 1, 8)];
        let after = [pool("node-0", 2, 8), pool("node-1", 2, 8)];
        let g = gate("baseline", "baseline", "5s");
        let first = eval_with(&g, &mut w, &before, &after, None).result;
        assert_eq!(
            (first.status, first.reason.as_str()),
            (GateStatus::Pending, "SlicesPublished")
        );
        w.now = ts(105);
        let r = eval_with(&g, &mut w, &before, &after, Some(&first)).result;
        assert_eq!(r.status, GateStatus::Passed, "{r:?}");
    }

    #[test]
    fn withdrawn_slices_fail_naming_node_and_counts() {
        let mut w = World::healthy(2, 8);
        let before = [pool("node-0", 1, 8), pool("node-1", 1, 8)];
        let after = [pool("node-0", 2, 8)];
        let v = eval_with(
            &gate("baseline", "baseline", "0s"),
            &mut w,
            &before,
            &after,
            None,
        );
        let r = v.result;
        assert_eq!(
            (r.status, r.reason.as_str()),
            (GateStatus::Failed, "SlicesWithdrawn")
        );
        assert_eq!(r.node.as_deref(), Some("node-1"));
        assert_eq!(
            (r.observed.as_deref(), r.expected.as_deref()),
            (Some("0"), Some(">= 8"))
        );
        assert!(
            r.message.contains("node node-1 pool node-1"),
            "{}",
            r.message
        );
        assert_eq!(v.violating.iter().collect::<Vec<_>>(), ["node-1"]);
    }

    #[test]
    fn fewer_devices_soak_then_fail() {
        let mut w = World::healthy(1, 8);
        let g = gate("baseline", "baseline", "5s");
        let before = [pool("node-0", 1, 8)];
        let after = [pool("node-0", 2, 4)];
        let first = eval_with(&g, &mut w, &before, &after, None);
        assert_eq!(first.result.status, GateStatus::Pending);
        assert!(
            first.violating.contains("node-0"),
            "a soaking violation stops replacements"
        );
        assert_eq!(first.recheck_after, Some(Duration::from_secs(5)));
        w.now = ts(105);
        let r = eval_with(&g, &mut w, &before, &after, Some(&first.result)).result;
        assert_eq!(
            (r.status, r.reason.as_str()),
            (GateStatus::Failed, "BelowMinimum")
        );
        assert_eq!(
            (r.observed.as_deref(), r.expected.as_deref()),
            (Some("4"), Some(">= 8"))
        );
    }

    #[test]
    fn over_advertised_memory_is_caught_by_counters_and_capacity() {
        let mut w = World::healthy(1, 8);
        let g = gate("baseline", "baseline", "0s");
        let devices = [("gpu-0", false), ("gpu-1", false)];
        let before = [
            slice("node-0", D, 1, 2, &devices),
            counter_slice("node-0", D, 1, 2, &["80Gi", "80Gi"]),
        ];
        // Same devices, twice the counters.
        let after = [
            slice("node-0", D, 2, 2, &devices),
            counter_slice("node-0", D, 2, 2, &["160Gi", "160Gi"]),
        ];
        let r = eval_with(&g, &mut w, &before, &after, None).result;
        assert_eq!(r.reason, "CounterAboveBaseline", "{r:?}");
        assert_eq!(r.observed.as_deref(), Some("memory 320Gi"));
        assert_eq!(r.expected.as_deref(), Some("memory <= 160Gi"));
        // With a numeric ceiling only the count is bounded.
        let r = eval_with(&gate("2", "2", "0s"), &mut w, &before, &after, None).result;
        assert_eq!(r.status, GateStatus::Passed, "{r:?}");
    }

    #[test]
    fn an_incomplete_pool_is_not_judged_on_its_devices() {
        let mut w = World::healthy(1, 8);
        let before = [pool("node-0", 1, 8)];
        let mut partial = pool("node-0", 2, 8);
        partial.spec.pool.resource_slice_count = 2;
        let r = eval_with(
            &gate("baseline", "baseline", "0s"),
            &mut w,
            &before,
            &[partial],
            None,
        )
        .result;
        assert_eq!(r.reason, "PoolIncomplete");
        assert!(
            r.message.contains("1 of 2 slices of generation 2"),
            "{}",
            r.message
        );
    }

    #[test]
    fn a_node_without_baseline_needs_one_device_and_a_starting_pod_waits() {
        let mut w = World::healthy(1, 8);
        let g = gate("baseline", "baseline", "0s");
        let r = eval_with(&g, &mut w, &[], &[pool("node-0", 1, 3)], None).result;
        assert_eq!(r.status, GateStatus::Passed, "{r:?}");
        w.device_baseline
            .insert("node-0".into(), NodeDevices::default());
        w.pod("node-0").ready = false;
        let r = eval_with(&g, &mut w, &[], &[], None).result;
        assert_eq!(r.reason, "AwaitingPods");
    }

    #[test]
    fn no_evidence_waits_then_fails_at_the_deadline() {
        let mut w = World::healthy(1, 8);
        let g = gate("baseline", "baseline", "0s");
        let r = w.with_snapshot(|s| evaluate(&g, s, None)).result;
        assert_eq!(
            (r.status, r.reason.as_str()),
            (GateStatus::Pending, "NoEvidence")
        );
        w.without_progress = Duration::from_secs(600);
        let r = w.with_snapshot(|s| evaluate(&g, s, None)).result;
        assert_eq!(r.status, GateStatus::Failed);
    }

    #[test]
    fn pools_not_published_since_the_new_driver_became_ready_are_not_judged() {
        use crate::devices::test_objects::written_at;
        let mut w = World::healthy(1, 8);
        w.pod("node-0").ready_since = Some(ts(100));
        let g = gate("baseline", "baseline", "0s");
        let before = [written_at(pool("node-0", 1, 8), 50)];
        // The old driver's pool, still there: not judged, whatever the soak.
        let v = eval_with(&g, &mut w, &before, &before, None);
        assert_eq!(
            (v.result.status, v.result.reason.as_str()),
            (GateStatus::Pending, "AwaitingPublication"),
            "{:?}",
            v.result
        );
        assert!(v.violating.is_empty());
        // Republished in the Ready's own second: cannot tell which came first.
        let same_second = [written_at(pool("node-0", 2, 8), 100)];
        let r = eval_with(&g, &mut w, &before, &same_second, None).result;
        assert_eq!(r.reason, "AwaitingPublication");
        // Published after it: judged.
        let fresh = [written_at(pool("node-0", 2, 8), 101)];
        let r = eval_with(&g, &mut w, &before, &fresh, None).result;
        assert_eq!(r.status, GateStatus::Passed, "{r:?}");
        let fewer = [written_at(pool("node-0", 2, 4), 101)];
        let r = eval_with(&g, &mut w, &before, &fewer, None).result;
        assert_eq!(
            (r.status, r.reason.as_str()),
            (GateStatus::Failed, "BelowMinimum")
        );
        // No slice at all has no time to be fresh by: judged as seen (it can
        // only fail).
        let r = eval_with(&g, &mut w, &before, &[], None).result;
        assert_eq!(
            (r.status, r.reason.as_str()),
            (GateStatus::Failed, "SlicesWithdrawn")
        );
        // A stale pool out of bounds holds a slot, fails nothing.
        let stale_fewer = [written_at(pool("node-0", 1, 4), 60)];
        let v = eval_with(&g, &mut w, &before, &stale_fewer, None);
        assert_eq!(v.result.status, GateStatus::Pending);
        assert_eq!(v.violating.iter().collect::<Vec<_>>(), ["node-0"]);
        // At the deadline, a node never published for fails.
        w.without_progress = Duration::from_secs(600);
        let r = eval_with(&g, &mut w, &before, &before, None).result;
        assert_eq!(
            (r.status, r.reason.as_str()),
            (GateStatus::Failed, "NoFreshPublication")
        );
    }
}
