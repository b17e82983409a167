//! The trust boundary on the real control plane: the authors' admission
//! policy (charts/saferollout/templates/admission.yaml, rendered by a real
//! helm with the values below) admits a SafeRollout only from someone who
//! may already do what it asks the operator to do, naming the missing right;
//! the operator, run with the same values as flags, refuses what got past
//! the policy (an exempt author) with `InvalidSpec`.
//!
//! Users are impersonated with `kubectl --as`: `alice` may only create and
//! update SafeRollouts and get the DaemonSet; `bob` also holds every right
//! the manifests ask for; `carol` is in a group the installation exempts.

mod support;

use std::path::PathBuf;

use k8s_openapi::api::apps::v1::DaemonSet;
use kube::api::Api;
use saferollout_api::SafeRollout;
use saferollout_testkit::{TestCluster, TestNamespace, cluster};
use serde_json::{Value, json};
use support::dra::ClusterObject;
use support::{
    Identity, Operator, TIMEOUT, agent_template, condition, create_plugin_daemonset,
    free_loopback_port, poll, wait_status,
};

const OPERATOR_SA: &str = "system:serviceaccount:saferollout-system:saferollout-operator";
/// The one Prometheus address this installation allows, and the Secret bound to it.
const PROMETHEUS: &str = "https://prometheus.monitoring.svc:9090";
const SECRET: &str = "prom-auth";
/// The group the installation exempts.
const TRUSTED: &str = "saferollout-e2e:trusted";
const V1: &str = "registry.example/plugin:v1";
/// The policy's (and its binding's) name, as deploy/render names it.
const POLICY: &str = "saferollout-operator-authors";

/// The values both the policy and the operator get.
fn values() -> Vec<String> {
    vec![
        format!("prometheusGate.addresses={{{PROMETHEUS}}}"),
        format!("prometheusGate.secrets[0].name={SECRET}"),
        format!("prometheusGate.secrets[0].addresses={{{PROMETHEUS}}}"),
        "probe.allowPrivileged=true".into(),
        "quarantine.allowNoExecute=true".into(),
        "nodeMaintenance.enabled=true".into(),
        "ownerRevert.enabled=true".into(),
        format!("admission.exempt.groups={{{TRUSTED}}}"),
    ]
}

/// Installs the policy as `deploy/render` renders it, with [`values`]; it
/// goes with the guards (a cluster reused by other test binaries must not
/// keep it).
fn install_policy(c: &TestCluster, dir: &std::path::Path) -> anyhow::Result<Vec<ClusterObject>> {
    let file = dir.join("admission.yaml");
    std::fs::write(&file, support::render_chart("admission.yaml", &values())?)?;
    c.kubectl(&["apply", "-f", &file.to_string_lossy()])?;
    Ok(vec![
        ClusterObject::new("validatingadmissionpolicy", POLICY),
        ClusterObject::new("validatingadmissionpolicybinding", POLICY),
    ])
}

