//! Preflight: the guides' checklists, run before the first stage of each new
//! revision. The template rules come from `saferollout-preflight` (shared with
//! `kubectl saferollout lint`); this module adds the checks that need facts of
//! the cluster (read by the caller): the DaemonSet's health, nodes that carry
//! the device but no agent (and why), the namespace's Pod Security level; and
//! decides when preflight must run at all.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::Taint;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use saferollout_api::{
    CAPACITY_LABEL_PREFIX, PreflightFinding, PreflightPolicy, PreflightStatus, SafeRolloutSpec,
    SafeRolloutStatus, count_of, quantity_count,
};
use saferollout_preflight::{
    Finding, Gating, PsaLevel, Severity, codes, daemonset_object, detect_kind, lint_agent_template,
};

use crate::eligibility::{taint_string, untolerated};
use crate::objects::{Quantities, SlimNode};
use crate::views::{NO_LABELS, PodsByNode, live_pods};

/// The most findings kept in status (the count is always complete).
pub const MAX_FINDINGS: usize = 20;

/// A node as preflight needs it, borrowed from the cached node: preflight
/// reads every node of the cluster, and copying their labels and capacity
/// was the operator's largest allocation at 5,000 nodes (about 10 MB each
/// time a new revision appeared).
#[derive(Debug, Clone, Copy)]
pub struct NodeFacts<'a> {
    pub name: &'a str,
    /// Capacity (extended resources, e.g. `nvidia.com/gpu`, as cached).
    pub capacity: Option<&'a Quantities>,
    pub taints: &'a [Taint],
    pub labels: &'a BTreeMap<String, String>,
}

impl<'a> NodeFacts<'a> {
    pub fn of(node: &'a SlimNode) -> Self {
        NodeFacts {
            name: node.metadata.name.as_deref().unwrap_or_default(),
            capacity: node.status.as_ref().and_then(|s| s.capacity.as_ref()),
            taints: node
                .spec
                .as_ref()
                .and_then(|s| s.taints.as_deref())
                .unwrap_or_default(),
            labels: node.metadata.labels.as_ref().unwrap_or(&NO_LABELS),
        }
    }

    /// The node's capacity of `resource`, counted (`None` when absent or not a count).
    fn capacity_of(&self, resource: &str) -> Option<i64> {
        quantity_count(self.capacity?.get(resource)?)
    }
}

/// Whether preflight must run now for the DaemonSet's `current` revision: a
/// rollout of it is about to start (or was blocked by preflight: the cluster
/// may have been fixed since).
pub fn needed(spec: &SafeRolloutSpec, status: &SafeRolloutStatus, current: &str) -> bool {
    let policy = spec
        .preflight
        .as_ref()
        .map(|p| p.policy)
        .unwrap_or_default();
    policy != PreflightPolicy::Skip
        && status
            .stable_revision
            .as_deref()
            .is_some_and(|s| s != current)
        && (status.target_revision.as_deref() != Some(current) || status.stages.is_empty())
        && status
            .preflight
            .as_ref()
            .is_none_or(|p| p.revision != current || !p.passed)
}

/// Node labels that mark device nodes: the allocatable gates' trusted
/// `max: capacityLabel:<label>` references.
pub fn device_labels(spec: &SafeRolloutSpec) -> Vec<String> {
    spec.allocatable_gates()
        .iter()
        .filter_map(|g| match &g.max {
            IntOrString::String(v) => v.strip_prefix(CAPACITY_LABEL_PREFIX).map(str::to_string),
            _ => None,
        })
        .collect()
}

/// Runs every check for `revision`.
/// DESIRED == CURRENT == READY == AVAILABLE: every pod the DaemonSet wants
/// runs and serves. Of the DaemonSet's status counts, preflight reads only
/// this (and quotes the counts when it is false).
pub fn is_settled(st: &k8s_openapi::api::apps::v1::DaemonSetStatus) -> bool {
    st.desired_number_scheduled == st.current_number_scheduled
        && st.current_number_scheduled == st.number_ready
        && st.number_ready == st.number_available.unwrap_or(0)
}

