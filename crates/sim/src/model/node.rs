//! Everything the sim decides for one node at one moment: its agent pods'
//! statuses, its extended-resource entries and its ResourceSlices.

use std::collections::{BTreeMap, BTreeSet};

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Node, Pod, PodStatus};
use k8s_openapi::api::resource::v1::ResourceSlice;
use serde_json::Value;

use super::advertisement::{Endpoint, ResourceEntries, advertisement, next_endpoint, parse_count};
use super::agent::{AgentMoment, Timings, agent_moment};
use super::pod_status::{PodStatusInputs, desired_pod_status, pod_status_differs};
use super::slice::{
    DriverPod, DriverPool, NodeRef, SliceTarget, desired_slice, plan_pool, published_pool,
    slice_differs, slice_name,
};
use super::time::whole_seconds;
use super::{AgentKind, Fault, ids};
use crate::{
    AGENT_LABEL, DEFAULT_DRIVER, DEFAULT_RESOURCE, DEVICES_LABEL, DRIVER_ANNOTATION, FIELD_MANAGER,
    RESOURCE_ANNOTATION,
};

/// What the sim needs to know of a Node object.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeFacts {
    pub uid: String,
    pub internal_ip: Option<String>,
    /// From the `sim.saferollout.dev/devices` label; missing or invalid is 0.
    pub physical_devices: u64,
    pub capacity: BTreeMap<String, String>,
    pub allocatable: BTreeMap<String, String>,
    /// Keys of `status.capacity` / `status.allocatable` that the sim's field
    /// manager wrote, per the node's managed fields.
    pub sim_owned: BTreeSet<String>,
}

impl NodeFacts {
    pub fn from_node(node: &Node) -> Self {
        let status = node.status.as_ref();
        let quantities = |map: Option<
            &BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>,
        >| {
            map.into_iter()
                .flatten()
                .map(|(key, quantity)| (key.clone(), quantity.0.clone()))
                .collect()
        };
        Self {
            uid: node.metadata.uid.clone().unwrap_or_default(),
            internal_ip: status
                .and_then(|s| s.addresses.as_ref())
                .and_then(|addresses| addresses.iter().find(|a| a.type_ == "InternalIP"))
                .map(|a| a.address.clone()),
            physical_devices: node
                .metadata
                .labels
                .as_ref()
                .and_then(|labels| labels.get(DEVICES_LABEL))
                .and_then(|value| value.trim().parse().ok())
                .unwrap_or(0),
            capacity: quantities(status.and_then(|s| s.capacity.as_ref())),
            allocatable: quantities(status.and_then(|s| s.allocatable.as_ref())),
            sim_owned: sim_owned_resources(node),
        }
    }

    fn entries(&self, resource: &str) -> ResourceEntries {
        ResourceEntries {
            capacity: self.capacity.get(resource).cloned(),
            allocatable: self.allocatable.get(resource).cloned(),
        }
    }
}

/// Resource keys under `status.capacity` or `status.allocatable` that the
/// managed fields attribute to the sim.
fn sim_owned_resources(node: &Node) -> BTreeSet<String> {
    let mut owned = BTreeSet::new();
    let entries = node.metadata.managed_fields.iter().flatten();
    for entry in entries.filter(|e| e.manager.as_deref() == Some(FIELD_MANAGER)) {
        let Some(fields) = entry.fields_v1.as_ref() else {
            continue;
        };
        for section in ["f:capacity", "f:allocatable"] {
            if let Some(Value::Object(keys)) = fields.0.get("f:status").and_then(|s| s.get(section))
            {
                owned.extend(
                    keys.keys()
                        .filter_map(|k| k.strip_prefix("f:"))
                        .map(str::to_owned),
                );
            }
        }
    }
    owned
}

/// What the sim remembers about a node between reconciles.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeMemory {
    /// When the sim started pods that have no `startTime` yet (their first
    /// status write may not have landed).
    pub pod_started: BTreeMap<String, Timestamp>,
    /// Device-plugin endpoints, per resource.
    pub endpoints: BTreeMap<String, Endpoint>,
    /// DRA pools, per driver.
    pub pools: BTreeMap<String, DriverPool>,
}

impl NodeMemory {
    /// Nothing worth keeping: the node can be forgotten.
    pub fn is_empty(&self) -> bool {
        self.pod_started.is_empty() && self.endpoints.is_empty() && self.pools.is_empty()
    }
}

/// A pod status to write.
#[derive(Clone, Debug, PartialEq)]
pub struct PodStatusUpdate {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub status: PodStatus,
}

/// The writes a node needs now and when to look at it again.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NodePlan {
    pub pod_statuses: Vec<PodStatusUpdate>,
    /// Resource entries that differ from the node's, per resource.
    pub node_entries: BTreeMap<String, ResourceEntries>,
    pub slice_applies: Vec<ResourceSlice>,
    /// Names of slices to delete.
    pub slice_deletes: Vec<String>,
    /// When something changes next without an outside event.
    pub next_change: Option<Timestamp>,
}

