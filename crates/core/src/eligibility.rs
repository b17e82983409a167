//! Which nodes the DaemonSet covers, and whether the operator may replace
//! the agent on a node now.
//!
//! The DaemonSet controller only creates a pod on a node that matches the
//! template's nodeSelector and required node affinity and whose NoSchedule /
//! NoExecute taints the pod tolerates (the template's tolerations plus the ones
//! it adds to every daemon pod). A NotReady node gets
//! `node.kubernetes.io/not-ready:NoSchedule`, which daemon pods do not
//! tolerate: deleting the agent pod of such a node empties it until the node
//! recovers. So the operator only replaces agents on nodes that are Ready and
//! that the DaemonSet controller would fill again; the others are skipped with
//! the reason.

use std::fmt;

use k8s_openapi::api::core::v1::{NodeSelectorRequirement, Taint, Toleration};

use crate::views::{NodeView, Placement};

/// Whether a node's agent may be replaced now, and if not why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Eligibility {
    Eligible,
    /// The node's Ready condition is not True.
    NotReady,
    /// A NoSchedule/NoExecute taint the agent does not tolerate (`key=value:Effect`).
    UntoleratedTaint(String),
    /// The DaemonSet's nodeSelector or required node affinity no longer matches.
    NotSelected,
}

impl Eligibility {
    pub fn is_eligible(&self) -> bool {
        matches!(self, Eligibility::Eligible)
    }

    /// CamelCase reason for status.
    pub fn reason(&self) -> &'static str {
        match self {
            Eligibility::Eligible => "Eligible",
            Eligibility::NotReady => "NodeNotReady",
            Eligibility::UntoleratedTaint(_) => "UntoleratedTaint",
            Eligibility::NotSelected => "NotSelected",
        }
    }
}

impl fmt::Display for Eligibility {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Eligibility::Eligible => f.write_str("eligible"),
            Eligibility::NotReady => f.write_str("the node is not Ready"),
            Eligibility::UntoleratedTaint(t) => {
                write!(f, "the node has a taint the agent does not tolerate: {t}")
            }
            Eligibility::NotSelected => {
                f.write_str("the DaemonSet's nodeSelector or node affinity does not match the node")
            }
        }
    }
}

/// Taints the DaemonSet controller tolerates on every daemon pod
/// (`AddOrUpdateDaemonPodTolerations`): (key, effect).
const DAEMON_TOLERATIONS: &[(&str, &str)] = &[
    ("node.kubernetes.io/not-ready", "NoExecute"),
    ("node.kubernetes.io/unreachable", "NoExecute"),
    ("node.kubernetes.io/disk-pressure", "NoSchedule"),
    ("node.kubernetes.io/memory-pressure", "NoSchedule"),
    ("node.kubernetes.io/pid-pressure", "NoSchedule"),
    ("node.kubernetes.io/unschedulable", "NoSchedule"),
];
/// Added only for pods on the host network.
const HOST_NETWORK_TOLERATION: (&str, &str) =
    ("node.kubernetes.io/network-unavailable", "NoSchedule");

/// Does one toleration tolerate the taint (the scheduler's rule)?
pub fn tolerates(t: &Toleration, taint: &Taint) -> bool {
    if let Some(effect) = t.effect.as_deref().filter(|e| !e.is_empty())
        && effect != taint.effect
    {
        return false;
    }
    match t.operator.as_deref() {
        Some("Exists") => t
            .key
            .as_deref()
            .is_none_or(|k| k.is_empty() || k == taint.key),
        _ => {
            t.key.as_deref() == Some(taint.key.as_str())
                && t.value.as_deref().unwrap_or("") == taint.value.as_deref().unwrap_or("")
        }
    }
}

