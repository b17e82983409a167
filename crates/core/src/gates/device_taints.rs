//! deviceTaints: the taints on the driver's devices, against what the node's
//! slices carried before the stage touched it (its baseline):
//! - a device tainted now that was not tainted so before fails the gate
//!   (NewTaints): the release marks devices unusable;
//! - a taint the old driver had set that is gone from a device still
//!   published ("health laundering": a restart hides a faulty device) is
//!   reported (the gate passes with reason TaintsCleared and a Warning
//!   Event) or, with `clearedTaints: Fail`, fails.
//!
//! Judged once the new driver pod is Ready and the node's pools are
//! complete and published after that ([`super::freshness`]: until then
//! their taints may be the old driver's); decided once the observation held
//! for `soak`. A node without a baseline needs at least one untainted device.

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use saferollout_api::{
    ClearedTaints, DeviceTaintsGate, GATE_DEVICE_TAINTS, GateResult, GateStatus,
};

use super::freshness::{self, Publication};
use super::{Snapshot, Verdict, list_some, result, soak};
use crate::devices::{pool_state, taint_device};

pub const NAME: &str = GATE_DEVICE_TAINTS;

#[derive(Debug)]
struct Finding {
    node: String,
    reason: &'static str,
    /// The taint entries, `<pool>/<device>: <key>=<value>:<effect>`.
    entries: Vec<String>,
}

enum Observation {
    Unavailable(String),
    Awaiting(Vec<String>),
    /// No new taint; the cleared ones, if any (first node's).
    Settled(Option<Finding>, BTreeSet<String>),
    New(Finding, BTreeSet<String>),
}

fn observe(gate: &DeviceTaintsGate, snap: &Snapshot) -> Observation {
    let Some(ev) = snap.evidence.devices else {
        return Observation::Unavailable("the operator observes no ResourceSlices".into());
    };
    if let Some(why) = ev.unavailable {
        return Observation::Unavailable(why.to_string());
    }
    let driver = gate.driver.as_str();
    let mut awaiting = Vec::new();
    let (mut new, mut cleared): (Vec<Finding>, Vec<Finding>) = (Vec::new(), Vec::new());
    for &node in snap.nodes {
        let Some(pod) = snap.target_pod(node).filter(|p| p.running && p.ready) else {
            awaiting.push(node.to_string());
            continue;
        };
        let slices = ev.node_slices(node, driver);
        if freshness::publication(&slices, driver, pod.ready_since) == Publication::Stale {
            awaiting.push(node.to_string());
            continue;
        }
        let state = pool_state(&slices, driver);
        if state.incomplete.is_some() {
            // resourceSlices says what is wrong with the pool; no taints to read yet.
            awaiting.push(node.to_string());
            continue;
        }
        let Some(base) = snap.device_baseline.get(node) else {
            if state.devices > 0 && state.untainted == 0 {
                new.push(Finding {
                    node: node.to_string(),
                    reason: "AllDevicesTainted",
                    entries: state.taints.iter().cloned().collect(),
                });
            }
            continue;
        };
        let before: BTreeSet<&str> = base.taints.iter().map(String::as_str).collect();
        let truncated = base.taints_total > base.taints.len() as i64;
        let added: Vec<String> = if truncated {
            // More taints than recorded: only a larger total is known to be new.
            if state.taints.len() as i64 > base.taints_total {
                state
                    .taints
                    .iter()
                    .filter(|t| !before.contains(t.as_str()))
                    .cloned()
                    .collect()
            } else {
                Vec::new()
            }
        } else {
            state
                .taints
                .iter()
                .filter(|t| !before.contains(t.as_str()))
                .cloned()
                .collect()
        };
        if !added.is_empty() {
            new.push(Finding {
                node: node.to_string(),
                reason: "NewTaints",
                entries: added,
            });
            continue;
        }
        let gone: Vec<String> = base
            .taints
            .iter()
            .filter(|t| !state.taints.contains(*t) && state.device_ids.contains(taint_device(t)))
            .cloned()
            .collect();
        if !gone.is_empty() {
            cleared.push(Finding {
                node: node.to_string(),
                reason: "TaintsCleared",
                entries: gone,
            });
        }
    }
    if !new.is_empty() {
        let nodes = new.iter().map(|f| f.node.clone()).collect();
        return Observation::New(new.swap_remove(0), nodes);
    }
    if !awaiting.is_empty() || snap.nodes.is_empty() {
        return Observation::Awaiting(awaiting);
    }
    let nodes = cleared.iter().map(|f| f.node.clone()).collect();
    Observation::Settled((!cleared.is_empty()).then(|| cleared.swap_remove(0)), nodes)
}

fn describe(f: &Finding, driver: &str) -> String {
    let what = match f.reason {
        "NewTaints" => "the release taints",
        "AllDevicesTainted" => "every device is tainted (no baseline to compare):",
        _ => "the release cleared the health taints the old driver had set on",
    };
    format!(
        "node {}: driver {driver}: {what} {} device(s): {}",
        f.node,
        f.entries.len(),
        list_some(&f.entries)
    )
}

