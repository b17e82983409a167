//! Every write the operator makes, each behind the leader fence.
//!
//! - Status: server-side apply of the whole status (fields that became empty
//!   are removed, which a merge patch would not do), only when it changed.
//! - The DaemonSet: JSON patches conditional on the generation the decision
//!   was made from, so a concurrent edit is never overwritten silently; the
//!   generation the write returns is remembered, and decisions wait until the
//!   cache shows it.
//! - Pods: deleted with their UID as a precondition, so a stale decision
//!   never deletes a pod the DaemonSet controller recreated under that name
//!   (or one a deposed leader's decision named); remembered as deleting until
//!   the cache shows it.
//! - Nodes: merge patches of this rollout's two labels.
//! - The last-good backup: a ControllerRevision owned by the SafeRollout.
//! - Events: through the one Recorder.

use std::collections::BTreeMap;
use std::sync::Arc;

use futures::StreamExt;

use jiff::Timestamp;
use k8s_openapi::api::apps::v1::{ControllerRevision, DaemonSet};
use k8s_openapi::api::core::v1::{Node, Pod, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use k8s_openapi::apimachinery::pkg::runtime::RawExtension;
use kube::api::{Api, DeleteParams, ObjectMeta, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::events::{Event as KubeEvent, EventType};
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};
use saferollout_api::{
    BACKUP_REVISION_LABEL, FIELD_MANAGER, MANAGED_BY, MANAGED_BY_LABEL, REVISION_HASH_LABEL,
    ROLLOUT_LABEL, STAGE_LABEL, SafeRollout, SafeRolloutStatus,
};
use saferollout_core::revision::{content_hash, revision_template_json};
use saferollout_core::rollout::{Action, PodRef};
use serde_json::json;
use tracing::{info, warn};

use super::caches::triggers::Cause;
use super::error::{Error, Result};
use super::snapshot::{World, backup_name};
pub use super::writing::is_failed_guard;
pub use super::writing::{API_WRITES_IN_FLIGHT, WriteSlots};
use super::writing::{crash_point, patch_params};
use super::{Context, RolloutKey};

/// Pod deletions (and a clean-up's label removals) of one action in flight
/// at once: a batch of maxUnavailable pods is deleted in a few round trips
/// instead of one per node (the DaemonSet controller deletes a whole batch in
/// parallel).
const PARALLEL_WRITES: usize = 64;

pub(super) fn fenced(ctx: &Context) -> Result<()> {
    if ctx.fence.is_open() {
        Ok(())
    } else {
        Err(Error::NotLeader)
    }
}

/// The server-side apply body of a status write, serialised straight from
/// the status: `json!` would first build a `serde_json::Value` tree of it,
/// and at 5,000 nodes a stage's per-node baselines make that tree several MB
/// a write.
#[derive(Debug, serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct StatusPatch<'a> {
    api_version: &'static str,
    kind: &'static str,
    status: &'a SafeRolloutStatus,
}

/// Of a written object, what a status write reads back; serde skips the rest
/// of the answer without building it.
#[derive(serde::Deserialize)]
struct WrittenVersion {
    metadata: WrittenMeta,
}

#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct WrittenMeta {
    resource_version: Option<String>,
}

/// Writes `new` when it differs from `old`, after any write of this
/// rollout's status still in flight behind its pass (status writes of one
/// rollout land in the order the passes made them); remembers the written
/// resource version so a reconcile does not decide from an older cached
/// status.
pub async fn status(
    sr: &SafeRollout,
    ctx: &Context,
    key: &RolloutKey,
    old: &SafeRolloutStatus,
    new: &SafeRolloutStatus,
) -> Result<bool> {
    if old == new && sr.status.is_some() {
        return Ok(false);
    }
    if let Some(previous) = ctx.memory(key, |m| m.status_behind.take()) {
        // Its failure is its own task's to report.
        let _ = previous.await;
    }
    send_status(ctx, key, new, Remember::Version).await
}

