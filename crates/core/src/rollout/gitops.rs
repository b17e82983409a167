//! GitOps mode: `spec.template` is the desired template and the operator is
//! the only writer of the DaemonSet's template.
//!
//! Decided by content every pass, never by remembering what was written:
//! - the DaemonSet already carries `spec.template`: nothing to write;
//! - `spec.template` was reverted before (blocked by its hash): leave the
//!   DaemonSet on what it has (the stable template, once restored);
//! - the DaemonSet carries a template the operator knows (the stable one, the
//!   rollout's target, a blocked one, or the one it wrote last, recognised by
//!   the DaemonSet generation that write returned): write `spec.template`
//!   (again, if an earlier write was lost); a Git revert of `spec.template`
//!   mid-rollout is such a write, and the nodes then return to it within the
//!   budget;
//! - anything else was written by someone else: pause with TemplateConflict
//!   and overwrite nothing.

use std::time::Duration;

use saferollout_api::{Phase, SafeRolloutStatus};

use super::{Action, Observed, SpecTemplate, is_blocked, is_source_blocked, phase};

/// `Some(requeue)` when this pass ends here (a write asked for, or a conflict).
pub(super) fn apply_spec_template(
    o: &Observed,
    st: &mut SafeRolloutStatus,
    actions: &mut Vec<Action>,
    current: &str,
    stable: &str,
    spec: SpecTemplate,
) -> Option<Option<Duration>> {
    if spec.in_place || is_source_blocked(st, spec.hash) {
        return None;
    }
    let written_by_us = st
        .applied_template
        .as_ref()
        .and_then(|a| a.generation)
        .zip(o.daemonset)
        .is_some_and(|(g, ds)| g == ds.generation);
    let known = current == stable
        || st.target_revision.as_deref() == Some(current)
        || is_blocked(st, current)
        || written_by_us;
    if known {
        // The generation stays the one the last completed write returned
        // until this write returns its own: if it is lost, the DaemonSet is
        // still recognised as carrying our previous write.
        let generation = st.applied_template.as_ref().and_then(|a| a.generation);
        st.applied_template = Some(saferollout_api::AppliedTemplate {
            hash: spec.hash.to_string(),
            generation,
        });
        actions.push(Action::ApplySpecTemplate);
        phase::working(
            st,
            o,
            if st.phase == Some(Phase::RollingBack) {
                Phase::RollingBack
            } else {
                Phase::Progressing
            },
            "ApplyingTemplate",
            format!("writing spec.template ({}) to the DaemonSet", spec.hash),
        );
        return Some(None);
    }
    phase::stalled(
        st,
        o,
        Phase::Paused,
        "TemplateConflict",
        format!(
            "the DaemonSet's template was changed outside the SafeRollout (revision {current}); \
             revert that edit or delete the SafeRollout: nothing was overwritten"
        ),
    );
    Some(None)
}
