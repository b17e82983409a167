//! The SafeRollout controller, as a pipeline: dereference (read the caches,
//! [`snapshot`]), decide (pure, `saferollout_core`), write status, act
//! ([`writes`]). Only the first and the last two touch the API.
//!
//! Runtime pieces around it:
//! - [`caches`]: reflectors on every resource the decisions read (pruned), and
//!   the triggers that wake reconciles;
//! - the leader lease ([`crate::leader`]): only the leader runs the work queue
//!   and every write checks the fence;
//! - in memory, per SafeRollout, only what the caches cannot show yet (the
//!   status version last written, pods deleted and the DaemonSet generation
//!   written moments ago, a dry-run result): losing it on restart is safe.

pub mod caches;
pub mod device_writes;
pub mod devices;
pub mod error;
pub mod fleet;
pub mod freshness;
pub mod labels;
pub mod maintenance;
pub mod owner_revert;
pub mod proof;
pub mod selector;
pub mod snapshot;
pub mod writes;
pub mod writing;

use std::collections::{BTreeSet, HashMap};
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use std::panic::AssertUnwindSafe;

use futures::{FutureExt, StreamExt};
use jiff::Timestamp;
use kube::api::Api;
use kube::runtime::controller::{Action as Requeue, Config as QueueConfig, applier};
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::finalizer::{Event as Finalizer, finalizer};
use kube::runtime::reflector::ObjectRef;
use kube::{Client, ResourceExt};
use saferollout_api::{FINALIZER, Phase, SafeRollout, SafeRolloutStatus};
use saferollout_core::expectations::Expectations;
use saferollout_core::limits::AdminLimits;
use saferollout_core::pass::needs::{DryRunOf, Known, Needs, Target, Template};
use saferollout_core::rollout::{Action, SpecTemplate, set_stalled};
use saferollout_core::transitions;
use sha2::{Digest, Sha256};
use tracing::{info, warn};

use crate::leader::Fence;
use crate::metrics::Metrics;
use caches::Caches;
use caches::triggers::{Cause, Triggers};
pub use error::{Error, Result};
use snapshot::Extras;

/// `(namespace, name)` of a SafeRollout.
pub type RolloutKey = (String, String);

/// What the operator remembers of one SafeRollout between passes.
#[derive(Default)]
pub struct RolloutMemory {
    /// Resource version of our last status write: the cache can lag behind
    /// it, and deciding from an older status would redo a plan.
    pub status_version: Option<u64>,
    /// When this replica last wrote the status (progress-only changes wait
    /// for the next write within `PROGRESS_WRITE_INTERVAL` of it).
    pub status_written_at: Option<Instant>,
    pub expectations: Expectations,
    /// What the last dry run of spec.template was of (the DaemonSet's uid
    /// and generation, the template's hash), and its answer.
    pub in_place: Option<(DryRunOf, bool)>,
    /// What the probe, logs and prometheus gates read last.
    pub proof: proof::Memory,
    /// Evictions a disruption budget refused (`spec.nodeMaintenance.drain`).
    pub drain: maintenance::Memory,
    /// (UID, resource version) of the cached object our finalizer was added
    /// to: until the cache moves past that version it cannot show the
    /// finalizer, and a second add would fail its JSON-patch test (422).
    pub finalizer_added_to: Option<(String, String)>,
    /// The writer of this rollout's node labels (see [`labels`]).
    pub labels: Option<labels::Writer>,
    /// The status write a pass left in flight behind it
    /// ([`writes::status_behind`]); the next write waits for it.
    pub status_behind: Option<tokio::task::JoinHandle<()>>,
    /// `strategy: Selector`: the nodes this replica tainted for the
    /// promotion (the node cache may show the taints late).
    pub selector_taints: BTreeSet<String>,
    /// `strategy: Selector`: `spec.template`'s revision by content as the
    /// API server stores it (from a dry run against the target), as of
    /// the target and template it was of.
    pub selector_spec: Option<(DryRunOf, String)>,
}

/// Every SafeRollout's memory, shared with their label writers.
pub type Memories = Arc<Mutex<HashMap<RolloutKey, RolloutMemory>>>;

/// Runs `f` on the memory of `key` in `all`.
pub fn with_memory<R>(
    all: &Mutex<HashMap<RolloutKey, RolloutMemory>>,
    key: &RolloutKey,
    f: impl FnOnce(&mut RolloutMemory) -> R,
) -> R {
    let mut all = all.lock().unwrap_or_else(|e| e.into_inner());
    f(all.entry(key.clone()).or_default())
}

pub struct Context {
    /// The connection of the writes (the caches watch over another).
    pub client: Client,
    pub caches: Arc<Caches>,
    pub recorder: Recorder,
    pub metrics: Arc<Metrics>,
    pub fence: Arc<Fence>,
    /// Where the label writers send a rollout's next pass.
    triggers: Arc<Triggers>,
    memory: Memories,
    /// Node and pod writes in flight, all SafeRollouts together.
    pub write_slots: writes::WriteSlots,
    /// What the operator's administrator lets SafeRollouts ask for.
    pub limits: Arc<AdminLimits>,
    /// SafeRolloutPolicies, with `--fleet-policies`.
    pub fleet: Option<Arc<fleet::FleetPolicies>>,
}

impl Context {
    /// Runs `f` on the memory of `key`.
    pub fn memory<R>(&self, key: &RolloutKey, f: impl FnOnce(&mut RolloutMemory) -> R) -> R {
        with_memory(&self.memory, key, f)
    }

    /// What a rollout's label writer needs (see [`labels`]).
    pub fn label_writes(&self) -> labels::Shared {
        labels::Shared {
            client: self.client.clone(),
            fence: self.fence.clone(),
            memory: self.memory.clone(),
            triggers: self.triggers.clone(),
            write_slots: self.write_slots.clone(),
        }
    }

    fn forget(&self, key: &RolloutKey) {
        if let Some(f) = &self.fleet {
            f.forget(key);
        }
        self.memory
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(key);
    }

    pub fn rollout_id(&self, key: &RolloutKey) -> String {
        rollout_id(&key.0, &key.1)
    }
}

