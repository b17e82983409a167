//! The reconcile loop: watch events and timers mark nodes dirty; each dirty
//! node is planned with [`plan_node`] and the plan's writes are sent,
//! several at a time, with their answers fed back into the mirrors.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use futures::{Stream, StreamExt};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Node, Pod, PodSpec};
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use serde_json::{Map, Value, json};
use tokio::sync::{Semaphore, mpsc};
use tokio::time::{Instant, sleep_until};
use tracing::{debug, info, warn};

use super::mirror::{Entry, Mirror, parse_resource_version};
use super::outputs::{GpuMetrics, LogOutcome, LogPublisher, LogState, serve_metrics};
use super::wakeups::Wakeups;
use super::writes::{self, Decision, WriteError, WriteKey, WriteOp, WriteTracker, Written};
use crate::model::Timings;
use crate::model::node::{NodeFacts, NodeMemory, NodePlan, NodeView, plan_node, referenced_claims};
use crate::model::pod_status::pod_status_patch;
use crate::model::time::elapsed;
use crate::{AGENT_LABEL, SLICE_NODE_LABEL, WORKLOAD_LABEL};

/// What the sim serves besides API objects.
#[derive(Clone, Debug, Default)]
pub struct Outputs {
    /// Where to write container logs for KWOK's kubelet server (and create
    /// KWOK `Logs` objects pointing at them); `None`: no logs.
    pub pod_logs_dir: Option<std::path::PathBuf>,
    /// Where to serve per-GPU metrics; `None`: not served.
    pub metrics_addr: Option<std::net::SocketAddr>,
}

/// Writes in flight at once: enough to keep up with thousands of nodes,
/// few enough not to swamp a test API server.
const MAX_CONCURRENT_WRITES: usize = 32;
/// Margin added to timer deadlines so that, when a timer fires, the
/// wall-clock boundary it waits for has certainly passed.
const TIMER_SLACK: Duration = Duration::from_millis(20);
const REPORT_EVERY: Duration = Duration::from_secs(60);
/// How soon a failed log publication is tried again.
const LOG_RETRY: Duration = Duration::from_secs(5);

/// Runs the sim until `shutdown` completes.
pub async fn run(
    client: Client,
    timings: Timings,
    outputs: Outputs,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    let metrics = GpuMetrics::default();
    if let Some(addr) = outputs.metrics_addr {
        serve_metrics(addr, metrics.clone()).await?;
    }
    let pod_events = watch::<Pod>(
        client.clone(),
        watcher::Config::default().labels(AGENT_LABEL),
    );
    let workload_events = watch::<Pod>(
        client.clone(),
        watcher::Config::default().labels(WORKLOAD_LABEL),
    );
    let claim_events = watch::<ResourceClaim>(client.clone(), watcher::Config::default());
    let node_events = watch::<Node>(client.clone(), watcher::Config::default());
    let slice_events = watch::<ResourceSlice>(
        client.clone(),
        watcher::Config::default().labels(SLICE_NODE_LABEL),
    );
    futures::pin_mut!(
        pod_events,
        workload_events,
        claim_events,
        node_events,
        slice_events,
        shutdown
    );

    let (outcomes_tx, mut outcomes) = mpsc::unbounded_channel();
    let (log_outcomes_tx, mut log_outcomes) = mpsc::unbounded_channel();
    let logs = outputs
        .pod_logs_dir
        .clone()
        .map(|dir| LogPublisher::new(dir, client.clone(), log_outcomes_tx));
    let mut sim = Reconciler::new(client, timings, outcomes_tx, logs, metrics);
    let mut report = tokio::time::interval_at(Instant::now() + REPORT_EVERY, REPORT_EVERY);
    info!(
        status_delay = ?timings.status_delay,
        endpoint_stop_grace = ?timings.endpoint_stop_grace,
        slow_delay = ?timings.slow_delay,
        flap_period = ?timings.flap_period,
        health_handover = ?timings.health_handover,
        workload_run_time = ?timings.workload_run_time,
        pod_logs_dir = ?outputs.pod_logs_dir,
        "watching agent pods (label {AGENT_LABEL}), workload pods (label {WORKLOAD_LABEL}), nodes, ResourceSlices and ResourceClaims"
    );
    loop {
        let wake = sim.wakeups.next();
        tokio::select! {
            () = &mut shutdown => {
                info!(writes_in_flight = sim.writes.in_flight(), "shutting down");
                return Ok(());
            }
            event = pod_events.next() => {
                let event = event.context("the pod watch ended")?;
                sim.on_pod_event(event);
            }
            event = workload_events.next() => {
                let event = event.context("the workload pod watch ended")?;
                sim.on_workload_event(event);
            }
            event = claim_events.next() => {
                let event = event.context("the ResourceClaim watch ended")?;
                sim.on_claim_event(event);
            }
            Some(outcome) = log_outcomes.recv() => sim.on_log_outcome(outcome),
            event = node_events.next() => {
                let event = event.context("the node watch ended")?;
                sim.on_node_event(event);
            }
            event = slice_events.next() => {
                let event = event.context("the ResourceSlice watch ended")?;
                sim.on_slice_event(event);
            }
            Some(outcome) = outcomes.recv() => sim.on_outcome(outcome),
            () = sleep_until(wake.unwrap_or_else(Instant::now)), if wake.is_some() => sim.on_timer(),
            _ = report.tick() => sim.report(),
        }
        sim.reconcile_dirty();
    }
}

