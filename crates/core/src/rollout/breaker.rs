//! The circuit breaker (`spec.circuitBreaker`): nodes going NotReady during
//! a rollout. Each alone is let go from its stage (hardware dies; holding a
//! budget slot for it would stall a healthy release until its deadline), but
//! many at once say something the stages cannot see:
//!
//! - more than `maxNotReadyNodes` of the nodes whose agent the rollout
//!   replaced went NotReady with the new agent on them: the release is the
//!   likely cause, and the stage fails (`NodesNotReadyAfterReplacement`,
//!   reverted or as `onFailure` says);
//! - more than `maxNotReadyNodes` of the DaemonSet's nodes went NotReady
//!   since the rollout started, the release's or not (a zone, a rack, a
//!   power event): the rollout holds, replacing nothing more, until enough
//!   are Ready again (`CircuitBreakerOpen`), since no gate can tell a good
//!   release from a bad one on a fleet in that state.
//!
//! The threshold is a count, or a percentage of the nodes the DaemonSet's
//! placement selects, rounded down and at least 1: a single node never
//! trips it.

use std::collections::BTreeSet;

use saferollout_api::{GateResult, GateStatus, SafeRolloutStatus, resolve_count};

use super::Observed;
use crate::eligibility::is_selected;
use crate::gates::list_some;
use crate::views::{DaemonSetView, live_pods};

/// The breaker's verdict on one pass.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Breaker {
    Closed,
    /// Hold: nothing more is replaced while so.
    Open {
        message: String,
    },
    /// The release made nodes NotReady: the stage fails with this result.
    Tripped(GateResult),
}

/// The reason of the conditions while the breaker holds the rollout.
pub(super) const OPEN: &str = "CircuitBreakerOpen";

pub(super) fn judge(
    o: &Observed,
    st: &SafeRolloutStatus,
    ds: &DaemonSetView,
    target: &str,
) -> Breaker {
    let Some(started) = st
        .stages
        .iter()
        .filter_map(|s| s.started_at.as_ref().map(|t| t.0))
        .min()
    else {
        return Breaker::Closed;
    };
    let limit = o.spec.circuit_breaker.clone().unwrap_or_default();
    let selected: Vec<_> = o
        .nodes
        .values()
        .filter(|n| is_selected(n, &ds.placement))
        .collect();
    let threshold = resolve_count(&limit.max_not_ready_nodes, selected.len(), false)
        .unwrap_or(1)
        .max(1);
    // The nodes the rollout took (held, or let go), NotReady with the new
    // agent on them.
    let taken: BTreeSet<&str> = st
        .stages
        .iter()
        .flat_map(|s| {
            s.nodes
                .iter()
                .chain(s.skipped.iter().map(|n| &n.node))
                .map(String::as_str)
        })
        .collect();
    let replaced_down: Vec<String> = selected
        .iter()
        .filter(|n| !n.ready && taken.contains(n.name))
        .filter(|n| live_pods(o.pods, n.name).any(|p| p.revision == target))
        .map(|n| n.name.to_string())
        .collect();
    if replaced_down.len() > threshold {
        return Breaker::Tripped(GateResult {
            gate: "circuitBreaker".into(),
            status: GateStatus::Failed,
            reason: "NodesNotReadyAfterReplacement".into(),
            message: format!(
                "{} node(s) went NotReady with revision {target}'s agent on them ({}), more than circuitBreaker.maxNotReadyNodes ({threshold})",
                replaced_down.len(),
                list_some(&replaced_down)
            ),
            node: replaced_down.first().cloned(),
            observed: Some(format!("{} NotReady", replaced_down.len())),
            expected: Some(format!("at most {threshold}")),
            ..Default::default()
        });
    }
    let down_since: Vec<String> = selected
        .iter()
        .filter(|n| !n.ready && n.not_ready_since.is_some_and(|t| t >= started))
        .map(|n| n.name.to_string())
        .collect();
    if down_since.len() > threshold {
        return Breaker::Open {
            message: format!(
                "{} node(s) went NotReady since the rollout started ({}), more than circuitBreaker.maxNotReadyNodes ({threshold}): nothing more is replaced until enough are Ready again",
                down_since.len(),
                list_some(&down_since)
            ),
        };
    }
    Breaker::Closed
}
