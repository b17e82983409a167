//! What the sim serves besides API objects: container log files for KWOK's
//! kubelet server (with the KWOK `Logs` object that points at them), and
//! the per-GPU metrics endpoint.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use anyhow::Context as _;
use axum::Router;
use axum::routing::get;
use kube::api::{ApiResource, DynamicObject, Patch, PatchParams};
use kube::{Api, Client};
use serde_json::json;
use tokio::sync::mpsc;
use tracing::{debug, info, warn};

use crate::FIELD_MANAGER;
use crate::model::ids;
use crate::model::metrics::{GpuSample, render};
use crate::model::node::PodLogs;

/// KWOK's per-pod logs configuration (`kwok.x-k8s.io/v1alpha1`, kind
/// `Logs`, served when KWOK runs with `--enable-crds=Logs`).
fn kwok_logs_resource() -> ApiResource {
    ApiResource {
        group: "kwok.x-k8s.io".into(),
        version: "v1alpha1".into(),
        api_version: "kwok.x-k8s.io/v1alpha1".into(),
        kind: "Logs".into(),
        plural: "logs".into(),
    }
}

/// The file a container's log goes to: `<dir>/<namespace>_<pod>_<uid>/<container>.log`
/// (the kubelet's `/var/log/pods` layout, flattened).
pub fn log_path(dir: &Path, logs: &PodLogs, container: &str) -> PathBuf {
    dir.join(format!("{}_{}_{}", logs.namespace, logs.name, logs.uid))
        .join(format!("{container}.log"))
}

/// The result of publishing one pod's logs.
#[derive(Debug)]
pub struct LogOutcome {
    pub node: String,
    pub uid: String,
    pub digest: u64,
    pub ok: bool,
}

/// Which pods' logs are published, failing or on their way: one
/// publication at a time per pod, each content once.
#[derive(Debug, Default)]
pub struct LogLedger {
    /// Digest of what was last published per pod UID.
    published: HashMap<String, u64>,
    /// Digest of what last failed to publish per pod UID.
    failed: HashMap<String, u64>,
    in_flight: HashSet<String>,
}

impl LogLedger {
    /// Where the pod's logs with `digest` stand, and whether to send them
    /// now (they then count as in flight).
    pub fn decide(&mut self, uid: &str, digest: u64) -> (LogState, bool) {
        if self.published.get(uid) == Some(&digest) {
            return (LogState::Published, false);
        }
        let state = if self.failed.get(uid) == Some(&digest) {
            LogState::Failing
        } else {
            LogState::Pending
        };
        let send = self.in_flight.insert(uid.to_owned());
        (state, send)
    }

    /// Records a finished publication; returns whether it failed.
    pub fn complete(&mut self, uid: &str, digest: u64, ok: bool) -> bool {
        self.in_flight.remove(uid);
        if ok {
            self.published.insert(uid.to_owned(), digest);
            self.failed.remove(uid);
        } else {
            self.failed.insert(uid.to_owned(), digest);
        }
        !ok
    }

    /// Forgets pods that are gone.
    pub fn retain(&mut self, alive: impl Fn(&str) -> bool) {
        self.published.retain(|uid, _| alive(uid));
        self.failed.retain(|uid, _| alive(uid));
    }
}

/// Writes log files and their KWOK `Logs` objects, each pod's only when its
/// lines changed, one publication at a time per pod.
pub struct LogPublisher {
    dir: PathBuf,
    client: Client,
    outcomes: mpsc::UnboundedSender<LogOutcome>,
    ledger: LogLedger,
}

impl LogPublisher {
    pub fn new(dir: PathBuf, client: Client, outcomes: mpsc::UnboundedSender<LogOutcome>) -> Self {
        Self {
            dir,
            client,
            outcomes,
            ledger: LogLedger::default(),
        }
    }

    /// Publishes `logs` unless that exact content is published or on its
    /// way, and says where the pod's logs stand.
    pub fn publish(&mut self, node: &str, logs: PodLogs) -> LogState {
        let digest = digest(&logs);
        let (state, send) = self.ledger.decide(&logs.uid, digest);
        if !send {
            return state;
        }
        let dir = self.dir.clone();
        let client = self.client.clone();
        let outcomes = self.outcomes.clone();
        let node = node.to_owned();
        // Said once per pod and content; retries are quiet.
        let loud = state == LogState::Pending;
        tokio::spawn(async move {
            let uid = logs.uid.clone();
            let pod = format!("{}/{}", logs.namespace, logs.name);
            let ok = match write_logs(&dir, client, &logs).await {
                Ok(()) => true,
                Err(error) if loud => {
                    warn!(pod, "publishing logs failed; retrying: {error:#}");
                    false
                }
                Err(error) => {
                    debug!(pod, "publishing logs failed again: {error:#}");
                    false
                }
            };
            let _ = outcomes.send(LogOutcome {
                node,
                uid,
                digest,
                ok,
            });
        });
        state
    }

    /// Records a finished publication; returns whether it failed.
    pub fn complete(&mut self, outcome: &LogOutcome) -> bool {
        self.ledger
            .complete(&outcome.uid, outcome.digest, outcome.ok)
    }

    /// Forgets pods that are gone.
    pub fn retain(&mut self, alive: impl Fn(&str) -> bool) {
        self.ledger.retain(alive);
    }
}

