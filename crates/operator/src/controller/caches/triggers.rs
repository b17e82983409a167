//! Where reconcile requests go ([`Triggers`]: the leader's work queue, or
//! nowhere on a follower) and what sent each ([`Cause`]).
//!
//! A leaf: the router, the device caches, the label writers and the passes'
//! writes all send through it, so it knows nothing of the caches.

use std::collections::HashSet;
use std::sync::Mutex;

use kube::runtime::reflector::ObjectRef;
use saferollout_api::SafeRollout;
use tokio::sync::mpsc::UnboundedSender;

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
    /// A SafeRolloutPolicy governing it changed, or another rollout it
    /// governs released nodes or passed a stage while this one waited.
    Fleet,
}

impl Cause {
    /// Every cause, in declaration order (its discriminant is its index).
    const ALL: [Cause; 12] = [
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
        Cause::Fleet,
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
            Cause::Fleet => "fleet",
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
    pub(super) fn take_own_deletion(&self, uid: &str) -> bool {
        self.own_deletions().remove(uid)
    }

    pub(super) fn forget_own_deletions(&self) {
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
