//! What the device gates add to the machine: baselines of the gated DRA
//! driver, the claims probes, and the failure policies that stop instead of
//! reverting (`onFailure: Quarantine | Halt`).
//!
//! Probes and quarantine objects are re-derived on every pass from status
//! and the cluster ([`sync`]): the ones status calls for and the cluster
//! lacks are created, the ones the cluster has and status does not call for
//! are deleted, all named deterministically, so a lost or repeated action is
//! harmless.
//!
//! - A probe exists only for a node of the stage under way whose new driver
//!   pod is Ready and whose probe has not passed yet; a passed node is
//!   recorded in the stage and its probe deleted; anything else (a passed,
//!   failed or abandoned stage, another revision) has none.
//! - A quarantine exists while `status.stopped` records one: a
//!   DeviceTaintRule per failed node and pool (DRA), or a node taint (device
//!   plugin). A retry of the stopped revision clears `status.stopped`, and
//!   the next sync lifts it; deleting the SafeRollout lifts it too.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use saferollout_api::{
    NodeDevices, OnFailure, Phase, QUARANTINE_NODE_TAINT_PREFIX, QuarantineRecord,
    QuarantineTarget, QuarantinedPool, SafeRolloutStatus, StageState, StageStatus, StoppedRollout,
};
use sha2::{Digest, Sha256};

use super::{Action, Observed, phase};
use crate::devices::{capture, pool_state};
use crate::gates::{Snapshot, Verdict, claims};
use crate::views::live_pods;

/// A DeviceTaintRule that takes one node's pool of a driver out of service.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct QuarantineRule {
    pub name: String,
    pub node: String,
    pub driver: String,
    pub pool: String,
    /// NoSchedule or NoExecute.
    pub effect: String,
}

/// A taint on a node (device-plugin quarantine).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct NodeTaint {
    pub node: String,
    pub key: String,
    pub value: String,
    pub effect: String,
}

fn hex(parts: &[&str], len: usize) -> String {
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

/// The name of the claims probe (pod, and claim for a DeviceClass probe) of
/// `node` for `revision` of the rollout `rollout_id`.
pub fn probe_name(rollout_id: &str, revision: &str, node: &str) -> String {
    format!(
        "saferollout-probe-{}",
        hex(&[rollout_id, revision, node], 16)
    )
}

/// The name of the DeviceTaintRule quarantining `pool` of `driver` on `node`.
pub fn rule_name(rollout_id: &str, driver: &str, node: &str, pool: &str, effect: &str) -> String {
    format!(
        "saferollout-quarantine-{}",
        hex(&[rollout_id, driver, node, pool, effect], 16)
    )
}

/// The node taint key of a device-plugin quarantine of `rollout_id`.
pub fn taint_key(rollout_id: &str) -> String {
    format!("{QUARANTINE_NODE_TAINT_PREFIX}{rollout_id}")
}

/// A resource name as a label value (`example.com/gpu` -> `example.com_gpu`).
pub fn taint_value(resource: &str) -> String {
    let mut v: String = resource
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '_'
            }
        })
        .take(63)
        .collect();
    while v.ends_with(|c: char| !c.is_ascii_alphanumeric()) {
        v.pop();
    }
    v
}

/// The baseline of the gated DRA driver on `node`, when there is one to take.
pub(super) fn capture_baseline(o: &Observed, node: &str) -> Option<NodeDevices> {
    let driver = o.spec.device_driver()?;
    let ev = o.evidence.devices.filter(|e| e.unavailable.is_none())?;
    Some(capture(ev, node, driver))
}

/// A gate that says something worth an Event without failing (cleared
/// health taints): once, when its reason first says so.
pub(super) fn warn_once(
    actions: &mut Vec<Action>,
    previous: &[saferollout_api::GateResult],
    verdicts: &[Verdict],
) {
    for v in verdicts {
        let Some(message) = &v.warning else { continue };
        let said = previous.iter().any(|p| {
            p.gate == v.result.gate && p.reason == v.result.reason && p.status == v.result.status
        });
        if !said {
            phase::event(actions, true, &v.result.reason, message.clone());
        }
    }
}

