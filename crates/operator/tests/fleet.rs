//! SafeRolloutPolicies end to end: the operator with `--fleet-policies`
//! against the real control plane, three agents of one GPU node stack on
//! the KWOK nodes (a driver-class agent and a device plugin played by the
//! simulated device plugin, a DRA driver played by the simulated DRA
//! driver), each with its own SafeRollout, governed by one policy. The
//! operator runs as the ServiceAccount of the chart's RBAC with
//! `fleetPolicies.enabled`. Tests share the nodes: one at a time.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceSlice};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use saferollout_api::{
    CONDITION_WAITING, Phase, SafeRollout, SafeRolloutPolicy, SafeRolloutStatus, StageState,
};
use saferollout_testkit::{TestNamespace, cluster, wait_for_all, wait_for_object};
use serde_json::json;

mod support;

use support::dra::{ClusterObject, NODES, OPERATOR_SA, pool_devices};
use support::{GPUS, Identity, TIMEOUT, allocatable, condition, image_of, pod_ready};

static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
/// Every agent's pods carry it (the sampler's selector).
const STACK_LABEL: &str = "fleet.saferollout.dev/stack";
/// The node every rollout takes as its canary.
const CANARY: &str = "sim-gpu-1";

/// One agent of the stack: its DaemonSet and SafeRollout share the name.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
enum Agent {
    Driver,
    Plugin,
    Dra,
}

impl Agent {
    const ALL: [Agent; 3] = [Agent::Driver, Agent::Plugin, Agent::Dra];

    fn name(self) -> &'static str {
        match self {
            Agent::Driver => "gpu-driver",
            Agent::Plugin => "device-plugin",
            Agent::Dra => "dra-driver",
        }
    }

    fn image(self, version: &str) -> String {
        match self {
            Agent::Driver => format!("registry.example/sim-driver:{version}"),
            Agent::Plugin => format!("registry.example/sim-plugin:{version}"),
            Agent::Dra => format!("registry.example/sim-dra-driver:{version}"),
        }
    }

    fn of_image(image: &str) -> Option<Agent> {
        Agent::ALL
            .into_iter()
            .find(|a| image.starts_with(&a.image("")))
    }
}

struct Env {
    _serial: tokio::sync::MutexGuard<'static, ()>,
    ns: TestNamespace,
    client: Client,
    op: support::Operator,
    /// The device plugins' resources and the DRA driver's name: the test's own.
    driver_resource: String,
    plugin_resource: String,
    dra_driver: String,
    /// The operator's metrics port (127.0.0.1).
    metrics_port: u16,
    _class: ClusterObject,
    _policy: Option<ClusterObject>,
}

/// The CRDs, the chart's RBAC with `fleetPolicies.enabled`, a namespace, a
/// DeviceClass for the test's DRA driver, and the operator watching the
/// namespace with `--fleet-policies`.
async fn setup(name: &str) -> anyhow::Result<Env> {
    let serial = SERIAL.lock().await;
    let c = cluster();
    support::install(c)?;
    support::install_policy_crd(c)?;
    support::grant_chart_rbac(c, "fleetPolicies.enabled=true")?;
    let ns = c.namespace(name).await?;
    let client = c.client().await?;
    let dra_driver = format!("gpu-{}.sim.saferollout.dev", ns.name);
    let class: DeviceClass = serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
        "metadata": {"name": dra_driver},
        "spec": {"selectors": [{"cel": {"expression": format!("device.driver == \"{dra_driver}\"")}}]}
    }))?;
    Api::<DeviceClass>::all(client.clone())
        .create(&PostParams::default(), &class)
        .await?;
    let metrics_port = support::free_loopback_port()?;
    let mut args = support::operator_args(&ns.name, &format!("127.0.0.1:{metrics_port}"), 3);
    args.push("--fleet-policies=true".into());
    let op = support::Operator::start(
        Identity::Impersonate(c.kubeconfig(), OPERATOR_SA),
        &args,
        &ns.name,
    )?;
    Ok(Env {
        _serial: serial,
        driver_resource: format!("example.com/drv-{}", ns.name),
        plugin_resource: format!("example.com/gpu-{}", ns.name),
        _class: ClusterObject::new("deviceclass", &dra_driver),
        dra_driver,
        metrics_port,
        _policy: None,
        ns,
        client,
        op,
    })
}

