//! The rollout engine beyond the canary, on the real control plane: failures
//! at a later stage, a Git revert mid-rollout, a node going NotReady during a
//! revert, a node dying after its agent was replaced, a node joining
//! mid-rollout, quantities in thousands, a second SafeRollout on one
//! DaemonSet, two operator replicas with the leader killed mid-stage, and
//! status writes refused by the API server mid-stage.
//!
//! The disruption budget is checked by sampling: a watch on the agent pods
//! records, at every event, which nodes have no live Ready agent; the largest
//! such set (leaving out the nodes whose agent failed a gate, the documented
//! exception) must never exceed `maxUnavailable`.

mod support;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use saferollout_api::{Phase, SafeRollout, SafeRolloutStatus, StageState};
use saferollout_testkit::{TestNamespace, cluster, wait_for_all, wait_for_object};
use serde_json::json;
use support::{
    GPUS, Identity, Operator, TIMEOUT, agent_template, allocatable, condition, create_rollout,
    free_loopback_port, http_get, image_of, is_leader, pod_ready, sample_pods, wait_adopted,
    wait_agents, wait_status,
};

const OPERATOR_SA: &str = "system:serviceaccount:saferollout-system:saferollout-operator";
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

struct Env {
    _serial: tokio::sync::MutexGuard<'static, ()>,
    ns: TestNamespace,
    client: Client,
    /// Each test advertises its own extended resource.
    resource: String,
}

async fn setup(name: &str) -> anyhow::Result<Env> {
    let serial = SERIAL.lock().await;
    let c = cluster();
    support::install(c)?;
    Ok(Env {
        _serial: serial,
        ns: c.namespace(name).await?,
        client: c.client().await?,
        resource: format!("example.com/gpu-{name}"),
    })
}

/// The operator as its ServiceAccount, watching the test's namespace, with a
/// short lease (`duration` seconds) and metrics on `metrics_port`.
fn operator(env: &Env, log: &str, duration: u64, metrics_port: u16) -> anyhow::Result<Operator> {
    let c = cluster();
    let args = support::operator_args(&env.ns.name, &format!("127.0.0.1:{metrics_port}"), duration);
    Operator::start(
        Identity::Impersonate(c.kubeconfig(), OPERATOR_SA),
        &args,
        &format!("{log}-{}", env.ns.name),
    )
}

fn srs(env: &Env) -> Api<SafeRollout> {
    Api::namespaced(env.client.clone(), &env.ns.name)
}

/// The plugin DaemonSet from `template`, waited on until every node runs it.
async fn create_daemonset(
    env: &Env,
    template: serde_json::Value,
    image: &str,
) -> anyhow::Result<()> {
    let ds: k8s_openapi::api::apps::v1::DaemonSet = serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "plugin"},
        "spec": {"selector": {"matchLabels": {"app": "plugin"}}, "template": template}
    }))?;
    Api::<k8s_openapi::api::apps::v1::DaemonSet>::namespaced(env.client.clone(), &env.ns.name)
        .create(&PostParams::default(), &ds)
        .await?;
    wait_agents(&env.client, &env.ns.name, image).await
}

async fn set_template(env: &Env, template: serde_json::Value) -> anyhow::Result<()> {
    srs(env)
        .patch(
            "plugin",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"template": template}})),
        )
        .await?;
    Ok(())
}

async fn annotate_remove(env: &Env, key: &str) -> anyhow::Result<()> {
    let patch = json!({"metadata": {"annotations": {key: null}}});
    srs(env)
        .patch("plugin", &PatchParams::default(), &Patch::Merge(patch))
        .await?;
    Ok(())
}

async fn annotate(env: &Env, key: &str, value: &str) -> anyhow::Result<()> {
    let patch = json!({"metadata": {"annotations": {key: value}}});
    srs(env)
        .patch("plugin", &PatchParams::default(), &Patch::Merge(patch))
        .await?;
    Ok(())
}

/// Waits until every node's allocatable of the test's resource satisfies `ok`.
async fn wait_allocatable(
    env: &Env,
    ok: impl Fn(&str, Option<i64>) -> bool + Send + 'static,
) -> anyhow::Result<()> {
    let res = env.resource.clone();
    wait_for_all(
        &Api::<Node>::all(env.client.clone()),
        watcher::Config::default(),
        TIMEOUT,
        move |ns| ns.iter().all(|n| ok(&n.name_any(), allocatable(n, &res))),
    )
    .await?;
    Ok(())
}

/// The test cluster's nodes.
fn four_nodes() -> Vec<String> {
    (0..4).map(|i| format!("sim-gpu-{i}")).collect()
}

fn failed_nodes(st: &SafeRolloutStatus) -> BTreeSet<String> {
    st.stages
        .iter()
        .flat_map(|s| s.failed_nodes.iter().cloned())
        .collect()
}

/// The plugin DaemonSet on `v1` with a rollout of `stages` adopted, then
/// `v2` written to spec.template: the rollout of v2 has started.
async fn roll(
    env: &Env,
    stages: serde_json::Value,
    v1: &str,
    v2: &str,
) -> anyhow::Result<SafeRolloutStatus> {
    create_daemonset(env, agent_template(&env.resource, v1), v1).await?;
    let mut spec = support::default_spec(&env.resource, v1);
    spec["stages"] = stages;
    create_rollout(&env.client, &env.ns.name, "plugin", spec).await?;
    let adopted = wait_adopted(&env.client, &env.ns.name, "plugin").await?;
    set_template(env, agent_template(&env.resource, v2)).await?;
    Ok(adopted)
}

/// Sets a node label for the test, removes it when dropped.
struct NodeLabel(&'static str, &'static str);

impl NodeLabel {
    fn set(node: &'static str, key: &'static str, value: &str) -> anyhow::Result<Self> {
        cluster().kubectl(&[
            "label",
            "node",
            node,
            &format!("{key}={value}"),
            "--overwrite",
        ])?;
        Ok(NodeLabel(node, key))
    }
}

impl Drop for NodeLabel {
    fn drop(&mut self) {
        let _ = cluster().kubectl(&["label", "node", self.0, &format!("{}-", self.1)]);
    }
}

#[tokio::test]
async fn a_failure_at_a_later_stage_is_reverted_within_the_budget() -> anyhow::Result<()> {
    let env = setup("later").await?;
    let _op = operator(&env, "later", 3, 0)?;
    let (v1, bad) = (
        "registry.example/plugin:v1",
        "registry.example/plugin:v2-cleartaints",
    );
    create_daemonset(&env, agent_template(&env.resource, v1), v1).await?;
    // sim-gpu-1 has a faulty GPU: the healthy plugin leaves it out (7), a
    // release that "launders" device health advertises all 8. The canary
    // (sim-gpu-0) has no faulty GPU, so the release passes it and fails at the
    // second stage, on sim-gpu-1.
    let _faulty = NodeLabel::set("sim-gpu-1", "sim.saferollout.dev/faulty-devices", "gpu-3")?;
    wait_allocatable(&env, |n, a| {
        a == Some(if n == "sim-gpu-1" { GPUS - 1 } else { GPUS })
    })
    .await?;
    let mut spec = support::default_spec(&env.resource, v1);
    spec["maxUnavailable"] = json!(1);
    create_rollout(&env.client, &env.ns.name, "plugin", spec).await?;
    wait_adopted(&env.client, &env.ns.name, "plugin").await?;

    let (samples, task) = sample_pods(&env.client, &env.ns.name, four_nodes());
    set_template(&env, agent_template(&env.resource, bad)).await?;
    let st = wait_status(&env.client, &env.ns.name, "plugin", TIMEOUT, |st| {
        st.phase == Some(Phase::Degraded)
    })
    .await?;
    wait_agents(&env.client, &env.ns.name, v1).await?;
    task.abort();

    let blocked = &st.blocked_revisions[0];
    assert_eq!(blocked.reason, "AboveMaximum", "{st:#?}");
    assert!(
        blocked.message.contains("sim-gpu-1") && blocked.message.contains("is 8, expected <= 7"),
        "{}",
        blocked.message
    );
    assert_eq!(st.stages[0].state, StageState::Passed, "the canary passed");
    assert_eq!(
        st.stages[1].state,
        StageState::Failed,
        "the second stage failed"
    );
    let exempt = failed_nodes(&st);
    assert!(exempt.contains("sim-gpu-1"), "{exempt:?}");
    let samples = samples.lock().unwrap();
    let (most, when) = samples.max_unavailable(&exempt);
    eprintln!("MEASURE most agents unavailable at once (failed nodes aside): {most} {when:?}");
    assert!(most <= 1, "maxUnavailable 1 broken: {when:?} at once");
    // Only the canary and the failing node ever ran the bad release.
    let bad_nodes: BTreeSet<&String> = samples
        .created
        .keys()
        .filter(|(_, i)| i == bad)
        .map(|(n, _)| n)
        .collect();
    assert_eq!(bad_nodes.len(), 2, "{bad_nodes:?}");
    Ok(())
}

