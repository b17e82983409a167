//! State-machine scenarios against the model (`model/`): each one names a
//! behaviour and asserts it, and every one also asserts that no safety rule
//! was broken on the way.

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use saferollout_api::{DurationString, Phase, Stage, StageState, quantity_count};

use super::model::{GPUS, Lag, Losses, Model, RESOURCE, Release};
use super::*;
use crate::conditions;
use crate::gates::test_support::as_stored;

pub(super) fn settled(nodes: usize) -> Model {
    let mut m = Model::new(nodes);
    m.run(60);
    assert_eq!(m.status.phase, Some(Phase::Succeeded), "{:#?}", m.status);
    m
}

fn degraded_reason(m: &Model) -> Option<String> {
    conditions::get(&m.status.conditions, conditions::DEGRADED)
        .filter(|c| c.status == "True")
        .map(|c| c.reason.clone())
}

pub(super) fn no_violations(m: &Model) {
    assert!(
        m.checker.violations.is_empty(),
        "safety rules broken: {:#?}",
        m.checker.violations
    );
}

fn stages(spec: &[(&str, bool)]) -> Vec<Stage> {
    spec.iter()
        .map(|(n, pause)| {
            let nodes = match n.parse::<i32>() {
                Ok(i) => IntOrString::Int(i),
                Err(_) => IntOrString::String(n.to_string()),
            };
            Stage {
                pause: *pause,
                ..Stage::new(nodes)
            }
        })
        .collect()
}

#[test]
fn adopting_records_the_original_strategy_and_backs_up_first() {
    let mut m = Model::new(4);
    let d = m.one_reconcile();
    assert_eq!(d.actions, vec![Action::TakeOverUpdates]);
    assert_eq!(
        m.status
            .original_update_strategy
            .as_ref()
            .and_then(|s| s.type_.as_deref()),
        Some("RollingUpdate")
    );
    let d = m.one_reconcile();
    assert_eq!(
        d.actions,
        vec![Action::BackupTemplate {
            revision: "v1".into()
        }]
    );
    assert_eq!(m.status.stable_revision.as_deref(), Some("v1"));
    m.run(10);
    assert!(conditions::is_true(&m.status.conditions, conditions::READY));
    assert!(m.labelled().is_empty());
    assert_eq!(m.pods_on("v1"), 4, "adoption replaces no pod");
    no_violations(&m);
}

#[test]
fn a_healthy_revision_goes_through_every_stage_within_its_size() {
    let mut m = settled(20);
    m.write_revision("v2", Release::Healthy);
    m.run(600);
    assert_eq!(m.status.phase, Some(Phase::Succeeded), "{:#?}", m.status);
    assert_eq!(m.status.stable_revision.as_deref(), Some("v2"));
    assert_eq!(m.cluster.backup.as_deref(), Some("v2"));
    assert!(m.all_on("v2"));
    assert!(m.labelled().is_empty(), "labels must be removed at the end");
    // Default stages 1, 10%, 50%, 100% of 20 nodes: 1, 2, 10, 20.
    let sizes: Vec<usize> = m.status.stages.iter().map(|s| s.nodes.len()).collect();
    assert_eq!(sizes, vec![1, 1, 8, 10]);
    for (stage, limit) in [(0, 1), (1, 2), (2, 10), (3, 20)] {
        assert!(
            m.checker.max_on_target[&stage] <= limit,
            "stage {stage}: {} on target",
            m.checker.max_on_target[&stage]
        );
    }
    assert!(
        m.status
            .stages
            .iter()
            .all(|s| s.state == StageState::Passed)
    );
    // Canary and second stage landed in different zones.
    let canary = &m.status.stages[0].nodes[0];
    let second = &m.status.stages[1].nodes[0];
    assert_ne!(
        m.cluster.nodes[canary].labels,
        m.cluster.nodes[second].labels
    );
    no_violations(&m);
}

#[test]
fn max_unavailable_limits_pods_replaced_at_once() {
    let mut m = settled(10);
    m.spec.stages = Some(stages(&[("100%", false)]));
    m.spec.max_unavailable = IntOrString::Int(3);
    // Pods of v2 never become Ready: the first three are all that go.
    m.write_revision("v2", Release::Unready);
    for _ in 0..30 {
        let d = m.one_reconcile();
        let _ = d;
    }
    assert_eq!(m.pods_on("v2"), 3, "3 in flight, none Ready");
    no_violations(&m);
}

#[test]
fn a_node_reading_no_devices_for_a_moment_holds_a_slot_without_halting_the_stage() {
    let mut m = settled(12);
    m.spec.stages = Some(stages(&[("100%", false)]));
    m.spec.max_unavailable = IntOrString::Int(4);
    // A replaced plugin's zone-a node reads 0 devices for 6 s after its pod
    // starts, shorter than the allocatable gate's 10 s soak; zone-b nodes
    // advertise at once.
    m.write_revision("v2", Release::LateInZoneA(6));
    let no_devices = |m: &Model| -> BTreeSet<String> {
        m.cluster
            .nodes
            .values()
            .filter(|n| n.allocatable.get(RESOURCE).and_then(quantity_count) == Some(0))
            .map(|n| n.name.clone())
            .collect()
    };
    let mut replaced_around_a_violation = false;
    for _ in 0..300 {
        let reading_zero = no_devices(&m);
        // Nodes without a serving agent or without devices: the budget.
        let down =
            m.cluster
                .nodes
                .keys()
                .filter(|n| {
                    reading_zero.contains(*n)
                        || !m.cluster.pods.values().any(|p| {
                            p.node == **n && p.ready && p.running && p.terminating.is_none()
                        })
                })
                .count();
        assert!(down <= 4, "{down} nodes down at maxUnavailable 4");
        let d = m.one_reconcile();
        let deleted = super::nodes_deleted_on(&d.actions);
        assert!(
            deleted.iter().all(|n| !reading_zero.contains(*n)),
            "the agent of a violating node was replaced: {deleted:?}"
        );
        replaced_around_a_violation |= !deleted.is_empty() && !reading_zero.is_empty();
        if m.status.phase == Some(Phase::Succeeded) && m.all_on("v2") {
            break;
        }
    }
    assert_eq!(m.status.phase, Some(Phase::Succeeded), "{:#?}", m.status);
    assert!(
        replaced_around_a_violation,
        "a soaking violation halted every replacement"
    );
    no_violations(&m);
}

/// Node label writes of one rollout (stages 2, 100%) of a healthy release
/// over 6 nodes, its caches of nodes `node_lag` seconds behind.
fn label_writes_of_a_rollout(node_lag: usize) -> usize {
    let mut m = settled(6);
    m.spec.stages = Some(stages(&[("2", false), ("100%", false)]));
    m.label_writer.writes = 0;
    m.write_revision("v2", Release::Healthy);
    let lag = Lag {
        nodes: node_lag,
        ..Lag::default()
    };
    let labelled = |m: &Model| {
        m.cluster
            .nodes
            .values()
            .any(|n| n.labels.contains_key(saferollout_api::ROLLOUT_LABEL))
    };
    for _ in 0..200 {
        if m.status.phase == Some(Phase::Succeeded) && m.all_on("v2") && !labelled(&m) {
            break;
        }
        m.reconcile(lag, Losses::default());
        m.advance();
    }
    assert!(
        m.all_on("v2") && !labelled(&m),
        "lag {node_lag}: rolled out and unlabelled:\n{}",
        m.trace.join("\n")
    );
    no_violations(&m);
    m.label_writer.writes
}