fn template(env: &Env, agent: Agent, version: &str) -> serde_json::Value {
    let image = agent.image(version);
    let (kind, annotation) = match agent {
        Agent::Driver => (
            "device-plugin",
            json!({"sim.saferollout.dev/resource": env.driver_resource}),
        ),
        Agent::Plugin => (
            "device-plugin",
            json!({"sim.saferollout.dev/resource": env.plugin_resource}),
        ),
        Agent::Dra => (
            "dra-driver",
            json!({"sim.saferollout.dev/driver": env.dra_driver}),
        ),
    };
    json!({
        "metadata": {
            "labels": {"app": agent.name(), "sim.saferollout.dev/agent": kind, STACK_LABEL: env.ns.name},
            "annotations": annotation
        },
        "spec": {"containers": [{"name": agent.name(), "image": image}]}
    })
}

fn gates(env: &Env, agent: Agent) -> serde_json::Value {
    let resource = match agent {
        Agent::Driver => &env.driver_resource,
        Agent::Plugin => &env.plugin_resource,
        Agent::Dra => {
            return json!({"resourceSlices": {"driver": env.dra_driver, "soak": "2s"}});
        }
    };
    json!({"allocatable": [{"resource": resource, "min": "baseline", "max": "baseline", "soak": "2s"}]})
}

/// Every agent's DaemonSet on every node, its devices advertised; then
/// each one's SafeRollout (labelled with its agent and the stack), adopted.
async fn create_stack(env: &Env) -> anyhow::Result<()> {
    for agent in Agent::ALL {
        let ds: DaemonSet = serde_json::from_value(json!({
            "apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": agent.name()},
            "spec": {"selector": {"matchLabels": {"app": agent.name()}}, "template": template(env, agent, "v1")}
        }))?;
        Api::<DaemonSet>::namespaced(env.client.clone(), &env.ns.name)
            .create(&PostParams::default(), &ds)
            .await?;
    }
    let resources = [env.driver_resource.clone(), env.plugin_resource.clone()];
    wait_for_all(
        &Api::<Node>::all(env.client.clone()),
        watcher::Config::default(),
        TIMEOUT,
        move |ns| {
            ns.iter()
                .all(|n| resources.iter().all(|r| allocatable(n, r) == Some(GPUS)))
        },
    )
    .await?;
    let driver = env.dra_driver.clone();
    wait_for_all(
        &Api::<ResourceSlice>::all(env.client.clone()),
        watcher::Config::default(),
        TIMEOUT,
        move |ss| {
            NODES
                .iter()
                .all(|n| pool_devices(ss, &driver, n) == Some(GPUS as usize))
        },
    )
    .await?;
    for agent in Agent::ALL {
        let sr: SafeRollout = serde_json::from_value(json!({
            "apiVersion": "saferollout.dev/v1alpha1", "kind": "SafeRollout",
            "metadata": {"name": agent.name(), "labels": {"agent": agent.name(), "stack": "gpu"}},
            "spec": {
                "targetRef": {"name": agent.name()},
                "template": template(env, agent, "v1"),
                "canary": {"nodeSelector": {"matchLabels": {"kubernetes.io/hostname": CANARY}}},
                "stages": [{"nodes": 1}, {"nodes": "100%"}],
                "maxUnavailable": 1,
                "progressDeadline": "2m",
                "gates": gates(env, agent)
            }
        }))?;
        Api::<SafeRollout>::namespaced(env.client.clone(), &env.ns.name)
            .create(&PostParams::default(), &sr)
            .await?;
    }
    for agent in Agent::ALL {
        support::wait_adopted(&env.client, &env.ns.name, agent.name()).await?;
    }
    Ok(())
}

