//! Every finding code. Codes are stable: tools, suppressions and the corpus's
//! `# expect:` lines refer to them, so a code is never reused for another check.
//!
//! - `SR0xx`: the SafeRollout manifest itself.
//! - `SR1xx`: the DaemonSet / pod template (secrets, kubelet mounts, update
//!   strategy, resources, scheduling).
//! - `SR2xx`: Pod Security Admission of the namespace against the pod.
//! - `SR3xx`: the document (kinds that are not linted, API versions).

use crate::Severity;

// SafeRollout (SR0xx): one code per group of fields of `SafeRollout::validate()`.

/// `spec.targetRef.name` is not a DNS-1123 subdomain.
pub const TARGET_NAME: &str = "SR001";
/// `spec.stages` is empty or has too many stages.
pub const STAGES: &str = "SR002";
/// `spec.stages[].nodes` is not a count >= 1 or a percentage 1%..100%.
pub const STAGE_NODES: &str = "SR003";
/// A duration (`soak`, `progressDeadline`, `podsReady.timeout`) is malformed or zero.
pub const DURATION: &str = "SR004";
/// `spec.maxUnavailable` is not a count >= 1 or a percentage 1%..100%.
pub const MAX_UNAVAILABLE: &str = "SR005";
/// `spec.gates.allocatable`: too many, duplicate, or not an extended resource name.
pub const ALLOCATABLE_RESOURCE: &str = "SR006";
/// `spec.gates.allocatable[].min/max`: not a valid bound, or min above max.
pub const ALLOCATABLE_BOUNDS: &str = "SR007";
/// Any other field error reported by `SafeRollout::validate()`.
pub const INVALID_FIELD: &str = "SR009";
/// `spec.template` is not a PodTemplateSpec.
pub const TEMPLATE: &str = "SR010";
/// A SafeRollout `apiVersion` the operator does not serve.
pub const SAFEROLLOUT_API_VERSION: &str = "SR011";

// DaemonSet / pod template (SR1xx).

/// An env var named like a secret (`*KEY`, `*TOKEN`, `*PASSWORD`, `*SECRET`, `*LICENSE*`) has a literal value.
pub const LITERAL_SECRET: &str = "SR101";
/// A device plugin does not mount the hostPath `/var/lib/kubelet/device-plugins`.
pub const DEVICE_PLUGIN_SOCKET_DIR: &str = "SR102";
/// A DRA driver does not mount `/var/lib/kubelet/plugins_registry` and `/var/lib/kubelet/plugins`.
pub const DRA_REGISTRATION_DIRS: &str = "SR103";
/// `maxUnavailable` of 100% (or a huge count) replaces every plugin at once.
pub const MAX_UNAVAILABLE_ALL: &str = "SR104";
/// `maxSurge` on a device plugin: two plugins register the same resource on a node.
pub const DEVICE_PLUGIN_SURGE: &str = "SR105";
/// `maxSurge` on a DRA driver: a seamless upgrade (Kubernetes >= 1.33 and driver support).
pub const DRA_SURGE: &str = "SR106";
/// A container without resource requests or limits.
pub const RESOURCES: &str = "SR107";
/// No `priorityClassName`: the agent can be preempted or not scheduled on a full node.
pub const PRIORITY_CLASS: &str = "SR108";
/// No tolerations: nodes with taints get no plugin.
pub const NO_TOLERATIONS: &str = "SR109";
/// A gated agent's image is mutable: no tag, a moving tag (`latest`, `devel`,
/// ...), or `imagePullPolicy: Always` without a digest.
pub const MUTABLE_IMAGE: &str = "SR110";
/// A device plugin set to keep running after failing to initialise
/// (`FAIL_ON_INIT_ERROR=false`) with no gate that counts its devices.
pub const FAIL_ON_INIT_ERROR: &str = "SR111";

// Pod Security Admission (SR2xx), when the namespace's level is known.

