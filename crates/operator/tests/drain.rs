//! `spec.nodeMaintenance` end to end (issue 38's drain): the operator with
//! `--node-maintenance` against the real control plane, as the
//! ServiceAccount of the chart's RBAC with `nodeMaintenance.enabled`, a
//! driver-class agent played by the simulated device plugin, and a
//! workload (a ReplicaSet of one pod pinned to the canary node) guarded by
//! a PodDisruptionBudget.
//!
//! What it shows, in one release after another on the same nodes:
//! - a budget allowing 0 disruptions holds the canary's stage with a
//!   condition naming the pod and the budget, its agent untouched and the
//!   rollout not failed;
//! - once the budget allows it, the workload pod is evicted (never
//!   deleted around the budget) before the agent is replaced there, the
//!   rollout goes on one cordoned node at a time, and every node is
//!   uncordoned once it passed;
//! - a broken release is caught on the cordoned canary, reverted, and the
//!   canary uncordoned after the revert.

mod support;

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, DeleteParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use saferollout_api::{MAINTENANCE_LABEL, MaintenanceStep, Phase, SafeRolloutStatus};
use saferollout_testkit::{TestNamespace, cluster, wait_for_all, wait_for_object};
use serde_json::json;
use support::{
    Identity, Operator, TIMEOUT, condition, create_plugin_daemonset, create_rollout, image_of,
    pod_ready, set_template_image, wait_adopted, wait_agents, wait_status,
};

const OPERATOR_SA: &str = "system:serviceaccount:saferollout-system:saferollout-operator";
/// The first stage's node (planning takes nodes by name).
const CANARY: &str = "sim-gpu-0";
const WORKLOAD: &str = "train";

struct Env {
    ns: TestNamespace,
    client: Client,
    resource: String,
    _op: Operator,
}

async fn setup(name: &str) -> anyhow::Result<Env> {
    let c = cluster();
    support::install(c)?;
    support::grant_chart_rbac(c, "nodeMaintenance.enabled=true")?;
    let ns = c.namespace(name).await?;
    let client = c.client().await?;
    let mut args = support::operator_args(&ns.name, "127.0.0.1:0", 3);
    args.push("--node-maintenance=true".into());
    let op = Operator::start(
        Identity::Impersonate(c.kubeconfig(), OPERATOR_SA),
        &args,
        &format!("drain-{}", ns.name),
    )?;
    Ok(Env {
        resource: format!("example.com/gpu-{name}"),
        ns,
        client,
        _op: op,
    })
}

/// A ReplicaSet of one pod on the canary node (a node selector, so a pod
/// the ReplicaSet recreates while the node is cordoned stays Pending).
async fn create_workload(env: &Env) -> anyhow::Result<()> {
    let rs: ReplicaSet = serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": {"name": WORKLOAD},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": WORKLOAD}},
            "template": {"metadata": {"labels": {"app": WORKLOAD}},
                "spec": {"nodeSelector": {"kubernetes.io/hostname": CANARY},
                    "containers": [{"name": "train", "image": "registry.example/train:v1"}]}}}
    }))?;
    Api::<ReplicaSet>::namespaced(env.client.clone(), &env.ns.name)
        .create(&PostParams::default(), &rs)
        .await?;
    wait_workload_running(env).await?;
    Ok(())
}

/// Waits until the workload's pod runs Ready on the canary; returns its UID.
async fn wait_workload_running(env: &Env) -> anyhow::Result<String> {
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), &env.ns.name);
    let found = wait_for_all(
        &pods,
        watcher::Config::default().labels(&format!("app={WORKLOAD}")),
        TIMEOUT,
        |ps| {
            ps.iter().any(|p| {
                pod_ready(p)
                    && p.metadata.deletion_timestamp.is_none()
                    && p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(CANARY)
            })
        },
    )
    .await?;
    let uid = found
        .iter()
        .find(|p| pod_ready(p) && p.metadata.deletion_timestamp.is_none())
        .and_then(|p| p.metadata.uid.clone())
        .unwrap_or_default();
    Ok(uid)
}