#[tokio::test]
async fn a_git_revert_mid_rollout_honours_max_unavailable() -> anyhow::Result<()> {
    let env = setup("gitrevert").await?;
    let _op = operator(&env, "gitrevert", 3, 0)?;
    let (v1, v2) = ("registry.example/plugin:v1", "registry.example/plugin:v2");
    create_daemonset(&env, agent_template(&env.resource, v1), v1).await?;
    let mut spec = support::default_spec(&env.resource, v1);
    spec["stages"] = json!([{"nodes": 1}, {"nodes": "100%"}]);
    spec["maxUnavailable"] = json!(1);
    create_rollout(&env.client, &env.ns.name, "plugin", spec).await?;
    wait_adopted(&env.client, &env.ns.name, "plugin").await?;

    let (samples, task) = sample_pods(&env.client, &env.ns.name, four_nodes());
    set_template(&env, agent_template(&env.resource, v2)).await?;
    // Mid-rollout: three of the four nodes on v2.
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), &env.ns.name);
    wait_for_all(
        &pods,
        watcher::Config::default().labels("app=plugin"),
        TIMEOUT,
        |ps| {
            ps.iter()
                .filter(|p| {
                    image_of(p) == v2 && pod_ready(p) && p.metadata.deletion_timestamp.is_none()
                })
                .count()
                >= 3
        },
    )
    .await?;
    // Git reverts spec.template to v1.
    set_template(&env, agent_template(&env.resource, v1)).await?;
    let st = wait_status(&env.client, &env.ns.name, "plugin", TIMEOUT, |st| {
        st.phase == Some(Phase::Succeeded)
            && st
                .message
                .as_deref()
                .is_some_and(|m| m.contains("every node runs"))
    })
    .await?;
    wait_agents(&env.client, &env.ns.name, v1).await?;
    task.abort();
    assert!(
        st.blocked_revisions.is_empty(),
        "an abandoned rollout blocks nothing: {st:#?}"
    );
    let samples = samples.lock().unwrap();
    let (most, when) = samples.max_unavailable(&BTreeSet::new());
    eprintln!(
        "MEASURE most agents unavailable at once during rollout and Git revert: {most} {when:?}"
    );
    assert!(most <= 1, "maxUnavailable 1 broken: {when:?} at once");
    let back: usize = samples
        .created
        .iter()
        .filter(|((_, i), _)| i == v1)
        .map(|(_, n)| n)
        .sum();
    assert!(
        back >= 3,
        "the nodes that got v2 went back to v1: {:?}",
        samples.created
    );
    Ok(())
}

/// Makes a node NotReady (KWOK leaves nodes with this label alone) until dropped.
struct NotReady(&'static str);

impl NotReady {
    async fn set(client: &Client, node: &'static str) -> anyhow::Result<Self> {
        Self::set_since(client, node, Duration::ZERO).await
    }

    /// NotReady since `ago` before now. A node that went NotReady before a
    /// rollout must say so by more than the API's one-second resolution of
    /// `lastTransitionTime`: one that changed in the second the first stage
    /// started counts as going NotReady during the rollout (the breaker
    /// compares whole seconds, and holds on a tie).
    async fn set_since(client: &Client, node: &'static str, ago: Duration) -> anyhow::Result<Self> {
        let c = cluster();
        c.kubectl(&[
            "label",
            "node",
            node,
            "sim.saferollout.dev/not-ready=true",
            "--overwrite",
        ])?;
        let guard = NotReady(node);
        let nodes: Api<Node> = Api::all(client.clone());
        let n = nodes.get_status(node).await?;
        let mut conditions = n.status.and_then(|s| s.conditions).unwrap_or_default();
        for ready in conditions.iter_mut().filter(|c| c.type_ == "Ready") {
            ready.status = "False".into();
            // As the kubelet does: the condition changed now.
            ready.last_transition_time = Some(
                k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(jiff::Timestamp::now() - ago),
            );
            ready.reason = Some("KubeletNotReady".into());
            ready.message = Some("test: the node's runtime stopped".into());
        }
        nodes
            .patch_status(
                node,
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {"conditions": conditions}})),
            )
            .await?;
        // The node lifecycle controller taints it: the DaemonSet controller would not refill it.
        wait_for_object(&nodes, node, TIMEOUT, |n| {
            n.and_then(|n| n.spec.as_ref()?.taints.as_ref())
                .is_some_and(|ts| {
                    ts.iter().any(|t| {
                        t.key == "node.kubernetes.io/not-ready" && t.effect == "NoSchedule"
                    })
                })
        })
        .await?;
        Ok(guard)
    }
}

impl Drop for NotReady {
    fn drop(&mut self) {
        // KWOK's node-initialize stage sets it Ready again.
        let _ = cluster().kubectl(&["label", "node", self.0, "sim.saferollout.dev/not-ready-"]);
    }
}

async fn wait_node_ready(client: &Client, node: &str) -> anyhow::Result<()> {
    wait_for_object(&Api::<Node>::all(client.clone()), node, TIMEOUT, |n| {
        let ready = n
            .and_then(|n| n.status.as_ref()?.conditions.as_ref())
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
        let tainted = n
            .and_then(|n| n.spec.as_ref()?.taints.as_ref())
            .is_some_and(|ts| {
                ts.iter()
                    .any(|t| t.key.starts_with("node.kubernetes.io/not-ready"))
            });
        ready && !tainted
    })
    .await?;
    Ok(())
}

