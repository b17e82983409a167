//! What a pass must read beyond the caches before it decides: a dry run of
//! `spec.template`, preflight, the probe pods, the agent logs the logs gate
//! scans and the Prometheus queries that are due; and, once it decided, the
//! nodes whose workload pods the device gates need watched
//! ([`pods_to_watch`], part of the [`super::Plan`]). Worked out from the
//! spec, the status, the cached DaemonSet and agent pods and what this
//! replica remembers of earlier reads, all given (nothing here reads or
//! waits); the operator reads exactly what [`Needs`] says.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use saferollout_api::{
    GateResult, LogsGate, Phase, PrometheusGate, REVISION_HASH_LABEL, SafeRolloutSpec,
    SafeRolloutStatus, StageState,
};

use crate::gates::logs::window_end;
use crate::gates::prometheus;
use crate::gates::proof::{LogObservation, LogRead};
use crate::objects::SlimPod;
use crate::views::AgentPod;

/// What a pass knows before it reads anything beyond the caches.
pub struct Known<'a> {
    pub spec: &'a SafeRolloutSpec,
    /// The status as last written: what the pass decides from.
    pub status: &'a SafeRolloutStatus,
    /// When the pass reads: the gates judge at this instant.
    pub now: Timestamp,
    /// The target DaemonSet as cached; `None`: absent.
    pub daemonset: Option<Target<'a>>,
    /// The DaemonSet's agent pods, as cached.
    pub pods: &'a [Arc<SlimPod>],
    /// Probe pods of this rollout are cached (left by an earlier stage, or
    /// of a probe gate since removed): read until they are gone.
    pub probe_pods_exist: bool,
    pub remembered: Remembered<'a>,
}

/// The target DaemonSet, as cached.
pub struct Target<'a> {
    pub uid: &'a str,
    pub generation: i64,
    /// The revision its template is (`None` until its ControllerRevision
    /// is cached).
    pub current_revision: Option<&'a str>,
}

/// What this replica remembers of earlier reads (losing it costs a re-read).
#[derive(Default)]
pub struct Remembered<'a> {
    /// The last dry run of `spec.template`: what it was of, and whether the
    /// DaemonSet already carried it.
    pub dry_run: Option<&'a (DryRunOf, bool)>,
    /// Per agent pod UID: its log as last read.
    pub logs: BTreeMap<&'a str, LogMemo<'a>>,
    /// Per prometheus gate name: how long ago its last query started.
    pub queried: BTreeMap<&'a str, Duration>,
    /// The prometheus gates (by name) whose query is still under way.
    pub querying: BTreeSet<&'a str>,
}

/// One agent log as last read.
pub struct LogMemo<'a> {
    /// What it showed, and when its container had started.
    pub observed: &'a LogObservation,
    pub since_read: Duration,
    /// Scanned with the logs gate's patterns as they are now.
    pub same_patterns: bool,
}

/// What a dry run of `spec.template` was of: its answer holds until the
/// DaemonSet or the template changes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DryRunOf {
    pub daemonset_uid: String,
    pub generation: i64,
    pub template: String,
}

/// What one pass reads beyond the caches.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Needs {
    pub template: Template,
    /// Run preflight for this revision (the DaemonSet's current one): a
    /// rollout of it is about to start (see [`crate::preflight::needed`]).
    pub preflight: Option<String>,
    /// Read this rollout's probe pods (a failed one's log tail once).
    pub probe_pods: bool,
    /// The agent pods the logs gate looks at, each read now or not; `None`:
    /// no logs gate, or no stage being judged.
    pub logs: Option<Vec<LogNeed>>,
    /// The prometheus gates' measurements; `None`: none handed in.
    pub prometheus: Option<Measurements>,
}

/// `spec.template`, and what the pass must learn of it.
#[derive(Debug, Clone, Default, PartialEq)]
pub enum Template {
    /// No `spec.template`.
    #[default]
    None,
    /// Not a pod template: reported, and the pass ends.
    Invalid(String),
    /// Its hash, and whether the DaemonSet carries it (remembered from the
    /// last dry run; `false` without a DaemonSet).
    Known { hash: String, in_place: bool },
    /// Its hash; whether the DaemonSet carries it takes a dry run, whose
    /// answer is remembered as of `of`.
    DryRun { hash: String, of: DryRunOf },
}

/// One agent pod the logs gate looks at.
#[derive(Debug, Clone, PartialEq)]
pub struct LogNeed {
    pub uid: String,
    pub pod: String,
    /// The container whose log is read.
    pub container: Option<String>,
    /// When the container (or else the pod) started; `None`: not yet.
    pub started: Option<Timestamp>,
    /// Nothing remembered holds (never read, a restarted container, other
    /// patterns): the log is scanned from its start.
    pub from_start: bool,
    /// Read now; otherwise what was last observed stands.
    pub read: bool,
    /// When the gate's window over this log ends.
    pub window_end: Option<Timestamp>,
}

