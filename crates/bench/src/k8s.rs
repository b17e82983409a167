//! Objects the benchmark creates and the waits it needs, all through the API
//! server (watches, never sleeps).

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::Context;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::{ControllerRevision, DaemonSet};
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, ServiceAccount};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use saferollout_api::{Phase, ROLLOUT_LABEL, STAGE_LABEL, SafeRollout, SafeRolloutStatus};
use saferollout_testkit::{wait_for_all, wait_for_object};
use serde_json::{Value, json};

pub const GPUS: i64 = 8;
pub const DRIVER: &str = "gpu.sim.saferollout.dev";
/// Node label that pins the reaction trials' canary.
pub const CANARY_LABEL: &str = "bench.saferollout.dev/canary";
/// Node label that splits the nodes into pools, one per DaemonSet of the multi-rollout run.
pub const POOL_LABEL: &str = "bench.saferollout.dev/pool";

/// The pod template of the simulated device plugin advertising `resource`.
pub fn plugin_template(resource: &str, image: &str) -> Value {
    json!({
        "metadata": {
            "labels": {"app": "agent", "sim.saferollout.dev/agent": "device-plugin"},
            "annotations": {"sim.saferollout.dev/resource": resource}
        },
        "spec": {"containers": [{"name": "agent", "image": image}]}
    })
}

/// The pod template of the simulated DRA driver.
pub fn driver_template(image: &str) -> Value {
    json!({
        "metadata": {
            "labels": {"app": "agent", "sim.saferollout.dev/agent": "dra-driver"},
            "annotations": {"sim.saferollout.dev/driver": DRIVER}
        },
        "spec": {"containers": [{"name": "agent", "image": image}]}
    })
}

pub fn rolling_update(max_unavailable: &str) -> Value {
    let mu: Value = max_unavailable
        .parse::<i64>()
        .map(Value::from)
        .unwrap_or_else(|_| Value::from(max_unavailable));
    json!({"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": mu, "maxSurge": 0}})
}

/// A namespace whose default ServiceAccount exists (pods are refused before).
pub async fn namespace(client: &Client, name: &str) -> anyhow::Result<()> {
    let api: Api<Namespace> = Api::all(client.clone());
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": name}}))?;
    match api.create(&PostParams::default(), &ns).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(e) => return Err(e.into()),
    }
    let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), name);
    wait_for_object(&sas, "default", Duration::from_secs(120), |sa| sa.is_some()).await?;
    Ok(())
}

/// Creates DaemonSet `name` in `ns` with `template` (RollingUpdate, maxUnavailable 1).
pub async fn create_daemonset(
    client: &Client,
    ns: &str,
    name: &str,
    template: Value,
    node_selector: Option<(&str, &str)>,
) -> anyhow::Result<()> {
    let mut template = template;
    if let Some((k, v)) = node_selector {
        template["spec"]["nodeSelector"] = json!({k: v});
    }
    let ds: DaemonSet = serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": name, "namespace": ns},
        "spec": {"selector": {"matchLabels": {"app": "agent"}}, "template": template,
                 "updateStrategy": rolling_update("1")}
    }))?;
    Api::<DaemonSet>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &ds)
        .await?;
    Ok(())
}

/// The DaemonSet's status says every pod runs its current template and is
/// available (what `kubectl rollout status` waits for).
pub fn daemonset_complete(ds: &DaemonSet, min_generation: i64) -> bool {
    let generation = ds.metadata.generation.unwrap_or_default();
    let Some(st) = &ds.status else { return false };
    generation >= min_generation
        && st.observed_generation.unwrap_or_default() >= generation
        && st.desired_number_scheduled > 0
        && st.updated_number_scheduled.unwrap_or_default() == st.desired_number_scheduled
        && st.number_available.unwrap_or_default() == st.desired_number_scheduled
        && st.number_unavailable.unwrap_or_default() == 0
        && st.current_number_scheduled == st.desired_number_scheduled
}

pub async fn wait_daemonset_complete(
    client: &Client,
    ns: &str,
    name: &str,
    timeout: Duration,
) -> anyhow::Result<()> {
    let api: Api<DaemonSet> = Api::namespaced(client.clone(), ns);
    wait_for_object(&api, name, timeout, |d| {
        d.is_some_and(|d| daemonset_complete(d, 0))
    })
    .await
    .with_context(|| format!("DaemonSet {ns}/{name} to be complete"))?;
    Ok(())
}

/// Waits until `count` nodes advertise `GPUS` of `resource`.
pub async fn wait_nodes_advertise(
    client: &Client,
    resource: &str,
    count: usize,
    timeout: Duration,
) -> anyhow::Result<()> {
    let res = resource.to_string();
    wait_for_all(
        &Api::<Node>::all(client.clone()),
        watcher::Config::default(),
        timeout,
        move |ns| {
            ns.iter()
                .filter(|n| allocatable(n, &res) == Some(GPUS))
                .count()
                >= count
        },
    )
    .await
    .with_context(|| format!("{count} nodes to advertise {resource}"))?;
    Ok(())
}

