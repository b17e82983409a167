use std::net::SocketAddr;
use std::sync::Arc;

use clap::Parser;
use saferollout_operator::{controller, metrics};
use tracing_subscriber::EnvFilter;

/// The saferollout operator: staged, gated, self-reverting rollouts of device-plugin and DRA-driver DaemonSets.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    /// Address for /metrics, /healthz and /readyz.
    #[arg(long, env = "SAFEROLLOUT_METRICS_ADDR", default_value = "0.0.0.0:8080")]
    metrics_addr: SocketAddr,
    /// Watch only this namespace (default: all namespaces).
    #[arg(long, env = "SAFEROLLOUT_NAMESPACE")]
    namespace: Option<String>,
    /// Log as JSON lines.
    #[arg(long, env = "SAFEROLLOUT_LOG_JSON")]
    log_json: bool,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info,kube=warn"));
    if args.log_json {
        tracing_subscriber::fmt()
            .json()
            .with_env_filter(filter)
            .init();
    } else {
        tracing_subscriber::fmt().with_env_filter(filter).init();
    }
    let client = kube::Client::try_default().await?;
    let metrics = Arc::new(metrics::Metrics::default());
    let server = tokio::spawn(metrics::serve(args.metrics_addr, metrics.clone()));
    tracing::info!(metrics = %args.metrics_addr, namespace = ?args.namespace, "starting saferollout-operator");
    tokio::select! {
        r = controller::run(client, metrics, args.namespace) => r?,
        r = server => r??,
    }
    Ok(())
}
