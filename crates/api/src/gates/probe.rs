//! `gates.probe`: a short-lived pod per stage node (or a sample) that asks
//! for one device and must succeed, proving the devices serve workloads.
//! Its settings, schema (CEL rules with field-named messages), client-side
//! validation and the labels of its pods; the judgement is
//! `saferollout_core::gates::probe`. What it records per node is
//! `crate::status::ProbeRecord`.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Toleration;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::duration::DurationString;
use crate::schema::{
    DNS1123_SUBDOMAIN_REGEX, EXTENDED_RESOURCE_REGEX, INT32_MAX, count_or_percent_rule, duration,
    rule,
};
use crate::validate::{
    Errors, Validate, is_count_or_percent, is_dns1123_subdomain, is_extended_resource_name,
};

/// Label on probe pods: the node the probe proves (also its pinning).
pub const PROBE_NODE_LABEL: &str = "saferollout.dev/probe-node";
/// Label on probe pods: the revision the probe proves. Probe pods are
/// selected by this label's presence.
pub const PROBE_REVISION_LABEL: &str = "saferollout.dev/probe-revision";

pub const MSG_PROBE_DEVICE: &str = "gates.probe needs exactly one of resource (an extended resource such as nvidia.com/gpu: the probe asks for 1 in its limits) or deviceClassName (DRA: the probe claims one device of that DeviceClass)";
pub const MSG_PROBE_RESOURCE: &str = "gates.probe.resource must be an extended resource name with a domain prefix, such as nvidia.com/gpu";
pub const MSG_PROBE_CLASS: &str = "gates.probe.deviceClassName must be the name of a DeviceClass: a DNS-1123 subdomain such as gpu.nvidia.com";
pub const MSG_PROBE_SAMPLE: &str = "gates.probe.sample must be a positive node count or a percentage between 1% and 100% (e.g. 1, \"10%\")";

/// The probe gate: after a stage node's agent is replaced (and the other
/// gates see nothing wrong there), a short-lived pod pinned to the node and
/// asking for one device must be scheduled and succeed within `timeout`.
///
/// The probe is built from an allow-list: you give the container (`image`,
/// `command`, `args`, `env`, `resources`), `labels` and `tolerations`; the
/// operator sets everything else (no service-account token, non-root,
/// all capabilities dropped, seccomp RuntimeDefault, no host namespaces, no
/// volumes, `restartPolicy: Never`), so a SafeRollout cannot run a pod its
/// author could not.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = probe_rules)]
pub struct ProbeGate {
    /// The probe container's image, e.g.
    /// nvcr.io/nvidia/k8s/cuda-sample:vectoradd-cuda12.5.0.
    #[schemars(length(min = 1, max = 512))]
    pub image: String,

    /// The container's command (its entrypoint when empty).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "probe_words")]
    pub command: Vec<String>,

    /// The container's arguments.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "probe_words")]
    pub args: Vec<String>,

    /// Environment variables with literal values (no references to Secrets
    /// or other objects). At most 32.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub env: Vec<ProbeEnvVar>,

    /// The container's resource requests and limits (the gate adds one
    /// device to the limits).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ProbeResources>,

    /// Labels of the probe pod (e.g. for an admission policy or a simulated
    /// kubelet to recognise it). The operator's own labels win.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(schema_with = "probe_labels")]
    pub labels: BTreeMap<String, String>,

    /// Tolerations of the probe pod. Each must be one the agent's own
    /// template has (a probe goes only where the agent may); the gate also
    /// tolerates exactly the node's taints that the agent tolerates.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub tolerations: Vec<Toleration>,

    /// Extra groups of the probe's user (it runs as 65534 unless
    /// privileged): the host groups that own the device nodes where they are
    /// not world-readable, e.g. `video` (44) and `render` (the host's GID)
    /// for AMD's `/dev/kfd` and Intel's `/dev/dri/renderD*`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "probe_groups")]
    pub supplemental_groups: Vec<i64>,

    /// Run the probe container privileged, as root. Only for diagnostics
    /// that need it (NVIDIA DCGM's `dcgmi diag`, AMD's ROCm Validation
    /// Suite `rvs`, Intel's `xpu-smi diag`, which read device counters
    /// through interfaces a device allocation does not expose): the operator
    /// refuses it unless its administrator allowed privileged probes
    /// (`--allow-privileged-probes`, chart value `probe.allowPrivileged`),
    /// and the admission policy admits it only from an author who may create
    /// pods in the namespace.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub privileged: bool,

    /// Device-plugin agents: the extended resource the probe asks for one of
    /// (e.g. nvidia.com/gpu).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "probe_resource")]
    pub resource: Option<String>,

    /// DRA drivers: the DeviceClass the probe claims one device of.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "probe_device_class")]
    pub device_class_name: Option<String>,

    /// Which of each stage's nodes are probed: a count or a percentage of
    /// the stage's nodes (rounded up). The first stage (the canary) is always
    /// probed in full. Default: every node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "probe_sample")]
    pub sample: Option<IntOrString>,

