//! Projected API objects: the fields decisions read and nothing else,
//! deserialized straight from the API server's JSON (serde skips every other
//! field), so a cache of thousands of them never builds nor keeps the full
//! objects. A pruned `k8s_openapi` Pod still weighs about 4 KB in memory,
//! most of it empty `Option`s of its spec and container statuses; a
//! [`SlimPod`] of an agent pod is its metadata and a few strings. A
//! [`SlimNode`] keeps labels, taints, extended resources and conditions.
//!
//! Field names and shapes mirror the full types (`spec.nodeName`,
//! `status.containerStatuses[].state`, ...), so code written against a Pod
//! reads a [`SlimPod`] the same way, and a test fixture written as Pod JSON
//! deserializes into one.

use std::borrow::Cow;
use std::sync::OnceLock;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{ContainerState, Node, Pod, Taint};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use kube_core::Resource;
use serde::{Deserialize, Deserializer, Serialize};

/// Facts worked out from the rest of an object the first time a view reads
/// them, then kept with it. The operator's caches hold each version of a pod
/// or node behind an `Arc`, never changed, and every pass built a view of
/// every one of them anew: label lookups and condition scans (with the
/// string comparisons they take, a fifth to a quarter of the operator's CPU
/// at 1,000 nodes; `bench/results/2026-12-05-views.md`). Only what takes a
/// lookup or a scan is kept; fields a view copies (names, timestamps) are
/// read from the object each time.
///
/// A clone starts without them (it may be changed before it is read), and
/// equality ignores them (they follow from the rest of the object). An object
/// changed in place after a view read it would keep stale facts: debug
/// builds (every test) work them out again on each read and fail on a
/// difference.
#[derive(Default)]
pub struct Derived<T>(OnceLock<T>);

impl<T: PartialEq + std::fmt::Debug> Derived<T> {
    /// The facts, worked out by `of` on first use.
    pub fn get(&self, of: impl Fn() -> T) -> &T {
        let facts = self.0.get_or_init(&of);
        debug_assert_eq!(
            *facts,
            of(),
            "an object was changed in place after a view read it"
        );
        facts
    }
}

impl<T> Clone for Derived<T> {
    fn clone(&self) -> Self {
        Derived(OnceLock::new())
    }
}

impl<T> PartialEq for Derived<T> {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl<T> std::fmt::Debug for Derived<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Derived")
    }
}

/// What a pod's view reads beyond its borrowed names, worked out once per
/// cached pod by [`crate::views::AgentPod::of`]. Defined here, beside the
/// objects that keep them, so that objects need nothing of the views.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct PodFacts {
    pub(crate) revision: Option<String>,
    pub(crate) running: bool,
    /// Which condition says Ready=True, if one does (its time is read from
    /// the pod: an index keeps the facts as small as they were).
    pub(crate) ready: Option<u16>,
    /// Which container waits (the first one that does).
    pub(crate) waiting: Option<u16>,
    pub(crate) restarts: i32,
}

/// What a node's view reads beyond borrowed fields, worked out once per
/// cached node by [`crate::views::NodeView::of`] (defined here for the same
/// reason as [`PodFacts`]).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct NodeFacts {
    pub(crate) ready: bool,
    pub(crate) not_ready_since: Option<Timestamp>,
    /// Which condition is Ready (its heartbeat is read from the node).
    pub(crate) ready_condition: Option<u16>,
    pub(crate) rollout: Option<String>,
    pub(crate) stage: Option<u32>,
}

/// Reads an object's metadata without its `managedFields`: about 40% of an
/// agent pod's or a node's JSON (2 of 5.7 KB, 2.5 of 4.7 KB on the bench's
/// cluster), which `ObjectMeta` would decode into a tree of small maps only
/// for the cache to drop it. serde skips the field without building it.
fn meta_without_managed_fields<'de, D: Deserializer<'de>>(d: D) -> Result<ObjectMeta, D::Error> {
    /// `ObjectMeta` but `managedFields`. The struct literal below names
    /// every field of `ObjectMeta`, so one it gains fails the build here.
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Meta {
        annotations: Option<BTreeMap<String, String>>,
        creation_timestamp: Option<Time>,
        deletion_grace_period_seconds: Option<i64>,
        deletion_timestamp: Option<Time>,
        finalizers: Option<Vec<String>>,
        generate_name: Option<String>,
        generation: Option<i64>,
        labels: Option<BTreeMap<String, String>>,
        name: Option<String>,
        namespace: Option<String>,
        owner_references: Option<Vec<OwnerReference>>,
        resource_version: Option<String>,
        self_link: Option<String>,
        uid: Option<String>,
    }
    let m = Option::<Meta>::deserialize(d)?;
    Ok(m.map(|m| ObjectMeta {
        annotations: m.annotations,
        creation_timestamp: m.creation_timestamp,
        deletion_grace_period_seconds: m.deletion_grace_period_seconds,
        deletion_timestamp: m.deletion_timestamp,
        finalizers: m.finalizers,
        generate_name: m.generate_name,
        generation: m.generation,
        labels: m.labels,
        managed_fields: None,
        name: m.name,
        namespace: m.namespace,
        owner_references: m.owner_references,
        resource_version: m.resource_version,
        self_link: m.self_link,
        uid: m.uid,
    })
    .unwrap_or_default())
}

