//! Fail-safe under faults (issue 35), on the real control plane: the operator
//! reaches the API server only through the fault proxy
//! ([`support::faults::FaultProxy`]: Toxiproxy, then faultproxy), which
//! answers a fifth of its requests with 429 (Retry-After) or 500 and delays
//! every answer by 0-2 s, from the operator's start (its initial lists and
//! the adoption included) to the end of the rollout.
//!
//! The test's own client talks to the API server directly, so what it
//! observes is never faulted. As in engine.rs, the disruption budget is
//! checked by sampling: a watch on the agent pods records, at every event,
//! which nodes have no live Ready agent; the same watch counts each node's
//! agent pod creations.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::ControllerRevision;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use saferollout_api::{Phase, SafeRollout, SafeRolloutStatus};
use saferollout_testkit::{TestNamespace, cluster};
use serde_json::json;
use support::faults::{FaultProxy, FaultStats};
use support::{
    GPUS, Identity, Operator, condition, create_plugin_daemonset, create_rollout, default_spec,
    free_loopback_port, is_leader, poll, sample_pods, set_template_image, wait_adopted,
    wait_agents, wait_status,
};

const OPERATOR_SA: &str = "system:serviceaccount:saferollout-system:saferollout-operator";
/// The rollouts share the cluster's nodes: one at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
/// A rollout through the faults: three stages of 2 s soaks, each request a
/// fifth likely to be refused and answered up to 2 s late.
const ROLLOUT_TIMEOUT: Duration = Duration::from_secs(300);

struct Env {
    _serial: tokio::sync::MutexGuard<'static, ()>,
    ns: TestNamespace,
    client: Client,
    resource: String,
    proxy: FaultProxy,
}

async fn setup(name: &str) -> anyhow::Result<Env> {
    let serial = SERIAL.lock().await;
    let c = cluster();
    support::install(c)?;
    let ns = c.namespace(name).await?;
    let proxy = FaultProxy::start(&ns.name, c.kubeconfig()).await?;
    let env = Env {
        _serial: serial,
        ns,
        client: c.client().await?,
        resource: format!("example.com/gpu-{name}"),
        proxy,
    };
    check_the_chain(&env).await?;
    Ok(env)
}

/// A client as the operator makes it, through the proxy, as the operator's
/// ServiceAccount.
async fn client_through_the_proxy(env: &Env) -> anyhow::Result<Client> {
    let kubeconfig = Kubeconfig::read_from(&env.proxy.kubeconfig)?;
    let mut config =
        kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?;
    config.auth_info.impersonate = Some(OPERATOR_SA.into());
    Ok(saferollout_operator::client::from_config(config)?)
}

/// Before any fault is set: through the proxy, the operator's client acts as
/// its ServiceAccount (what its RBAC grants works, a Secret it may not read
/// is refused) and a watch streams each event as it happens.
async fn check_the_chain(env: &Env) -> anyhow::Result<()> {
    let through = client_through_the_proxy(env).await?;
    Api::<SafeRollout>::namespaced(through.clone(), &env.ns.name)
        .list(&Default::default())
        .await?;
    match Api::<Secret>::namespaced(through.clone(), &env.ns.name)
        .list(&Default::default())
        .await
    {
        Err(kube::Error::Api(s)) if s.code == 403 => {}
        other => anyhow::bail!(
            "through the proxy, the operator's ServiceAccount listed Secrets (RBAC not applied?): {other:?}"
        ),
    }
    let mut events = watcher(
        Api::<ControllerRevision>::namespaced(through, &env.ns.name),
        watcher::Config::default().fields("metadata.name=chain-check"),
    )
    .boxed();
    // The watch (of an object the ServiceAccount may watch) is open once its
    // initial list (empty) is done.
    let within = Duration::from_secs(10);
    initial_list_within(&mut events, within).await?;
    // Created after, directly, it must come through as it happens: within
    // seconds, not when a buffer fills or the watch ends.
    let cr: ControllerRevision = serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "ControllerRevision",
        "metadata": {"name": "chain-check"}, "revision": 1, "data": {}
    }))?;
    let revisions = Api::<ControllerRevision>::namespaced(env.client.clone(), &env.ns.name);
    revisions.create(&PostParams::default(), &cr).await?;
    let seen = tokio::time::timeout(within, events.try_next())
        .await
        .map_err(|_| {
            anyhow::anyhow!("the watch through the proxy delivered nothing in {within:?}")
        })??;
    anyhow::ensure!(
        matches!(&seen, Some(watcher::Event::Apply(cr)) if cr.name_any() == "chain-check"),
        "the watch through the proxy did not deliver the ControllerRevision: {seen:?}"
    );
    // Nothing of the check stays beside the rollout's own revisions.
    revisions.delete("chain-check", &Default::default()).await?;
    Ok(())
}

