//! Whether an object's change wakes any pass (kube-runtime's `Predicate`):
//! the router remembers per object a fingerprint of what decisions read, and
//! a change that moves none of it (a heartbeat, a DaemonSet's status counts,
//! a pod's probe time) queues no pass that would decide the same again.

use std::hash::Hash;

use k8s_openapi::api::apps::v1::DaemonSet;
use kube::ResourceExt;
use saferollout_api::ROLLOUT_LABEL;
use saferollout_core::objects::{SlimNode, SlimPod};

/// What the node router remembers of a node: fingerprints of what decisions
/// read, split by whom a change concerns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct NodeMemo {
    /// The node's labels but the operator's own (`saferollout.dev/stage`,
    /// `saferollout.dev/rollout`): a change may move the node into or out of
    /// any DaemonSet's nodeSelector.
    labels: u64,
    /// The operator's own labels.
    ours: u64,
    /// The value of `saferollout.dev/rollout`: the SafeRollout holding the node.
    pub(super) rollout: Option<String>,
    /// Taints, unschedulable, allocatable, the kept conditions (Ready and
    /// those other writers set, which `nodeConditions` reads).
    state: u64,
    /// When the kubelet last wrote the status (the Ready heartbeat): gates
    /// wait for a status written after a new agent became Ready.
    written: Option<i64>,
}

/// Whom a node change wakes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Wake {
    Nobody,
    /// A node that is new to the router, or whose labels changed.
    Every,
    /// The SafeRollouts the node concerns ([`Router::concerned_by`]).
    ///
    /// [`Router::concerned_by`]: super::router::Router::concerned_by
    Concerned,
    /// The SafeRollout holding the node (its label): a status write alone.
    Holder,
}

impl NodeMemo {
    pub(crate) fn of(n: &SlimNode) -> Self {
        use std::hash::Hasher;
        let ours_key = |k: &str| k == saferollout_api::STAGE_LABEL || k == ROLLOUT_LABEL;
        let mut labels = std::collections::hash_map::DefaultHasher::new();
        let mut ours = std::collections::hash_map::DefaultHasher::new();
        for (k, v) in n.metadata.labels.iter().flatten() {
            if ours_key(k) {
                (k, v).hash(&mut ours);
            } else {
                (k, v).hash(&mut labels);
            }
        }
        let mut state = std::collections::hash_map::DefaultHasher::new();
        if let Some(spec) = &n.spec {
            for t in spec.taints.iter().flatten() {
                (&t.key, &t.value, &t.effect).hash(&mut state);
            }
            spec.unschedulable.hash(&mut state);
        }
        if let Some(st) = &n.status {
            for (k, v) in st.allocatable.iter().flatten() {
                (k, &v.0).hash(&mut state);
            }
            for c in st.conditions.iter().flatten() {
                (&c.type_, &c.status).hash(&mut state);
            }
        }
        NodeMemo {
            labels: labels.finish(),
            ours: ours.finish(),
            rollout: n
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(ROLLOUT_LABEL))
                .cloned(),
            state: state.finish(),
            written: n
                .status
                .as_ref()
                .and_then(|st| st.conditions.as_ref())
                .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"))
                .and_then(|c| c.last_heartbeat_time.as_ref())
                .map(|t| t.0.as_second()),
        }
    }

    /// Whom the change from `before` to `self` wakes.
    pub(crate) fn wakes(&self, before: Option<&NodeMemo>) -> Wake {
        match before {
            None => Wake::Every,
            Some(b) if b.labels != self.labels => Wake::Every,
            Some(b) if b.ours != self.ours || b.state != self.state => Wake::Concerned,
            Some(b) if b.written != self.written && self.rollout.is_some() => Wake::Holder,
            Some(_) => Wake::Nobody,
        }
    }
}

/// Whether an agent pod's change from fingerprint `before` (`None`: first
/// seen) to `now` wakes its rollouts. Not when nothing decisions read
/// changed, nor for a pod first seen unscheduled (it is in no decision, see
/// `AgentPod::of`), nor when the change is the start of a deletion the
/// operator made (`own_deletion`, see [`Triggers::deleting`]).
pub(super) fn pod_change_wakes(before: Option<u64>, now: u64, own_deletion: bool) -> bool {
    match before {
        None => now != UNSCHEDULED,
        Some(b) => b != now && !own_deletion,
    }
}

