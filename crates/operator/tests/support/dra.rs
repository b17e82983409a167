//! Shared by the DRA test binaries (`dra.rs`, `dra_policies.rs`): a
//! simulated DRA driver of the test's own (its own driver name and
//! DeviceClass, so one test's pools never satisfy another's gate), the
//! operator as its ServiceAccount, workload pods and claims, and the clock
//! that measures the time from a fault to the operator's decision.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Event, Pod};
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource};
use saferollout_api::{SafeRollout, SafeRolloutStatus};
use saferollout_testkit::{TestNamespace, cluster, wait_for_all, wait_for_object};
use serde::de::DeserializeOwned;
use serde_json::json;

use super::{GPUS, Identity, Operator, TIMEOUT};

pub const OPERATOR_SA: &str = "system:serviceaccount:saferollout-system:saferollout-operator";
pub const WORKLOAD_LABEL: &str = "sim.saferollout.dev/workload";
pub const FAULTY_LABEL: &str = "sim.saferollout.dev/faulty-devices";
/// The node every test takes as its canary (`canary.nodeSelector`).
pub const CANARY: &str = "sim-gpu-1";
pub const NODES: [&str; 4] = ["sim-gpu-0", "sim-gpu-1", "sim-gpu-2", "sim-gpu-3"];
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Deletes a cluster-scoped object when dropped (a test that fails half-way
/// leaves nothing behind for the next).
pub struct ClusterObject {
    kind: String,
    name: String,
}

impl ClusterObject {
    pub fn new(kind: &str, name: &str) -> Self {
        Self {
            kind: kind.into(),
            name: name.into(),
        }
    }
}

impl Drop for ClusterObject {
    fn drop(&mut self) {
        let _ = cluster().kubectl(&[
            "delete",
            &self.kind,
            &self.name,
            "--ignore-not-found",
            "--wait=false",
        ]);
    }
}

/// A node label set for a test, removed on drop.
pub struct NodeLabel {
    node: String,
    key: String,
}

impl NodeLabel {
    pub fn set(node: &str, key: &str, value: &str) -> anyhow::Result<Self> {
        cluster().kubectl(&[
            "label",
            "node",
            node,
            &format!("{key}={value}"),
            "--overwrite",
        ])?;
        Ok(Self {
            node: node.into(),
            key: key.into(),
        })
    }
}

impl Drop for NodeLabel {
    fn drop(&mut self) {
        let _ = cluster().kubectl(&["label", "node", &self.node, &format!("{}-", self.key)]);
    }
}

pub struct Env {
    pub _serial: tokio::sync::MutexGuard<'static, ()>,
    pub ns: TestNamespace,
    pub client: Client,
    pub op: Operator,
    /// The test's own DRA driver (and DeviceClass of the same name).
    pub driver: String,
    pub name: String,
    _class: ClusterObject,
}

/// The operator as the ServiceAccount of deploy/rbac.yaml, watching the
/// test's namespace, with a short lease.
pub fn start_operator(ns: &str) -> anyhow::Result<Operator> {
    start_operator_with(ns, &[], ns)
}

/// [`start_operator`] with environment variables (flags) and a log name.
pub fn start_operator_with(ns: &str, env: &[(&str, &str)], log: &str) -> anyhow::Result<Operator> {
    let args = super::operator_args(ns, "127.0.0.1:0", 3);
    Operator::start_with_env(
        Identity::Impersonate(cluster().kubeconfig(), OPERATOR_SA),
        &args,
        env,
        log,
    )
}

/// [`start_operator`] running `strategy: Selector` (`--selector-strategy`,
/// with the chart's `selector.enabled` RBAC granted).
pub fn start_selector_operator(ns: &str, log: &str) -> anyhow::Result<Operator> {
    super::grant_selector_rbac(cluster())?;
    let mut args = super::operator_args(ns, "127.0.0.1:0", 3);
    args.push("--selector-strategy=true".into());
    Operator::start_with_env(
        Identity::Impersonate(cluster().kubeconfig(), OPERATOR_SA),
        &args,
        &[],
        log,
    )
}

pub async fn setup(name: &str) -> anyhow::Result<Env> {
    let serial = SERIAL.lock().await;
    let c = cluster();
    super::install(c)?;
    let ns = c.namespace(name).await?;
    let client = c.client().await?;
    let driver = format!("gpu-{name}.sim.saferollout.dev");
    let class = serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
        "metadata": {"name": driver},
        "spec": {"selectors": [{"cel": {"expression": format!("device.driver == \"{driver}\"")}}]}
    }))?;
    Api::<k8s_openapi::api::resource::v1::DeviceClass>::all(client.clone())
        .create(&PostParams::default(), &class)
        .await?;
    let op = start_operator(&ns.name)?;
    Ok(Env {
        _serial: serial,
        _class: ClusterObject::new("deviceclass", &driver),
        ns,
        client,
        op,
        driver,
        name: name.into(),
    })
}

