//! Everything one benchmark run measured (written as results.json; the
//! report and plots are made from it).

use std::collections::BTreeMap;

use jiff::Timestamp;
use serde::{Deserialize, Serialize};

use crate::procfs::ProcStat;
use crate::stats::Summary;

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Results {
    pub started: Option<Timestamp>,
    pub finished: Option<Timestamp>,
    pub machine: Machine,
    pub commit: String,
    pub command: String,
    /// `--agent-start-secs`: how long each new agent pod of the overhead
    /// runs took to turn Ready and advertise (0: at once).
    #[serde(default)]
    pub agent_start_secs: u64,
    pub sizes: Vec<SizeResult>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Machine {
    pub cores: usize,
    pub memory_gib: f64,
    pub cpu_model: String,
    pub kernel: String,
    /// 1-minute load average at the start and end of the run.
    pub load_start: f64,
    pub load_end: f64,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct SizeResult {
    pub nodes: usize,
    pub cluster_up_secs: f64,
    pub load_start: f64,
    pub load_end: f64,
    pub rollouts: Vec<RolloutRun>,
    pub reaction: Vec<FaultResult>,
    pub multi: Option<MultiRun>,
    /// A bare client's streaming list of every node and DaemonSet pod, in
    /// seconds, median of three (see `k8s::stream_floor`).
    #[serde(default)]
    pub stream_floor_secs: Option<f64>,
    /// Control-plane components at the end of the size's runs.
    pub components: Vec<Component>,
    /// Anything that did not go as planned.
    pub notes: Vec<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Component {
    pub name: String,
    pub end: ProcStat,
    /// CPU seconds used while the benchmark ran on this size (cluster start excluded).
    pub cpu_secs_bench: f64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RolloutRun {
    /// `native`, `saferollout`, or the control `native-labelled` (native
    /// while the benchmark writes the stage labels saferollout would).
    pub mode: String,
    /// maxUnavailable: `1` or a percentage.
    pub max_unavailable: String,
    /// The SafeRollout's stages (`100%`, or `1,10%,50%,100%`); empty for native.
    pub stages: String,
    /// From the template write to the DaemonSet status showing every pod
    /// updated and available.
    pub daemonset_complete_secs: f64,
    /// From the template write to the SafeRollout's Succeeded.
    pub succeeded_secs: Option<f64>,
    /// The gates' soak by design over the whole rollout (each stage's gate
    /// passes only after holding for it), subtracted for the ratio.
    #[serde(default)]
    pub soak_secs: f64,
    pub operator: Option<OperatorRun>,
    /// Per stage of a staged rollout: its new nodes and the operator's requests.
    pub stage_requests: Vec<StageRequests>,
    /// CPU seconds each cluster component (control plane, KWOK, the fixture)
    /// used from the template write to the end of the timed run, and that
    /// run's wall time; empty in results of builds before it was measured.
    #[serde(default)]
    pub cluster_cpu: Vec<(String, f64)>,
    #[serde(default)]
    pub timed_secs: f64,
    /// `native-labelled`: from the template write to the last label written.
    #[serde(default)]
    pub labels_secs: Option<f64>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct OperatorRun {
    pub label: String,
    pub nodes: usize,
    pub rollouts: usize,
    /// Process start to its first SafeRollout status write (server-side time of the request).
    pub startup_secs: Option<f64>,
    pub wall_secs: f64,
    pub stat: ProcStat,
    /// Every request of the process (audit log), by `verb resource`.
    pub requests: BTreeMap<String, usize>,
    /// LIST requests after its first status write.
    pub lists_after_startup: Vec<String>,
    pub reconciles: f64,
    pub reconcile_mean_ms: f64,
    pub reconcile_results: Vec<(String, f64)>,
    /// Reconcile requests by cause (`saferollout_wakes_total`); empty in
    /// results of builds before the metric.
    #[serde(default)]
    pub wakes: Vec<(String, f64)>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StageRequests {
    pub index: usize,
    pub new_nodes: usize,
    pub secs: f64,
    pub requests: BTreeMap<String, usize>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct FaultResult {
    /// crashloop, allocatable, dra-slices.
    pub fault: String,
    /// What the fault is and which gate catches it.
    pub description: String,
    /// Soak of the gate that catches it, subtracted from every time.
    pub soak_secs: f64,
    pub trials: Vec<Trial>,
    /// Failing event to the DaemonSet template restored (the revert write).
    pub revert: Option<Summary>,
    /// Failing event to the status write naming the revision blocked.
    pub status: Option<Summary>,
    /// The canary's new pod Ready (its watch event) to the failing event:
    /// how long the gate waited for evidence written after the Ready.
    #[serde(default)]
    pub evidence_wait: Option<Summary>,
    /// Why the fault was not measured.
    pub skipped: Option<String>,
    pub operator: Option<OperatorRun>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Trial {
    pub index: usize,
    /// The canary's stage passed the faulty release (the failure came at the
    /// next stage): no reaction time.
    #[serde(default)]
    pub false_pass: bool,
    pub revert_ms: Option<f64>,
    pub status_ms: Option<f64>,
    /// The new pod's Ready event to the failing event.
    #[serde(default)]
    pub evidence_wait_ms: Option<f64>,
    /// Resource versions of the failing event and of the revert write.
    pub fault_rv: Option<String>,
    pub revert_rv: Option<String>,
    pub error: Option<String>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct MultiRun {
    pub rollouts: usize,
    pub nodes_each: usize,
    /// Operator start to every SafeRollout adopted (Succeeded).
    pub adopt_secs: f64,
    /// All templates written to every SafeRollout Succeeded on the new
    /// revision or blocked (a false revert).
    pub rollout_secs: f64,
    /// The allocatable gate's soak.
    #[serde(default)]
    pub soak_secs: usize,
    /// Rollouts that blocked the healthy release, with the gate's message.
    #[serde(default)]
    pub false_reverts: Vec<String>,
    pub operator: OperatorRun,
}
