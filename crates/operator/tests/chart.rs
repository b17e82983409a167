//! The Helm chart (charts/saferollout) with a real helm (built from its Go
//! module by tests/tools/build-bins): lint, render, schema, the plain
//! manifests of deploy/ rendered from it, every manifest lint-clean; then
//! installed on the local control plane, the operator run with a token of the
//! chart's ServiceAccount does a full rollout (the chart's RBAC suffices, in
//! the cluster-wide and the namespaced mode), and a copy missing one rule
//! fails with the 403 that names it.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, bail, ensure};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::config::Kubeconfig;
use saferollout_api::{Phase, SafeRollout};
use saferollout_testkit::{TestCluster, cluster, repo_root, wait_for_object};
use serde_json::{Value, json};
use support::*;

const CHART: &str = "charts/saferollout";
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The objects of a multi-document YAML text (empty documents dropped).
fn parse_docs(text: &str) -> anyhow::Result<Vec<Value>> {
    let docs: Vec<Value> = serde_yaml::from_multiple(text)?;
    Ok(docs.into_iter().filter(|d| !d.is_null()).collect())
}

/// `helm template` of the chart as release `t` in saferollout-system.
fn render(extra: &[&str]) -> anyhow::Result<Vec<Value>> {
    let mut args = vec!["template", "t", CHART, "--namespace", "saferollout-system"];
    args.extend_from_slice(extra);
    parse_docs(&helm(&args)?)
}

fn of_kind<'a>(objs: &'a [Value], kind: &str) -> Vec<&'a Value> {
    objs.iter().filter(|o| o["kind"] == kind).collect()
}

fn one<'a>(objs: &'a [Value], kind: &str) -> &'a Value {
    let found = of_kind(objs, kind);
    assert_eq!(found.len(), 1, "one {kind} expected, got {found:#?}");
    found[0]
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

/// Every (apiGroup/resource, verb) a set of Roles or ClusterRoles grants,
/// with the resourceNames it is limited to (empty: any).
fn grants(roles: &[&Value]) -> BTreeMap<(String, String), BTreeSet<String>> {
    let mut out: BTreeMap<(String, String), BTreeSet<String>> = BTreeMap::new();
    for role in roles {
        for rule in role["rules"].as_array().into_iter().flatten() {
            for group in strings(&rule["apiGroups"]) {
                for res in strings(&rule["resources"]) {
                    for verb in strings(&rule["verbs"]) {
                        let names = strings(&rule["resourceNames"]);
                        out.entry((format!("{group}/{res}"), verb))
                            .or_default()
                            .extend(if names.is_empty() {
                                vec!["*any*".to_string()]
                            } else {
                                names
                            });
                    }
                }
            }
        }
    }
    out
}

/// (resource, verb) pairs, e.g. `("/pods", "delete")`.
fn pairs(g: &BTreeMap<(String, String), BTreeSet<String>>) -> BTreeSet<(String, String)> {
    g.keys().cloned().collect()
}

fn expect_pairs(list: &[(&str, &[&str])]) -> BTreeSet<(String, String)> {
    list.iter()
        .flat_map(|(res, verbs)| verbs.iter().map(move |v| (res.to_string(), v.to_string())))
        .collect()
}

/// What the operator needs on the objects of the namespaces it watches.
const ROLLOUT_RULES: &[(&str, &[&str])] = &[
    (
        "saferollout.dev/saferollouts",
        &["get", "list", "watch", "patch", "update"],
    ),
    (
        "saferollout.dev/saferollouts/status",
        &["get", "patch", "update"],
    ),
    ("saferollout.dev/saferollouts/finalizers", &["update"]),
    ("apps/daemonsets", &["get", "list", "watch", "patch"]),
    (
        "apps/controllerrevisions",
        &["get", "list", "watch", "create", "delete"],
    ),
    ("/pods", &["get", "list", "watch", "delete", "create"]),
    ("/pods/log", &["get"]),
    ("resource.k8s.io/resourceclaimtemplates", &["create"]),
    ("events.k8s.io/events", &["create", "patch"]),
    ("resource.k8s.io/resourceclaims", &["create", "delete"]),
];
const CLUSTER_RULES: &[(&str, &[&str])] = &[
    ("/nodes", &["get", "list", "watch", "patch"]),
    ("/namespaces", &["get"]),
    ("resource.k8s.io/resourceslices", &["get", "list", "watch"]),
    ("resource.k8s.io/resourceclaims", &["get", "list", "watch"]),
    (
        "resource.k8s.io/devicetaintrules",
        &["get", "list", "watch", "create", "delete"],
    ),
];

fn no_wildcards_no_secrets(objs: &[Value]) {
    no_wildcards_and_secrets_only(objs, &[]);
}

