//! What a pass does with a [`Decision`], in which order. The
//! operator executes it against the API server, and the model's executor
//! (`rollout/model/executor.rs`) executes the same plan against its simulated
//! cluster, losing writes where the fault set says, so the property tests
//! cover the order (and [`crate::durability`]'s argument for it), not a copy.
//!
//! The order: the status write before the actions (the plan durable before
//! anything is touched), or behind them when only progress changed, or not
//! in this pass (deferred); then the actions that change the cluster, in
//! the decision's order; Events last (best effort: a revert's template
//! restore or a stage's first deletions never wait for an Event).

use std::time::Duration;

use jiff::Timestamp;
use std::collections::BTreeSet;

use saferollout_api::{SafeRolloutSpec, SafeRolloutStatus};

use crate::durability;
use crate::rollout::{Action, Decision};

/// When this pass's status goes to the API server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatusWrite {
    /// The status is as last written: nothing to send.
    Unchanged,
    /// Sent and confirmed before any action: a failed write ends the pass
    /// with nothing done.
    Before,
    /// Sent beside the actions, not waited for (see
    /// [`durability::status_may_go_behind`]): the actions may land and the
    /// write be lost, which the next pass re-derives.
    Behind,
    /// Not in this pass: only progress or messages changed and the last
    /// write is recent (see [`durability::when_to_write`]); the pass runs
    /// again after this long.
    Deferred(Duration),
}

/// What one pass does, in order.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// The status the pass decided (what [`Plan::write`] sends, unless
    /// deferred or unchanged).
    pub status: SafeRolloutStatus,
    pub write: StatusWrite,
    /// The actions that change the cluster, in order.
    pub actions: Vec<Action>,
    /// Events, published after the actions, whether they succeeded or not.
    pub events: Vec<Action>,
    /// Pass again after this long even if nothing changes (soaks,
    /// deadlines, a deferred write). The executor also passes again when
    /// an expectation its actions left may expire
    /// ([`crate::expectations::Expectations::next_expiry`], known only
    /// once they ran).
    pub requeue_after: Option<Duration>,
    /// See [`Decision::refresh_caches_heard_before`].
    pub refresh_caches_heard_before: Option<Timestamp>,
    /// The nodes whose workload pods the device gates need watched from now
    /// on ([`super::needs::pods_to_watch`] of the decided status).
    pub watch_pods_on: BTreeSet<String>,
}

/// The plan of a pass over `spec` that decided `decision` over the status
/// `written` (as last written; `None`: the SafeRollout has none yet), this
/// replica having last written it `since_last_write` ago.
pub fn plan(
    spec: &SafeRolloutSpec,
    written: Option<&SafeRolloutStatus>,
    decision: Decision,
    since_last_write: Option<Duration>,
) -> Plan {
    let Decision {
        status,
        actions,
        requeue_after,
        refresh_caches_heard_before,
    } = decision;
    let write = status_write(written, &status, &actions, since_last_write);
    let (events, actions): (Vec<Action>, Vec<Action>) = actions
        .into_iter()
        .partition(|a| matches!(a, Action::Event { .. }));
    let deferred = match write {
        StatusWrite::Deferred(wait) => Some(wait),
        _ => None,
    };
    Plan {
        watch_pods_on: super::needs::pods_to_watch(spec, &status),
        status,
        write,
        actions,
        events,
        requeue_after: [requeue_after, deferred].into_iter().flatten().min(),
        refresh_caches_heard_before,
    }
}

/// How `new` is written over `written`.
fn status_write(
    written: Option<&SafeRolloutStatus>,
    new: &SafeRolloutStatus,
    actions: &[Action],
    since_last_write: Option<Duration>,
) -> StatusWrite {
    // A first status is always written first: there is no plan to re-derive.
    let Some(old) = written else {
        return StatusWrite::Before;
    };
    if old == new {
        return StatusWrite::Unchanged;
    }
    if let durability::StatusWrite::After(wait) =
        durability::when_to_write(old, new, actions, since_last_write)
    {
        return StatusWrite::Deferred(wait);
    }
    if durability::status_may_go_behind(old, new, actions) {
        StatusWrite::Behind
    } else {
        StatusWrite::Before
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use saferollout_api::Phase;

    fn decision(status: SafeRolloutStatus, actions: Vec<Action>) -> Decision {
        Decision {
            status,
            actions,
            requeue_after: Some(Duration::from_secs(30)),
            refresh_caches_heard_before: None,
        }
    }

    fn spec() -> SafeRolloutSpec {
        SafeRolloutSpec::for_daemonset("plugin")
    }

    fn event() -> Action {
        Action::Event {
            warning: false,
            reason: "StageStarted".into(),
            message: "stage 2".into(),
        }
    }

    #[test]
    fn a_first_status_goes_before_and_events_go_last() {
        let new = SafeRolloutStatus {
            phase: Some(Phase::Pending),
            ..Default::default()
        };
        let p = plan(
            &spec(),
            None,
            decision(new.clone(), vec![event(), Action::TakeOverUpdates]),
            None,
        );
        assert_eq!(p.write, StatusWrite::Before);
        assert_eq!(p.actions, vec![Action::TakeOverUpdates]);
        assert_eq!(p.events, vec![event()]);
        assert_eq!(p.status, new);
    }

    #[test]
    fn an_unchanged_status_is_not_sent() {
        let st = SafeRolloutStatus {
            phase: Some(Phase::Succeeded),
            ..Default::default()
        };
        let p = plan(&spec(), Some(&st), decision(st.clone(), vec![]), None);
        assert_eq!(p.write, StatusWrite::Unchanged);
        assert_eq!(p.requeue_after, Some(Duration::from_secs(30)));
    }

    #[test]
    fn a_new_phase_goes_before_the_actions() {
        let old = SafeRolloutStatus {
            phase: Some(Phase::Progressing),
            ..Default::default()
        };
        let new = SafeRolloutStatus {
            phase: Some(Phase::RollingBack),
            ..Default::default()
        };
        let p = plan(
            &spec(),
            Some(&old),
            decision(new, vec![Action::TakeOverUpdates]),
            Some(Duration::ZERO),
        );
        assert_eq!(p.write, StatusWrite::Before);
    }
}