/// NoSchedule/NoExecute taints among `taints` that `tolerations` (plus, when
/// `daemon` is set, the daemon-pod defaults) do not tolerate.
pub fn untolerated<'t>(
    taints: &'t [Taint],
    tolerations: &[Toleration],
    daemon: Option<Placement>,
) -> Vec<&'t Taint> {
    taints
        .iter()
        .filter(|t| t.effect == "NoSchedule" || t.effect == "NoExecute")
        // A `Selector` promotion's taint holds the DaemonSet controllers
        // still for a moment; the node keeps running its agent.
        .filter(|t| t.key != saferollout_api::PROMOTING_TAINT)
        .filter(|t| !tolerations.iter().any(|tol| tolerates(tol, t)))
        .filter(|t| {
            let Some(placement) = daemon else {
                return true;
            };
            let default = DAEMON_TOLERATIONS
                .iter()
                .chain(placement.host_network.then_some(&HOST_NETWORK_TOLERATION))
                .any(|(key, effect)| t.key == *key && t.effect == *effect);
            !default
        })
        .collect()
}

/// `key=value:Effect`, as kubectl prints a taint.
pub fn taint_string(t: &Taint) -> String {
    format!(
        "{}={}:{}",
        t.key,
        t.value.as_deref().unwrap_or(""),
        t.effect
    )
}

fn requirement_matches(r: &NodeSelectorRequirement, value: Option<&str>) -> bool {
    let values = r.values.as_deref().unwrap_or_default();
    match r.operator.as_str() {
        "In" => value.is_some_and(|v| values.iter().any(|x| x == v)),
        "NotIn" => value.is_none_or(|v| !values.iter().any(|x| x == v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" | "Lt" => {
            let (Some(v), Some(bound)) = (
                value.and_then(|v| v.parse::<i64>().ok()),
                values.first().and_then(|b| b.parse::<i64>().ok()),
            ) else {
                return false;
            };
            if r.operator == "Gt" {
                v > bound
            } else {
                v < bound
            }
        }
        _ => false,
    }
}

/// The template's nodeSelector and required node affinity match the node.
pub fn is_selected(node: &NodeView, placement: &Placement) -> bool {
    if let Some(selector) = placement.node_selector
        && !selector
            .iter()
            .all(|(k, v)| node.label(k) == Some(v.as_str()))
    {
        return false;
    }
    let Some(required) = placement
        .affinity
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|na| {
            na.required_during_scheduling_ignored_during_execution
                .as_ref()
        })
    else {
        return true;
    };
    // Terms are ORed; a term's requirements are ANDed; an empty term matches nothing.
    required.node_selector_terms.iter().any(|term| {
        let exprs = term.match_expressions.as_deref().unwrap_or_default();
        let fields = term.match_fields.as_deref().unwrap_or_default();
        (!exprs.is_empty() || !fields.is_empty())
            && exprs
                .iter()
                .all(|r| requirement_matches(r, node.label(&r.key)))
            && fields.iter().all(|r| {
                let value = (r.key == "metadata.name").then_some(node.name);
                requirement_matches(r, value)
            })
    })
}

/// Whether the DaemonSet controller would (re)create the agent on `node` now.
pub fn eligibility(node: &NodeView, placement: &Placement) -> Eligibility {
    if !is_selected(node, placement) {
        return Eligibility::NotSelected;
    }
    if let Some(t) = untolerated(node.taints, placement.tolerations, Some(*placement)).first() {
        return Eligibility::UntoleratedTaint(taint_string(t));
    }
    if !node.ready {
        return Eligibility::NotReady;
    }
    Eligibility::Eligible
}

/// The taints the node lifecycle controller puts on a node that is not Ready.
const READINESS_TAINTS: [&str; 2] = [
    "node.kubernetes.io/not-ready",
    "node.kubernetes.io/unreachable",
];