/// A pod as the operator's agent-pod cache keeps it, and as the CLI lists
/// agent pods: identity, labels, owners, node, phase, conditions and the
/// containers' states.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
pub struct SlimPod {
    /// Without `managedFields`, never decoded.
    #[serde(default, deserialize_with = "meta_without_managed_fields")]
    pub metadata: ObjectMeta,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec: Option<SlimPodSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<SlimPodStatus>,
    /// What [`crate::views::AgentPod`] reads, worked out once.
    #[serde(skip)]
    pub facts: Derived<PodFacts>,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SlimPodSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_name: Option<String>,
    /// The containers' names (the logs gate reads the first one's log by default).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub containers: Vec<SlimContainer>,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
pub struct SlimContainer {
    #[serde(default)]
    pub name: String,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SlimPodStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conditions: Option<Vec<SlimCondition>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container_statuses: Option<Vec<SlimContainerStatus>>,
}

/// A condition's type, status, when the status last changed and (nodes)
/// when it was last written (no messages, reasons or probe times).
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SlimCondition {
    #[serde(rename = "type")]
    pub type_: String,
    #[serde(default)]
    pub status: String,
    /// A node's Ready transition tells the budget whether the node went
    /// NotReady before or after its agent was replaced; a pod's, since when
    /// its agent is Ready (the gates judge only evidence written after it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<Time>,
    /// Nodes only: when the kubelet last wrote the node's status (it stamps
    /// every status write with it), so a gate can tell a status written
    /// after the new agent became Ready from one the old agent left.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_heartbeat_time: Option<Time>,
}

/// A container's name, readiness, restarts and state (no image, IDs or
/// resources; never the environment, which is in the spec anyway).
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SlimContainerStatus {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub ready: bool,
    #[serde(default)]
    pub restart_count: i32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<ContainerState>,
}

/// Implements `Resource` for a projection as the resource of `$full`: an
/// `Api<$slim>` lists and watches the same objects.
macro_rules! projects {
    ($slim:ty, $full:ty, $scope:ty) => {
        impl Resource for $slim {
            type DynamicType = ();
            type Scope = $scope;

            fn kind(dt: &()) -> Cow<'_, str> {
                <$full as Resource>::kind(dt)
            }
            fn group(dt: &()) -> Cow<'_, str> {
                <$full as Resource>::group(dt)
            }
            fn version(dt: &()) -> Cow<'_, str> {
                <$full as Resource>::version(dt)
            }
            fn api_version(dt: &()) -> Cow<'_, str> {
                <$full as Resource>::api_version(dt)
            }
            fn plural(dt: &()) -> Cow<'_, str> {
                <$full as Resource>::plural(dt)
            }
            fn meta(&self) -> &ObjectMeta {
                &self.metadata
            }
            fn meta_mut(&mut self) -> &mut ObjectMeta {
                &mut self.metadata
            }
        }
    };
}

projects!(SlimPod, Pod, k8s_openapi::NamespaceResourceScope);
projects!(SlimNode, Node, k8s_openapi::ClusterResourceScope);

/// A node as the operator's cache keeps it, and as the CLI lists nodes:
/// metadata (labels), taints, schedulability, extended-resource capacity
/// and allocatable, conditions. No images, addresses, node info or volumes.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
pub struct SlimNode {
    /// Without `managedFields`, never decoded.
    #[serde(default, deserialize_with = "meta_without_managed_fields")]
    pub metadata: ObjectMeta,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec: Option<SlimNodeSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<SlimNodeStatus>,
    /// What [`crate::views::NodeView`] reads, worked out once.
    #[serde(skip)]
    pub facts: Derived<NodeFacts>,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
pub struct SlimNodeSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub taints: Option<Vec<Taint>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unschedulable: Option<bool>,
}