/// The prometheus gates' measurements this pass.
#[derive(Debug, Clone, PartialEq)]
pub struct Measurements {
    /// Per gate name, what its measurement must be of
    /// (`<revision>/<stage>/<query>`): one of another is stale, dropped.
    pub subjects: BTreeMap<String, String>,
    /// The queries to start now (each beside the passes).
    pub queries: Vec<Query>,
}

/// One Prometheus query to start.
#[derive(Debug, Clone, PartialEq)]
pub struct Query {
    /// The gate's name in status.
    pub name: String,
    pub gate: PrometheusGate,
    /// The query, `$STAGE_NODES` filled in.
    pub query: String,
    /// The regex of the nodes the rollout holds, as filled in.
    pub stage_nodes: String,
    pub subject: String,
}

/// What the pass over `known` must read.
pub fn needs(known: &Known<'_>) -> Needs {
    let (spec, status) = (known.spec, known.status);
    // Logs and measurements matter only while a stage is being judged.
    let rolling = status.target_revision.is_some()
        && status.current_stage.is_some()
        && matches!(status.phase, Some(Phase::Progressing | Phase::Paused));
    let preflight = known
        .daemonset
        .as_ref()
        .and_then(|d| d.current_revision)
        .filter(|current| crate::preflight::needed(spec, status, current))
        .map(str::to_string);
    Needs {
        template: template(spec, known.daemonset.as_ref(), known.remembered.dry_run),
        preflight,
        probe_pods: spec.probe_gate().is_some() || known.probe_pods_exist,
        logs: match spec.logs_gate() {
            Some(gate) if rolling => Some(logs(gate, known)),
            _ => None,
        },
        prometheus: if rolling && !spec.prometheus_gates().is_empty() {
            measurements(known)
        } else {
            None
        },
    }
}

/// What the pass must learn of `spec.template`.
fn template(
    spec: &SafeRolloutSpec,
    daemonset: Option<&Target<'_>>,
    dry_run: Option<&(DryRunOf, bool)>,
) -> Template {
    match spec.typed_template() {
        Err(e) => Template::Invalid(format!("spec.template is not a valid pod template: {e}")),
        Ok(None) => Template::None,
        Ok(Some(_)) => {
            let hash = (spec.template.as_ref())
                .map(crate::revision::template_hash)
                .unwrap_or_default();
            let Some(ds) = daemonset else {
                return Template::Known {
                    hash,
                    in_place: false,
                };
            };
            let of = DryRunOf {
                daemonset_uid: ds.uid.to_string(),
                generation: ds.generation,
                template: hash.clone(),
            };
            match dry_run {
                Some((asked, in_place)) if *asked == of => Template::Known {
                    hash,
                    in_place: *in_place,
                },
                _ => Template::DryRun { hash, of },
            }
        }
    }
}

/// The logs gate's look at the new agents on the nodes the rollout holds.
fn logs(gate: &LogsGate, known: &Known<'_>) -> Vec<LogNeed> {
    let target = known.status.target_revision.as_deref().unwrap_or_default();
    let held = known.status.held_nodes();
    known
        .pods
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter(|p| {
            p.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(REVISION_HASH_LABEL))
                .is_some_and(|r| r == target)
        })
        .filter(|p| {
            p.spec
                .as_ref()
                .and_then(|s| s.node_name.as_deref())
                .is_some_and(|n| held.contains(n))
        })
        .map(|p| log_need(gate, p, &known.remembered, known.now))
        .collect()
}

/// Whether the log of `pod` is read now: not once its verdict is settled
/// (a match, or clean reads covering its whole window), otherwise after
/// each `interval`, at once after a read that stopped at its bound, and
/// once after its window closed.
fn log_need(
    gate: &LogsGate,
    pod: &SlimPod,
    remembered: &Remembered<'_>,
    now: Timestamp,
) -> LogNeed {
    let uid = pod.metadata.uid.as_deref().unwrap_or_default();
    let started = started_at(pod, gate.container.as_deref());
    // A restarted container (a new log) or other patterns: from the start.
    let known = remembered
        .logs
        .get(uid)
        .filter(|k| k.observed.started_at == started && k.same_patterns);
    let unread = LogRead::Unread;
    let read = known.map_or(&unread, |k| &k.observed.read);
    let end = started.map(|s| window_end(gate, s));
    let read_after_end = |at: &Timestamp| end.is_some_and(|e| *at >= e);
    let settled = match read {
        LogRead::Matched(_) => true,
        LogRead::Clean { at } => read_after_end(at),
        LogRead::Unreadable { clean_at, .. } => clean_at.as_ref().is_some_and(read_after_end),
        LogRead::Unread | LogRead::Behind { .. } => false,
    };
    let last_at = match read {
        LogRead::Clean { at } => Some(*at),
        _ => None,
    };
    let window_closed_since_read = end.is_some_and(|e| now >= e && last_at.is_none_or(|a| a < e));
    let behind = matches!(read, LogRead::Behind { .. });
    let interval = gate.interval.to_std().unwrap_or(Duration::from_secs(10));
    let interval_passed = known.is_none_or(|k| k.since_read >= interval);
    LogNeed {
        uid: uid.to_string(),
        pod: pod.metadata.name.clone().unwrap_or_default(),
        container: gate.container.clone().or_else(|| {
            pod.spec
                .as_ref()
                .and_then(|s| s.containers.first())
                .map(|c| c.name.clone())
        }),
        started,
        from_start: known.is_none(),
        read: started.is_some()
            && !settled
            && (interval_passed || behind || window_closed_since_read),
        window_end: end,
    }
}

