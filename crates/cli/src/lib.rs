//! `kubectl saferollout`: a kubectl plugin for SafeRollouts.
//!
//! - `lint`: offline checks of DaemonSet and SafeRollout manifests (`saferollout-preflight`);
//! - `status`, `plan`, `inventory`, `policy`: read-only views of a rollout, the
//!   cluster and the fleet policies governing rollouts together;
//! - `pause`, `resume`, `approve`, `retry`, `abort`: one write each.
//!
//! Every command keeps its decisions and formatting in pure functions
//! ([`commands`]) apart from its API calls. Errors are one line and an exit
//! code ([`error`]).

pub mod cli;
pub mod client;
pub mod commands;
pub mod error;
pub mod output;
pub mod table;

pub use cli::Cli;
pub use commands::run;
pub use error::CliError;
