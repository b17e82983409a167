//! The caches every decision reads, and the triggers that wake reconciles.
//!
//! One reflector per resource and watched namespace (cluster-wide for nodes;
//! one for all namespaces when none are listed), each a consistent LIST then
//! a WATCH, with what decisions never read pruned away before it is stored
//! (managed fields, most of a pod's spec, a node's images and addresses, ...).
//! They run on every replica, leader or not, so a new leader decides at once
//! from warm caches. Reflector events map to the SafeRollouts they concern
//! and are sent to the leader's work queue ([`Triggers`]); a follower drops
//! them.

use std::collections::{HashMap, HashSet};
use std::fmt::Debug;
use std::hash::Hash;
use std::sync::{Arc, Mutex};

use k8s_openapi::api::apps::v1::{ControllerRevision, DaemonSet};
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::watcher::{self, Event};
use kube::{Client, Resource, ResourceExt};
use saferollout_api::{REVISION_HASH_LABEL, ROLLOUT_LABEL, SafeRollout};
use saferollout_core::objects::{SlimNode, SlimPod};
use tokio::sync::mpsc::UnboundedSender;

use super::freshness::{self, Freshness};
use crate::metrics::Metrics;

/// What sent a reconcile request: the label of `saferollout_wakes_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cause {
    /// The SafeRollout itself changed (spec, status, deletion) or was listed.
    SafeRollout,
    /// Its target DaemonSet changed.
    DaemonSet,
    /// One of the target's pods changed in what decisions read.
    AgentPod,
    /// A ControllerRevision of the target (a template's history) changed.
    ControllerRevision,
    /// A node changed in what the rollouts it concerns read.
    Node,
    /// One of the rollout's probe pods changed.
    ProbePod,
    /// A device gate's object changed (ResourceSlice, claim, workload pod).
    Device,
    /// The rollout's node label writes finished.
    LabelWrites,
    /// This replica became the leader: every rollout is decided once.
    Leading,
    /// A status write that went behind its pass failed: the next pass
    /// writes the status again.
    StatusRetry,
    /// A prometheus gate's query, run beside the passes, finished.
    Measurement,
}

impl Cause {
    /// Every cause, in declaration order (its discriminant is its index).
    const ALL: [Cause; 11] = [
        Cause::SafeRollout,
        Cause::DaemonSet,
        Cause::AgentPod,
        Cause::ControllerRevision,
        Cause::Node,
        Cause::ProbePod,
        Cause::Device,
        Cause::LabelWrites,
        Cause::Leading,
        Cause::StatusRetry,
        Cause::Measurement,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Cause::SafeRollout => "saferollout",
            Cause::DaemonSet => "daemonset",
            Cause::AgentPod => "agent_pod",
            Cause::ControllerRevision => "controllerrevision",
            Cause::Node => "node",
            Cause::ProbePod => "probe_pod",
            Cause::Device => "device",
            Cause::LabelWrites => "label_writes",
            Cause::Leading => "leading",
            Cause::StatusRetry => "status_retry",
            Cause::Measurement => "measurement",
        }
    }
}

/// Where reconcile requests go: the leader's queue, or nowhere on a follower.
#[derive(Default)]
pub struct Triggers {
    queue: Mutex<Option<UnboundedSender<ObjectRef<SafeRollout>>>>,
    /// `saferollout_wakes_total`, one counter per [`Cause`] (in its order),
    /// taken from the family once so a wake costs one atomic add.
    wakes: Vec<prometheus_client::metrics::counter::Counter>,
    /// UIDs of the agent pods this replica is deleting: the watch event that
    /// shows such a pod's deletion start wakes nobody, as the pass that
    /// deleted it counts it as going already (its rollout's expectations),
    /// and deciding again would change nothing. At `maxUnavailable: 1` on
    /// 1,000 nodes that was one pass in four of every replacement.
    own_deletions: Mutex<HashSet<String>>,
}

impl Triggers {
    /// Triggers counting their wakes in `metrics`.
    pub fn new(metrics: &Metrics) -> Self {
        Triggers {
            wakes: Cause::ALL
                .iter()
                .map(|c| {
                    metrics
                        .wakes
                        .get_or_create(&crate::metrics::CauseLabels {
                            cause: c.as_str().into(),
                        })
                        .clone()
                })
                .collect(),
            ..Default::default()
        }
    }

    fn own_deletions(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        self.own_deletions.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The operator is about to delete the pod `uid`.
    pub fn deleting(&self, uid: &str) {
        self.own_deletions().insert(uid.to_string());
    }

    /// Its delete failed or was refused: whatever the watch shows of the pod
    /// wakes its rollout as usual.
    pub fn not_deleting(&self, uid: &str) {
        self.own_deletions().remove(uid);
    }

    /// Whether pod `uid` was being deleted by the operator (forgotten now).
    fn take_own_deletion(&self, uid: &str) -> bool {
        self.own_deletions().remove(uid)
    }

    fn forget_own_deletions(&self) {
        self.own_deletions().clear();
    }

    /// Queues a reconcile of `r` on the leader (a follower drops it).
    pub fn send(&self, r: ObjectRef<SafeRollout>, cause: Cause) {
        if let Some(tx) = self
            .queue
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            && tx.send(r).is_ok()
        {
            self.count(cause);
        }
    }

    /// Counts one wake sent for `cause`.
    pub fn count(&self, cause: Cause) {
        // `ALL` lists the causes in declaration order.
        if let Some(c) = self.wakes.get(cause as usize) {
            c.inc();
        }
    }

    pub fn attach(&self, tx: Option<UnboundedSender<ObjectRef<SafeRollout>>>) {
        *self.queue.lock().unwrap_or_else(|e| e.into_inner()) = tx;
    }
}

/// Stores of one namespaced resource: one per watched namespace, or one for all.
pub struct NsStores<K: Resource + 'static>
where
    K::DynamicType: Eq + Hash + Clone,
{
    all: Option<Store<K>>,
    by_namespace: HashMap<String, Store<K>>,
}

impl<K> NsStores<K>
where
    K: Resource + Clone + 'static,
    K::DynamicType: Eq + Hash + Clone,
{
    /// The store holding `namespace`'s objects.
    pub fn get(&self, namespace: &str) -> Option<&Store<K>> {
        self.all
            .as_ref()
            .or_else(|| self.by_namespace.get(namespace))
    }

    pub fn stores(&self) -> impl Iterator<Item = &Store<K>> {
        self.all.iter().chain(self.by_namespace.values())
    }

    /// The objects of `namespace`.
    pub fn in_namespace(&self, namespace: &str) -> Vec<Arc<K>> {
        let Some(store) = self.get(namespace) else {
            return Vec::new();
        };
        let all = store.state();
        if self.all.is_some() {
            // Not `into_iter().filter().collect()`: that reuses the buffer of
            // every object in the cluster (40 KB at 5,000 pods) for the few
            // of one namespace, and a pass keeps it while it writes; 50
            // SafeRollouts' passes kept 1.5 MB of them (heaptrack).
            all.iter()
                .filter(|o| o.meta().namespace.as_deref() == Some(namespace))
                .cloned()
                .collect()
        } else {
            all
        }
    }
}

/// How every reflector gets its initial state (`--initial-list`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum InitialList {
    /// A streaming list (the Kubernetes WatchList feature): one watch that
    /// sends the current objects first, consistent with a quorum read and
    /// served from the API server's watch cache. The operator decodes and
    /// prunes one object at a time and never holds a page of whole objects:
    /// at 1,000 nodes its peak RSS is 43 MiB instead of 53 paged (measured
    /// on the bench's cluster; bench/README.md).
    #[default]
    Stream,
    /// Paginated LISTs (500 objects a page, quorum reads), then a watch: for
    /// API servers with WatchList turned off, which refuse streaming lists.
    Paged,
}

static INITIAL_LIST: std::sync::OnceLock<InitialList> = std::sync::OnceLock::new();

