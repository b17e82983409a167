//! The SafeRollout status, written only by the operator. Every field is
//! optional. Maps are BTreeMaps so that the serialised status is deterministic;
//! the operator keeps its vectors sorted (stages by index, gate results in
//! evaluation order, blocked revisions by time).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use k8s_openapi::api::apps::v1::DaemonSetUpdateStrategy;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::schema;

pub mod baseline;
pub mod device_baseline;
pub mod stopped;

pub use baseline::ResourceCounts;
pub use device_baseline::{MAX_RECORDED, NodeDevices};
pub use stopped::{QuarantineRecord, QuarantinedPool, StoppedRollout};

/// Observed state of a SafeRollout.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SafeRolloutStatus {
    /// The metadata.generation this status reflects.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,

    /// Summary of where the rollout is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<Phase>,

    /// When `phase` last changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase_transition_time: Option<Time>,

    /// Ready, Progressing and Degraded (kstatus-compatible).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(transform = schema::list_map_by_type)]
    pub conditions: Vec<Condition>,

    /// The revision (controller-revision-hash) that ran on every node before
    /// the current rollout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stable_revision: Option<String>,

    /// The revision (controller-revision-hash) being rolled out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_revision: Option<String>,

    /// Revisions that were reverted. A blocked revision is not rolled out again
    /// until the spec changes or a person retries it (annotation
    /// saferollout.dev/retry=<revision>).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(transform = schema::list_map_by_revision)]
    pub blocked_revisions: Vec<BlockedRevision>,

    /// Index (0-based) of the stage in progress in the effective stage list.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_stage: Option<i32>,

    /// Stages of the current rollout, by index.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(transform = schema::list_map_by_index)]
    pub stages: Vec<StageStatus>,

    /// The template recorded as good before anything changed: a revert
    /// restores it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_good_template: Option<LastGoodTemplate>,

    /// The DaemonSet's update strategy before the operator set it to OnDelete;
    /// restored when the SafeRollout is deleted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub original_update_strategy: Option<DaemonSetUpdateStrategy>,

    /// The last progress of the rollout or revert under way: when it last
    /// started a stage or got one more node replaced and judged (or, when
    /// reverting, converged). The progress deadline counts from here ("no
    /// progress for `progressDeadline`"), not from the stage start, so a large
    /// stage replaced one node at a time is not reverted for being large.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<Progress>,

    /// With `spec.template`: the template the operator last wrote to the
    /// DaemonSet, so a template it wrote is never mistaken for someone else's
    /// edit even when Git moved on before the write landed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub applied_template: Option<AppliedTemplate>,

    /// Nodes outside any stage whose agent the operator replaced (to bring
    /// them back to the stable revision, or in the stages of a revision it
    /// moved on from), until their new agent serves: they count against
    /// `maxUnavailable` like a stage's nodes. Sorted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub converging_nodes: Vec<String>,

    /// Only while a SafeRolloutPolicy governs this SafeRollout: the nodes
    /// where its agent is being replaced, reverted or failing now (those
    /// whose agent this pass deletes, and those it holds whose agent does
    /// not serve or fails a gate). The policy's other rollouts read it as
    /// this one's share of `maxDisruptedNodes`, so it is written before the
    /// deletions it records. Sorted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub disrupted_nodes: Vec<String>,

    /// Nodes of the DaemonSet that the rollout of the target revision left
    /// out of its plan, and why: NotReady, a taint the agent does not
    /// tolerate, or going out of service (cordoned, an autoscaler's or
    /// Karpenter's scale-down, out-of-service, shutdown). They are not
    /// replaced or judged and do not count in `maxUnavailable`; one that
    /// recovers is planned again. At most 20, sorted by node; the
    /// `Progressing` message gives the count.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(transform = schema::list_map_by_node)]
    pub skipped_nodes: Vec<NodeNote>,

    /// The nodes this rollout holds in maintenance (`spec.nodeMaintenance`):
    /// cordoned by it, with each one's step (Draining, Drained,
    /// Uncordoning) and what its drain waits on. Sorted by node.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(transform = schema::list_map_by_node)]
    pub node_maintenance: Vec<crate::maintenance::NodeMaintenanceStatus>,

    /// Nodes the operator cannot bring to the desired revision and why (a
    /// NotReady node it refuses to empty, an agent that does not become Ready
    /// within the deadline). At most 20, sorted by node.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(transform = schema::list_map_by_node)]
    pub stuck_nodes: Vec<NodeNote>,

    /// Preflight results for the target revision.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preflight: Option<PreflightStatus>,

    /// Set when a gate failed with `onFailure: Quarantine` or `Halt`: the
    /// revision, the failed nodes and what is out of service. Nothing more
    /// changes while the DaemonSet carries that revision; a retry of it (or
    /// deleting the SafeRollout) clears it and lifts the quarantine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stopped: Option<StoppedRollout>,

    /// The last value of the retry annotation the operator acted on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_retry: Option<String>,

    /// A human-readable summary.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// Summary of where a rollout is: Pending (nothing started), Progressing,