/// Privileged container under `baseline`/`restricted`.
pub const PSA_PRIVILEGED: &str = "SR201";
/// hostPath volumes under `baseline`/`restricted`.
pub const PSA_HOST_PATH: &str = "SR202";
/// hostNetwork / hostPID / hostIPC under `baseline`/`restricted`.
pub const PSA_HOST_NAMESPACES: &str = "SR203";
/// Capabilities added beyond the baseline set.
pub const PSA_CAPABILITIES_BASELINE: &str = "SR204";
/// hostPort under `baseline`/`restricted`.
pub const PSA_HOST_PORTS: &str = "SR205";
/// Other baseline checks: SELinux, seccomp Unconfined, AppArmor unconfined, procMount, sysctls, Windows hostProcess.
pub const PSA_BASELINE_OTHER: &str = "SR206";
/// `restricted`: runAsNonRoot not true, or runAsUser 0.
pub const PSA_RUN_AS_NON_ROOT: &str = "SR211";
/// `restricted`: allowPrivilegeEscalation not false.
pub const PSA_PRIVILEGE_ESCALATION: &str = "SR212";
/// `restricted`: capabilities not dropping ALL, or adding more than NET_BIND_SERVICE.
pub const PSA_CAPABILITIES_RESTRICTED: &str = "SR213";
/// `restricted`: no seccompProfile RuntimeDefault/Localhost.
pub const PSA_SECCOMP: &str = "SR214";
/// `restricted`: a volume type outside the restricted allow-list (hostPath is SR202).
pub const PSA_VOLUME_TYPES: &str = "SR215";

// Documents (SR3xx).

/// A document of a kind this linter does not check.
pub const SKIPPED: &str = "SR301";
/// A DaemonSet whose `apiVersion` is not `apps/v1` (no longer served).
pub const DAEMONSET_API_VERSION: &str = "SR302";
/// Cluster checks (operator preflight only): the DaemonSet is not healthy
/// (DESIRED == CURRENT == READY == AVAILABLE fails) before the rollout.
pub const DAEMONSET_UNHEALTHY: &str = "SR401";
/// A node carries the gated device but runs no agent pod (untolerated taints, selector).
pub const NODE_UNCOVERED: &str = "SR402";

/// One code with the severity it is reported at and a one-line summary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CodeInfo {
    pub code: &'static str,
    pub severity: Severity,
    pub summary: &'static str,
}

const fn info(code: &'static str, severity: Severity, summary: &'static str) -> CodeInfo {
    CodeInfo {
        code,
        severity,
        summary,
    }
}