#[tokio::test]
async fn a_node_made_not_ready_during_a_revert_is_named_and_not_emptied() -> anyhow::Result<()> {
    let env = setup("notready").await?;
    let _op = operator(&env, "notready", 3, 0)?;
    let (v1, v2) = ("registry.example/plugin:v1", "registry.example/plugin:v2");
    let paused_canary = json!([{"nodes": 1, "pause": true}, {"nodes": "100%"}]);
    roll(&env, paused_canary, v1, v2).await?;
    let paused = wait_status(&env.client, &env.ns.name, "plugin", TIMEOUT, |st| {
        st.phase == Some(Phase::Paused)
    })
    .await?;
    let canary = paused.stages[0].nodes[0].clone();
    let canary: &'static str = Box::leak(canary.into_boxed_str());
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), &env.ns.name);
    let on_canary = |ps: &[Arc<Pod>]| {
        ps.iter()
            .find(|p| {
                p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(canary)
                    && image_of(p) == v2
            })
            .cloned()
    };
    let before = wait_for_all(
        &pods,
        watcher::Config::default().labels("app=plugin"),
        TIMEOUT,
        |ps| on_canary(ps).is_some(),
    )
    .await?;
    let canary_pod = on_canary(&before).expect("the canary runs v2");

    // The canary's node goes NotReady, then a person aborts the rollout.
    let not_ready = NotReady::set(&env.client, canary).await?;
    annotate(
        &env,
        "saferollout.dev/abort",
        paused.target_revision.as_deref().unwrap_or_default(),
    )
    .await?;
    let st = wait_status(&env.client, &env.ns.name, "plugin", TIMEOUT, |st| {
        st.phase == Some(Phase::Degraded) && st.stuck_nodes.iter().any(|n| n.node == canary)
    })
    .await?;
    let ready = condition(&st, "Ready").unwrap();
    assert!(
        ready.message.contains(canary) && ready.message.contains("not-ready"),
        "{}",
        ready.message
    );
    assert!(
        condition(&st, "Stalled").is_some_and(|c| c.status == "True"),
        "{st:#?}"
    );
    // Every other node is back on v1; the NotReady node was not emptied.
    wait_for_all(
        &pods,
        watcher::Config::default().labels("app=plugin"),
        TIMEOUT,
        |ps| {
            ps.iter()
                .filter(|p| {
                    p.metadata.deletion_timestamp.is_none() && image_of(p) == v1 && pod_ready(p)
                })
                .count()
                == 3
        },
    )
    .await?;
    let still = pods.get(&canary_pod.name_any()).await?;
    assert_eq!(
        still.uid(),
        canary_pod.uid(),
        "the canary's pod is the same pod"
    );
    assert!(
        still.metadata.deletion_timestamp.is_none(),
        "the NotReady node's agent was not deleted"
    );

    // The node recovers: it is reverted too and nothing is stuck any more.
    drop(not_ready);
    wait_node_ready(&env.client, canary).await?;
    let st = wait_status(&env.client, &env.ns.name, "plugin", TIMEOUT, |st| {
        st.phase == Some(Phase::Degraded)
            && st.stuck_nodes.is_empty()
            && condition(st, "Ready").is_some_and(|c| c.reason == "RolledBack")
    })
    .await?;
    wait_agents(&env.client, &env.ns.name, v1).await?;
    assert_eq!(st.blocked_revisions[0].reason, "Aborted");
    Ok(())
}

/// The budget forgets a node that went NotReady after its agent was
/// replaced (hardware that died mid-rollout): the DaemonSet controller does
/// not count it either, and holding a slot for it would stall the rollout
/// until its deadline reverted a healthy release. (The opposite case, a node
/// the node cache still shows NotReady while its replaced agent starts, is
/// counted: the property tests of `crates/core` replay it with lagging
/// caches.)
#[tokio::test]
async fn a_node_that_fails_after_its_agent_was_replaced_holds_no_budget_slot() -> anyhow::Result<()>
{
    let env = setup("deadnode").await?;
    let _op = operator(&env, "deadnode", 3, 0)?;
    let (v1, v2) = ("registry.example/plugin:v1", "registry.example/plugin:v2");
    let paused_canary = json!([{"nodes": 1, "pause": true}, {"nodes": "100%"}]);
    create_daemonset(&env, agent_template(&env.resource, v1), v1).await?;
    let mut spec = support::default_spec(&env.resource, v1);
    spec["stages"] = paused_canary;
    spec["maxUnavailable"] = json!(1);
    create_rollout(&env.client, &env.ns.name, "plugin", spec).await?;
    wait_adopted(&env.client, &env.ns.name, "plugin").await?;
    set_template(&env, agent_template(&env.resource, v2)).await?;
    let paused = wait_status(&env.client, &env.ns.name, "plugin", TIMEOUT, |st| {
        st.phase == Some(Phase::Paused)
    })
    .await?;
    let canary: &'static str = Box::leak(paused.stages[0].nodes[0].clone().into_boxed_str());

    let others: Vec<String> = four_nodes().into_iter().filter(|n| n != canary).collect();
    let (samples, task) = sample_pods(&env.client, &env.ns.name, others.clone());
    // The canary's node dies: the node lifecycle controller marks its (v2)
    // agent not Ready. The canary stage takes another node in its place.
    let not_ready = NotReady::set(&env.client, canary).await?;
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), &env.ns.name);
    wait_for_all(
        &pods,
        watcher::Config::default().labels("app=plugin"),
        TIMEOUT,
        |ps| {
            ps.iter().any(|p| {
                p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(canary)
                    && image_of(p) == v2
                    && !pod_ready(p)
            })
        },
    )
    .await?;

    // Approved, the last stage replaces the other agents one at a time.
    annotate(
        &env,
        "saferollout.dev/approve",
        &format!(
            "{}:0",
            paused.target_revision.as_deref().unwrap_or_default()
        ),
    )
    .await?;
    let st = wait_status(&env.client, &env.ns.name, "plugin", TIMEOUT, |st| {
        st.phase == Some(Phase::Succeeded) && st.stable_revision == st.target_revision
    })
    .await?;
    task.abort();
    assert!(st.blocked_revisions.is_empty(), "{st:#?}");
    let skipped: Vec<_> = st.stages.iter().flat_map(|s| s.skipped.iter()).collect();
    assert!(
        skipped.iter().any(|n| n.node == canary),
        "the dead node was let go from its stage: {skipped:?}"
    );
    {
        let samples = samples.lock().unwrap();
        let (most, when) = samples.max_unavailable(&BTreeSet::new());
        eprintln!("MEASURE most of the other agents unavailable at once: {most} {when:?}");
        assert!(most <= 1, "maxUnavailable 1 broken: {when:?} at once");
        for node in &others {
            assert!(
                samples
                    .created
                    .contains_key(&(node.clone(), v2.to_string())),
                "{node} got v2: {:?}",
                samples.created
            );
        }
    }
    drop(not_ready);
    wait_node_ready(&env.client, canary).await?;
    wait_agents(&env.client, &env.ns.name, v2).await?;
    Ok(())
}

/// Creates a simulated GPU node like `tests/cluster/up` does; deletes it when dropped.
struct ExtraNode(&'static str);

impl ExtraNode {
    async fn create(client: &Client, name: &'static str, zone: &str) -> anyhow::Result<Self> {
        let node: Node = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {
                "kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "type": "kwok",
                "topology.kubernetes.io/zone": zone,
                "sim.saferollout.dev/devices": GPUS.to_string(), "example.com/gpu.count": GPUS.to_string()},
                "annotations": {"kwok.x-k8s.io/node": "fake"}},
            "status": {"capacity": {"cpu": "32", "memory": "256Gi", "pods": "110"},
                       "allocatable": {"cpu": "32", "memory": "256Gi", "pods": "110"}}
        }))?;
        Api::<Node>::all(client.clone())
            .create(&PostParams::default(), &node)
            .await?;
        Ok(ExtraNode(name))
    }
}

impl Drop for ExtraNode {
    fn drop(&mut self) {
        let _ = cluster().kubectl(&["delete", "node", self.0, "--wait=false"]);
    }
}

