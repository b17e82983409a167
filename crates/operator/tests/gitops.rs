//! How GitOps tools read SafeRollouts, on real objects: the operator is
//! driven through every phase on the local cluster, every version of the
//! objects it writes is captured from a watch, and one object per case is
//! judged by tests/gitops (gitops-check): saferollout's Argo CD health check
//! (deploy/argocd/health.lua) run by Argo CD's Lua interpreter
//! (github.com/yuin/gopher-lua, set up as Argo CD does), and Flux's kstatus
//! (sigs.k8s.io/cli-utils).
//!
//! Expected (the status semantics of docs/gitops.md):
//!
//! | case                      | Argo CD     | kstatus    |
//! |---------------------------|-------------|------------|
//! | Pending, taking over      | Progressing | InProgress |
//! | Progressing               | Progressing | InProgress |
//! | Paused by spec.paused     | Progressing | InProgress |
//! | Paused awaiting approval  | Progressing | InProgress |
//! | generation not observed   | Progressing | InProgress |
//! | Succeeded                 | Healthy     | Current    |
//! | RollingBack               | Degraded    | InProgress |
//! | Degraded (reverted)       | Degraded    | Failed     |
//! | Failed (preflight)        | Degraded    | Failed     |
//! | TargetNotFound            | Degraded    | Failed     |

mod support;

use std::collections::BTreeMap;
use std::process::Command;
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use saferollout_api::{Phase, SafeRollout};
use saferollout_testkit::{cluster, repo_root};
use serde_json::{Value, json};
use support::*;

const OPERATOR_SA: &str = "system:serviceaccount:saferollout-system:saferollout-operator";

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Tool {
    ArgoCd,
    KStatus,
}

/// (case, Argo CD health, kstatus status).
const EXPECTED: &[(&str, &str, &str)] = &[
    ("pending-taking-over", "Progressing", "InProgress"),
    ("progressing", "Progressing", "InProgress"),
    ("paused-by-spec", "Progressing", "InProgress"),
    ("paused-awaiting-approval", "Progressing", "InProgress"),
    ("generation-not-observed", "Progressing", "InProgress"),
    ("succeeded", "Healthy", "Current"),
    ("rolling-back", "Degraded", "InProgress"),
    ("degraded", "Degraded", "Failed"),
    ("failed-preflight", "Degraded", "Failed"),
    ("target-not-found", "Degraded", "Failed"),
];

fn status_str<'a>(o: &'a Value, path: &[&str]) -> Option<&'a str> {
    let mut v = &o["status"];
    for p in path {
        v = &v[*p];
    }
    v.as_str()
}

fn cond<'a>(o: &'a Value, type_: &str) -> Option<&'a Value> {
    o["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
}

fn observed(o: &Value) -> bool {
    o["status"]["observedGeneration"] == o["metadata"]["generation"]
}

/// Which case a captured object is, if any.
fn classify(o: &Value) -> Option<&'static str> {
    let phase = status_str(o, &["phase"])?;
    let ready_reason = cond(o, "Ready").and_then(|c| c["reason"].as_str());
    if !observed(o) {
        return None;
    }
    Some(match phase {
        "Pending" if ready_reason == Some("TakingOver") => "pending-taking-over",
        "Pending" if ready_reason == Some("TargetNotFound") => "target-not-found",
        "Progressing" => "progressing",
        "Paused" if o["spec"]["paused"] == true => "paused-by-spec",
        "Paused"
            if cond(o, "Progressing").and_then(|c| c["reason"].as_str())
                == Some("AwaitingApproval") =>
        {
            "paused-awaiting-approval"
        }
        "Succeeded" => "succeeded",
        "RollingBack" => "rolling-back",
        "Degraded" => "degraded",
        "Failed" => "failed-preflight",
        _ => return None,
    })
}

/// Every version of the SafeRollouts of `ns`, as raw JSON, in order.
fn capture(
    client: &kube::Client,
    ns: &str,
) -> (Arc<Mutex<Vec<Value>>>, tokio::task::JoinHandle<()>) {
    let ar = ApiResource::erase::<SafeRollout>(&());
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &ar);
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = seen.clone();
    let task = tokio::spawn(async move {
        let mut stream = watcher(api, watcher::Config::default())
            .applied_objects()
            .boxed();
        while let Some(ev) = stream.next().await {
            if let Ok(obj) = ev
                && let Ok(mut v) = serde_json::to_value(&obj)
            {
                v["apiVersion"] = json!("saferollout.dev/v1alpha1");
                v["kind"] = json!("SafeRollout");
                s.lock().unwrap().push(v);
            }
        }
    });
    (seen, task)
}

