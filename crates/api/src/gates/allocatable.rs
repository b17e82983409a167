//! `gates.allocatable[]`: per node, a device plugin's extended resource
//! (`nvidia.com/gpu`) stays within bounds of the node's baseline once the
//! new agent pod is Ready. Its settings, schema (CEL rules with
//! field-named messages) and client-side validation; the judgement is
//! `saferollout_core::gates::allocatable`.

use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Serialize};

use crate::consts::{BASELINE, CAPACITY_LABEL_PREFIX};
use crate::duration::DurationString;
use crate::intstr::{Bound, BoundError, parse_bound};
use crate::schema::{EXTENDED_RESOURCE_REGEX, INT32_MAX, duration, int_or_string, rule};
use crate::validate::{Errors, Validate, is_extended_resource_name};

/// Maximum number of allocatable gate entries.
pub const MAX_ALLOCATABLE: u32 = 8;

/// Message of the rule on `spec.gates.allocatable[].resource`.
pub const MSG_RESOURCE: &str = "gates.allocatable[].resource must be an extended resource name with a domain prefix, such as nvidia.com/gpu (cpu, memory and kubernetes.io/ names are not extended resources)";
/// Message of the rule on `spec.gates.allocatable[].min`.
pub const MSG_MIN: &str = "gates.allocatable[].min must be \"baseline\" or an integer >= 0";
/// Message of the rule on `spec.gates.allocatable[].max`.
pub const MSG_MAX: &str = "gates.allocatable[].max must be \"baseline\", \"capacityLabel:<node-label-key>\" or an integer >= 0";
/// Message of the rule comparing `min` and `max` of an allocatable gate.
pub const MSG_MIN_ABOVE_MAX: &str = "gates.allocatable[].min must not be greater than max";

/// The allocatable gate for one extended resource.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = allocatable_rules)]
pub struct AllocatableGate {
    /// The extended resource, e.g. nvidia.com/gpu (a name with a domain prefix;
    /// cpu and memory are not extended resources).
    #[schemars(schema_with = "allocatable_resource")]
    pub resource: String,

    /// Floor: "baseline" (the node's allocatable before the stage touched it)
    /// or a number. Catches a plugin that is Ready but advertises nothing.
    #[serde(default = "default_bound")]
    #[schemars(schema_with = "allocatable_min")]
    pub min: IntOrString,

    /// Ceiling: "baseline", "capacityLabel:<node-label-key>" (the integer
    /// value of a trusted node label such as nvidia.com/gpu.count) or a number.
    /// Catches a plugin that advertises more devices than exist.
    #[serde(default = "default_bound")]
    #[schemars(schema_with = "allocatable_max")]
    pub max: IntOrString,

    /// How long the value must stay within bounds before the gate passes
    /// (rejects flapping).
    #[serde(default = "default_allocatable_soak")]
    #[schemars(schema_with = "allocatable_soak")]
    pub soak: DurationString,
}

/// The gate's name, [`AllocatableGate::NAME`].
pub const GATE_ALLOCATABLE: &str = AllocatableGate::NAME;

impl AllocatableGate {
    /// The gate's name prefix, as written in `GateResult.gate`
    /// (`allocatable/<resource>` per resource).
    pub const NAME: &'static str = "allocatable";

    /// A gate on `resource` with the defaults: min and max "baseline", soak 10s.
    pub fn new(resource: impl Into<String>) -> Self {
        Self {
            resource: resource.into(),
            min: default_bound(),
            max: default_bound(),
            soak: default_allocatable_soak(),
        }
    }

    /// The floor, parsed.
    pub fn min_bound(&self) -> Result<Bound, BoundError> {
        parse_bound(&self.min, false)
    }

    /// The ceiling, parsed.
    pub fn max_bound(&self) -> Result<Bound, BoundError> {
        parse_bound(&self.max, true)
    }
}

fn default_allocatable_soak() -> DurationString {
    DurationString::from("10s")
}

fn default_bound() -> IntOrString {
    IntOrString::String(BASELINE.to_string())
}

fn allocatable_rules(s: &mut Schema) {
    s.insert(
        "x-kubernetes-validations".into(),
        serde_json::json!([{
            "rule": "!has(self.min) || !has(self.max) || type(self.min) != int || type(self.max) != int || self.min <= self.max",
            "message": MSG_MIN_ABOVE_MAX,
            "fieldPath": ".min",
        }]),
    );
}

fn allocatable_resource(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "string",
        "maxLength": 317,
        "x-kubernetes-validations": [rule(
            &format!(
                "self.matches('{EXTENDED_RESOURCE_REGEX}') && !self.contains('kubernetes.io/') && !self.startsWith('requests.')"
            ),
            MSG_RESOURCE,
        )],
    })
}

fn allocatable_min(_: &mut SchemaGenerator) -> Schema {
    int_or_string(vec![rule(
        &format!(
            "type(self) == int ? (self >= 0 && self <= {INT32_MAX}) : (type(self) == string && self == 'baseline')"
        ),
        MSG_MIN,
    )])
}

fn allocatable_max(_: &mut SchemaGenerator) -> Schema {
    // 14 = len("capacityLabel:"), 317 = longest label key.
    int_or_string(vec![rule(
        &format!(
            "type(self) == int ? (self >= 0 && self <= {INT32_MAX}) : (type(self) == string && (self == 'baseline' || (self.startsWith('capacityLabel:') && size(self) > 14 && size(self) <= 331)))"
        ),
        MSG_MAX,
    )])
}

fn allocatable_soak(_: &mut SchemaGenerator) -> Schema {
    duration("gates.allocatable[].soak", false)
}

impl Validate for AllocatableGate {
    fn validate(&self, path: &str, errors: &mut Errors) {
        if self.resource.len() > 317 {
            errors.push(
                format!("{path}.resource"),
                "Too long: may not be more than 317 bytes",
            );
        } else if !is_extended_resource_name(&self.resource) {
            errors.push(format!("{path}.resource"), MSG_RESOURCE);
        }
        if !is_bound(&self.min, false) {
            errors.push(format!("{path}.min"), MSG_MIN);
        }
        if !is_bound(&self.max, true) {
            errors.push(format!("{path}.max"), MSG_MAX);
        }
        if let (IntOrString::Int(min), IntOrString::Int(max)) = (&self.min, &self.max)
            && min > max
        {
            errors.push(format!("{path}.min"), MSG_MIN_ABOVE_MAX);
        }
        errors.check_duration(
            &format!("{path}.soak"),
            "gates.allocatable[].soak",
            &self.soak,
            false,
        );
    }
}

/// `min` (and `max` with `allow_label`): "baseline", an integer >= 0, or
/// "capacityLabel:<key>" with a non-empty key of at most 317 characters.
fn is_bound(v: &IntOrString, allow_label: bool) -> bool {
    match v {
        IntOrString::Int(n) => *n >= 0,
        IntOrString::String(s) if s == BASELINE => true,
        IntOrString::String(s) => {
            allow_label
                && s.starts_with(CAPACITY_LABEL_PREFIX)
                && s.len() > CAPACITY_LABEL_PREFIX.len()
                && s.len() <= 331
        }
    }
}
