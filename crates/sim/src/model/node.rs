//! Everything the sim decides for one node at one moment: its agent pods'
//! statuses, its extended-resource entries and its ResourceSlices.

use std::collections::{BTreeMap, BTreeSet};

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Container, Node, Pod, PodStatus};
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use serde_json::Value;

use super::advertisement::{Endpoint, ResourceEntries, advertisement, next_endpoint, parse_count};
use super::agent::{AgentMoment, ContainerRun, Timings, agent_moment};
use super::devices::{
    AgentService, Handover, Hardware, Health, device_health, parse_faulty_devices,
    plugin_device_names, plugin_healthy_count, tainted_gpus,
};
use super::logs::{AgentLogFacts, agent_log_lines, cri_log, other_container_lines};
use super::metrics::GpuSample;
use super::pod_status::{PodStatusInputs, desired_pod_status, pod_status_differs};
use super::slice::{
    DriverPod, DriverPool, NodeRef, PoolContent, SliceTarget, desired_slices, gpu_index,
    is_pool_slice_name, plan_pool, published_pool, slice_differs,
};
use super::time::{add, reported_after, whole_seconds};
use super::workload::{
    DeviceUse, UsedDevice, WorkloadMoment, assign_plugin_devices, desired_workload_status,
    is_terminal, workload_log_lines, workload_moment,
};
use super::{AgentKind, Fault, ids};
use crate::{
    AGENT_LABEL, DEFAULT_DRIVER, DEFAULT_RESOURCE, DEVICES_LABEL, DRIVER_ANNOTATION, FAULTY_LABEL,
    FIELD_MANAGER, PARTITIONS_ANNOTATION, REPORT_DELAY_ANNOTATION, RESOURCE_ANNOTATION,
    ROLLING_UPDATE_ANNOTATION, UNITS_ANNOTATION,
};

/// What the sim needs to know of a Node object.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeFacts {
    pub uid: String,
    pub internal_ip: Option<String>,
    /// From the `sim.saferollout.dev/devices` label; missing or invalid is 0.
    pub physical_devices: u64,
    /// GPU indices the `sim.saferollout.dev/faulty-devices` label names.
    pub faulty: BTreeSet<u64>,
    pub capacity: BTreeMap<String, String>,
    pub allocatable: BTreeMap<String, String>,
    /// Keys of `status.capacity` / `status.allocatable` that the sim's field
    /// manager wrote, per the node's managed fields.
    pub sim_owned: BTreeSet<String>,
    /// The node's Ready condition is not True.
    pub not_ready: bool,
    /// The node has a Ready condition (a status write stamps its heartbeat).
    pub has_ready_condition: bool,
    /// When the node's status was last written: its Ready condition's
    /// `lastHeartbeatTime`, which a kubelet sets on every status write.
    pub status_written: Option<Timestamp>,
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
        let ready = status
            .and_then(|s| s.conditions.as_ref())
            .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"));
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
            faulty: node
                .metadata
                .labels
                .as_ref()
                .and_then(|labels| labels.get(FAULTY_LABEL))
                .map(|value| parse_faulty_devices(value))
                .unwrap_or_default(),
            capacity: quantities(status.and_then(|s| s.capacity.as_ref())),
            allocatable: quantities(status.and_then(|s| s.allocatable.as_ref())),
            sim_owned: sim_owned_resources(node),
            not_ready: ready.is_none_or(|c| c.status != "True"),
            has_ready_condition: ready.is_some(),
            status_written: ready
                .and_then(|c| c.last_heartbeat_time.as_ref())
                .map(|t| t.0),
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
    /// Device IDs handed to workload containers by device plugins, per pod
    /// UID, container and resource (the device manager's assignments).
    pub assignments: BTreeMap<String, BTreeMap<(String, String), Vec<String>>>,
    /// When a workload's device was first seen lost (it ends then), per pod UID.
    pub lost_at: BTreeMap<String, Timestamp>,
    /// Since when no agent serves a resource (`dp/<resource>`) or driver
    /// (`dra/<driver>`) that the node had, for the health handover.
    pub unserved_since: BTreeMap<String, Timestamp>,
}

impl NodeMemory {
    /// Nothing worth keeping: the node can be forgotten.
    pub fn is_empty(&self) -> bool {
        self.pod_started.is_empty()
            && self.endpoints.is_empty()
            && self.pools.is_empty()
            && self.assignments.is_empty()
            && self.lost_at.is_empty()
            && self.unserved_since.is_empty()
    }
}

/// The log files of one pod's containers, as the kubelet would keep them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodLogs {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    /// CRI-format log text per container name.
    pub containers: BTreeMap<String, String>,
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
    /// The heartbeat to stamp on the node's Ready condition: the node's
    /// status is written now (with `node_entries`, or alone to report a
    /// plugin that registered), as a kubelet stamps every status write.
    pub status_heartbeat: Option<Timestamp>,
    pub slice_applies: Vec<ResourceSlice>,
    /// Names of slices to delete.
    pub slice_deletes: Vec<String>,
    /// When something changes next without an outside event.
    pub next_change: Option<Timestamp>,
    /// Log files of the node's agent and workload pods (written only when
    /// they change, so not counted as pending writes).
    pub logs: Vec<PodLogs>,
    /// Per-GPU metrics of the node (`None` without a Node).
    pub gpus: Option<Vec<GpuSample>>,
}