/// Records the nodes whose claims probe passed in this pass.
pub(super) fn record_probes(o: &Observed, snapshot: &Snapshot, stage: &mut StageStatus) {
    let Some(gate) = o.spec.gates.as_ref().and_then(|g| g.claims.as_ref()) else {
        return;
    };
    let passed = claims::probes_passed(gate, snapshot);
    if passed.is_empty() {
        return;
    }
    stage.probed.extend(passed);
    stage.probed.sort();
    stage.probed.dedup();
}

/// `onFailure: Quarantine | Halt`: the revision is blocked (by the caller);
/// record what stops and what goes out of service, say so, and change
/// nothing more.
pub(super) fn stop(
    o: &Observed,
    st: &mut SafeRolloutStatus,
    actions: &mut Vec<Action>,
    target: &str,
    policy: OnFailure,
    message: String,
    nodes: Vec<String>,
) {
    let fresh = (policy == OnFailure::Quarantine)
        .then(|| quarantine_record(o, st, &nodes))
        .flatten();
    // A quarantine still in force (an earlier revision's, not retried) stays.
    let earlier = st.stopped.as_ref().and_then(|s| s.quarantine.clone());
    let quarantine = match (earlier, fresh) {
        (Some(mut e), Some(f)) if e.driver == f.driver && e.resource == f.resource => {
            e.nodes.extend(f.nodes);
            e.nodes.sort();
            e.nodes.dedup();
            e.pools.extend(f.pools);
            e.pools.sort();
            e.pools.dedup();
            e.skipped.extend(f.skipped);
            e.skipped.retain(|n| !e.nodes.contains(n));
            e.skipped.sort();
            e.skipped.dedup();
            e.effect = f.effect;
            Some(e)
        }
        (_, Some(f)) => Some(f),
        (e, None) => e,
    };
    let unseen = quarantine.as_ref().is_some_and(|q| q.driver.is_some())
        && o.evidence
            .devices
            .and_then(|e| e.quarantine_rules.as_ref())
            .is_none();
    let what = match (&quarantine, policy) {
        // Recorded, but nothing can be tainted: say so.
        (Some(q), _) if unseen => format!(
            "{}; but the cluster serves no DeviceTaintRule the operator can manage, so nothing is tainted",
            describe(q)
        ),
        (Some(q), _) => describe(q),
        (None, OnFailure::Quarantine) => "nothing to quarantine (no driver or resource)".into(),
        _ => "nothing else changes".into(),
    };
    let reason = if policy == OnFailure::Quarantine {
        "Quarantined"
    } else {
        "Halted"
    };
    phase::event(
        actions,
        true,
        reason,
        format!(
            "revision {target} stopped by onFailure: {}: {what}",
            policy.as_str()
        ),
    );
    st.stopped = Some(StoppedRollout {
        revision: target.to_string(),
        policy,
        message,
        nodes,
        stopped_at: Time(o.now),
        quarantine,
    });
    hold(o, st);
}

fn describe(q: &QuarantineRecord) -> String {
    let nodes = &q.nodes;
    let mut what = match (&q.driver, &q.resource) {
        (Some(d), _) if q.effect == saferollout_api::QuarantineEffect::None.as_str() => format!(
            "preview only (DeviceTaintRule effect None): the devices of driver {d} on node(s) {} stay in service; {}",
            crate::gates::list_some(nodes),
            if q.preview.is_empty() {
                "what NoExecute would evict is not reported yet".to_string()
            } else {
                format!("if the effect was NoExecute: {}", q.preview.join("; "))
            }
        ),
        (Some(d), _) => format!(
            "the devices of driver {d} on node(s) {} are out of service (DeviceTaintRule, {})",
            crate::gates::list_some(nodes),
            q.effect
        ),
        (_, Some(r)) => format!(
            "node(s) {} tainted for {r} ({})",
            crate::gates::list_some(nodes),
            q.effect
        ),
        _ => String::new(),
    };
    if nodes.is_empty() {
        what = format!(
            "nothing quarantined: the agent publishes nothing of {} on the failed node(s)",
            q.driver
                .as_deref()
                .or(q.resource.as_deref())
                .unwrap_or("it")
        );
    }
    if !q.skipped.is_empty() {
        what.push_str(&format!(
            "; not quarantined, since the agent publishes nothing of it there: {}",
            crate::gates::list_some(&q.skipped)
        ));
    }
    what
}

