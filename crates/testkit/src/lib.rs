//! Test helpers for saferollout's integration tests.
//!
//! Every integration test runs against a real control plane started by
//! `tests/cluster/up` (kube-apiserver, etcd, kube-controller-manager,
//! kube-scheduler, KWOK, the agent fixture). [`cluster`] starts one per test
//! binary on first use and stops it when the test process exits, or reuses a
//! running one:
//!
//! - `SAFEROLLOUT_TEST_KUBECONFIG=<path>` reuses that cluster;
//! - `KUBECONFIG` is reused only when it points at a saferollout test cluster
//!   (its cluster entry is named `saferollout-test`), so tests never touch a
//!   real cluster by accident.
//!
//! Each test gets its own client ([`TestCluster::client`]; a client is tied to
//! the tokio runtime that made it and each `#[tokio::test]` has its own) and its
//! own namespace ([`TestCluster::namespace`]).

pub mod audit;
mod control_plane;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use anyhow::{Context, bail};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use kube::api::{Api, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::{WatchStreamExt, reflector, watcher};
use kube::{Client, Config, Resource};
use serde::de::DeserializeOwned;

pub use control_plane::{ControlPlane, Etcd, StoppedApiServer};

/// The repository root, found at run time from the test's package directory
/// (cargo sets `CARGO_MANIFEST_DIR` for test processes) or the working
/// directory. Not `env!`: a build cache shared between checkouts would bake in
/// another checkout's path.
pub fn repo_root() -> PathBuf {
    let start = std::env::var_os("CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        .or_else(|| std::env::current_dir().ok())
        .expect("a package directory or a working directory");
    start
        .ancestors()
        .find(|p| p.join("tests/cluster/up").is_file())
        .unwrap_or_else(|| panic!("no saferollout checkout above {}", start.display()))
        .to_path_buf()
}

/// A running test cluster.
#[derive(Debug)]
pub struct TestCluster {
    kubeconfig: PathBuf,
    /// The state dir when this process started the cluster; `None` when reused.
    state_dir: Option<PathBuf>,
}

static CLUSTER: OnceLock<TestCluster> = OnceLock::new();

/// The cluster for this test binary, started on first use.
pub fn cluster() -> &'static TestCluster {
    cluster_with(&Needs::default())
}

/// What a test binary needs of its cluster beyond what every test gets.
#[derive(Debug, Clone, Default)]
pub struct Needs {
    /// The API server writes an audit log with this policy
    /// (`up --audit-policy`; [`ControlPlane::audit_log`]).
    pub audit_policy: Option<PathBuf>,
}

/// The cluster for this test binary, started on first use with `needs`; a
/// reused cluster is checked for them (the first call decides: a binary
/// with needs asks through this function only).
pub fn cluster_with(needs: &Needs) -> &'static TestCluster {
    CLUSTER.get_or_init(|| TestCluster::start_or_reuse(needs).expect("starting the test cluster"))
}

/// Options for [`ClusterProcess::start`].
#[derive(Debug, Clone)]
pub struct ClusterOptions {
    pub nodes: usize,
    pub gpus_per_node: usize,
    pub state_dir: PathBuf,
    /// `up --audit-policy`.
    pub audit_policy: Option<PathBuf>,
}

/// A cluster started by `tests/cluster/up`, stopped by `tests/cluster/down`.
#[derive(Debug)]
pub struct ClusterProcess {
    pub kubeconfig: PathBuf,
    pub state_dir: PathBuf,
}

impl ClusterProcess {
    /// Runs `tests/cluster/up` and returns once the cluster is ready.
    pub fn start(opts: &ClusterOptions) -> anyhow::Result<Self> {
        let up = repo_root().join("tests/cluster/up");
        let mut cmd = Command::new(&up);
        cmd.arg("--nodes")
            .arg(opts.nodes.to_string())
            .arg("--gpus-per-node")
            .arg(opts.gpus_per_node.to_string())
            .arg("--state-dir")
            .arg(&opts.state_dir);
        if let Some(policy) = &opts.audit_policy {
            cmd.arg("--audit-policy").arg(policy);
        }
        let out = cmd
            .stdin(Stdio::null())
            .stderr(Stdio::inherit())
            .output()
            .with_context(|| format!("running {}", up.display()))?;
        if !out.status.success() {
            bail!("{} failed with {}", up.display(), out.status);
        }
        let stdout = String::from_utf8_lossy(&out.stdout);
        let last = stdout.lines().last().unwrap_or_default();
        let kubeconfig = last
            .strip_prefix("export KUBECONFIG=")
            .with_context(|| format!("up's last line is not an export line: {last:?}"))?;
        Ok(Self {
            kubeconfig: PathBuf::from(kubeconfig),
            state_dir: opts.state_dir.clone(),
        })
    }

