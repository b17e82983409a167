//! The executor of the `Selector` translation's steps
//! (`saferollout_core::selector::Step`): each one write, built by
//! `saferollout_core::selector::objects`, performed in the order the
//! translation gave; the first that fails ends the pass (every step is
//! derived again from the cluster on the next). What it remembers between
//! passes, as the model's executor does (`core/src/rollout/model/selector.rs`):
//! the generation of each write of the target (no pass decides on an older
//! cache of it), the agents a handover label write takes away (the budget
//! paid for them), and the promotion taints it wrote.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, Patch, PostParams, Preconditions, PropagationPolicy};
use kube::{Resource, ResourceExt};
use saferollout_api::{FIELD_MANAGER, PROMOTING_TAINT, SafeRollout};
use saferollout_core::handover::HandoverState;
use saferollout_core::objects::SlimNode;
use saferollout_core::revision::content_hash;
use saferollout_core::rollout::{Action, NodeTaint, PodRef};
use saferollout_core::selector::{
    Context as TranslationContext, OwnedPod, Owner, PromotionStep, Step, follow_ups, objects,
    translate,
};
use serde_json::json;
use tracing::info;

use super::Found;
use crate::controller::error::{Error, Result};
use crate::controller::snapshot::World;
use crate::controller::writing::{crash_point, patch_params};
use crate::controller::{Context, RolloutKey, device_writes, writes};

/// What one pass's steps are performed on.
pub struct Pass<'a> {
    pub sr: &'a SafeRollout,
    pub key: &'a RolloutKey,
    pub world: &'a World,
    pub found: &'a Found,
    /// `spec.template` as written (the canary's template is built from it).
    pub template_value: Option<&'a serde_json::Value>,
    /// `spec.template`'s revision by content, from the dry run.
    pub spec_revision: Option<&'a str>,
    pub status: &'a saferollout_api::SafeRolloutStatus,
}

/// What a pass's translation reads beyond the pass: the pods with the
/// operator's memory of its deletions laid over them (once), the nodes,
/// and the promotion taints this replica wrote.
struct Read<'a> {
    owned: Vec<OwnedPod<'a>>,
    nodes: Arc<Vec<Arc<SlimNode>>>,
    taints_written: BTreeSet<String>,
}

impl<'a> Read<'a> {
    fn of(pass: &Pass<'a>, ctx: &Context) -> Self {
        let now = Timestamp::now();
        let (key, world, found) = (pass.key, pass.world, pass.found);
        Read {
            owned: ctx.memory(key, |m| {
                found.owned_pods(world.pods(), &mut m.expectations, now)
            }),
            nodes: ctx.caches.nodes_by_name(),
            taints_written: ctx.memory(key, |m| m.selector_taints.clone()),
        }
    }

    fn context<'b>(&'b self, pass: &'b Pass<'a>, spec_is_target: bool) -> TranslationContext<'b> {
        pass.found.context(
            &self.owned,
            &self.nodes,
            pass.status,
            spec_is_target,
            &self.taints_written,
            pass.sr.spec.handover_order().into(),
        )
    }
}

/// What one pass's steps did.
#[derive(Debug, Default)]
pub struct Ran {
    /// The canary's generation after this pass wrote its template (status
    /// records it as the applied template's).
    pub canary_generation: Option<i64>,
    /// Something of the strategy is still under way (a canary, a handover
    /// label, a promotion taint, the target's expression): the next pass
    /// is due soon even if no watch event wakes it (the last old agents
    /// going away, which the promotion waits for, wake nothing).
    pub in_flight: bool,
}

/// How soon a pass follows one that left the strategy under way.
pub const IN_FLIGHT_RECHECK: Duration = Duration::from_secs(1);

/// Translates the plan's actions into steps, adds what goes on by itself,
/// and performs them.
pub async fn run(pass: &Pass<'_>, ctx: &Context, actions: &[Action]) -> Result<Ran> {
    let read = Read::of(pass, ctx);
    let spec_is_target = pass.spec_revision == Some(pass.found.view.target.revision.as_str());
    let tctx = read.context(pass, spec_is_target);
    let mut steps: Vec<Step> = actions
        .iter()
        .flat_map(|a| translate(a.clone(), &tctx))
        .collect();
    let more = follow_ups(&tctx, &steps);
    steps.extend(more);
    if !steps.is_empty() {
        tracing::debug!(ns = %pass.key.0, name = %pass.key.1, ?steps, "Selector steps of the pass");
    }
    let mut ran = Ran {
        canary_generation: None,
        in_flight: pass.found.canary.is_some()
            || !tctx.states.is_empty()
            || !tctx.promotion.tainted.is_empty()
            || tctx.promotion.target_has_expression,
    };
    for step in &steps {
        if let Some(g) = perform(pass, ctx, step, &read.owned).await? {
            ran.canary_generation = Some(g);
        }
    }
    Ok(ran)
}

