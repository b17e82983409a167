//! What the device gates read of the cluster, and how it is kept bounded.
//!
//! - ResourceSlices (cluster-wide, `resource.k8s.io/v1`): one or a few per
//!   node and driver; pruned to what gates read (pools, devices' names,
//!   capacity and taints, shared counters; no attributes).
//! - ResourceClaims (cluster-wide): one per DRA workload at most, bounded by
//!   the devices; pruned to their allocation and reservations.
//! - The operator's own quarantine DeviceTaintRules (label selector; the
//!   served version found by discovery at start: `v1` on 1.37, an older one
//!   on older clusters) and its claims probes (pods in the watched
//!   namespaces, label selector).
//! - Workload pods, which are not cached cluster-wide: [`NodePods`] watches
//!   only the pods of the nodes some rollout with a deviceHealth or claims
//!   gate holds, one watch per node with a field selector `spec.nodeName=`
//!   (as a kubelet watches its own pods: the API server's watch cache
//!   indexes pods by node), and keeps only pods that use devices (extended
//!   resources or ResourceClaims), pruned. Beyond [`PER_NODE_WATCHES`] held
//!   nodes, one cluster-wide watch replaces them (a stage that large covers
//!   much of the cluster anyway, and one stream is cheaper than hundreds of
//!   connections), still keeping only the held nodes' device pods; it lists
//!   again when a stage adds nodes.
//!
//! Discovery decides at start what is served; with `--device-gates=false`
//! (the chart's `deviceGates.enabled: false`) nothing of this is watched and
//! the device gates say so.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, Weak};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Container, Pod, PodSpec, ResourceRequirements};
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use kube::api::{Api, ApiResource, DynamicObject};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::watcher::Event;
use kube::runtime::{WatchStreamExt, watcher as watch};
use kube::{Client, ResourceExt};
use saferollout_api::{PROBE_LABEL, ROLLOUT_LABEL, SafeRollout, SafeRolloutStatus};
use saferollout_core::devices::{DeviceEvidence, claim_node};
use tokio::task::AbortHandle;
use tracing::{debug, info, warn};

use super::RolloutKey;
// The caches' leaves only, never `Caches`: the caches hold the device caches.
use super::caches::stores::{NsStores, watch_config};
use super::caches::triggers::{Cause, Triggers};
use super::freshness::{self, Freshness};
use crate::metrics::Metrics;

/// Above this many held nodes (the default of `--per-node-pod-watches`),
/// one cluster-wide pod watch replaces the per-node ones.
pub const PER_NODE_WATCHES: usize = 64;

/// The versions a DeviceTaintRule may be served at, preferred first.
const RULE_VERSIONS: &[&str] = &["v1", "v1beta2", "v1beta1", "v1alpha3"];

/// What discovery found.
#[derive(Debug, Clone, Default)]
pub struct DeviceApis {
    /// Why the device gates observe nothing (not served, turned off).
    pub unavailable: Option<String>,
    /// The served DeviceTaintRule resource, if any.
    pub rules: Option<ApiResource>,
    /// Held nodes watched one by one before one cluster-wide pod watch.
    pub per_node_watches: usize,
}

