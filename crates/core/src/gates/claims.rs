//! claims: what the driver's restart does to the claims of the rollout's
//! nodes.
//!
//! - Survival: the ResourceClaims allocated on a node (devices of the gated
//!   driver) and reserved for a pod when the stage took the node (its
//!   baseline) stay allocated there and reserved while their pods run, and
//!   those pods do not fail. A pod that fails (e.g. `NodePrepareResources
//!   failed`), or a claim that loses its allocation under a running pod,
//!   fails the gate at once. A claim its user deleted, or whose pod ended
//!   well, is not the release's doing. Losses are judged as seen, whenever
//!   they come; the survival passes a node only once the new driver
//!   published its pools after its pod became Ready (or publishes none;
//!   [`super::freshness`]): claims and pods that look intact before the new
//!   driver did anything say nothing of what it does to them.
//! - Probe (optional): on each node of the rollout whose new driver pod is
//!   Ready, a short-lived pod pinned to the node with a ResourceClaim (from a
//!   DeviceClass or a claim template): the real scheduler must allocate the
//!   claim on the node's devices and bind the pod there within the probe's
//!   timeout; the scheduler's own message is the failure's (e.g. `cannot
//!   allocate all claims`). A node whose probe passed is recorded in the
//!   stage (`probed`) and its probe deleted; probes are created and deleted
//!   by [`crate::rollout`] from status and the cluster.

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use saferollout_api::{
    ClaimsGate, GATE_CLAIMS, GateResult, GateStatus, PROBE_NODE_ANNOTATION,
    PROBE_REVISION_ANNOTATION,
};

use super::freshness::{self, Publication};
use super::proof::clean_line;
use super::{Snapshot, Verdict, elapsed, list_some, result};
use crate::devices::{
    DeviceEvidence, OTHER_CLAIM_PREFIX, claim_node, claim_uses_driver, failure_message,
    is_allocated, is_deleting, is_reserved, is_terminal, phase, pod_claim_names,
};

pub const NAME: &str = GATE_CLAIMS;

/// Where one node's probe is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProbeState {
    /// No probe pod yet (or the last one is going away).
    Missing,
    /// Created; the scheduler has not placed it yet (its message, if any)
    /// and it was created this long ago.
    Waiting {
        scheduler: Option<String>,
        age: Duration,
    },
    /// The claim is allocated on the node and the pod bound there.
    Allocated,
    /// The pod failed.
    Failed(String),
}

/// The probe pod for `node` of `revision`, if any.
pub fn probe_pod<'a>(ev: &DeviceEvidence<'a>, node: &str, revision: &str) -> Option<&'a Pod> {
    ev.probes.iter().copied().find(|p| {
        let a = p.metadata.annotations.as_ref();
        let get = |k: &str| a.and_then(|a| a.get(k)).map(String::as_str);
        get(PROBE_NODE_ANNOTATION) == Some(node) && get(PROBE_REVISION_ANNOTATION) == Some(revision)
    })
}

/// Where the probe of `node` is.
pub fn probe_state(ev: &DeviceEvidence, snap: &Snapshot, node: &str) -> ProbeState {
    let Some(pod) = probe_pod(ev, node, snap.target_revision).filter(|p| !is_deleting(p)) else {
        return ProbeState::Missing;
    };
    if phase(pod) == "Failed" {
        return ProbeState::Failed(clean_line(&failure_message(pod)));
    }
    let ns = pod.metadata.namespace.as_deref().unwrap_or_default();
    let bound = pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node);
    let claims = pod_claim_names(pod);
    let allocated = !claims.is_empty()
        && claims.iter().all(|c| {
            ev.claims
                .get(&(ns, *c))
                .is_some_and(|claim| claim_node(claim) == Some(node))
        });
    // A probe that ran to completion on the node had its devices there (its
    // claim may be released by now).
    if bound && (allocated || phase(pod) == "Succeeded") {
        return ProbeState::Allocated;
    }
    let scheduler = pod
        .status
        .iter()
        .flat_map(|s| s.conditions.iter().flatten())
        .find(|c| c.type_ == "PodScheduled" && c.status == "False")
        .and_then(|c| c.message.clone());
    let age = pod
        .metadata
        .creation_timestamp
        .as_ref()
        .map(|t| elapsed(t.0, snap.now))
        .unwrap_or_default();
    ProbeState::Waiting { scheduler, age }
}