/// A label value identifying a SafeRollout on nodes (`<namespace>.<name>`, hashed when too long).
pub fn rollout_id(namespace: &str, name: &str) -> String {
    let id = format!("{namespace}.{name}");
    if id.len() <= 63 {
        return id;
    }
    let digest = Sha256::digest(id.as_bytes());
    let hex: String = digest.iter().take(8).map(|b| format!("{b:02x}")).collect();
    format!("{}-{hex}", &id[..40])
}

fn key_of(sr: &SafeRollout) -> Result<RolloutKey> {
    Ok((
        sr.namespace()
            .ok_or(Error::MissingField("metadata.namespace"))?,
        sr.name_any(),
    ))
}

/// The cached object lacks our finalizer: the next pass adds it.
fn lacks_finalizer(sr: &SafeRollout) -> bool {
    sr.metadata.deletion_timestamp.is_none() && !sr.finalizers().iter().any(|f| f == FINALIZER)
}

/// `(uid, resourceVersion)` of the cached object.
fn cached_version(sr: &SafeRollout) -> (String, String) {
    (
        sr.metadata.uid.clone().unwrap_or_default(),
        sr.metadata.resource_version.clone().unwrap_or_default(),
    )
}

/// The cached object is the one we added the finalizer to, seen before the
/// watch delivered our write (a pass queued meanwhile, e.g. by the start-up
/// sweep): its add would be refused.
fn finalizer_in_flight(sr: &SafeRollout, ctx: &Context, key: &RolloutKey) -> bool {
    lacks_finalizer(sr)
        && ctx.memory(key, |m| {
            m.finalizer_added_to.as_ref() == Some(&cached_version(sr))
        })
}

/// The cached object is older than our own last status write.
fn is_stale(sr: &SafeRollout, ctx: &Context, key: &RolloutKey) -> bool {
    let cached = sr
        .metadata
        .resource_version
        .as_deref()
        .and_then(|v| v.parse::<u64>().ok());
    let written = ctx.memory(key, |m| m.status_version);
    matches!((cached, written), (Some(c), Some(w)) if c < w)
}

pub async fn reconcile(sr: Arc<SafeRollout>, ctx: Arc<Context>) -> Result<Requeue> {
    let started = Instant::now();
    // Passes run on the thread polling the work queue (the runtime's main
    // thread, not a worker): its thread cache goes too (see `allocator`).
    crate::allocator::steady_work_on_this_thread();
    let key = key_of(&sr)?;
    // Every SafeRollout's pass runs in the one work-queue task: a panic in
    // one (a bug, or an object no test foresaw) would end the process and,
    // the same object being there after a restart, crash-loop both replicas.
    // It is caught here and the pass abandoned instead.
    let result = match AssertUnwindSafe(pass(sr.clone(), &ctx, &key))
        .catch_unwind()
        .await
    {
        Ok(result) => result,
        Err(payload) => Err(panicked(&sr, &ctx, &key, &*payload).await),
    };
    let label = match &result {
        Ok(_) => "success",
        Err(e) if matches!(e.requeue(), r if r == Requeue::requeue(Duration::from_millis(200))) => {
            "requeue"
        }
        Err(_) => "error",
    };
    ctx.metrics.observe_reconcile(started.elapsed(), label);
    result
}

/// The target DaemonSet's identity, generation and current revision, as
/// `world` has it. (The revision too: the DaemonSet controller writes a new
/// template's ControllerRevision moments after the template, and preflight
/// read on a world without it has nothing for the rollout it would start.)
fn daemonset_version(
    world: &snapshot::World,
) -> Option<(Option<String>, Option<i64>, Option<String>)> {
    world.ds.as_ref().map(|d| {
        (
            d.metadata.uid.clone(),
            d.metadata.generation,
            world.current_revision().map(str::to_string),
        )
    })
}

/// A pass that panicked: its memory is dropped (nothing in it is needed for
/// safety, see [`RolloutMemory`], and a pass cut short may have left it half
/// updated), the panic is counted, logged and reported on the SafeRollout
/// (Stalled, reason `ReconcilePanicked`, with the panic's message); the
/// other SafeRollouts go on.
async fn panicked(
    sr: &SafeRollout,
    ctx: &Context,
    key: &RolloutKey,
    payload: &(dyn std::any::Any + Send),
) -> Error {
    let what = payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".into());
    // The message may quote objects: masked and bounded like any text the
    // operator copies into status.
    let what = saferollout_core::gates::proof::mask_secrets(
        &saferollout_core::gates::proof::truncate(&what, 512),
    );
    ctx.forget(key);
    ctx.metrics
        .reconcile_panics
        .get_or_create(&crate::metrics::RolloutLabels {
            namespace: key.0.clone(),
            name: key.1.clone(),
        })
        .inc();
    tracing::error!(namespace = %key.0, name = %key.1, panic = %what, "the pass panicked and was abandoned (a bug: please report it); the other SafeRollouts go on");
    let old = sr.status.clone().unwrap_or_default();
    let mut new = old.clone();
    set_stalled(
        &mut new,
        old.phase.unwrap_or(Phase::Pending),
        "ReconcilePanicked",
        format!(
            "the operator's pass for this SafeRollout panicked and was abandoned (a bug; please report it): {what}; nothing more is done for it until a pass succeeds (retried every {} s)",
            error::PANICKED_RETRY.as_secs()
        ),
        sr.metadata.generation,
        Timestamp::now(),
    );
    if let Err(e) = writes::status(sr, ctx, key, &old, &new).await {
        warn!(namespace = %key.0, name = %key.1, error = %e, "reporting the panic in status");
    }
    Error::Panicked(what)
}

/// Test hook, in debug builds only: the pass of the SafeRollout named by
/// `SAFEROLLOUT_DEBUG_PANIC_IN_PASS=<namespace>/<name>` panics, so the
/// end-to-end tests can check that one panicking pass harms nothing else.
fn debug_panic_hook(key: &RolloutKey) {
    #[cfg(debug_assertions)]
    if std::env::var("SAFEROLLOUT_DEBUG_PANIC_IN_PASS")
        .is_ok_and(|v| v == format!("{}/{}", key.0, key.1))
    {
        panic!("SAFEROLLOUT_DEBUG_PANIC_IN_PASS names {}/{}", key.0, key.1);
    }
    #[cfg(not(debug_assertions))]
    let _ = key;
}

