//! `gates.podsReady`, always judged: every agent pod on the stage's nodes
//! Running, Ready and of the new revision. Its settings and their schema;
//! the judgement is `saferollout_core::gates::pods_ready`.

use schemars::{JsonSchema, Schema, SchemaGenerator};
use serde::{Deserialize, Serialize};

use crate::duration::DurationString;
use crate::schema::duration;
use crate::validate::{Errors, Validate};

/// Settings of the podsReady gate.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PodsReadyGate {
    /// How long the stage's agent pods may take to become Ready. Defaults to
    /// the rollout's progressDeadline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "pods_ready_timeout")]
    pub timeout: Option<DurationString>,
}

impl PodsReadyGate {
    /// The always-on pods-ready gate's name, as written in `GateResult.gate`.
    pub const NAME: &'static str = "podsReady";
}

/// The gate's name, [`PodsReadyGate::NAME`].
pub const GATE_PODS_READY: &str = PodsReadyGate::NAME;

fn pods_ready_timeout(_: &mut SchemaGenerator) -> Schema {
    duration("gates.podsReady.timeout", true)
}

impl Validate for PodsReadyGate {
    fn validate(&self, path: &str, errors: &mut Errors) {
        if let Some(timeout) = &self.timeout {
            errors.check_duration(
                &format!("{path}.timeout"),
                "gates.podsReady.timeout",
                timeout,
                true,
            );
        }
    }
}