#[tokio::test]
async fn a_node_joining_mid_rollout_is_judged_with_the_current_stage() -> anyhow::Result<()> {
    let env = setup("join").await?;
    let _op = operator(&env, "join", 3, 0)?;
    let (v1, v2) = ("registry.example/plugin:v1", "registry.example/plugin:v2");
    let paused_canary = json!([{"nodes": 1, "pause": true}, {"nodes": "100%"}]);
    roll(&env, paused_canary, v1, v2).await?;
    let paused = wait_status(&env.client, &env.ns.name, "plugin", TIMEOUT, |st| {
        st.phase == Some(Phase::Paused)
    })
    .await?;

    // A node joins: the DaemonSet controller gives it the template it has now (v2).
    let _node = ExtraNode::create(&env.client, "sim-gpu-joined", "zone-b").await?;
    let joined = Instant::now();
    let st = wait_status(&env.client, &env.ns.name, "plugin", TIMEOUT, |st| {
        st.phase == Some(Phase::Paused)
            && st.stages[0].nodes.iter().any(|n| n == "sim-gpu-joined")
            && st.stages[0]
                .gates
                .iter()
                .any(|g| g.gate == "podsReady" && g.message.starts_with("2/2"))
            && st.stages[0]
                .gates
                .iter()
                .all(|g| g.status == saferollout_api::GateStatus::Passed)
    })
    .await?;
    eprintln!(
        "MEASURE node joined -> judged with stage 1: {:?}",
        joined.elapsed()
    );
    assert!(
        !st.stages[0].baseline.contains_key("sim-gpu-joined"),
        "a new node has no before"
    );
    annotate(
        &env,
        "saferollout.dev/approve",
        &format!(
            "{}:0",
            paused.target_revision.as_deref().unwrap_or_default()
        ),
    )
    .await?;
    wait_status(&env.client, &env.ns.name, "plugin", TIMEOUT, |st| {
        st.phase == Some(Phase::Succeeded) && st.stable_revision == st.target_revision
    })
    .await?;
    wait_agents(&env.client, &env.ns.name, v2).await?;
    Ok(())
}

#[tokio::test]
async fn a_resource_counted_in_thousands_rolls_and_gates() -> anyhow::Result<()> {
    let env = setup("kilo").await?;
    let _op = operator(&env, "kilo", 3, 0)?;
    // Like Intel's gpu.intel.com/millicores: 1000 units per GPU, "8k" per node.
    let template = |image: &str| {
        let mut t = agent_template(&env.resource, image);
        t["metadata"]["annotations"]["sim.saferollout.dev/units-per-device"] = json!("1000");
        t
    };
    let (v1, v2, bad) = (
        "registry.example/plugin:v1",
        "registry.example/plugin:v2",
        "registry.example/plugin:v3-broken",
    );
    create_daemonset(&env, template(v1), v1).await?;
    wait_allocatable(&env, |_, a| a == Some(8000)).await?;
    let node = Api::<Node>::all(env.client.clone())
        .get("sim-gpu-0")
        .await?;
    let shown = node.status.unwrap().allocatable.unwrap()[&env.resource]
        .0
        .clone();
    assert_eq!(shown, "8k", "the API server writes 8000 as 8k");
    let mut spec = support::default_spec(&env.resource, v1);
    spec["template"] = template(v1);
    create_rollout(&env.client, &env.ns.name, "plugin", spec).await?;
    let adopted = wait_adopted(&env.client, &env.ns.name, "plugin").await?;

    set_template(&env, template(v2)).await?;
    let st = wait_status(&env.client, &env.ns.name, "plugin", TIMEOUT, |st| {
        st.phase == Some(Phase::Succeeded) && st.stable_revision != adopted.stable_revision
    })
    .await?;
    assert_eq!(
        st.stages[0].baseline.values().next().unwrap()[&env.resource],
        8000
    );

    set_template(&env, template(bad)).await?;
    let st = wait_status(&env.client, &env.ns.name, "plugin", TIMEOUT, |st| {
        st.phase == Some(Phase::Degraded)
    })
    .await?;
    wait_agents(&env.client, &env.ns.name, v2).await?;
    let b = &st.blocked_revisions[0];
    assert_eq!(b.reason, "BelowMinimum");
    assert!(
        b.message.contains("is 0, expected >= 8000"),
        "{}",
        b.message
    );
    assert_eq!(
        st.stages.iter().flat_map(|s| s.nodes.iter()).count(),
        1,
        "caught at the canary"
    );
    Ok(())
}

#[tokio::test]
async fn a_second_saferollout_on_the_same_daemonset_is_refused() -> anyhow::Result<()> {
    let env = setup("conflict").await?;
    let _op = operator(&env, "conflict", 3, 0)?;
    let v1 = "registry.example/plugin:v1";
    create_daemonset(&env, agent_template(&env.resource, v1), v1).await?;
    create_rollout(
        &env.client,
        &env.ns.name,
        "plugin",
        support::default_spec(&env.resource, v1),
    )
    .await?;
    wait_adopted(&env.client, &env.ns.name, "plugin").await?;
    let mut second = support::default_spec(&env.resource, "registry.example/plugin:v2");
    second["stages"] = json!([{"nodes": "100%"}]);
    create_rollout(&env.client, &env.ns.name, "second", second).await?;
    let st = wait_status(&env.client, &env.ns.name, "second", TIMEOUT, |st| {
        condition(st, "Ready").is_some_and(|c| c.reason == "TargetConflict")
    })
    .await?;
    let ready = condition(&st, "Ready").unwrap();
    assert!(
        ready.message.contains("\"plugin\""),
        "names the owner: {}",
        ready.message
    );
    assert!(condition(&st, "Stalled").is_some_and(|c| c.status == "True"));
    assert!(
        st.stable_revision.is_none() && st.original_update_strategy.is_none(),
        "touched nothing: {st:#?}"
    );
    // Nothing changed: every agent still runs v1, the owner is still Succeeded.
    wait_agents(&env.client, &env.ns.name, v1).await?;
    let owner = srs(&env).get("plugin").await?.status.unwrap_or_default();
    assert_eq!(owner.phase, Some(Phase::Succeeded));
    Ok(())
}

