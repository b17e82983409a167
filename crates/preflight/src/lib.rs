//! Offline preflight checks ("lint") for device-plugin and DRA-driver
//! DaemonSets and for SafeRollout manifests: the guides' checklists that need
//! no cluster. Shared by the operator (findings go to status before the first
//! stage) and by `kubectl saferollout lint`. This crate makes no API calls; the
//! checks that need a cluster (server version, nodes without a plugin pod, the
//! namespace's Pod Security label) belong to the caller, which passes what it
//! learnt in (a [`Kind`], a [`PsaLevel`]).
//!
//! Entry points:
//! - [`lint_documents`]: multi-document YAML in, findings per object out.
//! - [`lint_daemonset`], [`lint_safe_rollout`], [`lint_pod_template`],
//!   [`lint_agent_template`]: typed objects.
//! - [`rules`], [`images`], [`init_errors`] and [`psa`]: the individual rules,
//!   one function each.
//! - [`codes`]: every finding code with a one-line summary.
//!
//! Findings never contain the value of an environment variable: a literal
//! secret is reported by the variable's name only, since findings end up in
//! status, events and CI logs.

pub mod codes;
pub mod documents;
pub mod images;
pub mod init_errors;
pub mod kind;
mod locate;
pub mod psa;
pub mod rules;
pub mod safe_rollout;

use std::fmt;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::PodTemplateSpec;
use saferollout_api::SafeRolloutSpec;
use serde::Serialize;

pub use documents::{DocRef, LintError, LintErrorKind, lint_documents};
pub use kind::{Kind, detect_kind, detect_template_kind};
pub use psa::PsaLevel;
pub use safe_rollout::lint_safe_rollout;

/// How bad a finding is. Ordered: `Info < Warning < Error`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum Severity {
    /// Worth knowing; nothing is wrong.
    Info,
    /// Likely to hurt some day; the rollout can proceed.
    Warning,
    /// The plugin will not work, or a secret leaks; a policy may block the rollout on it.
    Error,
}

impl fmt::Display for Severity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Severity::Info => "Info",
            Severity::Warning => "Warning",
            Severity::Error => "Error",
        })
    }
}

/// One result of a check.
///
/// Serialises as `{"severity": "Error", "code": "SR101", "object": ...,
/// "message": ..., "fix": ...}`. `code` is one of the [`codes`] constants, so
/// it is `&'static str` and the type is serialise-only.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Finding {
    pub severity: Severity,
    /// Stable code, e.g. `SR101`; see [`codes`].
    pub code: &'static str,
    /// The object the finding is about, e.g. `DaemonSet gpu/nvidia-device-plugin`.
    pub object: String,
    /// What is wrong, on one line.
    pub message: String,
    /// How to fix it, on one line.
    pub fix: String,
    /// The field the finding is about, as a path from the object's root
    /// (`spec.template.spec.containers[0].image`), when the rule names one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
    /// The 1-based line of [`Finding::field`] in the linted input, when
    /// [`lint_documents`] found it there (not for typed objects, which carry
    /// no positions).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub line: Option<usize>,
}

impl Finding {
    /// A finding; `message` and `fix` are flattened to one line (they may
    /// quote names taken from the manifest).
    pub fn new(
        severity: Severity,
        code: &'static str,
        object: impl Into<String>,
        message: impl Into<String>,
        fix: impl Into<String>,
    ) -> Self {
        Self {
            severity,
            code,
            object: one_line(object.into()),
            message: one_line(message.into()),
            fix: one_line(fix.into()),
            field: None,
            line: None,
        }
    }

    /// The same finding about the field at `path` (see [`Finding::field`]).
    pub fn at(mut self, path: impl Into<String>) -> Self {
        self.field = Some(path.into());
        self
    }

    /// An [`Severity::Error`] finding.
    pub fn error(
        code: &'static str,
        object: impl Into<String>,
        message: impl Into<String>,
        fix: impl Into<String>,
    ) -> Self {
        Self::new(Severity::Error, code, object, message, fix)
    }

    /// A [`Severity::Warning`] finding.
    pub fn warning(
        code: &'static str,
        object: impl Into<String>,
        message: impl Into<String>,
        fix: impl Into<String>,
    ) -> Self {
        Self::new(Severity::Warning, code, object, message, fix)
    }

    /// An [`Severity::Info`] finding.
    pub fn info(
        code: &'static str,
        object: impl Into<String>,
        message: impl Into<String>,
        fix: impl Into<String>,
    ) -> Self {
        Self::new(Severity::Info, code, object, message, fix)
    }

    /// Whether this finding is an error.
    pub fn is_error(&self) -> bool {
        self.severity == Severity::Error
    }
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {} {}: {} (fix: {})",
            self.severity, self.code, self.object, self.message, self.fix
        )
    }
}

/// Replaces line breaks and other control characters by spaces: findings are
/// printed one per line and may quote text from an untrusted manifest.
fn one_line(s: String) -> String {
    if s.chars().any(char::is_control) {
        s.chars()
            .map(|c| if c.is_control() { ' ' } else { c })
            .collect()
    } else {
        s
    }
}

