//! `spec.onFailure` and `spec.quarantine`: what the operator does when a gate
//! fails (Revert, Quarantine, Halt), and how a quarantine takes devices out
//! of service. Their types, their CEL rules and the messages those rules
//! give. What a stopped rollout records is in `crate::status::stopped`; the
//! rules that read the gates as well (what a quarantine may take out of
//! service) are checked client-side on the spec (`crate::spec`).

use schemars::{JsonSchema, Schema};
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::schema::{add_rules, health_resource, optional_driver_name, rule};
use crate::validate::{Errors, Validate};

/// What the operator does when a gate fails.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, Default, JsonSchema)]
pub enum OnFailure {
    /// Block the revision and bring every node back to the last good
    /// template (nodes whose agent failed first).
    #[default]
    Revert,
    /// For drivers that cannot go back: block the revision, replace nothing
    /// more, keep the new driver where it runs, and take the failed nodes'
    /// devices out of service (a DeviceTaintRule per node for a DRA driver,
    /// a node taint for a device plugin) until a retry or the SafeRollout's
    /// deletion.
    Quarantine,
    /// Block the revision and change nothing more.
    Halt,
}

impl OnFailure {
    pub fn as_str(self) -> &'static str {
        match self {
            OnFailure::Revert => "Revert",
            OnFailure::Quarantine => "Quarantine",
            OnFailure::Halt => "Halt",
        }
    }
}

/// The effect of a quarantine.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
pub enum QuarantineEffect {
    /// No new workload gets the devices (or, for a device plugin, the node).
    #[default]
    NoSchedule,
    /// Also evicts the workloads that use them. Refused unless the
    /// operator's administrator allowed it (`--quarantine-allow-no-execute`,
    /// chart value `quarantine.allowNoExecute`).
    NoExecute,
    /// DRA drivers only, a preview (KEP-5055): the DeviceTaintRule takes
    /// nothing out of service, and its status says how many pods a
    /// `NoExecute` rule would evict, which the operator reports.
    None,
}

impl QuarantineEffect {
    pub fn as_str(self) -> &'static str {
        match self {
            QuarantineEffect::NoSchedule => "NoSchedule",
            QuarantineEffect::NoExecute => "NoExecute",
            QuarantineEffect::None => "None",
        }
    }
}

/// `spec.quarantine`: how `onFailure: Quarantine` takes devices out of
/// service. What is quarantined defaults to what the gates name: the DRA
/// driver of the device gates, else the device plugin's resource of
/// `gates.deviceHealth` or the first `gates.allocatable` entry.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct QuarantineSpec {
    /// NoSchedule (default) or NoExecute.
    #[serde(default)]
    pub effect: QuarantineEffect,
    /// The DRA driver whose devices are tainted (a DeviceTaintRule per node).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "optional_driver_name")]
    pub driver: Option<String>,
    /// Or the device plugin's extended resource (a node taint).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "health_resource")]
    pub resource: Option<String>,
}

/// What `onFailure: Quarantine` takes out of service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QuarantineTarget {
    /// A DRA driver's devices: DeviceTaintRules.
    Driver(String),
    /// A device plugin's resource: a node taint.
    Resource(String),
}

/// Message of the rule that Quarantine has something to quarantine.
pub const MSG_QUARANTINE_TARGET: &str = "onFailure: Quarantine needs devices to quarantine: a DRA driver (gates.resourceSlices, claims, deviceTaints or deviceHealth.driver, or quarantine.driver) or a device plugin's resource (gates.allocatable, deviceHealth.resource or quarantine.resource)";
/// Message of the rule on `quarantine`.
pub const MSG_QUARANTINE_ONE_OF: &str = "quarantine may set driver or resource, not both";
/// Message of the rule that a quarantine's driver is the gated driver.
pub const MSG_QUARANTINE_DRIVER_SCOPE: &str = "quarantine.driver must be the DRA driver the device gates judge (a quarantine takes out of service only what this rollout's agent publishes)";
/// Message of the rule that a quarantine's resource is a gated resource.
pub const MSG_QUARANTINE_RESOURCE_SCOPE: &str = "quarantine.resource must be a resource the gates judge (gates.allocatable[].resource or gates.deviceHealth.resource): a quarantine takes out of service only what this rollout's agent advertises";
/// Message of the rule that effect None is for DRA drivers.
pub const MSG_QUARANTINE_NONE_RESOURCE: &str = "quarantine.effect None is a DeviceTaintRule preview for DRA drivers; node taints (quarantine.resource) have no None effect";

