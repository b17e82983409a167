//! `status NAME [-w] [-o table|json|yaml]`: where a rollout is.

use std::pin::pin;

use futures::StreamExt;
use jiff::Timestamp;
use kube::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::watch_object;
use saferollout_api::{SafeRollout, SafeRolloutSpec, SafeRolloutStatus};
use serde::Serialize;

use super::actions::approve_index;
use super::{get_rollout, int_or_string, rollout_ref};
use crate::cli::StatusArgs;
use crate::client::Kube;
use crate::error::{CliError, error_chain};
use crate::output::{OutputFormat, age, emit, serialize, timestamp};
use crate::table::{Table, list, or_dash};

/// How many node names a stage row shows before `(+N more)`.
const NODES_SHOWN: usize = 6;

/// `k/N`: the current stage, 1-based, of the effective stages (`-/N` before
/// the first stage).
pub fn stage_progress(spec: &SafeRolloutSpec, status: Option<&SafeRolloutStatus>) -> String {
    let total = spec.effective_stages().len();
    match status.and_then(|s| s.current_stage) {
        Some(i) => format!("{}/{total}", i + 1),
        None => format!("-/{total}"),
    }
}

/// What a watch compares to decide whether to print again: the spec, the
/// status and the annotations (resourceVersion and managedFields churn is not
/// a change worth a screen).
pub fn watch_key(
    sr: &SafeRollout,
) -> (
    SafeRolloutSpec,
    Option<SafeRolloutStatus>,
    Option<std::collections::BTreeMap<String, String>>,
) {
    (
        sr.spec.clone(),
        sr.status.clone(),
        sr.metadata.annotations.clone(),
    )
}