/// Chooses the initial-list strategy of every reflector; call once, before
/// [`start`].
pub fn set_initial_list(strategy: InitialList) {
    let _ = INITIAL_LIST.set(strategy);
}

/// The watcher configuration every reflector starts from.
pub fn watch_config() -> watcher::Config {
    match INITIAL_LIST.get().copied().unwrap_or_default() {
        InitialList::Stream => watcher::Config::default().streaming_lists(),
        InitialList::Paged => watcher::Config::default(),
    }
}

/// Every cache.
pub struct Caches {
    pub rollouts: NsStores<SafeRollout>,
    /// Every SafeRollout in one store, whatever the namespaces watched: the
    /// work queue looks objects up there.
    pub all_rollouts: Store<SafeRollout>,
    pub daemonsets: NsStores<DaemonSet>,
    /// The agent pods, projected (see [`SlimPod`]).
    pub pods: NsStores<SlimPod>,
    pub revisions: NsStores<ControllerRevision>,
    /// The operator's own probe pods (label `saferollout.dev/probe-revision`).
    pub probe_pods: NsStores<Pod>,
    /// Every node, projected (see [`SlimNode`]).
    pub nodes: Store<SlimNode>,
    /// The same nodes sorted by name, kept between node changes.
    sorted_nodes: SortedNodes,
    /// Parsed templates of the ControllerRevisions (forgotten when one goes).
    pub templates: super::snapshot::TemplateCache,
    /// What the device gates read (slices, claims, probes, quarantine
    /// rules, the workload pods of held nodes).
    pub devices: super::devices::DeviceCaches,
    /// True once every store has been listed (see [`Caches::wait_until_synced`]).
    synced: tokio::sync::watch::Receiver<bool>,
    /// When each store last heard from the API server.
    pub freshness: Arc<Freshness>,
}

impl Caches {
    /// The stores `sr`'s pass reads that have gone silent past the bound
    /// (see [`freshness`]).
    pub fn stale_for(&self, sr: &SafeRollout) -> Vec<freshness::Stale> {
        self.freshness.stale(read_by(sr))
    }

    /// When the stalest store `sr`'s pass reads last heard from the API server.
    pub fn heard_at_for(&self, sr: &SafeRollout) -> Option<jiff::Timestamp> {
        self.freshness.heard_at(read_by(sr))
    }

    /// Lists again the stores `sr`'s pass reads that have heard nothing since `since`.
    pub fn refresh_for(&self, sr: &SafeRollout, since: jiff::Timestamp) -> usize {
        self.freshness.refresh(since, read_by(sr))
    }

    /// Every SafeRollout of `namespace`.
    pub fn rollouts_in(&self, namespace: &str) -> Vec<Arc<SafeRollout>> {
        self.rollouts.in_namespace(namespace)
    }

    /// The probe pods of the rollout `rollout_id` in `namespace`.
    pub fn probe_pods_of(&self, namespace: &str, rollout_id: &str) -> Vec<Arc<Pod>> {
        self.probe_pods
            .in_namespace(namespace)
            .into_iter()
            .filter(|p| p.labels().get(ROLLOUT_LABEL).map(String::as_str) == Some(rollout_id))
            .collect()
    }

    /// The DaemonSet `sr` targets (`spec.targetRef`, same namespace).
    pub fn target_daemonset(&self, sr: &SafeRollout) -> Option<Arc<DaemonSet>> {
        let ns = sr.namespace().unwrap_or_default();
        self.daemonsets
            .get(&ns)
            .and_then(|s| s.get(&ObjectRef::new(&sr.spec.target_ref.name).within(&ns)))
    }

    /// Every SafeRollout.
    pub fn every_rollout(&self) -> Vec<Arc<SafeRollout>> {
        self.rollouts.stores().flat_map(|s| s.state()).collect()
    }

    /// Resolves once every cache has been listed. Any number of tasks may
    /// wait: one task waits on the stores themselves (a store wakes only one
    /// waiter at a time) and tells the others.
    pub async fn wait_until_synced(&self) {
        let mut synced = self.synced.clone();
        let _ = synced.wait_for(|s| *s).await;
    }

    pub fn is_synced(&self) -> bool {
        *self.synced.borrow()
    }

    /// Every node, sorted by name (see [`SortedNodes`]).
    pub fn nodes_by_name(&self) -> Arc<Vec<Arc<SlimNode>>> {
        self.sorted_nodes.get(&self.nodes)
    }
}

/// The node store's objects sorted by name, kept until a node changes.
///
/// Each pass views every node in name order; sorting the store's objects
/// anew each time took a fifth of the operator's CPU at 1,000 nodes with
/// `maxUnavailable: 1`, where nodes hardly change while pods do. Every node
/// event drops the list (after the store has the change, before any pass it
/// triggers), and a list read from the store before a drop is never kept
/// after it: a pass sees the same nodes as if it had sorted the store.
#[derive(Default)]
pub struct SortedNodes {
    inner: Mutex<SortedNodesState>,
}

#[derive(Default)]
struct SortedNodesState {
    /// Bumped by every node event.
    generation: u64,
    /// The sorted list and the generation it was read at.
    list: Option<(u64, Arc<Vec<Arc<SlimNode>>>)>,
}

impl SortedNodes {
    fn lock(&self) -> std::sync::MutexGuard<'_, SortedNodesState> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A node changed: the next reader sorts the store again.
    pub fn invalidate(&self) {
        let mut s = self.lock();
        s.generation += 1;
        s.list = None;
    }

    pub fn get(&self, store: &Store<SlimNode>) -> Arc<Vec<Arc<SlimNode>>> {
        let generation = {
            let s = self.lock();
            if let Some((g, list)) = &s.list
                && *g == s.generation
            {
                return list.clone();
            }
            s.generation
        };
        // Sorted outside the lock; kept only if no node changed meanwhile.
        let mut nodes = store.state();
        nodes.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        let nodes = Arc::new(nodes);
        let mut s = self.lock();
        if s.generation == generation {
            s.list = Some((generation, nodes.clone()));
        }
        nodes
    }
}

/// Waits for every store in turn, then reports it on `tx`.
async fn report_synced(caches: Arc<Caches>, tx: tokio::sync::watch::Sender<bool>) {
    for s in caches.rollouts.stores() {
        let _ = s.wait_until_ready().await;
    }
    for s in caches.daemonsets.stores() {
        let _ = s.wait_until_ready().await;
    }
    for s in caches.pods.stores() {
        let _ = s.wait_until_ready().await;
    }
    for s in caches.revisions.stores() {
        let _ = s.wait_until_ready().await;
    }
    for s in caches.probe_pods.stores() {
        let _ = s.wait_until_ready().await;
    }
    let _ = caches.nodes.wait_until_ready().await;
    super::devices::wait_synced(&caches.devices).await;
    crate::allocator::caches_listed();
    let _ = tx.send(true);
}

