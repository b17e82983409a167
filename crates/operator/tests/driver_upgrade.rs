//! A vendor's driver upgrade starting in the middle of a rollout (issue 39),
//! end to end against the real control plane, the operator as its
//! ServiceAccount. The test plays NVIDIA's upgrade controller: it marks a
//! node of the rollout's second stage
//! `nvidia.com/gpu-driver-upgrade-state=upgrade-required`, then
//! `pod-restart-required`, and deletes that node's agent pod, as the
//! controller does to the operands that depend on the driver (the
//! DaemonSet, OnDelete, brings it back from its current template).
//!
//! What it shows (`docs/vendors.md`, "A driver upgrade during a rollout"):
//! - the stage waits (Ready reason `DriverUpgrade`, naming the node and the
//!   label) for two progress deadlines and more, without failing, and the
//!   operator neither replaces nor judges that node meanwhile;
//! - the budget holds: the vendor's node counts against `maxUnavailable`,
//!   so at most one node is without a Ready agent at any moment, the
//!   vendor's included;
//! - once the label reads `upgrade-done`, the stage's gates judge afresh
//!   and the rollout finishes, every node's agent created once.

mod support;

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use saferollout_api::{Phase, SafeRolloutStatus};
use saferollout_core::eligibility::{DRIVER_UPGRADE, NVIDIA_DRIVER_UPGRADE_LABEL};
use saferollout_testkit::cluster;
use serde_json::json;
use support::{
    Identity, Operator, TIMEOUT, condition, create_plugin_daemonset, create_rollout, pod_ready,
    sample_pods, set_template_image, wait_adopted, wait_agents, wait_live_pods, wait_status,
};

const OPERATOR_SA: &str = "system:serviceaccount:saferollout-system:saferollout-operator";
/// Replaced last in stage 2 (nodes are taken and replaced by name), so the
/// upgrade starts before the rollout reaches it.
const UPGRADED: &str = "sim-gpu-3";
const DEADLINE_SECS: u64 = 15;

async fn set_upgrade_state(nodes: &Api<Node>, state: Option<&str>) -> anyhow::Result<()> {
    let patch = json!({"metadata": {"labels": {NVIDIA_DRIVER_UPGRADE_LABEL: state}}});
    nodes
        .patch(UPGRADED, &PatchParams::default(), &Patch::Merge(patch))
        .await?;
    Ok(())
}

fn waiting_on_upgrade(st: &SafeRolloutStatus) -> bool {
    condition(st, "Ready").is_some_and(|c| c.reason == DRIVER_UPGRADE)
}

