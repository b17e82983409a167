//! The gates that prove a release serves workloads: `probe` (a short-lived
//! pod per stage node that must get a device and succeed), `logs` (agent pod
//! logs must not show a fatal line within a window after start) and
//! `prometheus` (a PromQL query over the stage's nodes must meet a
//! condition). Their spec types, schemas (CEL rules with field-named
//! messages), client-side validation, and the status records they keep.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Toleration;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::duration::DurationString;
pub use crate::status::{Measurements, ProbeRecord};

use crate::schema::{
    DNS1123_SUBDOMAIN_REGEX, EXTENDED_RESOURCE_REGEX, INT32_MAX, at_most_message,
    count_or_percent_rule, duration, duration_at_most, rule,
};
use crate::validate::{
    Errors, Validate, duration_error, is_count_or_percent, is_dns1123_label, is_dns1123_subdomain,
    is_extended_resource_name,
};

/// Gate name of the probe gate, as written in `GateResult.gate`.
pub const GATE_PROBE: &str = "probe";
/// Gate name of the logs gate.
pub const GATE_LOGS: &str = "logs";
/// Gate name prefix of the prometheus gate (`prometheus/<name>` per query).
pub const GATE_PROMETHEUS: &str = "prometheus";
/// Label on probe pods: the node the probe proves (also its pinning).
pub const PROBE_NODE_LABEL: &str = "saferollout.dev/probe-node";
/// Label on probe pods: the revision the probe proves. Probe pods are
/// selected by this label's presence.
pub const PROBE_REVISION_LABEL: &str = "saferollout.dev/probe-revision";
/// The placeholder a prometheus query may contain: replaced by a regular
/// expression matching exactly the nodes the rollout holds.
pub const STAGE_NODES_PLACEHOLDER: &str = "$STAGE_NODES";

/// Maximum number of prometheus gate entries.
pub const MAX_PROMETHEUS: u32 = 8;
/// Maximum number of user log patterns.
pub const MAX_LOG_PATTERNS: u32 = 16;
/// Longest user log pattern.
pub const MAX_PATTERN_LENGTH: u32 = 512;

pub const MSG_PROBE_DEVICE: &str = "gates.probe needs exactly one of resource (an extended resource such as nvidia.com/gpu: the probe asks for 1 in its limits) or deviceClassName (DRA: the probe claims one device of that DeviceClass)";
pub const MSG_PROBE_RESOURCE: &str = "gates.probe.resource must be an extended resource name with a domain prefix, such as nvidia.com/gpu";
pub const MSG_PROBE_CLASS: &str = "gates.probe.deviceClassName must be the name of a DeviceClass: a DNS-1123 subdomain such as gpu.nvidia.com";
pub const MSG_PROBE_SAMPLE: &str = "gates.probe.sample must be a positive node count or a percentage between 1% and 100% (e.g. 1, \"10%\")";
pub const MSG_LOG_PATTERN: &str = "gates.logs.patterns[] must be a valid regular expression (RE2 syntax, e.g. \"(?i)fatal error\")";
pub const MSG_LOG_PATTERN_EMPTY: &str =
    "gates.logs.patterns[] must not be empty (an empty pattern matches every line)";
pub const MSG_PROM_NAME: &str = "gates.prometheus[].name must be a DNS-1123 label (lowercase letters, digits and '-', at most 63 characters), e.g. gpu-healthy";
pub const MSG_PROM_ADDRESS: &str = "gates.prometheus[].address must be an http:// or https:// URL of the Prometheus server, e.g. http://prometheus.monitoring:9090";
pub const MSG_PROM_QUERY: &str = "gates.prometheus[].query must be a non-empty PromQL expression";
pub const MSG_PROM_CONDITION: &str = "gates.prometheus[].condition must be a comparison and a number, e.g. \"< 1\", \"== 0\", \">= 0.95\" (operators <, <=, ==, !=, >=, >)";
pub const MSG_PROM_COUNT: &str = "gates.prometheus[].count must be between 1 and 100";
pub const MSG_PROM_FAILURE_LIMIT: &str =
    "gates.prometheus[].failureLimit must be between 0 and 100";