/// What is kept of each object: only what decisions read.
mod prune {
    use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};
    use saferollout_api::REVISION_HASH_LABEL;
    use saferollout_core::objects::{Quantities, SlimNode, SlimPod};

    pub fn meta(m: &mut k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) {
        m.managed_fields = None;
    }

    /// SafeRollouts keep everything but their managedFields: the operator
    /// applies their status many times a rollout, and the API server's
    /// record of the fields it owns (stages, node lists, baselines) came to
    /// 25 KB a SafeRollout at 100 nodes each (1.3 MB of the 50-SafeRollout
    /// heap at 5,000 nodes, heaptrack). Their annotations stay: retry,
    /// approve and abort are annotations.
    pub fn rollout(r: &mut saferollout_api::SafeRollout) {
        meta(&mut r.metadata);
    }

    /// Agent pods are projected when decoded ([`SlimPod`]): what is left
    /// to drop is the metadata decisions never read, every label but the
    /// revision hash, and every condition but Ready. (A label map is about
    /// 0.7 KB a pod: the pod template's labels, which decisions never read,
    /// outweigh the rest of a cached pod's metadata.)
    pub fn pod(p: &mut SlimPod) {
        meta(&mut p.metadata);
        p.metadata.annotations = None;
        p.metadata.generate_name = None;
        if let Some(labels) = p.metadata.labels.as_mut() {
            labels.retain(|k, _| k == REVISION_HASH_LABEL);
        }
        if let Some(st) = p.status.as_mut() {
            st.conditions
                .get_or_insert_default()
                .retain(|c| c.type_ == "Ready");
        }
    }

    /// Probe pods: what the probe gate reads (phase, scheduling, the first
    /// container's state), never the environment. Dropped: annotations, the
    /// spec beyond the node and the container names, addresses, every
    /// condition but PodScheduled, and the containers' image IDs, IDs, last
    /// states and device health.
    pub fn probe_pod(p: &mut Pod) {
        meta(&mut p.metadata);
        p.metadata.annotations = None;
        if let Some(spec) = p.spec.take() {
            p.spec = Some(PodSpec {
                node_name: spec.node_name,
                containers: spec
                    .containers
                    .into_iter()
                    .map(|c| Container {
                        name: c.name,
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            });
        }
        if let Some(st) = p.status.as_mut() {
            st.conditions
                .get_or_insert_default()
                .retain(|c| c.type_ == "PodScheduled");
            st.host_ip = None;
            st.host_ips = None;
            st.pod_ip = None;
            st.pod_ips = None;
            for c in st.container_statuses.iter_mut().flatten() {
                c.image_id.clear();
                c.container_id = None;
                c.last_state = None;
                c.allocated_resources_status = None;
            }
        }
    }

    /// Nodes are projected when decoded ([`SlimNode`]: no images,
    /// addresses, node info or volumes); this drops the metadata decisions
    /// never read, conditions but Ready, and resources that are not extended.
    pub fn node(n: &mut SlimNode) {
        meta(&mut n.metadata);
        n.metadata.annotations = None;
        if let Some(st) = n.status.as_mut() {
            st.conditions
                .get_or_insert_default()
                .retain(|c| c.type_ == "Ready");
            // Only extended resources (domain-prefixed names) are gated.
            for q in [st.allocatable.as_mut(), st.capacity.as_mut()]
                .into_iter()
                .flatten()
            {
                let mut extended = std::mem::take(q).into_tuple_vec();
                extended.retain(|(k, _)| k.contains('/'));
                extended.shrink_to_fit();
                // Still sorted: a subsequence of a sorted map.
                *q = Quantities::from_sorted_store_unchecked(extended);
            }
        }
    }
}

/// The stores a pass over `sr` reads: those of its namespace and the
/// cluster-wide ones; the device gates' only when it has any (or
/// quarantines a DRA driver's devices).
fn read_by(sr: &SafeRollout) -> impl Fn(&freshness::StoreKey) -> bool + '_ {
    let namespace = sr.metadata.namespace.as_deref();
    let devices = sr.spec.device_driver().is_some()
        || matches!(
            sr.spec.quarantine_target(),
            Some(saferollout_api::QuarantineTarget::Driver(_))
        );
    move |store| {
        let device_store = matches!(
            store.resource(),
            "resourceslices" | "resourceclaims" | "devicetaintrules"
        ) || store.labels.as_deref() == Some(saferollout_api::PROBE_LABEL);
        (store.namespace().is_none() || store.namespace() == namespace)
            && (devices || !device_store)
    }
}

/// Builds the stores for the watched namespaces (`None`: all) and spawns the
/// reflectors; their events go to `triggers` through `route`.
pub fn start(
    client: &Client,
    namespaces: &[String],
    device_apis: &super::devices::DeviceApis,
    freshness: &Arc<Freshness>,
    metrics: &Arc<Metrics>,
    triggers: &Arc<Triggers>,
) -> Arc<Caches> {
    let (devices, device_writers) =
        super::devices::stores(device_apis, namespaces, client, metrics, triggers);
    let pods_config = || watch_config().labels(REVISION_HASH_LABEL);
    let (nodes, nodes_writer) = reflector::store::<SlimNode>();
    let (all_rollouts, all_rollouts_writer) = reflector::store::<SafeRollout>();
    let (synced_tx, synced) = tokio::sync::watch::channel(false);
    let mut caches = Caches {
        templates: Default::default(),
        synced,
        all_rollouts,
        rollouts: ns_stores(),
        daemonsets: ns_stores(),
        pods: ns_stores(),
        revisions: ns_stores(),
        probe_pods: ns_stores(),
        nodes,
        sorted_nodes: SortedNodes::default(),
        devices,
        freshness: freshness.clone(),
    };
    let mut writers = Writers::default();
    let scopes: Vec<Option<&str>> = if namespaces.is_empty() {
        vec![None]
    } else {
        namespaces.iter().map(|n| Some(n.as_str())).collect()
    };
    for ns in &scopes {
        writers
            .rollouts
            .push((*ns, add_store(&mut caches.rollouts, *ns)));
        writers
            .daemonsets
            .push((*ns, add_store(&mut caches.daemonsets, *ns)));
        writers.pods.push((*ns, add_store(&mut caches.pods, *ns)));
        writers
            .revisions
            .push((*ns, add_store(&mut caches.revisions, *ns)));
        writers
            .probe_pods
            .push((*ns, add_store(&mut caches.probe_pods, *ns)));
    }
    // Watching every namespace, the one SafeRollout store is the merged one:
    // no second copy of every SafeRollout (their status lists every node).
    let merged = match &caches.rollouts.all {
        Some(all) => {
            caches.all_rollouts = all.clone();
            None
        }
        None => Some(Arc::new(Mutex::new(all_rollouts_writer))),
    };
    let caches = Arc::new(caches);
    tokio::spawn(report_synced(caches.clone(), synced_tx));
    let route = Router {
        caches: caches.clone(),
        triggers: triggers.clone(),
        merged,
    };
    for (ns, w) in writers.rollouts {
        let r = route.clone();
        freshness::reflect(
            api(client, ns),
            watch_config(),
            w,
            freshness,
            metrics,
            prune::rollout,
            move |ev| r.rollout_event(ev),
        );
    }
    for (ns, w) in writers.daemonsets {
        let r = route.clone();
        let mut fingerprints: HashMap<String, DaemonSetMemo> = HashMap::new();
        freshness::reflect(
            api(client, ns),
            watch_config(),
            w,
            freshness,
            metrics,
            |d: &mut DaemonSet| prune::meta(&mut d.metadata),
            move |ev| r.daemonset_event(ev, &mut fingerprints),
        );
    }
    for (ns, w) in writers.pods {
        let r = route.clone();
        let mut fingerprints: HashMap<String, u64> = HashMap::new();
        freshness::reflect(
            api(client, ns),
            pods_config(),
            w,
            freshness,
            metrics,
            prune::pod,
            move |ev| r.pod_event(ev, &mut fingerprints),
        );
    }
    for (ns, w) in writers.revisions {
        let r = route.clone();
        freshness::reflect(
            api(client, ns),
            watch_config(),
            w,
            freshness,
            metrics,
            |c: &mut ControllerRevision| prune::meta(&mut c.metadata),
            move |ev| r.revision_event(ev),
        );
    }
    super::devices::spawn(
        client,
        &caches,
        device_writers,
        freshness,
        metrics,
        triggers,
    );
    for (ns, w) in writers.probe_pods {
        let r = route.clone();
        freshness::reflect(
            api(client, ns),
            watch_config().labels(saferollout_api::PROBE_REVISION_LABEL),
            w,
            freshness,
            metrics,
            prune::probe_pod,
            move |ev| r.probe_pod_event(ev),
        );
    }
    let r = route.clone();
    let mut memos: HashMap<String, NodeMemo> = HashMap::new();
    freshness::reflect(
        Api::<SlimNode>::all(client.clone()),
        watch_config(),
        nodes_writer,
        freshness,
        metrics,
        prune::node,
        move |ev| r.node_event(ev, &mut memos),
    );
    caches
}