#[tokio::test]
async fn a_killed_leader_is_replaced_within_the_lease_duration_and_no_pod_is_deleted_twice()
-> anyhow::Result<()> {
    let env = setup("failover").await?;
    const LEASE: u64 = 5;
    let ports = [free_loopback_port()?, free_loopback_port()?];
    let mut a = operator(&env, "failover-a", LEASE, ports[0])?;
    let mut b = operator(&env, "failover-b", LEASE, ports[1])?;
    let (v1, v2) = ("registry.example/plugin:v1", "registry.example/plugin:v2");
    create_daemonset(&env, agent_template(&env.resource, v1), v1).await?;
    let mut spec = support::default_spec(&env.resource, v1);
    spec["stages"] =
        json!([{"nodes": 1, "soak": "2s"}, {"nodes": 2, "soak": "4s"}, {"nodes": "100%"}]);
    create_rollout(&env.client, &env.ns.name, "plugin", spec).await?;
    let adopted = wait_adopted(&env.client, &env.ns.name, "plugin").await?;
    let leaders: Vec<Option<bool>> = ports.iter().map(|p| is_leader(*p)).collect();
    assert_eq!(
        leaders.iter().filter(|l| **l == Some(true)).count(),
        1,
        "exactly one leader: {leaders:?}"
    );
    let (leader, follower) = if leaders[0] == Some(true) {
        (&mut a, &mut b)
    } else {
        (&mut b, &mut a)
    };
    let follower_port = if leaders[0] == Some(true) {
        ports[1]
    } else {
        ports[0]
    };
    // The follower is ready too (caches synced, lease state known), but does not lead.
    assert_eq!(http_get(follower_port, "/readyz")?.0, 200);

    let (samples, task) = sample_pods(&env.client, &env.ns.name, four_nodes());
    set_template(&env, agent_template(&env.resource, v2)).await?;
    wait_status(&env.client, &env.ns.name, "plugin", TIMEOUT, |st| {
        st.current_stage == Some(1) && st.stages.len() == 2
    })
    .await?;
    // SIGKILL: no graceful release of the lease.
    leader.kill();
    let killed = Instant::now();
    let leases: Api<Lease> = Api::namespaced(env.client.clone(), "saferollout-system");
    let old_holder = leases
        .get("saferollout-operator")
        .await?
        .spec
        .and_then(|s| s.holder_identity);
    wait_for_object(
        &leases,
        "saferollout-operator",
        Duration::from_secs(LEASE + 30),
        |l| {
            let holder = l.and_then(|l| l.spec.as_ref()?.holder_identity.clone());
            holder.is_some() && holder != old_holder
        },
    )
    .await?;
    let took_over = killed.elapsed();
    eprintln!("MEASURE leader killed -> lease taken over: {took_over:?} (lease duration {LEASE}s)");
    assert!(
        took_over <= Duration::from_secs(LEASE + 2),
        "took {took_over:?}"
    );
    assert!(follower.is_running());
    let st = wait_status(&env.client, &env.ns.name, "plugin", TIMEOUT, |st| {
        st.phase == Some(Phase::Succeeded) && st.stable_revision != adopted.stable_revision
    })
    .await?;
    wait_agents(&env.client, &env.ns.name, v2).await?;
    task.abort();
    assert!(st.blocked_revisions.is_empty());
    let samples = samples.lock().unwrap();
    samples.assert_each_node_got_one(v2, 4);
    let (most, when) = samples.max_unavailable(&BTreeSet::new());
    assert!(
        most <= 1,
        "maxUnavailable 1 broken across the failover: {when:?}"
    );
    Ok(())
}

/// The value of the counter line `series` (name and labels) on the metrics
/// of the operator serving them on `port`; 0 before its first increment.
fn counter(port: u16, series: &str) -> anyhow::Result<f64> {
    let (code, body) = http_get(port, "/metrics")?;
    anyhow::ensure!(code == 200, "/metrics answered {code}");
    Ok(body
        .lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or(0.0))
}

const REFUSE_STATUS: &str = "test.saferollout.dev/refuse-status";

/// A ValidatingAdmissionPolicy (and its binding) that refuses, while a
/// SafeRollout in `ns` is annotated `REFUSE_STATUS` and its stored status
/// lists the second stage, the status writes that change neither the phase
/// nor a stage's state (progress, messages, what the gates observe: the
/// writes the operator sends behind its passes), as an API server that loses
/// writes would; deleted when dropped.
struct RefuseStatusWrites(String);

impl RefuseStatusWrites {
    fn install(ns: &str) -> anyhow::Result<Self> {
        let name = format!("refuse-status-{ns}");
        let refused = format!(
            "has(object.metadata.annotations) && '{REFUSE_STATUS}' in object.metadata.annotations \
             && has(oldObject.status) && has(oldObject.status.stages) && size(oldObject.status.stages) >= 2 \
             && has(object.status.stages) && size(object.status.stages) == size(oldObject.status.stages) \
             && object.status.stages.all(s, oldObject.status.stages.exists(o, o.index == s.index && o.state == s.state)) \
             && object.status.phase == oldObject.status.phase"
        );
        let manifest = json!({"apiVersion": "v1", "kind": "List", "items": [
            {
                "apiVersion": "admissionregistration.k8s.io/v1",
                "kind": "ValidatingAdmissionPolicy",
                "metadata": {"name": name},
                "spec": {
                    "failurePolicy": "Fail",
                    "matchConstraints": {"resourceRules": [{
                        "apiGroups": ["saferollout.dev"], "apiVersions": ["*"],
                        "operations": ["UPDATE"], "resources": ["saferollouts/status"]
                    }]},
                    "validations": [{
                        "expression": format!("!({refused})"),
                        "message": "status write refused by the test"
                    }]
                }
            },
            {
                "apiVersion": "admissionregistration.k8s.io/v1",
                "kind": "ValidatingAdmissionPolicyBinding",
                "metadata": {"name": name},
                "spec": {
                    "policyName": name,
                    "validationActions": ["Deny"],
                    "matchResources": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}}}
                }
            }
        ]});
        let file = std::env::temp_dir().join(format!("{name}.json"));
        std::fs::write(&file, manifest.to_string())?;
        cluster().kubectl(&["apply", "-f", &file.to_string_lossy()])?;
        Ok(RefuseStatusWrites(name))
    }
}

impl Drop for RefuseStatusWrites {
    fn drop(&mut self) {
        for kind in [
            "validatingadmissionpolicybinding",
            "validatingadmissionpolicy",
        ] {
            let _ = cluster().kubectl(&["delete", kind, &self.0, "--ignore-not-found"]);
        }
    }
}

