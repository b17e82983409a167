//! Pod Security Admission (`SR2xx`): would the namespace's enforced level
//! admit the agent's pods? A DaemonSet is admitted whatever its template says,
//! but every pod it creates is rejected, so a violation means the plugin never
//! starts on any node.
//!
//! Follows the checks of `k8s.io/pod-security-admission` (policy version
//! "latest", Kubernetes 1.33+), with these simplifications:
//! - Windows pods get no exemptions (device plugins and DRA drivers here are
//!   Linux agents), and `hostProcess` is only checked at baseline.
//! - The user-namespace relaxation (`hostUsers: false` lifting the restricted
//!   runAsNonRoot / runAsUser checks, behind a feature gate) is not modelled.
//! - At `restricted`, hostPath volumes are reported as SR202 (as at baseline)
//!   and SR215 covers the other forbidden volume types; capabilities are
//!   checked by the restricted rule only (SR213), as PSA does.
//! - The `seccomp.security.alpha.kubernetes.io` annotations (removed in 1.27)
//!   are ignored; the AppArmor annotations are checked.
//! - Exemptions configured in the admission plugin (users, runtime classes,
//!   namespaces) are unknown here.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use k8s_openapi::api::core::v1::{
    Container, PodSecurityContext, PodSpec, PodTemplateSpec, SecurityContext, Volume,
};
use serde::Serialize;

use crate::{Finding, codes};

/// The namespace label that sets the enforced level.
pub const ENFORCE_LABEL: &str = "pod-security.kubernetes.io/enforce";

/// A Pod Security Standards level, as enforced on a namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PsaLevel {
    /// Anything goes.
    Privileged,
    /// No host namespaces, hostPath, privileged containers, extra capabilities...
    Baseline,
    /// Baseline plus non-root, no privilege escalation, drop ALL, seccomp.
    Restricted,
}

impl PsaLevel {
    /// The enforced level from a namespace's labels (`None` when the label is
    /// absent or not a level, in which case the cluster default applies).
    pub fn from_namespace_labels(labels: &BTreeMap<String, String>) -> Option<Self> {
        labels.get(ENFORCE_LABEL)?.parse().ok()
    }

    /// The level's name as written in the label.
    pub fn as_str(self) -> &'static str {
        match self {
            PsaLevel::Privileged => "privileged",
            PsaLevel::Baseline => "baseline",
            PsaLevel::Restricted => "restricted",
        }
    }
}

impl fmt::Display for PsaLevel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The text is not `privileged`, `baseline` or `restricted`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown Pod Security level {0:?} (expected privileged, baseline or restricted)")]
pub struct UnknownLevel(pub String);

impl FromStr for PsaLevel {
    type Err = UnknownLevel;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim() {
            "privileged" => Ok(PsaLevel::Privileged),
            "baseline" => Ok(PsaLevel::Baseline),
            "restricted" => Ok(PsaLevel::Restricted),
            other => Err(UnknownLevel(other.to_string())),
        }
    }
}

/// Capabilities a baseline pod may add (PSA `capabilities_baseline`).
pub const BASELINE_CAPABILITIES: &[&str] = &[
    "AUDIT_WRITE",
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "MKNOD",
    "NET_BIND_SERVICE",
    "SETFCAP",
    "SETGID",
    "SETPCAP",
    "SETUID",
    "SYS_CHROOT",
];

/// SELinux types a baseline pod may set (empty means the runtime's default).
pub const BASELINE_SELINUX_TYPES: &[&str] = &[
    "",
    "container_t",
    "container_init_t",
    "container_kvm_t",
    "container_engine_t",
];

/// Sysctls a baseline pod may set (the "safe" set).
pub const SAFE_SYSCTLS: &[&str] = &[
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range",
    "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
    "net.ipv4.tcp_rmem",
    "net.ipv4.tcp_wmem",
];

/// Volume types a restricted pod may use (PSA `restrictedVolumes`; `image`
/// since 1.33).
pub const RESTRICTED_VOLUME_TYPES: &[&str] = &[
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "image",
    "persistentVolumeClaim",
    "projected",
    "secret",
];

const APPARMOR_ANNOTATION_PREFIX: &str = "container.apparmor.security.beta.kubernetes.io/";

