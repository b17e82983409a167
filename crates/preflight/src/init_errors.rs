//! SR111: a device plugin told to survive its own initialisation failure.
//!
//! NVIDIA's device plugin has the flag `--fail-on-init-error` (environment
//! `FAIL_ON_INIT_ERROR`, default true; `cmd/nvidia-device-plugin/main.go` in
//! NVIDIA/k8s-device-plugin). Set to false, a plugin that cannot load NVML
//! or find its devices uses an empty resource manager
//! (`internal/resource/factory.go`: "using empty manager"), logs "No devices
//! found. Waiting indefinitely." and stays Running and Ready with 0 GPUs. A
//! `podsReady` gate passes it; only a gate that counts the node's devices
//! (an allocatable gate with a floor) fails it. Upstream removed the setting
//! from its static manifests for that reason (commit b3d0054, "failures in
//! loading GPU information is silently ignored"); releases up to v0.17.4
//! still ship it.
//!
//! The AMD and Intel GPU plugins have no such flag (docs/preflight.md says
//! where we looked), so the rule reads only NVIDIA's.

use k8s_openapi::api::core::v1::{Container, PodSpec};
use saferollout_api::{Bound, SafeRolloutSpec};

use crate::kind::Kind;
use crate::{Finding, Gating, codes};

/// The plugin's environment variable (urfave/cli `EnvVars`).
pub const ENV: &str = "FAIL_ON_INIT_ERROR";
/// The plugin's command-line flag, which wins over the variable.
pub const FLAG: &str = "fail-on-init-error";

/// The values Go's `strconv.ParseBool` reads as false (what the plugin's
/// flag library uses, on the variable's value as written).
fn go_false(value: &str) -> bool {
    matches!(value, "0" | "f" | "F" | "false" | "FALSE" | "False")
}

/// Whether a SafeRollout's gates would fail a node whose plugin runs with no
/// devices: an allocatable gate whose floor (`min`) is `baseline` or at
/// least 1. A DRA `resourceSlices` gate does not count: it reads what a DRA
/// driver publishes, and a device plugin publishes no ResourceSlices, so a
/// plugin with 0 GPUs leaves it as it was.
pub fn counts_devices(spec: &SafeRolloutSpec) -> bool {
    spec.allocatable_gates()
        .iter()
        .any(|g| match g.min_bound() {
            Ok(Bound::Value(min)) => min >= 1,
            Ok(Bound::Baseline) => true,
            // `capacityLabel:` is not allowed as a floor (SR007 reports it).
            Ok(Bound::CapacityLabel(_)) | Err(_) => false,
        })
}

/// NVIDIA's GPU feature discovery reads the same variable (and
/// `GFD_FAIL_ON_INIT_ERROR`) and ships in the same image; it advertises no
/// devices, so an allocatable gate is not its remedy.
fn is_feature_discovery(container: &Container) -> bool {
    container
        .command
        .as_deref()
        .and_then(<[String]>::first)
        .is_some_and(|c| c.rsplit('/').next() == Some("gpu-feature-discovery"))
}

/// Where the container turns the flag off, if it does: the last
/// `--fail-on-init-error=<false>` of its command line (which wins over the
/// environment), else its last `FAIL_ON_INIT_ERROR` entry with a literal
/// false value. Returns the field's path under the container and how it is
/// written.
fn turned_off(container: &Container) -> Option<(String, String)> {
    let words = [("command", &container.command), ("args", &container.args)];
    let mut last_flag = None;
    for (field, list) in words {
        for (i, word) in list.iter().flatten().enumerate() {
            let bare = word.trim_start_matches('-');
            if word.starts_with('-') && (bare == FLAG || bare.starts_with(&format!("{FLAG}="))) {
                last_flag = Some((format!("{field}[{i}]"), word.clone()));
            }
        }
    }
    if let Some((path, word)) = last_flag {
        let value = word.split_once('=').map_or("true", |(_, v)| v);
        return go_false(value).then_some((path, word));
    }
    let env = container.env.as_deref().unwrap_or_default();
    let (i, var) = env.iter().enumerate().rfind(|(_, v)| v.name == ENV)?;
    let value = var.value.as_deref()?;
    go_false(value).then(|| (format!("env[{i}]"), format!("{ENV}={value:?}")))
}

