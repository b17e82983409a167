//! `spec.nodeMaintenance` against the API server: what a pass reads of the
//! nodes the rollout holds in maintenance (their pods, listed by node), and
//! the cordons, evictions and uncordons the decision asks for.
//!
//! - Pods are listed per marked node with a field selector
//!   (`spec.nodeName=`, which the API server's watch cache indexes), at
//!   most [`MAX_PODS_PER_NODE`] each, on every pass while a node is marked:
//!   no cluster-wide pod cache is kept for a drain of a few nodes at a time.
//! - Evictions go through the Eviction API with the pod's UID as a
//!   precondition; a refusal (429: a PodDisruptionBudget allows no
//!   disruption now) is remembered per pod, with the budget's own words,
//!   for the next pass's evidence (and forgotten once the pod is gone).
//! - A cordon writes `spec.unschedulable` and the rollout's
//!   `saferollout.dev/maintenance` mark in one merge patch; an uncordon is a
//!   JSON patch whose first operation tests that the mark is this
//!   rollout's, so a cordon someone else made is never lifted.

use std::collections::HashMap;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, EvictParams, ListParams, Patch, Preconditions};
use saferollout_api::{MAINTENANCE_LABEL, SafeRollout};
use saferollout_core::drain::{DrainEvidence, WorkloadPod};
use saferollout_core::rollout::EvictRef;
use serde_json::json;
use tracing::{info, warn};

use super::error::Result;
use super::writing::patch_params;
use super::{Context, RolloutKey};

/// Most pods listed on one node (a kubelet runs 110 by default).
const MAX_PODS_PER_NODE: u32 = 500;
/// Longest refusal message kept (the API server's, with its causes).
const MAX_REFUSAL: usize = 300;
/// Evictions in flight at once for one action.
const PARALLEL_EVICTIONS: usize = 16;

/// What this replica remembers of a rollout's evictions.
#[derive(Debug, Default)]
pub struct Memory {
    /// Per pod UID: why its last eviction was refused.
    refused: HashMap<String, String>,
}

/// The pods on the nodes carrying this rollout's maintenance mark, when
/// its `nodeMaintenance` drains.
pub async fn gather(sr: &SafeRollout, ctx: &Context, key: &RolloutKey) -> DrainEvidence {
    let mut evidence = DrainEvidence::default();
    let drains = sr
        .spec
        .node_maintenance
        .as_ref()
        .is_some_and(|m| m.cordon && m.drain.is_some());
    if !drains {
        return evidence;
    }
    let id = ctx.rollout_id(key);
    let marked: Vec<String> = ctx
        .caches
        .nodes_by_name()
        .iter()
        .filter(|n| {
            n.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(MAINTENANCE_LABEL))
                == Some(&id)
        })
        .filter_map(|n| n.metadata.name.clone())
        .collect();
    let api: Api<Pod> = Api::all(ctx.client.clone());
    let refused = ctx.memory(key, |m| std::mem::take(&mut m.drain.refused));
    let mut still_refused = HashMap::new();
    for node in marked {
        let params = ListParams::default()
            .fields(&format!("spec.nodeName={node}"))
            .limit(MAX_PODS_PER_NODE);
        match api.list(&params).await {
            Ok(list) => {
                let pods: Vec<WorkloadPod> = list
                    .items
                    .iter()
                    .map(|p| {
                        let mut w = workload(p);
                        if let Some(why) = refused.get(&w.uid) {
                            still_refused.insert(w.uid.clone(), why.clone());
                            w.refused = Some(why.clone());
                        }
                        w
                    })
                    .collect();
                evidence.nodes.insert(node, pods);
            }
            // Not listed: its drain is not judged done this pass.
            Err(e) => warn!(%node, error = %e, "listing the pods of a node in maintenance failed"),
        }
    }
    ctx.memory(key, |m| {
        // Refusals of pods still there (and any recorded meanwhile).
        for (uid, why) in still_refused {
            m.drain.refused.entry(uid).or_insert(why);
        }
    });
    evidence
}

/// What the drain reads of `pod`: no spec or status beyond its owner,
/// volumes' kinds and phase, and never its env.
fn workload(pod: &Pod) -> WorkloadPod {
    let meta = &pod.metadata;
    let controller = meta
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true))
        .map(|o| o.kind.clone());
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    WorkloadPod {
        namespace: meta.namespace.clone().unwrap_or_default(),
        name: meta.name.clone().unwrap_or_default(),
        uid: meta.uid.clone().unwrap_or_default(),
        labels: meta.labels.clone().unwrap_or_default(),
        controller,
        mirror: meta
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key("kubernetes.io/config.mirror")),
        finished: matches!(phase, Some("Succeeded" | "Failed")),
        terminating: meta.deletion_timestamp.is_some(),
        uses_empty_dir: pod
            .spec
            .as_ref()
            .and_then(|s| s.volumes.as_ref())
            .is_some_and(|v| v.iter().any(|v| v.empty_dir.is_some())),
        refused: None,
    }
}

/// Cordons `nodes` and marks them as this rollout's.
pub async fn cordon(ctx: &Context, key: &RolloutKey, nodes: &[String]) -> Result<()> {
    let id = ctx.rollout_id(key);
    let api: Api<Node> = Api::all(ctx.client.clone());
    let patch = json!({
        "metadata": {"labels": {MAINTENANCE_LABEL: id}},
        "spec": {"unschedulable": true},
    });
    for node in nodes {
        info!(ns = %key.0, %node, "cordoning the node before its agent is replaced");
        match ctx
            .write_slots
            .run(api.patch(node, &patch_params(), &Patch::Merge(&patch)))
            .await
        {
            Err(kube::Error::Api(s)) if s.code == 404 => {} // gone; the next pass notices
            r => {
                r?;
            }
        }
    }
    Ok(())
}

