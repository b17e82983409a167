//! A healthy release on a fleet of simulated GPU nodes with the default stages
//! and deadlines (1 node, 10%, 50%, 100%; maxUnavailable 1; progressDeadline
//! 10m; the allocatable gate's default 10 s soak) must complete with no
//! false revert and within the disruption budget throughout.
//!
//! Heavy (a cluster of its own, 1,000 nodes by default), so ignored by the
//! test command:
//!
//! ```sh
//! cargo test -p saferollout-operator --test scale -- --ignored --nocapture
//! SAFEROLLOUT_SCALE_NODES=200 cargo test -p saferollout-operator --test scale -- --ignored --nocapture
//! ```

mod support;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use kube::api::Api;
use kube::runtime::watcher;
use saferollout_api::Phase;
use saferollout_testkit::{
    ClusterOptions, ClusterProcess, client_for, kubectl, repo_root, wait_for_all,
};
use serde_json::json;
use support::{
    GPUS, Identity, Operator, agent_template, allocatable, create_rollout, sample_pods,
    set_template_image, wait_adopted, wait_status,
};

const OPERATOR_SA: &str = "system:serviceaccount:saferollout-system:saferollout-operator";

#[tokio::test]
#[ignore = "heavy: a cluster of 1,000 nodes; run with --ignored"]
async fn a_healthy_release_completes_on_a_fleet_with_the_default_stages() -> anyhow::Result<()> {
    let nodes: usize = std::env::var("SAFEROLLOUT_SCALE_NODES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    let state_dir = std::env::temp_dir().join(format!("saferollout-scale-{}", std::process::id()));
    let started = Instant::now();
    let cluster = ClusterProcess::start(&ClusterOptions {
        nodes,
        gpus_per_node: GPUS as usize,
        state_dir: state_dir.clone(),
        audit_policy: None,
    })?;
    let _down = Down(cluster);
    let kubeconfig = _down.0.kubeconfig.clone();
    eprintln!(
        "MEASURE cluster of {nodes} nodes up in {:?}",
        started.elapsed()
    );
    for f in ["deploy/crd.yaml", "deploy/rbac.yaml"] {
        kubectl(
            &kubeconfig,
            &[
                "apply",
                "--server-side",
                "-f",
                &repo_root().join(f).to_string_lossy(),
            ],
        )?;
    }
    kubectl(
        &kubeconfig,
        &[
            "wait",
            "--for=condition=Established",
            "crd/saferollouts.saferollout.dev",
        ],
    )?;
    kubectl(&kubeconfig, &["create", "namespace", "scale"])?;
    let client = client_for(&kubeconfig).await?;
    let resource = "example.com/gpu";
    let (v1, v2) = ("registry.example/plugin:v1", "registry.example/plugin:v2");
    let ds = json!({
        "apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "plugin", "namespace": "scale"},
        "spec": {"selector": {"matchLabels": {"app": "plugin"}}, "template": agent_template(resource, v1)}
    });
    let file = state_dir.join("plugin.json");
    std::fs::write(&file, serde_json::to_vec(&ds)?)?;
    kubectl(&kubeconfig, &["apply", "-f", &file.to_string_lossy()])?;
    let fleet = Duration::from_secs(600);
    wait_for_all(
        &Api::<Node>::all(client.clone()),
        watcher::Config::default(),
        fleet,
        move |ns| ns.len() == nodes && ns.iter().all(|n| allocatable(n, resource) == Some(GPUS)),
    )
    .await?;

    let args: Vec<String> = ["--namespace", "scale", "--metrics-addr", "127.0.0.1:0"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let _op = Operator::start(
        Identity::Impersonate(&kubeconfig, OPERATOR_SA),
        &args,
        "scale",
    )?;
    // The defaults: stages 1, 10%, 50%, 100%; maxUnavailable 1; progressDeadline 10m.
    let spec = json!({
        "targetRef": {"name": "plugin"},
        "template": agent_template(resource, v1),
        "gates": {"allocatable": [{"resource": resource}]}
    });
    create_rollout(&client, "scale", "plugin", spec).await?;
    let adopted = wait_adopted(&client, "scale", "plugin").await?;
    let names: Vec<String> = (0..nodes).map(|i| format!("sim-gpu-{i}")).collect();
    let (samples, task) = sample_pods(&client, "scale", names);
    let rollout = Instant::now();
    set_template_image(&client, "scale", "plugin", resource, v2).await?;
    let st = wait_status(
        &client,
        "scale",
        "plugin",
        Duration::from_secs(3600),
        |st| {
            (st.phase == Some(Phase::Succeeded) && st.stable_revision != adopted.stable_revision)
                || !st.blocked_revisions.is_empty()
        },
    )
    .await?;
    let took = rollout.elapsed();
    task.abort();
    assert!(
        st.blocked_revisions.is_empty(),
        "a false revert: {:#?}",
        st.blocked_revisions
    );
    let sizes: Vec<usize> = st.stages.iter().map(|s| s.nodes.len()).collect();
    eprintln!(
        "MEASURE {nodes} nodes, default stages {sizes:?}: healthy release rolled out in {took:?}"
    );
    let samples = samples.lock().unwrap();
    let (most, _) = samples.max_unavailable(&BTreeSet::new());
    eprintln!("MEASURE most agents unavailable at once: {most}");
    assert!(most <= 1, "maxUnavailable 1 broken: {most} at once");
    let replaced: usize = samples
        .created
        .iter()
        .filter(|((_, i), _)| i == v2)
        .map(|(_, c)| c)
        .sum();
    assert_eq!(replaced, nodes, "every node replaced exactly once");
    Ok(())
}

/// Stops the cluster when the test ends.
struct Down(ClusterProcess);

impl Drop for Down {
    fn drop(&mut self) {
        let _ = self.0.stop();
    }
}
