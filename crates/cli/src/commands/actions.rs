//! `pause`, `resume`, `approve`, `retry`, `abort`: one write each, after a
//! pure decision on whether the action applies to the rollout's state.

use kube::Api;
use kube::api::{Patch, PatchParams};
use saferollout_api::{
    ABORT_ANNOTATION, APPROVE_ANNOTATION, Phase, RETRY_ANNOTATION, SafeRollout, SafeRolloutStatus,
    StageState,
};
use saferollout_core::rollout::approval_value;
use serde_json::json;

use super::{FIELD_MANAGER, get_rollout, rollout_ref};
use crate::cli::RetryArgs;
use crate::client::Kube;
use crate::error::CliError;
use crate::output::emit;

/// The stage index to approve: only when the rollout is Paused because its
/// current stage passed and waits for approval (not when paused by
/// `spec.paused`, nor when nothing waits).
pub fn approve_index(st: &SafeRolloutStatus) -> Result<i32, String> {
    let phase = st.phase.unwrap_or_default();
    let Some(index) = st.current_stage else {
        return Err(format!(
            "no stage is waiting for approval (phase {phase}, no current stage)"
        ));
    };
    let state = st.stage(index).map(|s| s.state);
    if phase == Phase::Paused && state == Some(StageState::Paused) {
        return Ok(index);
    }
    let state = state.map_or("not started".to_string(), |s| s.to_string());
    let why = if phase == Phase::Paused {
        " (paused by spec.paused or a template conflict, not by a stage: use resume)"
    } else {
        ""
    };
    Err(format!(
        "no stage is waiting for approval (phase {phase}, stage {} {state}){why}",
        index + 1
    ))
}

/// The revision `abort` reverts: the target of a rollout in progress.
pub fn abort_revision(st: &SafeRolloutStatus) -> Result<String, String> {
    let phase = st.phase.unwrap_or_default();
    let Some(target) = st.target_revision.as_deref().filter(|t| !t.is_empty()) else {
        return Err(format!(
            "no rollout in progress (phase {phase}, no target revision)"
        ));
    };
    if st.stable_revision.as_deref() == Some(target) {
        return Err(format!(
            "no rollout in progress (phase {phase}): revision {target} is already the stable one"
        ));
    }
    if !matches!(phase, Phase::Progressing | Phase::Paused) {
        return Err(format!(
            "no rollout in progress: phase is {phase} (abort applies while Progressing or Paused)"
        ));
    }
    Ok(target.to_string())
}

/// The revision `retry` unblocks: `requested` if it is blocked (by revision
/// or template hash), else the most recently blocked one.
pub fn retry_revision(st: &SafeRolloutStatus, requested: Option<&str>) -> Result<String, String> {
    if st.blocked_revisions.is_empty() {
        return Err("no revision is blocked: nothing to retry".into());
    }
    let revision = match requested {
        Some(r) => {
            let blocked = st
                .blocked_revisions
                .iter()
                .any(|b| b.revision == r || b.template_hash.as_deref() == Some(r));
            if !blocked {
                let list: Vec<&str> = st
                    .blocked_revisions
                    .iter()
                    .map(|b| b.revision.as_str())
                    .collect();
                return Err(format!(
                    "revision {r} is not blocked (blocked: {})",
                    list.join(", ")
                ));
            }
            r.to_string()
        }
        None => st
            .blocked_revisions
            .iter()
            .enumerate()
            // Latest blockedAt; on a tie the later entry (the list is kept in time order).
            .max_by_key(|(i, b)| (b.blocked_at.0, *i))
            .map(|(_, b)| b.revision.clone())
            .expect("not empty"),
    };
    if st.last_retry.as_deref() == Some(revision.as_str()) {
        return Err(format!(
            "revision {revision} was retried before (status.lastRetry) and blocked again; \
             the operator acts on a retry value once: change the template to roll it out"
        ));
    }
    Ok(revision)
}

/// Whether `pause`/`resume` has anything to write.
pub fn paused_change(currently: bool, want: bool) -> Option<bool> {
    (currently != want).then_some(want)
}

/// The merge patch of `retry`: sets the retry annotation and removes an abort
/// annotation naming the same revision, which would otherwise abort the
/// retried rollout again at once.
pub fn retry_patch(revision: &str, abort: Option<&str>) -> serde_json::Value {
    let mut patch = annotation_patch(RETRY_ANNOTATION, revision);
    if abort == Some(revision) {
        patch["metadata"]["annotations"][ABORT_ANNOTATION] = serde_json::Value::Null;
    }
    patch
}

/// The merge patch setting one annotation.
pub fn annotation_patch(key: &str, value: &str) -> serde_json::Value {
    json!({ "metadata": { "annotations": { key: value } } })
}