/// The pod template of the simulated DRA driver `driver`.
pub fn driver_template(driver: &str, image: &str) -> serde_json::Value {
    json!({
        "metadata": {
            "labels": {"app": "driver", "sim.saferollout.dev/agent": "dra-driver"},
            "annotations": {"sim.saferollout.dev/driver": driver}
        },
        "spec": {"containers": [{"name": "driver", "image": image}]}
    })
}

/// The driver's DaemonSet `driver` on every node, waited on until every
/// node's pool is complete with its GPUs.
pub async fn create_driver(env: &Env, image: &str) -> anyhow::Result<()> {
    let ds: DaemonSet = serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "driver"},
        "spec": {"selector": {"matchLabels": {"app": "driver"}}, "template": driver_template(&env.driver, image)}
    }))?;
    Api::<DaemonSet>::namespaced(env.client.clone(), &env.ns.name)
        .create(&PostParams::default(), &ds)
        .await?;
    wait_pools(env, |_, devices| devices == GPUS as usize).await?;
    Ok(())
}

/// Devices of `driver`'s complete pool on `node` (`None`: no complete pool).
pub fn pool_devices(slices: &[Arc<ResourceSlice>], driver: &str, node: &str) -> Option<usize> {
    let mine: Vec<&ResourceSlice> = slices
        .iter()
        .filter(|s| s.spec.driver == driver && s.spec.node_name.as_deref() == Some(node))
        .map(AsRef::as_ref)
        .collect();
    let newest = mine.iter().map(|s| s.spec.pool.generation).max()?;
    let current: Vec<&&ResourceSlice> = mine
        .iter()
        .filter(|s| s.spec.pool.generation == newest)
        .collect();
    let complete = current.len() as i64 == current[0].spec.pool.resource_slice_count;
    complete.then(|| {
        current
            .iter()
            .map(|s| s.spec.devices.as_ref().map_or(0, Vec::len))
            .sum()
    })
}

/// Waits until `check(node, devices)` holds for every node's complete pool.
pub async fn wait_pools(env: &Env, check: impl Fn(&str, usize) -> bool) -> anyhow::Result<()> {
    let driver = env.driver.clone();
    wait_for_all(
        &Api::<ResourceSlice>::all(env.client.clone()),
        watcher::Config::default(),
        TIMEOUT,
        |ss| {
            NODES
                .iter()
                .all(|n| pool_devices(ss, &driver, n).is_some_and(|d| check(n, d)))
        },
    )
    .await?;
    Ok(())
}

/// A SafeRollout spec owning the driver's template (GitOps mode), the
/// canary on [`CANARY`], then every node; `gates` as given.
pub fn rollout_spec(env: &Env, image: &str, gates: serde_json::Value) -> serde_json::Value {
    json!({
        "targetRef": {"name": "driver"},
        "template": driver_template(&env.driver, image),
        "canary": {"nodeSelector": {"matchLabels": {"kubernetes.io/hostname": CANARY}}},
        "stages": [{"nodes": 1}, {"nodes": "100%"}],
        "maxUnavailable": 1,
        "progressDeadline": "2m",
        "gates": gates
    })
}

pub fn srs(env: &Env) -> Api<SafeRollout> {
    Api::namespaced(env.client.clone(), &env.ns.name)
}

pub async fn create_rollout(env: &Env, spec: serde_json::Value) -> anyhow::Result<()> {
    super::create_rollout(&env.client, &env.ns.name, "driver", spec).await?;
    super::wait_adopted(&env.client, &env.ns.name, "driver").await?;
    Ok(())
}

/// Writes a new driver image to `spec.template`.
pub async fn set_image(env: &Env, image: &str) -> anyhow::Result<()> {
    let patch = json!({"spec": {"template": driver_template(&env.driver, image)}});
    srs(env)
        .patch("driver", &PatchParams::default(), &Patch::Merge(patch))
        .await?;
    Ok(())
}

pub async fn wait_status(
    env: &Env,
    timeout: Duration,
    done: impl Fn(&SafeRolloutStatus) -> bool,
) -> anyhow::Result<SafeRolloutStatus> {
    super::wait_status(&env.client, &env.ns.name, "driver", timeout, done).await
}