/// `status -o json|yaml`: the shape scripts read (documented in docs/cli.md).
/// Field names and meanings are stable; new fields may be added. Stage
/// numbers are 1-based, as in the table; times are RFC 3339 in UTC.
/// One node in maintenance.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MaintenanceReport {
    pub node: String,
    pub step: String,
    pub since: Option<String>,
    pub message: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StatusReport {
    pub namespace: String,
    pub name: String,
    /// The target DaemonSet (same namespace).
    pub daemon_set: String,
    pub generation: i64,
    /// The generation the operator last acted on (`null` before it did).
    pub observed_generation: Option<i64>,
    /// Pending, Progressing, Paused, Succeeded, RollingBack, Degraded or
    /// Failed; `null` before the operator reconciled the object.
    pub phase: Option<String>,
    /// `spec.paused`.
    pub paused: bool,
    pub message: Option<String>,
    /// Current stage, 1-based (`null` when none).
    pub current_stage: Option<i32>,
    /// Number of stages (the defaults when `spec.stages` is empty).
    pub stage_count: usize,
    /// The 1-based stage waiting for `kubectl saferollout approve` (`null` when none).
    pub awaiting_approval: Option<i32>,
    pub target_revision: Option<String>,
    pub stable_revision: Option<String>,
    pub last_good: Option<LastGoodReport>,
    pub stages: Vec<StageReport>,
    pub gates: Vec<GateReport>,
    /// The probe gate's verdict per probed node.
    pub probes: Vec<ProbeReport>,
    pub conditions: Vec<ConditionReport>,
    pub blocked_revisions: Vec<BlockedReport>,
    /// The rollout or revert under way: what, how many nodes done, since when.
    pub progress: Option<ProgressReport>,
    /// Nodes the operator cannot bring to the desired revision, with why.
    pub stuck_nodes: Vec<NodeReport>,
    /// Nodes the rollout leaves out while NotReady or going out of service.
    pub skipped_nodes: Vec<NodeReport>,
    /// Under a SafeRolloutPolicy: where its agent is being replaced,
    /// reverted or failing now (its share of the policy's budget).
    pub disrupted_nodes: Vec<String>,
    /// `spec.nodeMaintenance`: the nodes the rollout cordoned, with their
    /// step (Draining, Drained, Uncordoning) and what a drain waits on.
    pub node_maintenance: Vec<MaintenanceReport>,
    /// `spec.onFailure`: Revert, Quarantine or Halt.
    pub on_failure: String,
    /// Set when a gate failure stopped the rollout (Quarantine or Halt).
    pub stopped: Option<StoppedReport>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StoppedReport {
    pub revision: String,
    /// Quarantine or Halt.
    pub policy: String,
    pub message: String,
    /// The nodes whose agent failed (they keep the new release).
    pub nodes: Vec<String>,
    pub stopped_at: String,
    /// What is out of service (`null` for Halt).
    pub quarantine: Option<QuarantineReport>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct QuarantineReport {
    /// NoSchedule, NoExecute or None (a preview).
    pub effect: String,
    /// DRA: the driver whose devices DeviceTaintRules take out of service.
    pub driver: Option<String>,
    /// Device plugin: the resource a node taint stands for.
    pub resource: Option<String>,
    pub nodes: Vec<String>,
    /// DRA: `<node>/<pool>` of each DeviceTaintRule.
    pub pools: Vec<String>,
    /// Failed nodes where the agent publishes nothing to quarantine.
    pub skipped: Vec<String>,
    /// Effect None: what the cluster says NoExecute would evict.
    pub preview: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ProbeReport {
    /// 1-based stage the probe belongs to.
    pub stage: i32,
    pub node: String,
    pub pod: String,
    /// Pending, Passed or Failed.
    pub status: String,
    pub reason: String,
    pub message: String,
    pub since: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LastGoodReport {
    pub revision: String,
    pub controller_revision: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StageReport {
    /// 1-based.
    pub stage: usize,
    /// Cumulative size as written in the spec: a node count or a percentage.
    pub size: String,
    /// The stage waits for approval after passing (`pause: true`).
    pub approval: bool,
    /// Planned, Replacing, Verifying, Passed, Paused, Failed, ...; `null` before it started.
    pub state: Option<String>,
    pub nodes: Vec<String>,
    pub started_at: Option<String>,
    pub verified_at: Option<String>,
    /// Nodes the stage took and let go (NotReady, tainted, deleted, ...), with why.
    pub skipped: Vec<NodeReport>,
    /// Nodes whose agent failed a gate when the stage failed.
    pub failed_nodes: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GateReport {
    /// 1-based stage the result belongs to.
    pub stage: i32,
    pub gate: String,
    /// Pending, Passed or Failed.
    pub status: String,
    pub reason: String,
    pub message: String,
    pub node: Option<String>,
    pub observed: Option<String>,
    pub expected: Option<String>,
    pub since: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ConditionReport {
    #[serde(rename = "type")]
    pub type_: String,
    pub status: String,
    pub reason: String,
    pub message: String,
    pub last_transition_time: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ProgressReport {
    pub subject: String,
    pub nodes: i32,
    pub last_progress_time: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeReport {
    pub node: String,
    pub reason: String,
    pub message: String,
}

fn node_reports(notes: &[saferollout_api::NodeNote]) -> Vec<NodeReport> {
    notes
        .iter()
        .map(|n| NodeReport {
            node: n.node.clone(),
            reason: n.reason.clone(),
            message: n.message.clone(),
        })
        .collect()
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BlockedReport {
    pub revision: String,
    pub reason: String,
    pub message: String,
    pub blocked_at: String,
}

fn time(t: Option<&k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>) -> Option<String> {
    t.map(|t| timestamp(t.0))
}

/// The report of `status -o json|yaml`.
pub fn report(sr: &SafeRollout) -> StatusReport {
    let empty = SafeRolloutStatus::default();
    let st = sr.status.as_ref().unwrap_or(&empty);
    let spec = &sr.spec;
    let stages = spec.effective_stages();
    StatusReport {
        namespace: sr.metadata.namespace.clone().unwrap_or_default(),
        name: sr.metadata.name.clone().unwrap_or_default(),
        daemon_set: spec.target_ref.name.clone(),
        generation: sr.metadata.generation.unwrap_or(0),
        observed_generation: st.observed_generation,
        phase: st.phase.map(|p| p.to_string()),
        paused: spec.paused,
        message: st.message.clone(),
        current_stage: st.current_stage.map(|i| i + 1),
        stage_count: stages.len(),
        awaiting_approval: approve_index(st).ok().map(|i| i + 1),
        target_revision: st.target_revision.clone(),
        stable_revision: st.stable_revision.clone(),
        last_good: st.last_good_template.as_ref().map(|lg| LastGoodReport {
            revision: lg.revision.clone(),
            controller_revision: lg.controller_revision.clone(),
        }),
        stages: stages
            .iter()
            .enumerate()
            .map(|(i, stage_spec)| {
                let recorded = st.stage(i as i32);
                StageReport {
                    stage: i + 1,
                    size: int_or_string(&stage_spec.nodes),
                    approval: stage_spec.pause,
                    state: recorded.map(|r| r.state.to_string()),
                    nodes: recorded.map(|r| r.nodes.clone()).unwrap_or_default(),
                    started_at: time(recorded.and_then(|r| r.started_at.as_ref())),
                    verified_at: time(recorded.and_then(|r| r.verified_at.as_ref())),
                    skipped: recorded
                        .map(|r| node_reports(&r.skipped))
                        .unwrap_or_default(),
                    failed_nodes: recorded.map(|r| r.failed_nodes.clone()).unwrap_or_default(),
                }
            })
            .collect(),
        gates: st
            .stages
            .iter()
            .flat_map(|s| {
                s.gates.iter().map(move |g| GateReport {
                    stage: s.index + 1,
                    gate: g.gate.clone(),
                    status: g.status.to_string(),
                    reason: g.reason.clone(),
                    message: g.message.clone(),
                    node: g.node.clone(),
                    observed: g.observed.clone(),
                    expected: g.expected.clone(),
                    since: time(g.since.as_ref()),
                })
            })
            .collect(),
        probes: st
            .stages
            .iter()
            .flat_map(|s| {
                s.probes.iter().map(move |p| ProbeReport {
                    stage: s.index + 1,
                    node: p.node.clone(),
                    pod: p.pod.clone(),
                    status: p.status.to_string(),
                    reason: p.reason.clone(),
                    message: p.message.clone(),
                    since: timestamp(p.since.0),
                })
            })
            .collect(),
        conditions: st
            .conditions
            .iter()
            .map(|c| ConditionReport {
                type_: c.type_.clone(),
                status: c.status.clone(),
                reason: c.reason.clone(),
                message: c.message.clone(),
                last_transition_time: timestamp(c.last_transition_time.0),
            })
            .collect(),
        blocked_revisions: st
            .blocked_revisions
            .iter()
            .map(|b| BlockedReport {
                revision: b.revision.clone(),
                reason: b.reason.clone(),
                message: b.message.clone(),
                blocked_at: timestamp(b.blocked_at.0),
            })
            .collect(),
        progress: st.progress.as_ref().map(|p| ProgressReport {
            subject: p.subject.clone(),
            nodes: p.nodes,
            last_progress_time: timestamp(p.last_progress_time.0),
        }),
        stuck_nodes: node_reports(&st.stuck_nodes),
        skipped_nodes: node_reports(&st.skipped_nodes),
        disrupted_nodes: st.disrupted_nodes.clone(),
        node_maintenance: st
            .node_maintenance
            .iter()
            .map(|m| MaintenanceReport {
                node: m.node.clone(),
                step: m.step.as_str().to_string(),
                since: m.started_at.as_ref().map(|t| timestamp(t.0)),
                message: m.message.clone(),
            })
            .collect(),
        on_failure: spec.on_failure.as_str().to_string(),
        stopped: st.stopped.as_ref().map(|s| StoppedReport {
            revision: s.revision.clone(),
            policy: s.policy.as_str().to_string(),
            message: s.message.clone(),
            nodes: s.nodes.clone(),
            stopped_at: timestamp(s.stopped_at.0),
            quarantine: s.quarantine.as_ref().map(|q| QuarantineReport {
                effect: q.effect.clone(),
                driver: q.driver.clone(),
                resource: q.resource.clone(),
                nodes: q.nodes.clone(),
                pools: q
                    .pools
                    .iter()
                    .map(|p| format!("{}/{}", p.node, p.pool))
                    .collect(),
                skipped: q.skipped.clone(),
                preview: q.preview.clone(),
            }),
        }),
    }
}

/// The text `status` prints for one state of the object: the table, or one
/// JSON/YAML document (a YAML document starts with `---` when watching, so
/// a stream of them parses).
pub fn format_status(
    sr: &SafeRollout,
    output: OutputFormat,
    now: Timestamp,
    watching: bool,
) -> Result<String, CliError> {
    match serialize(&report(sr), output)? {
        None => Ok(render(sr, now)),
        Some(doc) if watching && output == OutputFormat::Yaml => Ok(format!("---\n{doc}")),
        Some(doc) => Ok(doc),
    }
}

/// The full status report.
pub fn render(sr: &SafeRollout, now: Timestamp) -> String {
    let empty = SafeRolloutStatus::default();
    let st = sr.status.as_ref().unwrap_or(&empty);
    let spec = &sr.spec;
    let stages = spec.effective_stages();
    let mut out = String::new();

    let mut head = Table::new(&["", ""]);
    head.row(["Name:".to_string(), rollout_ref(sr)]);
    head.row(["DaemonSet:".to_string(), spec.target_ref.name.clone()]);
    let mut phase = st
        .phase
        .map(|p| p.to_string())
        .unwrap_or_else(|| "- (not reconciled yet)".into());
    if spec.paused {
        phase.push_str(" (spec.paused: true)");
    }
    head.row(["Phase:".to_string(), phase]);
    let mut stage = stage_progress(spec, Some(st));
    if let Some(i) = st.current_stage {
        stage.push_str(&format!(" (index {i})"));
    }
    head.row(["Stage:".to_string(), stage]);
    head.row([
        "Target revision:".to_string(),
        or_dash(st.target_revision.as_deref()),
    ]);
    head.row([
        "Stable revision:".to_string(),
        or_dash(st.stable_revision.as_deref()),
    ]);
    if let Some(lg) = &st.last_good_template {
        head.row([
            "Last good:".to_string(),
            format!(
                "{} (ControllerRevision {})",
                lg.revision, lg.controller_revision
            ),
        ]);
    }
    let generation = sr.metadata.generation.unwrap_or(0);
    let observed = st
        .observed_generation
        .map_or("-".to_string(), |g| g.to_string());
    head.row([
        "Generation:".to_string(),
        format!("{generation} (observed {observed})"),
    ]);
    head.row([
        "On failure:".to_string(),
        match spec.on_failure {
            saferollout_api::OnFailure::Quarantine => {
                format!("Quarantine ({})", spec.quarantine_effect().as_str())
            }
            other => other.as_str().to_string(),
        },
    ]);
    if let Some(m) = &st.message {
        head.row(["Message:".to_string(), m.clone()]);
    }
    if let Some(p) = &st.progress {
        head.row([
            "Progress:".to_string(),
            format!(
                "{}: {} node(s) done, last progress {} ago (deadline {} without progress)",
                p.subject,
                p.nodes,
                age(Some(p.last_progress_time.0), now),
                spec.progress_deadline
            ),
        ]);
    }
    if let Ok(index) = approve_index(st) {
        head.row([
            "Waiting:".to_string(),
            format!(
                "stage {}/{} waits for approval: kubectl saferollout approve {}",
                index + 1,
                stages.len(),
                sr.metadata.name.as_deref().unwrap_or_default()
            ),
        ]);
    }
    // The header row of this two-column table is empty: drop that line.
    let rendered = head.render("");
    out.extend(rendered.lines().skip(1).map(|l| format!("{l}\n")));

    out.push_str("\nStages:\n");
    let mut t = Table::new(&["STAGE", "SIZE", "STATE", "NODES", "STARTED", "VERIFIED"]);
    for (i, stage_spec) in stages.iter().enumerate() {
        let recorded = st.stage(i as i32);
        let mut size = int_or_string(&stage_spec.nodes);
        if stage_spec.pause {
            size.push_str(" (approval)");
        }
        let current = st.current_stage == Some(i as i32);
        let state = match recorded {
            Some(r) => r.state.to_string(),
            None => "-".into(),
        };
        let nodes = match recorded {
            Some(r) if r.nodes.is_empty() => "0".to_string(),
            Some(r) => format!("{}: {}", r.nodes.len(), list(&r.nodes, NODES_SHOWN)),
            None => "-".into(),
        };
        t.row([
            format!(
                "{}{}/{}",
                if current { "*" } else { "" },
                i + 1,
                stages.len()
            ),
            size,
            state,
            nodes,
            age(
                recorded.and_then(|r| r.started_at.as_ref()).map(|t| t.0),
                now,
            ),
            age(
                recorded.and_then(|r| r.verified_at.as_ref()).map(|t| t.0),
                now,
            ),
        ]);
    }
    out.push_str(&t.render("  "));

    let mut gates = Table::new(&[
        "STAGE", "GATE", "STATUS", "REASON", "NODE", "OBSERVED", "EXPECTED", "SINCE", "MESSAGE",
    ]);
    for s in &st.stages {
        for g in &s.gates {
            gates.row([
                format!("{}/{}", s.index + 1, stages.len()),
                g.gate.clone(),
                g.status.to_string(),
                or_dash(Some(&g.reason)),
                or_dash(g.node.as_deref()),
                or_dash(g.observed.as_deref()),
                or_dash(g.expected.as_deref()),
                age(g.since.as_ref().map(|t| t.0), now),
                g.message.clone(),
            ]);
        }
    }
    if !gates.is_empty() {
        out.push_str("\nGates:\n");
        out.push_str(&gates.render("  "));
    }

    let mut attention = Table::new(&["NODE", "STAGE", "REASON", "MESSAGE"]);
    for n in &st.stuck_nodes {
        attention.row([
            n.node.clone(),
            "-".into(),
            n.reason.clone(),
            n.message.clone(),
        ]);
    }
    for n in &st.skipped_nodes {
        attention.row([
            n.node.clone(),
            "- (skipped)".into(),
            n.reason.clone(),
            n.message.clone(),
        ]);
    }
    for m in &st.node_maintenance {
        attention.row([
            m.node.clone(),
            "- (maintenance)".into(),
            m.step.as_str().to_string(),
            m.message.clone(),
        ]);
    }
    for s in &st.stages {
        for n in &s.skipped {
            let stage = format!("{}/{} (let go)", s.index + 1, stages.len());
            attention.row([n.node.clone(), stage, n.reason.clone(), n.message.clone()]);
        }
        for n in &s.failed_nodes {
            let stage = format!("{}/{}", s.index + 1, stages.len());
            attention.row([
                n.clone(),
                stage,
                "AgentFailedGate".into(),
                "reverted first, outside maxUnavailable".into(),
            ]);
        }
    }
    if !attention.is_empty() {
        out.push_str("\nNodes needing attention:\n");
        out.push_str(&attention.render("  "));
    }

    let mut probes = Table::new(&[
        "STAGE", "NODE", "POD", "STATUS", "REASON", "SINCE", "MESSAGE",
    ]);
    for s in &st.stages {
        for p in &s.probes {
            probes.row([
                format!("{}/{}", s.index + 1, stages.len()),
                p.node.clone(),
                p.pod.clone(),
                p.status.to_string(),
                or_dash(Some(&p.reason)),
                age(Some(p.since.0), now),
                p.message.clone(),
            ]);
        }
    }
    if !probes.is_empty() {
        out.push_str("\nProbes:\n");
        out.push_str(&probes.render("  "));
    }

    out.push_str("\nConditions:\n");
    if st.conditions.is_empty() {
        out.push_str("  <none>\n");
    } else {
        let mut t = Table::new(&["TYPE", "STATUS", "REASON", "AGE", "MESSAGE"]);
        for c in &st.conditions {
            t.row([
                c.type_.clone(),
                c.status.clone(),
                c.reason.clone(),
                age(Some(c.last_transition_time.0), now),
                c.message.clone(),
            ]);
        }
        out.push_str(&t.render("  "));
    }

    if let Some(s) = &st.stopped {
        out.push_str(&format!(
            "\nStopped: revision {} by onFailure: {} ({} ago) on node(s) {}\n",
            s.revision,
            s.policy.as_str(),
            age(Some(s.stopped_at.0), now),
            list(&s.nodes, NODES_SHOWN)
        ));
        if let Some(q) = &s.quarantine {
            let mut t = Table::new(&["NODE", "QUARANTINE", "EFFECT"]);
            match (&q.driver, &q.resource) {
                (Some(d), _) => {
                    for p in &q.pools {
                        t.row([
                            p.node.clone(),
                            format!("DeviceTaintRule: driver {d}, pool {}", p.pool),
                            q.effect.clone(),
                        ]);
                    }
                }
                (_, Some(r)) => {
                    for n in &q.nodes {
                        t.row([n.clone(), format!("node taint for {r}"), q.effect.clone()]);
                    }
                }
                _ => {}
            }
            out.push_str(&t.render("  "));
            if !q.skipped.is_empty() {
                out.push_str(&format!(
                    "  not quarantined (the agent publishes nothing of it there): {}\n",
                    list(&q.skipped, NODES_SHOWN)
                ));
            }
            for p in &q.preview {
                out.push_str(&format!("  preview, if the effect was NoExecute: {p}\n"));
            }
            out.push_str("  (kubectl saferollout retry lifts it)\n");
        }
    }

    out.push_str("\nBlocked revisions:\n");
    if st.blocked_revisions.is_empty() {
        out.push_str("  <none>\n");
    } else {
        let mut t = Table::new(&["REVISION", "REASON", "BLOCKED", "MESSAGE"]);
        for b in &st.blocked_revisions {
            t.row([
                b.revision.clone(),
                or_dash(Some(&b.reason)),
                format!("{} ago", age(Some(b.blocked_at.0), now)),
                b.message.clone(),
            ]);
        }
        out.push_str(&t.render("  "));
    }
    out
}

/// Runs `status`; with `--watch`, prints again on every change until Ctrl-C
/// or until the object is deleted.
pub async fn run(kube: &Kube, args: &StatusArgs) -> Result<u8, CliError> {
    let sr = get_rollout(kube, &args.name).await?;
    emit(&format_status(
        &sr,
        args.output,
        Timestamp::now(),
        args.watch,
    )?);
    if !args.watch {
        return Ok(0);
    }
    let api: Api<SafeRollout> = Api::namespaced(kube.client.clone(), &kube.namespace);
    let what = format!("SafeRollout {}/{}", kube.namespace, args.name);
    let mut last = watch_key(&sr);
    let mut failing = false;
    let mut events = pin!(watch_object(api, &args.name).default_backoff());
    loop {
        let next = tokio::select! {
            _ = tokio::signal::ctrl_c() => return Ok(0),
            next = events.next() => next,
        };
        match next {
            None => return Ok(0),
            Some(Ok(Some(sr))) => {
                failing = false;
                let key = watch_key(&sr);
                if key != last {
                    last = key;
                    let now = Timestamp::now();
                    let text = format_status(&sr, args.output, now, true)?;
                    if args.output == OutputFormat::Table {
                        emit(&format!("\n--- {} ---\n{text}", timestamp(now)));
                    } else {
                        emit(&text);
                    }
                }
            }
            Some(Ok(None)) => {
                // Scripts reading JSON/YAML see the stream end; people see why.
                if args.output == OutputFormat::Table {
                    emit(&format!("\n{what} was deleted\n"));
                } else {
                    eprintln!("{what} was deleted");
                }
                return Ok(0);
            }
            Some(Err(e)) => {
                if !failing {
                    eprintln!("warning: watching {what}: {} (retrying)", error_chain(&e));
                }
                failing = true;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
    use saferollout_api::{
        BlockedRevision, GateResult, GateStatus, Phase, StageState, StageStatus,
    };

    use super::*;

    fn ts(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    fn rollout() -> SafeRollout {
        let mut sr = SafeRollout::new("plugin", SafeRolloutSpec::for_daemonset("nvidia-plugin"));
        sr.metadata.namespace = Some("gpu".into());
        sr.metadata.generation = Some(2);
        sr
    }

    #[test]
    fn progress_counts_effective_stages() {
        let sr = rollout();
        assert_eq!(stage_progress(&sr.spec, None), "-/4");
        let st = SafeRolloutStatus {
            current_stage: Some(1),
            ..Default::default()
        };
        assert_eq!(stage_progress(&sr.spec, Some(&st)), "2/4");
    }

    #[test]
    fn stuck_skipped_and_failed_nodes_and_progress_are_shown() {
        let now = ts("2025-01-01T00:10:00Z");
        let mut sr = rollout();
        let note = |node: &str, reason: &str, message: &str| saferollout_api::NodeNote {
            node: node.into(),
            reason: reason.into(),
            message: message.into(),
        };
        sr.status = Some(SafeRolloutStatus {
            phase: Some(Phase::Degraded),
            progress: Some(saferollout_api::Progress {
                subject: "revert to revision good456".into(),
                nodes: 3,
                last_progress_time: Time(ts("2025-01-01T00:09:00Z")),
            }),
            stuck_nodes: vec![note(
                "node-x",
                "UntoleratedTaint",
                "runs revision bad123; not replaced",
            )],
            skipped_nodes: vec![note(
                "node-z",
                "NodeOutOfService",
                "the node is cordoned (spec.unschedulable)",
            )],
            disrupted_nodes: vec!["node-a".into()],
            stages: vec![StageStatus {
                index: 0,
                skipped: vec![note("node-y", "NodeDeleted", "the node left the cluster")],
                failed_nodes: vec!["node-a".into()],
                ..Default::default()
            }],
            ..Default::default()
        });
        let text = render(&sr, now);
        assert!(
            text.contains("revert to revision good456: 3 node(s) done, last progress 1m ago"),
            "{text}"
        );
        assert!(text.contains("Nodes needing attention:"), "{text}");
        for want in [
            "node-x",
            "UntoleratedTaint",
            "node-y",
            "1/4 (let go)",
            "node-a",
            "AgentFailedGate",
            "node-z",
            "- (skipped)",
            "NodeOutOfService",
        ] {
            assert!(text.contains(want), "{want} missing in {text}");
        }
        let json = serde_json::to_value(report(&sr)).unwrap();
        assert_eq!(json["stuckNodes"][0]["node"], "node-x");
        assert_eq!(json["skippedNodes"][0]["reason"], "NodeOutOfService");
        assert_eq!(json["disruptedNodes"][0], "node-a");
        assert_eq!(json["progress"]["nodes"], 3);
        assert_eq!(json["stages"][0]["skipped"][0]["reason"], "NodeDeleted");
        assert_eq!(json["stages"][0]["failedNodes"][0], "node-a");
    }

    #[test]
    fn a_new_rollout_renders() {
        let text = render(&rollout(), ts("2025-01-01T00:00:00Z"));
        assert!(text.starts_with("Name:"), "{text}");
        assert!(text.contains("gpu/plugin"), "{text}");
        assert!(text.contains("- (not reconciled yet)"), "{text}");
        assert!(text.contains("-/4"), "{text}");
        assert!(text.contains("Conditions:\n  <none>\n"), "{text}");
        assert!(!text.contains("Gates:"), "{text}");
    }

    #[test]
    fn a_failed_stage_renders_gates_conditions_and_blocks() {
        let now = ts("2025-01-01T00:10:00Z");
        let mut sr = rollout();
        sr.status = Some(SafeRolloutStatus {
            observed_generation: Some(2),
            phase: Some(Phase::Degraded),
            current_stage: Some(0),
            target_revision: Some("bad123".into()),
            stable_revision: Some("good456".into()),
            stages: vec![StageStatus {
                index: 0,
                nodes: vec!["node-a".into()],
                state: StageState::Failed,
                started_at: Some(Time(ts("2025-01-01T00:08:00Z"))),
                gates: vec![GateResult {
                    gate: "allocatable/nvidia.com/gpu".into(),
                    status: GateStatus::Failed,
                    reason: "BelowMinimum".into(),
                    message: "node-a advertises 0".into(),
                    node: Some("node-a".into()),
                    observed: Some("0".into()),
                    expected: Some(">= 8".into()),
                    since: Some(Time(ts("2025-01-01T00:09:00Z"))),
                    measurements: None,
                }],
                ..Default::default()
            }],
            conditions: vec![Condition {
                type_: "Degraded".into(),
                status: "True".into(),
                reason: "GateFailed".into(),
                message: "allocatable gate failed".into(),
                last_transition_time: Time(ts("2025-01-01T00:09:30Z")),
                observed_generation: Some(2),
            }],
            blocked_revisions: vec![BlockedRevision {
                revision: "bad123".into(),
                reason: "GateFailed".into(),
                message: "0 GPUs".into(),
                template_hash: None,
                blocked_at: Time(ts("2025-01-01T00:09:30Z")),
            }],
            ..Default::default()
        });
        let text = render(&sr, now);
        for want in [
            "Phase:             Degraded",
            "Stage:             1/4 (index 0)",
            "Target revision:   bad123",
            "Stable revision:   good456",
            "Generation:        2 (observed 2)",
            "*1/4",
            "Failed",
            "1: node-a",
            "2m",
            "allocatable/nvidia.com/gpu",
            "BelowMinimum",
            ">= 8",
            "GateFailed",
            "30s ago",
            "0 GPUs",
        ] {
            assert!(text.contains(want), "missing {want:?} in\n{text}");
        }
        // Stages not reached yet show as such.
        assert!(text.contains("  2/4     10%"), "{text}");
    }

    #[test]
    fn json_report_has_the_documented_shape() {
        let mut sr = rollout();
        sr.spec.paused = true;
        sr.status = Some(SafeRolloutStatus {
            observed_generation: Some(2),
            phase: Some(Phase::Degraded),
            current_stage: Some(0),
            target_revision: Some("bad123".into()),
            stable_revision: Some("good456".into()),
            message: Some("reverted".into()),
            stages: vec![StageStatus {
                index: 0,
                nodes: vec!["node-a".into()],
                state: StageState::Failed,
                started_at: Some(Time(ts("2025-01-01T00:08:00Z"))),
                gates: vec![GateResult {
                    gate: "allocatable/nvidia.com/gpu".into(),
                    status: GateStatus::Failed,
                    reason: "BelowMinimum".into(),
                    message: "node-a advertises 0".into(),
                    node: Some("node-a".into()),
                    observed: Some("0".into()),
                    expected: Some(">= 8".into()),
                    since: Some(Time(ts("2025-01-01T00:09:00Z"))),
                    measurements: None,
                }],
                probes: vec![saferollout_api::ProbeRecord {
                    node: "node-a".into(),
                    pod: "plugin-probe-0123456789".into(),
                    status: GateStatus::Failed,
                    reason: "Unschedulable".into(),
                    message: "0/4 nodes are available: 1 Insufficient nvidia.com/gpu".into(),
                    since: Time(ts("2025-01-01T00:08:30Z")),
                }],
                ..Default::default()
            }],
            conditions: vec![Condition {
                type_: "Degraded".into(),
                status: "True".into(),
                reason: "GateFailed".into(),
                message: "allocatable gate failed".into(),
                last_transition_time: Time(ts("2025-01-01T00:09:30.5Z")),
                observed_generation: Some(2),
            }],
            blocked_revisions: vec![BlockedRevision {
                revision: "bad123".into(),
                reason: "GateFailed".into(),
                message: "0 GPUs".into(),
                template_hash: None,
                blocked_at: Time(ts("2025-01-01T00:09:30Z")),
            }],
            ..Default::default()
        });
        let now = ts("2025-01-01T00:10:00Z");
        let text = format_status(&sr, OutputFormat::Json, now, false).unwrap();
        let got: serde_json::Value = serde_json::from_str(&text).unwrap();
        let stage = |n: usize, size: &str| {
            serde_json::json!({"stage": n, "size": size, "approval": false, "state": null,
                "nodes": [], "startedAt": null, "verifiedAt": null, "skipped": [], "failedNodes": []})
        };
        let want = serde_json::json!({
            "namespace": "gpu", "name": "plugin", "daemonSet": "nvidia-plugin",
            "generation": 2, "observedGeneration": 2, "phase": "Degraded", "paused": true,
            "message": "reverted", "currentStage": 1, "stageCount": 4, "awaitingApproval": null,
            "targetRevision": "bad123", "stableRevision": "good456", "lastGood": null,
            "stages": [
                {"stage": 1, "size": "1", "approval": false, "state": "Failed", "nodes": ["node-a"],
                 "startedAt": "2025-01-01T00:08:00Z", "verifiedAt": null, "skipped": [], "failedNodes": []},
                stage(2, "10%"), stage(3, "50%"), stage(4, "100%"),
            ],
            "gates": [{"stage": 1, "gate": "allocatable/nvidia.com/gpu", "status": "Failed",
                "reason": "BelowMinimum", "message": "node-a advertises 0", "node": "node-a",
                "observed": "0", "expected": ">= 8", "since": "2025-01-01T00:09:00Z"}],
            "probes": [{"stage": 1, "node": "node-a", "pod": "plugin-probe-0123456789",
                "status": "Failed", "reason": "Unschedulable",
                "message": "0/4 nodes are available: 1 Insufficient nvidia.com/gpu",
                "since": "2025-01-01T00:08:30Z"}],
            "conditions": [{"type": "Degraded", "status": "True", "reason": "GateFailed",
                "message": "allocatable gate failed", "lastTransitionTime": "2025-01-01T00:09:30Z"}],
            "blockedRevisions": [{"revision": "bad123", "reason": "GateFailed", "message": "0 GPUs",
                "blockedAt": "2025-01-01T00:09:30Z"}],
            "progress": null, "stuckNodes": [], "skippedNodes": [], "disruptedNodes": [], "nodeMaintenance": [],
            "onFailure": "Revert", "stopped": null,
        });
        assert_eq!(got, want, "{text}");

        // YAML: the same fields; a watch stream separates documents.
        let yaml = format_status(&sr, OutputFormat::Yaml, now, false).unwrap();
        let parsed: serde_json::Value = serde_yaml::from_str(&yaml).unwrap();
        assert_eq!(parsed, want, "{yaml}");
        let watched = format_status(&sr, OutputFormat::Yaml, now, true).unwrap();
        assert!(watched.starts_with("---\n"), "{watched}");
        assert_eq!(
            format_status(&sr, OutputFormat::Table, now, false).unwrap(),
            render(&sr, now)
        );
    }

    #[test]
    fn a_stage_waiting_for_approval_is_reported() {
        let mut sr = rollout();
        sr.spec.stages = Some(vec![
            serde_json::from_value(serde_json::json!({"nodes": 1, "pause": true})).unwrap(),
            serde_json::from_value(serde_json::json!({"nodes": "100%"})).unwrap(),
        ]);
        sr.status = Some(SafeRolloutStatus {
            phase: Some(Phase::Paused),
            current_stage: Some(0),
            stages: vec![StageStatus {
                index: 0,
                state: StageState::Paused,
                ..Default::default()
            }],
            ..Default::default()
        });
        let r = report(&sr);
        assert_eq!(r.awaiting_approval, Some(1));
        assert_eq!(r.current_stage, Some(1));
        assert_eq!(r.stage_count, 2);
        assert!(r.stages[0].approval);
        assert_eq!(r.stages[0].state.as_deref(), Some("Paused"));
        assert_eq!(r.phase.as_deref(), Some("Paused"));
    }

    #[test]
    fn a_quarantined_rollout_shows_its_device_gates_and_what_is_out_of_service() {
        let now = ts("2025-01-01T00:10:00Z");
        let mut sr = rollout();
        sr.spec.on_failure = saferollout_api::OnFailure::Quarantine;
        sr.status = Some(SafeRolloutStatus {
            phase: Some(Phase::Degraded),
            current_stage: Some(0),
            stages: vec![StageStatus {
                index: 0,
                nodes: vec!["gpu-1".into()],
                state: StageState::Failed,
                gates: vec![GateResult {
                    gate: "resourceSlices".into(),
                    status: GateStatus::Failed,
                    reason: "SlicesWithdrawn".into(),
                    message:
                        "node gpu-1 pool gpu-1: driver gpu.example.com publishes no ResourceSlice"
                            .into(),
                    node: Some("gpu-1".into()),
                    observed: Some("0".into()),
                    expected: Some(">= 8".into()),
                    since: Some(Time(ts("2025-01-01T00:09:00Z"))),
                    measurements: None,
                }],
                ..Default::default()
            }],
            stopped: Some(saferollout_api::StoppedRollout {
                revision: "bad123".into(),
                policy: saferollout_api::OnFailure::Quarantine,
                message: "gate resourceSlices failed on node gpu-1".into(),
                nodes: vec!["gpu-1".into()],
                stopped_at: Time(ts("2025-01-01T00:09:30Z")),
                quarantine: Some(saferollout_api::QuarantineRecord {
                    effect: "NoSchedule".into(),
                    driver: Some("gpu.example.com".into()),
                    resource: None,
                    nodes: vec!["gpu-1".into()],
                    pools: vec![saferollout_api::QuarantinedPool {
                        node: "gpu-1".into(),
                        pool: "gpu-1".into(),
                    }],
                    skipped: vec!["gpu-2".into()],
                    preview: Vec::new(),
                }),
            }),
            ..Default::default()
        });
        let text = render(&sr, now);
        for want in [
            "On failure:        Quarantine (NoSchedule)",
            "resourceSlices",
            "SlicesWithdrawn",
            "Stopped: revision bad123 by onFailure: Quarantine (30s ago) on node(s) gpu-1",
            "DeviceTaintRule: driver gpu.example.com, pool gpu-1",
            "not quarantined (the agent publishes nothing of it there): gpu-2",
        ] {
            assert!(text.contains(want), "missing {want:?} in\n{text}");
        }
        let r = report(&sr);
        assert_eq!(r.on_failure, "Quarantine");
        let q = r.stopped.unwrap().quarantine.unwrap();
        assert_eq!(q.pools, ["gpu-1/gpu-1"]);
        assert_eq!(q.skipped, ["gpu-2"]);
    }

    #[test]
    fn watch_ignores_metadata_churn() {
        let a = rollout();
        let mut b = a.clone();
        b.metadata.resource_version = Some("42".into());
        assert_eq!(watch_key(&a), watch_key(&b));
        b.spec.paused = true;
        assert_ne!(watch_key(&a), watch_key(&b));
    }

    #[test]
    fn long_node_lists_are_cut() {
        let mut sr = rollout();
        sr.status = Some(SafeRolloutStatus {
            stages: vec![StageStatus {
                index: 0,
                nodes: (0..10).map(|i| format!("n{i}")).collect(),
                state: StageState::Replacing,
                ..Default::default()
            }],
            ..Default::default()
        });
        let text = render(&sr, ts("2025-01-01T00:00:00Z"));
        assert!(
            text.contains("10: n0, n1, n2, n3, n4, n5 (+4 more)"),
            "{text}"
        );
    }
}