/// Asks the API server what `resource.k8s.io` serves.
pub async fn discover(client: &Client, enabled: bool) -> DeviceApis {
    if !enabled {
        return DeviceApis {
            unavailable: Some("the device gates are turned off (--device-gates=false)".into()),
            rules: None,
            per_node_watches: PER_NODE_WATCHES,
        };
    }
    // Asked once, at start-up: an answer the API server would not repeat
    // (429, 5xx, a dropped connection) is asked again, backing off, rather
    // than taken as "not served", which would leave the device gates unable
    // to judge (failing at the progress deadline) for the process's life.
    let group = crate::retry::retry_passing(
        "discovering resource.k8s.io",
        |e| !is_lasting(e),
        || kube::discovery::group(client, "resource.k8s.io"),
    )
    .await;
    let group = match group {
        Ok(g) => g,
        Err(e) => {
            warn!(error = %e, "resource.k8s.io is not served: the DRA gates cannot judge");
            return DeviceApis {
                unavailable: Some(format!("resource.k8s.io is not served ({e})")),
                rules: None,
                per_node_watches: PER_NODE_WATCHES,
            };
        }
    };
    let served = |ver: &str, kind: &str| {
        group
            .versioned_resources(ver)
            .into_iter()
            .find(|(ar, _)| ar.kind == kind)
            .map(|(ar, _)| ar)
    };
    let unavailable = (served("v1", "ResourceSlice").is_none() || served("v1", "ResourceClaim").is_none())
        .then(|| "resource.k8s.io/v1 ResourceSlices and ResourceClaims are not served (Kubernetes >= 1.34 serves them)".to_string());
    let rules = RULE_VERSIONS
        .iter()
        .find_map(|v| served(v, "DeviceTaintRule"));
    info!(
        dra = unavailable.is_none(),
        device_taint_rules = ?rules.as_ref().map(|r| r.api_version.clone()),
        "device APIs discovered"
    );
    DeviceApis {
        unavailable,
        rules,
        per_node_watches: PER_NODE_WATCHES,
    }
}

/// A discovery answer that will stand: the group or one of its versions is
/// not there (a 404, kube's "missing group"), or we may not read it.
fn is_lasting(e: &kube::Error) -> bool {
    match e {
        kube::Error::Discovery(_) => true,
        kube::Error::Api(s) => matches!(s.code, 401 | 403 | 404),
        _ => false,
    }
}

/// The device caches.
pub struct DeviceCaches {
    pub unavailable: Option<String>,
    pub slices: Option<Store<ResourceSlice>>,
    pub claims: Option<Store<ResourceClaim>>,
    /// The operator's quarantine rules, and the resource they are served as.
    pub rules: Option<(Store<DynamicObject>, ApiResource)>,
    /// Probe pods, per watched namespace (`None`: all).
    pub probes: Vec<(Option<String>, Store<Pod>)>,
    pub node_pods: Arc<NodePods>,
}

/// The writers of [`DeviceCaches`], handed to the reflectors.
pub struct DeviceWriters {
    slices: Option<reflector::store::Writer<ResourceSlice>>,
    claims: Option<reflector::store::Writer<ResourceClaim>>,
    rules: Option<(reflector::store::Writer<DynamicObject>, ApiResource)>,
    probes: Vec<(Option<String>, reflector::store::Writer<Pod>)>,
}

/// The stores, before their reflectors run.
pub fn stores(
    apis: &DeviceApis,
    namespaces: &[String],
    client: &Client,
    metrics: &Arc<Metrics>,
    triggers: &Arc<Triggers>,
) -> (DeviceCaches, DeviceWriters) {
    let on = apis.unavailable.is_none();
    fn typed<K>(on: bool) -> Option<(Store<K>, reflector::store::Writer<K>)>
    where
        K: kube::Resource<DynamicType = ()> + Clone + 'static,
    {
        on.then(|| {
            let w = reflector::store::Writer::default();
            (w.as_reader(), w)
        })
    }
    let (slices, slices_w) = typed::<ResourceSlice>(on).unzip();
    let (claims, claims_w) = typed::<ResourceClaim>(on).unzip();
    let rules = apis.rules.clone().filter(|_| on).map(|ar| {
        let w = reflector::store::Writer::<DynamicObject>::new(ar.clone());
        ((w.as_reader(), ar.clone()), (w, ar))
    });
    let (rules, rules_w) = rules.unzip();
    let scopes: Vec<Option<String>> = if namespaces.is_empty() {
        vec![None]
    } else {
        namespaces.iter().cloned().map(Some).collect()
    };
    let mut probes = Vec::new();
    let mut probes_w = Vec::new();
    if on {
        for ns in scopes {
            let w = reflector::store::Writer::default();
            probes.push((ns.clone(), w.as_reader()));
            probes_w.push((ns, w));
        }
    }
    let node_pods = NodePods::new(
        client.clone(),
        metrics.clone(),
        triggers.clone(),
        on,
        apis.per_node_watches,
    );
    (
        DeviceCaches {
            unavailable: apis.unavailable.clone(),
            slices,
            claims,
            rules,
            probes,
            node_pods,
        },
        DeviceWriters {
            slices: slices_w,
            claims: claims_w,
            rules: rules_w,
            probes: probes_w,
        },
    )
}

