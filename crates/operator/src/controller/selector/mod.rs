//! `strategy: Selector` in the operator (`docs/design/selector-strategy.md`):
//! the pair of DaemonSets found in the caches ([`Found`]), what the engine
//! and the translation read of it (built by
//! `saferollout_core::selector::observe`), and the executor of the
//! translation's steps ([`steps`]). Decisions stay in `core`.

pub mod steps;

use std::collections::BTreeSet;
use std::sync::Arc;

use jiff::Timestamp;
use k8s_openapi::api::apps::v1::{ControllerRevision, DaemonSet};
use k8s_openapi::api::core::v1::PodTemplateSpec;
use kube::ResourceExt;
use kube::runtime::reflector::ObjectRef;
use saferollout_api::{
    PROMOTING_TAINT, REVISION_HASH_LABEL, SafeRollout, SafeRolloutStatus, Strategy,
};
use saferollout_core::expectations::Expectations;
use saferollout_core::objects::{SlimNode, SlimPod};
use saferollout_core::revision::revision_hash;
use saferollout_core::selector::observe::{Found as PairFound, OwnedRevision, PairView};
use saferollout_core::selector::{
    CANARY_OF_LABEL, Context, OwnedPod, Owner, PromotionFacts, canary_name, handover_label_key,
    judged_nodes, lay_deletions, node_agents,
};
use saferollout_core::views::AgentPod;

use super::caches::Caches;

/// The pair as one pass found it.
pub struct Found {
    /// The rollout's handover label key on nodes.
    pub key: String,
    pub rollout_id: String,
    pub target: Arc<DaemonSet>,
    pub canary: Option<Arc<DaemonSet>>,
    /// Both DaemonSets' ControllerRevisions, with their parsed templates.
    revisions: Vec<(Owner, Arc<ControllerRevision>, Arc<PodTemplateSpec>)>,
    pub view: PairView,
}

/// `strategy: Selector`.
pub fn applies(sr: &SafeRollout) -> bool {
    sr.spec.strategy == Strategy::Selector
}

fn controller_uid(meta: &kube::api::ObjectMeta) -> Option<&str> {
    meta.owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true))
        .map(|o| o.uid.as_str())
}

/// The canary of `sr` in the caches: the DaemonSet of its name that `sr`
/// controls (one of that name it does not control is not its canary, and
/// the canary's creation then fails, which the pass reports).
pub fn canary_of(sr: &SafeRollout, caches: &Caches) -> Option<Arc<DaemonSet>> {
    let ns = sr.namespace().unwrap_or_default();
    let name = canary_name(&sr.spec.target_ref.name);
    let uid = sr.metadata.uid.as_deref()?;
    caches
        .daemonsets
        .get(&ns)?
        .get(&ObjectRef::new(&name).within(&ns))
        .filter(|c| controller_uid(&c.metadata) == Some(uid))
}

/// A pod without a controller, without the canary label and with a hash of
/// the target's: the promotion released it, the canary's controller let it
/// go and the target's has not adopted it yet (it will: the pod matches its
/// selector). Left out, its node would read as having no agent for that
/// moment. It counts as the canary's until adopted, so the promotion's last
/// steps (untaint, then remove the labels) wait for the adoption; its hash
/// still names the target's revision ([`PairView::pod_revision`]).
fn released_in_transit(meta: &kube::api::ObjectMeta, view: &PairView) -> bool {
    let labels = meta.labels.as_ref();
    let hash = labels.and_then(|l| l.get(REVISION_HASH_LABEL));
    controller_uid(meta).is_none()
        && labels.is_none_or(|l| !l.contains_key(CANARY_OF_LABEL))
        && hash.is_some_and(|h| view.pod_revision(None, h).is_some())
}

impl Found {
    /// Reads the pair of `sr` (whose target is `target`) from the caches.
    pub fn find(
        sr: &SafeRollout,
        caches: &Caches,
        target: Arc<DaemonSet>,
        rollout_id: &str,
    ) -> Found {
        let ns = sr.namespace().unwrap_or_default();
        let canary = canary_of(sr, caches);
        let target_uid = target.metadata.uid.clone().unwrap_or_default();
        let canary_uid = canary.as_ref().and_then(|c| c.metadata.uid.clone());
        let revisions: Vec<(Owner, Arc<ControllerRevision>, Arc<PodTemplateSpec>)> = caches
            .revisions
            .in_namespace(&ns)
            .into_iter()
            .filter_map(|cr| {
                let owner = match controller_uid(&cr.metadata) {
                    Some(u) if u == target_uid => Owner::Target,
                    Some(u) if Some(u) == canary_uid.as_deref() => Owner::Canary,
                    _ => return None,
                };
                let (template, _) = caches.templates.get(&cr)?;
                Some((owner, cr, template))
            })
            .collect();
        let key = handover_label_key(rollout_id);
        let owned: Vec<OwnedRevision> = revisions
            .iter()
            .filter_map(|(owner, cr, t)| {
                Some(OwnedRevision {
                    owner: *owner,
                    hash: revision_hash(cr)?,
                    number: cr.revision.unwrap_or_default(),
                    template: t,
                })
            })
            .collect();
        // A canary being deleted is gone for the decisions (the model
        // deletes it at once): its generation moved with the deletion, so
        // it would read as unobserved and never held, and a step written
        // to it now is lost. Its pods stay its own (`owner_of`) until the
        // garbage collector hands them over or deletes them.
        let view = PairView::of(&PairFound {
            key: &key,
            target: &target,
            canary: canary
                .as_deref()
                .filter(|c| c.metadata.deletion_timestamp.is_none()),
            revisions: &owned,
        });
        drop(owned);
        Found {
            key,
            rollout_id: rollout_id.to_string(),
            target,
            canary,
            revisions,
            view,
        }
    }

