//! `gates.logs`: agent pod logs must not show a fatal line within a window
//! after start. Its settings, schema (CEL rules with field-named messages)
//! and client-side validation; the judgement and the built-in patterns are
//! `saferollout_core::gates::logs`.

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Serialize};

use crate::duration::DurationString;
use crate::schema::{duration, rule};
use crate::validate::{Errors, Validate};

/// Maximum number of user log patterns.
pub const MAX_LOG_PATTERNS: u32 = 16;
/// Longest user log pattern.
pub const MAX_PATTERN_LENGTH: u32 = 512;

pub const MSG_LOG_PATTERN: &str = "gates.logs.patterns[] must be a valid regular expression (RE2 syntax, e.g. \"(?i)fatal error\")";
pub const MSG_LOG_PATTERN_EMPTY: &str =
    "gates.logs.patterns[] must not be empty (an empty pattern matches every line)";

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

impl LogsGate {
    /// The logs gate's name, as written in `GateResult.gate`.
    pub const NAME: &'static str = "logs";
}

/// The gate's name, [`LogsGate::NAME`].
pub const GATE_LOGS: &str = LogsGate::NAME;

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

fn default_logs_window() -> DurationString {
    DurationString::from("60s")
}

fn default_logs_interval() -> DurationString {
    DurationString::from("10s")
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
