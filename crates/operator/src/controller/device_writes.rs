//! The device gates' writes, each behind the leader fence (the caller,
//! [`super::writes::perform`], checks it), each idempotent:
//!
//! - claims probes: a pod named [`saferollout_core::rollout::probe_name`],
//!   pinned to its node by required node affinity (so the real scheduler
//!   places it and allocates its claim), with a ResourceClaim of the same
//!   name for a DeviceClass probe (or the user's claim template); both owned
//!   by the SafeRollout, so they never outlive it; AlreadyExists and
//!   NotFound are fine;
//! - quarantine DeviceTaintRules (cluster-scoped, so no owner reference to
//!   a namespaced SafeRollout is possible: the finalizer deletes them), at
//!   the version discovery found; AlreadyExists and NotFound are fine;
//! - quarantine node taints: JSON patches that append (with the node's
//!   resourceVersion as a guard when the list is empty, so a concurrent
//!   writer's taint is never replaced) or remove one entry by index after
//!   testing that it is ours; a failed guard is retried on the next pass.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::api::{Api, DeleteParams, DynamicObject, ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Resource, ResourceExt};
use saferollout_api::{
    FIELD_MANAGER, MANAGED_BY, MANAGED_BY_LABEL, PROBE_LABEL, PROBE_NODE_ANNOTATION,
    PROBE_REVISION_ANNOTATION, QUARANTINE_NODE_LABEL, QUARANTINE_TAINT_KEY, ROLLOUT_LABEL,
    SafeRollout,
};
use saferollout_core::rollout::{NodeTaint, QuarantineRule};
use serde_json::json;
use tracing::info;

use super::error::{Error, Result};
use super::{Context, RolloutKey};

fn post_params() -> PostParams {
    PostParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    }
}

/// Ignores "already exists" (409) and "not found" (404): the next pass
/// derives again what is missing.
fn tolerate<T>(r: kube::Result<T>) -> Result<()> {
    match r {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 409 || s.code == 404 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

fn owner(
    sr: &SafeRollout,
) -> Result<k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference> {
    sr.controller_owner_ref(&())
        .ok_or(Error::MissingField("metadata.uid"))
}

/// A label value, or nothing when the text cannot be one.
fn label_value(s: &str) -> Option<String> {
    (s.len() <= 63
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
    .then(|| s.to_string())
}

/// Creates the claims probe `name` for `node`.
pub async fn create_probe(
    sr: &SafeRollout,
    ctx: &Context,
    key: &RolloutKey,
    name: &str,
    node: &str,
    revision: &str,
) -> Result<()> {
    let Some(probe) = sr
        .spec
        .gates
        .as_ref()
        .and_then(|g| g.claims.as_ref())
        .and_then(|c| c.probe.as_ref())
    else {
        return Ok(()); // the spec changed since the decision
    };
    let ns = &key.0;
    let id = ctx.rollout_id(key);
    let mut labels: BTreeMap<String, String> = probe.labels.clone();
    labels.insert(PROBE_LABEL.into(), id.clone());
    labels.insert(ROLLOUT_LABEL.into(), id.clone());
    labels.insert(MANAGED_BY_LABEL.into(), MANAGED_BY.into());
    let annotations = BTreeMap::from([
        (PROBE_NODE_ANNOTATION.to_string(), node.to_string()),
        (PROBE_REVISION_ANNOTATION.to_string(), revision.to_string()),
    ]);
    let meta = ObjectMeta {
        name: Some(name.to_string()),
        namespace: Some(ns.clone()),
        labels: Some(labels.clone()),
        annotations: Some(annotations.clone()),
        owner_references: Some(vec![owner(sr)?]),
        ..Default::default()
    };
    let pod_claim = match (&probe.device_class_name, &probe.claim_template_name) {
        (Some(class), _) => {
            let claim: ResourceClaim = serde_json::from_value(json!({
                "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                "metadata": meta,
                "spec": {"devices": {"requests": [{"name": "probe", "exactly": {"deviceClassName": class}}]}}
            }))?;
            tolerate(
                Api::<ResourceClaim>::namespaced(ctx.client.clone(), ns)
                    .create(&post_params(), &claim)
                    .await,
            )?;
            json!({"name": "probe", "resourceClaimName": name})
        }
        (None, Some(template)) => json!({"name": "probe", "resourceClaimTemplateName": template}),
        (None, None) => return Ok(()), // the schema refuses this
    };
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": meta,
        "spec": {
            "restartPolicy": "Never",
            "automountServiceAccountToken": false,
            "terminationGracePeriodSeconds": 0,
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]
            }}},
            "tolerations": probe.tolerations,
            "securityContext": {"runAsNonRoot": true, "runAsUser": 65535, "seccompProfile": {"type": "RuntimeDefault"}},
            "resourceClaims": [pod_claim],
            "containers": [{
                "name": "probe",
                "image": probe.image,
                "resources": {"claims": [{"name": "probe"}], "requests": {"cpu": "1m", "memory": "8Mi"}, "limits": {"memory": "16Mi"}},
                "securityContext": {"allowPrivilegeEscalation": false, "readOnlyRootFilesystem": true,
                    "capabilities": {"drop": ["ALL"]}}
            }]
        }
    }))?;
    info!(%ns, probe = %name, %node, "creating a claims probe");
    tolerate(
        Api::<Pod>::namespaced(ctx.client.clone(), ns)
            .create(&post_params(), &pod)
            .await,
    )
}