/// Is `node` out of the DaemonSet's coverage only because it is not Ready
/// (its Ready condition, and the taints that come with it)? Such a node is
/// covered again the moment it recovers, with nothing else changing.
pub fn uncovered_only_by_readiness(node: &NodeView, placement: &Placement) -> bool {
    if node.ready {
        return false;
    }
    let taints: Vec<Taint> = node
        .taints
        .iter()
        .filter(|t| !READINESS_TAINTS.contains(&t.key.as_str()))
        .cloned()
        .collect();
    let recovered = NodeView {
        ready: true,
        not_ready_since: None,
        taints: &taints,
        ..*node
    };
    eligibility(&recovered, placement).is_eligible()
}

/// Taints that say a node is being taken out of service by someone else:
/// (key, what it says). Whatever the agent tolerates (device-plugin
/// DaemonSets often tolerate every taint), a rollout does not start on such
/// a node: its agent would be judged while the node drains or goes.
/// The taint the node lifecycle controller puts on a cordoned node.
const CORDON_TAINT: &str = "node.kubernetes.io/unschedulable";

const LIFECYCLE_TAINTS: &[(&str, &str)] = &[
    (CORDON_TAINT, "cordoned (spec.unschedulable)"),
    (
        "ToBeDeletedByClusterAutoscaler",
        "being removed by the cluster autoscaler",
    ),
    (
        "DeletionCandidateOfClusterAutoscaler",
        "a scale-down candidate of the cluster autoscaler",
    ),
    ("karpenter.sh/disrupted", "being disrupted by Karpenter"),
    ("karpenter.sh/disruption", "being disrupted by Karpenter"),
    ("node.kubernetes.io/out-of-service", "marked out of service"),
    (
        "node.cloudprovider.kubernetes.io/shutdown",
        "shut down by its cloud provider",
    ),
];

/// Why planning leaves `node` out although its agent could be replaced:
/// someone else is taking it out of service (a cordon, an autoscaler's or
/// Karpenter's scale-down, out-of-service, shutdown). `None`: nothing says
/// so. Such a node does not count in `maxUnavailable`'s base either.
///
/// A cordon a SafeRollout made for its `nodeMaintenance` (the node carries
/// [`saferollout_api::MAINTENANCE_LABEL`]) is not someone else's: the node
/// is being worked on by a rollout, which uncordons it when done.
pub fn out_of_service(node: &NodeView) -> Option<String> {
    let ours = node.label(saferollout_api::MAINTENANCE_LABEL).is_some();
    node.taints.iter().find_map(|t| {
        if ours && t.key == CORDON_TAINT {
            return None;
        }
        LIFECYCLE_TAINTS
            .iter()
            .find(|(key, _)| t.key == *key)
            .map(|(_, what)| format!("the node is {what} (taint {})", taint_string(t)))
    })
}

/// The label NVIDIA's upgrade controller (GPU Operator, k8s-operator-libs
/// `upgrade`) moves each node through during a driver upgrade:
/// `upgrade-required`, `cordon-required`, `wait-for-jobs-required`,
/// `pod-deletion-required`, `drain-required`, `pod-restart-required` (the
/// driver pod and the operands that depend on it, the device plugin among
/// them, are deleted and come back), `validation-required`,
/// `uncordon-required`, then `upgrade-done`; or `upgrade-failed`.
pub const NVIDIA_DRIVER_UPGRADE_LABEL: &str = "nvidia.com/gpu-driver-upgrade-state";
/// The label AMD's GPU Operator sets on a node whose driver it is to
/// upgrade (`upgrade-required`).
pub const AMD_DRIVER_UPGRADE_LABEL: &str = "operator.amd.com/gpu-driver-upgrade-state";
/// The taint AMD's GPU Operator puts on a node for its driver upgrade
/// (`amd-gpu-driver-upgrade=true:NoSchedule`, `upgrademgr.go`) before it
/// deletes the node's GPU pods, its device plugin's among them.
pub const AMD_DRIVER_UPGRADE_TAINT: &str = "amd-gpu-driver-upgrade";