/// Writes `new` (a status that differs from the cached one only in what
/// [`saferollout_core::durability::status_may_go_behind`] allows) in a task of
/// its own, after any write still in flight, and returns at once: the pass
/// that made it goes on to its deletions and ends without waiting for the
/// API server's answer (at 1,000 nodes a status write takes it about 90 ms,
/// a pod replacement about 70 ms). Until a later write replaces it, it is
/// what [`status`] waits for. A failed write is logged and wakes the rollout
/// for a pass that writes the status again.
pub fn status_behind(
    ctx: &Arc<Context>,
    key: &RolloutKey,
    sr: &SafeRollout,
    new: SafeRolloutStatus,
) {
    let (ctx, key, rollout) = (ctx.clone(), key.clone(), ObjectRef::from_obj(sr));
    // Counted as written now: the passes meanwhile defer their progress to
    // the next write (durability::when_to_write) instead of queuing another.
    let previous = ctx.memory(&key, |m| {
        m.status_written_at = Some(std::time::Instant::now());
        m.status_behind.take()
    });
    let task = {
        let (ctx, key) = (ctx.clone(), key.clone());
        tokio::spawn(async move {
            if let Some(previous) = previous {
                let _ = previous.await;
            }
            match send_status(&ctx, &key, &new, Remember::Nothing).await {
                Ok(_) => {}
                // The SafeRollout is gone: nothing to write again.
                Err(Error::Kube(kube::Error::Api(s))) if s.code == 404 => {}
                Err(error) => status_behind_failed(&ctx, &key, rollout, error),
            }
        })
    };
    ctx.memory(&key, |m| m.status_behind = Some(task));
}

/// A status write that went behind its pass failed: a pass writes it again
/// after the delay the error's kind asks for (as a failed reconcile would
/// be requeued), and meanwhile the passes count it as written, deferring
/// their progress-only writes as after a write that landed. Woken at once
/// with nothing counted, an API server that kept refusing the write (an
/// admission policy, a webhook, a quota) met one retry every few
/// milliseconds: about 100 a second in the end-to-end test that refuses
/// them, 13,000 in two minutes.
fn status_behind_failed(
    ctx: &Arc<Context>,
    key: &RolloutKey,
    rollout: ObjectRef<SafeRollout>,
    error: Error,
) {
    if !matches!(error, Error::NotLeader) {
        warn!(namespace = %key.0, name = %key.1, %error, "status write failed: writing it again");
    }
    ctx.metrics
        .reconcile_errors
        .get_or_create(&crate::metrics::ErrorLabels {
            error: error.metric_label(),
        })
        .inc();
    ctx.memory(key, |m| {
        m.status_written_at = Some(std::time::Instant::now());
    });
    let delay = error.retry_delay();
    let ctx = ctx.clone();
    tokio::spawn(async move {
        tokio::time::sleep(delay).await;
        ctx.triggers.send(rollout, Cause::StatusRetry);
    });
}

/// What a status write leaves in the rollout's memory.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Remember {
    /// Its resource version: passes wait until the cache shows it.
    Version,
    /// Nothing: a pass may decide from the status before it (it differs
    /// only in what a lost write may lose).
    Nothing,
}

async fn send_status(
    ctx: &Context,
    key: &RolloutKey,
    new: &SafeRolloutStatus,
    remember: Remember,
) -> Result<bool> {
    fenced(ctx)?;
    let patch = StatusPatch {
        api_version: saferollout_api::API_VERSION,
        kind: saferollout_api::KIND,
        status: new,
    };
    // The request `Api::patch_status` makes, but only the answer's resource
    // version is decoded: decoding the whole SafeRollout would copy, for a
    // moment, the status just written (every node of the plan and its
    // baseline) on top of the copies the pass and the cache hold.
    let mut request = kube::core::Request::new(SafeRollout::url_path(&(), Some(&key.0)))
        .patch_subresource(
            "status",
            &key.1,
            &PatchParams::apply(FIELD_MANAGER),
            &Patch::Apply(patch),
        )
        .map_err(kube::Error::BuildRequest)?;
    request.extensions_mut().insert("patch_status");
    let written: WrittenVersion = ctx.client.request(request).await?;
    let rv = written
        .metadata
        .resource_version
        .as_deref()
        .and_then(|v| v.parse().ok());
    ctx.memory(key, |m| {
        if remember == Remember::Version {
            m.status_version = rv;
        }
        m.status_written_at = Some(std::time::Instant::now());
    });
    crash_point("status");
    Ok(true)
}

