//! Maps reflector events to the SafeRollouts they concern (kube-runtime's
//! `trigger_owners` and `trigger_others`) and sends them to [`Triggers`]:
//! an agent pod or a ControllerRevision to the rollouts targeting its
//! DaemonSet, a node to those it concerns, a probe pod or a backup to its
//! owner. Whether a change wakes anyone at all, [`super::wakes`] decides.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use k8s_openapi::api::apps::v1::{ControllerRevision, DaemonSet};
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::watcher::Event;
use saferollout_api::SafeRollout;
use saferollout_core::objects::{SlimNode, SlimPod};

use super::Caches;
use super::triggers::{Cause, Triggers};
use super::wakes::{
    DaemonSetMemo, DaemonSetWake, NodeMemo, Wake, daemonset_key, pod_change_wakes, pod_fingerprint,
    pod_key, removal_wakes,
};
use crate::controller::rollout_id;

/// Maps cache events to the SafeRollouts they concern.
#[derive(Clone)]
pub(super) struct Router {
    pub(super) caches: Arc<Caches>,
    pub(super) triggers: Arc<Triggers>,
    /// Feeds [`Caches::all_rollouts`] when namespaces are watched one by one
    /// (watching all, that store is the reflector's own).
    pub(super) merged: Option<Arc<Mutex<reflector::store::Writer<SafeRollout>>>>,
}

impl Router {
    /// SafeRollouts of `namespace` targeting DaemonSet `name`.
    fn targeting(&self, namespace: Option<&str>, name: &str, cause: Cause) {
        self.targeting_where(namespace, name, cause, |_| true)
    }

    /// Those of them `pick` selects.
    fn targeting_where(
        &self,
        namespace: Option<&str>,
        name: &str,
        cause: Cause,
        pick: impl Fn(&SafeRollout) -> bool,
    ) {
        let Some(ns) = namespace else { return };
        for sr in self.caches.rollouts_in(ns) {
            if targets(&sr, name) && pick(&sr) {
                self.triggers.send(ObjectRef::from_obj(&*sr), cause);
            }
        }
    }

    fn all_in(&self, namespace: Option<&str>, cause: Cause) {
        let rollouts = match namespace {
            Some(ns) => self.caches.rollouts_in(ns),
            None => self.caches.every_rollout(),
        };
        for sr in rollouts {
            self.triggers.send(ObjectRef::from_obj(&*sr), cause);
        }
    }

    pub(super) fn rollout_event(&self, ev: &Event<SafeRollout>) {
        let mut merged = self
            .merged
            .as_ref()
            .map(|m| m.lock().unwrap_or_else(|e| e.into_inner()));
        match ev {
            Event::Apply(sr) | Event::Delete(sr) => {
                if let Some(m) = merged.as_mut() {
                    m.apply_watcher_event(ev);
                }
                drop(merged);
                self.triggers
                    .send(ObjectRef::from_obj(sr), Cause::SafeRollout);
                // A deleted owner frees its DaemonSet for a waiting SafeRollout.
                self.targeting(
                    sr.namespace().as_deref(),
                    &sr.spec.target_ref.name,
                    Cause::SafeRollout,
                );
            }
            Event::InitDone => {
                // A namespace (re)listed: rebuild the merged store from every one.
                if let Some(m) = merged.as_mut() {
                    m.apply_watcher_event(&Event::Init);
                    for sr in self.caches.every_rollout() {
                        m.apply_watcher_event(&Event::InitApply((*sr).clone()));
                    }
                    m.apply_watcher_event(&Event::InitDone);
                }
                drop(merged);
                self.all_in(None, Cause::SafeRollout);
            }
            Event::Init | Event::InitApply(_) => {}
        }
    }