fn status_of(sr: &SafeRollout) -> SafeRolloutStatus {
    sr.status.clone().unwrap_or_default()
}

async fn patch(kube: &Kube, name: &str, body: serde_json::Value) -> Result<(), CliError> {
    let api: Api<SafeRollout> = Api::namespaced(kube.client.clone(), &kube.namespace);
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    };
    api.patch(name, &params, &Patch::Merge(&body))
        .await
        .map_err(|e| kube.error(e, &format!("SafeRollout {}/{name}", kube.namespace)))?;
    Ok(())
}

/// `pause` (`want = true`) and `resume` (`want = false`).
pub async fn set_paused(kube: &Kube, name: &str, want: bool) -> Result<u8, CliError> {
    let sr = get_rollout(kube, name).await?;
    let what = rollout_ref(&sr);
    match paused_change(sr.spec.paused, want) {
        None if want => emit(&format!("SafeRollout {what} is already paused\n")),
        None => emit(&format!(
            "SafeRollout {what} is not paused: nothing to resume\n"
        )),
        Some(value) => {
            patch(kube, name, json!({ "spec": { "paused": value } })).await?;
            if value {
                emit(&format!(
                    "SafeRollout {what} paused (spec.paused: true): no further agent pod will be replaced\n"
                ));
            } else {
                emit(&format!(
                    "SafeRollout {what} resumed (spec.paused: false)\n"
                ));
            }
        }
    }
    Ok(0)
}

/// `approve`.
pub async fn approve(kube: &Kube, name: &str) -> Result<u8, CliError> {
    let sr = get_rollout(kube, name).await?;
    let what = rollout_ref(&sr);
    let st = status_of(&sr);
    let index =
        approve_index(&st).map_err(|e| CliError::failed(format!("SafeRollout {what}: {e}")))?;
    let total = sr.spec.effective_stages().len();
    // The operator accepts only `<target revision>:<stage>`, so an approval
    // left on the object never approves a later rollout.
    let target = st.target_revision.clone().unwrap_or_default();
    let value = approval_value(&target, index as usize);
    patch(kube, name, annotation_patch(APPROVE_ANNOTATION, &value)).await?;
    emit(&format!(
        "SafeRollout {what}: stage {}/{total} approved ({APPROVE_ANNOTATION}={value})\n",
        index + 1
    ));
    Ok(0)
}

/// `retry`.
pub async fn retry(kube: &Kube, args: &RetryArgs) -> Result<u8, CliError> {
    let sr = get_rollout(kube, &args.name).await?;
    let what = rollout_ref(&sr);
    let revision = retry_revision(&status_of(&sr), args.revision.as_deref())
        .map_err(|e| CliError::failed(format!("SafeRollout {what}: {e}")))?;
    let abort = sr
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ABORT_ANNOTATION))
        .map(String::as_str);
    patch(kube, &args.name, retry_patch(&revision, abort)).await?;
    let cleared = if abort == Some(revision.as_str()) {
        format!(", {ABORT_ANNOTATION} removed")
    } else {
        String::new()
    };
    emit(&format!(
        "SafeRollout {what}: revision {revision} unblocked for a retry ({RETRY_ANNOTATION}={revision}{cleared})\n"
    ));
    Ok(0)
}