/// Performs one action of a decision. `generation` is the DaemonSet
/// generation the decision was made from.
pub async fn perform(
    sr: &SafeRollout,
    ctx: &Context,
    key: &RolloutKey,
    world: &World,
    spec_template: Option<&serde_json::Value>,
    action: &Action,
) -> Result<Option<i64>> {
    fenced(ctx)?;
    let (ns, id) = (&key.0, ctx.rollout_id(key));
    let client = &ctx.client;
    let dss: Api<DaemonSet> = Api::namespaced(client.clone(), ns);
    let ds_name = &sr.spec.target_ref.name;
    let generation = world
        .ds
        .as_ref()
        .and_then(|d| d.metadata.generation)
        .unwrap_or_default();
    // Conditional on the generation decided from (not the resource version:
    // the DaemonSet controller's status updates must not fail it).
    let guarded = |ops: serde_json::Value| -> Result<Patch<serde_json::Value>> {
        let mut all =
            vec![json!({"op": "test", "path": "/metadata/generation", "value": generation})];
        all.extend(ops.as_array().cloned().unwrap_or_default());
        Ok(Patch::Json(serde_json::from_value(
            serde_json::Value::Array(all),
        )?))
    };
    let write_ds = |p: Patch<serde_json::Value>| async move {
        let written = dss.patch(ds_name, &patch_params(), &p).await?;
        let g = written.metadata.generation.unwrap_or_default();
        ctx.memory(key, |m| m.expectations.daemonset_written(g));
        Ok::<_, Error>(Some(g))
    };
    let result = match action {
        Action::TakeOverUpdates => {
            info!(%ns, daemonset = %ds_name, "setting updateStrategy OnDelete");
            write_ds(guarded(json!([{"op": "replace", "path": "/spec/updateStrategy", "value": {"type": "OnDelete"}}]))?).await
        }
        Action::ApplySpecTemplate => {
            let t = spec_template
                .cloned()
                .ok_or(Error::MissingField("spec.template"))?;
            info!(%ns, daemonset = %ds_name, "writing spec.template to the DaemonSet");
            write_ds(guarded(
                json!([{"op": "replace", "path": "/spec/template", "value": t}]),
            )?)
            .await
        }
        Action::RestoreLastGood { content } => {
            let backup = world
                .backup
                .as_ref()
                .ok_or_else(|| Error::MissingBackup(backup_name(&sr.name_any(), "?")))?;
            let t = backup
                .data
                .0
                .get("template")
                .cloned()
                .ok_or_else(|| Error::MissingBackup(backup.name_any()))?;
            // Only the content the decision verified is ever written back.
            let found = content_hash(&t);
            if found != *content {
                warn!(%ns, backup = %backup.name_any(), %found, expected = %content, "not restoring a last good backup the operator did not write");
                return Err(Error::BackupMismatch(format!(
                    "ControllerRevision {} holds content {found}, not {content}",
                    backup.name_any()
                )));
            }
            info!(%ns, daemonset = %ds_name, backup = %backup.name_any(), "restoring the last good template");
            write_ds(guarded(
                json!([{"op": "replace", "path": "/spec/template", "value": t}]),
            )?)
            .await
        }
        Action::BackupTemplate { revision } => backup_template(sr, ctx, ns, world, revision)
            .await
            .map(|_| None),
        // Queued for the rollout's label writer (see `labels`): never waited for.
        Action::LabelNodes { nodes, stage } => {
            super::labels::queue(&ctx.label_writes(), key, &id, nodes, Some(*stage));
            Ok(None)
        }
        Action::UnlabelNodes { nodes } => {
            super::labels::queue(&ctx.label_writes(), key, &id, nodes, None);
            Ok(None)
        }
        Action::DeletePods { pods } => delete_pods(ctx, key, pods).await.map(|_| None),
        Action::CreateProbe {
            name,
            node,
            revision,
        } => super::device_writes::create_probe(sr, ctx, key, name, node, revision)
            .await
            .map(|_| None),
        Action::DeleteProbes { names } => super::device_writes::delete_probes(ctx, key, names)
            .await
            .map(|_| None),
        Action::Quarantine { rules, taints } => {
            super::device_writes::quarantine(ctx, key, rules, taints)
                .await
                .map(|_| None)
        }
        Action::LiftQuarantine { rules, taints } => super::device_writes::lift(ctx, rules, taints)
            .await
            .map(|_| None),
        Action::Event {
            warning,
            reason,
            message,
        } => {
            event(sr, ctx, *warning, reason, message).await;
            Ok(None)
        }
        Action::CreateProbePods { probes } => {
            super::proof::create_probes(sr, ctx, key, world, probes)
                .await
                .map(|_| None)
        }
        Action::DeleteProbePods { pods } => super::proof::delete_probes(ctx, key, pods)
            .await
            .map(|_| None),
        Action::CordonNodes { nodes } => super::maintenance::cordon(ctx, key, nodes)
            .await
            .map(|_| None),
        Action::UncordonNodes { nodes } => super::maintenance::uncordon(ctx, key, nodes)
            .await
            .map(|_| None),
        Action::EvictPods { pods } => super::maintenance::evict(ctx, key, pods)
            .await
            .map(|_| None),
        Action::RevertOwner { plan } => super::owner_revert::revert(ctx, key, plan)
            .await
            .map(|_| None),
    };
    if result.is_ok() {
        match action {
            Action::ApplySpecTemplate | Action::RestoreLastGood { .. } => crash_point("template"),
            Action::BackupTemplate { .. } => crash_point("backup"),
            Action::DeletePods { .. } => crash_point("deletion"),
            Action::CordonNodes { .. } => crash_point("cordon"),
            Action::Quarantine { .. } => crash_point("quarantine"),
            _ => {}
        }
    }
    result
}

