//! Which of a node's pods a drain evicts, which it leaves, and which hold
//! it: `kubectl drain`'s rules, as a pure function of the pods the runtime
//! listed on the node ([`DrainEvidence`]) and `spec.nodeMaintenance.drain`.
//!
//! - DaemonSet pods stay (their controller would put them back at once,
//!   and the rollout's own agent is one of them); so do mirror (static)
//!   pods, which the API cannot evict, and pods already finished.
//! - A pod the drain's `podSelector` does not select stays.
//! - A pod no controller owns would be gone for good: it holds the drain
//!   (`kubectl drain` refuses it without `--force`); so does a pod with an
//!   emptyDir volume unless `deleteEmptyDirData`.
//! - Every other pod is evicted through the Eviction API, never deleted: a
//!   PodDisruptionBudget that allows no disruption refuses, and the drain
//!   waits, saying which budget refused (the runtime remembers the API
//!   server's answer, [`WorkloadPod::refused`]).
//! - A pod being deleted is waited for: the node is drained once no pod is
//!   left to evict or to wait for.

use std::collections::BTreeMap;

use kube_core::{Selector, SelectorExt};
use saferollout_api::Drain;

/// A pod on a node in maintenance, as the drain reads it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct WorkloadPod {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub labels: BTreeMap<String, String>,
    /// Its controller owner's kind (`ReplicaSet`, `DaemonSet`, `Job`, ...);
    /// `None`: no controller owns it.
    pub controller: Option<String>,
    /// A static pod's mirror (`kubernetes.io/config.mirror`).
    pub mirror: bool,
    /// Succeeded or Failed.
    pub finished: bool,
    /// Has a deletion timestamp (evicted, or deleted by someone).
    pub terminating: bool,
    pub uses_empty_dir: bool,
    /// The API server's last refusal of its eviction (a disruption budget),
    /// bounded; `None`: none refused since the runtime started.
    pub refused: Option<String>,
}

/// What the runtime listed on the nodes this rollout holds in maintenance.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DrainEvidence {
    /// By node: its pods, every one the API server listed. A node missing
    /// here was not listed for this pass (its drain is not judged done).
    pub nodes: BTreeMap<String, Vec<WorkloadPod>>,
}

/// What a drain does with one pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fate {
    /// Left on the node.
    Stays,
    /// To evict (again, if refused before).
    Evict,
    /// Being deleted: waited for.
    Leaving,
    /// Holds the drain until a person acts: why.
    Holds(String),
}

/// The drain's selector, parsed once; one that fails to parse (the API
/// server's schema refuses most) selects nothing, so nothing is evicted
/// that the author did not mean.
#[derive(Debug, Clone)]
pub enum PodSelector {
    Every,
    Matching(Selector),
    Nothing,
}

impl PodSelector {
    pub fn of(drain: &Drain) -> Self {
        match &drain.pod_selector {
            None => PodSelector::Every,
            Some(s) => {
                Selector::try_from(s.clone()).map_or(PodSelector::Nothing, PodSelector::Matching)
            }
        }
    }

    fn selects(&self, labels: &BTreeMap<String, String>) -> bool {
        match self {
            PodSelector::Every => true,
            PodSelector::Matching(s) => s.matches(labels),
            PodSelector::Nothing => false,
        }
    }
}

/// What `drain` does with `pod`.
pub fn fate(pod: &WorkloadPod, drain: &Drain, selector: &PodSelector) -> Fate {
    let daemon = pod.controller.as_deref() == Some("DaemonSet");
    if daemon || pod.mirror || pod.finished || !selector.selects(&pod.labels) {
        return Fate::Stays;
    }
    if pod.terminating {
        return Fate::Leaving;
    }
    if pod.controller.is_none() {
        return Fate::Holds(format!(
            "pod {}/{} has no controller: evicting it would lose it for good; delete it, or leave it out with nodeMaintenance.drain.podSelector",
            pod.namespace, pod.name
        ));
    }
    if pod.uses_empty_dir && !drain.delete_empty_dir_data {
        return Fate::Holds(format!(
            "pod {}/{} uses an emptyDir volume, whose data an eviction loses: set nodeMaintenance.drain.deleteEmptyDirData, or leave it out with podSelector",
            pod.namespace, pod.name
        ));
    }
    Fate::Evict
}

/// One node's drain, judged.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeDrain {
    /// Pods to evict now: (namespace, name, uid).
    pub evict: Vec<(String, String, String)>,
    /// Nothing is left to evict or wait for.
    pub done: bool,
    /// What the drain waits on, for status (empty when done).
    pub waiting_on: String,
    /// Some pod holds it for a reason only a person can lift (a refusal by
    /// a budget, no controller, emptyDir data).
    pub held: bool,
}

/// Most pods a status message names.
const NAMED: usize = 3;