/// The policy governing the test's stack (`stack: gpu` in the test's
/// namespace), removed when the test ends.
async fn create_policy(env: &mut Env, spec: serde_json::Value) -> anyhow::Result<String> {
    let name = format!("stack-{}", env.ns.name);
    let mut spec = spec;
    spec["selector"] = json!({
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": env.ns.name}},
        "rolloutSelector": {"matchLabels": {"stack": "gpu"}}
    });
    let policy: SafeRolloutPolicy = serde_json::from_value(json!({
        "apiVersion": "saferollout.dev/v1alpha1", "kind": "SafeRolloutPolicy",
        "metadata": {"name": name}, "spec": spec
    }))?;
    Api::<SafeRolloutPolicy>::all(env.client.clone())
        .create(&PostParams::default(), &policy)
        .await?;
    env._policy = Some(ClusterObject::new("saferolloutpolicy", &name));
    // Applied: the operator says so on the policy, naming the three.
    let api = Api::<SafeRolloutPolicy>::all(env.client.clone());
    wait_for_object(&api, &name, TIMEOUT, |p| {
        p.and_then(|p| p.status.as_ref())
            .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Ready"))
            .is_some_and(|c| c.status == "True" && c.message.contains("governs 3 SafeRollout(s)"))
    })
    .await?;
    Ok(name)
}

async fn set_version(env: &Env, agent: Agent, version: &str) -> anyhow::Result<()> {
    let patch = json!({"spec": {"template": template(env, agent, version)}});
    Api::<SafeRollout>::namespaced(env.client.clone(), &env.ns.name)
        .patch(agent.name(), &PatchParams::default(), &Patch::Merge(patch))
        .await?;
    Ok(())
}

async fn wait_status(
    env: &Env,
    agent: Agent,
    done: impl Fn(&SafeRolloutStatus) -> bool,
) -> anyhow::Result<SafeRolloutStatus> {
    support::wait_status(&env.client, &env.ns.name, agent.name(), TIMEOUT, done).await
}

fn node_of(p: &Pod) -> String {
    p.spec
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .unwrap_or_default()
}

fn rv(meta: &kube::api::ObjectMeta) -> u64 {
    meta.resource_version
        .as_deref()
        .and_then(|v| v.parse().ok())
        .unwrap_or_default()
}

/// What the stack's watches saw, in etcd order (resource versions).
#[derive(Default, Debug)]
struct Seen {
    /// Per pod event: the nodes where some agent has no live Ready pod.
    disrupted: Vec<BTreeSet<String>>,
    /// (agent, node) -> resource version at which its first pod of the new
    /// version was created.
    created: BTreeMap<(Agent, String), u64>,
    /// (agent, node) -> resource version of the first SafeRollout status
    /// showing the node in a passed stage of the new version.
    passed: BTreeMap<(Agent, String), u64>,
    /// Reasons of the Waiting condition seen True, by agent.
    waiting: BTreeMap<Agent, BTreeSet<String>>,
    watch_errors: usize,
}

