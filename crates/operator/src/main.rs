use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;

use saferollout_operator::{allocator, client, controller, leader, metrics};
use tracing_subscriber::EnvFilter;

// Feature `system-allocator`: the C library's malloc, for heap profilers
// such as heaptrack that only see it (jemalloc's symbols are prefixed).
#[cfg(not(feature = "system-allocator"))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's options: freed pages go back to the kernel within a second
/// (default 10 s), by a background thread rather than on the reconcile path.
/// `_RJEM_MALLOC_CONF` in the environment still overrides them.
#[cfg(not(feature = "system-allocator"))]
#[unsafe(export_name = "_rjem_malloc_conf")]
static MALLOC_CONF: Option<&'static u8> =
    Some(&b"background_thread:true,dirty_decay_ms:1000,muzzy_decay_ms:0\0"[0]);

/// The saferollout operator: staged, gated, self-reverting rollouts of device-plugin and DRA-driver DaemonSets.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    /// Address for /metrics, /healthz and /readyz.
    #[arg(long, env = "SAFEROLLOUT_METRICS_ADDR", default_value = "0.0.0.0:8080")]
    metrics_addr: SocketAddr,
    /// Watch only these namespaces (comma-separated; default: all namespaces).
    /// Pods, DaemonSets and ControllerRevisions are then read in these
    /// namespaces only, so namespaced RBAC (Roles) suffices for them.
    #[arg(
        long,
        env = "SAFEROLLOUT_WATCH_NAMESPACES",
        value_delimiter = ',',
        alias = "namespace"
    )]
    watch_namespaces: Vec<String>,
    /// Elect a leader among replicas with a coordination.k8s.io Lease; only the
    /// leader reconciles and writes.
    #[arg(long, env = "SAFEROLLOUT_LEADER_ELECTION", default_value_t = true, action = clap::ArgAction::Set)]
    leader_election: bool,
    /// Namespace of the leader Lease (default: the pod's namespace from
    /// POD_NAMESPACE, else saferollout-system).
    #[arg(long, env = "SAFEROLLOUT_LEADER_ELECTION_NAMESPACE")]
    leader_election_namespace: Option<String>,
    /// Name of the leader Lease.
    #[arg(
        long,
        env = "SAFEROLLOUT_LEADER_ELECTION_LEASE_NAME",
        default_value = "saferollout-operator"
    )]
    leader_election_lease_name: String,
    /// Seconds a lease stays valid after its last renewal; a new leader takes
    /// over at most this long (plus a second) after the old one died.
    #[arg(long, env = "SAFEROLLOUT_LEASE_DURATION", default_value_t = 15)]
    lease_duration: u64,
    /// Seconds before expiry the leader renews its lease. The leader stops
    /// writing `grace/2` after a renewal would have been due, so half of it is
    /// the time a renewal has to be confirmed and the time a write sent just
    /// before the fence closed has to reach the API server before another
    /// replica may take over (5 s with the defaults).
    #[arg(long, env = "SAFEROLLOUT_LEASE_GRACE", default_value_t = 10)]
    lease_grace: u64,
    /// Watch what the device gates read (ResourceSlices, ResourceClaims, the
    /// workload pods of the nodes a rollout holds, the operator's quarantine
    /// DeviceTaintRules and claims probes). Off: those gates wait and fail at
    /// the progress deadline, saying why.
    #[arg(long, env = "SAFEROLLOUT_DEVICE_GATES", default_value_t = true, action = clap::ArgAction::Set)]
    device_gates: bool,
    /// Up to this many nodes held by rollouts, their workload pods are
    /// watched one node at a time (field selector spec.nodeName); beyond it,
    /// by one cluster-wide watch that keeps only those nodes' device pods.
    #[arg(long, env = "SAFEROLLOUT_PER_NODE_POD_WATCHES", default_value_t = 64)]
    per_node_pod_watches: usize,
    /// Seconds a cache's watch may deliver nothing, not even a bookmark,
    /// before the cache counts as stale: the SafeRollouts reading it hold
    /// (nothing deleted, judged or quarantined) and the watch starts over.
    /// The API server sends every watch a bookmark about once a minute, so
    /// below 60 a quiet, healthy watch would count as stale.
    #[arg(long, env = "SAFEROLLOUT_WATCH_STALE_AFTER", default_value_t = 90, value_parser = clap::value_parser!(u64).range(65..))]
    watch_stale_after: u64,
    /// Log as JSON lines.
    #[arg(long, env = "SAFEROLLOUT_LOG_JSON")]
    log_json: bool,
    /// Runtime worker threads. The work is one queue of passes that mostly
    /// wait on the API server, so a few threads suffice on any machine; each
    /// more costs memory (a stack and, with glibc, a malloc arena of its own).
    #[arg(long, env = "SAFEROLLOUT_WORKER_THREADS", default_value_t = 2, value_parser = clap::value_parser!(u16).range(1..=64))]
    worker_threads: u16,
    /// A base URL the prometheus gate may dial (repeat, or comma-separate):
    /// a gate's address must be it or lie under it (`URL/...`). None by
    /// default: a SafeRollout with a prometheus gate is refused (InvalidSpec)
    /// until its administrator allows its server here.
    #[arg(
        long = "prometheus-address",
        env = "SAFEROLLOUT_PROMETHEUS_ADDRESSES",
        value_delimiter = ','
    )]
    prometheus_addresses: Vec<String>,
    /// A Secret the prometheus gate may send (bearer token, CA bundle) and a
    /// base URL it may go to, `NAME=URL` (repeat for more URLs or Secrets).
    /// A Secret not bound to the gate's address is never read.
    #[arg(long = "prometheus-secret", env = "SAFEROLLOUT_PROMETHEUS_SECRETS", value_delimiter = ',', value_parser = parse_secret_binding)]
    prometheus_secrets: Vec<(String, String)>,
    /// Allow `quarantine.effect: NoExecute` (the quarantine evicts every
    /// workload using the failed nodes' devices).
    #[arg(long, env = "SAFEROLLOUT_QUARANTINE_ALLOW_NO_EXECUTE", default_value_t = false, action = clap::ArgAction::Set)]
    quarantine_allow_no_execute: bool,
    /// Allow `gates.probe.privileged` (probes that run as root, privileged).
    #[arg(long, env = "SAFEROLLOUT_ALLOW_PRIVILEGED_PROBES", default_value_t = false, action = clap::ArgAction::Set)]
    allow_privileged_probes: bool,
    /// Run `strategy: Selector` SafeRollouts (a canary DaemonSet per
    /// rollout, node labels and taints): needs the RBAC the chart grants
    /// with `selector.enabled` (create and delete DaemonSets, patch pods).
    /// Off: such a SafeRollout is refused with a condition naming the field.
    #[arg(long, env = "SAFEROLLOUT_SELECTOR_STRATEGY", default_value_t = false, action = clap::ArgAction::Set)]
    selector_strategy: bool,
    /// Run `spec.nodeMaintenance` (cordon each node before its agent is
    /// replaced, evict its workload pods through the Eviction API, uncordon
    /// it after): needs the RBAC the chart grants with
    /// `nodeMaintenance.enabled` (create pods/eviction, list pods in every
    /// namespace). Off: such a SafeRollout is refused with a condition
    /// naming the field.
    #[arg(long, env = "SAFEROLLOUT_NODE_MAINTENANCE", default_value_t = false, action = clap::ArgAction::Set)]
    node_maintenance: bool,
    /// Run `spec.ownerRevert` (revert a DaemonSet a vendor's GPU operator
    /// owns by putting back the version fields of its custom resource):
    /// needs the RBAC the chart grants with `ownerRevert.enabled` (patch
    /// ClusterPolicies, DeviceConfigs and GpuDevicePlugins). Off: such a
    /// SafeRollout is refused with a condition naming the field.
    #[arg(long, env = "SAFEROLLOUT_OWNER_REVERT", default_value_t = false, action = clap::ArgAction::Set)]
    owner_revert: bool,
    /// Watch SafeRolloutPolicies and apply them to the SafeRollouts they
    /// select (a budget of disrupted nodes across rollouts, an order between
    /// agents on each node, maintenance windows): needs the policy CRD
    /// (deploy/crd-policy.yaml) and the RBAC the chart grants with
    /// `fleetPolicies.enabled` (list and watch the policies and namespaces,
    /// patch the policies' status).
    #[arg(long, env = "SAFEROLLOUT_FLEET_POLICIES", default_value_t = false, action = clap::ArgAction::Set)]
    fleet_policies: bool,
    /// How the caches get their initial state: `paged` (paginated LISTs,
    /// then watches) or `stream` (streaming lists, Kubernetes WatchList: one
    /// watch per cache that sends the current objects first).
    #[arg(long, env = "SAFEROLLOUT_INITIAL_LIST", value_enum, default_value_t = controller::caches::stores::InitialList::default())]
    initial_list: controller::caches::stores::InitialList,
}