/// No wildcards; Secrets only `get`, only by the names given.
fn no_wildcards_and_secrets_only(objs: &[Value], names: &[&str]) {
    for role in of_kind(objs, "ClusterRole")
        .into_iter()
        .chain(of_kind(objs, "Role"))
    {
        for rule in role["rules"].as_array().into_iter().flatten() {
            for key in ["apiGroups", "resources", "verbs", "resourceNames"] {
                assert!(
                    !strings(&rule[key]).iter().any(|s| s.contains('*')),
                    "wildcard in {key} of {}: {rule}",
                    role["metadata"]["name"]
                );
            }
            if strings(&rule["resources"]).contains(&"secrets".to_string()) {
                let allowed: Vec<String> = names.iter().map(|n| n.to_string()).collect();
                assert!(
                    !names.is_empty()
                        && strings(&rule["verbs"]) == ["get"]
                        && strings(&rule["resourceNames"]) == allowed,
                    "{} reads Secrets: {rule}",
                    role["metadata"]["name"]
                );
            }
        }
    }
}

fn container(objs: &[Value]) -> &Value {
    &one(objs, "Deployment")["spec"]["template"]["spec"]["containers"][0]
}

#[test]
fn helm_lints_the_chart_in_every_mode() -> anyhow::Result<()> {
    for values in [
        vec![],
        vec!["--set", "watchNamespaces={gpu-operator,dra}"],
        vec![
            "--set",
            "serviceMonitor.enabled=true,prometheusRule.enabled=true,networkPolicy.enabled=true",
        ],
        vec![
            "--set",
            "replicaCount=1,leaderElection.enabled=false,podDisruptionBudget.enabled=false",
        ],
    ] {
        let mut args = vec![
            "lint",
            "--strict",
            CHART,
            "--namespace",
            "saferollout-system",
        ];
        args.extend(values.iter().copied());
        let out = helm(&args)?;
        assert!(out.contains("0 chart(s) failed"), "{out}");
    }
    Ok(())
}

#[test]
fn the_device_gates_rules_go_with_their_values() -> anyhow::Result<()> {
    // The probe gate's rules (pods create, ResourceClaimTemplates for DRA
    // probes) are not the device gates': they stay.
    let device = |p: &(String, String)| {
        p.0.starts_with("resource.k8s.io/") && p.0 != "resource.k8s.io/resourceclaimtemplates"
    };
    let off = render(&["--set", "deviceGates.enabled=false"])?;
    let granted = pairs(&grants(&of_kind(&off, "ClusterRole")));
    assert!(!granted.iter().any(device), "{granted:?}");
    assert!(strings(&container(&off)["args"]).contains(&"--device-gates=false".to_string()));
    // Namespaced: without the device gates no pod right is cluster-wide.
    let off_ns = render(&[
        "--set",
        "deviceGates.enabled=false",
        "--set",
        "watchNamespaces={gpu-operator}",
    ])?;
    let cluster_wide = pairs(&grants(&of_kind(&off_ns, "ClusterRole")));
    assert!(
        !cluster_wide.iter().any(|p| p.0 == "/pods"),
        "{cluster_wide:?}"
    );
    let no_quarantine = render(&["--set", "deviceGates.quarantine=false"])?;
    let granted = pairs(&grants(&of_kind(&no_quarantine, "ClusterRole")));
    assert!(
        !granted.iter().any(|p| p.0.ends_with("/devicetaintrules")),
        "{granted:?}"
    );
    assert!(granted.iter().any(|p| p.0.ends_with("/resourceslices")));
    Ok(())
}

#[test]
fn the_values_schema_rejects_mistakes_by_name() -> anyhow::Result<()> {
    for (set, want) in [
        ("replicas=3", "replicas"),
        ("metrics.port=http", "port"),
        ("watchNamespaces={Bad_Name}", "watchNamespaces"),
        ("leaderElection.enabled=false", "replicaCount"),
        ("image.digest=latest", "digest"),
    ] {
        let err = render(&["--set", set]).expect_err(set).to_string();
        assert!(
            err.contains("schema") && err.contains(want),
            "--set {set}: {err}"
        );
    }
    Ok(())
}

