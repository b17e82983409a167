//! Overhead against the native DaemonSet rollout: the same update of the
//! same DaemonSet on the same cluster, done by the DaemonSet controller
//! (RollingUpdate, maxUnavailable K) and by saferollout (stages, the same
//! maxUnavailable, no soak, podsReady and allocatable gates).

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context, bail};
use jiff::Timestamp;
use k8s_openapi::api::apps::v1::DaemonSet;
use kube::api::Api;
use kube::runtime::watcher::{self, Event};
use saferollout_api::{Phase, SafeRollout};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use crate::cluster::OPERATOR_USER;
use crate::ctx::{Ctx, secs};
use crate::k8s;
use crate::results::{RolloutRun, StageRequests};
use crate::watch::{self, Obs};
use saferollout_testkit::audit;

pub const NS: &str = "bench";
pub const DS: &str = "plugin";
pub const RESOURCE: &str = "example.com/gpu";

/// The DaemonSet every overhead and reaction run updates, on every node.
pub async fn setup(ctx: &Ctx) -> anyhow::Result<()> {
    k8s::namespace(&ctx.client, NS).await?;
    let api: Api<DaemonSet> = Api::namespaced(ctx.client.clone(), NS);
    if api.get_opt(DS).await?.is_none() {
        k8s::create_daemonset(
            &ctx.client,
            NS,
            DS,
            k8s::plugin_template(RESOURCE, &ctx.image("")),
            None,
        )
        .await?;
    }
    let fleet = Duration::from_secs(600 + ctx.nodes as u64 / 2);
    k8s::wait_daemonset_complete(&ctx.client, NS, DS, fleet).await?;
    k8s::wait_nodes_advertise(&ctx.client, RESOURCE, ctx.nodes, fleet).await?;
    Ok(())
}

/// The allocatable gate's soak in the rollout runs. Without soak it falsely
/// reverts healthy releases here: a replaced plugin's node reads 0 devices
/// for a moment after its new pod turns Ready (the fixture, like a kubelet,
/// drops allocatable once no plugin runs and advertises again once the new
/// one does), which a gate without soak takes for lost devices (seen at 100
/// nodes, maxUnavailable 10%). Each stage's gate then passes only after
/// holding for the soak, so the soak is subtracted once per stage (2 s: the
/// up to a second more from its start rounded up to a whole second stays in
/// saferollout's time).
pub const OVERHEAD_SOAK: &str = "2s";
const OVERHEAD_SOAK_SECS: f64 = 2.0;

/// After a failed run: no SafeRollout left on the DaemonSet (the operator
/// gives it back), then every node on one template and advertising again.
pub async fn recover(ctx: &Ctx) -> anyhow::Result<()> {
    let api: Api<SafeRollout> = Api::namespaced(ctx.client.clone(), NS);
    let left = api.list(&Default::default()).await?;
    if !left.items.is_empty() {
        let op = ctx.start_operator("recover")?;
        for sr in &left.items {
            let name = sr.metadata.name.clone().unwrap_or_default();
            k8s::delete_rollout(&ctx.client, NS, &name, Duration::from_secs(300)).await?;
        }
        op.stop()?;
    }
    let image = ctx.rollout_image();
    timed_update(
        ctx,
        k8s::plugin_template(RESOURCE, &image),
        Some(k8s::rolling_update("10%")),
        None,
        false,
        rollout_timeout(ctx, "10%"),
    )
    .await?;
    k8s::wait_nodes_advertise(&ctx.client, RESOURCE, ctx.nodes, Duration::from_secs(300)).await
}

/// A SafeRollout spec for the benchmark DaemonSet.
pub fn rollout_spec(
    stages: &[&str],
    max_unavailable: &str,
    canary: bool,
    allocatable_soak: &str,
) -> Value {
    let stages: Vec<Value> = stages
        .iter()
        .map(|s| match s.parse::<i64>() {
            Ok(n) => json!({"nodes": n}),
            Err(_) => json!({"nodes": s}),
        })
        .collect();
    let mu: Value = max_unavailable
        .parse::<i64>()
        .map(Value::from)
        .unwrap_or_else(|_| Value::from(max_unavailable));
    let mut spec = json!({
        "targetRef": {"name": DS},
        "stages": stages,
        "maxUnavailable": mu,
        "progressDeadline": "30m",
        "gates": {"allocatable": [{"resource": RESOURCE, "min": "baseline", "max": "baseline", "soak": allocatable_soak}]}
    });
    if canary {
        spec["canary"] = json!({"nodeSelector": {"matchLabels": {k8s::CANARY_LABEL: "true"}}});
    }
    spec
}