/// One step of undoing the pair for the SafeRollout's deletion
/// (`saferollout_core::selector::deletion`); `None` once nothing of the
/// strategy is left, else how soon the next step is due.
pub async fn undo(pass: &Pass<'_>, ctx: &Context) -> Result<Option<Duration>> {
    use saferollout_core::selector::deletion::{DeletionStep, next};
    let read = Read::of(pass, ctx);
    let step = next(&read.context(pass, false));
    match step {
        DeletionStep::Done => Ok(None),
        DeletionStep::Wait => Ok(Some(Duration::from_secs(1))),
        DeletionStep::Step(step) => {
            info!(ns = %pass.key.0, name = %pass.key.1, ?step, "SafeRollout deleted: undoing its canary");
            perform(pass, ctx, &step, &read.owned).await?;
            Ok(Some(Duration::from_millis(500)))
        }
    }
}

/// The target's current template as JSON.
fn target_template(found: &Found) -> serde_json::Value {
    serde_json::to_value(&found.target.spec.template).unwrap_or_default()
}

async fn perform(
    pass: &Pass<'_>,
    ctx: &Context,
    step: &Step,
    owned: &[OwnedPod<'_>],
) -> Result<Option<i64>> {
    writes::fenced(ctx)?;
    let Pass {
        sr,
        key,
        world,
        found,
        template_value,
        ..
    } = *pass;
    let ns = key.0.as_str();
    let dss: Api<DaemonSet> = Api::namespaced(ctx.client.clone(), ns);
    match step {
        Step::Engine(Action::BackupTemplate { revision }) => {
            let (template, number) = found.template_of(revision).ok_or_else(|| {
                Error::MissingBackup(format!("a ControllerRevision of revision {revision}"))
            })?;
            writes::record_backup(
                sr,
                ctx,
                ns,
                &found.target.name_any(),
                revision,
                template,
                number,
            )
            .await?;
            crash_point("backup");
            Ok(None)
        }
        Step::Engine(a) => writes::perform(sr, ctx, key, world, template_value, a)
            .await
            .map(|_| None),
        Step::WriteCanary => {
            let template = template_value
                .cloned()
                .ok_or(Error::MissingField("spec.template"))?;
            // The target first follows the labels (OnDelete: nothing restarts).
            if !found.view.target_expression {
                let t = objects::target_template(&target_template(found), &found.key, true);
                info!(%ns, daemonset = %found.target.name_any(), "giving the target its handover expression");
                write_target(ctx, key, found, t).await?;
            }
            if found.canary.is_some() && found.live_canary().is_none() {
                // The last canary is still being deleted: created once it
                // is gone (a later pass), never written while it goes.
                return Ok(None);
            }
            let g = match found.live_canary() {
                None => {
                    let owner = sr
                        .controller_owner_ref(&())
                        .ok_or(Error::MissingField("metadata.uid"))?;
                    let canary = objects::canary_daemonset(
                        &found.target,
                        &template,
                        &found.key,
                        &found.rollout_id,
                        owner,
                    )
                    .map_err(|e| Error::Selector(e.to_string()))?;
                    info!(%ns, canary = %canary.name_any(), "creating the canary DaemonSet");
                    let params = PostParams {
                        field_manager: Some(FIELD_MANAGER.into()),
                        ..Default::default()
                    };
                    dss.create(&params, &canary).await?
                }
                Some(c) => {
                    info!(%ns, canary = %c.name_any(), "writing spec.template to the canary DaemonSet");
                    let patch =
                        objects::canary_template_patch(&template, &found.key, &found.rollout_id);
                    dss.patch(&c.name_any(), &patch_params(), &Patch::Merge(&patch))
                        .await?
                }
            };
            crash_point("template");
            Ok(g.metadata.generation)
        }
        Step::RestoreCanary { content } => {
            let (Some(c), Some(backup)) = (found.live_canary(), &world.backup) else {
                return Err(Error::MissingBackup(format!(
                    "the last good template ({content})"
                )));
            };
            let t = backup
                .data
                .0
                .get("template")
                .cloned()
                .ok_or_else(|| Error::MissingBackup(backup.name_any()))?;
            let found_content = content_hash(&t);
            if found_content != *content {
                return Err(Error::BackupMismatch(format!(
                    "ControllerRevision {} holds content {found_content}, not {content}",
                    backup.name_any()
                )));
            }
            info!(%ns, canary = %c.name_any(), backup = %backup.name_any(), "restoring the last good template to the canary DaemonSet");
            let patch = objects::canary_template_patch(&t, &found.key, &found.rollout_id);
            let g = dss
                .patch(&c.name_any(), &patch_params(), &Patch::Merge(&patch))
                .await?;
            crash_point("template");
            Ok(g.metadata.generation)
        }
        Step::RetireCanary => {
            if let Some(c) = found.live_canary() {
                info!(%ns, canary = %c.name_any(), "retiring the canary DaemonSet: nodes go back to the target");
                dss.patch(
                    &c.name_any(),
                    &patch_params(),
                    &Patch::Merge(objects::retiring_patch()),
                )
                .await?;
            }
            Ok(None)
        }
        Step::DeleteCanary => {
            delete_canary(ctx, found, PropagationPolicy::Background).await?;
            clear_target(ctx, key, found).await?;
            Ok(None)
        }
        Step::ClearTarget => {
            clear_target(ctx, key, found).await?;
            Ok(None)
        }
        Step::Handover {
            node,
            to,
            unless_changed,
        } => {
            if let Some(changed) = changed_since_read(ctx, &key.0, unless_changed).await? {
                // The pass is woken by the pod's change and decides again.
                info!(ns = %key.0, %node, pod = %changed, "not handing the node over: its agent changed since the pass read it (it may be Ready now, and the budget did not pay for it)");
                return Ok(None);
            }
            hand_over(ctx, key, found, owned, node, *to).await?;
            Ok(None)
        }
        Step::AlignHashes { pods, hash } => {
            relabel_pods(ctx, ns, pods, hash).await?;
            Ok(None)
        }
        Step::Promote(p) => {
            promote(ctx, key, found, p).await?;
            if !matches!(p, PromotionStep::NudgeCanary) {
                crash_point("promotion");
            }
            Ok(None)
        }
    }
}

/// Writes the target's template (guarded by the generation the pass read)
/// and remembers the generation the write returned.
async fn write_target(
    ctx: &Context,
    key: &RolloutKey,
    found: &Found,
    template: serde_json::Value,
) -> Result<()> {
    let dss: Api<DaemonSet> = Api::namespaced(ctx.client.clone(), &key.0);
    let generation = found.target.metadata.generation.unwrap_or_default();
    let ops = json!([
        {"op": "test", "path": "/metadata/generation", "value": generation},
        {"op": "replace", "path": "/spec/template", "value": template}
    ]);
    let patch: Patch<serde_json::Value> = Patch::Json(serde_json::from_value(ops)?);
    let written = dss
        .patch(&found.target.name_any(), &patch_params(), &patch)
        .await?;
    let g = written.metadata.generation.unwrap_or_default();
    ctx.memory(key, |m| m.expectations.daemonset_written(g));
    crash_point("template");
    Ok(())
}

/// Takes the handover expression off the target's template, if it has it.
async fn clear_target(ctx: &Context, key: &RolloutKey, found: &Found) -> Result<()> {
    if !found.view.target_expression {
        return Ok(());
    }
    info!(ns = %key.0, daemonset = %found.target.name_any(), "taking the handover expression off the target");
    let t = objects::target_template(&target_template(found), &found.key, false);
    write_target(ctx, key, found, t).await
}

/// Deletes the canary (the one this pass found, by UID).
async fn delete_canary(ctx: &Context, found: &Found, policy: PropagationPolicy) -> Result<()> {
    let Some(c) = found.live_canary() else {
        return Ok(());
    };
    let dss: Api<DaemonSet> =
        Api::namespaced(ctx.client.clone(), &c.namespace().unwrap_or_default());
    info!(canary = %c.name_any(), ?policy, "deleting the canary DaemonSet");
    let params = DeleteParams {
        propagation_policy: Some(policy),
        preconditions: Some(Preconditions {
            uid: c.metadata.uid.clone(),
            resource_version: None,
        }),
        ..Default::default()
    };
    match dss.delete(&c.name_any(), &params).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Writes a node's handover label, remembering first (a write that times
/// out may still land) the serving agents it takes away: those whose
/// controller deletes them in the new state. At `surge` the leaving agent
/// stays until the node moves on (the engine sees it leaving through the
/// label); remembered as deleted, it would read as no longer serving to
/// the handover itself.
async fn hand_over(
    ctx: &Context,
    key: &RolloutKey,
    found: &Found,
    owned: &[OwnedPod<'_>],
    node: &str,
    to: HandoverState,
) -> Result<()> {
    let now = Timestamp::now();
    let expression = found.view.target_expression;
    for p in owned
        .iter()
        .filter(|p| p.pod.node == node && !p.pod.deleting)
    {
        let taken = match p.owner {
            Owner::Target => expression && !to.target_runs(),
            Owner::Canary => !to.canary_runs(),
        };
        if taken {
            ctx.memory(key, |m| m.expectations.pod_deleted(p.pod.uid, now));
            ctx.triggers.deleting(p.pod.uid);
        }
    }
    info!(ns = %key.0, %node, state = ?to, "handing the node over");
    let patch = json!({"metadata": {"labels": {found.key.clone(): to.label_value()}}});
    let nodes: Api<Node> = Api::all(ctx.client.clone());
    match nodes
        .patch(node, &patch_params(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 404 => {}
        Err(e) => return Err(e.into()),
    }
    crash_point("label");
    Ok(())
}

/// The first of `pods` whose resourceVersion, read now from the API server,
/// is not the one the pass decided on (`unchanged_since`); a pod gone counts
/// as unchanged (its node has no agent to lose). A handover label write
/// cannot carry a pod's precondition as a deletion does, so this read
/// stands in for it: what is left is the moment between this read and the
/// label write, instead of the caches' lag.
async fn changed_since_read(ctx: &Context, ns: &str, pods: &[PodRef]) -> Result<Option<String>> {
    let api: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
    for r in pods {
        let Some(seen) = r.unchanged_since.as_deref() else {
            continue;
        };
        let Some(pod) = api.get_opt(&r.name).await? else {
            continue;
        };
        let same_pod = pod.metadata.uid.as_deref() == Some(r.uid.as_str());
        if same_pod && pod.metadata.resource_version.as_deref() != Some(seen) {
            return Ok(Some(r.name.clone()));
        }
    }
    Ok(None)
}

/// Sets each pod's hash label to `hash`, without the canary's labels.
async fn relabel_pods(ctx: &Context, ns: &str, pods: &[PodRef], hash: &str) -> Result<()> {
    let api: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
    let patch = objects::release_patch(hash);
    for p in pods {
        match api
            .patch(&p.name, &patch_params(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

fn promoting_taint(found: &Found, node: &str) -> NodeTaint {
    NodeTaint {
        node: node.to_string(),
        key: PROMOTING_TAINT.to_string(),
        value: found.rollout_id.clone(),
        effect: "NoSchedule".to_string(),
    }
}

/// One step of the promotion.
async fn promote(
    ctx: &Context,
    key: &RolloutKey,
    found: &Found,
    step: &PromotionStep,
) -> Result<()> {
    let ns = key.0.as_str();
    match step {
        PromotionStep::Taint { nodes } => {
            for n in nodes {
                info!(%ns, node = %n, "promotion: tainting the node so neither DaemonSet moves its agent");
                // Remembered once taken: the node cache may show it late
                // (a write refused is derived again by the next pass).
                if device_writes::add_node_taint(ctx, &promoting_taint(found, n)).await? {
                    ctx.memory(key, |m| m.selector_taints.insert(n.clone()));
                }
            }
        }
        PromotionStep::NudgeCanary => {
            if let Some(c) = found.live_canary() {
                let dss: Api<DaemonSet> = Api::namespaced(ctx.client.clone(), ns);
                let patch = objects::nudge_patch(&Timestamp::now().to_string());
                dss.patch(&c.name_any(), &patch_params(), &Patch::Merge(&patch))
                    .await?;
            }
        }
        PromotionStep::WriteTarget => {
            if let Some(c) = found.live_canary() {
                info!(%ns, daemonset = %found.target.name_any(), "promotion: writing the canary's template to the target");
                let canary = serde_json::to_value(&c.spec.template).unwrap_or_default();
                let t = objects::target_template(&canary, &found.key, false);
                write_target(ctx, key, found, t).await?;
            }
        }
        PromotionStep::Release { pods, hash } => {
            info!(%ns, pods = pods.len(), "promotion: releasing the canary's pods to the target");
            relabel_pods(ctx, ns, pods, hash).await?;
        }
        PromotionStep::DeleteCanary => {
            delete_canary(ctx, found, PropagationPolicy::Orphan).await?;
        }
        PromotionStep::Untaint { nodes } => {
            for n in nodes {
                device_writes::remove_node_taint(ctx, &promoting_taint(found, n)).await?;
                ctx.memory(key, |m| m.selector_taints.remove(n));
            }
        }
        PromotionStep::RemoveLabels { nodes } => {
            let patch = json!({"metadata": {"labels": {found.key.clone(): null}}});
            let api: Api<Node> = Api::all(ctx.client.clone());
            for n in nodes {
                match api.patch(n, &patch_params(), &Patch::Merge(&patch)).await {
                    Ok(_) => {}
                    Err(kube::Error::Api(s)) if s.code == 404 => {}
                    Err(e) => return Err(e.into()),
                }
            }
        }
    }
    Ok(())
}