/// A budget allowing no disruption of the workload, waited on until the
/// disruption controller says so.
async fn create_budget(env: &Env) -> anyhow::Result<()> {
    let pdb: PodDisruptionBudget = serde_json::from_value(json!({
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": WORKLOAD},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": WORKLOAD}}}
    }))?;
    let api: Api<PodDisruptionBudget> = Api::namespaced(env.client.clone(), &env.ns.name);
    api.create(&PostParams::default(), &pdb).await?;
    wait_for_object(&api, WORKLOAD, TIMEOUT, |p| {
        p.and_then(|p| p.status.as_ref())
            .is_some_and(|s| s.current_healthy == Some(1) && s.disruptions_allowed == Some(0))
    })
    .await?;
    Ok(())
}

fn cordoned(n: &Node) -> bool {
    n.spec.as_ref().and_then(|s| s.unschedulable) == Some(true)
}

fn marked(n: &Node) -> bool {
    n.labels().contains_key(MAINTENANCE_LABEL)
}

/// Samples, from a node watch, the largest number of nodes cordoned at once.
fn sample_cordons(client: &Client) -> (Arc<Mutex<usize>>, tokio::task::JoinHandle<()>) {
    let most = Arc::new(Mutex::new(0usize));
    let seen = most.clone();
    let api: Api<Node> = Api::all(client.clone());
    let task = tokio::spawn(async move {
        let mut now: BTreeSet<String> = BTreeSet::new();
        let mut stream = watcher(api, watcher::Config::default())
            .default_backoff()
            .boxed();
        while let Some(Ok(ev)) = stream.next().await {
            match ev {
                watcher::Event::Apply(n) | watcher::Event::InitApply(n) => {
                    if cordoned(&n) {
                        now.insert(n.name_any());
                    } else {
                        now.remove(&n.name_any());
                    }
                }
                watcher::Event::Delete(n) => {
                    now.remove(&n.name_any());
                }
                _ => {}
            }
            let mut m = seen.lock().unwrap();
            *m = (*m).max(now.len());
        }
    });
    (most, task)
}

async fn wait_nodes(
    env: &Env,
    done: impl Fn(&[Arc<Node>]) -> bool + Send + 'static,
) -> anyhow::Result<()> {
    wait_for_all(
        &Api::<Node>::all(env.client.clone()),
        watcher::Config::default(),
        TIMEOUT,
        move |ns| done(ns),
    )
    .await?;
    Ok(())
}

fn ready_reason(st: &SafeRolloutStatus) -> String {
    condition(st, "Ready")
        .map(|c| c.reason.clone())
        .unwrap_or_default()
}