/// What a quarantine of `nodes` takes out of service, and only what this
/// rollout's agent publishes or advertises there: for a DRA driver, the
/// pools each node's baseline recorded (else those the driver publishes on
/// the node now); for a device plugin, nodes whose baseline or allocatable
/// lists the resource. A node with nothing of it is left out (and said so).
fn quarantine_record(
    o: &Observed,
    st: &SafeRolloutStatus,
    nodes: &[String],
) -> Option<QuarantineRecord> {
    let effect = o.spec.quarantine_effect().as_str().to_string();
    match o.spec.quarantine_target()? {
        QuarantineTarget::Resource(r) => {
            let advertises = |n: &String| {
                st.stages
                    .iter()
                    .any(|s| s.baseline.get(n).is_some_and(|b| b.get(&r).is_some()))
                    || o.nodes
                        .get(n.as_str())
                        .is_some_and(|v| v.allocatable.get(&r).is_some())
            };
            let (nodes, skipped) = nodes.iter().cloned().partition(advertises);
            Some(QuarantineRecord {
                effect,
                resource: Some(r),
                nodes,
                skipped,
                ..Default::default()
            })
        }
        QuarantineTarget::Driver(d) => {
            let mut pools = BTreeSet::new();
            let mut skipped = Vec::new();
            for n in nodes {
                let recorded: Vec<String> = st
                    .stages
                    .iter()
                    .filter_map(|s| s.device_baseline.get(n))
                    .flat_map(|b| b.pools.clone())
                    .collect();
                let published = o
                    .evidence
                    .devices
                    .map(|ev| pool_state(&ev.node_slices(n, &d), &d).pools)
                    .unwrap_or_default();
                let names = if !recorded.is_empty() {
                    recorded
                } else {
                    published
                };
                if names.is_empty() {
                    skipped.push(n.clone());
                }
                for pool in names {
                    pools.insert(QuarantinedPool {
                        node: n.clone(),
                        pool,
                    });
                }
            }
            let nodes = nodes
                .iter()
                .filter(|n| !skipped.contains(n))
                .cloned()
                .collect();
            Some(QuarantineRecord {
                effect,
                driver: Some(d),
                pools: pools.into_iter().collect(),
                nodes,
                skipped,
                ..Default::default()
            })
        }
    }
}

/// What the quarantine's DeviceTaintRules of effect `None` say a `NoExecute`
/// rule would evict (their `EvictionInProgress` condition: counts only),
/// `<node>/<pool>: <message>`, at most [`saferollout_api::devices::MAX_RECORDED`].
fn previews(o: &Observed, q: &QuarantineRecord) -> Vec<String> {
    let (Some(driver), Some(ev)) = (&q.driver, o.evidence.devices) else {
        return Vec::new();
    };
    if q.effect != saferollout_api::QuarantineEffect::None.as_str() {
        return Vec::new();
    }
    q.pools
        .iter()
        .filter_map(|p| {
            let name = rule_name(o.rollout_id, driver, &p.node, &p.pool, &q.effect);
            let message = ev.quarantine_previews.get(name.as_str())?;
            Some(format!(
                "{}/{}: {}",
                p.node,
                p.pool,
                crate::gates::proof::clean_line(message)
            ))
        })
        .take(saferollout_api::devices::MAX_RECORDED)
        .collect()
}

