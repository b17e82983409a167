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
//! agent pod creations. The API server's audit log
//! (support/audit-policy.yaml) counts the operator's pod deletions and node
//! label writes on the server's side.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use anyhow::Context;
use futures::{StreamExt, TryStreamExt};
use jiff::Timestamp;
use k8s_openapi::api::apps::v1::ControllerRevision;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use saferollout_api::{Phase, SafeRollout, SafeRolloutStatus};
use saferollout_testkit::{Needs, TestCluster, TestNamespace, audit, cluster_with, repo_root};
use serde_json::json;
use support::faults::{FaultProxy, FaultStats};
use support::{
    GPUS, Identity, Operator, condition, create_plugin_daemonset, create_rollout, default_spec,
    free_loopback_port, http_get, is_leader, operator_args_default_lease, poll, sample_pods,
    set_template_image, wait_adopted, wait_agents, wait_status,
};

const OPERATOR_SA: &str = "system:serviceaccount:saferollout-system:saferollout-operator";
/// The impersonated extra field that tells two replicas apart in the audit log.
const REPLICA_EXTRA: &str = "test.saferollout.dev/replica";
/// The rollouts share the cluster's nodes: one at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
/// A rollout through the faults: three stages of 2 s soaks, each request a
/// fifth likely to be refused and answered up to 2 s late.
const ROLLOUT_TIMEOUT: Duration = Duration::from_secs(300);

/// This binary's cluster: its API server keeps an audit log with
/// support/audit-policy.yaml (a reused cluster must have been started with
/// it: `tests/cluster/up --audit-policy crates/operator/tests/support/audit-policy.yaml`).
fn cluster() -> &'static TestCluster {
    cluster_with(&Needs {
        audit_policy: Some(repo_root().join("crates/operator/tests/support/audit-policy.yaml")),
    })
}

/// Every request the API server logged as received at or after `since`.
fn audit_log(since: Timestamp) -> anyhow::Result<Vec<audit::Request>> {
    let log = cluster()
        .control_plane()?
        .audit_log()?
        .context("the cluster keeps no audit log")?;
    Ok(audit::read(&log)?
        .into_iter()
        .filter(|r| r.received >= since)
        .collect())
}

/// The operator's requests (either replica's) among them.
fn audited(since: Timestamp) -> anyhow::Result<Vec<audit::Request>> {
    Ok(audit_log(since)?
        .into_iter()
        .filter(|r| r.user == OPERATOR_SA)
        .collect())
}

/// The operator's deletions of the agent pods of `ns` since `since`, from the
/// audit log, each pod placed on its node by what the sampler saw; and when
/// each agent pod turned Ready, by the API server's clock too.
#[derive(Debug, Default)]
struct AuditedDeletions {
    /// Per node: when each deletion answered 2xx was received, and by which
    /// replica (its [`REPLICA_EXTRA`], if any).
    per_node: BTreeMap<String, Vec<(Timestamp, String)>>,
    /// Deletions the API server did not answer 2xx: pod, code, replica.
    refused: Vec<(String, Option<i32>, String)>,
    /// Deleted pods of the namespace the sampler never saw (not agents).
    unknown: Vec<String>,
    /// Per agent pod, when the API server received the first status write
    /// that made it Ready (the agent fixture's, as a kubelet's).
    ready: BTreeMap<String, Timestamp>,
}

impl AuditedDeletions {
    /// On the API server's side: each of `nodes` nodes' old agent deleted
    /// once, every deletion accepted, no other pod deleted.
    fn assert_each_of_nodes_deleted_once(&self, nodes: usize) {
        assert_eq!(self.per_node.len(), nodes, "{self:?}");
        assert!(
            self.per_node.values().all(|d| d.len() == 1),
            "an agent deleted twice: {self:?}"
        );
        assert!(
            self.refused.is_empty() && self.unknown.is_empty(),
            "{self:?}"
        );
    }

