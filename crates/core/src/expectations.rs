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
//!   generation;
//! - shows the rollout labels it queued or wrote on nodes (or removed from
//!   them) until the node cache does. Without this, each pass while the node
//!   cache lagged behind a stage's thousand label writes wrote most of them
//!   again: at 1,000 nodes half the nodes were patched three times at a
//!   stage's start.
//!
//! Losing this memory (a restart) is safe: a restarted operator starts from a
//! fresh list of every object, which shows all of its earlier writes.

use std::collections::BTreeMap;
use std::time::Duration;

use jiff::Timestamp;

use crate::gates::elapsed;
use crate::views::{NodesByName, PodsByNode, RolloutLabels};

/// How long a deletion is remembered at most.
const DELETION_TTL: Duration = Duration::from_secs(60);

/// How long a label write is remembered after it was made. Only labelling
/// and when a stage's replacements start depend on it (the budget and the
/// gates read pods and node status, never these labels), so a write the
/// cache never shows as written (a person changed the labels again before
/// the cache caught up) only delays its repair.
const LABELS_TTL: Duration = Duration::from_secs(30);

/// How long a queued label write is remembered at most before it is made (the
/// writer works through a stage's nodes at the API server's pace: about 30 s
/// for 5,000 nodes on the bench's machine).
const QUEUED_LABELS_TTL: Duration = Duration::from_secs(300);

/// A label write of one node: this rollout's labels with `stage`, or
/// (`None`) their removal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct LabelWrite {
    stage: Option<usize>,
    /// When it was queued, or made once `written`.
    at: Timestamp,
    written: bool,
}