pub const MSG_PROM_TOKEN_HTTPS: &str = "gates.prometheus[].address must be an https:// URL when bearerTokenSecret is set (a token is never sent in the clear)";
pub const MSG_SECRET_REF: &str =
    "a Secret reference needs name (a DNS-1123 subdomain in the SafeRollout's namespace) and key";

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

/// Built-in fatal-line pattern sets of the logs gate, each taken from the
/// agent's own sources (see `saferollout_core::gates::logs`).
#[derive(
    Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, JsonSchema,
)]
pub enum PatternSet {
    /// Any device plugin or DRA driver: kubelet registration failures.
    Generic,
    /// NVIDIA k8s-device-plugin.
    NvidiaDevicePlugin,
    /// NVIDIA DRA driver for GPUs.
    NvidiaDraDriver,
    /// AMD (ROCm) k8s-device-plugin.
    AmdDevicePlugin,
    /// Intel device plugins for Kubernetes (GPU plugin).
    IntelDevicePlugin,
}

impl PatternSet {
    pub const ALL: [PatternSet; 5] = [
        PatternSet::Generic,
        PatternSet::NvidiaDevicePlugin,
        PatternSet::NvidiaDraDriver,
        PatternSet::AmdDevicePlugin,
        PatternSet::IntelDevicePlugin,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            PatternSet::Generic => "Generic",
            PatternSet::NvidiaDevicePlugin => "NvidiaDevicePlugin",
            PatternSet::NvidiaDraDriver => "NvidiaDraDriver",
            PatternSet::AmdDevicePlugin => "AmdDevicePlugin",
            PatternSet::IntelDevicePlugin => "IntelDevicePlugin",
        }
    }
}

/// What a gate does with a result it cannot read.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
pub enum UnreadablePolicy {
    /// The gate fails (the release is reverted).
    #[default]
    Fail,
    /// The gate holds the stage (no further pod is replaced) until the logs
    /// can be read; at the progress deadline it fails.
    Pause,
}

/// The logs gate: every agent pod on the rollout's nodes must not log a
/// line matching a fatal pattern within `window` after its container
/// started.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LogsGate {
    /// Built-in pattern sets to apply. Default: all of them (their patterns
    /// are the agents' own fatal messages and do not appear in healthy logs).
    /// An empty list applies none (then `patterns` must be set).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 5))]
    pub builtin: Option<Vec<PatternSet>>,

    /// More fatal patterns: regular expressions (RE2 syntax), matched against
    /// each log line. At most 16.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "log_patterns")]
    pub patterns: Vec<String>,

    /// How long after the agent container started its log is watched. The
    /// gate passes on a node once its log was read clean after the window.
    #[serde(default = "default_logs_window")]
    #[schemars(schema_with = "logs_window")]
    pub window: DurationString,

    /// How often the logs are read while a window is open.
    #[serde(default = "default_logs_interval")]
    #[schemars(schema_with = "logs_interval")]
    pub interval: DurationString,

    /// The container whose log is read. Default: the pod's first container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 63))]
    pub container: Option<String>,

    /// When a log cannot be read (no permission, the kubelet unreachable)
    /// once its window has closed: `Fail` (default) or `Pause`. The gate
    /// never passes on logs it did not read.
    #[serde(default)]
    pub on_unreadable: UnreadablePolicy,
}

/// What the prometheus gate does with an inconclusive measurement (no data,
/// an error, a timeout).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
pub enum InconclusivePolicy {
    /// Counts as a failed measurement.
    #[default]
    Fail,
    /// Holds the stage until a measurement is conclusive; at the progress
    /// deadline the gate fails.
    Pause,
    /// Counts as a passed measurement.
    Pass,
}