/// Waits for a watch's initial list to end (the watch is then open).
async fn initial_list_within<S>(events: &mut S, within: Duration) -> anyhow::Result<()>
where
    S: futures::Stream<Item = Result<watcher::Event<ControllerRevision>, watcher::Error>> + Unpin,
{
    tokio::time::timeout(within, async {
        while !matches!(events.try_next().await?, Some(watcher::Event::InitDone)) {}
        anyhow::Ok(())
    })
    .await
    .map_err(|_| anyhow::anyhow!("no initial list through the proxy in {within:?}"))?
}

/// The operator as its ServiceAccount, watching the test's namespace,
/// reaching the API server through the proxy only.
fn operator(env: &Env) -> anyhow::Result<Operator> {
    operator_through(&env.proxy, &env.ns.name, 0, "faults")
}

/// An operator watching `ns` through `proxy` as its ServiceAccount, serving
/// metrics on loopback `port` (0: any), logging to a file named after `what`.
fn operator_through(
    proxy: &FaultProxy,
    ns: &str,
    port: u16,
    what: &str,
) -> anyhow::Result<Operator> {
    let args: Vec<String> = [
        "--namespace",
        ns,
        "--metrics-addr",
        &format!("127.0.0.1:{port}"),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    Operator::start(
        Identity::Impersonate(&proxy.kubeconfig, OPERATOR_SA),
        &args,
        &format!("{what}-{ns}"),
    )
}

/// A fifth of every request (any verb, any resource) answered 429 or 500;
/// every answer, the errors' too, delayed 0-2 s. And, so that the requests
/// whose refusal once stopped the operator are always refused rather than by
/// chance: its first read (or create) of its leader lease, and its first two
/// dry runs of spec.template on the DaemonSet (before and after it takes
/// over updates: the dry run tells whether the DaemonSet carries
/// spec.template already) are answered 500.
fn degrade(proxy: &FaultProxy) -> anyhow::Result<()> {
    proxy.burst(1, &[500], &["get", "create"], &["leases"])?;
    proxy.error_rule(json!({
        "codes": [500], "fraction": 1.0, "count": 2,
        "verbs": ["patch"], "resources": ["daemonsets"], "dryRun": true,
    }))?;
    proxy.errors(0.2, &[429, 500], &[], &[])?;
    proxy.set_latency(1000, 1000)
}

fn four_nodes() -> Vec<String> {
    (0..4).map(|i| format!("sim-gpu-{i}")).collect()
}

/// The plugin on `v1` with its rollout (1 node, 50 %, 100 %; maxUnavailable
/// 1; allocatable pinned to the baseline) adopted by an operator that
/// reaches the API server through the faults.
async fn adopted_through_faults(
    env: &Env,
    v1: &str,
) -> anyhow::Result<(Operator, SafeRolloutStatus)> {
    create_plugin_daemonset(&env.client, &env.ns.name, &env.resource, v1).await?;
    degrade(&env.proxy)?;
    let mut op = operator(env)?;
    let mut spec = default_spec(&env.resource, v1);
    spec["maxUnavailable"] = json!(1);
    create_rollout(&env.client, &env.ns.name, "plugin", spec).await?;
    match wait_adopted(&env.client, &env.ns.name, "plugin").await {
        Ok(adopted) => Ok((op, adopted)),
        // Say why when the faults took the operator down.
        Err(e) if !op.is_running() => Err(e.context(format!(
            "the operator exited under the faults; its log ends with: {}",
            op.log_text()
                .lines()
                .rev()
                .find(|l| l.starts_with("Error"))
                .unwrap_or("(no error line)")
        ))),
        Err(e) => Err(e),
    }
}

/// Each node's agent pod creations seen, by image.
fn creations(samples: &support::Samples) -> BTreeMap<String, BTreeMap<String, usize>> {
    let mut per_node: BTreeMap<String, BTreeMap<String, usize>> = BTreeMap::new();
    for ((node, image), n) in &samples.created {
        per_node
            .entry(node.clone())
            .or_default()
            .insert(image.clone(), *n);
    }
    per_node
}

fn report(what: &str, elapsed: Duration, stats: &FaultStats) {
    eprintln!(
        "MEASURE {what}: {:.1} s; requests through the proxy {} {:?}; injected {} {:?}, by verb and resource {:?}",
        elapsed.as_secs_f64(),
        stats.requests_total(),
        stats.requests,
        stats.injected_total(),
        stats.injected,
        stats.injected_by,
    );
}

/// The faults were real: both codes answered, to writes as well as reads.
fn assert_faults_injected(stats: &FaultStats) {
    assert!(
        stats.injected_code(429) > 0 && stats.injected_code(500) > 0,
        "no 429 or no 500 injected: {stats:?}"
    );
    let writes: u64 = stats
        .injected_by
        .iter()
        .filter(|(k, _)| {
            ["create ", "patch ", "update ", "delete "]
                .iter()
                .any(|v| k.starts_with(v))
                && !k.ends_with("(dry run)")
        })
        .map(|(_, n)| n)
        .sum();
    assert!(writes > 0, "no write was refused: {stats:?}");
}

#[tokio::test]
async fn a_rollout_through_errors_and_latency_succeeds_within_the_budget() -> anyhow::Result<()> {
    let env = setup("faultsok").await?;
    let (v1, v2) = ("registry.example/plugin:v1", "registry.example/plugin:v2");
    let (_op, adopted) = adopted_through_faults(&env, v1).await?;

    let (samples, task) = sample_pods(&env.client, &env.ns.name, four_nodes());
    let start = Instant::now();
    set_template_image(&env.client, &env.ns.name, "plugin", &env.resource, v2).await?;
    let st = wait_status(&env.client, &env.ns.name, "plugin", ROLLOUT_TIMEOUT, |st| {
        st.phase == Some(Phase::Succeeded) && st.stable_revision != adopted.stable_revision
    })
    .await?;
    let elapsed = start.elapsed();
    wait_agents(&env.client, &env.ns.name, v2).await?;
    task.abort();
    let stats = env.proxy.stats()?;
    // The operator's lease is given up on its way out: let that through.
    env.proxy.clear()?;
    report("rollout through the faults", elapsed, &stats);

    assert!(
        condition(&st, "Ready").is_some_and(|c| c.status == "True"),
        "{st:#?}"
    );
    assert!(st.blocked_revisions.is_empty(), "{st:#?}");
    let samples = samples.lock().unwrap();
    let (most, when) = samples.max_unavailable(&BTreeSet::new());
    eprintln!(
        "MEASURE most agents unavailable at once through the faults: {most} {when:?}; creations per node {:?}",
        creations(&samples)
    );
    assert!(most <= 1, "maxUnavailable 1 broken: {when:?} at once");
    // Each node's agent replaced exactly once, and never put back.
    samples.assert_each_node_got_one(v2, 4);
    assert!(
        samples.created.keys().all(|(_, image)| image == v2),
        "a pod of another image was created: {:?}",
        samples.created
    );
    assert_faults_injected(&stats);
    Ok(())
}

#[tokio::test]
async fn a_broken_release_through_errors_and_latency_is_reverted_within_the_budget()
-> anyhow::Result<()> {
    let env = setup("faultsbroken").await?;
    let (v1, broken) = (
        "registry.example/plugin:v1",
        "registry.example/plugin:v2-broken",
    );
    let (_op, _) = adopted_through_faults(&env, v1).await?;

    let (samples, task) = sample_pods(&env.client, &env.ns.name, four_nodes());
    let start = Instant::now();
    set_template_image(&env.client, &env.ns.name, "plugin", &env.resource, broken).await?;
    let st = wait_status(&env.client, &env.ns.name, "plugin", ROLLOUT_TIMEOUT, |st| {
        st.phase == Some(Phase::Degraded)
    })
    .await?;
    // The revert brings the canary back on v1 and its GPUs with it.
    wait_agents(&env.client, &env.ns.name, v1).await?;
    let elapsed = start.elapsed();
    let res = env.resource.clone();
    saferollout_testkit::wait_for_all(
        &Api::<k8s_openapi::api::core::v1::Node>::all(env.client.clone()),
        watcher::Config::default(),
        support::TIMEOUT,
        move |ns| {
            ns.iter()
                .all(|n| support::allocatable(n, &res) == Some(GPUS))
        },
    )
    .await?;
    task.abort();
    let stats = env.proxy.stats()?;
    env.proxy.clear()?;
    report(
        "broken release reverted through the faults",
        elapsed,
        &stats,
    );

    let degraded = condition(&st, "Degraded").expect("a Degraded condition");
    assert_eq!(degraded.reason, "AllocatableFailed", "{st:#?}");
    assert!(
        degraded.message.contains("is 0, expected >= 8"),
        "{}",
        degraded.message
    );
    assert_eq!(st.blocked_revisions.len(), 1, "{st:#?}");
    let failed: BTreeSet<String> = st
        .stages
        .iter()
        .flat_map(|s| s.failed_nodes.iter().cloned())
        .collect();
    let samples = samples.lock().unwrap();
    let per_node = creations(&samples);
    let (most, when) = samples.max_unavailable(&failed);
    eprintln!(
        "MEASURE most agents unavailable at once through the faults (failed nodes {failed:?} aside): {most} {when:?}; creations per node {per_node:?}"
    );
    assert!(most <= 1, "maxUnavailable 1 broken: {when:?} at once");
    // Only the canary got the broken release, once, and was brought back
    // once; no other node's agent was touched.
    let canary: Vec<&String> = samples
        .created
        .keys()
        .filter(|(_, image)| image == broken)
        .map(|(node, _)| node)
        .collect();
    assert_eq!(canary.len(), 1, "{per_node:?}");
    assert_eq!(
        per_node.get(canary[0]),
        Some(&BTreeMap::from([
            (broken.to_string(), 1),
            (v1.to_string(), 1)
        ])),
        "{per_node:?}"
    );
    assert_eq!(
        per_node.len(),
        1,
        "another node's agent was replaced: {per_node:?}"
    );
    assert_eq!(
        failed,
        BTreeSet::from([canary[0].clone()]),
        "the canary failed the gate: {st:#?}"
    );
    assert_faults_injected(&stats);
    Ok(())
}

/// The proxy's own controls, through the operator's client: each fault is
/// seen as set, and `clear` takes every one away.
#[tokio::test]
async fn the_proxy_injects_what_it_is_told() -> anyhow::Result<()> {
    let env = setup("faultsproxy").await?;
    let through = client_through_the_proxy(&env).await?;
    let revisions = Api::<ControllerRevision>::namespaced(through.clone(), &env.ns.name);
    let params = kube::api::ListParams::default();
    let list = || revisions.list(&params);

    // Latency: every answer at least this late.
    env.proxy.set_latency(400, 0)?;
    let start = Instant::now();
    list().await?;
    let late = start.elapsed();
    assert!(late >= Duration::from_millis(400), "answered in {late:?}");

    // A burst of two 500s for lists of ControllerRevisions, then answers again.
    env.proxy
        .burst(2, &[500], &["list"], &["controllerrevisions"])?;
    for _ in 0..2 {
        match list().await {
            Err(kube::Error::Api(s)) if s.code == 500 => {}
            other => anyhow::bail!("expected an injected 500, got {other:?}"),
        }
    }
    list().await?;

    // Resets: the operator's connection is cut (no HTTP answer at all).
    env.proxy.set_resets(1.0, 0)?;
    let cut = list().await;
    assert!(
        cut.as_ref()
            .is_err_and(|e| !matches!(e, kube::Error::Api(_))),
        "expected a transport error, got {cut:?}"
    );

    env.proxy.clear()?;

    // Blackholed watches: the list answers, the watch after it stays open
    // and says nothing, not even of an object created meanwhile.
    env.proxy.blackhole_watch(&["controllerrevisions"])?;
    let mut events = watcher(revisions.clone(), watcher::Config::default()).boxed();
    initial_list_within(&mut events, Duration::from_secs(10)).await?;
    let cr: ControllerRevision = serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "ControllerRevision",
        "metadata": {"name": "unseen"}, "revision": 1, "data": {}
    }))?;
    Api::<ControllerRevision>::namespaced(env.client.clone(), &env.ns.name)
        .create(&PostParams::default(), &cr)
        .await?;
    // Silence has no event to wait for: the check of check_the_chain (an
    // event within 10 s when nothing is blackholed) bounds it.
    let heard = tokio::time::timeout(Duration::from_secs(3), events.try_next()).await;
    assert!(heard.is_err(), "a blackholed watch delivered {heard:?}");
    poll("the held watch counted", support::TIMEOUT, || {
        Ok((env.proxy.stats()?.blackholed >= 1).then_some(()))
    })
    .await?;

    // Cleared: answered at once and in full.
    env.proxy.clear()?;
    let start = Instant::now();
    list().await?;
    assert!(start.elapsed() < Duration::from_millis(400));
    let stats = env.proxy.stats()?;
    assert_eq!(stats.injected_code(500), 2, "{stats:?}");
    Ok(())
}

