//! Each need: when a pass has it and when not.

use serde_json::{Value, json};

use super::*;
use crate::gates::proof::LogMatch;

fn spec(gates: Value) -> SafeRolloutSpec {
    serde_json::from_value(json!({"targetRef": {"name": "plugin"}, "gates": gates})).unwrap()
}

fn status_of(v: Value) -> SafeRolloutStatus {
    serde_json::from_value(v).unwrap()
}

fn ts(s: &str) -> Timestamp {
    s.parse().unwrap()
}

const NOW: &str = "2026-01-01T00:10:00Z";

/// Rolling revision `new` on stage 1, holding `a` (stage 0) and `b`.
fn rolling() -> SafeRolloutStatus {
    status_of(json!({
        "phase": "Progressing", "stableRevision": "old", "targetRevision": "new",
        "currentStage": 1,
        "stages": [{"index": 0, "nodes": ["a"], "state": "Passed"},
                   {"index": 1, "nodes": ["b"], "state": "Soaking"}]
    }))
}

/// An agent pod of `revision` on `node`, Ready, its container started at
/// `started` (`None`: not started).
fn pod(name: &str, node: &str, revision: &str, started: Option<&str>) -> Arc<SlimPod> {
    let state = match started {
        Some(t) => json!({"running": {"startedAt": t}}),
        None => json!({"waiting": {"reason": "ContainerCreating"}}),
    };
    Arc::new(
        serde_json::from_value(json!({
            "metadata": {"name": name, "uid": format!("uid-{name}"),
                         "labels": {"controller-revision-hash": revision}},
            "spec": {"nodeName": node, "containers": [{"name": "agent"}]},
            "status": {"phase": "Running",
                       "conditions": [{"type": "Ready", "status": "True"}],
                       "containerStatuses": [{"name": "agent", "ready": true, "state": state}]}
        }))
        .unwrap(),
    )
}

fn known<'a>(
    spec: &'a SafeRolloutSpec,
    status: &'a SafeRolloutStatus,
    pods: &'a [Arc<SlimPod>],
) -> Known<'a> {
    Known {
        spec,
        status,
        now: ts(NOW),
        daemonset: Some(Target {
            uid: "ds-uid",
            generation: 3,
            current_revision: Some("new"),
        }),
        pods,
        probe_pods_exist: false,
        remembered: Remembered::default(),
    }
}

#[test]
fn a_rollout_without_gates_or_template_reads_nothing() {
    let (spec, status) = (spec(json!({})), rolling());
    assert_eq!(needs(&known(&spec, &status, &[])), Needs::default());
}

#[test]
fn spec_template_takes_a_dry_run_until_one_was_made_of_this_daemonset_and_template() {
    let mut spec = spec(json!({}));
    spec.template = Some(json!({"spec": {"containers": [{"name": "agent", "image": "a:2"}]}}));
    let status = rolling();
    let mut k = known(&spec, &status, &[]);
    let Template::DryRun { hash, of } = needs(&k).template else {
        panic!("a dry run first")
    };
    assert_eq!((of.daemonset_uid.as_str(), of.generation), ("ds-uid", 3));
    assert_eq!(of.template, hash);
    let answered = (of.clone(), true);
    k.remembered.dry_run = Some(&answered);
    assert_eq!(
        needs(&k).template,
        Template::Known {
            hash: hash.clone(),
            in_place: true
        },
        "the answer holds"
    );
    let older = (
        DryRunOf {
            generation: 2,
            ..of.clone()
        },
        true,
    );
    k.remembered.dry_run = Some(&older);
    assert!(
        matches!(needs(&k).template, Template::DryRun { .. }),
        "the DaemonSet changed since"
    );
    k.daemonset = None;
    assert_eq!(
        needs(&k).template,
        Template::Known {
            hash,
            in_place: false
        },
        "no DaemonSet to ask about"
    );
}

#[test]
fn an_unusable_spec_template_is_reported_not_dry_run() {
    let mut spec = spec(json!({}));
    spec.template = Some(json!({"spec": {"containers": "not a list"}}));
    let status = rolling();
    let Template::Invalid(message) = needs(&known(&spec, &status, &[])).template else {
        panic!("invalid")
    };
    assert!(message.starts_with("spec.template is not a valid pod template"));
}

#[test]
fn preflight_runs_when_a_rollout_of_the_current_revision_is_about_to_start() {
    let spec = spec(json!({}));
    let starting = status_of(json!({"phase": "Succeeded", "stableRevision": "old"}));
    let mut k = known(&spec, &starting, &[]);
    assert_eq!(needs(&k).preflight.as_deref(), Some("new"));
    k.daemonset = Some(Target {
        uid: "ds-uid",
        generation: 3,
        current_revision: None,
    });
    assert_eq!(needs(&k).preflight, None, "its revision not cached yet");
    k.daemonset = None;
    assert_eq!(needs(&k).preflight, None, "no DaemonSet");
    let status = rolling();
    assert_eq!(
        needs(&known(&spec, &status, &[])).preflight,
        None,
        "under way"
    );
    let current = status_of_stable("new");
    assert_eq!(
        needs(&known(&spec, &current, &[])).preflight,
        None,
        "nothing new"
    );
    let skip: SafeRolloutSpec = serde_json::from_value(
        json!({"targetRef": {"name": "plugin"}, "preflight": {"policy": "Skip"}}),
    )
    .unwrap();
    assert_eq!(needs(&known(&skip, &starting, &[])).preflight, None);
}

