//! Which status writes must land before a pass acts.
//!
//! Status is written before actions so that a plan (a stage's nodes and
//! baselines, a blocked revision, the stable revision, ...) is durable before
//! anything is touched. A pass that only deletes the next pods of a stage
//! whose plan is already written changes nothing of the plan: just how far
//! the stage got (the progress count and time) and the gates' messages. A
//! restart that lost such a write re-derives it on its next pass (a lost
//! progress time only brings the deadline nearer; a lost soak start restarts
//! the soak), so that write may go behind the deletions instead of before
//! them: the operator sends it in a task of its own and neither the pass nor
//! the next one waits for its round trip, so the stage's serial replacements
//! do not wait for one status round trip each (writes of one rollout still
//! land in order: each waits for the one before).

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use saferollout_api::{GateResult, GateStatus, SafeRolloutStatus, StageStatus};

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
    /// In this pass: before its actions, or behind them (see
    /// [`status_may_go_behind`]).
    Now,
    /// Not in this pass: only progress and messages changed and the last
    /// write is recent. The pass runs again after this long and writes then
    /// (whatever it finds by then); meanwhile the status shows the last
    /// write, at most [`PROGRESS_WRITE_INTERVAL`] old.
    After(Duration),
}

/// Whether the status of a pass is written now or with a later pass.
///
/// Deferred are only changes of what [`status_may_go_behind`] already lets go
/// behind the actions, narrowed further: progress counts and times, messages (the
/// status's, the conditions', the gates'), and what a gate that stays
/// `Pending` observes (which node it waits on or sees out of bounds, and
/// since when), with no action but pod deletions and Events. A gate passing
/// or failing, the plan, the phase and the conditions' states are written at
/// once, so a failing gate or a stage passing is never held back.
///
/// A pending gate's observation is deferred because it changes with almost
/// every pass while many nodes are replaced at once (each replaced node is
/// awaited, then briefly out of bounds until its plugin registers again):
/// written each time, at 1,000 nodes and `maxUnavailable` 10%, it was two to
/// three writes of the whole status a second, each holding back the next
/// pass for 100-500 ms. Its cost: a soak starts from the status, so one that
/// starts within [`PROGRESS_WRITE_INTERVAL`] of the last write starts over
/// at the next write, and lasts at most that much longer (never shorter).
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
                && same_but_progress(old, new, Gates::ButPendingObservations) =>
        {
            StatusWrite::After(PROGRESS_WRITE_INTERVAL - since)
        }
        _ => StatusWrite::Now,
    }
}

/// True when the pass need not wait for its status write at all: its actions
/// (none, or pod deletions and Events) act on a plan `old` already records,
/// and `new` differs from `old` only in progress, messages and the gates'
/// verdicts (a stage's state, times and nodes, the phase, the revisions and
/// the conditions' states are compared). Nothing the pass does depends on
/// the write landing; the next pass may decide from `old` (it derives the
/// same plan, and the progress again), and a later write is sent only after
/// this one, so an older status never overwrites a newer one.
pub fn status_may_go_behind(
    old: &SafeRolloutStatus,
    new: &SafeRolloutStatus,
    actions: &[Action],
) -> bool {
    let deletes_only = actions
        .iter()
        .all(|a| matches!(a, Action::DeletePods { .. } | Action::Event { .. }));
    deletes_only && same_but_progress(old, new, Gates::Ignored)
}

/// How [`same_but_progress`] compares the gates' results.
#[derive(Clone, Copy)]
enum Gates {
    /// The same gates, each with the same status; a gate passed or failed
    /// also with the same reason, node, values and time (its message aside).
    /// What a gate pending on both sides observes is not compared.
    ButPendingObservations,
    /// Not at all.
    Ignored,
}

