//! What kind of node agent a DaemonSet is: a device plugin, a DRA driver, or
//! neither as far as we can tell. Some rules apply to one kind only.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Container, PodSpec, PodTemplateSpec};
use serde::Serialize;

/// The kubelet's device-plugin socket directory (`pluginapi.DevicePluginPath`).
pub const DEVICE_PLUGIN_DIR: &str = "/var/lib/kubelet/device-plugins";
/// Where kubelet plugins (DRA drivers, CSI) put their registration socket.
pub const PLUGINS_REGISTRY_DIR: &str = "/var/lib/kubelet/plugins_registry";
/// Where kubelet plugins put their service socket (`plugins/<driver>/dra.sock`).
pub const PLUGINS_DIR: &str = "/var/lib/kubelet/plugins";

/// The kind of node agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub enum Kind {
    /// A device plugin (kubelet device-plugin API, extended resources).
    DevicePlugin,
    /// A DRA driver's kubelet plugin (ResourceSlices, ResourceClaims).
    DraDriver,
    /// Not known; [`crate::lint_daemonset`] then calls [`detect_kind`].
    Unknown,
}

/// Guesses the kind of a DaemonSet from its mounts, then its names; see
/// [`detect_template_kind`].
pub fn detect_kind(ds: &DaemonSet) -> Kind {
    let name = ds.metadata.name.as_deref().unwrap_or_default();
    let template = &ds.spec.template;
    let mut labels: Vec<&str> = label_values(ds.metadata.labels.as_ref());
    labels.extend(label_values(
        template.metadata.as_ref().and_then(|m| m.labels.as_ref()),
    ));
    detect(name, &labels, template)
}

/// Guesses the kind of the agent running `template` (in the DaemonSet called
/// `name`):
/// 1. a container mounts the hostPath `/var/lib/kubelet/device-plugins` (or a
///    parent): a device plugin;
/// 2. a container mounts `/var/lib/kubelet/plugins_registry` or
///    `/var/lib/kubelet/plugins` (or a subdirectory): a DRA driver;
/// 3. the name has a `dra` word (`dra-example-driver`, `nvidia-dra-driver-gpu`;
///    a word, so that `cassandra` is not one): a DRA driver;
/// 4. every container runs one of the helper programs NVIDIA ships in its
///    device-plugin image (`mps-control-daemon`, `gpu-feature-discovery`,
///    `config-manager`; the commands of NVIDIA/k8s-device-plugin's chart and
///    static manifests): not known (the chart names those DaemonSets
///    `<release>-nvidia-device-plugin-mps-control-daemon` and labels them
///    like the plugin, but they register no devices);
/// 5. the name, a label value or an image contains `device-plugin`, or an image
///    is one of Intel's `intel-*-plugin`: a device plugin.
///
/// Mounts come first because they say what the agent actually talks to.
pub fn detect_template_kind(name: &str, template: &PodTemplateSpec) -> Kind {
    let labels = label_values(template.metadata.as_ref().and_then(|m| m.labels.as_ref()));
    detect(name, &labels, template)
}

fn detect(name: &str, labels: &[&str], template: &PodTemplateSpec) -> Kind {
    let Some(pod) = template.spec.as_ref() else {
        return detect_by_name(name, labels, &[]);
    };
    let mounts = container_host_mounts(pod);
    if mounts
        .iter()
        .any(|m| covers(&m.host_path, DEVICE_PLUGIN_DIR))
    {
        return Kind::DevicePlugin;
    }
    if mounts
        .iter()
        .any(|m| covers(&m.host_path, PLUGINS_REGISTRY_DIR) || is_plugins_dir(&m.host_path))
    {
        return Kind::DraDriver;
    }
    if !pod.containers.is_empty() && pod.containers.iter().all(runs_nvidia_helper) {
        return Kind::Unknown;
    }
    let images: Vec<&str> = pod
        .containers
        .iter()
        .filter_map(|c| c.image.as_deref())
        .collect();
    detect_by_name(name, labels, &images)
}

/// The programs other than the plugin in NVIDIA's `k8s-device-plugin` image.
const NVIDIA_HELPERS: &[&str] = &[
    "mps-control-daemon",
    "gpu-feature-discovery",
    "config-manager",
];