fn status_of_stable(revision: &str) -> SafeRolloutStatus {
    status_of(json!({"phase": "Succeeded", "stableRevision": revision}))
}

#[test]
fn probe_pods_are_read_with_a_probe_gate_or_while_some_are_left() {
    let with = spec(json!({"probe": {"image": "probe:1"}}));
    let without = spec(json!({}));
    let status = rolling();
    assert!(needs(&known(&with, &status, &[])).probe_pods);
    let mut k = known(&without, &status, &[]);
    assert!(!needs(&k).probe_pods);
    k.probe_pods_exist = true;
    assert!(needs(&k).probe_pods, "left by an earlier pass");
}

fn logs_spec() -> SafeRolloutSpec {
    spec(json!({"logs": {"window": "60s", "interval": "10s"}}))
}

#[test]
fn logs_are_looked_at_only_while_a_stage_is_judged_on_new_agents_of_held_nodes() {
    let spec = logs_spec();
    let pods = [
        pod("on-a", "a", "new", Some("2026-01-01T00:09:30Z")),
        pod("on-b", "b", "new", None),
        pod("old-on-b", "b", "old", Some("2026-01-01T00:00:00Z")),
        pod("on-c", "c", "new", Some("2026-01-01T00:09:30Z")),
    ];
    let status = rolling();
    let logs = needs(&known(&spec, &status, &pods)).logs.unwrap();
    let looked: Vec<(&str, bool)> = logs.iter().map(|l| (l.pod.as_str(), l.read)).collect();
    assert_eq!(
        looked,
        [("on-a", true), ("on-b", false)],
        "an agent not started yet is not read"
    );
    assert_eq!(logs[0].container.as_deref(), Some("agent"));
    assert_eq!(logs[0].window_end, Some(ts("2026-01-01T00:10:30Z")));
    assert!(logs[0].from_start);
    let paused = status_of(json!({"phase": "Failed", "targetRevision": "new", "currentStage": 1}));
    assert_eq!(
        needs(&known(&spec, &paused, &pods)).logs,
        None,
        "not rolling"
    );
    let none = self::spec(json!({}));
    assert_eq!(needs(&known(&none, &status, &pods)).logs, None, "no gate");
}

/// The need of the log of a pod started at 00:09:30 (window to 00:10:30,
/// now 00:10:00 unless `now` says otherwise) remembered as `read`, read
/// `since_read` ago.
fn log_need_after(read: LogRead, since_read: u64, now: &str) -> LogNeed {
    let spec = logs_spec();
    let status = rolling();
    let pods = [pod("on-a", "a", "new", Some("2026-01-01T00:09:30Z"))];
    let observed = LogObservation {
        pod: "on-a".into(),
        started_at: Some(ts("2026-01-01T00:09:30Z")),
        read,
    };
    let mut k = known(&spec, &status, &pods);
    k.now = ts(now);
    k.remembered.logs.insert(
        "uid-on-a",
        LogMemo {
            observed: &observed,
            since_read: Duration::from_secs(since_read),
            same_patterns: true,
        },
    );
    needs(&k).logs.unwrap().remove(0)
}

#[test]
fn a_log_is_read_each_interval_at_once_when_behind_and_once_after_its_window() {
    let clean = |at: &str| LogRead::Clean { at: ts(at) };
    let need = log_need_after(clean("2026-01-01T00:09:55Z"), 5, NOW);
    assert!(
        !need.read && !need.from_start,
        "read 5 s ago, interval 10 s"
    );
    assert!(log_need_after(clean("2026-01-01T00:09:50Z"), 10, NOW).read);
    let behind = LogRead::Behind {
        at: ts("2026-01-01T00:09:59Z"),
    };
    assert!(log_need_after(behind, 1, NOW).read, "stopped at its bound");
    let late = "2026-01-01T00:10:31Z";
    assert!(
        log_need_after(clean("2026-01-01T00:10:29Z"), 2, late).read,
        "the window closed since the last read"
    );
    assert!(
        !log_need_after(clean("2026-01-01T00:10:30Z"), 20, late).read,
        "read clean after the window: settled"
    );
    let matched = LogRead::Matched(LogMatch {
        pattern: "fatal".into(),
        origin: "spec.gates.logs.patterns[0]".into(),
        line: "fatal".into(),
    });
    assert!(
        !log_need_after(matched, 60, late).read,
        "a match is settled"
    );
}