/// `old` and `new` are the same but for the progress, the messages (the
/// status's and the conditions') and, as `gates` says, the gates.
///
/// Compared field by field rather than on stripped copies: a pass makes this
/// comparison twice, and a copy of a status that lists every node of a
/// thousand-node plan with its baseline costs more than the decision. The
/// destructuring names every field, so a field added to the status is
/// compared (or deliberately ignored) here before this compiles.
fn same_but_progress(old: &SafeRolloutStatus, new: &SafeRolloutStatus, gates: Gates) -> bool {
    let SafeRolloutStatus {
        observed_generation,
        phase,
        phase_transition_time,
        conditions,
        stable_revision,
        target_revision,
        blocked_revisions,
        current_stage,
        stages,
        last_good_template,
        original_update_strategy,
        progress: _,
        applied_template,
        converging_nodes,
        disrupted_nodes,
        skipped_nodes,
        node_maintenance,
        stuck_nodes,
        preflight,
        stopped,
        last_retry,
        message: _,
    } = old;
    *observed_generation == new.observed_generation
        && *phase == new.phase
        && *phase_transition_time == new.phase_transition_time
        && pairwise(conditions, &new.conditions, same_but_message)
        && *stable_revision == new.stable_revision
        && *target_revision == new.target_revision
        && *blocked_revisions == new.blocked_revisions
        && *current_stage == new.current_stage
        && pairwise(stages, &new.stages, |a, b| same_stage(a, b, gates))
        && *last_good_template == new.last_good_template
        && *original_update_strategy == new.original_update_strategy
        && *applied_template == new.applied_template
        && *converging_nodes == new.converging_nodes
        && *disrupted_nodes == new.disrupted_nodes
        && *skipped_nodes == new.skipped_nodes
        && *node_maintenance == new.node_maintenance
        && *stuck_nodes == new.stuck_nodes
        && *preflight == new.preflight
        && *stopped == new.stopped
        && *last_retry == new.last_retry
}

/// Both lists have the same length and `same` holds for each pair.
fn pairwise<T>(old: &[T], new: &[T], same: impl Fn(&T, &T) -> bool) -> bool {
    old.len() == new.len() && old.iter().zip(new).all(|(a, b)| same(a, b))
}

fn same_but_message(old: &Condition, new: &Condition) -> bool {
    let Condition {
        last_transition_time,
        message: _,
        observed_generation,
        reason,
        status,
        type_,
    } = old;
    *last_transition_time == new.last_transition_time
        && *observed_generation == new.observed_generation
        && *reason == new.reason
        && *status == new.status
        && *type_ == new.type_
}

fn same_stage(old: &StageStatus, new: &StageStatus, gates: Gates) -> bool {
    let StageStatus {
        index,
        nodes,
        state,
        started_at,
        verified_at,
        finished_at,
        gates: old_gates,
        baseline,
        skipped,
        failed_nodes,
        device_baseline,
        probed,
        probes,
    } = old;
    let same_gates = match gates {
        Gates::Ignored => true,
        Gates::ButPendingObservations => pairwise(old_gates, &new.gates, same_gate_unless_pending),
    };
    same_gates
        && *index == new.index
        && *nodes == new.nodes
        && *state == new.state
        && *started_at == new.started_at
        && *verified_at == new.verified_at
        && *finished_at == new.finished_at
        && *baseline == new.baseline
        && *skipped == new.skipped
        && *failed_nodes == new.failed_nodes
        && *device_baseline == new.device_baseline
        && *probed == new.probed
        && *probes == new.probes
}

/// Both pending (what they observe aside), or equal but for the message.
fn same_gate_unless_pending(old: &GateResult, new: &GateResult) -> bool {
    if old.gate == new.gate
        && old.status == GateStatus::Pending
        && new.status == GateStatus::Pending
    {
        return true;
    }
    same_gate_but_message(old, new)
}