#[test]
fn a_node_cache_behind_the_label_writes_writes_no_label_twice() {
    let fresh = label_writes_of_a_rollout(0);
    assert!(fresh >= 12, "each node labelled and unlabelled: {fresh}");
    for lag in [1, 3, 5] {
        assert_eq!(
            label_writes_of_a_rollout(lag),
            fresh,
            "node cache {lag} s behind: the labels written are remembered"
        );
    }
}

#[test]
fn a_stages_pods_are_replaced_once_its_nodes_carry_its_labels() {
    let mut m = settled(6);
    m.spec.stages = Some(stages(&[("2", false), ("100%", false)]));
    m.spec.max_unavailable = IntOrString::Int(2);
    m.write_revision("v2", Release::Healthy);
    let mut replaced = BTreeSet::new();
    for _ in 0..100 {
        if m.status.phase == Some(Phase::Succeeded) && m.all_on("v2") {
            break;
        }
        let Some(d) = m.reconcile(Lag::default(), Losses::default()) else {
            m.advance();
            continue;
        };
        for a in &d.actions {
            let Action::DeletePods { pods } = a else {
                continue;
            };
            for p in pods {
                let node = &m.cluster.nodes[&p.node];
                assert_eq!(
                    node.labels
                        .get(saferollout_api::ROLLOUT_LABEL)
                        .map(String::as_str),
                    Some("ns.plugin"),
                    "{} replaced before its label was on it:\n{}",
                    p.node,
                    m.trace.join("\n")
                );
                replaced.insert(p.node.clone());
            }
        }
        m.advance();
    }
    assert!(m.all_on("v2") && replaced.len() == 6, "{replaced:?}");
    no_violations(&m);
}

/// The node watch can show a stage's labels before the label writer has
/// recorded the API server's answers. The pass the watch wakes must not wait
/// for those writes (the node carries its labels), and a pass must come once
/// the writer records them: no other event may ever wake the rollout (the
/// engine and quarantine tests' flake, a stage replacing nothing for minutes).
/// Passes here run only when the operator's would.
#[test]
fn a_stage_whose_labels_the_watch_shows_before_their_answers_goes_on() {
    for (stages_spec, nodes) in [
        (&[("1", false), ("100%", false)][..], 4),
        (&[("2", false), ("50%", false), ("100%", false)][..], 8),
    ] {
        let mut m = settled(nodes);
        m.spec.stages = Some(stages(stages_spec));
        m.label_writer.responses_lag = true;
        m.write_revision("v2", Release::Healthy);
        assert!(
            m.run_woken("v2", 120),
            "{stages_spec:?}: stalled: {:#?}\n{}",
            m.status.phase,
            m.trace.join("\n")
        );
        no_violations(&m);
    }
}

/// A deletion the budget did not pay for (the pod was not Ready) carries the
/// pod's resourceVersion as a precondition. A pod that changed meanwhile (it
/// became Ready as its node recovered, the engine test's case) refuses the
/// delete: nothing was deleted, so the next pass decides on it again instead
/// of showing it terminating for a minute (and then, with no event to wake
/// it, never: a node left converging for good).
#[test]
fn a_deletion_refused_by_its_precondition_is_decided_again_at_once() {
    let mut m = settled(4);
    m.spec.stages = Some(stages(&[("1", false), ("100%", false)]));
    m.spec.max_unavailable = IntOrString::Int(1);
    // A release whose agent never becomes Ready, aborted once the canary runs
    // it: the revert deletes that agent for free.
    m.write_revision("v2", Release::Unready);
    for _ in 0..10 {
        m.one_reconcile();
    }
    assert!(m.cluster.pods.values().any(|p| p.revision == "v2"));
    m.abort = m.status.target_revision.clone();
    let free_deletions = |d: &Decision| -> BTreeSet<String> {
        d.actions
            .iter()
            .filter_map(|a| match a {
                Action::DeletePods { pods } => Some(pods.iter()),
                _ => None,
            })
            .flatten()
            .filter(|p| p.unchanged_since.is_some())
            .map(|p| p.uid.clone())
            .collect()
    };
    // Every pod changes after the caches took their picture, until a pass
    // deletes one for free: that deletion is refused.
    let refused = (0..120)
        .find_map(|_| {
            for p in m.cluster.pods.values_mut() {
                p.version = format!("{}-touched", p.version);
            }
            let d = m.reconcile(Lag::default(), Losses::default())?;
            let uids = free_deletions(&d);
            m.advance();
            (!uids.is_empty()).then_some(uids)
        })
        .unwrap_or_else(|| {
            panic!(
                "a pass deletes a pod that is not Ready:\n{}",
                m.trace.join("\n")
            )
        });
    for uid in &refused {
        let p = &m.cluster.pods[uid];
        assert!(
            p.terminating.is_none(),
            "the refused delete deleted nothing"
        );
    }
    let again = m.one_reconcile();
    assert_eq!(
        free_deletions(&again),
        refused,
        "the next pass deletes the same pods again"
    );
    m.run(300);
    assert!(m.all_on("v1"), "{:#?}", m.status);
    no_violations(&m);
}

#[test]
fn a_broken_release_is_reverted_at_the_canary() {
    let mut m = settled(8);
    m.write_revision("v2", Release::Broken);
    m.run(200);
    assert_eq!(m.status.phase, Some(Phase::Degraded), "{:#?}", m.status);
    assert_eq!(degraded_reason(&m).as_deref(), Some("AllocatableFailed"));
    assert_eq!(
        m.checker.touched["v2"].len(),
        1,
        "only the canary got v2: {:?}",
        m.checker.touched["v2"]
    );
    assert!(m.all_on("v1"));
    assert_eq!(m.cluster.ds.template, "v1");
    let blocked = &m.status.blocked_revisions[0];
    assert_eq!(blocked.revision, "v2");
    assert_eq!(blocked.reason, "BelowMinimum");
    assert!(
        blocked.message.contains("is 0, expected >= 8"),
        "{}",
        blocked.message
    );
    assert!(m.labelled().is_empty());
    assert!(!conditions::is_true(
        &m.status.conditions,
        conditions::READY
    ));
    assert!(conditions::is_true(
        &m.status.conditions,
        conditions::STALLED
    ));
    no_violations(&m);
}

#[test]
fn a_quantity_in_thousands_is_judged_as_a_count() {
    // Regression: "8k" read as nothing made the baseline 0, so a broken
    // release passed the canary. Now it is 8000, and 0 is below it.
    let mut m = Model::new(4);
    m.run(60);
    for n in m.cluster.nodes.values_mut() {
        n.allocatable.insert(
            RESOURCE.into(),
            k8s_openapi::apimachinery::pkg::api::resource::Quantity("8k".into()),
        );
    }
    m.write_revision("v2", Release::Broken);
    m.run(200);
    assert_eq!(m.status.blocked_revisions[0].reason, "BelowMinimum");
    assert_eq!(m.checker.touched["v2"].len(), 1);
    no_violations(&m);
}

#[test]
fn a_failure_at_a_later_stage_reverts_every_node_within_the_budget() {
    let mut m = settled(8);
    m.write_revision("v2", Release::BrokenInZoneB);
    m.run(400);
    assert_eq!(m.status.phase, Some(Phase::Degraded), "{:#?}", m.status);
    let failed = m
        .status
        .stages
        .iter()
        .find(|s| s.state == StageState::Failed)
        .unwrap();
    assert!(
        failed.index >= 1,
        "the canary (zone a) passed; a later stage failed"
    );
    assert!(m.status.stages[0].state == StageState::Passed);
    assert!(m.all_on("v1"));
    no_violations(&m);
}

#[test]
fn an_overcounting_release_is_reverted_by_the_ceiling() {
    let mut m = settled(4);
    m.write_revision("v2", Release::Overcount);
    m.run(200);
    assert_eq!(m.status.blocked_revisions[0].reason, "AboveMaximum");
    assert!(m.all_on("v1"));
    no_violations(&m);
}