#[tokio::test]
async fn a_driver_class_release_drains_each_node_respecting_budgets_and_uncordons_after()
-> anyhow::Result<()> {
    let env = setup("drain").await?;
    let (v1, v2, bad) = (
        "registry.example/driver:v1",
        "registry.example/driver:v2",
        "registry.example/driver:v3-broken",
    );
    create_plugin_daemonset(&env.client, &env.ns.name, &env.resource, v1).await?;
    create_workload(&env).await?;
    create_budget(&env).await?;
    let mut spec = support::default_spec(&env.resource, v1);
    spec["stages"] = json!([{"nodes": 1}, {"nodes": "100%"}]);
    spec["maxUnavailable"] = json!(1);
    spec["progressDeadline"] = json!("20s");
    spec["nodeMaintenance"] = json!({"drain": {"timeout": "5m"}});
    create_rollout(&env.client, &env.ns.name, "plugin", spec).await?;
    wait_adopted(&env.client, &env.ns.name, "plugin").await?;
    let (most_cordoned, sampler) = sample_cordons(&env.client);

    // A release: the canary is cordoned, and the budget holds its drain.
    set_template_image(&env.client, &env.ns.name, "plugin", &env.resource, v2).await?;
    let st = wait_status(&env.client, &env.ns.name, "plugin", TIMEOUT, |st| {
        ready_reason(st) == "DrainBlocked"
    })
    .await?;
    let ready = condition(&st, "Ready").unwrap();
    assert!(
        ready.message.contains(&format!("{}/", env.ns.name))
            && ready.message.contains(WORKLOAD)
            && ready.message.contains("disruption budget"),
        "the condition names the pod and the budget: {}",
        ready.message
    );
    assert_eq!(st.phase, Some(Phase::Progressing), "{st:#?}");
    let entry = &st.node_maintenance[0];
    assert_eq!(
        (entry.node.as_str(), entry.step),
        (CANARY, MaintenanceStep::Draining),
        "{st:#?}"
    );
    let node: Node = Api::<Node>::all(env.client.clone()).get(CANARY).await?;
    assert!(cordoned(&node) && marked(&node), "the canary is cordoned");
    // Held past two progress deadlines: nothing fails, nothing is forced
    // (a watch on the SafeRollout sees no other phase meanwhile).
    let failed = wait_status(
        &env.client,
        &env.ns.name,
        "plugin",
        std::time::Duration::from_secs(45),
        |st| st.phase != Some(Phase::Progressing) || !st.blocked_revisions.is_empty(),
    )
    .await;
    assert!(
        failed.is_err(),
        "a held drain failed the rollout: {failed:?}"
    );
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), &env.ns.name);
    let agents = pods
        .list(&kube::api::ListParams::default().labels("app=plugin"))
        .await?;
    assert!(
        agents.items.iter().any(|p| {
            p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(CANARY)
                && image_of(p) == v1
                && p.metadata.deletion_timestamp.is_none()
        }),
        "the canary's agent is untouched while held"
    );
    let workload_uid = wait_workload_running(&env).await?;

    // The budget goes: the workload is evicted, then the agent replaced.
    Api::<PodDisruptionBudget>::namespaced(env.client.clone(), &env.ns.name)
        .delete(WORKLOAD, &DeleteParams::default())
        .await?;
    let st = wait_status(&env.client, &env.ns.name, "plugin", TIMEOUT, |st| {
        st.phase == Some(Phase::Succeeded) && st.node_maintenance.is_empty()
    })
    .await?;
    wait_agents(&env.client, &env.ns.name, v2).await?;
    // The evicted pod is gone (the ReplicaSet made another, Pending while
    // the node was cordoned, Running once it was uncordoned).
    let evicted = pods.list(&Default::default()).await?;
    assert!(
        evicted
            .items
            .iter()
            .all(|p| p.metadata.uid.as_deref() != Some(workload_uid.as_str())),
        "the workload pod was evicted"
    );
    let new_workload = wait_workload_running(&env).await?;
    assert_ne!(new_workload, workload_uid);
    // The agent went after the workload: the canary's v2 agent was created
    // after the eviction (the Event of the eviction is the ReplicaSet's
    // new pod; compared by creation time, whole seconds).
    let agents = pods
        .list(&kube::api::ListParams::default().labels("app=plugin"))
        .await?;
    let canary_agent = agents
        .items
        .iter()
        .find(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(CANARY))
        .expect("an agent on the canary");
    let new_pod = pods.get(&pod_name(&pods, &new_workload).await?).await?;
    assert!(
        canary_agent.metadata.creation_timestamp >= new_pod.metadata.creation_timestamp,
        "the agent was replaced after the workload's eviction"
    );
    wait_nodes(&env, |ns| ns.iter().all(|n| !cordoned(n) && !marked(n))).await?;
    assert_eq!(
        *most_cordoned.lock().unwrap(),
        1,
        "one node cordoned at a time (maxUnavailable: 1)"
    );
    assert_eq!(st.phase, Some(Phase::Succeeded));

    // A broken release: caught on the cordoned canary, reverted, uncordoned
    // only after the revert's agent is Ready there (etcd order: node and pod
    // resource versions come from one counter).
    let canary_log = record_canary(&env.client, &env.ns.name).await?;
    set_template_image(&env.client, &env.ns.name, "plugin", &env.resource, bad).await?;
    let st = wait_status(&env.client, &env.ns.name, "plugin", TIMEOUT, |st| {
        st.phase == Some(Phase::Degraded) && st.node_maintenance.is_empty()
    })
    .await?;
    assert_eq!(st.blocked_revisions.len(), 1, "{st:#?}");
    wait_agents(&env.client, &env.ns.name, v2).await?;
    wait_nodes(&env, |ns| ns.iter().all(|n| !cordoned(n) && !marked(n))).await?;
    sampler.abort();
    let (log, tasks) = canary_log;
    for t in tasks {
        t.abort();
    }
    let log = log.lock().unwrap();
    let first = |what: &dyn Fn(&CanaryEvent) -> bool| log.iter().find(|e| what(e)).map(|e| e.rv);
    let cordoned_at = first(&|e| e.cordoned == Some(true)).expect("the canary was cordoned");
    let bad_at = first(&|e| e.agent.as_deref() == Some(bad)).expect("the broken agent ran");
    let reverted_at = log
        .iter()
        .find(|e| e.rv > bad_at && e.agent.as_deref() == Some(v2) && e.ready)
        .map(|e| e.rv)
        .expect("the revert's agent turned Ready");
    let uncordoned_at = log
        .iter()
        .find(|e| e.rv > cordoned_at && e.cordoned == Some(false))
        .map(|e| e.rv)
        .expect("the canary was uncordoned");
    assert!(
        cordoned_at < bad_at && bad_at < reverted_at && reverted_at < uncordoned_at,
        "cordoned at {cordoned_at}, broken agent at {bad_at}, reverted at {reverted_at}, uncordoned at {uncordoned_at}"
    );
    assert_eq!(*most_cordoned.lock().unwrap(), 1);
    Ok(())
}