impl NodePlan {
    pub fn is_empty(&self) -> bool {
        self.pod_statuses.is_empty()
            && self.node_entries.is_empty()
            && self.slice_applies.is_empty()
            && self.slice_deletes.is_empty()
    }

    fn wake_at(&mut self, at: Option<Timestamp>) {
        self.next_change = match (self.next_change, at) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
    }
}

/// What the sim sees on one node.
#[derive(Clone, Copy, Debug)]
pub struct NodeView<'a> {
    pub name: &'a str,
    /// `None` when no such Node exists (any more).
    pub node: Option<&'a NodeFacts>,
    /// Agent pods bound to the node, deleting or not.
    pub pods: &'a [&'a Pod],
    /// The sim's slices that name the node.
    pub slices: &'a [&'a ResourceSlice],
    /// Whether `slices` is known to be complete. Until the slice watch has
    /// listed (or when the API serves no ResourceSlices), DRA decisions wait:
    /// publishing without knowing the published generation would reset it.
    pub slices_known: bool,
}

/// An agent pod the sim runs on the node.
struct RunningAgent<'a> {
    pod: &'a Pod,
    uid: &'a str,
    kind: Option<AgentKind>,
    moment: AgentMoment,
}

/// Decides everything for one node at `now`, updating `memory`.
pub fn plan_node(
    view: NodeView<'_>,
    memory: &mut NodeMemory,
    now: Timestamp,
    timings: &Timings,
) -> NodePlan {
    let mut plan = NodePlan::default();
    let agents = running_agents(view, memory, now, timings);

    let host_ip = view
        .node
        .and_then(|n| n.internal_ip.clone())
        .unwrap_or_else(|| ids::fallback_host_ip(view.name));
    for agent in &agents {
        plan.wake_at(agent.moment.next_change);
        let started_at = started_at(agent.pod, memory).unwrap_or(now);
        let status = desired_pod_status(
            agent.pod,
            &PodStatusInputs {
                moment: &agent.moment,
                started_at,
                host_ip: &host_ip,
                crash_restart_interval: timings.crash_restart_interval,
                now,
            },
        );
        if pod_status_differs(agent.pod.status.as_ref(), &status) {
            plan.pod_statuses.push(PodStatusUpdate {
                namespace: agent.pod.metadata.namespace.clone().unwrap_or_default(),
                name: agent.pod.metadata.name.clone().unwrap_or_default(),
                uid: agent.uid.to_owned(),
                status,
            });
        }
    }

    let Some(node) = view.node else {
        // Without a Node there is nothing to advertise on, and its slices
        // are garbage-collected with it.
        memory.endpoints.clear();
        memory.pools.clear();
        return plan;
    };
    plan_device_plugins(&mut plan, node, &agents, memory, now, timings);
    if view.slices_known {
        plan_dra_drivers(&mut plan, view, node, &agents, memory, now, timings);
    }
    plan
}

/// The node's non-deleting agent pods with what each does now; also keeps
/// `memory.pod_started` in step with them.
fn running_agents<'a>(
    view: NodeView<'a>,
    memory: &mut NodeMemory,
    now: Timestamp,
    timings: &Timings,
) -> Vec<RunningAgent<'a>> {
    let mut agents = Vec::new();
    for &pod in view.pods {
        let bound_here = pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(view.name);
        let Some(uid) = pod.metadata.uid.as_deref() else {
            continue;
        };
        if !bound_here || pod.metadata.deletion_timestamp.is_some() {
            continue;
        }
        if pod
            .status
            .as_ref()
            .and_then(|s| s.start_time.as_ref())
            .is_none()
        {
            memory
                .pod_started
                .entry(uid.to_owned())
                .or_insert_with(|| whole_seconds(now));
        }
        let started = started_at(pod, memory).unwrap_or(now);
        let first_image = pod
            .spec
            .as_ref()
            .and_then(|s| s.containers.first())
            .and_then(|c| c.image.as_deref())
            .unwrap_or_default();
        agents.push(RunningAgent {
            pod,
            uid,
            kind: label(pod, AGENT_LABEL).and_then(AgentKind::from_label),
            moment: agent_moment(Fault::from_image(first_image), started, now, timings),
        });
    }
    memory
        .pod_started
        .retain(|uid, _| agents.iter().any(|a| a.uid == uid));
    agents
}

/// When the sim started the pod: its `startTime`, or the sim's note of it.
fn started_at(pod: &Pod, memory: &NodeMemory) -> Option<Timestamp> {
    pod.status
        .as_ref()
        .and_then(|s| s.start_time.as_ref())
        .map(|t| t.0)
        .or_else(|| {
            let uid = pod.metadata.uid.as_deref()?;
            memory.pod_started.get(uid).copied()
        })
}