/// Two replicas, each reaching the API server through a proxy of its own,
/// with the default lease (15 s, renewed 10 s before it expires: the fence's
/// margin is 5 s). Mid-stage, every request of the leader is delayed 5 s on
/// its way to the API server and the leader is frozen (SIGSTOP) past its
/// lease, with the stage's writes in flight; the other replica takes the
/// lease and goes on; then the frozen one is let go (SIGCONT). The fence
/// keeps their writes apart: the budget holds at every sampled event, no
/// node's agent is replaced twice, and the rollout ends on the new revision
/// with the resumed replica following.
#[tokio::test]
async fn a_leader_frozen_past_its_lease_with_its_writes_delayed_never_writes_beside_the_next()
-> anyhow::Result<()> {
    let env = setup("frozen").await?;
    let c = cluster();
    let second = FaultProxy::start(&format!("{}-b", env.ns.name), c.kubeconfig()).await?;
    let (v1, v2) = ("registry.example/plugin:v1", "registry.example/plugin:v2");
    create_plugin_daemonset(&env.client, &env.ns.name, &env.resource, v1).await?;
    let ports = [free_loopback_port()?, free_loopback_port()?];
    let proxies = [&env.proxy, &second];
    let mut replicas = Vec::new();
    for (i, (proxy, port)) in proxies.iter().zip(ports).enumerate() {
        let args: Vec<String> = [
            "--namespace",
            &env.ns.name,
            "--metrics-addr",
            &format!("127.0.0.1:{port}"),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        replicas.push(Operator::start(
            Identity::Impersonate(&proxy.kubeconfig, OPERATOR_SA),
            &args,
            &format!("frozen-{i}-{}", env.ns.name),
        )?);
    }
    let mut spec = default_spec(&env.resource, v1);
    spec["maxUnavailable"] = json!(1);
    spec["stages"] =
        json!([{"nodes": 1, "soak": "3s"}, {"nodes": 2, "soak": "3s"}, {"nodes": "100%"}]);
    create_rollout(&env.client, &env.ns.name, "plugin", spec).await?;
    let adopted = wait_adopted(&env.client, &env.ns.name, "plugin").await?;
    let leader = poll("one leader", Duration::from_secs(60), || {
        let leading: Vec<bool> = ports.iter().map(|p| is_leader(*p) == Some(true)).collect();
        Ok(match leading[..] {
            [true, false] => Some(0),
            [false, true] => Some(1),
            _ => None,
        })
    })
    .await?;
    let next = 1 - leader;

    let (samples, task) = sample_pods(&env.client, &env.ns.name, four_nodes());
    set_template_image(&env.client, &env.ns.name, "plugin", &env.resource, v2).await?;
    wait_status(&env.client, &env.ns.name, "plugin", ROLLOUT_TIMEOUT, |st| {
        st.current_stage == Some(1) && st.stages.len() == 2
    })
    .await?;
    proxies[leader].set_toxic(
        "writes-delayed",
        "latency",
        "upstream",
        1.0,
        json!({"latency": 5000}),
    )?;
    replicas[leader].signal("STOP")?;
    let frozen = Instant::now();
    // Continued whatever happens below, so the process can end.
    struct Continue<'a>(&'a Operator);
    impl Drop for Continue<'_> {
        fn drop(&mut self) {
            let _ = self.0.signal("CONT");
        }
    }
    let guard = Continue(&replicas[leader]);
    poll("the other replica leading", Duration::from_secs(60), || {
        Ok((is_leader(ports[next]) == Some(true)).then_some(()))
    })
    .await?;
    let took_over = frozen.elapsed();
    eprintln!("MEASURE leader frozen -> the other replica leads: {took_over:?}");
    // The frozen replica's last renewal was written at most 5 s before it
    // froze (one every 5 s), so the lease cannot have passed in under 10 s.
    assert!(took_over >= Duration::from_secs(9), "{took_over:?}");
    drop(guard);
    let st = wait_status(&env.client, &env.ns.name, "plugin", ROLLOUT_TIMEOUT, |st| {
        st.phase == Some(Phase::Succeeded) && st.stable_revision != adopted.stable_revision
    })
    .await?;
    wait_agents(&env.client, &env.ns.name, v2).await?;
    task.abort();
    assert!(st.blocked_revisions.is_empty(), "{st:#?}");
    assert!(replicas[leader].is_running(), "the resumed replica crashed");
    poll(
        "the resumed replica following",
        Duration::from_secs(60),
        || Ok((is_leader(ports[leader]) == Some(false)).then_some(())),
    )
    .await?;
    let samples = samples.lock().unwrap();
    let (most, when) = samples.max_unavailable(&BTreeSet::new());
    eprintln!(
        "MEASURE most agents unavailable at once across the frozen leader: {most}; creations per node {:?}",
        creations(&samples)
    );
    assert!(most <= 1, "maxUnavailable 1 broken: {when:?} at once");
    samples.assert_each_node_got_one(v2, 4);
    proxies[leader].remove_toxic("writes-delayed")?;
    Ok(())
}

