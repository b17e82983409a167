//! What the executor writes for each [`super::Step`], built here so the
//! operator only sends it: the canary DaemonSet, the target's template with
//! its handover expression (or without it), a released pod's labels, the
//! canary's nudge. The mechanics are the ones
//! `crates/testkit/tests/selector_handover.rs` proves against the real
//! DaemonSet controller.

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, OwnerReference};
use serde_json::{Value, json};

use super::{CANARY_OF_LABEL, RETIRING_ANNOTATION, canary_name, template};
use saferollout_api::{MANAGED_BY, MANAGED_BY_LABEL, REVISION_HASH_LABEL, ROLLOUT_LABEL};

/// The label the DaemonSet controller writes on each pod besides its hash;
/// a released pod drops the canary's (the target's differs).
pub const TEMPLATE_GENERATION_LABEL: &str = "pod-template-generation";
/// Annotation the promotion changes on the canary so its controller syncs
/// it again and sees the promotion's taints (a NoSchedule taint alone
/// enqueues no DaemonSet).
pub const NUDGE_ANNOTATION: &str = "saferollout.dev/promotion-nudge";

/// Why a canary cannot be built for a target.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CanaryError {
    #[error("DaemonSet {0} has no spec.selector.matchLabels to extend for the canary")]
    NoMatchLabels(String),
}

/// The canary DaemonSet for `target`: `template` with the canary's
/// expression and label, a selector that is the target's plus the canary
/// label (it selects only pods the target's selector also selects, and
/// never the target's own, which lack the label: after the canary's
/// orphaning deletion the target adopts its pods), `OnDelete`, owned by the
/// SafeRollout `owner` (deleted with it unless the operator orphans its pods
/// first).
pub fn canary_daemonset(
    target: &DaemonSet,
    template: &Value,
    key: &str,
    rollout_id: &str,
    owner: OwnerReference,
) -> Result<DaemonSet, CanaryError> {
    let target_name = target.metadata.name.clone().unwrap_or_default();
    let mut match_labels = target
        .spec
        .selector
        .match_labels
        .clone()
        .filter(|m| !m.is_empty())
        .ok_or_else(|| CanaryError::NoMatchLabels(target_name.clone()))?;
    match_labels.insert(CANARY_OF_LABEL.into(), rollout_id.into());
    let canary_template = template::canary_template(template, key, rollout_id);
    let mut ds: DaemonSet = serde_json::from_value(json!({
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {
            "name": canary_name(&target_name),
            "namespace": target.metadata.namespace,
            "labels": {
                MANAGED_BY_LABEL: MANAGED_BY,
                ROLLOUT_LABEL: rollout_id,
                CANARY_OF_LABEL: rollout_id,
            },
        },
        "spec": {
            "updateStrategy": {"type": "OnDelete"},
            "template": canary_template,
            "revisionHistoryLimit": target.spec.revision_history_limit.unwrap_or(10),
            "minReadySeconds": target.spec.min_ready_seconds.unwrap_or(0),
        }
    }))
    .unwrap_or_default();
    ds.spec.selector = LabelSelector {
        match_labels: Some(match_labels),
        match_expressions: None,
    };
    ds.metadata.owner_references = Some(vec![owner]);
    Ok(ds)
}

/// The JSON patch that writes `template` (with the canary's additions) to an
/// existing canary, no longer retiring.
pub fn canary_template_patch(template: &Value, key: &str, rollout_id: &str) -> Value {
    let t = template::canary_template(template, key, rollout_id);
    json!({
        "spec": {"template": t},
        "metadata": {"annotations": {RETIRING_ANNOTATION: null}},
    })
}

/// The merge patch marking the canary retiring (nodes go back to the target).
pub fn retiring_patch() -> Value {
    json!({"metadata": {"annotations": {RETIRING_ANNOTATION: "true"}}})
}

/// The merge patch that makes the canary's controller sync it again.
pub fn nudge_patch(now: &str) -> Value {
    json!({"metadata": {"annotations": {NUDGE_ANNOTATION: now}}})
}

/// The target's template with its handover expression (`expression`) or
/// without it (as the strategy found it, or promoted).
pub fn target_template(template: &Value, key: &str, expression: bool) -> Value {
    let stripped = template::strip(template, key);
    if expression {
        template::target_template(&stripped, key)
    } else {
        stripped
    }
}