/// Where a pod's current logs stand.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogState {
    Published,
    /// Being written for the first time.
    Pending,
    /// Writing this content failed before; being retried. Nobody waits for
    /// it (a broken log directory or a missing KWOK CRD must not stop pods
    /// from ending).
    Failing,
}

fn digest(logs: &PodLogs) -> u64 {
    let mut parts: Vec<&str> = vec![&logs.namespace, &logs.name, &logs.uid];
    for (container, text) in &logs.containers {
        parts.push(container);
        parts.push(text);
    }
    ids::hash(&parts)
}

async fn write_logs(dir: &Path, client: Client, logs: &PodLogs) -> anyhow::Result<()> {
    let mut entries = Vec::new();
    for (container, text) in &logs.containers {
        let path = log_path(dir, logs, container);
        let parent = path.parent().context("log path has a parent")?;
        tokio::fs::create_dir_all(parent)
            .await
            .with_context(|| format!("creating {}", parent.display()))?;
        // Written aside and renamed, so a reader never sees half a file.
        let tmp = path.with_extension("log.tmp");
        tokio::fs::write(&tmp, text)
            .await
            .with_context(|| format!("writing {}", tmp.display()))?;
        tokio::fs::rename(&tmp, &path)
            .await
            .with_context(|| format!("renaming {}", tmp.display()))?;
        let file = path.to_string_lossy().into_owned();
        entries.push(json!({
            "containers": [container],
            "logsFile": file,
            "previousLogsFile": file,
        }));
    }
    let object = json!({
        "apiVersion": "kwok.x-k8s.io/v1alpha1",
        "kind": "Logs",
        "metadata": {
            "name": logs.name,
            "namespace": logs.namespace,
            "ownerReferences": [{
                "apiVersion": "v1", "kind": "Pod", "name": logs.name, "uid": logs.uid,
            }],
        },
        "spec": {"logs": entries},
    });
    let api: Api<DynamicObject> =
        Api::namespaced_with(client, &logs.namespace, &kwok_logs_resource());
    api.patch(
        &logs.name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(object),
    )
    .await
    .context("applying the KWOK Logs object")?;
    Ok(())
}

/// The GPU readings of every node, shared with the metrics endpoint.
#[derive(Clone, Debug, Default)]
pub struct GpuMetrics {
    nodes: Arc<RwLock<BTreeMap<String, Vec<GpuSample>>>>,
}

impl GpuMetrics {
    /// Replaces a node's readings (`None`: the node is gone).
    pub fn set(&self, node: &str, samples: Option<Vec<GpuSample>>) {
        let mut nodes = self.nodes.write().unwrap_or_else(|e| e.into_inner());
        match samples {
            Some(samples) if !samples.is_empty() => {
                nodes.insert(node.to_owned(), samples);
            }
            _ => {
                nodes.remove(node);
            }
        }
    }

    pub fn render(&self) -> String {
        let nodes = self.nodes.read().unwrap_or_else(|e| e.into_inner());
        render(nodes.values().flatten())
    }
}

/// Serves `/metrics` (and `/healthz`) on `addr` until the process ends.
/// Binding happens before returning, so a bad address is an error at start.
pub async fn serve_metrics(addr: SocketAddr, metrics: GpuMetrics) -> anyhow::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding the metrics address {addr}"))?;
    let bound = listener.local_addr()?;
    let app = Router::new()
        .route(
            "/metrics",
            get(move || {
                let metrics = metrics.clone();
                async move {
                    (
                        [(
                            axum::http::header::CONTENT_TYPE,
                            "application/openmetrics-text; version=1.0.0; charset=utf-8",
                        )],
                        metrics.render(),
                    )
                }
            }),
        )
        .route("/healthz", get(|| async { "ok" }));
    tokio::spawn(async move {
        if let Err(error) = axum::serve(listener, app).await {
            warn!(%error, "the metrics server stopped");
        }
    });
    info!(%bound, "serving GPU metrics at /metrics");
    Ok(bound)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_content_is_published_once_and_failures_stop_holding_back() {
        let mut ledger = LogLedger::default();
        assert_eq!(ledger.decide("a", 1), (LogState::Pending, true));
        // In flight: not sent twice, still pending.
        assert_eq!(ledger.decide("a", 1), (LogState::Pending, false));
        assert!(!ledger.complete("a", 1, true));
        assert_eq!(ledger.decide("a", 1), (LogState::Published, false));
        // New content goes out; a failure makes it Failing (retried, not
        // waited for) until it succeeds.
        assert_eq!(ledger.decide("a", 2), (LogState::Pending, true));
        assert!(ledger.complete("a", 2, false));
        assert_eq!(ledger.decide("a", 2), (LogState::Failing, true));
        assert!(!ledger.complete("a", 2, true));
        assert_eq!(ledger.decide("a", 2), (LogState::Published, false));
        ledger.retain(|uid| uid != "a");
        assert_eq!(ledger.decide("a", 2), (LogState::Pending, true));
    }

    #[test]
    fn log_paths_follow_the_pod() {
        let logs = PodLogs {
            namespace: "ns".into(),
            name: "p".into(),
            uid: "u".into(),
            containers: BTreeMap::new(),
        };
        assert_eq!(
            log_path(Path::new("/s"), &logs, "agent"),
            PathBuf::from("/s/ns_p_u/agent.log")
        );
    }
}