/// Paused, Succeeded, RollingBack, Degraded (a gate failed, a revert
/// completed), Failed (the operator cannot proceed without a person).
#[derive(
    Serialize,
    Deserialize,
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Default,
    JsonSchema,
)]
pub enum Phase {
    #[default]
    Pending,
    Progressing,
    Paused,
    Succeeded,
    RollingBack,
    Degraded,
    Failed,
}

/// State of one stage.
#[derive(
    Serialize,
    Deserialize,
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Default,
    JsonSchema,
)]
pub enum StageState {
    #[default]
    Pending,
    Replacing,
    Verifying,
    Soaking,
    Paused,
    Passed,
    Failed,
}

/// Verdict of one gate.
#[derive(
    Serialize,
    Deserialize,
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Default,
    JsonSchema,
)]
pub enum GateStatus {
    #[default]
    Pending,
    Passed,
    Failed,
}

macro_rules! enum_str {
    ($ty:ident { $($variant:ident),* $(,)? }) => {
        impl $ty {
            /// The name as serialised.
            pub fn as_str(self) -> &'static str {
                match self {
                    $($ty::$variant => stringify!($variant),)*
                }
            }
        }

        impl fmt::Display for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

enum_str!(Phase {
    Pending,
    Progressing,
    Paused,
    Succeeded,
    RollingBack,
    Degraded,
    Failed
});
enum_str!(StageState {
    Pending,
    Replacing,
    Verifying,
    Soaking,
    Paused,
    Passed,
    Failed
});
enum_str!(GateStatus {
    Pending,
    Passed,
    Failed
});

/// A revision that was reverted and is not rolled out again without a retry.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BlockedRevision {
    /// The controller-revision-hash.
    pub revision: String,
    /// CamelCase reason, e.g. GateFailed.
    #[serde(default)]
    pub reason: String,
    /// Details: which gate failed where.
    #[serde(default)]
    pub message: String,
    /// When `spec.template` was the source: the hash of that template, so the
    /// same spec is not applied again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template_hash: Option<String>,
    /// When the revision was blocked.
    pub blocked_at: Time,
}