/// RBAC of the three users in `ns` (and bob's cluster-wide quarantine, node and eviction
/// rights, deleted with the guards).
fn grant(c: &TestCluster, ns: &str) -> anyhow::Result<Vec<ClusterObject>> {
    let secret = format!("--resource-name={SECRET}");
    // (role, verbs, resource, more)
    let roles: [(&str, &str, &str, &[&str]); 8] = [
        (
            "sr-author",
            "create,update,patch,get,list,watch",
            "saferollouts.saferollout.dev",
            &[],
        ),
        ("ds-get", "get", "daemonsets.apps", &[]),
        ("agent-owner", "patch", "daemonsets.apps", &[]),
        ("prober", "create", "pods", &[]),
        ("log-reader", "get", "pods/log", &[]),
        ("prom-secret", "get", "secrets", &[&secret]),
        ("canary-owner", "create,delete", "daemonsets.apps", &[]),
        ("pod-labeller", "patch", "pods", &[]),
    ];
    for (role, verbs, resource, more) in roles {
        let (verbs, resource) = (format!("--verb={verbs}"), format!("--resource={resource}"));
        let mut args = vec!["-n", ns, "create", "role", role, &verbs, &resource];
        args.extend_from_slice(more);
        c.kubectl(&args)?;
    }
    let users: [(&str, &[&str]); 3] = [
        ("alice", &["sr-author", "ds-get"]),
        (
            "bob",
            &[
                "sr-author",
                "ds-get",
                "agent-owner",
                "prober",
                "log-reader",
                "prom-secret",
                "canary-owner",
                "pod-labeller",
            ],
        ),
        ("carol", &["sr-author", "ds-get"]),
    ];
    for (user, roles) in users {
        for role in roles {
            c.kubectl(&[
                "-n",
                ns,
                "create",
                "rolebinding",
                &format!("{user}-{role}"),
                &format!("--role={role}"),
                &format!("--user={user}"),
            ])?;
        }
    }
    // Cluster-scoped, named per namespace so test runs do not collide.
    let mut guards = Vec::new();
    for (what, verb, resource) in [
        ("quarantine", "create", "devicetaintrules.resource.k8s.io"),
        ("node-patch", "patch", "nodes"),
        ("evict", "create", "pods/eviction"),
    ] {
        let name = format!("saferollout-e2e-{what}-{ns}");
        guards.push(ClusterObject::new("clusterrole", &name));
        guards.push(ClusterObject::new("clusterrolebinding", &name));
        c.kubectl(&[
            "create",
            "clusterrole",
            &name,
            &format!("--verb={verb}"),
            &format!("--resource={resource}"),
        ])?;
        c.kubectl(&[
            "create",
            "clusterrolebinding",
            &name,
            &format!("--clusterrole={name}"),
            "--user=bob",
        ])?;
    }
    // Patch on the GPU Operator's ClusterPolicy `cluster-policy` (applied:
    // `kubectl create clusterrole` wants the resource served, and no
    // ClusterPolicy CRD is installed here).
    let name = format!("saferollout-e2e-owner-revert-{ns}");
    let file = std::env::temp_dir().join(format!("{name}.json"));
    std::fs::write(
        &file,
        serde_json::to_string(&json!({"apiVersion": "v1", "kind": "List", "items": [
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                "metadata": {"name": name},
                "rules": [{"apiGroups": ["nvidia.com"], "resources": ["clusterpolicies"],
                    "resourceNames": ["cluster-policy"], "verbs": ["patch"]}]},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                "metadata": {"name": name},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
                "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "bob"}]}]}))?,
    )?;
    c.kubectl(&["apply", "-f", &file.to_string_lossy()])?;
    guards.push(ClusterObject::new("clusterrole", &name));
    guards.push(ClusterObject::new("clusterrolebinding", &name));
    Ok(guards)
}

/// A SafeRollout document named `name` in `ns` with `spec`.
fn manifest(ns: &str, name: &str, spec: Value) -> Value {
    json!({
        "apiVersion": "saferollout.dev/v1alpha1", "kind": "SafeRollout",
        "metadata": {"name": name, "namespace": ns}, "spec": spec
    })
}

/// The manifests of the issue, each asking for one right alice lacks (she
/// lacks `patch` on the DaemonSet too: the policy reports the most specific
/// refusal first), with the text her refusal must name.
fn manifests(ns: &str, resource: &str) -> Vec<(&'static str, Value, String)> {
    let base = |extra: Value| {
        let mut spec = json!({"targetRef": {"name": "plugin"}, "maxUnavailable": 1});
        for (k, v) in extra.as_object().unwrap() {
            spec[k] = v.clone();
        }
        spec
    };
    let mut privileged = agent_template(resource, "registry.example/plugin:v2");
    privileged["spec"]["containers"][0]["securityContext"] = json!({"privileged": true});
    privileged["spec"]["hostPID"] = json!(true);
    vec![
        (
            "with-template",
            base(json!({"template": privileged})),
            format!("user alice may not patch daemonsets.apps/plugin in namespace {ns}"),
        ),
        (
            "privileged-probe",
            base(json!({"gates": {"probe": {
                "image": "nvcr.io/nvidia/cloud-native/dcgm:4.2.3-1-ubuntu22.04",
                "command": ["dcgmi", "diag", "-r", "1"], "privileged": true, "resource": resource}}})),
            format!("user alice may not create pods in namespace {ns}"),
        ),
        (
            "quarantine-no-execute",
            base(json!({
                "gates": {"allocatable": [{"resource": resource}]},
                "onFailure": "Quarantine",
                "quarantine": {"driver": "gpu.nvidia.com", "effect": "NoExecute"}})),
            "user alice may not create devicetaintrules.resource.k8s.io".to_string(),
        ),
        (
            "selector-strategy",
            base(json!({"strategy": "Selector",
                "template": agent_template(resource, "registry.example/plugin:v2")})),
            format!("user alice may not create daemonsets.apps in namespace {ns}: strategy: Selector"),
        ),
        (
            "node-maintenance",
            base(json!({"nodeMaintenance": {"drain": {}}})),
            "user alice may not patch nodes: nodeMaintenance has the operator cordon".to_string(),
        ),
        (
            "owner-revert",
            base(json!({"ownerRevert": {"resource": "clusterpolicies.nvidia.com", "name": "cluster-policy"}})),
            "user alice may not patch clusterpolicies.nvidia.com/cluster-policy: ownerRevert".to_string(),
        ),
        (
            "unlisted-prometheus",
            base(json!({"gates": {"prometheus": [{"name": "xid", "address": "https://attacker.example:9090",
                "query": "up", "condition": "== 1"}]}})),
            "gates.prometheus[].address https://attacker.example:9090 is not an address this installation lets the operator dial (chart value prometheusGate.addresses)".to_string(),
        ),
        (
            "unreadable-secret",
            base(json!({"gates": {"prometheus": [{"name": "xid", "address": PROMETHEUS,
                "query": "up", "condition": "== 1",
                "bearerTokenSecret": {"name": SECRET, "key": "token"}}]}})),
            format!("user alice may not get secrets/{SECRET} in namespace {ns}"),
        ),
    ]
}

fn write(dir: &std::path::Path, name: &str, doc: &Value) -> anyhow::Result<PathBuf> {
    let file = dir.join(format!("{name}.json"));
    std::fs::write(&file, serde_json::to_string_pretty(doc)?)?;
    Ok(file)
}

/// `kubectl create` as `who` (with `--as-group` when given): Ok(output) or
/// Err(the API server's refusal).
fn create_as(
    c: &TestCluster,
    who: &str,
    group: Option<&str>,
    file: &std::path::Path,
) -> anyhow::Result<String> {
    let mut args = vec!["--as", who];
    if let Some(g) = group {
        args.extend(["--as-group", g, "--as-group", "system:authenticated"]);
    }
    let path = file.to_string_lossy();
    args.extend(["create", "-f", &path]);
    c.kubectl(&args)
}

async fn exists(api: &Api<SafeRollout>, name: &str) -> anyhow::Result<bool> {
    Ok(api.get_opt(name).await?.is_some())
}

struct Env {
    ns: TestNamespace,
    dir: PathBuf,
    resource: String,
    /// The policy and the cluster-wide roles, deleted when the test ends.
    _cluster_objects: Vec<ClusterObject>,
}

async fn setup() -> anyhow::Result<(Env, kube::Client)> {
    let c = cluster();
    support::install(c)?;
    let ns = c.namespace("admission").await?;
    let dir = std::env::temp_dir().join(format!("saferollout-admission-{}", ns.name));
    std::fs::create_dir_all(&dir)?;
    let mut cluster_objects = install_policy(c, &dir)?;
    cluster_objects.extend(grant(c, &ns.name)?);
    let client = c.client().await?;
    let resource = "example.com/gpu-admission".to_string();
    create_plugin_daemonset(&client, &ns.name, &resource, V1).await?;
    Ok((
        Env {
            ns,
            dir,
            resource,
            _cluster_objects: cluster_objects,
        },
        client,
    ))
}

#[tokio::test]
async fn a_saferollout_is_admitted_only_from_an_author_who_holds_what_it_asks_for()
-> anyhow::Result<()> {
    let c = cluster();
    let (env, client) = setup().await?;
    let ns = env.ns.name.clone();
    let srs: Api<SafeRollout> = Api::namespaced(client.clone(), &ns);
    let dss: Api<DaemonSet> = Api::namespaced(client.clone(), &ns);
    // The operator runs throughout, with the same limits as flags: whatever
    // the policy let through, it would act on.
    let metrics = free_loopback_port()?;
    let op = Operator::start(
        Identity::Impersonate(c.kubeconfig(), OPERATOR_SA),
        &[
            "--namespace".into(),
            ns.clone(),
            "--metrics-addr".into(),
            format!("127.0.0.1:{metrics}"),
            format!("--prometheus-address={PROMETHEUS}"),
            format!("--prometheus-secret={SECRET}={PROMETHEUS}"),
            "--allow-privileged-probes=true".into(),
            "--quarantine-allow-no-execute=true".into(),
            "--node-maintenance=true".into(),
            "--owner-revert=true".into(),
        ],
        &format!("admission-{ns}"),
    )?;
    let before = dss.get("plugin").await?;

    // A new policy takes a moment to reach the API server's admission: wait
    // until alice's first manifest is refused by it.
    let all = manifests(&ns, &env.resource);
    let first = write(
        &env.dir,
        all[0].0,
        &manifest(&ns, all[0].0, all[0].1.clone()),
    )?;
    poll(
        "the admission policy in force",
        TIMEOUT,
        || match create_as(c, "alice", None, &first) {
            Ok(_) => {
                anyhow::bail!("alice's SafeRollout was admitted before the policy was in force")
            }
            Err(e) if e.to_string().contains("ValidatingAdmissionPolicy") => Ok(Some(())),
            Err(_) => Ok(None),
        },
    )
    .await?;

    // alice, who may only create SafeRollouts: each refused, naming the right.
    for (name, spec, want) in &all {
        let file = write(&env.dir, name, &manifest(&ns, name, spec.clone()))?;
        let err = create_as(c, "alice", None, &file)
            .expect_err(&format!("alice's {name} admitted"))
            .to_string();
        assert!(err.contains("Forbidden"), "{name}: {err}");
        assert!(
            err.contains("saferollout-operator-authors"),
            "{name}: refused by the policy: {err}"
        );
        assert!(err.contains(want.as_str()), "{name}: {err}\nwants {want}");
        eprintln!(
            "REFUSED alice {name}: {}",
            err.lines().last().unwrap_or_default()
        );
        assert!(!exists(&srs, name).await?, "{name}: nothing is written");
    }
    // Nothing of the refused ones reached the cluster: no SafeRollout, and
    // the operator (running) never touched the DaemonSet.
    assert!(srs.list(&Default::default()).await?.items.is_empty());
    let after = dss.get("plugin").await?;
    assert_eq!(after.metadata.generation, before.metadata.generation);
    assert_eq!(after.spec.update_strategy, before.spec.update_strategy);

    // bob holds every right they ask for: admitted, all but the unlisted
    // Prometheus address (no right opens it: only the installation's values).
    for (name, spec, _) in &all {
        let file = write(&env.dir, name, &manifest(&ns, name, spec.clone()))?;
        let out = create_as(c, "bob", None, &file);
        if *name == "unlisted-prometheus" {
            let err = out.expect_err("an unlisted address admitted").to_string();
            assert!(err.contains("prometheusGate.addresses"), "{err}");
            continue;
        }
        out.map_err(|e| anyhow::anyhow!("bob's {name} refused: {e}"))?;
        assert!(exists(&srs, name).await?, "{name}");
    }

    // An update asks again: alice may update SafeRollouts, but not this one.
    let err = c
        .kubectl(&[
            "--as",
            "alice",
            "-n",
            &ns,
            "patch",
            "sr",
            "privileged-probe",
            "--type=merge",
            "-p",
            r#"{"spec":{"paused":true}}"#,
        ])
        .expect_err("alice's update admitted")
        .to_string();
    assert!(err.contains("user alice may not create pods"), "{err}");

    // carol is in an exempt group: admitted by the policy. The operator,
    // whose limits are its own, refuses the address anyway: InvalidSpec,
    // naming the field and the flag, and it writes nothing for it. (A second
    // DaemonSet, so this SafeRollout is the only one targeting it.)
    let ds_b: DaemonSet = serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "plugin-b"},
        "spec": {"selector": {"matchLabels": {"app": "plugin-b"}},
            "template": {"metadata": {"labels": {"app": "plugin-b"}},
                "spec": {"containers": [{"name": "c", "image": V1}],
                    "nodeSelector": {"saferollout-e2e/none": "true"}}}}
    }))?;
    let created_b = dss.create(&Default::default(), &ds_b).await?;
    let (name, mut spec, _) = all
        .iter()
        .find(|(n, _, _)| *n == "unlisted-prometheus")
        .cloned()
        .unwrap();
    spec["targetRef"]["name"] = json!("plugin-b");
    let file = write(&env.dir, "exempt", &manifest(&ns, name, spec))?;
    create_as(c, "carol", Some(TRUSTED), &file)
        .map_err(|e| anyhow::anyhow!("carol's exempt SafeRollout refused: {e}"))?;
    let st = wait_status(&client, &ns, name, TIMEOUT, |st| {
        condition(st, "Ready").is_some_and(|c| c.reason == "InvalidSpec")
    })
    .await?;
    let ready = condition(&st, "Ready").unwrap();
    assert!(
        ready.message.contains("spec.gates.prometheus[0].address")
            && ready.message.contains("--prometheus-address"),
        "{}",
        ready.message
    );
    assert_eq!(st.phase, Some(saferollout_api::Phase::Failed));
    // A refused SafeRollout touches nothing: the DaemonSet is not taken over.
    let b = dss.get("plugin-b").await?;
    assert_eq!(b.metadata.generation, created_b.metadata.generation);
    assert_eq!(b.spec.update_strategy, created_b.spec.update_strategy);
    assert!(
        b.metadata
            .managed_fields
            .iter()
            .flatten()
            .all(|f| f.manager.as_deref() != Some(saferollout_api::FIELD_MANAGER)),
        "the operator wrote plugin-b"
    );
    assert!(
        st.original_update_strategy.is_none() && st.target_revision.is_none(),
        "{st:?}"
    );
    drop(op);
    let _ = std::fs::remove_dir_all(&env.dir);
    Ok(())
}