/// The metric line of the agent pods' store of `ns` in the operator's
/// `/metrics` on `port`, if any.
fn pods_store_stale(port: u16, ns: &str) -> anyhow::Result<Option<String>> {
    let (_, text) = support::http_request(port, "GET", "/metrics", None)?;
    let series = format!(
        "saferollout_watch_stale{{resource=\"pods\",namespace=\"{ns}\",selector=\"{};\"}}",
        saferollout_api::REVISION_HASH_LABEL
    );
    Ok(text
        .lines()
        .find(|l| l.starts_with(&series))
        .map(|l| l[series.len()..].trim().to_string()))
}

/// The agent pods' watch goes silent mid-stage, for twice the progress
/// deadline: the proxy holds every pods watch open and forwards nothing,
/// and new ones get their headers and nothing more. The stage's deadline
/// passes by the clock, but not by the caches (they heard nothing since):
/// no gate fails on it. Past `--watch-stale-after` (90 s) the rollout
/// holds and says which cache and since when, in status and in
/// `saferollout_watch_stale`; nothing reverts or is quarantined. Once
/// watches pass again, the operator's next new watch lists the pods and the
/// rollout succeeds, within the budget, each node's agent replaced once.
#[tokio::test]
async fn a_silent_pods_watch_holds_the_rollout_until_it_speaks_again() -> anyhow::Result<()> {
    const DEADLINE: Duration = Duration::from_secs(50);
    let env = setup("silent").await?;
    let (v1, v2) = ("registry.example/plugin:v1", "registry.example/plugin:v2");
    create_plugin_daemonset(&env.client, &env.ns.name, &env.resource, v1).await?;
    let port = free_loopback_port()?;
    let mut op = operator_through(&env.proxy, &env.ns.name, port, "silent")?;
    let mut spec = default_spec(&env.resource, v1);
    spec["maxUnavailable"] = json!(1);
    spec["progressDeadline"] = json!(format!("{}s", DEADLINE.as_secs()));
    spec["stages"] =
        json!([{"nodes": 1, "soak": "2s"}, {"nodes": 2, "soak": "2s"}, {"nodes": "100%"}]);
    create_rollout(&env.client, &env.ns.name, "plugin", spec).await?;
    let adopted = wait_adopted(&env.client, &env.ns.name, "plugin").await?;

    let (samples, task) = sample_pods(&env.client, &env.ns.name, four_nodes());
    set_template_image(&env.client, &env.ns.name, "plugin", &env.resource, v2).await?;
    wait_status(&env.client, &env.ns.name, "plugin", ROLLOUT_TIMEOUT, |st| {
        st.current_stage == Some(1)
    })
    .await?;
    env.proxy.blackhole_watch(&["pods"])?;
    let silenced = Instant::now();

    // Silent for twice the deadline. Checked every second meanwhile: nothing
    // fails, and past the bound the hold is reported.
    let api: Api<SafeRollout> = Api::namespaced(env.client.clone(), &env.ns.name);
    let store = format!("pods in namespace {}", env.ns.name);
    let mut held: Option<(Duration, String)> = None;
    let mut metric_stale = false;
    while silenced.elapsed() < 2 * DEADLINE {
        let st = api.get_status("plugin").await?.status.unwrap_or_default();
        assert!(
            st.blocked_revisions.is_empty() && st.phase == Some(Phase::Progressing),
            "a fault of the cluster failed the rollout after {:?}: {st:#?}",
            silenced.elapsed()
        );
        if held.is_none()
            && let Some(ready) = condition(&st, "Ready").filter(|c| c.reason == "CacheStale")
        {
            held = Some((silenced.elapsed(), ready.message.clone()));
        }
        // The gauge is set by the store's reflector, within 5 s of the pass.
        metric_stale |= pods_store_stale(port, &env.ns.name)?.as_deref() == Some("1");
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let (held_after, message) = held.expect("the hold was reported while the watch was silent");
    eprintln!("MEASURE pods watch silent -> rollout held: {held_after:?}");
    assert!(message.contains(&store), "{message}");
    assert!(
        metric_stale,
        "saferollout_watch_stale of the pods store never read 1"
    );
    // Not before the bound: the watch's last word came at most a minute
    // (one bookmark) before the silence.
    assert!(held_after >= Duration::from_secs(30), "{held_after:?}");

    env.proxy.clear()?;
    let back = Instant::now();
    let st = wait_status(&env.client, &env.ns.name, "plugin", ROLLOUT_TIMEOUT, |st| {
        st.phase == Some(Phase::Succeeded) && st.stable_revision != adopted.stable_revision
    })
    .await?;
    eprintln!(
        "MEASURE watches pass again -> rollout succeeded: {:?}",
        back.elapsed()
    );
    wait_agents(&env.client, &env.ns.name, v2).await?;
    task.abort();
    assert!(st.blocked_revisions.is_empty(), "{st:#?}");
    assert!(
        st.stages.iter().all(|s| s.failed_nodes.is_empty()),
        "{st:#?}"
    );
    assert_eq!(pods_store_stale(port, &env.ns.name)?.as_deref(), Some("0"));
    assert!(op.is_running());
    // Nothing quarantined: no node carries a taint of the operator's.
    let nodes = Api::<k8s_openapi::api::core::v1::Node>::all(env.client.clone())
        .list(&Default::default())
        .await?;
    for n in nodes
        .items
        .iter()
        .filter(|n| four_nodes().contains(&n.name_any()))
    {
        let taints = n
            .spec
            .as_ref()
            .and_then(|s| s.taints.clone())
            .unwrap_or_default();
        assert!(
            taints.iter().all(|t| !t.key.contains("saferollout")),
            "{}: {taints:?}",
            n.name_any()
        );
    }
    let samples = samples.lock().unwrap();
    let (most, when) = samples.max_unavailable(&BTreeSet::new());
    eprintln!(
        "MEASURE most agents unavailable at once across the silent watch: {most}; creations per node {:?}",
        creations(&samples)
    );
    assert!(most <= 1, "maxUnavailable 1 broken: {when:?} at once");
    samples.assert_each_node_got_one(v2, 4);
    Ok(())
}