fn watch<K>(
    client: Client,
    config: watcher::Config,
) -> impl Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + 'static,
{
    // The API server's watch cache is fine for the initial list.
    watcher(Api::<K>::all(client), config.any_semantic()).default_backoff()
}

/// The result of one write, as reported by its task.
#[derive(Debug)]
struct Outcome {
    node: String,
    key: WriteKey,
    what: String,
    result: Result<Written, WriteError>,
}

/// Counts for the periodic report.
#[derive(Debug, Default)]
struct Counts {
    pod_statuses: u64,
    node_statuses: u64,
    slice_applies: u64,
    slice_deletes: u64,
    failures: u64,
}

struct Reconciler {
    client: Client,
    timings: Timings,
    pods: Mirror<Arc<Pod>>,
    workloads: Mirror<Arc<Pod>>,
    claims: Mirror<Arc<ResourceClaim>>,
    nodes: Mirror<NodeFacts>,
    slices: Mirror<Arc<ResourceSlice>>,
    memory: HashMap<String, NodeMemory>,
    dirty: HashSet<String>,
    wakeups: Wakeups,
    writes: WriteTracker,
    outcomes: mpsc::UnboundedSender<Outcome>,
    permits: Arc<Semaphore>,
    /// Whether pods and nodes had been listed at the last look.
    ready: bool,
    slices_known: bool,
    claims_known: bool,
    counts: Counts,
    logs: Option<LogPublisher>,
    metrics: GpuMetrics,
}

impl Reconciler {
    fn new(
        client: Client,
        timings: Timings,
        outcomes: mpsc::UnboundedSender<Outcome>,
        logs: Option<LogPublisher>,
        metrics: GpuMetrics,
    ) -> Self {
        Self {
            client,
            timings,
            pods: Mirror::default(),
            workloads: Mirror::default(),
            claims: Mirror::default(),
            nodes: Mirror::default(),
            slices: Mirror::default(),
            memory: HashMap::new(),
            dirty: HashSet::new(),
            wakeups: Wakeups::default(),
            writes: WriteTracker::default(),
            outcomes,
            permits: Arc::new(Semaphore::new(MAX_CONCURRENT_WRITES)),
            ready: false,
            slices_known: false,
            claims_known: false,
            counts: Counts::default(),
            logs,
            metrics,
        }
    }

    fn on_workload_event(&mut self, event: Result<watcher::Event<Pod>, watcher::Error>) {
        match event {
            Ok(event) => self
                .workloads
                .apply(map_event(event, pod_entry), &mut self.dirty),
            Err(error) => warn!(%error, "workload pod watch failed; retrying"),
        }
    }