/// A key of a Secret in the SafeRollout's namespace.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = secret_ref_rules)]
pub struct SecretKeyRef {
    /// The Secret's name (read by name: `get`, never `list`).
    #[schemars(length(max = 253))]
    pub name: String,
    /// The key in the Secret's data.
    #[schemars(length(max = 253))]
    pub key: String,
}

/// TLS settings of a Prometheus server.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PrometheusTls {
    /// PEM CA bundle that signed the server's certificate (else the
    /// system's roots); the certificate must name the address's host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_secret: Option<SecretKeyRef>,
}

/// One Prometheus analysis: `query` is run every `interval` once every node
/// of the stage runs the new agent; each sample of the result must meet
/// `condition`. The gate passes after `count` good measurements and fails
/// when more than `failureLimit` were bad.
///
/// The operator dials only addresses its administrator allowed
/// (`--prometheus-address`, chart value `prometheusGate.addresses`) and
/// sends a Secret only to the addresses bound to it
/// (`--prometheus-secret`, `prometheusGate.secrets`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = prometheus_rules)]
pub struct PrometheusGate {
    /// Names the gate in status and metrics (`prometheus/<name>`).
    #[schemars(schema_with = "prometheus_name")]
    pub name: String,
    /// The Prometheus server's base URL, e.g. http://prometheus.monitoring:9090.
    #[schemars(schema_with = "prometheus_address")]
    pub address: String,
    /// PromQL, evaluated as an instant query. `$STAGE_NODES` is replaced by
    /// a regular expression matching exactly the nodes the rollout holds,
    /// e.g. `min by (node) (DCGM_FI_DEV_XID_ERRORS{node=~"$STAGE_NODES"})`.
    /// Samples that carry a `node` label name the violating node.
    #[schemars(schema_with = "prometheus_query")]
    pub query: String,
    /// What every sample must satisfy: an operator and a number, e.g. `< 1`,
    /// `== 0`, `>= 0.95`.
    #[schemars(schema_with = "prometheus_condition")]
    pub condition: String,
    /// Time between measurements.
    #[serde(default = "default_prometheus_interval")]
    #[schemars(schema_with = "prometheus_interval")]
    pub interval: DurationString,
    /// Good measurements needed to pass.
    #[serde(default = "default_prometheus_count")]
    #[schemars(range(min = 1, max = 100))]
    pub count: i32,
    /// Bad measurements tolerated; one more fails the gate.
    #[serde(default)]
    #[schemars(range(min = 0, max = 100))]
    pub failure_limit: i32,
    /// What an inconclusive measurement (no data, an error, a timeout)
    /// counts as: `Fail` (default), `Pause` or `Pass`.
    #[serde(default)]
    pub inconclusive: InconclusivePolicy,
    /// How long one query may take (at most 30s).
    #[serde(default = "default_prometheus_timeout")]
    #[schemars(schema_with = "prometheus_timeout")]
    pub timeout: DurationString,
    /// TLS settings (https addresses).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<PrometheusTls>,
    /// A bearer token sent as `Authorization: Bearer ...`, from a Secret in
    /// the SafeRollout's namespace (read only when set; its value never
    /// appears in status, events or logs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bearer_token_secret: Option<SecretKeyRef>,
}

impl Default for LogsGate {
    /// Every built-in pattern set, a 60 s window read every 10 s, failing on
    /// unreadable logs.
    fn default() -> Self {
        LogsGate {
            builtin: None,
            patterns: Vec::new(),
            window: default_logs_window(),
            interval: default_logs_interval(),
            container: None,
            on_unreadable: UnreadablePolicy::Fail,
        }
    }
}

fn default_probe_delay() -> DurationString {
    DurationString::from("5s")
}

fn default_probe_timeout() -> DurationString {
    DurationString::from("2m")
}

fn default_logs_window() -> DurationString {
    DurationString::from("60s")
}

fn default_logs_interval() -> DurationString {
    DurationString::from("10s")
}

fn default_prometheus_interval() -> DurationString {
    DurationString::from("30s")
}