/// Waits until the rollout of a new revision succeeded.
pub async fn wait_succeeded(env: &Env, not: &str) -> anyhow::Result<SafeRolloutStatus> {
    wait_status(env, TIMEOUT, |st| {
        st.phase == Some(saferollout_api::Phase::Succeeded)
            && st.stable_revision.as_deref().is_some_and(|s| s != not)
    })
    .await
}

/// Waits until a revision is blocked (the operator's decision) and returns
/// the status and when the test saw it.
pub async fn wait_blocked(env: &Env) -> anyhow::Result<(SafeRolloutStatus, Instant)> {
    let st = wait_status(env, TIMEOUT, |st| !st.blocked_revisions.is_empty()).await?;
    Ok((st, Instant::now()))
}

/// Waits until a revert finished (every node back, Progressing=False RolledBack).
pub async fn wait_reverted(env: &Env) -> anyhow::Result<SafeRolloutStatus> {
    wait_status(env, TIMEOUT, |st| {
        st.phase == Some(saferollout_api::Phase::Degraded)
            && super::condition(st, "Progressing").is_some_and(|c| c.reason == "RolledBack")
    })
    .await
}

/// The gate result `gate` of the failed stage.
pub fn failed_gate<'a>(
    st: &'a SafeRolloutStatus,
    gate: &str,
) -> Option<&'a saferollout_api::GateResult> {
    st.stages
        .iter()
        .flat_map(|s| s.gates.iter())
        .find(|g| g.gate == gate && g.status == saferollout_api::GateStatus::Failed)
}

/// A ResourceClaim for one device of `class`.
pub fn claim(name: &str, class: &str) -> anyhow::Result<ResourceClaim> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": class}}]}}
    }))?)
}

/// A workload pod the fixture plays the kubelet for, pinned to `node` by
/// its hostname label (the real scheduler still places it), using `claim`
/// or `gpus` of `resource`. `restart` Never makes it a probe-like pod.
pub fn workload(
    name: &str,
    node: &str,
    restart: &str,
    claim: Option<&str>,
    gpus: Option<(&str, i64)>,
) -> anyhow::Result<Pod> {
    let mut resources = json!({});
    if let Some((resource, n)) = gpus {
        resources["limits"] = json!({resource: n.to_string()});
    }
    if claim.is_some() {
        resources["claims"] = json!([{"name": "gpu"}]);
    }
    let mut spec = json!({
        "restartPolicy": restart,
        "nodeSelector": {"kubernetes.io/hostname": node},
        "containers": [{"name": "work", "image": "registry.example/cuda-vector-add:1", "resources": resources}]
    });
    if let Some(claim) = claim {
        spec["resourceClaims"] = json!([{"name": "gpu", "resourceClaimName": claim}]);
    }
    Ok(serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {WORKLOAD_LABEL: "work"}},
        "spec": spec
    }))?)
}

pub fn phase(p: &Pod) -> &str {
    p.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("")
}

/// `(resourceID, health)` of a pod's allocatedResourcesStatus entries.
pub fn health(p: &Pod) -> Vec<(String, String)> {
    p.status
        .iter()
        .flat_map(|s| s.container_statuses.iter().flatten())
        .flat_map(|c| c.allocated_resources_status.iter().flatten())
        .flat_map(|r| r.resources.iter().flatten())
        .map(|h| (h.resource_id.clone(), h.health.clone().unwrap_or_default()))
        .collect()
}

pub async fn wait_pod(env: &Env, name: &str, done: impl Fn(&Pod) -> bool) -> anyhow::Result<Pod> {
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), &env.ns.name);
    Ok(
        wait_for_object(&pods, name, TIMEOUT, |p| p.is_some_and(&done))
            .await?
            .expect("the pod"),
    )
}

/// A long-running workload with a claim of the test's driver on `node`,
/// waited on until it runs with its device Healthy; returns its UID.
pub async fn claim_workload(env: &Env, name: &str, node: &str) -> anyhow::Result<String> {
    Api::<ResourceClaim>::namespaced(env.client.clone(), &env.ns.name)
        .create(&PostParams::default(), &claim(name, &env.driver)?)
        .await?;
    Api::<Pod>::namespaced(env.client.clone(), &env.ns.name)
        .create(
            &PostParams::default(),
            &workload(name, node, "Always", Some(name), None)?,
        )
        .await?;
    let running = wait_pod(env, name, |p| {
        phase(p) == "Running" && health(p).iter().any(|(_, h)| h == "Healthy")
    })
    .await?;
    Ok(running.metadata.uid.unwrap_or_default())
}