/// Progress of one stage.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = schema::legacy_baseline, transform = schema::legacy_device_baseline)]
pub struct StageStatus {
    /// Index (0-based) in the effective stage list.
    pub index: i32,
    /// Nodes this stage took (not those of earlier stages), sorted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nodes: Vec<String>,
    /// Pending, Replacing, Verifying, Soaking, Paused, Passed or Failed.
    #[serde(default)]
    pub state: StageState,
    /// When the stage started replacing pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<Time>,
    /// When every gate first passed (the soak runs from here).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verified_at: Option<Time>,
    /// When the stage passed (or failed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<Time>,
    /// The latest verdict of each gate on this stage.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gates: Vec<GateResult>,
    /// Each node's allocatable of the gated extended resources, captured
    /// before the stage touched the node; written as groups of the nodes
    /// that had the same counts.
    #[serde(
        rename = "baselineGroups",
        alias = "baseline",
        default,
        skip_serializing_if = "BTreeMap::is_empty",
        with = "baseline"
    )]
    // In memory per node; on the wire groups (`baseline`), read from
    // those or from `baseline`, the map older operators wrote.
    #[schemars(with = "Vec<baseline::BaselineGroup>", transform = schema::atomic)]
    pub baseline: BTreeMap<String, ResourceCounts>,
    /// Nodes the stage took and then let go, with why: the node left the
    /// cluster, became NotReady or unschedulable for the agent, or no longer
    /// matches the DaemonSet's node selection. Their agent pod is never
    /// deleted by the operator while they are in that state.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(transform = schema::atomic)]
    pub skipped: Vec<NodeNote>,
    /// Nodes whose agent itself failed a gate when the stage failed: a revert
    /// replaces them at once, outside the maxUnavailable budget.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failed_nodes: Vec<String>,
    /// Per node: what the gated DRA driver published there (devices,
    /// counters, capacity, taints) and the claims allocated there, captured
    /// before the stage touched the node; written as groups of the nodes
    /// that had the same shape, with claim names per node.
    #[serde(
        rename = "deviceBaselineGroups",
        alias = "deviceBaseline",
        default,
        skip_serializing_if = "BTreeMap::is_empty",
        with = "device_baseline"
    )]
    // In memory per node; on the wire groups (`device_baseline`), read
    // from those or from `deviceBaseline`, the map older operators wrote.
    #[schemars(
        with = "Vec<device_baseline::DeviceBaselineGroup>",
        transform = schema::atomic
    )]
    pub device_baseline: BTreeMap<String, NodeDevices>,
    /// Nodes of this stage whose claims probe passed (their probe is deleted).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub probed: Vec<String>,
    /// The probe gate's verdict per node this stage probed (the probe pods
    /// themselves are deleted once judged).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(transform = schema::atomic)]
    pub probes: Vec<ProbeRecord>,
}

/// A node and a reason (skipped by a stage, stuck during a revert).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeNote {
    /// The node's name.
    pub node: String,
    /// CamelCase reason, e.g. NodeNotReady, UntoleratedTaint, NodeDeleted.
    pub reason: String,
    /// Human-readable details.
    #[serde(default)]
    pub message: String,
}

/// A `spec.template` the operator wrote to the DaemonSet.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AppliedTemplate {
    /// Hash of the `spec.template` written.
    pub hash: String,
    /// The DaemonSet's `metadata.generation` in the response of the last
    /// write that returned (of this template, or of the one before while
    /// this one is being written).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<i64>,
}

/// Progress of the rollout or revert under way (see `status.progress`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Progress {
    /// What is progressing, e.g. `stage 2 of revision 6d4f9c` or `revert to
    /// revision 5997b7`: progress of another subject starts afresh.
    pub subject: String,
    /// The most nodes done so far for that subject (replaced and judged, or
    /// converged).
    pub nodes: i32,
    /// When `nodes` last grew, or the subject started.
    pub last_progress_time: Time,
}

/// The verdict of one gate on one stage.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GateResult {
    /// Gate name: podsReady, allocatable/<resource>, ...
    pub gate: String,
    /// Pending (not decided yet), Passed or Failed.
    #[serde(default)]
    pub status: GateStatus,
    /// CamelCase reason, e.g. CrashLoopBackOff, BelowMinimum.
    #[serde(default)]
    pub reason: String,
    /// Human-readable details.
    #[serde(default)]
    pub message: String,
    /// The node the verdict is about, when it is about one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// What was observed, e.g. "0".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed: Option<String>,
    /// What was expected, e.g. ">= 8".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected: Option<String>,
    /// Since when the gate has observed what `reason` says (soak times count
    /// from here).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<Time>,
    /// Gates that measure repeatedly (prometheus): the tally so far.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub measurements: Option<Measurements>,
}

