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

use saferollout_api::SafeRolloutStatus;

use crate::rollout::Action;

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