/// Held nodes that need a probe now: not probed yet in this rollout, and
/// their new driver pod is Ready.
pub fn nodes_to_probe<'a>(snap: &Snapshot<'a>) -> Vec<&'a str> {
    snap.nodes
        .iter()
        .copied()
        .filter(|n| !snap.probed.contains(*n))
        .filter(|n| snap.target_pod(n).is_some_and(|p| p.running && p.ready))
        .collect()
}

/// Nodes whose probe is allocated now (to record as probed).
pub fn probes_passed(gate: &ClaimsGate, snap: &Snapshot) -> Vec<String> {
    let (Some(_), Some(ev)) = (gate.probe.as_ref(), snap.evidence.devices) else {
        return Vec::new();
    };
    nodes_to_probe(snap)
        .into_iter()
        .filter(|n| probe_state(ev, snap, n) == ProbeState::Allocated)
        .map(str::to_string)
        .collect()
}

/// A claim that did not survive.
struct Lost {
    node: String,
    reason: &'static str,
    message: String,
}

/// The baseline claims of `node` that did not survive. Claims and pods of
/// other namespaces than the SafeRollout's are recorded by UID and never
/// named, nor their pods' messages quoted: status is read by this
/// namespace's users.
fn lost_claims(
    gate: &ClaimsGate,
    ev: &DeviceEvidence,
    snap: &Snapshot,
    node: &str,
    pods: &[&Pod],
) -> Vec<Lost> {
    let Some(base) = snap.device_baseline.get(node) else {
        return Vec::new();
    };
    let mut lost = Vec::new();
    for claim in baseline_claims(gate, ev, base, node) {
        let ns = claim.metadata.namespace.as_deref().unwrap_or_default();
        let name = claim.metadata.name.as_deref().unwrap_or_default();
        let own = ns == ev.namespace;
        let what = if own {
            format!("claim {ns}/{name}")
        } else {
            "a claim in another namespace".to_string()
        };
        let users: Vec<&&Pod> = pods
            .iter()
            .filter(|p| p.metadata.namespace.as_deref() == Some(ns))
            .filter(|p| pod_claim_names(p).contains(name))
            .collect();
        if let Some(failed) = users.iter().find(|p| phase(p) == "Failed") {
            let message = if own {
                format!(
                    "node {node}: pod {ns}/{} using {what} failed: {}",
                    failed.metadata.name.as_deref().unwrap_or_default(),
                    clean_line(&failure_message(failed))
                )
            } else {
                format!(
                    "node {node}: a pod in another namespace using {what} failed (its name and message are withheld from this namespace)"
                )
            };
            lost.push(Lost {
                node: node.to_string(),
                reason: "ClaimPodFailed",
                message,
            });
            continue;
        }
        let running = users.iter().any(|p| !is_terminal(p) && !is_deleting(p));
        if !running {
            continue;
        }
        if !is_allocated(claim) || claim_node(claim) != Some(node) {
            lost.push(Lost {
                node: node.to_string(),
                reason: "ClaimDeallocated",
                message: format!(
                    "node {node}: {what} is no longer allocated on the node while its pod runs"
                ),
            });
        } else if !is_reserved(claim) {
            lost.push(Lost {
                node: node.to_string(),
                reason: "ClaimNotReserved",
                message: format!(
                    "node {node}: {what} is no longer reserved for its pod while the pod runs"
                ),
            });
        }
    }
    lost
}

/// The claims of `node`'s baseline still there to judge (a claim its user
/// deleted has none): those it recorded by name, or, for a node whose claims
/// were only counted (past the status's budget of names,
/// `saferollout_api::device_baseline::MAX_CLAIM_NAMES`, or past the most one
/// node records), every claim of the driver allocated there and reserved
/// now. A claim made since the change is then judged too: stricter, never
/// weaker.
fn baseline_claims<'a>(
    gate: &ClaimsGate,
    ev: &DeviceEvidence<'a>,
    base: &saferollout_api::NodeDevices,
    node: &str,
) -> Vec<&'a k8s_openapi::api::resource::v1::ResourceClaim> {
    if base.claims.len() as i64 >= base.claims_total {
        return base
            .claims
            .iter()
            .filter_map(|key| find_claim(ev, node, key))
            .collect();
    }
    ev.claims_by_node
        .get(node)
        .into_iter()
        .flatten()
        .copied()
        .filter(|c| claim_uses_driver(c, &gate.driver) && is_reserved(c))
        .collect()
}

