//! What every scenario of one cluster size shares.

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};

use jiff::Timestamp;
use kube::Client;

use crate::cluster::{Cluster, OPERATOR_USER, Operator, by_label, reconcile_metrics};
use crate::results::OperatorRun;
use saferollout_testkit::audit;

pub struct Ctx {
    pub cluster: Cluster,
    pub client: Client,
    pub operator_bin: PathBuf,
    pub operator_kubeconfig: PathBuf,
    /// Where operator logs go.
    pub log_dir: PathBuf,
    pub nodes: usize,
    pub node_names: Vec<String>,
    /// How long each new agent pod of the overhead runs takes to turn Ready
    /// and advertise (0: at once; else the fixture's `-slow` agents).
    pub agent_start_secs: u64,
    versions: AtomicUsize,
}

impl Ctx {
    pub fn new(
        cluster: Cluster,
        client: Client,
        operator_bin: PathBuf,
        operator_kubeconfig: PathBuf,
        log_dir: PathBuf,
        node_names: Vec<String>,
        agent_start_secs: u64,
    ) -> Self {
        Ctx {
            nodes: cluster.nodes,
            cluster,
            client,
            operator_bin,
            operator_kubeconfig,
            log_dir,
            node_names,
            agent_start_secs,
            versions: AtomicUsize::new(1),
        }
    }

    /// A fresh image tag, `registry.example/agent:v<N><suffix>`.
    pub fn image(&self, suffix: &str) -> String {
        let n = self.versions.fetch_add(1, Ordering::Relaxed);
        format!("registry.example/agent:v{n}{suffix}")
    }

    /// A fresh healthy image for an overhead run: `-slow` (Ready and
    /// advertising `agent_start_secs` after it starts) when that is set.
    pub fn rollout_image(&self) -> String {
        self.image(if self.agent_start_secs > 0 {
            "-slow"
        } else {
            ""
        })
    }

    pub fn start_operator(&self, label: &str) -> anyhow::Result<Operator> {
        let log = self
            .log_dir
            .join(format!("operator-{}-{label}.log", self.nodes));
        eprintln!("bench: operator ({label}) logs to {}", log.display());
        Operator::start(&self.operator_bin, &self.operator_kubeconfig, log)
    }

    /// Stops the operator and gathers what it cost: memory, CPU, its requests
    /// from the audit log, its start-up time, its reconciles.
    pub fn finish_operator(
        &self,
        op: Operator,
        label: &str,
        rollouts: usize,
    ) -> anyhow::Result<OperatorRun> {
        let metrics = op.metrics().unwrap_or_default();
        let (reconcile_sum, reconciles, reconcile_results) = reconcile_metrics(&metrics);
        let wakes = by_label(&metrics, "saferollout_wakes_total");
        let started = op.started;
        let (stat, stopped) = op.stop()?;
        let requests: Vec<audit::Request> = audit::read(&self.cluster.audit_log())?
            .into_iter()
            .filter(|r| r.user == OPERATOR_USER)
            .collect();
        let first_status = requests
            .iter()
            .filter(|r| r.received >= started && r.received < stopped)
            .find(|r| r.key() == "patch saferollouts/status")
            .map(|r| r.received);
        let lists_after_startup = first_status
            .map(|t| {
                audit::lists_between(&requests, t, stopped)
                    .iter()
                    .map(|r| format!("{} at {}", r.key(), r.received))
                    .collect()
            })
            .unwrap_or_default();
        Ok(OperatorRun {
            label: label.to_string(),
            nodes: self.nodes,
            rollouts,
            startup_secs: first_status.map(|t| secs(started, t)),
            wall_secs: secs(started, stopped),
            stat,
            requests: audit::count_between(&requests, started, stopped),
            lists_after_startup,
            reconciles,
            reconcile_mean_ms: if reconciles > 0.0 {
                reconcile_sum / reconciles * 1000.0
            } else {
                0.0
            },
            reconcile_results,
            wakes,
        })
    }
}

pub fn secs(a: Timestamp, b: Timestamp) -> f64 {
    b.duration_since(a).as_secs_f64()
}