#[test]
fn the_default_release_is_hardened_with_two_leader_elected_replicas() -> anyhow::Result<()> {
    let objs = render(&[])?;
    let deploy = one(&objs, "Deployment");
    assert_eq!(deploy["spec"]["replicas"], 2);
    let pod = &deploy["spec"]["template"]["spec"];
    let c = container(&objs);
    let args = strings(&c["args"]);
    for want in [
        "--metrics-addr=0.0.0.0:8080",
        "--log-json",
        "--leader-election=true",
        "--device-gates=true",
        "--leader-election-namespace=saferollout-system",
        "--leader-election-lease-name=t-saferollout",
    ] {
        assert!(args.contains(&want.to_string()), "{want} in {args:?}");
    }
    assert!(
        !args.iter().any(|a| a.starts_with("--watch-namespaces")),
        "{args:?}"
    );
    let env: BTreeMap<String, String> = c["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["name"].as_str().unwrap().to_string(),
                e["valueFrom"]["fieldRef"]["fieldPath"]
                    .as_str()
                    .or(e["value"].as_str())
                    .unwrap_or_default()
                    .to_string(),
            )
        })
        .collect();
    assert_eq!(env["POD_NAMESPACE"], "metadata.namespace");
    assert_eq!(env["POD_NAME"], "metadata.name");

    // Hardened: non-root, read-only root FS, no capabilities, RuntimeDefault seccomp.
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert_eq!(
        pod["securityContext"]["seccompProfile"]["type"],
        "RuntimeDefault"
    );
    assert_eq!(c["securityContext"]["readOnlyRootFilesystem"], true);
    assert_eq!(c["securityContext"]["allowPrivilegeEscalation"], false);
    assert_eq!(c["securityContext"]["capabilities"]["drop"], json!(["ALL"]));
    assert!(c["resources"]["requests"]["cpu"].is_string());
    assert!(c["resources"]["limits"]["memory"].is_string());
    assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/readyz");
    assert_eq!(c["livenessProbe"]["httpGet"]["path"], "/healthz");
    let keys: Vec<&Value> = pod["topologySpreadConstraints"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| &t["topologyKey"])
        .collect();
    assert_eq!(
        keys,
        [
            &json!("topology.kubernetes.io/zone"),
            &json!("kubernetes.io/hostname")
        ]
    );
    assert_eq!(one(&objs, "PodDisruptionBudget")["spec"]["minAvailable"], 1);
    assert_eq!(one(&objs, "Service")["spec"]["ports"][0]["port"], 8080);
    assert_eq!(pod["serviceAccountName"], "t-saferollout");

    // Least privilege: exactly the rules the operator needs.
    no_wildcards_no_secrets(&objs);
    let cluster_roles = of_kind(&objs, "ClusterRole");
    let mut want = expect_pairs(ROLLOUT_RULES);
    want.extend(expect_pairs(CLUSTER_RULES));
    assert_eq!(pairs(&grants(&cluster_roles)), want);
    let roles = of_kind(&objs, "Role");
    assert_eq!(roles.len(), 1, "only the leader-election Role: {roles:#?}");
    assert_eq!(roles[0]["metadata"]["namespace"], "saferollout-system");
    let lease = grants(&roles);
    assert_eq!(
        pairs(&lease),
        expect_pairs(&[(
            "coordination.k8s.io/leases",
            &["create", "get", "list", "watch", "update", "patch"]
        )])
    );
    // list/watch: the write fence follows the Lease's renewals.
    for verb in ["get", "list", "watch", "update", "patch"] {
        assert_eq!(
            lease[&("coordination.k8s.io/leases".to_string(), verb.to_string())],
            BTreeSet::from(["t-saferollout".to_string()]),
            "{verb} is limited to the one Lease"
        );
    }
    // Every binding grants to the chart's ServiceAccount only.
    let bindings: Vec<&Value> = of_kind(&objs, "ClusterRoleBinding")
        .into_iter()
        .chain(of_kind(&objs, "RoleBinding"))
        .collect();
    assert_eq!(bindings.len(), 3);
    for b in bindings {
        assert_eq!(
            b["subjects"],
            json!([{"kind": "ServiceAccount", "name": "t-saferollout", "namespace": "saferollout-system"}])
        );
    }
    // Optional objects are off by default.
    for kind in [
        "ServiceMonitor",
        "PrometheusRule",
        "NetworkPolicy",
        "Namespace",
    ] {
        assert!(
            of_kind(&objs, kind).is_empty(),
            "{kind} rendered by default"
        );
    }
    Ok(())
}

#[test]
fn the_namespaced_mode_keeps_pod_and_daemonset_rights_in_the_listed_namespaces()
-> anyhow::Result<()> {
    let objs = render(&["--set", "watchNamespaces={gpu-operator,dra}"])?;
    no_wildcards_no_secrets(&objs);
    let args = strings(&container(&objs)["args"]);
    assert!(
        args.contains(&"--watch-namespaces=gpu-operator,dra".to_string()),
        "{args:?}"
    );
    // Cluster-wide: nodes, `get` on the listed namespaces only, and what the
    // device gates read (the workloads of a rollout's nodes are anywhere).
    let cluster = grants(&of_kind(&objs, "ClusterRole"));
    let mut want = expect_pairs(CLUSTER_RULES);
    want.extend(expect_pairs(&[("/pods", &["get", "list", "watch"])]));
    assert_eq!(pairs(&cluster), want);
    assert_eq!(
        cluster[&("/namespaces".to_string(), "get".to_string())],
        BTreeSet::from(["dra".to_string(), "gpu-operator".to_string()])
    );
    // Roles in each listed namespace (plus the Lease's).
    let roles = of_kind(&objs, "Role");
    for ns in ["gpu-operator", "dra"] {
        let here: Vec<&Value> = roles
            .iter()
            .copied()
            .filter(|r| r["metadata"]["namespace"] == ns)
            .collect();
        assert_eq!(pairs(&grants(&here)), expect_pairs(ROLLOUT_RULES), "{ns}");
        let bound = of_kind(&objs, "RoleBinding")
            .into_iter()
            .any(|b| b["metadata"]["namespace"] == ns && b["roleRef"]["kind"] == "Role");
        assert!(bound, "a RoleBinding in {ns}");
    }
    assert_eq!(roles.len(), 3);
    Ok(())
}