    /// Runs `tests/cluster/down`.
    pub fn stop(&self) -> anyhow::Result<()> {
        let status = Command::new(repo_root().join("tests/cluster/down"))
            .arg("--state-dir")
            .arg(&self.state_dir)
            .stdin(Stdio::null())
            .status()?;
        if !status.success() {
            bail!("tests/cluster/down failed with {status}");
        }
        Ok(())
    }

    /// PIDs recorded by `up`, by component name.
    pub fn pids(&self) -> anyhow::Result<Vec<(String, u32)>> {
        let text = std::fs::read_to_string(self.state_dir.join("pids"))?;
        parse_name_number_lines(&text)
    }

    /// Ports picked by `up`, by component name.
    pub fn ports(&self) -> anyhow::Result<Vec<(String, u16)>> {
        let text = std::fs::read_to_string(self.state_dir.join("ports"))?;
        parse_name_number_lines(&text)
    }
}

fn parse_name_number_lines<N: std::str::FromStr>(text: &str) -> anyhow::Result<Vec<(String, N)>> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let (name, n) = l
                .split_once(' ')
                .with_context(|| format!("bad line {l:?}"))?;
            let n = n
                .trim()
                .parse()
                .map_err(|_| anyhow::anyhow!("bad number in {l:?}"))?;
            Ok((name.to_string(), n))
        })
        .collect()
}

/// True when the kubeconfig's clusters include the one `tests/cluster/up` writes.
fn is_test_cluster_kubeconfig(path: &Path) -> bool {
    Kubeconfig::read_from(path)
        .map(|kc| kc.clusters.iter().any(|c| c.name == "saferollout-test"))
        .unwrap_or(false)
}

impl TestCluster {
    fn start_or_reuse(needs: &Needs) -> anyhow::Result<Self> {
        let reused = std::env::var_os("SAFEROLLOUT_TEST_KUBECONFIG")
            .map(PathBuf::from)
            .or_else(|| {
                std::env::var_os("KUBECONFIG")
                    .map(PathBuf::from)
                    .filter(|p| is_test_cluster_kubeconfig(p))
            });
        if let Some(kubeconfig) = reused {
            let c = Self {
                kubeconfig,
                state_dir: None,
            };
            if let Some(policy) = &needs.audit_policy {
                let audited = c.control_plane().and_then(|cp| cp.audit_log());
                anyhow::ensure!(
                    matches!(audited, Ok(Some(_))),
                    "this test binary reads the API server's audit log, and the cluster of {} keeps none ({audited:?}): start it with tests/cluster/up --audit-policy {}",
                    c.kubeconfig.display(),
                    policy.display()
                );
            }
            return Ok(c);
        }
        let exe = std::env::current_exe()?;
        let name = exe.file_stem().and_then(|s| s.to_str()).unwrap_or("test");
        let state_dir =
            std::env::temp_dir().join(format!("saferollout-test-{name}-{}", std::process::id()));
        let proc = ClusterProcess::start(&ClusterOptions {
            nodes: 4,
            gpus_per_node: 8,
            state_dir: state_dir.clone(),
            audit_policy: needs.audit_policy.clone(),
        })?;
        spawn_reaper(&state_dir)?;
        keep_cluster_on_failure(&state_dir, &proc.kubeconfig);
        Ok(Self {
            kubeconfig: proc.kubeconfig,
            state_dir: Some(state_dir),
        })
    }

    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// Where `up` keeps the cluster's logs and state, when this process started it.
    pub fn state_dir(&self) -> Option<&Path> {
        self.state_dir.as_deref()
    }

    /// The cluster's processes and ports, from the state dir `up` wrote:
    /// the one this process started, or a reused cluster's (`up` writes its
    /// kubeconfig there).
    pub fn control_plane(&self) -> anyhow::Result<ControlPlane> {
        let dir = match &self.state_dir {
            Some(d) => d.clone(),
            None => self
                .kubeconfig
                .parent()
                .context("the kubeconfig's directory")?
                .to_path_buf(),
        };
        anyhow::ensure!(
            dir.join("pids").is_file() && dir.join("ports").is_file(),
            "{} is not a state dir of tests/cluster/up (no pids and ports files)",
            dir.display()
        );
        Ok(ControlPlane {
            dir,
            kubeconfig: self.kubeconfig.clone(),
        })
    }