/// Resolves once every device store that runs has been listed.
pub async fn wait_synced(d: &DeviceCaches) {
    if let Some(s) = &d.slices {
        let _ = s.wait_until_ready().await;
    }
    if let Some(s) = &d.claims {
        let _ = s.wait_until_ready().await;
    }
    if let Some((s, _)) = &d.rules {
        let _ = s.wait_until_ready().await;
    }
    for (_, s) in &d.probes {
        let _ = s.wait_until_ready().await;
    }
}

/// What of each object is kept.
mod prune {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;

    use super::*;

    /// A slice: its pool, devices (names, capacities, taints), counters, and
    /// when it was last written. Of its managed fields only the newest time
    /// is kept, as one entry with nothing else (the gates judge a pool only
    /// when written after the new driver became Ready:
    /// `saferollout_core::gates::freshness::slice_written` reads it).
    pub fn slice(s: &mut ResourceSlice) {
        let written = s
            .metadata
            .managed_fields
            .iter()
            .flatten()
            .filter_map(|m| m.time.clone())
            .max_by_key(|t| t.0);
        s.metadata.managed_fields = written.map(|time| {
            vec![ManagedFieldsEntry {
                time: Some(time),
                ..Default::default()
            }]
        });
        s.metadata.annotations = None;
        for d in s.spec.devices.iter_mut().flatten() {
            d.attributes = None;
            d.consumes_counters = None;
        }
    }

    pub fn claim(c: &mut ResourceClaim) {
        c.metadata.managed_fields = None;
        c.metadata.annotations = None;
        c.spec = Default::default();
        if let Some(st) = c.status.as_mut() {
            st.devices = None;
            if let Some(a) = st.allocation.as_mut() {
                a.devices.iter_mut().for_each(|d| d.config = None);
            }
        }
    }