async fn patch_nodes(ctx: &Context, nodes: &[String], patch: serde_json::Value) -> Result<()> {
    let api: Api<Node> = Api::all(ctx.client.clone());
    let patch = Patch::Merge(&patch);
    let params = patch_params();
    let mut writes = futures::stream::iter(nodes)
        .map(|n| ctx.write_slots.run(api.patch(n, &params, &patch)))
        .buffer_unordered(PARALLEL_WRITES);
    while let Some(r) = writes.next().await {
        match r {
            Err(kube::Error::Api(s)) if s.code == 404 => {} // gone; the next pass notices
            r => {
                r?;
            }
        }
    }
    Ok(())
}

async fn delete_pods(ctx: &Context, key: &RolloutKey, pods: &[PodRef]) -> Result<()> {
    let api: Api<Pod> = Api::namespaced(ctx.client.clone(), &key.0);
    let now = Timestamp::now();
    let delete = |p: &PodRef| {
        info!(ns = %key.0, pod = %p.name, node = %p.node, "replacing agent pod");
        // Remembered before the call: a delete that times out may still
        // happen, and the watch may show it before the answer comes.
        ctx.memory(key, |m| m.expectations.pod_deleted(&p.uid, now));
        ctx.triggers.deleting(&p.uid);
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: Some(p.uid.clone()),
                resource_version: p.unchanged_since.clone(),
            }),
            ..Default::default()
        };
        let api = api.clone();
        let (name, uid) = (p.name.clone(), p.uid.clone());
        let slots = ctx.write_slots.clone();
        async move { (uid, slots.run(api.delete(&name, &params)).await) }
    };
    let mut deletes = futures::stream::iter(pods)
        .map(delete)
        .buffer_unordered(PARALLEL_WRITES);
    while let Some((uid, r)) = deletes.next().await {
        if r.is_err() {
            ctx.triggers.not_deleting(&uid);
        }
        match r {
            // Gone already: the cache will show it.
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            // The name now belongs to a newer pod (UID), or the pod changed
            // since it was seen (resourceVersion): nothing was deleted. The
            // pod's watch event brings the next pass, which decides again.
            Err(kube::Error::Api(s)) if s.code == 409 => {
                info!(ns = %key.0, uid = %uid, "agent pod changed since it was seen: not deleted");
                ctx.memory(key, |m| m.expectations.delete_refused(&uid));
            }
            r => {
                r?;
            }
        }
    }
    Ok(())
}

