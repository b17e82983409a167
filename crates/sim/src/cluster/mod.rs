//! API glue: connecting, watching agent pods, nodes and the sim's
//! ResourceSlices into mirrors, and the loop that reconciles the nodes that
//! changed (or whose timers fired) with the pure logic of [`crate::model`].

pub mod mirror;
pub mod outputs;
pub mod reconciler;
pub mod wakeups;
pub mod writes;

use std::path::Path;

use anyhow::Context as _;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};

pub use reconciler::{Outputs, run};

/// A client from `kubeconfig` if given, else from KUBECONFIG / the default
/// kubeconfig / the in-cluster environment.
pub async fn connect(kubeconfig: Option<&Path>) -> anyhow::Result<Client> {
    let config = match kubeconfig {
        Some(path) => {
            let kubeconfig = Kubeconfig::read_from(path)
                .with_context(|| format!("reading kubeconfig {}", path.display()))?;
            Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
                .await
                .with_context(|| format!("loading kubeconfig {}", path.display()))?
        }
        None => Config::infer()
            .await
            .context("finding a kubeconfig (KUBECONFIG, ~/.kube/config or in-cluster)")?,
    };
    Client::try_from(config).context("creating the Kubernetes client")
}
