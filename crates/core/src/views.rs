//! What the decision logic sees of the cluster: small views that borrow from
//! the API objects the caller holds (the operator's caches, the CLI's lists,
//! a test model), so building a snapshot of thousands of nodes copies no
//! labels, taints or quantities.

use std::collections::{BTreeMap, HashMap};

use jiff::Timestamp;
use k8s_openapi::api::apps::v1::{DaemonSet, DaemonSetUpdateStrategy};
use k8s_openapi::api::core::v1::{Affinity, PodSpec, Taint, Toleration};
use saferollout_api::{
    REVISION_HASH_LABEL, ROLLOUT_LABEL, STAGE_LABEL, ZONE_LABEL, quantity_count,
};

use crate::objects::{NodeFacts, PodFacts, Quantities, SlimCondition, SlimNode, SlimPod};

pub(crate) static NO_LABELS: BTreeMap<String, String> = BTreeMap::new();
static NO_QUANTITIES: Quantities = Quantities::new();

/// One agent pod of the target DaemonSet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AgentPod<'a> {
    pub name: &'a str,
    pub uid: &'a str,
    /// `metadata.resourceVersion`: which state of the pod this view shows.
    pub resource_version: &'a str,
    pub node: &'a str,
    /// The pod's `controller-revision-hash` label.
    pub revision: &'a str,
    pub running: bool,
    pub ready: bool,
    /// When the pod's Ready condition last turned True (its
    /// `lastTransitionTime`, written by the node's kubelet); `None` while it
    /// is not Ready or does not say. The gates judge a node only on evidence
    /// written after it ([`crate::gates::freshness`]).
    pub ready_since: Option<Timestamp>,
    /// Being deleted (has a deletion timestamp), or deleted by the operator
    /// moments ago and not yet seen so in the cache.
    pub deleting: bool,
    /// `state.waiting.reason` of the first container that waits (CrashLoopBackOff, ...).
    pub waiting_reason: Option<&'a str>,
    pub waiting_message: Option<&'a str>,
    pub restarts: i32,
    /// `metadata.creationTimestamp`.
    pub created: Option<Timestamp>,
    /// When the pod was deleted (its deletion timestamp less the grace
    /// period); `None` while it is not being deleted, or when the operator
    /// deleted it moments ago and the cache does not show it yet.
    pub deleted: Option<Timestamp>,
}

impl PodFacts {
    fn of(pod: &SlimPod) -> Self {
        let status = pod.status.as_ref();
        let containers = status
            .and_then(|s| s.container_statuses.as_deref())
            .unwrap_or_default();
        let ready = status
            .and_then(|s| s.conditions.as_ref())
            .and_then(|cs| {
                cs.iter()
                    .position(|c| c.type_ == "Ready" && c.status == "True")
            })
            .and_then(|i| u16::try_from(i).ok());
        PodFacts {
            revision: pod
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(REVISION_HASH_LABEL))
                .cloned(),
            running: status.and_then(|s| s.phase.as_deref()) == Some("Running"),
            ready,
            waiting: containers
                .iter()
                .position(|c| c.state.as_ref().is_some_and(|s| s.waiting.is_some()))
                .and_then(|i| u16::try_from(i).ok()),
            restarts: containers
                .iter()
                .map(|c| c.restart_count)
                .max()
                .unwrap_or(0),
        }
    }
}

impl<'a> AgentPod<'a> {
    /// The view of a pod bound to a node; `None` for a pod not yet scheduled.
    pub fn of(pod: &'a SlimPod) -> Option<Self> {
        let node = pod.spec.as_ref()?.node_name.as_deref()?;
        let facts = pod.facts.get(|| PodFacts::of(pod));
        let waiting = facts.waiting.and_then(|i| {
            pod.status.as_ref()?.container_statuses.as_ref()?[usize::from(i)]
                .state
                .as_ref()?
                .waiting
                .as_ref()
        });
        Some(AgentPod {
            name: pod.metadata.name.as_deref().unwrap_or_default(),
            uid: pod.metadata.uid.as_deref().unwrap_or_default(),
            resource_version: pod.metadata.resource_version.as_deref().unwrap_or_default(),
            node,
            revision: facts.revision.as_deref().unwrap_or_default(),
            running: facts.running,
            ready: facts.ready.is_some(),
            ready_since: facts.ready.and_then(|i| {
                pod.status.as_ref()?.conditions.as_ref()?[usize::from(i)]
                    .last_transition_time
                    .as_ref()
                    .map(|t| t.0)
            }),
            deleting: pod.metadata.deletion_timestamp.is_some(),
            waiting_reason: waiting.and_then(|w| w.reason.as_deref()),
            waiting_message: waiting.and_then(|w| w.message.as_deref()),
            restarts: facts.restarts,
            created: pod.metadata.creation_timestamp.as_ref().map(|t| t.0),
            deleted: pod.metadata.deletion_timestamp.as_ref().map(|t| {
                let grace = pod.metadata.deletion_grace_period_seconds.unwrap_or(0);
                t.0 - jiff::SignedDuration::from_secs(grace)
            }),
        })
    }