/// Watches every agent's pods (each node's disruption after every event,
/// and new-version creations) and the SafeRollouts (stages passed per
/// node, Waiting reasons) until aborted.
fn watch_stack(
    env: &Env,
    new_version: &str,
) -> (Arc<Mutex<Seen>>, Vec<tokio::task::JoinHandle<()>>) {
    let seen = Arc::new(Mutex::new(Seen::default()));
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), &env.ns.name);
    let selector = format!("{STACK_LABEL}={}", env.ns.name);
    let (s, v) = (seen.clone(), new_version.to_string());
    let pod_task = tokio::spawn(async move {
        let mut live: BTreeMap<String, Arc<Pod>> = BTreeMap::new();
        // Each pod's first resource version seen: its creation's, for the
        // pods created after the watch started.
        let mut first_rv: BTreeMap<String, u64> = BTreeMap::new();
        let mut listing = true;
        let mut stream = watcher(pods, watcher::Config::default().labels(&selector)).boxed();
        while let Some(ev) = stream.next().await {
            let Ok(ev) = ev else {
                s.lock().unwrap().watch_errors += 1;
                continue;
            };
            let mut s = s.lock().unwrap();
            match ev {
                watcher::Event::Init => {
                    live.clear();
                    listing = true;
                }
                watcher::Event::InitApply(p) | watcher::Event::Apply(p) => {
                    let agent = Agent::of_image(image_of(&p));
                    let node = node_of(&p);
                    let created = *first_rv
                        .entry(p.uid().unwrap_or_default())
                        .or_insert(rv(&p.metadata));
                    if let Some(agent) =
                        agent.filter(|_| image_of(&p).ends_with(&v) && !node.is_empty())
                    {
                        s.created.entry((agent, node)).or_insert(created);
                    }
                    live.insert(p.uid().unwrap_or_default(), Arc::new(p));
                }
                watcher::Event::InitDone => listing = false,
                watcher::Event::Delete(p) => {
                    live.remove(&p.uid().unwrap_or_default());
                }
            }
            if listing {
                continue;
            }
            let mut serving: BTreeSet<(Agent, String)> = BTreeSet::new();
            for p in live.values() {
                if p.metadata.deletion_timestamp.is_none()
                    && pod_ready(p)
                    && let Some(a) = Agent::of_image(image_of(p))
                {
                    serving.insert((a, node_of(p)));
                }
            }
            let disrupted = NODES
                .iter()
                .filter(|n| {
                    Agent::ALL
                        .iter()
                        .any(|a| !serving.contains(&(*a, n.to_string())))
                })
                .map(|n| n.to_string())
                .collect();
            s.disrupted.push(disrupted);
        }
    });
    let rollouts: Api<SafeRollout> = Api::namespaced(env.client.clone(), &env.ns.name);
    let s = seen.clone();
    let sr_task = tokio::spawn(async move {
        let mut stream = watcher(rollouts, watcher::Config::default()).boxed();
        while let Some(ev) = stream.next().await {
            // Changes only: the list shows the statuses from before the release.
            let Ok(watcher::Event::Apply(sr)) = ev else {
                continue;
            };
            let Some(agent) = Agent::ALL.into_iter().find(|a| a.name() == sr.name_any()) else {
                continue;
            };
            let Some(st) = sr.status.as_ref() else {
                continue;
            };
            let mut s = s.lock().unwrap();
            if let Some(c) = condition(st, CONDITION_WAITING).filter(|c| c.status == "True") {
                s.waiting.entry(agent).or_default().insert(c.reason.clone());
            }
            // Stages of a rollout in progress (the target is not stable yet),
            // or the stable revision's just after it succeeded.
            for stage in &st.stages {
                if matches!(stage.state, StageState::Passed | StageState::Paused) {
                    for n in &stage.nodes {
                        s.passed
                            .entry((agent, n.clone()))
                            .or_insert(rv(&sr.metadata));
                    }
                }
            }
        }
    });
    (seen, vec![pod_task, sr_task])
}

