//! probe: proves that a node's devices serve a workload. Once a stage
//! node's new agent is Ready and no other gate finds anything wrong there,
//! a short-lived pod built from the gate's allow-listed fields, pinned to
//! the node and asking for one device, must be scheduled and reach `Succeeded` within `timeout`.
//! A Ready plugin that advertises nothing leaves the probe unschedulable
//! (`Insufficient example.com/gpu`); one whose devices do not work makes it
//! fail (exit code, last log lines).
//!
//! The verdict per node is kept in status (`stages[].probes`): the probe pod
//! is named there before it exists, created idempotently (its name is
//! derived from the rollout, revision, node and stage start), and deleted as
//! soon as its verdict is recorded. Which probe pods may exist is re-derived
//! on every pass ([`alive`]): the pending probes of the current stage of a
//! rollout in progress; every other probe pod of the rollout is deleted, so
//! no probe outlives its stage (see `rollout::decide`).
//!
//! Sampling: the first stage (the canary) is probed in full; each later
//! stage probes `sample` of its own nodes (a count or a percentage, rounded
//! up), picked by a hash of revision and node so the pick is stable.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{
    Affinity, Capabilities, Container, EnvVar, NodeAffinity, NodeSelector, NodeSelectorRequirement,
    NodeSelectorTerm, Pod, PodResourceClaim, PodSecurityContext, PodSpec,
    ResourceClaim as ContainerClaim, ResourceRequirements, SeccompProfile, SecurityContext, Taint,
    Toleration,
};
use k8s_openapi::api::resource::v1::{
    DeviceClaim, DeviceRequest, ExactDeviceRequest, ResourceClaimSpec, ResourceClaimTemplate,
    ResourceClaimTemplateSpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use saferollout_api::{
    GATE_PROBE, GateStatus, MANAGED_BY, MANAGED_BY_LABEL, PROBE_NODE_LABEL, PROBE_REVISION_LABEL,
    ProbeGate, ProbeRecord, ROLLOUT_LABEL, STAGE_LABEL, StageStatus, resolve_count,
};
use sha2::{Digest, Sha256};

use super::proof::{ProbePod, clean_line};
use super::{Snapshot, Verdict, elapsed, list_some, result, soak};
use crate::eligibility::tolerates;

pub const NAME: &str = GATE_PROBE;

/// A probe pod to create.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct ProbeRequest {
    pub name: String,
    pub node: String,
    pub stage: usize,
    /// The revision the probe proves.
    pub revision: String,
}

/// The probe gate's judgement of one pass.
#[derive(Debug, Clone)]
pub struct ProbeStep {
    pub verdict: Verdict,
    /// Probe pods to create (their records are already in status).
    pub create: Vec<ProbeRequest>,
}

fn short_hash(parts: &[&str], len: usize) -> String {
    let mut h = Sha256::new();
    for p in parts {
        h.update(p.as_bytes());
        h.update([0]);
    }
    h.finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<String>()[..len]
        .to_string()
}

/// The probe pod's name: `<rollout>-probe-<hash of rollout, revision, node,
/// stage start>` (a retried revision probes afresh), at most 63 characters.
pub fn probe_name(rollout_id: &str, revision: &str, node: &str, stage_started: &str) -> String {
    let base = rollout_id
        .split_once('.')
        .map(|(_, name)| name)
        .unwrap_or(rollout_id);
    let base: String = base
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .take(40)
        .collect();
    let base = base.trim_matches('-');
    let hash = short_hash(&[rollout_id, revision, node, stage_started], 10);
    if base.is_empty() {
        format!("probe-{hash}")
    } else {
        format!("{base}-probe-{hash}")
    }
}

/// The nodes of one stage that are probed (sorted).
pub fn sampled(gate: &ProbeGate, stage: &StageStatus, revision: &str) -> Vec<String> {
    let nodes = &stage.nodes;
    if stage.index == 0 || nodes.is_empty() {
        return nodes.clone();
    }
    let k = match &gate.sample {
        None => nodes.len(),
        Some(s) => resolve_count(s, nodes.len(), true)
            .unwrap_or(nodes.len())
            .clamp(1, nodes.len()),
    };
    let mut by_hash: Vec<(String, &String)> = nodes
        .iter()
        .map(|n| (short_hash(&[revision, n], 16), n))
        .collect();
    by_hash.sort();
    let mut picked: Vec<String> = by_hash
        .into_iter()
        .take(k)
        .map(|(_, n)| n.clone())
        .collect();
    picked.sort();
    picked
}

fn timeout(gate: &ProbeGate) -> Duration {
    gate.timeout.to_std().unwrap_or(Duration::from_secs(120))
}

fn delay(gate: &ProbeGate) -> Duration {
    gate.delay.to_std().unwrap_or(Duration::from_secs(5))
}

/// Reason of a probe record whose pod is not asked for yet (the delay runs).
pub const WAITING: &str = "Waiting";

