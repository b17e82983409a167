//! What the operator's administrator lets a SafeRollout ask for: the
//! operator's own flags (chart values), checked on every pass beside what
//! the admission policy checked of the SafeRollout's author.
//!
//! The admission policy (`charts/saferollout/templates/admission.yaml`)
//! refuses a SafeRollout whose author lacks a right it would borrow; these
//! limits hold whoever the author was (the policy may not be installed, or
//! may exempt a GitOps controller), and cover what RBAC cannot express: which
//! Prometheus servers may be dialled and which Secret may go to which of
//! them, whether a quarantine may evict, whether a probe may be privileged,
//! and whether a user's log pattern compiles within bounds.
//!
//! A SafeRollout asking for more is refused with `InvalidSpec`, naming the
//! field and the flag that would allow it: it starts no rollout and writes
//! no template, while a revert or a stopped rollout's hold goes on.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Toleration;
use saferollout_api::{
    OnFailure, PrometheusGate, QuarantineEffect, QuarantineTarget, SafeRolloutSpec,
};

/// The operator's limits on what SafeRollouts may ask for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AdminLimits {
    /// Base URLs the prometheus gate may dial (`--prometheus-address`): an
    /// address is allowed when it is one of them or lies under one (the
    /// entry followed by `/`).
    pub prometheus_addresses: Vec<String>,
    /// Secrets the prometheus gate may send (`--prometheus-secret
    /// NAME=URL`), by name, with the base URLs each may go to.
    pub prometheus_secrets: BTreeMap<String, Vec<String>>,
    /// `quarantine.effect: NoExecute` (evicting workloads) is allowed
    /// (`--quarantine-allow-no-execute`).
    pub quarantine_no_execute: bool,
    /// `gates.probe.privileged` is allowed (`--allow-privileged-probes`).
    pub privileged_probes: bool,
    /// Every address and Secret is allowed: planning without an operator
    /// (the CLI) and the model; never set from a flag.
    pub any_address: bool,
    /// `strategy: Selector` may run (`--selector-strategy`; the chart sets
    /// it with the RBAC the strategy needs).
    pub selector_strategy: bool,
    /// `spec.nodeMaintenance` may cordon nodes and evict their workloads
    /// (`--node-maintenance`; the chart sets it with the RBAC it needs).
    pub node_maintenance: bool,
    /// `spec.ownerRevert` may patch a vendor operator's custom resource
    /// (`--owner-revert`; the chart sets it with the RBAC it needs).
    pub owner_revert: bool,
}

/// No limit at all: for planning and tests, never for the operator.
pub static UNLIMITED: AdminLimits = AdminLimits {
    prometheus_addresses: Vec::new(),
    prometheus_secrets: BTreeMap::new(),
    quarantine_no_execute: true,
    privileged_probes: true,
    any_address: true,
    selector_strategy: true,
    node_maintenance: true,
    owner_revert: true,
};

impl AdminLimits {
    /// [`UNLIMITED`], owned.
    pub fn unlimited() -> Self {
        UNLIMITED.clone()
    }

    /// Whether the prometheus gate may dial `address`.
    pub fn address_allowed(&self, address: &str) -> bool {
        self.any_address || under_any(address, &self.prometheus_addresses)
    }

    /// Whether Secret `name` may be sent to `address`.
    pub fn secret_allowed(&self, name: &str, address: &str) -> bool {
        self.any_address
            || self
                .prometheus_secrets
                .get(name)
                .is_some_and(|bases| under_any(address, bases))
    }
}

/// `address` is one of `bases` or lies under one: the base followed by `/`
/// (so `https://prom:9090` admits `https://prom:9090/api` but never
/// `https://prom:9090.evil.example` or `https://prom:9090@evil.example`).
fn under_any(address: &str, bases: &[String]) -> bool {
    bases.iter().any(|b| {
        let base = b.trim_end_matches('/');
        !base.is_empty()
            && (address == base
                || address
                    .strip_prefix(base)
                    .is_some_and(|rest| rest.starts_with('/')))
    })
}