    /// The DaemonSet controller writes its DaemonSet's status counts with
    /// almost every pod change (at `maxUnavailable: 1` on 1,000 nodes, 2.4
    /// writes per replacement): only a change of what decisions read wakes
    /// the SafeRollouts targeting it, as for agent pods. Whether its pods are
    /// settled is read by preflight alone, and it flips twice with every
    /// replacement: it wakes only a SafeRollout that preflight blocked.
    pub(super) fn daemonset_event(
        &self,
        ev: &Event<DaemonSet>,
        fingerprints: &mut HashMap<String, DaemonSetMemo>,
    ) {
        let wake = |ds: &DaemonSet| {
            self.targeting(ds.namespace().as_deref(), &ds.name_any(), Cause::DaemonSet)
        };
        match ev {
            Event::Apply(ds) => {
                let now = DaemonSetMemo::of(ds);
                match fingerprints
                    .insert(daemonset_key(ds), now)
                    .map(|b| now.wakes(&b))
                {
                    None | Some(DaemonSetWake::Every) => wake(ds),
                    Some(DaemonSetWake::BlockedByPreflight) => self.targeting_where(
                        ds.namespace().as_deref(),
                        &ds.name_any(),
                        Cause::DaemonSet,
                        blocked_by_preflight,
                    ),
                    Some(DaemonSetWake::Nobody) => {}
                }
            }
            Event::Delete(ds) => {
                fingerprints.remove(&daemonset_key(ds));
                wake(ds);
            }
            Event::InitApply(ds) => {
                fingerprints.insert(daemonset_key(ds), DaemonSetMemo::of(ds));
                wake(ds);
            }
            Event::Init => fingerprints.clear(),
            Event::InitDone => {}
        }
    }

    /// Agent pods change several times per replacement (scheduled, started,
    /// Ready, its conditions' timestamps): only a change of what decisions
    /// read wakes the SafeRollouts targeting its DaemonSet, so one replacement
    /// does not queue passes that would decide the same thing again.
    pub(super) fn pod_event(&self, ev: &Event<SlimPod>, fingerprints: &mut HashMap<String, u64>) {
        let wake = |p: &SlimPod| {
            if let Some(owner) = p.owner_references().iter().find(|o| o.kind == "DaemonSet") {
                self.targeting(p.namespace().as_deref(), &owner.name, Cause::AgentPod);
            }
        };
        match ev {
            Event::Apply(p) => {
                let fp = pod_fingerprint(p);
                let before = fingerprints.insert(pod_key(p), fp);
                let own_deletion = p.metadata.deletion_timestamp.is_some()
                    && p.metadata
                        .uid
                        .as_deref()
                        .is_some_and(|uid| self.triggers.take_own_deletion(uid));
                if pod_change_wakes(before, fp, own_deletion) {
                    wake(p);
                }
            }
            Event::Delete(p) => {
                let before = fingerprints.remove(&pod_key(p));
                if let Some(uid) = p.metadata.uid.as_deref() {
                    self.triggers.not_deleting(uid);
                }
                if removal_wakes(before, self.node_is_ready(p)) {
                    wake(p);
                }
            }
            Event::InitApply(p) => {
                fingerprints.insert(pod_key(p), pod_fingerprint(p));
            }
            Event::Init => {
                fingerprints.clear();
                self.triggers.forget_own_deletions();
            }
            Event::InitDone => self.all_in(None, Cause::AgentPod),
        }
    }

    /// Whether the node of pod `p` is Ready in the cache (false when unknown).
    fn node_is_ready(&self, p: &SlimPod) -> bool {
        p.spec
            .as_ref()
            .and_then(|s| s.node_name.as_deref())
            .and_then(|n| self.caches.nodes.get(&ObjectRef::new(n)))
            .is_some_and(|n| saferollout_core::views::NodeView::of(&n).ready)
    }

    /// A probe pod changed: its owner judges it.
    pub(super) fn probe_pod_event(&self, ev: &Event<Pod>) {
        match ev {
            Event::Apply(p) | Event::Delete(p) => {
                if let (Some(ns), Some(owner)) = (
                    p.namespace(),
                    p.owner_references()
                        .iter()
                        .find(|o| o.kind == "SafeRollout"),
                ) {
                    self.triggers
                        .send(ObjectRef::new(&owner.name).within(&ns), Cause::ProbePod);
                }
            }
            Event::InitDone => self.all_in(None, Cause::ProbePod),
            Event::Init | Event::InitApply(_) => {}
        }
    }