    fn on_claim_event(&mut self, event: Result<watcher::Event<ResourceClaim>, watcher::Error>) {
        match event {
            Ok(event) => self
                .claims
                .apply(map_event(event, claim_entry), &mut self.dirty),
            Err(error) => {
                warn!(%error, "ResourceClaim watch failed; retrying (DRA workloads wait until it works)")
            }
        }
    }

    fn on_log_outcome(&mut self, outcome: LogOutcome) {
        let Some(logs) = self.logs.as_mut() else {
            return;
        };
        if logs.complete(&outcome) {
            // Tried again (and no longer waited for) at the next look.
            self.wakeups
                .schedule(&outcome.node, Instant::now() + LOG_RETRY);
        } else {
            // A workload's final status may be waiting for its log.
            self.dirty.insert(outcome.node);
        }
    }

    fn on_pod_event(&mut self, event: Result<watcher::Event<Pod>, watcher::Error>) {
        match event {
            Ok(event) => self
                .pods
                .apply(map_event(event, pod_entry), &mut self.dirty),
            Err(error) => warn!(%error, "pod watch failed; retrying"),
        }
    }

    fn on_node_event(&mut self, event: Result<watcher::Event<Node>, watcher::Error>) {
        match event {
            Ok(event) => self
                .nodes
                .apply(map_event(event, node_entry), &mut self.dirty),
            Err(error) => warn!(%error, "node watch failed; retrying"),
        }
    }

    fn on_slice_event(&mut self, event: Result<watcher::Event<ResourceSlice>, watcher::Error>) {
        match event {
            Ok(event) => self
                .slices
                .apply(map_event(event, slice_entry), &mut self.dirty),
            Err(error) => {
                warn!(%error, "ResourceSlice watch failed; retrying (DRA drivers wait until it works)")
            }
        }
    }

    fn on_timer(&mut self) {
        self.dirty.extend(self.wakeups.take_due(Instant::now()));
    }

    fn on_outcome(&mut self, outcome: Outcome) {
        let Outcome {
            node,
            key,
            what,
            result,
        } = outcome;
        let now = Instant::now();
        let ok = !matches!(result, Err(WriteError::Failed(_)));
        let (look_again, retry_at) = self.writes.complete(&key, ok, now);
        match result {
            Ok(written) => {
                debug!(node, "wrote {what}");
                self.absorb(written);
            }
            Err(WriteError::Gone) => debug!(node, "skipped {what}: the object is gone"),
            Err(WriteError::Failed(error)) => {
                self.counts.failures += 1;
                warn!(node, %error, "writing {what} failed; retrying");
            }
        }
        if look_again {
            self.dirty.insert(node.clone());
        }
        if let Some(at) = retry_at {
            self.wakeups.schedule(&node, at);
        }
    }

    /// Feeds a write's answer into the mirrors, which may be behind it.
    fn absorb(&mut self, written: Written) {
        match written {
            Written::Pod(pod) => {
                self.counts.pod_statuses += 1;
                let workload = pod
                    .metadata
                    .labels
                    .as_ref()
                    .is_some_and(|l| l.contains_key(WORKLOAD_LABEL));
                if let Some(entry) = pod_entry(*pod) {
                    if workload {
                        self.workloads.upsert(entry, &mut self.dirty);
                    } else {
                        self.pods.upsert(entry, &mut self.dirty);
                    }
                }
            }
            Written::Node(node) => {
                self.counts.node_statuses += 1;
                if let Some(entry) = node_entry(*node) {
                    self.nodes.upsert(entry, &mut self.dirty);
                }
            }
            Written::Slice(slice) => {
                self.counts.slice_applies += 1;
                if let Some(entry) = slice_entry(*slice) {
                    self.slices.upsert(entry, &mut self.dirty);
                }
            }
            Written::SliceDeleted(name) => {
                self.counts.slice_deletes += 1;
                self.slices.remove(&name, &mut self.dirty);
            }
        }
    }