    /// Running and Ready, not going away: the agent serves.
    pub fn is_available(&self) -> bool {
        !self.deleting && self.running && self.ready
    }
}

/// One node.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NodeView<'a> {
    pub name: &'a str,
    pub labels: &'a BTreeMap<String, String>,
    /// The Ready condition is True.
    pub ready: bool,
    /// When the Ready condition last changed, if it is not True (and says).
    pub not_ready_since: Option<Timestamp>,
    /// When the kubelet last wrote the node's status: the Ready condition's
    /// `lastHeartbeatTime`, which a kubelet sets on every status write (and
    /// only then). A gate judges the status only when it was written after
    /// the node's new agent became Ready ([`crate::gates::freshness`]).
    pub status_written: Option<Timestamp>,
    pub taints: &'a [Taint],
    /// `status.allocatable`, as quantities.
    pub allocatable: &'a Quantities,
    /// `status.conditions` as the caller keeps them (the operator keeps
    /// Ready and the conditions other writers set, such as a node-problem
    /// detector's; not the kubelet's pressure conditions).
    pub conditions: &'a [SlimCondition],
    /// The node's saferollout labels, read once: a pass checks them on every
    /// node, and each lookup in the labels' map is several comparisons of
    /// keys sharing long prefixes (a tenth of a pass's CPU at 1,000 nodes).
    pub ours: RolloutLabels<'a>,
}

/// The labels saferollout puts on the nodes a rollout holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RolloutLabels<'a> {
    /// `saferollout.dev/rollout`: which SafeRollout holds the node.
    pub rollout: Option<&'a str>,
    /// `saferollout.dev/stage`: the stage index (`None` also when the value
    /// is not one).
    pub stage: Option<usize>,
    /// Not on the node yet: the operator queued these labels (see
    /// `Expectations::apply_labels`).
    pub queued: bool,
}

impl<'a> RolloutLabels<'a> {
    pub fn of(labels: &'a BTreeMap<String, String>) -> Self {
        RolloutLabels {
            rollout: labels.get(ROLLOUT_LABEL).map(String::as_str),
            stage: labels.get(STAGE_LABEL).and_then(|s| s.parse().ok()),
            queued: false,
        }
    }
}

impl NodeFacts {
    fn of(node: &SlimNode) -> Self {
        let conditions = node
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_deref())
            .unwrap_or_default();
        let index = conditions.iter().position(|c| c.type_ == "Ready");
        let ready_condition = index.map(|i| &conditions[i]);
        let ready = ready_condition.is_some_and(|c| c.status == "True");
        let ours = RolloutLabels::of(node.metadata.labels.as_ref().unwrap_or(&NO_LABELS));
        NodeFacts {
            ready,
            not_ready_since: ready_condition
                .filter(|_| !ready)
                .and_then(|c| c.last_transition_time.as_ref())
                .map(|t| t.0),
            ready_condition: index.and_then(|i| u16::try_from(i).ok()),
            rollout: ours.rollout.map(str::to_string),
            // A stage index fits (the CRD allows saferollout_api::schema::MAX_STAGES); a
            // larger label value is no stage of ours, as one that does not parse.
            stage: ours.stage.and_then(|i| u32::try_from(i).ok()),
        }
    }
}

