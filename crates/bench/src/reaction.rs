//! Reaction time: from the event that makes a gate fail on the canary to the
//! operator's revert write, both as watch events of the API server stamped on
//! arrival (see [`crate::watch`]), over many trials per fault.
//!
//! Each trial writes a new faulty template to the DaemonSet (a fresh tag, so
//! no revision is blocked already); the canary is pinned by a node label. The
//! trial ends when the revert is complete: the SafeRollout Degraded, the
//! canary's agent back on the stable template, Ready and serving.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context, bail};
use jiff::Timestamp;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::api::Api;
use kube::runtime::watcher::{self, Event};
use saferollout_api::{Phase, SafeRollout, SafeRolloutStatus};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use crate::ctx::Ctx;
use crate::k8s::{self, GPUS};
use crate::overhead::{self, RESOURCE};
use crate::results::{FaultResult, Trial};
use crate::stats;
use crate::watch::{self, Obs, Stamped, ms};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// The new agent crash-loops: podsReady fails on CrashLoopBackOff.
    CrashLoop,
    /// The new agent is Ready but advertises 0 devices: allocatable fails.
    Allocatable,
    /// The new DRA driver is Ready but withdraws its ResourceSlices.
    DraSlices,
}

impl Fault {
    pub fn parse(s: &str) -> anyhow::Result<Self> {
        Ok(match s {
            "crashloop" => Fault::CrashLoop,
            "allocatable" => Fault::Allocatable,
            "dra" | "dra-slices" => Fault::DraSlices,
            other => bail!("unknown fault {other:?} (crashloop, allocatable, dra)"),
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Fault::CrashLoop => "crashloop",
            Fault::Allocatable => "allocatable",
            Fault::DraSlices => "dra-slices",
        }
    }

    fn suffix(self) -> &'static str {
        match self {
            Fault::CrashLoop => "-crashloop",
            Fault::Allocatable | Fault::DraSlices => "-broken",
        }
    }

    pub fn description(self) -> &'static str {
        match self {
            Fault::CrashLoop => {
                "canary agent in CrashLoopBackOff (pod status write) -> podsReady fails at once"
            }
            Fault::Allocatable => {
                "canary agent Ready, then its node's status written after the Ready shows allocatable 0 -> allocatable (soak 0s)"
            }
            Fault::DraSlices => {
                "canary DRA driver Ready but its ResourceSlices withdrawn (the later of the two) -> resourceSlices gate"
            }
        }
    }
}

/// What the watches show of the canary.
#[derive(Default)]
struct View {
    pods: BTreeMap<String, Pod>,
    allocatable: Option<i64>,
    /// When the canary's status was last written (its Ready condition's
    /// heartbeat, which the kubelet, here the fixture, stamps on every
    /// status write).
    status_written: Option<Timestamp>,
    slices: BTreeMap<String, ()>,
    ds_image: Option<String>,
    rollout: Option<SafeRolloutStatus>,
    synced: usize,
}