impl NodePlan {
    pub fn is_empty(&self) -> bool {
        self.pod_statuses.is_empty()
            && self.node_entries.is_empty()
            && self.status_heartbeat.is_none()
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
    /// Workload pods (label `sim.saferollout.dev/workload`) bound to the node.
    pub workloads: &'a [&'a Pod],
    /// ResourceClaims allocated in the node's pools, and those the node's
    /// workload pods use.
    pub claims: &'a [&'a ResourceClaim],
    /// The sim's slices that name the node.
    pub slices: &'a [&'a ResourceSlice],
    /// Whether `slices` is known to be complete. Until the slice watch has
    /// listed (or when the API serves no ResourceSlices), DRA decisions wait:
    /// publishing without knowing the published generation would reset it.
    pub slices_known: bool,
    /// Whether `claims` is known to be complete (DRA decisions that depend
    /// on claims wait for it, as they wait for slices).
    pub claims_known: bool,
}

/// When an agent pod became Ready and when its devices are reported (the
/// node's status written with them, its slices published): in the whole
/// second after its Ready, later by its `sim.saferollout.dev/report-delay`.
#[derive(Clone, Copy, Debug)]
struct Report {
    ready: Timestamp,
    at: Timestamp,
}

/// An agent pod the sim runs on the node.
struct RunningAgent<'a> {
    pod: &'a Pod,
    uid: &'a str,
    kind: Option<AgentKind>,
    fault: Fault,
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
    let workloads = running_workloads(view, memory, now);
    memory
        .pod_started
        .retain(|uid, _| agents.iter().any(|a| a.uid == uid) || workloads.contains_key(uid));

    let host_ip = view
        .node
        .and_then(|n| n.internal_ip.clone())
        .unwrap_or_else(|| ids::fallback_host_ip(view.name));
    // When each agent pod became Ready, as its status says (or is about to),
    // and when its devices are reported.
    let mut reports: BTreeMap<&str, Report> = BTreeMap::new();
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
                node_not_ready: view.node.is_some_and(|n| n.not_ready),
                now,
            },
        );
        let ready_since = status
            .conditions
            .iter()
            .flatten()
            .find(|c| c.type_ == "Ready" && c.status == "True")
            .and_then(|c| c.last_transition_time.as_ref());
        if let Some(t) = ready_since {
            let delay = annotation(agent.pod, REPORT_DELAY_ANNOTATION)
                .and_then(|d| crate::cli::parse_duration(d).ok())
                .unwrap_or_default();
            let report = Report {
                ready: t.0,
                at: reported_after(add(t.0, delay)),
            };
            reports.insert(agent.uid, report);
        }
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
        memory.assignments.clear();
        memory.lost_at.clear();
        memory.unserved_since.clear();
        return plan;
    };
    let mut services =
        plan_device_plugins(&mut plan, node, &agents, &reports, memory, now, timings);
    let dra_known = view.slices_known && view.claims_known;
    if dra_known {
        services.extend(plan_dra_drivers(
            &mut plan, view, node, &agents, &reports, memory, now, timings,
        ));
    }
    for agent in &agents {
        plan.logs.push(agent_logs(agent, node, memory, now));
    }
    track_unserved(&mut plan, &services, memory, now, timings);
    if dra_known {
        plan_workloads(
            &mut plan, view, node, &workloads, &services, memory, &host_ip, now, timings,
        );
    } else {
        memory
            .assignments
            .retain(|uid, _| workloads.contains_key(uid));
        memory.lost_at.retain(|uid, _| workloads.contains_key(uid));
    }
    plan.gpus = Some(gpu_samples(
        view.name, node, &services, &workloads, memory, now, timings,
    ));
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
        let fault = Fault::from_image(first_image);
        agents.push(RunningAgent {
            pod,
            uid,
            kind: label(pod, AGENT_LABEL).and_then(AgentKind::from_label),
            fault,
            moment: agent_moment(fault, started, now, timings),
        });
    }
    agents
}

/// The node's workload pods that still run (bound here, not deleting, not
/// ended), by UID; also notes when the sim started them.
fn running_workloads<'a>(
    view: NodeView<'a>,
    memory: &mut NodeMemory,
    now: Timestamp,
) -> BTreeMap<String, &'a Pod> {
    let mut running = BTreeMap::new();
    for &pod in view.workloads {
        let bound_here = pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(view.name);
        let Some(uid) = pod.metadata.uid.as_deref() else {
            continue;
        };
        if !bound_here || pod.metadata.deletion_timestamp.is_some() || is_terminal(pod) {
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
        running.insert(uid.to_owned(), pod);
    }
    running
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

/// The instances of each DRA driver on the node, newest first, as the
/// kubelet's plugin manager has them registered or about to be.
///
/// A driver pod annotated `sim.saferollout.dev/rolling-update: "true"`
/// registers on a socket of its own (the `kubeletplugin` helper's
/// `RollingUpdate` option), so the kubelet (1.33+) keeps it beside other
/// instances of the driver. A pod without it listens on the driver's one
/// shared socket: a newer such pod unlinks and takes over the socket of an
/// older one, which the kubelet then cannot reach, not even as a fallback.
/// So of those only the newest is an instance, registered or not. (When it
/// goes, the newest left is the instance again, as before two-instance
/// support: the sim keeps no record of whose socket was taken; a real
/// kubelet could not reach that pod.)
fn driver_instances<'b, 'a>(
    agents: &'b [RunningAgent<'a>],
) -> BTreeMap<String, Vec<&'b RunningAgent<'a>>> {
    let mut instances: BTreeMap<String, Vec<&RunningAgent<'a>>> = BTreeMap::new();
    for agent in agents
        .iter()
        .filter(|a| a.kind == Some(AgentKind::DraDriver))
    {
        let driver = annotation(agent.pod, DRIVER_ANNOTATION).unwrap_or(DEFAULT_DRIVER);
        instances.entry(driver.to_owned()).or_default().push(agent);
    }
    for pods in instances.values_mut() {
        pods.sort_by(|a, b| age_key(b.pod).cmp(&age_key(a.pod)));
        let mut shared_socket_taken = false;
        pods.retain(|agent| {
            rolling_update(agent.pod) || !std::mem::replace(&mut shared_socket_taken, true)
        });
    }
    instances
}

