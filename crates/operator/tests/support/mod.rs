//! Helpers shared by the integration tests of the operator: the tools of
//! tests/tools/build-bins, the operator as a child process, the simulated
//! plugin and its rollout.
#![allow(dead_code)] // each test binary uses a different part

pub mod dra;
pub mod faults;
pub mod vendors;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use futures::StreamExt;
use k8s_openapi::api::apps::v1::{ControllerRevision, DaemonSet};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use saferollout_api::{SafeRollout, SafeRolloutStatus};
use saferollout_testkit::{TestCluster, repo_root, wait_for_all, wait_for_object};
use serde_json::json;

pub const GPUS: i64 = 8;
pub const TIMEOUT: Duration = Duration::from_secs(120);

/// The directory of helm, promtool, prometheus and gitops-check, built or
/// installed by tests/tools/build-bins (cached; tests/setup runs it first).
pub fn tools_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let out = Command::new(repo_root().join("tests/tools/build-bins"))
            .stderr(Stdio::inherit())
            .output()
            .expect("running tests/tools/build-bins");
        assert!(out.status.success(), "tests/tools/build-bins failed");
        let text = String::from_utf8(out.stdout).expect("utf-8");
        PathBuf::from(text.lines().last().unwrap_or_default())
    })
}

pub fn tool(name: &str) -> PathBuf {
    tools_dir().join(name)
}

/// Output of a command that must succeed (the error carries stderr).
pub fn run(cmd: &mut Command) -> anyhow::Result<String> {
    let out = cmd.output().with_context(|| format!("running {cmd:?}"))?;
    if !out.status.success() {
        bail!(
            "{cmd:?} failed with {}: {}{}",
            out.status,
            String::from_utf8_lossy(&out.stderr),
            String::from_utf8_lossy(&out.stdout)
        );
    }
    Ok(String::from_utf8(out.stdout)?)
}

/// `helm ARGS` run in the repository root.
pub fn helm(args: &[&str]) -> anyhow::Result<String> {
    run(Command::new(tool("helm"))
        .current_dir(repo_root())
        .args(args))
}

/// The chart's `template` (`templates/<file>`) rendered as `deploy/render`
/// renders it (release saferollout in saferollout-system, objects named
/// saferollout-operator), with `values` (`key=value` each, as `--set`).
pub fn render_chart(template: &str, values: &[String]) -> anyhow::Result<String> {
    let show = format!("templates/{template}");
    let mut args = vec![
        "template",
        "saferollout",
        "charts/saferollout",
        "--namespace",
        "saferollout-system",
        "--set",
        "fullnameOverride=saferollout-operator",
        "--show-only",
        &show,
    ];
    for v in values {
        args.extend(["--set", v.as_str()]);
    }
    helm(&args)
}

/// Installs the CRD from deploy/ and waits until it is served.
pub fn install_crd(c: &TestCluster) -> anyhow::Result<()> {
    install_crd_file(c, "deploy/crd.yaml", "saferollouts.saferollout.dev")
}

/// Installs the SafeRolloutPolicy CRD from deploy/ and waits until it is served.
pub fn install_policy_crd(c: &TestCluster) -> anyhow::Result<()> {
    install_crd_file(
        c,
        "deploy/crd-policy.yaml",
        "saferolloutpolicies.saferollout.dev",
    )
}

fn install_crd_file(c: &TestCluster, file: &str, name: &str) -> anyhow::Result<()> {
    c.kubectl(&[
        "apply",
        "--server-side",
        "-f",
        &repo_root().join(file).to_string_lossy(),
    ])?;
    let crd = format!("crd/{name}");
    // A CRD just created has no status yet, and `kubectl wait` refuses an
    // object without conditions ("accessor error") rather than waiting for
    // them: ask again until it has some (seen on a fresh cluster).
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match c.kubectl(&["wait", "--for=condition=Established", &crd, "--timeout=60s"]) {
            Ok(_) => return Ok(()),
            Err(e) if e.to_string().contains("accessor error") && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(200));
            }
            Err(e) => return Err(e),
        }
    }
}

/// Installs the CRD and the operator's RBAC from deploy/, as a user would.
pub fn install(c: &TestCluster) -> anyhow::Result<()> {
    install_crd(c)?;
    c.kubectl(&[
        "apply",
        "--server-side",
        "-f",
        &repo_root().join("deploy/rbac.yaml").to_string_lossy(),
    ])?;
    Ok(())
}