impl LabelWrite {
    /// The node's labels (as the cache shows them) are what this write makes.
    fn shown_by(&self, labels: &RolloutLabels, rollout_id: &str) -> bool {
        match self.stage {
            Some(stage) => labels.rollout == Some(rollout_id) && labels.stage == Some(stage),
            None => labels.rollout != Some(rollout_id),
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Expectations {
    /// UIDs of pods deleted, and when.
    deleted: BTreeMap<String, Timestamp>,
    /// The DaemonSet generation the last write produced.
    daemonset_generation: Option<i64>,
    /// Label writes queued or made, by node; the latest one per node.
    labels: BTreeMap<String, LabelWrite>,
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

    /// How long until the oldest remembered deletion or label write is
    /// forgotten: the pass that decides again on that pod or node must run by
    /// then even if no watch event wakes it (a deletion that timed out and
    /// never happened, a label the cache never shows).
    pub fn next_expiry(&self, now: Timestamp) -> Option<Duration> {
        let deletions = self
            .deleted
            .values()
            .map(|at| DELETION_TTL.saturating_sub(elapsed(*at, now)));
        // A queued write's expiry too: its writer answers long before, but a
        // pass must come then even if no answer ever does.
        let labels = self.labels.values().map(|w| {
            let ttl = if w.written {
                LABELS_TTL
            } else {
                QUEUED_LABELS_TTL
            };
            ttl.saturating_sub(elapsed(w.at, now))
        });
        deletions.chain(labels).min()
    }

    /// A write of this rollout's labels on `node` (`stage`; `None`: their
    /// removal) was queued: shown as done until it fails or the cache shows
    /// it.
    pub fn label_queued(&mut self, node: &str, stage: Option<usize>, now: Timestamp) {
        self.record_label(node, stage, now, false);
    }

    /// The API server made the label write: remembered until the cache shows
    /// it, [`LABELS_TTL`] at most.
    pub fn label_written(&mut self, node: &str, stage: Option<usize>, now: Timestamp) {
        self.record_label(node, stage, now, true);
    }

    fn record_label(&mut self, node: &str, stage: Option<usize>, at: Timestamp, written: bool) {
        let write = LabelWrite { stage, at, written };
        self.labels.insert(node.to_string(), write);
    }

    /// The label write failed (or was dropped): decided again from the cache,
    /// unless a later write of that node is queued.
    pub fn label_failed(&mut self, node: &str, stage: Option<usize>) {
        if self.labels.get(node).is_some_and(|w| w.stage == stage) {
            self.labels.remove(node);
        }
    }

    /// A later write of `node` than one of `stage` is queued (a revert's
    /// removal after a stage's labels): the earlier one need not be made.
    pub fn label_superseded(&self, node: &str, stage: Option<usize>) -> bool {
        self.labels.get(node).is_some_and(|w| w.stage != stage)
    }

    /// Nodes this rollout's labels were written on, or are queued for, that
    /// the cache may not show yet.
    pub fn labelled_nodes(&self) -> impl Iterator<Item = &str> {
        self.labels
            .iter()
            .filter(|(_, w)| w.stage.is_some())
            .map(|(n, _)| n.as_str())
    }

    /// Forgets the label writes made that `nodes` (the node cache) shows, and
    /// those of nodes gone from it or past their time ([`LABELS_TTL`],
    /// [`QUEUED_LABELS_TTL`]); then shows the others in `nodes`, as this
    /// rollout's (`rollout_id`) labels.
    ///
    /// A queued write the cache already shows is shown as made: the watch
    /// can deliver a label before the writer has recorded its response, and
    /// the node carries the labels either way. It is still remembered until
    /// the writer records it, so that earlier writes of the node still queued
    /// stay superseded ([`Self::label_superseded`]).
    pub fn apply_labels<'a>(
        &mut self,
        nodes: &mut NodesByName<'a>,
        rollout_id: &'a str,
        now: Timestamp,
    ) {
        self.labels.retain(|node, w| {
            let Some(view) = nodes.get(node.as_str()) else {
                return false;
            };
            if w.written {
                !w.shown_by(&view.ours, rollout_id) && elapsed(w.at, now) < LABELS_TTL
            } else {
                elapsed(w.at, now) < QUEUED_LABELS_TTL
            }
        });
        for (node, w) in &self.labels {
            if let Some(view) = nodes.get_mut(node.as_str()) {
                let made = w.written || w.shown_by(&view.ours, rollout_id);
                view.ours = RolloutLabels {
                    rollout: w.stage.map(|_| rollout_id),
                    stage: w.stage,
                    queued: !made,
                };
            }
        }
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
        self.deleted.is_empty() && self.labels.is_empty()
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
    fn label_writes_show_until_the_node_cache_does() {
        use crate::objects::SlimNode;
        use crate::views::NodeView;
        use saferollout_api::{ROLLOUT_LABEL, STAGE_LABEL};
        let node = |name: &str, stage: Option<&str>| {
            let mut n = SlimNode::default();
            n.metadata.name = Some(name.into());
            if let Some(stage) = stage {
                n.metadata.labels = Some(
                    [(ROLLOUT_LABEL, "ns.r"), (STAGE_LABEL, stage)]
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .into(),
                );
            }
            n
        };
        fn views(nodes: &[SlimNode]) -> NodesByName<'_> {
            nodes
                .iter()
                .map(NodeView::of)
                .map(|v| (v.name, v))
                .collect()
        }
        let ours = |stage| RolloutLabels {
            rollout: Some("ns.r"),
            stage,
            queued: false,
        };
        let queued = |stage| RolloutLabels {
            queued: true,
            ..ours(stage)
        };
        let mut e = Expectations::default();
        e.label_written("a", Some(1), ts(0));
        e.label_written("b", None, ts(0));
        e.label_written("gone", Some(1), ts(0));
        e.label_queued("c", Some(1), ts(0));
        assert_eq!(e.next_expiry(ts(10)), Some(Duration::from_secs(20)));
        let mut queued_only = Expectations::default();
        queued_only.label_queued("c", Some(1), ts(0));
        assert_eq!(
            queued_only.next_expiry(ts(10)),
            Some(Duration::from_secs(290))
        );
        assert_eq!(e.labelled_nodes().collect::<Vec<_>>(), ["a", "c", "gone"]);
        // A stale cache: a and c unlabelled, b still labelled.
        let stale = [node("a", None), node("b", Some("0")), node("c", None)];
        let mut v = views(&stale);
        e.apply_labels(&mut v, "ns.r", ts(1));
        assert_eq!(
            (v["a"].ours, v["b"].ours, v["c"].ours),
            (ours(Some(1)), RolloutLabels::default(), queued(Some(1)))
        );
        // a caught up (forgotten), b not yet (still shown unlabelled); the
        // node gone from the cache is forgotten; c's write is still queued.
        let partly = [node("a", Some("1")), node("b", Some("0")), node("c", None)];
        let mut v = views(&partly);
        e.apply_labels(&mut v, "ns.r", ts(2));
        assert_eq!(v["b"].ours, RolloutLabels::default());
        assert_eq!(e.labels.keys().collect::<Vec<_>>(), ["b", "c"]);
        // A queued write is shown until it is made, however long the queue;
        // one that failed is decided again from the cache.
        let mut v = views(&partly);
        e.apply_labels(&mut v, "ns.r", ts(250));
        assert_eq!(v["c"].ours, queued(Some(1)));
        e.label_failed("c", Some(1));
        let mut v = views(&partly);
        e.apply_labels(&mut v, "ns.r", ts(251));
        assert_eq!(v["c"].ours, RolloutLabels::default());
        // A failure of an earlier write leaves a later one alone, and the
        // later one makes the earlier one moot.
        e.label_queued("c", Some(2), ts(251));
        assert!(e.label_superseded("c", Some(1)) && !e.label_superseded("c", Some(2)));
        e.label_failed("c", Some(1));
        assert_eq!(e.labelled_nodes().collect::<Vec<_>>(), ["c"]);
        e.label_failed("c", Some(2));
        // A write the cache never shows is forgotten LABELS_TTL after it was
        // made.
        e.label_written("b", Some(2), ts(300));
        let mut v = views(&partly);
        e.apply_labels(&mut v, "ns.r", ts(300 + 29));
        assert_eq!(v["b"].ours, ours(Some(2)));
        let mut v = views(&partly);
        e.apply_labels(&mut v, "ns.r", ts(300 + 30));
        assert_eq!(v["b"].ours, ours(Some(0)), "as the cache shows it");
        assert!(e.is_empty());
        // The watch shows a queued write before the writer records its
        // answer: shown as made, and still remembered (an earlier write of
        // the node queued behind it stays superseded) until it is recorded.
        e.label_queued("d", None, ts(400));
        e.label_queued("d", Some(1), ts(401));
        let shown = [node("d", Some("1"))];
        let mut v = views(&shown);
        e.apply_labels(&mut v, "ns.r", ts(402));
        assert_eq!(v["d"].ours, ours(Some(1)));
        assert!(e.label_superseded("d", None));
        e.label_written("d", Some(1), ts(403));
        e.apply_labels(&mut views(&shown), "ns.r", ts(403));
        assert!(e.is_empty());
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