    /// A workload pod: who it is, where, the devices it asks for, its phase
    /// and failure messages, and the kubelet's device health.
    pub fn pod(p: &mut Pod) {
        p.metadata.managed_fields = None;
        p.metadata.annotations = None;
        p.metadata.labels = None;
        p.metadata.owner_references = None;
        if let Some(spec) = p.spec.take() {
            p.spec = Some(PodSpec {
                node_name: spec.node_name,
                restart_policy: spec.restart_policy,
                resource_claims: spec.resource_claims,
                containers: spec
                    .containers
                    .into_iter()
                    .map(|c| Container {
                        name: c.name,
                        resources: c.resources.map(|r| ResourceRequirements {
                            claims: r.claims,
                            limits: r
                                .limits
                                .map(|l| l.into_iter().filter(|(k, _)| k.contains('/')).collect()),
                            ..Default::default()
                        }),
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            });
        }
        if let Some(st) = p.status.as_mut() {
            st.conditions = None;
            st.host_ip = None;
            st.host_ips = None;
            st.pod_ip = None;
            st.pod_ips = None;
            st.init_container_statuses = None;
            st.ephemeral_container_statuses = None;
            for c in st.container_statuses.iter_mut().flatten() {
                c.image_id.clear();
                c.container_id = None;
                c.last_state = None;
                c.volume_mounts = None;
            }
        }
    }

    pub fn probe(p: &mut Pod) {
        p.metadata.managed_fields = None;
    }
}

/// Whether a pod uses devices: an extended resource in a container's limits
/// or a ResourceClaim.
pub fn uses_devices(p: &Pod) -> bool {
    let Some(spec) = p.spec.as_ref() else {
        return false;
    };
    spec.resource_claims.as_ref().is_some_and(|c| !c.is_empty())
        || spec.containers.iter().any(|c| {
            c.resources
                .as_ref()
                .and_then(|r| r.limits.as_ref())
                .is_some_and(|l| {
                    l.keys().any(|k| {
                        k.contains('/')
                            && !k.contains("kubernetes.io/")
                            && !k.starts_with("requests.")
                    })
                })
        })
}

/// Spawns the device reflectors; their events wake the rollouts they concern,
/// found in `rollouts`.
pub fn spawn(
    client: &Client,
    rollouts: &NsStores<SafeRollout>,
    writers: DeviceWriters,
    freshness: &Arc<Freshness>,
    metrics: &Arc<Metrics>,
    triggers: &Arc<Triggers>,
) {
    let send = |rollouts: &NsStores<SafeRollout>,
                triggers: &Arc<Triggers>,
                pick: &dyn Fn(&SafeRollout) -> bool| {
        for sr in rollouts.every() {
            if pick(&sr) {
                triggers.send(ObjectRef::from_obj(&*sr), Cause::Device);
            }
        }
    };
    if let Some(w) = writers.slices {
        let (c, t) = (rollouts.clone(), triggers.clone());
        freshness::reflect(
            Api::<ResourceSlice>::all(client.clone()),
            watch_config(),
            w,
            freshness,
            metrics,
            prune::slice,
            move |ev| match ev {
                Event::Apply(s) | Event::Delete(s) => {
                    let driver = s.spec.driver.as_str();
                    send(&c, &t, &|sr| sr.spec.device_driver() == Some(driver));
                }
                Event::InitDone => send(&c, &t, &|sr| sr.spec.device_driver().is_some()),
                _ => {}
            },
        );
    }
    if let Some(w) = writers.claims {
        let (c, t) = (rollouts.clone(), triggers.clone());
        freshness::reflect(
            Api::<ResourceClaim>::all(client.clone()),
            watch_config(),
            w,
            freshness,
            metrics,
            prune::claim,
            move |ev| match ev {
                Event::Apply(claim) | Event::Delete(claim) => {
                    let node = claim_node(claim);
                    let ns = claim.metadata.namespace.as_deref();
                    send(&c, &t, &|sr| {
                        has_claims_gate(sr)
                            && (sr.metadata.namespace.as_deref() == ns
                                || node.is_some_and(|n| {
                                    sr.status.as_ref().is_some_and(|st| st.holds_node(n))
                                }))
                    });
                }
                Event::InitDone => send(&c, &t, &has_claims_gate),
                _ => {}
            },
        );
    }
    if let Some((w, ar)) = writers.rules {
        let (c, t) = (rollouts.clone(), triggers.clone());
        let api: Api<DynamicObject> = Api::all_with(client.clone(), &ar);
        freshness::reflect(
            api,
            watch_config().labels(ROLLOUT_LABEL),
            w,
            freshness,
            metrics,
            |o: &mut DynamicObject| o.metadata.managed_fields = None,
            move |ev| match ev {
                Event::Apply(r) | Event::Delete(r) => {
                    let id = r.labels().get(ROLLOUT_LABEL).cloned().unwrap_or_default();
                    send(&c, &t, &|sr| id_of(sr) == id);
                }
                Event::InitDone => send(&c, &t, &|_| true),
                _ => {}
            },
        );
    }
    for (ns, w) in writers.probes {
        let (c, t) = (rollouts.clone(), triggers.clone());
        let api: Api<Pod> = match &ns {
            Some(ns) => Api::namespaced(client.clone(), ns),
            None => Api::all(client.clone()),
        };
        freshness::reflect(
            api,
            watch_config().labels(PROBE_LABEL),
            w,
            freshness,
            metrics,
            prune::probe,
            move |ev| match ev {
                Event::Apply(p) | Event::Delete(p) => {
                    let id = p.labels().get(PROBE_LABEL).cloned().unwrap_or_default();
                    send(&c, &t, &|sr| id_of(sr) == id);
                }
                Event::InitDone => send(&c, &t, &has_claims_gate),
                _ => {}
            },
        );
    }
}

fn id_of(sr: &SafeRollout) -> String {
    super::rollout_id(
        sr.metadata.namespace.as_deref().unwrap_or_default(),
        sr.metadata.name.as_deref().unwrap_or_default(),
    )
}

fn has_claims_gate(sr: &SafeRollout) -> bool {
    sr.spec.gates.as_ref().is_some_and(|g| g.claims.is_some())
}

// ---------------------------------------------------------------------------
// Workload pods of the held nodes

/// Pods that use devices on the nodes rollouts hold (see the module doc).
pub struct NodePods {
    client: Client,
    metrics: Arc<Metrics>,
    triggers: Arc<Triggers>,
    enabled: bool,
    per_node_limit: usize,
    me: Weak<NodePods>,
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    wants: HashMap<RolloutKey, BTreeSet<String>>,
    union: BTreeSet<String>,
    watches: Watches,
    nodes: HashMap<String, NodeEntry>,
    /// Bumped each time the watches change, so a stopped watch's late events
    /// are ignored.
    epoch: u64,
}

#[derive(Default)]
enum Watches {
    #[default]
    None,
    PerNode(HashMap<String, (AbortHandle, u64)>),
    Cluster(AbortHandle, u64),
}

#[derive(Default)]
struct NodeEntry {
    listed: bool,
    pods: BTreeMap<String, Arc<Pod>>,
}

/// What one watch covers.
#[derive(Clone, Debug)]
enum Scope {
    Node(String),
    Cluster,
}

impl NodePods {
    fn new(
        client: Client,
        metrics: Arc<Metrics>,
        triggers: Arc<Triggers>,
        enabled: bool,
        per_node_limit: usize,
    ) -> Arc<Self> {
        Arc::new_cyclic(|me| NodePods {
            client,
            metrics,
            triggers,
            enabled,
            per_node_limit,
            me: me.clone(),
            inner: Mutex::new(Inner::default()),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The pods of `node` that use devices, when its pods have been listed.
    pub fn pods(&self, node: &str) -> Option<Vec<Arc<Pod>>> {
        let inner = self.lock();
        let e = inner.nodes.get(node).filter(|e| e.listed)?;
        Some(e.pods.values().cloned().collect())
    }

    /// How many pod watches run (for tests and logs).
    pub fn watches(&self) -> usize {
        match &self.lock().watches {
            Watches::None => 0,
            Watches::PerNode(m) => m.len(),
            Watches::Cluster(..) => 1,
        }
    }

    /// Sets the nodes rollout `key` needs watched, starting and stopping
    /// watches as the union of every rollout's needs changes.
    pub fn set_wants(&self, key: &RolloutKey, nodes: BTreeSet<String>) {
        if !self.enabled {
            return;
        }
        let mut inner = self.lock();
        if nodes.is_empty() {
            inner.wants.remove(key);
        } else {
            inner.wants.insert(key.clone(), nodes);
        }
        let union: BTreeSet<String> = inner.wants.values().flatten().cloned().collect();
        if union == inner.union {
            return;
        }
        let grew = !union.is_subset(&inner.union);
        inner.union = union.clone();
        inner.nodes.retain(|n, _| union.contains(n));
        let cluster_wide = union.len() > self.per_node_limit;
        match std::mem::take(&mut inner.watches) {
            Watches::Cluster(task, epoch) if cluster_wide && !grew => {
                inner.watches = Watches::Cluster(task, epoch);
            }
            Watches::Cluster(task, _) => {
                task.abort();
                inner.nodes.clear();
                self.start(&mut inner, cluster_wide);
            }
            Watches::PerNode(mut tasks) if !cluster_wide => {
                tasks.retain(|n, (task, _)| {
                    let keep = union.contains(n);
                    if !keep {
                        task.abort();
                    }
                    keep
                });
                inner.watches = Watches::PerNode(tasks);
                self.start(&mut inner, false);
            }
            Watches::PerNode(tasks) => {
                for (task, _) in tasks.values() {
                    task.abort();
                }
                inner.nodes.clear();
                self.start(&mut inner, true);
            }
            Watches::None => self.start(&mut inner, cluster_wide),
        }
    }

    /// Starts what is missing: a watch per unwatched node, or the cluster-wide one.
    fn start(&self, inner: &mut Inner, cluster_wide: bool) {
        let Some(me) = self.me.upgrade() else { return };
        if inner.union.is_empty() {
            inner.watches = Watches::None;
            return;
        }
        if cluster_wide {
            inner.epoch += 1;
            let epoch = inner.epoch;
            let task = tokio::spawn(me.run(Scope::Cluster, epoch)).abort_handle();
            inner.watches = Watches::Cluster(task, epoch);
            info!(
                nodes = inner.union.len(),
                "watching the pods of the rollouts' nodes with one cluster-wide watch"
            );
            return;
        }
        let mut tasks = match std::mem::take(&mut inner.watches) {
            Watches::PerNode(t) => t,
            _ => HashMap::new(),
        };
        for node in inner.union.clone() {
            if tasks.contains_key(&node) {
                continue;
            }
            inner.epoch += 1;
            let epoch = inner.epoch;
            let task =
                tokio::spawn(me.clone().run(Scope::Node(node.clone()), epoch)).abort_handle();
            tasks.insert(node, (task, epoch));
        }
        inner.watches = Watches::PerNode(tasks);
    }

    /// Whether the watch `(scope, epoch)` is still the current one.
    fn current(inner: &Inner, scope: &Scope, epoch: u64) -> bool {
        match (&inner.watches, scope) {
            (Watches::PerNode(m), Scope::Node(n)) => m.get(n).is_some_and(|(_, e)| *e == epoch),
            (Watches::Cluster(_, e), Scope::Cluster) => *e == epoch,
            _ => false,
        }
    }

    async fn run(self: Arc<Self>, scope: Scope, epoch: u64) {
        let api: Api<Pod> = Api::all(self.client.clone());
        let config = match &scope {
            Scope::Node(n) => watch_config().fields(&format!("spec.nodeName={n}")),
            Scope::Cluster => watch_config().fields("spec.nodeName!="),
        };
        let mut listing: Option<HashMap<String, BTreeMap<String, Arc<Pod>>>> = None;
        let mut stream = std::pin::pin!(watch(api, config).default_backoff());
        while let Some(item) = stream.next().await {
            let ev = match item {
                Ok(ev) => ev,
                Err(e) => {
                    debug!(?scope, error = %e, "pod watch error; it backs off and lists again");
                    self.metrics.watch_restarted("pods of rollout nodes");
                    continue;
                }
            };
            let mut touched: BTreeSet<String> = BTreeSet::new();
            {
                let mut inner = self.lock();
                if !Self::current(&inner, &scope, epoch) {
                    return;
                }
                match ev {
                    Event::Init => listing = Some(HashMap::new()),
                    Event::InitApply(mut p) => {
                        if let (Some(l), Some(node)) = (listing.as_mut(), node_of(&p))
                            && inner.union.contains(&node)
                            && uses_devices(&p)
                        {
                            prune::pod(&mut p);
                            l.entry(node)
                                .or_default()
                                .insert(p.uid().unwrap_or_default(), Arc::new(p));
                        }
                    }
                    Event::InitDone => {
                        let mut listed = listing.take().unwrap_or_default();
                        let nodes: Vec<String> = match &scope {
                            Scope::Node(n) => vec![n.clone()],
                            Scope::Cluster => inner.union.iter().cloned().collect(),
                        };
                        for n in nodes {
                            let pods = listed.remove(&n).unwrap_or_default();
                            inner
                                .nodes
                                .insert(n.clone(), NodeEntry { listed: true, pods });
                            touched.insert(n);
                        }
                    }
                    Event::Apply(mut p) => {
                        if let Some(node) = node_of(&p).filter(|n| inner.union.contains(n)) {
                            let uid = p.uid().unwrap_or_default();
                            let entry = inner.nodes.entry(node.clone()).or_default();
                            if uses_devices(&p) {
                                prune::pod(&mut p);
                                entry.pods.insert(uid, Arc::new(p));
                            } else {
                                entry.pods.remove(&uid);
                            }
                            touched.insert(node);
                        }
                    }
                    Event::Delete(p) => {
                        if let Some(node) = node_of(&p)
                            && let Some(entry) = inner.nodes.get_mut(&node)
                            && entry.pods.remove(&p.uid().unwrap_or_default()).is_some()
                        {
                            touched.insert(node);
                        }
                    }
                }
                if touched.is_empty() {
                    continue;
                }
                for (key, nodes) in &inner.wants {
                    if nodes.iter().any(|n| touched.contains(n)) {
                        self.triggers
                            .send(ObjectRef::new(&key.1).within(&key.0), Cause::Device);
                    }
                }
            }
        }
    }
}

fn node_of(p: &Pod) -> Option<String> {
    p.spec.as_ref()?.node_name.clone()
}

// ---------------------------------------------------------------------------
// One reconcile's picture

/// The device objects one reconcile reads, held while it decides.
#[derive(Default)]
pub struct DeviceWorld {
    /// The SafeRollout's namespace (status names only its objects).
    namespace: String,
    unavailable: Option<String>,
    slices: Vec<Arc<ResourceSlice>>,
    claims: Vec<Arc<ResourceClaim>>,
    pods: Vec<(String, Vec<Arc<Pod>>)>,
    probes: Vec<Arc<Pod>>,
    /// The rollout's quarantine rules: name, and their EvictionInProgress
    /// message.
    rules: Option<Vec<(String, Option<String>)>>,
}

/// Reads what the device gates of `sr` need from the caches.
pub fn gather(sr: &SafeRollout, d: &DeviceCaches) -> DeviceWorld {
    let ns = sr.metadata.namespace.clone().unwrap_or_default();
    if let Some(why) = &d.unavailable {
        return DeviceWorld {
            namespace: ns,
            unavailable: Some(why.clone()),
            ..Default::default()
        };
    }
    let id = id_of(sr);
    let driver = sr.spec.device_driver();
    let slices = match (driver, &d.slices) {
        (Some(driver), Some(store)) => store
            .state()
            .into_iter()
            .filter(|s| s.spec.driver == driver)
            .collect(),
        _ => Vec::new(),
    };
    let claims = match (has_claims_gate(sr), &d.claims) {
        (true, Some(store)) => store.state(),
        _ => Vec::new(),
    };
    let pods = sr
        .status
        .iter()
        .flat_map(SafeRolloutStatus::held_nodes)
        .filter_map(|n| Some((n.to_string(), d.node_pods.pods(n)?)))
        .collect();
    let probes = d
        .probes
        .iter()
        .filter(|(scope, _)| scope.as_deref().is_none_or(|s| s == ns))
        .flat_map(|(_, s)| s.state())
        .filter(|p| p.metadata.namespace.as_deref() == Some(ns.as_str()))
        .filter(|p| p.labels().get(PROBE_LABEL) == Some(&id))
        .collect();
    let rules = d.rules.as_ref().map(|(store, _)| {
        store
            .state()
            .iter()
            .filter(|r| r.labels().get(ROLLOUT_LABEL) == Some(&id))
            .map(|r| (r.name_any(), eviction_message(r)))
            .collect()
    });
    DeviceWorld {
        namespace: ns,
        unavailable: None,
        slices,
        claims,
        pods,
        probes,
        rules,
    }
}

impl DeviceWorld {
    /// The evidence, borrowed from what this world holds.
    pub fn evidence(&self) -> DeviceEvidence<'_> {
        let mut ev = DeviceEvidence {
            namespace: &self.namespace,
            unavailable: self.unavailable.as_deref(),
            ..Default::default()
        };
        ev.add_slices(self.slices.iter().map(|s| &**s));
        ev.add_claims(self.claims.iter().map(|c| &**c));
        for (node, pods) in &self.pods {
            ev.pods_observed.insert(node.as_str());
            ev.pods
                .insert(node.as_str(), pods.iter().map(|p| &**p).collect());
        }
        ev.probes = self.probes.iter().map(|p| &**p).collect();
        ev.quarantine_rules = self
            .rules
            .as_ref()
            .map(|r| r.iter().map(|(name, _)| name.as_str()).collect());
        ev.quarantine_previews = self
            .rules
            .iter()
            .flatten()
            .filter_map(|(name, m)| Some((name.as_str(), m.as_deref()?)))
            .collect();
        ev
    }
}

/// The message of a DeviceTaintRule's `EvictionInProgress` condition (for
/// effect None: what NoExecute would evict, counts only), bounded.
fn eviction_message(rule: &DynamicObject) -> Option<String> {
    rule.data
        .pointer("/status/conditions")?
        .as_array()?
        .iter()
        .find(|c| c.get("type").and_then(|t| t.as_str()) == Some("EvictionInProgress"))?
        .get("message")?
        .as_str()
        .map(|m| m.chars().take(512).collect())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn discovery_is_asked_again_unless_its_answer_will_stand() {
        let api = |code: u16| {
            kube::Error::Api(
                kube::core::Status::failure("test", "test")
                    .with_code(code)
                    .boxed(),
            )
        };
        for code in [401, 403, 404] {
            assert!(is_lasting(&api(code)), "{code} is taken as the answer");
        }
        assert!(is_lasting(&kube::Error::Discovery(
            kube::error::DiscoveryError::MissingApiGroup("resource.k8s.io".into())
        )));
        for code in [429, 500, 503, 504] {
            assert!(!is_lasting(&api(code)), "{code} is asked again");
        }
        assert!(!is_lasting(&kube::Error::LinesCodecMaxLineLengthExceeded));
    }

    #[test]
    fn a_pruned_slice_keeps_when_it_was_last_written_and_no_other_managed_field() {
        let mut s: ResourceSlice = serde_json::from_value(json!({
            "metadata": {"name": "n-gpu", "creationTimestamp": "2026-12-06T10:00:00Z",
                "annotations": {"a": "b"},
                "managedFields": [
                    {"manager": "driver", "operation": "Apply", "time": "2026-12-06T10:00:05Z",
                        "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {}}},
                    {"manager": "other", "operation": "Update", "time": "2026-12-06T10:00:02Z",
                        "fieldsType": "FieldsV1", "fieldsV1": {"f:metadata": {}}}]},
            "spec": {"driver": "gpu.example.com", "nodeName": "n",
                "pool": {"name": "n", "generation": 2, "resourceSliceCount": 1}}
        }))
        .unwrap();
        prune::slice(&mut s);
        let kept = s.metadata.managed_fields.as_deref().unwrap();
        assert_eq!(kept.len(), 1);
        assert!(kept[0].manager.is_none() && kept[0].fields_v1.is_none());
        assert_eq!(
            saferollout_core::gates::freshness::slice_written(&s),
            Some("2026-12-06T10:00:05Z".parse().unwrap())
        );
        assert!(s.metadata.annotations.is_none());
    }

    #[test]
    fn only_pods_that_use_devices_are_kept_and_they_are_pruned() {
        let pod = |resources: serde_json::Value, claims: serde_json::Value| -> Pod {
            serde_json::from_value(json!({"metadata": {"name": "p", "uid": "u", "labels": {"a": "b"}},
                "spec": {"nodeName": "n", "resourceClaims": claims,
                    "containers": [{"name": "c", "image": "i", "env": [{"name": "TOKEN", "value": "s3cr3t"}],
                        "resources": resources}]},
                "status": {"phase": "Running", "containerStatuses": [{"name": "c", "image": "i", "imageID": "x",
                    "ready": true, "restartCount": 0,
                    "allocatedResourcesStatus": [{"name": "example.com/gpu", "resources": [{"resourceID": "gpu-0", "health": "Healthy"}]}]}]}}))
            .unwrap()
        };
        assert!(!uses_devices(&pod(
            json!({"limits": {"cpu": "1"}}),
            json!([])
        )));
        assert!(!uses_devices(&pod(
            json!({"limits": {"hugepages-2Mi": "1", "kubernetes.io/x": "1"}}),
            json!([])
        )));
        assert!(uses_devices(&pod(
            json!({}),
            json!([{"name": "gpu", "resourceClaimName": "c"}])
        )));
        let mut p = pod(
            json!({"limits": {"example.com/gpu": "1", "cpu": "1"}}),
            json!([]),
        );
        assert!(uses_devices(&p));
        prune::pod(&mut p);
        let text = serde_json::to_string(&p).unwrap();
        assert!(!text.contains("s3cr3t"), "no env values kept: {text}");
        assert!(uses_devices(&p), "what the filter reads is kept");
        assert!(text.contains("allocatedResourcesStatus"), "{text}");
        assert!(!text.contains("\"cpu\""), "{text}");
    }
}
