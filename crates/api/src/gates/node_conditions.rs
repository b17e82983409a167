//! `gates.nodeConditions`: named node conditions (the GPU health conditions
//! a node-problem detector or NVSentinel sets: `GPUMissing`, `GPUXIDErrors`,
//! `GpuDcgmConnectivityFailure`, `KernelDeadlock`, ...) keep their healthy status on each stage node once
//! its new agent is Ready. Its settings, schema (CEL rules with messages
//! that name the field) and client-side validation; the judgement is
//! `saferollout_core::gates::node_conditions`.

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Serialize};

use crate::consts::KUBERNETES_NODE_CONDITIONS;
use crate::duration::DurationString;
use crate::schema::{duration, list_map_by_type, rule};
use crate::validate::{Errors, Validate, is_dns1123_subdomain, validate_list_map};

/// Most conditions one gate names.
pub const MAX_NODE_CONDITIONS: u32 = 16;
/// Longest condition type (as `metav1.Condition`: a 253-character prefix,
/// `/`, a 63-character name... the API's own bound is 316).
pub const MAX_CONDITION_TYPE: u32 = 316;

/// A condition type as `metav1.Condition` validates it: an optional DNS
/// subdomain prefix and `/`, then a name of letters, digits, `-`, `_` and
/// `.` that starts and ends with a letter or digit.
pub const CONDITION_TYPE_REGEX: &str = "^([a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$";

/// Message of the rule on `spec.gates.nodeConditions.conditions[].type`.
pub const MSG_TYPE: &str = "gates.nodeConditions.conditions[].type must be a condition type such as GpuHealthy or example.com/GpuHealthy: letters, digits, '-', '_' and '.', starting and ending with a letter or digit, with an optional DNS subdomain prefix and '/'";
/// Message of the rule refusing the conditions Kubernetes sets itself.
pub const MSG_KUBERNETES_TYPE: &str = "gates.nodeConditions.conditions[].type must not be Ready, MemoryPressure, DiskPressure, PIDPressure or NetworkUnavailable: Kubernetes sets those itself (the operator reads Ready; podsReady covers the agent)";
/// Message of the rule on the list's size.
pub const MSG_CONDITIONS: &str =
    "gates.nodeConditions.conditions must name between 1 and 16 conditions, each once";

/// The status a condition has on a healthy node. Required: detectors
/// differ (node-problem-detector's conditions name a problem, healthy when
/// "False"; others name health, healthy when "True"), and a guessed default
/// would read every healthy node as failing, or worse, the reverse.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum HealthyStatus {
    /// e.g. a `GpuHealthy` condition.
    True,
    /// e.g. node-problem-detector's `KernelDeadlock`, AKS's `GPUMissing` and
    /// `GPUXIDErrors`, NVSentinel's `GpuDcgmConnectivityFailure`.
    False,
}

impl HealthyStatus {
    /// As a condition's `status` writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            HealthyStatus::True => "True",
            HealthyStatus::False => "False",
        }
    }
}

/// One node condition and the status it has when the node is healthy.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeCondition {
    /// The condition's type, e.g. GPUXIDErrors (as a node-problem detector or
    /// NVSentinel writes it in the Node's status.conditions).
    #[serde(rename = "type")]
    #[schemars(schema_with = "condition_type")]
    pub type_: String,

    /// "True" or "False": the status the condition has on a healthy node
    /// (node-problem-detector's conditions name problems: "False"). Unknown
    /// is never healthy.
    pub healthy_status: HealthyStatus,
}

/// `gates.nodeConditions`: on every stage node, once the new agent pod is
/// Ready and the node's status was written after that, each listed condition
/// the node has must have its healthy status for the soak.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = node_conditions_rules)]
pub struct NodeConditionsGate {
    /// The conditions, each once (by type); 1 to 16.
    #[schemars(length(min = 1, max = 16), transform = list_map_by_type)]
    pub conditions: Vec<NodeCondition>,

    /// How long every condition must keep its healthy status (or a condition
    /// its unhealthy one) before the gate passes (fails). Default 30s: a
    /// round of a detector that checks every 30 s.
    #[serde(default = "default_soak")]
    #[schemars(schema_with = "node_conditions_soak")]
    pub soak: DurationString,
}

/// The gate's name, [`NodeConditionsGate::NAME`].
pub const GATE_NODE_CONDITIONS: &str = NodeConditionsGate::NAME;

impl NodeConditionsGate {
    /// The gate's name, as written in `GateResult.gate`.
    pub const NAME: &'static str = "nodeConditions";

    /// A gate on conditions that are healthy when "True", soak 30s.
    pub fn healthy_when_true<S: Into<String>>(types: impl IntoIterator<Item = S>) -> Self {
        Self {
            conditions: types
                .into_iter()
                .map(|t| NodeCondition {
                    type_: t.into(),
                    healthy_status: HealthyStatus::True,
                })
                .collect(),
            soak: default_soak(),
        }
    }
}

fn default_soak() -> DurationString {
    DurationString::from("30s")
}

fn node_conditions_rules(s: &mut Schema) {
    if let Some(props) = s.get_mut("properties").and_then(|p| p.as_object_mut())
        && let Some(list) = props.get_mut("conditions").and_then(|l| l.as_object_mut())
    {
        list.insert(
            "x-kubernetes-validations".into(),
            serde_json::json!([rule("size(self) >= 1 && size(self) <= 16", MSG_CONDITIONS)]),
        );
    }
}

