//! Which status writes must land before a pass acts.
//!
//! Status is written before actions so that a plan (a stage's nodes and
//! baselines, a blocked revision, the stable revision, ...) is durable before
//! anything is touched. A pass that only deletes the next pods of a stage
//! whose plan is already written changes nothing of the plan: just how far
//! the stage got (the progress count and time) and the gates' messages. A
//! restart that lost such a write re-derives it on its next pass (a lost
//! progress time only brings the deadline nearer; a lost soak start restarts
//! the soak), so that write may go alongside the deletions instead of before
//! them, and the stage's serial replacements do not wait for one status round
//! trip each.

use std::time::Duration;

use saferollout_api::SafeRolloutStatus;

use crate::rollout::Action;

/// How long a status change that only says how far a stage got may wait
/// for the next write. During a stage every agent pod that turns Ready
/// changes a progress count and a gate message; writing each (a server-side
/// apply of a status that lists every node of the plan) costs the API server
/// more than the pod replacement itself at thousands of nodes, and each
/// write's round trip holds back the pass that replaces the next pod.
pub const PROGRESS_WRITE_INTERVAL: Duration = Duration::from_secs(1);

/// When a pass's status goes to the API server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatusWrite {
    /// Before (or alongside, see [`status_may_trail`]) the pass's actions.
    Now,
    /// Not in this pass: only progress and messages changed and the last
    /// write is recent. The pass runs again after this long and writes then
    /// (whatever it finds by then); meanwhile the status shows the last
    /// write, at most [`PROGRESS_WRITE_INTERVAL`] old.
    After(Duration),
}

/// Whether the status of a pass is written now or with a later pass.
///
/// Deferred are only changes of what [`status_may_trail`] already lets trail
/// the actions, narrowed further: progress counts and times, and messages
/// (the status's, the conditions', the gates'), with no action but pod
/// deletions and Events. Every gate's status, reason, node and soak start,
/// the plan, the phase and the conditions' states are written at once, so a
/// failing gate, a stage passing or a soak starting is never held back.
/// Deferring is losing the write for a moment, which the next pass re-derives
/// ("a lost progress time only brings the deadline nearer").
/// `since_last_write`: how long ago this replica last wrote the status
/// (`None`: not since it started).
pub fn when_to_write(
    old: &SafeRolloutStatus,
    new: &SafeRolloutStatus,
    actions: &[Action],
    since_last_write: Option<Duration>,
) -> StatusWrite {
    let only_deletions = actions
        .iter()
        .all(|a| matches!(a, Action::DeletePods { .. } | Action::Event { .. }));
    match since_last_write {
        Some(since)
            if since < PROGRESS_WRITE_INTERVAL
                && only_deletions
                && progress_free(old) == progress_free(new) =>
        {
            StatusWrite::After(PROGRESS_WRITE_INTERVAL - since)
        }
        _ => StatusWrite::Now,
    }
}

/// The status without its progress and messages.
fn progress_free(st: &SafeRolloutStatus) -> SafeRolloutStatus {
    let mut p = st.clone();
    p.progress = None;
    p.message = None;
    for g in p.stages.iter_mut().flat_map(|s| s.gates.iter_mut()) {
        g.message.clear();
    }
    for c in &mut p.conditions {
        c.message.clear();
    }
    p
}

/// True when the pass's actions may run alongside its status write: they are
/// pod deletions (and Events) of a stage whose plan `old` already records.
pub fn status_may_trail(
    old: &SafeRolloutStatus,
    new: &SafeRolloutStatus,
    actions: &[Action],
) -> bool {
    let deletes_only = actions
        .iter()
        .all(|a| matches!(a, Action::DeletePods { .. } | Action::Event { .. }))
        && actions
            .iter()
            .any(|a| matches!(a, Action::DeletePods { .. }));
    deletes_only && plan(old) == plan(new)
}

/// The status without what only says how far a stage got.
fn plan(st: &SafeRolloutStatus) -> SafeRolloutStatus {
    let mut p = st.clone();
    p.progress = None;
    p.message = None;
    for s in &mut p.stages {
        s.gates.clear();
    }
    for c in &mut p.conditions {
        c.message.clear();
    }
    p
}

#[cfg(test)]
mod tests {
    use saferollout_api::{GateResult, Progress, StageStatus};

    use super::*;
    use crate::gates::test_support::ts;
    use crate::rollout::PodRef;

    fn delete() -> Action {
        Action::DeletePods {
            pods: vec![PodRef {
                name: "p".into(),
                uid: "u".into(),
                node: "n".into(),
                unchanged_since: None,
            }],
        }
    }