/// The rules on `spec` about the failure policy.
pub(crate) fn spec_rules(s: &mut Schema) {
    let quarantine_target = "!has(self.onFailure) || self.onFailure != 'Quarantine' \
        || (has(self.quarantine) && (has(self.quarantine.driver) || has(self.quarantine.resource))) \
        || (has(self.gates) && (has(self.gates.resourceSlices) || has(self.gates.claims) \
            || has(self.gates.deviceTaints) || has(self.gates.deviceHealth) \
            || (has(self.gates.allocatable) && size(self.gates.allocatable) > 0)))";
    // The quarantine takes out of service only what the rollout judges: the
    // driver of the device gates, or a resource the gates name.
    let gated_driver = "(has(self.gates.resourceSlices) ? self.gates.resourceSlices.driver : \
        has(self.gates.claims) ? self.gates.claims.driver : \
        has(self.gates.deviceTaints) ? self.gates.deviceTaints.driver : \
        has(self.gates.deviceHealth) && has(self.gates.deviceHealth.driver) ? self.gates.deviceHealth.driver : '')";
    let quarantine_driver = format!(
        "!has(self.quarantine) || !has(self.quarantine.driver) || !has(self.gates) \
         || {gated_driver} == '' || {gated_driver} == self.quarantine.driver"
    );
    let gated_resources = "((has(self.gates.allocatable) ? self.gates.allocatable.map(a, a.resource) : []) \
        + (has(self.gates.deviceHealth) && has(self.gates.deviceHealth.resource) ? [self.gates.deviceHealth.resource] : []))";
    let quarantine_resource = format!(
        "!has(self.quarantine) || !has(self.quarantine.resource) || !has(self.gates) \
         || size({gated_resources}) == 0 || self.quarantine.resource in {gated_resources}"
    );
    add_rules(
        s,
        json!([
            {
                "rule": quarantine_target,
                "message": MSG_QUARANTINE_TARGET,
                "fieldPath": ".onFailure",
            },
            {
                "rule": quarantine_driver,
                "message": MSG_QUARANTINE_DRIVER_SCOPE,
                "fieldPath": ".quarantine.driver",
            },
            {
                "rule": quarantine_resource,
                "message": MSG_QUARANTINE_RESOURCE_SCOPE,
                "fieldPath": ".quarantine.resource",
            },
        ]),
    );
}

pub(crate) fn quarantine_rules(s: &mut Schema) {
    add_rules(
        s,
        json!([
            rule("!has(self.driver) || !has(self.resource)", MSG_QUARANTINE_ONE_OF),
            {
                "rule": "!has(self.resource) || !has(self.effect) || self.effect != 'None'",
                "message": MSG_QUARANTINE_NONE_RESOURCE,
                "fieldPath": ".effect",
            },
        ]),
    );
}

/// The rules on `spec.quarantine` alone; those that read the gates too are
/// checked on the spec.
impl Validate for QuarantineSpec {
    fn validate(&self, path: &str, errors: &mut Errors) {
        if self.driver.is_some() && self.resource.is_some() {
            errors.push(path, MSG_QUARANTINE_ONE_OF);
        }
        if let Some(d) = &self.driver {
            errors.check_driver(&format!("{path}.driver"), d);
        }
        if let Some(r) = &self.resource {
            errors.check_extended_resource(&format!("{path}.resource"), r);
        }
        if self.resource.is_some() && self.effect == QuarantineEffect::None {
            errors.push(format!("{path}.effect"), MSG_QUARANTINE_NONE_RESOURCE);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gates::{AllocatableGate, Gates};
    use crate::spec::SafeRolloutSpec;

    fn errors(spec: &SafeRolloutSpec) -> Vec<String> {
        spec.validate().into_iter().map(|e| e.path).collect()
    }

    #[test]
    fn quarantine_needs_something_to_quarantine() {
        let mut spec = SafeRolloutSpec::for_daemonset("plugin");
        spec.on_failure = OnFailure::Quarantine;
        assert_eq!(errors(&spec), ["spec.onFailure"]);
        spec.gates = Some(Gates {
            allocatable: vec![AllocatableGate::new("example.com/gpu")],
            ..Default::default()
        });
        assert_eq!(errors(&spec), Vec::<String>::new());
        assert_eq!(
            spec.quarantine_target(),
            Some(QuarantineTarget::Resource("example.com/gpu".into()))
        );
        spec.quarantine = Some(QuarantineSpec {
            effect: QuarantineEffect::NoExecute,
            driver: Some("gpu.example.com".into()),
            resource: None,
        });
        assert_eq!(
            spec.quarantine_target(),
            Some(QuarantineTarget::Driver("gpu.example.com".into()))
        );
        assert_eq!(spec.quarantine_effect(), QuarantineEffect::NoExecute);
    }
}