/// One pass over `sr`: the fence, the finalizer, then apply or clean up.
async fn pass(sr: Arc<SafeRollout>, ctx: &Arc<Context>, key: &RolloutKey) -> Result<Requeue> {
    if !ctx.fence.is_open() {
        return Err(Error::NotLeader);
    }
    if is_stale(&sr, ctx, key) || finalizer_in_flight(&sr, ctx, key) {
        // The watch delivers our write in a moment and triggers a fresh pass.
        return Ok(Requeue::requeue(Duration::from_millis(200)));
    }
    let api: Api<SafeRollout> = Api::namespaced(ctx.client.clone(), &key.0);
    // Without our finalizer, kube's helper only adds it (and waits for the
    // watch to show it).
    let adding = lacks_finalizer(&sr).then(|| cached_version(&sr));
    let result = finalizer(&api, FINALIZER, sr, |event| async {
        match event {
            Finalizer::Apply(sr) => apply(&sr, ctx, key).await,
            Finalizer::Cleanup(sr) => cleanup(&sr, ctx, key).await,
        }
    })
    .await
    .map_err(|e| Error::Finalizer(Box::new(e)));
    if let (Some(version), Ok(_)) = (adding, &result) {
        ctx.memory(key, |m| m.finalizer_added_to = Some(version));
    }
    result
}

pub fn error_policy(sr: Arc<SafeRollout>, error: &Error, ctx: Arc<Context>) -> Requeue {
    if matches!(error.root(), Error::CleanupPending(..)) {
        return error.requeue();
    }
    if !matches!(error.root(), Error::NotLeader) {
        warn!(namespace = ?sr.namespace(), name = %sr.name_any(), %error, "reconcile failed");
    }
    ctx.metrics
        .reconcile_errors
        .get_or_create(&crate::metrics::ErrorLabels {
            error: error.metric_label(),
        })
        .inc();
    error.requeue()
}

/// `spec.template`, its hash and whether the DaemonSet carries it, as
/// `needs` says (a dry run, remembered, when it takes one); the error: the
/// API server did not say. (An unusable template is reported before.)
async fn spec_template(
    sr: &SafeRollout,
    ctx: &Context,
    key: &RolloutKey,
    world: &snapshot::World,
    template: Template,
) -> Result<Option<(serde_json::Value, String, bool)>> {
    let value = || sr.spec.template.clone().unwrap_or_default();
    Ok(match (template, &world.ds) {
        (Template::None | Template::Invalid(_), _) => None,
        (Template::Known { hash, in_place }, _) => Some((value(), hash, in_place)),
        // The DaemonSet was there when `needs` was worked out.
        (Template::DryRun { hash, .. }, None) => Some((value(), hash, false)),
        (Template::DryRun { hash, of }, Some(ds)) if selector::applies(sr) => {
            // Under Selector the engine compares contents: the revision
            // the stored template is (whichever DaemonSet carries it).
            let stored = writes::stored_template(ctx, ds, &value()).await?;
            let key_name = saferollout_core::selector::handover_label_key(&ctx.rollout_id(key));
            let revision = stored.map(|t| {
                let v = serde_json::to_value(t).unwrap_or_default();
                saferollout_core::selector::revision_name(
                    &saferollout_core::selector::template::strip(&v, &key_name),
                )
            });
            ctx.memory(key, |m| {
                m.selector_spec = revision.map(|r| (of.clone(), r));
                m.in_place = Some((of, false));
            });
            Some((value(), hash, false))
        }
        (Template::DryRun { hash, of }, Some(ds)) => {
            let v = writes::template_in_place(ctx, ds, &value()).await?;
            ctx.memory(key, |m| m.in_place = Some((of, v)));
            Some((value(), hash, v))
        }
    })
}

async fn apply(sr: &SafeRollout, ctx: &Arc<Context>, key: &RolloutKey) -> Result<Requeue> {
    debug_panic_hook(key);
    // No decision on a partial picture (after a restart every cache lists first).
    if !ctx.caches.is_synced() || ctx.fleet.as_ref().is_some_and(|f| !f.is_ready()) {
        return Ok(Requeue::requeue(Duration::from_millis(200)));
    }
    // No decision on a cache that may have stopped hearing the cluster.
    let stale = ctx.caches.stale_for(sr);
    if !stale.is_empty() {
        return hold_for_stale_caches(sr, ctx, key, &stale).await;
    }
    let pass_started = Instant::now();
    let world = snapshot::dereference(sr, &ctx.caches);
    let dereferenced = pass_started.elapsed();
    // Nothing is decided on a DaemonSet older than our own last write of it.
    if let Some(ds) = &world.ds {
        let generation = ds.metadata.generation.unwrap_or_default();
        if !ctx.memory(key, |m| m.expectations.daemonset_caught_up(generation)) {
            return Ok(Requeue::requeue(Duration::from_millis(200)));
        }
    }
    let no_status = SafeRolloutStatus::default();
    let status = sr.status.as_ref().unwrap_or(&no_status);
    let (gathered, world) = match gather(sr, ctx, key, status, world).await? {
        Ok(g) => g,
        Err(requeue) => return Ok(requeue),
    };
    let now = gathered.now;
    // A governed rollout decides and writes its status in its turn (see
    // `fleet`), on what the others decided before it.
    let governing = ctx.fleet.as_ref().map(|f| (f, f.governing(sr)));
    let governed = governing
        .as_ref()
        .filter(|(_, policies)| !policies.is_empty());
    let turn = match governed {
        Some((f, _)) => Some(f.turn.lock().await),
        None => None,
    };
    let fleet_gathered = governed.map(|(f, policies)| {
        f.gather(
            sr,
            policies,
            &ctx.caches,
            world.pods(),
            world.current_revision(),
        )
    });
    let fleet_view = fleet_gathered.as_ref().map(|g| g.view());
    let (decision, nodes) = decide(sr, ctx, key, status, &world, &gathered, fleet_view.as_ref());
    let decided = pass_started.elapsed();
    let since_last_write = ctx.memory(key, |m| m.status_written_at.map(|t| t.elapsed()));
    let plan =
        saferollout_core::pass::plan(&sr.spec, sr.status.as_ref(), decision, since_last_write);
    if let Some(since) = plan.refresh_caches_heard_before {
        let asked = ctx.caches.refresh_for(sr, since);
        tracing::debug!(namespace = %key.0, name = %key.1, %since, asked, "a deadline is due on caches that heard nothing since it passed: listing them again");
    }
    // The workload pods of the nodes this rollout now holds, for its device gates.
    ctx.caches
        .devices
        .node_pods
        .set_wants(key, plan.watch_pods_on.clone());
    let changes = write_planned_status(sr, ctx, key, status, &plan, nodes).await?;
    if let Some((f, _)) = governed {
        f.record(&ctx.caches, &ctx.triggers, key, status, &plan.status);
    }
    drop(turn);
    let template_value = gathered.spec_template.as_ref().map(|(v, _, _)| v);
    let executed = Executed {
        sr,
        key,
        world: &world,
        template_value,
        now,
    };
    let outcome = match &world.selector {
        Some(found) => {
            executed
                .selector_steps(ctx, &plan, found, gathered.spec_revision.as_deref())
                .await
        }
        None => executed.actions(ctx, &plan, &changes).await,
    };
    let acted = pass_started.elapsed();
    executed.events(ctx, &plan).await;
    tracing::debug!(
        target: "saferollout::pass",
        namespace = %key.0, name = %key.1,
        dereference_ms = dereferenced.as_secs_f64() * 1e3,
        decide_ms = (decided - dereferenced).as_secs_f64() * 1e3,
        write_and_act_ms = (acted - decided).as_secs_f64() * 1e3,
        events_ms = (pass_started.elapsed() - acted).as_secs_f64() * 1e3,
        actions = plan.actions.len(),
        write = ?plan.write,
        "pass"
    );
    Ok(match outcome? {
        Some(requeue) => requeue,
        None => next_pass(ctx, key, &plan),
    })
}