/// What a timed update saw.
struct Timed {
    ds_secs: f64,
    sr_secs: Option<f64>,
    /// When each stage started (first seen as the current stage), and the
    /// most nodes it held.
    stage_starts: Vec<(usize, Timestamp)>,
    stage_nodes: BTreeMap<usize, usize>,
    done: Timestamp,
    /// CPU seconds of each cluster component from the write to `done`.
    cluster_cpu: Vec<(String, f64)>,
    /// With `labels`: from the template write to the last label written.
    labels_secs: Option<f64>,
}

/// Writes `template` (and `strategy`) to the DaemonSet and times it until its
/// status is complete and, with `rollout`, the SafeRollout Succeeded on a
/// new stable revision. With `labels`, every node gets a stage's labels from
/// the template write on, as the operator's label writer would write them.
async fn timed_update(
    ctx: &Ctx,
    template: Value,
    strategy: Option<Value>,
    rollout: Option<&str>,
    labels: bool,
    timeout: Duration,
) -> anyhow::Result<Timed> {
    let (tx, mut rx) = mpsc::unbounded_channel();
    let mut tasks = vec![watch::spawn(
        Api::<DaemonSet>::namespaced(ctx.client.clone(), NS),
        watcher::Config::default().fields(&format!("metadata.name={DS}")),
        Obs::DaemonSet,
        tx.clone(),
    )];
    if let Some(name) = rollout {
        tasks.push(watch::spawn(
            Api::<SafeRollout>::namespaced(ctx.client.clone(), NS),
            watcher::Config::default().fields(&format!("metadata.name={name}")),
            Obs::Rollout,
            tx.clone(),
        ));
    }
    drop(tx);
    let abort = Abort(tasks);
    // Both watches listed before the write: nothing it causes is missed.
    let mut synced = 0;
    let mut old_stable = None;
    while synced < abort.0.len() {
        let ev = rx.recv().await.context("watch ended")?;
        match ev.obs {
            Obs::DaemonSet(Event::InitDone) => synced += 1,
            Obs::Rollout(Event::InitApply(sr)) => {
                old_stable = sr.status.and_then(|s| s.stable_revision);
            }
            Obs::Rollout(Event::InitDone) => synced += 1,
            _ => {}
        }
    }
    let cpu_before = ctx.cluster.component_stats()?;
    let t0 = Timestamp::now();
    let generation = k8s::set_daemonset(&ctx.client, NS, DS, template, strategy).await?;
    let mut labelling = Abort(Vec::new());
    if labels {
        let (client, nodes) = (ctx.client.clone(), ctx.node_names.clone());
        labelling.0.push(tokio::spawn(async move {
            k8s::write_stage_labels(&client, &nodes, Some(CONTROL_ROLLOUT_ID)).await?;
            anyhow::Ok(Timestamp::now())
        }));
    }
    let deadline = tokio::time::Instant::now() + timeout;
    let mut ds_done = None;
    let mut sr_done = None;
    let mut stage_starts: Vec<(usize, Timestamp)> = Vec::new();
    let mut stage_nodes = BTreeMap::new();
    while ds_done.is_none() || (rollout.is_some() && sr_done.is_none()) {
        let ev = tokio::time::timeout_at(deadline, rx.recv())
            .await
            .with_context(|| format!("the update did not complete within {timeout:?}"))?
            .context("watch ended")?;
        match ev.obs {
            Obs::DaemonSet(Event::Apply(ds)) | Obs::DaemonSet(Event::InitApply(ds))
                if ds_done.is_none() && k8s::daemonset_complete(&ds, generation) =>
            {
                ds_done = Some(ev.at);
            }
            Obs::Rollout(Event::Apply(sr)) | Obs::Rollout(Event::InitApply(sr)) => {
                let Some(st) = sr.status else { continue };
                if let Some(i) = st.current_stage {
                    let i = i as usize;
                    if stage_starts.last().is_none_or(|(last, _)| *last != i)
                        && !stage_starts.iter().any(|(s, _)| *s == i)
                    {
                        stage_starts.push((i, ev.at));
                    }
                }
                for s in &st.stages {
                    let e = stage_nodes.entry(s.index as usize).or_insert(0);
                    *e = (*e).max(s.nodes.len());
                }
                if !st.blocked_revisions.is_empty() && st.phase == Some(Phase::Degraded) {
                    bail!(
                        "a false revert: {:?}",
                        st.blocked_revisions
                            .iter()
                            .map(|b| &b.message)
                            .collect::<Vec<_>>()
                    );
                }
                if sr_done.is_none()
                    && st.phase == Some(Phase::Succeeded)
                    && st.stable_revision.is_some()
                    && st.stable_revision != old_stable
                {
                    sr_done = Some(ev.at);
                }
            }
            _ => {}
        }
    }
    let cpu_after = ctx.cluster.component_stats()?;
    let cluster_cpu = cpu_after
        .into_iter()
        .map(|(name, after)| {
            let before = cpu_before
                .iter()
                .find(|(n, _)| *n == name)
                .map_or(after.cpu_secs, |(_, s)| s.cpu_secs);
            (name, after.cpu_secs - before)
        })
        .collect();
    let labels_secs = match labelling.0.first_mut() {
        Some(task) => Some(secs(t0, task.await??)),
        None => None,
    };
    let ds_done = ds_done.unwrap_or(t0);
    let done = sr_done.map_or(ds_done, |s| s.max(ds_done));
    Ok(Timed {
        ds_secs: secs(t0, ds_done),
        sr_secs: sr_done.map(|t| secs(t0, t)),
        stage_starts,
        stage_nodes,
        done,
        cluster_cpu,
        labels_secs,
    })
}