/// Grants the operator's ServiceAccount the rules of the chart's
/// `selector.enabled` (create and delete DaemonSets, patch pods): the
/// chart's RBAC rendered with it and applied over deploy/rbac.yaml's.
pub fn grant_selector_rbac(c: &TestCluster) -> anyhow::Result<()> {
    grant_chart_rbac(c, "selector.enabled=true")
}

/// Grants the operator's ServiceAccount the chart's RBAC rendered with
/// `value` (`key=value`) over deploy/rbac.yaml's.
pub fn grant_chart_rbac(c: &TestCluster, value: &str) -> anyhow::Result<()> {
    let rbac = render_chart("rbac.yaml", &[value.to_string()])?;
    let file = std::env::temp_dir().join(format!(
        "saferollout-rbac-{}-{}.yaml",
        value.replace(['=', '.'], "-"),
        std::process::id()
    ));
    std::fs::write(&file, rbac)?;
    c.kubectl(&["apply", "--server-side", "-f", &file.to_string_lossy()])?;
    Ok(())
}

/// A free TCP port on 127.0.0.1 (the listener is closed before it is used:
/// another process could take it in between, which a test then reports).
pub fn free_loopback_port() -> anyhow::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// A plain HTTP/1.0 GET to 127.0.0.1: (status code, body).
pub fn http_get(port: u16, path: &str) -> anyhow::Result<(u16, String)> {
    http_request(port, "GET", path, None)
}