/// Why `node` is in a vendor's driver upgrade, if it is: the upgrade
/// controller is about to delete, or is deleting and bringing back, the
/// node's driver and the agents that depend on it, whatever the rollout
/// does. `upgrade-done` (or no label) is not an upgrade; `upgrade-failed`
/// is one that has not ended (the node's driver is not the fleet's).
pub fn driver_upgrade(node: &NodeView) -> Option<String> {
    if let Some(state) = node
        .label(NVIDIA_DRIVER_UPGRADE_LABEL)
        .filter(|s| !s.is_empty() && *s != "upgrade-done")
    {
        return Some(format!(
            "the GPU Operator is upgrading its driver (label {NVIDIA_DRIVER_UPGRADE_LABEL}={state})"
        ));
    }
    if let Some(t) = node
        .taints
        .iter()
        .find(|t| t.key == AMD_DRIVER_UPGRADE_TAINT)
    {
        return Some(format!(
            "the AMD GPU Operator is upgrading its driver (taint {})",
            taint_string(t)
        ));
    }
    node.label(AMD_DRIVER_UPGRADE_LABEL)
        .filter(|s| !s.is_empty())
        .map(|state| {
            format!(
                "the AMD GPU Operator is to upgrade its driver (label {AMD_DRIVER_UPGRADE_LABEL}={state})"
            )
        })
}

/// The reason a node in a vendor's driver upgrade is left out or waited for.
pub const DRIVER_UPGRADE: &str = "DriverUpgrade";

/// Why `node` is out of service for a reason that is not the rollout's:
/// NotReady, in a vendor's driver upgrade ([`driver_upgrade`]), or someone
/// else is taking it out ([`out_of_service`]). Such a node that the rollout
/// never took is skipped, not waited for.
pub fn left_out(node: &NodeView) -> Option<(&'static str, String)> {
    if !node.ready {
        return Some(("NodeNotReady", "the node is not Ready".into()));
    }
    if let Some(why) = driver_upgrade(node) {
        return Some((DRIVER_UPGRADE, why));
    }
    out_of_service(node).map(|why| ("NodeOutOfService", why))
}