#[test]
fn the_prometheus_gate_reads_only_the_secrets_named_by_the_value() -> anyhow::Result<()> {
    for mode in [vec![], vec!["--set", "watchNamespaces={gpu-operator}"]] {
        let mut args = vec![
            "--set",
            "prometheusGate.secrets[0].name=prom-token",
            "--set",
            "prometheusGate.secrets[0].addresses={https://prom-a:9090,https://prom-b:9090}",
            "--set",
            "prometheusGate.secrets[1].name=prom-ca",
            "--set",
            "prometheusGate.secrets[1].addresses={https://prom-a:9090}",
        ];
        args.extend(mode.iter().copied());
        let objs = render(&args)?;
        no_wildcards_and_secrets_only(&objs, &["prom-token", "prom-ca"]);
        // Each Secret goes to the operator with the addresses it may be sent to.
        let flags: Vec<String> = strings(&container(&objs)["args"])
            .into_iter()
            .filter(|a| a.starts_with("--prometheus-secret="))
            .collect();
        assert_eq!(
            flags,
            [
                "--prometheus-secret=prom-token=https://prom-a:9090",
                "--prometheus-secret=prom-token=https://prom-b:9090",
                "--prometheus-secret=prom-ca=https://prom-a:9090"
            ],
            "{mode:?}"
        );
        let rollouts: Vec<&Value> = of_kind(&objs, "ClusterRole")
            .into_iter()
            .chain(of_kind(&objs, "Role"))
            .filter(|r| {
                r["rules"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|rule| strings(&rule["resources"]).contains(&"secrets".to_string()))
            })
            .collect();
        assert_eq!(rollouts.len(), 1, "{mode:?}: {rollouts:#?}");
        if !mode.is_empty() {
            assert_eq!(rollouts[0]["kind"], "Role", "namespaced where possible");
            assert_eq!(rollouts[0]["metadata"]["namespace"], "gpu-operator");
        }
    }
    Ok(())
}