/// The claim a baseline key names: `<namespace>/<name>`, or `uid:<uid>` for
/// another namespace's (see [`crate::devices::claim_key`]).
fn find_claim<'a>(
    ev: &DeviceEvidence<'a>,
    node: &str,
    key: &str,
) -> Option<&'a k8s_openapi::api::resource::v1::ResourceClaim> {
    match key.strip_prefix(OTHER_CLAIM_PREFIX) {
        Some(uid) => ev
            .claims_by_node
            .get(node)
            .into_iter()
            .flatten()
            .chain(ev.claims.values())
            .copied()
            .find(|c| c.metadata.uid.as_deref() == Some(uid)),
        None => {
            let (ns, name) = key.split_once('/')?;
            ev.claims.get(&(ns, name)).copied()
        }
    }
}

pub fn evaluate(gate: &ClaimsGate, snap: &Snapshot, _previous: Option<&GateResult>) -> Verdict {
    let deadline = snap.deadline_passed();
    let Some(ev) = snap.evidence.devices.filter(|e| e.unavailable.is_none()) else {
        let why = snap
            .evidence
            .devices
            .and_then(|e| e.unavailable)
            .unwrap_or("the operator observes no ResourceClaims");
        let status = if deadline {
            GateStatus::Failed
        } else {
            GateStatus::Pending
        };
        return Verdict::new(result(
            NAME,
            status,
            "NoEvidence",
            format!("cannot judge the claims of driver {}: {why}", gate.driver),
        ));
    };
    let timeout = gate
        .probe
        .as_ref()
        .and_then(|p| p.timeout.to_std().ok())
        .unwrap_or(Duration::from_secs(120));
    let mut awaiting = Vec::new();
    let mut lost: Vec<Lost> = Vec::new();
    let mut probing: Vec<(String, Option<String>, Duration)> = Vec::new();
    let mut probe_failed: Option<(String, &'static str, String)> = None;
    let mut claims_seen = 0usize;
    let to_probe: BTreeSet<&str> = if gate.probe.is_some() {
        nodes_to_probe(snap).into_iter().collect()
    } else {
        BTreeSet::new()
    };
    for &node in snap.nodes {
        let agent = snap.target_pod(node).filter(|p| p.running && p.ready);
        let agent_ready = agent.is_some();
        let needs_pods = snap
            .device_baseline
            .get(node)
            .is_some_and(|b| b.claims_total > 0);
        let pods = ev.node_pods(node);
        if !agent_ready || (needs_pods && pods.is_none()) {
            awaiting.push(node.to_string());
            continue;
        }
        if let Some(pods) = pods {
            claims_seen += snap
                .device_baseline
                .get(node)
                .map_or(0, |b| b.claims_total as usize);
            lost.extend(lost_claims(gate, ev, snap, node, pods));
        }
        let ready_since = agent.and_then(|p| p.ready_since);
        let slices = ev.node_slices(node, &gate.driver);
        if freshness::publication(&slices, &gate.driver, ready_since) == Publication::Stale {
            awaiting.push(node.to_string());
        }
        if !to_probe.contains(node) {
            continue;
        }
        match probe_state(ev, snap, node) {
            ProbeState::Allocated => {}
            ProbeState::Failed(m) => {
                probe_failed.get_or_insert((
                    node.to_string(),
                    "ProbeFailed",
                    format!("node {node}: the claims probe failed: {m}"),
                ));
            }
            ProbeState::Missing => probing.push((node.to_string(), None, Duration::ZERO)),
            ProbeState::Waiting { scheduler, age } => {
                if age >= timeout || deadline {
                    probe_failed.get_or_insert((
                        node.to_string(),
                        "ProbeNotAllocated",
                        format!(
                            "node {node}: the scheduler did not allocate the probe claim on the node within {}s: {}",
                            timeout.as_secs(),
                            scheduler.as_deref().unwrap_or("the probe pod is not scheduled")
                        ),
                    ));
                } else {
                    probing.push((node.to_string(), scheduler, age));
                }
            }
        }
    }
    if let Some(first) = lost.first() {
        let violating = lost.iter().map(|l| l.node.clone()).collect();
        let mut r = result(
            NAME,
            GateStatus::Failed,
            first.reason,
            first.message.clone(),
        );
        r.node = Some(first.node.clone());
        r.observed = Some(format!(
            "{} claim(s) lost",
            lost.iter().filter(|l| l.node == first.node).count()
        ));
        r.expected = Some("allocated claims and their pods survive".into());
        r.since = Some(Time(snap.now));
        return Verdict {
            violating,
            ..Verdict::new(r)
        };
    }
    if let Some((node, reason, message)) = probe_failed {
        let mut r = result(NAME, GateStatus::Failed, reason, message);
        r.node = Some(node.clone());
        r.observed = Some("not allocated".into());
        r.expected = Some(format!(
            "allocated on the node within {}s",
            timeout.as_secs()
        ));
        r.since = Some(Time(snap.now));
        return Verdict {
            violating: [node].into(),
            ..Verdict::new(r)
        };
    }
    if !awaiting.is_empty() || snap.nodes.is_empty() {
        let message = if awaiting.is_empty() {
            "no node of the rollout to judge yet".to_string()
        } else {
            format!(
                "waiting for the new driver pod to be Ready, the workloads to be listed and its ResourceSlices published after that on {}",
                list_some(&awaiting)
            )
        };
        return Verdict::new(result(NAME, GateStatus::Pending, "AwaitingPods", message));
    }
    if !probing.is_empty() {
        let names: Vec<&str> = probing.iter().map(|(n, _, _)| n.as_str()).collect();
        let said = probing
            .iter()
            .find_map(|(n, s, _)| s.as_ref().map(|s| format!(" (scheduler on {n}: {s})")))
            .unwrap_or_default();
        // Scheduling a probe takes a moment; one the scheduler refuses stops
        // further replacements while it may still come through.
        let violating = probing
            .iter()
            .filter(|(_, s, _)| s.is_some())
            .map(|(n, _, _)| n.clone())
            .collect();
        let next = probing
            .iter()
            .map(|(_, _, age)| timeout.saturating_sub(*age))
            .min()
            .unwrap_or(timeout);
        return Verdict {
            violating,
            recheck_after: Some(next),
            ..Verdict::new(result(
                NAME,
                GateStatus::Pending,
                "Probing",
                format!(
                    "waiting for the scheduler to allocate the probe claim on {}{said}",
                    list_some(&names)
                ),
            ))
        };
    }
    let probed = if gate.probe.is_some() {
        format!(
            "; the probe claim was allocated on all {} nodes",
            snap.nodes.len()
        )
    } else {
        String::new()
    };
    Verdict::new(result(
        NAME,
        GateStatus::Passed,
        "ClaimsIntact",
        format!(
            "{claims_seen} claim(s) of driver {} allocated before the restart are still allocated and their pods run{probed}",
            gate.driver
        ),
    ))
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::resource::v1::ResourceClaim;
    use saferollout_api::{ClaimProbe, NodeDevices};
    use serde_json::json;

    use super::super::test_support::*;
    use super::*;
    use crate::devices::test_objects::{claim, claim_pod};

    const D: &str = "gpu.example.com";

    fn gate(probe: bool) -> ClaimsGate {
        ClaimsGate {
            driver: D.into(),
            probe: probe.then(|| ClaimProbe::for_class(D)),
        }
    }

    fn with_claims(w: &mut World, node: &str, claims: &[&str]) {
        w.device_baseline.insert(
            node.into(),
            NodeDevices {
                claims: claims.iter().map(|c| c.to_string()).collect(),
                claims_total: claims.len() as i64,
                ..Default::default()
            },
        );
    }

    fn eval(w: &World, claims: &[ResourceClaim], pods: &[Pod], probes: &[Pod]) -> Verdict {
        let mut ev = DeviceEvidence {
            namespace: "work",
            ..Default::default()
        };
        ev.add_claims(claims);
        for n in &w.nodes {
            ev.pods_observed.insert(n.as_str());
        }
        for p in pods {
            let node = p.spec.as_ref().unwrap().node_name.as_deref().unwrap();
            ev.pods.entry(node).or_default().push(p);
        }
        ev.probes = probes.iter().collect();
        let g = gate(!probes.is_empty());
        w.with_devices(Some(&ev), |s| evaluate(&g, s, None))
    }

    #[test]
    fn another_namespaces_claims_are_judged_but_never_named() {
        let mut w = World::healthy(1, 8);
        let c = claim("tenant-b", "secret-project", D, Some("node-0"), Some("p1"));
        with_claims(&mut w, "node-0", &["uid:uid-tenant-b-secret-project"]);
        let mut failed = claim_pod("tenant-b", "p1", "node-0", "secret-project", "Failed");
        failed.status.as_mut().unwrap().message = Some(
            "NodePrepareResources failed for ResourceClaim secret-project: token=tenant-b-s3cr3t"
                .into(),
        );
        let v = eval(&w, std::slice::from_ref(&c), &[failed], &[]);
        assert_eq!(
            (v.result.status, v.result.reason.as_str()),
            (GateStatus::Failed, "ClaimPodFailed")
        );
        for hidden in ["tenant-b", "secret-project", "p1", "s3cr3t"] {
            assert!(!v.result.message.contains(hidden), "{}", v.result.message);
        }
        assert!(
            v.result.message.contains("another namespace"),
            "{}",
            v.result.message
        );
        // A lost allocation is found by UID and reported without a name.
        let mut gone = c.clone();
        gone.status = None;
        let v = eval(
            &w,
            &[gone],
            &[claim_pod(
                "tenant-b",
                "p1",
                "node-0",
                "secret-project",
                "Running",
            )],
            &[],
        );
        assert_eq!(v.result.reason, "ClaimDeallocated");
        assert!(
            !v.result.message.contains("secret-project"),
            "{}",
            v.result.message
        );
    }

    /// Judged alike whether the node's baseline names its claim or, past
    /// the status's budget of names, only counts it (the gate then judges
    /// the driver's claims allocated there now).
    #[test]
    fn surviving_claims_pass_and_a_failed_pod_fails_at_once() {
        for named in [true, false] {
            let mut w = World::healthy(1, 8);
            if named {
                with_claims(&mut w, "node-0", &["work/c1"]);
            } else {
                w.device_baseline.insert(
                    "node-0".into(),
                    NodeDevices {
                        claims_total: 1,
                        ..Default::default()
                    },
                );
            }
            let c = claim("work", "c1", D, Some("node-0"), Some("p1"));
            let ok = eval(
                &w,
                std::slice::from_ref(&c),
                &[claim_pod("work", "p1", "node-0", "c1", "Running")],
                &[],
            )
            .result;
            assert_eq!(
                (ok.status, ok.reason.as_str()),
                (GateStatus::Passed, "ClaimsIntact"),
                "named {named}: {ok:?}"
            );
            assert!(ok.message.starts_with("1 claim(s)"), "{}", ok.message);
            let mut failed = claim_pod("work", "p1", "node-0", "c1", "Failed");
            failed.status.as_mut().unwrap().message = Some(
                "NodePrepareResources failed for ResourceClaim c1: device gpu-0 not found in pool node-0 of driver gpu.example.com".into(),
            );
            let v = eval(&w, std::slice::from_ref(&c), &[failed], &[]);
            assert_eq!(
                (v.result.status, v.result.reason.as_str()),
                (GateStatus::Failed, "ClaimPodFailed"),
                "named {named}"
            );
            for said in ["NodePrepareResources failed", "claim work/c1"] {
                assert!(v.result.message.contains(said), "{}", v.result.message);
            }
            assert!(v.violating.contains("node-0"));
            // Without the pods of the node observed, it waits rather than passes.
            let mut ev = DeviceEvidence {
                namespace: "work",
                ..Default::default()
            };
            ev.add_claims(std::slice::from_ref(&c));
            let v = w.with_devices(Some(&ev), |s| evaluate(&gate(false), s, None));
            assert_ne!(
                v.result.status,
                GateStatus::Passed,
                "named {named}: {:?}",
                v.result
            );
        }
    }

    #[test]
    fn a_claim_deallocated_under_a_running_pod_fails_and_a_released_one_does_not() {
        let mut w = World::healthy(1, 8);
        with_claims(&mut w, "node-0", &["work/c1"]);
        let running = claim_pod("work", "p1", "node-0", "c1", "Running");
        let unallocated = claim("work", "c1", D, None, Some("p1"));
        let r = eval(&w, &[unallocated], &[running], &[]).result;
        assert_eq!(r.reason, "ClaimDeallocated");
        // The user deleted pod and claim: nothing lost.
        let r = eval(&w, &[], &[], &[]).result;
        assert_eq!(r.status, GateStatus::Passed);
    }

    fn probe(node: &str, bound: bool, scheduler: Option<&str>, created: i64) -> Pod {
        let mut status = json!({"phase": "Pending"});
        if let Some(m) = scheduler {
            status["conditions"] = json!([{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": m}]);
        }
        let mut spec = json!({"containers": [{"name": "probe"}],
            "resourceClaims": [{"name": "gpu", "resourceClaimName": format!("probe-{node}")}]});
        if bound {
            spec["nodeName"] = json!(node);
        }
        serde_json::from_value(json!({
            "metadata": {"name": format!("probe-{node}"), "namespace": "ns",
                "creationTimestamp": Time(ts(created)),
                "annotations": {PROBE_NODE_ANNOTATION: node, PROBE_REVISION_ANNOTATION: "new"}},
            "spec": spec, "status": status
        }))
        .unwrap()
    }

    #[test]
    fn a_probe_passes_once_the_scheduler_allocates_it_on_the_node() {
        let w = World::healthy(2, 8);
        let g = gate(true);
        let run = |claims: &[ResourceClaim], probes: &[Pod], w: &World| {
            let mut ev = DeviceEvidence::default();
            ev.add_claims(claims);
            ev.probes = probes.iter().collect();
            w.with_devices(Some(&ev), |s| (evaluate(&g, s, None), probes_passed(&g, s)))
        };
        // No probe yet: pending, creation is the machine's job.
        let (v, passed) = run(&[], &[], &w);
        assert_eq!(v.result.reason, "Probing");
        assert!(passed.is_empty());
        // One allocated on node-0, one refused on node-1.
        let probes = [
            probe("node-0", true, None, 95),
            probe(
                "node-1",
                false,
                Some("0/4 nodes are available: 1 cannot allocate all claims."),
                95,
            ),
        ];
        let claims = [claim(
            "ns",
            "probe-node-0",
            D,
            Some("node-0"),
            Some("probe-node-0"),
        )];
        let (v, passed) = run(&claims, &probes, &w);
        assert_eq!(passed, ["node-0"]);
        assert_eq!(v.result.status, GateStatus::Pending);
        assert!(
            v.result.message.contains("cannot allocate all claims"),
            "{}",
            v.result.message
        );
        assert_eq!(v.violating.iter().collect::<Vec<_>>(), ["node-1"]);
        // After the timeout (2 minutes), the scheduler's message is the failure's.
        let mut late = w;
        late.now = ts(300);
        let (v, _) = run(&claims, &probes, &late);
        assert_eq!(
            (v.result.status, v.result.reason.as_str()),
            (GateStatus::Failed, "ProbeNotAllocated")
        );
        assert_eq!(v.result.node.as_deref(), Some("node-1"));
        assert!(
            v.result.message.contains("cannot allocate all claims"),
            "{}",
            v.result.message
        );
        // Probed nodes pass without a probe.
        let mut done = World::healthy(2, 8);
        done.probed = ["node-0".to_string(), "node-1".to_string()].into();
        let (v, _) = run(&[], &[], &done);
        assert_eq!(v.result.status, GateStatus::Passed, "{:?}", v.result);
    }

    #[test]
    fn intact_claims_pass_only_once_the_new_driver_published_and_losses_fail_regardless() {
        use crate::devices::test_objects::{slice, written_at};
        let mut w = World::healthy(1, 8);
        w.pod("node-0").ready_since = Some(ts(100));
        with_claims(&mut w, "node-0", &["work/c1"]);
        let c = claim("work", "c1", D, Some("node-0"), Some("p1"));
        let running = claim_pod("work", "p1", "node-0", "c1", "Running");
        let judge = |published_at: i64, pod: &Pod| {
            let s = written_at(slice("node-0", D, 1, 1, &[("gpu-0", false)]), published_at);
            let mut ev = DeviceEvidence {
                namespace: "work",
                ..Default::default()
            };
            ev.add_claims([&c]);
            ev.add_slices([&s]);
            ev.pods_observed.insert("node-0");
            ev.pods.entry("node-0").or_default().push(pod);
            w.with_devices(Some(&ev), |s| evaluate(&gate(false), s, None))
                .result
        };
        // Intact, but the pool is still the old driver's: the new one has
        // done nothing yet that could have broken them.
        let r = judge(50, &running);
        assert_eq!(
            (r.status, r.reason.as_str()),
            (GateStatus::Pending, "AwaitingPods"),
            "{r:?}"
        );
        assert!(r.message.contains("published after that"), "{}", r.message);
        assert_eq!(judge(101, &running).status, GateStatus::Passed);
        // A failed claim pod fails at once, fresh publication or not.
        let failed = claim_pod("work", "p1", "node-0", "c1", "Failed");
        let r = judge(50, &failed);
        assert_eq!(
            (r.status, r.reason.as_str()),
            (GateStatus::Failed, "ClaimPodFailed")
        );
    }
}