/// An HTTP/1.0 request to 127.0.0.1:`port`, with a JSON body if any:
/// (status, body).
pub fn http_request(
    port: u16,
    method: &str,
    path: &str,
    json_body: Option<&str>,
) -> anyhow::Result<(u16, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    let body = json_body.unwrap_or_default();
    write!(
        s,
        "{method} {path} HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\nAccept: application/json\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)?;
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text
        .split_once("\r\n\r\n")
        .with_context(|| format!("no HTTP header in {text:?}"))?;
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .with_context(|| format!("no status in {head:?}"))?;
    Ok((code, body.to_string()))
}

/// `saferollout_leader` of the operator serving metrics on `port`.
pub fn is_leader(port: u16) -> Option<bool> {
    let (code, body) = http_get(port, "/metrics").ok()?;
    (code == 200).then(|| body.lines().any(|l| l == "saferollout_leader 1"))
}

/// Polls `f` every 250 ms until it returns `Some`, or fails after `timeout`
/// with `what`. For things no watch can tell (an HTTP API, a log file).
pub async fn poll<T>(
    what: &str,
    timeout: Duration,
    mut f: impl FnMut() -> anyhow::Result<Option<T>>,
) -> anyhow::Result<T> {
    let deadline = Instant::now() + timeout;
    let mut last_err = None;
    loop {
        match f() {
            Ok(Some(v)) => return Ok(v),
            Ok(None) => {}
            Err(e) => last_err = Some(e),
        }
        if Instant::now() > deadline {
            let why =
                format!("timed out after {timeout:?} waiting for {what}; last error: {last_err:?}");
            saferollout_testkit::keep_cluster(&why);
            bail!(why);
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The operator's arguments in the tests: watching `namespaces`
/// (comma-separated), metrics on `metrics_addr`, a lease of `lease` seconds
/// renewed 1 s before it expires, so a killed operator of an earlier test
/// holds the next one back that long at most.
pub fn operator_args(namespaces: &str, metrics_addr: &str, lease: u64) -> Vec<String> {
    let mut args = operator_args_default_lease(namespaces, metrics_addr);
    let lease = lease.to_string();
    args.extend(["--lease-duration", &lease, "--lease-grace", "1"].map(String::from));
    args
}

/// [`operator_args`] with the operator's own lease settings, for the tests
/// of what those settings do under faults.
pub fn operator_args_default_lease(namespaces: &str, metrics_addr: &str) -> Vec<String> {
    ["--namespace", namespaces, "--metrics-addr", metrics_addr]
        .map(String::from)
        .to_vec()
}

/// How the operator authenticates.
pub enum Identity<'a> {
    /// The cluster admin's kubeconfig, impersonating this user.
    Impersonate(&'a Path, &'a str),
    /// A kubeconfig of its own (e.g. a ServiceAccount token).
    Kubeconfig(&'a Path),
}

/// The operator binary as a child process, killed when dropped.
pub struct Operator {
    child: Child,
    pub log: PathBuf,
}

impl Operator {
    pub fn start(identity: Identity, args: &[String], log_name: &str) -> anyhow::Result<Self> {
        Self::start_with_env(identity, args, &[], log_name)
    }

    pub fn start_with_env(
        identity: Identity,
        args: &[String],
        env: &[(&str, &str)],
        log_name: &str,
    ) -> anyhow::Result<Self> {
        let log = std::env::temp_dir().join(format!("saferollout-operator-{log_name}.log"));
        let file = std::fs::File::create(&log)?;
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_saferollout-operator"));
        cmd.args(args)
            // SAFEROLLOUT_TEST_RUST_LOG: more of the operator's log when
            // debugging a test.
            .env(
                "RUST_LOG",
                std::env::var("SAFEROLLOUT_TEST_RUST_LOG")
                    .unwrap_or_else(|_| "info,kube=warn".into()),
            )
            .env_remove("SAFEROLLOUT_NAMESPACE")
            .envs(env.iter().copied())
            .stdout(Stdio::from(file.try_clone()?))
            .stderr(Stdio::from(file));
        match identity {
            Identity::Impersonate(kubeconfig, user) => {
                cmd.env("KUBECONFIG", kubeconfig)
                    .env("KUBE_RS_DEBUG_IMPERSONATE_USER", user);
            }
            Identity::Kubeconfig(kubeconfig) => {
                cmd.env("KUBECONFIG", kubeconfig)
                    .env_remove("KUBE_RS_DEBUG_IMPERSONATE_USER");
            }
        }
        let child = cmd.spawn()?;
        eprintln!("operator {log_name} logs to {}", log.display());
        Ok(Operator { child, log })
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// The process's peak resident memory so far (`VmHWM`), in KiB.
    pub fn peak_rss_kib(&self) -> anyhow::Result<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))?;
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .context("no VmHWM in /proc/<pid>/status")
    }

    /// Sends `signal` (`STOP`, `CONT`, ...) to the process.
    pub fn signal(&self, signal: &str) -> anyhow::Result<()> {
        let status = Command::new("kill")
            .args([&format!("-{signal}"), &self.child.id().to_string()])
            .status()?;
        anyhow::ensure!(status.success(), "kill -{signal} failed");
        Ok(())
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Operator {
    /// SIGTERM first, so the operator gives its leader lease up and the next
    /// test's operator takes it at once; SIGKILL if it has not exited in 5 s.
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline && matches!(self.child.try_wait(), Ok(None)) {
            std::thread::sleep(Duration::from_millis(50));
        }
        self.kill();
    }
}

/// Runs `kubectl-saferollout` (built beside the operator) against the test
/// cluster: exit code, stdout, stderr.
pub fn kubectl_saferollout(args: &[&str]) -> anyhow::Result<(i32, String, String)> {
    let bin =
        Path::new(env!("CARGO_BIN_EXE_saferollout-operator")).with_file_name("kubectl-saferollout");
    anyhow::ensure!(
        bin.exists(),
        "{} not built (cargo build -p saferollout-cli)",
        bin.display()
    );
    let out = Command::new(&bin)
        .arg("--kubeconfig")
        .arg(saferollout_testkit::cluster().kubeconfig())
        .args(args)
        .output()?;
    Ok((
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    ))
}

/// `--help` of the operator binary, to tell which flags it has.
pub fn operator_help() -> &'static str {
    static HELP: OnceLock<String> = OnceLock::new();
    HELP.get_or_init(|| {
        run(Command::new(env!("CARGO_BIN_EXE_saferollout-operator")).arg("--help"))
            .expect("saferollout-operator --help")
    })
}

/// The pod template of the simulated device plugin, advertising `resource`.
pub fn agent_template(resource: &str, image: &str) -> serde_json::Value {
    json!({
        "metadata": {
            "labels": {"app": "plugin", "sim.saferollout.dev/agent": "device-plugin"},
            "annotations": {"sim.saferollout.dev/resource": resource}
        },
        "spec": {"containers": [{"name": "plugin", "image": image}]}
    })
}

/// A plugin DaemonSet `plugin` on every node, waited on until each node
/// advertises its GPUs.
pub async fn create_plugin_daemonset(
    client: &Client,
    ns: &str,
    resource: &str,
    image: &str,
) -> anyhow::Result<()> {
    let ds: DaemonSet = serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "plugin"},
        "spec": {"selector": {"matchLabels": {"app": "plugin"}}, "template": agent_template(resource, image)}
    }))?;
    Api::<DaemonSet>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &ds)
        .await?;
    wait_agents(client, ns, image).await?;
    wait_every_node_advertises(client, resource).await
}