/// Whether the container's command is one of [`NVIDIA_HELPERS`] (by path or name).
fn runs_nvidia_helper(container: &Container) -> bool {
    container
        .command
        .as_deref()
        .and_then(<[String]>::first)
        .and_then(|c| c.rsplit('/').next())
        .is_some_and(|program| NVIDIA_HELPERS.contains(&program))
}

fn detect_by_name(name: &str, labels: &[&str], images: &[&str]) -> Kind {
    let lower = name.to_ascii_lowercase();
    if lower
        .split(|c: char| !c.is_ascii_alphanumeric())
        .any(|w| w == "dra")
    {
        return Kind::DraDriver;
    }
    let says_device_plugin = |s: &str| s.to_ascii_lowercase().contains("device-plugin");
    if says_device_plugin(name)
        || labels.iter().any(|l| says_device_plugin(l))
        || images
            .iter()
            .any(|i| says_device_plugin(i) || is_intel_plugin_image(i))
    {
        return Kind::DevicePlugin;
    }
    Kind::Unknown
}

/// Intel's device plugins are `intel/intel-gpu-plugin`, `intel/intel-qat-plugin`
/// and so on: no `device-plugin` in their names.
fn is_intel_plugin_image(image: &str) -> bool {
    let repo = image.rsplit('/').next().unwrap_or(image);
    let repo = repo.split([':', '@']).next().unwrap_or(repo);
    repo.starts_with("intel-") && repo.ends_with("-plugin")
}

fn label_values(labels: Option<&BTreeMap<String, String>>) -> Vec<&str> {
    labels
        .map(|l| l.values().map(String::as_str).collect())
        .unwrap_or_default()
}

/// A hostPath volume mounted into a (regular) container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HostMount {
    /// The host directory the container sees: the volume's path plus the
    /// mount's subPath, normalised.
    pub host_path: String,
}

/// Every hostPath volume mounted by a regular container (init containers run
/// to completion before the plugin starts, so their mounts do not count).
pub(crate) fn container_host_mounts(pod: &PodSpec) -> Vec<HostMount> {
    let volumes = pod.volumes.as_deref().unwrap_or_default();
    let mut mounts = Vec::new();
    for container in &pod.containers {
        for mount in container.volume_mounts.as_deref().unwrap_or_default() {
            let Some(host) = volumes
                .iter()
                .find(|v| v.name == mount.name)
                .and_then(|v| v.host_path.as_ref())
            else {
                continue;
            };
            let mut path = host.path.clone();
            if let Some(sub) = mount.sub_path.as_deref().filter(|s| !s.is_empty()) {
                path.push('/');
                path.push_str(sub);
            }
            mounts.push(HostMount {
                host_path: normalise(&path),
            });
        }
    }
    mounts
}

/// Collapses repeated slashes and drops a trailing one (`/var//lib/` -> `/var/lib`).
pub(crate) fn normalise(path: &str) -> String {
    let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
    format!("/{}", parts.join("/"))
}

/// Whether mounting `host_path` makes `dir` visible: it is `dir` or a parent.
pub(crate) fn covers(host_path: &str, dir: &str) -> bool {
    host_path == dir || host_path == "/" || dir.starts_with(&format!("{host_path}/"))
}

