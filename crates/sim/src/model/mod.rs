//! The sim's decisions as pure functions of what it observes, what it
//! remembers and the current time: no I/O, so they are unit-tested in full.
//!
//! - [`fault`]: which agent a pod plays and which fault its image asks for;
//! - [`agent`]: what a (faulty) agent does at a given moment;
//! - [`pod_status`]: the status the simulated kubelet reports for its pod;
//! - [`advertisement`]: the node's extended-resource entries (device plugin);
//! - [`slice`](mod@slice): the node's ResourceSlice (DRA driver);
//! - [`devices`]: per-device health, taints and what agents advertise;
//! - [`workload`]: the status the simulated kubelet reports for workload pods;
//! - [`logs`]: what agents and workloads print, in the CRI log format;
//! - [`metrics`]: DCGM-style per-GPU metrics;
//! - [`node`]: all of the above for one node, the unit the loop reconciles.

pub mod advertisement;
pub mod agent;
pub mod devices;
pub mod fault;
pub mod ids;
pub mod logs;
pub mod metrics;
pub mod node;
pub mod pod_status;
pub mod slice;
pub mod time;
pub mod workload;

pub use agent::Timings;
pub use fault::{AgentKind, Fault};