/// Preflight of `revision` of `ds`, knowing the gates of the SafeRollout
/// that rolls it out (`gating`, [`Gating::by`]; the rules that depend on
/// them run too: SR111, a device plugin that runs Ready with 0 devices on an
/// init error, unless an allocatable gate would see it).
#[allow(clippy::too_many_arguments)]
pub fn check(
    revision: &str,
    ds: &DaemonSet,
    pods: &PodsByNode,
    nodes: &[NodeFacts],
    gated_resources: &[String],
    device_labels: &[String],
    psa: Option<PsaLevel>,
    gating: Gating,
) -> PreflightStatus {
    let object = daemonset_object(ds);
    let mut findings =
        lint_agent_template(&object, &ds.spec.template, detect_kind(ds), psa, gating);

    // DESIRED == CURRENT == READY == AVAILABLE before anything changes.
    if let Some(st) = &ds.status {
        let available = st.number_available.unwrap_or(0);
        if !is_settled(st) {
            findings.push(Finding::error(
                codes::DAEMONSET_UNHEALTHY,
                &object,
                format!(
                    "the DaemonSet is not healthy before the rollout: desired {}, current {}, ready {}, available {}",
                    st.desired_number_scheduled, st.current_number_scheduled, st.number_ready, available
                ),
                "fix the running release first (or set spec.preflight.policy: Warn to roll anyway)",
            ));
        }
    }

    // Nodes with the device but no agent: the DESIRED > CURRENT trap.
    let tolerations = ds
        .spec
        .template
        .spec
        .as_ref()
        .and_then(|s| s.tolerations.clone())
        .unwrap_or_default();
    for node in nodes {
        // A node has the device when it advertises it, or when a trusted
        // discovery label (a gate's capacityLabel) says it has some.
        let has_device = gated_resources
            .iter()
            .any(|r| node.capacity_of(r).is_some_and(|c| c > 0))
            || device_labels.iter().any(|l| {
                node.labels
                    .get(l)
                    .and_then(|v| count_of(v))
                    .is_some_and(|n| n > 0)
            });
        let has_agent = live_pods(pods, node.name).next().is_some();
        if !has_device || has_agent {
            continue;
        }
        let blocking = untolerated(node.taints, &tolerations, None);
        let why = if blocking.is_empty() {
            "its nodeSelector or affinity does not match the node".to_string()
        } else {
            let list: Vec<String> = blocking.iter().map(|t| taint_string(t)).collect();
            format!(
                "the node has taints the DaemonSet does not tolerate: {}",
                list.join(", ")
            )
        };
        findings.push(Finding::warning(
            codes::NODE_UNCOVERED,
            format!("Node {}", node.name),
            format!("node {} has the device but no agent pod: {why}", node.name),
            "add a matching toleration (or fix the selector) so every device node runs the agent",
        ));
    }
    summarize(revision, findings)
}