/// The DaemonSet carries the stopped revision: nothing more changes.
pub(super) fn hold(o: &Observed, st: &mut SafeRolloutStatus) {
    if let Some(q) = st.stopped.as_mut().and_then(|s| s.quarantine.as_mut()) {
        let seen = previews(o, q);
        // Kept once the cluster said it (the controller writes it once).
        if !seen.is_empty() {
            q.preview = seen;
        }
    }
    let Some(s) = st.stopped.clone() else { return };
    let (reason, what) = match (&s.quarantine, s.policy) {
        (Some(q), _) if s.policy == OnFailure::Quarantine => ("Quarantined", describe(q)),
        (None, OnFailure::Quarantine) => ("Quarantined", "nothing to quarantine".to_string()),
        _ => ("Halted", "nothing else changes".to_string()),
    };
    let msg = format!(
        "revision {} stopped by onFailure: {}: {}; {what}; no pod is replaced until a retry (kubectl saferollout retry) or a new template",
        s.revision,
        s.policy.as_str(),
        s.message
    );
    phase::stalled(st, o, Phase::Degraded, reason, msg);
}

/// The nodes a quarantine holds out of service (they are left alone, not
/// reported stuck).
pub fn quarantined_nodes(st: &SafeRolloutStatus) -> BTreeSet<&str> {
    st.stopped
        .iter()
        .flat_map(|s| s.quarantine.iter())
        .flat_map(|q| q.nodes.iter().map(String::as_str))
        .collect()
}

/// Probes and quarantine objects, re-derived from the status just decided
/// and the cluster.
pub(super) fn sync(o: &Observed, st: &SafeRolloutStatus, actions: &mut Vec<Action>) {
    sync_probes(o, st, actions);
    sync_quarantine(o, st, actions);
}

/// The probes the status calls for: node -> name.
fn wanted_probes(o: &Observed, st: &SafeRolloutStatus) -> BTreeMap<String, String> {
    let mut wanted = BTreeMap::new();
    if o.spec
        .gates
        .as_ref()
        .and_then(|g| g.claims.as_ref())
        .and_then(|c| c.probe.as_ref())
        .is_none()
        || st.phase != Some(Phase::Progressing)
    {
        return wanted;
    }
    let (Some(index), Some(target)) = (st.current_stage, st.target_revision.as_deref()) else {
        return wanted;
    };
    let under_way = st
        .stage(index)
        .is_some_and(|s| matches!(s.state, StageState::Replacing | StageState::Verifying));
    if !under_way {
        return wanted;
    }
    let held = st.stages.iter().filter(|s| s.index <= index);
    let probed: BTreeSet<&str> = held
        .clone()
        .flat_map(|s| s.probed.iter().map(String::as_str))
        .collect();
    for node in held.flat_map(|s| s.nodes.iter()) {
        let ready = live_pods(o.pods, node).any(|p| p.revision == target && p.running && p.ready);
        if ready && !probed.contains(node.as_str()) {
            wanted.insert(node.clone(), probe_name(o.rollout_id, target, node));
        }
    }
    wanted
}

fn sync_probes(o: &Observed, st: &SafeRolloutStatus, actions: &mut Vec<Action>) {
    let Some(ev) = o.evidence.devices.filter(|e| e.unavailable.is_none()) else {
        return;
    };
    let wanted = wanted_probes(o, st);
    let existing: BTreeSet<&str> = ev
        .probes
        .iter()
        .filter_map(|p| p.metadata.name.as_deref())
        .collect();
    let names: BTreeSet<&str> = wanted.values().map(String::as_str).collect();
    let revision = st.target_revision.clone().unwrap_or_default();
    for (node, name) in &wanted {
        if !existing.contains(name.as_str()) {
            actions.push(Action::CreateProbe {
                name: name.clone(),
                node: node.clone(),
                revision: revision.clone(),
            });
        }
    }
    let extra: Vec<String> = ev
        .probes
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter_map(|p| p.metadata.name.clone())
        .filter(|n| !names.contains(n.as_str()))
        .collect();
    if !extra.is_empty() {
        actions.push(Action::DeleteProbes { names: extra });
    }
}

