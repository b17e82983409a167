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

#[cfg(test)]
mod tests {
    use super::*;

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