async fn patch(client: &kube::Client, ns: &str, name: &str, p: Value) -> anyhow::Result<()> {
    Api::<SafeRollout>::namespaced(client.clone(), ns)
        .patch(name, &PatchParams::default(), &Patch::Merge(p))
        .await?;
    Ok(())
}

#[tokio::test]
async fn argo_cd_health_and_kstatus_of_real_objects_in_every_phase() -> anyhow::Result<()> {
    let c = cluster();
    support::install(c)?;
    let ns = c.namespace("gitops").await?;
    let client = c.client().await?;
    let resource = "example.com/gpu-gitops";
    let start = |log: &str| {
        Operator::start(
            Identity::Impersonate(c.kubeconfig(), OPERATOR_SA),
            &[
                "--namespace".into(),
                ns.name.clone(),
                "--metrics-addr".into(),
                "127.0.0.1:0".into(),
            ],
            log,
        )
    };
    let mut op = start("gitops")?;
    let (seen, task) = capture(&client, &ns.name);
    let mut extra: Vec<(String, Value)> = Vec::new();

    // A SafeRollout whose DaemonSet does not exist.
    create_rollout(
        &client,
        &ns.name,
        "orphan",
        json!({"targetRef": {"name": "missing"}}),
    )
    .await?;
    wait_status(&client, &ns.name, "orphan", TIMEOUT, |st| {
        condition(st, "Ready").is_some_and(|c| c.reason == "TargetNotFound")
    })
    .await?;

    // Adoption (Pending while taking over, then Succeeded).
    let (v1, v2, v3) = (
        "registry.example/plugin:v1",
        "registry.example/plugin:v2",
        "registry.example/plugin:v3",
    );
    create_plugin_daemonset(&client, &ns.name, resource, v1).await?;
    let mut spec = default_spec(resource, v1);
    spec["stages"] = json!([{"nodes": 1, "pause": true}, {"nodes": "50%"}, {"nodes": "100%"}]);
    create_rollout(&client, &ns.name, "plugin", spec).await?;
    wait_adopted(&client, &ns.name, "plugin").await?;

    // A release: Progressing, then Paused awaiting approval after stage 1.
    set_template_image(&client, &ns.name, "plugin", resource, v2).await?;
    let st = wait_status(&client, &ns.name, "plugin", TIMEOUT, |st| {
        st.phase == Some(Phase::Paused)
    })
    .await?;
    let approve = |st: &saferollout_api::SafeRolloutStatus| {
        json!({"metadata": {"annotations": {"saferollout.dev/approve":
            format!("{}:0", st.target_revision.clone().unwrap_or_default())}}})
    };
    patch(&client, &ns.name, "plugin", approve(&st)).await?;
    let done = wait_status(&client, &ns.name, "plugin", TIMEOUT, |s| {
        s.phase == Some(Phase::Succeeded) && s.stable_revision == st.target_revision
    })
    .await?;

    // A release paused by spec.paused, then resumed and approved.
    let template = agent_template(resource, v3);
    patch(
        &client,
        &ns.name,
        "plugin",
        json!({"spec": {"template": template, "paused": true}}),
    )
    .await?;
    wait_status(&client, &ns.name, "plugin", TIMEOUT, |s| {
        s.phase == Some(Phase::Paused) && s.target_revision != done.stable_revision
    })
    .await?;

    // The operator stopped while the spec changes: generation not observed.
    op.kill();
    patch(
        &client,
        &ns.name,
        "plugin",
        json!({"spec": {"paused": false}}),
    )
    .await?;
    let ar = ApiResource::erase::<SafeRollout>(&());
    let raw = Api::<DynamicObject>::namespaced_with(client.clone(), &ns.name, &ar)
        .get("plugin")
        .await?;
    let mut raw = serde_json::to_value(&raw)?;
    raw["apiVersion"] = json!("saferollout.dev/v1alpha1");
    raw["kind"] = json!("SafeRollout");
    assert!(!observed(&raw), "{raw:#}");
    extra.push(("generation-not-observed".into(), raw));
    op = start("gitops-2")?;
    let st = wait_status(&client, &ns.name, "plugin", TIMEOUT, |s| {
        s.phase == Some(Phase::Paused)
            && s.current_stage == Some(0)
            && s.stages
                .first()
                .is_some_and(|x| x.state == saferollout_api::StageState::Paused)
    })
    .await?;
    patch(&client, &ns.name, "plugin", approve(&st)).await?;
    wait_status(&client, &ns.name, "plugin", TIMEOUT, |s| {
        s.phase == Some(Phase::Succeeded) && s.stable_revision == st.target_revision
    })
    .await?;

    // A broken release: RollingBack, then Degraded.
    set_template_image(
        &client,
        &ns.name,
        "plugin",
        resource,
        "registry.example/plugin:v4-broken",
    )
    .await?;
    wait_status(&client, &ns.name, "plugin", TIMEOUT, |s| {
        s.phase == Some(Phase::Degraded)
            && condition(s, "Progressing").is_some_and(|c| c.reason == "RolledBack")
    })
    .await?;

    // Preflight Enforce with an error (a literal secret): Failed.
    let mut template = agent_template(resource, "registry.example/plugin:v5");
    template["spec"]["containers"][0]["env"] = json!([{"name": "API_TOKEN", "value": "literal"}]);
    patch(
        &client,
        &ns.name,
        "plugin",
        json!({"spec": {"template": template, "preflight": {"policy": "Enforce"}}}),
    )
    .await?;
    wait_status(&client, &ns.name, "plugin", TIMEOUT, |s| {
        s.phase == Some(Phase::Failed)
    })
    .await?;
    // The watch delivers the last writes shortly after the waits saw them.
    poll("the Failed object in the capture", TIMEOUT, || {
        Ok(seen
            .lock()
            .unwrap()
            .iter()
            .any(|o| classify(o) == Some("failed-preflight"))
            .then_some(()))
    })
    .await?;
    task.abort();
    drop(op);

    // Who wrote updateStrategy and the template on the DaemonSet.
    let ds = Api::<k8s_openapi::api::apps::v1::DaemonSet>::namespaced(client.clone(), &ns.name)
        .get("plugin")
        .await?;
    let writers: Vec<String> = ds
        .metadata
        .managed_fields
        .iter()
        .flatten()
        .filter(|m| {
            m.fields_v1
                .as_ref()
                .is_some_and(|f| f.0["f:spec"].get("f:updateStrategy").is_some())
        })
        .filter_map(|m| m.manager.clone())
        .collect();
    eprintln!("managers of the DaemonSet's spec.updateStrategy: {writers:?}");
    // docs/gitops.md tells Argo CD users to ignore what the operator writes on the
    // DaemonSet with `managedFieldsManagers: [saferollout-operator]`.
    assert!(
        writers.iter().any(|m| m == "saferollout-operator"),
        "managers of spec.updateStrategy: {writers:?}"
    );

    // One object per case: the first captured.
    let mut cases: BTreeMap<String, Value> = BTreeMap::new();
    for o in seen.lock().unwrap().iter() {
        if let Some(case) = classify(o) {
            cases.entry(case.to_string()).or_insert_with(|| o.clone());
        }
    }
    for (case, o) in extra {
        cases.insert(case, o);
    }
    let dir = std::env::temp_dir().join(format!("saferollout-gitops-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let mut files = Vec::new();
    for (case, _, _) in EXPECTED {
        let o = cases.get(*case).ok_or_else(|| {
            anyhow::anyhow!(
                "no object captured for case {case}; captured: {:?}",
                cases.keys()
            )
        })?;
        let path = dir.join(format!("{case}.json"));
        std::fs::write(&path, serde_json::to_vec_pretty(o)?)?;
        files.push(path);
    }
    eprintln!("captured objects in {}", dir.display());

    let out = run(Command::new(tool("gitops-check"))
        .arg("-lua")
        .arg(repo_root().join("deploy/argocd/health.lua"))
        .args(&files))?;
    let verdicts: BTreeMap<String, Value> = out
        .lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l)?;
            let case = std::path::Path::new(v["file"].as_str().unwrap_or_default())
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_default();
            Ok((case, v))
        })
        .collect::<anyhow::Result<_>>()?;

    let mut wrong = Vec::new();
    for (case, argo, kstatus) in EXPECTED {
        let v = &verdicts[*case];
        let o = &cases[*case];
        for (tool, want, got) in [
            (Tool::ArgoCd, *argo, &v["argocd"]),
            (Tool::KStatus, *kstatus, &v["kstatus"]),
        ] {
            eprintln!(
                "{case:26} {tool:?}: {} (want {want}): {}",
                got["status"], got["message"]
            );
            if got["status"] != want {
                wrong.push(format!("{case} {tool:?}: {got} (want {want})"));
            }
        }
        // Argo CD's message is the deciding condition's (or the status message).
        let msg = v["argocd"]["message"].as_str().unwrap_or_default();
        let known: Vec<&str> = o["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|c| c["message"].as_str())
            .chain(status_str(o, &["message"]))
            .collect();
        if *case != "generation-not-observed" && !known.contains(&msg) {
            wrong.push(format!(
                "{case} ArgoCd message {msg:?} is none of {known:?}"
            ));
        }
    }
    assert!(wrong.is_empty(), "wrong verdicts:\n{}", wrong.join("\n"));
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}