#[test]
fn a_restarted_container_or_other_patterns_read_the_log_from_its_start() {
    let spec = logs_spec();
    let status = rolling();
    let pods = [pod("on-a", "a", "new", Some("2026-01-01T00:09:50Z"))];
    let observed = LogObservation {
        pod: "on-a".into(),
        started_at: Some(ts("2026-01-01T00:09:30Z")),
        read: LogRead::Clean {
            at: ts("2026-01-01T00:09:59Z"),
        },
    };
    let mut k = known(&spec, &status, &pods);
    let memo = |same_patterns| LogMemo {
        observed: &observed,
        since_read: Duration::from_secs(1),
        same_patterns,
    };
    k.remembered.logs.insert("uid-on-a", memo(true));
    let need = needs(&k).logs.unwrap().remove(0);
    assert!(need.from_start && need.read, "restarted since");
    let pods = [pod("on-a", "a", "new", Some("2026-01-01T00:09:30Z"))];
    k.pods = &pods;
    k.remembered.logs.insert("uid-on-a", memo(false));
    let need = needs(&k).logs.unwrap().remove(0);
    assert!(need.from_start && need.read, "the gate's patterns changed");
}

fn prometheus_spec() -> SafeRolloutSpec {
    spec(json!({"prometheus": [{
        "name": "xid", "address": "http://prometheus:9090",
        "query": "max by (node) (xid{node=~\"$STAGE_NODES\"})",
        "condition": "< 1", "interval": "30s"
    }]}))
}

#[test]
fn a_prometheus_query_starts_when_due_and_every_held_node_serves_the_new_agent() {
    let spec = prometheus_spec();
    let status = rolling();
    let serving = [
        pod("on-a", "a", "new", Some("2026-01-01T00:09:30Z")),
        pod("on-b", "b", "new", Some("2026-01-01T00:09:30Z")),
    ];
    let m = needs(&known(&spec, &status, &serving)).prometheus.unwrap();
    assert_eq!(m.subjects.len(), 1);
    let [q] = m.queries.as_slice() else {
        panic!("one query: {m:?}")
    };
    assert_eq!(q.name, "prometheus/xid");
    assert_eq!(
        q.subject,
        "new/1/max by (node) (xid{node=~\"$STAGE_NODES\"})"
    );
    assert_eq!(m.subjects["prometheus/xid"], q.subject);
    assert_eq!(
        q.query,
        format!("max by (node) (xid{{node=~\"{}\"}})", q.stage_nodes)
    );
    let half = [pod("on-a", "a", "new", Some("2026-01-01T00:09:30Z"))];
    let m = needs(&known(&spec, &status, &half)).prometheus.unwrap();
    assert!(m.queries.is_empty(), "b runs no new agent yet");
    assert_eq!(m.subjects.len(), 1, "measurements still handed in");
    let mut k = known(&spec, &status, &serving);
    k.remembered
        .queried
        .insert("prometheus/xid", Duration::from_secs(29));
    assert!(
        needs(&k).prometheus.unwrap().queries.is_empty(),
        "queried 29 s ago"
    );
    k.remembered
        .queried
        .insert("prometheus/xid", Duration::from_secs(30));
    assert_eq!(needs(&k).prometheus.unwrap().queries.len(), 1);
    k.remembered.querying.insert("prometheus/xid");
    assert!(
        needs(&k).prometheus.unwrap().queries.is_empty(),
        "one under way"
    );
}

#[test]
fn no_measurement_outside_a_judged_stage_or_after_the_verdict() {
    let spec = prometheus_spec();
    let pods = [pod("on-a", "a", "new", Some("2026-01-01T00:09:30Z"))];
    let unheld = status_of(json!({
        "phase": "Progressing", "targetRevision": "new", "currentStage": 0,
        "stages": [{"index": 0, "nodes": [], "state": "Replacing"}]
    }));
    assert_eq!(needs(&known(&spec, &unheld, &pods)).prometheus, None);
    let done = status_of(json!({"phase": "Succeeded", "targetRevision": "new"}));
    assert_eq!(needs(&known(&spec, &done, &pods)).prometheus, None);
    let passed = status_of(json!({
        "phase": "Progressing", "targetRevision": "new", "currentStage": 0,
        "stages": [{"index": 0, "nodes": ["a"], "state": "Soaking",
                    "gates": [{"gate": "prometheus/xid", "status": "Passed"}]}]
    }));
    let m = needs(&known(&spec, &passed, &pods)).prometheus.unwrap();
    assert!(m.queries.is_empty(), "the gate has its verdict");
}

#[test]
fn workload_pods_are_watched_on_held_nodes_while_a_stage_is_under_way() {
    let mut spec = spec(json!({"deviceHealth": {"driver": "gpu.example.com"}}));
    let status = status_of(json!({
        "currentStage": 1,
        "stages": [{"index": 0, "nodes": ["a"], "state": "Passed"},
                   {"index": 1, "nodes": ["b", "c"], "state": "Replacing"}]
    }));
    let want: Vec<String> = pods_to_watch(&spec, &status).into_iter().collect();
    assert_eq!(want, ["a", "b", "c"]);
    let mut passed = status.clone();
    passed.stages[1].state = StageState::Passed;
    assert!(
        pods_to_watch(&spec, &passed).is_empty(),
        "the stage is over"
    );
    spec.gates = None;
    assert!(
        pods_to_watch(&spec, &status).is_empty(),
        "no gate reads pods"
    );
}
