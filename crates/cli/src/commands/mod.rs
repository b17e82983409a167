//! One module per command. Each keeps its decisions and formatting in pure
//! functions (unit-tested here) apart from the API calls (`run`, `fetch`).

pub mod actions;
pub mod drift;
pub mod inventory;
pub mod lint;
pub mod plan;
pub mod policy;
pub mod status;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::Api;
use saferollout_api::SafeRollout;

use crate::cli::{Cli, Command};
use crate::client::{Kube, connect};
use crate::error::CliError;

/// Field manager of the CLI's writes.
pub const FIELD_MANAGER: &str = "kubectl-saferollout";
pub use saferollout_api::{REVISION_HASH_LABEL, ZONE_LABEL};

/// Runs the command; `Ok(code)` is the exit status of a command that ran.
pub async fn run(cli: Cli) -> Result<u8, CliError> {
    match &cli.command {
        // Offline: never loads a kubeconfig.
        Command::Lint(args) => lint::run(args),
        command => {
            let kube = connect(&cli.global).await?;
            match command {
                Command::Lint(_) => unreachable!("handled above"),
                Command::Status(args) => status::run(&kube, args).await,
                Command::Plan(args) => plan::run(&kube, args).await,
                Command::Pause(a) => actions::set_paused(&kube, &a.name, true).await,
                Command::Resume(a) => actions::set_paused(&kube, &a.name, false).await,
                Command::Approve(a) => actions::approve(&kube, &a.name).await,
                Command::Retry(args) => actions::retry(&kube, args).await,
                Command::Abort(a) => actions::abort(&kube, &a.name).await,
                Command::Inventory(args) => inventory::run(&kube, args).await,
                Command::Policy(args) => policy::run(&kube, args).await,
            }
        }
    }
}

/// Fetches a SafeRollout of the command's namespace; a missing one is
/// `SafeRollout ns/name not found` (exit 1).
pub async fn get_rollout(kube: &Kube, name: &str) -> Result<SafeRollout, CliError> {
    let api: Api<SafeRollout> = Api::namespaced(kube.client.clone(), &kube.namespace);
    api.get(name)
        .await
        .map_err(|e| kube.error(e, &format!("SafeRollout {}/{name}", kube.namespace)))
}

/// `namespace/name` of a SafeRollout.
pub fn rollout_ref(sr: &SafeRollout) -> String {
    format!(
        "{}/{}",
        sr.metadata.namespace.as_deref().unwrap_or_default(),
        sr.metadata.name.as_deref().unwrap_or_default()
    )
}

/// An int-or-string as written: `1`, `10%`.
pub fn int_or_string(v: &IntOrString) -> String {
    match v {
        IntOrString::Int(n) => n.to_string(),
        IntOrString::String(s) => s.clone(),
    }
}

/// Whether an owner reference of `meta` has this uid (false for an empty uid).
pub fn owned_by(meta: &ObjectMeta, uid: &str) -> bool {
    !uid.is_empty() && meta.owner_references.iter().flatten().any(|o| o.uid == uid)
}

/// The `controller-revision-hash` label.
pub fn revision_hash(meta: &ObjectMeta) -> Option<String> {
    meta.labels.as_ref()?.get(REVISION_HASH_LABEL).cloned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn helpers() {
        assert_eq!(int_or_string(&IntOrString::Int(3)), "3");
        assert_eq!(int_or_string(&IntOrString::String("10%".into())), "10%");
        let mut sr = SafeRollout::new("foo", saferollout_api::SafeRolloutSpec::for_daemonset("ds"));
        sr.metadata.namespace = Some("gpu".into());
        assert_eq!(rollout_ref(&sr), "gpu/foo");
        assert!(!owned_by(&ObjectMeta::default(), ""));
    }
}