    fn stage(nodes: &[&str], ready: usize, at: i64) -> SafeRolloutStatus {
        SafeRolloutStatus {
            target_revision: Some("new".into()),
            current_stage: Some(0),
            stages: vec![StageStatus {
                index: 0,
                nodes: nodes.iter().map(|n| n.to_string()).collect(),
                gates: vec![GateResult {
                    gate: "podsReady".into(),
                    message: format!("{ready}/{} agent pods Ready", nodes.len()),
                    ..Default::default()
                }],
                ..Default::default()
            }],
            progress: Some(Progress {
                subject: "stage 1".into(),
                nodes: ready as i32,
                last_progress_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(ts(at)),
            }),
            ..Default::default()
        }
    }

    #[test]
    fn the_next_deletions_of_a_written_plan_need_not_wait() {
        let old = stage(&["a", "b", "c"], 1, 0);
        let new = stage(&["a", "b", "c"], 2, 5);
        assert!(status_may_trail(&old, &new, &[delete()]));
        let event = Action::Event {
            warning: false,
            reason: "r".into(),
            message: "m".into(),
        };
        assert!(status_may_trail(&old, &new, &[delete(), event.clone()]));
        assert!(
            !status_may_trail(&old, &new, &[event]),
            "nothing to overlap without deletions"
        );
    }

    #[test]
    fn progress_alone_waits_for_the_next_write_after_a_recent_one() {
        let old = stage(&["a", "b", "c"], 1, 0);
        let new = stage(&["a", "b", "c"], 2, 5);
        let recent = Some(Duration::from_millis(300));
        assert_eq!(
            when_to_write(&old, &new, &[delete()], recent),
            StatusWrite::After(Duration::from_millis(700))
        );
        assert_eq!(
            when_to_write(&old, &new, &[], recent),
            StatusWrite::After(Duration::from_millis(700))
        );
        assert_eq!(
            when_to_write(&old, &new, &[delete()], Some(PROGRESS_WRITE_INTERVAL)),
            StatusWrite::Now,
            "the last write is old enough"
        );
        assert_eq!(
            when_to_write(&old, &new, &[delete()], None),
            StatusWrite::Now,
            "no write since start"
        );
    }

    #[test]
    fn gates_plans_and_other_actions_are_written_at_once() {
        let old = stage(&["a", "b", "c"], 1, 0);
        let recent = Some(Duration::from_millis(10));
        let mut failing = stage(&["a", "b", "c"], 1, 5);
        failing.stages[0].gates[0].status = saferollout_api::GateStatus::Failed;
        assert_eq!(when_to_write(&old, &failing, &[], recent), StatusWrite::Now);
        let mut soaking = stage(&["a", "b", "c"], 1, 5);
        soaking.stages[0].gates[0].since =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(ts(5)));
        assert_eq!(
            when_to_write(&old, &soaking, &[], recent),
            StatusWrite::Now,
            "a soak start is never deferred (deferring would restart it)"
        );
        let grown = stage(&["a", "b", "c", "d"], 1, 0);
        assert_eq!(when_to_write(&old, &grown, &[], recent), StatusWrite::Now);
        let new = stage(&["a", "b", "c"], 2, 5);
        assert_eq!(
            when_to_write(
                &old,
                &new,
                &[Action::LabelNodes {
                    nodes: vec!["d".into()],
                    stage: 0
                }],
                recent
            ),
            StatusWrite::Now
        );
        assert_eq!(
            when_to_write(&old, &new, &[Action::RestoreLastGood], recent),
            StatusWrite::Now
        );
    }

    #[test]
    fn a_new_plan_or_another_action_waits_for_the_status() {
        let old = stage(&["a", "b"], 1, 0);
        let grown = stage(&["a", "b", "c"], 1, 0);
        assert!(
            !status_may_trail(&old, &grown, &[delete()]),
            "new stage nodes"
        );
        let mut degraded = old.clone();
        degraded.phase = Some(saferollout_api::Phase::RollingBack);
        assert!(!status_may_trail(&old, &degraded, &[delete()]));
        let mut baseline = old.clone();
        baseline.stages[0]
            .baseline
            .insert("c".into(), [("example.com/gpu".to_string(), 8)].into());
        assert!(!status_may_trail(&old, &baseline, &[delete()]));
        assert!(!status_may_trail(&old, &old, &[Action::RestoreLastGood]));
        assert!(!status_may_trail(
            &old,
            &old,
            &[
                delete(),
                Action::LabelNodes {
                    nodes: vec!["c".into()],
                    stage: 0
                }
            ]
        ));
    }
}