impl<'a> NodeView<'a> {
    pub fn of(node: &'a SlimNode) -> Self {
        let facts = node.facts.get(|| NodeFacts::of(node));
        NodeView {
            name: node.metadata.name.as_deref().unwrap_or_default(),
            labels: node.metadata.labels.as_ref().unwrap_or(&NO_LABELS),
            ready: facts.ready,
            not_ready_since: facts.not_ready_since,
            status_written: facts.ready_condition.and_then(|i| {
                node.status.as_ref()?.conditions.as_ref()?[usize::from(i)]
                    .last_heartbeat_time
                    .as_ref()
                    .map(|t| t.0)
            }),
            taints: node
                .spec
                .as_ref()
                .and_then(|s| s.taints.as_deref())
                .unwrap_or_default(),
            allocatable: node
                .status
                .as_ref()
                .and_then(|s| s.allocatable.as_ref())
                .unwrap_or(&NO_QUANTITIES),
            conditions: node
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_deref())
                .unwrap_or_default(),
            ours: RolloutLabels {
                rollout: facts.rollout.as_deref(),
                stage: facts.stage.map(|i| i as usize),
                queued: false,
            },
        }
    }

    /// `topology.kubernetes.io/zone`.
    pub fn zone(&self) -> Option<&'a str> {
        self.labels.get(ZONE_LABEL).map(String::as_str)
    }

    /// The allocatable count of `resource` (0 when absent or not a whole count).
    pub fn allocatable_count(&self, resource: &str) -> i64 {
        self.allocatable
            .get(resource)
            .and_then(quantity_count)
            .unwrap_or(0)
    }

    pub fn label(&self, key: &str) -> Option<&'a str> {
        self.labels.get(key).map(String::as_str)
    }

    /// The node's condition of type `type_`, if it has one.
    pub fn condition(&self, type_: &str) -> Option<&'a SlimCondition> {
        self.conditions.iter().find(|c| c.type_ == type_)
    }
}

/// Where the DaemonSet's pods may run: what the DaemonSet controller reads to
/// decide whether a node should run one.
#[derive(Debug, Clone, Copy, Default)]
pub struct Placement<'a> {
    pub node_selector: Option<&'a BTreeMap<String, String>>,
    pub affinity: Option<&'a Affinity>,
    pub tolerations: &'a [Toleration],
    pub host_network: bool,
}

impl<'a> Placement<'a> {
    pub fn of(spec: Option<&'a PodSpec>) -> Self {
        let Some(spec) = spec else {
            return Placement::default();
        };
        Placement {
            node_selector: spec.node_selector.as_ref(),
            affinity: spec.affinity.as_ref(),
            tolerations: spec.tolerations.as_deref().unwrap_or_default(),
            host_network: spec.host_network.unwrap_or(false),
        }
    }
}

/// The target DaemonSet.
#[derive(Debug, Clone, Default)]
pub struct DaemonSetView<'a> {
    pub generation: i64,
    pub observed_generation: i64,
    pub update_strategy: Option<&'a DaemonSetUpdateStrategy>,
    /// The revision (`controller-revision-hash`) whose template the DaemonSet
    /// carries now, found by content among its ControllerRevisions; `None`
    /// while the DaemonSet controller has not recorded it yet.
    pub current_revision: Option<&'a str>,
    /// Every revision the DaemonSet still has a ControllerRevision for.
    pub known_revisions: Vec<&'a str>,
    pub placement: Placement<'a>,
    /// Its controller owner (a vendor's GPU operator), if any: then
    /// saferollout writes nothing that owner reconciles
    /// ([`crate::owner`]).
    pub owner: Option<crate::owner::OwnerView<'a>>,
}

impl<'a> DaemonSetView<'a> {
    /// The view of `ds`, with the current revision found by the caller (see
    /// [`crate::revision::current_revision`]).
    pub fn of(
        ds: &'a DaemonSet,
        current_revision: Option<&'a str>,
        known_revisions: Vec<&'a str>,
    ) -> Self {
        DaemonSetView {
            generation: ds.metadata.generation.unwrap_or(0),
            observed_generation: ds
                .status
                .as_ref()
                .and_then(|s| s.observed_generation)
                .unwrap_or(0),
            update_strategy: ds.spec.update_strategy.as_ref(),
            current_revision,
            known_revisions,
            placement: Placement::of(ds.spec.template.spec.as_ref()),
            owner: crate::owner::OwnerView::of(ds.metadata.owner_references.as_deref()),
        }
    }

    pub fn is_on_delete(&self) -> bool {
        self.update_strategy.and_then(|s| s.type_.as_deref()) == Some("OnDelete")
    }

    /// The DaemonSet controller has seen the DaemonSet's latest spec.
    pub fn is_observed(&self) -> bool {
        self.observed_generation >= self.generation
    }

    pub fn knows(&self, revision: &str) -> bool {
        self.known_revisions.contains(&revision)
    }
}

/// Agent pods by node name. Only ever looked up by node (a pass looks up
/// every node's pods several times), never iterated in an order that matters,
/// so a hash map with a fixed-seed fast hasher: deterministic, and one hash
/// instead of a dozen string comparisons per lookup at thousands of nodes.
pub type PodsByNode<'a> = HashMap<&'a str, Vec<AgentPod<'a>>, foldhash::fast::FixedState>;

