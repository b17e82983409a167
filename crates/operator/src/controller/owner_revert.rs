//! `spec.ownerRevert` in the operator: the owner's version fields put back
//! through one JSON patch of its custom resource, each field tested first
//! for the value that made the failed template (a person's change since is
//! never written over). The plan is core's ([`saferollout_core::owner`]);
//! the owner's own reconcile then writes the last good template, and the
//! engine brings the nodes back to it.

use kube::ResourceExt;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, Patch};
use saferollout_api::{SafeRollout, SafeRolloutStatus};
use saferollout_core::owner::{OwnerRevertPlan, OwnerView, gitops_manager, names_owner};
use serde_json::json;
use tracing::{info, warn};

use super::error::Result;
use super::writing::{is_failed_guard, patch_params};
use super::{Context, RolloutKey};

/// The owner's API, as the DaemonSet's ownerReference (`api_version`) and
/// `spec.ownerRevert` (its plural) name it.
fn owner_api(
    ctx: &Context,
    api_version: &str,
    kind: &str,
    plural: &str,
    namespace: Option<&str>,
) -> Api<DynamicObject> {
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    let resource =
        ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural);
    match namespace {
        Some(ns) => Api::namespaced_with(ctx.client.clone(), ns, &resource),
        None => Api::all_with(ctx.client.clone(), &resource),
    }
}

/// The GitOps tool that manages the owner `spec.ownerRevert` names (read
/// from the owner's labels and annotations), while the DaemonSet carries
/// another revision than the stable one: only then can a revert come. A
/// failed read is logged and reads as none (the revert's own write would
/// fail the same way).
pub async fn gitops(
    sr: &SafeRollout,
    ctx: &Context,
    status: &SafeRolloutStatus,
    world: &super::snapshot::World,
) -> Option<String> {
    let revert = sr.spec.owner_revert.as_ref()?;
    let ds = world.ds.as_deref()?;
    if world.current_revision() == status.stable_revision.as_deref() {
        return None;
    }
    let owner = OwnerView::of(ds.metadata.owner_references.as_deref())?;
    if !names_owner(revert, &owner) {
        return None;
    }
    let (_, plural, kind, namespaced) = revert.resource.parts();
    let ns = sr.namespace();
    let api = owner_api(
        ctx,
        owner.api_version,
        kind,
        plural,
        ns.as_deref().filter(|_| namespaced),
    );
    match api.get_metadata(&revert.name).await {
        Ok(meta) => gitops_manager(meta.labels(), meta.annotations()),
        Err(e) => {
            warn!(owner = %owner.describe(), error = %e, "reading the DaemonSet's owner");
            None
        }
    }
}

/// The JSON patch of `plan`: per field, a test of the failed value, then
/// the last good one.
fn operations(plan: &OwnerRevertPlan) -> serde_json::Value {
    plan.fields
        .iter()
        .flat_map(|f| {
            [
                json!({"op": "test", "path": f.path, "value": f.from}),
                json!({"op": "replace", "path": f.path, "value": f.to}),
            ]
        })
        .collect()
}

/// Patches the owner's custom resource as `plan` says. A failed test (the
/// fields no longer hold the failed values: put back already, or changed by
/// someone) writes nothing and is no error: the next pass decides again
/// from what the DaemonSet then carries.
pub async fn revert(ctx: &Context, key: &RolloutKey, plan: &OwnerRevertPlan) -> Result<()> {
    let api = owner_api(
        ctx,
        &plan.api_version,
        &plan.kind,
        &plan.plural,
        plan.namespace.as_deref(),
    );
    let patch: Patch<serde_json::Value> = Patch::Json(serde_json::from_value(operations(plan))?);
    info!(ns = %key.0, name = %key.1, owner = %plan.describe(), "reverting through the DaemonSet's owner");
    match ctx
        .write_slots
        .run(api.patch(&plan.name, &patch_params(), &patch))
        .await
    {
        Err(kube::Error::Api(s)) if is_failed_guard(&s) => {
            warn!(ns = %key.0, name = %key.1, owner = %plan.describe(), "the owner's fields no longer hold the failed release's values: not written");
            Ok(())
        }
        r => {
            r?;
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use saferollout_core::owner::FieldRevert;

    #[test]
    fn each_field_is_tested_before_it_is_put_back() {
        let plan = OwnerRevertPlan {
            api_version: "nvidia.com/v1".into(),
            kind: "ClusterPolicy".into(),
            plural: "clusterpolicies".into(),
            name: "cluster-policy".into(),
            namespace: None,
            fields: vec![FieldRevert {
                path: "/spec/devicePlugin/version".into(),
                from: "v2".into(),
                to: "v1".into(),
            }],
        };
        assert_eq!(
            operations(&plan),
            json!([
                {"op": "test", "path": "/spec/devicePlugin/version", "value": "v2"},
                {"op": "replace", "path": "/spec/devicePlugin/version", "value": "v1"},
            ])
        );
    }
}