/// When the next pass runs unless something changes: the plan's time, or
/// when a remembered deletion or label write the caches never confirmed
/// (one that timed out and did not happen, labels changed again meanwhile)
/// is forgotten, whichever comes first.
fn next_pass(ctx: &Context, key: &RolloutKey, plan: &saferollout_core::pass::Plan) -> Requeue {
    let expiry = ctx
        .memory(key, |m| m.expectations.next_expiry(Timestamp::now()))
        .map(|d| d.max(Duration::from_millis(200)));
    match [plan.requeue_after, expiry].into_iter().flatten().min() {
        Some(d) => Requeue::requeue(d),
        None => Requeue::await_change(),
    }
}

/// What a pass reads beyond the caches, and when.
struct Gathered {
    /// `spec.template`, its hash and whether the DaemonSet carries it.
    spec_template: Option<(serde_json::Value, String, bool)>,
    /// Under `strategy: Selector`: `spec.template`'s revision by content.
    spec_revision: Option<String>,
    preflight: Option<saferollout_api::PreflightStatus>,
    proof: saferollout_core::gates::proof::ProofEvidence,
    /// The pods on the nodes in maintenance (`spec.nodeMaintenance.drain`).
    drain: saferollout_core::drain::DrainEvidence,
    /// The GitOps tool managing the owner `spec.ownerRevert` names.
    owner_gitops: Option<String>,
    /// When it was read: the gates judge at this instant.
    now: Timestamp,
}

/// Reads the evidence `needs` says (a dry run, preflight, the proof gates'
/// reads), then the caches again. Those reads can take seconds: decisions
/// are made on the caches as they are after them, so deletions act on
/// current readiness, not on what it was before. The gates still judge at
/// the instant the evidence was read: a later one could close a window the
/// reads did not cover. Evidence is keyed by pod UID and gate, so a pod
/// replaced meanwhile has none. A DaemonSet that changed meanwhile
/// invalidates what was read of it: `Err`, decide again. An unusable
/// `spec.template` is reported here and ends the pass.
async fn gather(
    sr: &SafeRollout,
    ctx: &Arc<Context>,
    key: &RolloutKey,
    status: &SafeRolloutStatus,
    world: snapshot::World,
) -> Result<std::result::Result<(Gathered, snapshot::World), Requeue>> {
    let now = Timestamp::now();
    let needs = needs(sr, ctx, key, status, &world, now);
    if let Template::Invalid(msg) = needs.template {
        return report_invalid_template(sr, ctx, key, status, msg, now)
            .await
            .map(Err);
    }
    let spec_template = spec_template(sr, ctx, key, &world, needs.template.clone()).await?;
    let preflight = match &needs.preflight {
        Some(revision) => run_preflight(sr, ctx, &world, revision).await,
        None => None,
    };
    let proof = proof::gather(sr, ctx, key, &needs, now).await;
    let drain = maintenance::gather(sr, ctx, key).await;
    let owner_gitops = owner_revert::gitops(sr, ctx, status, &world).await;
    let spec_revision = spec_template
        .as_ref()
        .filter(|_| selector::applies(sr))
        .and_then(|_| ctx.memory(key, |m| m.selector_spec.as_ref().map(|(_, r)| r.clone())));
    let read_on = daemonset_version(&world);
    let world = snapshot::dereference(sr, &ctx.caches);
    if daemonset_version(&world) != read_on {
        return Ok(Err(Requeue::requeue(Duration::from_millis(200))));
    }
    Ok(Ok((
        Gathered {
            spec_template,
            spec_revision,
            preflight,
            proof,
            drain,
            owner_gitops,
            now,
        },
        world,
    )))
}

/// What this pass must read beyond the caches
/// (`saferollout_core::pass::needs`), from the caches and what earlier
/// reads left.
fn needs(
    sr: &SafeRollout,
    ctx: &Context,
    key: &RolloutKey,
    status: &SafeRolloutStatus,
    world: &snapshot::World,
    now: Timestamp,
) -> Needs {
    let probe_pods_exist = !ctx
        .caches
        .probe_pods_of(&key.0, &ctx.rollout_id(key))
        .is_empty();
    let daemonset = world.ds.as_ref().map(|d| Target {
        uid: d.metadata.uid.as_deref().unwrap_or_default(),
        generation: d.metadata.generation.unwrap_or_default(),
        current_revision: world.current_revision(),
    });
    ctx.memory(key, |m| {
        let mut remembered = m.proof.remembered(&sr.spec);
        remembered.dry_run = m.in_place.as_ref();
        saferollout_core::pass::needs(&Known {
            spec: &sr.spec,
            status,
            now,
            daemonset,
            pods: world.pods(),
            probe_pods_exist,
            remembered,
        })
    })
}

