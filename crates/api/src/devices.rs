//! The device gates (what a DRA driver publishes and what workloads see of
//! their devices) and the failure policy for drivers that cannot go back:
//! their spec types, schemas (CEL rules with field-named messages),
//! client-side validation and status records.
//!
//! - `gates.resourceSlices`: the driver's ResourceSlices per node, complete and
//!   within bounds (devices, shared counters, capacity) of the baseline;
//! - `gates.claims`: ResourceClaims allocated on a node before its driver was
//!   replaced stay allocated and their pods do not fail; optionally a probe
//!   claim the real scheduler must allocate on each node;
//! - `gates.deviceHealth`: `allocatedResourcesStatus` of the workloads on the
//!   rollout's nodes (device plugins and DRA drivers);
//! - `gates.deviceTaints`: devices newly tainted by the release, or health
//!   taints it silently cleared;
//! - `spec.onFailure`: `Revert` (default), `Quarantine` or `Halt`.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Toleration;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::consts::BASELINE;
use crate::duration::DurationString;
use crate::intstr::{Bound, BoundError, parse_bound};
use crate::schema::{
    DNS1123_SUBDOMAIN_REGEX, INT32_MAX, add_rules, driver_name, duration, health_resource,
    optional_driver_name, rule, string_rule,
};
use crate::validate::{Errors, Validate, is_dns1123_subdomain};

pub use crate::failure::{
    MSG_QUARANTINE_DRIVER_SCOPE, MSG_QUARANTINE_NONE_RESOURCE, MSG_QUARANTINE_ONE_OF,
    MSG_QUARANTINE_RESOURCE_SCOPE, MSG_QUARANTINE_TARGET, OnFailure, QuarantineEffect,
    QuarantineSpec, QuarantineTarget,
};
pub use crate::schema::{MSG_DRIVER, MSG_HEALTH_RESOURCE};
pub use crate::status::{
    MAX_RECORDED, NodeDevices, QuarantineRecord, QuarantinedPool, StoppedRollout,
};

// ---------------------------------------------------------------------------
// Spec

/// `gates.resourceSlices`: per node of the rollout, once its new driver pod is
/// Ready, the driver's ResourceSlices for the node's pool(s) are published and
/// complete (every slice of the pool's newest generation present, as many as
/// `resourceSliceCount` says; older generations do not count), the number of
/// devices stays within bounds, and the pool's shared counters and device
/// capacities stay within the baseline's (so a release that over-advertises
/// memory is caught even with the right device count). Decided once the
/// observation held for `soak`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = devices_bounds_rule)]
pub struct ResourceSlicesGate {
    /// The DRA driver, e.g. gpu.nvidia.com (`spec.driver` of its slices).
    #[schemars(schema_with = "driver_name")]
    pub driver: String,

    /// Floor of the devices in the node's pools: "baseline" (what the driver
    /// published before the stage touched the node; a node without one needs
    /// at least one device) or a number. With "baseline", no shared counter
    /// or capacity total may drop below the baseline's either.
    #[serde(default = "default_bound")]
    #[schemars(schema_with = "devices_min")]
    pub min_devices: IntOrString,

    /// Ceiling of the devices: "baseline" (no ceiling on a node without one)
    /// or a number. With "baseline", no shared counter or capacity total may
    /// exceed the baseline's either.
    #[serde(default = "default_bound")]
    #[schemars(schema_with = "devices_max")]
    pub max_devices: IntOrString,

    /// How long the observation must hold before the gate decides. The default
    /// is longer than the kubelet's 30 s grace before it removes the slices of
    /// a driver that stopped, so a new driver that never publishes is not
    /// judged on the slices its predecessor left.
    #[serde(default = "default_slices_soak")]
    #[schemars(schema_with = "slices_soak")]
    pub soak: DurationString,
}

/// `gates.claims`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClaimsGate {
    /// The DRA driver whose claims are judged.
    #[schemars(schema_with = "driver_name")]
    pub driver: String,

    /// A probe per node: a ResourceClaim that the real scheduler must
    /// allocate on the node's devices, for a short-lived pod pinned to the
    /// node, within `timeout`. Optional.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probe: Option<ClaimProbe>,
}

/// The probe of `gates.claims`. Probe pods and claims are created in the
/// SafeRollout's namespace, owned by the SafeRollout, one per node of a
/// stage once its new driver pod is Ready, and deleted when their node passed
/// or the stage ends.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = probe_rule)]
pub struct ClaimProbe {
    /// Ask for one device of this DeviceClass (the operator creates the claim).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "object_name")]
    pub device_class_name: Option<String>,

