//! The gates that prove a release serves workloads, on the real control
//! plane: `probe` (probe pods the real scheduler places and the fixture runs
//! as their kubelet), `logs` (agent logs through the API server's `pods/log`,
//! served by KWOK from the fixture's files, on loopback) and `prometheus` (a
//! real Prometheus scraping the fixture's DCGM-style metrics on loopback).
//!
//! Each failure test measures the time from the fault (the bad agent
//! Ready on the canary) to the decision (the revert written to status) and
//! prints it as a `MEASURE` line.

mod support;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use saferollout_api::{
    GateStatus, PROBE_REVISION_LABEL, Phase, SafeRollout, SafeRolloutStatus, StageState,
};
use saferollout_testkit::{TestNamespace, cluster, wait_for_all};
use serde_json::json;
use support::{
    Identity, Operator, Prometheus, TIMEOUT, agent_template, condition, create_plugin_daemonset,
    create_rollout, free_loopback_port, http_get, image_of, pod_ready, poll, wait_adopted,
    wait_status,
};

const OPERATOR_SA: &str = "system:serviceaccount:saferollout-system:saferollout-operator";
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
const V1: &str = "registry.example/plugin:v1";

/// The DRA DeviceClass the fixture's drivers publish devices for.
const DEVICE_CLASS: &str = "gpu.sim.saferollout.dev";

struct Env {
    _serial: tokio::sync::MutexGuard<'static, ()>,
    ns: TestNamespace,
    client: Client,
    resource: String,
    metrics: u16,
    op: Operator,
    /// The agent is a DRA driver (else a device plugin).
    dra: bool,
}

impl Env {
    /// The agent's pod template with `image`.
    fn template(&self, image: &str) -> serde_json::Value {
        if self.dra {
            json!({
                "metadata": {"labels": {"app": "plugin", "sim.saferollout.dev/agent": "dra-driver"}},
                "spec": {"containers": [{"name": "driver", "image": image}]}
            })
        } else {
            agent_template(&self.resource, image)
        }
    }
}

/// A namespace, the plugin DaemonSet on v1 advertising the test's own
/// resource, and the operator (as its ServiceAccount) watching it.
async fn setup(name: &str) -> anyhow::Result<Env> {
    setup_agent(name, false, &[]).await
}

/// `setup`, the operator started with `args` too (e.g. the Prometheus
/// addresses it may dial).
async fn setup_agent(name: &str, dra: bool, args: &[String]) -> anyhow::Result<Env> {
    let serial = SERIAL.lock().await;
    let c = cluster();
    support::install(c)?;
    let ns = c.namespace(name).await?;
    let client = c.client().await?;
    let resource = format!("example.com/gpu-{name}");
    let metrics = free_loopback_port()?;
    let mut all = vec![
        "--namespace".to_string(),
        ns.name.clone(),
        "--metrics-addr".into(),
        format!("127.0.0.1:{metrics}"),
    ];
    all.extend_from_slice(args);
    let op = Operator::start(
        Identity::Impersonate(c.kubeconfig(), OPERATOR_SA),
        &all,
        &format!("proof-{}", ns.name),
    )?;
    let env = Env {
        _serial: serial,
        ns,
        client,
        resource,
        metrics,
        op,
        dra,
    };
    if dra {
        let ds: k8s_openapi::api::apps::v1::DaemonSet = serde_json::from_value(json!({
            "apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "plugin"},
            "spec": {"selector": {"matchLabels": {"app": "plugin"}}, "template": env.template(V1)}
        }))?;
        Api::<k8s_openapi::api::apps::v1::DaemonSet>::namespaced(env.client.clone(), &env.ns.name)
            .create(&Default::default(), &ds)
            .await?;
        support::wait_agents(&env.client, &env.ns.name, V1).await?;
    } else {
        create_plugin_daemonset(&env.client, &env.ns.name, &env.resource, V1).await?;
    }
    Ok(env)
}

fn srs(env: &Env) -> Api<SafeRollout> {
    Api::namespaced(env.client.clone(), &env.ns.name)
}

/// A rollout of `image` with the canary then every node, and `gates`.
fn spec(env: &Env, image: &str, gates: serde_json::Value) -> serde_json::Value {
    json!({
        "targetRef": {"name": "plugin"},
        "template": env.template(image),
        "stages": [{"nodes": 1}, {"nodes": "100%"}],
        "maxUnavailable": 1,
        "progressDeadline": "3m",
        "gates": gates,
    })
}

/// Rolls out `image` with `gates`, from the adopted v1.
/// The rollout `plugin` of the agent on V1 with no gate but podsReady, adopted.
async fn adopt_v1(env: &Env) -> anyhow::Result<()> {
    create_rollout(
        &env.client,
        &env.ns.name,
        "plugin",
        spec(env, V1, json!({})),
    )
    .await?;
    wait_adopted(&env.client, &env.ns.name, "plugin").await?;
    Ok(())
}

async fn roll(env: &Env, image: &str, gates: serde_json::Value) -> anyhow::Result<()> {
    let patch = json!({"spec": {"template": env.template(image), "gates": gates}});
    srs(env)
        .patch("plugin", &PatchParams::default(), &Patch::Merge(patch))
        .await?;
    Ok(())
}