#[derive(Default)]
struct Writers<'a> {
    rollouts: Vec<(Option<&'a str>, reflector::store::Writer<SafeRollout>)>,
    daemonsets: Vec<(Option<&'a str>, reflector::store::Writer<DaemonSet>)>,
    pods: Vec<(Option<&'a str>, reflector::store::Writer<SlimPod>)>,
    revisions: Vec<(
        Option<&'a str>,
        reflector::store::Writer<ControllerRevision>,
    )>,
    probe_pods: Vec<(Option<&'a str>, reflector::store::Writer<Pod>)>,
}

fn ns_stores<K: Resource + 'static>() -> NsStores<K>
where
    K::DynamicType: Eq + Hash + Clone,
{
    NsStores {
        all: None,
        by_namespace: HashMap::new(),
    }
}

fn add_store<K>(stores: &mut NsStores<K>, ns: Option<&str>) -> reflector::store::Writer<K>
where
    K: Resource + Clone + 'static,
    K::DynamicType: Eq + Hash + Clone + Default,
{
    let (store, writer) = reflector::store::<K>();
    match ns {
        None => stores.all = Some(store),
        Some(ns) => {
            stores.by_namespace.insert(ns.to_string(), store);
        }
    }
    writer
}

fn api<K>(client: &Client, ns: Option<&str>) -> Api<K>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
{
    match ns {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

/// Maps cache events to the SafeRollouts they concern.
#[derive(Clone)]
struct Router {
    caches: Arc<Caches>,
    triggers: Arc<Triggers>,
    /// Feeds [`Caches::all_rollouts`] when namespaces are watched one by one
    /// (watching all, that store is the reflector's own).
    merged: Option<Arc<Mutex<reflector::store::Writer<SafeRollout>>>>,
}

impl Router {
    /// SafeRollouts of `namespace` targeting DaemonSet `name`.
    fn targeting(&self, namespace: Option<&str>, name: &str, cause: Cause) {
        self.targeting_where(namespace, name, cause, |_| true)
    }

    /// Those of them `pick` selects.
    fn targeting_where(
        &self,
        namespace: Option<&str>,
        name: &str,
        cause: Cause,
        pick: impl Fn(&SafeRollout) -> bool,
    ) {
        let Some(ns) = namespace else { return };
        for sr in self.caches.rollouts_in(ns) {
            if sr.spec.target_ref.name == name && pick(&sr) {
                self.triggers.send(ObjectRef::from_obj(&*sr), cause);
            }
        }
    }

    fn all_in(&self, namespace: Option<&str>, cause: Cause) {
        let rollouts = match namespace {
            Some(ns) => self.caches.rollouts_in(ns),
            None => self.caches.every_rollout(),
        };
        for sr in rollouts {
            self.triggers.send(ObjectRef::from_obj(&*sr), cause);
        }
    }

    fn rollout_event(&self, ev: &Event<SafeRollout>) {
        let mut merged = self
            .merged
            .as_ref()
            .map(|m| m.lock().unwrap_or_else(|e| e.into_inner()));
        match ev {
            Event::Apply(sr) | Event::Delete(sr) => {
                if let Some(m) = merged.as_mut() {
                    m.apply_watcher_event(ev);
                }
                drop(merged);
                self.triggers
                    .send(ObjectRef::from_obj(sr), Cause::SafeRollout);
                // A deleted owner frees its DaemonSet for a waiting SafeRollout.
                self.targeting(
                    sr.namespace().as_deref(),
                    &sr.spec.target_ref.name,
                    Cause::SafeRollout,
                );
            }
            Event::InitDone => {
                // A namespace (re)listed: rebuild the merged store from every one.
                if let Some(m) = merged.as_mut() {
                    m.apply_watcher_event(&Event::Init);
                    for sr in self.caches.every_rollout() {
                        m.apply_watcher_event(&Event::InitApply((*sr).clone()));
                    }
                    m.apply_watcher_event(&Event::InitDone);
                }
                drop(merged);
                self.all_in(None, Cause::SafeRollout);
            }
            Event::Init | Event::InitApply(_) => {}
        }
    }

    /// The DaemonSet controller writes its DaemonSet's status counts with
    /// almost every pod change (at `maxUnavailable: 1` on 1,000 nodes, 2.4
    /// writes per replacement): only a change of what decisions read wakes
    /// the SafeRollouts targeting it, as for agent pods. Whether its pods are
    /// settled is read by preflight alone, and it flips twice with every
    /// replacement: it wakes only a SafeRollout that preflight blocked.
    fn daemonset_event(
        &self,
        ev: &Event<DaemonSet>,
        fingerprints: &mut HashMap<String, DaemonSetMemo>,
    ) {
        let wake = |ds: &DaemonSet| {
            self.targeting(ds.namespace().as_deref(), &ds.name_any(), Cause::DaemonSet)
        };
        match ev {
            Event::Apply(ds) => {
                let now = DaemonSetMemo::of(ds);
                match fingerprints
                    .insert(daemonset_key(ds), now)
                    .map(|b| now.wakes(&b))
                {
                    None | Some(DaemonSetWake::Every) => wake(ds),
                    Some(DaemonSetWake::BlockedByPreflight) => self.targeting_where(
                        ds.namespace().as_deref(),
                        &ds.name_any(),
                        Cause::DaemonSet,
                        blocked_by_preflight,
                    ),
                    Some(DaemonSetWake::Nobody) => {}
                }
            }
            Event::Delete(ds) => {
                fingerprints.remove(&daemonset_key(ds));
                wake(ds);
            }
            Event::InitApply(ds) => {
                fingerprints.insert(daemonset_key(ds), DaemonSetMemo::of(ds));
                wake(ds);
            }
            Event::Init => fingerprints.clear(),
            Event::InitDone => {}
        }
    }

    /// Agent pods change several times per replacement (scheduled, started,
    /// Ready, its conditions' timestamps): only a change of what decisions
    /// read wakes the SafeRollouts targeting its DaemonSet, so one replacement
    /// does not queue passes that would decide the same thing again.
    fn pod_event(&self, ev: &Event<SlimPod>, fingerprints: &mut HashMap<String, u64>) {
        let wake = |p: &SlimPod| {
            if let Some(owner) = p.owner_references().iter().find(|o| o.kind == "DaemonSet") {
                self.targeting(p.namespace().as_deref(), &owner.name, Cause::AgentPod);
            }
        };
        match ev {
            Event::Apply(p) => {
                let fp = pod_fingerprint(p);
                let before = fingerprints.insert(pod_key(p), fp);
                let own_deletion = p.metadata.deletion_timestamp.is_some()
                    && p.metadata
                        .uid
                        .as_deref()
                        .is_some_and(|uid| self.triggers.take_own_deletion(uid));
                if pod_change_wakes(before, fp, own_deletion) {
                    wake(p);
                }
            }
            Event::Delete(p) => {
                let before = fingerprints.remove(&pod_key(p));
                if let Some(uid) = p.metadata.uid.as_deref() {
                    self.triggers.not_deleting(uid);
                }
                if removal_wakes(before, self.node_is_ready(p)) {
                    wake(p);
                }
            }
            Event::InitApply(p) => {
                fingerprints.insert(pod_key(p), pod_fingerprint(p));
            }
            Event::Init => {
                fingerprints.clear();
                self.triggers.forget_own_deletions();
            }
            Event::InitDone => self.all_in(None, Cause::AgentPod),
        }
    }

    /// Whether the node of pod `p` is Ready in the cache (false when unknown).
    fn node_is_ready(&self, p: &SlimPod) -> bool {
        p.spec
            .as_ref()
            .and_then(|s| s.node_name.as_deref())
            .and_then(|n| self.caches.nodes.get(&ObjectRef::new(n)))
            .is_some_and(|n| saferollout_core::views::NodeView::of(&n).ready)
    }

    /// A probe pod changed: its owner judges it.
    fn probe_pod_event(&self, ev: &Event<Pod>) {
        match ev {
            Event::Apply(p) | Event::Delete(p) => {
                if let (Some(ns), Some(owner)) = (
                    p.namespace(),
                    p.owner_references()
                        .iter()
                        .find(|o| o.kind == "SafeRollout"),
                ) {
                    self.triggers
                        .send(ObjectRef::new(&owner.name).within(&ns), Cause::ProbePod);
                }
            }
            Event::InitDone => self.all_in(None, Cause::ProbePod),
            Event::Init | Event::InitApply(_) => {}
        }
    }

    fn revision_event(&self, ev: &Event<ControllerRevision>) {
        if let Event::Delete(cr) = ev {
            self.caches
                .templates
                .forget(cr.metadata.uid.as_deref().unwrap_or_default());
        }
        match ev {
            Event::Apply(cr) | Event::Delete(cr) => {
                let ns = cr.namespace();
                for owner in cr.owner_references() {
                    match owner.kind.as_str() {
                        "DaemonSet" => {
                            self.targeting(ns.as_deref(), &owner.name, Cause::ControllerRevision)
                        }
                        // Our own backup.
                        "SafeRollout" => {
                            if let Some(ns) = &ns {
                                self.triggers.send(
                                    ObjectRef::new(&owner.name).within(ns),
                                    Cause::ControllerRevision,
                                );
                            }
                        }
                        _ => {}
                    }
                }
            }
            Event::InitDone => self.all_in(None, Cause::ControllerRevision),
            Event::Init | Event::InitApply(_) => {}
        }
    }

    /// Nodes change often (heartbeats, conditions): only what decisions read
    /// wakes a SafeRollout, and only one the node concerns (see
    /// [`NodeMemo::wakes`]): with many SafeRollouts on a large cluster, each
    /// replacement changes its node twice (allocatable down and up again),
    /// and waking every SafeRollout for each made every one of them decide
    /// again over every node (at 5,000 nodes and 50 rollouts: 466 CPU-seconds
    /// for 5,000 replacements).
    fn node_event(&self, ev: &Event<SlimNode>, memos: &mut HashMap<String, NodeMemo>) {
        // The store has the change already; passes it triggers come after.
        self.caches.sorted_nodes.invalidate();
        match ev {
            Event::Apply(n) => {
                let now = NodeMemo::of(n);
                let before = memos.insert(n.name_any(), now.clone());
                match now.wakes(before.as_ref()) {
                    Wake::Nobody => {}
                    Wake::Every => self.all_in(None, Cause::Node),
                    Wake::Concerned => self.concerned_by(n, &now, before.as_ref()),
                    Wake::Holder => {
                        for sr in self.caches.every_rollout() {
                            let id = super::rollout_id(
                                &sr.namespace().unwrap_or_default(),
                                &sr.name_any(),
                            );
                            if now.rollout.as_deref() == Some(id.as_str()) {
                                self.triggers.send(ObjectRef::from_obj(&*sr), Cause::Node);
                            }
                        }
                    }
                }
            }
            Event::Delete(n) => {
                memos.remove(&n.name_any());
                self.all_in(None, Cause::Node);
            }
            Event::InitApply(n) => {
                memos.insert(n.name_any(), NodeMemo::of(n));
            }
            Event::Init => memos.clear(),
            Event::InitDone => self.all_in(None, Cause::Node),
        }
    }

    /// Wakes the SafeRollouts node `n` concerns: the one whose label it
    /// carries (or carried), and those whose DaemonSet's pods may run on it
    /// (its template's or `spec.template`'s nodeSelector matches the node's
    /// labels; a DaemonSet not in the cache, or a template without
    /// nodeSelector, matches every node).
    fn concerned_by(&self, n: &SlimNode, now: &NodeMemo, before: Option<&NodeMemo>) {
        let labels = n.metadata.labels.as_ref();
        let holders: Vec<&str> = [
            now.rollout.as_deref(),
            before.and_then(|b| b.rollout.as_deref()),
        ]
        .into_iter()
        .flatten()
        .collect();
        for sr in self.caches.every_rollout() {
            // The rollout id is computed only for a node that carries (or
            // carried) one: most node changes concern nodes no rollout holds.
            let holds = !holders.is_empty() && {
                let id = super::rollout_id(&sr.namespace().unwrap_or_default(), &sr.name_any());
                holders.contains(&id.as_str())
            };
            if holds || may_run_on(&sr, self.caches.target_daemonset(&sr).as_deref(), labels) {
                self.triggers.send(ObjectRef::from_obj(&*sr), Cause::Node);
            }
        }
    }
}

/// Whether the agent of `sr` may run on a node with `labels`: the nodeSelector
/// of its DaemonSet's template or of the template the rollout brings
/// (`spec.template`, GitOps) matches them. A DaemonSet not in the cache, or a
/// template without nodeSelector, may run anywhere.
fn may_run_on(
    sr: &SafeRollout,
    ds: Option<&DaemonSet>,
    labels: Option<&std::collections::BTreeMap<String, String>>,
) -> bool {
    let Some(ds) = ds else { return true };
    let by_spec = sr.spec.template.as_ref().is_some_and(|t| {
        let of_spec = t.pointer("/spec/nodeSelector").and_then(|v| v.as_object());
        selects(
            of_spec.map(|m| {
                m.iter()
                    .map(|(k, v)| (k.as_str(), v.as_str().unwrap_or_default()))
            }),
            labels,
        )
    });
    let of_ds = ds
        .spec
        .template
        .spec
        .as_ref()
        .and_then(|s| s.node_selector.as_ref());
    by_spec
        || selects(
            of_ds.map(|m| m.iter().map(|(k, v)| (k.as_str(), v.as_str()))),
            labels,
        )
}

/// Whether a nodeSelector (none: every node) matches `labels`.
fn selects<'a>(
    selector: Option<impl Iterator<Item = (&'a str, &'a str)>>,
    labels: Option<&std::collections::BTreeMap<String, String>>,
) -> bool {
    let Some(mut selector) = selector else {
        return true;
    };
    selector.all(|(k, v)| labels.and_then(|l| l.get(k)).map(String::as_str) == Some(v))
}

/// What the node router remembers of a node: fingerprints of what decisions
/// read, split by whom a change concerns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct NodeMemo {
    /// The node's labels but the operator's own (`saferollout.dev/stage`,
    /// `saferollout.dev/rollout`): a change may move the node into or out of
    /// any DaemonSet's nodeSelector.
    labels: u64,
    /// The operator's own labels.
    ours: u64,
    /// The value of `saferollout.dev/rollout`: the SafeRollout holding the node.
    rollout: Option<String>,
    /// Taints, unschedulable, allocatable, readiness.
    state: u64,
    /// When the kubelet last wrote the status (the Ready heartbeat): gates
    /// wait for a status written after a new agent became Ready.
    written: Option<i64>,
}

/// Whom a node change wakes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Wake {
    Nobody,
    /// A node that is new to the router, or whose labels changed.
    Every,
    /// The SafeRollouts the node concerns ([`Router::concerned_by`]).
    Concerned,
    /// The SafeRollout holding the node (its label): a status write alone.
    Holder,
}

impl NodeMemo {
    pub(crate) fn of(n: &SlimNode) -> Self {
        use std::hash::Hasher;
        let ours_key = |k: &str| k == saferollout_api::STAGE_LABEL || k == ROLLOUT_LABEL;
        let mut labels = std::collections::hash_map::DefaultHasher::new();
        let mut ours = std::collections::hash_map::DefaultHasher::new();
        for (k, v) in n.metadata.labels.iter().flatten() {
            if ours_key(k) {
                (k, v).hash(&mut ours);
            } else {
                (k, v).hash(&mut labels);
            }
        }
        let mut state = std::collections::hash_map::DefaultHasher::new();
        if let Some(spec) = &n.spec {
            for t in spec.taints.iter().flatten() {
                (&t.key, &t.value, &t.effect).hash(&mut state);
            }
            spec.unschedulable.hash(&mut state);
        }
        if let Some(st) = &n.status {
            for (k, v) in st.allocatable.iter().flatten() {
                (k, &v.0).hash(&mut state);
            }
            for c in st
                .conditions
                .iter()
                .flatten()
                .filter(|c| c.type_ == "Ready")
            {
                c.status.hash(&mut state);
            }
        }
        NodeMemo {
            labels: labels.finish(),
            ours: ours.finish(),
            rollout: n
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(ROLLOUT_LABEL))
                .cloned(),
            state: state.finish(),
            written: n
                .status
                .as_ref()
                .and_then(|st| st.conditions.as_ref())
                .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"))
                .and_then(|c| c.last_heartbeat_time.as_ref())
                .map(|t| t.0.as_second()),
        }
    }

    /// Whom the change from `before` to `self` wakes.
    pub(crate) fn wakes(&self, before: Option<&NodeMemo>) -> Wake {
        match before {
            None => Wake::Every,
            Some(b) if b.labels != self.labels => Wake::Every,
            Some(b) if b.ours != self.ours || b.state != self.state => Wake::Concerned,
            Some(b) if b.written != self.written && self.rollout.is_some() => Wake::Holder,
            Some(_) => Wake::Nobody,
        }
    }
}

/// Whether an agent pod's change from fingerprint `before` (`None`: first
/// seen) to `now` wakes its rollouts. Not when nothing decisions read
/// changed, nor for a pod first seen unscheduled (it is in no decision, see
/// `AgentPod::of`), nor when the change is the start of a deletion the
/// operator made (`own_deletion`, see [`Triggers::deleting`]).
fn pod_change_wakes(before: Option<u64>, now: u64, own_deletion: bool) -> bool {
    match before {
        None => now != UNSCHEDULED,
        Some(b) => b != now && !own_deletion,
    }
}

/// A DaemonSet by namespace and name (its UID is in its fingerprint).
fn daemonset_key(ds: &DaemonSet) -> String {
    format!("{}/{}", ds.namespace().unwrap_or_default(), ds.name_any())
}

/// Whether preflight holds `sr`'s rollout back: it enforces, and its last
/// run found an error (one that may be the DaemonSet's unsettled pods).
/// Under `Warn` errors do not block, and preflight does not run again once
/// the rollout started.
fn blocked_by_preflight(sr: &SafeRollout) -> bool {
    let enforced = sr
        .spec
        .preflight
        .as_ref()
        .map(|p| p.policy)
        .unwrap_or_default()
        == saferollout_api::PreflightPolicy::Enforce;
    enforced
        && sr
            .status
            .as_ref()
            .and_then(|s| s.preflight.as_ref())
            .is_some_and(|p| !p.passed)
}

/// What the DaemonSet router remembers of a DaemonSet: what decisions read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DaemonSetMemo {
    /// Identity, labels, annotations and owners, deletion, the spec (through
    /// `metadata.generation`, which every spec change moves) and
    /// `status.observedGeneration`. Not the status counts, which move with
    /// every pod change.
    read: u64,
    /// Whether its pods are settled (`saferollout_core::preflight::is_settled`),
    /// which only preflight reads.
    settled: Option<bool>,
}