#[tokio::test]
async fn refused_progress_writes_mid_stage_repeat_and_skip_nothing() -> anyhow::Result<()> {
    // A status write that goes behind its pass (progress only, beside the
    // pass's deletions or none) and fails is written again by a later pass,
    // which decides from the status the API server still has: the refused
    // writes must cost no double replacement, no budget and no stage.
    let env = setup("lostwrites").await?;
    let _refuse = RefuseStatusWrites::install(&env.ns.name)?;
    let port = free_loopback_port()?;
    let _op = operator(&env, "lostwrites", 3, port)?;
    // A release whose agents take the simulator's slow delay (20 s) to turn
    // Ready: the second stage replaces its three nodes at once and then
    // waits, in passes that change only progress and what the gates observe.
    let (v1, v2) = (
        "registry.example/plugin:v1",
        "registry.example/plugin:v2-slow",
    );
    create_daemonset(&env, agent_template(&env.resource, v1), v1).await?;
    let mut spec = support::default_spec(&env.resource, v1);
    spec["stages"] = json!([{"nodes": 1}, {"nodes": "100%"}]);
    spec["maxUnavailable"] = json!(3);
    create_rollout(&env.client, &env.ns.name, "plugin", spec).await?;
    let adopted = wait_adopted(&env.client, &env.ns.name, "plugin").await?;
    annotate(&env, REFUSE_STATUS, "true").await?;

    let (samples, task) = sample_pods(&env.client, &env.ns.name, four_nodes());
    let retries = r#"saferollout_wakes_total{cause="status_retry"}"#;
    let before = counter(port, retries)?;
    set_template(&env, agent_template(&env.resource, v2)).await?;
    // The second stage is planned: its progress writes are refused from now on.
    wait_status(&env.client, &env.ns.name, "plugin", TIMEOUT, |st| {
        st.stages.len() == 2
    })
    .await?;
    let refusing = Instant::now();
    let deadline = refusing + TIMEOUT;
    while counter(port, retries)? - before < 1.0 {
        anyhow::ensure!(Instant::now() < deadline, "no status write was refused");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The stage goes on: its agents turn Ready...
    wait_agents(&env.client, &env.ns.name, v2).await?;
    // ...and its gates, within bounds, start a soak each pass that the
    // status cannot keep: every pass has a new progress write to send. The
    // retries are counted over five seconds of that (a rate, observed over
    // a window: nothing here waits for an event).
    tokio::time::sleep(Duration::from_secs(5)).await;
    let refused = counter(port, retries)? - before;
    let window = refusing.elapsed();
    // ...but it cannot pass while its gates' soak cannot be recorded (a soak
    // runs from the status, and that write is refused).
    let stuck = srs(&env).get("plugin").await?.status.unwrap_or_default();
    assert_eq!(stuck.current_stage, Some(1), "{stuck:#?}");
    assert_ne!(stuck.stages[1].state, StageState::Passed, "{stuck:#?}");
    annotate_remove(&env, REFUSE_STATUS).await?;
    let st = wait_status(&env.client, &env.ns.name, "plugin", TIMEOUT, |st| {
        st.phase == Some(Phase::Succeeded) && st.stable_revision != adopted.stable_revision
    })
    .await?;
    task.abort();
    eprintln!(
        "MEASURE progress writes refused behind their pass and written again: {refused} in {window:?}"
    );
    // Written again after a back-off, not at once: a refused write was
    // retried about 100 times a second before.
    assert!(
        refused <= 2.0 + window.as_secs_f64(),
        "{refused} retries in {window:?}"
    );
    assert!(st.blocked_revisions.is_empty(), "{st:#?}");
    assert_eq!(st.stages.len(), 2, "{st:#?}");
    assert!(
        st.stages.iter().all(|s| s.state == StageState::Passed),
        "{st:#?}"
    );
    let samples = samples.lock().unwrap();
    samples.assert_each_node_got_one(v2, 4);
    let (most, when) = samples.max_unavailable(&BTreeSet::new());
    assert!(
        most <= 3,
        "maxUnavailable 3 broken while progress writes were refused: {when:?}"
    );
    Ok(())
}

/// A pass that panics (a bug) is caught: its SafeRollout says so in a
/// condition and the metric counts it, while the process and every other
/// SafeRollout go on (here one in another namespace rolls a release through
/// all its stages meanwhile). The panic comes from the operator's debug-build
/// hook `SAFEROLLOUT_DEBUG_PANIC_IN_PASS`.
#[tokio::test]
async fn a_pass_that_panics_stops_only_its_own_safe_rollout() -> anyhow::Result<()> {
    let env = setup("panic").await?;
    let c = cluster();
    let other = c.namespace("panic-other").await?;
    let other_resource = format!("{}-other", env.resource);
    let (v1, v2) = ("registry.example/plugin:v1", "registry.example/plugin:v2");
    support::create_plugin_daemonset(&env.client, &env.ns.name, &env.resource, v1).await?;
    support::create_plugin_daemonset(&env.client, &other.name, &other_resource, v1).await?;
    let port = free_loopback_port()?;
    let args = support::operator_args(
        &format!("{},{}", env.ns.name, other.name),
        &format!("127.0.0.1:{port}"),
        3,
    );
    let panicking = format!("{}/plugin", env.ns.name);
    let mut op = Operator::start_with_env(
        Identity::Impersonate(c.kubeconfig(), OPERATOR_SA),
        &args,
        &[("SAFEROLLOUT_DEBUG_PANIC_IN_PASS", &panicking)],
        &format!("panic-{}", env.ns.name),
    )?;
    create_rollout(
        &env.client,
        &env.ns.name,
        "plugin",
        support::default_spec(&env.resource, v1),
    )
    .await?;
    create_rollout(
        &env.client,
        &other.name,
        "plugin",
        support::default_spec(&other_resource, v1),
    )
    .await?;

    let st = wait_status(&env.client, &env.ns.name, "plugin", TIMEOUT, |st| {
        condition(st, "Stalled").is_some_and(|c| c.reason == "ReconcilePanicked")
    })
    .await?;
    let stalled = condition(&st, "Stalled").unwrap();
    assert_eq!(stalled.status, "True");
    assert!(
        stalled.message.contains("SAFEROLLOUT_DEBUG_PANIC_IN_PASS"),
        "the panic's message is reported: {}",
        stalled.message
    );
    assert_eq!(
        condition(&st, "Ready").map(|c| c.reason.as_str()),
        Some("ReconcilePanicked")
    );

    // The other SafeRollout adopts its DaemonSet and rolls v2 out to the end.
    wait_adopted(&env.client, &other.name, "plugin").await?;
    support::set_template_image(&env.client, &other.name, "plugin", &other_resource, v2).await?;
    wait_status(&env.client, &other.name, "plugin", TIMEOUT, |st| {
        st.phase == Some(Phase::Succeeded)
            && st.stages.len() == 3
            && st.stages.iter().all(|s| s.state == StageState::Passed)
    })
    .await?;
    wait_agents(&env.client, &other.name, v2).await?;

    assert!(op.is_running(), "the operator process survived the panic");
    let (code, body) = http_get(port, "/metrics")?;
    assert_eq!(code, 200);
    let panics: f64 = body
        .lines()
        .find(|l| {
            l.starts_with("saferollout_reconcile_panics_total{")
                && l.contains(&format!("namespace=\"{}\"", env.ns.name))
        })
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or(0.0);
    assert!(panics >= 1.0, "the panics are counted:\n{body}");
    assert!(
        !body.contains(&format!(
            "saferollout_reconcile_panics_total{{namespace=\"{}\"",
            other.name
        )),
        "no panic is counted for the other SafeRollout"
    );
    // Its DaemonSet was never touched: still on v1, still RollingUpdate.
    let ds =
        Api::<k8s_openapi::api::apps::v1::DaemonSet>::namespaced(env.client.clone(), &env.ns.name)
            .get("plugin")
            .await?;
    let strategy = ds.spec.update_strategy.and_then(|u| u.type_);
    assert_ne!(strategy.as_deref(), Some("OnDelete"));
    Ok(())
}

/// The operator ended (SIGABRT, no clean-up, the lease kept: as a SIGKILL)
/// right after its first write of each kind during a rollout (the
/// DaemonSet's template, a stage's node label, a pod deletion, a status
/// write mid-rollout, the last good backup), then started again: the
/// rollout converges with every node replaced exactly once and the budget
/// held throughout, and deleting the SafeRollout afterwards leaves no label
/// on any node. The crash comes from the operator's debug-build hook
/// `SAFEROLLOUT_DEBUG_CRASH_AFTER`. (The quarantine's writes are covered in
/// dra_policies.rs.)
#[tokio::test]
async fn a_crash_right_after_each_kind_of_write_repeats_and_skips_nothing() -> anyhow::Result<()> {
    let env = setup("crash").await?;
    let c = cluster();
    let (v1, v2) = ("registry.example/plugin:v1", "registry.example/plugin:v2");
    let start = |ns: &str, log: &str, hook: Option<&str>| {
        let args = support::operator_args(ns, "127.0.0.1:0", 3);
        let env: Vec<(&str, &str)> = hook
            .map(|h| ("SAFEROLLOUT_DEBUG_CRASH_AFTER", h))
            .into_iter()
            .collect();
        Operator::start_with_env(
            Identity::Impersonate(c.kubeconfig(), OPERATOR_SA),
            &args,
            &env,
            &format!("{log}-{ns}"),
        )
    };
    for (kind, nth) in [
        ("template", 1),
        ("label", 1),
        ("deletion", 1),
        ("status", 3),
        ("backup", 1),
    ] {
        let ns = c.namespace(&format!("crash-{kind}")).await?;
        let resource = format!("{}-{kind}", env.resource);
        support::create_plugin_daemonset(&env.client, &ns.name, &resource, v1).await?;
        let mut spec = support::default_spec(&resource, v1);
        spec["stages"] =
            json!([{"nodes": 1, "soak": "1s"}, {"nodes": "50%", "soak": "1s"}, {"nodes": "100%"}]);
        let first = start(&ns.name, "before", None)?;
        create_rollout(&env.client, &ns.name, "plugin", spec).await?;
        let adopted = wait_adopted(&env.client, &ns.name, "plugin").await?;
        drop(first);

        let (samples, sampler) = sample_pods(&env.client, &ns.name, four_nodes());
        support::set_template_image(&env.client, &ns.name, "plugin", &resource, v2).await?;
        let hook = format!("{kind}:{nth}");
        let mut crashing = start(&ns.name, &format!("crash-{kind}"), Some(&hook))?;
        support::poll(
            &format!("the operator ending after {kind} write {nth}"),
            TIMEOUT,
            || Ok((!crashing.is_running()).then_some(())),
        )
        .await?;
        assert!(
            crashing
                .log_text()
                .contains(&format!("ending the process after {kind} write {nth}")),
            "the operator ended for another reason than the hook: {}",
            crashing.log.display()
        );
        let _after = start(&ns.name, &format!("after-{kind}"), None)?;
        wait_status(&env.client, &ns.name, "plugin", TIMEOUT, |st| {
            st.phase == Some(Phase::Succeeded) && st.stable_revision != adopted.stable_revision
        })
        .await?;
        wait_agents(&env.client, &ns.name, v2).await?;
        sampler.abort();
        {
            let samples = samples.lock().unwrap();
            samples.assert_each_node_got_one(v2, 4);
            let (most, which) = samples.max_unavailable(&BTreeSet::new());
            assert!(
                most <= 1,
                "after a crash at {kind}: {most} agents down at once: {which:?}"
            );
        }

        // Deleting the SafeRollout leaves no label of it on any node.
        let api: Api<SafeRollout> = Api::namespaced(env.client.clone(), &ns.name);
        api.delete("plugin", &Default::default()).await?;
        wait_for_object(&api, "plugin", TIMEOUT, |sr| sr.is_none()).await?;
        let id = format!("{}.plugin", ns.name);
        let kept = support::nodes_labelled(&env.client, &id).await?;
        assert!(
            kept.is_empty(),
            "nodes {kept:?} kept the rollout's label after a crash at {kind}"
        );
    }
    Ok(())
}

/// A node taint removed when dropped (a test that fails half-way must not
/// leave a node no other test's agent can be scheduled on).
struct NodeTaintGuard {
    key: String,
}

impl Drop for NodeTaintGuard {
    fn drop(&mut self) {
        for n in four_nodes() {
            let _ = cluster().kubectl(&["taint", "node", &n, &format!("{}-", self.key)]);
        }
    }
}

/// The nodes carrying a taint with `key`, and how many times each carries it.
async fn tainted(env: &Env, key: &str) -> anyhow::Result<Vec<(String, usize)>> {
    let nodes = Api::<Node>::all(env.client.clone())
        .list(&Default::default())
        .await?;
    Ok(nodes
        .items
        .iter()
        .map(|n| {
            let count = n
                .spec
                .iter()
                .flat_map(|s| s.taints.iter().flatten())
                .filter(|t| t.key == key)
                .count();
            (n.name_any(), count)
        })
        .filter(|(_, count)| *count > 0)
        .collect())
}

/// A device plugin's quarantine (`onFailure: Quarantine`; a `-broken`
/// release failing the allocatable gate at the canary) takes the canary out
/// of service with a node taint, its only write: the operator ended right
/// after it (`SAFEROLLOUT_DEBUG_CRASH_AFTER=quarantine:1`). The next
/// operator converges on the same quarantine: the Stalled condition, the
/// taint once, on the canary, no other agent touched. Deleting the
/// SafeRollout then leaves no taint and no label of it. (A DRA driver's
/// quarantine, a DeviceTaintRule, is crashed after in dra_policies.rs.)
#[tokio::test]
async fn a_crash_right_after_a_quarantine_taint_write_converges_and_deletion_leaves_nothing()
-> anyhow::Result<()> {
    let env = setup("crash-taint").await?;
    let c = cluster();
    let (v1, broken) = (
        "registry.example/plugin:v1",
        "registry.example/plugin:v2-broken",
    );
    let start = |log: &str, hook: Option<&str>, metrics: &str| {
        let args = support::operator_args(&env.ns.name, metrics, 3);
        let vars: Vec<(&str, &str)> = hook
            .map(|h| ("SAFEROLLOUT_DEBUG_CRASH_AFTER", h))
            .into_iter()
            .collect();
        Operator::start_with_env(
            Identity::Impersonate(c.kubeconfig(), OPERATOR_SA),
            &args,
            &vars,
            &format!("{log}-{}", env.ns.name),
        )
    };
    let id = format!("{}.plugin", env.ns.name);
    let key = format!("{}{id}", saferollout_api::QUARANTINE_NODE_TAINT_PREFIX);
    let _untaint = NodeTaintGuard { key: key.clone() };
    support::create_plugin_daemonset(&env.client, &env.ns.name, &env.resource, v1).await?;
    let mut spec = support::default_spec(&env.resource, v1);
    spec["onFailure"] = json!("Quarantine");
    let first = start("before", None, "127.0.0.1:0")?;
    create_rollout(&env.client, &env.ns.name, "plugin", spec).await?;
    wait_adopted(&env.client, &env.ns.name, "plugin").await?;
    drop(first);

    let (samples, sampler) = sample_pods(&env.client, &env.ns.name, four_nodes());
    support::set_template_image(&env.client, &env.ns.name, "plugin", &env.resource, broken).await?;
    let mut crashing = start("crash-taint", Some("quarantine:1"), "127.0.0.1:0")?;
    support::poll(
        "the operator ending after its quarantine taint write",
        TIMEOUT,
        || Ok((!crashing.is_running()).then_some(())),
    )
    .await?;
    assert!(
        crashing
            .log_text()
            .contains("ending the process after quarantine write 1"),
        "the operator ended for another reason than the hook: {}",
        crashing.log.display()
    );
    let written = tainted(&env, &key).await?;
    assert_eq!(written.len(), 1, "one node tainted: {written:?}");

    let port = free_loopback_port()?;
    let _after = start("after-taint", None, &format!("127.0.0.1:{port}"))?;
    let st = wait_status(&env.client, &env.ns.name, "plugin", TIMEOUT, |st| {
        condition(st, "Stalled").is_some_and(|c| c.reason == "Quarantined")
    })
    .await?;
    let stopped = st.stopped.clone().expect("stopped");
    assert_eq!(stopped.policy, saferollout_api::OnFailure::Quarantine);
    assert_eq!(stopped.nodes, [written[0].0.clone()], "{st:#?}");
    // The status may be the crashed operator's: the taint is judged once
    // the next one has made a pass (on caches synced before it leads),
    // which would have written it again.
    support::poll("a pass of the next operator", TIMEOUT, || {
        let passes: f64 = ["success", "requeue", "error"]
            .iter()
            .map(|r| {
                counter(
                    port,
                    &format!("saferollout_reconciles_total{{result=\"{r}\"}}"),
                )
            })
            .sum::<anyhow::Result<f64>>()?;
        Ok((passes >= 1.0).then_some(()))
    })
    .await?;
    assert_eq!(
        tainted(&env, &key).await?,
        written,
        "the quarantine's taint changed"
    );
    sampler.abort();
    {
        let samples = samples.lock().unwrap();
        assert_eq!(
            samples.created.keys().cloned().collect::<Vec<_>>(),
            [(written[0].0.clone(), broken.to_string())],
            "only the canary got the release, once: {:?}",
            samples.created
        );
        assert_eq!(samples.created.values().sum::<usize>(), 1);
    }

    let api: Api<SafeRollout> = Api::namespaced(env.client.clone(), &env.ns.name);
    api.delete("plugin", &Default::default()).await?;
    wait_for_object(&api, "plugin", TIMEOUT, |sr| sr.is_none()).await?;
    assert_eq!(
        tainted(&env, &key).await?,
        [],
        "a quarantine taint was left"
    );
    let kept = support::nodes_labelled(&env.client, &id).await?;
    assert!(kept.is_empty(), "nodes {kept:?} kept the rollout's label");
    Ok(())
}

/// Issue 38's lifecycle-aware budget: 20 nodes, 4 of them NotReady before
/// the release, `maxUnavailable: 10%`. A budget counting the NotReady
/// nodes' agents as unavailable would never replace anything (NVSentinel
/// #1764); the rollout instead takes the 16, one at a time (10% of 16),
/// names the 4 as skipped, leaves their agents alone and succeeds.
#[tokio::test]
async fn twenty_nodes_with_four_not_ready_roll_on_the_sixteen_and_name_the_four()
-> anyhow::Result<()> {
    let env = setup("lifecycle").await?;
    let _op = operator(&env, "lifecycle", 3, 0)?;
    let mut extra = Vec::new();
    for i in 0..16 {
        let name: &'static str = Box::leak(format!("sim-gpu-x{i:02}").into_boxed_str());
        let zone = if i % 2 == 0 { "zone-a" } else { "zone-b" };
        extra.push(ExtraNode::create(&env.client, name, zone).await?);
    }
    let (v1, v2) = ("registry.example/plugin:v1", "registry.example/plugin:v2");
    create_daemonset(&env, agent_template(&env.resource, v1), v1).await?;
    let down = ["sim-gpu-x01", "sim-gpu-x05", "sim-gpu-x09", "sim-gpu-x13"];
    let mut not_ready = Vec::new();
    // NotReady before the rollout (see `NotReady::set_since`).
    for n in down {
        not_ready.push(NotReady::set_since(&env.client, n, Duration::from_secs(5)).await?);
    }
    let mut spec = support::default_spec(&env.resource, v1);
    spec["stages"] = json!([{"nodes": 1}, {"nodes": "100%"}]);
    spec["maxUnavailable"] = json!("10%");
    create_rollout(&env.client, &env.ns.name, "plugin", spec).await?;
    let adopted = wait_adopted(&env.client, &env.ns.name, "plugin").await?;
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), &env.ns.name);
    let before = pods
        .list(&kube::api::ListParams::default().labels("app=plugin"))
        .await?;
    let down_uids = support::uids_by_node(before.items.iter());
    let ready_nodes: Vec<String> = Api::<Node>::all(env.client.clone())
        .list(&Default::default())
        .await?
        .items
        .iter()
        .map(|n| n.name_any())
        .filter(|n| !down.contains(&n.as_str()))
        .collect();
    assert_eq!(ready_nodes.len(), 16);
    let (samples, sampler) = support::sample_pods(&env.client, &env.ns.name, ready_nodes.clone());
    let started = Instant::now();
    set_template(&env, agent_template(&env.resource, v2)).await?;
    let st = wait_status(
        &env.client,
        &env.ns.name,
        "plugin",
        Duration::from_secs(300),
        |st| {
            st.phase == Some(Phase::Succeeded)
                && st.stable_revision != adopted.stable_revision
                && st.stable_revision == st.target_revision
        },
    )
    .await?;
    let took = started.elapsed();
    sampler.abort();
    let skipped: Vec<(&str, &str)> = st
        .skipped_nodes
        .iter()
        .map(|n| (n.node.as_str(), n.reason.as_str()))
        .collect();
    assert_eq!(
        skipped,
        down.iter()
            .map(|n| (*n, "NodeNotReady"))
            .collect::<Vec<_>>(),
        "{st:#?}"
    );
    let ready = condition(&st, "Ready").unwrap();
    assert!(
        ready.status == "True" && ready.message.contains("4 skipped"),
        "{ready:?}"
    );
    let held: usize = st.stages.iter().map(|s| s.nodes.len()).sum();
    assert_eq!(held, 16, "{st:#?}");
    {
        let samples = samples.lock().unwrap();
        let (most, when) = samples.max_unavailable(&BTreeSet::new());
        assert!(most <= 1, "10% of 16 nodes is 1: {most} at once: {when:?}");
        samples.assert_each_node_got_one(v2, 16);
    }
    // The NotReady nodes' agents were left alone.
    let after = pods
        .list(&kube::api::ListParams::default().labels("app=plugin"))
        .await?;
    let after_uids = support::uids_by_node(after.items.iter());
    for n in down {
        assert_eq!(
            after_uids.get(n),
            down_uids.get(n),
            "{n}'s agent was touched"
        );
    }
    eprintln!(
        "MEASURE 20 nodes, 4 NotReady, maxUnavailable 10%: the 16 rolled in {:.1}s",
        took.as_secs_f64()
    );
    // Back to the 4 nodes the other tests share.
    drop(not_ready);
    let names: Vec<&str> = extra.iter().map(|e| e.0).collect();
    drop(extra);
    wait_for_all(
        &Api::<Node>::all(env.client.clone()),
        watcher::Config::default(),
        TIMEOUT,
        |ns| ns.iter().all(|n| !names.contains(&n.name_any().as_str())),
    )
    .await?;
    Ok(())
}