impl View {
    /// Applies one event; returns its resource version.
    fn apply(&mut self, obs: Obs) -> Option<String> {
        fn rv<K: kube::Resource>(o: &K) -> Option<String> {
            o.meta().resource_version.clone()
        }
        match obs {
            Obs::Pod(Event::Init) => self.pods.clear(),
            Obs::Pod(Event::InitApply(p) | Event::Apply(p)) => {
                let v = rv(&p);
                self.pods
                    .insert(p.metadata.uid.clone().unwrap_or_default(), p);
                return v;
            }
            Obs::Pod(Event::Delete(p)) => {
                self.pods
                    .remove(&p.metadata.uid.clone().unwrap_or_default());
                return rv(&p);
            }
            Obs::Node(Event::InitApply(n) | Event::Apply(n)) => {
                self.allocatable = Some(k8s::allocatable(&n, RESOURCE).unwrap_or(0));
                self.status_written = n
                    .status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"))
                    .and_then(|c| c.last_heartbeat_time.as_ref())
                    .map(|t| t.0);
                return rv(&n);
            }
            Obs::Slice(Event::Init) => self.slices.clear(),
            Obs::Slice(Event::InitApply(s) | Event::Apply(s)) => {
                if s.spec.driver == k8s::DRIVER {
                    self.slices
                        .insert(s.metadata.name.clone().unwrap_or_default(), ());
                }
                return rv(&s);
            }
            Obs::Slice(Event::Delete(s)) => {
                self.slices
                    .remove(&s.metadata.name.clone().unwrap_or_default());
                return rv(&s);
            }
            Obs::DaemonSet(Event::InitApply(d) | Event::Apply(d)) => {
                self.ds_image = k8s::image_of_template(&d).map(String::from);
                return rv(&d);
            }
            Obs::Rollout(Event::InitApply(r) | Event::Apply(r)) => {
                let v = rv(&r);
                self.rollout = r.status;
                return v;
            }
            Obs::Pod(Event::InitDone)
            | Obs::Node(Event::InitDone)
            | Obs::Slice(Event::InitDone)
            | Obs::DaemonSet(Event::InitDone)
            | Obs::Rollout(Event::InitDone) => self.synced += 1,
            _ => {}
        }
        None
    }

    fn live_pods(&self) -> impl Iterator<Item = &Pod> {
        self.pods
            .values()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
    }

    /// The agent running `bad` is Ready.
    fn bad_ready(&self, bad: &str) -> bool {
        self.live_pods()
            .any(|p| k8s::image_of_pod(p) == Some(bad) && k8s::pod_ready(p))
    }

    /// The evidence that fails the gate is there for the agent running
    /// `bad`. A gate judges a node only on what was written after its new
    /// agent became Ready: for allocatable, the node's status written in a
    /// later whole second than the pod's Ready (see
    /// `saferollout_core::gates::freshness`); a withdrawal of slices has no
    /// time and is judged as seen.
    fn fault_holds(&self, fault: Fault, bad: &str) -> bool {
        let mut new = self
            .live_pods()
            .filter(|p| k8s::image_of_pod(p) == Some(bad));
        match fault {
            Fault::CrashLoop => new.any(|p| k8s::waiting_reason(p) == Some("CrashLoopBackOff")),
            Fault::Allocatable => {
                self.allocatable == Some(0)
                    && new.any(|p| {
                        saferollout_core::gates::freshness::written_after(
                            self.status_written,
                            k8s::ready_since(p),
                        )
                    })
            }
            Fault::DraSlices => new.any(k8s::pod_ready) && self.slices.is_empty(),
        }
    }

    /// The revert is complete: Degraded, and the canary runs one Ready agent
    /// of the stable template that serves its devices.
    fn settled(&self, fault: Fault, stable: &str) -> bool {
        let phase = self.rollout.as_ref().and_then(|s| s.phase);
        let pods: Vec<&Pod> = self.pods.values().collect();
        let serving = match fault {
            Fault::DraSlices => !self.slices.is_empty(),
            _ => self.allocatable == Some(GPUS),
        };
        phase == Some(Phase::Degraded)
            && self.ds_image.as_deref() == Some(stable)
            && pods.len() == 1
            && k8s::image_of_pod(pods[0]) == Some(stable)
            && k8s::pod_ready(pods[0])
            && serving
    }

    fn target(&self) -> Option<String> {
        self.rollout.as_ref()?.target_revision.clone()
    }

    /// The first stage of a rollout of another revision than `before` passed.
    fn canary_passed(&self, before: &Option<String>) -> bool {
        self.rollout.as_ref().is_some_and(|s| {
            s.target_revision.is_some()
                && s.target_revision != *before
                && s.stages
                    .iter()
                    .any(|st| st.index == 0 && st.state == saferollout_api::StageState::Passed)
        })
    }

    fn blocked(&self) -> usize {
        self.rollout
            .as_ref()
            .map_or(0, |s| s.blocked_revisions.len())
    }
}