/// The probe gate's record of one node (in `stages[].probes`): the verdict
/// stays after the probe pod is deleted.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProbeRecord {
    /// The node probed.
    pub node: String,
    /// The probe pod's name.
    pub pod: String,
    /// Pending (running), Passed or Failed.
    #[serde(default)]
    pub status: GateStatus,
    /// CamelCase reason, e.g. Succeeded, Unschedulable, ExitCode, Timeout.
    #[serde(default)]
    pub reason: String,
    /// What the probe showed: the scheduler's message, the exit code and
    /// the last lines of its log (truncated, secrets masked).
    #[serde(default)]
    pub message: String,
    /// When the probe was asked for (its timeout counts from here).
    pub since: Time,
}

/// The measurements a prometheus gate took on a stage (in its GateResult).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Measurements {
    pub passed: i32,
    pub failed: i32,
    pub inconclusive: i32,
    /// When the last measurement was taken (the next is due an interval later).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last: Option<Time>,
}

/// The template recorded as good before a rollout changed anything.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LastGoodTemplate {
    /// Name of the ControllerRevision holding the template.
    pub controller_revision: String,
    /// Its controller-revision-hash.
    pub revision: String,
    /// Content hash (`sha256:<hex>` of the template's canonical JSON) of the
    /// template the operator wrote to that ControllerRevision. The backup is
    /// used (a revert writes it) only while its content hashes to this; a
    /// ControllerRevision under that name with other content stops the
    /// rollout (Ready=False, reason BackupMismatch). Absent in statuses
    /// written by operators before it existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template_hash: Option<String>,
}

impl SafeRolloutStatus {
    /// The condition of type `type_`, if present.
    pub fn condition(&self, type_: &str) -> Option<&Condition> {
        self.conditions.iter().find(|c| c.type_ == type_)
    }

    /// Whether `revision` is blocked.
    pub fn is_blocked(&self, revision: &str) -> bool {
        self.blocked_revisions
            .iter()
            .any(|b| b.revision == revision)
    }

    /// The status of stage `index`, if recorded.
    pub fn stage(&self, index: i32) -> Option<&StageStatus> {
        self.stages.iter().find(|s| s.index == index)
    }

    /// The nodes the rollout holds: those of its current stage and the
    /// stages before it (none while no stage is current).
    pub fn held_nodes(&self) -> BTreeSet<&str> {
        self.held_stages()
            .flat_map(|s| s.nodes.iter().map(String::as_str))
            .collect()
    }

    /// Whether the rollout holds `node` ([`Self::held_nodes`] without
    /// building the set: asked once per event of a cache).
    pub fn holds_node(&self, node: &str) -> bool {
        self.held_stages()
            .any(|s| s.nodes.iter().any(|n| n == node))
    }

    /// The current stage and the stages before it.
    fn held_stages(&self) -> impl Iterator<Item = &StageStatus> {
        let current = self.current_stage;
        self.stages
            .iter()
            .filter(move |s| current.is_some_and(|c| s.index <= c))
    }
}

/// Preflight results (the guides' checklists) for one revision.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PreflightStatus {
    /// The revision checked.
    pub revision: String,
    /// No error finding.
    pub passed: bool,
    pub errors: i32,
    pub warnings: i32,
    /// The findings, errors first, at most 20.
    #[serde(default)]
    pub findings: Vec<PreflightFinding>,
}

/// One preflight finding.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PreflightFinding {
    /// Error, Warning or Info.
    pub severity: String,
    /// Stable code, e.g. SR101.
    pub code: String,
    pub object: String,
    pub message: String,
    pub fix: String,
}
