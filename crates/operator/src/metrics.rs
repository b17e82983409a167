//! Prometheus metrics, served on `/metrics` with `/healthz` and `/readyz`.
//! Alert rules (`deploy/prometheus-rules.yaml`) fire on these names: keep
//! them stable. Cardinality is bounded: series per SafeRollout (and per gate
//! of it), never per node.
//!
//! Everything per rollout is recorded after the status write succeeded, from
//! the written status ([`Metrics::observe_status`]) and what changed
//! ([`Metrics::record_transitions`], decided by `saferollout_core::transitions`):
//! a failed write counts nothing, the pass that repeats it counts once.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use saferollout_api::{GateStatus, Phase, SafeRolloutStatus};
use saferollout_core::transitions::Transitions;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RolloutLabels {
    pub namespace: String,
    pub name: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PhaseLabels {
    pub namespace: String,
    pub name: String,
    pub phase: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct GateLabels {
    pub namespace: String,
    pub name: String,
    pub gate: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct GateReasonLabels {
    pub namespace: String,
    pub name: String,
    pub gate: String,
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RollbackLabels {
    pub namespace: String,
    pub name: String,
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabels {
    pub error: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    pub result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResourceLabels {
    pub resource: String,
}

/// A watched store (see `controller::freshness::StoreKey`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StoreLabels {
    pub resource: String,
    /// Empty: cluster-wide, or every namespace.
    pub namespace: String,
    /// The watch's label and field selectors, `labels;fields`.
    pub selector: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CauseLabels {
    pub cause: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AllocatorLabels {
    pub kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct VersionLabels {
    pub version: String,
}

pub const PHASES: &[Phase] = &[
    Phase::Pending,
    Phase::Progressing,
    Phase::Paused,
    Phase::Succeeded,
    Phase::RollingBack,
    Phase::Degraded,
    Phase::Failed,
];

/// The reasons of the `Waiting` condition (`saferollout_core::fleet`).
const WAIT_REASONS: &[&str] = &[
    "FleetBudgetFull",
    "FleetConcurrencyFull",
    "FleetOrdering",
    "MaintenanceWindow",
    "FleetPolicyInvalid",
];

/// `saferollout_rollout_waiting`'s labels.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WaitingLabels {
    pub namespace: String,
    pub name: String,
    pub reason: String,
}

/// What a reconcile saw of the nodes, for the per-rollout node gauges.
#[derive(Debug, Clone, Copy, Default)]
pub struct NodeCounts {
    /// Nodes the DaemonSet covers now.
    pub in_scope: usize,
    /// Of those, nodes running a live pod of the target revision.
    pub on_target: usize,
}

pub struct Metrics {
    registry: Registry,
    pub phase: Family<PhaseLabels, Gauge>,
    pub phase_transition: Family<RolloutLabels, Gauge>,
    pub stage: Family<RolloutLabels, Gauge>,
    pub stages: Family<RolloutLabels, Gauge>,
    pub nodes_on_target: Family<RolloutLabels, Gauge>,
    pub nodes_in_scope: Family<RolloutLabels, Gauge>,
    /// `status.skippedNodes` (capped at 20 in status, as status is).
    pub nodes_skipped: Family<RolloutLabels, Gauge>,
    /// `status.nodeMaintenance`: the nodes the rollout holds cordoned.
    pub nodes_in_maintenance: Family<RolloutLabels, Gauge>,
    /// `status.disruptedNodes`: under a SafeRolloutPolicy.
    pub nodes_disrupted: Family<RolloutLabels, Gauge>,
    /// 1 for the reason a SafeRolloutPolicy holds the rollout back, 0 for
    /// the others; absent when no policy governs it.
    pub waiting: Family<WaitingLabels, Gauge>,
    pub progress: Family<RolloutLabels, Gauge>,
    pub progress_deadline: Family<RolloutLabels, Gauge>,
    pub gate_result: Family<GateLabels, Gauge>,
    pub gate_failures: Family<GateReasonLabels, Counter>,
    pub rollbacks: Family<RollbackLabels, Counter>,
    pub stages_passed: Family<RolloutLabels, Counter>,
    pub rollouts_succeeded: Family<RolloutLabels, Counter>,
    pub stage_duration: Family<RolloutLabels, Histogram>,
    pub revert_latency: Histogram,
    pub reconcile_duration: Histogram,
    pub reconciles: Family<ResultLabels, Counter>,
    pub reconcile_errors: Family<ErrorLabels, Counter>,
    /// Passes that panicked, by SafeRollout (the pass was abandoned; see
    /// `controller::reconcile`).
    pub reconcile_panics: Family<RolloutLabels, Counter>,
    pub watch_restarts: Family<ResourceLabels, Counter>,
    /// 1 while a store has heard nothing from the API server for longer than
    /// `--watch-stale-after` (see `controller::freshness`).
    pub watch_stale: Family<StoreLabels, Gauge>,
    /// Reconcile requests sent to the work queue, by what sent them (see
    /// `controller::caches::triggers::Cause`); requests for a rollout already queued
    /// merge into one reconcile, so these count at least the reconciles.
    pub wakes: Family<CauseLabels, Counter>,
    pub leader: Gauge,
    /// jemalloc's byte counts, read at each scrape ([`crate::allocator::bytes`]).
    allocator: Family<AllocatorLabels, Gauge>,
    /// Gates with a `gate_result` series, per rollout (so stale ones go).
    gate_series: std::sync::Mutex<std::collections::HashMap<RolloutLabels, Vec<String>>>,
    /// /readyz: every cache synced and the lease state known.
    caches_synced: AtomicBool,
    lease_known: AtomicBool,
}

fn stage_buckets() -> Histogram {
    // 1 s to about 4.5 h.
    Histogram::new(exponential_buckets(1.0, 2.0, 15))
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("saferollout");
        let m = Metrics {
            phase: Family::default(),
            phase_transition: Family::default(),
            stage: Family::default(),
            stages: Family::default(),
            nodes_on_target: Family::default(),
            nodes_in_scope: Family::default(),
            nodes_skipped: Family::default(),
            nodes_in_maintenance: Family::default(),
            nodes_disrupted: Family::default(),
            waiting: Family::default(),
            progress: Family::default(),
            progress_deadline: Family::default(),
            gate_result: Family::default(),
            gate_failures: Family::default(),
            rollbacks: Family::default(),
            stages_passed: Family::default(),
            rollouts_succeeded: Family::default(),
            stage_duration: Family::new_with_constructor(stage_buckets),
            // 10 ms to about 5.5 min.
            revert_latency: Histogram::new(exponential_buckets(0.01, 2.0, 16)),
            reconcile_duration: Histogram::new(exponential_buckets(0.001, 2.0, 14)),
            reconciles: Family::default(),
            reconcile_errors: Family::default(),
            reconcile_panics: Family::default(),
            watch_restarts: Family::default(),
            watch_stale: Family::default(),
            wakes: Family::default(),
            leader: Gauge::default(),
            allocator: Family::default(),
            gate_series: Default::default(),
            caches_synced: AtomicBool::new(false),
            lease_known: AtomicBool::new(false),
            registry: Registry::default(),
        };
        let build_info: Family<VersionLabels, Gauge> = Family::default();
        build_info
            .get_or_create(&VersionLabels {
                version: env!("CARGO_PKG_VERSION").to_string(),
            })
            .set(1);
        registry.register(
            "build_info",
            "The operator's version (always 1)",
            build_info,
        );
        registry.register(
            "allocator_bytes",
            "The memory allocator's bytes by kind (jemalloc): allocated (live objects), \
             active (their pages), resident (pages the allocator holds in RAM, its \
             metadata included), metadata, retained (returned to the kernel, address \
             space kept). Read at each scrape",
            m.allocator.clone(),
        );
        registry.register(
            "rollout_phase",
            "Current phase of each SafeRollout (1 = in this phase)",
            m.phase.clone(),
        );
        registry.register(
            "rollout_phase_transition_timestamp_seconds",
            "Unix time of each SafeRollout's last phase change",
            m.phase_transition.clone(),
        );
        registry.register(
            "rollout_stage",
            "Current stage of each SafeRollout, 1-based (0 = idle)",
            m.stage.clone(),
        );
        registry.register(
            "rollout_stages",
            "Number of stages of each SafeRollout",
            m.stages.clone(),
        );
        registry.register(
            "rollout_nodes_on_target",
            "Nodes the DaemonSet covers that run the target revision",
            m.nodes_on_target.clone(),
        );
        registry.register(
            "rollout_nodes_in_scope",
            "Nodes the target DaemonSet covers",
            m.nodes_in_scope.clone(),
        );
        registry.register(
            "rollout_nodes_skipped",
            "Nodes of the DaemonSet the rollout leaves out while they are NotReady or going out of service (status.skippedNodes, at most 20)",
            m.nodes_skipped.clone(),
        );
        registry.register(
            "rollout_nodes_in_maintenance",
            "Nodes the rollout cordoned for spec.nodeMaintenance (draining, drained or being uncordoned; status.nodeMaintenance)",
            m.nodes_in_maintenance.clone(),
        );
        registry.register(
            "rollout_nodes_disrupted",
            "Nodes where the rollout's agent is being replaced, reverted or failing now (status.disruptedNodes; under a SafeRolloutPolicy)",
            m.nodes_disrupted.clone(),
        );
        registry.register(
            "rollout_waiting",
            "1 for the reason a SafeRolloutPolicy holds the rollout back now (FleetBudgetFull, FleetConcurrencyFull, FleetOrdering, MaintenanceWindow, FleetPolicyInvalid), 0 for the others",
            m.waiting.clone(),
        );
        registry.register(
            "rollout_progress_timestamp_seconds",
            "Unix time of the last progress of the rollout or revert under way (absent when idle)",
            m.progress.clone(),
        );
        registry.register(
            "rollout_progress_deadline_seconds",
            "spec.progressDeadline of each SafeRollout",
            m.progress_deadline.clone(),
        );
        registry.register(
            "gate_result",
            "Verdict of each gate on the current stage: 1 passed, 0 pending, -1 failed",
            m.gate_result.clone(),
        );
        registry.register(
            "gate_failures",
            "Health gate failures that blocked a revision (whatever spec.onFailure then did)",
            m.gate_failures.clone(),
        );
        registry.register(
            "rollbacks",
            "Automatic reverts to the last good template, by reason",
            m.rollbacks.clone(),
        );
        registry.register(
            "stages_passed",
            "Rollout stages that passed every gate",
            m.stages_passed.clone(),
        );
        registry.register(
            "rollouts_succeeded",
            "Rollouts that reached every node",
            m.rollouts_succeeded.clone(),
        );
        registry.register(
            "stage_duration_seconds",
            "Time from a stage's start to its pass",
            m.stage_duration.clone(),
        );
        registry.register(
            "revert_latency_seconds",
            "Time from a gate's failing observation (its soak included) to the revert write",
            m.revert_latency.clone(),
        );
        registry.register(
            "reconcile_duration_seconds",
            "Time spent in one reconcile",
            m.reconcile_duration.clone(),
        );
        registry.register("reconciles", "Reconciles by result", m.reconciles.clone());
        registry.register(
            "reconcile_errors",
            "Reconcile errors by kind",
            m.reconcile_errors.clone(),
        );
        registry.register(
            "reconcile_panics",
            "Passes that panicked (a bug; the pass was abandoned and the other SafeRollouts went on), by SafeRollout",
            m.reconcile_panics.clone(),
        );
        registry.register(
            "watch_restarts",
            "Watches that had to list again (errors, expired resource versions), by resource",
            m.watch_restarts.clone(),
        );
        registry.register(
            "watch_stale",
            "1 while a cache's watch has delivered nothing, not even a bookmark, for longer than --watch-stale-after: the SafeRollouts reading it hold",
            m.watch_stale.clone(),
        );
        registry.register(
            "wakes",
            "Reconcile requests queued on the leader, by cause (an agent pod's change, the DaemonSet's, the SafeRollout's own, a node's, ...)",
            m.wakes.clone(),
        );
        registry.register(
            "leader",
            "1 on the replica holding the leader lease (the one that reconciles)",
            m.leader.clone(),
        );
        Metrics { registry, ..m }
    }
}

fn labels(namespace: &str, name: &str) -> RolloutLabels {
    RolloutLabels {
        namespace: namespace.into(),
        name: name.into(),
    }
}

impl Metrics {
    /// Gauges of one SafeRollout from the status just written.
    pub fn observe_status(
        &self,
        namespace: &str,
        name: &str,
        st: &SafeRolloutStatus,
        stage_count: usize,
        progress_deadline: Duration,
        nodes: NodeCounts,
    ) {
        let l = labels(namespace, name);
        let current = st.phase.unwrap_or_default();
        for p in PHASES {
            let pl = PhaseLabels {
                namespace: namespace.into(),
                name: name.into(),
                phase: p.as_str().into(),
            };
            self.phase.get_or_create(&pl).set(i64::from(*p == current));
        }
        if let Some(t) = &st.phase_transition_time {
            self.phase_transition.get_or_create(&l).set(t.0.as_second());
        }
        let rolling = matches!(
            current,
            Phase::Progressing | Phase::Paused | Phase::RollingBack
        );
        self.stage.get_or_create(&l).set(match st.current_stage {
            Some(s) if rolling => i64::from(s) + 1,
            _ => 0,
        });
        self.stages.get_or_create(&l).set(stage_count as i64);
        self.nodes_on_target
            .get_or_create(&l)
            .set(nodes.on_target as i64);
        self.nodes_in_scope
            .get_or_create(&l)
            .set(nodes.in_scope as i64);
        self.nodes_skipped
            .get_or_create(&l)
            .set(st.skipped_nodes.len() as i64);
        self.nodes_in_maintenance
            .get_or_create(&l)
            .set(st.node_maintenance.len() as i64);
        self.observe_fleet(namespace, name, st);
        match &st.progress {
            Some(p) => {
                self.progress
                    .get_or_create(&l)
                    .set(p.last_progress_time.0.as_second());
            }
            None => {
                self.progress.remove(&l);
            }
        }
        self.progress_deadline
            .get_or_create(&l)
            .set(progress_deadline.as_secs() as i64);
        let gates = st
            .current_stage
            .and_then(|i| st.stage(i))
            .or_else(|| st.stages.last())
            .map(|s| s.gates.as_slice())
            .unwrap_or_default();
        let gate_labels = |gate: &str| GateLabels {
            namespace: namespace.into(),
            name: name.into(),
            gate: gate.into(),
        };
        for g in gates {
            let value = match g.status {
                GateStatus::Passed => 1,
                GateStatus::Pending => 0,
                GateStatus::Failed => -1,
            };
            self.gate_result
                .get_or_create(&gate_labels(&g.gate))
                .set(value);
        }
        let now: Vec<String> = gates.iter().map(|g| g.gate.clone()).collect();
        let mut series = self.gate_series.lock().unwrap_or_else(|e| e.into_inner());
        for old in series
            .get(&l)
            .into_iter()
            .flatten()
            .filter(|g| !now.contains(g))
        {
            self.gate_result.remove(&gate_labels(old));
        }
        series.insert(l, now);
    }

    /// Counters and histograms of what a written status changed.
    pub fn record_transitions(&self, namespace: &str, name: &str, t: &Transitions) {
        let l = labels(namespace, name);
        if let Some(r) = &t.rollback {
            self.rollbacks
                .get_or_create(&RollbackLabels {
                    namespace: namespace.into(),
                    name: name.into(),
                    reason: r.reason.clone(),
                })
                .inc();
        }
        if let Some(f) = &t.gate_failure {
            self.gate_failures
                .get_or_create(&GateReasonLabels {
                    namespace: namespace.into(),
                    name: name.into(),
                    gate: f.gate.clone(),
                    reason: f.reason.clone(),
                })
                .inc();
        }
        for d in &t.stages_passed {
            self.stages_passed.get_or_create(&l).inc();
            self.stage_duration
                .get_or_create(&l)
                .observe(d.as_secs_f64());
        }
        if t.rollout_succeeded {
            self.rollouts_succeeded.get_or_create(&l).inc();
        }
    }

    /// Drops a deleted SafeRollout's gauges.
    /// The fleet gauges: present while a SafeRolloutPolicy governs the
    /// rollout (its status has the `Waiting` condition).
    fn observe_fleet(&self, namespace: &str, name: &str, st: &SafeRolloutStatus) {
        let l = labels(namespace, name);
        let Some(waiting) = st.condition(saferollout_api::CONDITION_WAITING) else {
            self.forget_fleet(namespace, name);
            return;
        };
        self.nodes_disrupted
            .get_or_create(&l)
            .set(st.disrupted_nodes.len() as i64);
        for reason in WAIT_REASONS {
            let held = waiting.status == "True" && waiting.reason == *reason;
            self.waiting
                .get_or_create(&WaitingLabels {
                    namespace: namespace.into(),
                    name: name.into(),
                    reason: (*reason).into(),
                })
                .set(i64::from(held));
        }
    }

    fn forget_fleet(&self, namespace: &str, name: &str) {
        self.nodes_disrupted.remove(&labels(namespace, name));
        for reason in WAIT_REASONS {
            self.waiting.remove(&WaitingLabels {
                namespace: namespace.into(),
                name: name.into(),
                reason: (*reason).into(),
            });
        }
    }

    pub fn forget(&self, namespace: &str, name: &str) {
        self.forget_fleet(namespace, name);
        let l = labels(namespace, name);
        for p in PHASES {
            self.phase.remove(&PhaseLabels {
                namespace: namespace.into(),
                name: name.into(),
                phase: p.as_str().into(),
            });
        }
        for f in [
            &self.phase_transition,
            &self.stage,
            &self.stages,
            &self.nodes_on_target,
            &self.nodes_in_scope,
            &self.nodes_skipped,
            &self.nodes_in_maintenance,
            &self.progress,
            &self.progress_deadline,
        ] {
            f.remove(&l);
        }
        let mut series = self.gate_series.lock().unwrap_or_else(|e| e.into_inner());
        for gate in series.remove(&l).unwrap_or_default() {
            self.gate_result.remove(&GateLabels {
                namespace: namespace.into(),
                name: name.into(),
                gate,
            });
        }
    }

    pub fn observe_reconcile(&self, took: Duration, result: &str) {
        self.reconcile_duration.observe(took.as_secs_f64());
        self.reconciles
            .get_or_create(&ResultLabels {
                result: result.into(),
            })
            .inc();
    }

    pub fn watch_restarted(&self, resource: &str) {
        self.watch_restarts
            .get_or_create(&ResourceLabels {
                resource: resource.into(),
            })
            .inc();
    }

    /// `saferollout_watch_stale` of one store (see `controller::freshness`).
    pub fn set_store_stale(&self, store: StoreLabels, stale: bool) {
        self.watch_stale.get_or_create(&store).set(stale.into());
    }

    pub fn set_caches_synced(&self) {
        self.caches_synced.store(true, Ordering::Release);
    }

    pub fn set_lease_known(&self) {
        self.lease_known.store(true, Ordering::Release);
    }

    /// Ready to serve: every cache listed and the leader lease's state known.
    pub fn is_ready(&self) -> bool {
        self.caches_synced.load(Ordering::Acquire) && self.lease_known.load(Ordering::Acquire)
    }

    pub fn encode(&self) -> String {
        for (kind, bytes) in crate::allocator::bytes() {
            self.allocator
                .get_or_create(&AllocatorLabels { kind })
                .set(i64::try_from(bytes).unwrap_or(i64::MAX));
        }
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .expect("writing to a String");
        out
    }
}

/// Serves `/metrics`, `/healthz` and `/readyz` until the process ends.
pub async fn serve(listener: tokio::net::TcpListener, metrics: Arc<Metrics>) -> anyhow::Result<()> {
    use axum::{Router, http::StatusCode, http::header, routing::get};
    let for_metrics = metrics.clone();
    let app = Router::new()
        .route(
            "/metrics",
            get(move || {
                let m = for_metrics.clone();
                async move {
                    (
                        [(
                            header::CONTENT_TYPE,
                            "application/openmetrics-text; version=1.0.0; charset=utf-8",
                        )],
                        m.encode(),
                    )
                }
            }),
        )
        .route("/healthz", get(|| async { "ok" }))
        .route(
            "/readyz",
            get(move || {
                let ready = metrics.is_ready();
                async move {
                    if ready {
                        (StatusCode::OK, "ok")
                    } else {
                        (
                            StatusCode::SERVICE_UNAVAILABLE,
                            "caches not synced or lease state unknown",
                        )
                    }
                }
            }),
        );
    axum::serve(listener, app).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use saferollout_api::{GateResult, StageStatus};
    use saferollout_core::transitions::Rollback;

    use super::*;

    // With the C library's malloc there are no jemalloc counts to read.
    #[cfg(not(feature = "system-allocator"))]
    #[test]
    fn the_allocator_counts_are_read_at_each_scrape() {
        use std::alloc::{GlobalAlloc, Layout};
        let allocated = |text: &str| -> i64 {
            text.lines()
                .find_map(|l| l.strip_prefix("saferollout_allocator_bytes{kind=\"allocated\"} "))
                .expect("allocated in the scrape")
                .parse()
                .unwrap()
        };
        let m = Metrics::default();
        let text = m.encode();
        for kind in ["allocated", "active", "resident", "metadata", "retained"] {
            assert!(
                text.contains(&format!("saferollout_allocator_bytes{{kind=\"{kind}\"}} ")),
                "{kind} missing from:\n{text}"
            );
        }
        // The test binary's global allocator is not jemalloc: 4 MiB taken
        // from jemalloc directly must show at the next scrape, and be gone
        // from the one after it is freed.
        let before = allocated(&text);
        let layout = Layout::from_size_align(4 << 20, 8).unwrap();
        // SAFETY: a non-zero layout, freed below with the same layout.
        let block = unsafe { tikv_jemallocator::Jemalloc.alloc(layout) };
        assert!(!block.is_null());
        let during = allocated(&m.encode());
        // SAFETY: allocated above by the same allocator with this layout.
        unsafe { tikv_jemallocator::Jemalloc.dealloc(block, layout) };
        let after = allocated(&m.encode());
        assert!(during >= before + (4 << 20), "{before} then {during}");
        assert!(after < during, "{during} then {after}");
    }

    #[test]
    fn status_gauges_and_transition_counters() {
        let m = Metrics::default();
        let st = SafeRolloutStatus {
            phase: Some(Phase::RollingBack),
            current_stage: Some(1),
            phase_transition_time: Some(Time(jiff::Timestamp::from_second(1_800_000_000).unwrap())),
            stages: vec![
                StageStatus::default(),
                StageStatus {
                    index: 1,
                    gates: vec![GateResult {
                        gate: "allocatable/x".into(),
                        status: GateStatus::Failed,
                        ..Default::default()
                    }],
                    ..Default::default()
                },
            ],
            node_maintenance: vec![
                saferollout_api::NodeMaintenanceStatus {
                    node: "n1".into(),
                    ..Default::default()
                },
                saferollout_api::NodeMaintenanceStatus {
                    node: "n2".into(),
                    ..Default::default()
                },
            ],
            ..Default::default()
        };
        m.observe_status(
            "ns",
            "sr",
            &st,
            3,
            Duration::from_secs(600),
            NodeCounts {
                in_scope: 4,
                on_target: 2,
            },
        );
        m.record_transitions(
            "ns",
            "sr",
            &Transitions {
                rollback: Some(Rollback {
                    gate: "allocatable/x".into(),
                    reason: "BelowMinimum".into(),
                    failing_since: None,
                }),
                gate_failure: Some(saferollout_core::transitions::GateFailure {
                    gate: "allocatable/x".into(),
                    reason: "BelowMinimum".into(),
                }),
                ..Default::default()
            },
        );
        let text = m.encode();
        for want in [
            r#"saferollout_rollout_phase{namespace="ns",name="sr",phase="RollingBack"} 1"#,
            r#"saferollout_rollout_phase{namespace="ns",name="sr",phase="Succeeded"} 0"#,
            r#"saferollout_rollout_stage{namespace="ns",name="sr"} 2"#,
            r#"saferollout_rollout_stages{namespace="ns",name="sr"} 3"#,
            r#"saferollout_rollout_nodes_on_target{namespace="ns",name="sr"} 2"#,
            r#"saferollout_rollout_nodes_in_maintenance{namespace="ns",name="sr"} 2"#,
            r#"saferollout_rollout_phase_transition_timestamp_seconds{namespace="ns",name="sr"} 1800000000"#,
            r#"saferollout_gate_result{namespace="ns",name="sr",gate="allocatable/x"} -1"#,
            r#"saferollout_rollbacks_total{namespace="ns",name="sr",reason="BelowMinimum"} 1"#,
            r#"saferollout_gate_failures_total{namespace="ns",name="sr",gate="allocatable/x",reason="BelowMinimum"} 1"#,
            r#"saferollout_build_info{version=""#,
        ] {
            assert!(text.contains(want), "missing {want} in\n{text}");
        }
        m.forget("ns", "sr");
        let text = m.encode();
        assert!(!text.contains(r#"saferollout_rollout_phase{namespace="ns""#));
        assert!(!text.contains(r#"saferollout_gate_result{namespace="ns""#));
        assert!(!text.contains(r#"saferollout_rollout_nodes_in_maintenance{namespace="ns""#));
    }

    #[test]
    fn readiness_needs_caches_and_the_lease() {
        let m = Metrics::default();
        assert!(!m.is_ready());
        m.set_caches_synced();
        assert!(!m.is_ready());
        m.set_lease_known();
        assert!(m.is_ready());
    }
}
