//! A target DaemonSet that another controller owns: the vendors' GPU
//! operators (NVIDIA's ClusterPolicy, AMD's DeviceConfig, Intel's
//! GpuDevicePlugin) build their agents' DaemonSets from their own custom
//! resource and reconcile them, so a write of saferollout to what they own
//! is undone, or undoes theirs (issue 39). What each reconciles, read from
//! their sources:
//!
//! - NVIDIA GPU Operator (`controllers/object_controls.go`): the whole
//!   object, template and update strategy, whenever its desired object's
//!   hash differs from `nvidia.com/last-applied-hash`; the strategy of
//!   every operand DaemonSet is `spec.daemonsets.updateStrategy`.
//! - AMD GPU Operator: the whole DaemonSet spec, on any generation change;
//!   `spec.devicePlugin.upgradePolicy.upgradeStrategy` (and
//!   `spec.draDriver.upgradePolicy` for its DRA driver).
//! - Intel device plugins operator: image, args, node selector and
//!   tolerations; it has no strategy field and leaves an outside `OnDelete`
//!   in place.
//! - Any other controller owner: assumed to reconcile everything.
//!
//! Owner-aware mode ([`OwnerView`]): saferollout writes nothing its owner
//! reconciles. The owner writes the template (a release is its custom
//! resource's version fields); the owner's own setting must make the
//! DaemonSet `OnDelete` (else nothing is touched, and the condition names
//! the field to set); saferollout stages the pod deletions and runs the
//! gates; a failure that would revert stops instead (Halt), naming the
//! fields to put back in the owner's resource, since writing the last good
//! template would be undone by the owner or would undo it.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use serde_json::Value;

/// Which vendor's operator owns the DaemonSet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Vendor {
    /// NVIDIA GPU Operator (`nvidia.com` ClusterPolicy).
    NvidiaGpuOperator,
    /// AMD GPU Operator (`amd.com` DeviceConfig).
    AmdGpuOperator,
    /// Intel device plugins operator (`deviceplugin.intel.com` GpuDevicePlugin).
    IntelDevicePlugins,
    /// Another controller.
    Other,
}

/// The DaemonSet's controller owner, as decisions read it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OwnerView<'a> {
    pub api_version: &'a str,
    pub kind: &'a str,
    pub name: &'a str,
}

impl<'a> OwnerView<'a> {
    /// The controller owner among `refs`, if any.
    pub fn of(refs: Option<&'a [OwnerReference]>) -> Option<Self> {
        refs?
            .iter()
            .find(|r| r.controller == Some(true))
            .map(|r| OwnerView {
                api_version: &r.api_version,
                kind: &r.kind,
                name: &r.name,
            })
    }

    pub fn vendor(&self) -> Vendor {
        let group = self.api_version.split('/').next().unwrap_or_default();
        match (group, self.kind) {
            ("nvidia.com", "ClusterPolicy") => Vendor::NvidiaGpuOperator,
            ("amd.com", "DeviceConfig") => Vendor::AmdGpuOperator,
            ("deviceplugin.intel.com", "GpuDevicePlugin") => Vendor::IntelDevicePlugins,
            _ => Vendor::Other,
        }
    }

    /// `Kind/name`, as conditions name it.
    pub fn describe(&self) -> String {
        format!("{}/{}", self.kind, self.name)
    }

    /// Whether the owner writes the DaemonSet's update strategy back (so
    /// saferollout may not set `OnDelete` itself).
    pub fn reconciles_strategy(&self) -> bool {
        self.vendor() != Vendor::IntelDevicePlugins
    }

