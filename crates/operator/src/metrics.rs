//! Prometheus metrics, served on `/metrics`. Alert rules in
//! `deploy/prometheus-rules.yaml` fire on these names: keep them stable.

use std::sync::Arc;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use saferollout_api::Phase;

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
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabels {
    pub error: String,
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

pub struct Metrics {
    pub registry: Registry,
    /// 1 for the SafeRollout's current phase, 0 for the others.
    pub phase: Family<PhaseLabels, Gauge>,
    /// Current stage, 1-based; 0 when no rollout is in progress.
    pub stage: Family<RolloutLabels, Gauge>,
    pub gate_failures: Family<GateLabels, Counter>,
    pub rollbacks: Family<RolloutLabels, Counter>,
    pub stages_passed: Family<RolloutLabels, Counter>,
    pub rollouts_succeeded: Family<RolloutLabels, Counter>,
    pub reconcile_duration: Histogram,
    pub reconcile_errors: Family<ErrorLabels, Counter>,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("saferollout");
        let m = Metrics {
            phase: Family::default(),
            stage: Family::default(),
            gate_failures: Family::default(),
            rollbacks: Family::default(),
            stages_passed: Family::default(),
            rollouts_succeeded: Family::default(),
            reconcile_duration: Histogram::new(exponential_buckets(0.001, 2.0, 14)),
            reconcile_errors: Family::default(),
            registry: Registry::default(),
        };
        registry.register(
            "rollout_phase",
            "Current phase of each SafeRollout (1 = in this phase)",
            m.phase.clone(),
        );
        registry.register(
            "rollout_stage",
            "Current stage of each SafeRollout, 1-based (0 = idle)",
            m.stage.clone(),
        );
        registry.register(
            "gate_failures",
            "Health gate failures that caused a revert",
            m.gate_failures.clone(),
        );
        registry.register(
            "rollbacks",
            "Automatic reverts to the last good template",
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
            "reconcile_duration_seconds",
            "Time spent in one reconcile",
            m.reconcile_duration.clone(),
        );
        registry.register(
            "reconcile_errors",
            "Reconcile errors by kind",
            m.reconcile_errors.clone(),
        );
        Metrics { registry, ..m }
    }
}

impl Metrics {
    pub fn set_phase(&self, namespace: &str, name: &str, phase: &Phase) {
        for p in PHASES {
            let labels = PhaseLabels {
                namespace: namespace.into(),
                name: name.into(),
                phase: format!("{p:?}"),
            };
            self.phase.get_or_create(&labels).set(i64::from(p == phase));
        }
    }

    pub fn set_stage(&self, namespace: &str, name: &str, stage: Option<i32>) {
        let labels = RolloutLabels {
            namespace: namespace.into(),
            name: name.into(),
        };
        self.stage
            .get_or_create(&labels)
            .set(stage.map_or(0, |s| i64::from(s) + 1));
    }

    /// Drops a deleted SafeRollout's series.
    pub fn forget(&self, namespace: &str, name: &str) {
        for p in PHASES {
            self.phase.remove(&PhaseLabels {
                namespace: namespace.into(),
                name: name.into(),
                phase: format!("{p:?}"),
            });
        }
        self.stage.remove(&RolloutLabels {
            namespace: namespace.into(),
            name: name.into(),
        });
    }

    pub fn observe_reconcile(&self, took: Duration) {
        self.reconcile_duration.observe(took.as_secs_f64());
    }

    pub fn encode(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .expect("writing to a String");
        out
    }
}

/// Serves `/metrics`, `/healthz` and `/readyz` until the process ends.
pub async fn serve(addr: std::net::SocketAddr, metrics: Arc<Metrics>) -> anyhow::Result<()> {
    use axum::{Router, http::header, routing::get};
    let app = Router::new()
        .route(
            "/metrics",
            get(move || {
                let m = metrics.clone();
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
        .route("/readyz", get(|| async { "ok" }));
    let listener = tokio::net::TcpListener::bind(addr).await?;
    axum::serve(listener, app).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phase_gauge_marks_exactly_one_phase() {
        let m = Metrics::default();
        m.set_phase("ns", "sr", &Phase::RollingBack);
        m.rollbacks
            .get_or_create(&RolloutLabels {
                namespace: "ns".into(),
                name: "sr".into(),
            })
            .inc();
        let text = m.encode();
        assert!(
            text.contains(
                r#"saferollout_rollout_phase{namespace="ns",name="sr",phase="RollingBack"} 1"#
            ),
            "{text}"
        );
        assert!(text.contains(
            r#"saferollout_rollout_phase{namespace="ns",name="sr",phase="Succeeded"} 0"#
        ));
        assert!(text.contains(r#"saferollout_rollbacks_total{namespace="ns",name="sr"} 1"#));
    }
}
