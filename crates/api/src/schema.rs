//! Hand-written OpenAPI schemas for the fields whose validation the derive cannot
//! express: CEL rules (`x-kubernetes-validations`) with messages that name the
//! field, int-or-string checks, list-map markers.
//!
//! Cost: the API server estimates the worst-case cost of every CEL rule when the
//! CRD is created and rejects rules that could be too expensive. Strings carrying
//! a rule get a `maxLength`, lists a `maxItems`. An int-or-string value counts as
//! a string of unbounded size (about 3 MB) whatever `maxLength` says, so rules on
//! int-or-string fields never call `matches()`, `contains()` or similar on it:
//! they compare with literals and use `in` on a literal list, which cost O(1) in
//! the string's size.

use std::borrow::Cow;

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde_json::{Value, json};

use crate::duration::{DURATION_MAX_LENGTH, DURATION_REGEX, DurationString};

/// DNS-1123 subdomain, as RE2 without backslashes.
pub const DNS1123_SUBDOMAIN_REGEX: &str =
    "^[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*$";

/// An extended resource name: `<dns-subdomain prefix>/<name>` where the name is
/// a qualified-name part (alphanumerics, `-`, `_`, `.`; at most 63 characters).
pub const EXTENDED_RESOURCE_REGEX: &str = "^[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*/[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$";

/// Largest integer the int-or-string fields accept (they are int32 on the wire).
pub const INT32_MAX: i64 = i32::MAX as i64;

/// Maximum number of stages.
pub const MAX_STAGES: u32 = 10;

/// Message of the DNS-1123 rule on `spec.targetRef.name`.
pub const MSG_TARGET_NAME: &str = "targetRef.name must be the name of a DaemonSet: a non-empty DNS-1123 subdomain (lowercase letters, digits, '-' and '.')";
/// Message of the immutability rule on `spec.targetRef.name`.
pub const MSG_TARGET_IMMUTABLE: &str =
    "targetRef.name is immutable: create a new SafeRollout to target another DaemonSet";
/// Message of the rule on `spec.stages[].nodes`.
pub const MSG_STAGE_NODES: &str = "stages[].nodes must be a positive node count or a percentage between 1% and 100% (e.g. 1, 5, \"10%\")";
/// Message of the rule on `spec.circuitBreaker.maxNotReadyNodes`.
pub const MSG_MAX_NOT_READY_NODES: &str = "circuitBreaker.maxNotReadyNodes must be a positive node count or a percentage between 1% and 100% (e.g. 2, \"10%\")";
/// Message of the rule on `spec.maxUnavailable`.
pub const MSG_MAX_UNAVAILABLE: &str = "maxUnavailable must be a positive pod count or a percentage between 1% and 100% (e.g. 1, \"10%\")";

/// Message of the rule on a DRA driver name.
pub const MSG_DRIVER: &str =
    "must be a DRA driver name: a DNS subdomain of at most 63 characters, such as gpu.nvidia.com";
/// Message of the rule on `deviceHealth.resource` and `quarantine.resource`.
pub const MSG_HEALTH_RESOURCE: &str = "must be an extended resource name with a domain prefix, such as nvidia.com/gpu (cpu, memory and kubernetes.io/ names are not extended resources)";

/// Message of the grammar rule on a duration field.
pub fn duration_message(field: &str) -> String {
    format!(
        "{field} must be a duration such as 30s, 5m or 1h30m: digits with an optional fraction, each followed by a unit ms, s, m or h; no sign, no spaces"
    )
}

/// Message of the non-zero rule on a duration field.
pub fn positive_message(field: &str) -> String {
    format!("{field} must be longer than zero")
}

/// One `x-kubernetes-validations` entry.
pub(crate) fn rule(rule: &str, message: &str) -> Value {
    json!({ "rule": rule, "message": message })
}

/// One `x-kubernetes-validations` entry with a `reason`.
pub(crate) fn rule_with_reason(rule: &str, message: &str, reason: &str) -> Value {
    json!({ "rule": rule, "message": message, "reason": reason })
}

/// The CEL literal list `['1%', '2%', ..., '100%']`.
pub fn percent_list() -> String {
    let items: Vec<String> = (1..=100).map(|p| format!("'{p}%'")).collect();
    format!("[{}]", items.join(", "))
}

/// CEL: an int-or-string that is an integer in 1..=int32 max or one of `1%`..`100%`.
pub fn count_or_percent_rule() -> String {
    format!(
        "type(self) == int ? (self >= 1 && self <= {INT32_MAX}) : (type(self) == string && self in {})",
        percent_list()
    )
}

pub(crate) fn int_or_string(rules: Vec<Value>) -> Schema {
    // `nullable: false` stops kube's OptionalIntOrString transform from marking a
    // defaulted field nullable: a `null` is then pruned and defaulted by the API
    // server instead of reaching the operator.
    json_schema!({
        "x-kubernetes-int-or-string": true,
        "nullable": false,
        "x-kubernetes-validations": rules,
    })
}