/// Whom a DaemonSet change wakes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DaemonSetWake {
    Nobody,
    /// Only settled changed: the SafeRollouts preflight blocked (it may pass now).
    BlockedByPreflight,
    /// Every SafeRollout targeting it.
    Every,
}

impl DaemonSetMemo {
    pub(crate) fn of(ds: &DaemonSet) -> Self {
        use std::hash::Hasher;
        let mut h = std::collections::hash_map::DefaultHasher::new();
        let m = &ds.metadata;
        (&m.uid, m.generation, &m.labels, &m.annotations).hash(&mut h);
        m.deletion_timestamp.is_some().hash(&mut h);
        for o in m.owner_references.iter().flatten() {
            (&o.kind, &o.name, &o.uid).hash(&mut h);
        }
        ds.status
            .as_ref()
            .map(|s| s.observed_generation)
            .hash(&mut h);
        DaemonSetMemo {
            read: h.finish(),
            settled: ds
                .status
                .as_ref()
                .map(saferollout_core::preflight::is_settled),
        }
    }

    pub(crate) fn wakes(&self, before: &DaemonSetMemo) -> DaemonSetWake {
        if self.read != before.read {
            DaemonSetWake::Every
        } else if self.settled != before.settled {
            DaemonSetWake::BlockedByPreflight
        } else {
            DaemonSetWake::Nobody
        }
    }
}

