//! The `Selector` rollout strategy's mechanics against the real DaemonSet
//! controller (kube-controller-manager v1.37.2), without the operator, built
//! from the objects the operator writes (`saferollout_core::selector::objects`:
//! the canary DaemonSet, the target's template with and without its handover
//! expression, a released pod's labels, the canary's nudge).
//!
//! The target DaemonSet T is made `OnDelete` and given the target's handover
//! expression (`<key> NotIn [drain, new]`); a canary DaemonSet C runs the new
//! template where the node's handover label is `surge` or `new`. The one
//! label's states move the agent from T to C node by node (break before
//! make: `drain`, then `new`; make before break: `surge`, then `new`).
//! Promotion hands every pod C made to T without deleting or creating one:
//!
//! 1. taint every node `saferollout.dev/promoting=<rollout>:NoSchedule`, and
//!    see the DaemonSet controller's node cache hold the taints (C's status:
//!    desiredNumberScheduled 0, numberMisscheduled N: C is poked to sync, a
//!    NoSchedule taint alone enqueues no DaemonSet: `syncNodeUpdate`);
//! 2. write T's template := the new template (T makes a new ControllerRevision);
//! 3. delete C with propagationPolicy Orphan (the garbage collector strips C's
//!    ownerReference from its pods and ControllerRevisions);
//! 4. T adopts the orphans (`ClaimPods`) and, the nodes tainted, keeps them;
//! 5. relabel each pod: T's new `controller-revision-hash`, no canary label, no
//!    `pod-template-generation`;
//! 6. remove the taints and the two node labels, restore T's update strategy.
//!
//! Every test watches the namespace's pods from before the rollout and judges
//! from that event stream; waits are watches with deadlines.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::{ControllerRevision, DaemonSet, DaemonSetUpdateStrategy};
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod, Taint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{
    Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, PropagationPolicy, WatchEvent,
    WatchParams,
};
use kube::runtime::watcher;
use saferollout_core::handover::HandoverState;
use saferollout_core::selector::{self, objects};
use saferollout_testkit::{cluster, kubectl, wait_for_all, wait_for_object};
use serde_json::{Value, json};

const NODES: usize = 4;
const TIMEOUT: Duration = Duration::from_secs(90);
const TARGET: &str = "agent";
const OLD_IMAGE: &str = "registry.example/agent:v1";
const NEW_IMAGE: &str = "registry.example/agent:v2";
const CANARY: &str = selector::CANARY_OF_LABEL;
const PROMOTING: &str = "saferollout.dev/promoting";
const HASH: &str = "controller-revision-hash";
const TEMPLATE_GENERATION: &str = objects::TEMPLATE_GENERATION_LABEL;

/// The tests label and taint every node: one at a time.
static NODE_STATE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn node_names() -> Vec<String> {
    (0..NODES).map(|i| format!("sim-gpu-{i}")).collect()
}

/// The rollout's handover label key on nodes.
fn handover_key(rollout: &str) -> String {
    selector::handover_label_key(rollout)
}

/// The canary's name (each test has its own namespace).
fn canary_name() -> String {
    selector::canary_name(TARGET)
}

/// The agent's pod template: plain pods (no sim label), which KWOK makes
/// Ready at once.
fn template(image: &str) -> Value {
    json!({
        "metadata": {"labels": {"app": TARGET}, "annotations": {"agent.example/image": image}},
        "spec": {"containers": [{"name": "agent", "image": image}]}
    })
}

fn target_daemonset() -> DaemonSet {
    serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "DaemonSet",
        "metadata": {"name": TARGET},
        "spec": {
            "selector": {"matchLabels": {"app": TARGET}},
            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}},
            "template": template(OLD_IMAGE)
        }
    }))
    .unwrap()
}

/// C as the operator creates it for T (owned by `owner`, a stand-in for
/// the SafeRollout).
fn canary_daemonset(t: &DaemonSet, rollout: &str, owner: OwnerReference) -> DaemonSet {
    objects::canary_daemonset(
        t,
        &template(NEW_IMAGE),
        &handover_key(rollout),
        rollout,
        owner,
    )
    .expect("T has matchLabels")
}

// ---------------------------------------------------------------------------
// Small accessors.

fn name(p: &Pod) -> String {
    p.metadata.name.clone().unwrap_or_default()
}

fn uid(p: &Pod) -> String {
    p.metadata.uid.clone().unwrap_or_default()
}

fn node_of(p: &Pod) -> &str {
    p.spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .unwrap_or("")
}

/// The node a DaemonSet pod is for: its nodeName once bound, before that the
/// node its affinity's `metadata.name` field names (`GetTargetNodeName`).
fn target_node(p: &Pod) -> String {
    if !node_of(p).is_empty() {
        return node_of(p).to_owned();
    }
    p.spec
        .as_ref()
        .and_then(|s| s.affinity.as_ref()?.node_affinity.as_ref())
        .and_then(|a| {
            a.required_during_scheduling_ignored_during_execution
                .as_ref()
        })
        .and_then(|r| {
            r.node_selector_terms
                .first()?
                .match_fields
                .as_ref()?
                .first()
        })
        .and_then(|f| f.values.as_ref()?.first().cloned())
        .unwrap_or_default()
}

fn owner_uid(p: &Pod) -> Option<&str> {
    p.metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true))
        .map(|o| o.uid.as_str())
}

fn image(p: &Pod) -> &str {
    p.spec
        .as_ref()
        .and_then(|s| s.containers.first())
        .and_then(|c| c.image.as_deref())
        .unwrap_or("")
}

fn label<'a>(p: &'a Pod, key: &str) -> Option<&'a str> {
    p.metadata.labels.as_ref()?.get(key).map(String::as_str)
}

fn ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

fn terminating(p: &Pod) -> bool {
    p.metadata.deletion_timestamp.is_some()
}

fn ds_uid(ds: &DaemonSet) -> String {
    ds.metadata.uid.clone().unwrap_or_default()
}

/// (desired, current, updated, available, misscheduled, observedGeneration current)
fn ds_status(ds: &DaemonSet) -> (i32, i32, i32, i32, i32, bool) {
    let s = ds.status.clone().unwrap_or_default();
    (
        s.desired_number_scheduled,
        s.current_number_scheduled,
        s.updated_number_scheduled.unwrap_or(0),
        s.number_available.unwrap_or(0),
        s.number_misscheduled,
        s.observed_generation.is_some() && s.observed_generation == ds.metadata.generation,
    )
}

// ---------------------------------------------------------------------------
// The pods' event stream.

#[derive(Clone, Debug)]
struct Seen {
    kind: &'static str,
    pod: Pod,
}