/// Every code, in order (for `lint --explain`, docs and tests).
pub const ALL: &[CodeInfo] = &[
    info(
        TARGET_NAME,
        Severity::Error,
        "spec.targetRef.name is not a valid DaemonSet name",
    ),
    info(
        STAGES,
        Severity::Error,
        "spec.stages is empty or has more than 10 stages",
    ),
    info(
        STAGE_NODES,
        Severity::Error,
        "spec.stages[].nodes is not a count >= 1 or a percentage 1%..100%",
    ),
    info(
        DURATION,
        Severity::Error,
        "a duration (soak, progressDeadline, podsReady.timeout) is malformed or zero",
    ),
    info(
        MAX_UNAVAILABLE,
        Severity::Error,
        "spec.maxUnavailable is not a count >= 1 or a percentage 1%..100%",
    ),
    info(
        ALLOCATABLE_RESOURCE,
        Severity::Error,
        "spec.gates.allocatable: too many, duplicate, or not an extended resource",
    ),
    info(
        ALLOCATABLE_BOUNDS,
        Severity::Error,
        "spec.gates.allocatable[].min/max is not a valid bound, or min > max",
    ),
    info(
        INVALID_FIELD,
        Severity::Error,
        "another field of the SafeRollout is invalid",
    ),
    info(
        TEMPLATE,
        Severity::Error,
        "spec.template is not a PodTemplateSpec",
    ),
    info(
        SAFEROLLOUT_API_VERSION,
        Severity::Error,
        "SafeRollout apiVersion is not saferollout.dev/v1alpha1",
    ),
    info(
        LITERAL_SECRET,
        Severity::Error,
        "a secret-like env var has a literal value instead of secretKeyRef",
    ),
    info(
        DEVICE_PLUGIN_SOCKET_DIR,
        Severity::Error,
        "device plugin without the /var/lib/kubelet/device-plugins hostPath mount",
    ),
    info(
        DRA_REGISTRATION_DIRS,
        Severity::Error,
        "DRA driver without the plugins_registry and plugins hostPath mounts",
    ),
    info(
        MAX_UNAVAILABLE_ALL,
        Severity::Error,
        "maxUnavailable 100% replaces every plugin at once",
    ),
    info(
        DEVICE_PLUGIN_SURGE,
        Severity::Error,
        "maxSurge on a device plugin: two plugins register one resource on a node",
    ),
    info(
        DRA_SURGE,
        Severity::Info,
        "maxSurge on a DRA driver: seamless upgrade, needs Kubernetes >= 1.33",
    ),
    info(
        RESOURCES,
        Severity::Warning,
        "a container has no resource requests or no limits",
    ),
    info(
        PRIORITY_CLASS,
        Severity::Warning,
        "no priorityClassName (use system-node-critical)",
    ),
    info(
        NO_TOLERATIONS,
        Severity::Info,
        "no tolerations: tainted nodes get no plugin",
    ),
    info(
        MUTABLE_IMAGE,
        Severity::Error,
        "a gated agent's image has no digest and a moving tag (or none, or pull policy Always)",
    ),
    info(
        FAIL_ON_INIT_ERROR,
        Severity::Warning,
        "FAIL_ON_INIT_ERROR=false on a device plugin without an allocatable gate",
    ),
    info(
        PSA_PRIVILEGED,
        Severity::Error,
        "privileged container in a baseline/restricted namespace",
    ),
    info(
        PSA_HOST_PATH,
        Severity::Error,
        "hostPath volume in a baseline/restricted namespace",
    ),
    info(
        PSA_HOST_NAMESPACES,
        Severity::Error,
        "hostNetwork/hostPID/hostIPC in a baseline/restricted namespace",
    ),
    info(
        PSA_CAPABILITIES_BASELINE,
        Severity::Error,
        "capabilities added beyond the baseline set",
    ),
    info(
        PSA_HOST_PORTS,
        Severity::Error,
        "hostPort in a baseline/restricted namespace",
    ),
    info(
        PSA_BASELINE_OTHER,
        Severity::Error,
        "SELinux, seccomp, AppArmor, procMount, sysctl or hostProcess setting forbidden by baseline",
    ),
    info(
        PSA_RUN_AS_NON_ROOT,
        Severity::Error,
        "restricted: runAsNonRoot is not true or runAsUser is 0",
    ),
    info(
        PSA_PRIVILEGE_ESCALATION,
        Severity::Error,
        "restricted: allowPrivilegeEscalation is not false",
    ),
    info(
        PSA_CAPABILITIES_RESTRICTED,
        Severity::Error,
        "restricted: capabilities do not drop ALL or add more than NET_BIND_SERVICE",
    ),
    info(
        PSA_SECCOMP,
        Severity::Error,
        "restricted: no seccompProfile RuntimeDefault or Localhost",
    ),
    info(
        PSA_VOLUME_TYPES,
        Severity::Error,
        "restricted: a volume type outside the restricted allow-list",
    ),
    info(
        SKIPPED,
        Severity::Info,
        "a document of a kind that is not linted",
    ),
    info(
        DAEMONSET_API_VERSION,
        Severity::Error,
        "DaemonSet apiVersion is not apps/v1",
    ),
    info(
        DAEMONSET_UNHEALTHY,
        Severity::Error,
        "the DaemonSet is not healthy before the rollout",
    ),
    info(
        NODE_UNCOVERED,
        Severity::Warning,
        "a node with the device runs no agent pod",
    ),
];

/// The entry of `code` in [`ALL`].
pub fn lookup(code: &str) -> Option<&'static CodeInfo> {
    ALL.iter().find(|c| c.code == code)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_unique_and_well_formed() {
        let mut seen = std::collections::BTreeSet::new();
        for c in ALL {
            assert!(seen.insert(c.code), "duplicate {}", c.code);
            assert!(
                c.code.len() == 5
                    && c.code.starts_with("SR")
                    && c.code[2..].bytes().all(|b| b.is_ascii_digit()),
                "{}",
                c.code
            );
            assert!(!c.summary.contains('\n'));
        }
        assert_eq!(lookup("SR101").unwrap().severity, Severity::Error);
        assert!(lookup("SR999").is_none());
    }
}