fn default_prometheus_count() -> i32 {
    3
}

fn default_prometheus_timeout() -> DurationString {
    DurationString::from("10s")
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

fn log_patterns(_: &mut SchemaGenerator) -> Schema {
    // `''.matches(self)` compiles the pattern: an invalid one is an error
    // the API server reports on this field.
    json_schema!({
        "type": "array",
        "maxItems": MAX_LOG_PATTERNS,
        "items": {
            "type": "string",
            "maxLength": MAX_PATTERN_LENGTH,
            "x-kubernetes-validations": [
                rule("size(self) > 0", MSG_LOG_PATTERN_EMPTY),
                rule("size(self) == 0 || ''.matches(self) || !''.matches(self)", MSG_LOG_PATTERN),
            ],
        },
    })
}

fn logs_window(_: &mut SchemaGenerator) -> Schema {
    duration("gates.logs.window", true)
}

fn logs_interval(_: &mut SchemaGenerator) -> Schema {
    duration("gates.logs.interval", true)
}

fn prometheus_name(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "string",
        "maxLength": 63,
        "x-kubernetes-validations": [rule(
            "self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$')",
            MSG_PROM_NAME,
        )],
    })
}

fn prometheus_address(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "string",
        "maxLength": 2048,
        "x-kubernetes-validations": [rule(
            "(self.startsWith('http://') || self.startsWith('https://')) && isURL(self) && size(url(self).getHostname()) > 0",
            MSG_PROM_ADDRESS,
        )],
    })
}

fn prometheus_query(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "string",
        "maxLength": 4096,
        "x-kubernetes-validations": [rule("self.trim().size() > 0", MSG_PROM_QUERY)],
    })
}

/// `<op> <number>`: the operators PromQL compares with, then a decimal.
pub const CONDITION_REGEX: &str =
    "^ *(<=|>=|==|!=|<|>) *[-+]?([0-9]+([.][0-9]*)?|[.][0-9]+)([eE][-+]?[0-9]+)? *$";

fn prometheus_condition(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "string",
        "maxLength": 64,
        "x-kubernetes-validations": [rule(
            &format!("self.matches('{CONDITION_REGEX}')"),
            MSG_PROM_CONDITION,
        )],
    })
}

fn prometheus_interval(_: &mut SchemaGenerator) -> Schema {
    duration("gates.prometheus[].interval", true)
}

/// Longest `gates.prometheus[].timeout`: a query runs beside the passes,
/// and one that takes longer is no health signal anyone can act on.
pub const MAX_PROMETHEUS_TIMEOUT: &str = "30s";

/// [`MAX_PROMETHEUS_TIMEOUT`] as a duration.
pub fn max_prometheus_timeout() -> std::time::Duration {
    std::time::Duration::from_secs(30)
}

fn prometheus_timeout(_: &mut SchemaGenerator) -> Schema {
    duration_at_most("gates.prometheus[].timeout", MAX_PROMETHEUS_TIMEOUT)
}

fn prometheus_rules(s: &mut Schema) {
    s.insert(
        "x-kubernetes-validations".into(),
        json!([{
            "rule": "!has(self.bearerTokenSecret) || self.address.startsWith('https://')",
            "message": MSG_PROM_TOKEN_HTTPS,
            "fieldPath": ".address",
        }]),
    );
}

fn secret_ref_rules(s: &mut Schema) {
    s.insert(
        "x-kubernetes-validations".into(),
        json!([{
            "rule": format!("self.name.matches('{DNS1123_SUBDOMAIN_REGEX}') && size(self.key) > 0"),
            "message": MSG_SECRET_REF,
        }]),
    );
}

/// A comparison of a prometheus gate's condition.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Condition {
    pub op: CompareOp,
    pub value: f64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CompareOp {
    Lt,
    Le,
    Eq,
    Ne,
    Ge,
    Gt,
}

