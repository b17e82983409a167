//! saferollout's pure decision logic, shared by the operator and
//! `kubectl saferollout`. Nothing here calls the API or reads a clock: each
//! function takes what was observed and returns a decision, so every rule is
//! tested exhaustively without a cluster (unit tests, and property tests of
//! the state machine against a model of the DaemonSet controller and kubelets).
//!
//! - [`objects`]: projected API objects (the fields decisions read) that the
//!   operator's caches keep instead of whole pods and nodes.
//! - [`views`]: what the logic sees of pods, nodes and the DaemonSet, borrowed
//!   from the API objects (no copies of labels or specs per decision).
//! - [`eligibility`]: which nodes the DaemonSet covers and which of them may
//!   have their agent replaced now (Ready, taints tolerated, still selected).
//! - [`revision`]: which DaemonSet revision a template is, by content.
//! - [`plan`]: which nodes each stage takes.
//! - [`gates`]: the health gates; [`devices`]: what the device gates observe.
//! - [`limits`]: what the operator's administrator lets a SafeRollout ask for.
//! - [`rollout`]: the state machine: status and actions from a snapshot.
//! - [`pass`]: one pass: what it must read beyond the caches before it
//!   decides ([`pass::needs`]: a dry run, preflight, probe pods, agent logs,
//!   due Prometheus queries), then what it does with the decision, in order
//!   ([`pass::plan`]: the status write before, behind or after its actions;
//!   Events last; the nodes whose workload pods to watch): run by the
//!   operator, the plan by the model too.
//! - [`expectations`]: the operator's own writes its caches do not show yet.
//! - [`conditions`]: kstatus-compatible conditions.
//! - [`preflight`]: the cluster-side preflight checks and when they run.
//! - [`transitions`]: what changed between two statuses (for metrics).
//! - [`drain`]: which of a node's pods `spec.nodeMaintenance.drain` evicts,
//!   leaves or is held by.
//! - [`owner`]: a target DaemonSet another controller owns (the vendors'
//!   GPU operators): what it reconciles, and the fields to name.
//! - [`deletion`]: how deleting a SafeRollout hands its DaemonSet back.
//! - [`handover`]: one node's handover between the target and the canary
//!   DaemonSet under the `Selector` strategy.
//! - [`selector`]: the `Selector` strategy's translation between the engine
//!   and the two DaemonSets, its follow-ups and the promotion (run by the
//!   model and its property tests; not by the operator yet:
//!   `docs/design/selector-strategy.md`).
//! - [`fleet`]: what a `SafeRolloutPolicy` decides across rollouts: the
//!   shared disruption budget, the order of agents on a node, maintenance
//!   windows (not wired yet: `docs/design/fleet-policies.md`).

pub mod conditions;
pub mod deletion;
pub mod devices;
pub mod drain;
pub mod durability;
pub mod eligibility;
pub mod expectations;
pub mod fleet;
pub mod gates;
pub mod handover;
pub mod limits;
pub mod objects;
pub mod owner;
pub mod pass;
pub mod plan;
pub mod preflight;
pub mod revision;
pub mod rollout;
pub mod selector;
pub mod transitions;
pub mod views;

pub use rollout::{Action, Decision, Observed, decide};