/// Every PSA check of `level` on the pod template. Empty for `privileged`.
pub fn pod_security(object: &str, template: &PodTemplateSpec, level: PsaLevel) -> Vec<Finding> {
    let mut findings = Vec::new();
    if level == PsaLevel::Privileged {
        return findings;
    }
    let empty = PodSpec::default();
    let pod = template.spec.as_ref().unwrap_or(&empty);
    let annotations = template
        .metadata
        .as_ref()
        .and_then(|m| m.annotations.as_ref());
    let check = Check { object, level };
    findings.extend(check.privileged(pod));
    findings.extend(check.host_path_volumes(pod));
    findings.extend(check.host_namespaces(pod));
    findings.extend(check.host_ports(pod));
    if level == PsaLevel::Baseline {
        findings.extend(check.capabilities_baseline(pod));
    }
    findings.extend(check.baseline_other(pod, annotations));
    if level == PsaLevel::Restricted {
        findings.extend(check.run_as_non_root(pod));
        findings.extend(check.privilege_escalation(pod));
        findings.extend(check.capabilities_restricted(pod));
        findings.extend(check.seccomp_restricted(pod));
        findings.extend(check.restricted_volume_types(pod));
    }
    findings
}

/// The checks, with what every finding needs.
struct Check<'a> {
    object: &'a str,
    level: PsaLevel,
}

/// Regular then init containers (PSA checks both).
fn containers(pod: &PodSpec) -> impl Iterator<Item = &Container> {
    pod.containers
        .iter()
        .chain(pod.init_containers.iter().flatten())
}

fn security(container: &Container) -> Option<&SecurityContext> {
    container.security_context.as_ref()
}