pub async fn event(sr: &SafeRollout, ctx: &Context, warning: bool, reason: &str, message: &str) {
    let ns = sr.namespace().unwrap_or_default();
    if warning {
        warn!(%ns, name = %sr.name_any(), %reason, %message);
    } else {
        info!(%ns, name = %sr.name_any(), %reason, %message);
    }
    if !ctx.fence.is_open() {
        return;
    }
    let ev = KubeEvent {
        type_: if warning {
            EventType::Warning
        } else {
            EventType::Normal
        },
        reason: reason.into(),
        note: Some(message.chars().take(1000).collect()),
        action: "Rollout".into(),
        secondary: None,
    };
    // Events are best effort: losing one must not stall a revert.
    if let Err(e) = ctx.recorder.publish(&ev, &sr.object_ref(&())).await {
        warn!(%e, "publishing event failed");
    }
}

/// Copies the DaemonSet's template of `revision` into a ControllerRevision
/// owned by the SafeRollout, then drops older backups.
async fn backup_template(
    sr: &SafeRollout,
    ctx: &Context,
    ns: &str,
    world: &World,
    revision: &str,
) -> Result<()> {
    let ds = world
        .ds
        .as_ref()
        .ok_or(Error::MissingField("target DaemonSet"))?;
    let ds_uid = ds.metadata.uid.clone().unwrap_or_default();
    let all = ctx.caches.revisions.in_namespace(ns);
    let owned =
        |cr: &ControllerRevision, uid: &str| cr.owner_references().iter().any(|o| o.uid == uid);
    let source = all
        .iter()
        .filter(|cr| owned(cr, &ds_uid))
        .find(|cr| cr.labels().get(REVISION_HASH_LABEL).map(String::as_str) == Some(revision))
        .ok_or_else(|| Error::MissingBackup(format!("DaemonSet revision {revision}")))?;
    let template =
        revision_template_json(source).ok_or_else(|| Error::MissingBackup(source.name_any()))?;
    record_backup(
        sr,
        ctx,
        ns,
        &ds.name_any(),
        revision,
        template,
        source.revision.unwrap_or_default(),
    )
    .await
}