    /// Or: a ResourceClaimTemplate in the SafeRollout's namespace (the claim
    /// controller creates the claim from it for the probe pod).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "object_name")]
    pub claim_template_name: Option<String>,

    /// The probe pod's image. It only has to start: the probe passes once the
    /// claim is allocated on the node and the pod is bound there (and fails
    /// if the pod fails).
    #[serde(default = "default_probe_image")]
    #[schemars(length(min = 1, max = 512))]
    pub image: String,

    /// Labels for the probe pod (e.g. to let an admission policy or a
    /// simulated kubelet recognise it).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,

    /// Tolerations for the probe pod (GPU nodes are often tainted).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub tolerations: Vec<Toleration>,

    /// How long the scheduler has to allocate the claim on the node.
    #[serde(default = "default_probe_timeout")]
    #[schemars(schema_with = "probe_timeout")]
    pub timeout: DurationString,
}

/// `gates.deviceHealth`: per node of the rollout, the
/// `containerStatuses[].allocatedResourcesStatus` that the kubelet reports
/// for workload pods (KEP-4680): every entry for the gated devices must read
/// Healthy. An Unhealthy or Unknown entry fails the gate once it has lasted
/// the handover window (the kubelet reports Unknown for about 30 s while a
/// driver's health stream is gone); the gate passes once every node has been
/// clear for the window.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = health_rule)]
pub struct DeviceHealthGate {
    /// A DRA driver: entries whose resourceID is `<driver>/<pool>/<device>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "optional_driver_name")]
    pub driver: Option<String>,

    /// Or a device plugin's extended resource, e.g. nvidia.com/gpu.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "health_resource")]
    pub resource: Option<String>,

    /// How long an entry may read Unhealthy or Unknown (and how long every
    /// node must be clear before the gate passes).
    #[serde(default = "default_handover")]
    #[schemars(schema_with = "handover")]
    pub handover: DurationString,
}

/// What a release that clears health taints the old driver had set does to
/// `gates.deviceTaints`.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
pub enum ClearedTaints {
    /// The gate passes, with reason TaintsCleared and a Warning Event.
    #[default]
    Report,
    /// The gate fails.
    Fail,
}

/// `gates.deviceTaints`: the taints on the driver's devices in the node's
/// slices are recorded before the stage touches the node; a release that
/// taints a device that was not tainted fails; a release that clears a taint
/// the old driver had set ("health laundering") is reported, or fails with
/// `clearedTaints: Fail`. A node without a baseline needs one untainted device.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DeviceTaintsGate {
    /// The DRA driver whose devices are judged.
    #[schemars(schema_with = "driver_name")]
    pub driver: String,

    /// Report (default) or Fail.
    #[serde(default)]
    pub cleared_taints: ClearedTaints,

    /// How long the observation must hold before the gate decides.
    #[serde(default = "default_taints_soak")]
    #[schemars(schema_with = "taints_soak")]
    pub soak: DurationString,
}

fn default_bound() -> IntOrString {
    IntOrString::String(BASELINE.to_string())
}
fn default_slices_soak() -> DurationString {
    DurationString::from("40s")
}
fn default_taints_soak() -> DurationString {
    DurationString::from("10s")
}
fn default_handover() -> DurationString {
    DurationString::from("30s")
}
fn default_probe_timeout() -> DurationString {
    DurationString::from("2m")
}
fn default_probe_image() -> String {
    DEFAULT_PROBE_IMAGE.to_string()
}

/// The probe pod's image when none is given: it only has to start.
pub const DEFAULT_PROBE_IMAGE: &str = "registry.k8s.io/pause:3.10";

impl ResourceSlicesGate {
    /// A gate on `driver` with the defaults (baseline bounds, 40 s soak).
    pub fn new(driver: impl Into<String>) -> Self {
        Self {
            driver: driver.into(),
            min_devices: default_bound(),
            max_devices: default_bound(),
            soak: default_slices_soak(),
        }
    }

    pub fn min_bound(&self) -> Result<Bound, BoundError> {
        parse_bound(&self.min_devices, false)
    }

    pub fn max_bound(&self) -> Result<Bound, BoundError> {
        parse_bound(&self.max_devices, false)
    }
}

impl DeviceTaintsGate {
    pub fn new(driver: impl Into<String>) -> Self {
        Self {
            driver: driver.into(),
            cleared_taints: ClearedTaints::Report,
            soak: default_taints_soak(),
        }
    }
}

impl DeviceHealthGate {
    /// A gate on a DRA driver's devices.
    pub fn for_driver(driver: impl Into<String>) -> Self {
        Self {
            driver: Some(driver.into()),
            resource: None,
            handover: default_handover(),
        }
    }