/// The SafeRollout spec of a fault's DaemonSet.
fn spec(fault: Fault, dra_gates: &Value) -> Value {
    match fault {
        Fault::DraSlices => json!({
            "targetRef": {"name": "driver"},
            "canary": {"nodeSelector": {"matchLabels": {k8s::CANARY_LABEL: "true"}}},
            "stages": [{"nodes": 1}, {"nodes": "100%"}],
            "maxUnavailable": 1,
            "progressDeadline": "10m",
            "gates": dra_gates,
        }),
        _ => overhead::rollout_spec(&["1", "100%"], "1", true, ALLOCATABLE_SOAK),
    }
}

const DRA_NS: &str = "bench-dra";

/// Every gate runs without soak, as the issue asks, so nothing is subtracted.
/// (A soak could not be subtracted exactly anyway: the operator keeps a gate's
/// `since` in status, whose times have whole seconds, so a 1 s soak ends 0-1 s
/// after the violation began.) Before the gates judged only evidence written
/// after the new agent became Ready, the allocatable gate without soak could
/// pass a broken plugin whose pod turned Ready a moment before its node's
/// allocatable dropped; a trial whose canary stage passes is still counted as
/// a false pass at the canary (the failure is caught at the next stage) and
/// left out of the reaction times.
const ALLOCATABLE_SOAK: &str = "0s";

/// Runs `trials` trials of each fault in `faults` (interleaved, so a slow
/// spell of the machine spreads over all of them). Device-plugin faults share
/// one operator run; the DRA fault has its own DaemonSet and run.
pub async fn run(
    ctx: &Ctx,
    faults: &[Fault],
    trials: usize,
    dra_gates: &Value,
) -> anyhow::Result<Vec<FaultResult>> {
    let canary = ctx.node_names.first().context("no node")?.clone();
    k8s::label_nodes(
        &ctx.client,
        vec![(
            canary.clone(),
            [(k8s::CANARY_LABEL.to_string(), "true".to_string())].into(),
        )],
        1,
    )
    .await?;
    let mut results = Vec::new();
    let plugin: Vec<Fault> = faults
        .iter()
        .copied()
        .filter(|f| *f != Fault::DraSlices)
        .collect();
    if !plugin.is_empty() {
        results.extend(
            run_group(
                ctx,
                &plugin,
                trials,
                &canary,
                overhead::NS,
                overhead::DS,
                dra_gates,
            )
            .await?,
        );
    }
    if faults.contains(&Fault::DraSlices) {
        k8s::namespace(&ctx.client, DRA_NS).await?;
        match k8s::rollout_spec_known(&ctx.client, DRA_NS, spec(Fault::DraSlices, dra_gates)).await
        {
            Err(e) => {
                eprintln!("bench: DRA fault not measured: {e:#}");
                results.push(FaultResult {
                    fault: Fault::DraSlices.name().into(),
                    description: Fault::DraSlices.description().into(),
                    skipped: Some(format!(
                        "this build's SafeRollout has no gate for ResourceSlices (the API server refused gates {dra_gates}: {})",
                        api_message(&e)
                    )),
                    ..Default::default()
                });
            }
            Ok(()) => {
                k8s::create_daemonset(
                    &ctx.client,
                    DRA_NS,
                    "driver",
                    k8s::driver_template(&ctx.image("")),
                    None,
                )
                .await?;
                let fleet = Duration::from_secs(600 + ctx.nodes as u64 / 2);
                k8s::wait_daemonset_complete(&ctx.client, DRA_NS, "driver", fleet).await?;
                results.extend(
                    run_group(
                        ctx,
                        &[Fault::DraSlices],
                        trials,
                        &canary,
                        DRA_NS,
                        "driver",
                        dra_gates,
                    )
                    .await?,
                );
            }
        }
    }
    Ok(results)
}