#[test]
fn a_crashlooping_release_fails_fast() {
    let mut m = settled(4);
    m.write_revision("v2", Release::Crashloop);
    let start = m.now;
    m.run(200);
    assert_eq!(m.status.blocked_revisions[0].reason, "CrashLoopBackOff");
    assert_eq!(degraded_reason(&m).as_deref(), Some("PodsReadyFailed"));
    let took = m.status.blocked_revisions[0]
        .blocked_at
        .0
        .duration_since(start);
    assert!(took < jiff::SignedDuration::from_secs(10), "took {took:?}");
    assert!(m.all_on("v1"));
    no_violations(&m);
}

#[test]
fn a_never_ready_release_fails_when_progress_stops_for_the_deadline() {
    let mut m = settled(4);
    m.spec.progress_deadline = DurationString::new("30s");
    m.write_revision("v2", Release::Unready);
    for _ in 0..25 {
        m.one_reconcile();
    }
    assert!(
        m.status.blocked_revisions.is_empty(),
        "not before the deadline"
    );
    m.run(200);
    assert_eq!(
        m.status.blocked_revisions[0].reason,
        "ProgressDeadlineExceeded"
    );
    no_violations(&m);
}

#[test]
fn a_deadline_is_missed_only_on_caches_that_heard_the_cluster_after_it_passed() {
    let mut m = settled(4);
    m.spec.progress_deadline = DurationString::new("30s");
    m.write_revision("v2", Release::Unready);
    // The caches go silent a second in; the stage waits on an unready pod.
    m.one_reconcile();
    let silent_since = m.now;
    m.caches_heard_at = Some(silent_since);
    let mut asked = None;
    for _ in 0..200 {
        let d = m.one_reconcile();
        asked = asked.or(d.refresh_caches_heard_before);
        if asked.is_some() {
            assert!(d.requeue_after.is_some_and(|r| r <= Duration::from_secs(1)));
        }
    }
    assert!(
        m.status.blocked_revisions.is_empty(),
        "failed on caches silent since before the deadline: {:#?}",
        m.status
    );
    let due = asked.expect("the pass asked for the caches to be listed again");
    assert!(due > silent_since && due <= m.now, "{due} vs {}", m.now);
    // Listed again: they vouch for now, and the deadline is missed at once.
    m.caches_heard_at = Some(m.now);
    let d = m.one_reconcile();
    assert_eq!(d.refresh_caches_heard_before, None);
    assert_eq!(
        m.status.blocked_revisions[0].reason,
        "ProgressDeadlineExceeded"
    );
    no_violations(&m);
}

#[test]
fn an_enforced_preflight_never_lets_a_rollout_start_unchecked() {
    // The model computes no preflight, as an operator pass that read the
    // cluster before the new template's ControllerRevision existed.
    let mut m = settled(4);
    m.spec.preflight = Some(saferollout_api::Preflight {
        policy: saferollout_api::PreflightPolicy::Enforce,
    });
    m.write_revision("v2", Release::Healthy);
    // It never settles: it keeps looking for its preflight.
    for _ in 0..100 {
        m.one_reconcile();
    }
    let d = m.one_reconcile();
    assert_eq!(d.status.target_revision.as_deref(), Some("v2"));
    assert!(
        d.requeue_after.is_some_and(|r| r <= Duration::from_secs(1)),
        "looks again for its preflight soon: {d:?}"
    );
    assert_eq!(m.pods_on("v2"), 0, "a node was replaced unchecked");
    assert!(m.status.stages.is_empty(), "{:#?}", m.status);
    assert!(
        m.actions_log
            .iter()
            .all(|a| !matches!(a, Action::DeletePods { .. })),
        "{:?}",
        m.actions_log
    );
    no_violations(&m);
}

#[test]
fn a_large_stage_replaced_one_by_one_is_not_reverted_for_being_large() {
    // 40 nodes, one at a time, 2 s each: 80 s, far beyond a 30 s deadline
    // counted from the stage start, but progress never stops for 30 s.
    let mut m = settled(40);
    m.spec.progress_deadline = DurationString::new("30s");
    m.spec.stages = Some(stages(&[("1", false), ("100%", false)]));
    m.write_revision("v2", Release::Healthy);
    m.run(2000);
    assert_eq!(m.status.phase, Some(Phase::Succeeded), "{:#?}", m.status);
    assert!(m.status.blocked_revisions.is_empty());
    assert!(m.all_on("v2"));
    no_violations(&m);
}

#[test]
fn a_flapping_plugin_fails_at_the_deadline_instead_of_stalling() {
    let mut m = settled(4);
    m.spec.progress_deadline = DurationString::new("60s");
    m.write_revision("v2", Release::Flap(3));
    m.run(500);
    assert_eq!(m.status.phase, Some(Phase::Degraded), "{:#?}", m.status);
    let reason = &m.status.blocked_revisions[0].reason;
    assert!(reason == "Unstable" || reason == "BelowMinimum", "{reason}");
    no_violations(&m);
}

#[test]
fn a_blocked_revision_written_again_is_not_rolled() {
    let mut m = settled(4);
    m.write_revision("v2", Release::Broken);
    m.run(200);
    let touched = m.checker.touched["v2"].clone();
    // Helm applies the same template again.
    m.write_revision("v2", Release::Broken);
    m.run(50);
    assert_eq!(m.cluster.ds.template, "v1", "restored again");
    assert_eq!(m.checker.touched["v2"], touched, "no node replaced");
    assert_eq!(m.status.blocked_revisions.len(), 1);
    no_violations(&m);
}

#[test]
fn a_retry_unblocks_the_revision() {
    let mut m = settled(4);
    m.write_revision("v2", Release::Broken);
    m.run(200);
    m.retry = Some("v2".into());
    // The release was fixed in place (same revision, now healthy) and applied again.
    m.write_revision("v2", Release::Healthy);
    m.run(300);
    assert!(m.status.blocked_revisions.is_empty());
    assert_eq!(m.status.phase, Some(Phase::Succeeded), "{:#?}", m.status);
    assert!(m.all_on("v2"));
    assert_eq!(m.status.last_retry.as_deref(), Some("v2"));
    no_violations(&m);
}

#[test]
fn spec_paused_replaces_nothing() {
    let mut m = settled(4);
    m.spec.paused = true;
    m.write_revision("v2", Release::Healthy);
    m.run(20);
    assert_eq!(m.status.phase, Some(Phase::Paused));
    assert!(conditions::is_true(
        &m.status.conditions,
        conditions::RECONCILING
    ));
    assert!(m.all_on("v1"));
    m.spec.paused = false;
    m.run(300);
    assert!(m.all_on("v2"));
    no_violations(&m);
}

#[test]
fn a_pausing_stage_waits_for_approval() {
    let mut m = settled(4);
    m.spec.stages = Some(stages(&[("1", true), ("100%", false)]));
    m.write_revision("v2", Release::Healthy);
    m.run(100);
    assert_eq!(m.status.phase, Some(Phase::Paused));
    assert_eq!(m.status.stages[0].state, StageState::Paused);
    assert_eq!(m.pods_on("v2"), 1);
    m.approve = Some("0".into());
    m.run(20);
    assert_eq!(
        m.status.phase,
        Some(Phase::Paused),
        "a bare index approves nothing"
    );
    m.approve = Some(approval_value("v2", 0));
    m.run(200);
    assert!(m.all_on("v2"));
    no_violations(&m);
}

/// One node that soaks `soak` once its gates pass, then the rest.
fn canary_soaking(soak: &str) -> Vec<Stage> {
    vec![
        Stage {
            soak: DurationString::new(soak),
            ..Stage::new(IntOrString::Int(1))
        },
        Stage::new(IntOrString::String("100%".into())),
    ]
}

