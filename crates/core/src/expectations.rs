//! What the operator's own writes will show once its caches catch up.
//!
//! Caches lag behind the operator's writes. Deciding from a cache that does
//! not yet show a pod the operator just deleted would count that node as
//! serving and spend the disruption budget twice; deciding from a DaemonSet
//! that does not yet show the template just written would write it again. So
//! the operator remembers, per SafeRollout and in memory only, the pods it
//! deleted (by UID) and the DaemonSet generation its last write produced (from
//! the write's response, never predicted), and:
//! - treats a pod it deleted as terminating until the cache says so (or the
//!   pod is gone, or a minute has passed);
//! - decides nothing for the DaemonSet until its cache has reached that
//!   generation.
//!
//! Losing this memory (a restart) is safe: a restarted operator starts from a
//! fresh list of every object, which shows all of its earlier writes.

use std::collections::BTreeMap;
use std::time::Duration;

use jiff::Timestamp;

use crate::gates::elapsed;
use crate::views::PodsByNode;

/// How long a deletion is remembered at most.
const DELETION_TTL: Duration = Duration::from_secs(60);

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Expectations {
    /// UIDs of pods deleted, and when.
    deleted: BTreeMap<String, Timestamp>,
    /// The DaemonSet generation the last write produced.
    daemonset_generation: Option<i64>,
}

impl Expectations {
    pub fn pod_deleted(&mut self, uid: &str, now: Timestamp) {
        self.deleted.insert(uid.to_string(), now);
    }

    /// The API server refused the deletion of `uid` (its preconditions
    /// failed: the pod changed since the pass saw it, or the name is another
    /// pod's now): nothing was deleted, so the pod must not be shown
    /// terminating. Remembering it would stall its node for a minute, and a
    /// pass after that minute may never come if nothing else changes.
    pub fn delete_refused(&mut self, uid: &str) {
        self.deleted.remove(uid);
    }

    /// How long until the oldest remembered deletion is forgotten: the pass
    /// that decides again on that pod must run by then even if no watch event
    /// wakes it (a deletion that timed out and never happened).
    pub fn next_expiry(&self, now: Timestamp) -> Option<Duration> {
        self.deleted
            .values()
            .map(|at| DELETION_TTL.saturating_sub(elapsed(*at, now)))
            .min()
    }

    pub fn daemonset_written(&mut self, generation: i64) {
        self.daemonset_generation = Some(generation);
    }

    /// The DaemonSet in the cache is at least as new as our last write.
    pub fn daemonset_caught_up(&self, cached_generation: i64) -> bool {
        self.daemonset_generation
            .is_none_or(|g| cached_generation >= g)
    }

    /// Marks the pods deleted moments ago as deleting in `pods`, and forgets
    /// deletions the cache already shows (terminating or gone) or that are
    /// older than a minute.
    pub fn apply(&mut self, pods: &mut PodsByNode, now: Timestamp) {
        self.deleted
            .retain(|_, at| elapsed(*at, now) < DELETION_TTL);
        let mut seen_live = std::collections::BTreeSet::new();
        for p in pods.values_mut().flatten() {
            if self.deleted.contains_key(p.uid) {
                if p.deleting {
                    continue; // the cache shows it: nothing to remember
                }
                p.deleting = true;
                seen_live.insert(p.uid.to_string());
            }
        }
        self.deleted.retain(|uid, _| seen_live.contains(uid));
    }

    pub fn is_empty(&self) -> bool {
        self.deleted.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::views::{AgentPod, pods_by_node};

    fn ts(s: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + s).unwrap()
    }

    /// Pod `p` on node `n`, live in the cache.
    fn live_pod(uid: &str) -> AgentPod<'_> {
        AgentPod {
            name: "p",
            uid,
            node: "n",
            ..Default::default()
        }
    }

    #[test]
    fn a_deleted_pod_counts_as_deleting_until_the_cache_shows_it() {
        let mut e = Expectations::default();
        e.pod_deleted("u1", ts(0));
        let pod = live_pod("u1");
        let mut stale = pods_by_node([pod]);
        e.apply(&mut stale, ts(1));
        assert!(stale["n"][0].deleting, "stale cache: still shown live");
        assert!(!e.is_empty());
        let mut fresh = pods_by_node([AgentPod {
            deleting: true,
            ..pod
        }]);
        e.apply(&mut fresh, ts(2));
        assert!(e.is_empty(), "the cache caught up");
        // Gone from the cache: forgotten too. Remembered at most a minute.
        e.pod_deleted("u2", ts(0));
        e.apply(&mut pods_by_node([]), ts(1));
        assert!(e.is_empty());
        e.pod_deleted("u1", ts(0));
        let mut stale = pods_by_node([pod]);
        e.apply(&mut stale, ts(61));
        assert!(e.is_empty() && !stale["n"][0].deleting);
    }

    #[test]
    fn a_refused_deletion_is_forgotten_and_the_oldest_one_sets_the_next_pass() {
        let mut e = Expectations::default();
        assert_eq!(e.next_expiry(ts(0)), None);
        e.pod_deleted("u1", ts(0));
        e.pod_deleted("u2", ts(20));
        assert_eq!(e.next_expiry(ts(30)), Some(Duration::from_secs(30)));
        e.delete_refused("u1");
        assert_eq!(e.next_expiry(ts(30)), Some(Duration::from_secs(50)));
        let pod = live_pod("u1");
        let mut pods = pods_by_node([pod]);
        e.apply(&mut pods, ts(31));
        assert!(
            !pods["n"][0].deleting,
            "a refused deletion shows the pod live"
        );
        e.pod_deleted("u1", ts(0));
        assert_eq!(e.next_expiry(ts(90)), Some(Duration::ZERO), "overdue");
    }

    #[test]
    fn decisions_wait_for_the_daemonset_write() {
        let mut e = Expectations::default();
        assert!(e.daemonset_caught_up(1));
        e.daemonset_written(5);
        assert!(!e.daemonset_caught_up(4));
        assert!(e.daemonset_caught_up(5));
    }
}