fn condition_type(_: &mut SchemaGenerator) -> Schema {
    let kubernetes: Vec<String> = KUBERNETES_NODE_CONDITIONS
        .iter()
        .map(|t| format!("'{t}'"))
        .collect();
    json_schema!({
        "type": "string",
        "maxLength": MAX_CONDITION_TYPE,
        "x-kubernetes-validations": [
            rule(&format!("self.matches('{CONDITION_TYPE_REGEX}')"), MSG_TYPE),
            rule(&format!("!(self in [{}])", kubernetes.join(", ")), MSG_KUBERNETES_TYPE),
        ],
    })
}

fn node_conditions_soak(_: &mut SchemaGenerator) -> Schema {
    duration("gates.nodeConditions.soak", false)
}

/// `s` is a condition type ([`CONDITION_TYPE_REGEX`], at most 316 bytes).
pub fn is_condition_type(s: &str) -> bool {
    let (prefix, name) = match s.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, s),
    };
    let edge = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    s.len() <= MAX_CONDITION_TYPE as usize
        && prefix.is_none_or(is_dns1123_subdomain)
        && edge(name.chars().next())
        && edge(name.chars().last())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

impl Validate for NodeCondition {
    fn validate(&self, path: &str, errors: &mut Errors) {
        let at = format!("{path}.type");
        if self.type_.len() > MAX_CONDITION_TYPE as usize {
            errors.push(at, "Too long: may not be more than 316 bytes");
        } else if !is_condition_type(&self.type_) {
            errors.push(at, MSG_TYPE);
        } else if KUBERNETES_NODE_CONDITIONS.contains(&self.type_.as_str()) {
            errors.push(at, MSG_KUBERNETES_TYPE);
        }
    }
}

impl Validate for NodeConditionsGate {
    fn validate(&self, path: &str, errors: &mut Errors) {
        let list = format!("{path}.conditions");
        if self.conditions.is_empty() {
            errors.push(&list, MSG_CONDITIONS);
        }
        validate_list_map(
            errors,
            &list,
            &self.conditions,
            MAX_NODE_CONDITIONS as usize,
            "type",
            |c| &c.type_,
        );
        errors.check_duration(
            &format!("{path}.soak"),
            "gates.nodeConditions.soak",
            &self.soak,
            false,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn errors(gate: &NodeConditionsGate) -> Vec<String> {
        let mut e = Errors::new();
        gate.validate("spec.gates.nodeConditions", &mut e);
        e.into_vec().into_iter().map(|e| e.to_string()).collect()
    }

    #[test]
    fn defaults_and_the_wire_form() {
        let g: NodeConditionsGate = serde_json::from_value(serde_json::json!({
            "conditions": [{"type": "GpuHealthy", "healthyStatus": "True"}, {"type": "KernelDeadlock", "healthyStatus": "False"}]
        }))
        .unwrap();
        assert_eq!(g.soak.as_str(), "30s");
        assert_eq!(g.conditions[0].healthy_status, HealthyStatus::True);
        // healthyStatus is required.
        assert!(
            serde_json::from_value::<NodeCondition>(serde_json::json!({"type": "GPUMissing"}))
                .is_err()
        );
        assert_eq!(g.conditions[1].healthy_status.as_str(), "False");
        assert!(errors(&g).is_empty(), "{:?}", errors(&g));
        let back = serde_json::to_value(&g).unwrap();
        assert_eq!(back["conditions"][0]["type"], "GpuHealthy");
    }

    #[test]
    fn condition_types_are_checked_as_kubernetes_does() {
        for ok in ["GpuHealthy", "nvidia.com/GpuHealthy", "a", "Xid_79.count-2"] {
            assert!(is_condition_type(ok), "{ok}");
        }
        for bad in [
            "",
            "-GpuHealthy",
            "GpuHealthy-",
            "Gpu Healthy",
            "NVIDIA.com/GpuHealthy",
            "/GpuHealthy",
            "a/b/c",
        ] {
            assert!(!is_condition_type(bad), "{bad}");
        }
        assert!(!is_condition_type(&"a".repeat(317)));
    }

    #[test]
    fn each_rule_names_its_field() {
        let mut g = NodeConditionsGate::healthy_when_true(["Gpu Healthy", "Ready", "X", "X"]);
        g.soak = DurationString::new("half a minute");
        let e = errors(&g);
        assert!(e[0].starts_with("spec.gates.nodeConditions.conditions[0].type: gates.nodeConditions.conditions[].type must be a condition type"), "{e:?}");
        assert!(e[1].starts_with("spec.gates.nodeConditions.conditions[1].type: gates.nodeConditions.conditions[].type must not be Ready"), "{e:?}");
        assert!(
            e[2].starts_with("spec.gates.nodeConditions.conditions[3]: Duplicate value"),
            "{e:?}"
        );
        assert!(
            e[3].starts_with(
                "spec.gates.nodeConditions.soak: gates.nodeConditions.soak must be a duration"
            ),
            "{e:?}"
        );
        assert_eq!(e.len(), 4);
        let none = NodeConditionsGate::healthy_when_true(Vec::<String>::new());
        assert_eq!(
            errors(&none),
            [format!(
                "spec.gates.nodeConditions.conditions: {MSG_CONDITIONS}"
            )]
        );
        let many = NodeConditionsGate::healthy_when_true((0..17).map(|i| format!("C{i}")));
        assert!(errors(&many)[0].contains("Too many"), "{:?}", errors(&many));
    }
}