/// Every watch event of a namespace's pods, in the API server's order, from
/// a list's resourceVersion on (one watch, re-opened from the last version
/// it saw when the server ends it).
struct Recorder {
    events: Arc<Mutex<Vec<Seen>>>,
    failed: Arc<Mutex<Option<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Recorder {
    async fn start(pods: &Api<Pod>) -> anyhow::Result<Self> {
        let list = pods.list(&ListParams::default()).await?;
        anyhow::ensure!(list.items.is_empty(), "the namespace has pods already");
        let mut rv = list.metadata.resource_version.unwrap_or_default();
        let events: Arc<Mutex<Vec<Seen>>> = Arc::default();
        let failed: Arc<Mutex<Option<String>>> = Arc::default();
        let (pods, ev, fail) = (pods.clone(), events.clone(), failed.clone());
        let task = tokio::spawn(async move {
            loop {
                let wp = WatchParams::default().timeout(280);
                let stream = match pods.watch(&wp, &rv).await {
                    Ok(s) => s,
                    Err(e) => {
                        *fail.lock().unwrap() = Some(format!("watch: {e}"));
                        return;
                    }
                };
                let mut stream = stream.boxed();
                loop {
                    let e = match stream.try_next().await {
                        Ok(Some(e)) => e,
                        Ok(None) => break,
                        Err(e) => {
                            *fail.lock().unwrap() = Some(format!("watch stream: {e}"));
                            return;
                        }
                    };
                    let (kind, pod) = match e {
                        WatchEvent::Added(p) => ("Added", p),
                        WatchEvent::Modified(p) => ("Modified", p),
                        WatchEvent::Deleted(p) => ("Deleted", p),
                        WatchEvent::Bookmark(b) => {
                            rv = b.metadata.resource_version;
                            continue;
                        }
                        WatchEvent::Error(s) => {
                            // A 410 would lose events: the test fails.
                            *fail.lock().unwrap() = Some(format!("watch error: {s:?}"));
                            return;
                        }
                    };
                    rv = pod.metadata.resource_version.clone().unwrap_or_default();
                    ev.lock().unwrap().push(Seen { kind, pod });
                }
            }
        });
        Ok(Self {
            events,
            failed,
            task,
        })
    }

    fn len(&self) -> usize {
        self.events.lock().unwrap().len()
    }

    fn since(&self, from: usize) -> Vec<Seen> {
        self.events.lock().unwrap()[from..].to_vec()
    }

    /// Returns once the recorder has every event the API server had sent
    /// when this was called: it writes a marker annotation on `pod` and waits
    /// for that write's event (a watch delivers a resource's events in order).
    async fn catch_up(&self, pods: &Api<Pod>, pod: &str) -> anyhow::Result<()> {
        let marker = format!("{:?}", Instant::now());
        let patch = json!({"metadata": {"annotations": {"spike.saferollout.dev/marker": marker}}});
        let written = pods
            .patch(pod, &PatchParams::default(), &Patch::Merge(patch))
            .await?;
        let rv = written.metadata.resource_version.unwrap_or_default();
        let deadline = Instant::now() + TIMEOUT;
        loop {
            if let Some(f) = self.failed.lock().unwrap().clone() {
                anyhow::bail!("the pods recorder failed: {f}");
            }
            if self
                .events
                .lock()
                .unwrap()
                .iter()
                .rev()
                .any(|s| s.pod.metadata.resource_version.as_deref() == Some(rv.as_str()))
            {
                return Ok(());
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "the recorder never saw resourceVersion {rv}"
            );
            // Polling a local Vec the watch task fills, not the cluster.
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Recorder {
    /// Waits until the recorded events satisfy `f`.
    async fn until(&self, f: impl Fn(&[Seen]) -> bool) -> anyhow::Result<()> {
        let deadline = Instant::now() + TIMEOUT;
        loop {
            if let Some(e) = self.failed.lock().unwrap().clone() {
                anyhow::bail!("the pods recorder failed: {e}");
            }
            if f(&self.events.lock().unwrap()) {
                return Ok(());
            }
            anyhow::ensure!(Instant::now() < deadline, "the recorder never saw it");
            // Polling a local Vec the watch task fills, not the cluster.
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Pod UIDs created (Added) in these events, with their node and owner.
fn created(events: &[Seen]) -> Vec<(String, String, Option<String>)> {
    events
        .iter()
        .filter(|s| s.kind == "Added")
        .map(|s| {
            (
                uid(&s.pod),
                target_node(&s.pod),
                owner_uid(&s.pod).map(str::to_owned),
            )
        })
        .collect()
}

/// Index of the first event for `pod_uid` satisfying `f`.
fn first(events: &[Seen], pod_uid: &str, f: impl Fn(&Seen) -> bool) -> Option<usize> {
    events.iter().position(|s| uid(&s.pod) == pod_uid && f(s))
}

// ---------------------------------------------------------------------------
// Cluster writes.

/// Removes every label and taint the tests put on nodes, when dropped.
struct NodeCleanup;

impl Drop for NodeCleanup {
    fn drop(&mut self) {
        let kc = cluster().kubeconfig().to_path_buf();
        let Ok(nodes) = kubectl(&kc, &["get", "nodes", "-o", "json"]) else {
            return;
        };
        let nodes: Value = serde_json::from_str(&nodes).unwrap_or_default();
        for n in nodes["items"].as_array().into_iter().flatten() {
            let node = n["metadata"]["name"].as_str().unwrap_or_default();
            for key in n["metadata"]["labels"].as_object().into_iter().flatten() {
                if key.0.starts_with("saferollout.dev/")
                    || key.0.starts_with(selector::HANDOVER_LABEL_PREFIX)
                {
                    let _ = kubectl(&kc, &["label", "node", node, &format!("{}-", key.0)]);
                }
            }
            if n["spec"]["taints"]
                .as_array()
                .is_some_and(|ts| ts.iter().any(|t| t["key"] == PROMOTING))
            {
                let _ = kubectl(&kc, &["taint", "node", node, &format!("{PROMOTING}-")]);
            }
        }
    }
}

async fn set_node_label(
    nodes: &Api<Node>,
    node: &str,
    key: &str,
    value: Option<&str>,
) -> anyhow::Result<()> {
    let patch = json!({"metadata": {"labels": {key: value}}});
    nodes
        .patch(node, &PatchParams::default(), &Patch::Merge(patch))
        .await?;
    Ok(())
}

/// Writes a node's handover label (`Old`: removes it).
async fn set_handover(
    nodes: &Api<Node>,
    node: &str,
    rollout: &str,
    state: HandoverState,
) -> anyhow::Result<()> {
    set_node_label(nodes, node, &handover_key(rollout), state.label_value()).await
}

/// Adds (`Some(value)`) or removes the promoting taint: read, change, replace,
/// again on a conflict (KWOK and the sim write nodes too).
async fn set_promoting_taint(
    nodes: &Api<Node>,
    node: &str,
    value: Option<&str>,
) -> anyhow::Result<()> {
    for _ in 0..20 {
        let mut n = nodes.get(node).await?;
        let spec = n.spec.get_or_insert_with(Default::default);
        let mut taints: Vec<Taint> = spec.taints.take().unwrap_or_default();
        taints.retain(|t| t.key != PROMOTING);
        if let Some(v) = value {
            taints.push(Taint {
                key: PROMOTING.into(),
                value: Some(v.into()),
                effect: "NoSchedule".into(),
                time_added: None,
            });
        }
        spec.taints = (!taints.is_empty()).then_some(taints);
        match nodes.replace(node, &PostParams::default(), &n).await {
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(e)) if e.code == 409 => continue,
            Err(e) => return Err(e.into()),
        }
    }
    anyhow::bail!("{node}: 20 conflicts in a row")
}

/// Read, change, replace a DaemonSet, again on a conflict (the controller
/// writes its status).
async fn modify_ds(
    dss: &Api<DaemonSet>,
    name: &str,
    f: impl Fn(&mut DaemonSet),
) -> anyhow::Result<DaemonSet> {
    for _ in 0..20 {
        let mut ds = dss.get(name).await?;
        f(&mut ds);
        match dss.replace(name, &PostParams::default(), &ds).await {
            Ok(ds) => return Ok(ds),
            Err(kube::Error::Api(e)) if e.code == 409 => continue,
            Err(e) => return Err(e.into()),
        }
    }
    anyhow::bail!("{name}: 20 conflicts in a row")
}

async fn wait_ds(
    dss: &Api<DaemonSet>,
    name: &str,
    f: impl Fn(&DaemonSet) -> bool,
) -> anyhow::Result<DaemonSet> {
    Ok(wait_for_object(dss, name, TIMEOUT, |d| d.is_some_and(&f))
        .await?
        .expect("waited for a present object"))
}

async fn wait_pods(
    pods: &Api<Pod>,
    f: impl Fn(&[Arc<Pod>]) -> bool,
) -> anyhow::Result<Vec<Arc<Pod>>> {
    wait_for_all(pods, watcher::Config::default(), TIMEOUT, f).await
}

/// Pods owned by `owner`, not terminating, on `node`.
fn owned_on<'a>(ps: &'a [Arc<Pod>], owner: &str, node: &str) -> Vec<&'a Arc<Pod>> {
    ps.iter()
        .filter(|p| owner_uid(p) == Some(owner) && node_of(p) == node && !terminating(p))
        .collect()
}

/// Waits until T (`owner`) runs one Ready pod of `image` on every node.
async fn wait_every_node_ready(
    pods: &Api<Pod>,
    owner: &str,
    image_: &str,
) -> anyhow::Result<Vec<Arc<Pod>>> {
    wait_pods(pods, |ps| {
        node_names().iter().all(|n| {
            let on = owned_on(ps, owner, n);
            on.len() == 1 && ready(on[0]) && image(on[0]) == image_
        })
    })
    .await
}

/// Creates T, waits for its pods, and returns it.
async fn start_target(dss: &Api<DaemonSet>, pods: &Api<Pod>) -> anyhow::Result<DaemonSet> {
    let t = dss
        .create(&PostParams::default(), &target_daemonset())
        .await?;
    wait_every_node_ready(pods, &ds_uid(&t), OLD_IMAGE).await?;
    let t = wait_ds(dss, TARGET, |d| {
        let (desired, _, updated, available, _, observed) = ds_status(d);
        observed && desired == NODES as i32 && updated == desired && available == desired
    })
    .await?;
    Ok(t)
}

/// Makes T `OnDelete` with the target's handover expression; returns T's
/// original update strategy.
async fn prepare_target(
    dss: &Api<DaemonSet>,
    rollout: &str,
) -> anyhow::Result<DaemonSetUpdateStrategy> {
    let original = dss.get(TARGET).await?.spec.update_strategy.unwrap();
    let key = handover_key(rollout);
    modify_ds(dss, TARGET, |ds| {
        let spec = &mut ds.spec;
        spec.update_strategy = Some(serde_json::from_value(json!({"type": "OnDelete"})).unwrap());
        let current = serde_json::to_value(&spec.template).unwrap();
        spec.template =
            serde_json::from_value(objects::target_template(&current, &key, true)).unwrap();
    })
    .await?;
    wait_ds(dss, TARGET, |d| ds_status(d).5).await?;
    Ok(original)
}

/// Creates C, owned by a ConfigMap standing in for the SafeRollout (an
/// owner must exist, or the garbage collector deletes C).
async fn start_canary(dss: &Api<DaemonSet>, rollout: &str) -> anyhow::Result<DaemonSet> {
    let ns = dss
        .get(TARGET)
        .await?
        .metadata
        .namespace
        .unwrap_or_default();
    let cms: Api<ConfigMap> = Api::namespaced(cluster().client().await?, &ns);
    let stand_in = ConfigMap {
        metadata: kube::api::ObjectMeta {
            name: Some(format!("rollout-{rollout}")),
            ..Default::default()
        },
        ..Default::default()
    };
    let stand_in = cms.create(&PostParams::default(), &stand_in).await?;
    let owner = OwnerReference {
        api_version: "v1".into(),
        kind: "ConfigMap".into(),
        name: stand_in.metadata.name.clone().unwrap_or_default(),
        uid: stand_in.metadata.uid.clone().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    };
    let t = dss.get(TARGET).await?;
    dss.create(
        &PostParams::default(),
        &canary_daemonset(&t, rollout, owner),
    )
    .await?;
    wait_ds(dss, &canary_name(), |d| ds_status(d).5).await
}

/// Break before make on one node: `drain`, T's pod gone, then `new`, C's
/// pod Ready.
async fn move_break_before_make(
    nodes: &Api<Node>,
    pods: &Api<Pod>,
    rollout: &str,
    node: &str,
    t: &str,
    c: &str,
) -> anyhow::Result<()> {
    set_handover(nodes, node, rollout, HandoverState::Drain).await?;
    wait_gone_from(pods, t, node).await?;
    set_handover(nodes, node, rollout, HandoverState::New).await?;
    wait_ready_on(pods, c, node).await
}

/// Make before break on one node: `surge`, C's pod Ready beside T's, then
/// `new`, T's pod gone.
async fn move_make_before_break(
    nodes: &Api<Node>,
    pods: &Api<Pod>,
    rollout: &str,
    node: &str,
    t: &str,
    c: &str,
) -> anyhow::Result<()> {
    set_handover(nodes, node, rollout, HandoverState::Surge).await?;
    wait_ready_on(pods, c, node).await?;
    set_handover(nodes, node, rollout, HandoverState::New).await?;
    wait_gone_from(pods, t, node).await
}

/// Waits until no pod of `owner` is left on `node`: gone from the API, not
/// just terminating.
async fn wait_gone_from(pods: &Api<Pod>, owner: &str, node: &str) -> anyhow::Result<()> {
    wait_pods(pods, |ps| {
        !ps.iter()
            .any(|p| owner_uid(p) == Some(owner) && node_of(p) == node)
    })
    .await?;
    Ok(())
}

/// Waits until `owner` has exactly one pod on `node`, and it is Ready.
async fn wait_ready_on(pods: &Api<Pod>, owner: &str, node: &str) -> anyhow::Result<()> {
    wait_pods(pods, |ps| {
        let on = owned_on(ps, owner, node);
        on.len() == 1 && ready(on[0])
    })
    .await?;
    Ok(())
}

/// The template as the API server stores it for the new release (defaults
/// filled in): a server-side dry run of a DaemonSet with it.
async fn stored_new_template(dss: &Api<DaemonSet>) -> anyhow::Result<Value> {
    let mut probe = target_daemonset();
    probe.metadata.name = Some("dry-run-probe".into());
    probe.spec.template = serde_json::from_value(template(NEW_IMAGE))?;
    let pp = PostParams {
        dry_run: true,
        ..Default::default()
    };
    let stored = dss.create(&pp, &probe).await?;
    Ok(serde_json::to_value(stored.spec.template)?)
}

/// T's current ControllerRevision hash: the newest revision T controls.
async fn current_hash(
    crs: &Api<ControllerRevision>,
    t: &str,
) -> anyhow::Result<(String, Vec<ControllerRevision>)> {
    let all = crs.list(&ListParams::default()).await?.items;
    let owned: Vec<ControllerRevision> = all
        .iter()
        .filter(|cr| {
            cr.metadata
                .owner_references
                .iter()
                .flatten()
                .any(|o| o.controller == Some(true) && o.uid == t)
        })
        .cloned()
        .collect();
    let newest = owned
        .iter()
        .max_by_key(|cr| cr.revision)
        .and_then(|cr| cr.metadata.labels.as_ref()?.get(HASH).cloned())
        .ok_or_else(|| anyhow::anyhow!("T controls no labelled ControllerRevision"))?;
    Ok((newest, all))
}

/// Pokes C (an annotation: any DaemonSet update enqueues it) until its status
/// shows every node tainted: the DaemonSet controller's node cache then holds
/// every taint, for every later sync of T too (one shared node informer).
/// A NoSchedule taint alone enqueues no DaemonSet that keeps its pods
/// (`syncNodeUpdate`), so C's status would otherwise stay as it was.
async fn witness_taints(dss: &Api<DaemonSet>, canary: &str) -> anyhow::Result<u32> {
    let deadline = Instant::now() + TIMEOUT;
    for poke in 1.. {
        let patch = objects::nudge_patch(&poke.to_string());
        dss.patch(canary, &PatchParams::default(), &Patch::Merge(patch))
            .await?;
        let seen = wait_for_object(dss, canary, Duration::from_secs(3), |d| {
            d.is_some_and(|d| {
                let (desired, _, _, _, misscheduled, _) = ds_status(d);
                desired == 0 && misscheduled == NODES as i32
            })
        })
        .await;
        if seen.is_ok() {
            return Ok(poke);
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "C's status never showed the taints"
        );
    }
    unreachable!()
}

/// The steps' wall times.
#[derive(Debug, Default)]
struct Timings(Vec<(&'static str, Duration)>);

impl Timings {
    fn step(&mut self, what: &'static str, since: &mut Instant) {
        self.0.push((what, since.elapsed()));
        *since = Instant::now();
    }
}

struct Promotion {
    hash: String,
    pokes: u32,
    timings: Timings,
    revisions_after_handover: Vec<ControllerRevision>,
}

/// How C's pods pass to T.
#[derive(Clone, Copy, Debug)]
enum Handover {
    /// Delete C with propagationPolicy Orphan, T adopts, then relabel.
    OrphanDelete,
    /// Relabel under the taint: C releases, T adopts, then delete C.
    Release,
}

/// The promotion, steps 1 to 6 (see the module's documentation).
async fn promote(
    dss: &Api<DaemonSet>,
    pods: &Api<Pod>,
    nodes: &Api<Node>,
    crs: &Api<ControllerRevision>,
    rollout: &str,
    original_strategy: &DaemonSetUpdateStrategy,
    handover: Handover,
) -> anyhow::Result<Promotion> {
    let canary = canary_name();
    let t_uid = ds_uid(&dss.get(TARGET).await?);
    let mut timings = Timings::default();
    let mut at = Instant::now();

    // 1. Taint, and see the controller's node cache hold the taints.
    for n in node_names() {
        set_promoting_taint(nodes, &n, Some(rollout)).await?;
    }
    let pokes = witness_taints(dss, &canary).await?;
    timings.step("1 taint + witness", &mut at);

    // 2. T's template := C's, without the strategy's additions (the
    // canary's expression and label, T's expression), still OnDelete.
    let key = handover_key(rollout);
    let canary_template = serde_json::to_value(dss.get(&canary).await?.spec.template)?;
    let new_template = objects::target_template(&canary_template, &key, false);
    let t = modify_ds(dss, TARGET, |ds| {
        ds.spec.template = serde_json::from_value(new_template.clone()).unwrap();
    })
    .await?;
    let generation = t.metadata.generation;
    wait_ds(dss, TARGET, |d| {
        d.status.as_ref().and_then(|s| s.observed_generation) >= generation
    })
    .await?;
    let (hash, _) = current_hash(crs, &t_uid).await?;
    timings.step("2 template + revision", &mut at);

    let relabel = objects::release_patch(&hash);
    let revisions_after_handover;
    match handover {
        Handover::OrphanDelete => {
            // 3. Delete C, orphaning its pods.
            let dp = DeleteParams {
                propagation_policy: Some(PropagationPolicy::Orphan),
                ..Default::default()
            };
            dss.delete(&canary, &dp).await?;
            wait_for_object(dss, &canary, TIMEOUT, |d| d.is_none()).await?;
            timings.step("3 orphan-delete C", &mut at);
            revisions_after_handover = current_hash(crs, &t_uid).await?.1;

            // 4. T adopts every pod.
            wait_pods(pods, |ps| {
                ps.len() == NODES && ps.iter().all(|p| owner_uid(p) == Some(t_uid.as_str()))
            })
            .await?;
            timings.step("4 adoption", &mut at);

            // 5. Relabel the pods as T's current revision.
            for p in pods.list(&ListParams::default()).await? {
                pods.patch(&name(&p), &PatchParams::default(), &Patch::Merge(&relabel))
                    .await?;
            }
            timings.step("5 relabel", &mut at);
        }
        Handover::Release => {
            // 3'. Relabel while C owns them: without the canary label C's
            // selector no longer matches, C releases them (ClaimObject) and,
            // the nodes tainted, makes none; T adopts them.
            for p in pods.list(&ListParams::default()).await? {
                pods.patch(&name(&p), &PatchParams::default(), &Patch::Merge(&relabel))
                    .await?;
            }
            timings.step("3' relabel (C releases)", &mut at);
            wait_pods(pods, |ps| {
                ps.len() == NODES && ps.iter().all(|p| owner_uid(p) == Some(t_uid.as_str()))
            })
            .await?;
            timings.step("4' adoption", &mut at);
            // 5'. C has no pods left: delete it in the background, its
            // ControllerRevisions with it.
            dss.delete(&canary, &DeleteParams::background()).await?;
            wait_for_object(dss, &canary, TIMEOUT, |d| d.is_none()).await?;
            let canary_revisions = format!("{CANARY}={rollout}");
            wait_for_all(
                crs,
                watcher::Config::default().labels(&canary_revisions),
                TIMEOUT,
                |rs| rs.is_empty(),
            )
            .await?;
            timings.step("5' delete C + its revisions", &mut at);
            revisions_after_handover = current_hash(crs, &t_uid).await?.1;
        }
    }

    // 6. Untaint: T counts its pods as scheduled and updated.
    for n in node_names() {
        set_promoting_taint(nodes, &n, None).await?;
    }
    wait_ds(dss, TARGET, |d| {
        let (desired, current, updated, available, misscheduled, observed) = ds_status(d);
        observed
            && desired == NODES as i32
            && current == desired
            && updated == desired
            && available == desired
            && misscheduled == 0
    })
    .await?;
    for n in node_names() {
        set_handover(nodes, &n, rollout, HandoverState::Old).await?;
    }
    let strategy = original_strategy.clone();
    let t = modify_ds(dss, TARGET, |ds| {
        ds.spec.update_strategy = Some(strategy.clone());
    })
    .await?;
    let generation = t.metadata.generation;
    wait_ds(dss, TARGET, |d| {
        d.status.as_ref().and_then(|s| s.observed_generation) >= generation
    })
    .await?;
    timings.step("6 untaint + unlabel + strategy", &mut at);

    Ok(Promotion {
        hash,
        pokes,
        timings,
        revisions_after_handover,
    })
}

fn revision_summary(crs: &[ControllerRevision]) -> Vec<String> {
    crs.iter()
        .map(|cr| {
            let owner = cr
                .metadata
                .owner_references
                .iter()
                .flatten()
                .map(|o| o.name.clone())
                .collect::<Vec<_>>();
            format!(
                "{} rev {:?} owners {owner:?}",
                cr.metadata.name.as_deref().unwrap_or(""),
                cr.revision
            )
        })
        .collect()
}

// ---------------------------------------------------------------------------
// Tests.

#[tokio::test]
async fn promotion_hands_every_pod_to_the_target_without_a_restart() -> anyhow::Result<()> {
    promotion(Handover::OrphanDelete, "selector-promote", "ra").await
}

/// The same promotion, C's pods passed to T by release instead of the
/// garbage collector's orphaning.
#[tokio::test]
async fn promotion_by_release_hands_every_pod_to_the_target_without_a_restart() -> anyhow::Result<()>
{
    promotion(Handover::Release, "selector-release", "rr").await
}

async fn promotion(handover: Handover, prefix: &str, rollout: &str) -> anyhow::Result<()> {
    let _serial = NODE_STATE.lock().await;
    let _clean = NodeCleanup;
    // `_ns` keeps the namespace until the test ends.
    let Setup {
        ns: _ns,
        dss,
        pods,
        crs,
        nodes,
    } = setup(prefix).await?;
    let rec = Recorder::start(&pods).await?;

    let t = start_target(&dss, &pods).await?;
    let t_uid = ds_uid(&t);
    let original = prepare_target(&dss, rollout).await?;
    let rollout_from = rec.len();
    let cds = start_canary(&dss, rollout).await?;
    let c_uid = ds_uid(&cds);
    let rollout_started = Instant::now();
    for n in node_names() {
        move_break_before_make(&nodes, &pods, rollout, &n, &t_uid, &c_uid).await?;
    }
    let rollout_took = rollout_started.elapsed();
    let canary_pods = pods.list(&ListParams::default()).await?.items;
    rec.catch_up(&pods, &name(&canary_pods[0])).await?;
    let promotion_from = rec.len();

    let promotion = promote(&dss, &pods, &nodes, &crs, rollout, &original, handover).await?;
    let last = pods.list(&ListParams::default()).await?.items;
    rec.catch_up(&pods, &name(&last[0])).await?;
    eprintln!(
        "{handover:?}: rollout of {NODES} nodes (break before make): {rollout_took:?}; promotion steps: {:?}; pokes until C's status showed the taints: {}",
        promotion.timings.0, promotion.pokes
    );
    eprintln!(
        "{handover:?}: ControllerRevisions right after the handover: {:#?}",
        revision_summary(&promotion.revisions_after_handover)
    );

    // One creation per node during the rollout, each by C; none since.
    let during_rollout = rec.since(rollout_from);
    let creations = created(&during_rollout);
    assert_eq!(creations.len(), NODES, "{creations:?}");
    let per_node: BTreeSet<&str> = creations.iter().map(|(_, n, _)| n.as_str()).collect();
    assert_eq!(per_node.len(), NODES, "{creations:?}");
    assert!(
        creations
            .iter()
            .all(|(_, _, o)| o.as_deref() == Some(c_uid.as_str())),
        "{creations:?}"
    );
    let during_promotion = rec.since(promotion_from);
    assert!(created(&during_promotion).is_empty());
    let deleted: Vec<_> = during_promotion
        .iter()
        .filter(|s| s.kind == "Deleted" || terminating(&s.pod))
        .map(|s| name(&s.pod))
        .collect();
    assert!(deleted.is_empty(), "pods deleted in promotion: {deleted:?}");

    // Every pod is the one C made, owned by T, labelled as T's revision.
    let made: BTreeSet<String> = creations.iter().map(|(u, _, _)| u.clone()).collect();
    let now: BTreeSet<String> = last.iter().map(uid).collect();
    assert_eq!(made, now);
    for p in &last {
        assert_eq!(owner_uid(p), Some(t_uid.as_str()), "{p:?}");
        assert_eq!(label(p, HASH), Some(promotion.hash.as_str()));
        assert_eq!(label(p, CANARY), None);
        assert_eq!(label(p, TEMPLATE_GENERATION), None);
        assert!(ready(p) && image(p) == NEW_IMAGE, "{p:?}");
        let owners = p.metadata.owner_references.as_ref().map_or(0, Vec::len);
        assert_eq!(owners, 1, "{:?}", p.metadata.owner_references);
    }

    // T: the new template exactly, its strategy back, its status whole.
    let t = dss.get(TARGET).await?;
    let spec = t.spec.clone();
    assert_eq!(
        serde_json::to_value(&spec.template)?,
        stored_new_template(&dss).await?
    );
    assert_eq!(spec.update_strategy.as_ref(), Some(&original));
    let (desired, current, updated, available, misscheduled, observed) = ds_status(&t);
    assert!(observed, "{:?}", t.status);
    assert_eq!(
        (desired, current, updated, available, misscheduled),
        (4, 4, 4, 4, 0)
    );
    assert!(dss.get_opt(&canary_name()).await?.is_none());
    for n in nodes.list(&ListParams::default()).await? {
        let labels = n.metadata.labels.clone().unwrap_or_default();
        assert!(
            !labels.keys().any(|k| k.starts_with("saferollout.dev/")
                || k.starts_with(selector::HANDOVER_LABEL_PREFIX)),
            "{labels:?}"
        );
        let taints = n.spec.and_then(|s| s.taints).unwrap_or_default();
        assert!(!taints.iter().any(|t| t.key == PROMOTING), "{taints:?}");
    }

    // T behaves normally afterwards: a deleted pod comes back as the new
    // template, with the pod-level affinity C's pods had.
    let victim = last
        .iter()
        .find(|p| node_of(p) == "sim-gpu-0")
        .unwrap()
        .clone();
    pods.delete(&name(&victim), &Default::default()).await?;
    let after = wait_pods(&pods, |ps| {
        let on = owned_on(ps, &t_uid, "sim-gpu-0");
        ps.len() == NODES && on.len() == 1 && uid(on[0]) != uid(&victim) && ready(on[0])
    })
    .await?;
    let fresh = owned_on(&after, &t_uid, "sim-gpu-0")[0].clone();
    assert_eq!(image(&fresh), NEW_IMAGE);
    assert_eq!(label(&fresh, HASH), Some(promotion.hash.as_str()));
    let (vs, fs) = (victim.spec.clone().unwrap(), fresh.spec.clone().unwrap());
    assert_eq!(vs.affinity, fs.affinity, "C's pod vs T's fresh pod");
    assert_eq!(vs.tolerations, fs.tolerations);
    assert_eq!(vs.containers[0].image, fs.containers[0].image);
    eprintln!(
        "fresh pod's labels {:?}; adopted pods' labels {:?}",
        fresh.metadata.labels, victim.metadata.labels
    );
    wait_ds(&dss, TARGET, |d| {
        let (desired, _, updated, available, _, observed) = ds_status(d);
        observed && desired == 4 && updated == 4 && available == 4
    })
    .await?;
    let (_, revisions) = current_hash(&crs, &t_uid).await?;
    eprintln!(
        "ControllerRevisions at the end: {:#?}",
        revision_summary(&revisions)
    );
    // C's revisions: orphaned with C, they match T's selector (their labels
    // are C's template labels) and T adopts them (controlledHistories) as
    // old history; released pods leave C to be deleted with its revisions.
    let canary_revisions: Vec<_> = revisions
        .iter()
        .filter(|cr| {
            cr.metadata
                .labels
                .as_ref()
                .is_some_and(|l| l.get(CANARY).map(String::as_str) == Some(rollout))
        })
        .collect();
    match handover {
        Handover::OrphanDelete => {
            assert_eq!(canary_revisions.len(), 1, "{canary_revisions:?}");
            let owner = canary_revisions[0].metadata.owner_references.as_ref();
            assert!(
                owner.is_some_and(|o| o.iter().any(|o| o.uid == t_uid)),
                "{owner:?}"
            );
        }
        Handover::Release => assert!(canary_revisions.is_empty(), "{canary_revisions:?}"),
    }
    Ok(())
}

/// Break before make on every node at once.
async fn move_all_break_before_make(
    nodes: &Api<Node>,
    pods: &Api<Pod>,
    rollout: &str,
    t: &str,
    c: &str,
) -> anyhow::Result<()> {
    for n in node_names() {
        set_handover(nodes, &n, rollout, HandoverState::Drain).await?;
    }
    wait_pods(pods, |ps| !ps.iter().any(|p| owner_uid(p) == Some(t))).await?;
    for n in node_names() {
        set_handover(nodes, &n, rollout, HandoverState::New).await?;
    }
    wait_every_node_ready(pods, c, NEW_IMAGE).await?;
    Ok(())
}

/// T's pod per node, by UID.
fn by_node(ps: &[Pod], owner: &str) -> BTreeMap<String, String> {
    ps.iter()
        .filter(|p| owner_uid(p) == Some(owner))
        .map(|p| (node_of(p).to_owned(), uid(p)))
        .collect()
}

/// The pod `owner` created on `node` in these events.
fn created_on(events: &[Seen], owner: &str, node: &str) -> Vec<String> {
    created(events)
        .into_iter()
        .filter(|(_, n, o)| n == node && o.as_deref() == Some(owner))
        .map(|(u, _, _)| u)
        .collect()
}

struct Setup {
    ns: saferollout_testkit::TestNamespace,
    dss: Api<DaemonSet>,
    pods: Api<Pod>,
    crs: Api<ControllerRevision>,
    nodes: Api<Node>,
}

async fn setup(prefix: &str) -> anyhow::Result<Setup> {
    let c = cluster();
    let ns = c.namespace(prefix).await?;
    let client = c.client().await?;
    Ok(Setup {
        dss: Api::namespaced(client.clone(), &ns.name),
        pods: Api::namespaced(client.clone(), &ns.name),
        crs: Api::namespaced(client.clone(), &ns.name),
        nodes: Api::all(client),
        ns,
    })
}

/// In which order [`hand_every_node_over`] moves each node.
#[derive(Clone, Copy)]
enum Order {
    BreakBeforeMake,
    MakeBeforeBreak,
}

/// What a node-by-node handover of every node left to judge.
struct HandedOver {
    s: Setup,
    /// The pod events from the canary's creation on.
    events: Vec<Seen>,
    /// The target's pod on each node before the handover, by node.
    old: BTreeMap<String, String>,
    /// The canary DaemonSet's UID.
    c_uid: String,
}

/// Starts the target and the canary, then moves every node to the canary
/// one at a time in `order`, recording every pod event.
async fn hand_every_node_over(
    prefix: &str,
    rollout: &str,
    order: Order,
) -> anyhow::Result<HandedOver> {
    let s = setup(prefix).await?;
    let rec = Recorder::start(&s.pods).await?;
    let t_uid = ds_uid(&start_target(&s.dss, &s.pods).await?);
    prepare_target(&s.dss, rollout).await?;
    let old = by_node(&s.pods.list(&ListParams::default()).await?.items, &t_uid);
    let from = rec.len();
    let c_uid = ds_uid(&start_canary(&s.dss, rollout).await?);
    for n in node_names() {
        match order {
            Order::BreakBeforeMake => {
                move_break_before_make(&s.nodes, &s.pods, rollout, &n, &t_uid, &c_uid).await?
            }
            Order::MakeBeforeBreak => {
                move_make_before_break(&s.nodes, &s.pods, rollout, &n, &t_uid, &c_uid).await?
            }
        }
    }
    let last = s.pods.list(&ListParams::default()).await?.items;
    rec.catch_up(&s.pods, &name(&last[0])).await?;
    let events = rec.since(from);
    Ok(HandedOver {
        s,
        events,
        old,
        c_uid,
    })
}

#[tokio::test]
async fn make_before_break_keeps_an_agent_ready_on_each_node() -> anyhow::Result<()> {
    let _serial = NODE_STATE.lock().await;
    let _clean = NodeCleanup;
    let HandedOver {
        s,
        events,
        old,
        c_uid,
    } = hand_every_node_over("selector-mbb", "rc", Order::MakeBeforeBreak).await?;
    for n in node_names() {
        let new = created_on(&events, &c_uid, &n);
        assert_eq!(new.len(), 1, "{n}: {new:?}");
        let ready_at = first(&events, &new[0], |s| ready(&s.pod)).expect("new pod Ready");
        let deleting_at = first(&events, &old[&n], |s| {
            terminating(&s.pod) || s.kind == "Deleted"
        })
        .expect("old pod deleted");
        assert!(
            ready_at < deleting_at,
            "{n}: new Ready at event {ready_at}, old deleting at {deleting_at}"
        );
        assert!(first(&events, &old[&n], |s| s.kind == "Deleted").is_some());
    }
    drop(s.ns);
    Ok(())
}

#[tokio::test]
async fn break_before_make_removes_the_old_agent_before_the_new_one_exists() -> anyhow::Result<()> {
    let _serial = NODE_STATE.lock().await;
    let _clean = NodeCleanup;
    let HandedOver {
        s,
        events,
        old,
        c_uid,
    } = hand_every_node_over("selector-bbm", "rbbm", Order::BreakBeforeMake).await?;
    for n in node_names() {
        let new = created_on(&events, &c_uid, &n);
        assert_eq!(new.len(), 1, "{n}: {new:?}");
        let gone_at = first(&events, &old[&n], |s| s.kind == "Deleted").expect("old pod gone");
        let made_at = first(&events, &new[0], |s| s.kind == "Added").unwrap();
        assert!(
            gone_at < made_at,
            "{n}: old gone at event {gone_at}, new created at {made_at}"
        );
    }
    drop(s.ns);
    Ok(())
}

#[tokio::test]
async fn revert_brings_the_old_agent_back_and_an_abort_restarts_nothing() -> anyhow::Result<()> {
    let _serial = NODE_STATE.lock().await;
    let _clean = NodeCleanup;
    let s = setup("selector-revert").await?;
    let rollout = "rd";
    let rec = Recorder::start(&s.pods).await?;
    let t = start_target(&s.dss, &s.pods).await?;
    let t_uid = ds_uid(&t);
    let original_template = t.spec.clone().template;
    let first_pods = s.pods.list(&ListParams::default()).await?.items;
    let original_hash = label(&first_pods[0], HASH).unwrap().to_owned();
    let original = prepare_target(&s.dss, rollout).await?;
    let c_uid = ds_uid(&start_canary(&s.dss, rollout).await?);
    let (moved, kept) = (&node_names()[..2], &node_names()[2..]);
    for n in moved {
        move_break_before_make(&s.nodes, &s.pods, rollout, n, &t_uid, &c_uid).await?;
    }
    let canary_pods = by_node(&s.pods.list(&ListParams::default()).await?.items, &c_uid);
    let from = rec.len();

    // Revert, break before make in reverse: `drain` (C's pod gone), then no
    // label (T's back).
    for n in moved {
        set_handover(&s.nodes, n, rollout, HandoverState::Drain).await?;
        wait_gone_from(&s.pods, &c_uid, n).await?;
        set_handover(&s.nodes, n, rollout, HandoverState::Old).await?;
        wait_pods(&s.pods, |ps| {
            let on = owned_on(ps, &t_uid, n);
            on.len() == 1 && ready(on[0]) && image(on[0]) == OLD_IMAGE
        })
        .await?;
    }
    let reverted = s.pods.list(&ListParams::default()).await?.items;
    rec.catch_up(&s.pods, &name(&reverted[0])).await?;
    let events = rec.since(from);
    let affinity_hash = current_hash(&s.crs, &t_uid).await?.0;
    for n in moved {
        assert!(
            first(&events, &canary_pods[n], |s| s.kind == "Deleted").is_some(),
            "{n}: C's pod not deleted"
        );
        let back = created_on(&events, &t_uid, n);
        assert_eq!(back.len(), 1, "{n}: {back:?}");
        let p = reverted.iter().find(|p| uid(p) == back[0]).unwrap();
        assert_eq!(image(p), OLD_IMAGE);
        // T made it from its current revision: the old template plus the
        // handover expression, not the original revision.
        assert_eq!(label(p, HASH), Some(affinity_hash.as_str()));
        assert_ne!(affinity_hash, original_hash);
    }
    assert_eq!(
        created(&events).len(),
        moved.len(),
        "{:?}",
        created(&events)
    );

    // Abort: T's original template again (its original revision becomes
    // current), the reverted pods relabelled to it, C deleted (it has no
    // pods), T's strategy back: nothing restarts.
    let from = rec.len();
    modify_ds(&s.dss, TARGET, |ds| {
        ds.spec.template = original_template.clone();
    })
    .await?;
    wait_ds(&s.dss, TARGET, |d| ds_status(d).5).await?;
    let (hash, _) = current_hash(&s.crs, &t_uid).await?;
    assert_eq!(
        hash, original_hash,
        "the original revision is current again"
    );
    let patch = objects::release_patch(&hash);
    for p in &reverted {
        if label(p, HASH) != Some(hash.as_str()) {
            s.pods
                .patch(&name(p), &PatchParams::default(), &Patch::Merge(&patch))
                .await?;
        }
    }
    s.dss.delete(&canary_name(), &Default::default()).await?;
    wait_for_object(&s.dss, &canary_name(), TIMEOUT, |d| d.is_none()).await?;
    let strategy = original.clone();
    let t = modify_ds(&s.dss, TARGET, |ds| {
        ds.spec.update_strategy = Some(strategy.clone());
    })
    .await?;
    wait_ds(&s.dss, TARGET, |d| {
        let (desired, _, updated, available, _, _) = ds_status(d);
        d.status.as_ref().and_then(|s| s.observed_generation) >= t.metadata.generation
            && desired == 4
            && updated == 4
            && available == 4
    })
    .await?;
    rec.catch_up(&s.pods, &name(&reverted[0])).await?;
    let events = rec.since(from);
    assert!(created(&events).is_empty(), "{:?}", created(&events));
    assert!(
        !events
            .iter()
            .any(|s| s.kind == "Deleted" || terminating(&s.pod)),
        "a pod was deleted in the abort"
    );
    let now = by_node(&s.pods.list(&ListParams::default()).await?.items, &t_uid);
    assert_eq!(now, by_node(&reverted, &t_uid));
    for n in kept {
        let kept_uid = first_pods
            .iter()
            .find(|p| node_of(p) == n)
            .map(uid)
            .unwrap();
        assert_eq!(now[n.as_str()], kept_uid, "{n} kept its first pod");
    }
    assert_eq!(
        dss_template(&s.dss).await?,
        serde_json::to_value(&original_template)?
    );
    drop(s.ns);
    Ok(())
}

async fn dss_template(dss: &Api<DaemonSet>) -> anyhow::Result<Value> {
    Ok(serde_json::to_value(dss.get(TARGET).await?.spec.template)?)
}

/// Step 1 left out: T's template changed while C still owns the pods and
/// nothing keeps T from running on the nodes.
#[tokio::test]
async fn without_the_taint_the_target_starts_a_second_agent_on_every_node() -> anyhow::Result<()> {
    let _serial = NODE_STATE.lock().await;
    let _clean = NodeCleanup;
    let s = setup("selector-notaint").await?;
    let rollout = "rb";
    let rec = Recorder::start(&s.pods).await?;
    let t_uid = ds_uid(&start_target(&s.dss, &s.pods).await?);
    prepare_target(&s.dss, rollout).await?;
    let c_uid = ds_uid(&start_canary(&s.dss, rollout).await?);
    move_all_break_before_make(&s.nodes, &s.pods, rollout, &t_uid, &c_uid).await?;
    let canary_pods = by_node(&s.pods.list(&ListParams::default()).await?.items, &c_uid);
    let from = rec.len();

    modify_ds(&s.dss, TARGET, |ds| {
        ds.spec.template = serde_json::from_value(template(NEW_IMAGE)).unwrap();
    })
    .await?;
    // Two agents on every node: C's and a new one of T's.
    wait_pods(&s.pods, |ps| {
        node_names()
            .iter()
            .all(|n| owned_on(ps, &t_uid, n).len() == 1 && owned_on(ps, &c_uid, n).len() == 1)
    })
    .await?;

    // Orphaning C's pods now: T owns two pods a node and deletes all but the
    // oldest (podByCreationTimestampAndPhase: creationTimestamp has whole
    // seconds, ties go by name).
    let dp = DeleteParams {
        propagation_policy: Some(PropagationPolicy::Orphan),
        ..Default::default()
    };
    s.dss.delete(&canary_name(), &dp).await?;
    let end = wait_pods(&s.pods, |ps| {
        ps.len() == NODES
            && node_names()
                .iter()
                .all(|n| owned_on(ps, &t_uid, n).len() == 1)
    })
    .await?;
    rec.catch_up(&s.pods, &name(&end[0])).await?;
    let events = rec.since(from);
    let made = created(&events);
    assert_eq!(made.len(), NODES, "{made:?}");
    assert!(
        made.iter()
            .all(|(_, _, o)| o.as_deref() == Some(t_uid.as_str()))
    );
    let survivors: Vec<&str> = node_names()
        .iter()
        .map(|n| {
            let u = uid(owned_on(&end, &t_uid, n)[0]);
            if u == canary_pods[n] {
                "C's"
            } else {
                "T's new"
            }
        })
        .collect();
    eprintln!("survivor per node after the adoption: {survivors:?}");
    drop(s.ns);
    Ok(())
}

/// Steps 1 and 2 left out (C orphaned while T still has its handover
/// expression):
/// T adopts every pod and deletes it, leaving the nodes without an agent.
#[tokio::test]
async fn adopting_under_the_targets_expression_deletes_every_agent() -> anyhow::Result<()> {
    let _serial = NODE_STATE.lock().await;
    let _clean = NodeCleanup;
    let s = setup("selector-early-orphan").await?;
    let rollout = "rb2";
    let rec = Recorder::start(&s.pods).await?;
    let t_uid = ds_uid(&start_target(&s.dss, &s.pods).await?);
    prepare_target(&s.dss, rollout).await?;
    let c_uid = ds_uid(&start_canary(&s.dss, rollout).await?);
    move_all_break_before_make(&s.nodes, &s.pods, rollout, &t_uid, &c_uid).await?;
    let canary_pods = by_node(&s.pods.list(&ListParams::default()).await?.items, &c_uid);
    let from = rec.len();

    let dp = DeleteParams {
        propagation_policy: Some(PropagationPolicy::Orphan),
        ..Default::default()
    };
    s.dss.delete(&canary_name(), &dp).await?;
    wait_pods(&s.pods, |ps| ps.is_empty()).await?;
    // No pod is left to mark the stream with: wait for the deletions' events.
    rec.until(|es| {
        canary_pods
            .values()
            .all(|u| first(&es[from..], u, |s| s.kind == "Deleted").is_some())
    })
    .await?;
    let events = rec.since(from);
    assert!(created(&events).is_empty());
    for (n, u) in &canary_pods {
        let adopted = first(&events, u, |s| owner_uid(&s.pod) == Some(t_uid.as_str()))
            .unwrap_or_else(|| panic!("{n}: never adopted by T"));
        let deleting = first(&events, u, |s| terminating(&s.pod)).expect("deleted");
        assert!(adopted < deleting, "{n}");
        // T deleted it (still T's when the deletion began).
        assert_eq!(owner_uid(&events[deleting].pod), Some(t_uid.as_str()));
    }
    drop(s.ns);
    Ok(())
}