fn same_gate_but_message(old: &GateResult, new: &GateResult) -> bool {
    let GateResult {
        gate,
        status,
        reason,
        message: _,
        node,
        observed,
        expected,
        since,
        measurements,
    } = old;
    *gate == new.gate
        && *status == new.status
        && *reason == new.reason
        && *node == new.node
        && *observed == new.observed
        && *expected == new.expected
        && *since == new.since
        && *measurements == new.measurements
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

    /// The stripped copies the field-by-field comparison replaced: the
    /// reference it must agree with.
    fn stripped(st: &SafeRolloutStatus, gates: Gates) -> SafeRolloutStatus {
        let mut p = st.clone();
        p.progress = None;
        p.message = None;
        for s in &mut p.stages {
            match gates {
                Gates::Ignored => s.gates.clear(),
                Gates::ButPendingObservations => s.gates.iter_mut().for_each(|g| {
                    g.message.clear();
                    if g.status == saferollout_api::GateStatus::Pending {
                        // Only the gate's name and status count.
                        *g = GateResult {
                            gate: std::mem::take(&mut g.gate),
                            ..Default::default()
                        };
                    }
                }),
            }
        }
        for c in &mut p.conditions {
            c.message.clear();
        }
        p
    }

    #[test]
    fn comparing_field_by_field_agrees_with_comparing_stripped_copies() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
        let mut base = stage(&["a", "b", "c"], 1, 0);
        base.conditions = vec![Condition {
            type_: "Progressing".into(),
            status: "True".into(),
            reason: "Rolling".into(),
            message: "stage 1".into(),
            last_transition_time: Time(ts(0)),
            observed_generation: Some(1),
        }];
        base.stages[0].baseline.insert(
            "a".into(),
            [("example.com/gpu".to_string(), 8)].into_iter().collect(),
        );
        base.stages[0].gates.push(GateResult {
            gate: "allocatable/example.com/gpu".into(),
            status: saferollout_api::GateStatus::Passed,
            reason: "WithinBounds".into(),
            since: Some(Time(ts(1))),
            ..Default::default()
        });
        type Change = (&'static str, fn(&mut SafeRolloutStatus));
        let changes: Vec<Change> = vec![
            ("nothing", |_| {}),
            ("progress", |s| s.progress.as_mut().unwrap().nodes += 1),
            ("message", |s| s.message = Some("m".into())),
            ("gate message", |s| {
                s.stages[0].gates[0].message = "x".into()
            }),
            ("gate status", |s| {
                s.stages[0].gates[0].status = saferollout_api::GateStatus::Passed
            }),
            ("gate soak start", |s| {
                s.stages[0].gates[0].since = Some(Time(ts(9)))
            }),
            ("passed gate's soak start", |s| {
                s.stages[0].gates[1].since = Some(Time(ts(9)))
            }),
            ("passed gate's node", |s| {
                s.stages[0].gates[1].node = Some("b".into())
            }),
            ("gate renamed", |s| s.stages[0].gates[0].gate = "x".into()),
            ("gate added", |s| {
                s.stages[0].gates.push(GateResult::default())
            }),
            ("condition message", |s| {
                s.conditions[0].message = "y".into()
            }),
            ("condition status", |s| {
                s.conditions[0].status = "False".into()
            }),
            ("condition time", |s| {
                s.conditions[0].last_transition_time = Time(ts(5))
            }),
            ("stage nodes", |s| s.stages[0].nodes.push("d".into())),
            ("baseline", |s| {
                s.stages[0]
                    .baseline
                    .get_mut("a")
                    .unwrap()
                    .insert("x/y".into(), 1);
            }),
            ("stage state", |s| {
                s.stages[0].state = saferollout_api::StageState::Verifying
            }),
            ("stage added", |s| s.stages.push(StageStatus::default())),
            ("phase", |s| {
                s.phase = Some(saferollout_api::Phase::Degraded)
            }),
            ("stable revision", |s| {
                s.stable_revision = Some("old".into())
            }),
            ("converging", |s| s.converging_nodes.push("a".into())),
            ("current stage", |s| s.current_stage = Some(1)),
        ];
        for (what, change) in changes {
            let mut new = base.clone();
            change(&mut new);
            for gates in [Gates::ButPendingObservations, Gates::Ignored] {
                assert_eq!(
                    same_but_progress(&base, &new, gates),
                    stripped(&base, gates) == stripped(&new, gates),
                    "{what}"
                );
            }
        }
    }

    #[test]
    fn the_next_deletions_of_a_written_plan_need_not_wait() {
        let old = stage(&["a", "b", "c"], 1, 0);
        let new = stage(&["a", "b", "c"], 2, 5);
        assert!(status_may_go_behind(&old, &new, &[delete()]));
        let event = Action::Event {
            warning: false,
            reason: "r".into(),
            message: "m".into(),
        };
        assert!(status_may_go_behind(&old, &new, &[delete(), event.clone()]));
        assert!(
            status_may_go_behind(&old, &new, &[event]),
            "a pass with only Events acts on nothing the write protects"
        );
        assert!(
            status_may_go_behind(&old, &new, &[]),
            "a pass that only writes progress need not wait for it"
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
        let mut passed = stage(&["a", "b", "c"], 1, 5);
        passed.stages[0].gates[0].status = saferollout_api::GateStatus::Passed;
        assert_eq!(when_to_write(&old, &passed, &[], recent), StatusWrite::Now);
        assert_eq!(
            when_to_write(&passed, &old, &[], recent),
            StatusWrite::Now,
            "a gate that was decided and is pending again"
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
            when_to_write(
                &old,
                &new,
                &[Action::RestoreLastGood {
                    content: String::new()
                }],
                recent
            ),
            StatusWrite::Now
        );
    }

    #[test]
    fn what_a_pending_gate_observes_waits_for_the_next_write() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
        let recent = Some(Duration::from_millis(300));
        let mut old = stage(&["a", "b", "c"], 1, 0);
        old.stages[0].gates[0].reason = "AwaitingPods".into();
        old.stages[0].gates[0].since = Some(Time(ts(0)));
        // Node b is briefly out of bounds (its plugin registers again): the
        // gate stays pending, its soak start waits at most the interval.
        let mut soaking = stage(&["a", "b", "c"], 1, 5);
        soaking.stages[0].gates[0].reason = "BelowMinimum".into();
        soaking.stages[0].gates[0].node = Some("b".into());
        soaking.stages[0].gates[0].observed = Some("0".into());
        soaking.stages[0].gates[0].since = Some(Time(ts(5)));
        assert_eq!(
            when_to_write(&old, &soaking, &[delete()], recent),
            StatusWrite::After(Duration::from_millis(700))
        );
        assert_eq!(
            when_to_write(&old, &soaking, &[delete()], Some(PROGRESS_WRITE_INTERVAL)),
            StatusWrite::Now,
            "written with the next write: a soak starts at most the interval late"
        );
        let mut failed = soaking.clone();
        failed.stages[0].gates[0].status = saferollout_api::GateStatus::Failed;
        assert_eq!(
            when_to_write(&soaking, &failed, &[], recent),
            StatusWrite::Now,
            "a failing gate is never held back"
        );
    }

    #[test]
    fn a_new_plan_or_another_action_waits_for_the_status() {
        let old = stage(&["a", "b"], 1, 0);
        let grown = stage(&["a", "b", "c"], 1, 0);
        assert!(
            !status_may_go_behind(&old, &grown, &[delete()]),
            "new stage nodes"
        );
        let mut degraded = old.clone();
        degraded.phase = Some(saferollout_api::Phase::RollingBack);
        assert!(!status_may_go_behind(&old, &degraded, &[delete()]));
        let mut baseline = old.clone();
        baseline.stages[0].baseline.insert(
            "c".into(),
            [("example.com/gpu".to_string(), 8)].into_iter().collect(),
        );
        assert!(!status_may_go_behind(&old, &baseline, &[delete()]));
        assert!(!status_may_go_behind(
            &old,
            &old,
            &[Action::RestoreLastGood {
                content: String::new()
            }]
        ));
        assert!(!status_may_go_behind(
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