#[test]
fn stage_soak_holds_the_next_stage() {
    let mut m = settled(4);
    m.spec.stages = Some(canary_soaking("30s"));
    m.write_revision("v2", Release::Healthy);
    for _ in 0..25 {
        m.one_reconcile();
    }
    assert_eq!(m.status.current_stage, Some(0));
    assert_eq!(m.status.stages[0].state, StageState::Soaking);
    m.run(200);
    assert!(m.all_on("v2"));
    no_violations(&m);
}

#[test]
fn a_stage_soak_read_back_from_the_status_lasts_its_full_length() {
    // Regression: the soak started at the pass's time, which the status
    // kept as the whole second before, so it ended up to a second early.
    let mut m = settled(4);
    m.spec.stages = Some(canary_soaking("3s"));
    m.write_revision("v2", Release::Healthy);
    // Every pass from here on at .7 of a second.
    m.now += jiff::SignedDuration::from_millis(700);
    let mut verified = None;
    for _ in 0..40 {
        let at = m.now;
        m.one_reconcile(); // one pass, then a second of the cluster
        m.status = as_stored(&m.status);
        if m.status
            .stages
            .first()
            .is_some_and(|s| s.verified_at.is_some())
        {
            verified = Some(at);
            break;
        }
    }
    let verified = verified.expect("stage 1 verified");
    assert_eq!(m.status.stages[0].state, StageState::Soaking);
    // Passes every 100 ms, nothing else moving.
    let mut passed = None;
    for _ in 0..60 {
        m.now += jiff::SignedDuration::from_millis(100);
        m.reconcile(Lag::default(), Losses::default())
            .expect("caches are fresh");
        m.status = as_stored(&m.status);
        if m.status.stages[0].state == StageState::Passed {
            passed = Some(m.now);
            break;
        }
        assert_eq!(m.status.stages[0].state, StageState::Soaking);
    }
    let after = passed.expect("stage 1 passed").duration_since(verified);
    // At least the soak; at most a second more (its start is rounded up).
    assert!(
        after >= jiff::SignedDuration::from_secs(3) && after < jiff::SignedDuration::from_secs(4),
        "stage 1 passed {after:?} after it was verified at {verified}"
    );
}

#[test]
fn gitops_applies_spec_template_and_rolls_it() {
    let mut m = settled(4);
    m.spec_hash = Some("h2".into());
    m.run(300);
    assert_eq!(m.cluster.ds.template, "spec-h2");
    assert!(m.all_on("spec-h2"));
    assert_eq!(m.status.phase, Some(Phase::Succeeded));
    no_violations(&m);
}

#[test]
fn gitops_blocked_spec_template_is_not_reapplied() {
    let mut m = settled(4);
    m.releases.insert("spec-bad".into(), Release::Broken);
    m.spec_hash = Some("bad".into());
    m.run(300);
    assert_eq!(
        m.status.blocked_revisions[0].template_hash.as_deref(),
        Some("bad")
    );
    let applies = |m: &Model| {
        m.actions_log
            .iter()
            .filter(|a| **a == Action::ApplySpecTemplate)
            .count()
    };
    let before = applies(&m);
    m.run(50);
    assert_eq!(applies(&m), before);
    assert!(m.all_on("v1"));
    // A new spec.template is rolled.
    m.spec_hash = Some("good".into());
    m.run(300);
    assert!(m.all_on("spec-good"));
    no_violations(&m);
}

/// The operator's default limits, and a spec beyond them: a quarantine
/// that evicts (NoExecute), which they refuse.
fn ask_for_what_the_operator_refuses(m: &mut Model) {
    m.limits = crate::limits::AdminLimits::default();
    m.spec.on_failure = saferollout_api::OnFailure::Quarantine;
    m.spec.quarantine = Some(saferollout_api::QuarantineSpec {
        effect: saferollout_api::QuarantineEffect::NoExecute,
        resource: Some(RESOURCE.into()),
        ..Default::default()
    });
}

#[test]
fn gitops_a_refused_fix_forward_is_never_written_and_the_revert_goes_on() {
    let mut m = settled(8);
    m.spec.stages = Some(stages(&[("2", false), ("100%", false)]));
    m.spec.max_unavailable = IntOrString::Int(2);
    m.releases.insert("spec-bad".into(), Release::Broken);
    m.spec_hash = Some("bad".into());
    // Until the bad release failed its gate and the revert began.
    for _ in 0..300 {
        if is_blocked(&m.status, "spec-bad") {
            break;
        }
        m.reconcile(Lag::default(), Losses::default());
        m.advance();
    }
    assert!(
        m.pods_on("spec-bad") > 0,
        "the revert has nodes to bring back"
    );
    // Git pushes a fix forward the operator refuses (NoExecute not allowed).
    ask_for_what_the_operator_refuses(&mut m);
    m.releases.insert("spec-fix".into(), Release::Healthy);
    m.spec_hash = Some("fix".into());
    m.run(400);
    assert!(m.all_on("v1"), "the revert finished");
    assert_eq!(m.pods_on("spec-fix"), 0);
    assert_ne!(m.cluster.ds.template, "spec-fix", "never written");
    no_violations(&m);
}

#[test]
fn gitops_detects_a_human_edit_and_overwrites_nothing() {
    let mut m = settled(4);
    m.spec_hash = Some("h2".into());
    m.run(300);
    m.write_revision("hand", Release::Healthy);
    for _ in 0..5 {
        let d = m.one_reconcile();
        assert!(
            d.actions.iter().all(|a| matches!(a, Action::Event { .. })),
            "{:?}",
            d.actions
        );
    }
    assert_eq!(m.status.phase, Some(Phase::Paused));
    let ready = conditions::get(&m.status.conditions, conditions::READY).unwrap();
    assert_eq!(ready.reason, "TemplateConflict");
    assert!(m.all_on("spec-h2"));
    // Reverting the edit resumes: the DaemonSet is back on a known revision.
    m.write_revision("spec-h2", Release::Healthy);
    m.run(50);
    assert_eq!(m.status.phase, Some(Phase::Succeeded), "{:#?}", m.status);
    no_violations(&m);
}

#[test]
fn gitops_revert_of_spec_template_mid_rollout_honours_the_budget() {
    // Regression: a Git revert mid-rollout replaced every updated node at once.
    let mut m = settled(8);
    m.spec.stages = Some(stages(&[("1", false), ("100%", false)]));
    m.spec_hash = Some("v1h".into());
    m.releases.insert("spec-v1h".into(), Release::Healthy);
    m.run(300);
    m.spec_hash = Some("v2h".into());
    // Roll until most nodes are on v2.
    for _ in 0..200 {
        m.one_reconcile();
        if m.pods_on("spec-v2h") >= 6 {
            break;
        }
    }
    assert!(m.pods_on("spec-v2h") >= 6);
    m.spec_hash = Some("v1h".into());
    m.run(400);
    assert!(m.all_on("spec-v1h"));
    assert_eq!(m.status.phase, Some(Phase::Succeeded), "{:#?}", m.status);
    no_violations(&m);
}

#[test]
fn gitops_adopts_a_daemonset_already_on_spec_template_without_a_rollout() {
    let mut m = Model::new(4);
    m.releases.insert("spec-same".into(), Release::Healthy);
    m.cluster.ds.template = "spec-same".into();
    m.cluster.ds.revisions.insert("spec-same".into(), 2);
    for p in m.cluster.pods.values_mut() {
        p.revision = "spec-same".into();
    }
    m.spec_hash = Some("same".into());
    m.run(50);
    assert_eq!(m.status.phase, Some(Phase::Succeeded));
    assert!(!m.actions_log.contains(&Action::ApplySpecTemplate));
    assert!(
        !m.actions_log
            .iter()
            .any(|a| matches!(a, Action::DeletePods { .. }))
    );
    no_violations(&m);
}