    fn report(&mut self) {
        self.writes.prune(Instant::now());
        let counts = std::mem::take(&mut self.counts);
        let wrote = counts.pod_statuses
            + counts.node_statuses
            + counts.slice_applies
            + counts.slice_deletes;
        if wrote + counts.failures == 0 {
            return;
        }
        if let Some(logs) = self.logs.as_mut() {
            let alive: HashSet<String> = self
                .pods
                .values()
                .chain(self.workloads.values())
                .filter_map(|p| p.metadata.uid.clone())
                .collect();
            logs.retain(|uid| alive.contains(uid));
        }
        info!(
            agent_pods = self.pods.len(),
            workload_pods = self.workloads.len(),
            nodes = self.nodes.len(),
            slices = self.slices.len(),
            nodes_remembered = self.memory.len(),
            timers = self.wakeups.len(),
            pod_status_writes = counts.pod_statuses,
            node_status_writes = counts.node_statuses,
            slice_applies = counts.slice_applies,
            slice_deletes = counts.slice_deletes,
            failed_writes = counts.failures,
            "last minute"
        );
    }

    fn reconcile_dirty(&mut self) {
        if !self.ready {
            if !(self.pods.is_synced() && self.nodes.is_synced()) {
                return;
            }
            self.ready = true;
            info!(
                agent_pods = self.pods.len(),
                nodes = self.nodes.len(),
                "pods and nodes listed; simulating"
            );
        }
        if !self.claims_known && self.claims.is_synced() {
            self.claims_known = true;
            info!(claims = self.claims.len(), "ResourceClaims listed");
            let waiting: Vec<String> = self
                .pods
                .nodes()
                .chain(self.workloads.nodes())
                .cloned()
                .collect();
            self.dirty.extend(waiting);
        }
        if !self.slices_known && self.slices.is_synced() {
            self.slices_known = true;
            info!(
                slices = self.slices.len(),
                "ResourceSlices listed; DRA drivers active"
            );
            // Nodes whose drivers waited for the list need a look.
            let waiting: Vec<String> = self.pods.nodes().cloned().collect();
            self.dirty.extend(waiting);
        }
        if self.dirty.is_empty() {
            return;
        }
        let now_ts = Timestamp::now();
        let now = Instant::now();
        for node in std::mem::take(&mut self.dirty) {
            self.reconcile_node(&node, now_ts, now);
        }
    }

    fn reconcile_node(&mut self, node: &str, now_ts: Timestamp, now: Instant) {
        let (plan, node_uid) = {
            let pods: Vec<&Pod> = self.pods.on_node(node).map(AsRef::as_ref).collect();
            let workloads: Vec<&Pod> = self.workloads.on_node(node).map(AsRef::as_ref).collect();
            let mut claims: Vec<&ResourceClaim> =
                self.claims.on_node(node).map(AsRef::as_ref).collect();
            for pod in &workloads {
                let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
                for name in referenced_claims(pod) {
                    if let Some(claim) = self.claims.get(&format!("{namespace}/{name}"))
                        && !claims.iter().any(|c| std::ptr::eq(*c, claim.as_ref()))
                    {
                        claims.push(claim.as_ref());
                    }
                }
            }
            let slices: Vec<&ResourceSlice> =
                self.slices.on_node(node).map(AsRef::as_ref).collect();
            let facts = self.nodes.get(node);
            let memory = self.memory.entry(node.to_owned()).or_default();
            let view = NodeView {
                name: node,
                node: facts,
                pods: &pods,
                workloads: &workloads,
                claims: &claims,
                slices: &slices,
                slices_known: self.slices_known,
                claims_known: self.claims_known,
            };
            let plan = plan_node(view, memory, now_ts, &self.timings);
            if memory.is_empty() {
                self.memory.remove(node);
            }
            (plan, facts.map(|f| f.uid.clone()))
        };
        if let Some(at) = plan.next_change {
            self.wakeups
                .schedule(node, now + elapsed(now_ts, at) + TIMER_SLACK);
        }
        let mut plan = plan;
        if let Some(logs) = self.logs.as_mut() {
            let mut unpublished = HashSet::new();
            for pod_logs in std::mem::take(&mut plan.logs) {
                let uid = pod_logs.uid.clone();
                if logs.publish(node, pod_logs) == LogState::Pending {
                    unpublished.insert(uid);
                }
            }
            // A pod that ends has its final log readable before anyone
            // sees it ended, as with a real kubelet.
            plan.pod_statuses.retain(|update| {
                let ended = matches!(update.status.phase.as_deref(), Some("Succeeded" | "Failed"));
                !(ended && unpublished.contains(&update.uid))
            });
        }
        self.metrics.set(node, plan.gpus.take());
        for op in write_ops(node, node_uid.as_deref(), plan) {
            self.submit(node, op, now);
        }
    }