    fn read(ns: &str, since: Timestamp, samples: &support::Samples) -> anyhow::Result<Self> {
        let mut out = AuditedDeletions::default();
        for r in audit_log(since)?
            .into_iter()
            .filter(|r| r.namespace.as_deref() == Some(ns))
        {
            let pod = r.name.clone().unwrap_or_default();
            if r.resource == "pods/status" {
                let conditions = r
                    .request_object
                    .as_ref()
                    .and_then(|o| o["status"]["conditions"].as_array().cloned())
                    .unwrap_or_default();
                let ready = conditions
                    .iter()
                    .any(|c| c["type"] == "Ready" && c["status"] == "True");
                if ready && r.succeeded() {
                    out.ready.entry(pod).or_insert(r.received);
                }
                continue;
            }
            if !(r.verb == "delete" && r.resource == "pods" && r.user == OPERATOR_SA) {
                continue;
            }
            let replica = r.extra(REPLICA_EXTRA).unwrap_or_default().to_string();
            match samples.pods.get(&pod) {
                None => out.unknown.push(pod),
                Some(_) if !r.succeeded() => out.refused.push((pod, r.code, replica)),
                Some(seen) => out
                    .per_node
                    .entry(seen.node.clone())
                    .or_default()
                    .push((r.received, replica)),
            }
        }
        Ok(out)
    }

    /// The most nodes out at once because of the operator, and which: a
    /// node is out from its agent's deletion (received by the API server)
    /// until the API server received the status write that made its new
    /// agent (`image`) Ready (a deletion that waited for that Ready can only
    /// come after). Also the least time from a new agent's Ready to the
    /// next deletion: the margin of the check.
    fn most_out_at_once(
        &self,
        samples: &support::Samples,
        image: &str,
    ) -> ((usize, BTreeSet<String>), Option<jiff::SignedDuration>) {
        let out: BTreeMap<&String, (Timestamp, Timestamp)> = self
            .per_node
            .iter()
            .filter_map(|(node, ds)| {
                let deleted = ds.iter().map(|(t, _)| *t).min()?;
                let back = samples
                    .pods
                    .iter()
                    .filter(|(_, p)| &p.node == node && p.image == image)
                    .filter_map(|(name, _)| self.ready.get(name).copied())
                    .min()
                    .unwrap_or(Timestamp::MAX);
                Some((node, (deleted, back)))
            })
            .collect();
        let most = out
            .values()
            .map(|(t, _)| {
                out.iter()
                    .filter(|(_, (from, to))| from <= t && t < to)
                    .map(|(n, _)| (*n).clone())
                    .collect::<BTreeSet<String>>()
            })
            .map(|s| (s.len(), s))
            .max_by_key(|(n, _)| *n)
            .unwrap_or_default();
        let margin = out
            .values()
            .flat_map(|(_, back)| {
                out.values()
                    .filter(move |(deleted, _)| deleted >= back)
                    .map(move |(deleted, _)| deleted.duration_since(*back))
            })
            .min();
        (most, margin)
    }
}

/// `saferollout_watch_restarts_total` of the operator serving metrics on
/// `port`, by resource.
fn watch_restarts(port: u16) -> anyhow::Result<BTreeMap<String, f64>> {
    let (code, body) = http_get(port, "/metrics")?;
    anyhow::ensure!(code == 200, "/metrics: {code}");
    Ok(body
        .lines()
        .filter_map(|l| l.strip_prefix("saferollout_watch_restarts_total{resource=\""))
        .filter_map(|rest| {
            let (resource, value) = rest.split_once("\"}")?;
            Some((resource.to_string(), value.trim().parse().ok()?))
        })
        .collect())
}

/// The watch errors "too old resource version: RV (oldest)" (410 Gone) in
/// the operator's JSON log: per resource, the resource versions its watches
/// tried to resume from.
fn expired_watches(log: &str) -> BTreeMap<String, Vec<u64>> {
    let mut out: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for line in log.lines() {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        let fields = &v["fields"];
        let Some(rest) = fields["error"]
            .as_str()
            .and_then(|e| e.split("too old resource version: ").nth(1))
        else {
            continue;
        };
        let rv = rest
            .split(|c: char| !c.is_ascii_digit())
            .next()
            .and_then(|d| d.parse::<u64>().ok());
        // The device gates' pod watch names no resource (only DRA rollouts run it).
        let resource = fields["resource"]
            .as_str()
            .unwrap_or("pods of rollout nodes");
        out.entry(resource.to_string()).or_default().extend(rv);
    }
    out
}

