//! The DaemonSet / pod-template rules (`SR1xx`), one function each. Every rule
//! takes the finding's `object` string and the part of the manifest it looks
//! at, and returns its findings (empty when fine).

use k8s_openapi::api::apps::v1::DaemonSetUpdateStrategy;
use k8s_openapi::api::core::v1::{Container, PodSpec};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::codes;
use crate::kind::{
    DEVICE_PLUGIN_DIR, Kind, PLUGINS_DIR, PLUGINS_REGISTRY_DIR, container_host_mounts, covers,
    is_plugins_dir, normalise,
};
use crate::{Finding, Severity};

/// A `maxUnavailable` count at least this large is treated as "every node":
/// most accelerator clusters have fewer GPU nodes than this, and nobody who
/// means "a few at a time" writes a three-digit number.
pub const ALL_AT_ONCE_COUNT: i32 = 100;

/// The priority class node agents should use.
pub const NODE_CRITICAL_PRIORITY_CLASS: &str = "system-node-critical";

/// Containers then init containers, each with a label for messages.
fn all_containers(pod: &PodSpec) -> impl Iterator<Item = (&'static str, &Container)> {
    pod.containers.iter().map(|c| ("container", c)).chain(
        pod.init_containers
            .iter()
            .flatten()
            .map(|c| ("init container", c)),
    )
}

/// Whether an env var's name says it holds a secret: it ends in KEY, TOKEN,
/// PASSWORD, PASSWD or SECRET, or contains LICENSE/LICENCE (case-insensitive).
///
/// `*_LABEL_KEY` and `*_ANNOTATION_KEY` are excluded: plugins take node-label
/// keys in variables of that shape (e.g. `RESOURCE_LABEL_KEY=nvidia.com/gpu.count`),
/// and those are never secret.
pub fn is_secret_like_name(name: &str) -> bool {
    let upper = name.to_ascii_uppercase();
    if upper.ends_with("LABEL_KEY") || upper.ends_with("ANNOTATION_KEY") {
        return false;
    }
    ["KEY", "TOKEN", "PASSWORD", "PASSWD", "SECRET"]
        .iter()
        .any(|suffix| upper.ends_with(suffix))
        || upper.contains("LICENSE")
        || upper.contains("LICENCE")
}

/// Whether a literal env value is only a reference to other variables
/// (`$(NGC_API_KEY_FROM_SECRET)`): the kubelet expands it, and the secret
/// itself is not in the manifest.
fn is_variable_reference(value: &str) -> bool {
    let mut rest = value.trim();
    if rest.is_empty() {
        return false;
    }
    while let Some(after) = rest.strip_prefix("$(") {
        let Some(end) = after.find(')') else {
            return false;
        };
        rest = &after[end + 1..];
    }
    rest.is_empty()
}

/// SR101: env vars named like secrets with a literal value. Reports the
/// variable's name and container only; the value never enters a finding.
pub fn literal_secrets(object: &str, pod: &PodSpec) -> Vec<Finding> {
    let mut findings = Vec::new();
    for (what, container) in all_containers(pod) {
        for var in container.env.as_deref().unwrap_or_default() {
            let literal = var
                .value
                .as_deref()
                .is_some_and(|v| !v.trim().is_empty() && !is_variable_reference(v));
            if literal && is_secret_like_name(&var.name) {
                findings.push(Finding::error(
                    codes::LITERAL_SECRET,
                    object,
                    format!(
                        "{what} {:?}: env var {:?} has a literal value: anyone who can read the DaemonSet (kubectl get -o yaml, describe) can read it",
                        container.name, var.name
                    ),
                    format!(
                        "put the value in a Secret and set env {:?} with valueFrom.secretKeyRef instead of value",
                        var.name
                    ),
                ));
            }
        }
    }
    findings
}

/// Names of the hostPath volumes whose (normalised) path `matches`, mounted
/// or not (for "declared but not mounted" messages).
fn host_path_volumes_matching(pod: &PodSpec, matches: impl Fn(&str) -> bool) -> Vec<&str> {
    pod.volumes
        .iter()
        .flatten()
        .filter(|v| {
            v.host_path
                .as_ref()
                .is_some_and(|h| matches(&normalise(&h.path)))
        })
        .map(|v| v.name.as_str())
        .collect()
}