    /// The owner's field that makes its DaemonSets `OnDelete`.
    pub fn on_delete_field(&self) -> String {
        match self.vendor() {
            Vendor::NvidiaGpuOperator => format!(
                "spec.daemonsets.updateStrategy: OnDelete in ClusterPolicy {}",
                self.name
            ),
            Vendor::AmdGpuOperator => format!(
                "spec.devicePlugin.upgradePolicy.upgradeStrategy: OnDelete (spec.draDriver.upgradePolicy for its DRA driver) in DeviceConfig {}",
                self.name
            ),
            Vendor::IntelDevicePlugins => format!(
                "nothing: GpuDevicePlugin {} leaves an outside OnDelete in place",
                self.name
            ),
            Vendor::Other => format!(
                "the update strategy of this DaemonSet to OnDelete in {}'s own configuration",
                self.describe()
            ),
        }
    }

    /// The owner's fields a release is made of: what a person puts back to
    /// revert one.
    pub fn version_fields(&self) -> String {
        match self.vendor() {
            Vendor::NvidiaGpuOperator => format!(
                "spec.devicePlugin.repository, image and version together (or the operand's own fields) in ClusterPolicy {}",
                self.name
            ),
            Vendor::AmdGpuOperator => format!(
                "spec.devicePlugin.devicePluginImage (spec.draDriver.image for its DRA driver) in DeviceConfig {}",
                self.name
            ),
            Vendor::IntelDevicePlugins => {
                format!("spec.image in GpuDevicePlugin {}", self.name)
            }
            Vendor::Other => format!("the release's fields in {}", self.describe()),
        }
    }
}

/// One field of the owner's custom resource to put back, by JSON pointer:
/// written only while it still holds `from` (a person's change since is
/// never written over).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldRevert {
    pub path: String,
    pub from: String,
    pub to: String,
}

/// A revert through the owner's custom resource (`spec.ownerRevert`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnerRevertPlan {
    /// `group/version` as the DaemonSet's ownerReference names it.
    pub api_version: String,
    pub kind: String,
    /// The resource's plural name.
    pub plural: String,
    pub name: String,
    /// The DaemonSet's namespace for a namespaced owner (DeviceConfig).
    pub namespace: Option<String>,
    pub fields: Vec<FieldRevert>,
}

impl OwnerRevertPlan {
    /// `field: from → to, …`, as messages say it.
    pub fn describe(&self) -> String {
        let fields: Vec<String> = self
            .fields
            .iter()
            .map(|f| format!("{} {:?} → {:?}", pointer_to_field(&f.path), f.from, f.to))
            .collect();
        format!("{}/{}: {}", self.kind, self.name, fields.join(", "))
    }
}

/// The GitOps tool that manages an object, read from the marks it leaves on
/// what it applies: Argo CD's tracking annotation (or its
/// `argocd.argoproj.io/instance` label), Flux's Kustomization and
/// HelmRelease labels. A revert written to such an object is undone at the
/// tool's next sync (with self-heal, at once), so it is reverted in Git.
/// (`app.kubernetes.io/instance`, Argo CD's legacy label tracking, is left
/// out: Helm sets it too.)
pub fn gitops_manager(
    labels: &std::collections::BTreeMap<String, String>,
    annotations: &std::collections::BTreeMap<String, String>,
) -> Option<String> {
    if let Some(id) = annotations.get("argocd.argoproj.io/tracking-id") {
        let app = id.split(':').next().unwrap_or(id);
        return Some(format!("Argo CD (application {app})"));
    }
    if let Some(app) = labels.get("argocd.argoproj.io/instance") {
        return Some(format!("Argo CD (application {app})"));
    }
    for (kind, prefix) in [
        ("Kustomization", "kustomize.toolkit.fluxcd.io"),
        ("HelmRelease", "helm.toolkit.fluxcd.io"),
    ] {
        if let Some(name) = labels.get(&format!("{prefix}/name")) {
            let ns = labels
                .get(&format!("{prefix}/namespace"))
                .map(|n| format!("{n}/"))
                .unwrap_or_default();
            return Some(format!("Flux ({kind} {ns}{name})"));
        }
    }
    None
}

