//! The local real control plane (tests/cluster/up) with the operator's CRD,
//! RBAC and a token for its ServiceAccount, and the operator as a child process.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context, bail};
use jiff::Timestamp;
use saferollout_testkit::{kubectl, repo_root};

use crate::procfs::{self, ProcStat};

/// The operator's ServiceAccount (deploy/rbac.yaml), as the audit log names it.
pub const OPERATOR_USER: &str = "system:serviceaccount:saferollout-system:saferollout-operator";

/// A cluster started by tests/cluster/up with the bench's audit policy.
pub struct Cluster {
    pub kubeconfig: PathBuf,
    pub state_dir: PathBuf,
    pub nodes: usize,
}

impl Cluster {
    /// Starts a cluster of `nodes` nodes in `state_dir` (up is idempotent: a
    /// running cluster there is reused as it is).
    pub fn up(
        nodes: usize,
        gpus: usize,
        state_dir: &Path,
        audit_policy: Option<&Path>,
        agent_start_secs: u64,
    ) -> anyhow::Result<Self> {
        let up = repo_root().join("tests/cluster/up");
        let policy = audit_policy.map_or_else(
            || repo_root().join("bench/audit-policy.yaml"),
            Path::to_path_buf,
        );
        let mut command = Command::new(&up);
        if agent_start_secs > 0 {
            command.args(["--sim-slow-delay", &format!("{agent_start_secs}s")]);
        }
        let out = command
            .args(["--nodes", &nodes.to_string()])
            .args(["--gpus-per-node", &gpus.to_string()])
            .arg("--state-dir")
            .arg(state_dir)
            .arg("--audit-policy")
            .arg(&policy)
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
        let cluster = Cluster {
            kubeconfig: kubeconfig.into(),
            state_dir: state_dir.to_path_buf(),
            nodes,
        };
        if !cluster.audit_log().exists() {
            bail!(
                "{} has no audit log: a cluster started without bench/audit-policy.yaml is running there; stop it with tests/cluster/down --state-dir {}",
                state_dir.display(),
                state_dir.display()
            );
        }
        Ok(cluster)
    }

    pub fn down(&self) -> anyhow::Result<()> {
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

    pub fn audit_log(&self) -> PathBuf {
        self.state_dir.join("logs/audit.log")
    }

    pub fn kubectl(&self, args: &[&str]) -> anyhow::Result<String> {
        kubectl(&self.kubeconfig, args)
    }

    /// The components `up` started, by name, with their PIDs.
    pub fn components(&self) -> anyhow::Result<Vec<(String, u32)>> {
        let text = std::fs::read_to_string(self.state_dir.join("pids"))?;
        text.lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| {
                let (name, pid) = l.split_once(' ').context("bad pids line")?;
                Ok((name.to_string(), pid.trim().parse()?))
            })
            .collect()
    }

    /// Reads every component's memory and CPU.
    pub fn component_stats(&self) -> anyhow::Result<Vec<(String, ProcStat)>> {
        self.components()?
            .into_iter()
            .map(|(name, pid)| Ok((name, procfs::read(pid)?)))
            .collect()
    }

    /// Installs the CRD and the operator's RBAC from deploy/ and writes a
    /// kubeconfig that authenticates with a token of its ServiceAccount.
    pub fn install_operator(&self) -> anyhow::Result<PathBuf> {
        for f in ["deploy/crd.yaml", "deploy/rbac.yaml"] {
            let path = repo_root().join(f);
            self.kubectl(&["apply", "--server-side", "-f", &path.to_string_lossy()])?;
        }
        self.kubectl(&[
            "wait",
            "--for=condition=Established",
            "crd/saferollouts.saferollout.dev",
            "--timeout=60s",
        ])?;
        let token = self.kubectl(&[
            "create",
            "token",
            "saferollout-operator",
            "-n",
            "saferollout-system",
            "--duration=48h",
        ])?;
        let ports = std::fs::read_to_string(self.state_dir.join("ports"))?;
        let port = ports
            .lines()
            .find_map(|l| l.strip_prefix("kube-apiserver "))
            .context("no kube-apiserver port in the state dir")?
            .trim()
            .to_string();
        let ca = self.state_dir.join("pki/ca.crt");
        let kubeconfig = serde_json::json!({
            "apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": "bench", "cluster": {
                "server": format!("https://127.0.0.1:{port}"),
                "certificate-authority": ca,
            }}],
            "users": [{"name": "operator", "user": {"token": token.trim()}}],
            "contexts": [{"name": "operator", "context": {"cluster": "bench", "user": "operator"}}],
            "current-context": "operator",
        });
        let path = self.state_dir.join("operator.kubeconfig");
        std::fs::write(&path, serde_json::to_vec_pretty(&kubeconfig)?)?;
        Ok(path)
    }
}