/// Decides on `world` and what was `gathered`, with the caches' word on
/// how current they are.
fn decide(
    sr: &SafeRollout,
    ctx: &Context,
    key: &RolloutKey,
    status: &SafeRolloutStatus,
    world: &snapshot::World,
    gathered: &Gathered,
    fleet: Option<&saferollout_core::fleet::Fleet>,
) -> (saferollout_core::Decision, crate::metrics::NodeCounts) {
    let id = ctx.rollout_id(key);
    let device_evidence = world.devices.evidence();
    let mut evidence = saferollout_core::gates::Evidence::default()
        .with_proof(&gathered.proof)
        .with_drain(&gathered.drain);
    evidence.devices = Some(&device_evidence);
    let extras = Extras {
        spec_template: gathered
            .spec_template
            .as_ref()
            .map(|(_, hash, in_place)| SpecTemplate {
                hash,
                in_place: *in_place,
            }),
        preflight: gathered.preflight.as_ref(),
        rollout_id: &id,
        evidence,
        limits: &ctx.limits,
        now: gathered.now,
        caches_heard_at: ctx.caches.heard_at_for(sr),
        selector: None,
        fleet,
        owner_gitops: gathered.owner_gitops.as_deref(),
    };
    ctx.memory(key, |m| {
        let mut extras = extras;
        if world.selector.is_some() {
            extras.selector = Some(snapshot::SelectorExtras {
                spec_revision: gathered.spec_revision.as_deref(),
                taints_written: &m.selector_taints,
            });
        }
        snapshot::decide(sr, status, world, extras, &mut m.expectations)
    })
}

/// Sends the plan's status as [`saferollout_core::pass::StatusWrite`] says
/// (before the actions, waiting for it; behind them, in a task of its own,
/// so neither this pass's deletions nor the next pass wait for its round
/// trip; or not now), then records what changed in the metrics (from the
/// decided status: a deferred write is only late).
async fn write_planned_status(
    sr: &SafeRollout,
    ctx: &Arc<Context>,
    key: &RolloutKey,
    written: &SafeRolloutStatus,
    plan: &saferollout_core::pass::Plan,
    nodes: crate::metrics::NodeCounts,
) -> Result<transitions::Transitions> {
    use saferollout_core::pass::StatusWrite;
    match plan.write {
        StatusWrite::Behind => writes::status_behind(ctx, key, sr, plan.status.clone()),
        StatusWrite::Before => {
            writes::status(sr, ctx, key, written, &plan.status).await?;
        }
        StatusWrite::Unchanged | StatusWrite::Deferred(_) => {}
    }
    let changes = transitions::between(written, &plan.status);
    ctx.metrics.record_transitions(&key.0, &key.1, &changes);
    ctx.metrics.observe_status(
        &key.0,
        &key.1,
        &plan.status,
        sr.spec.effective_stages().len(),
        sr.spec
            .progress_deadline_duration()
            .unwrap_or(Duration::from_secs(600)),
        nodes,
    );
    Ok(changes)
}

/// What the actions of one pass are performed on.
struct Executed<'a> {
    sr: &'a SafeRollout,
    key: &'a RolloutKey,
    world: &'a snapshot::World,
    template_value: Option<&'a serde_json::Value>,
    now: Timestamp,
}

impl Executed<'_> {
    /// Publishes the plan's Events, after its actions whatever they did.
    async fn events(&self, ctx: &Arc<Context>, plan: &saferollout_core::pass::Plan) {
        for action in &plan.events {
            // Never fails but for a closed fence, which the next pass reports.
            let _ = writes::perform(
                self.sr,
                ctx,
                self.key,
                self.world,
                self.template_value,
                action,
            )
            .await;
        }
    }

    /// Under `strategy: Selector`: the plan's actions translated into
    /// steps and performed (see [`selector::steps`]); a write of the
    /// canary's template is recorded in status as the applied template's.
    async fn selector_steps(
        &self,
        ctx: &Arc<Context>,
        plan: &saferollout_core::pass::Plan,
        found: &selector::Found,
        spec_revision: Option<&str>,
    ) -> Result<Option<Requeue>> {
        let pass = selector::steps::Pass {
            sr: self.sr,
            key: self.key,
            world: self.world,
            found,
            template_value: self.template_value,
            spec_revision,
            status: &plan.status,
        };
        match selector::steps::run(&pass, ctx, &plan.actions).await {
            Ok(ran) => {
                if let Some(g) = ran.canary_generation {
                    let mut recorded = plan.status.clone();
                    if let Some(a) = recorded.applied_template.as_mut() {
                        a.generation = Some(g);
                    }
                    writes::status(self.sr, ctx, self.key, &plan.status, &recorded).await?;
                }
                let due = plan
                    .requeue_after
                    .map_or(selector::steps::IN_FLIGHT_RECHECK, |d| {
                        d.min(selector::steps::IN_FLIGHT_RECHECK)
                    });
                Ok(ran.in_flight.then(|| Requeue::requeue(due)))
            }
            Err(Error::Kube(kube::Error::Api(s))) if writes::is_failed_guard(&s) => {
                Err(Error::StaleDaemonSet)
            }
            Err(Error::Kube(kube::Error::Api(s)))
                if s.code == 422 && plan.actions.contains(&Action::ApplySpecTemplate) =>
            {
                let msg = format!(
                    "the API server rejected spec.template for the canary of DaemonSet {}: {}",
                    self.sr.spec.target_ref.name, s.message
                );
                report_invalid_template(self.sr, ctx, self.key, &plan.status, msg, self.now)
                    .await
                    .map(Some)
            }
            Err(Error::Selector(msg)) => {
                report_invalid_template(self.sr, ctx, self.key, &plan.status, msg, self.now)
                    .await
                    .map(Some)
            }
            Err(e) => Err(e),
        }
    }

    /// Performs the plan's actions in order; the first that fails ends the
    /// pass (`Some`: how it ends instead of the usual requeue).
    async fn actions(
        &self,
        ctx: &Arc<Context>,
        plan: &saferollout_core::pass::Plan,
        changes: &transitions::Transitions,
    ) -> Result<Option<Requeue>> {
        let Self {
            sr,
            key,
            world,
            template_value,
            now,
        } = *self;
        let mut status = plan.status.clone();
        for action in &plan.actions {
            match writes::perform(sr, ctx, key, world, template_value, action).await {
                Ok(written) => {
                    if let (Action::RestoreLastGood { .. }, Some(r)) = (action, &changes.rollback)
                        && let Some(since) = r.failing_since
                    {
                        let latency = Timestamp::now().duration_since(since);
                        ctx.metrics
                            .revert_latency
                            .observe(latency.as_secs_f64().max(0.0));
                    }
                    if let (Action::ApplySpecTemplate, Some(g)) = (action, written) {
                        // The generation our write produced: our template, not someone's edit.
                        let mut recorded = status.clone();
                        if let Some(a) = recorded.applied_template.as_mut() {
                            a.generation = Some(g);
                        }
                        writes::status(sr, ctx, key, &status, &recorded).await?;
                        status = recorded;
                    }
                }
                Err(Error::Kube(kube::Error::Api(s))) if writes::is_failed_guard(&s) => {
                    return Err(Error::StaleDaemonSet);
                }
                // The API server refused the template: a condition, not a retry loop.
                Err(Error::Kube(kube::Error::Api(s)))
                    if s.code == 422 && matches!(action, Action::ApplySpecTemplate) =>
                {
                    let msg = format!(
                        "the API server rejected spec.template for DaemonSet {}: {}",
                        sr.spec.target_ref.name, s.message
                    );
                    return report_invalid_template(sr, ctx, key, &status, msg, now)
                        .await
                        .map(Some);
                }
                Err(e) => return Err(e),
            }
        }
        Ok(None)
    }
}

