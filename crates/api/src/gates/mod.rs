//! The health gates of `spec.gates`: one file per gate, named as
//! `saferollout_core::gates` names the module that judges it. Each file holds
//! the gate's settings, their schema (CEL rules with messages that name the
//! field), its client-side validation (`impl Validate`) and its defaults;
//! this module holds [`Gates`], the field that gathers them, and the rule
//! that the device gates name one driver.

pub mod allocatable;
pub mod claims;
pub mod device_health;
pub mod device_taints;
pub mod logs;
pub mod node_conditions;
pub mod pods_ready;
pub mod probe;
pub mod prometheus;
pub mod resource_slices;

pub use allocatable::{AllocatableGate, GATE_ALLOCATABLE};
pub use claims::{ClaimProbe, ClaimsGate, GATE_CLAIMS};
pub use device_health::{DeviceHealthGate, GATE_DEVICE_HEALTH};
pub use device_taints::{ClearedTaints, DeviceTaintsGate, GATE_DEVICE_TAINTS};
pub use logs::{GATE_LOGS, LogsGate, PatternSet, UnreadablePolicy};
pub use node_conditions::{GATE_NODE_CONDITIONS, HealthyStatus, NodeCondition, NodeConditionsGate};
pub use pods_ready::{GATE_PODS_READY, PodsReadyGate};
pub use probe::{
    GATE_PROBE, PROBE_NODE_LABEL, PROBE_REVISION_LABEL, ProbeEnvVar, ProbeGate, ProbeResources,
};
pub use prometheus::{
    CompareOp, Condition, GATE_PROMETHEUS, InconclusivePolicy, PrometheusGate, PrometheusTls,
    STAGE_NODES_PLACEHOLDER, SecretKeyRef, is_http_url, max_prometheus_timeout,
};
pub use resource_slices::{GATE_RESOURCE_SLICES, ResourceSlicesGate};

use schemars::{JsonSchema, Schema};
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::schema::{self, add_rules, rule};
use crate::validate::{Errors, Validate, validate_list_map};

/// The health gates. podsReady always applies; every other gate applies when
/// its field is set. (Adding a gate is one optional field here.)
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = gates_rules)]
pub struct Gates {
    /// Every agent pod on the stage's nodes must be Running, Ready and of the
    /// new revision. Fails at once on CrashLoopBackOff, ImagePullBackOff or
    /// CreateContainerConfigError. Judged even when this field is absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pods_ready: Option<PodsReadyGate>,

    /// Per node, an extended resource's allocatable count must stay within
    /// bounds once the new agent pod is Ready. At most 8 entries, one per
    /// resource.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 8), transform = schema::list_map_by_resource)]
    pub allocatable: Vec<AllocatableGate>,

    /// Named node conditions (e.g. the GPU health conditions a
    /// node-problem detector or NVSentinel sets) keep their healthy status
    /// on each stage node once its new agent is Ready.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_conditions: Option<NodeConditionsGate>,

    /// DRA: the driver's ResourceSlices per node are republished, complete and
    /// within bounds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource_slices: Option<ResourceSlicesGate>,

    /// DRA: allocated ResourceClaims survive the driver's restart; optionally a
    /// probe claim the scheduler must allocate on each node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claims: Option<ClaimsGate>,

    /// Workloads' allocatedResourcesStatus reads Healthy (device plugins and
    /// DRA drivers).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_health: Option<DeviceHealthGate>,

    /// DRA: no device newly tainted by the release; health taints cleared by
    /// it reported (or failed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_taints: Option<DeviceTaintsGate>,
    /// A short-lived pod per stage node (or a sample) that asks for one
    /// device and must succeed: proves the devices serve workloads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probe: Option<ProbeGate>,

    /// Agent pod logs must show no fatal line within a window after start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logs: Option<LogsGate>,

    /// PromQL analyses over the stage's nodes. At most 8, one per name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 8), transform = schema::list_map_by_name)]
    pub prometheus: Vec<PrometheusGate>,
}

impl Gates {
    /// The DRA drivers the device gates name, in field order: resourceSlices,
    /// claims, deviceTaints, deviceHealth (the schema makes them agree).
    pub(crate) fn drivers(&self) -> impl Iterator<Item = &str> {
        [
            self.resource_slices.as_ref().map(|s| s.driver.as_str()),
            self.claims.as_ref().map(|c| c.driver.as_str()),
            self.device_taints.as_ref().map(|t| t.driver.as_str()),
            self.device_health
                .as_ref()
                .and_then(|h| h.driver.as_deref()),
        ]
        .into_iter()
        .flatten()
    }
}

/// Message of the rule that the device gates name one driver.
pub const MSG_ONE_DRIVER: &str = "gates.resourceSlices, gates.claims, gates.deviceTaints and gates.deviceHealth must name the same driver (one DRA driver per SafeRollout)";