fn sync_quarantine(o: &Observed, st: &SafeRolloutStatus, actions: &mut Vec<Action>) {
    let record = st.stopped.as_ref().and_then(|s| s.quarantine.as_ref());
    let mut rules = Vec::new();
    let mut taints = Vec::new();
    if let Some(q) = record {
        if let Some(driver) = &q.driver {
            for p in &q.pools {
                rules.push(QuarantineRule {
                    name: rule_name(o.rollout_id, driver, &p.node, &p.pool, &q.effect),
                    node: p.node.clone(),
                    driver: driver.clone(),
                    pool: p.pool.clone(),
                    effect: q.effect.clone(),
                });
            }
        }
        if let Some(resource) = &q.resource {
            for n in &q.nodes {
                taints.push(NodeTaint {
                    node: n.clone(),
                    key: taint_key(o.rollout_id),
                    value: taint_value(resource),
                    effect: q.effect.clone(),
                });
            }
        }
    }
    // Rules: only when the runtime can see them.
    let mut create_rules = Vec::new();
    let mut lift_rules = Vec::new();
    if let Some(existing) = o.evidence.devices.and_then(|e| e.quarantine_rules.as_ref()) {
        let wanted: BTreeSet<&str> = rules.iter().map(|r| r.name.as_str()).collect();
        create_rules = rules
            .iter()
            .filter(|r| !existing.contains(r.name.as_str()))
            .cloned()
            .collect();
        lift_rules = existing
            .iter()
            .filter(|n| !wanted.contains(*n))
            .map(|n| n.to_string())
            .collect();
    }
    // Node taints: the nodes show them.
    let key = taint_key(o.rollout_id);
    let present: BTreeSet<NodeTaint> = o
        .nodes
        .values()
        .flat_map(|n| {
            n.taints.iter().filter(|t| t.key == key).map(|t| NodeTaint {
                node: n.name.to_string(),
                key: t.key.clone(),
                value: t.value.clone().unwrap_or_default(),
                effect: t.effect.clone(),
            })
        })
        .collect();
    let wanted_taints: BTreeSet<NodeTaint> = taints
        .into_iter()
        .filter(|t| o.nodes.contains_key(t.node.as_str()))
        .collect();
    let add_taints: Vec<NodeTaint> = wanted_taints.difference(&present).cloned().collect();
    let lift_taints: Vec<NodeTaint> = present
        .difference(&wanted_taints)
        // A taint being replaced (another effect) is written over, not lifted.
        .filter(|t| !add_taints.iter().any(|a| a.node == t.node))
        .cloned()
        .collect();
    if !create_rules.is_empty() || !add_taints.is_empty() {
        actions.push(Action::Quarantine {
            rules: create_rules,
            taints: add_taints,
        });
    }
    if !lift_rules.is_empty() || !lift_taints.is_empty() {
        actions.push(Action::LiftQuarantine {
            rules: lift_rules,
            taints: lift_taints,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_deterministic_and_valid() {
        let a = probe_name("ns.sr", "rev1", "node-0");
        assert_eq!(a, probe_name("ns.sr", "rev1", "node-0"));
        assert_ne!(a, probe_name("ns.sr", "rev2", "node-0"));
        assert_ne!(a, probe_name("ns.sr", "rev1", "node-1"));
        assert!(
            a.len() <= 63 && saferollout_api::validate::is_dns1123_subdomain(&a),
            "{a}"
        );
        let r = rule_name("ns.sr", "gpu.example.com", "node-0", "node-0", "NoSchedule");
        assert_ne!(
            r,
            rule_name("ns.sr", "gpu.example.com", "node-0", "node-0", "NoExecute")
        );
        assert!(saferollout_api::validate::is_dns1123_subdomain(&r), "{r}");
        assert_eq!(taint_value("example.com/gpu"), "example.com_gpu");
        assert_eq!(taint_key("ns.sr"), "quarantine.saferollout.dev/ns.sr");
    }
}