/// Whether a driver pod registers on a socket of its own.
fn rolling_update(pod: &Pod) -> bool {
    annotation(pod, ROLLING_UPDATE_ANNOTATION).is_some_and(|v| v.trim() == "true")
}

/// Which of a driver's `instances` (newest first) serves the pool, as the
/// kubelet (1.33+) uses the most recently registered instance and falls
/// back to an older one when it goes: the newest registered instance that
/// publishes already (`publisher`) or whose first publication is due (the
/// whole second after its Ready, see [`DriverPod::report_at`]). While a newer
/// registered instance waits for that, the older one goes on serving (the
/// returned wake-up is when the newer one's turn comes), so a healthy
/// handover never leaves the pool without its slices. With no registered
/// instance due, the newest registered one (whose publication then waits,
/// the pool's slices kept); with none registered, the newest (which
/// publishes nothing: the pool's slices go after the status delay).
fn serving_instance<'b, 'a>(
    instances: &[&'b RunningAgent<'a>],
    publisher: Option<&str>,
    reports: &BTreeMap<&str, Report>,
    now: Timestamp,
) -> (Option<&'b RunningAgent<'a>>, Option<Timestamp>) {
    let registered: Vec<&RunningAgent<'a>> = instances
        .iter()
        .copied()
        .filter(|a| a.moment.offer.serving())
        .collect();
    let mut wake = None;
    for agent in &registered {
        let pending = reports
            .get(agent.uid)
            .map(|r| r.at)
            .filter(|at| now < *at && publisher != Some(agent.uid));
        match pending {
            None => return (Some(agent), wake),
            Some(at) => wake = Some(wake.map_or(at, |w: Timestamp| w.min(at))),
        }
    }
    (registered.first().or(instances.first()).copied(), wake)
}

/// Orders pods by creation, names breaking ties.
fn age_key(pod: &Pod) -> (Option<Timestamp>, Option<&str>) {
    (
        pod.metadata.creation_timestamp.as_ref().map(|t| t.0),
        pod.metadata.name.as_deref(),
    )
}

/// Service keys: `dp/<resource>` and `dra/<driver>`.
fn plugin_key(resource: &str) -> String {
    format!("dp/{resource}")
}

fn driver_key(driver: &str) -> String {
    format!("dra/{driver}")
}

/// Plans the node's extended-resource entries; returns what each resource's
/// plugin serves, by service key (`None` for a resource the node had but
/// whose plugin is gone).
/// The node's status is written as a kubelet writes it: whenever what it
/// reports changes, stamped with a heartbeat; and a plugin whose pod became
/// Ready is reported in the whole second after its Ready (a kubelet reports
/// a registration at its next node-status sync; the sim's syncs are whole
/// seconds), its devices held back until then, so the node's status written
/// with them is after the Ready (`saferollout_core::gates::freshness`).
fn plan_device_plugins(
    plan: &mut NodePlan,
    node: &NodeFacts,
    agents: &[RunningAgent<'_>],
    reports: &BTreeMap<&str, Report>,
    memory: &mut NodeMemory,
    now: Timestamp,
    timings: &Timings,
) -> BTreeMap<String, Option<AgentService>> {
    let mut report_due = false;
    let mut services = BTreeMap::new();
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
        let service = plugins.get(&resource).map(|agent| {
            let count = agent
                .moment
                .offer
                .plugin_devices(node.physical_devices)
                .unwrap_or(0);
            AgentService {
                kind: AgentKind::DevicePlugin,
                fault: agent.fault,
                offer: agent.moment.offer,
                advertised: plugin_device_names(count),
            }
        });
        let plugin_devices = plugins.get(&resource).and_then(|agent| {
            let count = agent.moment.offer.plugin_devices(node.physical_devices)?;
            let healthy = plugin_healthy_count(agent.fault, count, &node.faulty);
            let units = annotation(agent.pod, UNITS_ANNOTATION)
                .and_then(|u| u.parse::<u64>().ok())
                .filter(|u| *u > 0)
                .unwrap_or(1);
            Some((count * units, (count - healthy) * units))
        });
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
        // The plugin's pod is Ready and the node's status not written since.
        let unreported = plugins
            .get(&resource)
            .and_then(|agent| reports.get(agent.uid))
            .filter(|report| {
                node.has_ready_condition
                    && node
                        .status_written
                        .is_none_or(|w| w.as_second() <= report.ready.as_second())
            });
        let mut held = false;
        if let Some(report) = unreported {
            if now < report.at {
                plan.wake_at(Some(report.at));
                held = true;
            } else {
                report_due = true;
            }
        }
        if !(target.finished && shown == target.entries) {
            memory.endpoints.insert(resource.clone(), endpoint);
            // A resource the node still shows (or is about to drop) counts;
            // one that is gone has no devices left to report on.
            services.insert(plugin_key(&resource), service);
        }
        if shown != target.entries && !held {
            plan.node_entries.insert(resource, target.entries);
        }
    }
    if node.has_ready_condition && (report_due || !plan.node_entries.is_empty()) {
        plan.status_heartbeat = Some(whole_seconds(now));
    }
    services
}

