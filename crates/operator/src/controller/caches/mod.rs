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
//!
//! Split by job, as kube-runtime splits its own: [`stores`] hold the objects
//! ([`prune`] drops what decisions never read before they are stored),
//! [`wakes`] says whether a change moved anything decisions read (its
//! `Predicate`), [`router`] which SafeRollouts it concerns (its `trigger_*`),
//! and [`triggers`] sends them to the work queue.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use k8s_openapi::api::apps::v1::{ControllerRevision, DaemonSet};
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::watcher::{self, Event};
use kube::{Client, Resource, ResourceExt};
use saferollout_api::{REVISION_HASH_LABEL, ROLLOUT_LABEL, SafeRollout};
use saferollout_core::objects::{SlimNode, SlimPod};

use self::router::Router;
use self::stores::{NsStores, SortedNodes, TemplateCache, add_store, api, ns_stores, watch_config};
use self::triggers::Triggers;
use self::wakes::{DaemonSetMemo, NodeMemo};
use super::freshness::{self, Freshness};
use crate::metrics::Metrics;

mod prune;
mod router;
pub mod stores;
pub mod triggers;
mod wakes;

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
    pub templates: TemplateCache,
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
        self.rollouts.every()
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
    reflect_each(
        client,
        writers.rollouts,
        watch_config,
        freshness,
        metrics,
        prune::rollout,
        || {
            let r = route.clone();
            move |ev: &Event<SafeRollout>| r.rollout_event(ev)
        },
    );
    reflect_each(
        client,
        writers.daemonsets,
        watch_config,
        freshness,
        metrics,
        |d: &mut DaemonSet| prune::meta(&mut d.metadata),
        || {
            let r = route.clone();
            let mut fingerprints: HashMap<String, DaemonSetMemo> = HashMap::new();
            move |ev: &Event<DaemonSet>| r.daemonset_event(ev, &mut fingerprints)
        },
    );
    reflect_each(
        client,
        writers.pods,
        pods_config,
        freshness,
        metrics,
        prune::pod,
        || {
            let r = route.clone();
            let mut fingerprints: HashMap<String, u64> = HashMap::new();
            move |ev: &Event<SlimPod>| r.pod_event(ev, &mut fingerprints)
        },
    );
    reflect_each(
        client,
        writers.revisions,
        watch_config,
        freshness,
        metrics,
        |c: &mut ControllerRevision| prune::meta(&mut c.metadata),
        || {
            let r = route.clone();
            move |ev: &Event<ControllerRevision>| r.revision_event(ev)
        },
    );
    super::devices::spawn(
        client,
        &caches.rollouts,
        device_writers,
        freshness,
        metrics,
        triggers,
    );
    reflect_each(
        client,
        writers.probe_pods,
        || watch_config().labels(saferollout_api::PROBE_REVISION_LABEL),
        freshness,
        metrics,
        prune::probe_pod,
        || {
            let r = route.clone();
            move |ev: &Event<Pod>| r.probe_pod_event(ev)
        },
    );
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

/// Spawns a reflector for each watched namespace's (or the one cluster-wide)
/// store of a namespaced resource; `on_event` makes each its own handler
/// (with its own memo of what it has seen).
fn reflect_each<K, H>(
    client: &Client,
    writers: Vec<(Option<&str>, reflector::store::Writer<K>)>,
    config: impl Fn() -> watcher::Config,
    freshness: &Arc<Freshness>,
    metrics: &Arc<Metrics>,
    prune: impl Fn(&mut K) + Clone + Send + 'static,
    on_event: impl Fn() -> H,
) where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
    H: FnMut(&Event<K>) + Send + 'static,
{
    for (ns, w) in writers {
        freshness::reflect(
            api(client, ns),
            config(),
            w,
            freshness,
            metrics,
            prune.clone(),
            on_event(),
        );
    }
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