/// Waits until every node advertises its GPUs of `resource`.
pub async fn wait_every_node_advertises(client: &Client, resource: &str) -> anyhow::Result<()> {
    let res = resource.to_string();
    wait_for_all(
        &Api::<Node>::all(client.clone()),
        watcher::Config::default(),
        TIMEOUT,
        move |ns| ns.iter().all(|n| allocatable(n, &res) == Some(GPUS)),
    )
    .await?;
    Ok(())
}

/// Waits until every node runs one Ready agent pod with `image`.
pub async fn wait_agents(client: &Client, ns: &str, image: &str) -> anyhow::Result<()> {
    let nodes = Api::<Node>::all(client.clone())
        .list(&Default::default())
        .await?;
    let want = nodes.items.len();
    wait_live_pods(client, ns, "app=plugin", |live| {
        live.len() == want && live.iter().all(|p| pod_ready(p) && image_of(p) == image)
    })
    .await?;
    Ok(())
}

/// Waits until `done` holds for the live pods (not being deleted) matching
/// `selector` in `ns`; returns every pod the watch showed then.
pub async fn wait_live_pods(
    client: &Client,
    ns: &str,
    selector: &str,
    done: impl Fn(&[&Arc<Pod>]) -> bool,
) -> anyhow::Result<Vec<Arc<Pod>>> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    wait_for_all(
        &pods,
        watcher::Config::default().labels(selector),
        TIMEOUT,
        |ps| {
            let live: Vec<&Arc<Pod>> = ps
                .iter()
                .filter(|p| p.metadata.deletion_timestamp.is_none())
                .collect();
            done(&live)
        },
    )
    .await
}

/// Each live pod's UID by node (the last one listed on a node wins).
pub fn uids_by_node<'a>(pods: impl IntoIterator<Item = &'a Pod>) -> BTreeMap<String, String> {
    pods.into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .map(|p| {
            let node = p
                .spec
                .as_ref()
                .and_then(|s| s.node_name.clone())
                .unwrap_or_default();
            (node, p.metadata.uid.clone().unwrap_or_default())
        })
        .collect()
}

/// The default rollout of the tests: 1 node, 50%, 100%, allocatable pinned to the baseline.
pub fn default_spec(resource: &str, image: &str) -> serde_json::Value {
    json!({
        "targetRef": {"name": "plugin"},
        "template": agent_template(resource, image),
        "stages": [{"nodes": 1}, {"nodes": "50%"}, {"nodes": "100%"}],
        "progressDeadline": "3m",
        "gates": {"allocatable": [{"resource": resource, "min": "baseline", "max": "baseline", "soak": "2s"}]}
    })
}

pub async fn create_rollout(
    client: &Client,
    ns: &str,
    name: &str,
    spec: serde_json::Value,
) -> anyhow::Result<()> {
    let sr: SafeRollout = serde_json::from_value(json!({
        "apiVersion": "saferollout.dev/v1alpha1", "kind": "SafeRollout",
        "metadata": {"name": name}, "spec": spec
    }))?;
    Api::<SafeRollout>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &sr)
        .await?;
    Ok(())
}

/// Waits until the operator adopted the DaemonSet: Succeeded on a stable
/// revision, with the last-good backup (a ControllerRevision) written.
/// (Not `status.lastGoodTemplate`: today's operator sometimes fills it in
/// only on its next reconcile, which nothing may trigger.)
pub async fn wait_adopted(
    client: &Client,
    ns: &str,
    name: &str,
) -> anyhow::Result<SafeRolloutStatus> {
    let st = wait_status(client, ns, name, TIMEOUT, |st| {
        st.phase == Some(saferollout_api::Phase::Succeeded) && st.stable_revision.is_some()
    })
    .await?;
    let backup = format!(
        "{name}-last-good-{}",
        st.stable_revision.clone().unwrap_or_default()
    );
    let revisions: Api<ControllerRevision> = Api::namespaced(client.clone(), ns);
    wait_for_object(&revisions, &backup, TIMEOUT, |cr| cr.is_some()).await?;
    Ok(st)
}