/// Records `template` as the last good backup of `revision` (a
/// ControllerRevision owned by the SafeRollout, the DaemonSet's revision
/// `number`), and deletes the SafeRollout's older backups.
pub(super) async fn record_backup(
    sr: &SafeRollout,
    ctx: &Context,
    ns: &str,
    ds_name: &str,
    revision: &str,
    template: serde_json::Value,
    number: i64,
) -> Result<()> {
    // Refuse a template that is not a pod template rather than back up garbage.
    let _: PodTemplateSpec = serde_json::from_value(template.clone())?;
    let name = backup_name(&sr.name_any(), revision);
    let api: Api<ControllerRevision> = Api::namespaced(ctx.client.clone(), ns);
    let cr = ControllerRevision {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            namespace: Some(ns.into()),
            labels: Some(BTreeMap::from([
                (
                    ROLLOUT_LABEL.to_string(),
                    ctx.rollout_id(&(ns.to_string(), sr.name_any())),
                ),
                (BACKUP_REVISION_LABEL.to_string(), revision.to_string()),
                (MANAGED_BY_LABEL.to_string(), MANAGED_BY.to_string()),
            ])),
            owner_references: Some(vec![OwnerReference {
                controller: Some(true),
                ..sr.controller_owner_ref(&())
                    .ok_or(Error::MissingField("metadata.uid"))?
            }]),
            ..Default::default()
        },
        data: RawExtension(json!({"template": template, "daemonSet": ds_name})),
        revision: Some(number),
    };
    let params = PostParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    };
    match api.create(&params, &cr).await {
        Ok(_) => info!(%ns, backup = %name, "recorded the last good template"),
        Err(kube::Error::Api(s)) if s.code == 409 => {
            // Someone created it first: it counts as recorded only if it
            // holds what this write meant to (ControllerRevision data is
            // immutable, so it holds that for good), and is ours.
            let existing = api.get(&name).await?;
            let sr_uid = sr.metadata.uid.clone().unwrap_or_default();
            let ours = existing.owner_references().iter().any(|o| o.uid == sr_uid);
            let (meant, found) = (
                content_hash(&template),
                super::snapshot::backup_content(&existing),
            );
            if !ours || found.as_deref() != Some(meant.as_str()) {
                warn!(%ns, backup = %name, ?found, %meant, ours, "a last good backup the operator did not write is in the way");
                return Err(Error::BackupMismatch(format!(
                    "ControllerRevision {name} exists with content {}, not {meant}{}",
                    found.as_deref().unwrap_or("(none)"),
                    if ours {
                        ""
                    } else {
                        ", and is not owned by this SafeRollout"
                    }
                )));
            }
        }
        Err(e) => return Err(e.into()),
    }
    let sr_uid = sr.metadata.uid.clone().unwrap_or_default();
    let owned =
        |cr: &ControllerRevision, uid: &str| cr.owner_references().iter().any(|o| o.uid == uid);
    for old in ctx
        .caches
        .revisions
        .in_namespace(ns)
        .iter()
        .filter(|cr| owned(cr, &sr_uid) && cr.name_any() != name)
    {
        match api.delete(&old.name_any(), &DeleteParams::default()).await {
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            r => {
                r?;
            }
        }
    }
    Ok(())
}