/// Whether an agent pod's removal from the cluster wakes its rollouts, given
/// its fingerprint as last seen (`None`: never seen) and whether its node is
/// Ready. Not when it was last seen terminating on a Ready node: decisions
/// already leave a terminating pod out, so its removal changes nothing they
/// read (the DaemonSet controller's replacement pod wakes them once bound).
/// On a node that is not Ready, a terminating pod's deletion time decides
/// whether the node holds a slot of the budget, so its removal may free one.
/// At `maxUnavailable: 1` on 1,000 nodes, one pass in five of a replacement.
fn removal_wakes(before: Option<u64>, node_ready: bool) -> bool {
    before != Some(TERMINATING) || !node_ready
}

/// A pod by UID (a pod recreated under the same name is another pod).
fn pod_key(p: &SlimPod) -> String {
    p.metadata
        .uid
        .clone()
        .unwrap_or_else(|| format!("{}/{}", p.namespace().unwrap_or_default(), p.name_any()))
}

/// The fingerprint of every pod not bound to a node yet.
const UNSCHEDULED: u64 = 0;
/// The fingerprint of every pod being deleted, bound to a node: decisions
/// read no more of it than that and its timestamps, which do not change.
const TERMINATING: u64 = 1;

/// What of an agent pod decisions read: identity, labels and owner, node,
/// deletion, phase, readiness and the containers' states (the pod views of
/// `saferollout_core::views::AgentPod`, and the start times the logs gate
/// reads). Not its resourceVersion, nor timestamps only kubelets look at,
/// nor anything of a pod being deleted ([`TERMINATING`]): every decision
/// leaves such a pod out but for its creation and deletion times, which do
/// not change (the kubelet's last status writes of a terminating pod woke a
/// pass each).
fn pod_fingerprint(p: &SlimPod) -> u64 {
    use std::hash::Hasher;
    let Some(node) = p.spec.as_ref().and_then(|s| s.node_name.as_ref()) else {
        return UNSCHEDULED;
    };
    if p.metadata.deletion_timestamp.is_some() {
        return TERMINATING;
    }
    let mut h = std::collections::hash_map::DefaultHasher::new();
    node.hash(&mut h);
    p.metadata.name.hash(&mut h);
    p.metadata.uid.hash(&mut h);
    p.metadata.labels.hash(&mut h);
    for o in p.metadata.owner_references.iter().flatten() {
        (&o.kind, &o.name, &o.uid).hash(&mut h);
    }
    if let Some(st) = p.status.as_ref() {
        st.phase.hash(&mut h);
        st.start_time.as_ref().map(|t| t.0).hash(&mut h);
        for c in st.conditions.iter().flatten() {
            (&c.type_, &c.status).hash(&mut h);
        }
        for c in st.container_statuses.iter().flatten() {
            (&c.name, c.ready, c.restart_count, c.started).hash(&mut h);
            let state = c.state.as_ref();
            let waiting = state.and_then(|s| s.waiting.as_ref());
            (
                waiting.map(|w| (&w.reason, &w.message)),
                state
                    .and_then(|s| s.running.as_ref())
                    .map(|r| r.started_at.as_ref().map(|t| t.0)),
                state
                    .and_then(|s| s.terminated.as_ref())
                    .map(|t| (&t.reason, t.exit_code)),
            )
                .hash(&mut h);
        }
    }
    // Never collides with the unscheduled and terminating markers.
    h.finish().max(TERMINATING + 1)
}