/// Uncordons `nodes`, each only while it carries this rollout's mark.
pub async fn uncordon(ctx: &Context, key: &RolloutKey, nodes: &[String]) -> Result<()> {
    let id = ctx.rollout_id(key);
    let api: Api<Node> = Api::all(ctx.client.clone());
    let mark = format!("/metadata/labels/{}", MAINTENANCE_LABEL.replace('/', "~1"));
    let ops = json!([
        {"op": "test", "path": mark, "value": id},
        {"op": "remove", "path": mark},
        {"op": "add", "path": "/spec/unschedulable", "value": false},
    ]);
    let patch: Patch<serde_json::Value> = Patch::Json(serde_json::from_value(ops)?);
    for node in nodes {
        info!(ns = %key.0, %node, "uncordoning the node");
        match ctx
            .write_slots
            .run(api.patch(node, &patch_params(), &patch))
            .await
        {
            // Gone, or no longer marked as ours: nothing of ours to lift.
            Err(kube::Error::Api(s)) if s.code == 404 || super::writing::is_failed_guard(&s) => {}
            r => {
                r?;
            }
        }
    }
    Ok(())
}

/// Evicts `pods` through the Eviction API, remembering refusals.
pub async fn evict(ctx: &Context, key: &RolloutKey, pods: &[EvictRef]) -> Result<()> {
    let evict = |p: &EvictRef| {
        let api: Api<Pod> = Api::namespaced(ctx.client.clone(), &p.namespace);
        let params = EvictParams {
            delete_options: Some(DeleteParams {
                preconditions: Some(Preconditions {
                    uid: Some(p.uid.clone()),
                    resource_version: None,
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let slots = ctx.write_slots.clone();
        let p = p.clone();
        async move {
            let r = slots.run(api.evict(&p.name, &params)).await;
            (p, r)
        }
    };
    let mut evictions = futures::stream::iter(pods)
        .map(evict)
        .buffer_unordered(PARALLEL_EVICTIONS);
    while let Some((p, r)) = evictions.next().await {
        match r {
            Ok(_) => {
                info!(ns = %p.namespace, pod = %p.name, node = %p.node, "evicted for the node's maintenance");
                ctx.memory(key, |m| m.drain.refused.remove(&p.uid));
            }
            // Gone already, or the name is another pod's now.
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
            // A disruption budget allows no disruption now: asked again
            // next pass; the status says which budget, as the API server
            // said it.
            Err(kube::Error::Api(s)) if s.code == 429 => {
                let why = refusal(&s);
                info!(ns = %p.namespace, pod = %p.name, reason = %why, "eviction refused");
                ctx.memory(key, |m| m.drain.refused.insert(p.uid.clone(), why));
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// The API server's refusal, with its causes (the budget's name and what
/// it needs), bounded.
fn refusal(s: &kube::core::Status) -> String {
    let causes: Vec<&str> = s
        .details
        .iter()
        .flat_map(|d| &d.causes)
        .map(|c| c.message.as_str())
        .filter(|m| !m.is_empty())
        .collect();
    let mut why = if causes.is_empty() {
        s.message.clone()
    } else {
        format!(
            "{} ({})",
            s.message.trim_end_matches('.'),
            causes.join("; ")
        )
    };
    if why.len() > MAX_REFUSAL {
        let mut end = MAX_REFUSAL;
        while !why.is_char_boundary(end) {
            end -= 1;
        }
        why.truncate(end);
        why.push('…');
    }
    why
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_keeps_the_budgets_words_bounded() {
        let s: kube::core::Status = serde_json::from_value(json!({
            "code": 429,
            "message": "Cannot evict pod as it would violate the pod's disruption budget.",
            "reason": "TooManyRequests",
            "details": {"causes": [{"reason": "DisruptionBudget",
                "message": "The disruption budget train needs 1 healthy pods and has 1 currently"}]}
        }))
        .unwrap();
        assert_eq!(
            refusal(&s),
            "Cannot evict pod as it would violate the pod's disruption budget (The disruption budget train needs 1 healthy pods and has 1 currently)"
        );
        let long = kube::core::Status {
            message: "é".repeat(400),
            ..s
        };
        assert!(refusal(&long).len() <= MAX_REFUSAL + '…'.len_utf8());
    }

    #[test]
    fn the_drain_reads_owner_mirror_phase_and_volumes_only() {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "etcd-n1", "namespace": "kube-system", "uid": "u1",
                "annotations": {"kubernetes.io/config.mirror": "x"},
                "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": "n1", "uid": "n", "controller": true}]},
            "spec": {"containers": [{"name": "c", "env": [{"name": "SECRET", "value": "s"}]}],
                "volumes": [{"name": "scratch", "emptyDir": {}}]},
            "status": {"phase": "Running"}
        }))
        .unwrap();
        let w = workload(&pod);
        assert!(w.mirror && w.uses_empty_dir && !w.finished && !w.terminating);
        assert_eq!(w.controller.as_deref(), Some("Node"));
        assert!(!format!("{w:?}").contains("SECRET"), "no env is kept");
    }
}
