//! saferollout operator: the runtime around the pure decision logic of
//! `saferollout-core` (staged, gated, self-reverting rollouts of device-plugin
//! and DRA-driver DaemonSets).
//!
//! - [`controller`]: caches, the reconcile pipeline (dereference, decide,
//!   write status, act), the work queue;
//! - [`leader`]: leader election on a Lease and the write fence;
//! - [`metrics`]: Prometheus metrics, `/healthz`, `/readyz`;
//! - [`client`]: the API client (HTTP/2, the fence's layers); [`retry`]:
//!   start-up requests asked again.

pub mod allocator;
pub mod client;
pub mod controller;
pub mod leader;
pub mod metrics;
pub mod retry;