/// One event of the canary seen by [`record_canary`]: its cordon (node
/// events) or its agent (pod events), at a resource version.
struct CanaryEvent {
    rv: u64,
    cordoned: Option<bool>,
    agent: Option<String>,
    ready: bool,
}

type CanaryLog = (
    Arc<Mutex<Vec<CanaryEvent>>>,
    Vec<tokio::task::JoinHandle<()>>,
);

/// Records, from a node watch and an agent pod watch, the canary's cordon
/// and its agents' images and readiness; returns once both watches listed
/// (what changes after is recorded).
async fn record_canary(client: &Client, ns: &str) -> anyhow::Result<CanaryLog> {
    let log = Arc::new(Mutex::new(Vec::new()));
    let listed = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let rv = |m: &kube::api::ObjectMeta| {
        m.resource_version
            .as_deref()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    let nodes: Api<Node> = Api::all(client.clone());
    let node_log = log.clone();
    let node_listed = listed.clone();
    let node_task = tokio::spawn(async move {
        let config = watcher::Config::default().fields(&format!("metadata.name={CANARY}"));
        let mut stream = watcher(nodes, config).default_backoff().boxed();
        while let Some(Ok(ev)) = stream.next().await {
            if let watcher::Event::InitDone = ev {
                node_listed.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
            if let watcher::Event::Apply(n) = ev {
                node_log.lock().unwrap().push(CanaryEvent {
                    rv: rv(&n.metadata),
                    cordoned: Some(cordoned(&n)),
                    agent: None,
                    ready: false,
                });
            }
        }
    });
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let pod_log = log.clone();
    let pod_listed = listed.clone();
    let pod_task = tokio::spawn(async move {
        let mut stream = watcher(pods, watcher::Config::default().labels("app=plugin"))
            .default_backoff()
            .boxed();
        while let Some(Ok(ev)) = stream.next().await {
            if let watcher::Event::InitDone = ev {
                pod_listed.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
            if let watcher::Event::Apply(p) = ev
                && p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(CANARY)
                && p.metadata.deletion_timestamp.is_none()
            {
                pod_log.lock().unwrap().push(CanaryEvent {
                    rv: rv(&p.metadata),
                    cordoned: None,
                    agent: Some(image_of(&p).to_string()),
                    ready: pod_ready(&p),
                });
            }
        }
    });
    let deadline = std::time::Instant::now() + TIMEOUT;
    while listed.load(std::sync::atomic::Ordering::SeqCst) < 2 {
        anyhow::ensure!(
            std::time::Instant::now() < deadline,
            "the canary's watches did not list"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    Ok((log, vec![node_task, pod_task]))
}

/// The name of the pod with `uid` among the namespace's pods.
async fn pod_name(pods: &Api<Pod>, uid: &str) -> anyhow::Result<String> {
    let list = pods.list(&Default::default()).await?;
    list.items
        .iter()
        .find(|p| p.metadata.uid.as_deref() == Some(uid))
        .map(|p| p.name_any())
        .ok_or_else(|| anyhow::anyhow!("no pod {uid}"))
}