/// Groups pods by their node.
pub fn pods_by_node<'a>(pods: impl IntoIterator<Item = AgentPod<'a>>) -> PodsByNode<'a> {
    let pods = pods.into_iter();
    let mut out = PodsByNode::with_capacity_and_hasher(pods.size_hint().0, Default::default());
    for p in pods {
        // Nearly every node has one agent pod (two while it is replaced): a
        // default Vec's first push reserves four, a few MB a pass at 5,000 nodes.
        out.entry(p.node)
            .or_insert_with(|| Vec::with_capacity(1))
            .push(p);
    }
    out
}

/// Every node of a snapshot: iterated in name order (plans and deletions
/// take nodes in that order, so the same snapshot always gives the same
/// decision), looked up by name through a hash index (a pass looks up every
/// node several times; in a sorted map each lookup is a dozen string
/// comparisons of names that share long prefixes).
#[derive(Debug, Clone, Default)]
pub struct NodesByName<'a> {
    /// Sorted by name, one view per name.
    sorted: Vec<NodeView<'a>>,
    index: HashMap<&'a str, usize, foldhash::fast::FixedState>,
}

impl<'a> NodesByName<'a> {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn get(&self, name: &str) -> Option<&NodeView<'a>> {
        self.index.get(name).map(|&i| &self.sorted[i])
    }

    pub fn get_mut(&mut self, name: &str) -> Option<&mut NodeView<'a>> {
        self.index.get(name).map(|&i| &mut self.sorted[i])
    }

    pub fn contains_key(&self, name: &str) -> bool {
        self.index.contains_key(name)
    }

    /// The views, in name order.
    pub fn values(&self) -> std::slice::Iter<'_, NodeView<'a>> {
        self.sorted.iter()
    }

    /// The names, in order.
    pub fn keys(&self) -> impl Iterator<Item = &'a str> + '_ {
        self.sorted.iter().map(|v| v.name)
    }

    pub fn len(&self) -> usize {
        self.sorted.len()
    }

    pub fn is_empty(&self) -> bool {
        self.sorted.is_empty()
    }
}

impl<'a> FromIterator<(&'a str, NodeView<'a>)> for NodesByName<'a> {
    /// A name given twice keeps its last view, as a map's insert would.
    fn from_iter<I: IntoIterator<Item = (&'a str, NodeView<'a>)>>(iter: I) -> Self {
        let mut sorted: Vec<NodeView<'a>> = iter
            .into_iter()
            .map(|(name, view)| NodeView { name, ..view })
            .collect();
        // Stable: of equal names the last stays last, and dedup keeps it below.
        sorted.sort_by(|a, b| a.name.cmp(b.name));
        sorted.reverse();
        sorted.dedup_by(|later, earlier| later.name == earlier.name);
        sorted.reverse();
        let index = sorted
            .iter()
            .enumerate()
            .map(|(i, v)| (v.name, i))
            .collect();
        NodesByName { sorted, index }
    }
}

impl<'a> std::ops::Index<&str> for NodesByName<'a> {
    type Output = NodeView<'a>;

    fn index(&self, name: &str) -> &NodeView<'a> {
        self.get(name)
            .unwrap_or_else(|| panic!("no node {name} in the snapshot"))
    }
}