/// Whether the DaemonSet's template already equals `template` once the API
/// server has defaulted it: a server-side dry run of the write, compared with
/// the live template. Asked once per DaemonSet generation and spec.template.
///
/// A dry run the API server did not answer (429, 5xx, a dropped connection)
/// tells nothing: it is an error, and the pass is retried. Before, it read
/// as "not in place" and that answer was kept for the generation: the
/// operator wrote the template the DaemonSet already had, a write that
/// changes nothing and so wakes nothing, and the rollout stood at
/// "writing spec.template" for good (tests/faults.rs, one injected 500).
/// `template` as the API server would store it in DaemonSet `ds` (a
/// server-side dry run: defaults filled in); `None` when it would refuse it
/// (reported when it is really written).
pub async fn stored_template(
    ctx: &Context,
    ds: &DaemonSet,
    template: &serde_json::Value,
) -> Result<Option<k8s_openapi::api::core::v1::PodTemplateSpec>> {
    let api: Api<DaemonSet> =
        Api::namespaced(ctx.client.clone(), &ds.namespace().unwrap_or_default());
    let patch: Patch<serde_json::Value> = match serde_json::from_value(
        json!([{"op": "replace", "path": "/spec/template", "value": template}]),
    ) {
        Ok(p) => Patch::Json(p),
        Err(_) => return Ok(None),
    };
    let params = PatchParams {
        dry_run: true,
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    };
    match api.patch(&ds.name_any(), &params, &patch).await {
        Ok(would_be) => Ok(Some(would_be.spec.template)),
        Err(kube::Error::Api(s)) if s.code == 429 || s.code >= 500 => {
            Err(kube::Error::Api(s).into())
        }
        Err(kube::Error::Api(_)) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Whether DaemonSet `ds` already carries `template` as the API server
/// would store it (`false` when it would refuse it).
pub async fn template_in_place(
    ctx: &Context,
    ds: &DaemonSet,
    template: &serde_json::Value,
) -> Result<bool> {
    Ok(stored_template(ctx, ds, template)
        .await?
        .is_some_and(|t| saferollout_core::revision::same_template(&t, &ds.spec.template)))
}

/// Restores the DaemonSet's original update strategy (the SafeRollout is
/// being deleted).
pub async fn give_back(
    ctx: &Context,
    ns: &str,
    ds_name: &str,
    original: &k8s_openapi::api::apps::v1::DaemonSetUpdateStrategy,
) -> Result<()> {
    fenced(ctx)?;
    let dss: Api<DaemonSet> = Api::namespaced(ctx.client.clone(), ns);
    let value = serde_json::to_value(original)?;
    let p: Patch<serde_json::Value> = Patch::Json(serde_json::from_value(json!([
        {"op": "replace", "path": "/spec/updateStrategy", "value": value}
    ]))?);
    match dss.patch(ds_name, &patch_params(), &p).await {
        Err(kube::Error::Api(s)) if s.code == 404 => {}
        r => {
            r?;
        }
    }
    info!(%ns, daemonset = %ds_name, "restored the DaemonSet's original update strategy");
    Ok(())
}

/// Removes this rollout's labels from `nodes`.
pub async fn unlabel(ctx: &Context, nodes: &[String]) -> Result<()> {
    fenced(ctx)?;
    let labels = json!({"metadata": {"labels": {STAGE_LABEL: null, ROLLOUT_LABEL: null}}});
    patch_nodes(ctx, nodes, labels).await
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The answer to a status write is the whole SafeRollout; only its
    /// resource version is read (and must be: a pass compares it with the
    /// cached status's).
    #[test]
    fn a_status_writes_answer_yields_its_resource_version() {
        let answer = json!({
            "apiVersion": "saferollout.dev/v1alpha1",
            "kind": "SafeRollout",
            "metadata": {"name": "plugin", "namespace": "gpu", "resourceVersion": "4711",
                         "managedFields": [{"manager": "saferollout-operator"}]},
            "spec": {"targetRef": {"name": "plugin"}},
            "status": {"stages": [{"index": 0, "nodes": ["node-a"],
                                   "baseline": {"node-a": {"nvidia.com/gpu": 8}}}]},
        });
        let written: WrittenVersion = serde_json::from_value(answer).unwrap();
        assert_eq!(written.metadata.resource_version.as_deref(), Some("4711"));
    }

    /// Writers of many rollouts at once (each with its own limit) keep to
    /// the shared limit together, and use all of it.
    #[tokio::test]
    async fn write_slots_bound_the_writes_in_flight_across_writers() {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicUsize, Ordering};
        let slots = WriteSlots::default();
        let (now, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let writer = |_: usize| {
            let (slots, now, most) = (slots.clone(), now.clone(), most.clone());
            async move {
                futures::stream::iter(0..100)
                    .map(|_| {
                        slots.run(async {
                            let n = now.fetch_add(1, Ordering::SeqCst) + 1;
                            most.fetch_max(n, Ordering::SeqCst);
                            tokio::task::yield_now().await;
                            now.fetch_sub(1, Ordering::SeqCst);
                        })
                    })
                    .buffer_unordered(32)
                    .count()
                    .await
            }
        };
        let done: Vec<usize> = futures::future::join_all((0..10).map(writer)).await;
        assert_eq!(done, vec![100; 10]);
        assert_eq!(most.load(Ordering::SeqCst), API_WRITES_IN_FLIGHT);
    }
}