/// A node's allocatable count of `resource`.
pub fn allocatable(n: &Node, resource: &str) -> Option<i64> {
    saferollout_api::quantity_count(n.status.as_ref()?.allocatable.as_ref()?.get(resource)?)
}

pub fn image_of_template(ds: &DaemonSet) -> Option<&str> {
    ds.spec
        .template
        .spec
        .as_ref()?
        .containers
        .first()?
        .image
        .as_deref()
}

pub fn image_of_pod(p: &Pod) -> Option<&str> {
    p.spec.as_ref()?.containers.first()?.image.as_deref()
}

pub fn pod_ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// When the pod's Ready condition turned True (`None` while not Ready).
pub fn ready_since(p: &Pod) -> Option<jiff::Timestamp> {
    p.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Ready" && c.status == "True")?
        .last_transition_time
        .as_ref()
        .map(|t| t.0)
}

pub fn waiting_reason(p: &Pod) -> Option<&str> {
    p.status
        .as_ref()?
        .container_statuses
        .as_ref()?
        .first()?
        .state
        .as_ref()?
        .waiting
        .as_ref()?
        .reason
        .as_deref()
}

/// Patches the DaemonSet's pod template image (and, when given, its update
/// strategy) in one write; returns the new generation.
pub async fn set_daemonset(
    client: &Client,
    ns: &str,
    name: &str,
    template: Value,
    strategy: Option<Value>,
) -> anyhow::Result<i64> {
    let mut spec = json!({"template": template});
    if let Some(s) = strategy {
        spec["updateStrategy"] = s;
    }
    let ds = Api::<DaemonSet>::namespaced(client.clone(), ns)
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": spec})),
        )
        .await?;
    ds.metadata
        .generation
        .context("DaemonSet without generation")
}

pub async fn create_rollout(
    client: &Client,
    ns: &str,
    name: &str,
    spec: Value,
) -> anyhow::Result<()> {
    let sr: SafeRollout = serde_json::from_value(json!({
        "apiVersion": "saferollout.dev/v1alpha1", "kind": "SafeRollout",
        "metadata": {"name": name, "namespace": ns}, "spec": spec
    }))?;
    Api::<SafeRollout>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &sr)
        .await?;
    Ok(())
}

/// Whether the API server knows every field of `spec` (a strict server-side
/// dry run): `Err` carries its answer.
pub async fn rollout_spec_known(client: &Client, ns: &str, spec: Value) -> anyhow::Result<()> {
    let api: Api<SafeRollout> = Api::namespaced(client.clone(), ns);
    let params = PatchParams::apply("saferollout-bench")
        .dry_run()
        .validation_strict();
    api.patch(
        "bench-probe",
        &params,
        &Patch::Apply(json!({
            "apiVersion": "saferollout.dev/v1alpha1", "kind": "SafeRollout",
            "metadata": {"name": "bench-probe", "namespace": ns}, "spec": spec
        })),
    )
    .await?;
    Ok(())
}

pub async fn wait_rollout(
    client: &Client,
    ns: &str,
    name: &str,
    timeout: Duration,
    done: impl Fn(&SafeRolloutStatus) -> bool,
) -> anyhow::Result<SafeRolloutStatus> {
    let api: Api<SafeRollout> = Api::namespaced(client.clone(), ns);
    let sr = wait_for_object(&api, name, timeout, |sr| {
        sr.and_then(|s| s.status.as_ref()).is_some_and(&done)
    })
    .await
    .with_context(|| format!("SafeRollout {ns}/{name}"))?
    .context("exists")?;
    Ok(sr.status.unwrap_or_default())
}

/// Waits until the operator adopted the DaemonSet: Succeeded on a stable
/// revision, whose last-good backup exists.
pub async fn wait_adopted(
    client: &Client,
    ns: &str,
    name: &str,
    timeout: Duration,
) -> anyhow::Result<SafeRolloutStatus> {
    let st = wait_rollout(client, ns, name, timeout, |st| {
        st.phase == Some(Phase::Succeeded) && st.stable_revision.is_some()
    })
    .await?;
    let backup = format!(
        "{name}-last-good-{}",
        st.stable_revision.clone().unwrap_or_default()
    );
    let revisions: Api<ControllerRevision> = Api::namespaced(client.clone(), ns);
    wait_for_object(&revisions, &backup, timeout, |cr| cr.is_some()).await?;
    Ok(st)
}

/// Deletes `name`; false when it was not there.
async fn delete_if_present<K>(
    api: &Api<K>,
    name: &str,
    params: &DeleteParams,
) -> anyhow::Result<bool>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match api.delete(name, params).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// Deletes SafeRollout `name` and waits until it is gone (the operator gave
/// the DaemonSet back and removed its finalizer).
pub async fn delete_rollout(
    client: &Client,
    ns: &str,
    name: &str,
    timeout: Duration,
) -> anyhow::Result<()> {
    let api: Api<SafeRollout> = Api::namespaced(client.clone(), ns);
    if !delete_if_present(&api, name, &DeleteParams::default()).await? {
        return Ok(());
    }
    wait_for_object(&api, name, timeout, |sr| sr.is_none())
        .await
        .with_context(|| format!("SafeRollout {ns}/{name} to be deleted"))?;
    Ok(())
}