/// Judges the drain of a node whose pods are `pods` (`None`: not listed).
pub fn judge(pods: Option<&[WorkloadPod]>, drain: &Drain) -> NodeDrain {
    let Some(pods) = pods else {
        return NodeDrain {
            waiting_on: "its pods have not been listed yet".into(),
            ..Default::default()
        };
    };
    let selector = PodSelector::of(drain);
    let mut out = NodeDrain::default();
    let mut reasons = Vec::new();
    let mut leaving = 0;
    for pod in pods {
        match fate(pod, drain, &selector) {
            Fate::Stays => {}
            Fate::Leaving => leaving += 1,
            Fate::Evict => {
                out.evict
                    .push((pod.namespace.clone(), pod.name.clone(), pod.uid.clone()));
                if let Some(refused) = &pod.refused {
                    out.held = true;
                    reasons.push(format!(
                        "the eviction of pod {}/{} is refused: {refused}",
                        pod.namespace, pod.name
                    ));
                }
            }
            Fate::Holds(why) => {
                out.held = true;
                reasons.push(why);
            }
        }
    }
    let pending = out.evict.len() - reasons.len().min(out.evict.len());
    if pending > 0 {
        reasons.push(format!("evicting {pending} pod(s)"));
    }
    if leaving > 0 {
        reasons.push(format!("waiting for {leaving} evicted pod(s) to terminate"));
    }
    out.done = reasons.is_empty();
    let more = reasons.len().saturating_sub(NAMED);
    reasons.truncate(NAMED);
    if more > 0 {
        reasons.push(format!("and {more} more"));
    }
    out.waiting_on = reasons.join("; ");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, controller: Option<&str>) -> WorkloadPod {
        WorkloadPod {
            namespace: "apps".into(),
            name: name.into(),
            uid: format!("uid-{name}"),
            labels: [("app".to_string(), name.to_string())].into(),
            controller: controller.map(str::to_string),
            ..Default::default()
        }
    }

    #[test]
    fn daemonset_mirror_finished_and_unselected_pods_stay() {
        let drain = Drain::default();
        let every = PodSelector::of(&drain);
        assert_eq!(
            fate(&pod("agent", Some("DaemonSet")), &drain, &every),
            Fate::Stays
        );
        let mirror = WorkloadPod {
            mirror: true,
            ..pod("etcd", None)
        };
        assert_eq!(fate(&mirror, &drain, &every), Fate::Stays);
        let done = WorkloadPod {
            finished: true,
            ..pod("job", Some("Job"))
        };
        assert_eq!(fate(&done, &drain, &every), Fate::Stays);
        let gpu_only: Drain = serde_json::from_value(serde_json::json!({
            "podSelector": {"matchLabels": {"app": "train"}}
        }))
        .unwrap();
        let selector = PodSelector::of(&gpu_only);
        assert_eq!(
            fate(&pod("web", Some("ReplicaSet")), &gpu_only, &selector),
            Fate::Stays
        );
        assert_eq!(
            fate(&pod("train", Some("ReplicaSet")), &gpu_only, &selector),
            Fate::Evict
        );
    }

    #[test]
    fn a_bare_pod_or_emptydir_data_holds_the_drain_and_says_which() {
        let drain = Drain::default();
        let judged = judge(Some(&[pod("bare", None)]), &drain);
        assert!(!judged.done && judged.held && judged.evict.is_empty());
        assert!(
            judged.waiting_on.contains("apps/bare has no controller"),
            "{}",
            judged.waiting_on
        );
        let scratch = WorkloadPod {
            uses_empty_dir: true,
            ..pod("scratch", Some("ReplicaSet"))
        };
        let judged = judge(Some(std::slice::from_ref(&scratch)), &drain);
        assert!(judged.held && judged.waiting_on.contains("deleteEmptyDirData"));
        let allowed = Drain {
            delete_empty_dir_data: true,
            ..Drain::default()
        };
        assert_eq!(judge(Some(&[scratch]), &allowed).evict.len(), 1);
    }

    #[test]
    fn a_refused_eviction_is_asked_again_and_named_and_a_node_is_done_when_nothing_is_left() {
        let drain = Drain::default();
        let refused = WorkloadPod {
            refused: Some(
                "Cannot evict pod as it would violate the pod's disruption budget.".into(),
            ),
            ..pod("train", Some("ReplicaSet"))
        };
        let judged = judge(Some(&[refused]), &drain);
        assert_eq!(judged.evict.len(), 1, "asked again");
        assert!(judged.held && judged.waiting_on.contains("disruption budget"));
        let leaving = WorkloadPod {
            terminating: true,
            ..pod("train", Some("ReplicaSet"))
        };
        let judged = judge(Some(&[leaving]), &drain);
        assert!(!judged.done && !judged.held && judged.evict.is_empty());
        let judged = judge(Some(&[pod("agent", Some("DaemonSet"))]), &drain);
        assert!(judged.done && judged.waiting_on.is_empty());
        assert!(
            !judge(None, &drain).done,
            "a node not listed is not drained"
        );
    }
}