#[test]
fn the_operators_limits_and_the_admission_policy_come_from_the_same_values() -> anyhow::Result<()> {
    // Defaults: nothing allowed, the policy installed, the operator exempt.
    let objs = render(&[])?;
    let args = strings(&container(&objs)["args"]);
    for want in [
        "--quarantine-allow-no-execute=false",
        "--allow-privileged-probes=false",
    ] {
        assert!(args.contains(&want.to_string()), "{want} in {args:?}");
    }
    assert!(!args.iter().any(|a| a.starts_with("--prometheus-address")));
    let policy = one(&objs, "ValidatingAdmissionPolicy");
    assert_eq!(policy["spec"]["failurePolicy"], "Fail");
    let binding = one(&objs, "ValidatingAdmissionPolicyBinding");
    assert_eq!(binding["spec"]["policyName"], policy["metadata"]["name"]);
    assert_eq!(binding["spec"]["validationActions"], json!(["Deny"]));
    let exempt = policy["spec"]["matchConditions"][0]["expression"]
        .as_str()
        .unwrap();
    assert!(
        exempt.contains("'system:serviceaccount:saferollout-system:t-saferollout'"),
        "{exempt}"
    );
    let variable = |objs: &[Value], name: &str| -> String {
        one(objs, "ValidatingAdmissionPolicy")["spec"]["variables"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == name)
            .and_then(|v| v["expression"].as_str())
            .unwrap()
            .to_string()
    };
    assert_eq!(variable(&objs, "allowedAddresses"), "[]");
    assert_eq!(variable(&objs, "secretAddresses"), "{}");

    // Set: the same values reach both, trailing slashes trimmed for the policy.
    let objs = render(&[
        "--set",
        "prometheusGate.addresses={https://prom:9090/,http://thanos:10902}",
        "--set",
        "prometheusGate.secrets[0].name=prom-auth",
        "--set",
        "prometheusGate.secrets[0].addresses={https://prom:9090}",
        "--set",
        "quarantine.allowNoExecute=true,probe.allowPrivileged=true",
        "--set",
        "admission.exempt.groups={gitops:argocd}",
    ])?;
    let args = strings(&container(&objs)["args"]);
    for want in [
        "--prometheus-address=https://prom:9090/",
        "--prometheus-address=http://thanos:10902",
        "--prometheus-secret=prom-auth=https://prom:9090",
        "--quarantine-allow-no-execute=true",
        "--allow-privileged-probes=true",
    ] {
        assert!(args.contains(&want.to_string()), "{want} in {args:?}");
    }
    assert_eq!(
        variable(&objs, "allowedAddresses"),
        r#"["https://prom:9090","http://thanos:10902"]"#
    );
    assert_eq!(
        variable(&objs, "secretAddresses"),
        r#"{"prom-auth":["https://prom:9090"]}"#
    );
    let exempt =
        one(&objs, "ValidatingAdmissionPolicy")["spec"]["matchConditions"][0]["expression"]
            .as_str()
            .unwrap();
    assert!(exempt.contains(r#"g in ["gitops:argocd"]"#), "{exempt}");

    // Off: no policy (the operator's own limits still hold).
    let off = render(&["--set", "admission.enabled=false"])?;
    assert!(of_kind(&off, "ValidatingAdmissionPolicy").is_empty());
    assert!(of_kind(&off, "ValidatingAdmissionPolicyBinding").is_empty());
    // Bad values are refused by the schema, by name.
    for (set, want) in [
        ("prometheusGate.addresses={prom:9090}", "addresses"),
        ("prometheusGate.secrets[0].name=prom", "addresses"),
        ("quarantine.allowNoExecute=yes", "allowNoExecute"),
    ] {
        let err = render(&["--set", set]).expect_err(set).to_string();
        assert!(
            err.contains("schema") && err.contains(want),
            "--set {set}: {err}"
        );
    }
    Ok(())
}

#[test]
fn optional_objects_render_when_enabled() -> anyhow::Result<()> {
    let objs = render(&[
        "--set",
        "serviceMonitor.enabled=true,prometheusRule.enabled=true,networkPolicy.enabled=true",
        "--set",
        "prometheusRule.labels.release=kube-prometheus",
    ])?;
    let sm = one(&objs, "ServiceMonitor");
    let ep = &sm["spec"]["endpoints"][0];
    assert_eq!(ep["port"], "metrics");
    assert_eq!(ep["honorLabels"], true);
    assert_eq!(
        ep["relabelings"],
        json!([{"targetLabel": "job", "replacement": "saferollout-operator"}])
    );
    // The PrometheusRule carries the rules file verbatim: one source.
    let rule = one(&objs, "PrometheusRule");
    assert_eq!(rule["metadata"]["labels"]["release"], "kube-prometheus");
    let file =
        std::fs::read_to_string(repo_root().join(CHART).join("files/prometheus-rules.yaml"))?;
    let from_file: Value = serde_yaml::from_str(&file)?;
    assert_eq!(rule["spec"], from_file);
    let plain: Value = serde_yaml::from_str(&std::fs::read_to_string(
        repo_root().join("deploy/prometheus-rules.yaml"),
    )?)?;
    assert_eq!(plain, from_file);
    let np = one(&objs, "NetworkPolicy");
    assert_eq!(np["spec"]["policyTypes"], json!(["Ingress", "Egress"]));
    assert_eq!(np["spec"]["ingress"][0]["ports"][0]["port"], "metrics");
    Ok(())
}

#[test]
fn deploy_is_the_chart_rendered() -> anyhow::Result<()> {
    // deploy/render --check fails naming each stale file (CRD copy included).
    let out = Command::new(repo_root().join("deploy/render"))
        .arg("--check")
        .env("HELM", tool("helm"))
        .output()?;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        std::fs::read(repo_root().join("deploy/crd.yaml"))?,
        std::fs::read(
            repo_root()
                .join(CHART)
                .join("crds/saferollouts.saferollout.dev.yaml")
        )?
    );
    // rbac.yaml alone sets up the identity the e2e tests impersonate.
    let rbac = parse_docs(&std::fs::read_to_string(
        repo_root().join("deploy/rbac.yaml"),
    )?)?;
    let kinds: BTreeSet<&str> = rbac.iter().filter_map(|o| o["kind"].as_str()).collect();
    assert_eq!(
        kinds,
        BTreeSet::from([
            "Namespace",
            "ServiceAccount",
            "ClusterRole",
            "ClusterRoleBinding",
            "Role",
            "RoleBinding"
        ])
    );
    let sa = one(&rbac, "ServiceAccount");
    assert_eq!(sa["metadata"]["name"], "saferollout-operator");
    assert_eq!(sa["metadata"]["namespace"], "saferollout-system");
    Ok(())
}

#[test]
fn every_value_is_documented_in_the_chart_readme() -> anyhow::Result<()> {
    let values: Value = serde_yaml::from_str(&std::fs::read_to_string(
        repo_root().join(CHART).join("values.yaml"),
    )?)?;
    let readme = std::fs::read_to_string(repo_root().join(CHART).join("README.md"))?;
    // Leaves, and maps/lists that are values in their own right (resources, ...).
    fn keys(prefix: &str, v: &Value, out: &mut Vec<String>) {
        match v {
            Value::Object(m) if !m.is_empty() && !prefix.ends_with("Context") => {
                for (k, v) in m {
                    let p = if prefix.is_empty() {
                        k.clone()
                    } else {
                        format!("{prefix}.{k}")
                    };
                    keys(&p, v, out);
                }
            }
            _ => out.push(prefix.to_string()),
        }
    }
    let mut all = Vec::new();
    keys("", &values, &mut all);
    // resources and the security contexts are documented as a whole.
    let whole = ["resources", "podSecurityContext", "securityContext"];
    let documented = |k: &str| {
        let top = k.split('.').next().unwrap_or_default();
        readme.contains(&format!("| `{k}` |"))
            || (whole.contains(&top) && readme.contains(&format!("| `{top}` |")))
    };
    let undocumented: Vec<&String> = all.iter().filter(|k| !documented(k)).collect();
    assert!(
        undocumented.is_empty(),
        "not in the README: {undocumented:?}"
    );
    Ok(())
}

/// `kubectl-saferollout lint` (built beside the operator by tests/all).
fn lint(args: &[&str], stdin: Option<&str>) -> anyhow::Result<(i32, String)> {
    let bin =
        Path::new(env!("CARGO_BIN_EXE_saferollout-operator")).with_file_name("kubectl-saferollout");
    ensure!(
        bin.exists(),
        "{} not built (cargo build -p saferollout-cli)",
        bin.display()
    );
    let mut child = Command::new(&bin)
        .arg("lint")
        .args(args)
        .current_dir(repo_root())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    {
        use std::io::Write;
        let mut input = child.stdin.take().context("stdin")?;
        input.write_all(stdin.unwrap_or_default().as_bytes())?;
    }
    let out = child.wait_with_output()?;
    Ok((
        out.status.code().unwrap_or(-1),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    ))
}

#[test]
fn every_manifest_of_examples_deploy_and_the_chart_lints_without_an_error() -> anyhow::Result<()> {
    // Files: every YAML manifest of examples/ and deploy/. The one file that
    // is no Kubernetes manifest, deploy/prometheus-rules.yaml, is checked by
    // promtool (tests/alerts).
    let mut files = Vec::new();
    for dir in ["examples", "deploy", "deploy/argocd"] {
        for e in std::fs::read_dir(repo_root().join(dir))? {
            let p = e?.path();
            if p.extension().is_some_and(|x| x == "yaml") && !p.ends_with("prometheus-rules.yaml") {
                files.push(p.strip_prefix(repo_root())?.to_string_lossy().into_owned());
            }
        }
    }
    files.sort();
    assert!(
        files.contains(&"examples/sim-device-plugin.yaml".to_string()),
        "{files:?}"
    );
    let mut args: Vec<&str> = Vec::new();
    for f in &files {
        args.extend(["-f", f.as_str()]);
    }
    let (code, out) = lint(&args, None)?;
    assert_eq!(code, 0, "{out}");
    assert!(out.contains(" 0 errors"), "{out}");

    // The rendered chart, in each mode.
    for values in [
        vec![],
        vec!["--set", "watchNamespaces={gpu-operator,dra}"],
        vec![
            "--set",
            "serviceMonitor.enabled=true,prometheusRule.enabled=true,networkPolicy.enabled=true,namespace.create=true",
        ],
    ] {
        let mut args = vec!["template", "t", CHART, "--include-crds"];
        args.extend(values.iter().copied());
        let rendered = helm(&args)?;
        let (code, out) = lint(&["-f", "-", "--psa-level", "restricted"], Some(&rendered))?;
        assert_eq!(code, 0, "{values:?}: {out}");
        assert!(out.contains(" 0 errors"), "{values:?}: {out}");
    }
    Ok(())
}

// ---- On the local cluster -------------------------------------------------

/// A release of a chart directory, installed with helm into `namespace`.
struct Release {
    name: String,
    namespace: String,
}

impl Release {
    fn install(
        c: &TestCluster,
        chart: &Path,
        name: &str,
        namespace: &str,
        set: &[&str],
    ) -> anyhow::Result<Self> {
        let kubeconfig = c.kubeconfig().to_string_lossy().into_owned();
        let chart = chart.to_string_lossy().into_owned();
        let mut args = vec![
            "install",
            name,
            &chart,
            "--namespace",
            namespace,
            "--create-namespace",
            "--kubeconfig",
            &kubeconfig,
        ];
        for s in set {
            args.extend(["--set", s]);
        }
        helm(&args)?;
        Ok(Release {
            name: name.into(),
            namespace: namespace.into(),
        })
    }

    fn service_account(&self) -> String {
        format!("{}-saferollout", self.name)
    }

    /// A kubeconfig that authenticates with a token of the release's ServiceAccount.
    fn token_kubeconfig(&self, c: &TestCluster) -> anyhow::Result<PathBuf> {
        let token = c.kubectl(&[
            "create",
            "token",
            &self.service_account(),
            "-n",
            &self.namespace,
            "--duration=1h",
        ])?;
        let admin = Kubeconfig::read_from(c.kubeconfig())?;
        let cluster = admin
            .clusters
            .first()
            .context("a cluster in the kubeconfig")?;
        let server = cluster.cluster.as_ref().context("cluster details")?;
        let kubeconfig = json!({
            "apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": "test", "cluster": {
                "server": server.server,
                "certificate-authority-data": server.certificate_authority_data,
                "certificate-authority": server.certificate_authority,
            }}],
            "users": [{"name": self.service_account(), "user": {"token": token.trim()}}],
            "contexts": [{"name": "sa", "context": {"cluster": "test", "user": self.service_account()}}],
            "current-context": "sa",
        });
        let path = std::env::temp_dir().join(format!(
            "saferollout-{}-{}.kubeconfig",
            self.name,
            std::process::id()
        ));
        std::fs::write(&path, serde_json::to_vec_pretty(&kubeconfig)?)?;
        Ok(path)
    }

    /// The operator's arguments as the installed Deployment has them, with
    /// the metrics address on loopback.
    async fn operator_args(&self, client: &kube::Client) -> anyhow::Result<Vec<String>> {
        let d = Api::<Deployment>::namespaced(client.clone(), &self.namespace)
            .get(&self.service_account())
            .await?;
        let args = d
            .spec
            .template
            .spec
            .and_then(|s| s.containers.into_iter().next())
            .and_then(|c| c.args)
            .context("the Deployment's container args")?;
        let out: Vec<String> = args
            .into_iter()
            .map(|a| {
                if a.starts_with("--metrics-addr") {
                    "--metrics-addr=127.0.0.1:0".to_string()
                } else {
                    a
                }
            })
            .collect();
        eprintln!("operator args from the chart's Deployment: {out:?}");
        Ok(out)
    }

    fn start_operator(&self, kubeconfig: &Path, args: &[String]) -> anyhow::Result<Operator> {
        Operator::start_with_env(
            Identity::Kubeconfig(kubeconfig),
            args,
            &[
                ("POD_NAMESPACE", &self.namespace),
                ("POD_NAME", "chart-test"),
            ],
            &self.name,
        )
    }
}