/// `/spec/devicePlugin/version` → `spec.devicePlugin.version`.
fn pointer_to_field(pointer: &str) -> String {
    pointer.trim_start_matches('/').replace('/', ".")
}

/// Whether `spec.ownerRevert` names the DaemonSet's controller owner.
pub fn names_owner(revert: &saferollout_api::OwnerRevert, owner: &OwnerView) -> bool {
    let (group, _, kind, _) = revert.resource.parts();
    owner.api_version.split('/').next() == Some(group)
        && owner.kind == kind
        && owner.name == revert.name
}

/// The fields of the owner's custom resource that made the container image
/// `image` (what its operator builds the agent's image from).
fn image_fields(vendor: Vendor, image: &str) -> Option<Vec<(&'static str, String)>> {
    match vendor {
        // `ImagePath(repository, image, version)`: `repository/image:version`,
        // or `repository/image@version` for a digest.
        Vendor::NvidiaGpuOperator => {
            let (path, version) = match image.split_once('@') {
                Some((p, digest)) => (p, digest.to_string()),
                None => {
                    let slash = image.rfind('/').map_or(0, |i| i + 1);
                    let colon = image[slash..].rfind(':')? + slash;
                    (&image[..colon], image[colon + 1..].to_string())
                }
            };
            let (repository, name) = path.rsplit_once('/')?;
            Some(vec![
                ("/spec/devicePlugin/repository", repository.to_string()),
                ("/spec/devicePlugin/image", name.to_string()),
                ("/spec/devicePlugin/version", version),
            ])
        }
        Vendor::AmdGpuOperator => Some(vec![(
            "/spec/devicePlugin/devicePluginImage",
            image.to_string(),
        )]),
        Vendor::IntelDevicePlugins => Some(vec![("/spec/image", image.to_string())]),
        Vendor::Other => None,
    }
}

/// The container images of a pod template, by container name.
fn images(template: &Value) -> Vec<(&str, &str)> {
    template["spec"]["containers"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| Some((c["name"].as_str()?, c["image"].as_str()?)))
        .collect()
}