/// Errors first, then warnings, then the rest; capped.
fn summarize(revision: &str, mut findings: Vec<Finding>) -> PreflightStatus {
    findings.sort_by_key(|f| std::cmp::Reverse(f.severity));
    let count = |s: Severity| findings.iter().filter(|f| f.severity == s).count() as i32;
    let (errors, warnings) = (count(Severity::Error), count(Severity::Warning));
    PreflightStatus {
        revision: revision.to_string(),
        passed: errors == 0,
        errors,
        warnings,
        findings: findings
            .into_iter()
            .take(MAX_FINDINGS)
            .map(|f| PreflightFinding {
                severity: format!("{:?}", f.severity),
                code: f.code.to_string(),
                object: f.object,
                message: f.message,
                fix: f.fix,
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ds(template_spec: serde_json::Value, status: serde_json::Value) -> DaemonSet {
        serde_json::from_value(json!({
            "metadata": {"name": "plugin", "namespace": "gpu"},
            "spec": {"selector": {}, "template": {"spec": template_spec}},
            "status": status
        }))
        .unwrap()
    }

    fn healthy_status() -> serde_json::Value {
        json!({"desiredNumberScheduled": 2, "currentNumberScheduled": 2, "numberReady": 2, "numberAvailable": 2, "numberMisscheduled": 0})
    }

    fn node(name: &str, gpus: i64, taints: serde_json::Value) -> SlimNode {
        serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {"taints": taints},
            "status": {"capacity": {"example.com/gpu": gpus.to_string(), "cpu": "32"}},
        }))
        .unwrap()
    }

    fn codes(p: &PreflightStatus) -> Vec<&str> {
        p.findings.iter().map(|f| f.code.as_str()).collect()
    }

    #[test]
    fn an_unhealthy_daemonset_is_an_error() {
        let d = ds(
            json!({"containers": [{"name": "c", "image": "x"}]}),
            json!({"desiredNumberScheduled": 3, "currentNumberScheduled": 3, "numberReady": 2, "numberMisscheduled": 0}),
        );
        let p = check(
            "r",
            &d,
            &PodsByNode::default(),
            &[],
            &[],
            &[],
            None,
            Gating::ROLLED_OUT,
        );
        assert!(!p.passed);
        assert!(codes(&p).contains(&"SR401"));
    }

    #[test]
    fn a_device_node_without_agent_names_the_untolerated_taint() {
        let d = ds(
            json!({"containers": [{"name": "c", "image": "x"}], "tolerations": [{"key": "ok", "operator": "Exists"}]}),
            healthy_status(),
        );
        let nodes = [
            node(
                "tainted",
                8,
                json!([{"key": "gpu-maintenance", "value": "true", "effect": "NoSchedule"}, {"key": "ok", "effect": "NoSchedule"}]),
            ),
            node("covered", 8, json!([])),
            node("cpu-only", 0, json!([])),
        ];
        let pods = crate::views::pods_by_node([crate::views::AgentPod {
            node: "covered",
            ..Default::default()
        }]);
        let p = check(
            "r",
            &d,
            &pods,
            &nodes.each_ref().map(NodeFacts::of),
            &["example.com/gpu".to_string()],
            &[],
            None,
            Gating::ROLLED_OUT,
        );
        let uncovered: Vec<_> = p.findings.iter().filter(|f| f.code == "SR402").collect();
        assert_eq!(uncovered.len(), 1, "{p:#?}");
        assert!(
            uncovered[0]
                .message
                .contains("gpu-maintenance=true:NoSchedule"),
            "{}",
            uncovered[0].message
        );
        assert!(
            !uncovered[0].message.contains("ok="),
            "a tolerated taint is not blamed"
        );
    }

    #[test]
    fn template_rules_and_psa_apply() {
        let d = ds(
            json!({"containers": [{"name": "c", "image": "x", "securityContext": {"privileged": true},
                   "env": [{"name": "NGC_API_KEY", "value": "s3cr3t"}]}]}),
            healthy_status(),
        );
        let p = check(
            "r",
            &d,
            &PodsByNode::default(),
            &[],
            &[],
            &[],
            Some(PsaLevel::Restricted),
            Gating::ROLLED_OUT,
        );
        assert!(codes(&p).contains(&"SR101"), "{p:#?}");
        assert!(codes(&p).contains(&"SR201"), "{p:#?}");
        assert!(
            !serde_json::to_string(&p).unwrap().contains("s3cr3t"),
            "never the secret's value"
        );
        assert_eq!(p.findings[0].severity, "Error", "errors first");
    }

    #[test]
    fn findings_are_capped_but_counted() {
        let findings: Vec<Finding> = (0..30)
            .map(|i| Finding::warning(codes::NODE_UNCOVERED, format!("Node n{i}"), "m", "f"))
            .collect();
        let p = summarize("r", findings);
        assert_eq!(p.findings.len(), MAX_FINDINGS);
        assert_eq!(p.warnings, 30);
        assert!(p.passed);
    }

    #[test]
    fn an_init_error_ignored_is_found_unless_an_allocatable_gate_sees_zero_devices() {
        let d = ds(
            json!({
                "containers": [{"name": "plugin", "image": "plugin:v1.0.0",
                    "env": [{"name": "FAIL_ON_INIT_ERROR", "value": "false"}],
                    "volumeMounts": [{"name": "dp", "mountPath": "/var/lib/kubelet/device-plugins"}]}],
                "volumes": [{"name": "dp", "hostPath": {"path": "/var/lib/kubelet/device-plugins"}}]
            }),
            healthy_status(),
        );
        let codes_with = |spec: &SafeRolloutSpec| -> Vec<String> {
            let p = check(
                "r",
                &d,
                &PodsByNode::default(),
                &[],
                &[],
                &[],
                None,
                Gating::by(spec),
            );
            p.findings.iter().map(|f| f.code.clone()).collect()
        };
        let mut spec = SafeRolloutSpec::for_daemonset("plugin");
        assert!(
            codes_with(&spec).contains(&codes::FAIL_ON_INIT_ERROR.to_string()),
            "{:?}",
            codes_with(&spec)
        );
        spec.gates = Some(saferollout_api::Gates {
            allocatable: vec![saferollout_api::AllocatableGate::new("example.com/gpu")],
            ..Default::default()
        });
        assert!(!codes_with(&spec).contains(&codes::FAIL_ON_INIT_ERROR.to_string()));
    }
}

#[cfg(test)]
mod label_tests {
    use super::*;

    #[test]
    fn a_discovery_label_marks_a_device_node() {
        let d: DaemonSet = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "n"},
            "spec": {"selector": {}, "template": {"spec": {"containers": [{"name": "c", "image": "x"}]}}}
        }))
        .unwrap();
        let node: SlimNode = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "new-node", "labels": {"nvidia.com/gpu.count": "8"}},
        }))
        .unwrap();
        let labels = ["nvidia.com/gpu.count".to_string()];
        let facts = [NodeFacts::of(&node)];
        let p = check(
            "r",
            &d,
            &PodsByNode::default(),
            &facts,
            &[],
            &labels,
            None,
            Gating::ROLLED_OUT,
        );
        assert!(
            p.findings
                .iter()
                .any(|f| f.code == "SR402" && f.message.contains("new-node")),
            "{p:#?}"
        );
    }
}