#[test]
fn a_replacement_in_flight_when_a_new_revision_starts_holds_its_slot() {
    // Regression (found by the property test): a stage of v2 empties a node;
    // meanwhile the template went to v3 and straight back to v1, and the
    // DaemonSet cache shows v3. The emptied node's agent comes back on v1,
    // the stable revision, not Ready yet. Starting v3 drops v2's stages:
    // that node must keep its slot, or v3's canary takes a second agent down
    // with maxUnavailable 1.
    let mut m = settled(6);
    m.spec.stages = Some(stages(&[("1", false), ("100%", false)]));
    m.write_revision("v2", Release::Healthy);
    for _ in 0..200 {
        if m.status.current_stage == Some(1) {
            break;
        }
        m.one_reconcile();
    }
    assert_eq!(m.status.current_stage, Some(1));
    m.write_revision("v3", Release::Healthy);
    m.advance();
    m.write_revision("v1", Release::Healthy);
    m.advance();
    // The DaemonSet cache still shows v2: stage 2 empties a node, whose agent
    // the DaemonSet controller brings back on v1.
    let mut emptied = None;
    for passes in 0..100 {
        let lag = Lag {
            daemonset: 2 + passes,
            ..Lag::default()
        };
        let d = m.reconcile(lag, Losses::default()).expect("a pass");
        m.advance();
        if let Some(pods) = d.actions.iter().find_map(|a| match a {
            Action::DeletePods { pods } => Some(pods),
            _ => None,
        }) {
            emptied = Some((pods[0].node.clone(), passes));
            break;
        }
    }
    let (emptied, passes) = emptied.expect("stage 2 replaces a pod");
    assert!(
        m.cluster
            .pods
            .values()
            .any(|p| p.node == emptied && p.revision == "v1" && !p.ready),
        "{emptied} runs a v1 agent, not Ready yet"
    );
    assert!(m.checker.disrupted.contains(&emptied), "{emptied} is down");
    // Now the cache shows v3.
    let lag = Lag {
        daemonset: passes + 2,
        ..Lag::default()
    };
    let d = m.reconcile(lag, Losses::default()).expect("a pass");
    assert_eq!(d.status.target_revision.as_deref(), Some("v3"));
    assert!(
        d.status.converging_nodes.contains(&emptied),
        "{emptied} carried: {:?}",
        d.status.converging_nodes
    );
    no_violations(&m);
    m.advance();
    m.run(400);
    assert!(m.all_on("v1"), "{:#?}", m.status);
    no_violations(&m);
}

#[test]
fn a_lost_template_write_is_made_again() {
    let mut m = settled(4);
    m.spec_hash = Some("h2".into());
    let d = m
        .reconcile(
            Lag::default(),
            Losses {
                status: false,
                first_action: true,
            },
        )
        .unwrap();
    assert!(d.actions.contains(&Action::ApplySpecTemplate));
    assert_eq!(m.cluster.ds.template, "v1", "the write was lost");
    m.run(300);
    assert!(m.all_on("spec-h2"), "{:#?}", m.status);
    no_violations(&m);
}

#[test]
fn lost_label_writes_are_redone_from_status() {
    // Regression: labels were only asked for when a stage was planned.
    let mut m = settled(4);
    m.spec.stages = Some(stages(&[("1", true), ("100%", false)]));
    m.write_revision("v2", Release::Healthy);
    m.one_reconcile(); // waits for the DaemonSet controller
    let d = m
        .reconcile(
            Lag::default(),
            Losses {
                status: false,
                first_action: true,
            },
        )
        .unwrap();
    let first_write = d
        .actions
        .iter()
        .find(|a| !matches!(a, Action::Event { .. }));
    assert!(
        matches!(first_write, Some(Action::LabelNodes { .. })),
        "{:?}",
        d.actions
    );
    assert!(m.labelled().is_empty(), "lost");
    m.advance();
    m.one_reconcile();
    assert_eq!(m.labelled().len(), 1, "labelled again from status");
    no_violations(&m);
}

#[test]
fn a_node_vanishing_mid_stage_is_let_go_and_replaced_in_the_plan() {
    let mut m = settled(6);
    m.write_revision("v2", Release::Unready);
    m.one_reconcile();
    m.one_reconcile();
    let canary = m.status.stages[0].nodes[0].clone();
    m.delete_node(&canary);
    m.releases.insert("v2".into(), Release::Healthy);
    m.run(400);
    assert_eq!(m.status.phase, Some(Phase::Succeeded), "{:#?}", m.status);
    assert!(m.all_on("v2"));
    assert!(
        m.status.stages[0]
            .skipped
            .iter()
            .any(|s| s.node == canary && s.reason == "NodeDeleted")
    );
    no_violations(&m);
}

#[test]
fn a_not_ready_node_is_never_emptied_and_is_named_while_reverting() {
    let mut m = settled(4);
    m.spec.stages = Some(stages(&[("2", false), ("100%", false)]));
    m.spec.max_unavailable = IntOrString::Int(2);
    m.write_revision("v2", Release::BreaksAfter(6));
    // Both canaries on v2, then one node goes NotReady before the failure.
    for _ in 0..200 {
        m.one_reconcile();
        if m.pods_on("v2") == 2
            && m.cluster
                .pods
                .values()
                .filter(|p| p.revision == "v2")
                .all(|p| p.ready)
        {
            break;
        }
    }
    let sick = m
        .cluster
        .pods
        .values()
        .find(|p| p.revision == "v2")
        .unwrap()
        .node
        .clone();
    m.set_node_ready(&sick, false);
    m.run(300);
    assert!(
        m.cluster
            .pods
            .values()
            .any(|p| p.node == sick && p.revision == "v2"),
        "not emptied"
    );
    assert_eq!(m.status.phase, Some(Phase::Degraded), "{:#?}", m.status);
    assert!(
        m.status.stuck_nodes.iter().any(|s| s.node == sick),
        "{:#?}",
        m.status.stuck_nodes
    );
    let ready = conditions::get(&m.status.conditions, conditions::READY).unwrap();
    assert!(ready.message.contains(&sick), "{}", ready.message);
    // When the node comes back, it is reverted too.
    m.set_node_ready(&sick, true);
    m.run(300);
    assert!(m.all_on("v1"), "{:#?}\n{:#?}", m.status, m.cluster.pods);
    assert!(m.status.stuck_nodes.is_empty());
    no_violations(&m);
}

#[test]
fn a_node_joining_mid_rollout_is_judged_with_the_current_stage() {
    let mut m = settled(4);
    m.spec.stages = Some(stages(&[("1", true), ("100%", false)]));
    m.write_revision("v2", Release::Healthy);
    m.run(100);
    assert_eq!(m.status.stages[0].state, StageState::Paused);
    m.add_node("node-new", 1);
    m.run(30);
    let stage = &m.status.stages[0];
    assert!(stage.nodes.contains(&"node-new".to_string()), "{stage:#?}");
    assert!(
        !stage.baseline.contains_key("node-new"),
        "no before for a new node"
    );
    m.approve = Some(approval_value("v2", 0));
    m.run(300);
    assert!(m.all_on("v2"));
    no_violations(&m);
}

#[test]
fn a_broken_release_on_a_joining_node_fails_its_gate() {
    let mut m = settled(4);
    m.spec.stages = Some(stages(&[("1", true), ("100%", false)]));
    m.write_revision("v2", Release::BrokenInZoneB);
    m.run(100);
    // The canary is in zone a and passed; a zone-b node joins on v2.
    m.add_node("node-new", 1);
    m.run(200);
    assert_eq!(m.status.phase, Some(Phase::Degraded), "{:#?}", m.status);
    assert!(m.status.blocked_revisions[0].message.contains("node-new"));
    no_violations(&m);
}