/// The probe template the fixture runs as a workload (its kubelet): one
/// device of the test's resource, or (DRA) of the fixture's DeviceClass.
fn probe_gate(env: &Env, timeout: &str, sample: serde_json::Value) -> serde_json::Value {
    let mut gate = json!({
        "labels": {"sim.saferollout.dev/workload": "probe"},
        "image": "registry.example/cuda-vector-add:v1",
        "sample": sample,
        "delay": "2s",
        "timeout": timeout,
    });
    if env.dra {
        gate["deviceClassName"] = json!(DEVICE_CLASS);
    } else {
        gate["resource"] = json!(env.resource);
    }
    gate
}

/// The fixture's metrics port (`sim-metrics` in the state dir's `ports`).
fn sim_metrics_port() -> anyhow::Result<u16> {
    let dir = cluster()
        .kubeconfig()
        .parent()
        .ok_or_else(|| anyhow::anyhow!("kubeconfig without a directory"))?;
    let ports = std::fs::read_to_string(dir.join("ports"))?;
    ports
        .lines()
        .find_map(|l| l.strip_prefix("sim-metrics "))
        .and_then(|p| p.trim().parse().ok())
        .ok_or_else(|| anyhow::anyhow!("no sim-metrics port in {ports}"))
}

/// A real Prometheus scraping the fixture's per-GPU metrics (one static
/// loopback target).
async fn prometheus() -> anyhow::Result<Prometheus> {
    let port = sim_metrics_port()?;
    let prom = Prometheus::start(
        "proof",
        &format!(
            "scrape_configs:\n- job_name: sim-gpus\n  static_configs:\n  - targets: ['127.0.0.1:{port}']\n"
        ),
    )?;
    prom.wait_targets_up(1).await?;
    Ok(prom)
}

/// The operator's flag that lets it dial `prom`.
fn allow(prom: &Prometheus) -> Vec<String> {
    vec![format!(
        "--prometheus-address=http://127.0.0.1:{}",
        prom.port
    )]
}

/// What a watch of the rollout's probe pods saw: when each appeared, its
/// stage label, when it was deleted.
#[derive(Default, Debug)]
struct ProbeLog {
    seen: BTreeMap<String, (String, Instant, Option<Instant>)>,
}

fn watch_probes(env: &Env) -> (Arc<Mutex<ProbeLog>>, tokio::task::JoinHandle<()>) {
    let log = Arc::new(Mutex::new(ProbeLog::default()));
    let api: Api<Pod> = Api::namespaced(env.client.clone(), &env.ns.name);
    let l = log.clone();
    let task = tokio::spawn(async move {
        let mut stream = watcher(api, watcher::Config::default().labels(PROBE_REVISION_LABEL))
            .default_backoff()
            .boxed();
        while let Ok(Some(ev)) = stream.try_next().await {
            let now = Instant::now();
            let mut l = l.lock().unwrap();
            let (pod, gone) = match ev {
                watcher::Event::Apply(p) | watcher::Event::InitApply(p) => {
                    let gone = p.metadata.deletion_timestamp.is_some();
                    (p, gone)
                }
                watcher::Event::Delete(p) => (p, true),
                _ => continue,
            };
            let stage = pod
                .labels()
                .get(saferollout_api::STAGE_LABEL)
                .cloned()
                .unwrap_or_default();
            let entry = l.seen.entry(pod.name_any()).or_insert((stage, now, None));
            if gone && entry.2.is_none() {
                entry.2 = Some(now);
            }
        }
    });
    (log, task)
}

/// When status first showed each stage finished (Passed or Failed).
fn watch_stage_ends(
    env: &Env,
) -> (
    Arc<Mutex<BTreeMap<i32, Instant>>>,
    tokio::task::JoinHandle<()>,
) {
    let ends = Arc::new(Mutex::new(BTreeMap::new()));
    let e = ends.clone();
    let api = srs(env);
    let task = tokio::spawn(async move {
        let mut stream = watcher(api, watcher::Config::default())
            .default_backoff()
            .applied_objects()
            .boxed();
        while let Ok(Some(sr)) = stream.try_next().await {
            let now = Instant::now();
            for s in sr.status.iter().flat_map(|st| st.stages.iter()) {
                if matches!(s.state, StageState::Passed | StageState::Failed) {
                    e.lock().unwrap().entry(s.index).or_insert(now);
                }
            }
        }
    });
    (ends, task)
}

/// Waits for a Ready agent pod of `image` (the fault is live), then for the
/// revert decision; prints and returns the time between them.
async fn fault_to_decision(
    env: &Env,
    image: &str,
    gate: &str,
) -> anyhow::Result<SafeRolloutStatus> {
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), &env.ns.name);
    let img = image.to_string();
    wait_for_all(
        &pods,
        watcher::Config::default().labels("app=plugin"),
        TIMEOUT,
        move |ps| ps.iter().any(|p| image_of(p) == img && pod_ready(p)),
    )
    .await?;
    let fault = Instant::now();
    let st = wait_status(&env.client, &env.ns.name, "plugin", TIMEOUT, |st| {
        !st.blocked_revisions.is_empty()
    })
    .await?;
    let took = fault.elapsed();
    eprintln!(
        "MEASURE {gate} gate: fault (bad agent Ready on the canary) -> revert decision: {took:?}"
    );
    Ok(st)
}

fn failed_gate<'a>(st: &'a SafeRolloutStatus, gate: &str) -> &'a saferollout_api::GateResult {
    st.stages
        .iter()
        .flat_map(|s| s.gates.iter())
        .find(|g| g.gate == gate && g.status == GateStatus::Failed)
        .unwrap_or_else(|| panic!("no failed {gate} gate in {st:#?}"))
}

