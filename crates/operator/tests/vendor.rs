//! Owner-aware mode end to end (issue 39, first part): a device-plugin
//! DaemonSet owned by a ClusterPolicy (`nvidia.com`, its CRD installed by
//! the test, the object a stand-in with no controller behind it), against
//! the real control plane, the operator as its ServiceAccount.
//!
//! What it shows:
//! - the owner's OnDelete unset: the rollout refuses with a condition
//!   naming the ClusterPolicy field, and the DaemonSet is not written (its
//!   generation does not move, no managed field is the operator's);
//! - the owner's OnDelete set, a release the owner writes (the test writes
//!   the DaemonSet's template, as the operator's reconcile would) goes
//!   through three stages, every node replaced once, with no write of the
//!   operator to the DaemonSet;
//! - a broken release stops (Halt), naming the ClusterPolicy fields to put
//!   back, and the template the owner wrote is left as it is.

mod support;

use k8s_openapi::api::apps::v1::DaemonSet;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use saferollout_api::{OnFailure, Phase};
use saferollout_testkit::{TestNamespace, cluster};
use serde_json::json;
use support::dra::ClusterObject;
use support::{
    Identity, Operator, TIMEOUT, agent_template, condition, create_rollout, sample_pods,
    wait_agents, wait_status,
};

const OPERATOR_SA: &str = "system:serviceaccount:saferollout-system:saferollout-operator";
const CRD: &str = "clusterpolicies.nvidia.com";

struct Env {
    ns: TestNamespace,
    client: Client,
    resource: String,
    policy_uid: String,
    policy_name: String,
    _policy: ClusterObject,
    _op: Operator,
}