/// Deletes claims probes: the pods and the claims made for them.
pub async fn delete_probes(ctx: &Context, key: &RolloutKey, names: &[String]) -> Result<()> {
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &key.0);
    let claims: Api<ResourceClaim> = Api::namespaced(ctx.client.clone(), &key.0);
    for name in names {
        info!(ns = %key.0, probe = %name, "deleting a claims probe");
        tolerate(pods.delete(name, &DeleteParams::default()).await)?;
        tolerate(claims.delete(name, &DeleteParams::default()).await)?;
    }
    Ok(())
}

/// Creates quarantine DeviceTaintRules and node taints.
pub async fn quarantine(
    ctx: &Context,
    key: &RolloutKey,
    rules: &[QuarantineRule],
    taints: &[NodeTaint],
) -> Result<()> {
    let id = ctx.rollout_id(key);
    if !rules.is_empty() {
        let Some((_, ar)) = ctx.caches.devices.rules.as_ref() else {
            return Ok(()); // not served: the decision would not ask
        };
        let api: Api<DynamicObject> = Api::all_with(ctx.client.clone(), ar);
        for r in rules {
            let mut labels = BTreeMap::from([
                (ROLLOUT_LABEL.to_string(), id.clone()),
                (MANAGED_BY_LABEL.to_string(), MANAGED_BY.to_string()),
            ]);
            if let Some(v) = label_value(&r.node) {
                labels.insert(QUARANTINE_NODE_LABEL.into(), v);
            }
            let mut obj = DynamicObject::new(&r.name, ar).data(json!({
                "spec": {
                    "deviceSelector": {"driver": r.driver, "pool": r.pool},
                    "taint": {"key": QUARANTINE_TAINT_KEY, "value": id, "effect": r.effect}
                }
            }));
            obj.metadata.labels = Some(labels);
            obj.metadata.annotations = Some(BTreeMap::from([(
                QUARANTINE_NODE_LABEL.to_string(),
                r.node.clone(),
            )]));
            info!(rule = %r.name, node = %r.node, driver = %r.driver, pool = %r.pool, effect = %r.effect,
                "quarantining a node's devices with a DeviceTaintRule");
            let created = api.create(&post_params(), &obj).await;
            let written = created.is_ok();
            tolerate(created)?;
            if written {
                super::writing::crash_point("devicetaintrule");
            }
        }
    }
    for t in taints {
        info!(node = %t.node, taint = %t.key, effect = %t.effect, "quarantining a node with a taint");
        add_node_taint(ctx, t).await?;
    }
    Ok(())
}

/// Appends taint `t` to its node's taints as the node cache shows them (a
/// JSON patch: another writer's taint is never replaced); nothing when the
/// cache does not show the node. A node that changed meanwhile refuses it,
/// and the next pass derives it again. `true`: the API server took it.
pub(super) async fn add_node_taint(ctx: &Context, t: &NodeTaint) -> Result<bool> {
    let Some(node) = ctx
        .caches
        .nodes
        .get(&kube::runtime::reflector::ObjectRef::new(&t.node))
    else {
        return Ok(false);
    };
    let taint = json!({"key": t.key, "value": t.value, "effect": t.effect});
    let existing = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|ts| !ts.is_empty());
    let ops = if existing {
        json!([{"op": "add", "path": "/spec/taints/-", "value": taint}])
    } else {
        json!([
            {"op": "test", "path": "/metadata/resourceVersion", "value": node.resource_version()},
            {"op": "add", "path": "/spec/taints", "value": [taint]}
        ])
    };
    patch_node(&Api::all(ctx.client.clone()), &t.node, ops).await
}