/// The live (not terminating) pods on `node`.
pub fn live_pods<'p, 'a>(
    pods: &'p PodsByNode<'a>,
    node: &str,
) -> impl Iterator<Item = &'p AgentPod<'a>> {
    pods.get(node).into_iter().flatten().filter(|p| !p.deleting)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn pod_view_reads_status_and_revision() {
        let pod: SlimPod = serde_json::from_value(json!({
            "metadata": {"name": "p", "uid": "u1", "labels": {"controller-revision-hash": "abc"}},
            "spec": {"nodeName": "n1", "containers": []},
            "status": {"phase": "Running",
                "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": "2026-12-06T10:00:07Z"}],
                "containerStatuses": [{"name": "c", "image": "i", "imageID": "", "ready": true, "restartCount": 3,
                    "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off"}}}]}
        }))
        .unwrap();
        let v = AgentPod::of(&pod).unwrap();
        assert_eq!(
            (v.name, v.uid, v.node, v.revision),
            ("p", "u1", "n1", "abc")
        );
        assert!(v.running && v.ready && !v.deleting && v.is_available());
        assert_eq!(v.ready_since, Some("2026-12-06T10:00:07Z".parse().unwrap()));
        assert_eq!(v.waiting_reason, Some("CrashLoopBackOff"));
        assert_eq!(v.restarts, 3);
        // Not Ready: no time since which it is.
        let starting: SlimPod = serde_json::from_value(json!({
            "metadata": {"name": "p"}, "spec": {"nodeName": "n1"},
            "status": {"conditions": [{"type": "Ready", "status": "False",
                "lastTransitionTime": "2026-12-06T10:00:07Z"}]}
        }))
        .unwrap();
        assert_eq!(AgentPod::of(&starting).unwrap().ready_since, None);
        let unscheduled: SlimPod =
            serde_json::from_value(json!({"metadata": {"name": "q"}})).unwrap();
        assert!(AgentPod::of(&unscheduled).is_none());
    }

    #[test]
    fn a_deleted_pod_was_deleted_its_grace_period_before_its_deletion_timestamp() {
        let pod: SlimPod = serde_json::from_value(json!({
            "metadata": {"name": "p", "creationTimestamp": "2026-12-02T10:00:00Z",
                "deletionTimestamp": "2026-12-02T10:01:30Z", "deletionGracePeriodSeconds": 30},
            "spec": {"nodeName": "n1"}
        }))
        .unwrap();
        let v = AgentPod::of(&pod).unwrap();
        assert!(v.deleting);
        assert_eq!(v.created, Some("2026-12-02T10:00:00Z".parse().unwrap()));
        assert_eq!(v.deleted, Some("2026-12-02T10:01:00Z".parse().unwrap()));
    }

    #[test]
    fn nodes_by_name_iterate_in_name_order_and_keep_the_last_view_of_a_name() {
        let labels = BTreeMap::new();
        let view = |name, ready| NodeView {
            name,
            labels: &labels,
            ready,
            not_ready_since: None,
            status_written: None,
            taints: &[],
            allocatable: &NO_QUANTITIES,
            conditions: &[],
            ours: RolloutLabels::default(),
        };
        let nodes: NodesByName = [
            view("n3", true),
            view("n1", true),
            view("n2", false),
            view("n1", false),
        ]
        .into_iter()
        .map(|v| (v.name, v))
        .collect();
        assert_eq!(nodes.keys().collect::<Vec<_>>(), ["n1", "n2", "n3"]);
        assert_eq!(nodes.len(), 3);
        assert!(!nodes["n1"].ready, "the later view of n1");
        assert!(nodes.contains_key("n3") && !nodes.contains_key("n4"));
        assert!(nodes.get("n4").is_none());
        assert!(NodesByName::new().is_empty());
    }

    #[test]
    fn node_view_parses_quantities_and_readiness() {
        let node: SlimNode = serde_json::from_value(json!({
            "metadata": {"name": "n1", "labels": {"topology.kubernetes.io/zone": "a"}},
            "spec": {"taints": [{"key": "k", "effect": "NoSchedule"}]},
            "status": {"allocatable": {"gpu.intel.com/millicores": "8k", "example.com/gpu": "8"},
                       "conditions": [{"type": "Ready", "status": "False",
                           "lastHeartbeatTime": "2026-12-06T10:00:09Z"}]}
        }))
        .unwrap();
        let v = NodeView::of(&node);
        assert_eq!(v.zone(), Some("a"));
        assert!(!v.ready);
        assert_eq!(
            v.status_written,
            Some("2026-12-06T10:00:09Z".parse().unwrap()),
            "the kubelet's last status write"
        );
        assert_eq!(v.taints.len(), 1);
        assert_eq!(v.allocatable_count("gpu.intel.com/millicores"), 8000);
        assert_eq!(v.allocatable_count("example.com/gpu"), 8);
        assert_eq!(v.allocatable_count("absent"), 0);
        assert_eq!(v.ours, RolloutLabels::default(), "no saferollout label");
    }

    #[test]
    fn node_view_reads_the_rollout_labels_once() {
        let node: SlimNode = serde_json::from_value(json!({
            "metadata": {"name": "n1", "labels": {
                "topology.kubernetes.io/zone": "a",
                ROLLOUT_LABEL: "ns.plugin",
                STAGE_LABEL: "2",
            }},
        }))
        .unwrap();
        let v = NodeView::of(&node);
        assert_eq!(v.ours.rollout, Some("ns.plugin"));
        assert_eq!(v.ours.stage, Some(2));
        assert_eq!(v.ours.rollout, v.label(ROLLOUT_LABEL));
    }
}