/// What a probe pod shows, judged: `Some(record)` once decided.
fn judge_pod(pod: &ProbePod) -> Option<(GateStatus, &'static str, String)> {
    let tail = pod
        .log_tail
        .as_deref()
        .filter(|t| !t.is_empty())
        .map(|t| format!("; last log lines: {t}"))
        .unwrap_or_default();
    match pod.phase.as_str() {
        "Succeeded" => Some((
            GateStatus::Passed,
            "Succeeded",
            format!(
                "probe pod {} succeeded on node {} (exit code {})",
                pod.name,
                pod.node,
                pod.exit_code.unwrap_or(0)
            ),
        )),
        "Failed" => {
            let code = pod
                .exit_code
                .map(|c| format!("exit code {c}"))
                .unwrap_or_else(|| "no exit code".into());
            let why = [
                pod.terminated_reason.as_deref(),
                pod.terminated_message.as_deref(),
                pod.message.as_deref(),
            ]
            .into_iter()
            .flatten()
            .map(clean_line)
            .collect::<Vec<_>>()
            .join(": ");
            let why = if why.is_empty() {
                String::new()
            } else {
                format!(" ({why})")
            };
            Some((
                GateStatus::Failed,
                "ProbeFailed",
                format!(
                    "probe pod {} failed on node {}: {code}{why}{tail}",
                    pod.name, pod.node
                ),
            ))
        }
        _ => None,
    }
}

/// Where a pending probe stands, for its message.
fn pending_state(pod: Option<&ProbePod>) -> (String, bool) {
    match pod {
        None => ("not created yet".into(), false),
        Some(p) => match &p.unschedulable {
            Some((reason, message)) => (format!("{reason}: {}", clean_line(message)), true),
            None => match &p.waiting_reason {
                Some(w) => (format!("{} ({w})", p.phase), false),
                None => (p.phase.clone(), false),
            },
        },
    }
}

