//! The SafeRollout controller: dereference (read the caches), decide (pure,
//! [`crate::rollout`]), update status, then act. Only the first and the last
//! two steps touch the API.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use jiff::Timestamp;
use k8s_openapi::api::apps::v1::{ControllerRevision, DaemonSet};
use k8s_openapi::api::core::v1::{Node, Pod, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, OwnerReference};
use k8s_openapi::apimachinery::pkg::runtime::RawExtension;
use kube::api::{Api, DeleteParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::controller::{Action as Requeue, Controller};
use kube::runtime::events::{Event as KubeEvent, EventType, Recorder, Reporter};
use kube::runtime::finalizer::{Event as Finalizer, finalizer};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::{WatchStreamExt, reflector, watcher};
use kube::{Client, Resource, ResourceExt};
use saferollout_api::{
    FIELD_MANAGER, FINALIZER, GateStatus, LastGoodTemplate, MANAGED_BY, MANAGED_BY_LABEL, Phase,
    RETRY_ANNOTATION, ROLLOUT_LABEL, STAGE_LABEL, SafeRollout, SafeRolloutStatus,
};
use serde_json::json;
use sha2::{Digest, Sha256};
use tracing::{info, warn};

use crate::gates::{AgentPod, NodeState};
use crate::metrics::{GateLabels, Metrics, RolloutLabels};
use crate::rollout::{self, Action, DaemonSetView, NodeInfo, Observed};

/// Annotation a person sets to approve a paused stage; the value is the stage index.
pub const APPROVE_ANNOTATION: &str = "saferollout.dev/approve";
/// Label on the last-good backup ControllerRevision: the DaemonSet revision it holds.
pub const BACKUP_REVISION_LABEL: &str = "saferollout.dev/revision";
const REVISION_HASH_LABEL: &str = "controller-revision-hash";
const ZONE_LABEL: &str = "topology.kubernetes.io/zone";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Kubernetes API error: {0}")]
    Kube(#[from] kube::Error),
    #[error("finalizer error: {0}")]
    Finalizer(#[source] Box<kube::runtime::finalizer::Error<Error>>),
    #[error("serialization error: {0}")]
    Serde(#[from] serde_json::Error),
    #[error("the last good template is missing: {0}")]
    MissingBackup(String),
    #[error("object has no {0}")]
    MissingField(&'static str),
    #[error("the DaemonSet's spec changed since it was read; retrying with fresh caches")]
    StaleDaemonSet,
}

impl Error {
    pub fn metric_label(&self) -> String {
        match self {
            Error::Kube(kube::Error::Api(s)) => format!("api_{}", s.reason.to_lowercase()),
            Error::Kube(_) => "kube".into(),
            Error::Finalizer(_) => "finalizer".into(),
            Error::Serde(_) => "serde".into(),
            Error::MissingBackup(_) => "missing_backup".into(),
            Error::MissingField(_) => "missing_field".into(),
            Error::StaleDaemonSet => "stale_daemonset".into(),
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The caches every reconcile reads from: shared reflectors, no LISTs per reconcile.
#[derive(Clone)]
pub struct Stores {
    pub daemonsets: Store<DaemonSet>,
    pub pods: Store<Pod>,
    pub nodes: Store<Node>,
    pub revisions: Store<ControllerRevision>,
}

pub struct Context {
    pub client: Client,
    pub stores: Stores,
    pub recorder: Recorder,
    pub metrics: Arc<Metrics>,
    /// resourceVersion of each SafeRollout as our last status write left it.
    /// The cache can lag behind our own writes; deciding from an older status
    /// would redo a plan or lose a recorded value, so such passes wait.
    pub written: std::sync::Mutex<std::collections::HashMap<(String, String), u64>>,
}

/// The cached object is older than our own last status write.
fn is_stale(sr: &SafeRollout, ctx: &Context) -> bool {
    let key = (sr.namespace().unwrap_or_default(), sr.name_any());
    let cached = sr
        .metadata
        .resource_version
        .as_deref()
        .and_then(|v| v.parse::<u64>().ok());
    let written = ctx
        .written
        .lock()
        .map(|m| m.get(&key).copied())
        .unwrap_or_default();
    matches!((cached, written), (Some(c), Some(w)) if c < w)
}

/// A label value identifying a SafeRollout on nodes (`<namespace>.<name>`, hashed when too long).
pub fn rollout_id(namespace: &str, name: &str) -> String {
    let id = format!("{namespace}.{name}");
    if id.len() <= 63 {
        return id;
    }
    let digest = Sha256::digest(id.as_bytes());
    format!("{}-{}", &id[..40], &hex(&digest)[..16])
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A stable hash of a JSON value (keys sorted at every level).
pub fn template_hash(value: &serde_json::Value) -> String {
    fn canonical(v: &serde_json::Value, out: &mut String) {
        match v {
            serde_json::Value::Object(m) => {
                let mut keys: Vec<_> = m.keys().collect();
                keys.sort();
                out.push('{');
                for k in keys {
                    out.push_str(&serde_json::to_string(k).unwrap_or_default());
                    out.push(':');
                    canonical(&m[k], out);
                    out.push(',');
                }
                out.push('}');
            }
            serde_json::Value::Array(a) => {
                out.push('[');
                for x in a {
                    canonical(x, out);
                    out.push(',');
                }
                out.push(']');
            }
            other => out.push_str(&other.to_string()),
        }
    }
    let mut s = String::new();
    canonical(value, &mut s);
    hex(&Sha256::digest(s.as_bytes()))[..16].to_string()
}

fn backup_name(sr: &str, revision: &str) -> String {
    format!("{sr}-last-good-{revision}")
}

fn owned_by(meta: &ObjectMeta, uid: &str) -> bool {
    meta.owner_references.iter().flatten().any(|o| o.uid == uid)
}

/// The pod template a DaemonSet ControllerRevision holds (`data.spec.template`).
fn revision_template(cr: &ControllerRevision) -> Option<serde_json::Value> {
    let mut t = cr.data.0.get("spec")?.get("template")?.clone();
    if let Some(m) = t.as_object_mut() {
        m.remove("$patch");
    }
    Some(t)
}

fn agent_pod(p: &Pod) -> Option<AgentPod> {
    let spec = p.spec.as_ref()?;
    let node = spec.node_name.clone()?;
    let status = p.status.as_ref();
    let waiting = status
        .and_then(|s| s.container_statuses.as_ref())
        .into_iter()
        .flatten()
        .find_map(|c| c.state.as_ref()?.waiting.clone());
    let restarts = status
        .and_then(|s| s.container_statuses.as_ref())
        .into_iter()
        .flatten()
        .map(|c| c.restart_count)
        .max()
        .unwrap_or(0);
    Some(AgentPod {
        name: p.name_any(),
        node,
        revision: p
            .labels()
            .get(REVISION_HASH_LABEL)
            .cloned()
            .unwrap_or_default(),
        running: status.and_then(|s| s.phase.as_deref()) == Some("Running"),
        ready: status
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True")),
        deleting: p.metadata.deletion_timestamp.is_some(),
        waiting_reason: waiting.as_ref().and_then(|w| w.reason.clone()),
        waiting_message: waiting.and_then(|w| w.message),
        restarts,
    })
}

fn quantity_as_count(q: &k8s_openapi::apimachinery::pkg::api::resource::Quantity) -> Option<i64> {
    q.0.trim().parse().ok()
}

/// Label selector matching (matchLabels and matchExpressions).
pub fn selector_matches(sel: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    let labels_ok = sel
        .match_labels
        .iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v));
    let exprs_ok = sel.match_expressions.iter().flatten().all(|e| {
        let values = e.values.clone().unwrap_or_default();
        match e.operator.as_str() {
            "In" => labels.get(&e.key).is_some_and(|v| values.contains(v)),
            "NotIn" => labels.get(&e.key).is_none_or(|v| !values.contains(v)),
            "Exists" => labels.contains_key(&e.key),
            "DoesNotExist" => !labels.contains_key(&e.key),
            _ => false,
        }
    });
    labels_ok && exprs_ok
}

pub async fn reconcile(sr: Arc<SafeRollout>, ctx: Arc<Context>) -> Result<Requeue> {
    let started = Instant::now();
    let ns = sr
        .namespace()
        .ok_or(Error::MissingField("metadata.namespace"))?;
    let api: Api<SafeRollout> = Api::namespaced(ctx.client.clone(), &ns);
    if is_stale(&sr, &ctx) {
        // The watch delivers our write in a moment and triggers a fresh pass.
        return Ok(Requeue::requeue(Duration::from_millis(500)));
    }
    let result = finalizer(&api, FINALIZER, sr, |event| async {
        match event {
            Finalizer::Apply(sr) => apply(&sr, &ctx).await,
            Finalizer::Cleanup(sr) => cleanup(&sr, &ctx).await,
        }
    })
    .await
    .map_err(|e| Error::Finalizer(Box::new(e)));
    ctx.metrics.observe_reconcile(started.elapsed());
    result
}

pub fn error_policy(sr: Arc<SafeRollout>, error: &Error, ctx: Arc<Context>) -> Requeue {
    warn!(namespace = ?sr.namespace(), name = %sr.name_any(), %error, "reconcile failed");
    ctx.metrics
        .reconcile_errors
        .get_or_create(&crate::metrics::ErrorLabels {
            error: error.metric_label(),
        })
        .inc();
    // Conflicts resolve on the next pass with fresh caches; anything else backs off.
    match error {
        Error::StaleDaemonSet => Requeue::requeue(Duration::from_millis(200)),
        Error::Finalizer(f)
            if matches!(
                **f,
                kube::runtime::finalizer::Error::ApplyFailed(Error::StaleDaemonSet)
            ) =>
        {
            Requeue::requeue(Duration::from_millis(200))
        }
        Error::Kube(kube::Error::Api(s)) if s.code == 409 => {
            Requeue::requeue(Duration::from_millis(200))
        }
        _ => Requeue::requeue(Duration::from_secs(5)),
    }
}

/// Everything `apply` read from the caches.
struct World {
    ds: Option<Arc<DaemonSet>>,
    view: Option<DaemonSetView>,
    pods: BTreeMap<String, Vec<AgentPod>>,
    nodes: BTreeMap<String, NodeInfo>,
    labelled: BTreeSet<String>,
    backup: Option<Arc<ControllerRevision>>,
}

fn dereference(sr: &SafeRollout, ctx: &Context, ns: &str, id: &str) -> World {
    let ds = ctx
        .stores
        .daemonsets
        .get(&ObjectRef::new(&sr.spec.target_ref.name).within(ns));
    let ds_uid = ds
        .as_ref()
        .and_then(|d| d.metadata.uid.clone())
        .unwrap_or_default();
    let revisions: Vec<Arc<ControllerRevision>> = ctx
        .stores
        .revisions
        .state()
        .into_iter()
        .filter(|cr| cr.metadata.namespace.as_deref() == Some(ns))
        .collect();
    let view = ds.as_ref().map(|d| {
        let own: Vec<&Arc<ControllerRevision>> = revisions
            .iter()
            .filter(|cr| !ds_uid.is_empty() && owned_by(&cr.metadata, &ds_uid))
            .collect();
        let current = own
            .iter()
            .max_by_key(|cr| cr.revision)
            .and_then(|cr| cr.labels().get(REVISION_HASH_LABEL).cloned());
        DaemonSetView {
            generation: d.metadata.generation.unwrap_or(0),
            observed_generation: d
                .status
                .as_ref()
                .and_then(|s| s.observed_generation)
                .unwrap_or(0),
            update_strategy: d.spec.update_strategy.clone(),
            current_revision: current,
            known_revisions: own
                .iter()
                .filter_map(|cr| cr.labels().get(REVISION_HASH_LABEL).cloned())
                .collect(),
        }
    });
    let mut pods: BTreeMap<String, Vec<AgentPod>> = BTreeMap::new();
    if !ds_uid.is_empty() {
        for p in ctx.stores.pods.state() {
            if p.metadata.namespace.as_deref() == Some(ns)
                && owned_by(&p.metadata, &ds_uid)
                && let Some(a) = agent_pod(&p)
            {
                pods.entry(a.node.clone()).or_default().push(a);
            }
        }
    }
    let canary = sr
        .spec
        .canary
        .as_ref()
        .and_then(|c| c.node_selector.as_ref());
    let mut nodes = BTreeMap::new();
    let mut labelled = BTreeSet::new();
    for n in ctx.stores.nodes.state() {
        let labels = n.labels().clone();
        if labels.get(ROLLOUT_LABEL).map(String::as_str) == Some(id) {
            labelled.insert(n.name_any());
        }
        let allocatable = n
            .status
            .as_ref()
            .and_then(|s| s.allocatable.as_ref())
            .map(|a| {
                a.iter()
                    .filter_map(|(k, q)| Some((k.clone(), quantity_as_count(q)?)))
                    .collect()
            })
            .unwrap_or_default();
        nodes.insert(
            n.name_any(),
            NodeInfo {
                zone: labels.get(ZONE_LABEL).cloned(),
                canary_eligible: canary.is_none_or(|sel| selector_matches(sel, &labels)),
                state: NodeState {
                    allocatable,
                    labels,
                },
            },
        );
    }
    let stable = sr.status.as_ref().and_then(|s| s.stable_revision.clone());
    let backup = stable.and_then(|rev| {
        revisions
            .iter()
            .find(|cr| cr.name_any() == backup_name(&sr.name_any(), &rev))
            .cloned()
    });
    World {
        ds,
        view,
        pods,
        nodes,
        labelled,
        backup,
    }
}

async fn apply(sr: &SafeRollout, ctx: &Context) -> Result<Requeue> {
    let ns = sr
        .namespace()
        .ok_or(Error::MissingField("metadata.namespace"))?;
    let name = sr.name_any();
    let id = rollout_id(&ns, &name);
    let world = dereference(sr, ctx, &ns, &id);
    let status = sr.status.clone().unwrap_or_default();
    let now = Timestamp::now();

    // Validate what the schema cannot: spec.template must be a pod template.
    let spec_template = match sr.spec.typed_template() {
        Ok(t) => t.map(|_| sr.spec.template.clone().unwrap_or_default()),
        Err(e) => {
            let mut st = status.clone();
            st.observed_generation = sr.metadata.generation;
            let msg = format!("spec.template is not a valid pod template: {e}");
            return report_invalid_template(sr, ctx, &status, st, msg, now).await;
        }
    };
    let spec_hash = spec_template.as_ref().map(template_hash);
    let gated = gated_resources(sr);
    let preflight = run_preflight(sr, ctx, &world, &status, &gated).await;
    let spec_template_in_place = match (&world.ds, &spec_template, &spec_hash) {
        (Some(ds), Some(t), Some(h)) if status.applied_template_hash.as_ref() != Some(h) => {
            template_in_place(ctx, ds, t).await
        }
        _ => false,
    };
    let gated = gated_resources(sr);
    let backup_revision = world
        .backup
        .as_ref()
        .and_then(|b| b.labels().get(BACKUP_REVISION_LABEL).cloned());
    let annotations = sr.annotations();
    let observed = Observed {
        spec: &sr.spec,
        generation: sr.metadata.generation,
        status: &status,
        retry: annotations.get(RETRY_ANNOTATION).map(String::as_str),
        approve: annotations.get(APPROVE_ANNOTATION).map(String::as_str),
        abort: annotations
            .get(crate::rollout::ABORT_ANNOTATION)
            .map(String::as_str),
        preflight: preflight.as_ref(),
        daemonset: world.view.as_ref(),
        spec_template_hash: spec_hash.as_deref(),
        spec_template_in_place,
        backup_revision: backup_revision.as_deref(),
        pods: &world.pods,
        nodes: &world.nodes,
        labelled_nodes: &world.labelled,
        gated_resources: &gated,
        now,
    };
    let decision = rollout::decide(&observed);
    let mut new_status = decision.status;
    if let Some(b) = &backup_revision {
        new_status.last_good_template = Some(LastGoodTemplate {
            controller_revision: backup_name(&name, b),
            revision: b.clone(),
        });
    }

    record_metrics(ctx, &ns, &name, &status, &new_status);
    // Status first: the plan and baselines are durable before any node is touched.
    write_status(sr, ctx, &status, &new_status).await?;

    let mut template_error = None;
    for action in &decision.actions {
        match perform(
            sr,
            ctx,
            &ns,
            &id,
            &world,
            spec_template.as_ref(),
            spec_hash.as_deref(),
            action,
        )
        .await
        {
            Ok(()) => {}
            Err(Error::Kube(kube::Error::Api(s))) if is_failed_guard(&s) => {
                return Err(Error::StaleDaemonSet);
            }
            // The API server refused the template: a condition, not a retry loop.
            Err(Error::Kube(kube::Error::Api(s)))
                if s.code == 422 && matches!(action, Action::ApplySpecTemplate) =>
            {
                template_error = Some(s.message.clone());
            }
            Err(e) => return Err(e),
        }
    }
    if let Some(msg) = template_error {
        let msg = format!(
            "the API server rejected spec.template for DaemonSet {}: {msg}",
            sr.spec.target_ref.name
        );
        return report_invalid_template(sr, ctx, &new_status, new_status.clone(), msg, now).await;
    }
    Ok(match decision.requeue_after {
        Some(d) => Requeue::requeue(d),
        None => Requeue::await_change(),
    })
}

fn record_metrics(
    ctx: &Context,
    ns: &str,
    name: &str,
    old: &SafeRolloutStatus,
    new: &SafeRolloutStatus,
) {
    let m = &ctx.metrics;
    m.set_phase(ns, name, new.phase.as_ref().unwrap_or(&Phase::Pending));
    m.set_stage(
        ns,
        name,
        if new.phase == Some(Phase::Progressing) {
            new.current_stage
        } else {
            None
        },
    );
    let labels = RolloutLabels {
        namespace: ns.into(),
        name: name.into(),
    };
    if new.blocked_revisions.len() > old.blocked_revisions.len() {
        m.rollbacks.get_or_create(&labels).inc();
        let failed = new
            .stages
            .iter()
            .flat_map(|s| s.gates.iter())
            .find(|g| g.status == GateStatus::Failed);
        if let Some(g) = failed {
            m.gate_failures
                .get_or_create(&GateLabels {
                    namespace: ns.into(),
                    name: name.into(),
                    gate: g.gate.clone(),
                    reason: g.reason.clone(),
                })
                .inc();
        }
    }
    let passed = |s: &SafeRolloutStatus| {
        s.stages
            .iter()
            .filter(|st| st.state == saferollout_api::StageState::Passed)
            .count()
    };
    if passed(new) > passed(old) && new.target_revision == old.target_revision {
        m.stages_passed
            .get_or_create(&labels)
            .inc_by((passed(new) - passed(old)) as u64);
    }
    if new.phase == Some(Phase::Succeeded)
        && old.phase != Some(Phase::Succeeded)
        && old.target_revision.is_some()
    {
        m.rollouts_succeeded.get_or_create(&labels).inc();
    }
}

/// An unusable spec.template is a condition, not a retry loop: record it and
/// wait for the spec to change.
async fn report_invalid_template(
    sr: &SafeRollout,
    ctx: &Context,
    written: &SafeRolloutStatus,
    mut st: SafeRolloutStatus,
    message: String,
    now: Timestamp,
) -> Result<Requeue> {
    rollout::set_stalled(
        &mut st,
        Phase::Failed,
        "InvalidTemplate",
        message,
        sr.metadata.generation,
        now,
    );
    write_status(sr, ctx, written, &st).await?;
    Ok(Requeue::await_change())
}

fn gated_resources(sr: &SafeRollout) -> Vec<String> {
    sr.spec
        .allocatable_gates()
        .iter()
        .map(|g| g.resource.clone())
        .collect()
}

/// Preflight for the DaemonSet's current revision, when a rollout of it is
/// about to start (or was blocked by it: the cluster may have been fixed).
async fn run_preflight(
    sr: &SafeRollout,
    ctx: &Context,
    world: &World,
    status: &SafeRolloutStatus,
    gated: &[String],
) -> Option<saferollout_api::PreflightStatus> {
    let policy = sr
        .spec
        .preflight
        .as_ref()
        .map(|p| p.policy)
        .unwrap_or_default();
    let (ds, view) = (world.ds.as_ref()?, world.view.as_ref()?);
    let current = view.current_revision.as_deref()?;
    let fresh_needed = policy != saferollout_api::PreflightPolicy::Skip
        && status
            .stable_revision
            .as_deref()
            .is_some_and(|s| s != current)
        && (status.target_revision.as_deref() != Some(current) || status.stages.is_empty())
        && status
            .preflight
            .as_ref()
            .is_none_or(|p| p.revision != current || !p.passed);
    if !fresh_needed {
        return None;
    }
    // The namespace's Pod Security level decides whether the agent can start at all.
    let ns = ds.namespace().unwrap_or_default();
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(ctx.client.clone());
    let psa = match namespaces.get(&ns).await {
        Ok(n) => saferollout_preflight::PsaLevel::from_namespace_labels(n.labels()),
        Err(e) => {
            warn!(%ns, error = %e, "cannot read the namespace's Pod Security level");
            None
        }
    };
    let nodes: Vec<crate::preflight::NodeFacts> = ctx
        .stores
        .nodes
        .state()
        .iter()
        .map(|n| crate::preflight::NodeFacts {
            name: n.name_any(),
            capacity: n
                .status
                .as_ref()
                .and_then(|s| s.capacity.as_ref())
                .map(|c| {
                    c.iter()
                        .filter_map(|(k, q)| Some((k.clone(), quantity_as_count(q)?)))
                        .collect()
                })
                .unwrap_or_default(),
            taints: n
                .spec
                .as_ref()
                .and_then(|s| s.taints.clone())
                .unwrap_or_default(),
            labels: n.labels().clone(),
        })
        .collect();
    // Trusted discovery labels (a gate's `max: capacityLabel:<label>`) mark device nodes too.
    let device_labels: Vec<String> = sr
        .spec
        .allocatable_gates()
        .iter()
        .filter_map(|g| match &g.max {
            k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::String(v) => v
                .strip_prefix(saferollout_api::CAPACITY_LABEL_PREFIX)
                .map(str::to_string),
            _ => None,
        })
        .collect();
    Some(crate::preflight::check(
        current,
        ds,
        &world.pods,
        &nodes,
        gated,
        &device_labels,
        psa,
    ))
}

/// Whether the DaemonSet's template already equals `template` once the API
/// server has defaulted it: a server-side dry run of the write, compared with
/// the live template. Only asked when spec.template changes.
async fn template_in_place(ctx: &Context, ds: &DaemonSet, template: &serde_json::Value) -> bool {
    let api: Api<DaemonSet> =
        Api::namespaced(ctx.client.clone(), &ds.namespace().unwrap_or_default());
    let patch: Patch<serde_json::Value> = match serde_json::from_value(
        json!([{"op": "replace", "path": "/spec/template", "value": template}]),
    ) {
        Ok(p) => Patch::Json(p),
        Err(_) => return false,
    };
    let params = PatchParams {
        dry_run: true,
        ..Default::default()
    };
    match api.patch(&ds.name_any(), &params, &patch).await {
        Ok(would_be) => {
            let same = would_be.spec.template == ds.spec.template;
            if !same {
                tracing::debug!(
                    live = %serde_json::to_string(&ds.spec.template).unwrap_or_default(),
                    wanted = %serde_json::to_string(&would_be.spec.template).unwrap_or_default(),
                    "spec.template differs from the DaemonSet's"
                );
            }
            same
        }
        // An invalid template is reported when it is really written.
        Err(_) => false,
    }
}

/// A JSON patch whose `test` operation failed: the API server answers 422
/// without field causes (an invalid object gets 422 with causes).
fn is_failed_guard(s: &kube::core::Status) -> bool {
    s.code == 422 && s.details.as_ref().is_none_or(|d| d.causes.is_empty())
}

/// Writes status with server-side apply when it changed (fields that became
/// empty are removed, which a merge patch would not do).
async fn write_status(
    sr: &SafeRollout,
    ctx: &Context,
    old: &SafeRolloutStatus,
    new: &SafeRolloutStatus,
) -> Result<()> {
    if old == new && sr.status.is_some() {
        return Ok(());
    }
    let api: Api<SafeRollout> =
        Api::namespaced(ctx.client.clone(), &sr.namespace().unwrap_or_default());
    let patch = json!({
        "apiVersion": saferollout_api::API_VERSION,
        "kind": saferollout_api::KIND,
        "status": new,
    });
    let written = api
        .patch_status(
            &sr.name_any(),
            &PatchParams::apply(FIELD_MANAGER),
            &Patch::Apply(patch),
        )
        .await?;
    if let Some(rv) = written
        .metadata
        .resource_version
        .as_deref()
        .and_then(|v| v.parse().ok())
        && let Ok(mut m) = ctx.written.lock()
    {
        m.insert(
            (written.namespace().unwrap_or_default(), written.name_any()),
            rv,
        );
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
async fn perform(
    sr: &SafeRollout,
    ctx: &Context,
    ns: &str,
    id: &str,
    world: &World,
    spec_template: Option<&serde_json::Value>,
    spec_hash: Option<&str>,
    action: &Action,
) -> Result<()> {
    let client = &ctx.client;
    let dss: Api<DaemonSet> = Api::namespaced(client.clone(), ns);
    let ds_name = &sr.spec.target_ref.name;
    let generation = world
        .ds
        .as_ref()
        .and_then(|d| d.metadata.generation)
        .unwrap_or_default();
    // Every DaemonSet write is conditional on the spec generation we decided
    // from, so a concurrent edit by a person is never overwritten silently: the
    // patch fails and the next pass, with fresh caches, sees the edit.
    // (generation, not resourceVersion: status updates must not fail it.)
    let guarded = |ops: serde_json::Value| -> Result<Patch<serde_json::Value>> {
        let mut all =
            vec![json!({"op": "test", "path": "/metadata/generation", "value": generation})];
        all.extend(ops.as_array().cloned().unwrap_or_default());
        Ok(Patch::Json(serde_json::from_value(
            serde_json::Value::Array(all),
        )?))
    };
    match action {
        Action::TakeOverUpdates => {
            info!(%ns, daemonset = %ds_name, "setting updateStrategy OnDelete");
            let p = guarded(
                json!([{"op": "replace", "path": "/spec/updateStrategy", "value": {"type": "OnDelete"}}]),
            )?;
            dss.patch(ds_name, &PatchParams::default(), &p).await?;
        }
        Action::ApplySpecTemplate => {
            let t = spec_template.cloned().unwrap_or_default();
            info!(%ns, daemonset = %ds_name, hash = ?spec_hash, "writing spec.template to the DaemonSet");
            let p = guarded(json!([{"op": "replace", "path": "/spec/template", "value": t}]))?;
            dss.patch(ds_name, &PatchParams::default(), &p).await?;
        }
        Action::RestoreLastGood => {
            let backup = world
                .backup
                .as_ref()
                .ok_or_else(|| Error::MissingBackup(backup_name(&sr.name_any(), "?")))?;
            let t = backup
                .data
                .0
                .get("template")
                .cloned()
                .ok_or_else(|| Error::MissingBackup(backup.name_any()))?;
            info!(%ns, daemonset = %ds_name, backup = %backup.name_any(), "restoring the last good template");
            let p = guarded(json!([{"op": "replace", "path": "/spec/template", "value": t}]))?;
            dss.patch(ds_name, &PatchParams::default(), &p).await?;
        }
        Action::BackupTemplate { revision } => {
            backup_template(sr, ctx, ns, world, revision).await?
        }
        Action::LabelNodes { nodes, stage } => {
            let api: Api<Node> = Api::all(client.clone());
            for n in nodes {
                let p = json!({"metadata": {"labels": {STAGE_LABEL: stage.to_string(), ROLLOUT_LABEL: id}}});
                match api
                    .patch(n, &PatchParams::default(), &Patch::Merge(p))
                    .await
                {
                    Err(kube::Error::Api(s)) if s.code == 404 => {} // node vanished; the next pass notices
                    r => {
                        r?;
                    }
                }
            }
        }
        Action::UnlabelNodes { nodes } => {
            let api: Api<Node> = Api::all(client.clone());
            for n in nodes {
                let p = json!({"metadata": {"labels": {STAGE_LABEL: null, ROLLOUT_LABEL: null}}});
                match api
                    .patch(n, &PatchParams::default(), &Patch::Merge(p))
                    .await
                {
                    Err(kube::Error::Api(s)) if s.code == 404 => {}
                    r => {
                        r?;
                    }
                }
            }
        }
        Action::DeletePods { pods } => {
            let api: Api<Pod> = Api::namespaced(client.clone(), ns);
            for (pod, node) in pods {
                info!(%ns, %pod, %node, "replacing agent pod");
                match api.delete(pod, &DeleteParams::default()).await {
                    Err(kube::Error::Api(s)) if s.code == 404 => {}
                    r => {
                        r?;
                    }
                }
            }
        }
        Action::Event {
            warning,
            reason,
            message,
        } => {
            if *warning {
                warn!(%ns, name = %sr.name_any(), %reason, %message);
            } else {
                info!(%ns, name = %sr.name_any(), %reason, %message);
            }
            let ev = KubeEvent {
                type_: if *warning {
                    EventType::Warning
                } else {
                    EventType::Normal
                },
                reason: reason.clone(),
                note: Some(message.chars().take(1000).collect()),
                action: "Rollout".into(),
                secondary: None,
            };
            // Events are best effort: losing one must not stall a revert.
            if let Err(e) = ctx.recorder.publish(&ev, &sr.object_ref(&())).await {
                warn!(%e, "publishing event failed");
            }
        }
    }
    Ok(())
}

/// Copies the DaemonSet's template of `revision` into a ControllerRevision
/// owned by the SafeRollout, then drops older backups.
async fn backup_template(
    sr: &SafeRollout,
    ctx: &Context,
    ns: &str,
    world: &World,
    revision: &str,
) -> Result<()> {
    let ds = world
        .ds
        .as_ref()
        .ok_or(Error::MissingField("target DaemonSet"))?;
    let ds_uid = ds.metadata.uid.clone().unwrap_or_default();
    let all = ctx.stores.revisions.state();
    let source = all
        .iter()
        .filter(|cr| {
            cr.metadata.namespace.as_deref() == Some(ns) && owned_by(&cr.metadata, &ds_uid)
        })
        .find(|cr| cr.labels().get(REVISION_HASH_LABEL).map(String::as_str) == Some(revision))
        .ok_or_else(|| Error::MissingBackup(format!("DaemonSet revision {revision}")))?;
    let template =
        revision_template(source).ok_or_else(|| Error::MissingBackup(source.name_any()))?;
    // Refuse a template that is not a pod template rather than back up garbage.
    let _: PodTemplateSpec = serde_json::from_value(template.clone())?;
    let name = backup_name(&sr.name_any(), revision);
    let api: Api<ControllerRevision> = Api::namespaced(ctx.client.clone(), ns);
    let cr = ControllerRevision {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            namespace: Some(ns.into()),
            labels: Some(BTreeMap::from([
                (ROLLOUT_LABEL.to_string(), rollout_id(ns, &sr.name_any())),
                (BACKUP_REVISION_LABEL.to_string(), revision.to_string()),
                (MANAGED_BY_LABEL.to_string(), MANAGED_BY.to_string()),
            ])),
            owner_references: Some(vec![OwnerReference {
                controller: Some(true),
                ..sr.controller_owner_ref(&())
                    .ok_or(Error::MissingField("metadata.uid"))?
            }]),
            ..Default::default()
        },
        data: RawExtension(json!({"template": template, "daemonSet": ds.name_any()})),
        revision: source.revision,
    };
    match api
        .create(
            &PostParams {
                field_manager: Some(FIELD_MANAGER.into()),
                ..Default::default()
            },
            &cr,
        )
        .await
    {
        Ok(_) => info!(%ns, backup = %name, "recorded the last good template"),
        Err(kube::Error::Api(s)) if s.code == 409 => {} // already recorded (ControllerRevision data is immutable)
        Err(e) => return Err(e.into()),
    }
    let sr_uid = sr.metadata.uid.clone().unwrap_or_default();
    for old in all.iter().filter(|cr| {
        cr.metadata.namespace.as_deref() == Some(ns)
            && owned_by(&cr.metadata, &sr_uid)
            && cr.name_any() != name
    }) {
        match api.delete(&old.name_any(), &DeleteParams::default()).await {
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            r => {
                r?;
            }
        }
    }
    Ok(())
}

/// The SafeRollout is being deleted: give the DaemonSet back to its own
/// controller. Pods keep running whatever they run; the original update
/// strategy (usually RollingUpdate) then converges them on the DaemonSet's
/// current template. Labels go; backups are garbage-collected with the owner.
async fn cleanup(sr: &SafeRollout, ctx: &Context) -> Result<Requeue> {
    let ns = sr
        .namespace()
        .ok_or(Error::MissingField("metadata.namespace"))?;
    let name = sr.name_any();
    let id = rollout_id(&ns, &name);
    let world = dereference(sr, ctx, &ns, &id);
    let original = sr
        .status
        .as_ref()
        .and_then(|s| s.original_update_strategy.clone());
    if let (Some(_), Some(original)) = (&world.ds, original) {
        let dss: Api<DaemonSet> = Api::namespaced(ctx.client.clone(), &ns);
        let value = serde_json::to_value(&original)?;
        let p: Patch<serde_json::Value> = Patch::Json(serde_json::from_value(
            json!([{"op": "replace", "path": "/spec/updateStrategy", "value": value}]),
        )?);
        match dss
            .patch(&sr.spec.target_ref.name, &PatchParams::default(), &p)
            .await
        {
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            r => {
                r?;
            }
        }
        info!(%ns, %name, "restored the DaemonSet's original update strategy");
    }
    let nodes: Vec<String> = world.labelled.iter().cloned().collect();
    if !nodes.is_empty() {
        perform(
            sr,
            ctx,
            &ns,
            &id,
            &world,
            None,
            None,
            &Action::UnlabelNodes { nodes },
        )
        .await?;
    }
    ctx.metrics.forget(&ns, &name);
    if let Ok(mut m) = ctx.written.lock() {
        m.remove(&(ns.clone(), name.clone()));
    }
    Ok(Requeue::await_change())
}

/// A node change worth waking rollouts for: labels, allocatable, existence.
fn node_fingerprint(n: &Node) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    n.metadata.labels.hash(&mut h);
    if let Some(a) = n.status.as_ref().and_then(|s| s.allocatable.as_ref()) {
        for (k, v) in a {
            k.hash(&mut h);
            v.0.hash(&mut h);
        }
    }
    h.finish()
}

/// Builds and runs the controller until shutdown.
pub async fn run(
    client: Client,
    metrics: Arc<Metrics>,
    watch_namespace: Option<String>,
) -> anyhow::Result<()> {
    let srs: Api<SafeRollout> = match &watch_namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    // Fail early with a clear message when the CRD is not installed (the
    // operator never installs it itself: that is the deployer's job).
    // RBAC and a fresh CRD take a moment to be served after `kubectl apply`:
    // retry for a while before giving up with a clear message.
    let deadline = Instant::now() + Duration::from_secs(30);
    while let Err(e) = srs.list(&kube::api::ListParams::default().limit(1)).await {
        if Instant::now() > deadline {
            anyhow::bail!(
                "cannot list SafeRollouts ({e}); are deploy/crd.yaml and deploy/rbac.yaml applied?"
            );
        }
        warn!(error = %e, "cannot list SafeRollouts yet; retrying");
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let ds_api: Api<DaemonSet> = namespaced_or_all(&client, &watch_namespace);
    let pod_api: Api<Pod> = namespaced_or_all(&client, &watch_namespace);
    let cr_api: Api<ControllerRevision> = namespaced_or_all(&client, &watch_namespace);
    let node_api: Api<Node> = Api::all(client.clone());

    const BUF: usize = 1024;
    let (ds_store, ds_writer) = reflector::store_shared(BUF);
    let (pod_store, pod_writer) = reflector::store_shared(BUF);
    let (node_store, node_writer) = reflector::store_shared(BUF);
    let (cr_store, cr_writer) = reflector::store_shared(BUF);
    let ds_sub = ds_writer.subscribe().expect("shared store");
    let pod_sub = pod_writer.subscribe().expect("shared store");
    let node_sub = node_writer.subscribe().expect("shared store");
    let cr_sub = cr_writer.subscribe().expect("shared store");

    // Only pods of DaemonSets (and StatefulSets) carry this label: the operator
    // never caches the cluster's other pods.
    let pod_cfg = watcher::Config::default()
        .labels(REVISION_HASH_LABEL)
        .any_semantic();
    macro_rules! spawn_reflector {
        ($api:expr, $cfg:expr, $writer:expr) => {
            tokio::spawn(
                watcher($api, $cfg)
                    .default_backoff()
                    .modify(|o| {
                        o.managed_fields_mut().clear();
                    })
                    .reflect_shared($writer)
                    .for_each(|_| futures::future::ready(())),
            )
        };
    }
    spawn_reflector!(ds_api, watcher::Config::default().any_semantic(), ds_writer);
    spawn_reflector!(pod_api, pod_cfg, pod_writer);
    spawn_reflector!(
        node_api,
        watcher::Config::default().any_semantic(),
        node_writer
    );
    spawn_reflector!(cr_api, watcher::Config::default().any_semantic(), cr_writer);

    let stores = Stores {
        daemonsets: ds_store,
        pods: pod_store,
        nodes: node_store,
        revisions: cr_store,
    };
    let recorder = Recorder::new(client.clone(), Reporter::from("saferollout-operator"));
    let ctx = Arc::new(Context {
        client: client.clone(),
        stores: stores.clone(),
        recorder,
        metrics,
        written: Default::default(),
    });

    let controller = Controller::new(srs, watcher::Config::default().any_semantic());
    let sr_store = controller.store();
    let by_target = {
        let sr_store = sr_store.clone();
        move |ns: Option<String>, ds: String| {
            sr_store
                .state()
                .into_iter()
                .filter(|sr| sr.namespace() == ns && sr.spec.target_ref.name == ds)
                .map(|sr| ObjectRef::from_obj(&*sr))
                .collect::<Vec<_>>()
        }
    };
    let ds_map = by_target.clone();
    let pod_map = by_target.clone();
    let ds_store_for_cr = stores.daemonsets.clone();
    let cr_map = by_target.clone();
    let all_active = {
        let sr_store = sr_store.clone();
        move || {
            sr_store
                .state()
                .into_iter()
                .filter(|sr| {
                    let st = sr.status.as_ref();
                    st.and_then(|s| s.target_revision.as_ref())
                        != st.and_then(|s| s.stable_revision.as_ref())
                        || st.is_none_or(|s| s.phase != Some(Phase::Succeeded))
                })
                .map(|sr| ObjectRef::from_obj(&*sr))
                .collect::<Vec<_>>()
        }
    };
    // Nodes change often (heartbeats on old clusters, conditions): only labels and allocatable matter.
    let mut seen: std::collections::HashMap<String, u64> = std::collections::HashMap::new();
    let node_changes = node_sub.filter(move |n| {
        let fp = node_fingerprint(n);
        let changed = seen.insert(n.name_any(), fp) != Some(fp);
        futures::future::ready(changed)
    });

    controller
        .watches_shared_stream(ds_sub, move |ds| ds_map(ds.namespace(), ds.name_any()))
        .watches_shared_stream(pod_sub, move |pod| {
            let owner = pod
                .owner_references()
                .iter()
                .find(|o| o.kind == "DaemonSet")
                .map(|o| o.name.clone());
            owner
                .map(|ds| pod_map(pod.namespace(), ds))
                .unwrap_or_default()
        })
        .watches_shared_stream(cr_sub, move |cr| {
            let ns = cr.namespace();
            let owner = cr
                .owner_references()
                .iter()
                .find(|o| o.kind == "DaemonSet")
                .map(|o| o.name.clone());
            match owner {
                Some(ds)
                    if ds_store_for_cr
                        .get(&ObjectRef::new(&ds).within(ns.as_deref().unwrap_or("")))
                        .is_some() =>
                {
                    cr_map(ns, ds)
                }
                _ => Vec::new(),
            }
        })
        .watches_shared_stream(node_changes, move |_n| all_active())
        .shutdown_on_signal()
        .run(reconcile, error_policy, ctx)
        .for_each(|res| async move {
            if let Err(e) = res {
                tracing::debug!(error = %e, "reconcile result");
            }
        })
        .await;
    Ok(())
}

fn namespaced_or_all<K>(client: &Client, ns: &Option<String>) -> Api<K>
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
    use super::*;

    #[test]
    fn template_hash_ignores_key_order() {
        let a = json!({"metadata": {"labels": {"a": "1", "b": "2"}}, "spec": {"containers": []}});
        let b = json!({"spec": {"containers": []}, "metadata": {"labels": {"b": "2", "a": "1"}}});
        assert_eq!(template_hash(&a), template_hash(&b));
        let c = json!({"spec": {"containers": [{"image": "x:2"}]}});
        assert_ne!(template_hash(&a), template_hash(&c));
        assert_eq!(template_hash(&a).len(), 16);
    }

    #[test]
    fn rollout_id_fits_a_label_value() {
        assert_eq!(rollout_id("gpu", "nvidia"), "gpu.nvidia");
        let long = rollout_id(&"n".repeat(60), &"x".repeat(60));
        assert!(long.len() <= 63, "{long}");
        assert_ne!(long, rollout_id(&"n".repeat(60), &"y".repeat(60)));
    }

    #[test]
    fn selectors_match_labels_and_expressions() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;
        let labels: BTreeMap<String, String> = [
            ("zone".to_string(), "a".to_string()),
            ("canary".to_string(), "yes".to_string()),
        ]
        .into();
        let mut sel = LabelSelector {
            match_labels: Some([("canary".into(), "yes".into())].into()),
            ..Default::default()
        };
        assert!(selector_matches(&sel, &labels));
        sel.match_expressions = Some(vec![LabelSelectorRequirement {
            key: "zone".into(),
            operator: "In".into(),
            values: Some(vec!["b".into()]),
        }]);
        assert!(!selector_matches(&sel, &labels));
    }

    #[test]
    fn revision_template_strips_the_patch_directive() {
        let cr = ControllerRevision {
            data: RawExtension(
                json!({"spec": {"template": {"$patch": "replace", "spec": {"containers": []}}}}),
            ),
            ..Default::default()
        };
        assert_eq!(
            revision_template(&cr),
            Some(json!({"spec": {"containers": []}}))
        );
    }
}
