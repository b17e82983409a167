//! `gates.resourceSlices` (DRA): the driver's ResourceSlices per node,
//! complete and within bounds (devices, shared counters, capacity) of the
//! baseline. Its settings, schema (CEL rules with field-named messages) and
//! client-side validation; the judgement is
//! `saferollout_core::gates::resource_slices`.

use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::consts::BASELINE;
use crate::duration::DurationString;
use crate::intstr::{Bound, BoundError, parse_bound};
use crate::schema::{INT32_MAX, add_rules, driver_name, duration, rule};
use crate::validate::{Errors, Validate};

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

/// The gate's name, [`ResourceSlicesGate::NAME`].
pub const GATE_RESOURCE_SLICES: &str = ResourceSlicesGate::NAME;

impl ResourceSlicesGate {
    /// The DRA ResourceSlices gate's name, as written in `GateResult.gate`.
    pub const NAME: &'static str = "resourceSlices";

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

fn default_bound() -> IntOrString {
    IntOrString::String(BASELINE.to_string())
}

fn default_slices_soak() -> DurationString {
    DurationString::from("40s")
}

/// Message of the rule on `minDevices`.
pub const MSG_MIN_DEVICES: &str =
    "gates.resourceSlices.minDevices must be \"baseline\" or an integer >= 0";
/// Message of the rule on `maxDevices`.
pub const MSG_MAX_DEVICES: &str =
    "gates.resourceSlices.maxDevices must be \"baseline\" or an integer >= 0";
/// Message of the rule comparing them.
pub const MSG_MIN_ABOVE_MAX_DEVICES: &str =
    "gates.resourceSlices.minDevices must not be greater than maxDevices";

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

fn devices_min(_: &mut SchemaGenerator) -> Schema {
    int_or_baseline(MSG_MIN_DEVICES)
}

fn devices_max(_: &mut SchemaGenerator) -> Schema {
    int_or_baseline(MSG_MAX_DEVICES)
}

fn slices_soak(_: &mut SchemaGenerator) -> Schema {
    duration("gates.resourceSlices.soak", false)
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
