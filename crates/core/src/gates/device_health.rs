//! deviceHealth: what the kubelet reports of the devices workloads use on the
//! rollout's nodes (`containerStatuses[].allocatedResourcesStatus`,
//! KEP-4680), for device plugins (entries named after the extended
//! resource, resourceID = the device ID) and DRA drivers (entries named
//! `claim:<name>[/<request>]`, resourceID = `<driver>/<pool>/<device>`).
//!
//! A node is judged once its new agent pod is Ready and its pods are
//! observed. An Unhealthy or Unknown entry fails the gate once it has lasted
//! the handover window (the kubelet reports Unknown while a driver's health
//! stream is away, about 30 s across a restart); the gate passes once every
//! node has been clear for the window. A node where no workload uses the
//! devices is clear. Unhealthy is reported before Unknown, nodes in name order.
//!
//! A node counts as clear only once the new agent's own report is there
//! ([`super::freshness`]): for a device plugin, the node's status written
//! after its pod became Ready (the device manager's health of the plugin's
//! devices is what the kubelet reports); for a DRA driver, its pools
//! published after that (or none at all). The entries carry no time of
//! their own, so the rest of the bound is the window: counted from when every
//! node is clear, it must be at least the kubelet's health timeout for a
//! Healthy the old driver reported to have turned Unknown within it.

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use saferollout_api::{DeviceHealthGate, GATE_DEVICE_HEALTH, GateResult, GateStatus};

use super::freshness::{self, Publication};
use super::proof::clean_line;
use super::{Snapshot, Verdict, list_some, result, soak};
use crate::devices::{is_deleting, is_terminal};

pub const NAME: &str = GATE_DEVICE_HEALTH;

/// One entry that does not read Healthy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadDevice {
    pub pod: String,
    pub container: String,
    pub device: String,
    /// Unhealthy or Unknown.
    pub health: String,
    pub message: Option<String>,
}

/// The entries for the gated devices in `pod`'s container statuses that do
/// not read Healthy, Unhealthy first; and how many entries there are. A pod
/// outside the SafeRollout's namespace `own` is not named (nor its
/// container): status is read by this namespace's users.
pub fn bad_devices(gate: &DeviceHealthGate, pod: &Pod, own: &str) -> (Vec<BadDevice>, usize) {
    let ns = pod.metadata.namespace.as_deref().unwrap_or_default();
    let name = pod.metadata.name.as_deref().unwrap_or_default();
    let (pod_name, container_name) = if ns == own {
        (format!("pod {ns}/{name}"), None)
    } else {
        ("a pod in another namespace".to_string(), Some("-"))
    };
    let mut bad = Vec::new();
    let mut seen = 0;
    for c in pod
        .status
        .iter()
        .flat_map(|s| s.container_statuses.iter().flatten())
    {
        for status in c.allocated_resources_status.iter().flatten() {
            let by_resource = gate.resource.as_deref() == Some(status.name.as_str());
            for h in status.resources.iter().flatten() {
                let ours = by_resource
                    || gate.driver.as_deref().is_some_and(|d| {
                        status.name.starts_with("claim:")
                            && h.resource_id
                                .strip_prefix(d)
                                .is_some_and(|r| r.starts_with('/'))
                    });
                if !ours {
                    continue;
                }
                seen += 1;
                let health = h.health.as_deref().unwrap_or("Unknown");
                if health != "Healthy" {
                    bad.push(BadDevice {
                        pod: pod_name.clone(),
                        container: container_name.unwrap_or(&c.name).to_string(),
                        device: h.resource_id.clone(),
                        health: health.to_string(),
                        message: h
                            .message
                            .as_deref()
                            .filter(|m| !m.is_empty())
                            .map(clean_line),
                    });
                }
            }
        }
    }
    bad.sort_by_key(|b| b.health != "Unhealthy");
    (bad, seen)
}

enum Observation {
    Unavailable(String),
    Awaiting(Vec<String>),
    /// Every judged node clear; (devices, pods) seen.
    Clear(usize, usize),
    Bad {
        node: String,
        first: BadDevice,
        count: usize,
        violating: BTreeSet<String>,
    },
}