    /// A client for the current tokio runtime.
    pub async fn client(&self) -> anyhow::Result<Client> {
        client_for(&self.kubeconfig).await
    }

    /// A fresh namespace (`<prefix>-<n>`) whose default ServiceAccount exists,
    /// deleted (without waiting) when the guard drops.
    pub async fn namespace(&self, prefix: &str) -> anyhow::Result<TestNamespace> {
        let client = self.client().await?;
        let api: Api<Namespace> = Api::all(client.clone());
        let mut ns = Namespace::default();
        ns.metadata.generate_name = Some(format!("{prefix}-"));
        let created = api.create(&PostParams::default(), &ns).await?;
        let name = created.metadata.name.context("namespace without name")?;
        // Pods are refused until the ServiceAccount controller made `default`.
        let sas: Api<ServiceAccount> = Api::namespaced(client, &name);
        wait_for_object(&sas, "default", Duration::from_secs(60), |sa| sa.is_some()).await?;
        Ok(TestNamespace {
            name,
            kubeconfig: self.kubeconfig.clone(),
        })
    }

    /// Runs `kubectl` (the test cluster's own build) against this cluster.
    pub fn kubectl(&self, args: &[&str]) -> anyhow::Result<String> {
        kubectl(&self.kubeconfig, args)
    }
}

/// A client from a kubeconfig file.
pub async fn client_for(kubeconfig: &Path) -> anyhow::Result<Client> {
    let kc = Kubeconfig::read_from(kubeconfig)?;
    let config = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await?;
    Ok(Client::try_from(config)?)
}

/// The directory holding the control-plane binaries (`tests/cluster/build-bins`).
pub fn bin_dir() -> anyhow::Result<PathBuf> {
    let out = Command::new(repo_root().join("tests/cluster/build-bins"))
        .stderr(Stdio::inherit())
        .output()?;
    if !out.status.success() {
        bail!("build-bins failed with {}", out.status);
    }
    let text = String::from_utf8(out.stdout)?;
    Ok(PathBuf::from(text.lines().last().unwrap_or_default()))
}

/// Runs the test cluster's kubectl with a kubeconfig; errors carry stderr.
pub fn kubectl(kubeconfig: &Path, args: &[&str]) -> anyhow::Result<String> {
    static KUBECTL: OnceLock<PathBuf> = OnceLock::new();
    let kubectl =
        KUBECTL.get_or_init(|| bin_dir().expect("control-plane binaries").join("kubectl"));
    let out = Command::new(kubectl)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .output()?;
    if !out.status.success() {
        bail!(
            "kubectl {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8(out.stdout)?)
}

/// Where the cluster of a test binary in which a test failed is kept: its
/// logs and a dump of the objects tests work on, for whoever reads the failure.
pub fn kept_dir(state_dir: &Path) -> PathBuf {
    let name = state_dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    std::env::temp_dir().join("saferollout-failed").join(name)
}

/// Marker file: a test of this process failed, keep the cluster's logs.
const FAILED_MARKER: &str = "FAILED";

/// The cluster this process started, to keep when a test fails.
static STARTED: OnceLock<(PathBuf, PathBuf)> = OnceLock::new();

/// Marks the cluster this process started to be kept when the test binary
/// exits (its logs, state and a dump of the objects tests work on), and says
/// where. Called on a panic and when a wait times out (tests that fail by
/// returning an error run no panic hook). Only the first call dumps.
pub fn keep_cluster(why: &str) {
    static ONCE: std::sync::Once = std::sync::Once::new();
    let Some((state_dir, kubeconfig)) = STARTED.get() else {
        return; // a reused cluster is not ours to keep
    };
    ONCE.call_once(|| {
        let _ = std::fs::write(state_dir.join(FAILED_MARKER), why);
        let kinds = "nodes,pods,daemonsets,controllerrevisions,saferollouts,leases,events";
        let args = ["get", kinds, "-A", "-o", "yaml", "--request-timeout=20s"];
        if let Ok(dump) = kubectl(kubeconfig, &args) {
            let _ = std::fs::write(state_dir.join("objects.yaml"), dump);
        }
        eprintln!(
            "a test failed: the cluster's logs and objects will be kept in {} once this test binary exits",
            kept_dir(state_dir).display()
        );
    });
}

fn keep_cluster_on_failure(state_dir: &Path, kubeconfig: &Path) {
    let _ = STARTED.set((state_dir.to_path_buf(), kubeconfig.to_path_buf()));
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        previous(info);
        keep_cluster(&info.to_string());
    }));
}

