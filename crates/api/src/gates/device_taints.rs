//! `gates.deviceTaints` (DRA): devices newly tainted by the release, or
//! health taints it silently cleared. Its settings, schema and client-side
//! validation; the judgement is `saferollout_core::gates::device_taints`.

use schemars::{JsonSchema, Schema, SchemaGenerator};
use serde::{Deserialize, Serialize};

use crate::duration::DurationString;
use crate::schema::{driver_name, duration};
use crate::validate::{Errors, Validate};

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

/// The gate's name, [`DeviceTaintsGate::NAME`].
pub const GATE_DEVICE_TAINTS: &str = DeviceTaintsGate::NAME;

impl DeviceTaintsGate {
    /// The device taints gate's name, as written in `GateResult.gate`.
    pub const NAME: &'static str = "deviceTaints";

    pub fn new(driver: impl Into<String>) -> Self {
        Self {
            driver: driver.into(),
            cleared_taints: ClearedTaints::Report,
            soak: default_taints_soak(),
        }
    }
}

fn default_taints_soak() -> DurationString {
    DurationString::from("10s")
}

fn taints_soak(_: &mut SchemaGenerator) -> Schema {
    duration("gates.deviceTaints.soak", false)
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