/// Tasks aborted when the timed run ends early (an error, a timeout).
struct Abort<T = ()>(Vec<tokio::task::JoinHandle<T>>);

impl<T> Drop for Abort<T> {
    fn drop(&mut self) {
        for t in &self.0 {
            t.abort();
        }
    }
}

fn rollout_timeout(ctx: &Ctx, max_unavailable: &str) -> Duration {
    // Serial replacements take well under a second each (plus the agents'
    // start); leave room for a busy machine.
    let batches = if max_unavailable == "1" {
        ctx.nodes as u64
    } else {
        20
    };
    Duration::from_secs(300 + (3 + ctx.agent_start_secs) * batches)
}

/// The value of `saferollout.dev/rollout` on the nodes the `native-labelled`
/// control labels: no SafeRollout has this id (no operator runs then anyway).
const CONTROL_ROLLOUT_ID: &str = "bench-control";

/// The DaemonSet controller rolls a new template out (no operator runs).
///
/// `labelled` is the control run `native-labelled`: meanwhile the benchmark
/// writes the labels saferollout's one 100% stage puts on every node (same
/// patch, same writes in flight as the operator's label writer), so a reader
/// can tell what those writes alone cost the machine. They are removed after
/// the timed run, as the operator removes them after `Succeeded`.
pub async fn native(
    ctx: &Ctx,
    max_unavailable: &str,
    labelled: bool,
) -> anyhow::Result<RolloutRun> {
    let mode = if labelled {
        "native-labelled"
    } else {
        "native"
    };
    eprintln!(
        "bench: {} nodes: {mode} RollingUpdate, maxUnavailable {max_unavailable}",
        ctx.nodes
    );
    let image = ctx.rollout_image();
    let t = timed_update(
        ctx,
        k8s::plugin_template(RESOURCE, &image),
        Some(k8s::rolling_update(max_unavailable)),
        None,
        labelled,
        rollout_timeout(ctx, max_unavailable),
    )
    .await;
    if labelled {
        // Also after a failed run: the labels would stay on every node.
        k8s::write_stage_labels(&ctx.client, &ctx.node_names, None).await?;
    }
    let t = t?;
    // The next run starts from every node advertising again.
    k8s::wait_nodes_advertise(&ctx.client, RESOURCE, ctx.nodes, Duration::from_secs(300)).await?;
    eprintln!("bench:   {mode} done in {:.1}s", t.ds_secs);
    Ok(RolloutRun {
        mode: mode.into(),
        labels_secs: t.labels_secs,
        max_unavailable: max_unavailable.into(),
        stages: String::new(),
        daemonset_complete_secs: t.ds_secs,
        succeeded_secs: None,
        soak_secs: 0.0,
        operator: None,
        stage_requests: Vec::new(),
        timed_secs: t.ds_secs,
        cluster_cpu: t.cluster_cpu,
    })
}

