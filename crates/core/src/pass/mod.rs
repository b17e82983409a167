//! One pass over a SafeRollout, as the operator runs it: first its
//! [`needs`] (what it must read beyond the caches: a dry run of
//! `spec.template`, preflight, probe pods, agent logs, Prometheus queries),
//! worked out from the spec, the status and what earlier reads left; the
//! operator reads exactly that, decides ([`crate::decide`]), then executes
//! the [`plan`] of the decision (the status write before, behind or after
//! the actions; Events last; the nodes whose workload pods to watch). The
//! model ([`crate::rollout::model`]) executes the same plan.

pub mod needs;
pub mod plan;

pub use needs::{Needs, needs};
pub use plan::{Plan, StatusWrite, plan};