#[tokio::test]
async fn three_agents_under_one_disrupted_node_take_the_nodes_one_at_a_time_in_order()
-> anyhow::Result<()> {
    let mut env = setup("fleet-budget").await?;
    create_stack(&env).await?;
    let policy = create_policy(
        &mut env,
        json!({
            "maxDisruptedNodes": 1,
            "ordering": [{
                "rollouts": {"matchExpressions": [{"key": "agent", "operator": "In", "values": ["device-plugin", "dra-driver"]}]},
                "after": [{"matchLabels": {"agent": "gpu-driver"}}]
            }]
        }),
    )
    .await?;
    let (seen, tasks) = watch_stack(&env, "v2");
    // Every agent's release at once.
    let started = std::time::Instant::now();
    for agent in Agent::ALL {
        set_version(&env, agent, "v2").await?;
    }
    let mut finals = BTreeMap::new();
    for agent in Agent::ALL {
        let st = support::wait_status(
            &env.client,
            &env.ns.name,
            agent.name(),
            Duration::from_secs(300),
            |st| {
                st.phase == Some(Phase::Succeeded)
                    && st.stable_revision.is_some()
                    && st.stable_revision == st.target_revision
                    && st.stages.iter().all(|s| s.state == StageState::Passed)
                    && !st.stages.is_empty()
            },
        )
        .await?;
        finals.insert(agent, st);
    }
    let took = started.elapsed();
    // Every node runs the new version of every agent.
    let live = support::wait_live_pods(
        &env.client,
        &env.ns.name,
        &format!("{STACK_LABEL}={}", env.ns.name),
        |live| {
            live.len() == 3 * NODES.len()
                && live
                    .iter()
                    .all(|p| pod_ready(p) && image_of(p).ends_with(":v2"))
        },
    )
    .await?;
    assert_eq!(live.len(), 12);
    for t in tasks {
        t.abort();
    }
    let seen = seen.lock().unwrap();
    // The budget: never more than one node with any agent not Ready.
    let most = seen.disrupted.iter().map(BTreeSet::len).max().unwrap_or(0);
    let worst = seen
        .disrupted
        .iter()
        .find(|d| d.len() == most)
        .cloned()
        .unwrap_or_default();
    assert!(most <= 1, "{most} nodes disrupted at once: {worst:?}");
    assert!(
        seen.disrupted.iter().any(|d| d.len() == 1),
        "the sampler saw no node disrupted at all: it cannot have sampled the rollouts"
    );
    // The ordering: on every node, the plugin's and the DRA driver's new
    // pods were created after the driver passed its gates there.
    for node in NODES {
        let passed = seen.passed.get(&(Agent::Driver, node.to_string())).copied();
        let passed =
            passed.unwrap_or_else(|| panic!("the driver's stage never passed on {node}: {seen:?}"));
        for dependent in [Agent::Plugin, Agent::Dra] {
            let created = seen.created.get(&(dependent, node.to_string())).copied();
            let created = created.unwrap_or_else(|| panic!("no new {dependent:?} pod on {node}"));
            assert!(
                created > passed,
                "{dependent:?}'s new pod on {node} (resource version {created}) came before the driver passed there ({passed})"
            );
        }
    }
    // Someone waited, on the budget or the ordering, and said so.
    let reasons: BTreeSet<&String> = seen.waiting.values().flatten().collect();
    assert!(
        reasons
            .iter()
            .any(|r| *r == "FleetBudgetFull" || *r == "FleetOrdering"),
        "no rollout waited: {:?}",
        seen.waiting
    );
    for (agent, st) in &finals {
        assert!(
            st.disrupted_nodes.is_empty(),
            "{agent:?}: {:?}",
            st.disrupted_nodes
        );
        let w = condition(st, CONDITION_WAITING).expect("a governed rollout's Waiting");
        assert_eq!(w.status, "False", "{agent:?}: {w:?}");
    }
    eprintln!(
        "MEASURE {}: 3 agents x {} nodes under maxDisruptedNodes 1 with ordering: {:.1}s, {} samples, waits {:?}, policy {policy}",
        env.ns.name,
        NODES.len(),
        took.as_secs_f64(),
        seen.disrupted.len(),
        seen.waiting
    );
    assert_eq!(
        seen.watch_errors, 0,
        "the watch broke: samples may be missing"
    );
    drop(env.op);
    Ok(())
}