/// The operator's watches in the audit log across an outage of the API
/// server: each watch is its path and selectors (its query without the
/// resource version it starts from).
#[derive(Debug)]
struct WatchesAcross {
    /// Per watch made before the outage, the resource versions it resumed
    /// from after it (a resumed watch: a resource version, no initial events).
    resumed: BTreeMap<String, Vec<u64>>,
    /// Per watch, how often it started over after resuming from a compacted
    /// resource version: a list (a streaming one, `sendInitialEvents=true`,
    /// or a LIST), or a watch from a resource version after the compaction,
    /// which only a new read can have given (the leader election reads its
    /// Lease again, a GET this audit policy does not log).
    listed_again: BTreeMap<String, usize>,
}

impl WatchesAcross {
    fn read(started: Timestamp, outage: Timestamp, compacted: i64) -> anyhow::Result<Self> {
        let requests = audited(started)?;
        let before: BTreeSet<String> = requests
            .iter()
            .filter(|r| r.verb == "watch" && r.received < outage)
            .map(watch_key)
            .collect();
        let mut resumed: BTreeMap<String, Vec<u64>> =
            before.iter().map(|k| (k.clone(), Vec::new())).collect();
        let mut listed_again: BTreeMap<String, usize> =
            before.iter().map(|k| (k.clone(), 0)).collect();
        for r in requests.iter().filter(|r| r.received >= outage) {
            let key = watch_key(r);
            let relist = (r.verb == "watch" && r.param("sendInitialEvents") == Some("true"))
                || r.verb == "list";
            let from = r
                .param("resourceVersion")
                .and_then(|rv| rv.parse::<u64>().ok());
            match (resumed.get_mut(&key), from) {
                (Some(rvs), _) if relist && !rvs.is_empty() => {
                    *listed_again.entry(key).or_default() += 1;
                }
                (Some(rvs), Some(rv)) if !relist && r.verb == "watch" => {
                    if rv >= compacted as u64 {
                        if !rvs.is_empty() {
                            *listed_again.entry(key).or_default() += 1;
                        }
                    } else {
                        rvs.push(rv);
                    }
                }
                _ => {}
            }
        }
        Ok(WatchesAcross {
            resumed,
            listed_again,
        })
    }

    /// Every watch made before resumed and then listed again.
    fn all_listed_again(&self) -> bool {
        !self.resumed.is_empty()
            && self.resumed.values().all(|rvs| !rvs.is_empty())
            && self.listed_again.values().all(|n| *n > 0)
    }
}

/// A watch's (or list's) path and selectors: its query without what says
/// where it starts.
fn watch_key(r: &audit::Request) -> String {
    let (path, query) = r.uri.split_once('?').unwrap_or((&r.uri, ""));
    let mut kept: Vec<&str> = query
        .split('&')
        .filter(|kv| !kv.is_empty())
        .filter(|kv| {
            let k = kv.split('=').next().unwrap_or_default();
            ![
                "watch",
                "resourceVersion",
                "resourceVersionMatch",
                "sendInitialEvents",
                "allowWatchBookmarks",
                "timeoutSeconds",
                "limit",
                "continue",
            ]
            .contains(&k)
        })
        .collect();
    kept.sort();
    format!("{path}?{}", kept.join("&"))
}

/// The resource a watch key is of: the path's last segment.
fn watch_resource(key: &str) -> String {
    let path = key.split('?').next().unwrap_or_default();
    path.rsplit('/').next().unwrap_or_default().to_string()
}

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
    let args = operator_args_default_lease(ns, &format!("127.0.0.1:{port}"));
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