/// SR102: a device plugin must mount the kubelet's device-plugin directory: it
/// creates its socket there and registers through `kubelet.sock` in it.
/// Without it the pod runs, is Ready, and advertises nothing.
pub fn device_plugin_socket_mount(object: &str, pod: &PodSpec, kind: Kind) -> Vec<Finding> {
    if kind != Kind::DevicePlugin {
        return Vec::new();
    }
    let mounted = container_host_mounts(pod)
        .iter()
        .any(|m| covers(&m.host_path, DEVICE_PLUGIN_DIR));
    if mounted {
        return Vec::new();
    }
    let declared = host_path_volumes_matching(pod, |p| covers(p, DEVICE_PLUGIN_DIR));
    let message = match declared.first() {
        Some(volume) => format!(
            "hostPath volume {volume:?} ({DEVICE_PLUGIN_DIR}) is declared but no container mounts it: the plugin cannot register with the kubelet and advertises nothing"
        ),
        None => format!(
            "no container mounts the hostPath {DEVICE_PLUGIN_DIR}: the plugin cannot register with the kubelet and advertises nothing"
        ),
    };
    vec![Finding::error(
        codes::DEVICE_PLUGIN_SOCKET_DIR,
        object,
        message,
        format!(
            "add a volume with hostPath.path {DEVICE_PLUGIN_DIR} and mount it at {DEVICE_PLUGIN_DIR} in the plugin container"
        ),
    )]
}

/// SR103: a DRA driver's kubelet plugin needs the registration directory
/// (`plugins_registry`, where the kubelet discovers it) and the plugin
/// directory (`plugins/<driver>`, where its DRA socket lives).
pub fn dra_registration_mounts(object: &str, pod: &PodSpec, kind: Kind) -> Vec<Finding> {
    if kind != Kind::DraDriver {
        return Vec::new();
    }
    let mounts = container_host_mounts(pod);
    let mut missing = Vec::new();
    if !mounts
        .iter()
        .any(|m| covers(&m.host_path, PLUGINS_REGISTRY_DIR))
    {
        missing.push(PLUGINS_REGISTRY_DIR);
    }
    if !mounts.iter().any(|m| is_plugins_dir(&m.host_path)) {
        missing.push(PLUGINS_DIR);
    }
    if missing.is_empty() {
        return Vec::new();
    }
    vec![Finding::error(
        codes::DRA_REGISTRATION_DIRS,
        object,
        format!(
            "no container mounts the hostPath {}: the kubelet never learns of the driver and no ResourceClaim on its nodes can be prepared",
            missing.join(" and ")
        ),
        format!(
            "add hostPath volumes for {} and mount them at the same paths in the kubelet-plugin container",
            missing.join(" and ")
        ),
    )]
}

/// A percentage such as `"25%"`, as a number.
fn percent(s: &str) -> Option<u32> {
    s.trim().strip_suffix('%')?.trim().parse().ok()
}

/// Whether an int-or-string is positive (`0`, `"0%"` and malformed values are not).
fn is_positive(v: &IntOrString) -> bool {
    match v {
        IntOrString::Int(n) => *n > 0,
        IntOrString::String(s) => {
            percent(s).is_some_and(|p| p > 0) || s.trim().parse::<i64>().is_ok_and(|n| n > 0)
        }
    }
}

fn show(v: &IntOrString) -> String {
    match v {
        IntOrString::Int(n) => n.to_string(),
        IntOrString::String(s) => format!("{s:?}"),
    }
}