#[test]
fn decisions_are_deterministic_and_idle_status_is_stable() {
    let mut m = settled(5);
    m.write_revision("v2", Release::Healthy);
    m.one_reconcile();
    let a = m
        .reconcile(
            Lag::default(),
            Losses {
                status: true,
                first_action: false,
            },
        )
        .unwrap();
    let b = m
        .reconcile(
            Lag::default(),
            Losses {
                status: true,
                first_action: false,
            },
        )
        .unwrap();
    assert_eq!(a.status, b.status);
    assert_eq!(a.actions, b.actions);
    assert_eq!(a.requeue_after, b.requeue_after);
    m.run(300);
    let idle = m.status.clone();
    m.advance();
    let d = m.one_reconcile();
    assert_eq!(d.status, idle, "nothing changed, so status does not either");
    assert!(d.actions.is_empty());
}

#[test]
fn abort_reverts_at_once_and_blocks_the_revision() {
    let mut m = settled(6);
    m.write_revision("v2", Release::Healthy);
    m.one_reconcile();
    m.one_reconcile();
    m.abort = Some("v2".into());
    m.run(100);
    assert_eq!(m.status.phase, Some(Phase::Degraded));
    assert_eq!(m.status.blocked_revisions[0].reason, "Aborted");
    assert_eq!(degraded_reason(&m).as_deref(), Some("ManualFailed"));
    assert!(m.all_on("v1"));
    no_violations(&m);
}

#[test]
fn a_spec_beyond_the_operators_limits_rolls_nothing_forward_but_a_revert_goes_on() {
    let mut m = settled(4);
    ask_for_what_the_operator_refuses(&mut m);
    // Settled: nothing to roll, but the next release would be refused.
    m.run(60);
    let ready = conditions::get(&m.status.conditions, conditions::READY).unwrap();
    assert_eq!(ready.reason, "InvalidSpec");
    assert!(
        ready.message.contains("--quarantine-allow-no-execute"),
        "{}",
        ready.message
    );
    m.write_revision("v2", Release::Healthy);
    m.run(60);
    assert_eq!(m.status.phase, Some(Phase::Failed));
    assert_eq!(m.pods_on("v2"), 0, "nothing rolled forward");
    assert!(m.labelled().is_empty());
    // Allowed: the same revision rolls.
    m.limits.quarantine_no_execute = true;
    m.run(600);
    assert_eq!(m.status.phase, Some(Phase::Succeeded), "{:#?}", m.status);
    assert!(m.all_on("v2"));
    // A revert under way is never held by a refusal.
    m.write_revision("v3", Release::Broken);
    for _ in 0..600 {
        if is_blocked(&m.status, "v3") {
            break;
        }
        m.reconcile(Lag::default(), Losses::default());
        m.advance();
    }
    assert!(is_blocked(&m.status, "v3"), "{:#?}", m.status);
    assert!(m.pods_on("v3") > 0, "the revert has nodes to bring back");
    m.limits.quarantine_no_execute = false;
    m.spec.on_failure = saferollout_api::OnFailure::Revert;
    m.spec.quarantine = None;
    m.spec.gates.as_mut().unwrap().logs = Some(saferollout_api::LogsGate {
        patterns: vec![r"\Qx\E".into()],
        ..Default::default()
    });
    m.run(600);
    assert!(m.all_on("v2"), "reverted to v2 despite the refused spec");
    no_violations(&m);
}

#[test]
fn a_missing_daemonset_and_a_conflicting_owner_are_conditions() {
    let m = Model::new(1);
    let pods = crate::views::PodsByNode::default();
    let nodes = crate::views::NodesByName::new();
    let base = Observed {
        spec: &m.spec,
        generation: Some(1),
        status: &m.status,
        requests: Requests::default(),
        owned_by_other: None,
        preflight: None,
        daemonset: None,
        spec_template: None,
        name: "plugin",
        backup: None,
        revision_contents: &BTreeMap::new(),
        pods: &pods,
        nodes: &nodes,
        rollout_id: "ns.plugin",
        evidence: &crate::gates::Evidence::default(),
        limits: &crate::limits::UNLIMITED,
        now: m.now,
        caches_heard_at: None,
        fleet: None,
        owner_revert: None,
        owner_gitops: None,
    };
    let d = decide(&base);
    assert!(d.actions.is_empty());
    assert_eq!(d.status.phase, Some(saferollout_api::Phase::Pending));
    let ready = conditions::get(&d.status.conditions, conditions::READY).unwrap();
    assert_eq!(ready.reason, "TargetNotFound");
    assert!(ready.message.contains("\"plugin\""));
    let conflict = decide(&Observed {
        owned_by_other: Some("first"),
        ..base
    });
    assert!(conflict.actions.is_empty(), "touches nothing");
    let ready = conditions::get(&conflict.status.conditions, conditions::READY).unwrap();
    assert_eq!(ready.reason, "TargetConflict");
    assert!(ready.message.contains("\"first\""), "{}", ready.message);
}

#[test]
fn a_lost_restore_is_redone_and_the_phase_does_not_flip() {
    let mut m = settled(4);
    m.write_revision("v2", Release::Crashloop);
    let mut phases = Vec::new();
    for _ in 0..40 {
        // Every first action lost while the revert is under way.
        let lose = m.status.phase == Some(Phase::Progressing)
            || m.status.phase == Some(Phase::RollingBack);
        m.reconcile(
            Lag::default(),
            Losses {
                status: false,
                first_action: lose && m.cluster.ds.template == "v2",
            },
        );
        m.advance();
        if phases.last() != Some(&m.status.phase) {
            phases.push(m.status.phase);
        }
    }
    m.run(200);
    assert!(m.all_on("v1"));
    assert!(
        !phases
            .windows(3)
            .any(|w| w[0] == w[2] && w[0] != w[1] && w[0] == Some(Phase::RollingBack)),
        "RollingBack/Degraded flip-flop: {phases:?}"
    );
    no_violations(&m);
}

#[test]
fn requeue_waits_exactly_for_a_soak() {
    let mut m = settled(2);
    m.spec.stages = Some(stages(&[("100%", false)]));
    m.write_revision("v2", Release::Healthy);
    let mut saw = None;
    for _ in 0..30 {
        let d = m.one_reconcile();
        if m.status.stages.first().is_some_and(|s| {
            s.gates.iter().any(|g| {
                g.reason == "WithinBounds" && g.status == saferollout_api::GateStatus::Pending
            })
        }) {
            saw = d.requeue_after;
            break;
        }
    }
    let wait = saw.expect("the allocatable gate soaked");
    assert!(
        wait <= Duration::from_secs(10) && wait > Duration::from_secs(8),
        "{wait:?}"
    );
    let _ = GPUS;
}

fn stalled_reason(m: &Model) -> Option<String> {
    conditions::get(&m.status.conditions, conditions::STALLED)
        .filter(|c| c.status == "True")
        .map(|c| c.reason.clone())
}

fn only_events(actions: &[Action]) -> bool {
    actions.iter().all(|a| matches!(a, Action::Event { .. }))
}

