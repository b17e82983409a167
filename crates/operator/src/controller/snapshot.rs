//! Dereference: everything one reconcile of a SafeRollout reads, taken from
//! the caches (no API call but the rare ones marked), then handed to the pure
//! decision as borrowed views.

use std::sync::Arc;

use jiff::Timestamp;
use k8s_openapi::api::apps::v1::{ControllerRevision, DaemonSet};
use k8s_openapi::api::core::v1::PodTemplateSpec;
use kube::ResourceExt;
use saferollout_api::{
    ABORT_ANNOTATION, APPROVE_ANNOTATION, BACKUP_REVISION_LABEL, PreflightStatus, RETRY_ANNOTATION,
    SafeRollout, SafeRolloutStatus,
};
use saferollout_core::eligibility::eligibility;
use saferollout_core::expectations::Expectations;
use saferollout_core::objects::{SlimNode, SlimPod};
use saferollout_core::revision::{
    RevisionTemplate, backup_template_json, content_hash, current_revision, revision_hash,
};
use saferollout_core::rollout::{BackupView, Decision, Observed, Requests, SpecTemplate};
use saferollout_core::views::{
    AgentPod, DaemonSetView, NodeView, NodesByName, PodsByNode, live_pods, pods_by_node,
};

use super::caches::Caches;
use crate::metrics::NodeCounts;

/// The objects one reconcile reads, held while it decides.
pub struct World {
    pub ds: Option<Arc<DaemonSet>>,
    /// The DaemonSet's own ControllerRevisions, with their parsed templates.
    revisions: Vec<(Arc<ControllerRevision>, Arc<PodTemplateSpec>)>,
    pub backup: Option<Arc<ControllerRevision>>,
    /// The content hash of the template `backup` holds.
    pub backup_content: Option<String>,
    /// The content hash of each of the DaemonSet's revisions' templates.
    revision_contents: std::collections::BTreeMap<String, String>,
    pods: Vec<Arc<SlimPod>>,
    /// Sorted by name (shared with other passes until a node changes).
    nodes: Arc<Vec<Arc<SlimNode>>>,
    /// The older SafeRollout that targets the same DaemonSet, if any.
    pub owned_by_other: Option<String>,
    /// What the device gates read.
    pub devices: super::devices::DeviceWorld,
    /// Under `strategy: Selector`: the pair of DaemonSets (`pods` then holds
    /// both one's agent pods).
    pub selector: Option<super::selector::Found>,
}

impl World {
    fn revision_views(&self) -> Vec<RevisionTemplate<'_>> {
        self.revisions
            .iter()
            .filter_map(|(cr, t)| {
                Some(RevisionTemplate {
                    hash: revision_hash(cr)?,
                    number: cr.revision.unwrap_or(0),
                    template: t,
                })
            })
            .collect()
    }

    /// The revision the DaemonSet's template is, by content (under
    /// `strategy: Selector`, the revision the engine sees as current: the
    /// active canary's, else the target's, named by content).
    pub fn current_revision(&self) -> Option<&str> {
        if let Some(found) = &self.selector {
            return found.view.pair().current();
        }
        let ds = self.ds.as_ref()?;
        current_revision(&ds.spec.template, &self.revision_views())
    }

    /// The DaemonSet's agent pods, as cached.
    pub fn pods(&self) -> &[Arc<SlimPod>] {
        &self.pods
    }

    /// Views of the DaemonSet's agent pods.
    pub fn agent_pods(&self) -> impl Iterator<Item = AgentPod<'_>> {
        self.pods.iter().filter_map(|p| AgentPod::of(p))
    }
}

/// Whether `meta` names the object of UID `uid` among its owners (an
/// empty UID owns nothing).
pub(super) fn owned_by(meta: &kube::api::ObjectMeta, uid: &str) -> bool {
    !uid.is_empty() && meta.owner_references.iter().flatten().any(|o| o.uid == uid)
}

pub use saferollout_core::rollout::backup_name;

/// The content hash of the template a last-good backup holds.
pub fn backup_content(cr: &ControllerRevision) -> Option<String> {
    backup_template_json(cr).map(content_hash)
}