    pub(super) fn revision_event(&self, ev: &Event<ControllerRevision>) {
        if let Event::Delete(cr) = ev {
            self.caches
                .templates
                .forget(cr.metadata.uid.as_deref().unwrap_or_default());
        }
        match ev {
            Event::Apply(cr) | Event::Delete(cr) => {
                let ns = cr.namespace();
                for owner in cr.owner_references() {
                    match owner.kind.as_str() {
                        "DaemonSet" => {
                            self.targeting(ns.as_deref(), &owner.name, Cause::ControllerRevision)
                        }
                        // Our own backup.
                        "SafeRollout" => {
                            if let Some(ns) = &ns {
                                self.triggers.send(
                                    ObjectRef::new(&owner.name).within(ns),
                                    Cause::ControllerRevision,
                                );
                            }
                        }
                        _ => {}
                    }
                }
            }
            Event::InitDone => self.all_in(None, Cause::ControllerRevision),
            Event::Init | Event::InitApply(_) => {}
        }
    }

    /// Nodes change often (heartbeats, conditions): only what decisions read
    /// wakes a SafeRollout, and only one the node concerns (see
    /// [`NodeMemo::wakes`]): with many SafeRollouts on a large cluster, each
    /// replacement changes its node twice (allocatable down and up again),
    /// and waking every SafeRollout for each made every one of them decide
    /// again over every node (at 5,000 nodes and 50 rollouts: 466 CPU-seconds
    /// for 5,000 replacements).
    pub(super) fn node_event(&self, ev: &Event<SlimNode>, memos: &mut HashMap<String, NodeMemo>) {
        // The store has the change already; passes it triggers come after.
        self.caches.sorted_nodes.invalidate();
        match ev {
            Event::Apply(n) => {
                let now = NodeMemo::of(n);
                let before = memos.insert(n.name_any(), now.clone());
                match now.wakes(before.as_ref()) {
                    Wake::Nobody => {}
                    Wake::Every => self.all_in(None, Cause::Node),
                    Wake::Concerned => self.concerned_by(n, &now, before.as_ref()),
                    Wake::Holder => {
                        for sr in self.caches.every_rollout() {
                            let id =
                                rollout_id(&sr.namespace().unwrap_or_default(), &sr.name_any());
                            if now.rollout.as_deref() == Some(id.as_str()) {
                                self.triggers.send(ObjectRef::from_obj(&*sr), Cause::Node);
                            }
                        }
                    }
                }
            }
            Event::Delete(n) => {
                memos.remove(&n.name_any());
                self.all_in(None, Cause::Node);
            }
            Event::InitApply(n) => {
                memos.insert(n.name_any(), NodeMemo::of(n));
            }
            Event::Init => memos.clear(),
            Event::InitDone => self.all_in(None, Cause::Node),
        }
    }

    /// Wakes the SafeRollouts node `n` concerns: the one whose label it
    /// carries (or carried), and those whose DaemonSet's pods may run on it
    /// (its template's or `spec.template`'s nodeSelector matches the node's
    /// labels; a DaemonSet not in the cache, or a template without
    /// nodeSelector, matches every node).
    fn concerned_by(&self, n: &SlimNode, now: &NodeMemo, before: Option<&NodeMemo>) {
        let labels = n.metadata.labels.as_ref();
        let holders: Vec<&str> = [
            now.rollout.as_deref(),
            before.and_then(|b| b.rollout.as_deref()),
        ]
        .into_iter()
        .flatten()
        .collect();
        for sr in self.caches.every_rollout() {
            // The rollout id is computed only for a node that carries (or
            // carried) one: most node changes concern nodes no rollout holds.
            let holds = !holders.is_empty() && {
                let id = rollout_id(&sr.namespace().unwrap_or_default(), &sr.name_any());
                holders.contains(&id.as_str())
            };
            if holds || may_run_on(&sr, self.caches.target_daemonset(&sr).as_deref(), labels) {
                self.triggers.send(ObjectRef::from_obj(&*sr), Cause::Node);
            }
        }
    }
}

/// Whether the agent of `sr` may run on a node with `labels`: the nodeSelector
/// of its DaemonSet's template or of the template the rollout brings
/// (`spec.template`, GitOps) matches them. A DaemonSet not in the cache, or a
/// template without nodeSelector, may run anywhere.
/// `sr` targets DaemonSet `name`, or has it as its canary (`strategy:
/// Selector`: its pods and status are the rollout's too).
fn targets(sr: &SafeRollout, name: &str) -> bool {
    sr.spec.target_ref.name == name
        || (sr.spec.strategy == saferollout_api::Strategy::Selector
            && saferollout_core::selector::canary_name(&sr.spec.target_ref.name) == name)
}