/// How to revert the release from the last good template `good` to the
/// failed one `failed` through the owner's version fields; `Err`: why it
/// cannot be (then the rollout halts, saying so). Only a release that is a
/// change of one container's image can be: anything else in the template
/// (args, env, an operator upgrade's changes) did not come from those
/// fields, and putting them back would not bring `good` back.
pub fn revert_plan(
    owner: &OwnerView,
    namespace: &str,
    good: &Value,
    failed: &Value,
) -> Result<OwnerRevertPlan, String> {
    let vendor = owner.vendor();
    let (good_images, failed_images) = (images(good), images(failed));
    let changed: Vec<(&str, &str, &str)> = good_images
        .iter()
        .filter_map(|(name, g)| {
            let f = failed_images.iter().find(|(n, _)| n == name)?.1;
            (f != *g).then_some((*name, *g, f))
        })
        .collect();
    let [(container, good_image, failed_image)] = changed.as_slice() else {
        return Err(format!(
            "the failed template differs from the last good one in {} container image(s), not one",
            changed.len()
        ));
    };
    // The failed template with the good image is the good template, or
    // something besides the image changed.
    let mut rebuilt = failed.clone();
    if let Some(c) = rebuilt["spec"]["containers"]
        .as_array_mut()
        .and_then(|cs| cs.iter_mut().find(|c| c["name"] == *container))
    {
        c["image"] = Value::String(good_image.to_string());
    }
    if crate::revision::content_hash(&rebuilt) != crate::revision::content_hash(good) {
        return Err(format!(
            "the template changed beyond the image of container {container:?} (args, env or an operator upgrade): the owner's version fields did not make all of it"
        ));
    }
    let (Some(from), Some(to)) = (
        image_fields(vendor, failed_image),
        image_fields(vendor, good_image),
    ) else {
        return Err(format!(
            "{} has no version fields saferollout knows to put back (image {good_image:?} in container {container:?})",
            owner.describe()
        ));
    };
    let fields = from
        .into_iter()
        .zip(to)
        .filter(|((_, f), (_, t))| f != t)
        .map(|((path, from), (_, to))| FieldRevert {
            path: path.to_string(),
            from,
            to,
        })
        .collect();
    let plural = match vendor {
        Vendor::NvidiaGpuOperator => "clusterpolicies",
        Vendor::AmdGpuOperator => "deviceconfigs",
        Vendor::IntelDevicePlugins => "gpudeviceplugins",
        Vendor::Other => unreachable!("no version fields: returned above"),
    };
    Ok(OwnerRevertPlan {
        api_version: owner.api_version.to_string(),
        kind: owner.kind.to_string(),
        plural: plural.to_string(),
        name: owner.name.to_string(),
        namespace: (vendor == Vendor::AmdGpuOperator).then(|| namespace.to_string()),
        fields,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn template(image: &str, args: &[&str]) -> Value {
        json!({"metadata": {"labels": {"app": "plugin"}},
            "spec": {"containers": [
                {"name": "plugin", "image": image, "args": args},
                {"name": "sidecar", "image": "registry.example/sidecar:1"}]}})
    }

    fn view<'a>(api_version: &'a str, kind: &'a str) -> OwnerView<'a> {
        OwnerView {
            api_version,
            kind,
            name: "owner",
        }
    }

    #[test]
    fn a_release_of_one_image_is_reverted_through_the_vendor_s_fields() {
        let nvidia = view("nvidia.com/v1", "ClusterPolicy");
        let plan = revert_plan(
            &nvidia,
            "ns",
            &template("nvcr.io/nvidia/k8s-device-plugin:v0.17.4", &[]),
            &template("nvcr.io/nvidia/k8s-device-plugin:v0.18.0", &[]),
        )
        .unwrap();
        assert_eq!(
            plan.fields,
            [FieldRevert {
                path: "/spec/devicePlugin/version".into(),
                from: "v0.18.0".into(),
                to: "v0.17.4".into(),
            }]
        );
        assert_eq!(plan.namespace, None);
        assert_eq!(
            plan.describe(),
            "ClusterPolicy/owner: spec.devicePlugin.version \"v0.18.0\" → \"v0.17.4\""
        );
        // A registry on a port, and a digest.
        let plan = revert_plan(
            &nvidia,
            "ns",
            &template("localhost:5000/nvidia/plugin:v1", &[]),
            &template("registry.example/team/plugin@sha256:abc", &[]),
        )
        .unwrap();
        let paths: Vec<(&str, &str)> = plan
            .fields
            .iter()
            .map(|f| (f.path.as_str(), f.to.as_str()))
            .collect();
        assert_eq!(
            paths,
            [
                ("/spec/devicePlugin/repository", "localhost:5000/nvidia"),
                ("/spec/devicePlugin/version", "v1"),
            ]
        );
        let amd = revert_plan(
            &view("amd.com/v1alpha1", "DeviceConfig"),
            "kube-amd-gpu",
            &template("rocm/k8s-device-plugin:1.31.0.6", &[]),
            &template("rocm/k8s-device-plugin:1.31.0.7", &[]),
        )
        .unwrap();
        assert_eq!(amd.fields[0].path, "/spec/devicePlugin/devicePluginImage");
        assert_eq!(amd.fields[0].to, "rocm/k8s-device-plugin:1.31.0.6");
        assert_eq!(amd.namespace.as_deref(), Some("kube-amd-gpu"));
        let intel = revert_plan(
            &view("deviceplugin.intel.com/v1", "GpuDevicePlugin"),
            "ns",
            &template("intel/intel-gpu-plugin:0.32.0", &[]),
            &template("intel/intel-gpu-plugin:0.32.1", &[]),
        )
        .unwrap();
        assert_eq!(intel.fields[0].path, "/spec/image");
    }

    #[test]
    fn the_gitops_tool_managing_an_owner_is_read_from_its_marks() {
        let map = |kvs: &[(&str, &str)]| {
            kvs.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<std::collections::BTreeMap<_, _>>()
        };
        let none = map(&[]);
        assert_eq!(
            gitops_manager(
                &none,
                &map(&[(
                    "argocd.argoproj.io/tracking-id",
                    "gpu-operator:nvidia.com/ClusterPolicy:/cluster-policy"
                )])
            )
            .as_deref(),
            Some("Argo CD (application gpu-operator)")
        );
        assert_eq!(
            gitops_manager(
                &map(&[
                    ("kustomize.toolkit.fluxcd.io/name", "gpu"),
                    ("kustomize.toolkit.fluxcd.io/namespace", "flux-system")
                ]),
                &none
            )
            .as_deref(),
            Some("Flux (Kustomization flux-system/gpu)")
        );
        // Helm's own label is not a GitOps tool's.
        assert_eq!(
            gitops_manager(
                &map(&[("app.kubernetes.io/instance", "gpu-operator")]),
                &none
            ),
            None
        );
    }

    #[test]
    fn a_release_beyond_the_image_or_of_an_unknown_owner_is_not_reverted() {
        let nvidia = view("nvidia.com/v1", "ClusterPolicy");
        let err = revert_plan(
            &nvidia,
            "ns",
            &template("nvcr.io/nvidia/plugin:v1", &[]),
            &template("nvcr.io/nvidia/plugin:v2", &["--fail-on-init-error=false"]),
        )
        .unwrap_err();
        assert!(err.contains("beyond the image"), "{err}");
        let err = revert_plan(
            &nvidia,
            "ns",
            &template("nvcr.io/nvidia/plugin:v1", &[]),
            &template("nvcr.io/nvidia/plugin:v1", &["-v"]),
        )
        .unwrap_err();
        assert!(err.contains("0 container image(s)"), "{err}");
        let err = revert_plan(
            &view("example.com/v1", "Agent"),
            "ns",
            &template("a/plugin:v1", &[]),
            &template("a/plugin:v2", &[]),
        )
        .unwrap_err();
        assert!(err.contains("no version fields"), "{err}");
    }

    fn owner(api_version: &str, kind: &str, controller: bool) -> OwnerReference {
        OwnerReference {
            api_version: api_version.into(),
            kind: kind.into(),
            name: "cluster-policy".into(),
            uid: "u".into(),
            controller: Some(controller),
            ..Default::default()
        }
    }

    #[test]
    fn the_vendor_is_read_from_the_controller_owner_only() {
        let refs = [
            owner("v1", "ConfigMap", false),
            owner("nvidia.com/v1", "ClusterPolicy", true),
        ];
        let o = OwnerView::of(Some(&refs)).unwrap();
        assert_eq!(o.vendor(), Vendor::NvidiaGpuOperator);
        assert!(o.reconciles_strategy());
        assert!(
            o.on_delete_field()
                .starts_with("spec.daemonsets.updateStrategy: OnDelete")
        );
        assert!(
            OwnerView::of(Some(&refs[..1])).is_none(),
            "not a controller"
        );
        let amd = [owner("amd.com/v1alpha1", "DeviceConfig", true)];
        assert_eq!(
            OwnerView::of(Some(&amd)).unwrap().vendor(),
            Vendor::AmdGpuOperator
        );
        let intel = [owner("deviceplugin.intel.com/v1", "GpuDevicePlugin", true)];
        let intel = OwnerView::of(Some(&intel)).unwrap();
        assert!(
            !intel.reconciles_strategy(),
            "Intel leaves an outside OnDelete"
        );
        assert!(intel.version_fields().starts_with("spec.image"));
        let other = [owner("example.com/v1", "Agent", true)];
        assert_eq!(OwnerView::of(Some(&other)).unwrap().vendor(), Vendor::Other);
    }
}