fn observe(gate: &DeviceHealthGate, snap: &Snapshot) -> Observation {
    let Some(ev) = snap.evidence.devices else {
        return Observation::Unavailable("the operator observes no workload pods".into());
    };
    if let Some(why) = ev.unavailable {
        return Observation::Unavailable(why.to_string());
    }
    let mut awaiting = Vec::new();
    let mut violating = BTreeSet::new();
    let mut first: Option<(String, BadDevice, usize)> = None;
    let (mut devices, mut pods) = (0, 0);
    for &node in snap.nodes {
        let agent = snap.target_pod(node).filter(|p| p.running && p.ready);
        let Some((agent, node_pods)) = agent.zip(ev.node_pods(node)) else {
            awaiting.push(node.to_string());
            continue;
        };
        let mut node_bad = Vec::new();
        for pod in node_pods
            .iter()
            .filter(|p| !is_terminal(p) && !is_deleting(p))
        {
            let (bad, seen) = bad_devices(gate, pod, ev.namespace);
            devices += seen;
            pods += usize::from(seen > 0);
            node_bad.extend(bad);
        }
        if node_bad.is_empty() {
            // Clear, but only on what the new agent reported.
            let fresh = match (&gate.driver, snap.node(node)) {
                (Some(driver), _) => {
                    let slices = ev.node_slices(node, driver);
                    freshness::publication(&slices, driver, agent.ready_since) != Publication::Stale
                }
                (None, Some(view)) => freshness::node_status_fresh(view, agent),
                (None, None) => false,
            };
            if !fresh {
                awaiting.push(node.to_string());
            }
            continue;
        }
        violating.insert(node.to_string());
        node_bad.sort_by_key(|b| b.health != "Unhealthy");
        let count = node_bad.len();
        let better = match &first {
            None => true,
            // Unhealthy before Unknown; otherwise the first node by name.
            Some((_, f, _)) => f.health != "Unhealthy" && node_bad[0].health == "Unhealthy",
        };
        if better {
            first = Some((node.to_string(), node_bad.swap_remove(0), count));
        }
    }
    if let Some((node, first, count)) = first {
        return Observation::Bad {
            node,
            first,
            count,
            violating,
        };
    }
    if !awaiting.is_empty() || snap.nodes.is_empty() {
        return Observation::Awaiting(awaiting);
    }
    Observation::Clear(devices, pods)
}

fn what(gate: &DeviceHealthGate) -> String {
    match (&gate.driver, &gate.resource) {
        (Some(d), _) => format!("driver {d}"),
        (_, Some(r)) => r.clone(),
        _ => "the gated devices".into(),
    }
}