/// When the agent container (or else the pod) started.
fn started_at(pod: &SlimPod, container: Option<&str>) -> Option<Timestamp> {
    let status = pod.status.as_ref()?;
    let cs = status
        .container_statuses
        .as_ref()
        .and_then(|cs| match container {
            Some(name) => cs.iter().find(|c| c.name == name),
            None => cs.first(),
        });
    cs.and_then(|c| c.state.as_ref())
        .and_then(|s| s.running.as_ref())
        .and_then(|r| r.started_at.as_ref())
        .or(status.start_time.as_ref())
        .map(|t| t.0)
}

/// The gates' results so far on the current stage.
fn current_gates(status: &SafeRolloutStatus) -> &[GateResult] {
    status
        .current_stage
        .and_then(|c| status.stage(c))
        .map(|s| s.gates.as_slice())
        .unwrap_or(&[])
}

/// The prometheus gates' measurements: `None` while the rollout holds no
/// node. A gate's query starts when it is due ([`prometheus::due`], from
/// the tally in status), its last one started at least an interval ago and
/// none is under way, and only once every node the rollout holds runs a
/// Ready new agent (a measurement is evidence about the new agents).
fn measurements(known: &Known<'_>) -> Option<Measurements> {
    let status = known.status;
    let held: Vec<&str> = status.held_nodes().into_iter().collect();
    if held.is_empty() {
        return None;
    }
    let target = status.target_revision.as_deref().unwrap_or_default();
    let stage = status.current_stage.unwrap_or_default();
    let subject = |gate: &PrometheusGate| format!("{target}/{stage}/{}", gate.query);
    let gates = known.spec.prometheus_gates();
    let results = current_gates(status);
    let due = gates.iter().filter(|gate| {
        let name = prometheus::gate_name(&gate.name);
        let previous = results.iter().find(|g| g.gate == name);
        let every = gate.interval.to_std().unwrap_or(Duration::from_secs(30));
        let recently = known
            .remembered
            .queried
            .get(name.as_str())
            .is_some_and(|since| *since < every);
        let busy = known.remembered.querying.contains(name.as_str());
        prometheus::due(gate, previous, known.now) && !recently && !busy
    });
    let due: Vec<&PrometheusGate> = due.collect();
    let serving = || {
        let ready: HashSet<&str> = (known.pods.iter())
            .filter_map(|p| AgentPod::of(p))
            .filter(|p| p.revision == target && p.is_available())
            .map(|p| p.node)
            .collect();
        held.iter().all(|n| ready.contains(n))
    };
    let stage_nodes = prometheus::stage_nodes_regex(&held);
    let queries = if !due.is_empty() && serving() {
        due.into_iter()
            .map(|gate| Query {
                name: prometheus::gate_name(&gate.name),
                gate: gate.clone(),
                query: prometheus::render_query(gate, &stage_nodes),
                stage_nodes: stage_nodes.clone(),
                subject: subject(gate),
            })
            .collect()
    } else {
        Vec::new()
    };
    let subjects = gates
        .iter()
        .map(|g| (prometheus::gate_name(&g.name), subject(g)))
        .collect();
    Some(Measurements { subjects, queries })
}

/// The nodes whose workload pods a rollout needs watched: those it holds
/// while a stage is under way, when it has a deviceHealth or claims gate.
pub fn pods_to_watch(spec: &SafeRolloutSpec, status: &SafeRolloutStatus) -> BTreeSet<String> {
    let gates = spec.gates.as_ref();
    let read = gates.is_some_and(|g| g.device_health.is_some() || g.claims.is_some());
    let under_way = status
        .current_stage
        .and_then(|i| status.stage(i))
        .is_some_and(|s| !matches!(s.state, StageState::Passed | StageState::Failed));
    if !read || !under_way {
        return BTreeSet::new();
    }
    status
        .held_nodes()
        .into_iter()
        .map(str::to_string)
        .collect()
}

#[cfg(test)]
mod tests;