    /// The canary, unless it is being deleted.
    pub fn live_canary(&self) -> Option<&Arc<DaemonSet>> {
        self.canary
            .as_ref()
            .filter(|c| c.metadata.deletion_timestamp.is_none())
    }

    /// Which of the two DaemonSets controls a pod (`None`: neither).
    pub fn owner_of(&self, meta: &kube::api::ObjectMeta) -> Option<Owner> {
        let uid = controller_uid(meta)?;
        if Some(uid) == self.target.metadata.uid.as_deref() {
            Some(Owner::Target)
        } else if Some(uid) == self.canary.as_ref().and_then(|c| c.metadata.uid.as_deref()) {
            Some(Owner::Canary)
        } else {
            None
        }
    }

    /// A pod of the pair: controlled by either DaemonSet, or released to
    /// the target and not adopted yet ([`released_in_transit`]).
    pub fn claims(&self, meta: &kube::api::ObjectMeta) -> bool {
        self.owner_of(meta).is_some() || released_in_transit(meta, &self.view)
    }

    /// The stripped template of a revision by content, and its number
    /// (the last-good backup records it).
    pub fn template_of(&self, revision: &str) -> Option<(serde_json::Value, i64)> {
        self.revisions.iter().find_map(|(owner, cr, t)| {
            let hash = revision_hash(cr)?;
            (self.view.revision_of(*owner, hash) == Some(revision)).then(|| {
                let v = serde_json::to_value(t.as_ref()).unwrap_or_default();
                (
                    saferollout_core::selector::template::strip(&v, &self.key),
                    cr.revision.unwrap_or_default(),
                )
            })
        })
    }

    /// The agent pods of both DaemonSets with their owners, their revisions
    /// by content, and the operator's memory of its deletions laid over
    /// them (see [`lay_deletions`]).
    pub fn owned_pods<'a>(
        &'a self,
        pods: &'a [Arc<SlimPod>],
        expectations: &mut Expectations,
        now: Timestamp,
    ) -> Vec<OwnedPod<'a>> {
        let mut owned: Vec<OwnedPod<'a>> = pods
            .iter()
            .filter_map(|p| {
                let mut pod = AgentPod::of(p)?;
                let hash = pod.revision;
                let owner = match self.owner_of(&p.metadata) {
                    Some(owner) => owner,
                    None if released_in_transit(&p.metadata, &self.view) => Owner::Canary,
                    None => return None,
                };
                pod.revision = self.view.pod_revision(Some(owner), hash).unwrap_or(hash);
                Some(OwnedPod { owner, pod, hash })
            })
            .collect();
        lay_deletions(&mut owned, expectations, now);
        owned
    }

    /// The translation's context. `taints_written`: the promotion taints
    /// this replica wrote that the node cache may not show yet.
    pub fn context<'a>(
        &'a self,
        pods: &[OwnedPod<'a>],
        nodes: &'a [Arc<SlimNode>],
        status: &'a SafeRolloutStatus,
        spec_is_target: bool,
        taints_written: &'a BTreeSet<String>,
        order: saferollout_core::handover::HandoverOrder,
    ) -> Context<'a> {
        let states = nodes
            .iter()
            .filter_map(|n| {
                let v = n.metadata.labels.as_ref()?.get(&self.key)?;
                let state = saferollout_core::handover::HandoverState::of_label(Some(v)).ok()?;
                Some((n.metadata.name.as_deref()?, state))
            })
            .collect();
        let mut by_node: std::collections::BTreeMap<&str, Vec<OwnedPod>> = Default::default();
        for p in pods {
            by_node.entry(p.pod.node).or_default().push(*p);
        }
        let agents = by_node
            .iter()
            .map(|(n, ps)| (*n, node_agents(ps, |_| true)))
            .collect();
        let mut tainted: BTreeSet<&str> = nodes
            .iter()
            .filter(|n| {
                n.spec
                    .as_ref()
                    .and_then(|s| s.taints.as_ref())
                    .is_some_and(|ts| {
                        ts.iter().any(|t| {
                            t.key == PROMOTING_TAINT
                                && t.value.as_deref() == Some(self.rollout_id.as_str())
                        })
                    })
            })
            .filter_map(|n| n.metadata.name.as_deref())
            .collect();
        let names: BTreeSet<&str> = nodes
            .iter()
            .filter_map(|n| n.metadata.name.as_deref())
            .collect();
        tainted.extend(
            taints_written
                .iter()
                .map(String::as_str)
                .filter(|n| names.contains(n)),
        );
        let pair = self.view.pair();
        Context {
            pair,
            order,
            states,
            pods: by_node,
            agents,
            spec_is_target,
            target_hash: pair.target.and(self.view.target.hash.clone()),
            stable: status.stable_revision.as_deref(),
            judged: judged_nodes(status),
            promotion: PromotionFacts {
                tainted,
                canary_held: self.view.canary.as_ref().is_some_and(|c| c.held),
                target_on_canary: self.view.target_on_canary(),
                target_written: self.view.target_written(),
                target_has_expression: self.view.target_expression,
            },
        }
    }
}