/// `spec.ownerRevert`'s plan for this pass ([`Observed::owner_revert`]): from
/// the DaemonSet's template back to the last good backup's, through the
/// owner it names, which must be the DaemonSet's controller owner.
fn owner_revert_plan(
    sr: &SafeRollout,
    world: &World,
) -> Option<Result<saferollout_core::owner::OwnerRevertPlan, String>> {
    use saferollout_core::owner::{OwnerView, names_owner, revert_plan};
    let revert = sr.spec.owner_revert.as_ref()?;
    let ds = world.ds.as_deref()?;
    let owner = OwnerView::of(ds.metadata.owner_references.as_deref())?;
    if !names_owner(revert, &owner) {
        return Some(Err(format!(
            "it names {} {:?}, but the DaemonSet's controller owner is {}",
            revert.resource.as_str(),
            revert.name,
            owner.describe()
        )));
    }
    let Some(good) = world.backup.as_deref().and_then(backup_template_json) else {
        return Some(Err(
            "no last good template was backed up to revert to".into()
        ));
    };
    let failed = serde_json::to_value(&ds.spec.template).unwrap_or_default();
    Some(revert_plan(
        &owner,
        &sr.namespace().unwrap_or_default(),
        good,
        &failed,
    ))
}

/// Reads what a reconcile of `sr` needs from the caches.
pub fn dereference(sr: &SafeRollout, caches: &Caches) -> World {
    let templates = &caches.templates;
    let ns = sr.namespace().unwrap_or_default();
    let ds = caches.target_daemonset(sr);
    let ds_uid = ds
        .as_ref()
        .and_then(|d| d.metadata.uid.clone())
        .unwrap_or_default();
    let sr_uid = sr.metadata.uid.clone().unwrap_or_default();
    let all_revisions = caches.revisions.in_namespace(&ns);
    let mut revision_contents = std::collections::BTreeMap::new();
    let revisions = all_revisions
        .iter()
        .filter(|cr| owned_by(&cr.metadata, &ds_uid))
        .filter_map(|cr| {
            let (template, hash) = templates.get(cr)?;
            if let Some(rev) = revision_hash(cr) {
                revision_contents.insert(rev.to_string(), hash);
            }
            Some((cr.clone(), template))
        })
        .collect();
    let stable = sr.status.as_ref().and_then(|s| s.stable_revision.clone());
    let backup = stable.and_then(|rev| {
        let name = backup_name(&sr.name_any(), &rev);
        all_revisions
            .iter()
            .find(|cr| cr.name_any() == name && owned_by(&cr.metadata, &sr_uid))
            .cloned()
    });
    let backup_content = backup.as_deref().and_then(backup_content);
    let selector = ds
        .as_ref()
        .filter(|_| super::selector::applies(sr))
        .map(|t| {
            let id = super::rollout_id(&ns, &sr.name_any());
            super::selector::Found::find(sr, caches, t.clone(), &id)
        });
    let pods = caches
        .pods
        .in_namespace(&ns)
        .into_iter()
        .filter(|p| match &selector {
            Some(found) => found.claims(&p.metadata),
            None => owned_by(&p.metadata, &ds_uid),
        })
        .collect();
    let owned_by_other = caches
        .rollouts_in(&ns)
        .into_iter()
        .filter(|other| {
            other.spec.target_ref.name == sr.spec.target_ref.name && other.uid() != sr.uid()
        })
        .filter(|other| {
            (other.creation_timestamp(), other.name_any())
                < (sr.creation_timestamp(), sr.name_any())
        })
        .map(|other| other.name_any())
        .min();
    World {
        ds,
        revisions,
        backup,
        backup_content,
        revision_contents,
        pods,
        nodes: caches.nodes_by_name(),
        owned_by_other,
        devices: super::devices::gather(sr, &caches.devices),
        selector,
    }
}

/// What the reconcile adds to the caches' picture.
pub struct Extras<'a> {
    pub spec_template: Option<SpecTemplate<'a>>,
    pub preflight: Option<&'a PreflightStatus>,
    pub rollout_id: &'a str,
    /// What the gates beyond podsReady and allocatable observe.
    pub evidence: saferollout_core::gates::Evidence<'a>,
    /// What the operator's administrator lets SafeRollouts ask for.
    pub limits: &'a saferollout_core::limits::AdminLimits,
    pub now: Timestamp,
    /// When the stalest cache the pass reads last heard from the API server.
    pub caches_heard_at: Option<Timestamp>,
    /// Under `strategy: Selector`: what the pass knows beyond the caches.
    pub selector: Option<SelectorExtras<'a>>,
    /// The SafeRolloutPolicies governing the rollout (see [`super::fleet`]).
    pub fleet: Option<&'a saferollout_core::fleet::Fleet<'a>>,
    /// The GitOps tool managing the owner `spec.ownerRevert` names.
    pub owner_gitops: Option<&'a str>,
}

