//! Connecting to the cluster the way kubectl does: `--kubeconfig`, else
//! `$KUBECONFIG`, else `~/.kube/config` (else the in-cluster service account);
//! `--context`; `-n`, else the context's namespace, else `default`.

use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};

use crate::cli::GlobalArgs;
use crate::error::{CliError, error_chain};

/// A client and the namespace the command works in.
#[derive(Clone)]
pub struct Kube {
    pub client: Client,
    pub namespace: String,
    /// The API server URL, for error messages.
    pub server: String,
}

impl Kube {
    /// Maps a kube error about `what`, naming the server for connection errors.
    pub fn error(&self, err: kube::Error, what: &str) -> CliError {
        match err {
            kube::Error::Api(_) => CliError::kube(err, what),
            other => CliError::usage(format!(
                "{what}: cannot reach the API server at {}: {}",
                self.server,
                error_chain(&other)
            )),
        }
    }
}

/// Loads the kubeconfig and builds a client. Makes no request.
pub async fn connect(global: &GlobalArgs) -> Result<Kube, CliError> {
    let options = KubeConfigOptions {
        context: global.context.clone(),
        ..Default::default()
    };
    let config = match &global.kubeconfig {
        Some(path) => {
            let kubeconfig = Kubeconfig::read_from(path).map_err(|e| {
                CliError::usage(format!(
                    "cannot read kubeconfig {}: {}",
                    path.display(),
                    error_chain(&e)
                ))
            })?;
            Config::from_custom_kubeconfig(kubeconfig, &options)
                .await
                .map_err(|e| kubeconfig_error(&e))?
        }
        None => match Config::from_kubeconfig(&options).await {
            Ok(config) => config,
            // Like kubectl: no kubeconfig at all inside a pod means the in-cluster account.
            Err(e) => match (global.context.is_none(), Config::incluster()) {
                (true, Ok(config)) if std::env::var_os("KUBECONFIG").is_none() => config,
                _ => return Err(kubeconfig_error(&e)),
            },
        },
    };
    let namespace = global
        .namespace
        .clone()
        .unwrap_or_else(|| config.default_namespace.clone());
    let server = config.cluster_url.to_string();
    let client = Client::try_from(config).map_err(|e| {
        CliError::usage(format!(
            "cannot build a client for {server}: {}",
            error_chain(&e)
        ))
    })?;
    Ok(Kube {
        client,
        namespace,
        server,
    })
}

fn kubeconfig_error(e: &kube::config::KubeconfigError) -> CliError {
    CliError::usage(format!("cannot load kubeconfig: {}", error_chain(e)))
}