#[test]
fn quarantine_keeps_the_new_release_stops_and_taints_the_failed_node() {
    use saferollout_api::OnFailure;
    let mut m = settled(6);
    m.spec.on_failure = OnFailure::Quarantine;
    m.write_revision("v2", Release::Broken);
    m.run(200);
    assert_eq!(m.status.phase, Some(Phase::Degraded), "{:#?}", m.status);
    assert_eq!(stalled_reason(&m).as_deref(), Some("Quarantined"));
    assert_eq!(degraded_reason(&m).as_deref(), Some("AllocatableFailed"));
    assert_eq!(
        m.cluster.ds.template, "v2",
        "the new release stays on the DaemonSet"
    );
    let canary = m.checker.touched["v2"].iter().next().unwrap().clone();
    assert_eq!(
        m.checker.touched["v2"].len(),
        1,
        "nothing beyond the canary"
    );
    assert!(
        m.cluster
            .pods
            .values()
            .any(|p| p.node == canary && p.revision == "v2" && p.terminating.is_none()),
        "the failed node keeps the new release"
    );
    let stopped = m.status.stopped.clone().expect("stopped");
    assert_eq!(stopped.nodes, std::slice::from_ref(&canary));
    let taint = |m: &Model, node: &str| {
        m.cluster.nodes[node]
            .taints
            .iter()
            .find(|t| t.key == taint_key("ns.plugin"))
            .cloned()
    };
    let t = taint(&m, &canary).expect("the failed node is tainted");
    assert_eq!(
        (t.value.as_deref(), t.effect.as_str()),
        (Some("example.com_gpu"), "NoSchedule")
    );
    assert!(
        m.cluster
            .nodes
            .keys()
            .filter(|n| **n != canary)
            .all(|n| taint(&m, n).is_none()),
        "only the failed node"
    );
    // Nothing more changes.
    let logged = m.actions_log.len();
    m.run(50);
    assert!(
        only_events(&m.actions_log[logged..]),
        "{:?}",
        &m.actions_log[logged..]
    );
    assert_eq!(m.checker.touched["v2"].len(), 1);
    // A fixed release and a retry of the quarantined one: the quarantine is
    // lifted and the fix rolls everywhere.
    m.write_revision("v3", Release::Healthy);
    for _ in 0..20 {
        m.one_reconcile();
    }
    assert_eq!(m.status.target_revision.as_deref(), Some("v3"));
    assert!(
        taint(&m, &canary).is_some(),
        "a new release does not lift the quarantine"
    );
    m.retry = Some("v2".into());
    m.run(600);
    assert_eq!(m.status.phase, Some(Phase::Succeeded), "{:#?}", m.status);
    assert!(m.status.stopped.is_none());
    assert!(taint(&m, &canary).is_none(), "retry lifts the quarantine");
    assert!(m.all_on("v3"));
    no_violations(&m);
}

#[test]
fn halt_changes_nothing_more() {
    use saferollout_api::OnFailure;
    let mut m = settled(6);
    m.spec.on_failure = OnFailure::Halt;
    m.write_revision("v2", Release::Broken);
    m.run(200);
    assert_eq!(m.status.phase, Some(Phase::Degraded), "{:#?}", m.status);
    assert_eq!(stalled_reason(&m).as_deref(), Some("Halted"));
    let ready = conditions::get(&m.status.conditions, conditions::READY).unwrap();
    assert!(
        ready.message.contains("onFailure: Halt"),
        "{}",
        ready.message
    );
    assert!(
        m.actions_log
            .iter()
            .any(|a| matches!(a, Action::Event { reason, .. } if reason == "Halted")),
        "an Event says so"
    );
    assert_eq!(m.cluster.ds.template, "v2", "the template is not restored");
    assert!(
        !m.actions_log
            .iter()
            .any(|a| matches!(a, Action::RestoreLastGood { .. }))
    );
    let labelled: Vec<String> = m.labelled().into_iter().cloned().collect();
    assert_eq!(labelled.len(), 1, "the canary keeps its labels");
    let pods: Vec<(String, String)> = m
        .cluster
        .pods
        .values()
        .map(|p| (p.uid.clone(), p.revision.clone()))
        .collect();
    let logged = m.actions_log.len();
    m.run(50);
    assert!(
        only_events(&m.actions_log[logged..]),
        "{:?}",
        &m.actions_log[logged..]
    );
    let after: Vec<(String, String)> = m
        .cluster
        .pods
        .values()
        .map(|p| (p.uid.clone(), p.revision.clone()))
        .collect();
    assert_eq!(pods, after, "no pod replaced");
    assert!(
        m.cluster.nodes.values().all(|n| n.taints.is_empty()),
        "nothing quarantined"
    );
    // A person writing the last good template back reverts as usual.
    m.write_revision("v1", Release::Healthy);
    m.run(300);
    assert!(m.all_on("v1"));
    assert!(m.labelled().is_empty());
    no_violations(&m);
}

/// The model with only podsReady and the probe gate (no allocatable gate).
fn settled_with_probe_only(nodes: usize) -> Model {
    let mut m = Model::new(nodes);
    m.spec.gates = None;
    m.add_probe_gate(1);
    m.run(60);
    assert_eq!(m.status.phase, Some(Phase::Succeeded), "{:#?}", m.status);
    m
}

#[test]
fn a_broken_release_is_caught_by_the_probe_alone_and_no_probe_outlives_its_stage() {
    let mut m = settled_with_probe_only(6);
    m.spec.stages = Some(stages(&[("1", false), ("100%", false)]));
    m.write_revision("v2", Release::Broken);
    m.run(300);
    assert_eq!(m.status.phase, Some(Phase::Degraded), "{:#?}", m.status);
    assert_eq!(degraded_reason(&m).as_deref(), Some("ProbeFailed"));
    let canary = &m.status.stages[0];
    assert_eq!(canary.probes.len(), 1);
    assert_eq!(canary.probes[0].reason, "Unschedulable");
    assert!(
        canary.probes[0].message.contains("Insufficient"),
        "{}",
        canary.probes[0].message
    );
    assert_eq!(m.checker.touched["v2"].len(), 1, "only the canary got v2");
    assert!(m.cluster.probes.is_empty(), "{:?}", m.cluster.probes);
    no_violations(&m);
}

#[test]
fn quarantine_at_a_later_stage_keeps_the_budget() {
    use saferollout_api::OnFailure;
    let mut m = settled(8);
    m.spec.on_failure = OnFailure::Quarantine;
    m.spec.stages = Some(stages(&[("1", false), ("50%", false), ("100%", false)]));
    m.write_revision("v2", Release::BrokenInZoneB);
    m.run(400);
    assert_eq!(
        stalled_reason(&m).as_deref(),
        Some("Quarantined"),
        "{:#?}",
        m.status
    );
    let failed = &m.status.stopped.as_ref().unwrap().nodes;
    assert!(!failed.is_empty());
    for n in failed {
        assert!(
            m.cluster.nodes[n]
                .taints
                .iter()
                .any(|t| t.key == taint_key("ns.plugin"))
        );
    }
    // Nodes that got the release keep it; no revert happened.
    assert!(m.pods_on("v2") >= 2, "{}", m.pods_on("v2"));
    assert!(
        !m.actions_log
            .iter()
            .any(|a| matches!(a, Action::RestoreLastGood { .. }))
    );
    no_violations(&m);
}

#[test]
fn a_healthy_release_passes_its_probes_one_per_canary_node_and_a_sample_later() {
    let mut m = settled_with_probe_only(6);
    m.spec.stages = Some(stages(&[("2", false), ("100%", false)]));
    m.write_revision("v2", Release::Healthy);
    m.run(300);
    assert_eq!(m.status.phase, Some(Phase::Succeeded), "{:#?}", m.status);
    assert!(m.all_on("v2"));
    let created = m
        .actions_log
        .iter()
        .filter_map(|a| match a {
            Action::CreateProbePods { probes } => Some(probes.len()),
            _ => None,
        })
        .sum::<usize>();
    // Canary: both nodes; the second stage's 4 nodes: a sample of 1.
    assert_eq!(created, 3, "{:?}", m.actions_log);
    assert!(m.cluster.probes.is_empty(), "{:?}", m.cluster.probes);
    no_violations(&m);
}