pub async fn set_template_image(
    client: &Client,
    ns: &str,
    name: &str,
    resource: &str,
    image: &str,
) -> anyhow::Result<()> {
    let patch = json!({"spec": {"template": agent_template(resource, image)}});
    Api::<SafeRollout>::namespaced(client.clone(), ns)
        .patch(name, &PatchParams::default(), &Patch::Merge(patch))
        .await?;
    Ok(())
}

pub async fn wait_status(
    client: &Client,
    ns: &str,
    name: &str,
    timeout: Duration,
    done: impl Fn(&SafeRolloutStatus) -> bool,
) -> anyhow::Result<SafeRolloutStatus> {
    let api: Api<SafeRollout> = Api::namespaced(client.clone(), ns);
    let sr = wait_for_object(&api, name, timeout, |sr| {
        sr.and_then(|s| s.status.as_ref()).is_some_and(&done)
    })
    .await?
    .context("exists")?;
    Ok(sr.status.unwrap_or_default())
}

pub fn condition<'a>(
    st: &'a SafeRolloutStatus,
    type_: &str,
) -> Option<&'a k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition> {
    st.conditions.iter().find(|c| c.type_ == type_)
}

pub fn pod_ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

pub fn image_of(p: &Pod) -> &str {
    p.spec
        .as_ref()
        .and_then(|s| s.containers.first())
        .and_then(|c| c.image.as_deref())
        .unwrap_or("")
}

/// A node's allocatable count of `res` (quantities in any notation: `8k` is 8000).
pub fn allocatable(n: &Node, res: &str) -> Option<i64> {
    saferollout_api::quantity_count(n.status.as_ref()?.allocatable.as_ref()?.get(res)?)
}

/// Names of the agent pods of `ns` that are not being deleted.
pub async fn agent_pod_names(client: &Client, ns: &str) -> anyhow::Result<Vec<String>> {
    let pods = Api::<Pod>::namespaced(client.clone(), ns)
        .list(&kube::api::ListParams::default().labels("app=plugin"))
        .await?;
    let mut names: Vec<String> = pods
        .items
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .map(|p| p.name_any())
        .collect();
    names.sort();
    Ok(names)
}

/// What the pod sampler saw.
#[derive(Default, Debug)]
pub struct Samples {
    /// Per event: the nodes with no live Ready agent pod.
    pub unavailable: Vec<BTreeSet<String>>,
    /// Agent pods created (first seen after the watch started), per node, by image.
    pub created: BTreeMap<(String, String), usize>,
    /// Agent pods deleted by UID.
    pub deleted: BTreeSet<String>,
    /// Every agent pod seen bound to a node, by name.
    pub pods: BTreeMap<String, SeenPod>,
    /// Errors of the watch (each followed by a new watch or a list).
    pub watch_errors: usize,
    /// Lists after the first: the watch broke and could not resume (its
    /// resource version expired, 410), so it listed again.
    pub relists: usize,
}

/// An agent pod as the sampler saw it.
#[derive(Debug, Clone)]
pub struct SeenPod {
    pub node: String,
    pub image: String,
}

impl Samples {
    /// The most nodes unavailable at once, leaving `exempt` out.
    pub fn max_unavailable(&self, exempt: &BTreeSet<String>) -> (usize, BTreeSet<String>) {
        self.unavailable
            .iter()
            .map(|s| s.difference(exempt).cloned().collect::<BTreeSet<_>>())
            .map(|s| (s.len(), s))
            .max_by_key(|(n, _)| *n)
            .unwrap_or_default()
    }