/// The newest agent of `kind` per name (resource or driver) as `name_of`
/// reads it off the pod.
fn newest_per<'b, 'a>(
    agents: &'b [RunningAgent<'a>],
    kind: AgentKind,
    name_of: impl Fn(&Pod) -> String,
) -> BTreeMap<String, &'b RunningAgent<'a>> {
    let mut newest: BTreeMap<String, &RunningAgent<'a>> = BTreeMap::new();
    for agent in agents.iter().filter(|a| a.kind == Some(kind)) {
        let key = name_of(agent.pod);
        let replace = newest
            .get(&key)
            .is_none_or(|current| age_key(agent.pod) > age_key(current.pod));
        if replace {
            newest.insert(key, agent);
        }
    }
    newest
}

/// Orders pods by creation, names breaking ties.
fn age_key(pod: &Pod) -> (Option<Timestamp>, Option<&str>) {
    (
        pod.metadata.creation_timestamp.as_ref().map(|t| t.0),
        pod.metadata.name.as_deref(),
    )
}

fn plan_device_plugins(
    plan: &mut NodePlan,
    node: &NodeFacts,
    agents: &[RunningAgent<'_>],
    memory: &mut NodeMemory,
    now: Timestamp,
    timings: &Timings,
) {
    let plugins = newest_per(agents, AgentKind::DevicePlugin, |pod| {
        annotation(pod, RESOURCE_ANNOTATION)
            .unwrap_or(DEFAULT_RESOURCE)
            .to_owned()
    });
    let resources: BTreeSet<String> = plugins
        .keys()
        .chain(memory.endpoints.keys())
        .chain(node.sim_owned.iter())
        .cloned()
        .collect();
    for resource in resources {
        let plugin_devices = plugins
            .get(&resource)
            .and_then(|agent| agent.moment.offer.plugin_devices(node.physical_devices));
        // A leftover entry (only allocatable, say) still needs retiring.
        let owned_capacity = node
            .sim_owned
            .contains(&resource)
            .then(|| {
                let shown = node
                    .capacity
                    .get(&resource)
                    .or(node.allocatable.get(&resource));
                shown.map(|q| parse_count(q))
            })
            .flatten();
        let previous = memory.endpoints.remove(&resource);
        let Some(endpoint) = next_endpoint(previous, plugin_devices, owned_capacity, now) else {
            continue;
        };
        let target = advertisement(&endpoint, now, timings);
        let shown = node.entries(&resource);
        plan.wake_at(target.next_change);
        if !(target.finished && shown == target.entries) {
            memory.endpoints.insert(resource.clone(), endpoint);
        }
        if shown != target.entries {
            plan.node_entries.insert(resource, target.entries);
        }
    }
}

fn plan_dra_drivers(
    plan: &mut NodePlan,
    view: NodeView<'_>,
    node: &NodeFacts,
    agents: &[RunningAgent<'_>],
    memory: &mut NodeMemory,
    now: Timestamp,
    timings: &Timings,
) {
    let drivers = newest_per(agents, AgentKind::DraDriver, |pod| {
        annotation(pod, DRIVER_ANNOTATION)
            .unwrap_or(DEFAULT_DRIVER)
            .to_owned()
    });
    // Only slices under the conventional name are the pool's; anything else
    // carrying the label is left alone.
    let published: BTreeMap<&str, &ResourceSlice> = view
        .slices
        .iter()
        .filter(|s| {
            s.metadata.name.as_deref() == Some(slice_name(view.name, &s.spec.driver).as_str())
        })
        .map(|&s| (s.spec.driver.as_str(), s))
        .collect();
    let names: BTreeSet<String> = drivers
        .keys()
        .cloned()
        .chain(memory.pools.keys().cloned())
        .chain(published.keys().map(|d| (*d).to_owned()))
        .collect();
    for driver in names {
        let current = published.get(driver.as_str()).copied();
        let driver_pod = drivers.get(&driver).map(|agent| DriverPod {
            uid: agent.uid,
            devices: agent.moment.offer.driver_devices(node.physical_devices),
        });
        let previous = memory.pools.remove(&driver);
        let (pool, target, wake) = plan_pool(
            previous,
            current.map(published_pool),
            driver_pod,
            now,
            timings,
        );
        plan.wake_at(wake);
        match target {
            SliceTarget::Publish {
                devices,
                generation,
                publisher,
            } => {
                let node_ref = NodeRef {
                    name: view.name,
                    uid: &node.uid,
                };
                let desired = desired_slice(node_ref, &driver, devices, generation, &publisher);
                if current.is_none_or(|c| slice_differs(c, &desired)) {
                    plan.slice_applies.push(desired);
                }
            }
            SliceTarget::Keep => {}
            SliceTarget::Absent => {
                if let Some(name) = current.and_then(|c| c.metadata.name.clone()) {
                    plan.slice_deletes.push(name);
                }
            }
        }
        memory.pools.insert(driver, pool);
    }
}

fn label<'a>(pod: &'a Pod, key: &str) -> Option<&'a str> {
    pod.metadata.labels.as_ref()?.get(key).map(String::as_str)
}

fn annotation<'a>(pod: &'a Pod, key: &str) -> Option<&'a str> {
    pod.metadata
        .annotations
        .as_ref()?
        .get(key)
        .map(String::as_str)
}

#[cfg(test)]
mod tests;