/// Deletes the rollout (with its operator still running, so its finalizer
/// goes) and waits until it is gone.
async fn delete_rollout(client: &kube::Client, ns: &str) -> anyhow::Result<()> {
    let api: Api<SafeRollout> = Api::namespaced(client.clone(), ns);
    api.delete("plugin", &DeleteParams::default()).await?;
    wait_for_object(&api, "plugin", TIMEOUT, |o| o.is_none()).await?;
    Ok(())
}

/// A healthy release through every stage, by an operator started on `args`.
async fn full_rollout(client: &kube::Client, ns: &str, resource: &str) -> anyhow::Result<()> {
    let (v1, v2) = ("registry.example/plugin:v1", "registry.example/plugin:v2");
    create_plugin_daemonset(client, ns, resource, v1).await?;
    create_rollout(client, ns, "plugin", default_spec(resource, v1)).await?;
    let adopted = wait_adopted(client, ns, "plugin").await?;
    set_template_image(client, ns, "plugin", resource, v2).await?;
    let st = wait_status(client, ns, "plugin", TIMEOUT, |st| {
        st.phase == Some(Phase::Succeeded) && st.stable_revision != adopted.stable_revision
    })
    .await?;
    wait_agents(client, ns, v2).await?;
    let passed = st
        .stages
        .iter()
        .filter(|s| s.state == saferollout_api::StageState::Passed)
        .count();
    assert_eq!(passed, 3, "three stages passed: {st:#?}");
    assert!(condition(&st, "Ready").is_some_and(|c| c.status == "True"));
    Ok(())
}

