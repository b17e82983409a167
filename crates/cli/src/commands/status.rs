//! `status NAME [-w]`: where a rollout is.

use std::pin::pin;

use futures::StreamExt;
use jiff::Timestamp;
use kube::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::watch_object;
use saferollout_api::{SafeRollout, SafeRolloutSpec, SafeRolloutStatus};

use super::actions::approve_index;
use super::{get_rollout, int_or_string, rollout_ref};
use crate::cli::StatusArgs;
use crate::client::Kube;
use crate::error::{CliError, error_chain};
use crate::output::{age, emit, timestamp};
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
    if let Some(m) = &st.message {
        head.row(["Message:".to_string(), m.clone()]);
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
    emit(&render(&sr, Timestamp::now()));
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
                    emit(&format!(
                        "\n--- {} ---\n{}",
                        timestamp(now),
                        render(&sr, now)
                    ));
                }
            }
            Some(Ok(None)) => {
                emit(&format!("\n{what} was deleted\n"));
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