/// `NAME=URL`: a Secret and a base URL it may be sent to.
fn parse_secret_binding(s: &str) -> Result<(String, String), String> {
    let (name, url) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?}: expected NAME=URL"))?;
    if name.is_empty() || !saferollout_api::proof::is_http_url(url) {
        return Err(format!(
            "{s:?}: expected NAME=URL with a Secret name and an http(s) URL"
        ));
    }
    Ok((name.to_string(), url.to_string()))
}

/// The limits the flags set.
fn limits(args: &Args) -> anyhow::Result<saferollout_core::limits::AdminLimits> {
    for a in &args.prometheus_addresses {
        if !saferollout_api::proof::is_http_url(a) {
            anyhow::bail!("--prometheus-address {a:?} is not an http(s) URL");
        }
    }
    let mut secrets = std::collections::BTreeMap::<String, Vec<String>>::new();
    for (name, url) in &args.prometheus_secrets {
        secrets.entry(name.clone()).or_default().push(url.clone());
    }
    Ok(saferollout_core::limits::AdminLimits {
        prometheus_addresses: args.prometheus_addresses.clone(),
        prometheus_secrets: secrets,
        quarantine_no_execute: args.quarantine_allow_no_execute,
        privileged_probes: args.allow_privileged_probes,
        any_address: false,
        selector_strategy: args.selector_strategy,
        node_maintenance: args.node_maintenance,
        owner_revert: args.owner_revert,
    })
}