    /// Asserts that each of `nodes` nodes got exactly one agent pod of
    /// `image`: none was replaced twice.
    pub fn assert_each_node_got_one(&self, image: &str, nodes: usize) {
        let per_node: BTreeMap<&String, usize> = self
            .created
            .iter()
            .filter(|((_, i), _)| i == image)
            .map(|((n, _), c)| (n, *c))
            .collect();
        assert_eq!(per_node.len(), nodes, "{per_node:?}");
        assert!(
            per_node.values().all(|c| *c == 1),
            "a node was replaced twice: {per_node:?}"
        );
    }
}

/// Samples the agent pods (`app=plugin`) of `ns` until the task is aborted;
/// `nodes` are the nodes that should each run one. A watch that has to list
/// again (its resource version expired) counts the pods first seen in that
/// list as created, and samples nothing until the list is complete.
pub fn sample_pods(
    client: &Client,
    ns: &str,
    nodes: Vec<String>,
) -> (Arc<Mutex<Samples>>, tokio::task::JoinHandle<()>) {
    let samples = Arc::new(Mutex::new(Samples::default()));
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    let s = samples.clone();
    let task = tokio::spawn(async move {
        let mut live: BTreeMap<String, Pod> = BTreeMap::new();
        // Pods that existed before, or were already counted when first bound.
        let mut known: BTreeSet<String> = BTreeSet::new();
        // Between a list's start and its end `live` is partial: no samples.
        let mut listing = true;
        let mut listed_once = false;
        let mut stream = watcher(api, watcher::Config::default().labels("app=plugin"))
            .default_backoff()
            .boxed();
        while let Some(ev) = stream.next().await {
            // An error (the connection broke, the resource version expired):
            // the watcher backs off and watches or lists again. Ending here
            // would stop sampling in silence.
            let Ok(ev) = ev else {
                s.lock().unwrap().watch_errors += 1;
                continue;
            };
            let mut s = s.lock().unwrap();
            match ev {
                watcher::Event::Init => {
                    live.clear();
                    listing = true;
                    if listed_once {
                        s.relists += 1;
                    }
                }
                watcher::Event::InitApply(p) => {
                    if !listed_once {
                        known.insert(p.uid().unwrap_or_default());
                    }
                    // In a later list: made while the watch was down.
                    seen(&mut s, &mut known, &p, listed_once);
                    live.insert(p.uid().unwrap_or_default(), p);
                }
                watcher::Event::InitDone => {
                    listing = false;
                    listed_once = true;
                }
                watcher::Event::Apply(p) => {
                    let uid = p.uid().unwrap_or_default();
                    seen(&mut s, &mut known, &p, true);
                    if p.metadata.deletion_timestamp.is_some() {
                        s.deleted.insert(uid.clone());
                    }
                    live.insert(uid, p);
                }
                watcher::Event::Delete(p) => {
                    s.deleted.insert(p.uid().unwrap_or_default());
                    live.remove(&p.uid().unwrap_or_default());
                }
            }
            if listing {
                continue;
            }
            let serving: BTreeSet<String> = live
                .values()
                .filter(|p| p.metadata.deletion_timestamp.is_none() && pod_ready(p))
                .filter_map(|p| p.spec.as_ref()?.node_name.clone())
                .collect();
            let all: BTreeSet<String> = nodes.iter().cloned().collect();
            s.unavailable
                .push(all.difference(&serving).cloned().collect());
        }
    });
    (samples, task)
}

/// Records an agent pod seen by [`sample_pods`]; with `count`, a pod first
/// seen bound to its node counts as created.
fn seen(s: &mut Samples, known: &mut BTreeSet<String>, p: &Pod, count: bool) {
    let uid = p.uid().unwrap_or_default();
    let node = p
        .spec
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .unwrap_or_default();
    if node.is_empty() {
        return;
    }
    // Counted once, when first seen bound to its node.
    if count && known.insert(uid) {
        *s.created
            .entry((node.clone(), image_of(p).to_string()))
            .or_default() += 1;
    }
    s.pods.entry(p.name_any()).or_insert_with(|| SeenPod {
        node,
        image: image_of(p).to_string(),
    });
}

/// Prometheus (tests/tools/build-bins) on 127.0.0.1, stopped when dropped.
/// Its scrape targets are static loopback addresses only.
pub struct Prometheus {
    child: Child,
    pub port: u16,
    dir: PathBuf,
}

impl Prometheus {
    /// Starts Prometheus with a 1 s scrape and evaluation interval and
    /// `config` (rule files, scrape configs) after the global section.
    pub fn start(name: &str, config: &str) -> anyhow::Result<Self> {
        Self::start_with_args(name, config, &[])
    }