/// The operator binary running against the cluster as its ServiceAccount.
pub struct Operator {
    child: Child,
    pub started: Timestamp,
    pub metrics_port: u16,
}

impl Operator {
    pub fn start(bin: &Path, kubeconfig: &Path, log: PathBuf) -> anyhow::Result<Self> {
        let metrics_port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let file = std::fs::File::create(&log)?;
        let started = Timestamp::now();
        let child = Command::new(bin)
            .args([
                "--metrics-addr",
                &format!("127.0.0.1:{metrics_port}"),
                "--leader-election-namespace",
                "saferollout-system",
            ])
            .env("KUBECONFIG", kubeconfig)
            // SAFEROLLOUT_BENCH_OPERATOR_LOG, e.g. `info,saferollout::pass=debug`
            // for each pass's time split when profiling.
            .env(
                "RUST_LOG",
                std::env::var("SAFEROLLOUT_BENCH_OPERATOR_LOG")
                    .unwrap_or_else(|_| "info,kube=warn".into()),
            )
            .env_remove("KUBE_RS_DEBUG_IMPERSONATE_USER")
            .stdin(Stdio::null())
            .stdout(Stdio::from(file.try_clone()?))
            .stderr(Stdio::from(file))
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        Ok(Operator {
            child,
            started,
            metrics_port,
        })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn stat(&self) -> anyhow::Result<ProcStat> {
        procfs::read(self.pid())
    }

    /// The operator's Prometheus metrics (text format).
    pub fn metrics(&self) -> anyhow::Result<String> {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(("127.0.0.1", self.metrics_port))?;
        s.set_read_timeout(Some(Duration::from_secs(10)))?;
        write!(
            s,
            "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1:{}\r\n\r\n",
            self.metrics_port
        )?;
        let mut raw = String::new();
        s.read_to_string(&mut raw)?;
        Ok(raw
            .split_once("\r\n\r\n")
            .map(|(_, b)| b.to_string())
            .unwrap_or_default())
    }

    /// SIGTERM (the operator gives its lease up), SIGKILL after 10 s. Returns
    /// the last reading of the process taken just before.
    pub fn stop(mut self) -> anyhow::Result<(ProcStat, Timestamp)> {
        let stat = self.stat()?;
        let stopped = Timestamp::now();
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while std::time::Instant::now() < deadline && matches!(self.child.try_wait(), Ok(None)) {
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        Ok((stat, stopped))
    }
}

impl Drop for Operator {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `sum` and `count` of a histogram and the counters of `saferollout_reconciles_total`.
pub fn reconcile_metrics(text: &str) -> (f64, f64, Vec<(String, f64)>) {
    let value = |prefix: &str| -> f64 {
        text.lines()
            .filter(|l| l.starts_with(prefix))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    let sum = value("saferollout_reconcile_duration_seconds_sum");
    let count = value("saferollout_reconcile_duration_seconds_count");
    (sum, count, by_label(text, "saferollout_reconciles_total"))
}

/// The series of the one-label counter `name`: (label value, value).
pub fn by_label(text: &str, name: &str) -> Vec<(String, f64)> {
    let prefix = format!("{name}{{");
    text.lines()
        .filter(|l| l.starts_with(&prefix))
        .filter_map(|l| {
            let label = l.split('"').nth(1)?.to_string();
            Some((label, l.rsplit(' ').next()?.parse().ok()?))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_reconcile_metrics() {
        let text = "# HELP x\nsaferollout_reconcile_duration_seconds_sum 1.5\nsaferollout_reconcile_duration_seconds_count 30\nsaferollout_reconciles_total{result=\"success\"} 28\nsaferollout_reconciles_total{result=\"requeue\"} 2\n";
        let (sum, count, results) = reconcile_metrics(text);
        assert_eq!((sum, count), (1.5, 30.0));
        assert_eq!(
            results,
            vec![("success".into(), 28.0), ("requeue".into(), 2.0)]
        );
    }

    #[test]
    fn reads_wakes_by_cause() {
        let text = "saferollout_wakes_total{cause=\"agent_pod\"} 12\nsaferollout_wakes_total_created 3\nsaferollout_wakes_total{cause=\"node\"} 0\n";
        assert_eq!(
            by_label(text, "saferollout_wakes_total"),
            vec![("agent_pod".into(), 12.0), ("node".into(), 0.0)]
        );
    }
}
