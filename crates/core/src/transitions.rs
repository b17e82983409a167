//! What changed between the status a pass started from and the one it wrote:
//! the events metrics count. Decided here, once, so the runtime only records
//! them (after the status write succeeded: a failed write counts nothing, and
//! the pass that repeats it counts once).

use std::time::Duration;

use jiff::Timestamp;
use saferollout_api::{GateStatus, Phase, SafeRolloutStatus, StageState};

use crate::gates::elapsed;

/// A revision was blocked and its revert started.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rollback {
    /// The gate that failed (`manual` for an abort).
    pub gate: String,
    /// Its reason (BelowMinimum, CrashLoopBackOff, Aborted, ...).
    pub reason: String,
    /// Since when the gate observed the failure (its soak included): the
    /// revert latency runs from here to the restore write.
    pub failing_since: Option<Timestamp>,
}

/// A gate failed and its revision was blocked, whatever `onFailure` does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GateFailure {
    pub gate: String,
    pub reason: String,
}

/// Countable changes.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Transitions {
    /// A revert started (onFailure: Revert, or an abort).
    pub rollback: Option<Rollback>,
    /// A gate failure blocked a revision (any policy).
    pub gate_failure: Option<GateFailure>,
    /// Durations of the stages that passed in this pass.
    pub stages_passed: Vec<Duration>,
    /// A rollout reached every node.
    pub rollout_succeeded: bool,
}

pub fn between(old: &SafeRolloutStatus, new: &SafeRolloutStatus) -> Transitions {
    let mut t = Transitions::default();
    if new.blocked_revisions.len() > old.blocked_revisions.len() {
        let blocked = new.blocked_revisions.last();
        let failed = new
            .stages
            .iter()
            .filter(|s| s.state == StageState::Failed)
            .flat_map(|s| s.gates.iter())
            .find(|g| g.status == GateStatus::Failed);
        let rollback = match failed {
            Some(g) => Rollback {
                gate: g.gate.clone(),
                reason: g.reason.clone(),
                failing_since: g.since.as_ref().map(|s| s.0),
            },
            None => Rollback {
                gate: "manual".into(),
                reason: blocked.map(|b| b.reason.clone()).unwrap_or_default(),
                failing_since: blocked.map(|b| b.blocked_at.0),
            },
        };
        t.gate_failure = Some(GateFailure {
            gate: rollback.gate.clone(),
            reason: rollback.reason.clone(),
        });
        // Quarantine and Halt stop instead of reverting.
        let stopped = new
            .stopped
            .as_ref()
            .is_some_and(|s| blocked.is_some_and(|b| b.revision == s.revision));
        if !stopped {
            t.rollback = Some(rollback);
        }
    }
    if new.target_revision == old.target_revision {
        for s in new.stages.iter().filter(|s| s.state == StageState::Passed) {
            let was = old
                .stage(s.index)
                .is_some_and(|o| o.state == StageState::Passed);
            if !was && let (Some(start), Some(end)) = (&s.started_at, &s.finished_at) {
                t.stages_passed.push(elapsed(start.0, end.0));
            }
        }
    }
    t.rollout_succeeded = new.phase == Some(Phase::Succeeded)
        && old.phase != Some(Phase::Succeeded)
        && new.stable_revision != old.stable_revision
        && old.stable_revision.is_some();
    t
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use saferollout_api::{BlockedRevision, GateResult, StageStatus};

    use super::*;

    fn ts(s: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + s).unwrap()
    }

    #[test]
    fn a_block_is_one_rollback_with_its_gate() {
        let old = SafeRolloutStatus::default();
        let mut new = old.clone();
        new.blocked_revisions.push(BlockedRevision {
            revision: "r2".into(),
            template_hash: None,
            reason: "BelowMinimum".into(),
            message: String::new(),
            blocked_at: Time(ts(10)),
        });
        new.stages.push(StageStatus {
            state: StageState::Failed,
            gates: vec![GateResult {
                gate: "allocatable/x".into(),
                status: GateStatus::Failed,
                reason: "BelowMinimum".into(),
                since: Some(Time(ts(5))),
                ..Default::default()
            }],
            ..Default::default()
        });
        let t = between(&old, &new);
        let f = t.gate_failure.clone().unwrap();
        assert_eq!(
            (f.gate.as_str(), f.reason.as_str()),
            ("allocatable/x", "BelowMinimum")
        );
        let r = t.rollback.unwrap();
        assert_eq!(
            (r.gate.as_str(), r.reason.as_str()),
            ("allocatable/x", "BelowMinimum")
        );
        assert_eq!(r.failing_since, Some(ts(5)));
        // Writing the same status again counts nothing.
        assert_eq!(between(&new, &new), Transitions::default());
        // Quarantine or Halt: a gate failure, no rollback.
        new.stopped = Some(saferollout_api::StoppedRollout {
            revision: "r2".into(),
            policy: saferollout_api::OnFailure::Halt,
            message: String::new(),
            nodes: vec![],
            stopped_at: Time(ts(10)),
            quarantine: None,
        });
        let t = between(&old, &new);
        assert!(t.gate_failure.is_some() && t.rollback.is_none(), "{t:?}");
    }

    #[test]
    fn stage_passes_and_success_are_counted_once() {
        let mut old = SafeRolloutStatus {
            target_revision: Some("r2".into()),
            stable_revision: Some("r1".into()),
            phase: Some(Phase::Progressing),
            ..Default::default()
        };
        old.stages.push(StageStatus {
            index: 0,
            state: StageState::Soaking,
            started_at: Some(Time(ts(0))),
            ..Default::default()
        });
        let mut new = old.clone();
        new.stages[0].state = StageState::Passed;
        new.stages[0].finished_at = Some(Time(ts(30)));
        new.phase = Some(Phase::Succeeded);
        new.stable_revision = Some("r2".into());
        let t = between(&old, &new);
        assert_eq!(t.stages_passed, vec![Duration::from_secs(30)]);
        assert!(t.rollout_succeeded);
        assert_eq!(between(&new, &new), Transitions::default());
        // Adopting a DaemonSet is not a rollout.
        let adopted = SafeRolloutStatus {
            phase: Some(Phase::Succeeded),
            stable_revision: Some("r1".into()),
            ..Default::default()
        };
        assert!(!between(&SafeRolloutStatus::default(), &adopted).rollout_succeeded);
    }
}