    /// [`Prometheus::start`] with more command-line arguments (e.g.
    /// `--web.config.file` for TLS).
    pub fn start_with_args(name: &str, config: &str, args: &[String]) -> anyhow::Result<Self> {
        let dir = std::env::temp_dir().join(format!(
            "saferollout-prometheus-{name}-{}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;
        let config = format!("global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n{config}");
        std::fs::write(dir.join("prometheus.yml"), config)?;
        let port = free_loopback_port()?;
        let log = std::fs::File::create(dir.join("prometheus.log"))?;
        let child = Command::new(tool("prometheus"))
            .arg(format!(
                "--config.file={}",
                dir.join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .args(args)
            .stdout(Stdio::from(log.try_clone()?))
            .stderr(Stdio::from(log))
            .spawn()?;
        eprintln!(
            "prometheus on 127.0.0.1:{port} logs to {}",
            dir.join("prometheus.log").display()
        );
        Ok(Prometheus { child, port, dir })
    }

    /// `data` of a successful Prometheus API answer.
    pub fn api(&self, path: &str) -> anyhow::Result<serde_json::Value> {
        let (code, body) = http_get(self.port, path)?;
        anyhow::ensure!(code == 200, "GET {path}: {code} {body}");
        let v: serde_json::Value = serde_json::from_str(&body)?;
        anyhow::ensure!(v["status"] == "success", "GET {path}: {body}");
        Ok(v["data"].clone())
    }

    /// The alerts in state `firing` named `name`.
    pub fn firing(&self, name: &str) -> anyhow::Result<Vec<serde_json::Value>> {
        let data = self.api("/api/v1/alerts")?;
        Ok(data["alerts"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|a| a["labels"]["alertname"] == name && a["state"] == "firing")
            .cloned()
            .collect())
    }

    /// Waits until Prometheus is ready and every target is up, checking that
    /// each target is on loopback.
    pub async fn wait_targets_up(&self, targets: usize) -> anyhow::Result<()> {
        poll("Prometheus ready", TIMEOUT, || {
            Ok(http_get(self.port, "/-/ready")
                .ok()
                .filter(|(code, _)| *code == 200))
        })
        .await?;
        poll("Prometheus targets up", TIMEOUT, || {
            let data = self.api("/api/v1/targets")?;
            let active = data["activeTargets"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            for t in &active {
                let url = t["scrapeUrl"].as_str().unwrap_or_default();
                anyhow::ensure!(
                    url.starts_with("http://127.0.0.1:"),
                    "a target that is not on loopback: {url}"
                );
            }
            Ok(
                (active.len() == targets && active.iter().all(|t| t["health"] == "up"))
                    .then_some(()),
            )
        })
        .await
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(self.dir.join("data"));
    }
}

/// Waits until an Event `reason` about a SafeRollout exists in `ns` (the
/// operator publishes Events after its status write and its other actions,
/// so a test that saw the status must wait for them) and returns the
/// namespace's Events as seen then.
pub async fn wait_events(
    client: &Client,
    ns: &str,
    reason: &str,
) -> anyhow::Result<Vec<k8s_openapi::api::core::v1::Event>> {
    let api: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(client.clone(), ns);
    let reason = reason.to_string();
    let seen = wait_for_all(&api, watcher::Config::default(), TIMEOUT, move |es| {
        es.iter().any(|e| {
            e.reason.as_deref() == Some(reason.as_str())
                && e.involved_object.kind.as_deref() == Some("SafeRollout")
        })
    })
    .await?;
    Ok(seen.iter().map(|e| (**e).clone()).collect())
}

/// The nodes that still carry the rollout label value `id`.
pub async fn nodes_labelled(client: &Client, id: &str) -> anyhow::Result<Vec<String>> {
    let nodes = Api::<k8s_openapi::api::core::v1::Node>::all(client.clone())
        .list(&Default::default())
        .await?;
    Ok(nodes
        .items
        .iter()
        .filter(|n| {
            n.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(saferollout_api::ROLLOUT_LABEL))
                .is_some_and(|v| v == id)
        })
        .map(|n| n.metadata.name.clone().unwrap_or_default())
        .collect())
}