/// `DaemonSet ns/name` (or `DaemonSet name` without a namespace): the
/// [`Finding::object`] of a DaemonSet.
pub fn daemonset_object(ds: &DaemonSet) -> String {
    object_ref(
        "DaemonSet",
        ds.metadata.namespace.as_deref(),
        ds.metadata.name.as_deref(),
    )
}

/// `Kind ns/name`, `Kind name` or `Kind <unnamed>`.
pub(crate) fn object_ref(kind: &str, namespace: Option<&str>, name: Option<&str>) -> String {
    let name = name.filter(|n| !n.is_empty()).unwrap_or("<unnamed>");
    match namespace.filter(|n| !n.is_empty()) {
        Some(ns) => format!("{kind} {ns}/{name}"),
        None => format!("{kind} {name}"),
    }
}

/// Where the pod spec sits in every object linted here: a DaemonSet's
/// template and a SafeRollout's are both `spec.template` (a rule's
/// [`Finding::field`] starts with it).
pub const POD_SPEC_PATH: &str = "spec.template.spec";

/// What the linter knows of the SafeRollout that rolls an agent out: some
/// rules apply only to agents that saferollout gates (SR110), or only when
/// no gate counts the agent's devices (SR111).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gating {
    /// A SafeRollout rolls the agent out: it targets the DaemonSet, or the
    /// template is its `spec.template`.
    pub rolled_out: bool,
    /// Whether that SafeRollout has a gate that fails a node whose agent
    /// runs with no devices ([`init_errors::counts_devices`]); `None` when
    /// the caller does not know its gates. `Some(false)` when nothing rolls
    /// the agent out: then nothing counts its devices either.
    pub counts_devices: Option<bool>,
}

impl Gating {
    /// A DaemonSet linted on its own: no SafeRollout in sight.
    pub const ALONE: Gating = Gating {
        rolled_out: false,
        counts_devices: Some(false),
    };
    /// Rolled out by a SafeRollout whose gates the caller does not pass
    /// (what [`lint_pod_template`] assumes).
    pub const ROLLED_OUT: Gating = Gating {
        rolled_out: true,
        counts_devices: None,
    };

    /// Rolled out by the SafeRollout with this spec.
    pub fn by(spec: &SafeRolloutSpec) -> Self {
        Gating {
            rolled_out: true,
            counts_devices: Some(init_errors::counts_devices(spec)),
        }
    }
}

/// Every DaemonSet rule: the pod-template rules plus the update strategy.
///
/// `kind` is what the caller knows; [`Kind::Unknown`] means "find out" with
/// [`detect_kind`]. `psa` is the Pod Security Admission level enforced in the
/// DaemonSet's namespace, when known. `gating`: whether a SafeRollout rolls
/// the DaemonSet out, and with which gates ([`Gating::ALONE`] when none does).
pub fn lint_daemonset(
    ds: &DaemonSet,
    kind: Kind,
    psa: Option<PsaLevel>,
    gating: Gating,
) -> Vec<Finding> {
    let kind = match kind {
        Kind::Unknown => detect_kind(ds),
        known => known,
    };
    let object = daemonset_object(ds);
    let mut findings = lint_agent_template(&object, &ds.spec.template, kind, psa, gating);
    findings.extend(rules::update_strategy(
        &object,
        ds.spec.update_strategy.as_ref(),
        kind,
    ));
    findings
}

/// The rules that look only at a pod template (everything but the update
/// strategy), for a template that a SafeRollout rolls out and whose gates
/// the caller does not pass ([`Gating::ROLLED_OUT`]): the operator's
/// preflight of its target. SR111 needs the gates and is not run; callers
/// that know them use [`lint_agent_template`]. `kind` must already be
/// resolved (see [`detect_kind`]).
pub fn lint_pod_template(
    object: &str,
    template: &PodTemplateSpec,
    kind: Kind,
    psa: Option<PsaLevel>,
) -> Vec<Finding> {
    lint_agent_template(object, template, kind, psa, Gating::ROLLED_OUT)
}

/// The pod-template rules with what is known of the SafeRollout that rolls
/// the template out (used for a DaemonSet's template and a SafeRollout's
/// `spec.template`). `kind` must already be resolved (see [`detect_kind`]).
pub fn lint_agent_template(
    object: &str,
    template: &PodTemplateSpec,
    kind: Kind,
    psa: Option<PsaLevel>,
    gating: Gating,
) -> Vec<Finding> {
    let empty_pod = Default::default();
    let pod = template.spec.as_ref().unwrap_or(&empty_pod);
    let mut findings = Vec::new();
    findings.extend(rules::literal_secrets(object, pod));
    findings.extend(rules::device_plugin_socket_mount(object, pod, kind));
    findings.extend(rules::dra_registration_mounts(object, pod, kind));
    findings.extend(rules::resources(object, pod));
    findings.extend(rules::priority_class(object, pod));
    findings.extend(rules::tolerations(object, pod));
    findings.extend(images::mutable_images(object, pod, kind, gating));
    findings.extend(init_errors::fail_on_init_error(object, pod, kind, gating));
    if let Some(level) = psa {
        findings.extend(psa::pod_security(object, template, level));
    }
    findings
}

#[cfg(test)]
mod tests;