fn quoted(names: &[&str]) -> String {
    names
        .iter()
        .map(|n| format!("{n:?}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// "container \"a\"" or "containers \"a\", \"b\"".
fn containers_phrase(names: &[&str]) -> String {
    let noun = if names.len() == 1 {
        "container"
    } else {
        "containers"
    };
    format!("{noun} {}", quoted(names))
}

/// The fix for what a node agent needs by nature (host access).
const FIX_PRIVILEGED_NAMESPACE: &str = "run the agent in a namespace labelled pod-security.kubernetes.io/enforce=privileged (node agents need host access)";

impl Check<'_> {
    fn error(&self, code: &'static str, what: String, fix: impl Into<String>) -> Finding {
        Finding::error(
            code,
            self.object,
            format!(
                "{what}, which Pod Security \"{}\" forbids: the API server rejects every pod of it, so the agent will never start",
                self.level
            ),
            fix,
        )
    }

    /// SR201: `securityContext.privileged: true`.
    fn privileged(&self, pod: &PodSpec) -> Option<Finding> {
        let names: Vec<&str> = containers(pod)
            .filter(|c| security(c).and_then(|s| s.privileged) == Some(true))
            .map(|c| c.name.as_str())
            .collect();
        (!names.is_empty()).then(|| {
            self.error(
                codes::PSA_PRIVILEGED,
                format!("{} privileged", verb_phrase(&names, "is", "are")),
                FIX_PRIVILEGED_NAMESPACE,
            )
        })
    }

    /// SR202: any hostPath volume (device plugins need one, so this fires for
    /// every device plugin outside a privileged namespace).
    fn host_path_volumes(&self, pod: &PodSpec) -> Option<Finding> {
        let volumes: Vec<String> = pod
            .volumes
            .iter()
            .flatten()
            .filter_map(|v| {
                v.host_path
                    .as_ref()
                    .map(|h| format!("{:?} ({})", v.name, h.path))
            })
            .collect();
        (!volumes.is_empty()).then(|| {
            self.error(
                codes::PSA_HOST_PATH,
                format!("the pod uses hostPath volumes {}", volumes.join(", ")),
                FIX_PRIVILEGED_NAMESPACE,
            )
        })
    }

    /// SR203: hostNetwork, hostPID, hostIPC.
    fn host_namespaces(&self, pod: &PodSpec) -> Option<Finding> {
        let used: Vec<&str> = [
            ("hostNetwork", pod.host_network),
            ("hostPID", pod.host_pid),
            ("hostIPC", pod.host_ipc),
        ]
        .into_iter()
        .filter(|(_, on)| *on == Some(true))
        .map(|(name, _)| name)
        .collect();
        (!used.is_empty()).then(|| {
            self.error(
                codes::PSA_HOST_NAMESPACES,
                format!("the pod sets {}", used.join(", ")),
                "drop the host namespaces the agent does not need, or run it in a privileged namespace",
            )
        })
    }

    /// SR205: any non-zero hostPort.
    fn host_ports(&self, pod: &PodSpec) -> Option<Finding> {
        let ports: Vec<String> = containers(pod)
            .flat_map(|c| {
                c.ports
                    .iter()
                    .flatten()
                    .filter_map(|p| p.host_port.filter(|h| *h != 0))
                    .map(move |h| format!("{:?}:{h}", c.name))
            })
            .collect();
        (!ports.is_empty()).then(|| {
            self.error(
                codes::PSA_HOST_PORTS,
                format!("the pod uses hostPorts {}", ports.join(", ")),
                "remove hostPort (expose metrics through a Service), or run the agent in a privileged namespace",
            )
        })
    }

    /// SR204: added capabilities outside [`BASELINE_CAPABILITIES`].
    fn capabilities_baseline(&self, pod: &PodSpec) -> Vec<Finding> {
        containers(pod)
            .filter_map(|c| {
                let added = added_capabilities(c);
                let extra: Vec<&str> = added
                    .iter()
                    .copied()
                    .filter(|cap| !BASELINE_CAPABILITIES.contains(cap))
                    .collect();
                (!extra.is_empty()).then(|| {
                    self.error(
                        codes::PSA_CAPABILITIES_BASELINE,
                        format!(
                            "container {:?} adds capabilities {}",
                            c.name,
                            extra.join(", ")
                        ),
                        "remove the added capabilities, or run the agent in a privileged namespace",
                    )
                })
            })
            .collect()
    }

    /// SR206: the remaining baseline checks, one finding per problem.
    fn baseline_other(
        &self,
        pod: &PodSpec,
        annotations: Option<&BTreeMap<String, String>>,
    ) -> Vec<Finding> {
        let mut problems = Vec::new();
        let pod_sc = pod.security_context.as_ref();
        let mut contexts: Vec<(String, Context<'_>)> = Vec::new();
        if let Some(sc) = pod_sc {
            contexts.push(("the pod".to_string(), Context::Pod(sc)));
        }
        for c in containers(pod) {
            if let Some(sc) = security(c) {
                contexts.push((format!("container {:?}", c.name), Context::Container(sc)));
            }
        }
        for (who, sc) in &contexts {
            if let Some(se) = sc.se_linux() {
                let type_ = se.type_.as_deref().unwrap_or_default();
                if !BASELINE_SELINUX_TYPES.contains(&type_) {
                    problems.push(format!("{who} sets SELinux type {type_:?}"));
                }
                if se.user.as_deref().is_some_and(|u| !u.is_empty()) {
                    problems.push(format!("{who} sets an SELinux user"));
                }
                if se.role.as_deref().is_some_and(|r| !r.is_empty()) {
                    problems.push(format!("{who} sets an SELinux role"));
                }
            }
            if sc.seccomp_type() == Some("Unconfined") {
                problems.push(format!("{who} sets seccompProfile Unconfined"));
            }
            if sc.app_armor_type() == Some("Unconfined") {
                problems.push(format!("{who} sets appArmorProfile Unconfined"));
            }
            if sc.host_process() == Some(true) {
                problems.push(format!("{who} sets windowsOptions.hostProcess"));
            }
            if let Context::Container(c) = sc
                && let Some(mount) = c.proc_mount.as_deref().filter(|m| *m != "Default")
            {
                problems.push(format!("{who} sets procMount {mount:?}"));
            }
        }
        for sysctl in pod_sc
            .and_then(|s| s.sysctls.as_ref())
            .into_iter()
            .flatten()
        {
            if !SAFE_SYSCTLS.contains(&sysctl.name.as_str()) {
                problems.push(format!("the pod sets the unsafe sysctl {:?}", sysctl.name));
            }
        }
        for (key, value) in annotations.into_iter().flatten() {
            if let Some(container) = key.strip_prefix(APPARMOR_ANNOTATION_PREFIX)
                && !(value.is_empty()
                    || value == "runtime/default"
                    || value.starts_with("localhost/"))
            {
                problems.push(format!(
                    "the AppArmor annotation of container {container:?} is {value:?}"
                ));
            }
        }
        problems
            .into_iter()
            .map(|p| {
                self.error(
                    codes::PSA_BASELINE_OTHER,
                    p,
                    "remove the setting, or run the agent in a privileged namespace",
                )
            })
            .collect()
    }

    /// SR211: runAsNonRoot must be true for every container (its own or the
    /// pod's), never false, and runAsUser never 0.
    fn run_as_non_root(&self, pod: &PodSpec) -> Vec<Finding> {
        let pod_sc = pod.security_context.as_ref();
        let pod_non_root = pod_sc.and_then(|s| s.run_as_non_root);
        let mut findings = Vec::new();
        let mut unset = Vec::new();
        let mut explicit_false = Vec::new();
        let mut root_user = Vec::new();
        if pod_non_root == Some(false) {
            explicit_false.push("the pod".to_string());
        }
        if pod_sc.and_then(|s| s.run_as_user) == Some(0) {
            root_user.push("the pod".to_string());
        }
        for c in containers(pod) {
            let sc = security(c);
            match sc.and_then(|s| s.run_as_non_root) {
                Some(false) => explicit_false.push(format!("container {:?}", c.name)),
                None if pod_non_root != Some(true) => unset.push(c.name.as_str()),
                _ => {}
            }
            if sc.and_then(|s| s.run_as_user) == Some(0) {
                root_user.push(format!("container {:?}", c.name));
            }
        }
        let fix = "set securityContext.runAsNonRoot: true and a non-zero runAsUser (on the pod or every container)";
        if !unset.is_empty() {
            findings.push(self.error(
                codes::PSA_RUN_AS_NON_ROOT,
                format!(
                    "{} and the pod do not set securityContext.runAsNonRoot: true",
                    containers_phrase(&unset)
                ),
                fix,
            ));
        }
        if !explicit_false.is_empty() {
            findings.push(self.error(
                codes::PSA_RUN_AS_NON_ROOT,
                format!("{} set runAsNonRoot: false", explicit_false.join(", ")),
                fix,
            ));
        }
        if !root_user.is_empty() {
            findings.push(self.error(
                codes::PSA_RUN_AS_NON_ROOT,
                format!("{} set runAsUser: 0", root_user.join(", ")),
                fix,
            ));
        }
        findings
    }

    /// SR212: allowPrivilegeEscalation must be explicitly false.
    fn privilege_escalation(&self, pod: &PodSpec) -> Option<Finding> {
        let names: Vec<&str> = containers(pod)
            .filter(|c| security(c).and_then(|s| s.allow_privilege_escalation) != Some(false))
            .map(|c| c.name.as_str())
            .collect();
        (!names.is_empty()).then(|| {
            self.error(
                codes::PSA_PRIVILEGE_ESCALATION,
                format!(
                    "{} not set securityContext.allowPrivilegeEscalation: false",
                    verb_phrase(&names, "does", "do")
                ),
                "set securityContext.allowPrivilegeEscalation: false on every container",
            )
        })
    }

    /// SR213: capabilities must drop ALL and add nothing but NET_BIND_SERVICE.
    fn capabilities_restricted(&self, pod: &PodSpec) -> Vec<Finding> {
        let mut findings = Vec::new();
        let not_dropping: Vec<&str> = containers(pod)
            .filter(|c| {
                !security(c)
                    .and_then(|s| s.capabilities.as_ref())
                    .and_then(|caps| caps.drop.as_ref())
                    .is_some_and(|d| d.iter().any(|cap| cap == "ALL"))
            })
            .map(|c| c.name.as_str())
            .collect();
        if !not_dropping.is_empty() {
            findings.push(self.error(
                codes::PSA_CAPABILITIES_RESTRICTED,
                format!(
                    "{} not drop ALL capabilities",
                    verb_phrase(&not_dropping, "does", "do")
                ),
                "set securityContext.capabilities.drop: [\"ALL\"] on every container",
            ));
        }
        for c in containers(pod) {
            let extra: Vec<&str> = added_capabilities(c)
                .into_iter()
                .filter(|cap| *cap != "NET_BIND_SERVICE")
                .collect();
            if !extra.is_empty() {
                findings.push(self.error(
                    codes::PSA_CAPABILITIES_RESTRICTED,
                    format!("container {:?} adds capabilities {}", c.name, extra.join(", ")),
                    "add no capability but NET_BIND_SERVICE, or run the agent in a less restricted namespace",
                ));
            }
        }
        findings
    }

    /// SR214: seccompProfile RuntimeDefault or Localhost, on the pod or on
    /// every container. (Unconfined anywhere is already SR206.)
    fn seccomp_restricted(&self, pod: &PodSpec) -> Option<Finding> {
        let allowed = |t: Option<&str>| matches!(t, Some("RuntimeDefault" | "Localhost"));
        let pod_type = pod
            .security_context
            .as_ref()
            .and_then(|s| s.seccomp_profile.as_ref())
            .map(|p| p.type_.as_str());
        if allowed(pod_type) {
            return None;
        }
        let names: Vec<&str> = containers(pod)
            .filter(|c| {
                let own = security(c)
                    .and_then(|s| s.seccomp_profile.as_ref())
                    .map(|p| p.type_.as_str());
                own.is_none() || (!allowed(own) && own != Some("Unconfined"))
            })
            .map(|c| c.name.as_str())
            .collect();
        (!names.is_empty()).then(|| {
            self.error(
                codes::PSA_SECCOMP,
                format!(
                    "neither the pod nor {} set securityContext.seccompProfile to RuntimeDefault or Localhost",
                    containers_phrase(&names)
                ),
                "set spec.securityContext.seccompProfile.type: RuntimeDefault on the pod",
            )
        })
    }

    /// SR215: volume types outside [`RESTRICTED_VOLUME_TYPES`] (hostPath is SR202).
    fn restricted_volume_types(&self, pod: &PodSpec) -> Option<Finding> {
        let bad: Vec<String> = pod
            .volumes
            .iter()
            .flatten()
            .filter(|v| v.host_path.is_none())
            .filter_map(|v| {
                let type_ = volume_type(v);
                (!RESTRICTED_VOLUME_TYPES.contains(&type_.as_str()))
                    .then(|| format!("{:?} ({type_})", v.name))
            })
            .collect();
        (!bad.is_empty()).then(|| {
            self.error(
                codes::PSA_VOLUME_TYPES,
                format!("the pod uses volumes {}", bad.join(", ")),
                format!("use only {} volumes", RESTRICTED_VOLUME_TYPES.join(", ")),
            )
        })
    }
}

/// "container \"a\" is" / "containers \"a\", \"b\" are".
fn verb_phrase(names: &[&str], one: &str, many: &str) -> String {
    let verb = if names.len() == 1 { one } else { many };
    format!("{} {verb}", containers_phrase(names))
}

fn added_capabilities(c: &Container) -> Vec<&str> {
    security(c)
        .and_then(|s| s.capabilities.as_ref())
        .and_then(|caps| caps.add.as_ref())
        .map(|add| add.iter().map(String::as_str).collect())
        .unwrap_or_default()
}

/// The volume's type: its one field besides `name` (`"unknown"` when none).
fn volume_type(volume: &Volume) -> String {
    serde_json::to_value(volume)
        .ok()
        .and_then(|v| {
            v.as_object()?
                .keys()
                .find(|k| k.as_str() != "name")
                .cloned()
        })
        .unwrap_or_else(|| "unknown".to_string())
}

/// A pod- or container-level security context, for the checks both share.
enum Context<'a> {
    Pod(&'a PodSecurityContext),
    Container(&'a SecurityContext),
}

impl Context<'_> {
    fn se_linux(&self) -> Option<&k8s_openapi::api::core::v1::SELinuxOptions> {
        match self {
            Context::Pod(s) => s.se_linux_options.as_ref(),
            Context::Container(s) => s.se_linux_options.as_ref(),
        }
    }
    fn seccomp_type(&self) -> Option<&str> {
        match self {
            Context::Pod(s) => s.seccomp_profile.as_ref(),
            Context::Container(s) => s.seccomp_profile.as_ref(),
        }
        .map(|p| p.type_.as_str())
    }
    fn app_armor_type(&self) -> Option<&str> {
        match self {
            Context::Pod(s) => s.app_armor_profile.as_ref(),
            Context::Container(s) => s.app_armor_profile.as_ref(),
        }
        .map(|p| p.type_.as_str())
    }
    fn host_process(&self) -> Option<bool> {
        match self {
            Context::Pod(s) => s.windows_options.as_ref(),
            Context::Container(s) => s.windows_options.as_ref(),
        }
        .and_then(|w| w.host_process)
    }
}

#[cfg(test)]
mod tests;