/// Records when `fault` first holds for the objects a watch shows: the
/// moment the cluster shows the fault, to measure the operator against.
pub struct FaultClock {
    seen: Arc<Mutex<Option<Instant>>>,
    task: tokio::task::JoinHandle<()>,
}

impl FaultClock {
    pub fn watch<K>(
        api: Api<K>,
        config: watcher::Config,
        fault: impl Fn(&[Arc<K>]) -> bool + Send + 'static,
    ) -> Self
    where
        K: Resource<DynamicType = ()>
            + Clone
            + DeserializeOwned
            + std::fmt::Debug
            + Send
            + Sync
            + 'static,
    {
        let seen = Arc::new(Mutex::new(None));
        let s = seen.clone();
        let task = tokio::spawn(async move {
            let (reader, writer) = kube::runtime::reflector::store();
            let mut stream =
                kube::runtime::reflector(writer, watcher(api, config).default_backoff()).boxed();
            while let Ok(Some(ev)) = stream.try_next().await {
                if matches!(ev, watcher::Event::Init | watcher::Event::InitApply(_)) {
                    continue;
                }
                if fault(&reader.state()) {
                    s.lock().unwrap().get_or_insert_with(Instant::now);
                    return;
                }
            }
        });
        FaultClock { seen, task }
    }

    /// When the fault was first seen (fails if it never was).
    pub fn seen(&self) -> anyhow::Result<Instant> {
        self.seen
            .lock()
            .unwrap()
            .ok_or_else(|| anyhow::anyhow!("the fault was never seen in the cluster"))
    }
}

impl Drop for FaultClock {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Prints the time from a fault to the operator's decision, for the record.
pub fn measure(test: &str, what: &str, fault: Instant, decision: Instant, note: &str) {
    let took = decision.saturating_duration_since(fault);
    eprintln!(
        "MEASURE {test}: {what}: fault to decision {:.2}s ({note})",
        took.as_secs_f64()
    );
}

/// The slices of the test's driver on `node` lose devices or vanish: a
/// fault clock for withdrawn or fewer devices.
pub fn slices_fault(env: &Env, node: &str, below: usize) -> FaultClock {
    let (driver, node) = (env.driver.clone(), node.to_string());
    FaultClock::watch(
        Api::<ResourceSlice>::all(env.client.clone()),
        watcher::Config::default(),
        move |ss| {
            let mine = ss
                .iter()
                .any(|s| s.spec.driver == driver && s.spec.node_name.as_deref() == Some(&node));
            !mine || pool_devices(ss, &driver, &node).is_some_and(|d| d < below)
        },
    )
}

/// Warning Events about the SafeRollout with `reason`.
pub async fn events(env: &Env, reason: &str) -> anyhow::Result<Vec<String>> {
    let list = Api::<Event>::namespaced(env.client.clone(), &env.ns.name)
        .list(&Default::default())
        .await?;
    Ok(list
        .items
        .into_iter()
        .filter(|e| {
            e.reason.as_deref() == Some(reason)
                && e.involved_object.kind.as_deref() == Some("SafeRollout")
        })
        .filter_map(|e| e.message)
        .collect())
}

/// Waits until at least one Event `reason` about the SafeRollout exists
/// (Events are published after the status write); returns their messages.
pub async fn wait_events(env: &Env, reason: &str) -> anyhow::Result<Vec<String>> {
    let seen = super::wait_events(&env.client, &env.ns.name, reason).await?;
    Ok(seen
        .iter()
        .filter(|e| e.reason.as_deref() == Some(reason))
        .filter_map(|e| e.message.clone())
        .collect())
}

/// Waits until the scheduler reports `needle` for pod `pod`.
pub async fn wait_unschedulable(env: &Env, pod: &str, needle: &str) -> anyhow::Result<String> {
    let p = wait_pod(env, pod, |p| {
        p.status
            .iter()
            .flat_map(|s| s.conditions.iter().flatten())
            .any(|c| {
                c.type_ == "PodScheduled"
                    && c.status == "False"
                    && c.message.as_deref().unwrap_or("").contains(needle)
            })
    })
    .await?;
    Ok(p.status
        .iter()
        .flat_map(|s| s.conditions.iter().flatten())
        .find_map(|c| c.message.clone())
        .unwrap_or_default())
}