/// Deletes DaemonSet `name` (if there) and waits until no pod is left in `ns`.
pub async fn delete_daemonset_and_pods(
    client: &Client,
    ns: &str,
    name: &str,
    timeout: Duration,
) -> anyhow::Result<()> {
    let api: Api<DaemonSet> = Api::namespaced(client.clone(), ns);
    // Gone already or not, its pods may still be terminating.
    delete_if_present(&api, name, &DeleteParams::background()).await?;
    wait_for_all(
        &Api::<Pod>::namespaced(client.clone(), ns),
        watcher::Config::default(),
        timeout,
        |pods| pods.is_empty(),
    )
    .await
    .with_context(|| format!("the pods of DaemonSet {ns}/{name} to be gone"))?;
    Ok(())
}

/// Sets `labels` on nodes, `parallel` writes at a time.
pub async fn label_nodes(
    client: &Client,
    labels: Vec<(String, BTreeMap<String, String>)>,
    parallel: usize,
) -> anyhow::Result<()> {
    let patches = labels
        .into_iter()
        .map(|(node, l)| (node, json!({"metadata": {"labels": l}})))
        .collect();
    patch_nodes_metadata(client, patches, parallel, "labelling").await
}

/// Sends each node its metadata merge patch, `parallel` at a time; `doing`
/// names the write in errors.
async fn patch_nodes_metadata(
    client: &Client,
    patches: Vec<(String, Value)>,
    parallel: usize,
    doing: &str,
) -> anyhow::Result<()> {
    let api: Api<Node> = Api::all(client.clone());
    futures::stream::iter(patches)
        .map(|(node, patch)| {
            let api = api.clone();
            async move {
                api.patch_metadata(&node, &PatchParams::default(), &Patch::Merge(patch))
                    .await
                    .with_context(|| format!("{doing} node {node}"))
            }
        })
        .buffer_unordered(parallel)
        .try_collect::<Vec<_>>()
        .await?;
    Ok(())
}

/// Label patches in flight at once: as the operator's label writer
/// (`crates/operator/src/controller/labels.rs`).
const STAGE_LABEL_WRITES: usize = 32;

/// Writes the labels saferollout's first stage puts on each of `nodes`
/// (`saferollout.dev/stage: "0"`, `saferollout.dev/rollout: <rollout_id>`),
/// or with `None` removes them, with the operator's patch: a metadata merge
/// patch per node, [`STAGE_LABEL_WRITES`] in flight.
pub async fn write_stage_labels(
    client: &Client,
    nodes: &[String],
    rollout_id: Option<&str>,
) -> anyhow::Result<()> {
    let patch = match rollout_id {
        Some(id) => json!({"metadata": {"labels": {STAGE_LABEL: "0", ROLLOUT_LABEL: id}}}),
        None => json!({"metadata": {"labels": {STAGE_LABEL: null, ROLLOUT_LABEL: null}}}),
    };
    let patches = nodes
        .iter()
        .map(|node| (node.clone(), patch.clone()))
        .collect();
    patch_nodes_metadata(
        client,
        patches,
        STAGE_LABEL_WRITES,
        "writing the stage labels of",
    )
    .await
}

/// Names of every node, sorted as `up` numbers them.
pub async fn node_names(client: &Client) -> anyhow::Result<Vec<String>> {
    let mut names: Vec<String> = Api::<Node>::all(client.clone())
        .list_metadata(&Default::default())
        .await?
        .items
        .iter()
        .map(|n| n.name_any())
        .collect();
    names.sort_by_key(|n| {
        n.rsplit('-')
            .next()
            .and_then(|i| i.parse::<u64>().ok())
            .unwrap_or(u64::MAX)
    });
    Ok(names)
}

/// How long the API server takes to stream every node and every DaemonSet
/// pod (streaming lists, as the operator's caches start: the same two
/// largest sets) to a client that only reads the bytes, both at once. The
/// floor of the operator's start-up on this machine: what is left of its
/// start-up above it is the operator's own (decoding, caches, the first pass).
pub async fn stream_floor(client: &Client) -> anyhow::Result<f64> {
    use futures::AsyncBufReadExt;
    let query = "watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true";
    let read = |path: String| async move {
        let request = http::Request::get(&path).body(Vec::new())?;
        let mut lines = client.request_stream(request).await?.lines();
        while let Some(line) = lines.next().await {
            if line?.contains("k8s.io/initial-events-end") {
                return anyhow::Ok(());
            }
        }
        anyhow::bail!("{path}: the stream ended before its initial events did")
    };
    let started = std::time::Instant::now();
    futures::try_join!(
        read(format!("/api/v1/nodes?{query}")),
        read(format!(
            "/api/v1/pods?labelSelector=controller-revision-hash&{query}"
        )),
    )?;
    Ok(started.elapsed().as_secs_f64())
}
