//! The decisions a `SafeRolloutPolicy` adds across the SafeRollouts it
//! governs (issue 38; docs/design/fleet-policies.md). Pure, like the rest of
//! the crate: each function takes what was observed (which nodes each
//! rollout disrupts, which agents passed their gates where, the time) and
//! returns a decision with the reason a rollout waits. One module per
//! mechanism:
//!
//! - [`budget`]: `maxDisruptedNodes` and `maxConcurrentRollouts`, which
//!   nodes each rollout may take now.
//! - [`ordering`]: `ordering`, whether a rollout may replace its agent on a
//!   node now, and the cycles that would stop rollouts forever.
//! - [`windows`]: `maintenanceWindows`, whether a stage may start now and
//!   when the next window opens (a revert is never held).
//!
//! Not wired into the operator yet: nothing here is called by
//! `crate::rollout` or the operator.

pub mod budget;
pub mod ordering;
pub mod windows;