    fn submit(&mut self, node: &str, op: WriteOp, now: Instant) {
        match self.writes.decide(&op, now) {
            Decision::Send => {}
            Decision::WaitUntil(at) => {
                self.wakeups.schedule(node, at);
                return;
            }
            Decision::AfterInFlight => return,
        }
        let client = self.client.clone();
        let outcomes = self.outcomes.clone();
        let permits = Arc::clone(&self.permits);
        let node = node.to_owned();
        tokio::spawn(async move {
            // The semaphore is never closed.
            let _permit = permits.acquire_owned().await;
            let key = op.key();
            let what = op.describe();
            let result = writes::perform(client, op).await;
            // Fails only when the loop has ended, i.e. at shutdown.
            let _ = outcomes.send(Outcome {
                node,
                key,
                what,
                result,
            });
        });
    }
}

/// Converts the objects of a watch event.
fn map_event<K, T>(event: watcher::Event<K>, convert: impl Fn(K) -> T) -> watcher::Event<T> {
    match event {
        watcher::Event::Apply(object) => watcher::Event::Apply(convert(object)),
        watcher::Event::Delete(object) => watcher::Event::Delete(convert(object)),
        watcher::Event::Init => watcher::Event::Init,
        watcher::Event::InitApply(object) => watcher::Event::InitApply(convert(object)),
        watcher::Event::InitDone => watcher::Event::InitDone,
    }
}

/// The writes a plan calls for.
fn write_ops(node: &str, node_uid: Option<&str>, plan: NodePlan) -> Vec<WriteOp> {
    let mut ops = Vec::new();
    for update in plan.pod_statuses {
        ops.push(WriteOp::PodStatus {
            patch: pod_status_patch(&update.uid, &update.status),
            namespace: update.namespace,
            name: update.name,
        });
    }
    if !plan.node_entries.is_empty() || plan.status_heartbeat.is_some() {
        let mut capacity = Map::new();
        let mut allocatable = Map::new();
        for (resource, entries) in plan.node_entries {
            // Null removes the key (in a strategic merge patch as in a JSON
            // merge patch).
            capacity.insert(
                resource.clone(),
                entries.capacity.map_or(Value::Null, Value::String),
            );
            allocatable.insert(
                resource,
                entries.allocatable.map_or(Value::Null, Value::String),
            );
        }
        let mut patch = json!({"status": {}});
        if !capacity.is_empty() {
            patch["status"]["capacity"] = Value::Object(capacity);
            patch["status"]["allocatable"] = Value::Object(allocatable);
        }
        if let Some(beat) = plan.status_heartbeat {
            // Merged into the Ready condition by its type (a strategic merge
            // patch), the rest of the condition left as it is.
            patch["status"]["conditions"] =
                json!([{"type": "Ready", "lastHeartbeatTime": Time(beat)}]);
        }
        if let Some(uid) = node_uid {
            patch["metadata"] = json!({"uid": uid});
        }
        ops.push(WriteOp::NodeStatus {
            name: node.to_owned(),
            patch,
        });
    }
    for slice in plan.slice_applies {
        ops.push(WriteOp::ApplySlice {
            name: slice.metadata.name.clone().unwrap_or_default(),
            slice: Box::new(slice),
        });
    }
    for name in plan.slice_deletes {
        ops.push(WriteOp::DeleteSlice { name });
    }
    ops
}

