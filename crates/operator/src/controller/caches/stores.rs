//! The stores and their plumbing: one store per watched namespace
//! ([`NsStores`]), how every reflector gets its initial state
//! ([`InitialList`]), and what is derived from a store and kept between
//! passes: the nodes sorted by name ([`SortedNodes`]), the ControllerRevisions'
//! templates parsed ([`TemplateCache`]).
//!
//! A leaf: it knows nothing of what the stores' events wake.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Arc, Mutex};

use k8s_openapi::api::apps::v1::ControllerRevision;
use k8s_openapi::api::core::v1::PodTemplateSpec;
use kube::api::Api;
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher;
use kube::{Client, Resource};
use saferollout_core::objects::SlimNode;
use saferollout_core::revision::{content_hash, revision_template, revision_template_json};

/// Stores of one namespaced resource: one per watched namespace, or one for all.
/// A clone reads the same stores.
#[derive(Clone)]
pub struct NsStores<K: Resource + 'static>
where
    K::DynamicType: Eq + Hash + Clone,
{
    pub(super) all: Option<Store<K>>,
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

    /// The objects of every watched namespace.
    pub fn every(&self) -> Vec<Arc<K>> {
        self.stores().flat_map(|s| s.state()).collect()
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

/// Parsed ControllerRevision templates and their content hashes, by UID
/// and resource version: a revision's data never changes, so each is
/// parsed and hashed once.
#[derive(Default)]
pub struct TemplateCache(Mutex<HashMap<String, CachedTemplate>>);

/// A revision's resource version, its parsed template and content hash.
type CachedTemplate = (String, Arc<PodTemplateSpec>, String);

impl TemplateCache {
    /// The template `cr` holds, parsed, and its content hash (`None`: it
    /// holds none that parses).
    pub fn get(&self, cr: &ControllerRevision) -> Option<(Arc<PodTemplateSpec>, String)> {
        let uid = cr.metadata.uid.clone().unwrap_or_default();
        let rv = cr.metadata.resource_version.clone().unwrap_or_default();
        let mut map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((cached_rv, t, hash)) = map.get(&uid)
            && *cached_rv == rv
        {
            return Some((t.clone(), hash.clone()));
        }
        let t = Arc::new(revision_template(cr)?);
        let hash = content_hash(&revision_template_json(cr)?);
        map.insert(uid, (rv, t.clone(), hash.clone()));
        Some((t, hash))
    }

    /// Forgets a revision that is gone.
    pub fn forget(&self, uid: &str) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).remove(uid);
    }
}

pub(super) fn ns_stores<K: Resource + 'static>() -> NsStores<K>
where
    K::DynamicType: Eq + Hash + Clone,
{
    NsStores {
        all: None,
        by_namespace: HashMap::new(),
    }
}

pub(super) fn add_store<K>(
    stores: &mut NsStores<K>,
    ns: Option<&str>,
) -> reflector::store::Writer<K>
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

pub(super) fn api<K>(client: &Client, ns: Option<&str>) -> Api<K>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
{
    match ns {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

#[cfg(test)]
mod tests {
    use saferollout_core::objects::SlimPod;
    use serde_json::json;

    use super::*;

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
}