    /// A gate on a device plugin's resource.
    pub fn for_resource(resource: impl Into<String>) -> Self {
        Self {
            driver: None,
            resource: Some(resource.into()),
            handover: default_handover(),
        }
    }
}

impl ClaimProbe {
    /// A probe asking for one device of `class`.
    pub fn for_class(class: impl Into<String>) -> Self {
        Self {
            device_class_name: Some(class.into()),
            claim_template_name: None,
            image: default_probe_image(),
            labels: BTreeMap::new(),
            tolerations: Vec::new(),
            timeout: default_probe_timeout(),
        }
    }
}

// ---------------------------------------------------------------------------
// Schema

/// Message of the rule on `minDevices`.
pub const MSG_MIN_DEVICES: &str =
    "gates.resourceSlices.minDevices must be \"baseline\" or an integer >= 0";
/// Message of the rule on `maxDevices`.
pub const MSG_MAX_DEVICES: &str =
    "gates.resourceSlices.maxDevices must be \"baseline\" or an integer >= 0";
/// Message of the rule comparing them.
pub const MSG_MIN_ABOVE_MAX_DEVICES: &str =
    "gates.resourceSlices.minDevices must not be greater than maxDevices";
/// Message of the rule on `deviceHealth`.
pub const MSG_HEALTH_ONE_OF: &str = "gates.deviceHealth must set exactly one of driver (a DRA driver's devices) or resource (a device plugin's extended resource)";
/// Message of the rule on `claims.probe`.
pub const MSG_PROBE_ONE_OF: &str =
    "gates.claims.probe must set exactly one of deviceClassName or claimTemplateName";
/// Message of the rule on an object name.
pub const MSG_OBJECT_NAME: &str =
    "must be an object name: a DNS-1123 subdomain (lowercase letters, digits, '-' and '.')";
/// Message of the rule that the device gates name one driver.
pub const MSG_ONE_DRIVER: &str = "gates.resourceSlices, gates.claims, gates.deviceTaints and gates.deviceHealth must name the same driver (one DRA driver per SafeRollout)";

pub(crate) fn object_name(_: &mut SchemaGenerator) -> Schema {
    string_rule(
        253,
        &format!("self.matches('{DNS1123_SUBDOMAIN_REGEX}')"),
        MSG_OBJECT_NAME,
    )
}

fn int_or_baseline(message: &str) -> Schema {
    json_schema!({
        "x-kubernetes-int-or-string": true,
        "nullable": false,
        "x-kubernetes-validations": [rule(
            &format!(
                "type(self) == int ? (self >= 0 && self <= {INT32_MAX}) : (type(self) == string && self == 'baseline')"
            ),
            message,
        )],
    })
}

pub(crate) fn devices_min(_: &mut SchemaGenerator) -> Schema {
    int_or_baseline(MSG_MIN_DEVICES)
}

pub(crate) fn devices_max(_: &mut SchemaGenerator) -> Schema {
    int_or_baseline(MSG_MAX_DEVICES)
}

pub(crate) fn slices_soak(_: &mut SchemaGenerator) -> Schema {
    duration("gates.resourceSlices.soak", false)
}

pub(crate) fn taints_soak(_: &mut SchemaGenerator) -> Schema {
    duration("gates.deviceTaints.soak", false)
}

pub(crate) fn handover(_: &mut SchemaGenerator) -> Schema {
    duration("gates.deviceHealth.handover", false)
}

pub(crate) fn probe_timeout(_: &mut SchemaGenerator) -> Schema {
    duration("gates.claims.probe.timeout", true)
}

fn devices_bounds_rule(s: &mut Schema) {
    add_rules(
        s,
        json!([{
            "rule": "!has(self.minDevices) || !has(self.maxDevices) || type(self.minDevices) != int || type(self.maxDevices) != int || self.minDevices <= self.maxDevices",
            "message": MSG_MIN_ABOVE_MAX_DEVICES,
            "fieldPath": ".minDevices",
        }]),
    );
}

fn probe_rule(s: &mut Schema) {
    add_rules(
        s,
        json!([rule(
            "has(self.deviceClassName) != has(self.claimTemplateName)",
            MSG_PROBE_ONE_OF
        )]),
    );
}

fn health_rule(s: &mut Schema) {
    add_rules(
        s,
        json!([rule(
            "has(self.driver) != has(self.resource)",
            MSG_HEALTH_ONE_OF
        )]),
    );
}

