//! podsReady (always on): every agent pod on the rollout's nodes Running,
//! Ready and of the target revision within the progress deadline. Fails fast,
//! with the kubelet's reason, on waiting states that never resolve by themselves.

use saferollout_api::{GateResult, GateStatus};

use super::{Snapshot, result};

pub const NAME: &str = "podsReady";

/// Container waiting reasons that mean the release is bad, not slow.
const FATAL_WAITING_REASONS: &[&str] = &[
    "CrashLoopBackOff",
    "ImagePullBackOff",
    "InvalidImageName",
    "CreateContainerConfigError",
    "CreateContainerError",
    "RunContainerError",
];

pub fn evaluate(snap: &Snapshot) -> GateResult {
    let mut waiting_on: Vec<&str> = Vec::new();
    for node in snap
        .nodes
        .iter()
        .filter(|n| snap.node_states.contains_key(*n))
    {
        let target_pods = snap
            .pods
            .get(node)
            .into_iter()
            .flatten()
            .filter(|p| p.revision == snap.target_revision && !p.deleting);
        for pod in target_pods.clone() {
            if let Some(reason) = pod
                .waiting_reason
                .as_deref()
                .filter(|r| FATAL_WAITING_REASONS.contains(r))
            {
                let mut r = result(
                    NAME,
                    GateStatus::Failed,
                    reason,
                    format!(
                        "agent pod {} on node {node} is in {reason} (restarts: {}){}",
                        pod.name,
                        pod.restarts,
                        pod.waiting_message
                            .as_deref()
                            .map(|m| format!(": {m}"))
                            .unwrap_or_default()
                    ),
                );
                r.node = Some(node.clone());
                r.observed = Some(reason.to_string());
                r.expected = Some("Running and Ready".into());
                return r;
            }
        }
        if !target_pods.clone().any(|p| p.running && p.ready) {
            waiting_on.push(node);
        }
    }
    let total = snap
        .nodes
        .iter()
        .filter(|n| snap.node_states.contains_key(*n))
        .count();
    if waiting_on.is_empty() {
        return result(
            NAME,
            GateStatus::Passed,
            "PodsReady",
            format!(
                "{total}/{total} agent pods Running and Ready on revision {}",
                snap.target_revision
            ),
        );
    }
    let ready = total - waiting_on.len();
    let shown: Vec<&str> = waiting_on.iter().copied().take(5).collect();
    let message = format!(
        "{ready}/{total} agent pods Running and Ready on revision {}; waiting for {}{}",
        snap.target_revision,
        shown.join(", "),
        if waiting_on.len() > shown.len() {
            ", ..."
        } else {
            ""
        }
    );
    if snap.deadline_passed() {
        let mut r = result(
            NAME,
            GateStatus::Failed,
            "ProgressDeadlineExceeded",
            format!(
                "progress deadline of {:?} passed: {message}",
                snap.progress_deadline
            ),
        );
        r.node = Some(waiting_on[0].to_string());
        r.observed = Some(format!("{ready}/{total} Ready"));
        r.expected = Some(format!("{total}/{total} Ready"));
        return r;
    }
    result(NAME, GateStatus::Pending, "PodsNotReady", message)
}

#[cfg(test)]
mod tests {
    use super::super::test_support::*;
    use super::*;

    #[test]
    fn passes_when_every_node_has_a_ready_target_pod() {
        let w = World::healthy(3, 8);
        let r = evaluate(&w.snapshot());
        assert_eq!(r.status, GateStatus::Passed, "{r:?}");
        assert_eq!(
            r.message,
            "3/3 agent pods Running and Ready on revision new"
        );
    }

    #[test]
    fn pending_while_a_pod_is_old_missing_or_unready() {
        let mut w = World::healthy(3, 8);
        w.pods.get_mut("node-0").unwrap()[0].revision = "old".into();
        w.pods.remove("node-1");
        w.pods.get_mut("node-2").unwrap()[0].ready = false;
        let r = evaluate(&w.snapshot());
        assert_eq!(r.status, GateStatus::Pending);
        assert_eq!(r.reason, "PodsNotReady");
        assert!(
            r.message.contains("0/3") && r.message.contains("node-0, node-1, node-2"),
            "{}",
            r.message
        );
    }

    #[test]
    fn a_deleting_pod_does_not_count() {
        let mut w = World::healthy(1, 8);
        w.pods.get_mut("node-0").unwrap()[0].deleting = true;
        assert_eq!(evaluate(&w.snapshot()).status, GateStatus::Pending);
    }

    #[test]
    fn fails_fast_on_crashloop_with_the_reason_and_node() {
        let mut w = World::healthy(2, 8);
        let pod = &mut w.pods.get_mut("node-1").unwrap()[0];
        pod.ready = false;
        pod.running = false;
        pod.waiting_reason = Some("CrashLoopBackOff".into());
        pod.restarts = 3;
        let r = evaluate(&w.snapshot());
        assert_eq!(r.status, GateStatus::Failed);
        assert_eq!(r.reason, "CrashLoopBackOff");
        assert_eq!(r.node.as_deref(), Some("node-1"));
        assert!(r.message.contains("restarts: 3"));
    }

    #[test]
    fn image_pull_backoff_fails_but_err_image_pull_waits() {
        let mut w = World::healthy(1, 8);
        let pod = &mut w.pods.get_mut("node-0").unwrap()[0];
        pod.ready = false;
        pod.waiting_reason = Some("ErrImagePull".into());
        assert_eq!(evaluate(&w.snapshot()).status, GateStatus::Pending);
        w.pods.get_mut("node-0").unwrap()[0].waiting_reason = Some("ImagePullBackOff".into());
        assert_eq!(evaluate(&w.snapshot()).reason, "ImagePullBackOff");
    }

    #[test]
    fn fails_when_the_deadline_passes() {
        let mut w = World::healthy(2, 8);
        w.pods.get_mut("node-0").unwrap()[0].ready = false;
        w.now = ts(601);
        let r = evaluate(&w.snapshot());
        assert_eq!(r.status, GateStatus::Failed);
        assert_eq!(r.reason, "ProgressDeadlineExceeded");
        assert_eq!(r.node.as_deref(), Some("node-0"));
    }

    #[test]
    fn vanished_nodes_are_not_waited_for() {
        let mut w = World::healthy(2, 8);
        w.node_states.remove("node-1");
        w.pods.remove("node-1");
        let r = evaluate(&w.snapshot());
        assert_eq!(r.status, GateStatus::Passed, "{r:?}");
        assert!(r.message.starts_with("1/1"));
    }
}