/// `abort`.
pub async fn abort(kube: &Kube, name: &str) -> Result<u8, CliError> {
    let sr = get_rollout(kube, name).await?;
    let what = rollout_ref(&sr);
    let revision = abort_revision(&status_of(&sr))
        .map_err(|e| CliError::failed(format!("SafeRollout {what}: {e}")))?;
    patch(kube, name, annotation_patch(ABORT_ANNOTATION, &revision)).await?;
    emit(&format!(
        "SafeRollout {what}: rollout of revision {revision} aborted ({ABORT_ANNOTATION}={revision}); \
         the operator reverts it and blocks the revision\n"
    ));
    Ok(0)
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use saferollout_api::{BlockedRevision, StageStatus};

    use super::*;

    fn status(phase: Phase, current: Option<i32>, state: Option<StageState>) -> SafeRolloutStatus {
        SafeRolloutStatus {
            phase: Some(phase),
            current_stage: current,
            stages: state
                .into_iter()
                .map(|state| StageStatus {
                    index: current.unwrap_or(0),
                    state,
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn approve_applies_only_to_a_stage_waiting_for_approval() {
        assert_eq!(
            approve_index(&status(Phase::Paused, Some(1), Some(StageState::Paused))),
            Ok(1)
        );
        // Paused by spec.paused: the stage is not waiting.
        let e = approve_index(&status(Phase::Paused, Some(1), Some(StageState::Verifying)))
            .unwrap_err();
        assert!(e.contains("use resume"), "{e}");
        let e = approve_index(&status(
            Phase::Progressing,
            Some(0),
            Some(StageState::Soaking),
        ))
        .unwrap_err();
        assert_eq!(
            e,
            "no stage is waiting for approval (phase Progressing, stage 1 Soaking)"
        );
        assert!(approve_index(&status(Phase::Paused, Some(2), None)).is_err());
        assert!(approve_index(&SafeRolloutStatus::default()).is_err());
    }

    fn rollout_status(
        phase: Phase,
        target: Option<&str>,
        stable: Option<&str>,
    ) -> SafeRolloutStatus {
        SafeRolloutStatus {
            phase: Some(phase),
            target_revision: target.map(Into::into),
            stable_revision: stable.map(Into::into),
            ..Default::default()
        }
    }

    #[test]
    fn abort_applies_only_to_a_rollout_in_progress() {
        assert_eq!(
            abort_revision(&rollout_status(
                Phase::Progressing,
                Some("new"),
                Some("old")
            )),
            Ok("new".into())
        );
        assert_eq!(
            abort_revision(&rollout_status(Phase::Paused, Some("new"), None)),
            Ok("new".into())
        );
        for (phase, target, stable) in [
            (Phase::Progressing, None, Some("old")),
            (Phase::Progressing, Some(""), Some("old")),
            (Phase::Succeeded, Some("new"), Some("new")),
            (Phase::Progressing, Some("new"), Some("new")),
            (Phase::Degraded, Some("new"), Some("old")),
            (Phase::RollingBack, Some("new"), Some("old")),
            (Phase::Pending, Some("new"), Some("old")),
        ] {
            let e = abort_revision(&rollout_status(phase, target, stable)).unwrap_err();
            assert!(e.starts_with("no rollout in progress"), "{phase}: {e}");
        }
    }

    fn blocked(revision: &str, at: &str) -> BlockedRevision {
        BlockedRevision {
            revision: revision.into(),
            reason: "GateFailed".into(),
            message: String::new(),
            template_hash: Some(format!("tpl-{revision}")),
            blocked_at: Time(at.parse().unwrap()),
        }
    }

    #[test]
    fn retry_defaults_to_the_most_recently_blocked_revision() {
        let mut st = SafeRolloutStatus {
            blocked_revisions: vec![
                blocked("r1", "2025-01-01T00:00:00Z"),
                blocked("r3", "2025-01-03T00:00:00Z"),
                blocked("r2", "2025-01-02T00:00:00Z"),
            ],
            ..Default::default()
        };
        assert_eq!(retry_revision(&st, None), Ok("r3".into()));
        assert_eq!(retry_revision(&st, Some("r1")), Ok("r1".into()));
        // A template hash names a blocked revision too.
        assert_eq!(retry_revision(&st, Some("tpl-r2")), Ok("tpl-r2".into()));
        let e = retry_revision(&st, Some("zz")).unwrap_err();
        assert_eq!(e, "revision zz is not blocked (blocked: r1, r3, r2)");
        // Same time: the later entry wins.
        st.blocked_revisions
            .push(blocked("r4", "2025-01-03T00:00:00Z"));
        assert_eq!(retry_revision(&st, None), Ok("r4".into()));
        // A value the operator already acted on would be ignored.
        st.last_retry = Some("r4".into());
        assert!(retry_revision(&st, None).unwrap_err().contains("lastRetry"));
    }

    #[test]
    fn retry_without_blocked_revisions_is_an_error() {
        assert_eq!(
            retry_revision(&SafeRolloutStatus::default(), None),
            Err("no revision is blocked: nothing to retry".into())
        );
    }

    #[test]
    fn pause_and_resume_write_only_changes() {
        assert_eq!(paused_change(false, true), Some(true));
        assert_eq!(paused_change(true, false), Some(false));
        assert_eq!(paused_change(true, true), None);
        assert_eq!(paused_change(false, false), None);
    }

    #[test]
    fn retry_clears_an_abort_of_the_same_revision() {
        assert_eq!(
            retry_patch("r1", Some("r1")),
            json!({"metadata": {"annotations": {
                "saferollout.dev/retry": "r1",
                "saferollout.dev/abort": null,
            }}})
        );
        for abort in [None, Some("r0")] {
            assert_eq!(
                retry_patch("r1", abort),
                json!({"metadata": {"annotations": {"saferollout.dev/retry": "r1"}}})
            );
        }
    }

    #[test]
    fn annotation_patches() {
        assert_eq!(
            annotation_patch(APPROVE_ANNOTATION, "2"),
            json!({"metadata": {"annotations": {"saferollout.dev/approve": "2"}}})
        );
    }
}