/// SR111: a device plugin container that runs on after failing to
/// initialise. A Warning when nothing gates the agent's device count:
/// linted alone (no SafeRollout in the input targets it), or rolled out by a
/// SafeRollout without an allocatable gate with a floor. Silent when that
/// SafeRollout has one ([`counts_devices`]), and when the caller does not
/// know the gates (`counts_devices: None`). The finding is about the
/// variable's env entry (or the flag's argument).
pub fn fail_on_init_error(object: &str, pod: &PodSpec, kind: Kind, gating: Gating) -> Vec<Finding> {
    if kind != Kind::DevicePlugin || gating.counts_devices != Some(false) {
        return Vec::new();
    }
    let mut findings = Vec::new();
    for (i, container) in pod.containers.iter().enumerate() {
        if is_feature_discovery(container) {
            continue;
        }
        let Some((field, written)) = turned_off(container) else {
            continue;
        };
        let gated = if gating.rolled_out {
            "its SafeRollout has no allocatable gate with a floor (min baseline or >= 1)"
        } else {
            "no SafeRollout in the input targets it"
        };
        findings.push(
            Finding::warning(
                codes::FAIL_ON_INIT_ERROR,
                object,
                format!(
                    "container {:?}: {written}: a plugin that cannot load NVML or find its GPUs keeps running, Ready, with 0 GPUs, and only a gate that counts the node's devices sees it; {gated}",
                    container.name
                ),
                format!(
                    "gate the rollout with spec.gates.allocatable (e.g. resource nvidia.com/gpu, min baseline), or remove {ENV} so the plugin fails and podsReady catches it"
                ),
            )
            .at(format!("{}.containers[{i}].{field}", crate::POD_SPEC_PATH)),
        );
    }
    findings
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tests::{codes_of, daemonset, env_literal, pod_of};
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
    use saferollout_api::{AllocatableGate, Gates, ResourceSlicesGate};

    const OBJ: &str = "DaemonSet gpu/nvidia-device-plugin";

    fn plugin_with(
        env: Vec<k8s_openapi::api::core::v1::EnvVar>,
    ) -> k8s_openapi::api::apps::v1::DaemonSet {
        let mut ds = daemonset(
            "nvidia-device-plugin",
            "nvcr.io/nvidia/k8s-device-plugin:v0.17.4",
            &[],
        );
        pod_of(&mut ds).containers[0].env = Some(env);
        ds
    }

    #[test]
    fn false_as_go_reads_it_is_a_warning_at_the_env_entry() {
        for value in ["false", "False", "FALSE", "0", "f", "F"] {
            let mut ds = plugin_with(vec![env_literal("NODE_NAME", "n"), env_literal(ENV, value)]);
            let f = fail_on_init_error(OBJ, pod_of(&mut ds), Kind::DevicePlugin, Gating::ALONE);
            assert_eq!(codes_of(&f), ["SR111"], "{value}");
            assert_eq!(f[0].severity, crate::Severity::Warning);
            assert_eq!(
                f[0].field.as_deref(),
                Some("spec.template.spec.containers[0].env[1]")
            );
            assert!(f[0].message.contains("0 GPUs"), "{}", f[0].message);
            assert!(f[0].message.contains("no SafeRollout"), "{}", f[0].message);
            assert!(f[0].fix.contains("spec.gates.allocatable"), "{}", f[0].fix);
        }
        // True, unset, empty (the default applies), spaces (the plugin fails to
        // parse it and exits), or read from elsewhere: nothing to report.
        for value in ["true", "1", "", " false", "no"] {
            let mut ds = plugin_with(vec![env_literal(ENV, value)]);
            let pod = pod_of(&mut ds);
            assert!(
                fail_on_init_error(OBJ, pod, Kind::DevicePlugin, Gating::ALONE).is_empty(),
                "{value:?}"
            );
        }
        let mut ds = plugin_with(vec![]);
        assert!(
            fail_on_init_error(OBJ, pod_of(&mut ds), Kind::DevicePlugin, Gating::ALONE).is_empty()
        );
        // The last entry of a name is the one the container gets.
        let mut ds = plugin_with(vec![env_literal(ENV, "false"), env_literal(ENV, "true")]);
        assert!(
            fail_on_init_error(OBJ, pod_of(&mut ds), Kind::DevicePlugin, Gating::ALONE).is_empty()
        );
    }

    #[test]
    fn the_flag_wins_over_the_variable() {
        let mut ds = plugin_with(vec![env_literal(ENV, "true")]);
        let pod = pod_of(&mut ds);
        pod.containers[0].args = Some(vec![
            "--mig-strategy=none".into(),
            "--fail-on-init-error=false".into(),
        ]);
        let f = fail_on_init_error(OBJ, pod, Kind::DevicePlugin, Gating::ALONE);
        assert_eq!(codes_of(&f), ["SR111"]);
        assert_eq!(
            f[0].field.as_deref(),
            Some("spec.template.spec.containers[0].args[1]")
        );
        // A bare flag is true, and wins over a false variable.
        pod.containers[0].env = Some(vec![env_literal(ENV, "false")]);
        pod.containers[0].args = Some(vec!["-fail-on-init-error".into()]);
        assert!(fail_on_init_error(OBJ, pod, Kind::DevicePlugin, Gating::ALONE).is_empty());
        pod.containers[0].args = None;
        pod.containers[0].command = Some(vec![
            "nvidia-device-plugin".into(),
            "-fail-on-init-error=0".into(),
        ]);
        let f = fail_on_init_error(OBJ, pod, Kind::DevicePlugin, Gating::ALONE);
        assert_eq!(
            f[0].field.as_deref(),
            Some("spec.template.spec.containers[0].command[1]")
        );
    }

    #[test]
    fn silent_when_a_gate_counts_devices_or_the_gates_are_unknown() {
        let mut ds = plugin_with(vec![env_literal(ENV, "false")]);
        let pod = pod_of(&mut ds);
        let gated = |counts| Gating {
            rolled_out: true,
            counts_devices: counts,
        };
        assert!(fail_on_init_error(OBJ, pod, Kind::DevicePlugin, gated(Some(true))).is_empty());
        assert!(fail_on_init_error(OBJ, pod, Kind::DevicePlugin, gated(None)).is_empty());
        let f = fail_on_init_error(OBJ, pod, Kind::DevicePlugin, gated(Some(false)));
        assert_eq!(codes_of(&f), ["SR111"]);
        assert!(
            f[0].message.contains("no allocatable gate"),
            "{}",
            f[0].message
        );
        // Only device plugins; GPU feature discovery is not one.
        assert!(fail_on_init_error(OBJ, pod, Kind::DraDriver, Gating::ALONE).is_empty());
        pod.containers[0].command = Some(vec!["/usr/bin/gpu-feature-discovery".into()]);
        assert!(fail_on_init_error(OBJ, pod, Kind::DevicePlugin, Gating::ALONE).is_empty());
    }

    #[test]
    fn which_gates_count_devices() {
        let with = |allocatable: Vec<AllocatableGate>, slices: Option<ResourceSlicesGate>| {
            let mut spec = SafeRolloutSpec::for_daemonset("p");
            spec.gates = Some(Gates {
                allocatable,
                resource_slices: slices,
                ..Default::default()
            });
            counts_devices(&spec)
        };
        let gate = |min: IntOrString| {
            let mut g = AllocatableGate::new("nvidia.com/gpu");
            g.min = min;
            g
        };
        assert!(!counts_devices(&SafeRolloutSpec::for_daemonset("p")));
        assert!(with(vec![AllocatableGate::new("nvidia.com/gpu")], None));
        assert!(with(vec![gate(IntOrString::Int(8))], None));
        assert!(!with(vec![gate(IntOrString::Int(0))], None));
        assert!(!with(vec![gate(IntOrString::String("lots".into()))], None));
        assert!(!with(
            vec![],
            Some(ResourceSlicesGate::new("gpu.nvidia.com"))
        ));
    }
}