/// Waits until the rollout's probe pods are all gone.
async fn wait_no_probe_pods(env: &Env, within: Duration) -> anyhow::Result<()> {
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), &env.ns.name);
    wait_for_all(
        &pods,
        watcher::Config::default().labels(PROBE_REVISION_LABEL),
        within,
        |ps| ps.is_empty(),
    )
    .await?;
    Ok(())
}

/// Waits until `saferollout_gate_failures_total` of `gate` reaches `n` (the
/// operator counts after its status write, which a watch may see first).
async fn wait_gate_failures(env: &Env, gate: &str, n: f64) -> anyhow::Result<()> {
    let got = poll(
        &format!("{n} {gate} failures counted"),
        Duration::from_secs(10),
        || Ok(Some(gate_failures(env, gate)?).filter(|c| *c >= n)),
    )
    .await?;
    assert_eq!(got, n, "{gate} failures");
    Ok(())
}

/// `saferollout_gate_failures_total` of `gate` on the operator's /metrics.
fn gate_failures(env: &Env, gate: &str) -> anyhow::Result<f64> {
    let (code, body) = http_get(env.metrics, "/metrics")?;
    anyhow::ensure!(code == 200, "{code}");
    Ok(body
        .lines()
        .filter(|l| l.starts_with("saferollout_gate_failures_total{"))
        .filter(|l| {
            l.contains(&format!("gate=\"{gate}\""))
                && l.contains(&format!("namespace=\"{}\"", env.ns.name))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum())
}

/// `kubectl saferollout status -o json` (built beside the operator by tests/all).
fn status_json(env: &Env) -> anyhow::Result<serde_json::Value> {
    let (code, out, err) =
        support::kubectl_saferollout(&["-n", &env.ns.name, "status", "plugin", "-o", "json"])?;
    anyhow::ensure!(code == 0, "kubectl saferollout status exited {code}: {err}");
    Ok(serde_json::from_str(&out)?)
}

#[tokio::test]
async fn a_healthy_release_passes_probe_logs_and_prometheus_and_leaves_no_probe_pod()
-> anyhow::Result<()> {
    let prom = prometheus().await?;
    let env = setup_agent("healthy", false, &allow(&prom)).await?;
    adopt_v1(&env).await?;
    let (probes, probe_task) = watch_probes(&env);
    let (ends, ends_task) = watch_stage_ends(&env);

    let address = format!("http://127.0.0.1:{}", prom.port);
    let started = Instant::now();
    roll(
        &env,
        "registry.example/plugin:v2",
        json!({
            "probe": probe_gate(&env, "60s", json!(1)),
            "logs": {"window": "5s", "interval": "2s"},
            "prometheus": [
                {"name": "gpu-healthy", "address": address,
                 "query": "saferollout_sim_gpu_healthy{node=~\"$STAGE_NODES\"}",
                 "condition": "== 1", "interval": "2s", "count": 2},
                {"name": "no-data-passes", "address": address,
                 "query": "saferollout_sim_gpu_healthy{node=~\"$STAGE_NODES\", gpu=\"no-such-gpu\"}",
                 "condition": "== 1", "interval": "2s", "count": 1, "inconclusive": "Pass"},
            ],
        }),
    )
    .await?;
    let st = wait_status(
        &env.client,
        &env.ns.name,
        "plugin",
        Duration::from_secs(180),
        |st| {
            st.phase == Some(Phase::Succeeded)
                && st.stable_revision.as_deref() == st.target_revision.as_deref()
                && st.stages.len() == 2
        },
    )
    .await?;
    eprintln!(
        "MEASURE healthy rollout (2 stages, 4 nodes, probe + logs + 2 prometheus gates): {:?}",
        started.elapsed()
    );
    let succeeded_at = Instant::now();
    for s in &st.stages {
        for gate in [
            "podsReady",
            "probe",
            "logs",
            "prometheus/gpu-healthy",
            "prometheus/no-data-passes",
        ] {
            let g = s.gates.iter().find(|g| g.gate == gate);
            assert_eq!(
                g.map(|g| g.status),
                Some(GateStatus::Passed),
                "stage {} gate {gate}: {g:?}",
                s.index
            );
        }
    }
    let canary = &st.stages[0];
    assert_eq!(canary.probes.len(), 1, "{:?}", canary.probes);
    assert_eq!(
        st.stages[1].probes.len(),
        1,
        "a sample of 1 of the 3 later nodes"
    );
    assert!(
        st.stages
            .iter()
            .flat_map(|s| &s.probes)
            .all(|p| p.status == GateStatus::Passed)
    );
    let tally = st.stages[0]
        .gates
        .iter()
        .find(|g| g.gate == "prometheus/gpu-healthy")
        .and_then(|g| g.measurements.clone())
        .unwrap();
    assert!(tally.passed >= 2 && tally.failed == 0, "{tally:?}");

    // Probe pods never outlive their stage: each is gone within moments of
    // its stage's end, and none is left.
    wait_no_probe_pods(&env, Duration::from_secs(10)).await?;
    let seen = probes.lock().unwrap().seen.clone();
    let ends = ends.lock().unwrap().clone();
    assert_eq!(seen.len(), 2, "{seen:?}");
    for (name, (stage, _, deleted)) in &seen {
        let deleted = deleted.unwrap_or_else(|| panic!("probe pod {name} never deleted"));
        let end = ends
            .get(&stage.parse::<i32>()?)
            .copied()
            .unwrap_or(succeeded_at);
        assert!(
            deleted <= end + Duration::from_secs(3),
            "probe pod {name} of stage {stage} deleted {:?} after its stage ended",
            deleted - end
        );
    }
    probe_task.abort();
    ends_task.abort();

    // kubectl saferollout status -o json shows the gates and the probes.
    let report = status_json(&env)?;
    let gates: Vec<&str> = report["gates"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|g| g["gate"].as_str())
        .collect();
    for g in ["probe", "logs", "prometheus/gpu-healthy"] {
        assert!(gates.contains(&g), "{gates:?}");
    }
    assert_eq!(
        report["probes"].as_array().map(Vec::len),
        Some(2),
        "{report:#}"
    );
    assert_eq!(report["probes"][0]["status"], "Passed");
    drop(env.op);
    Ok(())
}

#[tokio::test]
async fn a_broken_plugin_is_caught_by_the_probe_alone() -> anyhow::Result<()> {
    let env = setup("probe").await?;
    adopt_v1(&env).await?;
    let broken = "registry.example/plugin:v2-broken";
    // No allocatable gate: only podsReady (which a Ready broken plugin passes) and the probe.
    roll(
        &env,
        broken,
        json!({"probe": probe_gate(&env, "10s", json!(1))}),
    )
    .await?;
    let st = fault_to_decision(&env, broken, "probe").await?;
    let g = failed_gate(&st, "probe");
    assert_eq!(g.reason, "Unschedulable", "{g:?}");
    let insufficient = format!("Insufficient {}", env.resource);
    assert!(g.message.contains(&insufficient), "{}", g.message);
    let degraded = condition(&st, "Degraded").unwrap();
    assert_eq!(degraded.reason, "ProbeFailed");
    assert!(
        degraded.message.contains(&insufficient),
        "{}",
        degraded.message
    );
    let st = wait_status(&env.client, &env.ns.name, "plugin", TIMEOUT, |st| {
        st.phase == Some(Phase::Degraded)
    })
    .await?;
    assert_eq!(st.stages[0].probes[0].status, GateStatus::Failed);
    wait_no_probe_pods(&env, Duration::from_secs(10)).await?;
    wait_gate_failures(&env, "probe", 1.0).await?;
    let report = status_json(&env)?;
    assert_eq!(report["probes"][0]["reason"], "Unschedulable", "{report:#}");
    Ok(())
}

#[tokio::test]
async fn a_fatal_log_line_is_reverted_by_the_logs_gate_alone_and_no_secret_leaks()
-> anyhow::Result<()> {
    let env = setup("logs").await?;
    adopt_v1(&env).await?;
    // The agents' logs carry a secret-looking value (the fixture's license token).
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), &env.ns.name);
    let any = pods
        .list(&ListParams::default().labels("app=plugin"))
        .await?
        .items;
    let log = pods.logs(&any[0].name_any(), &Default::default()).await?;
    assert!(log.contains("token=simtok-"), "{log}");
    // And credentials of other formats (the masking corpus's, end to end):
    // each agent's are its own, so the values are read from every agent's log.
    let mut planted: Vec<String> = Vec::new();
    for p in &any {
        let log = pods.logs(&p.name_any(), &Default::default()).await?;
        for word in log.split(|c: char| c.is_whitespace() || c == ',' || c == '@' || c == '/') {
            let word = word.trim_start_matches("token=");
            if ["simtok-", "ghp_", "nvapi-", "AKIA", "eyJ"]
                .iter()
                .any(|p| word.starts_with(p))
            {
                planted.push(word.to_string());
            }
        }
    }
    assert!(planted.len() >= 5 * any.len(), "{planted:?}");

    let fatal = "registry.example/plugin:v2-fatallog";
    roll(
        &env,
        fatal,
        json!({"logs": {"window": "30s", "interval": "2s"}}),
    )
    .await?;
    let st = fault_to_decision(&env, fatal, "logs").await?;
    let g = failed_gate(&st, "logs");
    assert_eq!(g.reason, "FatalLogLine", "{g:?}");
    assert!(
        g.message.contains("Failed to initialize NVML"),
        "{}",
        g.message
    );
    assert!(
        g.message.contains("builtin:NvidiaDevicePlugin"),
        "{}",
        g.message
    );
    assert_eq!(condition(&st, "Degraded").unwrap().reason, "LogsFailed");

    // A user pattern that matches the token line: the status shows it masked.
    let st = wait_status(&env.client, &env.ns.name, "plugin", TIMEOUT, |st| {
        st.phase == Some(Phase::Degraded)
    })
    .await?;
    assert!(st.stages[0].failed_nodes.len() == 1);
    roll(
        &env,
        "registry.example/plugin:v3",
        json!({"logs": {"builtin": [], "patterns": ["registry credentials"], "window": "30s", "interval": "2s"}}),
    )
    .await?;
    let st = wait_status(&env.client, &env.ns.name, "plugin", TIMEOUT, |st| {
        st.blocked_revisions.len() == 2
    })
    .await?;
    let g = failed_gate(&st, "logs");
    assert!(
        g.message.contains("registry credentials") && g.message.contains("***"),
        "{}",
        g.message
    );

    // No secret value anywhere in status, Events or the operator's log.
    let sr = srs(&env).get("plugin").await?;
    let status_text = serde_json::to_string(&sr.status)?;
    // The gate failures are Events (published after the status write).
    let events = support::wait_events(&env.client, &env.ns.name, "GateFailed").await?;
    let events_text = serde_json::to_string(&events)?;
    let log_text = env.op.log_text();
    for secret in planted.iter().map(String::as_str).chain(["simtok-"]) {
        assert!(
            !status_text.contains(secret),
            "{secret} in status: {status_text}"
        );
        assert!(
            !events_text.contains(secret),
            "{secret} in Events: {events_text}"
        );
        assert!(!log_text.contains(secret), "{secret} in the operator's log");
    }
    wait_gate_failures(&env, "logs", 2.0).await?;
    Ok(())
}