/// etcd compaction under every watch of the operator, mid-rollout: the
/// kube-apiserver stops (as in a restart of it), the cluster's revision moves
/// on meanwhile (a write straight to etcd, outside the API server's keys, as
/// another API server's writes would move it), etcd compacts its history up
/// to there, and the API server starts again. Every watch of the operator
/// then resumes from a resource version that is compacted away and is
/// answered 410 Gone ("too old resource version", by the new API server's
/// watch cache, which begins at the current revision); each of its caches
/// lists again.
///
/// Why the restart: a compaction alone breaks no watch. The API server
/// serves a watch that resumes from its watch cache, whose history does not
/// follow etcd's compaction: on this cluster, after compacting etcd to
/// revision 304, a watch from 298 was served its events, not a 410. Only
/// the cache's own history bounds it, and a restarted API server's begins
/// at the revision it started at.
///
/// The rollout goes on and succeeds: the budget holds at every sampled event,
/// each node's agent is replaced once, and the audit log shows each old
/// agent deleted once, never while another node's new agent was not yet
/// Ready, and no node's labels written twice.
#[tokio::test]
async fn a_compaction_that_expires_every_watch_mid_rollout_lists_again_and_repeats_nothing()
-> anyhow::Result<()> {
    let env = setup("compacted").await?;
    let (v1, v2) = ("registry.example/plugin:v1", "registry.example/plugin:v2");
    create_plugin_daemonset(&env.client, &env.ns.name, &env.resource, v1).await?;
    let port = free_loopback_port()?;
    let args = operator_args_default_lease(&env.ns.name, &format!("127.0.0.1:{port}"));
    let started = Timestamp::now();
    // The caches' watch errors are logged at debug (by their reflector loop,
    // `controller::freshness`), as JSON: the 410s are read there.
    let op = Operator::start_with_env(
        Identity::Impersonate(&env.proxy.kubeconfig, OPERATOR_SA),
        &args,
        &[
            ("SAFEROLLOUT_LOG_JSON", "true"),
            (
                "RUST_LOG",
                "info,kube=warn,saferollout_operator::controller::freshness=debug,saferollout_operator::controller::devices=debug",
            ),
        ],
        &format!("compacted-{}", env.ns.name),
    )?;
    let mut spec = default_spec(&env.resource, v1);
    spec["maxUnavailable"] = json!(1);
    create_rollout(&env.client, &env.ns.name, "plugin", spec).await?;
    let adopted = wait_adopted(&env.client, &env.ns.name, "plugin").await?;

    let (samples, task) = sample_pods(&env.client, &env.ns.name, four_nodes());
    let since = Timestamp::now();
    let start = Instant::now();
    set_template_image(&env.client, &env.ns.name, "plugin", &env.resource, v2).await?;
    // Mid-rollout: the canary done, the second stage begun.
    wait_status(&env.client, &env.ns.name, "plugin", ROLLOUT_TIMEOUT, |st| {
        st.current_stage == Some(1)
    })
    .await?;
    let restarts_before = watch_restarts(port)?;
    let requests_before = env.proxy.stats()?.requests;
    let plane = cluster().control_plane()?;
    let stopping = Timestamp::now();
    let outage = Instant::now();
    let (compacted, ready_in) = tokio::task::spawn_blocking(move || {
        let etcd = plane.etcd()?;
        let stopped = plane.kill_api_server()?;
        let moved = etcd.put("/saferollout-test/compaction", "the revision moves on")?;
        etcd.compact(moved)?;
        let ready_in = stopped.start()?;
        anyhow::Ok((moved, ready_in))
    })
    .await??;
    let outage = outage.elapsed();
    let during: BTreeMap<String, u64> = env
        .proxy
        .stats()?
        .requests
        .into_iter()
        .map(|(verb, n)| {
            let before = requests_before.get(&verb).copied().unwrap_or_default();
            (verb, n - before)
        })
        .collect();

    // Every watch the operator had made before (the audit log has each
    // request) resumes from a compacted resource version, and lists again.
    let watches = poll(
        "every watch of the operator resumed and listed again",
        Duration::from_secs(60),
        || {
            let watches = WatchesAcross::read(started, stopping, compacted)?;
            Ok(watches.all_listed_again().then_some(watches))
        },
    )
    .await?;
    // The caches say why: 410 Gone, for every resource they watch (the
    // leader election's watch of its Lease is none of them, and logs
    // nothing of it).
    let cached: BTreeSet<String> = watches
        .resumed
        .keys()
        .filter(|k| !k.contains("/leases"))
        .map(|k| watch_resource(k))
        .collect();
    let expired = poll(
        "the operator's caches answered 410",
        Duration::from_secs(30),
        || {
            let expired = expired_watches(&op.log_text());
            Ok(cached
                .iter()
                .all(|r| expired.contains_key(r))
                .then_some(expired))
        },
    )
    .await?;
    let st = wait_status(&env.client, &env.ns.name, "plugin", ROLLOUT_TIMEOUT, |st| {
        st.phase == Some(Phase::Succeeded) && st.stable_revision != adopted.stable_revision
    })
    .await?;
    let elapsed = start.elapsed();
    wait_agents(&env.client, &env.ns.name, v2).await?;
    task.abort();
    let restarts_after = watch_restarts(port)?;
    let stats = env.proxy.stats()?;
    report("rollout across the compaction", elapsed, &stats);

    let samples = samples.lock().unwrap();
    let deletions = AuditedDeletions::read(&env.ns.name, since, &samples)?;
    let id = format!("{}.plugin", env.ns.name);
    let mut labels: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for r in audited(since)?
        .iter()
        .filter(|r| r.verb == "patch" && r.resource == "nodes" && r.succeeded())
    {
        let written = r
            .request_object
            .as_ref()
            .map(|o| &o["metadata"]["labels"])
            .filter(|l| l[saferollout_api::ROLLOUT_LABEL] == id.as_str());
        if let Some(l) = written {
            labels
                .entry(r.name.clone().unwrap_or_default())
                .or_default()
                .push(l.to_string());
        }
    }
    let (most, when) = samples.max_unavailable(&BTreeSet::new());
    let ((out, which), margin) = deletions.most_out_at_once(&samples, v2);
    eprintln!(
        "MEASURE compaction: API server killed at {stopping} and ready again in {outage:?} (ready {ready_in:?} after its start); etcd compacted to revision {compacted}; the operator's watches (audit log) resumed from {:?}, listed again {:?}; 410s logged by the operator per resource {:?}; watch restarts before {restarts_before:?} after {restarts_after:?}; requests through the proxy during the outage {:?}; the sampler's own watch failed {} times and listed again {} times",
        watches.resumed,
        watches.listed_again,
        expired
            .iter()
            .map(|(r, rvs)| (r.as_str(), rvs.len()))
            .collect::<BTreeMap<_, _>>(),
        during,
        samples.watch_errors,
        samples.relists
    );
    eprintln!(
        "MEASURE compaction: most agents unavailable at once {most} {when:?}; creations per node {:?}; audited deletions per node {:?}, refused {:?}; most nodes out at once by them {out} {which:?}, least time from a new agent's Ready to the next deletion {margin:?}; label writes per node {labels:?}",
        creations(&samples),
        deletions.per_node,
        deletions.refused
    );

    // (Every watch resumed from a compacted resource version and started
    // over: what the poll above waited for.)
    for resource in &cached {
        let rvs = &expired[resource];
        assert!(
            rvs.iter().all(|rv| *rv < compacted as u64),
            "{resource}: a watch resumed from a resource version etcd still had: {rvs:?}, compacted to {compacted}"
        );
        assert!(
            restarts_after.get(resource).copied().unwrap_or_default()
                > restarts_before.get(resource).copied().unwrap_or_default(),
            "{resource}: no watch restart counted: {restarts_before:?} -> {restarts_after:?}"
        );
    }
    assert!(
        condition(&st, "Ready").is_some_and(|c| c.status == "True"),
        "{st:#?}"
    );
    assert!(st.blocked_revisions.is_empty(), "{st:#?}");
    assert!(most <= 1, "maxUnavailable 1 broken: {when:?} at once");
    samples.assert_each_node_got_one(v2, 4);
    assert!(
        samples.created.keys().all(|(_, image)| image == v2),
        "a pod of another image was created: {:?}",
        samples.created
    );
    // On the server's side: each node's old agent deleted once, nothing else.
    deletions.assert_each_of_nodes_deleted_once(4);
    assert!(
        out <= 1,
        "maxUnavailable 1 broken by the deletions: {which:?} out at once"
    );
    for (node, written) in &labels {
        let distinct: BTreeSet<&String> = written.iter().collect();
        assert_eq!(
            distinct.len(),
            written.len(),
            "node {node}'s labels written twice: {written:?}"
        );
    }
    Ok(())
}