async fn run_group(
    ctx: &Ctx,
    faults: &[Fault],
    trials: usize,
    canary: &str,
    ns: &str,
    ds: &str,
    dra_gates: &Value,
) -> anyhow::Result<Vec<FaultResult>> {
    let name = ds;
    eprintln!(
        "bench: {} nodes: reaction, {trials} trials of {:?} on canary {canary}",
        ctx.nodes, faults
    );
    k8s::create_rollout(&ctx.client, ns, name, spec(faults[0], dra_gates)).await?;
    let op = ctx.start_operator(&format!("reaction-{}", faults[0].name()))?;
    let slow = Duration::from_secs(300 + ctx.nodes as u64 / 10);
    k8s::wait_adopted(&ctx.client, ns, name, slow).await?;

    let (tx, mut rx) = mpsc::unbounded_channel();
    let on_canary = format!("spec.nodeName={canary}");
    let client = &ctx.client;
    let tasks = vec![
        watch::spawn(
            Api::<Pod>::namespaced(client.clone(), ns),
            watcher::Config::default().fields(&on_canary),
            Obs::Pod,
            tx.clone(),
        ),
        watch::spawn(
            Api::<Node>::all(client.clone()),
            watcher::Config::default().fields(&format!("metadata.name={canary}")),
            Obs::Node,
            tx.clone(),
        ),
        watch::spawn(
            Api::<DaemonSet>::namespaced(client.clone(), ns),
            watcher::Config::default().fields(&format!("metadata.name={ds}")),
            Obs::DaemonSet,
            tx.clone(),
        ),
        watch::spawn(
            Api::<SafeRollout>::namespaced(client.clone(), ns),
            watcher::Config::default().fields(&format!("metadata.name={name}")),
            Obs::Rollout,
            tx.clone(),
        ),
        watch::spawn(
            Api::<ResourceSlice>::all(client.clone()),
            watcher::Config::default().fields(&on_canary),
            Obs::Slice,
            tx.clone(),
        ),
    ];
    drop(tx);
    let watches = tasks.len();
    let _abort = Abort(tasks);
    let mut view = View::default();
    while view.synced < watches {
        let ev = rx.recv().await.context("watch ended")?;
        view.apply(ev.obs);
    }
    let mut per_fault: BTreeMap<&str, Vec<Trial>> = BTreeMap::new();
    for i in 0..trials {
        for &fault in faults {
            let trial = run_trial(ctx, &mut view, &mut rx, fault, i, ns, ds).await;
            let trial = match trial {
                Ok(t) => t,
                Err(e) => {
                    eprintln!("bench:   trial {i} of {}: {e:#}", fault.name());
                    let t = Trial {
                        index: i,
                        error: Some(format!("{e:#}")),
                        ..Default::default()
                    };
                    per_fault.entry(fault.name()).or_default().push(t);
                    // The next trial needs the revert done: wait for it, or give up.
                    let stable = view.ds_image.clone().unwrap_or_default();
                    wait_settled(&mut view, &mut rx, fault, &stable)
                        .await
                        .with_context(|| format!("the rollout did not settle after trial {i}"))?;
                    continue;
                }
            };
            per_fault.entry(fault.name()).or_default().push(trial);
        }
    }
    k8s::delete_rollout(&ctx.client, ns, name, slow).await?;
    let operator = ctx.finish_operator(op, &format!("reaction-{}", faults[0].name()), 1)?;
    Ok(faults
        .iter()
        .map(|f| {
            let trials = per_fault.remove(f.name()).unwrap_or_default();
            let revert: Vec<f64> = trials.iter().filter_map(|t| t.revert_ms).collect();
            let status: Vec<f64> = trials.iter().filter_map(|t| t.status_ms).collect();
            let waits: Vec<f64> = trials.iter().filter_map(|t| t.evidence_wait_ms).collect();
            FaultResult {
                fault: f.name().into(),
                description: f.description().into(),
                soak_secs: 0.0,
                revert: stats::summarize(&revert),
                status: stats::summarize(&status),
                evidence_wait: stats::summarize(&waits),
                trials,
                skipped: None,
                operator: Some(operator.clone()),
            }
        })
        .collect())
}

struct Abort(Vec<tokio::task::JoinHandle<()>>);

impl Drop for Abort {
    fn drop(&mut self) {
        for t in &self.0 {
            t.abort();
        }
    }
}