#[tokio::test]
async fn the_charts_rbac_suffices_for_a_full_rollout() -> anyhow::Result<()> {
    let _serial = SERIAL.lock().await;
    let c = cluster();
    let client = c.client().await?;
    let release = Release::install(c, &repo_root().join(CHART), "sr", "saferollout-system", &[])?;
    let kubeconfig = release.token_kubeconfig(c)?;
    let args = release.operator_args(&client).await?;
    let mut op = release.start_operator(&kubeconfig, &args)?;
    let ns = c.namespace("chart").await?;
    full_rollout(&client, &ns.name, "example.com/gpu-chart").await?;
    delete_rollout(&client, &ns.name).await?;
    assert!(op.is_running(), "{}", op.log_text());
    let log = op.log_text();
    assert!(!log.contains("forbidden"), "a request was refused:\n{log}");
    Ok(())
}

#[tokio::test]
async fn the_namespaced_chart_suffices_and_stops_at_its_namespaces() -> anyhow::Result<()> {
    let _serial = SERIAL.lock().await;
    let c = cluster();
    let client = c.client().await?;
    let ns = c.namespace("chartns").await?;
    let set = format!("watchNamespaces={{{}}}", ns.name);
    let release = Release::install(
        c,
        &repo_root().join(CHART),
        "srns",
        "saferollout-ns",
        &[&set],
    )?;
    let kubeconfig = release.token_kubeconfig(c)?;

    // What the token may do, asked as the token (SelfSubjectAccessReview).
    let can = |args: &[&str]| -> anyhow::Result<bool> {
        let mut all = vec!["auth", "can-i"];
        all.extend_from_slice(args);
        let out = Command::new(tools_dir().join("kubectl"))
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .args(&all)
            .output()?;
        match String::from_utf8_lossy(&out.stdout).trim() {
            "yes" => Ok(true),
            "no" => Ok(false),
            other => bail!(
                "kubectl auth can-i {args:?}: {other:?} {}",
                String::from_utf8_lossy(&out.stderr)
            ),
        }
    };
    assert!(can(&["delete", "pods", "-n", &ns.name])?);
    assert!(can(&["patch", "daemonsets.apps", "-n", &ns.name])?);
    assert!(can(&["patch", "nodes"])?);
    assert!(can(&["get", &format!("namespaces/{}", ns.name)])?);
    for other in ["default", "kube-system"] {
        assert!(!can(&["delete", "pods", "-n", other])?, "pods in {other}");
        assert!(
            !can(&["patch", "daemonsets.apps", "-n", other])?,
            "daemonsets in {other}"
        );
        assert!(!can(&["list", "controllerrevisions.apps", "-n", other])?);
        assert!(!can(&["get", "namespaces/kube-system"])?);
    }
    assert!(!can(&["get", "secrets", "-n", &ns.name])?);
    // The device gates read the workloads of held nodes in any namespace
    // (deviceGates.enabled, the default); every pod write stays in the
    // listed namespaces.
    assert!(can(&["list", "pods", "--all-namespaces"])?);
    for other in ["default", "kube-system"] {
        assert!(
            !can(&["create", "pods", "-n", other])?,
            "pod create in {other}"
        );
    }

    let args = release.operator_args(&client).await?;
    let mut op = release.start_operator(&kubeconfig, &args)?;
    full_rollout(&client, &ns.name, "example.com/gpu-chartns").await?;
    delete_rollout(&client, &ns.name).await?;
    assert!(op.is_running(), "{}", op.log_text());
    let log = op.log_text();
    assert!(!log.contains("forbidden"), "a request was refused:\n{log}");
    Ok(())
}