/// The logs gate reads each agent's log to the end, 1 MiB a read, each
/// read going on where the last stopped: an agent that prints more than
/// 2 MiB of routine lines and then a fatal line (inside the window) fails
/// the gate naming that line. (Before, the gate read the first 1 MiB only
/// and passed.)
#[tokio::test]
async fn a_fatal_line_after_2_mib_of_noise_fails_the_logs_gate() -> anyhow::Result<()> {
    let env = setup("noisylog").await?;
    adopt_v1(&env).await?;
    let noisy = "registry.example/plugin:v2-noisyfatal";
    roll(
        &env,
        noisy,
        json!({"logs": {"window": "60s", "interval": "2s"}}),
    )
    .await?;
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), &env.ns.name);
    let img = noisy.to_string();
    let ready = wait_for_all(
        &pods,
        watcher::Config::default().labels("app=plugin"),
        TIMEOUT,
        move |ps| ps.iter().any(|p| image_of(p) == img && pod_ready(p)),
    )
    .await?;
    let fault = Instant::now();
    let canary = ready
        .iter()
        .find(|p| image_of(p) == noisy)
        .expect("the noisy agent")
        .name_any();
    // Through the API server, as the operator reads it: the fatal line lies
    // past 2 MiB of the log (the fixture writes the log beside the pod's
    // status, so it is polled for, with a deadline).
    let deadline = Instant::now() + Duration::from_secs(30);
    let offset = loop {
        let log = pods.logs(&canary, &Default::default()).await?;
        if let Some(offset) = log.find("Failed to initialize NVML") {
            break offset;
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "no fatal line in the log of {canary}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(offset > 2 << 20, "the fatal line is at byte {offset}");
    let st = wait_status(&env.client, &env.ns.name, "plugin", TIMEOUT, |st| {
        !st.blocked_revisions.is_empty()
    })
    .await?;
    eprintln!(
        "MEASURE logs gate, fatal line at byte {offset}: fault (bad agent Ready on the canary) -> revert decision: {:?}",
        fault.elapsed()
    );
    let g = failed_gate(&st, "logs");
    assert_eq!(g.reason, "FatalLogLine", "{g:?}");
    assert!(
        g.message.contains("Failed to initialize NVML") && g.message.contains(&canary),
        "{}",
        g.message
    );
    assert_eq!(
        g.node.as_deref(),
        st.stages[0].nodes.first().map(String::as_str)
    );
    assert_eq!(condition(&st, "Degraded").unwrap().reason, "LogsFailed");
    wait_gate_failures(&env, "logs", 1.0).await?;
    Ok(())
}

#[tokio::test]
async fn the_prometheus_gate_fails_and_reverts_and_treats_no_data_as_configured()
-> anyhow::Result<()> {
    let prom = prometheus().await?;
    let env = setup_agent("prom", false, &allow(&prom)).await?;
    adopt_v1(&env).await?;
    let address = format!("http://127.0.0.1:{}", prom.port);
    let broken = "registry.example/plugin:v2-broken";
    roll(
        &env,
        broken,
        json!({"prometheus": [{"name": "gpu-healthy", "address": address,
            "query": "saferollout_sim_gpu_healthy{node=~\"$STAGE_NODES\"}",
            "condition": "== 1", "interval": "2s", "count": 3}]}),
    )
    .await?;
    let st = fault_to_decision(&env, broken, "prometheus").await?;
    let g = failed_gate(&st, "prometheus/gpu-healthy");
    assert_eq!(g.reason, "ConditionNotMet", "{g:?}");
    assert_eq!(g.observed.as_deref(), Some("0"));
    assert_eq!(g.expected.as_deref(), Some("== 1"));
    assert_eq!(
        g.node.as_ref(),
        st.stages[0].nodes.first(),
        "the canary is named"
    );
    wait_status(&env.client, &env.ns.name, "plugin", TIMEOUT, |st| {
        st.phase == Some(Phase::Degraded)
    })
    .await?;

    // No data, with the default policy (inconclusive: Fail): reverted.
    roll(
        &env,
        "registry.example/plugin:v3",
        json!({"prometheus": [{"name": "gpu-healthy", "address": address,
            "query": "saferollout_sim_gpu_healthy{node=~\"$STAGE_NODES\", gpu=\"no-such-gpu\"}",
            "condition": "== 1", "interval": "2s", "count": 2}]}),
    )
    .await?;
    let st = wait_status(&env.client, &env.ns.name, "plugin", TIMEOUT, |st| {
        st.blocked_revisions.len() == 2
    })
    .await?;
    let g = failed_gate(&st, "prometheus/gpu-healthy");
    assert_eq!(g.reason, "Inconclusive", "{g:?}");
    assert!(g.message.contains("no data"), "{}", g.message);
    wait_gate_failures(&env, "prometheus/gpu-healthy", 2.0).await?;
    Ok(())
}

#[tokio::test]
async fn dra_probes_claim_a_device_pass_on_a_healthy_driver_and_fail_on_a_broken_one()
-> anyhow::Result<()> {
    let env = setup_agent("dra", true, &[]).await?;
    adopt_v1(&env).await?;
    roll(
        &env,
        "registry.example/plugin:v2",
        json!({"probe": probe_gate(&env, "20s", json!(1))}),
    )
    .await?;
    let st = wait_status(&env.client, &env.ns.name, "plugin", TIMEOUT, |st| {
        st.phase == Some(Phase::Succeeded) && st.stages.len() == 2
    })
    .await?;
    let probes: Vec<_> = st.stages.iter().flat_map(|s| &s.probes).collect();
    assert_eq!(probes.len(), 2, "{probes:?}");
    assert!(
        probes.iter().all(|p| p.status == GateStatus::Passed),
        "{probes:?}"
    );
    wait_no_probe_pods(&env, Duration::from_secs(10)).await?;

    let broken = "registry.example/plugin:v3-broken";
    roll(
        &env,
        broken,
        json!({"probe": probe_gate(&env, "10s", json!(1))}),
    )
    .await?;
    let st = fault_to_decision(&env, broken, "probe (DRA)").await?;
    let g = failed_gate(&st, "probe");
    // The broken driver withdraws its devices: the scheduler cannot allocate
    // the claim, or (when it allocated from the slice an instant before it
    // went) the kubelet finds the device gone and the probe fails.
    match g.reason.as_str() {
        "Unschedulable" => assert!(
            g.message.contains("cannot allocate all claims"),
            "{}",
            g.message
        ),
        "ProbeFailed" => assert!(
            g.message.contains("exit code 1") && g.message.contains("Test FAILED"),
            "{}",
            g.message
        ),
        other => panic!("unexpected reason {other}: {g:?}"),
    }
    wait_no_probe_pods(&env, Duration::from_secs(10)).await?;
    Ok(())
}

/// A CA and a server certificate for 127.0.0.1 (openssl), in `dir`.
fn loopback_certificates(dir: &std::path::Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir)?;
    let sh = |script: &str| {
        support::run(
            std::process::Command::new("sh")
                .arg("-ec")
                .arg(script)
                .current_dir(dir),
        )
    };
    sh(
        "openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 1 -subj /CN=proof-ca 2>/dev/null",
    )?;
    sh(
        "openssl req -newkey rsa:2048 -nodes -keyout server.key -out server.csr -subj /CN=127.0.0.1 2>/dev/null",
    )?;
    std::fs::write(dir.join("san.ext"), "subjectAltName=IP:127.0.0.1\n")?;
    sh(
        "openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 1 -extfile san.ext -out server.crt 2>/dev/null",
    )?;
    Ok(())
}