fn ready_reason(m: &Model) -> String {
    conditions::get(&m.status.conditions, conditions::READY)
        .map(|c| c.reason.clone())
        .unwrap_or_default()
}

fn events(m: &Model, reason: &str) -> usize {
    m.actions_log
        .iter()
        .filter(|a| matches!(a, Action::Event { reason: r, .. } if r == reason))
        .count()
}

/// Someone created `<name>-last-good-v1`, owned by the SafeRollout, with
/// other content before the operator could: the operator's own write meets
/// it (409), status records what it meant to write, and everything stops
/// (`BackupMismatch`, one Warning Event) instead of rolling on, and nothing
/// is ever restored from it. Once it is deleted, the operator records the
/// backup itself and a failing release is reverted to the real v1.
#[test]
fn a_backup_someone_else_created_first_stops_everything_and_is_never_restored() {
    let mut m = Model::new(4);
    m.cluster.backup = Some("v1".into());
    m.cluster.backup_content = Some("sha256:planted".into());
    m.run(30);
    assert_eq!(ready_reason(&m), "BackupMismatch", "{:#?}", m.status);
    assert_eq!(m.status.phase, Some(Phase::Failed));
    let ready = conditions::get(&m.status.conditions, conditions::READY).unwrap();
    assert!(
        ready.message.contains("sha256:planted"),
        "{}",
        ready.message
    );
    assert!(conditions::is_true(
        &m.status.conditions,
        conditions::STALLED
    ));
    assert_eq!(events(&m, "BackupMismatch"), 1, "one Warning Event");
    let recorded = m.status.last_good_template.clone().unwrap();
    assert_eq!(recorded.template_hash, Some(model::content_of("v1")));
    assert_eq!(recorded.controller_revision, "plugin-last-good-v1");

    // A failing release written meanwhile is neither rolled nor reverted.
    m.write_revision("v2", Release::Crashloop);
    m.run(120);
    assert_eq!(ready_reason(&m), "BackupMismatch");
    assert_eq!(m.pods_on("v1"), 4, "no pod replaced");
    assert!(!m.actions_log.iter().any(|a| matches!(
        a,
        Action::DeletePods { .. } | Action::RestoreLastGood { .. } | Action::LabelNodes { .. }
    )));
    assert_eq!(m.cluster.ds.template, "v2", "nothing written over it");
    no_violations(&m);

    // A person deletes the planted backup: the operator records its own,
    // and v2 is rolled, fails, and is reverted to v1 as backed up.
    m.cluster.backup = None;
    m.cluster.backup_content = None;
    m.run(600);
    assert_eq!(m.cluster.backup_content, Some(model::content_of("v1")));
    assert!(m.status.is_blocked("v2"), "{:#?}", m.status);
    assert!(m.all_on("v1"));
    assert_eq!(m.cluster.ds.template, "v1");
    no_violations(&m);
}

/// The backup replaced under the operator's feet mid-rollout (deleted and
/// created again with other content): the revert a failing gate asks for is
/// never made from it.
#[test]
fn a_backup_replaced_mid_rollout_is_never_restored() {
    let mut m = settled(4);
    m.write_revision("v2", Release::BreaksAfter(30));
    for _ in 0..300 {
        if m.pods_on("v2") >= 1 {
            break;
        }
        m.one_reconcile();
    }
    assert_eq!(m.pods_on("v2"), 1, "the canary runs v2");
    m.cluster.backup_content = Some("sha256:planted".into());
    m.run(300);
    assert_eq!(ready_reason(&m), "BackupMismatch", "{:#?}", m.status);
    assert!(
        !m.actions_log
            .iter()
            .any(|a| matches!(a, Action::RestoreLastGood { .. })),
        "no revert from a backup the operator did not write"
    );
    assert_eq!(m.cluster.ds.template, "v2");
    no_violations(&m);
}

/// A status an older operator wrote records no content hash: while the
/// DaemonSet still has the stable revision, the backup is checked against
/// it; once it no longer has it, the backup is the only copy and its hash
/// is recorded as found (the rollout goes on, with an Event saying so).
#[test]
fn an_older_operators_status_without_a_hash_keeps_working() {
    // Checked against the DaemonSet's own revision, and recorded.
    let mut m = settled(4);
    let legacy = |m: &mut Model| {
        m.status.last_good_template.as_mut().unwrap().template_hash = None;
    };
    legacy(&mut m);
    m.run(5);
    assert_eq!(
        m.status.last_good_template.as_ref().unwrap().template_hash,
        Some(model::content_of("v1"))
    );
    assert_eq!(events(&m, "BackupAdopted"), 0);
    // A backup that does not match the DaemonSet's revision is refused.
    let mut m = settled(4);
    legacy(&mut m);
    m.cluster.backup_content = Some("sha256:planted".into());
    m.run(5);
    assert_eq!(ready_reason(&m), "BackupMismatch");
    // The DaemonSet no longer has the stable revision: recorded as found.
    let mut m = settled(4);
    legacy(&mut m);
    m.write_revision("v2", Release::Healthy);
    m.cluster.ds.revisions.remove("v1");
    // (The caches show the cluster as of the last tick.)
    m.advance();
    m.run(600);
    assert_eq!(events(&m, "BackupAdopted"), 1);
    assert_eq!(m.status.phase, Some(Phase::Succeeded), "{:#?}", m.status);
    assert!(m.all_on("v2"));
    no_violations(&m);
}

/// Right after a broken release is reverted, the node cache may still show
/// a status written before the restored plugin became Ready (the broken
/// plugin's 0, or the same second's report) while the pod cache shows it
/// Ready. Another broken release written at once, under a gate without
/// soak: the canary's baseline is taken only from a status written after
/// the restored plugin became Ready (8; the model checks the freshness of
/// every baseline it sees recorded), never from that 0 (a baseline of 0
/// bounds nothing: the release would pass).
#[test]
fn a_baseline_is_taken_from_the_restored_agents_report_not_the_reverted_ones() {
    let mut m = settled(4);
    m.spec.stages = Some(stages(&[("1", false), ("100%", false)]));
    if let Some(gates) = m.spec.gates.as_mut() {
        gates.allocatable[0].soak = DurationString::new("0s");
    }
    m.write_revision("v2", Release::Broken);
    for _ in 0..60 {
        m.one_reconcile();
        if m.status.phase == Some(Phase::Degraded) && m.all_on("v1") {
            break;
        }
    }
    assert_eq!(degraded_reason(&m).as_deref(), Some("AllocatableFailed"));
    m.write_revision("v3", Release::Broken);
    // The node cache two seconds behind the pod cache: it shows the 0.
    let lagging = Lag {
        nodes: 2,
        ..Lag::default()
    };
    for _ in 0..60 {
        m.reconcile(lagging, Losses::default());
        m.advance();
        for s in &m.status.stages {
            for (node, b) in &s.baseline {
                assert_eq!(
                    b.get(RESOURCE).copied(),
                    Some(GPUS),
                    "baseline of {node} taken from what the reverted release left"
                );
            }
        }
        if m.status
            .blocked_revisions
            .iter()
            .any(|b| b.revision == "v3")
            && m.all_on("v1")
        {
            break;
        }
    }
    assert!(
        m.status
            .blocked_revisions
            .iter()
            .any(|b| b.revision == "v3"),
        "{:#?}",
        m.status
    );
    assert_eq!(
        m.checker.touched.get("v3").map(BTreeSet::len),
        Some(1),
        "only the canary got v3"
    );
    no_violations(&m);
}