/// A duration string schema; `positive` also rejects zero durations.
pub(crate) fn duration(field: &str, positive: bool) -> Schema {
    let mut rules = vec![rule(
        &format!("self.matches('{DURATION_REGEX}')"),
        &duration_message(field),
    )];
    if positive {
        // Only judged on well-formed values, so a malformed one gets one message.
        rules.push(rule(
            &format!("!self.matches('{DURATION_REGEX}') || self.matches('[1-9]')"),
            &positive_message(field),
        ));
    }
    json_schema!({
        "type": "string",
        "maxLength": DURATION_MAX_LENGTH,
        "x-kubernetes-validations": rules,
    })
}

/// A duration field's schema: the grammar rule, named for no field in
/// particular (fields name themselves with `schema_with`). Here rather than
/// in `duration`, which the schema helpers read.
impl JsonSchema for DurationString {
    fn inline_schema() -> bool {
        true
    }

    fn schema_name() -> Cow<'static, str> {
        "DurationString".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        duration("this field", false)
    }
}

/// A positive duration schema of at most `max` (a Go duration such as
/// `30s`, which CEL's `duration()` parses as the API server does).
pub(crate) fn duration_at_most(field: &str, max: &str) -> Schema {
    let mut s = duration(field, true);
    if let Some(rules) = s
        .get_mut("x-kubernetes-validations")
        .and_then(|r| r.as_array_mut())
    {
        rules.push(rule(
            &format!("!self.matches('{DURATION_REGEX}') || duration(self) <= duration('{max}')"),
            &at_most_message(field, max),
        ));
    }
    s
}

/// Message of the upper-bound rule on a duration field.
pub fn at_most_message(field: &str, max: &str) -> String {
    format!("{field} must be at most {max}")
}

pub(crate) fn target_ref_name(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "string",
        "maxLength": 253,
        "x-kubernetes-validations": [
            rule(
                &format!("self.matches('{DNS1123_SUBDOMAIN_REGEX}')"),
                MSG_TARGET_NAME,
            ),
            rule_with_reason(
                "self == oldSelf",
                MSG_TARGET_IMMUTABLE,
                "FieldValueForbidden",
            ),
        ],
    })
}

pub(crate) fn pod_template(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true,
    })
}

pub(crate) fn stage_nodes(_: &mut SchemaGenerator) -> Schema {
    int_or_string(vec![rule(&count_or_percent_rule(), MSG_STAGE_NODES)])
}

pub(crate) fn stage_soak(_: &mut SchemaGenerator) -> Schema {
    duration("stages[].soak", false)
}

pub(crate) fn max_unavailable(_: &mut SchemaGenerator) -> Schema {
    int_or_string(vec![rule(&count_or_percent_rule(), MSG_MAX_UNAVAILABLE)])
}

pub(crate) fn max_not_ready_nodes(_: &mut SchemaGenerator) -> Schema {
    int_or_string(vec![rule(
        &count_or_percent_rule(),
        MSG_MAX_NOT_READY_NODES,
    )])
}

pub(crate) fn progress_deadline(_: &mut SchemaGenerator) -> Schema {
    duration("progressDeadline", true)
}

// Names shared by the device gates and the quarantine.

/// The DNS-1123 subdomain regex (RE2) limited to 63 characters by maxLength.
const DNS_SUBDOMAIN: &str = DNS1123_SUBDOMAIN_REGEX;

/// A string of at most `max` bytes with one rule.
pub(crate) fn string_rule(max: u32, cel: &str, message: &str) -> Schema {
    json_schema!({
        "type": "string",
        "maxLength": max,
        "x-kubernetes-validations": [rule(cel, message)],
    })
}

/// A DRA driver name (the device gates' `driver`, `quarantine.driver`).
pub(crate) fn driver_name(_: &mut SchemaGenerator) -> Schema {
    string_rule(
        63,
        &format!("self.matches('{DNS_SUBDOMAIN}')"),
        &format!("driver {MSG_DRIVER}"),
    )
}

pub(crate) fn optional_driver_name(g: &mut SchemaGenerator) -> Schema {
    driver_name(g)
}

/// A device plugin's extended resource (`gates.deviceHealth.resource`,
/// `quarantine.resource`).
pub(crate) fn health_resource(_: &mut SchemaGenerator) -> Schema {
    string_rule(
        317,
        &format!(
            "self.matches('{EXTENDED_RESOURCE_REGEX}') && !self.contains('kubernetes.io/') && !self.startsWith('requests.')"
        ),
        &format!("resource {MSG_HEALTH_RESOURCE}"),
    )
}

/// Sets the `x-kubernetes-validations` of a schema.
/// Adds `x-kubernetes-validations` entries to a schema, after any it has
/// (several modules add rules to the spec's schema).
pub(crate) fn add_rules(s: &mut Schema, rules: serde_json::Value) {
    let serde_json::Value::Array(new) = rules else {
        panic!("x-kubernetes-validations is a list");
    };
    match s.get_mut("x-kubernetes-validations") {
        Some(serde_json::Value::Array(existing)) => existing.extend(new),
        _ => {
            s.insert(
                "x-kubernetes-validations".into(),
                serde_json::Value::Array(new),
            );
        }
    }
}