/// How often a pass held by stale caches looks again (the caches' recovery
/// sends no event of its own).
const STALE_RECHECK: Duration = Duration::from_secs(5);

/// A pass that would read a stale cache (see [`freshness`]): nothing is
/// decided; the status says which caches and since when (written once, the
/// same bytes after), with one Warning Event when the hold begins.
async fn hold_for_stale_caches(
    sr: &SafeRollout,
    ctx: &Context,
    key: &RolloutKey,
    stale: &[freshness::Stale],
) -> Result<Requeue> {
    let no_status = SafeRolloutStatus::default();
    let status = sr.status.as_ref().unwrap_or(&no_status);
    let stale: Vec<saferollout_core::rollout::StaleCache> = stale
        .iter()
        .map(|s| saferollout_core::rollout::StaleCache {
            store: s.store.to_string(),
            since: s.since,
        })
        .collect();
    let (held, new) = saferollout_core::rollout::hold_for_stale_caches(
        status,
        &stale,
        ctx.caches.freshness.stale_after(),
        sr.metadata.generation,
        Timestamp::now(),
    );
    if held != *status {
        writes::status(sr, ctx, key, status, &held).await?;
    }
    if new {
        warn!(namespace = %key.0, name = %key.1, stale = ?stale, "holding: a cache this SafeRollout reads is stale");
        let message = held.message.clone().unwrap_or_default();
        writes::event(
            sr,
            ctx,
            true,
            saferollout_core::rollout::CACHE_STALE,
            &message,
        )
        .await;
    }
    Ok(Requeue::requeue(STALE_RECHECK))
}

/// An unusable spec.template is a condition, not a retry loop: record it and
/// wait for the spec to change.
async fn report_invalid_template(
    sr: &SafeRollout,
    ctx: &Context,
    key: &RolloutKey,
    written: &SafeRolloutStatus,
    message: String,
    now: Timestamp,
) -> Result<Requeue> {
    let mut st = written.clone();
    st.observed_generation = sr.metadata.generation;
    let phase_before = st.phase;
    set_stalled(
        &mut st,
        Phase::Failed,
        "InvalidTemplate",
        message,
        sr.metadata.generation,
        now,
    );
    if st.phase != phase_before {
        st.phase_transition_time = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(now));
    }
    writes::status(sr, ctx, key, written, &st).await?;
    Ok(Requeue::await_change())
}

/// Preflight for `revision`, the DaemonSet's current one, when `needs`
/// says (a rollout of it is about to start).
async fn run_preflight(
    sr: &SafeRollout,
    ctx: &Context,
    world: &snapshot::World,
    revision: &str,
) -> Option<saferollout_api::PreflightStatus> {
    use saferollout_core::preflight;
    let ds = world.ds.as_ref()?;
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
    let nodes = ctx.caches.nodes.state();
    let nodes: Vec<preflight::NodeFacts> =
        nodes.iter().map(|n| preflight::NodeFacts::of(n)).collect();
    let pods: Vec<_> = world.agent_pods().collect();
    let gated: Vec<String> = sr
        .spec
        .allocatable_gates()
        .iter()
        .map(|g| g.resource.clone())
        .collect();
    Some(preflight::check(
        revision,
        ds,
        &saferollout_core::views::pods_by_node(pods),
        &nodes,
        &gated,
        &preflight::device_labels(&sr.spec),
        psa,
        saferollout_preflight::Gating::by(&sr.spec),
    ))
}