/// Resource quantities by name (a node's allocatable or capacity), sorted by
/// name. A node has a handful and the cache keeps only the extended ones
/// (one or two): a sorted vector holds them in a few dozen bytes where a
/// `BTreeMap` allocates a node for eleven entries, about 0.5 KiB per map and
/// two maps per cached node.
pub type Quantities = litemap::LiteMap<String, Quantity>;

#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
pub struct SlimNodeStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocatable: Option<Quantities>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity: Option<Quantities>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conditions: Option<Vec<SlimCondition>>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_slim_pod_reads_a_full_pods_json_and_keeps_only_what_decisions_read() {
        let full = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "namespace": "ns", "uid": "u", "labels": {"a": "b"}},
            "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "i",
                "env": [{"name": "TOKEN", "value": "s3cr3t"}]}]},
            "status": {"phase": "Running", "podIP": "10.0.0.1",
                "conditions": [{"type": "Ready", "status": "True", "lastProbeTime": null}],
                "containerStatuses": [{"name": "c", "image": "i", "imageID": "x", "ready": true,
                    "restartCount": 2, "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}}}]}
        });
        let pod: SlimPod = serde_json::from_value(full).unwrap();
        let spec = pod.spec.as_ref().unwrap();
        assert_eq!(spec.node_name.as_deref(), Some("n1"));
        assert_eq!(spec.containers[0].name, "c");
        let st = pod.status.as_ref().unwrap();
        assert_eq!(st.phase.as_deref(), Some("Running"));
        assert_eq!(st.conditions.as_ref().unwrap()[0].type_, "Ready");
        let c = &st.container_statuses.as_ref().unwrap()[0];
        assert_eq!((c.name.as_str(), c.ready, c.restart_count), ("c", true, 2));
        assert!(c.state.as_ref().unwrap().running.is_some());
        let kept = serde_json::to_string(&pod).unwrap();
        assert!(
            !kept.contains("s3cr3t") && !kept.contains("10.0.0.1"),
            "{kept}"
        );
        assert_eq!(
            (SlimPod::plural(&()), SlimPod::api_version(&())),
            ("pods".into(), "v1".into())
        );
    }

    #[test]
    fn slim_objects_keep_all_metadata_but_managed_fields() {
        let meta = json!({
            "name": "p", "namespace": "ns", "uid": "u", "generateName": "p-",
            "resourceVersion": "7", "generation": 3, "selfLink": "/x",
            "creationTimestamp": "2026-12-03T10:00:00Z",
            "deletionTimestamp": "2026-12-03T10:01:00Z", "deletionGracePeriodSeconds": 30,
            "labels": {"a": "b"}, "annotations": {"c": "d"}, "finalizers": ["f"],
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet",
                "name": "ds", "uid": "o", "controller": true}],
            "managedFields": [{"manager": "kubelet", "operation": "Update",
                "fieldsType": "FieldsV1", "fieldsV1": {"f:status": {}}}]
        });
        let mut full: ObjectMeta = serde_json::from_value(meta.clone()).unwrap();
        assert!(full.managed_fields.is_some());
        full.managed_fields = None;
        let pod: SlimPod = serde_json::from_value(json!({"metadata": meta.clone()})).unwrap();
        let node: SlimNode = serde_json::from_value(json!({"metadata": meta})).unwrap();
        assert_eq!((&pod.metadata, &node.metadata), (&full, &full));
        // Absent or null metadata is empty metadata, as before.
        let bare: SlimPod = serde_json::from_value(json!({"metadata": null})).unwrap();
        assert_eq!(bare.metadata, ObjectMeta::default());
        let bare: SlimNode = serde_json::from_value(json!({})).unwrap();
        assert_eq!(bare.metadata, ObjectMeta::default());
    }

    #[test]
    fn a_slim_node_reads_a_full_nodes_json() {
        let node: SlimNode = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": "n", "labels": {"a": "b"}},
            "spec": {"podCIDR": "10.0.0.0/24", "unschedulable": true,
                "taints": [{"key": "k", "effect": "NoSchedule"}]},
            "status": {"allocatable": {"example.com/gpu": "8"}, "capacity": {"example.com/gpu": "8"},
                "images": [{"names": ["i"]}], "addresses": [{"type": "InternalIP", "address": "10.0.0.1"}],
                "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}]}
        }))
        .unwrap();
        let spec = node.spec.as_ref().unwrap();
        assert_eq!(
            (spec.unschedulable, spec.taints.as_ref().unwrap().len()),
            (Some(true), 1)
        );
        let st = node.status.as_ref().unwrap();
        assert_eq!(
            st.allocatable
                .as_ref()
                .unwrap()
                .get("example.com/gpu")
                .unwrap()
                .0,
            "8"
        );
        assert_eq!(st.conditions.as_ref().unwrap()[0].status, "True");
        let kept = serde_json::to_string(&node).unwrap();
        assert!(
            !kept.contains("10.0.0") && !kept.contains("images"),
            "{kept}"
        );
        assert_eq!(SlimNode::plural(&()), "nodes");
    }

    #[test]
    fn a_not_ready_node_says_since_when() {
        let node: SlimNode = serde_json::from_value(json!({
            "metadata": {"name": "n"},
            "status": {"conditions": [{"type": "Ready", "status": "Unknown",
                "lastHeartbeatTime": "2026-12-02T10:00:30Z",
                "lastTransitionTime": "2026-12-02T10:00:00Z", "reason": "NodeStatusUnknown"}]}
        }))
        .unwrap();
        let view = crate::views::NodeView::of(&node);
        assert!(!view.ready);
        assert_eq!(
            view.not_ready_since,
            Some("2026-12-02T10:00:00Z".parse().unwrap())
        );
        let ready: SlimNode = serde_json::from_value(json!({
            "metadata": {"name": "n"},
            "status": {"conditions": [{"type": "Ready", "status": "True",
                "lastTransitionTime": "2026-12-02T10:00:00Z"}]}
        }))
        .unwrap();
        assert_eq!(crate::views::NodeView::of(&ready).not_ready_since, None);
    }

    fn agent_pod(ready: &str, revision: &str) -> SlimPod {
        serde_json::from_value(json!({
            "metadata": {"name": "p", "uid": "u", "resourceVersion": "1",
                "labels": {"controller-revision-hash": revision}},
            "spec": {"nodeName": "n1"},
            "status": {"phase": "Running",
                "conditions": [{"type": "Ready", "status": ready}],
                "containerStatuses": [{"name": "c", "restartCount": 3,
                    "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off"}}}]}
        }))
        .unwrap()
    }

    #[test]
    fn a_view_reads_its_facts_once_and_a_clone_works_them_out_anew() {
        use crate::views::AgentPod;
        let pod = agent_pod("False", "v1");
        let first = AgentPod::of(&pod).unwrap();
        assert_eq!(
            (first.revision, first.ready, first.running, first.restarts),
            ("v1", false, true, 3)
        );
        assert_eq!(first.waiting_reason, Some("CrashLoopBackOff"));
        assert_eq!(first.waiting_message, Some("back-off"));
        assert!(pod.facts.0.get().is_some(), "kept after the first view");
        assert_eq!(AgentPod::of(&pod), Some(first));
        // A clone may be changed before it is read: it starts without facts.
        let mut changed = pod.clone();
        assert!(changed.facts.0.get().is_none());
        changed.status = agent_pod("True", "v1").status;
        changed.metadata.labels = agent_pod("True", "v2").metadata.labels;
        let view = AgentPod::of(&changed).unwrap();
        assert_eq!((view.revision, view.ready), ("v2", true));
        // Equality is the object's: facts worked out or not.
        assert_eq!(agent_pod("False", "v1"), pod);
    }

    #[test]
    #[cfg(debug_assertions)]
    #[should_panic(expected = "changed in place after a view read it")]
    fn an_object_changed_in_place_after_a_view_fails_debug_builds() {
        let mut pod = agent_pod("False", "v1");
        crate::views::AgentPod::of(&pod);
        pod.status = agent_pod("True", "v1").status;
        crate::views::AgentPod::of(&pod);
    }

    /// Every cached pod and node carries its facts: at 5,000 nodes and 50
    /// SafeRollouts (about 10,000 objects) each byte is 10 KB of the 64 MiB
    /// the operator keeps to.
    #[test]
    fn facts_stay_small() {
        use std::mem::size_of;
        assert!(
            size_of::<Derived<PodFacts>>() <= 48,
            "{}",
            size_of::<Derived<PodFacts>>()
        );
        assert!(
            size_of::<Derived<NodeFacts>>() <= 72,
            "{}",
            size_of::<Derived<NodeFacts>>()
        );
    }
}