/// SR104 / SR105 / SR106: the DaemonSet's own rolling update.
///
/// - `maxUnavailable` of 100% (or at least [`ALL_AT_ONCE_COUNT`]) takes every
///   plugin down at once: a bad release loses every node's devices.
/// - `maxSurge` starts the new pod before the old one stops. Two device
///   plugins on a node register the same resource with the kubelet, and the
///   one that registered last wins while the other keeps running (SR105). DRA
///   drivers can do this on purpose since Kubernetes 1.33 (seamless upgrade,
///   when the driver supports it), so it is only noted (SR106).
///
/// `OnDelete` has no rolling update to check (and is what the operator sets).
pub fn update_strategy(
    object: &str,
    strategy: Option<&DaemonSetUpdateStrategy>,
    kind: Kind,
) -> Vec<Finding> {
    let mut findings = Vec::new();
    if strategy.and_then(|s| s.type_.as_deref()) == Some("OnDelete") {
        return findings;
    }
    let rolling = strategy.and_then(|s| s.rolling_update.as_ref());
    if let Some(max_unavailable) = rolling.and_then(|r| r.max_unavailable.as_ref()) {
        let all_at_once = match max_unavailable {
            IntOrString::Int(n) => *n >= ALL_AT_ONCE_COUNT,
            IntOrString::String(s) => percent(s).is_some_and(|p| p >= 100),
        };
        if all_at_once {
            findings.push(Finding::error(
                codes::MAX_UNAVAILABLE_ALL,
                object,
                format!(
                    "updateStrategy.rollingUpdate.maxUnavailable is {}: an update replaces every plugin at once, so a bad release takes the devices off every node",
                    show(max_unavailable)
                ),
                "set maxUnavailable to 1 (or a small percentage) and let a SafeRollout stage the update",
            ));
        }
    }
    if let Some(max_surge) = rolling
        .and_then(|r| r.max_surge.as_ref())
        .filter(|s| is_positive(s))
    {
        match kind {
            Kind::DevicePlugin => findings.push(Finding::error(
                codes::DEVICE_PLUGIN_SURGE,
                object,
                format!(
                    "updateStrategy.rollingUpdate.maxSurge is {}: old and new device plugin run on a node together and both register the same resource with the kubelet",
                    show(max_surge)
                ),
                "set maxSurge to 0 and maxUnavailable to 1",
            )),
            Kind::DraDriver => findings.push(Finding::info(
                codes::DRA_SURGE,
                object,
                format!(
                    "updateStrategy.rollingUpdate.maxSurge is {}: a seamless upgrade, which needs Kubernetes 1.33 or later and a driver that supports two instances per node",
                    show(max_surge)
                ),
                "keep it if the driver supports seamless upgrades; otherwise set maxSurge to 0",
            )),
            Kind::Unknown => {}
        }
    }
    findings
}

/// SR107: containers without requests (the scheduler reserves nothing, so a
/// full node evicts or never fits the agent) or without limits (a leaking
/// agent can starve the node's workloads). Init containers are not checked:
/// they finish before the agent runs.
pub fn resources(object: &str, pod: &PodSpec) -> Vec<Finding> {
    let mut findings = Vec::new();
    for container in &pod.containers {
        let resources = container.resources.as_ref();
        let has_requests = resources
            .and_then(|r| r.requests.as_ref())
            .is_some_and(|r| !r.is_empty());
        let has_limits = resources
            .and_then(|r| r.limits.as_ref())
            .is_some_and(|l| !l.is_empty());
        let missing = match (has_requests, has_limits) {
            (true, true) => continue,
            (false, false) => "resources.requests or resources.limits",
            (false, true) => "resources.requests",
            (true, false) => "resources.limits",
        };
        findings.push(Finding::new(
            Severity::Warning,
            codes::RESOURCES,
            object,
            format!("container {:?} has no {missing}", container.name),
            "set cpu and memory requests (what the agent needs) and a memory limit",
        ));
    }
    findings
}

/// SR108: without a priority class the agent is preempted like any pod and
/// may not fit on a node that filled up while it was being replaced.
pub fn priority_class(object: &str, pod: &PodSpec) -> Vec<Finding> {
    if pod
        .priority_class_name
        .as_deref()
        .is_some_and(|p| !p.trim().is_empty())
    {
        return Vec::new();
    }
    vec![Finding::warning(
        codes::PRIORITY_CLASS,
        object,
        "no priorityClassName: the agent can be preempted, or find no room on a full node during an update",
        format!("set priorityClassName: {NODE_CRITICAL_PRIORITY_CLASS}"),
    )]
}