async fn setup(name: &str) -> anyhow::Result<Env> {
    let c = cluster();
    support::install(c)?;
    let ns = c.namespace(name).await?;
    let client = c.client().await?;
    // The ClusterPolicy CRD, as the GPU Operator installs it (its schema
    // aside), and one ClusterPolicy to own the DaemonSet.
    let crd = std::env::temp_dir().join(format!("saferollout-vendor-crd-{}.yaml", ns.name));
    std::fs::write(
        &crd,
        serde_json::to_string(&json!({
            "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": CRD},
            "spec": {"group": "nvidia.com", "scope": "Cluster",
                "names": {"kind": "ClusterPolicy", "plural": "clusterpolicies", "singular": "clusterpolicy"},
                "versions": [{"name": "v1", "served": true, "storage": true,
                    "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}]}
        }))?,
    )?;
    c.kubectl(&["apply", "--server-side", "-f", &crd.to_string_lossy()])?;
    c.kubectl(&[
        "wait",
        "--for=condition=Established",
        &format!("crd/{CRD}"),
        "--timeout=60s",
    ])?;
    let policy_name = format!("cluster-policy-{}", ns.name);
    let policy = std::env::temp_dir().join(format!("saferollout-vendor-cp-{}.yaml", ns.name));
    std::fs::write(
        &policy,
        serde_json::to_string(&json!({
            "apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy",
            "metadata": {"name": policy_name},
            "spec": {"daemonsets": {"updateStrategy": "RollingUpdate"},
                "devicePlugin": {"repository": "registry.example", "image": "plugin", "version": "v1"}}
        }))?,
    )?;
    c.kubectl(&["apply", "-f", &policy.to_string_lossy()])?;
    let policy_uid = c.kubectl(&[
        "get",
        "clusterpolicy",
        &policy_name,
        "-o",
        "jsonpath={.metadata.uid}",
    ])?;
    let args = support::operator_args(&ns.name, "127.0.0.1:0", 3);
    let op = Operator::start(
        Identity::Impersonate(c.kubeconfig(), OPERATOR_SA),
        &args,
        &format!("vendor-{}", ns.name),
    )?;
    Ok(Env {
        resource: format!("example.com/gpu-{name}"),
        _policy: ClusterObject::new("clusterpolicy", &policy_name),
        policy_uid: policy_uid.trim().to_string(),
        policy_name,
        ns,
        client,
        _op: op,
    })
}

fn dss(env: &Env) -> Api<DaemonSet> {
    Api::namespaced(env.client.clone(), &env.ns.name)
}

/// Writes the DaemonSet as the owner's reconcile does: the template and
/// the strategy its ClusterPolicy says, under the owner's field manager.
async fn owner_writes(env: &Env, image: &str, strategy: &str) -> anyhow::Result<()> {
    let patch = json!({
        "spec": {"updateStrategy": {"type": strategy, "rollingUpdate": null},
            "template": agent_template(&env.resource, image)}
    });
    let params = PatchParams {
        field_manager: Some("gpu-operator".into()),
        ..Default::default()
    };
    dss(env)
        .patch("plugin", &params, &Patch::Merge(patch))
        .await?;
    Ok(())
}

/// The field managers that wrote the DaemonSet's spec.
async fn spec_writers(env: &Env) -> anyhow::Result<Vec<String>> {
    let ds = dss(env).get("plugin").await?;
    Ok(ds
        .managed_fields()
        .iter()
        .filter(|m| {
            m.fields_v1
                .as_ref()
                .is_some_and(|f| f.0.get("f:spec").is_some())
        })
        .filter_map(|m| m.manager.clone())
        .collect())
}

#[tokio::test]
async fn a_daemonset_a_clusterpolicy_owns_is_staged_and_gated_without_a_write_to_it()
-> anyhow::Result<()> {
    let env = setup("vendor").await?;
    let (v1, v2, bad) = (
        "registry.example/plugin:v1",
        "registry.example/plugin:v2",
        "registry.example/plugin:v3-broken",
    );
    let ds: DaemonSet = serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "DaemonSet",
        "metadata": {"name": "plugin", "ownerReferences": [{"apiVersion": "nvidia.com/v1",
            "kind": "ClusterPolicy", "name": env.policy_name, "uid": env.policy_uid,
            "controller": true, "blockOwnerDeletion": true}]},
        "spec": {"selector": {"matchLabels": {"app": "plugin"}},
            "template": agent_template(&env.resource, v1)}
    }))?;
    let params = PostParams {
        field_manager: Some("gpu-operator".into()),
        ..Default::default()
    };
    dss(&env).create(&params, &ds).await?;
    wait_agents(&env.client, &env.ns.name, v1).await?;

    // The owner's OnDelete unset: refused, naming the field; nothing written.
    let spec = json!({
        "targetRef": {"name": "plugin"},
        "stages": [{"nodes": 1}, {"nodes": "50%"}, {"nodes": "100%"}],
        "maxUnavailable": 1,
        "progressDeadline": "1m",
        "gates": {"allocatable": [{"resource": env.resource, "min": "baseline", "max": "baseline", "soak": "2s"}]}
    });
    create_rollout(&env.client, &env.ns.name, "plugin", spec).await?;
    let st = wait_status(&env.client, &env.ns.name, "plugin", TIMEOUT, |st| {
        condition(st, "Ready").is_some_and(|c| c.reason == "OwnerNotOnDelete")
    })
    .await?;
    let message = &condition(&st, "Ready").unwrap().message;
    assert!(
        message.contains(&format!(
            "spec.daemonsets.updateStrategy: OnDelete in ClusterPolicy {}",
            env.policy_name
        )),
        "{message}"
    );
    let before = dss(&env).get("plugin").await?;
    assert_eq!(before.metadata.generation, Some(1), "nothing written");
    assert_eq!(spec_writers(&env).await?, ["gpu-operator"]);

    // The owner sets OnDelete (its ClusterPolicy field): adopted.
    owner_writes(&env, v1, "OnDelete").await?;
    wait_status(&env.client, &env.ns.name, "plugin", TIMEOUT, |st| {
        st.phase == Some(Phase::Succeeded) && st.stable_revision.is_some()
    })
    .await?;

    // A release the owner writes: three stages, every node replaced once.
    let nodes: Vec<String> = (0..4).map(|i| format!("sim-gpu-{i}")).collect();
    let (samples, task) = sample_pods(&env.client, &env.ns.name, nodes.clone());
    owner_writes(&env, v2, "OnDelete").await?;
    let st = wait_status(&env.client, &env.ns.name, "plugin", TIMEOUT, |st| {
        st.phase == Some(Phase::Succeeded) && st.stages.len() == 3
    })
    .await?;
    wait_agents(&env.client, &env.ns.name, v2).await?;
    task.abort();
    {
        let samples = samples.lock().unwrap();
        for n in &nodes {
            assert_eq!(
                samples.created.get(&(n.clone(), v2.to_string())),
                Some(&1),
                "{n} replaced once: {:?}",
                samples.created
            );
        }
        let most = samples
            .unavailable
            .iter()
            .map(|u| u.len())
            .max()
            .unwrap_or(0);
        assert!(most <= 1, "{most} nodes down at maxUnavailable 1");
    }
    assert_eq!(st.stages.len(), 3, "{st:#?}");
    assert_eq!(
        spec_writers(&env).await?,
        ["gpu-operator"],
        "the operator wrote the owner's DaemonSet"
    );

    // A broken release: stopped, naming the owner's fields; not reverted.
    owner_writes(&env, bad, "OnDelete").await?;
    let st = wait_status(&env.client, &env.ns.name, "plugin", TIMEOUT, |st| {
        st.stopped.is_some()
    })
    .await?;
    let stopped = st.stopped.clone().unwrap();
    assert_eq!(stopped.policy, OnFailure::Halt);
    assert!(
        stopped
            .message
            .contains(&format!("owned by ClusterPolicy/{}", env.policy_name))
            && stopped
                .message
                .contains("spec.devicePlugin.repository, image and version together"),
        "{}",
        stopped.message
    );
    // The template stays the owner's.
    let ds = dss(&env).get("plugin").await?;
    let image = ds
        .spec
        .template
        .spec
        .as_ref()
        .and_then(|p| p.containers.first())
        .and_then(|c| c.image.as_deref());
    assert_eq!(
        image,
        Some(bad),
        "the template the owner wrote is left as it is"
    );
    assert_eq!(spec_writers(&env).await?, ["gpu-operator"]);
    Ok(())
}