/// The SafeRollout is being deleted: give the DaemonSet back to its own
/// controller, never with a release its gates stopped
/// (`saferollout_core::deletion`): over a stopped or blocked revision the
/// last good template is written back first (and the write waited for), and
/// while agents still run a stopped revision the DaemonSet stays OnDelete.
/// Otherwise pods keep running whatever they run and the original update
/// strategy (usually RollingUpdate) converges them on the DaemonSet's
/// current template. Labels go; backups are garbage-collected with the owner.
/// A SafeRollout that never owned the DaemonSet (refused as a second one)
/// changes nothing of it.
async fn cleanup(sr: &SafeRollout, ctx: &Context, key: &RolloutKey) -> Result<Requeue> {
    // What a deletion hands back is decided on current caches too.
    let stale = ctx.caches.stale_for(sr);
    if !stale.is_empty() {
        warn!(namespace = %key.0, name = %key.1, stale = ?stale, "the SafeRollout is being deleted; its cleanup waits for stale caches");
        // An error keeps the finalizer (an `Ok` would remove it).
        return Err(Error::CleanupPending(
            STALE_RECHECK,
            "waiting for stale caches",
        ));
    }
    let world = snapshot::dereference(sr, &ctx.caches);
    let no_status = SafeRolloutStatus::default();
    let status = sr.status.as_ref().unwrap_or(&no_status);
    // Under Selector the canary's pods go to the target first, one step a
    // pass (the finalizer holds the SafeRollout meanwhile).
    if let Some(found) = &world.selector {
        let pass = selector::steps::Pass {
            sr,
            key,
            world: &world,
            found,
            template_value: None,
            spec_revision: None,
            status,
        };
        if let Some(after) = selector::steps::undo(&pass, ctx).await? {
            return Err(Error::CleanupPending(after, "undoing the canary"));
        }
    }
    if let (Some(_), Some(original), None) = (
        &world.ds,
        status.original_update_strategy.as_ref(),
        &world.owned_by_other,
    ) {
        let stopped = status.stopped.as_ref().map(|s| s.revision.as_str());
        let agents_on_stopped = world
            .agent_pods()
            .any(|p| !p.deleting && Some(p.revision) == stopped);
        let owner = world.ds.as_ref().and_then(|d| {
            saferollout_core::owner::OwnerView::of(d.metadata.owner_references.as_deref())
        });
        let hand_back = match owner {
            Some(owner) => saferollout_core::deletion::hand_back_owned(owner),
            None => saferollout_core::deletion::hand_back(
                status,
                world.current_revision(),
                agents_on_stopped,
                sr.annotations()
                    .get(saferollout_api::ON_DELETE_ANNOTATION)
                    .map(String::as_str),
                world.backup_content.as_deref(),
            ),
        };
        if hand_back.restore_last_good {
            // Waited for: the strategy is handed back only over the last good template.
            let restore = Action::RestoreLastGood {
                content: hand_back.content.clone().unwrap_or_default(),
            };
            writes::perform(sr, ctx, key, &world, None, &restore).await?;
        }
        if hand_back.restore_strategy {
            writes::give_back(ctx, &key.0, &sr.spec.target_ref.name, original).await?;
        }
        info!(ns = %key.0, name = %key.1, message = %hand_back.message, "SafeRollout deleted");
        let event = Action::Event {
            warning: hand_back.restore_last_good || !hand_back.restore_strategy,
            reason: "HandedBack".into(),
            message: hand_back.message,
        };
        let _ = writes::perform(sr, ctx, key, &world, None, &event).await;
    }
    let id = ctx.rollout_id(key);
    // Label writes still queued land first; those the cache does not show
    // yet are in the expectations.
    labels::drain(&ctx.label_writes(), key).await;
    let mut labelled: BTreeSet<String> = nodes_labelled(ctx, saferollout_api::ROLLOUT_LABEL, &id)
        .into_iter()
        .collect();
    ctx.memory(key, |m| {
        labelled.extend(m.expectations.labelled_nodes().map(str::to_string))
    });
    let labelled: Vec<String> = labelled.into_iter().collect();
    if !labelled.is_empty() {
        writes::unlabel(ctx, &labelled).await?;
    }
    // Nodes it cordoned for their maintenance are uncordoned (only those
    // still carrying its mark), as its quarantine is lifted below.
    let cordoned = nodes_labelled(ctx, saferollout_api::MAINTENANCE_LABEL, &id);
    if !cordoned.is_empty() {
        fenced_uncordon(ctx, key, &cordoned).await?;
    }
    // Quarantine rules and taints cannot be owned by the SafeRollout (rules
    // are cluster-scoped): they go here, with any probe left.
    device_writes::clean_up(sr, ctx, key).await?;
    ctx.caches
        .devices
        .node_pods
        .set_wants(key, Default::default());
    ctx.metrics.forget(&key.0, &key.1);
    ctx.forget(key);
    Ok(Requeue::await_change())
}

/// The cached nodes whose label `key` is `id`.
fn nodes_labelled(ctx: &Context, key: &str, id: &str) -> Vec<String> {
    ctx.caches
        .nodes
        .state()
        .iter()
        .filter(|n| n.labels().get(key).map(String::as_str) == Some(id))
        .map(|n| n.name_any())
        .collect()
}

/// Uncordons the nodes a deleted SafeRollout left cordoned.
async fn fenced_uncordon(ctx: &Context, key: &RolloutKey, nodes: &[String]) -> Result<()> {
    writes::fenced(ctx)?;
    maintenance::uncordon(ctx, key, nodes).await
}

/// What `run` needs.
pub struct Options {
    /// Watch only these namespaces (empty: all).
    pub namespaces: Vec<String>,
    /// Watch what the device gates read (ResourceSlices, ResourceClaims,
    /// workload pods of held nodes, DeviceTaintRules).
    pub device_gates: bool,
    /// Held nodes watched one by one before one cluster-wide pod watch.
    pub per_node_pod_watches: usize,
    /// What SafeRollouts may ask for (flags; see `saferollout_core::limits`).
    pub limits: AdminLimits,
    /// When each cache last heard from the API server (fed by the watching
    /// client's tap, see [`freshness`]).
    pub freshness: Arc<freshness::Freshness>,
    /// Watch SafeRolloutPolicies and apply them (needs their CRD and the
    /// RBAC the chart grants with `fleetPolicies.enabled`).
    pub fleet_policies: bool,
}

/// The caches, started and filling: what [`run`] reconciles from.
pub struct Started {
    /// The connection the writes go over (the caches watch over another).
    writer: Client,
    limits: Arc<AdminLimits>,
    metrics: Arc<Metrics>,
    caches: Arc<Caches>,
    triggers: Arc<Triggers>,
    fleet: Option<Arc<fleet::FleetPolicies>>,
}