impl CompareOp {
    pub fn as_str(self) -> &'static str {
        match self {
            CompareOp::Lt => "<",
            CompareOp::Le => "<=",
            CompareOp::Eq => "==",
            CompareOp::Ne => "!=",
            CompareOp::Ge => ">=",
            CompareOp::Gt => ">",
        }
    }
}

impl Condition {
    /// Parses `< 1`, `== 0`, `>= 0.95`; `None` when malformed.
    pub fn parse(s: &str) -> Option<Condition> {
        // Spaces only, as the schema's grammar.
        if s.chars().any(|c| c.is_whitespace() && c != ' ') {
            return None;
        }
        let s = s.trim();
        let (op, rest) = [
            ("<=", CompareOp::Le),
            (">=", CompareOp::Ge),
            ("==", CompareOp::Eq),
            ("!=", CompareOp::Ne),
            ("<", CompareOp::Lt),
            (">", CompareOp::Gt),
        ]
        .into_iter()
        .find_map(|(p, op)| s.strip_prefix(p).map(|rest| (op, rest)))?;
        let number = rest.trim();
        // The schema's grammar: no NaN, no infinities, no hex.
        let ok = !number.is_empty()
            && number
                .bytes()
                .all(|b| b.is_ascii_digit() || matches!(b, b'.' | b'e' | b'E' | b'+' | b'-'))
            && number.bytes().any(|b| b.is_ascii_digit());
        if !ok {
            return None;
        }
        let value: f64 = number.parse().ok()?;
        Some(Condition { op, value })
    }

    /// Whether a sample's value meets the condition (NaN never does).
    pub fn holds(&self, v: f64) -> bool {
        match self.op {
            CompareOp::Lt => v < self.value,
            CompareOp::Le => v <= self.value,
            CompareOp::Eq => v == self.value,
            CompareOp::Ne => v != self.value && !v.is_nan(),
            CompareOp::Ge => v >= self.value,
            CompareOp::Gt => v > self.value,
        }
    }
}

impl std::fmt::Display for Condition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.op.as_str(), self.value)
    }
}

// ---------------------------------------------------------------------------
// Client-side validation (mirrors the schema; see crate::validate)

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

impl Validate for LogsGate {
    fn validate(&self, path: &str, errors: &mut Errors) {
        errors.check_max_items(
            &format!("{path}.patterns"),
            self.patterns.len(),
            MAX_LOG_PATTERNS as usize,
        );
        for (i, p) in self.patterns.iter().enumerate() {
            let at = format!("{path}.patterns[{i}]");
            if p.len() > MAX_PATTERN_LENGTH as usize {
                errors.push(
                    at,
                    format!("Too long: may not be more than {MAX_PATTERN_LENGTH} bytes"),
                );
            } else if p.is_empty() {
                errors.push(at, MSG_LOG_PATTERN_EMPTY);
            } else if regex::Regex::new(p).is_err() {
                errors.push(at, MSG_LOG_PATTERN);
            }
        }
        for (field, d) in [("window", &self.window), ("interval", &self.interval)] {
            errors.check_duration(
                &format!("{path}.{field}"),
                &format!("gates.logs.{field}"),
                d,
                true,
            );
        }
    }
}

