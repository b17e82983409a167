//! An in-memory mirror of one watched kind, indexed by node, that reports
//! which nodes each change concerns.

use std::collections::{BTreeSet, HashMap, HashSet};

use kube::runtime::watcher::Event;

/// A mirrored object: its key (name, or namespace/name), the node it
/// concerns, its resourceVersion, and what the sim keeps of it.
#[derive(Clone, Debug)]
pub struct Entry<V> {
    pub key: String,
    pub node: Option<String>,
    /// `None` when not a plain number: such versions are never compared.
    pub resource_version: Option<u64>,
    pub value: V,
}

/// Objects of one kind as last seen, plus a node index.
#[derive(Debug)]
pub struct Mirror<V> {
    items: HashMap<String, Entry<V>>,
    by_node: HashMap<String, BTreeSet<String>>,
    /// Objects of a relist in progress, which replace `items` when it ends.
    relist: Option<HashMap<String, Entry<V>>>,
    synced: bool,
}

impl<V> Default for Mirror<V> {
    fn default() -> Self {
        Self {
            items: HashMap::new(),
            by_node: HashMap::new(),
            relist: None,
            synced: false,
        }
    }
}

impl<V: PartialEq> Mirror<V> {
    /// Whether a first full list has been seen.
    pub fn is_synced(&self) -> bool {
        self.synced
    }

    pub fn len(&self) -> usize {
        self.items.len()
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    pub fn get(&self, key: &str) -> Option<&V> {
        self.items.get(key).map(|e| &e.value)
    }

    /// The objects that concern `node`.
    pub fn on_node<'a>(&'a self, node: &str) -> impl Iterator<Item = &'a V> + 'a {
        self.by_node
            .get(node)
            .into_iter()
            .flatten()
            .filter_map(|key| self.items.get(key).map(|e| &e.value))
    }

    /// Every object's value.
    pub fn values(&self) -> impl Iterator<Item = &V> {
        self.items.values().map(|e| &e.value)
    }

    /// Every node some object concerns.
    pub fn nodes(&self) -> impl Iterator<Item = &String> {
        self.by_node.keys()
    }

    /// Applies a watch event (objects already converted to entries; `None`
    /// drops an object the sim has no use for) and adds the nodes whose view
    /// changed to `dirty`.
    pub fn apply(&mut self, event: Event<Option<Entry<V>>>, dirty: &mut HashSet<String>) {
        match event {
            Event::Apply(Some(entry)) => self.upsert(entry, dirty),
            Event::Apply(None) | Event::InitApply(None) | Event::Delete(None) => {}
            Event::Delete(Some(entry)) => self.remove(&entry.key, dirty),
            Event::Init => self.relist = Some(HashMap::new()),
            Event::InitApply(Some(entry)) => {
                self.relist
                    .get_or_insert_with(HashMap::new)
                    .insert(entry.key.clone(), entry);
            }
            Event::InitDone => {
                let fresh = self.relist.take().unwrap_or_default();
                let gone: Vec<String> = self
                    .items
                    .keys()
                    .filter(|key| !fresh.contains_key(*key))
                    .cloned()
                    .collect();
                for key in gone {
                    self.remove(&key, dirty);
                }
                for entry in fresh.into_values() {
                    // A relist is the truth, even if older than a write
                    // response seen meanwhile; the write memo covers the gap.
                    self.replace(entry, dirty);
                }
                self.synced = true;
            }
        }
    }

    /// Inserts or updates an object unless the mirror already holds a newer
    /// version of it (a write response can overtake the watch).
    pub fn upsert(&mut self, entry: Entry<V>, dirty: &mut HashSet<String>) {
        let stale = match (self.items.get(&entry.key), entry.resource_version) {
            (
                Some(Entry {
                    resource_version: Some(held),
                    ..
                }),
                Some(new),
            ) => new < *held,
            _ => false,
        };
        if !stale {
            self.replace(entry, dirty);
        }
    }

    fn replace(&mut self, entry: Entry<V>, dirty: &mut HashSet<String>) {
        if let Some(old) = self.items.get(&entry.key)
            && old.value == entry.value
            && old.node == entry.node
        {
            // Only the version moved: nothing for the sim to do.
            self.items.insert(entry.key.clone(), entry);
            return;
        }
        if let Some(node) = &entry.node {
            dirty.insert(node.clone());
            self.by_node
                .entry(node.clone())
                .or_default()
                .insert(entry.key.clone());
        }
        if let Some(old) = self.items.insert(entry.key.clone(), entry) {
            self.unindex_if_moved(&old, dirty);
        }
    }

    /// Forgets an object.
    pub fn remove(&mut self, key: &str, dirty: &mut HashSet<String>) {
        if let Some(old) = self.items.remove(key)
            && let Some(node) = &old.node
        {
            dirty.insert(node.clone());
            self.unindex(node, key);
        }
    }

    /// After `old` was replaced: drops its index entry if the replacement
    /// concerns another node.
    fn unindex_if_moved(&mut self, old: &Entry<V>, dirty: &mut HashSet<String>) {
        let Some(old_node) = &old.node else {
            return;
        };
        let still_there = self
            .items
            .get(&old.key)
            .is_some_and(|current| current.node.as_ref() == Some(old_node));
        if !still_there {
            dirty.insert(old_node.clone());
            self.unindex(old_node, &old.key);
        }
    }