/// One thing a SafeRollout asks for that the operator refuses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The field, e.g. `spec.gates.prometheus[0].address`.
    pub field: String,
    /// Why, and what would allow it.
    pub message: String,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

/// Everything `spec` asks for beyond `limits`, given the agent's
/// tolerations (a probe may only tolerate what the agent does).
pub fn refusals(
    spec: &SafeRolloutSpec,
    limits: &AdminLimits,
    agent_tolerations: &[Toleration],
) -> Vec<Refusal> {
    let mut out = Vec::new();
    prometheus(spec, limits, &mut out);
    quarantine(spec, limits, &mut out);
    probes(spec, limits, agent_tolerations, &mut out);
    log_patterns(spec, &mut out);
    strategy(spec, limits, &mut out);
    maintenance(spec, limits, &mut out);
    owner_revert(spec, limits, &mut out);
    out
}

/// `spec.ownerRevert` patches a vendor operator's custom resource: only
/// where the administrator enabled it.
fn owner_revert(spec: &SafeRolloutSpec, limits: &AdminLimits, out: &mut Vec<Refusal>) {
    if spec.owner_revert.is_some() && !limits.owner_revert {
        refuse(
            out,
            "spec.ownerRevert".into(),
            "reverting through a vendor operator's custom resource is not enabled in this \
             installation (operator flag --owner-revert, chart value ownerRevert.enabled)"
                .into(),
        );
    }
}

/// `spec.nodeMaintenance` cordons nodes and evicts workloads of any
/// namespace from them: only where the administrator enabled it.
fn maintenance(spec: &SafeRolloutSpec, limits: &AdminLimits, out: &mut Vec<Refusal>) {
    if spec.node_maintenance.is_some() && !limits.node_maintenance {
        refuse(
            out,
            "spec.nodeMaintenance".into(),
            "cordoning and draining nodes is not enabled in this installation (operator flag \
             --node-maintenance, chart value nodeMaintenance.enabled)"
                .into(),
        );
    }
}

/// `strategy: Selector` is accepted by the schema (so manifests written for
/// it validate) while the operator cannot run it yet: it is refused here, so
/// such a SafeRollout touches nothing rather than rolling out `InPlace`
/// behind its author's back.
fn strategy(spec: &SafeRolloutSpec, limits: &AdminLimits, out: &mut Vec<Refusal>) {
    if spec.strategy == saferollout_api::Strategy::Selector && !limits.selector_strategy {
        refuse(
            out,
            "spec.strategy".into(),
            "Selector is not enabled in this installation (operator flag \
             --selector-strategy, chart value selector.enabled); use InPlace"
                .into(),
        );
    }
}

fn refuse(out: &mut Vec<Refusal>, field: String, message: String) {
    out.push(Refusal { field, message });
}

fn prometheus(spec: &SafeRolloutSpec, limits: &AdminLimits, out: &mut Vec<Refusal>) {
    for (i, g) in spec.prometheus_gates().iter().enumerate() {
        prometheus_gate(&format!("spec.gates.prometheus[{i}]"), g, limits, out);
    }
}

/// Why the operator may not run `gate`'s query, if it may not: what the
/// runtime checks again before it reads a Secret or dials an address.
pub fn refusals_of_prometheus(gate: &PrometheusGate, limits: &AdminLimits) -> Option<String> {
    let mut out = Vec::new();
    prometheus_gate(
        &format!("gates.prometheus[{}]", gate.name),
        gate,
        limits,
        &mut out,
    );
    (!out.is_empty()).then(|| describe_all(&out))
}