/// A DaemonSet by namespace and name (its UID is in its fingerprint).
pub(super) fn daemonset_key(ds: &DaemonSet) -> String {
    format!("{}/{}", ds.namespace().unwrap_or_default(), ds.name_any())
}

/// What the DaemonSet router remembers of a DaemonSet: what decisions read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DaemonSetMemo {
    /// Identity, labels, annotations and owners, deletion, the spec (through
    /// `metadata.generation`, which every spec change moves) and
    /// `status.observedGeneration`. Not the status counts, which move with
    /// every pod change.
    read: u64,
    /// Whether its pods are settled (`saferollout_core::preflight::is_settled`),
    /// which only preflight reads.
    settled: Option<bool>,
}

/// Whom a DaemonSet change wakes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DaemonSetWake {
    Nobody,
    /// Only settled changed: the SafeRollouts preflight blocked (it may pass now).
    BlockedByPreflight,
    /// Every SafeRollout targeting it.
    Every,
}

impl DaemonSetMemo {
    pub(crate) fn of(ds: &DaemonSet) -> Self {
        use std::hash::Hasher;
        let mut h = std::collections::hash_map::DefaultHasher::new();
        let m = &ds.metadata;
        (&m.uid, m.generation, &m.labels, &m.annotations).hash(&mut h);
        m.deletion_timestamp.is_some().hash(&mut h);
        for o in m.owner_references.iter().flatten() {
            (&o.kind, &o.name, &o.uid).hash(&mut h);
        }
        ds.status
            .as_ref()
            .map(|s| s.observed_generation)
            .hash(&mut h);
        DaemonSetMemo {
            read: h.finish(),
            settled: ds
                .status
                .as_ref()
                .map(saferollout_core::preflight::is_settled),
        }
    }

    pub(crate) fn wakes(&self, before: &DaemonSetMemo) -> DaemonSetWake {
        if self.read != before.read {
            DaemonSetWake::Every
        } else if self.settled != before.settled {
            DaemonSetWake::BlockedByPreflight
        } else {
            DaemonSetWake::Nobody
        }
    }
}

/// Whether an agent pod's removal from the cluster wakes its rollouts, given
/// its fingerprint as last seen (`None`: never seen) and whether its node is
/// Ready. Not when it was last seen terminating on a Ready node: decisions
/// already leave a terminating pod out, so its removal changes nothing they
/// read (the DaemonSet controller's replacement pod wakes them once bound).
/// On a node that is not Ready, a terminating pod's deletion time decides
/// whether the node holds a slot of the budget, so its removal may free one.
/// At `maxUnavailable: 1` on 1,000 nodes, one pass in five of a replacement.
pub(super) fn removal_wakes(before: Option<u64>, node_ready: bool) -> bool {
    before != Some(TERMINATING) || !node_ready
}

/// A pod by UID (a pod recreated under the same name is another pod).
pub(super) fn pod_key(p: &SlimPod) -> String {
    p.metadata
        .uid
        .clone()
        .unwrap_or_else(|| format!("{}/{}", p.namespace().unwrap_or_default(), p.name_any()))
}

/// The fingerprint of every pod not bound to a node yet.
const UNSCHEDULED: u64 = 0;
/// The fingerprint of every pod being deleted, bound to a node: decisions
/// read no more of it than that and its timestamps, which do not change.
const TERMINATING: u64 = 1;

