//! What is kept of each object: only what decisions read.

use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};
use saferollout_api::REVISION_HASH_LABEL;
use saferollout_core::objects::{Quantities, SlimNode, SlimPod};

pub fn meta(m: &mut k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) {
    m.managed_fields = None;
}

/// SafeRollouts keep everything but their managedFields: the operator
/// applies their status many times a rollout, and the API server's
/// record of the fields it owns (stages, node lists, baselines) came to
/// 25 KB a SafeRollout at 100 nodes each (1.3 MB of the 50-SafeRollout
/// heap at 5,000 nodes, heaptrack). Their annotations stay: retry,
/// approve and abort are annotations.
pub fn rollout(r: &mut saferollout_api::SafeRollout) {
    meta(&mut r.metadata);
}

/// Agent pods are projected when decoded ([`SlimPod`]): what is left
/// to drop is the metadata decisions never read, every label but the
/// revision hash, and every condition but Ready. (A label map is about
/// 0.7 KB a pod: the pod template's labels, which decisions never read,
/// outweigh the rest of a cached pod's metadata.)
pub fn pod(p: &mut SlimPod) {
    meta(&mut p.metadata);
    p.metadata.annotations = None;
    p.metadata.generate_name = None;
    if let Some(labels) = p.metadata.labels.as_mut() {
        labels.retain(|k, _| k == REVISION_HASH_LABEL);
    }
    if let Some(st) = p.status.as_mut() {
        st.conditions
            .get_or_insert_default()
            .retain(|c| c.type_ == "Ready");
    }
}

/// Probe pods: what the probe gate reads (phase, scheduling, the first
/// container's state), never the environment. Dropped: annotations, the
/// spec beyond the node and the container names, addresses, every
/// condition but PodScheduled, and the containers' image IDs, IDs, last
/// states and device health.
pub fn probe_pod(p: &mut Pod) {
    meta(&mut p.metadata);
    p.metadata.annotations = None;
    if let Some(spec) = p.spec.take() {
        p.spec = Some(PodSpec {
            node_name: spec.node_name,
            containers: spec
                .containers
                .into_iter()
                .map(|c| Container {
                    name: c.name,
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        });
    }
    if let Some(st) = p.status.as_mut() {
        st.conditions
            .get_or_insert_default()
            .retain(|c| c.type_ == "PodScheduled");
        st.host_ip = None;
        st.host_ips = None;
        st.pod_ip = None;
        st.pod_ips = None;
        for c in st.container_statuses.iter_mut().flatten() {
            c.image_id.clear();
            c.container_id = None;
            c.last_state = None;
            c.allocated_resources_status = None;
        }
    }
}

/// Nodes are projected when decoded ([`SlimNode`]: no images,
/// addresses, node info or volumes); this drops the metadata decisions
/// never read, the kubelet's pressure conditions (gates read Ready and
/// the conditions other writers set: `nodeConditions`), and resources
/// that are not extended.
pub fn node(n: &mut SlimNode) {
    meta(&mut n.metadata);
    n.metadata.annotations = None;
    if let Some(st) = n.status.as_mut() {
        st.conditions.get_or_insert_default().retain(|c| {
            c.type_ == "Ready"
                || !saferollout_api::KUBERNETES_NODE_CONDITIONS.contains(&c.type_.as_str())
        });
        // Only extended resources (domain-prefixed names) are gated.
        for q in [st.allocatable.as_mut(), st.capacity.as_mut()]
            .into_iter()
            .flatten()
        {
            let mut extended = std::mem::take(q).into_tuple_vec();
            extended.retain(|(k, _)| k.contains('/'));
            extended.shrink_to_fit();
            // Still sorted: a subsequence of a sorted map.
            *q = Quantities::from_sorted_store_unchecked(extended);
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::super::prune;
    use super::*;

    #[test]
    fn a_cached_safe_rollout_keeps_its_annotations_and_status_not_its_managed_fields() {
        let mut r: saferollout_api::SafeRollout = serde_json::from_value(json!({
            "apiVersion": "saferollout.dev/v1alpha1", "kind": "SafeRollout",
            "metadata": {"name": "r", "namespace": "ns",
                "annotations": {"saferollout.dev/retry": "1"},
                "managedFields": [{"manager": "saferollout-operator", "operation": "Apply",
                    "fieldsType": "FieldsV1", "fieldsV1": {"f:status": {"f:stages": {}}}}]},
            "spec": {"targetRef": {"name": "agent"}},
            "status": {"targetRevision": "abc"}}))
        .unwrap();
        let before = r.clone();
        prune::rollout(&mut r);
        assert!(r.metadata.managed_fields.is_none());
        assert_eq!(r.metadata.annotations, before.metadata.annotations);
        assert_eq!(r.spec, before.spec);
        assert_eq!(r.status, before.status);
    }

    #[test]
    fn pruning_keeps_what_decisions_read() {
        let mut n: SlimNode = serde_json::from_value(json!({"metadata": {"name": "n", "labels": {"a": "b"}, "annotations": {"x": "y"}},
            "spec": {"taints": [{"key": "k", "effect": "NoSchedule"}]},
            "status": {"allocatable": {"cpu": "4", "example.com/gpu": "8", "a.example/x": "2", "memory": "1Gi"}, "images": [{"names": ["i"]}],
                "conditions": [{"type": "Ready", "status": "True"}, {"type": "MemoryPressure", "status": "False"}, {"type": "GpuHealthy", "status": "True"}]}}))
        .unwrap();
        prune::node(&mut n);
        let v = saferollout_core::views::NodeView::of(&n);
        assert!(v.ready);
        let kept: Vec<&str> = v.conditions.iter().map(|c| c.type_.as_str()).collect();
        assert_eq!(
            kept,
            ["Ready", "GpuHealthy"],
            "not the kubelet's pressure conditions"
        );
        assert_eq!(v.allocatable_count("example.com/gpu"), 8);
        assert_eq!(v.allocatable_count("a.example/x"), 2);
        assert_eq!(v.allocatable_count("cpu"), 0, "not an extended resource");
        assert_eq!(v.taints.len(), 1);
        assert_eq!(v.labels.len(), 1);
        assert!(n.metadata.annotations.is_none());
        assert_eq!(
            n.status
                .as_ref()
                .unwrap()
                .allocatable
                .as_ref()
                .unwrap()
                .len(),
            2
        );

        let mut p: SlimPod = serde_json::from_value(json!({"metadata": {"name": "p", "generateName": "plugin-",
                "labels": {"controller-revision-hash": "r", "app": "plugin", "pod-template-generation": "2"}, "annotations": {"x": "y"}},
            "spec": {"nodeName": "n", "containers": [{"name": "c", "image": "i", "env": [{"name": "TOKEN", "value": "s3cr3t"}]}]},
            "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}, {"type": "Initialized", "status": "True"}]}}))
        .unwrap();
        prune::pod(&mut p);
        let v = saferollout_core::views::AgentPod::of(&p).unwrap();
        assert!(v.ready && v.running);
        assert_eq!(v.node, "n");
        assert_eq!(v.revision, "r");
        assert_eq!(
            p.metadata.labels.as_ref().unwrap().len(),
            1,
            "only the revision hash label is kept"
        );
        assert!(p.metadata.generate_name.is_none());
        assert!(
            !serde_json::to_string(&p).unwrap().contains("s3cr3t"),
            "no env values kept"
        );
        assert!(p.metadata.annotations.is_none());
        assert_eq!(
            p.status
                .as_ref()
                .unwrap()
                .conditions
                .as_ref()
                .unwrap()
                .len(),
            1
        );
    }
}