/// The circuit breaker: the two canary nodes go NotReady with the new
/// agent on them, more than `maxNotReadyNodes` (10% of 4, at least 1): the
/// release is blocked (`NodesNotReadyAfterReplacement`) and reverted, where
/// a single node going so is let go (the test above).
#[tokio::test]
async fn two_nodes_going_not_ready_with_the_new_agent_trip_the_circuit_breaker()
-> anyhow::Result<()> {
    let env = setup("breaker").await?;
    let _op = operator(&env, "breaker", 3, 0)?;
    let (v1, v2) = ("registry.example/plugin:v1", "registry.example/plugin:v2");
    create_daemonset(&env, agent_template(&env.resource, v1), v1).await?;
    let mut spec = support::default_spec(&env.resource, v1);
    spec["stages"] = json!([{"nodes": 2, "pause": true}, {"nodes": "100%"}]);
    spec["maxUnavailable"] = json!(2);
    create_rollout(&env.client, &env.ns.name, "plugin", spec).await?;
    wait_adopted(&env.client, &env.ns.name, "plugin").await?;
    set_template(&env, agent_template(&env.resource, v2)).await?;
    let paused = wait_status(&env.client, &env.ns.name, "plugin", TIMEOUT, |st| {
        st.phase == Some(Phase::Paused)
    })
    .await?;
    let canaries: Vec<&'static str> = paused.stages[0]
        .nodes
        .iter()
        .map(|n| &*Box::leak(n.clone().into_boxed_str()))
        .collect();
    assert_eq!(canaries.len(), 2);
    let mut down = Vec::new();
    for n in &canaries {
        down.push(NotReady::set(&env.client, n).await?);
    }
    let st = wait_status(&env.client, &env.ns.name, "plugin", TIMEOUT, |st| {
        !st.blocked_revisions.is_empty()
    })
    .await?;
    let blocked = &st.blocked_revisions[0];
    assert_eq!(blocked.reason, "NodesNotReadyAfterReplacement", "{st:#?}");
    for n in &canaries {
        assert!(blocked.message.contains(n), "{}", blocked.message);
    }
    // The nodes come back: every agent is back on v1.
    drop(down);
    for n in &canaries {
        wait_node_ready(&env.client, n).await?;
    }
    wait_agents(&env.client, &env.ns.name, v1).await?;
    wait_status(&env.client, &env.ns.name, "plugin", TIMEOUT, |st| {
        st.phase == Some(Phase::Degraded)
            && condition(st, "Progressing").is_some_and(|c| c.reason == "RolledBack")
    })
    .await?;
    Ok(())
}