#[tokio::test]
async fn prometheus_over_tls_reads_its_ca_and_token_from_secrets_only_when_allowed()
-> anyhow::Result<()> {
    let dir = std::env::temp_dir().join(format!("saferollout-proof-tls-{}", std::process::id()));
    loopback_certificates(&dir)?;
    std::fs::write(
        dir.join("web.yml"),
        format!(
            "tls_server_config:\n  cert_file: {}\n  key_file: {}\n",
            dir.join("server.crt").display(),
            dir.join("server.key").display()
        ),
    )?;
    let sim = sim_metrics_port()?;
    let prom = Prometheus::start_with_args(
        "proof-tls",
        &format!(
            "scrape_configs:\n- job_name: sim-gpus\n  static_configs:\n  - targets: ['127.0.0.1:{sim}']\n"
        ),
        &[format!(
            "--web.config.file={}",
            dir.join("web.yml").display()
        )],
    )?;
    let address = format!("https://127.0.0.1:{}", prom.port);
    // Ready once it has scraped the fixture: asked over TLS with the
    // operator's own client, trusting only the test's CA.
    let ca = std::fs::read(dir.join("ca.crt"))?;
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let outcome = saferollout_operator::controller::proof::query_with(
            &address,
            "count(saferollout_sim_gpu_healthy)",
            Duration::from_secs(2),
            None,
            Some(&ca),
        )
        .await;
        if matches!(&outcome, saferollout_core::gates::proof::MeasurementOutcome::Samples(s) if !s.is_empty())
        {
            break;
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "Prometheus over TLS: {outcome:?}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    // The operator may dial it, and send prom-auth there (and nowhere else).
    let env = setup_agent(
        "tls",
        false,
        &[
            format!("--prometheus-address={address}"),
            format!("--prometheus-secret=prom-auth={address}"),
        ],
    )
    .await?;
    let token = "prom-token-do-not-leak-4711";
    let c = cluster();
    c.kubectl(&[
        "-n",
        &env.ns.name,
        "create",
        "secret",
        "generic",
        "prom-auth",
        &format!("--from-file=ca.crt={}", dir.join("ca.crt").display()),
        &format!("--from-literal=token={token}"),
    ])?;
    adopt_v1(&env).await?;
    let gates = json!({"prometheus": [{"name": "gpu-healthy", "address": address,
        "query": "saferollout_sim_gpu_healthy{node=~\"$STAGE_NODES\"}",
        "condition": "== 1", "interval": "2s", "count": 2,
        "tls": {"caSecret": {"name": "prom-auth", "key": "ca.crt"}},
        "bearerTokenSecret": {"name": "prom-auth", "key": "token"}}]});

    // The default RBAC reads no Secret: the measurement is inconclusive
    // (inconclusive: Fail) and says why.
    roll(&env, "registry.example/plugin:v2", gates.clone()).await?;
    let st = wait_status(&env.client, &env.ns.name, "plugin", TIMEOUT, |st| {
        !st.blocked_revisions.is_empty()
    })
    .await?;
    let g = failed_gate(&st, "prometheus/gpu-healthy");
    assert_eq!(g.reason, "Inconclusive", "{g:?}");
    assert!(
        g.message.contains("cannot read Secret \"prom-auth\"") && g.message.contains("403"),
        "{}",
        g.message
    );

    // The chart's value grants `get` on that one Secret (a Role in the
    // watched namespace): the same gate passes over TLS.
    let rendered = support::render_chart(
        "rbac.yaml",
        &[
            format!("watchNamespaces={{{}}}", env.ns.name),
            "prometheusGate.secrets[0].name=prom-auth".into(),
            format!("prometheusGate.secrets[0].addresses={{{address}}}"),
        ],
    )?;
    let roles: Vec<&str> = rendered
        .split("\n---")
        .filter(|d| {
            d.contains(&format!("namespace: {}", env.ns.name))
                && (d.contains("kind: Role\n") || d.contains("kind: RoleBinding\n"))
        })
        .collect();
    assert_eq!(roles.len(), 2, "{rendered}");
    assert!(
        roles
            .iter()
            .any(|r| r.contains("resources: [secrets], verbs: [get], resourceNames: [prom-auth]")),
        "{rendered}"
    );
    let file = dir.join("roles.yaml");
    std::fs::write(&file, roles.join("\n---\n"))?;
    c.kubectl(&["apply", "-f", &file.to_string_lossy()])?;
    roll(&env, "registry.example/plugin:v3", gates).await?;
    let st = wait_status(&env.client, &env.ns.name, "plugin", TIMEOUT, |st| {
        st.phase == Some(Phase::Succeeded)
            && st.target_revision == st.stable_revision
            && st.stages.len() == 2
    })
    .await?;
    let g = st.stages[0]
        .gates
        .iter()
        .find(|g| g.gate == "prometheus/gpu-healthy")
        .unwrap();
    assert_eq!(g.status, GateStatus::Passed, "{g:?}");

    // The token appears nowhere the operator writes.
    let sr = srs(&env).get("plugin").await?;
    assert!(!serde_json::to_string(&sr.status)?.contains(token));
    let events: Api<k8s_openapi::api::events::v1::Event> =
        Api::namespaced(env.client.clone(), &env.ns.name);
    assert!(
        !serde_json::to_string(&events.list(&Default::default()).await?.items)?.contains(token)
    );
    assert!(
        !env.op.log_text().contains(token),
        "the token in the operator's log"
    );
    drop(prom);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// A Prometheus stand-in on 127.0.0.1: each query's connection goes to
/// `answer` once its request is read. Returns (port, queries received).
async fn stand_in<F, Fut>(answer: F) -> anyhow::Result<(u16, Arc<AtomicUsize>)>
where
    F: Fn(tokio::net::TcpStream) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let port = listener.local_addr()?.port();
    let queries = Arc::new(AtomicUsize::new(0));
    let q = queries.clone();
    let answer = Arc::new(answer);
    tokio::spawn(async move {
        while let Ok((mut tcp, _)) = listener.accept().await {
            let (q, answer) = (q.clone(), answer.clone());
            tokio::spawn(async move {
                if read_request(&mut tcp).await.is_some() {
                    q.fetch_add(1, Ordering::SeqCst);
                    answer(tcp).await;
                }
            });
        }
    });
    Ok((port, queries))
}

/// A stand-in that answers every query with an endless instant vector (up
/// to 1 GiB per answer, while the client reads): (port, queries, bytes
/// written).
async fn endless_prometheus() -> anyhow::Result<(u16, Arc<AtomicUsize>, Arc<AtomicUsize>)> {
    let written = Arc::new(AtomicUsize::new(0));
    let w = written.clone();
    let (port, queries) = stand_in(move |mut tcp| {
        let w = w.clone();
        async move {
            let head = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\r\n{\"status\":\"success\",\"data\":{\"resultType\":\"vector\",\"result\":[";
            if tcp.write_all(head.as_bytes()).await.is_err() {
                return;
            }
            let chunk = br#"{"metric":{"node":"sim-gpu-0"},"value":[1,"1"]},"#.repeat(2048);
            let mut sent = 0usize;
            while sent < 1 << 30 {
                if tcp.write_all(&chunk).await.is_err() {
                    return;
                }
                sent += chunk.len();
                w.fetch_add(chunk.len(), Ordering::SeqCst);
            }
        }
    })
    .await?;
    Ok((port, queries, written))
}

/// A stand-in that accepts queries and never answers: (port, queries
/// received, queries waiting now).
async fn silent_prometheus() -> anyhow::Result<(u16, Arc<AtomicUsize>, Arc<AtomicUsize>)> {
    let waiting = Arc::new(AtomicUsize::new(0));
    let w = waiting.clone();
    let (port, queries) = stand_in(move |mut tcp| {
        let w = w.clone();
        async move {
            w.fetch_add(1, Ordering::SeqCst);
            // Holds the connection open, silent, until the client goes.
            let mut rest = [0u8; 1];
            let _ = tcp.read(&mut rest).await;
            w.fetch_sub(1, Ordering::SeqCst);
        }
    })
    .await?;
    Ok((port, queries, waiting))
}

/// Reads one HTTP request's head (the body is a small form): `None` when the
/// connection closed first.
async fn read_request(tcp: &mut tokio::net::TcpStream) -> Option<String> {
    let mut buf = Vec::new();
    let mut byte = [0u8; 1];
    while !buf.ends_with(b"\r\n\r\n") {
        if tcp.read(&mut byte).await.ok()? == 0 {
            return None;
        }
        buf.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&buf).into_owned();
    let len = head
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("content-length:")
                .map(|v| v.trim().parse::<usize>().unwrap_or(0))
        })
        .unwrap_or(0);
    let mut body = vec![0u8; len];
    tcp.read_exact(&mut body).await.ok()?;
    Some(head)
}

