//! saferollout operator: staged, gated, self-reverting rollouts of
//! device-plugin and DRA-driver DaemonSets.
//!
//! - [`plan`], [`gates`], [`rollout`], [`conditions`]: pure decision logic,
//!   unit-tested without a cluster;
//! - [`controller`]: the kube-rs controller that reads caches, asks
//!   [`rollout::decide`], writes status, then acts;
//! - [`metrics`]: Prometheus metrics.

pub mod conditions;
pub mod controller;
pub mod gates;
pub mod metrics;
pub mod plan;
pub mod preflight;
pub mod rollout;