/// What of a node decisions read: labels, taints, readiness, allocatable.
#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_node_change_wakes_whom_it_concerns() {
        let node = |ready: &str, beat: &str, gpus: &str, labels: serde_json::Value| -> SlimNode {
            serde_json::from_value(
                json!({"metadata": {"name": "n", "labels": labels}, "status": {
                "allocatable": {"example.com/gpu": gpus},
                "conditions": [{"type": "Ready", "status": ready, "lastHeartbeatTime": beat}]}}),
            )
            .unwrap()
        };
        let pool = json!({"pool": "a"});
        let base = NodeMemo::of(&node("True", "2026-01-01T00:00:00Z", "8", pool.clone()));
        assert_eq!(base.wakes(None), Wake::Every, "a node new to the router");
        let wakes = |n: SlimNode| NodeMemo::of(&n).wakes(Some(&base));
        assert_eq!(
            wakes(node("True", "2026-01-01T00:00:10Z", "8", pool.clone())),
            Wake::Nobody,
            "a heartbeat"
        );
        assert_eq!(
            wakes(node("False", "2026-01-01T00:00:00Z", "8", pool.clone())),
            Wake::Concerned
        );
        assert_eq!(
            wakes(node("True", "2026-01-01T00:00:00Z", "0", pool.clone())),
            Wake::Concerned
        );
        let held =
            json!({"pool": "a", "saferollout.dev/rollout": "ns.r", "saferollout.dev/stage": "0"});
        let labelled = NodeMemo::of(&node("True", "2026-01-01T00:00:00Z", "8", held.clone()));
        assert_eq!(
            labelled.wakes(Some(&base)),
            Wake::Concerned,
            "our own labels"
        );
        assert_eq!(
            NodeMemo::of(&node("True", "2026-01-01T00:00:10Z", "8", held)).wakes(Some(&labelled)),
            Wake::Holder,
            "a held node's heartbeat: its gates may wait for a fresh status"
        );
        assert_eq!(labelled.rollout.as_deref(), Some("ns.r"));
        assert_eq!(
            base.wakes(Some(&labelled)),
            Wake::Concerned,
            "our labels removed"
        );
        assert_eq!(
            wakes(node(
                "True",
                "2026-01-01T00:00:00Z",
                "8",
                json!({"pool": "b"})
            )),
            Wake::Every,
            "another label: any DaemonSet's nodeSelector may now match"
        );
    }

    #[test]
    fn a_node_selector_matches_a_subset_of_the_labels() {
        let labels: std::collections::BTreeMap<String, String> = [
            ("pool".to_string(), "a".to_string()),
            ("zone".to_string(), "z".to_string()),
        ]
        .into();
        let sel = |pairs: &'static [(&'static str, &'static str)]| Some(pairs.iter().copied());
        assert!(selects(sel(&[("pool", "a")]), Some(&labels)));
        assert!(selects(sel(&[]), Some(&labels)));
        assert!(!selects(sel(&[("pool", "b")]), Some(&labels)));
        assert!(!selects(
            sel(&[("pool", "a"), ("gpu", "yes")]),
            Some(&labels)
        ));
        assert!(!selects(sel(&[("pool", "a")]), None));
        assert!(
            selects(None::<std::vec::IntoIter<(&str, &str)>>, None),
            "no selector: every node"
        );
    }

    #[test]
    fn a_pod_fingerprint_moves_with_what_decisions_read_only() {
        let pod = |node: Option<&str>, ready: &str, rv: &str, probe: &str| -> SlimPod {
            let mut v = json!({"metadata": {"name": "p", "uid": "u", "resourceVersion": rv,
                    "labels": {"controller-revision-hash": "r"}},
                "spec": {"containers": [{"name": "c"}]},
                "status": {"phase": "Running", "conditions": [
                    {"type": "Ready", "status": ready, "lastProbeTime": probe}]}});
            if let Some(n) = node {
                v["spec"]["nodeName"] = json!(n);
            }
            let mut p: SlimPod = serde_json::from_value(v).unwrap();
            prune::pod(&mut p);
            p
        };
        let base = pod_fingerprint(&pod(Some("n1"), "True", "1", "2026-01-01T00:00:00Z"));
        assert_eq!(
            base,
            pod_fingerprint(&pod(Some("n1"), "True", "2", "2026-01-01T00:00:09Z")),
            "a new resourceVersion or probe time alone is no change"
        );
        assert_ne!(
            base,
            pod_fingerprint(&pod(Some("n1"), "False", "2", "2026-01-01T00:00:00Z"))
        );
        assert_ne!(
            base,
            pod_fingerprint(&pod(Some("n2"), "True", "1", "2026-01-01T00:00:00Z"))
        );
        assert_eq!(
            pod_fingerprint(&pod(None, "False", "1", "2026-01-01T00:00:00Z")),
            UNSCHEDULED
        );
        let mut deleting = pod(Some("n1"), "True", "1", "2026-01-01T00:00:00Z");
        deleting.metadata.deletion_timestamp = Some(
            k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(jiff::Timestamp::UNIX_EPOCH),
        );
        let deleting_fp = pod_fingerprint(&deleting);
        assert_ne!(base, deleting_fp);
        let mut terminated = deleting.clone();
        terminated.status.as_mut().unwrap().phase = Some("Succeeded".into());
        terminated.status.as_mut().unwrap().conditions = None;
        assert_eq!(
            deleting_fp,
            pod_fingerprint(&terminated),
            "a terminating pod's status is in no decision"
        );
        assert_eq!(deleting_fp, TERMINATING);
    }

    #[test]
    fn a_pod_removal_wakes_unless_it_was_terminating_on_a_ready_node() {
        assert!(!removal_wakes(Some(TERMINATING), true), "seen terminating");
        assert!(
            removal_wakes(Some(TERMINATING), false),
            "its node is not Ready: the removal may free a slot"
        );
        assert!(
            removal_wakes(Some(42), true),
            "gone at once, never seen terminating"
        );
        assert!(removal_wakes(None, true), "never seen");
    }

    #[test]
    fn only_an_enforced_failed_preflight_blocks() {
        let sr = |policy: Option<&str>, passed: Option<bool>| -> SafeRollout {
            let mut v = json!({
                "apiVersion": "saferollout.dev/v1alpha1", "kind": "SafeRollout",
                "metadata": {"name": "sr", "namespace": "ns"},
                "spec": {"targetRef": {"name": "plugin"}}
            });
            if let Some(p) = policy {
                v["spec"]["preflight"] = json!({"policy": p});
            }
            if let Some(passed) = passed {
                v["status"] = json!({"preflight": {"revision": "r2", "passed": passed, "errors": 1, "warnings": 0}});
            }
            serde_json::from_value(v).unwrap()
        };
        assert!(blocked_by_preflight(&sr(Some("Enforce"), Some(false))));
        assert!(!blocked_by_preflight(&sr(Some("Enforce"), Some(true))));
        assert!(!blocked_by_preflight(&sr(Some("Enforce"), None)));
        assert!(!blocked_by_preflight(&sr(Some("Warn"), Some(false))));
        assert!(
            !blocked_by_preflight(&sr(None, Some(false))),
            "Warn by default"
        );
    }

    #[test]
    fn a_daemonset_change_wakes_only_for_what_decisions_read() {
        let ds = |generation: i64, observed: i64, ready: i32, annotation: &str| -> DaemonSet {
            serde_json::from_value(json!({
                "metadata": {"name": "plugin", "namespace": "ns", "uid": "u",
                    "generation": generation, "annotations": {"a": annotation}},
                "spec": {"selector": {}, "template": {}},
                "status": {"observedGeneration": observed, "desiredNumberScheduled": 3,
                    "currentNumberScheduled": 3, "numberReady": ready, "numberAvailable": ready,
                    "numberMisscheduled": 0, "updatedNumberScheduled": ready}
            }))
            .unwrap()
        };
        let settled = DaemonSetMemo::of(&ds(2, 2, 3, "x"));
        let unsettled = DaemonSetMemo::of(&ds(2, 2, 2, "x"));
        assert_eq!(
            DaemonSetMemo::of(&ds(2, 2, 1, "x")).wakes(&unsettled),
            DaemonSetWake::Nobody,
            "status counts alone"
        );
        assert_eq!(
            settled.wakes(&unsettled),
            DaemonSetWake::BlockedByPreflight,
            "settled again: preflight may pass now"
        );
        assert_eq!(unsettled.wakes(&settled), DaemonSetWake::BlockedByPreflight);
        for changed in [ds(3, 2, 3, "x"), ds(2, 1, 3, "x"), ds(2, 2, 3, "y")] {
            assert_eq!(
                DaemonSetMemo::of(&changed).wakes(&settled),
                DaemonSetWake::Every,
                "spec (generation), observedGeneration or annotations"
            );
        }
    }

    #[test]
    fn a_pod_change_wakes_unless_nothing_read_changed_or_it_is_our_own_delete() {
        assert!(
            !pod_change_wakes(None, UNSCHEDULED, false),
            "created, not scheduled"
        );
        assert!(pod_change_wakes(None, 7, false), "first seen scheduled");
        assert!(pod_change_wakes(Some(UNSCHEDULED), 7, false), "scheduled");
        assert!(!pod_change_wakes(Some(7), 7, false), "nothing read changed");
        assert!(pod_change_wakes(Some(7), 8, false), "changed, e.g. Ready");
        assert!(
            !pod_change_wakes(Some(7), 8, true),
            "the deletion the operator made"
        );
        assert!(
            pod_change_wakes(None, 8, true),
            "a pod first seen while being deleted is news"
        );
    }

    #[test]
    fn wakes_are_counted_by_cause_on_the_leader_only() {
        let metrics = Metrics::default();
        let t = Triggers::new(&metrics);
        let r = || ObjectRef::<SafeRollout>::new("sr").within("ns");
        t.send(r(), Cause::AgentPod);
        let count = |cause: &str| {
            metrics
                .encode()
                .lines()
                .find(|l| l.starts_with(&format!("saferollout_wakes_total{{cause=\"{cause}\"}}")))
                .and_then(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        };
        assert_eq!(count("agent_pod"), Some(0), "a follower queues nothing");
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        t.attach(Some(tx));
        t.send(r(), Cause::AgentPod);
        t.send(r(), Cause::AgentPod);
        t.send(r(), Cause::DaemonSet);
        assert_eq!(count("agent_pod"), Some(2));
        assert_eq!(count("daemonset"), Some(1));
        assert_eq!(count("node"), Some(0));
        for (i, c) in Cause::ALL.iter().enumerate() {
            assert_eq!(*c as usize, i, "ALL is in declaration order");
        }
        let mut queued = 0;
        while rx.try_recv().is_ok() {
            queued += 1;
        }
        assert_eq!(queued, 3);
    }

    #[test]
    fn own_deletions_are_forgotten_once_seen_or_failed() {
        let t = Triggers::default();
        t.deleting("u1");
        t.deleting("u2");
        assert!(t.take_own_deletion("u1"));
        assert!(!t.take_own_deletion("u1"), "taken once");
        t.not_deleting("u2");
        assert!(!t.take_own_deletion("u2"));
        t.deleting("u3");
        t.forget_own_deletions();
        assert!(!t.take_own_deletion("u3"));
    }

    #[test]
    fn one_namespace_of_the_cluster_wide_store_keeps_no_buffer_of_the_cluster() {
        let (store, mut writer) = reflector::store::<SlimPod>();
        let pod = |ns: &str, i: usize| -> SlimPod {
            serde_json::from_value(json!({"metadata": {"name": format!("p{i}"), "namespace": ns}}))
                .unwrap()
        };
        for i in 0..1000 {
            writer.apply_watcher_event(&watcher::Event::Apply(pod("big", i)));
        }
        for i in 0..3 {
            writer.apply_watcher_event(&watcher::Event::Apply(pod("small", i)));
        }
        let stores = NsStores {
            all: Some(store),
            by_namespace: HashMap::new(),
        };
        let small = stores.in_namespace("small");
        assert_eq!(small.len(), 3);
        assert!(
            small
                .iter()
                .all(|p| p.metadata.namespace.as_deref() == Some("small")),
            "{small:?}"
        );
        assert!(
            small.capacity() < 100,
            "kept room for {} pods",
            small.capacity()
        );
        assert_eq!(stores.in_namespace("big").len(), 1000);
    }

    #[test]
    fn a_cached_safe_rollout_keeps_its_annotations_and_status_not_its_managed_fields() {
        let mut r: saferollout_api::SafeRollout = serde_json::from_value(json!({
            "apiVersion": "saferollout.dev/v1alpha1", "kind": "SafeRollout",
            "metadata": {"name": "r", "namespace": "ns",
                "annotations": {"saferollout.dev/retry": "1"},
                "managedFields": [{"manager": "saferollout-operator", "operation": "Apply",
                    "fieldsType": "FieldsV1", "fieldsV1": {"f:status": {"f:stages": {}}}}]},
            "spec": {"targetRef": {"name": "agent"}},
            "status": {"targetRevision": "abc"}}))
        .unwrap();
        let before = r.clone();
        prune::rollout(&mut r);
        assert!(r.metadata.managed_fields.is_none());
        assert_eq!(r.metadata.annotations, before.metadata.annotations);
        assert_eq!(r.spec, before.spec);
        assert_eq!(r.status, before.status);
    }

    #[test]
    fn pruning_keeps_what_decisions_read() {
        let mut n: SlimNode = serde_json::from_value(json!({"metadata": {"name": "n", "labels": {"a": "b"}, "annotations": {"x": "y"}},
            "spec": {"taints": [{"key": "k", "effect": "NoSchedule"}]},
            "status": {"allocatable": {"cpu": "4", "example.com/gpu": "8", "a.example/x": "2", "memory": "1Gi"}, "images": [{"names": ["i"]}],
                "conditions": [{"type": "Ready", "status": "True"}, {"type": "MemoryPressure", "status": "False"}]}}))
        .unwrap();
        prune::node(&mut n);
        let v = saferollout_core::views::NodeView::of(&n);
        assert!(v.ready);
        assert_eq!(v.allocatable_count("example.com/gpu"), 8);
        assert_eq!(v.allocatable_count("a.example/x"), 2);
        assert_eq!(v.allocatable_count("cpu"), 0, "not an extended resource");
        assert_eq!(v.taints.len(), 1);
        assert_eq!(v.labels.len(), 1);
        assert!(n.metadata.annotations.is_none());
        assert_eq!(
            n.status
                .as_ref()
                .unwrap()
                .allocatable
                .as_ref()
                .unwrap()
                .len(),
            2
        );

        let mut p: SlimPod = serde_json::from_value(json!({"metadata": {"name": "p", "generateName": "plugin-",
                "labels": {"controller-revision-hash": "r", "app": "plugin", "pod-template-generation": "2"}, "annotations": {"x": "y"}},
            "spec": {"nodeName": "n", "containers": [{"name": "c", "image": "i", "env": [{"name": "TOKEN", "value": "s3cr3t"}]}]},
            "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}, {"type": "Initialized", "status": "True"}]}}))
        .unwrap();
        prune::pod(&mut p);
        let v = saferollout_core::views::AgentPod::of(&p).unwrap();
        assert!(v.ready && v.running);
        assert_eq!(v.node, "n");
        assert_eq!(v.revision, "r");
        assert_eq!(
            p.metadata.labels.as_ref().unwrap().len(),
            1,
            "only the revision hash label is kept"
        );
        assert!(p.metadata.generate_name.is_none());
        assert!(
            !serde_json::to_string(&p).unwrap().contains("s3cr3t"),
            "no env values kept"
        );
        assert!(p.metadata.annotations.is_none());
        assert_eq!(
            p.status
                .as_ref()
                .unwrap()
                .conditions
                .as_ref()
                .unwrap()
                .len(),
            1
        );
    }
}