/// `/var/lib/kubelet/plugins` itself, a parent, or one driver's directory in it.
pub(crate) fn is_plugins_dir(host_path: &str) -> bool {
    covers(host_path, PLUGINS_DIR) || host_path.starts_with(&format!("{PLUGINS_DIR}/"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tests::{daemonset, pod_of};

    #[test]
    fn paths() {
        assert_eq!(normalise("/var//lib/kubelet/"), "/var/lib/kubelet");
        assert_eq!(normalise("/"), "/");
        assert!(covers("/var/lib/kubelet", DEVICE_PLUGIN_DIR));
        assert!(covers(DEVICE_PLUGIN_DIR, DEVICE_PLUGIN_DIR));
        assert!(!covers(
            "/var/lib/kubelet/device-plugins-x",
            DEVICE_PLUGIN_DIR
        ));
        assert!(!covers("/var/lib/kube", DEVICE_PLUGIN_DIR));
        assert!(is_plugins_dir("/var/lib/kubelet/plugins/gpu.example.com"));
        assert!(!is_plugins_dir(PLUGINS_REGISTRY_DIR));
        assert!(is_intel_plugin_image("intel/intel-gpu-plugin:0.32.0"));
        assert!(!is_intel_plugin_image(
            "intel/intel-deviceplugin-operator:0.32.0"
        ));
    }

    #[test]
    fn detects_by_mounts_then_names() {
        let nvidia = daemonset(
            "nvidia-device-plugin-daemonset",
            "nvcr.io/nvidia/k8s-device-plugin:v0.17.1",
            &[("dp", DEVICE_PLUGIN_DIR)],
        );
        assert_eq!(detect_kind(&nvidia), Kind::DevicePlugin);

        // Mounts win over names.
        let dra_mounts = daemonset(
            "gpu-agent",
            "example.com/agent:1",
            &[("reg", PLUGINS_REGISTRY_DIR), ("p", PLUGINS_DIR)],
        );
        assert_eq!(detect_kind(&dra_mounts), Kind::DraDriver);
        let subdir = daemonset(
            "x",
            "example.com/agent:1",
            &[("p", "/var/lib/kubelet/plugins/gpu.example.com")],
        );
        assert_eq!(detect_kind(&subdir), Kind::DraDriver);
        let parent = daemonset("x", "example.com/agent:1", &[("k", "/var/lib/kubelet")]);
        assert_eq!(detect_kind(&parent), Kind::DevicePlugin);

        // Without mounts: names, images, labels.
        let by_name = daemonset("dra-example-driver-kubeletplugin", "example.com/a:1", &[]);
        assert_eq!(detect_kind(&by_name), Kind::DraDriver);
        let not_dra = daemonset("cassandra", "cassandra:5", &[]);
        assert_eq!(detect_kind(&not_dra), Kind::Unknown);
        let by_image = daemonset("amdgpu", "rocm/k8s-device-plugin:1.31", &[]);
        assert_eq!(detect_kind(&by_image), Kind::DevicePlugin);
        let intel = daemonset("gpu", "intel/intel-gpu-plugin:0.32.0", &[]);
        assert_eq!(detect_kind(&intel), Kind::DevicePlugin);
        let mut by_label = daemonset("agent", "example.com/a:1", &[]);
        by_label.metadata.labels = Some(
            [(
                "app.kubernetes.io/name".to_string(),
                "fpga-device-plugin".to_string(),
            )]
            .into(),
        );
        assert_eq!(detect_kind(&by_label), Kind::DevicePlugin);
        // NVIDIA's helpers ship in the plugin's image and are named after it.
        let mut mps = daemonset(
            "nvdp-nvidia-device-plugin-mps-control-daemon",
            "nvcr.io/nvidia/k8s-device-plugin:v0.20.0",
            &[("mps-root", "/run/nvidia/mps")],
        );
        pod_of(&mut mps).containers[0].command = Some(vec!["mps-control-daemon".into()]);
        assert_eq!(detect_kind(&mps), Kind::Unknown);
        let mut gfd = daemonset(
            "gpu-feature-discovery",
            "nvcr.io/nvidia/k8s-device-plugin:v0.20.0",
            &[],
        );
        let pod = pod_of(&mut gfd);
        pod.containers[0].command = Some(vec!["/usr/bin/gpu-feature-discovery".into()]);
        let mut sidecar = pod.containers[0].clone();
        sidecar.command = Some(vec!["config-manager".into()]);
        pod.containers.push(sidecar.clone());
        assert_eq!(detect_kind(&gfd), Kind::Unknown);
        // The plugin with the config-manager sidecar is still the plugin.
        let mut plugin = daemonset(
            "nvdp-nvidia-device-plugin",
            "nvcr.io/nvidia/k8s-device-plugin:v0.20.0",
            &[],
        );
        let pod = pod_of(&mut plugin);
        pod.containers[0].command = Some(vec!["nvidia-device-plugin".into()]);
        pod.containers.push(sidecar);
        assert_eq!(detect_kind(&plugin), Kind::DevicePlugin);

        let mut empty = DaemonSet::default();
        assert_eq!(detect_kind(&empty), Kind::Unknown);
        empty.metadata.name = Some("x-device-plugin".into());
        assert_eq!(detect_kind(&empty), Kind::DevicePlugin);
    }
}