    fn unindex(&mut self, node: &str, key: &str) {
        if let Some(keys) = self.by_node.get_mut(node) {
            keys.remove(key);
            if keys.is_empty() {
                self.by_node.remove(node);
            }
        }
    }
}

/// A resourceVersion as a number, when it is one.
pub fn parse_resource_version(version: Option<&str>) -> Option<u64> {
    version?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(key: &str, node: Option<&str>, version: u64, value: u32) -> Entry<u32> {
        Entry {
            key: key.into(),
            node: node.map(Into::into),
            resource_version: Some(version),
            value,
        }
    }

    fn dirty_after(mirror: &mut Mirror<u32>, event: Event<Option<Entry<u32>>>) -> BTreeSet<String> {
        let mut dirty = HashSet::new();
        mirror.apply(event, &mut dirty);
        dirty.into_iter().collect()
    }

    fn set(nodes: &[&str]) -> BTreeSet<String> {
        nodes.iter().map(|n| (*n).to_owned()).collect()
    }

    #[test]
    fn initial_list_syncs_and_dirties_every_node() {
        let mut mirror = Mirror::default();
        assert!(!mirror.is_synced());
        assert!(dirty_after(&mut mirror, Event::Init).is_empty());
        dirty_after(
            &mut mirror,
            Event::InitApply(Some(entry("a", Some("n1"), 1, 1))),
        );
        dirty_after(
            &mut mirror,
            Event::InitApply(Some(entry("b", Some("n2"), 1, 1))),
        );
        dirty_after(&mut mirror, Event::InitApply(None));
        assert!(
            mirror.is_empty(),
            "nothing shows before the list is complete"
        );
        assert_eq!(
            dirty_after(&mut mirror, Event::InitDone),
            set(&["n1", "n2"])
        );
        assert!(mirror.is_synced());
        assert_eq!(mirror.len(), 2);
        assert_eq!(mirror.on_node("n1").copied().collect::<Vec<_>>(), [1]);
    }

    #[test]
    fn updates_move_objects_between_nodes() {
        let mut mirror = Mirror::default();
        dirty_after(
            &mut mirror,
            Event::Apply(Some(entry("a", Some("n1"), 1, 1))),
        );
        assert_eq!(
            dirty_after(
                &mut mirror,
                Event::Apply(Some(entry("a", Some("n2"), 2, 1)))
            ),
            set(&["n1", "n2"])
        );
        assert_eq!(mirror.on_node("n1").count(), 0);
        assert_eq!(mirror.on_node("n2").count(), 1);
        assert_eq!(mirror.nodes().collect::<Vec<_>>(), ["n2"]);

        // Only the resourceVersion changed: no node to look at.
        assert!(
            dirty_after(
                &mut mirror,
                Event::Apply(Some(entry("a", Some("n2"), 3, 1)))
            )
            .is_empty()
        );
        // Older than what is held (a write response got here first): ignored.
        assert!(
            dirty_after(
                &mut mirror,
                Event::Apply(Some(entry("a", Some("n2"), 2, 9)))
            )
            .is_empty()
        );
        assert_eq!(mirror.get("a"), Some(&1));

        assert_eq!(
            dirty_after(
                &mut mirror,
                Event::Delete(Some(entry("a", Some("n2"), 4, 1)))
            ),
            set(&["n2"])
        );
        assert!(mirror.is_empty());
        assert_eq!(mirror.nodes().count(), 0);
    }

    #[test]
    fn relist_drops_vanished_objects_and_dirties_only_changes() {
        let mut mirror = Mirror::default();
        dirty_after(&mut mirror, Event::Init);
        dirty_after(
            &mut mirror,
            Event::InitApply(Some(entry("a", Some("n1"), 1, 1))),
        );
        dirty_after(
            &mut mirror,
            Event::InitApply(Some(entry("b", Some("n2"), 1, 1))),
        );
        dirty_after(&mut mirror, Event::InitDone);

        dirty_after(&mut mirror, Event::Init);
        dirty_after(
            &mut mirror,
            Event::InitApply(Some(entry("b", Some("n2"), 5, 1))),
        );
        dirty_after(
            &mut mirror,
            Event::InitApply(Some(entry("c", Some("n3"), 5, 1))),
        );
        assert_eq!(
            dirty_after(&mut mirror, Event::InitDone),
            set(&["n1", "n3"])
        );
        assert_eq!(mirror.get("a"), None);
        assert_eq!(mirror.len(), 2);
    }

    #[test]
    fn unindexed_objects_are_kept_but_concern_no_node() {
        let mut mirror = Mirror::default();
        assert!(
            dirty_after(
                &mut mirror,
                Event::Apply(Some(entry("pending", None, 1, 1)))
            )
            .is_empty()
        );
        assert_eq!(mirror.get("pending"), Some(&1));
        // Binding it to a node makes it show there.
        assert_eq!(
            dirty_after(
                &mut mirror,
                Event::Apply(Some(entry("pending", Some("n1"), 2, 1)))
            ),
            set(&["n1"])
        );
    }

    #[test]
    fn resource_versions_parse_when_numeric() {
        assert_eq!(parse_resource_version(Some("123")), Some(123));
        assert_eq!(parse_resource_version(Some("abc")), None);
        assert_eq!(parse_resource_version(None), None);
    }
}
