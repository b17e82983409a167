//! podsReady (always on): every agent pod on the rollout's nodes Running,
//! Ready and of the target revision before the progress deadline (or
//! `gates.podsReady.timeout`) passes without progress. Fails at once, with the
//! kubelet's reason, on waiting states that never resolve by themselves.

use std::time::Duration;

use saferollout_api::{GATE_PODS_READY, GateStatus};

use super::{Snapshot, Verdict, list_some, result};

pub const NAME: &str = GATE_PODS_READY;

/// Container waiting reasons that mean the release is bad, not slow.
const FATAL_WAITING_REASONS: &[&str] = &[
    "CrashLoopBackOff",
    "ImagePullBackOff",
    "InvalidImageName",
    "CreateContainerConfigError",
    "CreateContainerError",
    "RunContainerError",
];

pub fn evaluate(snap: &Snapshot, deadline: Duration) -> Verdict {
    let total = snap.nodes.len();
    if total == 0 {
        // Nothing judged is nothing proven.
        return Verdict::new(result(
            NAME,
            GateStatus::Pending,
            "NoNodes",
            "no node of the rollout to judge yet".into(),
        ));
    }
    let mut waiting_on: Vec<&str> = Vec::new();
    let mut fatal = None;
    let mut violating = std::collections::BTreeSet::new();
    for &node in snap.nodes {
        let target_pods = snap
            .pods
            .get(node)
            .into_iter()
            .flatten()
            .filter(|p| p.revision == snap.target_revision && !p.deleting);
        let mut ready = false;
        for pod in target_pods {
            if let Some(reason) = pod
                .waiting_reason
                .filter(|r| FATAL_WAITING_REASONS.contains(r))
            {
                violating.insert(node.to_string());
                fatal.get_or_insert((node, *pod, reason));
            }
            ready |= pod.running && pod.ready;
        }
        if !ready {
            waiting_on.push(node);
        }
    }
    if let Some((node, pod, reason)) = fatal {
        let mut r = result(
            NAME,
            GateStatus::Failed,
            reason,
            format!(
                "agent pod {} on node {node} is in {reason} (restarts: {}){}",
                pod.name,
                pod.restarts,
                pod.waiting_message
                    .map(|m| format!(": {m}"))
                    .unwrap_or_default()
            ),
        );
        r.node = Some(node.to_string());
        r.observed = Some(reason.to_string());
        r.expected = Some("Running and Ready".into());
        return Verdict {
            violating,
            ..Verdict::new(r)
        };
    }
    if waiting_on.is_empty() {
        return Verdict::new(result(
            NAME,
            GateStatus::Passed,
            "PodsReady",
            format!(
                "{total}/{total} agent pods Running and Ready on revision {}",
                snap.target_revision
            ),
        ));
    }
    let ready = total - waiting_on.len();
    let message = format!(
        "{ready}/{total} agent pods Running and Ready on revision {}; waiting for {}",
        snap.target_revision,
        list_some(&waiting_on)
    );
    if snap.without_progress >= deadline {
        let mut r = result(
            NAME,
            GateStatus::Failed,
            "ProgressDeadlineExceeded",
            format!("no progress for {deadline:?}: {message}"),
        );
        r.node = Some(waiting_on[0].to_string());
        r.observed = Some(format!("{ready}/{total} Ready"));
        r.expected = Some(format!("{total}/{total} Ready"));
        return Verdict {
            violating: waiting_on.iter().map(|n| n.to_string()).collect(),
            ..Verdict::new(r)
        };
    }
    Verdict::new(result(NAME, GateStatus::Pending, "PodsNotReady", message))
}

#[cfg(test)]
mod tests {
    use super::super::test_support::*;
    use super::*;

    const DEADLINE: Duration = Duration::from_secs(600);

    fn eval(w: &World) -> Verdict {
        w.with_snapshot(|s| evaluate(s, DEADLINE))
    }

    #[test]
    fn passes_when_every_node_has_a_ready_target_pod() {
        let w = World::healthy(3, 8);
        let v = eval(&w);
        assert_eq!(v.result.status, GateStatus::Passed, "{v:?}");
        assert_eq!(
            v.result.message,
            "3/3 agent pods Running and Ready on revision new"
        );
        assert!(v.violating.is_empty());
    }

    #[test]
    fn a_gate_with_no_node_never_passes() {
        let mut w = World::healthy(0, 8);
        w.nodes.clear();
        let v = eval(&w);
        assert_eq!(
            (v.result.status, v.result.reason.as_str()),
            (GateStatus::Pending, "NoNodes")
        );
    }

    #[test]
    fn pending_while_a_pod_is_old_missing_or_unready() {
        let mut w = World::healthy(3, 8);
        w.pod("node-0").revision = "old".into();
        w.pods.remove("node-1");
        w.pod("node-2").ready = false;
        let v = eval(&w);
        assert_eq!(v.result.status, GateStatus::Pending);
        assert_eq!(v.result.reason, "PodsNotReady");
        assert!(
            v.result.message.contains("0/3") && v.result.message.contains("node-0, node-1, node-2"),
            "{}",
            v.result.message
        );
        assert!(v.violating.is_empty(), "starting pods violate nothing");
    }

    #[test]
    fn a_deleting_pod_does_not_count() {
        let mut w = World::healthy(1, 8);
        w.pod("node-0").deleting = true;
        assert_eq!(eval(&w).result.status, GateStatus::Pending);
    }

    #[test]
    fn fails_fast_on_crashloop_with_the_reason_and_every_crashing_node() {
        let mut w = World::healthy(3, 8);
        for n in ["node-1", "node-2"] {
            let pod = w.pod(n);
            pod.ready = false;
            pod.running = false;
            pod.waiting_reason = Some("CrashLoopBackOff".into());
            pod.restarts = 3;
        }
        let v = eval(&w);
        assert_eq!(v.result.status, GateStatus::Failed);
        assert_eq!(v.result.reason, "CrashLoopBackOff");
        assert_eq!(v.result.node.as_deref(), Some("node-1"));
        assert!(v.result.message.contains("restarts: 3"));
        assert_eq!(v.violating.len(), 2);
    }

    #[test]
    fn image_pull_backoff_fails_but_err_image_pull_waits() {
        let mut w = World::healthy(1, 8);
        w.pod("node-0").ready = false;
        w.pod("node-0").waiting_reason = Some("ErrImagePull".into());
        assert_eq!(eval(&w).result.status, GateStatus::Pending);
        w.pod("node-0").waiting_reason = Some("ImagePullBackOff".into());
        assert_eq!(eval(&w).result.reason, "ImagePullBackOff");
    }

    #[test]
    fn fails_when_no_progress_for_the_deadline() {
        let mut w = World::healthy(2, 8);
        w.pod("node-0").ready = false;
        w.without_progress = Duration::from_secs(599);
        assert_eq!(eval(&w).result.status, GateStatus::Pending);
        w.without_progress = DEADLINE;
        let v = eval(&w);
        assert_eq!(v.result.status, GateStatus::Failed);
        assert_eq!(v.result.reason, "ProgressDeadlineExceeded");
        assert_eq!(v.result.node.as_deref(), Some("node-0"));
        assert!(v.violating.contains("node-0"));
    }
}
