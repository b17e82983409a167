//! Owner-aware mode against the model (issue 39): a DaemonSet a vendor's
//! operator owns is never written where the owner reconciles it; the
//! owner's own OnDelete setting is required; a failure stops the rollout
//! naming the owner's fields instead of writing the last good template.

use saferollout_api::{OnFailure, Phase};

use super::Action;
use super::model::{Model, Release};
use super::tests::no_violations;
use crate::conditions;

const NVIDIA: (&str, &str) = ("nvidia.com/v1", "ClusterPolicy");
const INTEL: (&str, &str) = ("deviceplugin.intel.com/v1", "GpuDevicePlugin");

fn owned(nodes: usize, (api_version, kind): (&str, &str), on_delete: bool) -> Model {
    let mut m = Model::new(nodes);
    m.owner = Some((api_version.into(), kind.into()));
    if on_delete {
        m.cluster.ds.strategy = "OnDelete".into();
    }
    m
}

fn ready(m: &Model) -> (String, String) {
    let c = conditions::get(&m.status.conditions, conditions::READY).expect("Ready");
    (c.reason.clone(), c.message.clone())
}

fn writes(m: &Model) -> usize {
    m.actions_log
        .iter()
        .filter(|a| {
            matches!(
                a,
                Action::TakeOverUpdates
                    | Action::ApplySpecTemplate
                    | Action::RestoreLastGood { .. }
            )
        })
        .count()
}

#[test]
fn an_owner_that_reconciles_the_strategy_must_set_on_delete_itself_and_nothing_is_touched_before() {
    let mut m = owned(4, NVIDIA, false);
    m.run(30);
    let (reason, message) = ready(&m);
    assert_eq!(reason, "OwnerNotOnDelete");
    assert!(
        message.contains("spec.daemonsets.updateStrategy: OnDelete in ClusterPolicy vendor"),
        "{message}"
    );
    assert_eq!(m.status.phase, Some(Phase::Failed));
    assert!(
        m.actions_log
            .iter()
            .all(|a| matches!(a, Action::Event { .. })),
        "{:?}",
        m.actions_log
    );
    let warned = m
        .actions_log
        .iter()
        .filter(|a| matches!(a, Action::Event { reason, .. } if reason == "OwnerNotOnDelete"))
        .count();
    assert_eq!(warned, 1, "one Warning Event, not one a pass");
    // The owner's field set: adopted, then a release the owner writes goes
    // through the stages with only pod deletions.
    m.cluster.ds.strategy = "OnDelete".into();
    m.run(60);
    assert_eq!(m.status.phase, Some(Phase::Succeeded), "{:#?}", m.status);
    m.write_revision("v2", Release::Healthy);
    m.run(600);
    assert_eq!(m.status.phase, Some(Phase::Succeeded), "{:#?}", m.status);
    assert!(m.all_on("v2"));
    assert_eq!(writes(&m), 0);
    no_violations(&m);
}

#[test]
fn a_failed_release_of_an_owned_daemonset_stops_naming_the_owners_fields() {
    let mut m = owned(4, NVIDIA, true);
    m.run(60);
    m.write_revision("v2", Release::Broken);
    m.run(600);
    let stopped = m.status.stopped.clone().expect("stopped, not reverted");
    assert_eq!(stopped.policy, OnFailure::Halt);
    assert!(
        stopped.message.contains("owned by ClusterPolicy/vendor")
            && stopped
                .message
                .contains("spec.devicePlugin.repository, image and version"),
        "{}",
        stopped.message
    );
    assert_eq!(writes(&m), 0, "no template written over the owner's");
    no_violations(&m);
}

/// `spec.ownerRevert`: the failed release is reverted through the owner's
/// version field (the model's owner writes the stable template back when
/// it is put back), never by a write of the DaemonSet's template; every
/// node ends on the last good revision within the budget.
#[test]
fn a_failed_release_is_reverted_through_the_owner_under_owner_revert() {
    let mut m = owned(5, NVIDIA, true);
    m.owner_revert = true;
    m.run(60);
    let stable = m.status.stable_revision.clone().expect("adopted");
    m.write_revision("v2", Release::Broken);
    m.run(900);
    let reverts: Vec<&Action> = m
        .actions_log
        .iter()
        .filter(|a| matches!(a, Action::RevertOwner { .. }))
        .collect();
    assert!(!reverts.is_empty(), "{:#?}", m.status);
    let Action::RevertOwner { plan } = reverts[0] else {
        unreachable!()
    };
    assert_eq!(
        (plan.fields[0].from.as_str(), plan.fields[0].to.as_str()),
        ("v2", stable.as_str())
    );
    assert!(m.status.stopped.is_none(), "reverted, not halted");
    assert!(m.all_on(&stable), "{:#?}", m.cluster.pods);
    // Reverted, as a revert of a plain DaemonSet ends: Degraded, v2 blocked.
    assert_eq!(m.status.phase, Some(Phase::Degraded), "{:#?}", m.status);
    assert!(
        m.status
            .blocked_revisions
            .iter()
            .any(|b| b.revision == "v2"),
        "v2 stays blocked"
    );
    assert_eq!(writes(&m), 0, "no template written over the owner's");
    no_violations(&m);
}

/// An owner a GitOps tool manages: a revert written there would be undone
/// at its next sync, so the rollout halts, saying what to revert in Git.
#[test]
fn an_owner_a_gitops_tool_manages_is_reverted_in_git_not_by_saferollout() {
    let mut m = owned(4, NVIDIA, true);
    m.owner_revert = true;
    m.owner_gitops = Some("Argo CD (application gpu-operator)".into());
    m.run(60);
    m.write_revision("v2", Release::Broken);
    m.run(600);
    let stopped = m.status.stopped.clone().expect("halted");
    assert_eq!(stopped.policy, OnFailure::Halt);
    assert!(
        stopped
            .message
            .contains("managed by Argo CD (application gpu-operator)")
            && stopped.message.contains("in Git"),
        "{}",
        stopped.message
    );
    assert!(
        !m.actions_log
            .iter()
            .any(|a| matches!(a, Action::RevertOwner { .. })),
        "nothing written to the owner"
    );
    assert_eq!(writes(&m), 0);
    no_violations(&m);
}

#[test]
fn an_owner_that_leaves_the_strategy_alone_gets_on_delete_from_saferollout() {
    let mut m = owned(3, INTEL, false);
    m.run(60);
    assert_eq!(m.status.phase, Some(Phase::Succeeded), "{:#?}", m.status);
    assert_eq!(m.cluster.ds.strategy, "OnDelete");
    m.write_revision("v2", Release::Healthy);
    m.run(600);
    assert!(m.all_on("v2"));
    no_violations(&m);
}

#[test]
fn spec_template_is_refused_on_an_owned_daemonset() {
    let mut m = owned(3, NVIDIA, true);
    m.spec.template = Some(serde_json::json!({"spec": {"containers": []}}));
    m.run(30);
    let (reason, message) = ready(&m);
    assert_eq!(reason, "InvalidSpec");
    assert!(message.starts_with("spec.template:"), "{message}");
    assert_eq!(writes(&m), 0);
}