#[tokio::test]
async fn a_driver_upgrade_starting_mid_rollout_is_waited_for_within_the_budget()
-> anyhow::Result<()> {
    let c = cluster();
    support::install(c)?;
    let ns = c.namespace("driver-upgrade").await?;
    let client = c.client().await?;
    let args = support::operator_args(&ns.name, "127.0.0.1:0", 3);
    let _op = Operator::start(
        Identity::Impersonate(c.kubeconfig(), OPERATOR_SA),
        &args,
        &format!("driver-upgrade-{}", ns.name),
    )?;
    let resource = format!("example.com/gpu-{}", ns.name);
    let (v1, v2) = ("registry.example/plugin:v1", "registry.example/plugin:v2");
    create_plugin_daemonset(&client, &ns.name, &resource, v1).await?;
    let spec = json!({
        "targetRef": {"name": "plugin"},
        "stages": [{"nodes": 1}, {"nodes": "100%"}],
        "maxUnavailable": 1,
        "progressDeadline": format!("{DEADLINE_SECS}s"),
        "gates": {"allocatable": [{"resource": resource, "min": "baseline", "max": "baseline", "soak": "2s"}]}
    });
    create_rollout(&client, &ns.name, "plugin", spec).await?;
    wait_adopted(&client, &ns.name, "plugin").await?;

    let nodes_api: Api<Node> = Api::all(client.clone());
    let names: Vec<String> = nodes_api
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter_map(|n| n.metadata.name)
        .collect();
    let (samples, task) = sample_pods(&client, &ns.name, names.clone());
    set_template_image(&client, &ns.name, "plugin", &resource, v2).await?;
    // Stage 2 took its nodes: the upgrade controller starts on the last.
    wait_status(&client, &ns.name, "plugin", TIMEOUT, |st| {
        st.stages.len() == 2 && st.stages[1].nodes.iter().any(|n| n == UPGRADED)
    })
    .await?;
    // NVIDIA's upgrade controller announces the upgrade (`upgrade-required`)
    // before it deletes anything. Once the operator holds the stage, and
    // the replacement it had in flight is Ready, nothing of the operator's
    // is unavailable: the vendor's deletion then has the budget to itself,
    // and any second node down from here on is the operator's doing.
    set_upgrade_state(&nodes_api, Some("upgrade-required")).await?;
    wait_status(&client, &ns.name, "plugin", TIMEOUT, waiting_on_upgrade).await?;
    wait_live_pods(&client, &ns.name, "app=plugin", |live| {
        names.iter().filter(|n| *n != UPGRADED).all(|n| {
            live.iter().any(|p| {
                p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(n) && pod_ready(p)
            })
        })
    })
    .await?;
    set_upgrade_state(&nodes_api, Some("pod-restart-required")).await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    let on_node = ListParams::default()
        .labels("app=plugin")
        .fields(&format!("spec.nodeName={UPGRADED}"));
    let before: Vec<Pod> = pods.list(&on_node).await?.items;
    let before_uid = before.first().and_then(|p| p.metadata.uid.clone());
    let before_image = before.first().map(support::image_of).map(str::to_string);
    for p in &before {
        pods.delete(
            &p.metadata.name.clone().unwrap_or_default(),
            &DeleteParams::default(),
        )
        .await?;
    }
    assert_eq!(
        before_image.as_deref(),
        Some(v1),
        "the upgrade started before the rollout reached {UPGRADED}"
    );

    // The stage waits, naming the node and the label's new state.
    let st = wait_status(&client, &ns.name, "plugin", TIMEOUT, |st| {
        waiting_on_upgrade(st)
            && condition(st, "Ready").is_some_and(|c| c.message.contains("pod-restart-required"))
    })
    .await?;
    let message = &condition(&st, "Ready").unwrap().message;
    assert!(
        message.contains(UPGRADED) && message.contains("pod-restart-required"),
        "{message}"
    );
    // ...for more than two progress deadlines, neither failing nor moving on.
    let hold = Duration::from_secs(2 * DEADLINE_SECS + 5);
    let moved = wait_status(&client, &ns.name, "plugin", hold, |st| {
        st.phase != Some(Phase::Progressing)
            || st.stopped.is_some()
            || !st.blocked_revisions.is_empty()
            || st.current_stage != Some(1)
            || !waiting_on_upgrade(st)
    })
    .await;
    assert!(
        moved.is_err(),
        "the rollout did not wait for the driver upgrade: {moved:#?}"
    );
    {
        let s = samples.lock().unwrap();
        // Only the DaemonSet's own replacement on the upgraded node (after
        // the vendor's deletion); the operator deleted nothing there.
        let recreated: Vec<&String> = s
            .pods
            .iter()
            .filter(|(_, p)| p.node == UPGRADED)
            .map(|(name, _)| name)
            .collect();
        assert_eq!(
            s.created
                .iter()
                .filter(|((n, _), _)| n == UPGRADED)
                .map(|(_, c)| *c)
                .sum::<usize>(),
            1,
            "{UPGRADED} got one pod, the DaemonSet's after the vendor's deletion: {recreated:?}"
        );
        let (most, at) = s.max_unavailable(&BTreeSet::new());
        assert!(
            most <= 1,
            "{most} nodes without a Ready agent at once ({at:?}), the vendor's included, at maxUnavailable 1"
        );
    }
    assert!(before_uid.is_some());

    // The upgrade ends: judged afresh, the rollout finishes.
    set_upgrade_state(&nodes_api, Some("upgrade-done")).await?;
    wait_status(&client, &ns.name, "plugin", TIMEOUT, |st| {
        st.phase == Some(Phase::Succeeded) && st.stages.len() == 2
    })
    .await?;
    wait_agents(&client, &ns.name, v2).await?;
    task.abort();
    {
        let s = samples.lock().unwrap();
        s.assert_each_node_got_one(v2, names.len());
        let (most, at) = s.max_unavailable(&BTreeSet::new());
        assert!(most <= 1, "{most} nodes down at once: {at:?}");
    }
    set_upgrade_state(&nodes_api, None).await?;
    Ok(())
}