/// Stops the cluster in `state_dir` once this process has exited: Rust runs no
/// destructors for statics, so a detached watcher does it. When a test failed,
/// the logs and state are copied to [`kept_dir`] first.
fn spawn_reaper(state_dir: &Path) -> anyhow::Result<()> {
    let down = repo_root().join("tests/cluster/down");
    let keep = kept_dir(state_dir);
    let script = format!(
        "tail --pid={pid} -f /dev/null; \
         if [ -e {dir}/{FAILED_MARKER} ]; then mkdir -p {keep} && cp -r {dir}/. {keep}/ 2>/dev/null; rm -rf {keep}/etcd; fi; \
         exec {down} --state-dir {dir}",
        pid = std::process::id(),
        down = shell_quote(&down.to_string_lossy()),
        dir = shell_quote(&state_dir.to_string_lossy()),
        keep = shell_quote(&keep.to_string_lossy()),
    );
    Command::new("setsid")
        .args(["sh", "-c", &script])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("spawning the cluster reaper")?;
    Ok(())
}

fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// A namespace owned by one test.
#[derive(Debug)]
pub struct TestNamespace {
    pub name: String,
    kubeconfig: PathBuf,
}

impl Drop for TestNamespace {
    fn drop(&mut self) {
        // Best effort and non-blocking: the cluster goes away with the test binary.
        let _ = kubectl(
            &self.kubeconfig,
            &["delete", "namespace", &self.name, "--wait=false"],
        );
    }
}

/// Waits, by watching, until `done` holds for the object named `name` (`None`
/// while it does not exist). Returns the object it held for.
pub async fn wait_for_object<K>(
    api: &Api<K>,
    name: &str,
    timeout: Duration,
    done: impl Fn(Option<&K>) -> bool,
) -> anyhow::Result<Option<K>>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut last: Option<K> = None;
    let fut = async {
        let mut stream = watcher(api.clone(), config).default_backoff().boxed();
        while let Some(event) = stream.try_next().await? {
            match event {
                watcher::Event::Init => {
                    last = None;
                    continue;
                }
                // Judge only complete pictures: "absent" is not known before InitDone.
                watcher::Event::InitApply(o) => {
                    last = Some(o);
                    continue;
                }
                watcher::Event::Apply(o) => last = Some(o),
                watcher::Event::Delete(_) => last = None,
                watcher::Event::InitDone => {}
            }
            if done(last.as_ref()) {
                return Ok::<_, anyhow::Error>(last.clone());
            }
        }
        bail!("watch on {name} ended")
    };
    match tokio::time::timeout(timeout, fut).await {
        Ok(r) => r,
        Err(_) => {
            let why =
                format!("timed out after {timeout:?} waiting for {name}; last seen: {last:#?}");
            keep_cluster(&why);
            bail!(why)
        }
    }
}

/// Waits, by watching a set of objects, until `done` holds for all of them
/// together. Returns the set it held for.
pub async fn wait_for_all<K>(
    api: &Api<K>,
    config: watcher::Config,
    timeout: Duration,
    done: impl Fn(&[std::sync::Arc<K>]) -> bool,
) -> anyhow::Result<Vec<std::sync::Arc<K>>>
where
    K: Resource<DynamicType = ()>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    let (reader, writer) = reflector::store();
    let fut = async {
        let mut stream = reflector(writer, watcher(api.clone(), config).default_backoff()).boxed();
        while let Some(event) = stream.try_next().await? {
            if matches!(event, watcher::Event::Init | watcher::Event::InitApply(_)) {
                continue; // judge only complete pictures
            }
            let state = reader.state();
            if done(&state) {
                return Ok::<_, anyhow::Error>(state);
            }
        }
        bail!("watch ended")
    };
    match tokio::time::timeout(timeout, fut).await {
        Ok(r) => r,
        Err(_) => {
            let why = format!(
                "timed out after {timeout:?}; last seen: {:#?}",
                reader.state()
            );
            keep_cluster(&why);
            bail!(why)
        }
    }
}