/// Deletes quarantine rules by name and removes node taints.
pub async fn lift(ctx: &Context, rules: &[String], taints: &[NodeTaint]) -> Result<()> {
    if let Some((_, ar)) = ctx.caches.devices.rules.as_ref() {
        let api: Api<DynamicObject> = Api::all_with(ctx.client.clone(), ar);
        for name in rules {
            info!(rule = %name, "lifting a quarantine: deleting its DeviceTaintRule");
            tolerate(api.delete(name, &DeleteParams::default()).await)?;
        }
    }
    for t in taints {
        info!(node = %t.node, taint = %t.key, "lifting a quarantine: removing the node taint");
        remove_node_taint(ctx, t).await?;
    }
    Ok(())
}

/// Removes the node's taint `t` (key, value and effect), by its index in the
/// taints the node cache shows (tested, so a list that changed meanwhile
/// refuses it); nothing when the cache shows none.
pub(super) async fn remove_node_taint(ctx: &Context, t: &NodeTaint) -> Result<()> {
    let Some(node) = ctx
        .caches
        .nodes
        .get(&kube::runtime::reflector::ObjectRef::new(&t.node))
    else {
        return Ok(());
    };
    let Some(i) = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .and_then(|ts| {
            ts.iter().position(|x| {
                x.key == t.key && x.effect == t.effect && x.value.as_deref() == Some(&t.value)
            })
        })
    else {
        return Ok(());
    };
    let ops = json!([
        {"op": "test", "path": format!("/spec/taints/{i}/key"), "value": t.key},
        {"op": "test", "path": format!("/spec/taints/{i}/value"), "value": t.value},
        {"op": "test", "path": format!("/spec/taints/{i}/effect"), "value": t.effect},
        {"op": "remove", "path": format!("/spec/taints/{i}")}
    ]);
    patch_node(&Api::all(ctx.client.clone()), &t.node, ops)
        .await
        .map(|_| ())
}

async fn patch_node(nodes: &Api<Node>, name: &str, ops: serde_json::Value) -> Result<bool> {
    let patch: Patch<serde_json::Value> = Patch::Json(serde_json::from_value(ops)?);
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    };
    match nodes.patch(name, &params, &patch).await {
        Ok(_) => Ok(true),
        // Gone, or the node changed since the cache showed it (a failed
        // test, or a duplicate taint): the next pass derives it again.
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 422 || s.code == 409 => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// Everything a SafeRollout left of the device gates, for its deletion: its
/// quarantine rules and node taints, and its probes.
pub async fn clean_up(sr: &SafeRollout, ctx: &Context, key: &RolloutKey) -> Result<()> {
    let id = ctx.rollout_id(key);
    let world = super::devices::gather(sr, &ctx.caches.devices);
    let ev = world.evidence();
    let rules: Vec<String> = ev
        .quarantine_rules
        .iter()
        .flatten()
        .map(|s| s.to_string())
        .collect();
    let taint_key = saferollout_core::rollout::taint_key(&id);
    let taints: Vec<NodeTaint> = ctx
        .caches
        .nodes
        .state()
        .iter()
        .flat_map(|n| {
            n.spec
                .iter()
                .flat_map(|s| s.taints.iter().flatten())
                .filter(|t| t.key == taint_key)
                .map(|t| NodeTaint {
                    node: n.name_any(),
                    key: t.key.clone(),
                    value: t.value.clone().unwrap_or_default(),
                    effect: t.effect.clone(),
                })
                .collect::<Vec<_>>()
        })
        .collect();
    if !rules.is_empty() || !taints.is_empty() {
        lift(ctx, &rules, &taints).await?;
    }
    let probes: Vec<String> = ev
        .probes
        .iter()
        .filter_map(|p| p.metadata.name.clone())
        .collect();
    if !probes.is_empty() {
        delete_probes(ctx, key, &probes).await?;
    }
    Ok(())
}