/// The rule on `spec.gates`: the device gates name one driver.
fn gates_rules(s: &mut Schema) {
    let drivers = "[has(self.resourceSlices) ? self.resourceSlices.driver : '', \
                   has(self.claims) ? self.claims.driver : '', \
                   has(self.deviceTaints) ? self.deviceTaints.driver : '', \
                   has(self.deviceHealth) && has(self.deviceHealth.driver) ? self.deviceHealth.driver : '']";
    add_rules(
        s,
        json!([rule(
            &format!("{drivers}.filter(d, d != '').all(d, d == {drivers}.filter(e, e != '')[0])"),
            MSG_ONE_DRIVER
        )]),
    );
}

impl Validate for Gates {
    /// Each gate, in the order their errors were always reported (the
    /// proof gates before the device gates), then the rule that the device
    /// gates name one driver.
    fn validate(&self, path: &str, errors: &mut Errors) {
        self.pods_ready
            .validate(&format!("{path}.podsReady"), errors);
        validate_list_map(
            errors,
            &format!("{path}.allocatable"),
            &self.allocatable,
            allocatable::MAX_ALLOCATABLE as usize,
            "resource",
            |g| &g.resource,
        );
        self.node_conditions
            .validate(&format!("{path}.nodeConditions"), errors);
        self.probe.validate(&format!("{path}.probe"), errors);
        self.logs.validate(&format!("{path}.logs"), errors);
        validate_list_map(
            errors,
            &format!("{path}.prometheus"),
            &self.prometheus,
            prometheus::MAX_PROMETHEUS as usize,
            "name",
            |g| &g.name,
        );
        self.resource_slices
            .validate(&format!("{path}.resourceSlices"), errors);
        self.claims.validate(&format!("{path}.claims"), errors);
        self.device_health
            .validate(&format!("{path}.deviceHealth"), errors);
        self.device_taints
            .validate(&format!("{path}.deviceTaints"), errors);
        let drivers: Vec<&str> = self.drivers().filter(|d| !d.is_empty()).collect();
        if drivers.iter().any(|d| *d != drivers[0]) {
            errors.push(path, MSG_ONE_DRIVER);
        }
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

    use super::*;
    use crate::duration::DurationString;
    use crate::failure::{OnFailure, QuarantineTarget};
    use crate::spec::SafeRolloutSpec;

    fn errors(spec: &SafeRolloutSpec) -> Vec<String> {
        spec.validate().into_iter().map(|e| e.path).collect()
    }

    #[test]
    fn a_full_device_spec_is_valid() {
        let mut spec = SafeRolloutSpec::for_daemonset("driver");
        spec.gates = Some(Gates {
            resource_slices: Some(ResourceSlicesGate::new("gpu.example.com")),
            claims: Some(ClaimsGate {
                driver: "gpu.example.com".into(),
                probe: Some(ClaimProbe::for_class("gpu.example.com")),
            }),
            device_health: Some(DeviceHealthGate::for_driver("gpu.example.com")),
            device_taints: Some(DeviceTaintsGate::new("gpu.example.com")),
            ..Default::default()
        });
        spec.on_failure = OnFailure::Quarantine;
        assert_eq!(errors(&spec), Vec::<String>::new());
        assert_eq!(
            spec.quarantine_target(),
            Some(QuarantineTarget::Driver("gpu.example.com".into()))
        );
    }

    #[test]
    fn each_rule_names_its_field() {
        let mut spec = SafeRolloutSpec::for_daemonset("driver");
        let mut slices = ResourceSlicesGate::new("Not_A_Driver");
        slices.min_devices = IntOrString::Int(9);
        slices.max_devices = IntOrString::Int(4);
        let mut probe = ClaimProbe::for_class("gpu");
        probe.claim_template_name = Some("tmpl".into());
        spec.gates = Some(Gates {
            resource_slices: Some(slices),
            claims: Some(ClaimsGate {
                driver: "gpu.example.com".into(),
                probe: Some(probe),
            }),
            device_health: Some(DeviceHealthGate {
                driver: None,
                resource: None,
                handover: DurationString::new("soon"),
            }),
            ..Default::default()
        });
        assert_eq!(
            errors(&spec),
            [
                "spec.gates.resourceSlices.driver",
                "spec.gates.resourceSlices.minDevices",
                "spec.gates.claims.probe",
                "spec.gates.deviceHealth",
                "spec.gates.deviceHealth.handover",
                "spec.gates",
            ]
        );
    }

    /// A gate's name is its field in `spec.gates`: what `GateResult.gate`
    /// says (or starts with) is what the manifest calls the gate. The fields
    /// come from the schema of `Gates`, so a new gate's field is listed
    /// whether or not anything sets it.
    #[test]
    fn each_gate_is_named_as_its_field() {
        let schema = schemars::schema_for!(Gates);
        let mut fields: Vec<&str> = schema
            .get("properties")
            .and_then(|p| p.as_object())
            .expect("Gates has properties")
            .keys()
            .map(String::as_str)
            .collect();
        let mut names = [
            PodsReadyGate::NAME,
            AllocatableGate::NAME,
            NodeConditionsGate::NAME,
            ResourceSlicesGate::NAME,
            ClaimsGate::NAME,
            DeviceHealthGate::NAME,
            DeviceTaintsGate::NAME,
            ProbeGate::NAME,
            LogsGate::NAME,
            PrometheusGate::NAME,
        ];
        names.sort();
        fields.sort();
        assert_eq!(fields, names);
    }
}