/// One entry of `gates.prometheus` (the list's size and unique names are
/// checked on `Gates`).
impl Validate for PrometheusGate {
    fn validate(&self, path: &str, errors: &mut Errors) {
        if !is_dns1123_label(&self.name) {
            errors.push(format!("{path}.name"), MSG_PROM_NAME);
        }
        if !is_http_url(&self.address) {
            errors.push(format!("{path}.address"), MSG_PROM_ADDRESS);
        }
        if self.query.trim().is_empty() {
            errors.push(format!("{path}.query"), MSG_PROM_QUERY);
        }
        if Condition::parse(&self.condition).is_none() {
            errors.push(format!("{path}.condition"), MSG_PROM_CONDITION);
        }
        if !(1..=100).contains(&self.count) {
            errors.push(format!("{path}.count"), MSG_PROM_COUNT);
        }
        if !(0..=100).contains(&self.failure_limit) {
            errors.push(format!("{path}.failureLimit"), MSG_PROM_FAILURE_LIMIT);
        }
        for (field, d) in [("interval", &self.interval), ("timeout", &self.timeout)] {
            errors.check_duration(
                &format!("{path}.{field}"),
                &format!("gates.prometheus[].{field}"),
                d,
                true,
            );
        }
        if duration_error("gates.prometheus[].timeout", &self.timeout, true).is_none()
            && self
                .timeout
                .to_std()
                .is_ok_and(|t| t > max_prometheus_timeout())
        {
            errors.push(
                format!("{path}.timeout"),
                at_most_message("gates.prometheus[].timeout", MAX_PROMETHEUS_TIMEOUT),
            );
        }
        if self.bearer_token_secret.is_some() && !self.address.starts_with("https://") {
            errors.push(format!("{path}.address"), MSG_PROM_TOKEN_HTTPS);
        }
        let refs = [
            ("bearerTokenSecret", self.bearer_token_secret.as_ref()),
            (
                "tls.caSecret",
                self.tls.as_ref().and_then(|t| t.ca_secret.as_ref()),
            ),
        ];
        for (field, r) in refs {
            if let Some(r) = r
                && (!is_dns1123_subdomain(&r.name) || r.key.is_empty())
            {
                errors.push(format!("{path}.{field}"), MSG_SECRET_REF);
            }
        }
    }
}

/// An absolute http(s) URL with a host (what the schema's `url()` accepts).
pub fn is_http_url(s: &str) -> bool {
    let Some(rest) = s
        .strip_prefix("http://")
        .or_else(|| s.strip_prefix("https://"))
    else {
        return false;
    };
    let host_port = rest.split(['/', '?', '#']).next().unwrap_or_default();
    let host = match host_port.rsplit_once(':') {
        Some((h, port)) if !h.ends_with(']') || host_port.starts_with('[') => {
            if !port.is_empty() && !port.bytes().all(|b| b.is_ascii_digit()) {
                return false;
            }
            h
        }
        _ => host_port,
    };
    !host.is_empty() && !host.contains(char::is_whitespace) && !s.contains(char::is_whitespace)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conditions_parse_and_hold() {
        let c = Condition::parse("< 1").unwrap();
        assert!(c.holds(0.0) && !c.holds(1.0));
        let c = Condition::parse("==0").unwrap();
        assert!(c.holds(0.0) && !c.holds(79.0));
        let c = Condition::parse(" >= 0.95 ").unwrap();
        assert!(c.holds(1.0) && !c.holds(0.5));
        assert!(!Condition::parse("!= 1").unwrap().holds(f64::NAN));
        for bad in [
            "", "1", "< ", "<< 1", "= 1", "< NaN", "< inf", "< 0x10", "approx 1",
        ] {
            assert!(Condition::parse(bad).is_none(), "{bad}");
        }
        // The schema's regex agrees with the parser on these.
        let re = regex::Regex::new(CONDITION_REGEX).unwrap();
        for s in ["< 1", "==0", ">= 0.95", "!= -1e3", "> .5"] {
            assert!(re.is_match(s) && Condition::parse(s).is_some(), "{s}");
        }
        for s in ["1", "< NaN", "=> 1", "< 1 2"] {
            assert!(!re.is_match(s) && Condition::parse(s).is_none(), "{s}");
        }
    }

    #[test]
    fn urls() {
        for ok in [
            "http://127.0.0.1:9090",
            "https://prometheus.monitoring.svc:9090/prom",
            "http://[::1]:9090",
        ] {
            assert!(is_http_url(ok), "{ok}");
        }
        for bad in [
            "prometheus:9090",
            "ftp://x",
            "http://",
            "http://:9090",
            "http://a b",
        ] {
            assert!(!is_http_url(bad), "{bad}");
        }
    }
}