/// A window of `minutes` minutes starting at the next whole minute at
/// least `lead` from now, UTC, on the day it starts.
fn window_from_now(lead: Duration, minutes: i64) -> (serde_json::Value, jiff::Timestamp) {
    let now = jiff::Timestamp::now();
    let lead = jiff::SignedDuration::try_from(lead).unwrap();
    let at = (now + lead).to_zoned(jiff::tz::TimeZone::UTC);
    let start = at
        .round(
            jiff::ZonedRound::new()
                .smallest(jiff::Unit::Minute)
                .mode(jiff::RoundMode::Ceil),
        )
        .unwrap();
    let end = start
        .checked_add(jiff::SignedDuration::from_mins(minutes))
        .unwrap();
    let day = format!("{:?}", start.weekday());
    (
        json!({
            "days": [day],
            "start": start.strftime("%H:%M").to_string(),
            "end": end.strftime("%H:%M").to_string(),
            "timeZone": "UTC"
        }),
        start.timestamp(),
    )
}

#[tokio::test]
async fn a_release_waits_for_its_window_and_a_revert_outside_one_is_not_held() -> anyhow::Result<()>
{
    let mut env = setup("fleet-window").await?;
    create_stack(&env).await?;
    // Opens a minute or two from now, for ten minutes.
    let (window, opens) = window_from_now(Duration::from_secs(60), 10);
    let policy = create_policy(&mut env, json!({"maintenanceWindows": [window]})).await?;
    let (seen, tasks) = watch_stack(&env, "v2");
    set_version(&env, Agent::Plugin, "v2").await?;
    // Outside the window: waiting, and the condition names the next one.
    let st = wait_status(&env, Agent::Plugin, |st| {
        condition(st, CONDITION_WAITING).is_some_and(|c| c.status == "True")
    })
    .await?;
    let w = condition(&st, CONDITION_WAITING).unwrap();
    assert_eq!(w.reason, "MaintenanceWindow", "{w:?}");
    let opening = opens.to_zoned(jiff::tz::TimeZone::UTC);
    assert!(
        w.message
            .contains(&opening.strftime("%Y-%m-%d %H:%M").to_string()),
        "{}",
        w.message
    );
    assert!(
        jiff::Timestamp::now() < opens,
        "the test took too long to see the wait before the window opened"
    );
    // `kubectl saferollout policy` says the same: closed, the next
    // opening, and who waits on it.
    let (code, out, err) = support::kubectl_saferollout(&["policy", &policy, "-o", "json"])?;
    assert_eq!(code, 0, "{err}");
    let report: serde_json::Value = serde_json::from_str(&out)?;
    let p = &report["policies"][0];
    assert_eq!(p["name"], policy.as_str(), "{out}");
    assert_eq!(p["windowOpen"], false, "{out}");
    assert!(
        p["nextWindow"]
            .as_str()
            .is_some_and(|w| w.contains(&opening.strftime("%H:%M").to_string())),
        "{out}"
    );
    let plugin = p["rollouts"]
        .as_array()
        .and_then(|rs| rs.iter().find(|r| r["name"] == Agent::Plugin.name()))
        .unwrap_or_else(|| panic!("the plugin among the governed: {out}"));
    assert_eq!(plugin["waiting"]["reason"], "MaintenanceWindow", "{out}");
    // And the metrics: the plugin waits on the window, the driver on nothing.
    let (code, metrics) = support::http_get(env.metrics_port, "/metrics")?;
    assert_eq!(code, 200);
    let series = |name: &str, reason: &str| {
        format!(
            "saferollout_rollout_waiting{{namespace=\"{}\",name=\"{name}\",reason=\"{reason}\"}} ",
            env.ns.name
        )
    };
    let value = |line: String| {
        metrics
            .lines()
            .find(|l| l.starts_with(&line))
            .map(|l| l[line.len()..].trim().to_string())
    };
    assert_eq!(
        value(series(Agent::Plugin.name(), "MaintenanceWindow")).as_deref(),
        Some("1"),
        "{metrics}"
    );
    assert_eq!(
        value(series(Agent::Driver.name(), "MaintenanceWindow")).as_deref(),
        Some("0"),
        "{metrics}"
    );
    assert_eq!(p["rollouts"].as_array().map(Vec::len), Some(3), "{out}");
    // Inside it: the release starts and succeeds; nothing of it before.
    support::wait_status(
        &env.client,
        &env.ns.name,
        Agent::Plugin.name(),
        Duration::from_secs(300),
        |st| {
            st.phase == Some(Phase::Succeeded)
                && st.stable_revision == st.target_revision
                && st.target_revision.is_some()
                && !st.stages.is_empty()
        },
    )
    .await?;
    {
        let seen = seen.lock().unwrap();
        assert_eq!(seen.created.len(), NODES.len(), "{:?}", seen.created);
    }
    let first_creation = {
        // The first new pod's creation, in time: after the window opened.
        let pods = Api::<Pod>::namespaced(env.client.clone(), &env.ns.name)
            .list(
                &kube::api::ListParams::default().labels(&format!("app={}", Agent::Plugin.name())),
            )
            .await?;
        pods.items
            .iter()
            .filter_map(|p| p.metadata.creation_timestamp.as_ref().map(|t| t.0))
            .min()
            .unwrap()
    };
    assert!(
        first_creation
            >= opens
                .checked_sub(jiff::SignedDuration::from_secs(1))
                .unwrap(),
        "a new pod was created at {first_creation}, before the window opened at {opens}"
    );
    // A broken release inside the window; once its canary is replaced the
    // window is moved to tomorrow: the revert goes on outside it.
    let soak_long = json!({"spec": {"gates": {"allocatable": [{"resource": env.plugin_resource, "min": "baseline", "max": "baseline", "soak": "8s"}]}}});
    Api::<SafeRollout>::namespaced(env.client.clone(), &env.ns.name)
        .patch(
            Agent::Plugin.name(),
            &PatchParams::default(),
            &Patch::Merge(soak_long),
        )
        .await?;
    set_version(&env, Agent::Plugin, "v3-broken").await?;
    support::wait_live_pods(
        &env.client,
        &env.ns.name,
        &format!("app={}", Agent::Plugin.name()),
        |live| {
            live.iter()
                .any(|p| image_of(p).ends_with("v3-broken") && node_of(p) == CANARY)
        },
    )
    .await?;
    let tomorrow = jiff::Timestamp::now()
        .to_zoned(jiff::tz::TimeZone::UTC)
        .checked_add(jiff::SignedDuration::from_hours(12))
        .unwrap();
    let closed = json!({"spec": {"maintenanceWindows": [{
        "days": [format!("{:?}", tomorrow.weekday())],
        "start": tomorrow.strftime("%H:%M").to_string(),
        "end": tomorrow.checked_add(jiff::SignedDuration::from_mins(5)).unwrap().strftime("%H:%M").to_string(),
        "timeZone": "UTC"
    }]}});
    Api::<SafeRolloutPolicy>::all(env.client.clone())
        .patch(&policy, &PatchParams::default(), &Patch::Merge(closed))
        .await?;
    let st = support::wait_status(
        &env.client,
        &env.ns.name,
        Agent::Plugin.name(),
        TIMEOUT,
        |st| {
            st.phase == Some(Phase::Degraded)
                && condition(st, "Progressing").is_some_and(|c| c.reason == "RolledBack")
        },
    )
    .await?;
    assert!(!st.blocked_revisions.is_empty());
    support::wait_live_pods(
        &env.client,
        &env.ns.name,
        &format!("app={}", Agent::Plugin.name()),
        |live| {
            live.len() == NODES.len()
                && live
                    .iter()
                    .all(|p| pod_ready(p) && image_of(p).ends_with(":v2"))
        },
    )
    .await?;
    for t in tasks {
        t.abort();
    }
    drop(env.op);
    Ok(())
}