pub fn evaluate(
    gate: &DeviceTaintsGate,
    snap: &Snapshot,
    previous: Option<&GateResult>,
) -> Verdict {
    let soak_for = gate.soak.to_std().unwrap_or(Duration::from_secs(10));
    let deadline = snap.deadline_passed();
    let driver = gate.driver.as_str();
    match observe(gate, snap) {
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
                format!("cannot judge the device taints of driver {driver}: {why}"),
            ))
        }
        Observation::Awaiting(nodes) => {
            let message = if nodes.is_empty() {
                "no node of the rollout to judge yet".to_string()
            } else {
                format!(
                    "waiting for the new driver pod to be Ready and its pools complete and published after that on {}",
                    list_some(&nodes)
                )
            };
            let mut r = result(NAME, GateStatus::Pending, "AwaitingPods", message);
            r.since = Some(Time(soak::since(previous, "AwaitingPods", None, snap.now)));
            if deadline {
                r.status = GateStatus::Failed;
                r.reason = "ProgressDeadlineExceeded".into();
            }
            Verdict::new(r)
        }
        Observation::New(f, violating) => {
            let since = soak::since(previous, f.reason, Some(&f.node), snap.now);
            let (status, recheck) =
                soak::outcome(since, snap.now, soak_for, deadline, GateStatus::Failed);
            let mut r = result(
                NAME,
                status,
                f.reason,
                format!("{} (soak {}s)", describe(&f, driver), soak_for.as_secs()),
            );
            r.observed = Some(format!("{} tainted", f.entries.len()));
            r.expected = Some(if f.reason == "NewTaints" {
                "no new taint".into()
            } else {
                "an untainted device".into()
            });
            r.node = Some(f.node);
            Verdict {
                violating,
                ..soak::verdict(r, since, recheck)
            }
        }
        Observation::Settled(None, _) => {
            let since = soak::since(previous, "TaintsUnchanged", None, snap.now);
            let (status, recheck) =
                soak::outcome(since, snap.now, soak_for, deadline, GateStatus::Passed);
            let r = result(
                NAME,
                status,
                if status == GateStatus::Failed {
                    "Unstable"
                } else {
                    "TaintsUnchanged"
                },
                format!(
                    "no device of driver {driver} newly tainted or cleared on all {} nodes (soak {}s)",
                    snap.nodes.len(),
                    soak_for.as_secs()
                ),
            );
            soak::verdict(r, since, recheck)
        }
        Observation::Settled(Some(f), cleared_nodes) => {
            let fail = gate.cleared_taints == ClearedTaints::Fail;
            let since = soak::since(previous, f.reason, Some(&f.node), snap.now);
            let held = if fail {
                GateStatus::Failed
            } else {
                GateStatus::Passed
            };
            let (status, recheck) = soak::outcome(since, snap.now, soak_for, deadline, held);
            let policy = if fail {
                "clearedTaints: Fail"
            } else {
                "reported: clearedTaints: Report"
            };
            let message = format!(
                "{} ({policy}; soak {}s)",
                describe(&f, driver),
                soak_for.as_secs()
            );
            let mut r = result(NAME, status, f.reason, message.clone());
            r.observed = Some(format!("{} cleared", f.entries.len()));
            r.expected = Some("health taints kept".into());
            r.node = Some(f.node);
            Verdict {
                // Laundering that fails stops further replacements while it soaks.
                violating: if fail { cleared_nodes } else { BTreeSet::new() },
                warning: (status == GateStatus::Passed).then_some(message),
                ..soak::verdict(r, since, recheck)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::resource::v1::ResourceSlice;
    use saferollout_api::DurationString;

    use super::super::test_support::*;
    use super::*;
    use crate::devices::test_objects::slice;
    use crate::devices::{DeviceEvidence, capture};

    const D: &str = "gpu.example.com";

    fn gate(cleared: ClearedTaints, soak: &str) -> DeviceTaintsGate {
        DeviceTaintsGate {
            driver: D.into(),
            cleared_taints: cleared,
            soak: DurationString::new(soak),
        }
    }

    fn pool(generation: i64, tainted: &[usize]) -> ResourceSlice {
        let names: Vec<String> = (0..4).map(|i| format!("gpu-{i}")).collect();
        let devices: Vec<(&str, bool)> = names
            .iter()
            .enumerate()
            .map(|(i, n)| (n.as_str(), tainted.contains(&i)))
            .collect();
        slice("node-0", D, generation, 1, &devices)
    }

    fn eval(
        g: &DeviceTaintsGate,
        w: &mut World,
        before: Option<ResourceSlice>,
        now: ResourceSlice,
        prev: Option<&GateResult>,
    ) -> Verdict {
        if let Some(before) = before {
            let mut ev = DeviceEvidence::default();
            ev.add_slices([&before]);
            w.device_baseline
                .insert("node-0".into(), capture(&ev, "node-0", D));
        }
        let mut ev = DeviceEvidence::default();
        ev.add_slices([&now]);
        w.with_devices(Some(&ev), |s| evaluate(g, s, prev))
    }

    #[test]
    fn a_newly_tainted_device_fails_after_the_soak() {
        let mut w = World::healthy(1, 4);
        let g = gate(ClearedTaints::Report, "5s");
        let first = eval(&g, &mut w, Some(pool(1, &[3])), pool(2, &[0, 3]), None);
        assert_eq!(
            (first.result.status, first.result.reason.as_str()),
            (GateStatus::Pending, "NewTaints")
        );
        assert!(first.violating.contains("node-0"));
        w.now = ts(105);
        let r = eval(&g, &mut w, None, pool(2, &[0, 3]), Some(&first.result)).result;
        assert_eq!(r.status, GateStatus::Failed);
        assert!(
            r.message
                .contains("node-0/gpu-0: gpu.example.com/unhealthy=xid-79:NoSchedule"),
            "{}",
            r.message
        );
        assert!(
            !r.message.contains("gpu-3"),
            "gpu-3 was tainted before: {}",
            r.message
        );
    }

    #[test]
    fn cleared_health_taints_are_reported_or_fail() {
        let mut w = World::healthy(1, 4);
        let report = gate(ClearedTaints::Report, "0s");
        let v = eval(&report, &mut w, Some(pool(1, &[3])), pool(2, &[]), None);
        assert_eq!(
            (v.result.status, v.result.reason.as_str()),
            (GateStatus::Passed, "TaintsCleared")
        );
        assert!(
            v.warning
                .as_deref()
                .is_some_and(|m| m.contains("cleared the health taints")),
            "{v:?}"
        );
        assert!(v.violating.is_empty());
        let fail = gate(ClearedTaints::Fail, "0s");
        let v = eval(&fail, &mut w, None, pool(2, &[]), None);
        assert_eq!(
            (v.result.status, v.result.reason.as_str()),
            (GateStatus::Failed, "TaintsCleared")
        );
        assert_eq!(v.result.observed.as_deref(), Some("1 cleared"));
        // A device that is no longer published cleared nothing (resourceSlices judges the count).
        let mut fewer = pool(2, &[]);
        fewer.spec.devices.as_mut().unwrap().truncate(3);
        let v = eval(&fail, &mut w, None, fewer, None);
        assert_eq!(v.result.status, GateStatus::Passed, "{v:?}");
    }

    #[test]
    fn unchanged_taints_pass_after_the_soak_and_a_node_without_baseline_needs_an_untainted_device()
    {
        let mut w = World::healthy(1, 4);
        let g = gate(ClearedTaints::Fail, "5s");
        let r1 = eval(&g, &mut w, Some(pool(1, &[3])), pool(2, &[3]), None).result;
        assert_eq!(
            (r1.status, r1.reason.as_str()),
            (GateStatus::Pending, "TaintsUnchanged")
        );
        w.now = ts(105);
        let r2 = eval(&g, &mut w, None, pool(2, &[3]), Some(&r1)).result;
        assert_eq!(r2.status, GateStatus::Passed);
        w.device_baseline.clear();
        let g0 = gate(ClearedTaints::Report, "0s");
        assert_eq!(
            eval(&g0, &mut w, None, pool(1, &[3]), None).result.status,
            GateStatus::Passed
        );
        let r = eval(&g0, &mut w, None, pool(1, &[0, 1, 2, 3]), None).result;
        assert_eq!(
            (r.status, r.reason.as_str()),
            (GateStatus::Failed, "AllDevicesTainted")
        );
    }

    #[test]
    fn taints_of_a_pool_not_published_since_the_new_driver_became_ready_are_not_judged() {
        use crate::devices::test_objects::written_at;
        let mut w = World::healthy(1, 8);
        w.pod("node-0").ready_since = Some(ts(100));
        let g = gate(ClearedTaints::Fail, "0s");
        // The old driver had gpu-1 tainted; what is published now is still
        // its pool (written at 50): the new driver may clear or add taints.
        let before = written_at(pool(1, &[1]), 50);
        let r = eval(&g, &mut w, Some(before.clone()), before.clone(), None).result;
        assert_eq!(
            (r.status, r.reason.as_str()),
            (GateStatus::Pending, "AwaitingPods"),
            "{r:?}"
        );
        assert!(r.message.contains("published after that"), "{}", r.message);
        // The new driver's pool, published after its Ready: judged.
        let laundered = written_at(pool(2, &[]), 101);
        let r = eval(&g, &mut w, Some(before.clone()), laundered, None).result;
        assert_eq!(
            (r.status, r.reason.as_str()),
            (GateStatus::Failed, "TaintsCleared")
        );
        let same = written_at(pool(2, &[1]), 101);
        let r = eval(&g, &mut w, Some(before), same, None).result;
        assert_eq!(r.status, GateStatus::Passed, "{r:?}");
    }
}