/// Judges the probes of every node the rollout holds, updates the records
/// of `stages` (those up to `index`; new ones go to stage `index`), and asks
/// for the probe pods still missing. `others` are the other gates' verdicts:
/// a node one of them finds violating is not probed (it fails on its own).
pub fn step(
    gate: &ProbeGate,
    snap: &Snapshot,
    stages: &mut [StageStatus],
    index: usize,
    rollout_id: &str,
    others: &[Verdict],
) -> ProbeStep {
    let revision = snap.target_revision;
    let limit = timeout(gate);
    let held: BTreeSet<&str> = snap.nodes.iter().copied().collect();
    let violating = super::violating_nodes(others);
    let observed: BTreeMap<&str, &ProbePod> = snap
        .evidence
        .proof
        .map(|p| {
            p.probe_pods
                .iter()
                .filter(|p| !p.deleting)
                .map(|p| (p.name.as_str(), p))
                .collect()
        })
        .unwrap_or_default();
    let errors = snap.evidence.proof.map(|p| &p.probe_errors);
    // The nodes to probe, by stage.
    let mut wanted: Vec<(usize, String)> = Vec::new();
    for s in stages.iter().filter(|s| s.index as usize <= index) {
        for n in sampled(gate, s, revision) {
            if held.contains(n.as_str()) {
                wanted.push((s.index as usize, n));
            }
        }
    }
    // A pending probe of a node no longer probed (let go, or out of the
    // sample since nodes joined) is abandoned: its pod is deleted.
    let wanted_nodes: BTreeSet<&str> = wanted.iter().map(|(_, n)| n.as_str()).collect();
    for s in stages.iter_mut().filter(|s| s.index as usize <= index) {
        s.probes
            .retain(|r| r.status != GateStatus::Pending || wanted_nodes.contains(r.node.as_str()));
    }
    let current_started = stages
        .iter()
        .find(|s| s.index as usize == index)
        .and_then(|s| s.started_at.as_ref())
        .map(|t| t.0.to_string())
        .unwrap_or_default();

    let mut create = Vec::new();
    let mut recheck: Option<Duration> = None;
    let mut passed = Vec::new();
    let mut failed: Vec<ProbeRecord> = Vec::new();
    let mut running: Vec<String> = Vec::new();
    let mut awaiting: Vec<String> = Vec::new();
    let mut stuck: BTreeSet<String> = BTreeSet::new();
    for (_, node) in &wanted {
        // The node's record, wherever it was made.
        let found = stages.iter().enumerate().find_map(|(si, s)| {
            s.probes
                .iter()
                .position(|r| &r.node == node)
                .filter(|_| s.index as usize <= index)
                .map(|ri| (si, ri))
        });
        let (si, ri) = if let Some(found) = found {
            found
        } else {
            let ready = snap.target_pod(node).is_some_and(|p| p.running && p.ready);
            if !ready || violating.contains(node) || snap.node(node).is_none() {
                awaiting.push(node.clone());
                continue;
            }
            let name = probe_name(rollout_id, revision, node, &current_started);
            let record = ProbeRecord {
                node: node.clone(),
                pod: name.clone(),
                status: GateStatus::Pending,
                reason: WAITING.into(),
                message: format!(
                    "probe pod {name} on node {node} is created {} after the agent is Ready",
                    gate.delay.as_str()
                ),
                // Whole seconds, rounded up, as the status keeps them: the
                // delay lasts at least as long as it says (`soak::since`).
                since: Time(soak::whole_second_up(snap.now)),
            };
            let pos = stages
                .iter()
                .position(|s| s.index as usize == index)
                .expect("the current stage is recorded");
            stages[pos].probes.push(record);
            stages[pos].probes.sort_by(|a, b| a.node.cmp(&b.node));
            let pos_in = stages[pos]
                .probes
                .iter()
                .position(|r| &r.node == node)
                .expect("just recorded");
            (pos, pos_in)
        };
        let stage_of_record = stages[si].index as usize;
        let record = &mut stages[si].probes[ri];
        // The delay: the pod is asked for once it has passed (the timeout
        // counts from then).
        if record.status == GateStatus::Pending && record.reason == WAITING {
            let ready = snap.target_pod(node).is_some_and(|p| p.running && p.ready);
            if !ready || violating.contains(node) {
                // The delay starts again once the node is fit again.
                record.since = Time(soak::whole_second_up(snap.now));
                awaiting.push(node.clone());
                continue;
            }
            if let Some(left) = soak::remaining(record.since.0, snap.now, delay(gate)) {
                recheck = Some(recheck.map_or(left, |r| r.min(left)));
                running.push(node.clone());
                continue;
            }
            record.reason = "Created".into();
            record.message = format!("probe pod {} asked for on node {node}", record.pod);
            record.since = Time(soak::whole_second_up(snap.now));
            create.push(ProbeRequest {
                name: record.pod.clone(),
                node: node.clone(),
                stage: stage_of_record,
                revision: revision.to_string(),
            });
            running.push(node.clone());
            recheck = Some(recheck.map_or(limit, |r| r.min(limit)));
            continue;
        }
        if record.status == GateStatus::Pending {
            let pod = observed.get(record.pod.as_str()).copied();
            if let Some((status, reason, message)) = pod.and_then(judge_pod) {
                record.status = status;
                record.reason = reason.into();
                record.message = message;
            } else {
                let age = elapsed(record.since.0, snap.now);
                let (state, unschedulable) = pending_state(pod);
                if age >= limit {
                    let (reason, what) = match pod {
                        None => (
                            "NotCreated",
                            match errors.and_then(|e| e.get(&record.pod)) {
                                Some(e) => format!("never created: {}", clean_line(e)),
                                None => "never appeared".to_string(),
                            },
                        ),
                        Some(_) if unschedulable => {
                            ("Unschedulable", format!("was not scheduled: {state}"))
                        }
                        Some(_) => ("Timeout", format!("did not succeed: still {state}")),
                    };
                    record.status = GateStatus::Failed;
                    record.reason = reason.into();
                    record.message = format!(
                        "probe pod {} on node {} {what} after {}",
                        record.pod,
                        record.node,
                        gate.timeout.as_str()
                    );
                } else {
                    if pod.is_none() {
                        // Lost or not created yet: ask again (AlreadyExists is fine).
                        create.push(ProbeRequest {
                            name: record.pod.clone(),
                            node: record.node.clone(),
                            stage: stage_of_record,
                            revision: revision.to_string(),
                        });
                    }
                    let (reason, message) = if unschedulable {
                        (
                            "Unschedulable",
                            format!("probe pod {} on node {}: {state}", record.pod, record.node),
                        )
                    } else {
                        (
                            "Running",
                            format!("probe pod {} on node {}: {state}", record.pod, record.node),
                        )
                    };
                    record.reason = reason.into();
                    record.message = message;
                    let left = soak::remaining(record.since.0, snap.now, limit).unwrap_or_default();
                    recheck = Some(recheck.map_or(left, |r| r.min(left)));
                    if unschedulable {
                        stuck.insert(node.clone());
                    }
                }
            }
        }
        let record = &stages[si].probes[ri];
        match record.status {
            GateStatus::Passed => passed.push(node.clone()),
            GateStatus::Failed => failed.push(record.clone()),
            GateStatus::Pending => running.push(node.clone()),
        }
    }

    let total = wanted.len();
    let verdict = if let Some(first) = failed.first() {
        let mut r = result(
            NAME,
            GateStatus::Failed,
            &first.reason,
            first.message.clone(),
        );
        r.node = Some(first.node.clone());
        r.observed = Some(first.reason.clone());
        r.expected = Some("Succeeded".into());
        r.since = Some(Time(snap.now));
        Verdict {
            violating: failed.iter().map(|f| f.node.clone()).collect(),
            ..Verdict::new(r)
        }
    } else if total > 0 && passed.len() == total {
        Verdict::new(result(
            NAME,
            GateStatus::Passed,
            "ProbesSucceeded",
            format!("probe pods succeeded on all {total} probed nodes"),
        ))
    } else {
        let mut parts = vec![format!("{}/{total} probes succeeded", passed.len())];
        if !running.is_empty() {
            parts.push(format!("running on {}", list_some(&running)));
        }
        if !awaiting.is_empty() {
            parts.push(format!(
                "waiting for a Ready agent the other gates accept on {}",
                list_some(&awaiting)
            ));
        }
        let message = parts.join("; ");
        if snap.deadline_passed() {
            let mut r = result(
                NAME,
                GateStatus::Failed,
                "ProgressDeadlineExceeded",
                format!("no progress before the deadline: {message}"),
            );
            r.node = running.first().or(awaiting.first()).cloned();
            Verdict::new(r)
        } else {
            Verdict {
                // A probe the scheduler cannot place stops further replacements.
                violating: stuck,
                recheck_after: recheck.map(|r| r.max(Duration::from_millis(200))),
                ..Verdict::new(result(NAME, GateStatus::Pending, "Probing", message))
            }
        }
    };
    ProbeStep { verdict, create }
}