/// SR109: accelerator nodes are commonly tainted (`nvidia.com/gpu:NoSchedule`,
/// `amd.com/gpu`); a DaemonSet tolerating nothing skips all of them. Not an
/// error: untainted clusters are fine.
pub fn tolerations(object: &str, pod: &PodSpec) -> Vec<Finding> {
    if pod.tolerations.as_ref().is_some_and(|t| !t.is_empty()) {
        return Vec::new();
    }
    vec![Finding::info(
        codes::NO_TOLERATIONS,
        object,
        "no tolerations: nodes with taints (e.g. nvidia.com/gpu:NoSchedule) will not get the plugin",
        "tolerate the taints of your accelerator nodes (e.g. key nvidia.com/gpu, operator Exists, effect NoSchedule)",
    )]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tests::{codes_of, daemonset, env_literal, env_secret_ref, pod_of};
    use k8s_openapi::api::apps::v1::RollingUpdateDaemonSet;
    use k8s_openapi::api::core::v1::{ResourceRequirements, Toleration};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    const OBJ: &str = "DaemonSet gpu/plugin";

    #[test]
    fn secret_like_names() {
        for name in [
            "NGC_API_KEY",
            "LICENSE_SERVER_TOKEN",
            "db_password",
            "CLIENT_SECRET",
            "NVIDIA_LICENSE",
            "licence_file_content",
            "ApiKey",
        ] {
            assert!(is_secret_like_name(name), "{name}");
        }
        for name in [
            "FAIL_ON_INIT_ERROR",
            "NODE_NAME",
            "RESOURCE_LABEL_KEY",
            "KEYBOARD",
            "TOKENIZER_PATH",
            "PASS_DEVICE_SPECS",
        ] {
            assert!(!is_secret_like_name(name), "{name}");
        }
        assert!(is_variable_reference("$(NGC_KEY)"));
        assert!(is_variable_reference("$(A)$(B)"));
        assert!(!is_variable_reference("$(A)literal"));
        assert!(!is_variable_reference("$(A"));
        assert!(!is_variable_reference("abc"));
    }

    #[test]
    fn literal_secrets_are_errors_and_references_are_fine() {
        let mut ds = daemonset("plugin", "img:1", &[]);
        let pod = pod_of(&mut ds);
        pod.containers[0].env = Some(vec![
            env_literal("NGC_API_KEY", "nvapi-ZZZ-very-secret-value"),
            env_literal("FAIL_ON_INIT_ERROR", "false"),
            env_literal("EMPTY_TOKEN", ""),
            env_literal("FORWARDED_TOKEN", "$(TOKEN_FROM_SECRET)"),
            env_secret_ref("DB_PASSWORD", "db", "password"),
        ]);
        let mut init = pod.containers[0].clone();
        init.name = "init".into();
        init.env = Some(vec![env_literal(
            "LICENSE_SERVER_TOKEN",
            "another-secret-value-42",
        )]);
        pod.init_containers = Some(vec![init]);
        let findings = literal_secrets(OBJ, pod);
        assert_eq!(codes_of(&findings), ["SR101", "SR101"]);
        assert!(findings[0].message.contains("\"NGC_API_KEY\""));
        assert!(findings[0].message.contains("container \"plugin\""));
        assert!(findings[1].message.contains("init container \"init\""));
        assert!(findings[1].message.contains("LICENSE_SERVER_TOKEN"));
        let json = serde_json::to_string(&findings).unwrap();
        for value in ["nvapi-ZZZ-very-secret-value", "another-secret-value-42"] {
            assert!(!json.contains(value), "{json}");
            for f in &findings {
                assert!(!f.to_string().contains(value));
            }
        }

        let mut good = daemonset("plugin", "img:1", &[]);
        pod_of(&mut good).containers[0].env =
            Some(vec![env_secret_ref("NGC_API_KEY", "ngc", "key")]);
        assert!(literal_secrets(OBJ, pod_of(&mut good)).is_empty());
    }

    #[test]
    fn device_plugin_needs_the_socket_dir() {
        let mut good = daemonset("p", "i:1", &[("dp", DEVICE_PLUGIN_DIR)]);
        assert!(device_plugin_socket_mount(OBJ, pod_of(&mut good), Kind::DevicePlugin).is_empty());
        let mut parent = daemonset("p", "i:1", &[("k", "/var/lib/kubelet/")]);
        assert!(
            device_plugin_socket_mount(OBJ, pod_of(&mut parent), Kind::DevicePlugin).is_empty()
        );

        let mut none = daemonset("p", "i:1", &[("dev", "/dev")]);
        let f = device_plugin_socket_mount(OBJ, pod_of(&mut none), Kind::DevicePlugin);
        assert_eq!(codes_of(&f), ["SR102"]);
        assert!(f[0].message.contains("no container mounts"));
        // Only device plugins need it.
        assert!(device_plugin_socket_mount(OBJ, pod_of(&mut none), Kind::Unknown).is_empty());
        assert!(device_plugin_socket_mount(OBJ, pod_of(&mut none), Kind::DraDriver).is_empty());

        // Declared but not mounted.
        let mut unmounted = daemonset("p", "i:1", &[("dp", DEVICE_PLUGIN_DIR)]);
        pod_of(&mut unmounted).containers[0].volume_mounts = None;
        let f = device_plugin_socket_mount(OBJ, pod_of(&mut unmounted), Kind::DevicePlugin);
        assert_eq!(codes_of(&f), ["SR102"]);
        assert!(f[0].message.contains("\"dp\""), "{}", f[0].message);

        // A wrong path is not the socket dir.
        let mut wrong = daemonset("p", "i:1", &[("dp", "/var/lib/kubelet/device-plugin")]);
        let f = device_plugin_socket_mount(OBJ, pod_of(&mut wrong), Kind::DevicePlugin);
        assert_eq!(codes_of(&f), ["SR102"]);
    }

    #[test]
    fn dra_driver_needs_registry_and_plugins_dirs() {
        let mut good = daemonset(
            "d",
            "i:1",
            &[("r", PLUGINS_REGISTRY_DIR), ("p", PLUGINS_DIR)],
        );
        assert!(dra_registration_mounts(OBJ, pod_of(&mut good), Kind::DraDriver).is_empty());
        let mut subdir = daemonset(
            "d",
            "i:1",
            &[
                ("r", PLUGINS_REGISTRY_DIR),
                ("p", "/var/lib/kubelet/plugins/gpu.example.com"),
            ],
        );
        assert!(dra_registration_mounts(OBJ, pod_of(&mut subdir), Kind::DraDriver).is_empty());

        let mut no_registry = daemonset("d", "i:1", &[("p", PLUGINS_DIR)]);
        let f = dra_registration_mounts(OBJ, pod_of(&mut no_registry), Kind::DraDriver);
        assert_eq!(codes_of(&f), ["SR103"]);
        assert!(
            f[0].message
                .contains(&format!("hostPath {PLUGINS_REGISTRY_DIR}:")),
            "{}",
            f[0].message
        );

        let mut neither = daemonset("d", "i:1", &[]);
        let f = dra_registration_mounts(OBJ, pod_of(&mut neither), Kind::DraDriver);
        assert_eq!(codes_of(&f), ["SR103"]);
        assert!(
            f[0].message
                .contains(&format!("{PLUGINS_REGISTRY_DIR} and {PLUGINS_DIR}"))
        );
        assert!(dra_registration_mounts(OBJ, pod_of(&mut neither), Kind::DevicePlugin).is_empty());
    }

    fn strategy(
        type_: &str,
        max_unavailable: Option<IntOrString>,
        max_surge: Option<IntOrString>,
    ) -> DaemonSetUpdateStrategy {
        DaemonSetUpdateStrategy {
            type_: Some(type_.into()),
            rolling_update: Some(RollingUpdateDaemonSet {
                max_unavailable,
                max_surge,
            }),
        }
    }

    #[test]
    fn update_strategy_rules() {
        let s = |n: &str| Some(IntOrString::String(n.into()));
        let i = |n: i32| Some(IntOrString::Int(n));
        let check =
            |st: &DaemonSetUpdateStrategy, kind| codes_of(&update_strategy(OBJ, Some(st), kind));

        assert!(update_strategy(OBJ, None, Kind::DevicePlugin).is_empty());
        for ok in [i(1), s("10%"), s("99%"), i(ALL_AT_ONCE_COUNT - 1), None] {
            assert!(check(&strategy("RollingUpdate", ok, None), Kind::DevicePlugin).is_empty());
        }
        for all in [s("100%"), s(" 100% "), i(ALL_AT_ONCE_COUNT), i(10_000)] {
            let st = strategy("RollingUpdate", all, None);
            assert_eq!(check(&st, Kind::DevicePlugin), ["SR104"]);
            assert_eq!(check(&st, Kind::Unknown), ["SR104"]);
        }
        // OnDelete ignores rollingUpdate.
        assert!(check(&strategy("OnDelete", s("100%"), i(1)), Kind::DevicePlugin).is_empty());

        let surge = strategy("RollingUpdate", i(0), i(1));
        assert_eq!(check(&surge, Kind::DevicePlugin), ["SR105"]);
        let f = update_strategy(OBJ, Some(&surge), Kind::DraDriver);
        assert_eq!(codes_of(&f), ["SR106"]);
        assert_eq!(f[0].severity, Severity::Info);
        assert!(check(&surge, Kind::Unknown).is_empty());
        for zero in [i(0), s("0%"), s("0")] {
            assert!(check(&strategy("RollingUpdate", i(1), zero), Kind::DevicePlugin).is_empty());
        }
        assert_eq!(
            check(
                &strategy("RollingUpdate", i(0), s("25%")),
                Kind::DevicePlugin
            ),
            ["SR105"]
        );
    }

    #[test]
    fn resources_priority_and_tolerations() {
        let mut ds = daemonset("p", "i:1", &[]);
        let pod = pod_of(&mut ds);
        let f = resources(OBJ, pod);
        assert_eq!(codes_of(&f), ["SR107"]);
        assert_eq!(f[0].severity, Severity::Warning);
        assert!(f[0].message.contains("requests or resources.limits"));

        let q = |s: &str| Quantity(s.into());
        pod.containers[0].resources = Some(ResourceRequirements {
            requests: Some([("cpu".to_string(), q("50m"))].into()),
            ..Default::default()
        });
        let f = resources(OBJ, pod);
        assert!(
            f[0].message.ends_with("no resources.limits"),
            "{}",
            f[0].message
        );
        pod.containers[0].resources = Some(ResourceRequirements {
            requests: Some([("cpu".to_string(), q("50m"))].into()),
            limits: Some([("memory".to_string(), q("64Mi"))].into()),
            ..Default::default()
        });
        assert!(resources(OBJ, pod).is_empty());

        let f = priority_class(OBJ, pod);
        assert_eq!(codes_of(&f), ["SR108"]);
        assert!(f[0].fix.contains("system-node-critical"));
        pod.priority_class_name = Some(NODE_CRITICAL_PRIORITY_CLASS.into());
        assert!(priority_class(OBJ, pod).is_empty());

        let f = tolerations(OBJ, pod);
        assert_eq!(codes_of(&f), ["SR109"]);
        assert_eq!(f[0].severity, Severity::Info);
        pod.tolerations = Some(vec![]);
        assert_eq!(codes_of(&tolerations(OBJ, pod)), ["SR109"]);
        pod.tolerations = Some(vec![Toleration {
            key: Some("nvidia.com/gpu".into()),
            operator: Some("Exists".into()),
            effect: Some("NoSchedule".into()),
            ..Default::default()
        }]);
        assert!(tolerations(OBJ, pod).is_empty());
    }
}