/// Plans the node's ResourceSlices; returns what each driver serves, by
/// service key.
#[allow(clippy::too_many_arguments)]
fn plan_dra_drivers(
    plan: &mut NodePlan,
    view: NodeView<'_>,
    node: &NodeFacts,
    agents: &[RunningAgent<'_>],
    reports: &BTreeMap<&str, Report>,
    memory: &mut NodeMemory,
    now: Timestamp,
    timings: &Timings,
) -> BTreeMap<String, Option<AgentService>> {
    let mut services = BTreeMap::new();
    let drivers = driver_instances(agents);
    // Only slices under the pool's names are the pool's; anything else
    // carrying the label is left alone.
    let mut published: BTreeMap<&str, Vec<&ResourceSlice>> = BTreeMap::new();
    for &slice in view.slices {
        let name = slice.metadata.name.as_deref().unwrap_or_default();
        if is_pool_slice_name(name, view.name, &slice.spec.driver) {
            published
                .entry(slice.spec.driver.as_str())
                .or_default()
                .push(slice);
        }
    }
    let names: BTreeSet<String> = drivers
        .keys()
        .cloned()
        .chain(memory.pools.keys().cloned())
        .chain(published.keys().map(|d| (*d).to_owned()))
        .collect();
    for driver in names {
        let current = published.get(driver.as_str()).cloned().unwrap_or_default();
        let previous = memory.pools.remove(&driver);
        // The first slice carries the pool's publisher.
        let first = current
            .iter()
            .copied()
            .min_by_key(|s| s.metadata.name.as_deref().map(str::len));
        let publisher = match &previous {
            Some(pool) => pool.publisher.clone(),
            None => first.and_then(|s| published_pool(s).publisher.map(str::to_owned)),
        };
        let instances = drivers.get(&driver).map_or(&[][..], Vec::as_slice);
        let (agent, wake) = serving_instance(instances, publisher.as_deref(), reports, now);
        plan.wake_at(wake);
        let content = agent.and_then(|agent| {
            let devices = agent.moment.offer.driver_devices(node.physical_devices)?;
            let withheld = if agent.fault == Fault::DropClaims {
                allocated_devices(view.claims, &driver, view.name)
            } else {
                BTreeSet::new()
            };
            Some(PoolContent {
                devices,
                partitions: annotation(agent.pod, PARTITIONS_ANNOTATION)
                    .and_then(|v| v.trim().parse().ok())
                    .unwrap_or(0),
                scale: if agent.fault == Fault::Overcount {
                    2
                } else {
                    1
                },
                tainted: tainted_gpus(agent.fault, devices, &node.faulty),
                withheld,
            })
        });
        let service = agent.map(|agent| AgentService {
            kind: AgentKind::DraDriver,
            fault: agent.fault,
            offer: agent.moment.offer,
            advertised: content
                .as_ref()
                .map(|c| c.device_names().into_iter().collect())
                .unwrap_or_default(),
        });
        services.insert(driver_key(&driver), service);
        let driver_pod = agent.map(|agent| DriverPod {
            uid: agent.uid,
            content: content.clone(),
            registered: agent.moment.offer.serving(),
            report_at: reports.get(agent.uid).map(|r| r.at),
        });
        let (pool, target, wake) = plan_pool(
            previous,
            first.map(published_pool),
            driver_pod,
            now,
            timings,
        );
        plan.wake_at(wake);
        match target {
            SliceTarget::Publish {
                content,
                generation,
                publisher,
            } => {
                let node_ref = NodeRef {
                    name: view.name,
                    uid: &node.uid,
                };
                let desired = desired_slices(node_ref, &driver, &content, generation, &publisher);
                for slice in &desired {
                    let existing = current
                        .iter()
                        .find(|c| c.metadata.name == slice.metadata.name);
                    if existing.is_none_or(|c| slice_differs(c, slice)) {
                        plan.slice_applies.push(slice.clone());
                    }
                }
                for stale in &current {
                    if !desired
                        .iter()
                        .any(|d| d.metadata.name == stale.metadata.name)
                        && let Some(name) = stale.metadata.name.clone()
                    {
                        plan.slice_deletes.push(name);
                    }
                }
            }
            SliceTarget::Keep => {}
            SliceTarget::Absent => {
                plan.slice_deletes
                    .extend(current.iter().filter_map(|c| c.metadata.name.clone()));
            }
        }
        memory.pools.insert(driver, pool);
    }
    services
}

/// Whether the node's published pool of `driver` lists `device`.
fn published(slices: &[&ResourceSlice], driver: &str, node: &str, device: &str) -> bool {
    slices.iter().any(|slice| {
        slice.spec.driver == driver
            && is_pool_slice_name(
                slice.metadata.name.as_deref().unwrap_or_default(),
                node,
                driver,
            )
            && slice
                .spec
                .devices
                .iter()
                .flatten()
                .any(|d| d.name == device)
    })
}

/// Devices of `driver` in the pool `pool` that some claim is allocated.
fn allocated_devices(claims: &[&ResourceClaim], driver: &str, pool: &str) -> BTreeSet<String> {
    claims
        .iter()
        .flat_map(|claim| allocation_results(claim))
        .filter(|r| r.driver == driver && r.pool == pool)
        .map(|r| r.device.clone())
        .collect()
}

fn allocation_results(
    claim: &ResourceClaim,
) -> impl Iterator<Item = &k8s_openapi::api::resource::v1::DeviceRequestAllocationResult> {
    claim
        .status
        .as_ref()
        .and_then(|s| s.allocation.as_ref())
        .and_then(|a| a.devices.as_ref())
        .and_then(|d| d.results.as_ref())
        .into_iter()
        .flatten()
}

/// Keeps `memory.unserved_since` in step with the services: set when a
/// service the node had stops serving, cleared when one serves.
fn track_unserved(
    plan: &mut NodePlan,
    services: &BTreeMap<String, Option<AgentService>>,
    memory: &mut NodeMemory,
    now: Timestamp,
    timings: &Timings,
) {
    memory
        .unserved_since
        .retain(|key, _| services.contains_key(key));
    for (key, service) in services {
        if service.as_ref().is_some_and(AgentService::serving) {
            memory.unserved_since.remove(key);
        } else {
            let since = *memory.unserved_since.entry(key.clone()).or_insert(now);
            let ends = add(since, timings.health_handover);
            if ends > now {
                plan.wake_at(Some(ends));
            }
        }
    }
}

/// The log files of an agent pod.
fn agent_logs(
    agent: &RunningAgent<'_>,
    node: &NodeFacts,
    memory: &NodeMemory,
    now: Timestamp,
) -> PodLogs {
    let pod = agent.pod;
    let started = started_at(pod, memory).unwrap_or(now);
    let containers: &[Container] = pod.spec.as_ref().map_or(&[], |s| &s.containers);
    let name = match agent.kind {
        Some(AgentKind::DraDriver) => annotation(pod, DRIVER_ANNOTATION).unwrap_or(DEFAULT_DRIVER),
        _ => annotation(pod, RESOURCE_ANNOTATION).unwrap_or(DEFAULT_RESOURCE),
    };
    let devices = match agent.kind {
        Some(AgentKind::DraDriver) => agent.moment.offer.driver_devices(node.physical_devices),
        _ => agent.moment.offer.plugin_devices(node.physical_devices),
    };
    // A crash-looping container's log is its last attempt's.
    let stamp = match agent.moment.run {
        ContainerRun::CrashLooping {
            last_attempt_at, ..
        } => last_attempt_at,
        ContainerRun::Running => started,
    };
    PodLogs {
        namespace: pod.metadata.namespace.clone().unwrap_or_default(),
        name: pod.metadata.name.clone().unwrap_or_default(),
        uid: agent.uid.to_owned(),
        containers: containers
            .iter()
            .enumerate()
            .map(|(index, container)| {
                let lines = if index == 0 {
                    agent_log_lines(
                        &AgentLogFacts {
                            kind: agent.kind,
                            fault: agent.fault,
                            name,
                            image: container.image.as_deref().unwrap_or_default(),
                            pod_uid: agent.uid,
                            devices: devices.unwrap_or(0),
                        },
                        stamp,
                    )
                } else {
                    other_container_lines(&container.name, stamp)
                };
                (container.name.clone(), cri_log(&lines, stamp))
            })
            .collect(),
    }
}

/// Statuses and logs of the node's workload pods.
#[allow(clippy::too_many_arguments)]
fn plan_workloads(
    plan: &mut NodePlan,
    view: NodeView<'_>,
    node: &NodeFacts,
    workloads: &BTreeMap<String, &Pod>,
    services: &BTreeMap<String, Option<AgentService>>,
    memory: &mut NodeMemory,
    host_ip: &str,
    now: Timestamp,
    timings: &Timings,
) {
    memory
        .assignments
        .retain(|uid, _| workloads.contains_key(uid));
    memory.lost_at.retain(|uid, _| workloads.contains_key(uid));
    // Device-plugin devices already held, per resource.
    let mut taken: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for containers in memory.assignments.values() {
        for ((_, resource), ids) in containers {
            taken
                .entry(resource.clone())
                .or_default()
                .extend(ids.iter().cloned());
        }
    }
    // ... and those the pods' statuses report (what a restarted sim
    // continues from), so no pod is handed another's device.
    for pod in workloads.values() {
        let reported = pod
            .status
            .iter()
            .flat_map(|s| s.container_statuses.iter().flatten())
            .flat_map(|c| c.allocated_resources_status.iter().flatten())
            .filter(|r| !r.name.starts_with("claim:"));
        for entry in reported {
            taken.entry(entry.name.clone()).or_default().extend(
                entry
                    .resources
                    .iter()
                    .flatten()
                    .map(|r| r.resource_id.clone()),
            );
        }
    }
    // Oldest first, as the kubelet admits them.
    let mut ordered: Vec<&Pod> = workloads.values().copied().collect();
    ordered.sort_by_key(|p| age_key(p));
    for pod in ordered {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let started = started_at(pod, memory).unwrap_or(now);
        if !claims_ready(pod, view) {
            // As a kubelet that cannot prepare the pod's claims yet: the pod
            // does not start (the claim's allocation is on its way).
            if pod
                .status
                .as_ref()
                .and_then(|s| s.start_time.as_ref())
                .is_none()
            {
                memory.pod_started.remove(&uid);
            }
            continue;
        }
        let devices = workload_devices(pod, view, node, services, memory, &mut taken, now, timings);
        let lost_at = devices
            .values()
            .flatten()
            .any(|d| d.lost.is_some())
            .then(|| {
                *memory
                    .lost_at
                    .entry(uid.clone())
                    .or_insert(whole_seconds(now))
            });
        let moment = workload_moment(
            pod,
            &devices,
            started,
            timings.workload_run_time,
            now,
            lost_at,
        );
        if let WorkloadMoment::Running {
            ends_at: Some(ends_at),
        } = moment
        {
            plan.wake_at(Some(ends_at));
        }
        // (Addresses and start time are kept from the current status.)
        let status = desired_workload_status(pod, &moment, &devices, started, host_ip, now);
        if pod_status_differs(pod.status.as_ref(), &status) {
            plan.pod_statuses.push(PodStatusUpdate {
                namespace: pod.metadata.namespace.clone().unwrap_or_default(),
                name: pod.metadata.name.clone().unwrap_or_default(),
                uid: uid.clone(),
                status,
            });
        }
        let stamp = match &moment {
            WorkloadMoment::Ended { at, .. } => *at,
            WorkloadMoment::Running { .. } => started,
        };
        let containers: &[Container] = pod.spec.as_ref().map_or(&[], |s| &s.containers);
        plan.logs.push(PodLogs {
            namespace: pod.metadata.namespace.clone().unwrap_or_default(),
            name: pod.metadata.name.clone().unwrap_or_default(),
            uid,
            containers: containers
                .iter()
                .map(|c| {
                    let used = devices.get(&c.name).map_or(&[][..], Vec::as_slice);
                    let lines = workload_log_lines(&moment, used);
                    (c.name.clone(), cri_log(&lines, stamp))
                })
                .collect(),
        });
    }
}

/// The devices each container of a workload pod uses, with their health.
#[allow(clippy::too_many_arguments)]
fn workload_devices(
    pod: &Pod,
    view: NodeView<'_>,
    node: &NodeFacts,
    services: &BTreeMap<String, Option<AgentService>>,
    memory: &mut NodeMemory,
    taken: &mut BTreeMap<String, BTreeSet<String>>,
    now: Timestamp,
    timings: &Timings,
) -> DeviceUse {
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
    let mut used = DeviceUse::new();
    let health_of = |key: &str, kind: AgentKind, device: &str| {
        let service = services.get(key).and_then(Option::as_ref);
        let health = device_health(
            service,
            kind,
            device,
            &Hardware {
                physical: node.physical_devices,
                faulty: &node.faulty,
            },
            &Handover {
                unserved_since: memory.unserved_since.get(key).copied(),
                window: timings.health_handover,
                now,
            },
        );
        (service, health)
    };
    let physically_faulty =
        |device: &str| gpu_index(device).is_some_and(|i| node.faulty.contains(&i));
    let containers: &[Container] = pod.spec.as_ref().map_or(&[], |s| &s.containers);
    for container in containers {
        let mut devices = Vec::new();
        // Device plugins: extended resources in limits that the node's
        // plugins (now or before) serve.
        let limits = container
            .resources
            .as_ref()
            .and_then(|r| r.limits.as_ref())
            .cloned()
            .unwrap_or_default();
        for (resource, quantity) in &limits {
            let key = plugin_key(resource);
            if !services.contains_key(&key) {
                continue;
            }
            let count = usize::try_from(parse_count(&quantity.0)).unwrap_or(0);
            let assignment_key = (container.name.clone(), resource.clone());
            let previous = memory
                .assignments
                .get(&uid)
                .and_then(|a| a.get(&assignment_key))
                .cloned()
                .or_else(|| reported_ids(pod, &container.name, resource));
            let held = taken.entry(resource.clone()).or_default();
            let mine: BTreeSet<String> = previous.iter().flatten().cloned().collect();
            // The device manager hands out only devices reported healthy.
            let mut avoid: BTreeSet<String> = held.difference(&mine).cloned().collect();
            if let Some(service) = services.get(&key).and_then(Option::as_ref) {
                avoid.extend(
                    service
                        .advertised
                        .iter()
                        .filter(|id| {
                            health_of(&key, AgentKind::DevicePlugin, id).1 != Health::Healthy
                        })
                        .cloned(),
                );
            }
            let ids = assign_plugin_devices(previous.as_deref(), count, &avoid);
            held.extend(ids.iter().cloned());
            memory
                .assignments
                .entry(uid.clone())
                .or_default()
                .insert(assignment_key, ids.clone());
            for id in ids {
                let (_, health) = health_of(&key, AgentKind::DevicePlugin, &id);
                devices.push(UsedDevice {
                    status_name: resource.clone(),
                    problem: problem(resource, &id, health, physically_faulty(&id), false),
                    resource_id: id,
                    health,
                    health_message: None,
                    lost: None,
                });
            }
        }
        // DRA: the container's claims, allocated in the node's pools of
        // drivers the node has (had).
        for claim_ref in container
            .resources
            .as_ref()
            .and_then(|r| r.claims.as_ref())
            .into_iter()
            .flatten()
        {
            let Some(claim_name) = pod_claim_name(pod, &claim_ref.name) else {
                continue;
            };
            let Some(claim) = view.claims.iter().find(|c| {
                c.metadata.name.as_deref() == Some(claim_name.as_str())
                    && c.metadata.namespace.as_deref() == Some(namespace)
            }) else {
                continue;
            };
            let request = claim_ref.request.as_deref().filter(|r| !r.is_empty());
            let status_name = match request {
                Some(request) => format!("claim:{}/{request}", claim_ref.name),
                None => format!("claim:{}", claim_ref.name),
            };
            for result in allocation_results(claim) {
                let key = driver_key(&result.driver);
                let wanted = request.is_none_or(|r| {
                    result.request == r || result.request.starts_with(&format!("{r}/"))
                });
                if result.pool != view.name || !services.contains_key(&key) || !wanted {
                    continue;
                }
                let (service, mut health) = health_of(&key, AgentKind::DraDriver, &result.device);
                let tainted = service.is_some_and(|s| {
                    s.fault == Fault::Taint
                        || (s.fault != Fault::ClearTaints
                            && gpu_index(&result.device).is_some_and(|i| node.faulty.contains(&i)))
                });
                let lost = service
                    .filter(|s| {
                        s.fault == Fault::DropClaims
                            && s.serving()
                            && !s.advertised.contains(&result.device)
                            // Once the withdrawal is published: the driver
                            // publishes in the second after its Ready, and a
                            // pod failed before that would free its claim, so
                            // the device would never be seen withdrawn.
                            && !published(view.slices, &result.driver, view.name, &result.device)
                    })
                    .map(|_| {
                        format!(
                            "NodePrepareResources failed for ResourceClaim {claim_name}: device {} not found in pool {} of driver {}",
                            result.device, result.pool, result.driver
                        )
                    });
                if lost.is_some() {
                    health = Health::Unhealthy;
                }
                let resource_id = format!("{}/{}/{}", result.driver, result.pool, result.device);
                let problem = problem(
                    &status_name,
                    &resource_id,
                    health,
                    physically_faulty(&result.device),
                    tainted,
                );
                let health_message = (health == Health::Unhealthy && lost.is_none())
                    .then(|| dra_health_message(service, &result.device, node))
                    .flatten();
                devices.push(UsedDevice {
                    status_name: status_name.clone(),
                    resource_id,
                    health,
                    health_message,
                    problem,
                    lost,
                });
            }
        }
        if !devices.is_empty() {
            used.insert(container.name.clone(), devices);
        }
    }
    used
}

/// What a serving DRA driver says about an Unhealthy device (the kubelet
/// passes it on as `resources[].message`).
fn dra_health_message(
    service: Option<&AgentService>,
    device: &str,
    node: &NodeFacts,
) -> Option<String> {
    let service = service.filter(|s| s.serving())?;
    let faulty = gpu_index(device).is_some_and(|i| node.faulty.contains(&i));
    if service.fault == Fault::Unhealthy || faulty {
        Some(super::devices::XID_MESSAGE.to_owned())
    } else if !service.advertised.contains(device) {
        Some(format!("device {device} is not published"))
    } else {
        None
    }
}

/// Why a workload cannot use a device, if it cannot: its health is not
/// Healthy, the hardware is faulty (whatever a laundering agent reports),
/// or its driver tainted it.
fn problem(name: &str, id: &str, health: Health, faulty: bool, tainted: bool) -> Option<String> {
    let why = if health != Health::Healthy {
        format!("{name} device {id} is {}", health.as_str())
    } else if faulty {
        format!(
            "{name} device {id} has a hardware fault ({})",
            super::devices::XID_MESSAGE
        )
    } else if tainted {
        format!(
            "{name} device {id} carries the health taint {}={}:{}",
            super::slice::HEALTH_TAINT_KEY,
            super::slice::HEALTH_TAINT_VALUE,
            super::slice::HEALTH_TAINT_EFFECT
        )
    } else {
        return None;
    };
    Some(format!(
        "failed to allocate device vector A on {id} (error code no CUDA-capable device is detected): {why}"
    ))
}

/// The device IDs the pod's status reports for a container's resource
/// (what a restarted sim continues from).
fn reported_ids(pod: &Pod, container: &str, resource: &str) -> Option<Vec<String>> {
    let statuses = pod.status.as_ref()?.container_statuses.as_ref()?;
    let status = statuses.iter().find(|s| s.name == container)?;
    let entry = status
        .allocated_resources_status
        .as_ref()?
        .iter()
        .find(|r| r.name == resource)?;
    Some(
        entry
            .resources
            .iter()
            .flatten()
            .map(|r| r.resource_id.clone())
            .collect(),
    )
}

/// Names of the ResourceClaims the pod's containers use (those known yet).
pub fn referenced_claims(pod: &Pod) -> Vec<String> {
    let containers: &[Container] = pod.spec.as_ref().map_or(&[], |s| &s.containers);
    let mut names: Vec<String> = containers
        .iter()
        .flat_map(|c| c.resources.iter().flat_map(|r| r.claims.iter().flatten()))
        .filter_map(|r| pod_claim_name(pod, &r.name))
        .collect();
    names.sort();
    names.dedup();
    names
}

/// Whether every claim the pod's containers use is known and allocated.
fn claims_ready(pod: &Pod, view: NodeView<'_>) -> bool {
    let namespace = pod.metadata.namespace.as_deref();
    let containers: &[Container] = pod.spec.as_ref().map_or(&[], |s| &s.containers);
    containers
        .iter()
        .flat_map(|c| c.resources.iter().flat_map(|r| r.claims.iter().flatten()))
        .all(|r| {
            pod_claim_name(pod, &r.name).is_some_and(|name| {
                view.claims.iter().any(|c| {
                    c.metadata.name.as_deref() == Some(name.as_str())
                        && c.metadata.namespace.as_deref() == namespace
                        && allocation_results(c).next().is_some()
                })
            })
        })
}

/// The ResourceClaim behind a pod's claim entry: `resourceClaimName`, or
/// the generated name the claim controller reports in the pod's status.
fn pod_claim_name(pod: &Pod, entry: &str) -> Option<String> {
    let spec_entry = pod
        .spec
        .as_ref()?
        .resource_claims
        .as_ref()?
        .iter()
        .find(|c| c.name == entry)?;
    if let Some(name) = &spec_entry.resource_claim_name {
        return Some(name.clone());
    }
    pod.status
        .as_ref()?
        .resource_claim_statuses
        .as_ref()?
        .iter()
        .find(|s| s.name == entry)?
        .resource_claim_name
        .clone()
}

/// Per-GPU metrics of the node: a GPU is healthy when it is not physically
/// faulty, every agent the node has reports it Healthy (Unknown counts as
/// healthy during the handover window, so a quick agent replacement shows
/// no dip) and no driver taints it; unhealthy when the node has no agent
/// (an agent gone for longer than the handover window no longer counts).
fn gpu_samples(
    node_name: &str,
    node: &NodeFacts,
    services: &BTreeMap<String, Option<AgentService>>,
    workloads: &BTreeMap<String, &Pod>,
    memory: &NodeMemory,
    now: Timestamp,
    timings: &Timings,
) -> Vec<GpuSample> {
    let in_use: BTreeSet<u64> = memory
        .assignments
        .values()
        .flat_map(|a| a.values().flatten())
        .filter_map(|id| gpu_index(id))
        .chain(workloads.values().flat_map(|pod| {
            pod.status
                .iter()
                .flat_map(|s| s.container_statuses.iter().flatten())
                .flat_map(|c| c.allocated_resources_status.iter().flatten())
                .filter(|r| r.name.starts_with("claim:"))
                .flat_map(|r| r.resources.iter().flatten())
                .filter_map(|r| r.resource_id.rsplit('/').next().and_then(gpu_index))
                .collect::<Vec<_>>()
        }))
        .collect();
    (0..node.physical_devices)
        .map(|index| {
            let device = format!("gpu-{index}");
            // Services that count: agents present (serving or not), and
            // agents gone for less than the handover window. An agent gone
            // for longer is not installed any more and says nothing.
            let mut counted = false;
            let mut healthy = true;
            let mut xid = if node.faulty.contains(&index) { 79 } else { 0 };
            for (key, service) in services {
                let kind = if key.starts_with("dra/") {
                    AgentKind::DraDriver
                } else {
                    AgentKind::DevicePlugin
                };
                let since = memory.unserved_since.get(key).copied();
                let within = since.is_some_and(|s| now < add(s, timings.health_handover));
                if service.is_none() && !within {
                    continue;
                }
                counted = true;
                let health = device_health(
                    service.as_ref(),
                    kind,
                    &device,
                    &Hardware {
                        physical: node.physical_devices,
                        faulty: &node.faulty,
                    },
                    &Handover {
                        unserved_since: since,
                        window: timings.health_handover,
                        now,
                    },
                );
                let serving = service.as_ref().filter(|s| s.serving());
                let tainted = serving.is_some_and(|s| {
                    kind == AgentKind::DraDriver
                        && tainted_gpus(s.fault, node.physical_devices, &node.faulty)
                            .contains(&index)
                });
                if serving.is_some_and(|s| s.fault == Fault::Unhealthy) {
                    xid = 79;
                }
                let ok = health == Health::Healthy || (health == Health::Unknown && within);
                healthy &= ok && !tainted;
            }
            healthy &= counted;
            // A laundering agent may call it healthy; the hardware is not.
            healthy &= !node.faulty.contains(&index);
            GpuSample {
                node: node_name.to_owned(),
                index,
                uuid: gpu_uuid(&node.uid, node_name, index),
                healthy,
                in_use: in_use.contains(&index),
                xid,
            }
        })
        .collect()
}

/// A stable, GPU-style UUID for a node's GPU.
fn gpu_uuid(node_uid: &str, node: &str, index: u64) -> String {
    let digest = ids::hex_digest(&["gpu-uuid", node_uid, node, &index.to_string()]);
    format!(
        "GPU-{}-{}-{}-{}-{}",
        &digest[0..8],
        &digest[8..12],
        &digest[12..16],
        &digest[16..20],
        &digest[20..32]
    )
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