/// The probe pods that may exist after a pass: the pending probes of the
/// current stage of a rollout in progress. Every other probe pod of the
/// rollout is deleted.
pub fn alive(status: &saferollout_api::SafeRolloutStatus) -> BTreeSet<String> {
    use saferollout_api::Phase;
    let rolling = matches!(status.phase, Some(Phase::Progressing | Phase::Paused));
    let Some(current) = status.current_stage.filter(|_| rolling) else {
        return BTreeSet::new();
    };
    status
        .stages
        .iter()
        .filter(|s| s.index <= current)
        .flat_map(|s| s.probes.iter())
        .filter(|r| r.status == GateStatus::Pending)
        .map(|r| r.pod.clone())
        .collect()
}

/// Everything the probe pod is built from besides the gate.
pub struct ProbePodParams<'a> {
    pub name: &'a str,
    pub namespace: &'a str,
    pub node: &'a str,
    pub stage: usize,
    pub revision: &'a str,
    pub rollout_id: &'a str,
    pub owner: OwnerReference,
    /// The agent template's tolerations.
    pub agent_tolerations: &'a [Toleration],
    /// The node's taints.
    pub node_taints: &'a [Taint],
    /// DRA: the ResourceClaimTemplate the probe claims its device through.
    pub claim_template: Option<&'a str>,
}

/// The claim name inside the probe pod (DRA).
pub const PROBE_CLAIM: &str = "device";

/// The user the probe container runs as (unless privileged): `nobody`.
pub const PROBE_USER: i64 = 65534;