#[tokio::test]
async fn a_hostile_prometheus_is_inconclusive_bounded_and_never_delays_a_revert()
-> anyhow::Result<()> {
    let (endless_port, endless_queries, written) = endless_prometheus().await?;
    let (silent_port, silent_queries, silent_waiting) = silent_prometheus().await?;
    let endless = format!("http://127.0.0.1:{endless_port}");
    let silent = format!("http://127.0.0.1:{silent_port}");
    let env = setup_agent(
        "hostile",
        false,
        &[
            format!("--prometheus-address={endless}"),
            format!("--prometheus-address={silent}"),
        ],
    )
    .await?;
    adopt_v1(&env).await?;

    // A healthy release whose two prometheus gates read the hostile servers,
    // with the longest timeout a gate may have; inconclusive: Pause holds
    // the canary meanwhile.
    let gate = |name: &str, address: &str| {
        json!({"name": name, "address": address, "query": "up{node=~\"$STAGE_NODES\"}",
            "condition": "== 1", "interval": "2s", "count": 1, "timeout": "30s",
            "inconclusive": "Pause"})
    };
    let gates = json!({"prometheus": [gate("endless", &endless), gate("silent", &silent)]});
    roll(&env, "registry.example/plugin:v2", gates.clone()).await?;
    let reason_of = |st: &SafeRolloutStatus, gate: &str| {
        st.stages
            .first()
            .and_then(|s| s.gates.iter().find(|g| g.gate == gate))
            .map(|g| (g.status, g.reason.clone(), g.message.clone()))
    };
    let st = wait_status(
        &env.client,
        &env.ns.name,
        "plugin",
        Duration::from_secs(120),
        |st| {
            ["prometheus/endless", "prometheus/silent"]
                .iter()
                .all(|g| reason_of(st, g).is_some_and(|(_, r, _)| r == "Inconclusive"))
        },
    )
    .await?;
    for (gate, says) in [
        ("prometheus/endless", "exceeds 4 MiB"),
        ("prometheus/silent", "timed out after 30s"),
    ] {
        let (status, _, message) = reason_of(&st, gate).unwrap();
        assert_eq!(status, GateStatus::Pending, "{gate}: Pause holds the stage");
        assert!(message.contains(says), "{gate}: {message}");
    }
    let sent = written.load(Ordering::SeqCst);
    let answers = endless_queries.load(Ordering::SeqCst);
    eprintln!(
        "MEASURE endless Prometheus: {answers} answer(s) cut after {} MiB written in all",
        sent >> 20
    );
    assert!(
        answers >= 1 && sent < answers * (64 << 20),
        "{sent} bytes for {answers} answers"
    );
    assert!(silent_queries.load(Ordering::SeqCst) >= 1);

    // A crash-looping release while a silent query is in flight: podsReady
    // fails and the revert does not wait for the query (its timeout is 30 s).
    poll("a silent query in flight", Duration::from_secs(40), || {
        Ok((silent_waiting.load(Ordering::SeqCst) > 0).then_some(()))
    })
    .await?;
    let crashloop = "registry.example/plugin:v3-crashloop";
    roll(&env, crashloop, gates).await?;
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), &env.ns.name);
    wait_for_all(
        &pods,
        watcher::Config::default().labels("app=plugin"),
        TIMEOUT,
        move |ps| {
            ps.iter().any(|p| {
                image_of(p) == crashloop
                    && p.status
                        .iter()
                        .flat_map(|s| s.container_statuses.iter().flatten())
                        .any(|c| {
                            c.state
                                .as_ref()
                                .and_then(|s| s.waiting.as_ref())
                                .and_then(|w| w.reason.as_deref())
                                == Some("CrashLoopBackOff")
                        })
            })
        },
    )
    .await?;
    let fault = Instant::now();
    let st = wait_status(&env.client, &env.ns.name, "plugin", TIMEOUT, |st| {
        st.blocked_revisions
            .iter()
            .any(|b| b.reason == "CrashLoopBackOff")
    })
    .await?;
    let took = fault.elapsed();
    eprintln!(
        "MEASURE CrashLoopBackOff -> revert decision with a silent Prometheus query in flight: {took:?}"
    );
    assert!(
        took < Duration::from_secs(10),
        "the revert waited: {took:?}"
    );
    assert_eq!(
        condition(&st, "Degraded").unwrap().reason,
        "PodsReadyFailed"
    );

    // The operator's memory stayed bounded through all of it.
    let peak = env.op.peak_rss_kib()?;
    eprintln!(
        "MEASURE operator peak RSS with a 1 GiB and a silent Prometheus: {} MiB",
        peak >> 10
    );
    assert!(peak < 128 << 10, "peak RSS {peak} KiB");
    Ok(())
}
