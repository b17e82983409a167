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

use crate::validate::{Errors, Validate};

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

/// The longest object name (`metadata.name`).
const MAX_NAME: usize = 253;

impl Validate for OwnerRevert {
    fn validate(&self, path: &str, errors: &mut Errors) {
        if self.name.is_empty() {
            errors.push(
                format!("{path}.name"),
                "should be at least 1 chars long: the owner's name",
            );
        } else if self.name.len() > MAX_NAME {
            errors.push(
                format!("{path}.name"),
                format!("may not be longer than {MAX_NAME}"),
            );
        }
    }
}