/// The merge patch that releases a canary pod to the target (or aligns a
/// target pod's hash): the target's current hash, without the canary label
/// or the canary's template generation.
pub fn release_patch(hash: &str) -> Value {
    json!({"metadata": {"labels": {
        REVISION_HASH_LABEL: hash,
        CANARY_OF_LABEL: null,
        TEMPLATE_GENERATION_LABEL: null,
    }}})
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::selector::{handover_label_key, revision_name};

    fn target() -> DaemonSet {
        serde_json::from_value(json!({
            "apiVersion": "apps/v1", "kind": "DaemonSet",
            "metadata": {"name": "plugin", "namespace": "gpu"},
            "spec": {
                "selector": {"matchLabels": {"app": "plugin"}},
                "updateStrategy": {"type": "OnDelete"},
                "template": {
                    "metadata": {"labels": {"app": "plugin"}},
                    "spec": {"containers": [{"name": "p", "image": "plugin:v1"}]}
                }
            }
        }))
        .unwrap()
    }

    fn owner() -> OwnerReference {
        OwnerReference {
            api_version: "saferollout.dev/v1alpha1".into(),
            kind: "SafeRollout".into(),
            name: "plugin".into(),
            uid: "u-1".into(),
            controller: Some(true),
            block_owner_deletion: Some(true),
        }
    }

    #[test]
    fn the_canary_selects_a_subset_of_the_targets_pods_and_runs_the_new_content() {
        let key = handover_label_key("gpu.plugin");
        let new = json!({
            "metadata": {"labels": {"app": "plugin"}},
            "spec": {"containers": [{"name": "p", "image": "plugin:v2"}]}
        });
        let c = canary_daemonset(&target(), &new, &key, "gpu.plugin", owner()).unwrap();
        assert_eq!(
            c.metadata.name.as_deref(),
            Some("plugin-saferollout-canary")
        );
        assert_eq!(c.metadata.namespace.as_deref(), Some("gpu"));
        let sel = c.spec.selector.match_labels.clone().unwrap();
        assert_eq!(sel.get("app").map(String::as_str), Some("plugin"));
        assert_eq!(
            sel.get(CANARY_OF_LABEL).map(String::as_str),
            Some("gpu.plugin")
        );
        // Its pods carry every label of its selector.
        let labels = c.spec.template.metadata.clone().unwrap().labels.unwrap();
        assert!(sel.iter().all(|(k, v)| labels.get(k) == Some(v)));
        assert_eq!(
            c.spec.update_strategy.unwrap().type_.as_deref(),
            Some("OnDelete")
        );
        // By content it is the new template.
        let as_json = serde_json::to_value(&c.spec.template).unwrap();
        assert_eq!(
            revision_name(&template::strip(&as_json, &key)),
            revision_name(&new)
        );
        assert_eq!(c.metadata.owner_references.unwrap()[0].uid, "u-1");
    }

    #[test]
    fn a_target_without_match_labels_is_refused_by_name() {
        let mut t = target();
        t.spec.selector.match_labels = None;
        let err = canary_daemonset(&t, &json!({}), "k", "id", owner()).unwrap_err();
        assert!(err.to_string().contains("DaemonSet plugin"), "{err}");
    }

    #[test]
    fn the_targets_expression_comes_and_goes_without_touching_the_rest() {
        let key = handover_label_key("gpu.plugin");
        let plain = serde_json::to_value(&target().spec.template).unwrap();
        let with = target_template(&plain, &key, true);
        assert_ne!(with, plain);
        assert_eq!(target_template(&with, &key, false), plain);
        // Idempotent both ways.
        assert_eq!(target_template(&with, &key, true), with);
        assert_eq!(target_template(&plain, &key, false), plain);
    }

    #[test]
    fn a_released_pod_loses_the_canary_label_and_takes_the_hash() {
        let p = release_patch("abc");
        assert_eq!(p["metadata"]["labels"][REVISION_HASH_LABEL], "abc");
        assert!(p["metadata"]["labels"][CANARY_OF_LABEL].is_null());
        assert!(
            p["metadata"]["labels"]
                .as_object()
                .unwrap()
                .contains_key(TEMPLATE_GENERATION_LABEL)
        );
    }
}