/// Marks a per-node field of a stage's status (a map or a list) atomic for
/// server-side apply: the API server tracks it as one field of the operator's,
/// not one per node. Only the operator writes status; at 5,000 nodes granular
/// tracking put about 5,000 entries per field into managedFields (the object
/// reached 774 KB, half of it managedFields) and every status write cost the
/// API server 2.6 s (bench/results, 2026-12-02).
pub(crate) fn atomic(schema: &mut Schema) {
    let key = if schema.get("type") == Some(&json!("array")) {
        "x-kubernetes-list-type"
    } else {
        "x-kubernetes-map-type"
    };
    schema.insert(key.into(), json!("atomic"));
}

/// Adds `baseline` to a stage's status schema: the per-node map operators
/// before `baselineGroups` wrote (see [`crate::baseline`]). No Rust field
/// writes it; the schema keeps it so the API server does not prune it from
/// a stored status before the operator has read it.
pub(crate) fn legacy_baseline(schema: &mut Schema) {
    let legacy = json!({
        "description": "Deprecated: the per-node baseline older operators wrote; read, replaced by baselineGroups on the next write.",
        "type": "object",
        "additionalProperties": {
            "type": "object",
            "additionalProperties": {"type": "integer", "format": "int64"}
        },
        "x-kubernetes-map-type": "atomic"
    });
    if let Some(props) = schema.get_mut("properties").and_then(|p| p.as_object_mut()) {
        props.insert("baseline".into(), legacy);
    }
}

/// Adds `deviceBaseline` to a stage's status schema: the per-node map
/// operators before `deviceBaselineGroups` wrote (see
/// [`crate::device_baseline`]), as their schema had it. No Rust field writes
/// it; the schema keeps it so the API server does not prune it from a stored
/// status before the operator has read it.
pub(crate) fn legacy_device_baseline(schema: &mut Schema) {
    let legacy = json!({
        "additionalProperties": {
            "description": "What a node had of the gated DRA driver before the stage touched it.",
            "properties": {
                "capacity": {
                    "additionalProperties": {
                        "format": "int64",
                        "type": "integer"
                    },
                    "description": "Total of each device capacity (e.g. memory) over the devices.",
                    "type": "object"
                },
                "claims": {
                    "description": "ResourceClaims allocated on the node and reserved for a pod,\n`<namespace>/<name>`, sorted; at most 64 (`claimsTotal` counts them).",
                    "items": {
                        "type": "string"
                    },
                    "type": "array"
                },
                "claimsTotal": {
                    "default": 0,
                    "format": "int64",
                    "type": "integer"
                },
                "counters": {
                    "additionalProperties": {
                        "format": "int64",
                        "type": "integer"
                    },
                    "description": "Total of each shared counter (e.g. memory) over the pools.",
                    "type": "object"
                },
                "devices": {
                    "default": 0,
                    "description": "Devices published in those pools.",
                    "format": "int64",
                    "type": "integer"
                },
                "pools": {
                    "description": "The pools the driver published for the node.",
                    "items": {
                        "type": "string"
                    },
                    "type": "array"
                },
                "taints": {
                    "description": "Tainted devices, `<device>: <key>=<value>:<effect>`, sorted; at most\n64 (`taintsTotal` counts them all).",
                    "items": {
                        "type": "string"
                    },
                    "type": "array"
                },
                "taintsTotal": {
                    "default": 0,
                    "format": "int64",
                    "type": "integer"
                }
            },
            "type": "object"
        },
        "description": "Deprecated: the per-node device baseline older operators wrote; read, replaced by deviceBaselineGroups on the next write.",
        "type": "object",
        "x-kubernetes-map-type": "atomic"
    });
    if let Some(props) = schema.get_mut("properties").and_then(|p| p.as_object_mut()) {
        props.insert("deviceBaseline".into(), legacy);
    }
}

/// Marks the schema (an array) as a list-map keyed by `keys`.
pub(crate) fn list_map(schema: &mut Schema, keys: &[&str]) {
    schema.insert("x-kubernetes-list-type".into(), json!("map"));
    schema.insert("x-kubernetes-list-map-keys".into(), json!(keys));
}

/// Marks the schema (an array of scalars) as a set: the API server refuses
/// a value twice (`Duplicate value`).
pub(crate) fn list_set(schema: &mut Schema) {
    schema.insert("x-kubernetes-list-type".into(), json!("set"));
}

pub(crate) fn list_map_by_type(schema: &mut Schema) {
    list_map(schema, &["type"]);
}

pub(crate) fn list_map_by_revision(schema: &mut Schema) {
    list_map(schema, &["revision"]);
}

pub(crate) fn list_map_by_index(schema: &mut Schema) {
    list_map(schema, &["index"]);
}

pub(crate) fn list_map_by_node(schema: &mut Schema) {
    list_map(schema, &["node"]);
}

pub(crate) fn list_map_by_resource(schema: &mut Schema) {
    list_map(schema, &["resource"]);
}

pub(crate) fn list_map_by_name(schema: &mut Schema) {
    list_map(schema, &["name"]);
}