    /// How long after the node's new agent is Ready (and the other gates
    /// accept the node) the probe is created: a restarted plugin needs a
    /// moment before the node shows what it advertises.
    #[serde(default = "default_probe_delay")]
    #[schemars(schema_with = "probe_delay")]
    pub delay: DurationString,

    /// How long a probe may take from its creation to `Succeeded`
    /// (scheduling, image pull, run). When it passes, the probe fails with
    /// what it saw (the scheduler's message, the container's state).
    #[serde(default = "default_probe_timeout")]
    #[schemars(schema_with = "probe_timeout")]
    pub timeout: DurationString,
}

impl ProbeGate {
    /// The probe gate's name, as written in `GateResult.gate`.
    pub const NAME: &'static str = "probe";
}

/// The gate's name, [`ProbeGate::NAME`].
pub const GATE_PROBE: &str = ProbeGate::NAME;

/// An environment variable of the probe container: a literal value only.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProbeEnvVar {
    /// The variable's name.
    #[schemars(length(min = 1, max = 256))]
    pub name: String,
    /// Its value.
    #[serde(default)]
    #[schemars(length(max = 4096))]
    pub value: String,
}

/// Requests and limits of the probe container (quantities by resource name).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProbeResources {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = 16))]
    pub requests: BTreeMap<String, Quantity>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = 16))]
    pub limits: BTreeMap<String, Quantity>,
}

fn default_probe_delay() -> DurationString {
    DurationString::from("5s")
}

fn default_probe_timeout() -> DurationString {
    DurationString::from("2m")
}

fn probe_words(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "array",
        "maxItems": 64,
        "items": {"type": "string", "maxLength": 4096},
    })
}

fn probe_groups(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "array",
        "maxItems": 16,
        "items": {"type": "integer", "format": "int64", "minimum": 1, "maximum": INT32_MAX},
    })
}

fn probe_labels(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "object",
        "maxProperties": 16,
        "additionalProperties": {"type": "string", "maxLength": 63},
    })
}

fn probe_resource(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "string",
        "maxLength": 317,
        "x-kubernetes-validations": [rule(
            &format!(
                "self.matches('{EXTENDED_RESOURCE_REGEX}') && !self.contains('kubernetes.io/') && !self.startsWith('requests.')"
            ),
            MSG_PROBE_RESOURCE,
        )],
    })
}

fn probe_device_class(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "string",
        "maxLength": 253,
        "x-kubernetes-validations": [rule(
            &format!("self.matches('{DNS1123_SUBDOMAIN_REGEX}')"),
            MSG_PROBE_CLASS,
        )],
    })
}

fn probe_sample(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "x-kubernetes-int-or-string": true,
        "nullable": false,
        "x-kubernetes-validations": [rule(&count_or_percent_rule(), MSG_PROBE_SAMPLE)],
    })
}

fn probe_delay(_: &mut SchemaGenerator) -> Schema {
    duration("gates.probe.delay", false)
}

fn probe_timeout(_: &mut SchemaGenerator) -> Schema {
    duration("gates.probe.timeout", true)
}

fn probe_rules(s: &mut Schema) {
    s.insert(
        "x-kubernetes-validations".into(),
        json!([{
            "rule": "has(self.resource) != has(self.deviceClassName)",
            "message": MSG_PROBE_DEVICE,
        }]),
    );
}

impl Validate for ProbeGate {
    fn validate(&self, path: &str, errors: &mut Errors) {
        if self.image.is_empty() || self.image.len() > 512 {
            errors.push(
                format!("{path}.image"),
                "should be between 1 and 512 characters",
            );
        }
        for (field, len, max) in [
            ("command", self.command.len(), 64),
            ("args", self.args.len(), 64),
            ("env", self.env.len(), 32),
            ("supplementalGroups", self.supplemental_groups.len(), 16),
            ("tolerations", self.tolerations.len(), 16),
        ] {
            errors.check_max_items(&format!("{path}.{field}"), len, max);
        }
        for (i, g) in self.supplemental_groups.iter().enumerate() {
            if !(1..=INT32_MAX).contains(g) {
                errors.push(
                    format!("{path}.supplementalGroups[{i}]"),
                    format!("Invalid value: {g}: should be between 1 and {INT32_MAX}"),
                );
            }
        }
        if self.resource.is_some() == self.device_class_name.is_some() {
            errors.push(path, MSG_PROBE_DEVICE);
        }
        if let Some(r) = &self.resource
            && !is_extended_resource_name(r)
        {
            errors.push(format!("{path}.resource"), MSG_PROBE_RESOURCE);
        }
        if let Some(c) = &self.device_class_name
            && !is_dns1123_subdomain(c)
        {
            errors.push(format!("{path}.deviceClassName"), MSG_PROBE_CLASS);
        }
        if let Some(s) = &self.sample
            && !is_count_or_percent(s)
        {
            errors.push(format!("{path}.sample"), MSG_PROBE_SAMPLE);
        }
        errors.check_duration(
            &format!("{path}.delay"),
            "gates.probe.delay",
            &self.delay,
            false,
        );
        errors.check_duration(
            &format!("{path}.timeout"),
            "gates.probe.timeout",
            &self.timeout,
            true,
        );
    }
}