/// What of an agent pod decisions read: identity, labels and owner, node,
/// deletion, phase, readiness and the containers' states (the pod views of
/// `saferollout_core::views::AgentPod`, and the start times the logs gate
/// reads). Not its resourceVersion, nor timestamps only kubelets look at,
/// nor anything of a pod being deleted ([`TERMINATING`]): every decision
/// leaves such a pod out but for its creation and deletion times, which do
/// not change (the kubelet's last status writes of a terminating pod woke a
/// pass each).
pub(super) fn pod_fingerprint(p: &SlimPod) -> u64 {
    use std::hash::Hasher;
    let Some(node) = p.spec.as_ref().and_then(|s| s.node_name.as_ref()) else {
        return UNSCHEDULED;
    };
    if p.metadata.deletion_timestamp.is_some() {
        return TERMINATING;
    }
    let mut h = std::collections::hash_map::DefaultHasher::new();
    node.hash(&mut h);
    p.metadata.name.hash(&mut h);
    p.metadata.uid.hash(&mut h);
    p.metadata.labels.hash(&mut h);
    for o in p.metadata.owner_references.iter().flatten() {
        (&o.kind, &o.name, &o.uid).hash(&mut h);
    }
    if let Some(st) = p.status.as_ref() {
        st.phase.hash(&mut h);
        st.start_time.as_ref().map(|t| t.0).hash(&mut h);
        for c in st.conditions.iter().flatten() {
            (&c.type_, &c.status).hash(&mut h);
        }
        for c in st.container_statuses.iter().flatten() {
            (&c.name, c.ready, c.restart_count, c.started).hash(&mut h);
            let state = c.state.as_ref();
            let waiting = state.and_then(|s| s.waiting.as_ref());
            (
                waiting.map(|w| (&w.reason, &w.message)),
                state
                    .and_then(|s| s.running.as_ref())
                    .map(|r| r.started_at.as_ref().map(|t| t.0)),
                state
                    .and_then(|s| s.terminated.as_ref())
                    .map(|t| (&t.reason, t.exit_code)),
            )
                .hash(&mut h);
        }
    }
    // Never collides with the unscheduled and terminating markers.
    h.finish().max(TERMINATING + 1)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::super::prune;
    use super::*;

    #[test]
    fn a_node_change_wakes_whom_it_concerns() {
        let node = |ready: &str, beat: &str, gpus: &str, labels: serde_json::Value| -> SlimNode {
            serde_json::from_value(
                json!({"metadata": {"name": "n", "labels": labels}, "status": {
                "allocatable": {"example.com/gpu": gpus},
                "conditions": [{"type": "Ready", "status": ready, "lastHeartbeatTime": beat}]}}),
            )
            .unwrap()
        };
        let pool = json!({"pool": "a"});
        let base = NodeMemo::of(&node("True", "2026-01-01T00:00:00Z", "8", pool.clone()));
        assert_eq!(base.wakes(None), Wake::Every, "a node new to the router");
        let wakes = |n: SlimNode| NodeMemo::of(&n).wakes(Some(&base));
        assert_eq!(
            wakes(node("True", "2026-01-01T00:00:10Z", "8", pool.clone())),
            Wake::Nobody,
            "a heartbeat"
        );
        assert_eq!(
            wakes(node("False", "2026-01-01T00:00:00Z", "8", pool.clone())),
            Wake::Concerned
        );
        assert_eq!(
            wakes(node("True", "2026-01-01T00:00:00Z", "0", pool.clone())),
            Wake::Concerned
        );
        let held =
            json!({"pool": "a", "saferollout.dev/rollout": "ns.r", "saferollout.dev/stage": "0"});
        let labelled = NodeMemo::of(&node("True", "2026-01-01T00:00:00Z", "8", held.clone()));
        assert_eq!(
            labelled.wakes(Some(&base)),
            Wake::Concerned,
            "our own labels"
        );
        assert_eq!(
            NodeMemo::of(&node("True", "2026-01-01T00:00:10Z", "8", held)).wakes(Some(&labelled)),
            Wake::Holder,
            "a held node's heartbeat: its gates may wait for a fresh status"
        );
        assert_eq!(labelled.rollout.as_deref(), Some("ns.r"));
        assert_eq!(
            base.wakes(Some(&labelled)),
            Wake::Concerned,
            "our labels removed"
        );
        assert_eq!(
            wakes(node(
                "True",
                "2026-01-01T00:00:00Z",
                "8",
                json!({"pool": "b"})
            )),
            Wake::Every,
            "another label: any DaemonSet's nodeSelector may now match"
        );
    }

    #[test]
    fn a_pod_fingerprint_moves_with_what_decisions_read_only() {
        let pod = |node: Option<&str>, ready: &str, rv: &str, probe: &str| -> SlimPod {
            let mut v = json!({"metadata": {"name": "p", "uid": "u", "resourceVersion": rv,
                    "labels": {"controller-revision-hash": "r"}},
                "spec": {"containers": [{"name": "c"}]},
                "status": {"phase": "Running", "conditions": [
                    {"type": "Ready", "status": ready, "lastProbeTime": probe}]}});
            if let Some(n) = node {
                v["spec"]["nodeName"] = json!(n);
            }
            let mut p: SlimPod = serde_json::from_value(v).unwrap();
            prune::pod(&mut p);
            p
        };
        let base = pod_fingerprint(&pod(Some("n1"), "True", "1", "2026-01-01T00:00:00Z"));
        assert_eq!(
            base,
            pod_fingerprint(&pod(Some("n1"), "True", "2", "2026-01-01T00:00:09Z")),
            "a new resourceVersion or probe time alone is no change"
        );
        assert_ne!(
            base,
            pod_fingerprint(&pod(Some("n1"), "False", "2", "2026-01-01T00:00:00Z"))
        );
        assert_ne!(
            base,
            pod_fingerprint(&pod(Some("n2"), "True", "1", "2026-01-01T00:00:00Z"))
        );
        assert_eq!(
            pod_fingerprint(&pod(None, "False", "1", "2026-01-01T00:00:00Z")),
            UNSCHEDULED
        );
        let mut deleting = pod(Some("n1"), "True", "1", "2026-01-01T00:00:00Z");
        deleting.metadata.deletion_timestamp = Some(
            k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(jiff::Timestamp::UNIX_EPOCH),
        );
        let deleting_fp = pod_fingerprint(&deleting);
        assert_ne!(base, deleting_fp);
        let mut terminated = deleting.clone();
        terminated.status.as_mut().unwrap().phase = Some("Succeeded".into());
        terminated.status.as_mut().unwrap().conditions = None;
        assert_eq!(
            deleting_fp,
            pod_fingerprint(&terminated),
            "a terminating pod's status is in no decision"
        );
        assert_eq!(deleting_fp, TERMINATING);
    }

    #[test]
    fn a_pod_removal_wakes_unless_it_was_terminating_on_a_ready_node() {
        assert!(!removal_wakes(Some(TERMINATING), true), "seen terminating");
        assert!(
            removal_wakes(Some(TERMINATING), false),
            "its node is not Ready: the removal may free a slot"
        );
        assert!(
            removal_wakes(Some(42), true),
            "gone at once, never seen terminating"
        );
        assert!(removal_wakes(None, true), "never seen");
    }

    #[test]
    fn a_daemonset_change_wakes_only_for_what_decisions_read() {
        let ds = |generation: i64, observed: i64, ready: i32, annotation: &str| -> DaemonSet {
            serde_json::from_value(json!({
                "metadata": {"name": "plugin", "namespace": "ns", "uid": "u",
                    "generation": generation, "annotations": {"a": annotation}},
                "spec": {"selector": {}, "template": {}},
                "status": {"observedGeneration": observed, "desiredNumberScheduled": 3,
                    "currentNumberScheduled": 3, "numberReady": ready, "numberAvailable": ready,
                    "numberMisscheduled": 0, "updatedNumberScheduled": ready}
            }))
            .unwrap()
        };
        let settled = DaemonSetMemo::of(&ds(2, 2, 3, "x"));
        let unsettled = DaemonSetMemo::of(&ds(2, 2, 2, "x"));
        assert_eq!(
            DaemonSetMemo::of(&ds(2, 2, 1, "x")).wakes(&unsettled),
            DaemonSetWake::Nobody,
            "status counts alone"
        );
        assert_eq!(
            settled.wakes(&unsettled),
            DaemonSetWake::BlockedByPreflight,
            "settled again: preflight may pass now"
        );
        assert_eq!(unsettled.wakes(&settled), DaemonSetWake::BlockedByPreflight);
        for changed in [ds(3, 2, 3, "x"), ds(2, 1, 3, "x"), ds(2, 2, 3, "y")] {
            assert_eq!(
                DaemonSetMemo::of(&changed).wakes(&settled),
                DaemonSetWake::Every,
                "spec (generation), observedGeneration or annotations"
            );
        }
    }

    #[test]
    fn a_pod_change_wakes_unless_nothing_read_changed_or_it_is_our_own_delete() {
        assert!(
            !pod_change_wakes(None, UNSCHEDULED, false),
            "created, not scheduled"
        );
        assert!(pod_change_wakes(None, 7, false), "first seen scheduled");
        assert!(pod_change_wakes(Some(UNSCHEDULED), 7, false), "scheduled");
        assert!(!pod_change_wakes(Some(7), 7, false), "nothing read changed");
        assert!(pod_change_wakes(Some(7), 8, false), "changed, e.g. Ready");
        assert!(
            !pod_change_wakes(Some(7), 8, true),
            "the deletion the operator made"
        );
        assert!(
            pod_change_wakes(None, 8, true),
            "a pod first seen while being deleted is news"
        );
    }
}
