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
//! - [`lint_daemonset`], [`lint_safe_rollout`], [`lint_pod_template`]: typed objects.
//! - [`rules`] and [`psa`]: the individual rules, one function each.
//! - [`codes`]: every finding code with a one-line summary.
//!
//! Findings never contain the value of an environment variable: a literal
//! secret is reported by the variable's name only, since findings end up in
//! status, events and CI logs.

pub mod codes;
pub mod documents;
pub mod kind;
pub mod psa;
pub mod rules;
pub mod safe_rollout;

use std::fmt;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::PodTemplateSpec;
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
        }
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

/// Every DaemonSet rule: the pod-template rules plus the update strategy.
///
/// `kind` is what the caller knows; [`Kind::Unknown`] means "find out" with
/// [`detect_kind`]. `psa` is the Pod Security Admission level enforced in the
/// DaemonSet's namespace, when known.
pub fn lint_daemonset(ds: &DaemonSet, kind: Kind, psa: Option<PsaLevel>) -> Vec<Finding> {
    let kind = match kind {
        Kind::Unknown => detect_kind(ds),
        known => known,
    };
    let object = daemonset_object(ds);
    let mut findings = lint_pod_template(&object, &ds.spec.template, kind, psa);
    findings.extend(rules::update_strategy(
        &object,
        ds.spec.update_strategy.as_ref(),
        kind,
    ));
    findings
}

/// The rules that look only at a pod template (everything but the update
/// strategy): used for a DaemonSet's template and a SafeRollout's
/// `spec.template`. `kind` must already be resolved (see [`detect_kind`]).
pub fn lint_pod_template(
    object: &str,
    template: &PodTemplateSpec,
    kind: Kind,
    psa: Option<PsaLevel>,
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
    if let Some(level) = psa {
        findings.extend(psa::pod_security(object, template, level));
    }
    findings
}

#[cfg(test)]
mod tests;
