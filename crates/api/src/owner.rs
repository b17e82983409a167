//! `spec.ownerRevert`: a target DaemonSet that a vendor's GPU operator owns
//! (issue 39's owner-aware mode) is reverted through the owner's custom
//! resource: its version fields put back to what made the last good
//! template, for the owner to write that template again. saferollout never
//! writes the DaemonSet's template there; without this field a failure that
//! would revert halts, naming the fields to put back.
//!
//! The field names the owner so that the admission policy can ask whether
//! the SafeRollout's author may `patch` it (a SafeRollout grants its author
//! nothing they do not already hold), and the operator checks it is the
//! DaemonSet's controller owner.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The owners a revert can go through: `<plural>.<group>`.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum OwnerResource {
    /// NVIDIA GPU Operator's ClusterPolicy (cluster-scoped): its
    /// `spec.devicePlugin.{repository,image,version}`.
    #[serde(rename = "clusterpolicies.nvidia.com")]
    ClusterPolicies,
    /// AMD GPU Operator's DeviceConfig (in the DaemonSet's namespace): its
    /// `spec.devicePlugin.devicePluginImage`.
    #[serde(rename = "deviceconfigs.amd.com")]
    DeviceConfigs,
    /// Intel device plugins operator's GpuDevicePlugin (cluster-scoped): its
    /// `spec.image`.
    #[serde(rename = "gpudeviceplugins.deviceplugin.intel.com")]
    GpuDevicePlugins,
}

impl OwnerResource {
    /// (API group, plural, kind, namespaced).
    pub fn parts(self) -> (&'static str, &'static str, &'static str, bool) {
        match self {
            OwnerResource::ClusterPolicies => {
                ("nvidia.com", "clusterpolicies", "ClusterPolicy", false)
            }
            OwnerResource::DeviceConfigs => ("amd.com", "deviceconfigs", "DeviceConfig", true),
            OwnerResource::GpuDevicePlugins => (
                "deviceplugin.intel.com",
                "gpudeviceplugins",
                "GpuDevicePlugin",
                false,
            ),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            OwnerResource::ClusterPolicies => "clusterpolicies.nvidia.com",
            OwnerResource::DeviceConfigs => "deviceconfigs.amd.com",
            OwnerResource::GpuDevicePlugins => "gpudeviceplugins.deviceplugin.intel.com",
        }
    }
}

/// `spec.ownerRevert`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct OwnerRevert {
    /// The owner's resource: `clusterpolicies.nvidia.com`,
    /// `deviceconfigs.amd.com` or `gpudeviceplugins.deviceplugin.intel.com`.
    pub resource: OwnerResource,
    /// The owner's name: the DaemonSet's controller ownerReference (a
    /// DeviceConfig is in the DaemonSet's namespace).
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
}