/// The rule on `spec.gates`: the device gates name one driver.
pub(crate) fn gates_rules(s: &mut Schema) {
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

// ---------------------------------------------------------------------------
// Client-side validation (mirrors the rules above; see crate::validate)

impl Validate for ResourceSlicesGate {
    fn validate(&self, path: &str, errors: &mut Errors) {
        errors.check_driver(&format!("{path}.driver"), &self.driver);
        if !is_baseline_bound(&self.min_devices) {
            errors.push(format!("{path}.minDevices"), MSG_MIN_DEVICES);
        }
        if !is_baseline_bound(&self.max_devices) {
            errors.push(format!("{path}.maxDevices"), MSG_MAX_DEVICES);
        }
        if let (IntOrString::Int(min), IntOrString::Int(max)) =
            (&self.min_devices, &self.max_devices)
            && min > max
        {
            errors.push(format!("{path}.minDevices"), MSG_MIN_ABOVE_MAX_DEVICES);
        }
        errors.check_duration(
            &format!("{path}.soak"),
            "gates.resourceSlices.soak",
            &self.soak,
            false,
        );
    }
}

/// `minDevices`, `maxDevices`: "baseline" or an integer >= 0.
fn is_baseline_bound(v: &IntOrString) -> bool {
    match v {
        IntOrString::Int(n) => *n >= 0,
        IntOrString::String(s) => s == BASELINE,
    }
}

impl Validate for ClaimsGate {
    fn validate(&self, path: &str, errors: &mut Errors) {
        errors.check_driver(&format!("{path}.driver"), &self.driver);
        self.probe.validate(&format!("{path}.probe"), errors);
    }
}

impl Validate for ClaimProbe {
    fn validate(&self, path: &str, errors: &mut Errors) {
        if self.device_class_name.is_some() == self.claim_template_name.is_some() {
            errors.push(path, MSG_PROBE_ONE_OF);
        }
        for (field, v) in [
            ("deviceClassName", &self.device_class_name),
            ("claimTemplateName", &self.claim_template_name),
        ] {
            if let Some(v) = v
                && (v.len() > 253 || !is_dns1123_subdomain(v))
            {
                errors.push(format!("{path}.{field}"), MSG_OBJECT_NAME);
            }
        }
        if self.image.is_empty() || self.image.len() > 512 {
            errors.push(
                format!("{path}.image"),
                "should be between 1 and 512 characters",
            );
        }
        errors.check_max_items(&format!("{path}.tolerations"), self.tolerations.len(), 16);
        errors.check_duration(
            &format!("{path}.timeout"),
            "gates.claims.probe.timeout",
            &self.timeout,
            true,
        );
    }
}

impl Validate for DeviceHealthGate {
    fn validate(&self, path: &str, errors: &mut Errors) {
        if self.driver.is_some() == self.resource.is_some() {
            errors.push(path, MSG_HEALTH_ONE_OF);
        }
        if let Some(d) = &self.driver {
            errors.check_driver(&format!("{path}.driver"), d);
        }
        if let Some(r) = &self.resource {
            errors.check_extended_resource(&format!("{path}.resource"), r);
        }
        errors.check_duration(
            &format!("{path}.handover"),
            "gates.deviceHealth.handover",
            &self.handover,
            false,
        );
    }
}

impl Validate for DeviceTaintsGate {
    fn validate(&self, path: &str, errors: &mut Errors) {
        errors.check_driver(&format!("{path}.driver"), &self.driver);
        errors.check_duration(
            &format!("{path}.soak"),
            "gates.deviceTaints.soak",
            &self.soak,
            false,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::{AllocatableGate, Gates, SafeRolloutSpec};

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

    #[test]
    fn quarantine_needs_something_to_quarantine() {
        let mut spec = SafeRolloutSpec::for_daemonset("plugin");
        spec.on_failure = OnFailure::Quarantine;
        assert_eq!(errors(&spec), ["spec.onFailure"]);
        spec.gates = Some(Gates {
            allocatable: vec![AllocatableGate::new("example.com/gpu")],
            ..Default::default()
        });
        assert_eq!(errors(&spec), Vec::<String>::new());
        assert_eq!(
            spec.quarantine_target(),
            Some(QuarantineTarget::Resource("example.com/gpu".into()))
        );
        spec.quarantine = Some(QuarantineSpec {
            effect: QuarantineEffect::NoExecute,
            driver: Some("gpu.example.com".into()),
            resource: None,
        });
        assert_eq!(
            spec.quarantine_target(),
            Some(QuarantineTarget::Driver("gpu.example.com".into()))
        );
        assert_eq!(spec.quarantine_effect(), QuarantineEffect::NoExecute);
    }
}