/// Whether planning may take `node`: its agent may be replaced now and
/// nothing says the node is out of service ([`left_out`]); `Err`: the
/// reason (CamelCase) and why.
pub fn plannable(node: &NodeView, placement: &Placement) -> Result<(), (&'static str, String)> {
    let eligible = eligibility(node, placement);
    if matches!(eligible, Eligibility::NotSelected) {
        return Err((eligible.reason(), eligible.to_string()));
    }
    if let Some(left) = left_out(node) {
        return Err(left);
    }
    match eligible {
        Eligibility::Eligible => Ok(()),
        e => Err((e.reason(), e.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::api::core::v1::Affinity;
    use serde_json::json;

    use super::*;
    use crate::views::RolloutLabels;

    fn taint(key: &str, value: &str, effect: &str) -> Taint {
        Taint {
            key: key.into(),
            value: Some(value.into()),
            effect: effect.into(),
            ..Default::default()
        }
    }

    fn node<'a>(
        labels: &'a BTreeMap<String, String>,
        taints: &'a [Taint],
        alloc: &'a crate::objects::Quantities,
        ready: bool,
    ) -> NodeView<'a> {
        NodeView {
            name: "n1",
            labels,
            ready,
            not_ready_since: None,
            status_written: None,
            taints,
            allocatable: alloc,
            conditions: &[],
            ours: RolloutLabels::of(labels),
        }
    }

    #[test]
    fn toleration_rules() {
        let t = taint("gpu", "true", "NoSchedule");
        let tol = |v: serde_json::Value| -> Toleration { serde_json::from_value(v).unwrap() };
        assert!(tolerates(
            &tol(json!({"key": "gpu", "operator": "Exists"})),
            &t
        ));
        assert!(tolerates(&tol(json!({"operator": "Exists"})), &t));
        assert!(tolerates(&tol(json!({"key": "gpu", "value": "true"})), &t));
        assert!(!tolerates(
            &tol(json!({"key": "gpu", "value": "false"})),
            &t
        ));
        assert!(!tolerates(
            &tol(json!({"key": "gpu", "operator": "Exists", "effect": "NoExecute"})),
            &t
        ));
    }

    #[test]
    fn a_not_ready_node_is_not_eligible_and_says_why() {
        let (labels, alloc) = (BTreeMap::new(), crate::objects::Quantities::new());
        let taints = [taint("node.kubernetes.io/not-ready", "", "NoSchedule")];
        let n = node(&labels, &taints, &alloc, false);
        let e = eligibility(&n, &Placement::default());
        assert_eq!(e.reason(), "UntoleratedTaint");
        assert!(
            e.to_string()
                .contains("node.kubernetes.io/not-ready=:NoSchedule"),
            "{e}"
        );
        // Before the node lifecycle controller taints it, NotReady alone suffices.
        let n = node(&labels, &[], &alloc, false);
        assert_eq!(
            eligibility(&n, &Placement::default()),
            Eligibility::NotReady
        );
    }

    #[test]
    fn daemon_pods_tolerate_cordons_and_pressure_but_not_foreign_taints() {
        let (labels, alloc) = (BTreeMap::new(), crate::objects::Quantities::new());
        let taints = [
            taint("node.kubernetes.io/unschedulable", "", "NoSchedule"),
            taint("node.kubernetes.io/not-ready", "", "NoExecute"),
        ];
        assert!(
            eligibility(&node(&labels, &taints, &alloc, true), &Placement::default()).is_eligible()
        );
        let taints = [taint("gpu-maintenance", "true", "NoSchedule")];
        assert_eq!(
            eligibility(&node(&labels, &taints, &alloc, true), &Placement::default()),
            Eligibility::UntoleratedTaint("gpu-maintenance=true:NoSchedule".into())
        );
        let prefer = [taint("soft", "x", "PreferNoSchedule")];
        assert!(
            eligibility(&node(&labels, &prefer, &alloc, true), &Placement::default()).is_eligible()
        );
    }

    #[test]
    fn node_selector_and_required_affinity() {
        let labels: BTreeMap<String, String> = [
            ("gpu".to_string(), "true".to_string()),
            ("count".to_string(), "8".to_string()),
        ]
        .into();
        let alloc = crate::objects::Quantities::new();
        let n = node(&labels, &[], &alloc, true);
        let sel: BTreeMap<String, String> = [("gpu".to_string(), "true".to_string())].into();
        let p = Placement {
            node_selector: Some(&sel),
            ..Default::default()
        };
        assert!(is_selected(&n, &p));
        let other: BTreeMap<String, String> = [("gpu".to_string(), "false".to_string())].into();
        let p = Placement {
            node_selector: Some(&other),
            ..Default::default()
        };
        assert_eq!(eligibility(&n, &p), Eligibility::NotSelected);

        let affinity = |terms: serde_json::Value| -> Affinity {
            serde_json::from_value(json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}})).unwrap()
        };
        let cases = [
            (
                json!([{"matchExpressions": [{"key": "count", "operator": "Gt", "values": ["4"]}]}]),
                true,
            ),
            (
                json!([{"matchExpressions": [{"key": "count", "operator": "Lt", "values": ["4"]}]}]),
                false,
            ),
            (
                json!([{"matchExpressions": [{"key": "gpu", "operator": "NotIn", "values": ["true"]}]},
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}]),
                true,
            ),
            (
                json!([{"matchExpressions": [{"key": "absent", "operator": "DoesNotExist"}]}]),
                true,
            ),
            (json!([{}]), false),
        ];
        for (terms, want) in cases {
            let a = affinity(terms.clone());
            let p = Placement {
                affinity: Some(&a),
                ..Default::default()
            };
            assert_eq!(is_selected(&n, &p), want, "{terms}");
        }
    }
}