/// This replica's name in the election: the pod name when deployed, else host and process.
fn identity() -> String {
    let host = std::env::var("POD_NAME")
        .or_else(|_| std::env::var("HOSTNAME"))
        .unwrap_or_else(|_| "saferollout-operator".into());
    format!("{host}-{}", std::process::id())
}

fn main() -> std::process::ExitCode {
    let args = Args::parse();
    let result = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(usize::from(args.worker_threads))
        .on_thread_unpark(allocator::steady_work_on_this_thread)
        .enable_all()
        .build()
        .map_err(anyhow::Error::from)
        .and_then(|runtime| runtime.block_on(run(args)));
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        // One line that says what is wrong and how to fix it (the errors
        // are written for that), not a backtrace.
        Err(e) => {
            eprintln!("saferollout-operator: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> anyhow::Result<()> {
    controller::caches::stores::set_initial_list(args.initial_list);
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info,kube=warn"));
    if args.log_json {
        tracing_subscriber::fmt()
            .json()
            .with_env_filter(filter)
            .init();
    } else {
        tracing_subscriber::fmt().with_env_filter(filter).init();
    }
    if args.lease_grace == 0 || args.lease_grace >= args.lease_duration {
        anyhow::bail!("--lease-grace must be at least 1 and less than --lease-duration");
    }
    let limits = limits(&args)?;
    let config = kube::Config::infer().await.map_err(|e| {
        anyhow::anyhow!(
            "no Kubernetes API to talk to ({e}): run in a pod with a ServiceAccount, or set KUBECONFIG to a kubeconfig file"
        )
    })?;
    // Two connections to the API server: one carries the watches (and the
    // lease), the other the writes, each behind the leader fence (see
    // `client` and `leader`).
    let fence = if args.leader_election {
        leader::Fence::elected()
    } else {
        leader::Fence::always()
    };
    let freshness =
        controller::freshness::Freshness::new(Duration::from_secs(args.watch_stale_after));
    let client = client::watching(config.clone(), freshness.clone())?;
    let writer = client::fenced(config, fence.clone())?;
    let metrics = Arc::new(metrics::Metrics::default());
    let listener = tokio::net::TcpListener::bind(args.metrics_addr)
        .await
        .map_err(|e| {
            anyhow::anyhow!(
                "cannot serve metrics on {} ({e}): choose another address with --metrics-addr",
                args.metrics_addr
            )
        })?;
    tracing::info!(
        metrics = %listener.local_addr()?,
        namespaces = ?args.watch_namespaces,
        leader_election = args.leader_election,
        prometheus_addresses = ?limits.prometheus_addresses,
        prometheus_secrets = ?limits.prometheus_secrets.keys().collect::<Vec<_>>(),
        quarantine_allow_no_execute = limits.quarantine_no_execute,
        allow_privileged_probes = limits.privileged_probes,
        node_maintenance = limits.node_maintenance,
        owner_revert = limits.owner_revert,
        "starting saferollout-operator"
    );
    let server = tokio::spawn(metrics::serve(listener, metrics.clone()));
    let options = controller::Options {
        namespaces: args.watch_namespaces,
        device_gates: args.device_gates,
        per_node_pod_watches: args.per_node_pod_watches,
        limits,
        freshness,
        fleet_policies: args.fleet_policies,
    };
    let election = async {
        if !args.leader_election {
            return Ok(leader::sole_leader(fence));
        }
        let namespace = args
            .leader_election_namespace
            .or_else(|| std::env::var("POD_NAMESPACE").ok())
            .unwrap_or_else(|| "saferollout-system".into());
        let config = leader::ElectionConfig {
            namespace,
            lease_name: args.leader_election_lease_name,
            identity: identity(),
            duration: args.lease_duration,
            grace: args.lease_grace,
        };
        tracing::info!(lease = %config.lease_name, namespace = %config.namespace, identity = %config.identity, "joining the leader election");
        leader::elect(client.clone(), config, fence).await
    };
    // The caches fill while the election runs (start-up at 5,000 nodes is
    // mostly their initial lists).
    let (leadership, started) = tokio::try_join!(
        election,
        controller::start(client.clone(), writer, metrics.clone(), options)
    )?;
    metrics.set_lease_known();
    let leader::Leadership {
        fence,
        changes,
        step_down,
    } = leadership;
    let result = tokio::select! {
        r = controller::run(started, fence, changes) => r,
        r = server => r.map_err(anyhow::Error::from).and_then(|r| r),
    };
    step_down.release().await;
    result
}