/// The API server's message of an error, else the whole error.
fn api_message(e: &anyhow::Error) -> String {
    match e.downcast_ref::<kube::Error>() {
        Some(kube::Error::Api(s)) => s.message.clone(),
        _ => format!("{e:#}"),
    }
}

async fn wait_settled(
    view: &mut View,
    rx: &mut mpsc::UnboundedReceiver<Stamped>,
    fault: Fault,
    stable: &str,
) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    while !view.settled(fault, stable) {
        let ev = tokio::time::timeout_at(deadline, rx.recv())
            .await
            .context("not settled within 120s")?
            .context("watch ended")?;
        view.apply(ev.obs);
    }
    Ok(())
}

async fn run_trial(
    ctx: &Ctx,
    view: &mut View,
    rx: &mut mpsc::UnboundedReceiver<Stamped>,
    fault: Fault,
    index: usize,
    ns: &str,
    ds: &str,
) -> anyhow::Result<Trial> {
    let stable = view.ds_image.clone().context("no DaemonSet seen")?;
    let bad = ctx.image(fault.suffix());
    let template = match fault {
        Fault::DraSlices => k8s::driver_template(&bad),
        _ => k8s::plugin_template(RESOURCE, &bad),
    };
    let blocked_before = view.blocked();
    let target_before = view.target();
    k8s::set_daemonset(&ctx.client, ns, ds, template, None).await?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    let mut saw_bad = false;
    let mut fault_at: Option<(Timestamp, Option<String>)> = None;
    let mut ready_at: Option<Timestamp> = None;
    let mut revert_at: Option<(Timestamp, Option<String>)> = None;
    let mut status_at: Option<Timestamp> = None;
    let mut false_pass = false;
    loop {
        let ev = tokio::time::timeout_at(deadline, rx.recv())
            .await
            .context("the trial did not settle within 120s")?
            .context("watch ended")?;
        let is_ds = matches!(ev.obs, Obs::DaemonSet(_));
        let is_sr = matches!(ev.obs, Obs::Rollout(_));
        let rv = view.apply(ev.obs);
        if is_ds && view.ds_image.as_deref() == Some(bad.as_str()) {
            saw_bad = true;
        }
        if ready_at.is_none() && view.bad_ready(&bad) {
            ready_at = Some(ev.at);
        }
        if fault_at.is_none() && view.fault_holds(fault, &bad) {
            fault_at = Some((ev.at, rv.clone()));
        }
        if revert_at.is_none()
            && is_ds
            && saw_bad
            && view.ds_image.as_deref() == Some(stable.as_str())
        {
            revert_at = Some((ev.at, rv.clone()));
        }
        if status_at.is_none() && is_sr && view.blocked() > blocked_before {
            status_at = Some(ev.at);
        }
        // The canary's stage passed while the revert had not come yet.
        if is_sr && revert_at.is_none() && view.canary_passed(&target_before) {
            false_pass = true;
        }
        if revert_at.is_some() && status_at.is_some() && view.settled(fault, &stable) {
            break;
        }
    }
    let (fault_t, fault_rv) = fault_at.context("the failing event was never seen")?;
    let (revert_t, revert_rv) = revert_at.context("no revert")?;
    let trial = Trial {
        index,
        revert_ms: (!false_pass).then(|| ms(fault_t, revert_t)),
        status_ms: status_at.filter(|_| !false_pass).map(|s| ms(fault_t, s)),
        evidence_wait_ms: ready_at
            .filter(|_| fault != Fault::CrashLoop)
            .map(|r| ms(r, fault_t)),
        false_pass,
        fault_rv,
        revert_rv,
        error: None,
    };
    eprintln!(
        "bench:   {} trial {index}: revert write {:.1} ms, status {:.1} ms after the failing event{}",
        fault.name(),
        trial.revert_ms.unwrap_or(f64::NAN),
        trial.status_ms.unwrap_or(f64::NAN),
        if false_pass {
            " (the canary passed: caught at the next stage)"
        } else {
            ""
        }
    );
    Ok(trial)
}