/// Builds the probe pod from the gate's allow-listed fields; everything else
/// is the operator's: no service-account token, no host namespaces, no
/// volumes, non-root with every capability dropped (root and privileged only
/// for `privileged`, which the operator refuses unless allowed), pinned to
/// the node by a required node affinity, one device, the node's taints the
/// agent tolerates.
pub fn probe_pod(gate: &ProbeGate, p: &ProbePodParams) -> Result<Pod, String> {
    let mut labels = gate.labels.clone();
    labels.insert(MANAGED_BY_LABEL.into(), MANAGED_BY.into());
    labels.insert(ROLLOUT_LABEL.into(), p.rollout_id.into());
    labels.insert(PROBE_NODE_LABEL.into(), label_value(p.node));
    labels.insert(PROBE_REVISION_LABEL.into(), p.revision.into());
    labels.insert(STAGE_LABEL.into(), p.stage.to_string());
    let meta = ObjectMeta {
        name: Some(p.name.into()),
        namespace: Some(p.namespace.into()),
        labels: Some(labels),
        owner_references: Some(vec![p.owner.clone()]),
        ..Default::default()
    };
    // Pinned by the scheduler, so it decides (and reports Insufficient ...).
    let pin = NodeSelectorRequirement {
        key: "metadata.name".into(),
        operator: "In".into(),
        values: Some(vec![p.node.into()]),
    };
    let affinity = Affinity {
        node_affinity: Some(NodeAffinity {
            required_during_scheduling_ignored_during_execution: Some(NodeSelector {
                node_selector_terms: vec![NodeSelectorTerm {
                    match_fields: Some(vec![pin]),
                    ..Default::default()
                }],
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    // The user's tolerations (the operator refuses those the agent lacks),
    // then the node's taints the agent tolerates, tolerated exactly.
    let mut tolerations = gate.tolerations.clone();
    for taint in p
        .node_taints
        .iter()
        .filter(|t| t.effect != "PreferNoSchedule")
    {
        if p.agent_tolerations.iter().any(|t| tolerates(t, taint))
            && !tolerations.iter().any(|t| tolerates(t, taint))
        {
            tolerations.push(Toleration {
                key: Some(taint.key.clone()),
                operator: Some(
                    if taint.value.is_some() {
                        "Equal"
                    } else {
                        "Exists"
                    }
                    .into(),
                ),
                value: taint.value.clone(),
                effect: Some(taint.effect.clone()),
                toleration_seconds: None,
            });
        }
    }
    let (requests, limits) = gate
        .resources
        .as_ref()
        .map(|r| (r.requests.clone(), r.limits.clone()))
        .unwrap_or_default();
    let mut resources = ResourceRequirements {
        requests: (!requests.is_empty()).then_some(requests),
        limits: (!limits.is_empty()).then_some(limits),
        ..Default::default()
    };
    let mut pod_claims = None;
    match (&gate.resource, p.claim_template) {
        (Some(resource), _) => {
            resources
                .limits
                .get_or_insert_with(Default::default)
                .insert(resource.clone(), Quantity("1".into()));
            if let Some(req) = resources.requests.as_mut() {
                req.insert(resource.clone(), Quantity("1".into()));
            }
        }
        (None, Some(template)) => {
            resources.claims = Some(vec![ContainerClaim {
                name: PROBE_CLAIM.into(),
                request: None,
            }]);
            pod_claims = Some(vec![PodResourceClaim {
                name: PROBE_CLAIM.into(),
                resource_claim_template_name: Some(template.into()),
                resource_claim_name: None,
            }]);
        }
        (None, None) => {
            return Err("spec.gates.probe needs resource or deviceClassName".into());
        }
    }
    // Non-root with nothing more than the device, unless privileged (root,
    // every device and capability: only when the operator allows it).
    let mut pod_security = PodSecurityContext {
        supplemental_groups: (!gate.supplemental_groups.is_empty())
            .then(|| gate.supplemental_groups.clone()),
        seccomp_profile: Some(SeccompProfile {
            type_: "RuntimeDefault".into(),
            localhost_profile: None,
        }),
        ..Default::default()
    };
    let container_security = if gate.privileged {
        SecurityContext {
            privileged: Some(true),
            ..Default::default()
        }
    } else {
        pod_security.run_as_non_root = Some(true);
        pod_security.run_as_user = Some(PROBE_USER);
        pod_security.run_as_group = Some(PROBE_USER);
        SecurityContext {
            privileged: Some(false),
            allow_privilege_escalation: Some(false),
            capabilities: Some(Capabilities {
                drop: Some(vec!["ALL".into()]),
                add: None,
            }),
            ..Default::default()
        }
    };
    let container = Container {
        name: PROBE_CONTAINER.into(),
        image: Some(gate.image.clone()),
        command: (!gate.command.is_empty()).then(|| gate.command.clone()),
        args: (!gate.args.is_empty()).then(|| gate.args.clone()),
        env: (!gate.env.is_empty()).then(|| {
            gate.env
                .iter()
                .map(|e| EnvVar {
                    name: e.name.clone(),
                    value: Some(e.value.clone()),
                    value_from: None,
                })
                .collect()
        }),
        resources: Some(resources),
        security_context: Some(container_security),
        ..Default::default()
    };
    let timeout_secs = gate
        .timeout
        .to_std()
        .ok()
        .map(|d| d.as_secs().max(1) as i64);
    let spec = PodSpec {
        containers: vec![container],
        restart_policy: Some("Never".into()),
        active_deadline_seconds: timeout_secs,
        automount_service_account_token: Some(false),
        enable_service_links: Some(false),
        host_network: Some(false),
        host_pid: Some(false),
        host_ipc: Some(false),
        affinity: Some(affinity),
        tolerations: (!tolerations.is_empty()).then_some(tolerations),
        security_context: Some(pod_security),
        resource_claims: pod_claims,
        ..Default::default()
    };
    Ok(Pod {
        metadata: meta,
        spec: Some(spec),
        status: None,
    })
}

/// The probe pod's one container.
pub const PROBE_CONTAINER: &str = "probe";

/// A node name as a label value (names longer than 63 are hashed).
pub fn label_value(node: &str) -> String {
    if node.len() <= 63 {
        node.to_string()
    } else {
        format!("{}-{}", &node[..40], short_hash(&[node], 16))
    }
}

/// The name of the ResourceClaimTemplate DRA probes claim through.
pub fn claim_template_name(rollout_id: &str, class: &str) -> String {
    probe_name(rollout_id, "claim", class, "")
}

/// The ResourceClaimTemplate of DRA probes: one device of `class`.
pub fn claim_template(
    gate: &ProbeGate,
    name: &str,
    namespace: &str,
    rollout_id: &str,
    owner: OwnerReference,
) -> Option<ResourceClaimTemplate> {
    let class = gate.device_class_name.as_ref()?;
    Some(ResourceClaimTemplate {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(namespace.into()),
            labels: Some(BTreeMap::from([
                (MANAGED_BY_LABEL.to_string(), MANAGED_BY.to_string()),
                (ROLLOUT_LABEL.to_string(), rollout_id.to_string()),
            ])),
            owner_references: Some(vec![owner]),
            ..Default::default()
        },
        spec: Some(ResourceClaimTemplateSpec {
            metadata: None,
            spec: Some(ResourceClaimSpec {
                devices: Some(DeviceClaim {
                    requests: Some(vec![DeviceRequest {
                        name: "gpu".into(),
                        exactly: Some(ExactDeviceRequest {
                            device_class_name: class.clone(),
                            count: Some(1),
                            allocation_mode: Some("ExactCount".into()),
                            ..Default::default()
                        }),
                        ..Default::default()
                    }]),
                    ..Default::default()
                }),
            }),
        }),
    })
}

/// When a probe asked for at `since` times out.
pub fn deadline(gate: &ProbeGate, since: Timestamp) -> Timestamp {
    since
        .checked_add(jiff::SignedDuration::try_from(timeout(gate)).unwrap_or_default())
        .unwrap_or(since)
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
    use serde_json::json;

    use super::super::proof::ProofEvidence;
    use super::super::test_support::*;
    use super::*;

    fn gate() -> ProbeGate {
        serde_json::from_value(json!({
            "image": "registry.example/cuda-vector-add:v1",
            "env": [{"name": "TOKEN", "value": "s3cr3t"}],
            "labels": {"sim.saferollout.dev/workload": "probe"},
            "resource": "example.com/gpu",
            "delay": "0s",
            "timeout": "20s",
        }))
        .unwrap()
    }

    fn stages(w: &World) -> Vec<StageStatus> {
        vec![StageStatus {
            index: 0,
            nodes: w.nodes.clone(),
            started_at: Some(Time(ts(0))),
            ..Default::default()
        }]
    }

    fn run(w: &World, st: &mut [StageStatus], pods: Vec<ProbePod>) -> ProbeStep {
        let ev = ProofEvidence {
            probe_pods: pods,
            ..Default::default()
        };
        w.with_proof(&ev, |s| step(&gate(), s, st, 0, "ns.plugin", &[]))
    }

    fn pod(name: &str, node: &str, phase: &str) -> ProbePod {
        ProbePod {
            name: name.into(),
            uid: format!("uid-{name}"),
            node: node.into(),
            phase: phase.into(),
            ..Default::default()
        }
    }

    #[test]
    fn a_ready_node_gets_one_probe_named_in_status_first() {
        let w = World::healthy(2, 8);
        let mut st = stages(&w);
        let s = run(&w, &mut st, vec![]);
        assert_eq!(s.verdict.result.status, GateStatus::Pending);
        assert_eq!(s.create.len(), 2);
        assert_eq!(st[0].probes.len(), 2);
        assert_eq!(st[0].probes[0].pod, s.create[0].name);
        assert!(
            s.create[0].name.starts_with("plugin-probe-"),
            "{}",
            s.create[0].name
        );
        // Asked again while it does not show: same name (idempotent create).
        let again = run(&w, &mut st, vec![]);
        assert_eq!(again.create, s.create);
        // Once it exists, nothing more is created.
        let pods: Vec<ProbePod> = s
            .create
            .iter()
            .map(|r| pod(&r.name, &r.node, "Running"))
            .collect();
        assert!(run(&w, &mut st, pods).create.is_empty());
    }

    #[test]
    fn success_on_every_node_passes_and_the_verdict_outlives_the_pod() {
        let w = World::healthy(2, 8);
        let mut st = stages(&w);
        let s = run(&w, &mut st, vec![]);
        let pods: Vec<ProbePod> = s
            .create
            .iter()
            .map(|r| pod(&r.name, &r.node, "Succeeded"))
            .collect();
        let v = run(&w, &mut st, pods).verdict;
        assert_eq!(v.result.status, GateStatus::Passed, "{:?}", v.result);
        // The pods are gone (deleted after the verdict): still passed, nothing recreated.
        let after = run(&w, &mut st, vec![]);
        assert_eq!(after.verdict.result.status, GateStatus::Passed);
        assert!(after.create.is_empty());
        let status = saferollout_api::SafeRolloutStatus {
            phase: Some(saferollout_api::Phase::Progressing),
            current_stage: Some(0),
            stages: st,
            ..Default::default()
        };
        assert!(alive(&status).is_empty(), "judged probes are deleted");
    }

    #[test]
    fn the_probe_is_created_only_after_the_delay_and_its_timeout_counts_from_then() {
        let mut w = World::healthy(1, 8);
        let g = ProbeGate {
            delay: "5s".into(),
            ..gate()
        };
        let mut st = stages(&w);
        let ev = ProofEvidence::default();
        let run = |w: &World, st: &mut Vec<StageStatus>| {
            w.with_proof(&ev, |s| step(&g, s, st, 0, "ns.plugin", &[]))
        };
        let s = run(&w, &mut st);
        assert!(s.create.is_empty());
        assert_eq!(st[0].probes[0].reason, WAITING);
        assert_eq!(s.verdict.recheck_after, Some(Duration::from_secs(5)));
        w.now = ts(105);
        let s = run(&w, &mut st);
        assert_eq!(s.create.len(), 1);
        assert_eq!(st[0].probes[0].since, Time(ts(105)));
        // A node that stops being fit restarts the delay.
        let mut st = stages(&w);
        run(&w, &mut st);
        w.pod("node-0").ready = false;
        w.now = ts(110);
        assert!(run(&w, &mut st).create.is_empty());
        w.pod("node-0").ready = true;
        w.now = ts(112);
        assert!(
            run(&w, &mut st).create.is_empty(),
            "only 2s since fit again"
        );
    }

    #[test]
    fn a_delay_read_back_from_the_status_lasts_its_full_length() {
        // Regression: the delay started at the pass's time, which the status
        // keeps as the whole second before: it ended up to a second early.
        let mut w = World::healthy(1, 8);
        let g = ProbeGate {
            delay: "5s".into(),
            ..gate()
        };
        let ev = ProofEvidence::default();
        let run = |w: &World, st: &mut Vec<StageStatus>| {
            w.with_proof(&ev, |s| step(&g, s, st, 0, "ns.plugin", &[]))
        };
        let start = ts(100) + jiff::SignedDuration::from_millis(600);
        w.now = start;
        let mut st = stages(&w);
        assert!(run(&w, &mut st).create.is_empty());
        let mut created_after = None;
        for ms in (100..=7_000).step_by(100) {
            st = as_stored(&st);
            w.now = start + jiff::SignedDuration::from_millis(ms);
            if !run(&w, &mut st).create.is_empty() {
                created_after = Some(ms);
                break;
            }
        }
        assert_eq!(created_after, Some(5_400), "at the whole second 5 s on");
    }

    #[test]
    fn a_failed_probe_fails_with_exit_code_message_and_log_tail() {
        let w = World::healthy(1, 8);
        let mut st = stages(&w);
        let s = run(&w, &mut st, vec![]);
        let mut p = pod(&s.create[0].name, "node-0", "Failed");
        p.exit_code = Some(1);
        p.terminated_reason = Some("Error".into());
        p.terminated_message = Some("device gpu-0 is Unhealthy".into());
        p.log_tail = Some("Test FAILED: device gpu-0 is Unhealthy".into());
        let v = run(&w, &mut st, vec![p]).verdict;
        assert_eq!(v.result.status, GateStatus::Failed);
        assert_eq!(v.result.reason, "ProbeFailed");
        assert_eq!(v.result.node.as_deref(), Some("node-0"));
        for part in ["exit code 1", "Unhealthy", "Test FAILED"] {
            assert!(v.result.message.contains(part), "{}", v.result.message);
        }
        assert!(v.violating.contains("node-0"));
    }

    #[test]
    fn an_unschedulable_probe_holds_then_fails_at_its_timeout_with_the_schedulers_message() {
        let mut w = World::healthy(1, 8);
        let mut st = stages(&w);
        let s = run(&w, &mut st, vec![]);
        let mut p = pod(&s.create[0].name, "node-0", "Pending");
        p.unschedulable = Some((
            "Unschedulable".into(),
            "0/4 nodes are available: 1 Insufficient example.com/gpu, 3 node(s) didn't match Pod's node affinity/selector.".into(),
        ));
        w.now = ts(110);
        let v = run(&w, &mut st, vec![p.clone()]).verdict;
        assert_eq!(v.result.status, GateStatus::Pending);
        assert!(
            v.violating.contains("node-0"),
            "no more replacements meanwhile"
        );
        assert_eq!(v.recheck_after, Some(Duration::from_secs(10)));
        w.now = ts(120);
        let v = run(&w, &mut st, vec![p]).verdict;
        assert_eq!(
            (v.result.status, v.result.reason.as_str()),
            (GateStatus::Failed, "Unschedulable")
        );
        assert!(
            v.result.message.contains("Insufficient example.com/gpu"),
            "{}",
            v.result.message
        );
    }

    #[test]
    fn nodes_not_ready_or_violating_another_gate_are_not_probed() {
        let mut w = World::healthy(2, 8);
        w.pod("node-0").ready = false;
        let mut st = stages(&w);
        let other = Verdict {
            violating: BTreeSet::from(["node-1".to_string()]),
            ..Verdict::new(result(
                "allocatable/x",
                GateStatus::Pending,
                "BelowMinimum",
                String::new(),
            ))
        };
        let ev = ProofEvidence::default();
        let s = w.with_proof(&ev, |s| step(&gate(), s, &mut st, 0, "ns.plugin", &[other]));
        assert!(s.create.is_empty());
        assert_eq!(s.verdict.result.status, GateStatus::Pending);
    }

    #[test]
    fn later_stages_probe_a_stable_sample_and_the_canary_in_full() {
        let g = ProbeGate {
            sample: Some(IntOrString::String("50%".into())),
            ..gate()
        };
        let canary = StageStatus {
            index: 0,
            nodes: vec!["a".into(), "b".into()],
            ..Default::default()
        };
        assert_eq!(sampled(&g, &canary, "r1").len(), 2);
        let later = StageStatus {
            index: 1,
            nodes: (0..10).map(|i| format!("n{i}")).collect(),
            ..Default::default()
        };
        let pick = sampled(&g, &later, "r1");
        assert_eq!(pick.len(), 5);
        assert_eq!(pick, sampled(&g, &later, "r1"), "stable");
        let one = ProbeGate {
            sample: Some(IntOrString::Int(1)),
            ..gate()
        };
        assert_eq!(sampled(&one, &later, "r1").len(), 1);
    }

    #[test]
    fn the_probe_pod_is_pinned_asks_for_one_device_and_tolerates_what_the_agent_tolerates() {
        let taints = vec![
            Taint {
                key: "example.com/gpu".into(),
                effect: "NoSchedule".into(),
                value: Some("present".into()),
                time_added: None,
            },
            Taint {
                key: "dedicated".into(),
                effect: "NoSchedule".into(),
                value: None,
                time_added: None,
            },
        ];
        let agent = vec![Toleration {
            key: Some("example.com/gpu".into()),
            operator: Some("Exists".into()),
            ..Default::default()
        }];
        let owner = OwnerReference {
            api_version: "saferollout.dev/v1alpha1".into(),
            kind: "SafeRollout".into(),
            name: "plugin".into(),
            uid: "u".into(),
            ..Default::default()
        };
        let params = ProbePodParams {
            name: "plugin-probe-x",
            namespace: "ns",
            node: "node-0",
            stage: 0,
            revision: "r1",
            rollout_id: "ns.plugin",
            owner,
            agent_tolerations: &agent,
            node_taints: &taints,
            claim_template: None,
        };
        let pod = probe_pod(&gate(), &params).unwrap();
        let v = serde_json::to_value(&pod).unwrap();
        assert_eq!(v["spec"]["restartPolicy"], "Never");
        assert_eq!(
            v["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
                ["nodeSelectorTerms"][0]["matchFields"][0]["values"][0],
            "node-0"
        );
        assert_eq!(
            v["spec"]["containers"][0]["resources"]["limits"]["example.com/gpu"],
            "1"
        );
        let tol = v["spec"]["tolerations"].as_array().unwrap();
        assert_eq!(tol.len(), 1, "only the taint the agent tolerates: {tol:?}");
        assert_eq!(tol[0]["key"], "example.com/gpu");
        assert_eq!(v["metadata"]["labels"][PROBE_NODE_LABEL], "node-0");
        assert_eq!(
            v["metadata"]["labels"]["sim.saferollout.dev/workload"],
            "probe"
        );
        assert_eq!(v["metadata"]["ownerReferences"][0]["kind"], "SafeRollout");
        assert_eq!(v["spec"]["activeDeadlineSeconds"], 20);
        // Everything beyond the allow-list is the operator's.
        assert_eq!(v["spec"]["automountServiceAccountToken"], false);
        assert!(v["spec"].get("serviceAccountName").is_none());
        for host in ["hostNetwork", "hostPID", "hostIPC"] {
            assert_eq!(v["spec"][host], false, "{host}");
        }
        assert!(v["spec"].get("volumes").is_none());
        assert_eq!(v["spec"]["securityContext"]["runAsNonRoot"], true);
        assert_eq!(v["spec"]["securityContext"]["runAsUser"], PROBE_USER);
        let c = &v["spec"]["containers"][0];
        assert_eq!(c["securityContext"]["privileged"], false);
        assert_eq!(c["securityContext"]["allowPrivilegeEscalation"], false);
        assert_eq!(c["securityContext"]["capabilities"]["drop"][0], "ALL");
        assert!(c.get("volumeMounts").is_none());
        assert_eq!(c["env"][0]["value"], "s3cr3t");
        // Privileged (only once the operator allows it): root, privileged.
        let privileged = ProbeGate {
            privileged: true,
            ..gate()
        };
        let v = serde_json::to_value(probe_pod(&privileged, &params).unwrap()).unwrap();
        assert_eq!(
            v["spec"]["containers"][0]["securityContext"]["privileged"],
            true
        );
        assert!(v["spec"]["securityContext"].get("runAsNonRoot").is_none());
        assert_eq!(v["spec"]["automountServiceAccountToken"], false);

        let dra = ProbeGate {
            resource: None,
            device_class_name: Some("gpu.sim.saferollout.dev".into()),
            ..gate()
        };
        let claim = claim_template_name("ns.plugin", "gpu.sim.saferollout.dev");
        let pod = probe_pod(
            &dra,
            &ProbePodParams {
                claim_template: Some(&claim),
                ..params
            },
        )
        .unwrap();
        let v = serde_json::to_value(&pod).unwrap();
        assert_eq!(
            v["spec"]["resourceClaims"][0]["resourceClaimTemplateName"],
            claim.as_str()
        );
        assert_eq!(
            v["spec"]["containers"][0]["resources"]["claims"][0]["name"],
            PROBE_CLAIM
        );
    }
}
