//! `spec.nodeMaintenance`: what happens to a node around its agent's
//! replacement, for driver-class agents whose restart breaks the workloads
//! using the devices (a driver reload, a container toolkit). The node is
//! cordoned, its workload pods are evicted through the Eviction API (so
//! PodDisruptionBudgets hold, and nothing is ever forced), and the node is
//! uncordoned once its new agent serves with no gate violated, or once a
//! revert brought the last good agent back. What each node is at is in
//! `status.nodeMaintenance` ([`NodeMaintenanceStatus`]).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, Time};
use schemars::{JsonSchema, Schema, SchemaGenerator};
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::duration::DurationString;
use crate::schema::{add_rules, duration};
use crate::validate::{Errors, Validate};

/// `spec.nodeMaintenance`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = maintenance_rules)]
pub struct NodeMaintenance {
    /// Cordon each node (`spec.unschedulable`) before its agent is
    /// replaced, so no new workload lands on it meanwhile; it is uncordoned
    /// once its new agent serves with no gate violated on it, or once a
    /// revert brought the last good agent back. A node someone else had
    /// cordoned is not the rollout's to take (it is skipped) and is never
    /// uncordoned by it. A cordoned node holds one slot of
    /// `maxUnavailable` from its cordon to its uncordon.
    #[serde(default = "yes")]
    pub cordon: bool,
    /// Evict the node's workload pods before its agent is replaced
    /// (needs `cordon: true`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drain: Option<Drain>,
}

fn yes() -> bool {
    true
}

/// `spec.nodeMaintenance.drain`: which pods leave a node before its agent
/// is replaced, through the Eviction API: a PodDisruptionBudget that allows
/// no disruption holds the node (the rollout says which budget and waits),
/// and no pod is ever deleted around it. DaemonSet pods, mirror (static)
/// pods and pods already finished stay; a pod no controller owns, or one
/// with an emptyDir volume (unless `deleteEmptyDirData`), holds the drain
/// with a message naming it, as `kubectl drain` refuses them without
/// `--force`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Drain {
    /// Only pods matching this selector are evicted (others stay on the
    /// node, as DaemonSet pods do). Absent: every workload pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_selector: Option<LabelSelector>,
    /// How long a node's drain may wait on evictions (refused by a budget,
    /// or pods still terminating) before the rollout reports it stuck:
    /// `DrainTimedOut` in the `Ready` condition and a Warning Event (the
    /// `SafeRolloutStuck` alert fires on its own once nothing progressed
    /// for `progressDeadline` and 5 minutes more). Nothing is forced then
    /// either: the rollout keeps asking, and an abort (or a fixed budget)
    /// ends the wait.
    #[serde(default = "default_drain_timeout")]
    #[schemars(schema_with = "drain_timeout")]
    pub timeout: DurationString,
    /// Evict pods that use emptyDir volumes too (their data is lost).
    /// Without it such a pod holds the drain.
    #[serde(default)]
    pub delete_empty_dir_data: bool,
}

impl Default for Drain {
    fn default() -> Self {
        Drain {
            pod_selector: None,
            timeout: default_drain_timeout(),
            delete_empty_dir_data: false,
        }
    }
}

fn default_drain_timeout() -> DurationString {
    "10m".into()
}

fn drain_timeout(_: &mut SchemaGenerator) -> Schema {
    duration("nodeMaintenance.drain.timeout", true)
}

/// Message of the rule that a drain cordons.
pub const MSG_DRAIN_NEEDS_CORDON: &str =
    "nodeMaintenance.drain needs cordon: true (a node being drained must not take new workloads)";
/// Message of the rule that node maintenance is for `strategy: InPlace`.
pub const MSG_MAINTENANCE_IN_PLACE: &str = "nodeMaintenance works with strategy InPlace only (a Selector handover keeps the old agent serving)";

fn maintenance_rules(s: &mut Schema) {
    add_rules(
        s,
        json!([{
            "rule": "!has(self.drain) || !has(self.cordon) || self.cordon",
            "message": MSG_DRAIN_NEEDS_CORDON,
            "fieldPath": ".cordon",
        }]),
    );
}

/// The rule on `spec` that reads the strategy too.
pub(crate) fn spec_rules(s: &mut Schema) {
    add_rules(
        s,
        json!([{
            "rule": "!has(self.nodeMaintenance) || !has(self.strategy) || self.strategy != 'Selector'",
            "message": MSG_MAINTENANCE_IN_PLACE,
            "fieldPath": ".nodeMaintenance",
        }]),
    );
}

impl Validate for NodeMaintenance {
    fn validate(&self, path: &str, errors: &mut Errors) {
        if self.drain.is_some() && !self.cordon {
            errors.push(format!("{path}.cordon"), MSG_DRAIN_NEEDS_CORDON);
        }
        if let Some(d) = &self.drain {
            errors.check_duration(
                &format!("{path}.drain.timeout"),
                "nodeMaintenance.drain.timeout",
                &d.timeout,
                true,
            );
        }
    }
}

/// Where a node is in its maintenance.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
pub enum MaintenanceStep {
    /// Cordoned; its workload pods are being evicted (or it is being
    /// cordoned now).
    #[default]
    Draining,
    /// Cordoned and drained: its agent is being replaced and judged.
    Drained,
    /// Its agent serves (the new one with no gate violated, or the last
    /// good one after a revert): it is being uncordoned.
    Uncordoning,
}

impl MaintenanceStep {
    pub fn as_str(self) -> &'static str {
        match self {
            MaintenanceStep::Draining => "Draining",
            MaintenanceStep::Drained => "Drained",
            MaintenanceStep::Uncordoning => "Uncordoning",
        }
    }
}

/// One node the rollout holds in maintenance (`status.nodeMaintenance`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeMaintenanceStatus {
    pub node: String,
    pub step: MaintenanceStep,
    /// When the rollout cordoned the node (its drain's timeout counts from here).
    pub started_at: Option<Time>,
    /// What the drain waits on: the pods left and, for a refused eviction,
    /// the budget that refused it.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_drain_without_cordon_is_refused_naming_the_field() {
        let m = NodeMaintenance {
            cordon: false,
            drain: Some(Drain::default()),
        };
        let mut errors = Errors::default();
        m.validate("spec.nodeMaintenance", &mut errors);
        let errors = errors.into_vec();
        assert_eq!(errors.len(), 1);
        assert_eq!(errors[0].path, "spec.nodeMaintenance.cordon");
        let ok: NodeMaintenance = serde_json::from_value(json!({"drain": {}})).unwrap();
        assert!(ok.cordon, "cordon defaults to true");
        assert_eq!(ok.drain.unwrap().timeout, "10m".into());
    }
}