/// saferollout rolls the same kind of update out: the SafeRollout is created
/// and the operator started (its start-up is measured), it adopts the
/// DaemonSet, then the template changes (the Helm path), then the SafeRollout
/// is deleted (the DaemonSet goes back to RollingUpdate) and the operator stops.
///
/// `repeat` counts the runs of the same kind before this one in the list:
/// each run gets its own SafeRollout, operator log and footprint row.
pub async fn saferollout(
    ctx: &Ctx,
    max_unavailable: &str,
    stages: &[&str],
    repeat: usize,
) -> anyhow::Result<RolloutRun> {
    let mut label = format!(
        "rollout-k{}-{}",
        max_unavailable.replace('%', "pct"),
        stages.len()
    );
    if repeat > 0 {
        label.push_str(&format!("-r{}", repeat + 1));
    }
    eprintln!(
        "bench: {} nodes: saferollout, stages {stages:?}, maxUnavailable {max_unavailable}",
        ctx.nodes
    );
    // A fresh name per run: a recreated SafeRollout of the same name would
    // wait for the garbage collector to remove the previous one's backup.
    let name = &format!("plugin-{label}");
    k8s::create_rollout(
        &ctx.client,
        NS,
        name,
        rollout_spec(stages, max_unavailable, false, OVERHEAD_SOAK),
    )
    .await?;
    let op = ctx.start_operator(&label)?;
    let slow = Duration::from_secs(300 + ctx.nodes as u64 / 10);
    k8s::wait_adopted(&ctx.client, NS, name, slow).await?;
    let image = ctx.rollout_image();
    let t = timed_update(
        ctx,
        k8s::plugin_template(RESOURCE, &image),
        None,
        Some(name),
        false,
        rollout_timeout(ctx, max_unavailable),
    )
    .await?;
    eprintln!(
        "bench:   saferollout done: DaemonSet complete {:.1}s, Succeeded {:.1}s",
        t.ds_secs,
        t.sr_secs.unwrap_or(f64::NAN)
    );
    k8s::delete_rollout(&ctx.client, NS, name, slow).await?;
    let operator = ctx.finish_operator(op, &label, 1)?;
    // Requests of each stage, from the audit log: stage i runs from its start
    // to the next one's (the last one to Succeeded).
    let requests: Vec<audit::Request> = audit::read(&ctx.cluster.audit_log())?
        .into_iter()
        .filter(|r| r.user == OPERATOR_USER)
        .collect();
    let mut stage_requests = Vec::new();
    for (j, (i, start)) in t.stage_starts.iter().enumerate() {
        let end = t.stage_starts.get(j + 1).map_or(t.done, |(_, s)| *s);
        stage_requests.push(StageRequests {
            index: *i,
            new_nodes: t.stage_nodes.get(i).copied().unwrap_or_default(),
            secs: secs(*start, end),
            requests: audit::count_between(&requests, *start, end),
        });
    }
    k8s::wait_nodes_advertise(&ctx.client, RESOURCE, ctx.nodes, Duration::from_secs(300)).await?;
    Ok(RolloutRun {
        mode: "saferollout".into(),
        max_unavailable: max_unavailable.into(),
        stages: stages.join(","),
        daemonset_complete_secs: t.ds_secs,
        succeeded_secs: t.sr_secs,
        soak_secs: OVERHEAD_SOAK_SECS * stages.len() as f64,
        operator: Some(operator),
        stage_requests,
        timed_secs: t.sr_secs.unwrap_or(t.ds_secs).max(t.ds_secs),
        cluster_cpu: t.cluster_cpu,
        labels_secs: None,
    })
}