/// Checks the API, discovers what the device gates can watch and starts the
/// caches (they fill in the background). Runs alongside the leader election,
/// so a new leader's first pass waits for whichever of the two ends last,
/// not for both in turn.
pub async fn start(
    client: Client,
    writer: Client,
    metrics: Arc<Metrics>,
    options: Options,
) -> anyhow::Result<Started> {
    wait_for_api(&client, &options.namespaces).await?;
    let triggers = Arc::new(Triggers::new(&metrics));
    let mut device_apis = devices::discover(&client, options.device_gates).await;
    device_apis.per_node_watches = options.per_node_pod_watches;
    let caches = caches::start(
        &client,
        &options.namespaces,
        &device_apis,
        &options.freshness,
        &metrics,
        &triggers,
    );
    if options.fleet_policies {
        wait_for_policy_api(&client).await?;
    }
    let fleet = options
        .fleet_policies
        .then(|| fleet::start(&client, &caches, &options.freshness, &metrics, &triggers));
    {
        let (caches, metrics) = (caches.clone(), metrics.clone());
        tokio::spawn(async move {
            let started = Instant::now();
            caches.wait_until_synced().await;
            info!(took = ?started.elapsed(), "caches synced");
            metrics.set_caches_synced();
        });
    }
    Ok(Started {
        writer,
        limits: Arc::new(options.limits),
        metrics,
        caches,
        triggers,
        fleet,
    })
}

/// How often the policies' statuses are computed again without a policy
/// change (the rollouts they govern come and go).
const POLICY_STATUS_EVERY: Duration = Duration::from_secs(10);

/// Runs the controller until shutdown: caches always, the work queue while
/// this replica leads.
pub async fn run(
    started: Started,
    fence: Arc<Fence>,
    mut leading: tokio::sync::watch::Receiver<bool>,
) -> anyhow::Result<()> {
    let Started {
        writer,
        limits,
        metrics,
        caches,
        triggers,
        fleet,
    } = started;
    if let Some(f) = &fleet {
        tokio::spawn(f.clone().write_statuses(
            writer.clone(),
            caches.clone(),
            fence.clone(),
            POLICY_STATUS_EVERY,
        ));
    }
    let ctx = Arc::new(Context {
        client: writer.clone(),
        caches: caches.clone(),
        recorder: Recorder::new(writer.clone(), Reporter::from("saferollout-operator")),
        metrics: metrics.clone(),
        fence,
        triggers: triggers.clone(),
        memory: Default::default(),
        write_slots: Default::default(),
        limits,
        fleet,
    });
    let shutdown = shutdown_signal();
    tokio::pin!(shutdown);
    loop {
        // Follow until elected.
        while !*leading.borrow_and_update() {
            metrics.leader.set(0);
            tokio::select! {
                r = leading.changed() => r?,
                _ = &mut shutdown => return Ok(()),
            }
        }
        metrics.leader.set(1);
        caches.wait_until_synced().await;
        info!("leading: reconciling");
        if let Some(f) = &ctx.fleet {
            // Another replica may have led meanwhile: what this one decided
            // before is no longer the last word, the statuses are.
            f.start_leading();
        }
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        for sr in caches.every_rollout() {
            if tx.send(ObjectRef::from_obj(&*sr)).is_ok() {
                triggers.count(Cause::Leading);
            }
        }
        triggers.attach(Some(tx));
        let queue = futures::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|r| (Ok::<_, Infallible>(r), rx))
        });
        let work = applier(
            |sr, ctx| Box::pin(reconcile(sr, ctx)),
            error_policy,
            ctx.clone(),
            caches.all_rollouts.clone(),
            queue,
            QueueConfig::default(),
        )
        .for_each(|res| async move {
            if let Err(e) = res {
                tracing::debug!(error = %e, "reconcile result");
            }
        });
        tokio::pin!(work);
        let lost = async {
            while *leading.borrow() {
                if leading.changed().await.is_err() {
                    return;
                }
            }
        };
        tokio::select! {
            _ = &mut work => warn!("the work queue ended"),
            _ = lost => warn!("lost the leader lease: stopped reconciling"),
            _ = &mut shutdown => {
                triggers.attach(None);
                return Ok(());
            }
        }
        triggers.attach(None);
    }
}

async fn shutdown_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    info!("shutting down");
}

/// Fails early with a clear message when the CRD or RBAC is missing (the
/// operator never installs its own CRD). A fresh CRD and RBAC take a moment to
/// be served after `kubectl apply`: retry for a while first.
async fn wait_for_api(client: &Client, namespaces: &[String]) -> anyhow::Result<()> {
    let apis: Vec<Api<SafeRollout>> = if namespaces.is_empty() {
        vec![Api::all(client.clone())]
    } else {
        namespaces
            .iter()
            .map(|n| Api::namespaced(client.clone(), n))
            .collect()
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    for api in apis {
        while let Err(e) = api.list(&kube::api::ListParams::default().limit(1)).await {
            if Instant::now() > deadline {
                anyhow::bail!(
                    "cannot list SafeRollouts ({e}); are deploy/crd.yaml and deploy/rbac.yaml applied?"
                );
            }
            warn!(error = %e, "cannot list SafeRollouts yet; retrying");
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }
    Ok(())
}

/// With `--fleet-policies`: fails early, saying what to apply, when the
/// SafeRolloutPolicy CRD or the RBAC to read policies and namespaces is
/// missing (otherwise the caches would never list, and every rollout would
/// wait on them in silence).
async fn wait_for_policy_api(client: &Client) -> anyhow::Result<()> {
    let policies: Api<saferollout_api::SafeRolloutPolicy> = Api::all(client.clone());
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    let deadline = Instant::now() + Duration::from_secs(30);
    let limit = kube::api::ListParams::default().limit(1);
    loop {
        let listed = match policies.list(&limit).await {
            Ok(_) => namespaces.list_metadata(&limit).await.map(|_| ()),
            Err(e) => Err(e),
        };
        match listed {
            Ok(()) => return Ok(()),
            Err(e) if Instant::now() > deadline => anyhow::bail!(
                "--fleet-policies: cannot list SafeRolloutPolicies and namespaces ({e}); are deploy/crd-policy.yaml and the RBAC of the chart's fleetPolicies.enabled applied?"
            ),
            Err(e) => {
                warn!(error = %e, "cannot list SafeRolloutPolicies or namespaces yet; retrying");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rollout_id_fits_a_label_value() {
        assert_eq!(rollout_id("gpu", "nvidia"), "gpu.nvidia");
        let long = rollout_id(&"n".repeat(60), &"x".repeat(60));
        assert!(long.len() <= 63, "{long}");
        assert_ne!(long, rollout_id(&"n".repeat(60), &"y".repeat(60)));
    }
}
