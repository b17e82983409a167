//! `gates.prometheus[]`: a PromQL query over the stage's nodes must meet a
//! condition. Its settings, schema (CEL rules with field-named messages),
//! client-side validation and the condition's grammar; the judgement is
//! `saferollout_core::gates::prometheus`. The tally it keeps is
//! `crate::status::Measurements`.

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::duration::DurationString;
use crate::schema::{DNS1123_SUBDOMAIN_REGEX, at_most_message, duration, duration_at_most, rule};
use crate::validate::{Errors, Validate, duration_error, is_dns1123_label, is_dns1123_subdomain};

/// The placeholder a prometheus query may contain: replaced by a regular
/// expression matching exactly the nodes the rollout holds.
pub const STAGE_NODES_PLACEHOLDER: &str = "$STAGE_NODES";

/// Maximum number of prometheus gate entries.
pub const MAX_PROMETHEUS: u32 = 8;

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

impl PrometheusGate {
    /// The gate's name prefix, as written in `GateResult.gate`
    /// (`prometheus/<name>` per query).
    pub const NAME: &'static str = "prometheus";
}

/// The gate's name, [`PrometheusGate::NAME`].
pub const GATE_PROMETHEUS: &str = PrometheusGate::NAME;

fn default_prometheus_interval() -> DurationString {
    DurationString::from("30s")
}

fn default_prometheus_count() -> i32 {
    3
}

fn default_prometheus_timeout() -> DurationString {
    DurationString::from("10s")
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