fn copy_dir(from: &Path, to: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(to)?;
    for e in std::fs::read_dir(from)? {
        let e = e?;
        let target = to.join(e.file_name());
        if e.file_type()?.is_dir() {
            copy_dir(&e.path(), &target)?;
        } else {
            std::fs::copy(e.path(), &target)?;
        }
    }
    Ok(())
}

#[tokio::test]
async fn a_chart_missing_one_rule_fails_with_the_403_named() -> anyhow::Result<()> {
    let _serial = SERIAL.lock().await;
    let c = cluster();
    let client = c.client().await?;
    // A copy of the chart without the rule that lets the operator delete pods.
    let copy = std::env::temp_dir().join(format!("saferollout-chart-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&copy);
    copy_dir(&repo_root().join(CHART), &copy)?;
    let rbac = copy.join("templates/_rbac.tpl");
    let text = std::fs::read_to_string(&rbac)?;
    let rule = r#"- {apiGroups: [""], resources: [pods], verbs: [delete]}"#;
    assert_eq!(
        text.matches(rule).count(),
        1,
        "the rule is one line of {}",
        rbac.display()
    );
    std::fs::write(&rbac, text.replace(&format!("{rule}\n"), ""))?;

    let ns = c.namespace("chartbroken").await?;
    let set = format!("watchNamespaces={{{}}}", ns.name);
    let release = Release::install(c, &copy, "srbroken", "saferollout-broken", &[&set])?;
    let kubeconfig = release.token_kubeconfig(c)?;
    let args = release.operator_args(&client).await?;
    let op = release.start_operator(&kubeconfig, &args)?;

    let resource = "example.com/gpu-chartbroken";
    let (v1, v2) = ("registry.example/plugin:v1", "registry.example/plugin:v2");
    create_plugin_daemonset(&client, &ns.name, resource, v1).await?;
    create_rollout(&client, &ns.name, "plugin", default_spec(resource, v1)).await?;
    wait_adopted(&client, &ns.name, "plugin").await?;
    let before = agent_pod_names(&client, &ns.name).await?;
    set_template_image(&client, &ns.name, "plugin", resource, v2).await?;

    // The operator says which request was refused, to whom, and why.
    let user = format!(
        "system:serviceaccount:{}:{}",
        release.namespace,
        release.service_account()
    );
    let refused = poll("the 403 in the operator's log", TIMEOUT, || {
        Ok(op
            .log_text()
            .lines()
            .find(|l| l.contains("forbidden"))
            .map(String::from))
    })
    .await?;
    for want in [
        r#"cannot delete resource \"pods\""#,
        &format!(r#"User \"{user}\""#),
        &format!(r#"in the namespace \"{}\""#, ns.name),
    ] {
        let want_plain = want.replace("\\\"", "\"");
        assert!(
            refused.contains(want) || refused.contains(&want_plain),
            "{want_plain} in: {refused}"
        );
    }
    // And nothing was replaced: the rollout cannot proceed.
    assert_eq!(agent_pod_names(&client, &ns.name).await?, before);
    let sr = Api::<SafeRollout>::namespaced(client.clone(), &ns.name)
        .get("plugin")
        .await?;
    assert_ne!(
        sr.status.and_then(|s| s.phase),
        Some(Phase::Succeeded),
        "no success without deleting a pod"
    );

    // Clean up as an admin (this operator cannot finish): no stage label or
    // finalizer is left for the other tests' operators.
    drop(op);
    let api: Api<SafeRollout> = Api::namespaced(client.clone(), &ns.name);
    api.patch(
        "plugin",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await?;
    let _ = api.delete("plugin", &DeleteParams::default()).await;
    let nodes: Api<Node> = Api::all(client.clone());
    for n in nodes.list(&Default::default()).await? {
        let labels = n.metadata.labels.clone().unwrap_or_default();
        if labels.keys().any(|k| k.starts_with("saferollout.dev/")) {
            let name = n.metadata.name.clone().unwrap_or_default();
            nodes
                .patch(
                    &name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"metadata": {"labels": {
                        "saferollout.dev/stage": null, "saferollout.dev/rollout": null}}})),
                )
                .await?;
        }
    }
    std::fs::remove_dir_all(&copy)?;
    Ok(())
}
