//! What a rollout stopped by `onFailure: Quarantine` or `Halt` records in
//! `status.stopped`: the revision, the failed nodes, and what a quarantine
//! took out of service.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::failure::OnFailure;

/// A rollout stopped by `onFailure: Quarantine` or `Halt`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StoppedRollout {
    /// The revision whose gate failed; nothing more changes while the
    /// DaemonSet carries it.
    pub revision: String,
    /// Quarantine or Halt.
    pub policy: OnFailure,
    /// Which gate failed where.
    #[serde(default)]
    pub message: String,
    /// The nodes whose agent failed the gate (they keep the new release).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nodes: Vec<String>,
    pub stopped_at: Time,
    /// What is out of service, for Quarantine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quarantine: Option<QuarantineRecord>,
}

/// What a quarantine took out of service; removed by a retry of the
/// revision or the SafeRollout's deletion.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct QuarantineRecord {
    /// NoSchedule, NoExecute or None.
    pub effect: String,
    /// DRA: the driver whose devices a DeviceTaintRule per node and pool
    /// taints with `saferollout.dev/quarantine`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver: Option<String>,
    /// Device plugin: the resource; each node gets the taint
    /// `quarantine.saferollout.dev/<rollout>=<resource>:<effect>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource: Option<String>,
    /// The nodes out of service (those whose agent failed, with those of an
    /// earlier quarantine still in force).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nodes: Vec<String>,
    /// DRA: the pools taken out of service.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pools: Vec<QuarantinedPool>,
    /// Failed nodes left out: the agent publishes nothing of the driver (or
    /// advertises nothing of the resource) there, so there is nothing of it
    /// to take out of service.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skipped: Vec<String>,
    /// Effect None: what the cluster says a NoExecute rule would evict,
    /// `<node>/<pool>: <message>` (counts of pods and namespaces).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub preview: Vec<String>,
}

/// One node's pool under quarantine.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct QuarantinedPool {
    pub node: String,
    pub pool: String,
}
