//! `gates.deviceHealth`: `allocatedResourcesStatus` of the workloads on the
//! rollout's nodes (device plugins and DRA drivers). Its settings, schema
//! (CEL rules with field-named messages) and client-side validation; the
//! judgement is `saferollout_core::gates::device_health`.

use schemars::{JsonSchema, Schema, SchemaGenerator};
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::duration::DurationString;
use crate::schema::{add_rules, duration, health_resource, optional_driver_name, rule};
use crate::validate::{Errors, Validate};

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

/// The gate's name, [`DeviceHealthGate::NAME`].
pub const GATE_DEVICE_HEALTH: &str = DeviceHealthGate::NAME;

impl DeviceHealthGate {
    /// The device health gate's (allocatedResourcesStatus) name, as written
    /// in `GateResult.gate`.
    pub const NAME: &'static str = "deviceHealth";

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

fn default_handover() -> DurationString {
    DurationString::from("30s")
}

/// Message of the rule on `deviceHealth`.
pub const MSG_HEALTH_ONE_OF: &str = "gates.deviceHealth must set exactly one of driver (a DRA driver's devices) or resource (a device plugin's extended resource)";

fn handover(_: &mut SchemaGenerator) -> Schema {
    duration("gates.deviceHealth.handover", false)
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
