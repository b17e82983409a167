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
//! - [`admit`]: the three applied to one rollout's pass, which
//!   `crate::rollout` calls before it deletes anything of a stage.

pub mod admit;
pub mod budget;
pub mod ordering;
pub mod windows;

pub use admit::{Admitted, Fleet, Governing, Held, admit};