fn may_run_on(
    sr: &SafeRollout,
    ds: Option<&DaemonSet>,
    labels: Option<&std::collections::BTreeMap<String, String>>,
) -> bool {
    let Some(ds) = ds else { return true };
    let by_spec = sr.spec.template.as_ref().is_some_and(|t| {
        let of_spec = t.pointer("/spec/nodeSelector").and_then(|v| v.as_object());
        selects(
            of_spec.map(|m| {
                m.iter()
                    .map(|(k, v)| (k.as_str(), v.as_str().unwrap_or_default()))
            }),
            labels,
        )
    });
    let of_ds = ds
        .spec
        .template
        .spec
        .as_ref()
        .and_then(|s| s.node_selector.as_ref());
    by_spec
        || selects(
            of_ds.map(|m| m.iter().map(|(k, v)| (k.as_str(), v.as_str()))),
            labels,
        )
}

/// Whether a nodeSelector (none: every node) matches `labels`.
fn selects<'a>(
    selector: Option<impl Iterator<Item = (&'a str, &'a str)>>,
    labels: Option<&std::collections::BTreeMap<String, String>>,
) -> bool {
    let Some(mut selector) = selector else {
        return true;
    };
    selector.all(|(k, v)| labels.and_then(|l| l.get(k)).map(String::as_str) == Some(v))
}

/// Whether preflight holds `sr`'s rollout back: it enforces, and its last
/// run found an error (one that may be the DaemonSet's unsettled pods).
/// Under `Warn` errors do not block, and preflight does not run again once
/// the rollout started.
fn blocked_by_preflight(sr: &SafeRollout) -> bool {
    let enforced = sr
        .spec
        .preflight
        .as_ref()
        .map(|p| p.policy)
        .unwrap_or_default()
        == saferollout_api::PreflightPolicy::Enforce;
    enforced
        && sr
            .status
            .as_ref()
            .and_then(|s| s.preflight.as_ref())
            .is_some_and(|p| !p.passed)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_node_selector_matches_a_subset_of_the_labels() {
        let labels: std::collections::BTreeMap<String, String> = [
            ("pool".to_string(), "a".to_string()),
            ("zone".to_string(), "z".to_string()),
        ]
        .into();
        let sel = |pairs: &'static [(&'static str, &'static str)]| Some(pairs.iter().copied());
        assert!(selects(sel(&[("pool", "a")]), Some(&labels)));
        assert!(selects(sel(&[]), Some(&labels)));
        assert!(!selects(sel(&[("pool", "b")]), Some(&labels)));
        assert!(!selects(
            sel(&[("pool", "a"), ("gpu", "yes")]),
            Some(&labels)
        ));
        assert!(!selects(sel(&[("pool", "a")]), None));
        assert!(
            selects(None::<std::vec::IntoIter<(&str, &str)>>, None),
            "no selector: every node"
        );
    }

    #[test]
    fn only_an_enforced_failed_preflight_blocks() {
        let sr = |policy: Option<&str>, passed: Option<bool>| -> SafeRollout {
            let mut v = json!({
                "apiVersion": "saferollout.dev/v1alpha1", "kind": "SafeRollout",
                "metadata": {"name": "sr", "namespace": "ns"},
                "spec": {"targetRef": {"name": "plugin"}}
            });
            if let Some(p) = policy {
                v["spec"]["preflight"] = json!({"policy": p});
            }
            if let Some(passed) = passed {
                v["status"] = json!({"preflight": {"revision": "r2", "passed": passed, "errors": 1, "warnings": 0}});
            }
            serde_json::from_value(v).unwrap()
        };
        assert!(blocked_by_preflight(&sr(Some("Enforce"), Some(false))));
        assert!(!blocked_by_preflight(&sr(Some("Enforce"), Some(true))));
        assert!(!blocked_by_preflight(&sr(Some("Enforce"), None)));
        assert!(!blocked_by_preflight(&sr(Some("Warn"), Some(false))));
        assert!(
            !blocked_by_preflight(&sr(None, Some(false))),
            "Warn by default"
        );
    }
}