/// What the sim keeps of an agent pod: no managed fields, and no container
/// environment, which the sim has no use for and must never log.
fn pod_entry(mut pod: Pod) -> Option<Entry<Arc<Pod>>> {
    let key = format!(
        "{}/{}",
        pod.metadata.namespace.as_deref()?,
        pod.metadata.name.as_deref()?
    );
    let resource_version = parse_resource_version(pod.metadata.resource_version.as_deref());
    pod.metadata.managed_fields = None;
    // Kept in the entry instead, so that a no-op update compares equal.
    pod.metadata.resource_version = None;
    if let Some(spec) = pod.spec.as_mut() {
        strip_environment(spec);
    }
    Some(Entry {
        key,
        node: pod.spec.as_ref().and_then(|s| s.node_name.clone()),
        resource_version,
        value: Arc::new(pod),
    })
}

/// What the sim keeps of a ResourceClaim, indexed by the pool (for the
/// sim's drivers: the node) of its first allocated device.
fn claim_entry(mut claim: ResourceClaim) -> Option<Entry<Arc<ResourceClaim>>> {
    let key = format!(
        "{}/{}",
        claim.metadata.namespace.as_deref()?,
        claim.metadata.name.as_deref()?
    );
    let resource_version = parse_resource_version(claim.metadata.resource_version.as_deref());
    claim.metadata.managed_fields = None;
    claim.metadata.resource_version = None;
    let node = claim
        .status
        .as_ref()
        .and_then(|s| s.allocation.as_ref())
        .and_then(|a| a.devices.as_ref())
        .and_then(|d| d.results.as_ref())
        .and_then(|r| r.first())
        .map(|r| r.pool.clone());
    Some(Entry {
        key,
        node,
        resource_version,
        value: Arc::new(claim),
    })
}

fn strip_environment(spec: &mut PodSpec) {
    let containers = spec
        .containers
        .iter_mut()
        .chain(spec.init_containers.iter_mut().flatten());
    for container in containers {
        container.env = None;
        container.env_from = None;
    }
    for container in spec.ephemeral_containers.iter_mut().flatten() {
        container.env = None;
        container.env_from = None;
    }
}

fn node_entry(node: Node) -> Option<Entry<NodeFacts>> {
    let name = node.metadata.name.clone()?;
    Some(Entry {
        key: name.clone(),
        node: Some(name),
        resource_version: parse_resource_version(node.metadata.resource_version.as_deref()),
        value: NodeFacts::from_node(&node),
    })
}