/// Every node label write refused (500) for 5 s as the rollout begins: a
/// refused write is decided again by a later pass, after a pause, and the
/// rollout goes on once writes pass again. Before, the refused write woke
/// the next pass at once, which queued it again: the operator asked the API
/// server in a loop, as fast as it answered.
#[tokio::test]
async fn refused_label_writes_are_asked_again_after_a_pause_not_in_a_loop() -> anyhow::Result<()> {
    let env = setup("labelsrefused").await?;
    let (v1, v2) = ("registry.example/plugin:v1", "registry.example/plugin:v2");
    create_plugin_daemonset(&env.client, &env.ns.name, &env.resource, v1).await?;
    let _op = operator(&env)?;
    let mut spec = default_spec(&env.resource, v1);
    spec["maxUnavailable"] = json!(1);
    create_rollout(&env.client, &env.ns.name, "plugin", spec).await?;
    let adopted = wait_adopted(&env.client, &env.ns.name, "plugin").await?;

    env.proxy.errors(1.0, &[500], &["patch"], &["nodes"])?;
    set_template_image(&env.client, &env.ns.name, "plugin", &env.resource, v2).await?;
    let refused = |env: &Env| -> anyhow::Result<u64> {
        Ok(env
            .proxy
            .stats()?
            .injected_by
            .get("patch nodes")
            .copied()
            .unwrap_or_default())
    };
    poll("a label write refused", ROLLOUT_TIMEOUT, || {
        Ok((refused(&env)? > 0).then_some(()))
    })
    .await?;
    // The fault's length: what is measured is how often the operator asks
    // while it lasts.
    let window = Duration::from_secs(5);
    tokio::time::sleep(window).await;
    let asked = refused(&env)?;
    env.proxy.clear()?;
    let st = wait_status(&env.client, &env.ns.name, "plugin", ROLLOUT_TIMEOUT, |st| {
        st.phase == Some(Phase::Succeeded) && st.stable_revision != adopted.stable_revision
    })
    .await?;
    wait_agents(&env.client, &env.ns.name, v2).await?;
    eprintln!("MEASURE label writes refused in the first {window:?} of the fault: {asked}");
    // A pause of 1 s before the pass that decides it again (other events
    // wake passes too: 2 a second measured); the loop asked 360 a second.
    assert!(
        asked <= 5 * window.as_secs(),
        "{asked} label writes in {window:?} of refusals: asked again in a loop"
    );
    assert!(
        condition(&st, "Ready").is_some_and(|c| c.status == "True"),
        "{st:#?}"
    );
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
///
/// Counted on the API server's side too: the audit log has every pod
/// deletion of both replicas (both act as the same ServiceAccount; each
/// replica's kubeconfig adds an impersonated extra field naming it), and
/// their deletions together never take a node out while another node
/// deleted before has no Ready new agent (the agent fixture's status write
/// that made it Ready, in the same log), and take each node once.
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
        let args = operator_args_default_lease(&env.ns.name, &format!("127.0.0.1:{port}"));
        let kubeconfig = proxy.kubeconfig_as(OPERATOR_SA, REPLICA_EXTRA, &i.to_string())?;
        replicas.push(Operator::start(
            Identity::Kubeconfig(&kubeconfig),
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
    let since = Timestamp::now();
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

    let deletions = AuditedDeletions::read(&env.ns.name, since, &samples)?;
    let ((out, which), margin) = deletions.most_out_at_once(&samples, v2);
    let by_replica: BTreeMap<&str, usize> =
        deletions
            .per_node
            .values()
            .flatten()
            .fold(BTreeMap::new(), |mut m, (_, replica)| {
                *m.entry(replica.as_str()).or_default() += 1;
                m
            });
    eprintln!(
        "MEASURE frozen leader, audit log: deletions per node {:?} (leader was replica {leader}), by replica {by_replica:?}, refused {:?}; most nodes out at once {out} {which:?}; least time from a new agent's Ready to the next deletion {margin:?}",
        deletions.per_node, deletions.refused
    );
    deletions.assert_each_of_nodes_deleted_once(4);
    assert!(
        by_replica.keys().all(|r| ["0", "1"].contains(r)),
        "a deletion of no known replica: {by_replica:?}"
    );
    assert!(
        out <= 1,
        "maxUnavailable 1 broken by the deletions: {which:?} out at once"
    );
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