pub fn evaluate(
    gate: &DeviceHealthGate,
    snap: &Snapshot,
    previous: Option<&GateResult>,
) -> Verdict {
    let window = gate.handover.to_std().unwrap_or(Duration::from_secs(30));
    let deadline = snap.deadline_passed();
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
                format!("cannot judge the health of {}: {why}", what(gate)),
            ))
        }
        Observation::Awaiting(nodes) => {
            let message = if nodes.is_empty() {
                "no node of the rollout to judge yet".to_string()
            } else {
                format!(
                    "waiting for the new agent pod to be Ready, the workloads to be listed and the agent's report written after that on {}",
                    list_some(&nodes)
                )
            };
            let mut r = result(NAME, GateStatus::Pending, "AwaitingPods", message);
            r.since = Some(Time(soak::since(previous, "AwaitingPods", None, snap.now)));
            Verdict::new(r)
        }
        Observation::Clear(devices, pods) => {
            let since = soak::since(previous, "Healthy", None, snap.now);
            let left = soak::remaining(since, snap.now, window);
            let message = format!(
                "{devices} device(s) of {} used by {pods} pod(s) report Healthy on all {} nodes (handover {}s)",
                what(gate),
                snap.nodes.len(),
                window.as_secs()
            );
            let status = if left.is_none() {
                GateStatus::Passed
            } else {
                GateStatus::Pending
            };
            let mut r = result(NAME, status, "Healthy", message);
            r.since = Some(Time(since));
            Verdict {
                recheck_after: left,
                ..Verdict::new(r)
            }
        }
        Observation::Bad {
            node,
            first,
            count,
            violating,
        } => {
            let reason = if first.health == "Unhealthy" {
                "Unhealthy"
            } else {
                "Unknown"
            };
            let since = soak::since(previous, reason, Some(&node), snap.now);
            let (status, recheck) =
                soak::outcome(since, snap.now, window, deadline, GateStatus::Failed);
            let more = if count > 1 {
                format!(" (and {} more on the node)", count - 1)
            } else {
                String::new()
            };
            let mut r = result(
                NAME,
                status,
                reason,
                format!(
                    "node {node}: {}{}: device {} is {}{}{more} (handover {}s)",
                    first.pod,
                    if first.container == "-" {
                        String::new()
                    } else {
                        format!(" container {}", first.container)
                    },
                    first.device,
                    first.health,
                    first.message.map(|m| format!(": {m}")).unwrap_or_default(),
                    window.as_secs()
                ),
            );
            r.node = Some(node);
            r.observed = Some(first.health);
            r.expected = Some("Healthy".into());
            Verdict {
                violating,
                ..soak::verdict(r, since, recheck)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use saferollout_api::DurationString;

    use super::super::test_support::*;
    use super::*;
    use crate::devices::DeviceEvidence;
    use crate::devices::test_objects::health_pod;

    fn dra(handover: &str) -> DeviceHealthGate {
        DeviceHealthGate {
            handover: DurationString::new(handover),
            ..DeviceHealthGate::for_driver("gpu.example.com")
        }
    }

    fn eval(g: &DeviceHealthGate, w: &World, pods: &[Pod], prev: Option<&GateResult>) -> Verdict {
        let mut ev = DeviceEvidence {
            namespace: "work",
            ..Default::default()
        };
        for n in &w.nodes {
            ev.pods_observed.insert(n.as_str());
        }
        for p in pods {
            let node = p.spec.as_ref().unwrap().node_name.as_deref().unwrap();
            ev.pods.entry(node).or_default().push(p);
        }
        w.with_devices(Some(&ev), |s| evaluate(g, s, prev))
    }

    #[test]
    fn unhealthy_fails_after_the_handover_window() {
        let mut w = World::healthy(2, 8);
        let g = dra("5s");
        let pods = [
            health_pod(
                "a",
                "node-0",
                &[("claim:gpu", "gpu.example.com/node-0/gpu-0", "Healthy")],
            ),
            health_pod(
                "b",
                "node-1",
                &[("claim:gpu", "gpu.example.com/node-1/gpu-1", "Unhealthy")],
            ),
        ];
        let first = eval(&g, &w, &pods, None);
        assert_eq!(
            (first.result.status, first.result.reason.as_str()),
            (GateStatus::Pending, "Unhealthy")
        );
        assert!(first.violating.contains("node-1"));
        w.now = ts(105);
        let r = eval(&g, &w, &pods, Some(&first.result)).result;
        assert_eq!(r.status, GateStatus::Failed);
        assert_eq!(r.node.as_deref(), Some("node-1"));
        assert!(
            r.message.contains(
                "work/b container work: device gpu.example.com/node-1/gpu-1 is Unhealthy"
            ),
            "{}",
            r.message
        );
    }

    #[test]
    fn another_namespaces_pods_are_not_named_and_messages_are_masked() {
        let mut w = World::healthy(1, 8);
        let g = dra("5s");
        let mut pod = health_pod(
            "tenant-job",
            "node-0",
            &[("claim:gpu", "gpu.example.com/node-0/gpu-1", "Unhealthy")],
        );
        pod.metadata.namespace = Some("tenant-b".into());
        let statuses = pod
            .status
            .as_mut()
            .unwrap()
            .container_statuses
            .as_mut()
            .unwrap();
        statuses[0].allocated_resources_status.as_mut().unwrap()[0]
            .resources
            .as_mut()
            .unwrap()[0]
            .message = Some("XID 79 token=drv-s3cr3t-value".into());
        let first = eval(&g, &w, std::slice::from_ref(&pod), None);
        w.now = ts(105);
        let r = eval(&g, &w, &[pod], Some(&first.result)).result;
        assert_eq!(r.status, GateStatus::Failed);
        for hidden in ["tenant-b", "tenant-job", "drv-s3cr3t-value"] {
            assert!(!r.message.contains(hidden), "{}", r.message);
        }
        assert!(
            r.message.contains("a pod in another namespace: device gpu.example.com/node-0/gpu-1 is Unhealthy: XID 79"),
            "{}",
            r.message
        );
    }

    #[test]
    fn unknown_during_the_handover_then_healthy_passes() {
        let mut w = World::healthy(1, 8);
        let g = dra("5s");
        let unknown = [health_pod(
            "a",
            "node-0",
            &[("claim:gpu", "gpu.example.com/node-0/gpu-0", "Unknown")],
        )];
        let r1 = eval(&g, &w, &unknown, None).result;
        assert_eq!(
            (r1.status, r1.reason.as_str()),
            (GateStatus::Pending, "Unknown")
        );
        w.now = ts(103);
        let healthy = [health_pod(
            "a",
            "node-0",
            &[("claim:gpu", "gpu.example.com/node-0/gpu-0", "Healthy")],
        )];
        let r2 = eval(&g, &w, &healthy, Some(&r1)).result;
        assert_eq!(
            (r2.status, r2.reason.as_str()),
            (GateStatus::Pending, "Healthy")
        );
        w.now = ts(108);
        let r3 = eval(&g, &w, &healthy, Some(&r2)).result;
        assert_eq!(r3.status, GateStatus::Passed, "clear for the whole window");
    }

    #[test]
    fn device_plugin_entries_and_other_drivers() {
        let w = World::healthy(1, 8);
        let plugin = DeviceHealthGate {
            handover: DurationString::new("0s"),
            ..DeviceHealthGate::for_resource("example.com/gpu")
        };
        let pods = [health_pod(
            "a",
            "node-0",
            &[
                ("example.com/gpu", "gpu-0", "Unhealthy"),
                ("claim:nic", "nic.example.com/node-0/nic-0", "Unhealthy"),
            ],
        )];
        let r = eval(&plugin, &w, &pods, None).result;
        assert_eq!(
            (r.status, r.observed.as_deref()),
            (GateStatus::Failed, Some("Unhealthy"))
        );
        assert!(r.message.contains("device gpu-0"), "{}", r.message);
        // The DRA gate of another driver does not read these.
        let r = eval(&dra("0s"), &w, &pods, None).result;
        assert_eq!(r.status, GateStatus::Passed, "{r:?}");
    }

    #[test]
    fn unobserved_pods_and_a_starting_agent_wait() {
        let mut w = World::healthy(1, 8);
        let r = w
            .with_devices(Some(&DeviceEvidence::default()), |s| {
                evaluate(&dra("0s"), s, None)
            })
            .result;
        assert_eq!(r.reason, "AwaitingPods");
        w.pod("node-0").ready = false;
        let r = eval(&dra("0s"), &w, &[], None).result;
        assert_eq!(r.reason, "AwaitingPods");
    }

    #[test]
    fn clear_counts_only_on_the_new_agents_report() {
        use crate::devices::test_objects::{slice, written_at};
        let mut w = World::healthy(1, 8);
        w.pod("node-0").ready_since = Some(ts(100));
        let healthy = [health_pod(
            "a",
            "node-0",
            &[("claim:gpu", "gpu.example.com/node-0/gpu-0", "Healthy")],
        )];
        // A DRA driver: its pools published after its Ready.
        let judge_dra = |published_at: i64| {
            let s = written_at(
                slice("node-0", "gpu.example.com", 1, 1, &[("gpu-0", false)]),
                published_at,
            );
            let mut ev = DeviceEvidence {
                namespace: "work",
                ..Default::default()
            };
            ev.add_slices([&s]);
            ev.pods_observed.insert("node-0");
            ev.pods.entry("node-0").or_default().push(&healthy[0]);
            w.with_devices(Some(&ev), |s| evaluate(&dra("0s"), s, None))
                .result
        };
        let r = judge_dra(50);
        assert_eq!(
            (r.status, r.reason.as_str()),
            (GateStatus::Pending, "AwaitingPods"),
            "the old driver's pool: {r:?}"
        );
        assert_eq!(judge_dra(101).status, GateStatus::Passed);
        // A device plugin: the node's status written after its Ready.
        let plugin = DeviceHealthGate {
            handover: DurationString::new("0s"),
            ..DeviceHealthGate::for_resource("example.com/gpu")
        };
        let pods = [health_pod(
            "a",
            "node-0",
            &[("example.com/gpu", "gpu-0", "Healthy")],
        )];
        w.node_states.get_mut("node-0").unwrap().status_written = Some(ts(100));
        let r = eval(&plugin, &w, &pods, None).result;
        assert_eq!(r.status, GateStatus::Pending, "{r:?}");
        w.node_states.get_mut("node-0").unwrap().status_written = Some(ts(101));
        assert_eq!(
            eval(&plugin, &w, &pods, None).result.status,
            GateStatus::Passed
        );
        // What is not Healthy is judged as seen: it can only fail.
        w.node_states.get_mut("node-0").unwrap().status_written = Some(ts(90));
        let bad = [health_pod(
            "a",
            "node-0",
            &[("example.com/gpu", "gpu-0", "Unhealthy")],
        )];
        let r = eval(&plugin, &w, &bad, None).result;
        assert_eq!(
            (r.status, r.reason.as_str()),
            (GateStatus::Failed, "Unhealthy")
        );
    }
}