fn slice_entry(mut slice: ResourceSlice) -> Option<Entry<Arc<ResourceSlice>>> {
    let key = slice.metadata.name.clone()?;
    let resource_version = parse_resource_version(slice.metadata.resource_version.as_deref());
    slice.metadata.managed_fields = None;
    slice.metadata.resource_version = None;
    let node = slice
        .metadata
        .labels
        .as_ref()
        .and_then(|labels| labels.get(SLICE_NODE_LABEL))
        .cloned();
    Some(Entry {
        key,
        node,
        resource_version,
        value: Arc::new(slice),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::advertisement::ResourceEntries;
    use crate::model::node::PodStatusUpdate;
    use k8s_openapi::api::core::v1::{Container, EnvVar, PodStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ManagedFieldsEntry, ObjectMeta};
    use std::collections::BTreeMap;

    #[test]
    fn plan_becomes_patches() {
        let plan = NodePlan {
            pod_statuses: vec![PodStatusUpdate {
                namespace: "ns".into(),
                name: "p".into(),
                uid: "pod-uid".into(),
                status: PodStatus {
                    phase: Some("Running".into()),
                    ..PodStatus::default()
                },
            }],
            node_entries: BTreeMap::from([
                (
                    "example.com/gpu".to_owned(),
                    ResourceEntries {
                        capacity: Some("4".into()),
                        allocatable: Some("0".into()),
                    },
                ),
                ("vendor.io/x".to_owned(), ResourceEntries::default()),
            ]),
            slice_applies: vec![],
            slice_deletes: vec!["s".into()],
            ..NodePlan::default()
        };
        let ops = write_ops("n1", Some("node-uid"), plan);
        assert_eq!(ops.len(), 3);
        let WriteOp::PodStatus { patch, .. } = &ops[0] else {
            panic!("{ops:?}")
        };
        assert_eq!(
            patch,
            &json!({"metadata": {"uid": "pod-uid"}, "status": {"phase": "Running"}})
        );
        let WriteOp::NodeStatus { name, patch } = &ops[1] else {
            panic!("{ops:?}")
        };
        assert_eq!(name, "n1");
        assert_eq!(
            patch,
            &json!({
                "metadata": {"uid": "node-uid"},
                "status": {
                    "capacity": {"example.com/gpu": "4", "vendor.io/x": null},
                    "allocatable": {"example.com/gpu": "0", "vendor.io/x": null},
                }
            })
        );
        assert!(matches!(&ops[2], WriteOp::DeleteSlice { name } if name == "s"));
    }

    #[test]
    fn a_node_status_write_stamps_the_ready_heartbeat() {
        let beat = Timestamp::from_second(1_800_000_000).unwrap();
        // A report alone: only the Ready condition's heartbeat, merged by type.
        let plan = NodePlan {
            status_heartbeat: Some(beat),
            ..NodePlan::default()
        };
        let ops = write_ops("n1", None, plan);
        let [WriteOp::NodeStatus { patch, .. }] = &ops[..] else {
            panic!("{ops:?}")
        };
        assert_eq!(
            patch,
            &json!({"status": {"conditions": [
                {"type": "Ready", "lastHeartbeatTime": "2027-01-15T08:00:00Z"}]}})
        );
        // With devices, in the same write.
        let plan = NodePlan {
            node_entries: BTreeMap::from([(
                "example.com/gpu".to_owned(),
                ResourceEntries {
                    capacity: Some("4".into()),
                    allocatable: Some("4".into()),
                },
            )]),
            status_heartbeat: Some(beat),
            ..NodePlan::default()
        };
        let ops = write_ops("n1", None, plan);
        let [WriteOp::NodeStatus { patch, .. }] = &ops[..] else {
            panic!("{ops:?}")
        };
        assert_eq!(patch["status"]["allocatable"]["example.com/gpu"], "4");
        assert_eq!(
            patch["status"]["conditions"][0]["lastHeartbeatTime"],
            "2027-01-15T08:00:00Z"
        );
    }

    #[test]
    fn pod_entries_drop_environment_and_bookkeeping() {
        let pod = Pod {
            metadata: ObjectMeta {
                name: Some("p".into()),
                namespace: Some("ns".into()),
                resource_version: Some("17".into()),
                managed_fields: Some(vec![ManagedFieldsEntry::default()]),
                ..ObjectMeta::default()
            },
            spec: Some(PodSpec {
                node_name: Some("n1".into()),
                containers: vec![Container {
                    name: "agent".into(),
                    env: Some(vec![EnvVar {
                        name: "TOKEN".into(),
                        value: Some("hunter2-value".into()),
                        ..EnvVar::default()
                    }]),
                    ..Container::default()
                }],
                ..PodSpec::default()
            }),
            status: None,
        };
        let entry = pod_entry(pod).unwrap();
        assert_eq!(entry.key, "ns/p");
        assert_eq!(entry.node.as_deref(), Some("n1"));
        assert_eq!(entry.resource_version, Some(17));
        assert_eq!(entry.value.metadata.managed_fields, None);
        assert_eq!(entry.value.metadata.resource_version, None);
        assert_eq!(entry.value.spec.as_ref().unwrap().containers[0].env, None);
        assert!(!format!("{:?}", entry.value).contains("hunter2-value"));
    }

    #[test]
    fn slice_entries_are_indexed_by_their_node_label() {
        let slice = crate::model::slice::desired_slice(
            crate::model::slice::NodeRef {
                name: "n1",
                uid: "u",
            },
            "d.x",
            1,
            1,
            "p",
        );
        let entry = slice_entry(slice).unwrap();
        assert_eq!(entry.key, "n1-d-x");
        assert_eq!(entry.node.as_deref(), Some("n1"));
    }
}