/// What a `Selector` pass knows beyond the caches.
pub struct SelectorExtras<'a> {
    /// `spec.template`'s revision by content (as the API server stores it:
    /// from the dry run), when there is one.
    pub spec_revision: Option<&'a str>,
    /// The promotion taints this replica wrote (the node cache may lag).
    pub taints_written: &'a std::collections::BTreeSet<String>,
}

/// Builds the views of `world` and decides; also counts nodes for the metrics.
pub fn decide(
    sr: &SafeRollout,
    status: &SafeRolloutStatus,
    world: &World,
    extras: Extras,
    expectations: &mut Expectations,
) -> (Decision, NodeCounts) {
    let mut node_views: NodesByName = world
        .nodes
        .iter()
        .map(|n| NodeView::of(n))
        .map(|v| (v.name, v))
        .collect();
    expectations.apply_labels(&mut node_views, extras.rollout_id, extras.now);
    let revision_views = world.revision_views();
    let owned;
    let (pods, ds_view, revision_contents, spec_template) =
        match (&world.selector, extras.selector.as_ref()) {
            (Some(found), Some(more)) => {
                // Both DaemonSets shown to the engine as one.
                owned = found.owned_pods(&world.pods, expectations, extras.now);
                let ctx = found.context(
                    &owned,
                    &world.nodes,
                    status,
                    more.spec_revision == Some(found.view.target.revision.as_str()),
                    more.taints_written,
                    sr.spec.handover_order().into(),
                );
                let pods = saferollout_core::selector::engine_pods(&owned, &ctx);
                let carrier = ctx.pair.current();
                let spec_template = extras.spec_template.map(|t| SpecTemplate {
                    hash: t.hash,
                    in_place: more.spec_revision.is_some() && more.spec_revision == carrier,
                });
                (
                    pods,
                    Some(found.view.engine_view(&found.target)),
                    &found.view.contents,
                    spec_template,
                )
            }
            _ => {
                let mut pods: PodsByNode = pods_by_node(world.agent_pods());
                expectations.apply(&mut pods, extras.now);
                let ds_view = world.ds.as_ref().map(|ds| {
                    let current = current_revision(&ds.spec.template, &revision_views);
                    DaemonSetView::of(ds, current, revision_views.iter().map(|r| r.hash).collect())
                });
                (
                    pods,
                    ds_view,
                    &world.revision_contents,
                    extras.spec_template,
                )
            }
        };
    let annotations = sr.annotations();
    let owner_revert = owner_revert_plan(sr, world);
    let observed = Observed {
        spec: &sr.spec,
        generation: sr.metadata.generation,
        status,
        requests: Requests {
            retry: annotations.get(RETRY_ANNOTATION).map(String::as_str),
            approve: annotations.get(APPROVE_ANNOTATION).map(String::as_str),
            abort: annotations.get(ABORT_ANNOTATION).map(String::as_str),
        },
        owned_by_other: world.owned_by_other.as_deref(),
        preflight: extras.preflight,
        daemonset: ds_view.as_ref(),
        spec_template,
        name: sr.metadata.name.as_deref().unwrap_or_default(),
        backup: world.backup.as_ref().and_then(|b| {
            Some(BackupView {
                name: b.metadata.name.as_deref()?,
                // Found by the name of status's stable revision: one without
                // our label is still that name's (and checked as such).
                revision: b
                    .labels()
                    .get(BACKUP_REVISION_LABEL)
                    .or(status.stable_revision.as_ref())?,
                content: world.backup_content.as_deref(),
            })
        }),
        revision_contents,
        pods: &pods,
        nodes: &node_views,
        rollout_id: extras.rollout_id,
        evidence: &extras.evidence,
        limits: extras.limits,
        now: extras.now,
        caches_heard_at: extras.caches_heard_at,
        fleet: extras.fleet,
        owner_revert: owner_revert.as_ref(),
        owner_gitops: extras.owner_gitops,
    };
    let decision = saferollout_core::decide(&observed);
    let counts = ds_view
        .as_ref()
        .map(|ds| {
            let target = decision
                .status
                .target_revision
                .as_deref()
                .unwrap_or_default();
            let covered: Vec<_> = node_views
                .values()
                .filter(|n| eligibility(n, &ds.placement).is_eligible())
                .collect();
            NodeCounts {
                in_scope: covered.len(),
                on_target: covered
                    .iter()
                    .filter(|n| live_pods(&pods, n.name).any(|p| p.revision == target))
                    .count(),
            }
        })
        .unwrap_or_default();
    (decision, counts)
}