/// The refusals as one text, `field: why; field: why`.
pub fn describe_all(refused: &[Refusal]) -> String {
    refused
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

fn prometheus_gate(at: &str, g: &PrometheusGate, limits: &AdminLimits, out: &mut Vec<Refusal>) {
    if !limits.address_allowed(&g.address) {
        refuse(
            out,
            format!("{at}.address"),
            format!(
                "{:?} is not an address the operator may dial: its administrator allows them with --prometheus-address (chart value prometheusGate.addresses)",
                g.address
            ),
        );
    }
    if g.bearer_token_secret.is_some() && !g.address.starts_with("https://") {
        refuse(
            out,
            format!("{at}.address"),
            "a bearer token is sent only over https".into(),
        );
    }
    let secrets = [
        ("bearerTokenSecret", g.bearer_token_secret.as_ref()),
        (
            "tls.caSecret",
            g.tls.as_ref().and_then(|t| t.ca_secret.as_ref()),
        ),
    ];
    for (field, secret) in secrets {
        let Some(secret) = secret else { continue };
        if !limits.secret_allowed(&secret.name, &g.address) {
            refuse(
                out,
                format!("{at}.{field}"),
                format!(
                    "Secret {:?} may not be sent to {:?}: its administrator binds each Secret to the addresses it may go to with --prometheus-secret NAME=URL (chart value prometheusGate.secrets)",
                    secret.name, g.address
                ),
            );
        }
    }
}

fn quarantine(spec: &SafeRolloutSpec, limits: &AdminLimits, out: &mut Vec<Refusal>) {
    if spec.on_failure != OnFailure::Quarantine {
        return;
    }
    let effect = spec.quarantine_effect();
    if effect == QuarantineEffect::NoExecute && !limits.quarantine_no_execute {
        refuse(
            out,
            "spec.quarantine.effect".into(),
            "NoExecute evicts every workload using the quarantined devices: its administrator allows it with --quarantine-allow-no-execute (chart value quarantine.allowNoExecute); NoSchedule, or None to preview what NoExecute would evict, need nothing".into(),
        );
    }
    if effect == QuarantineEffect::None
        && matches!(
            spec.quarantine_target(),
            Some(QuarantineTarget::Resource(_))
        )
    {
        refuse(
            out,
            "spec.quarantine.effect".into(),
            "None previews a DeviceTaintRule and needs a DRA driver; a device plugin's quarantine is a node taint, which has no None effect".into(),
        );
    }
    // Only what this rollout judges (the schema says so too).
    for (field, why) in spec.quarantine_out_of_scope() {
        refuse(out, field.into(), why.into());
    }
}

fn probes(
    spec: &SafeRolloutSpec,
    limits: &AdminLimits,
    agent: &[Toleration],
    out: &mut Vec<Refusal>,
) {
    if let Some(p) = spec.probe_gate() {
        if p.privileged && !limits.privileged_probes {
            refuse(
                out,
                "spec.gates.probe.privileged".into(),
                "privileged probes run as root with every device and capability of the node: its administrator allows them with --allow-privileged-probes (chart value probe.allowPrivileged)".into(),
            );
        }
        tolerations("spec.gates.probe.tolerations", &p.tolerations, agent, out);
    }
    if let Some(p) = spec
        .gates
        .as_ref()
        .and_then(|g| g.claims.as_ref())
        .and_then(|c| c.probe.as_ref())
    {
        tolerations(
            "spec.gates.claims.probe.tolerations",
            &p.tolerations,
            agent,
            out,
        );
    }
}

/// A probe goes only where the agent may: each of its tolerations must be
/// covered by one of the agent's.
fn tolerations(at: &str, asked: &[Toleration], agent: &[Toleration], out: &mut Vec<Refusal>) {
    for (i, t) in asked.iter().enumerate() {
        if !agent.iter().any(|a| covers(a, t)) {
            refuse(
                out,
                format!("{at}[{i}]"),
                format!(
                    "the agent's template has no toleration covering {}: a probe tolerates only what the agent does",
                    describe(t)
                ),
            );
        }
    }
}

/// Whether toleration `a` tolerates everything `t` does.
pub fn covers(a: &Toleration, t: &Toleration) -> bool {
    let effect = |x: &Toleration| x.effect.clone().filter(|e| !e.is_empty());
    if effect(a).is_some() && effect(a) != effect(t) {
        return false;
    }
    let key = |x: &Toleration| x.key.clone().filter(|k| !k.is_empty());
    let exists = |x: &Toleration| x.operator.as_deref() == Some("Exists");
    let keys_ok = match (exists(a), key(a)) {
        (true, None) => true,
        (true, Some(k)) => key(t).as_deref() == Some(k.as_str()),
        (false, k) => {
            k.is_some()
                && key(t) == k
                && !exists(t)
                && a.value.as_deref().unwrap_or("") == t.value.as_deref().unwrap_or("")
        }
    };
    // A bounded toleration (tolerationSeconds) does not cover an unbounded one.
    let seconds_ok = match (a.toleration_seconds, t.toleration_seconds) {
        (None, _) => true,
        (Some(a), Some(t)) => t <= a,
        (Some(_), None) => false,
    };
    keys_ok && seconds_ok
}

fn describe(t: &Toleration) -> String {
    format!(
        "{}{}{}{}",
        t.key.as_deref().unwrap_or("<any key>"),
        if t.operator.as_deref() == Some("Exists") {
            " (Exists)".to_string()
        } else {
            format!("={}", t.value.as_deref().unwrap_or(""))
        },
        t.effect
            .as_deref()
            .map(|e| format!(":{e}"))
            .unwrap_or_default(),
        t.toleration_seconds
            .map(|s| format!(" for {s}s"))
            .unwrap_or_default()
    )
}

fn log_patterns(spec: &SafeRolloutSpec, out: &mut Vec<Refusal>) {
    let Some(g) = spec.logs_gate() else { return };
    for (i, p) in g.patterns.iter().enumerate() {
        if let Some(e) = crate::gates::logs::user_pattern_error(p) {
            refuse(
                out,
                format!("spec.gates.logs.patterns[{i}]"),
                format!("{p:?} does not compile for the operator: {e}"),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use saferollout_api::{
        Gates, LogsGate, PrometheusGate, QuarantineSpec, ResourceSlicesGate, SecretKeyRef,
    };
    use serde_json::json;

    use super::*;

    fn prometheus_gate(address: &str) -> PrometheusGate {
        serde_json::from_value(json!({
            "name": "xid", "address": address, "query": "up", "condition": "== 1"
        }))
        .unwrap()
    }

    fn spec_with(gates: Gates) -> SafeRolloutSpec {
        let mut s = SafeRolloutSpec::for_daemonset("plugin");
        s.gates = Some(gates);
        s
    }

    fn fields(r: &[Refusal]) -> Vec<&str> {
        r.iter().map(|r| r.field.as_str()).collect()
    }

    #[test]
    fn prometheus_addresses_must_lie_under_an_allowed_base() {
        let limits = AdminLimits {
            prometheus_addresses: vec!["https://prom.monitoring:9090/".into()],
            ..Default::default()
        };
        for ok in [
            "https://prom.monitoring:9090",
            "https://prom.monitoring:9090/",
            "https://prom.monitoring:9090/thanos",
        ] {
            assert!(limits.address_allowed(ok), "{ok}");
        }
        for bad in [
            "https://prom.monitoring:90901",
            "https://prom.monitoring:9090.evil.example",
            "https://prom.monitoring:9090@evil.example",
            "http://prom.monitoring:9090",
            "https://evil.example/https://prom.monitoring:9090",
        ] {
            assert!(!limits.address_allowed(bad), "{bad}");
        }
        // The default allows nothing, and the refusal names the flag.
        let spec = spec_with(Gates {
            prometheus: vec![prometheus_gate("http://127.0.0.1:9090")],
            ..Default::default()
        });
        let r = refusals(&spec, &AdminLimits::default(), &[]);
        assert_eq!(fields(&r), ["spec.gates.prometheus[0].address"]);
        assert!(r[0].message.contains("--prometheus-address"), "{}", r[0]);
        assert!(refusals(&spec, &AdminLimits::unlimited(), &[]).is_empty());
    }

    #[test]
    fn a_secret_goes_only_to_the_addresses_bound_to_it() {
        let mut gate = prometheus_gate("https://prom:9090");
        gate.bearer_token_secret = Some(SecretKeyRef {
            name: "prom-token".into(),
            key: "token".into(),
        });
        let spec = spec_with(Gates {
            prometheus: vec![gate.clone()],
            ..Default::default()
        });
        let mut limits = AdminLimits {
            prometheus_addresses: vec!["https://prom:9090".into(), "https://other:9090".into()],
            ..Default::default()
        };
        let r = refusals(&spec, &limits, &[]);
        assert_eq!(fields(&r), ["spec.gates.prometheus[0].bearerTokenSecret"]);
        assert!(r[0].message.contains("--prometheus-secret"), "{}", r[0]);
        limits
            .prometheus_secrets
            .insert("prom-token".into(), vec!["https://other:9090".into()]);
        assert_eq!(refusals(&spec, &limits, &[]).len(), 1, "bound elsewhere");
        limits
            .prometheus_secrets
            .insert("prom-token".into(), vec!["https://prom:9090".into()]);
        assert_eq!(refusals(&spec, &limits, &[]), []);
        // Never in the clear, whatever the limits say.
        gate.address = "http://prom:9090".into();
        let spec = spec_with(Gates {
            prometheus: vec![gate],
            ..Default::default()
        });
        let r = refusals(&spec, &AdminLimits::unlimited(), &[]);
        assert_eq!(fields(&r), ["spec.gates.prometheus[0].address"]);
    }

    #[test]
    fn quarantine_effects_and_scope() {
        let mut spec = spec_with(Gates {
            resource_slices: Some(ResourceSlicesGate::new("gpu.example.com")),
            ..Default::default()
        });
        spec.on_failure = OnFailure::Quarantine;
        spec.quarantine = Some(QuarantineSpec {
            effect: QuarantineEffect::NoExecute,
            ..Default::default()
        });
        let r = refusals(&spec, &AdminLimits::default(), &[]);
        assert_eq!(fields(&r), ["spec.quarantine.effect"]);
        assert!(r[0].message.contains("--quarantine-allow-no-execute"));
        let allowed = AdminLimits {
            quarantine_no_execute: true,
            ..Default::default()
        };
        assert_eq!(refusals(&spec, &allowed, &[]), []);
        // Preview and NoSchedule need nothing.
        for effect in [QuarantineEffect::None, QuarantineEffect::NoSchedule] {
            spec.quarantine.as_mut().unwrap().effect = effect;
            assert_eq!(refusals(&spec, &AdminLimits::default(), &[]), []);
        }
        // Another driver than the one judged is out of scope.
        spec.quarantine.as_mut().unwrap().driver = Some("other.example.com".into());
        assert_eq!(
            fields(&refusals(&spec, &AdminLimits::default(), &[])),
            ["spec.quarantine.driver"]
        );
        // A device plugin's quarantine has no None effect.
        let mut plugin = spec_with(Gates {
            allocatable: vec![saferollout_api::AllocatableGate::new("example.com/gpu")],
            ..Default::default()
        });
        plugin.on_failure = OnFailure::Quarantine;
        plugin.quarantine = Some(QuarantineSpec {
            effect: QuarantineEffect::None,
            resource: Some("example.com/gpu".into()),
            ..Default::default()
        });
        assert_eq!(
            fields(&refusals(&plugin, &AdminLimits::default(), &[])),
            ["spec.quarantine.effect"]
        );
        plugin.quarantine = Some(QuarantineSpec {
            resource: Some("nvidia.com/gpu".into()),
            ..Default::default()
        });
        assert_eq!(
            fields(&refusals(&plugin, &AdminLimits::default(), &[])),
            ["spec.quarantine.resource"]
        );
    }

    #[test]
    fn probes_are_privileged_only_when_allowed_and_tolerate_only_what_the_agent_does() {
        let tol = |v: serde_json::Value| -> Toleration { serde_json::from_value(v).unwrap() };
        let mut probe: saferollout_api::ProbeGate = serde_json::from_value(json!({
            "image": "cuda-sample:vectoradd", "resource": "nvidia.com/gpu", "privileged": true,
            "tolerations": [
                {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
                {"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoExecute"},
            ]
        }))
        .unwrap();
        let agent = [tol(
            json!({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}),
        )];
        let spec = spec_with(Gates {
            probe: Some(probe.clone()),
            ..Default::default()
        });
        let r = refusals(&spec, &AdminLimits::default(), &agent);
        assert_eq!(
            fields(&r),
            [
                "spec.gates.probe.privileged",
                "spec.gates.probe.tolerations[1]"
            ]
        );
        assert!(r[0].message.contains("--allow-privileged-probes"));
        assert!(r[1].message.contains("dedicated=ml:NoExecute"), "{}", r[1]);
        // An agent that tolerates everything covers any probe toleration.
        let all = [tol(json!({"operator": "Exists"}))];
        probe.privileged = false;
        let spec = spec_with(Gates {
            probe: Some(probe),
            ..Default::default()
        });
        assert_eq!(refusals(&spec, &AdminLimits::default(), &all), []);
    }

    #[test]
    fn toleration_coverage() {
        let tol = |v: serde_json::Value| -> Toleration { serde_json::from_value(v).unwrap() };
        let exists_gpu = tol(json!({"key": "gpu", "operator": "Exists"}));
        let equal_gpu = tol(json!({"key": "gpu", "operator": "Equal", "value": "a"}));
        assert!(covers(&exists_gpu, &equal_gpu));
        assert!(!covers(&equal_gpu, &exists_gpu));
        assert!(covers(&equal_gpu, &equal_gpu));
        let bounded = tol(json!({"key": "gpu", "operator": "Exists", "tolerationSeconds": 30}));
        assert!(!covers(&bounded, &exists_gpu));
        assert!(covers(&exists_gpu, &bounded));
        let no_schedule = tol(json!({"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}));
        assert!(!covers(&no_schedule, &exists_gpu));
        assert!(covers(&exists_gpu, &no_schedule));
    }

    #[test]
    fn a_log_pattern_the_operator_cannot_compile_is_refused_by_name() {
        let spec = spec_with(Gates {
            logs: Some(LogsGate {
                // `\Q...\E` is RE2 (the API server's dialect), not the operator's.
                patterns: vec!["fatal".into(), r"\Qa.b\E".into()],
                ..Default::default()
            }),
            ..Default::default()
        });
        let r = refusals(&spec, &AdminLimits::default(), &[]);
        assert_eq!(fields(&r), ["spec.gates.logs.patterns[1]"]);
        assert!(r[0].message.contains("does not compile"), "{}", r[0]);
    }

    #[test]
    fn the_selector_strategy_runs_only_where_the_installation_enables_it() {
        let mut spec = spec_with(Gates::default());
        assert_eq!(refusals(&spec, &AdminLimits::default(), &[]), []);
        spec.strategy = saferollout_api::Strategy::Selector;
        let r = refusals(&spec, &AdminLimits::default(), &[]);
        assert_eq!(fields(&r), ["spec.strategy"]);
        assert!(r[0].message.contains("--selector-strategy"), "{}", r[0]);
        let enabled = AdminLimits {
            selector_strategy: true,
            ..AdminLimits::default()
        };
        assert_eq!(refusals(&spec, &enabled, &[]), []);
    }
}
