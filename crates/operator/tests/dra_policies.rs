//! `spec.onFailure` on the real control plane: Quarantine keeps a failed DRA
//! driver release where it runs, stops the rollout and takes the failed
//! node's devices out of service with a DeviceTaintRule that the real
//! scheduler honours (other nodes still allocate); a retry or the
//! SafeRollout's deletion lifts it. Halt stops and changes nothing more.
//!
//! A new DeviceTaintRule reaches the scheduler with no signal of when: the
//! tests wait for the kube-controller-manager's `EvictionInProgress`
//! condition on the rule's generation before asking for a device.

mod support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{DeviceTaintRule, ResourceClaim};
use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use saferollout_api::{OnFailure, Phase, ROLLOUT_LABEL};
use saferollout_testkit::{cluster, wait_for_all, wait_for_object};
use serde_json::json;
use support::dra::*;
use support::{GPUS, Identity, Operator, TIMEOUT, free_loopback_port, http_get, poll};

const V1: &str = "registry.example/sim-dra-driver:v1.0.0";

fn rules(env: &Env) -> Api<DeviceTaintRule> {
    Api::all(env.client.clone())
}

fn rollout_id(env: &Env) -> String {
    format!("{}.driver", env.ns.name)
}

/// The rollout's quarantine rules, waited on until `done` holds.
async fn wait_rules(
    env: &Env,
    done: impl Fn(&[std::sync::Arc<DeviceTaintRule>]) -> bool,
) -> anyhow::Result<Vec<std::sync::Arc<DeviceTaintRule>>> {
    wait_for_all(
        &rules(env),
        kube::runtime::watcher::Config::default()
            .labels(&format!("{ROLLOUT_LABEL}={}", rollout_id(env))),
        TIMEOUT,
        done,
    )
    .await
}

/// Waits until the device-taint controller has reported on the rule's
/// current generation: the cluster's own sign that it has seen the rule.
async fn wait_rule_seen(env: &Env, name: &str) -> anyhow::Result<()> {
    wait_for_object(&rules(env), name, TIMEOUT, |r| {
        r.is_some_and(|r| {
            r.status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .into_iter()
                .flatten()
                .any(|c| {
                    c.type_ == "EvictionInProgress"
                        && c.observed_generation == r.metadata.generation
                })
        })
    })
    .await?;
    Ok(())
}

fn quarantine_spec(env: &Env) -> serde_json::Value {
    let mut spec = rollout_spec(
        env,
        V1,
        json!({"resourceSlices": {"driver": env.driver, "soak": "2s"}}),
    );
    spec["onFailure"] = json!("Quarantine");
    spec
}

/// Asks for one device on `node` with a probe-style pod; returns its name.
async fn ask_for_a_device(env: &Env, name: &str, node: &str) -> anyhow::Result<()> {
    Api::<ResourceClaim>::namespaced(env.client.clone(), &env.ns.name)
        .create(&PostParams::default(), &claim(name, &env.driver)?)
        .await?;
    Api::<Pod>::namespaced(env.client.clone(), &env.ns.name)
        .create(
            &PostParams::default(),
            &workload(name, node, "Never", Some(name), None)?,
        )
        .await?;
    Ok(())
}

/// The one quarantine rule, checked to take the canary's pool of the
/// test's driver out of service.
async fn the_rule(env: &Env) -> anyhow::Result<DeviceTaintRule> {
    let found = wait_rules(env, |rs| !rs.is_empty()).await?;
    assert_eq!(found.len(), 1, "{found:#?}");
    let rule = (*found[0]).clone();
    let sel = &rule.spec.device_selector;
    let sel = sel.as_ref().expect("a device selector");
    assert_eq!(sel.driver.as_deref(), Some(env.driver.as_str()));
    assert_eq!(sel.pool.as_deref(), Some(CANARY));
    assert_eq!(rule.spec.taint.key, "saferollout.dev/quarantine");
    assert_eq!(rule.spec.taint.effect, "NoSchedule");
    Ok(rule)
}

#[tokio::test]
async fn quarantine_takes_a_broken_drivers_devices_out_of_service_until_retried()
-> anyhow::Result<()> {
    let env = setup("quarantine").await?;
    create_driver(&env, V1).await?;
    create_rollout(&env, quarantine_spec(&env)).await?;
    let stable = wait_status(&env, TIMEOUT, |st| st.stable_revision.is_some())
        .await?
        .stable_revision
        .unwrap_or_default();
    let fault = slices_fault(&env, CANARY, GPUS as usize);
    let broken = "registry.example/sim-dra-driver:v2.0.0-broken";
    set_image(&env, broken).await?;
    let st = wait_status(&env, TIMEOUT, |st| st.stopped.is_some()).await?;
    measure(
        &env.name,
        "-broken, Quarantine",
        fault.seen()?,
        Instant::now(),
        "resourceSlices soak 2s",
    );
    let stopped = st.stopped.clone().unwrap();
    assert_eq!(stopped.policy, OnFailure::Quarantine);
    assert_eq!(stopped.nodes, [CANARY]);
    let stalled = support::condition(&st, "Stalled").unwrap();
    assert_eq!(
        (stalled.status.as_str(), stalled.reason.as_str()),
        ("True", "Quarantined")
    );
    assert_eq!(st.phase, Some(Phase::Degraded));

    // The new release stays where it runs: the DaemonSet keeps it, the canary runs it.
    let rule = the_rule(&env).await?;
    wait_rule_seen(&env, &rule.name_any()).await?;
    let ds = Api::<DaemonSet>::namespaced(env.client.clone(), &env.ns.name)
        .get("driver")
        .await?;
    assert_eq!(
        ds.spec.template.spec.as_ref().unwrap().containers[0]
            .image
            .as_deref(),
        Some(broken)
    );
    let canary_pods: Vec<Pod> = Api::<Pod>::namespaced(env.client.clone(), &env.ns.name)
        .list(&ListParams::default().labels("app=driver"))
        .await?
        .items
        .into_iter()
        .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(CANARY))
        .collect();
    assert_eq!(canary_pods.len(), 1);
    assert_eq!(support::image_of(&canary_pods[0]), broken);
    let quarantined = wait_events(&env, "Quarantined").await?;
    assert!(
        quarantined.iter().any(|m| m.contains("DeviceTaintRule")),
        "{quarantined:?}"
    );

    // The real scheduler refuses a device on the quarantined node, while
    // another node still allocates.
    ask_for_a_device(&env, "on-canary", CANARY).await?;
    let refused = wait_unschedulable(&env, "on-canary", "cannot allocate all claims").await?;
    ask_for_a_device(&env, "elsewhere", "sim-gpu-2").await?;
    let done = wait_pod(&env, "elsewhere", |p| {
        matches!(phase(p), "Succeeded" | "Failed")
    })
    .await?;
    assert_eq!(phase(&done), "Succeeded", "{:#?}", done.status);
    assert!(
        health(&done)
            .iter()
            .all(|(id, _)| id.starts_with(&format!("{}/sim-gpu-2/", env.driver))),
        "{:?}",
        health(&done)
    );
    eprintln!("scheduler on the quarantined node: {refused}");

    // A fixed release and a retry of the quarantined one lift the quarantine.
    let revision = stopped.revision.clone();
    set_image(&env, "registry.example/sim-dra-driver:v2.1.0").await?;
    wait_status(&env, TIMEOUT, |st| {
        st.target_revision.as_deref() != Some(&revision)
    })
    .await?;
    assert_eq!(
        rules(&env)
            .list(&Default::default())
            .await?
            .items
            .iter()
            .filter(|r| r.name_any() == rule.name_any())
            .count(),
        1,
        "a new release alone does not lift the quarantine"
    );
    srs(&env)
        .patch(
            "driver",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"metadata": {"annotations": {"saferollout.dev/retry": revision}}}),
            ),
        )
        .await?;
    wait_rules(&env, |rs| rs.is_empty()).await?;
    let st = wait_succeeded(&env, &stable).await?;
    assert!(st.stopped.is_none());
    Ok(())
}

#[tokio::test]
async fn a_quarantined_nodes_remaining_devices_are_refused_until_the_rollout_is_deleted()
-> anyhow::Result<()> {
    let env = setup("quarantine-fewer").await?;
    create_driver(&env, V1).await?;
    create_rollout(&env, quarantine_spec(&env)).await?;
    let fault = slices_fault(&env, CANARY, GPUS as usize);
    set_image(&env, "registry.example/sim-dra-driver:v2.0.0-fewer").await?;
    wait_status(&env, TIMEOUT, |st| st.stopped.is_some()).await?;
    measure(
        &env.name,
        "-fewer, Quarantine",
        fault.seen()?,
        Instant::now(),
        "resourceSlices soak 2s",
    );
    let rule = the_rule(&env).await?;
    wait_rule_seen(&env, &rule.name_any()).await?;
    // The node still publishes half its devices: the rule alone keeps them from new claims.
    wait_pools(&env, |n, d| {
        if n == CANARY {
            d == GPUS as usize / 2
        } else {
            d == GPUS as usize
        }
    })
    .await?;
    ask_for_a_device(&env, "on-canary", CANARY).await?;
    wait_unschedulable(&env, "on-canary", "cannot allocate all claims").await?;

    // Deleting the SafeRollout lifts it (rules are cluster-scoped: no owner
    // reference can collect them; the finalizer does), and the waiting pod
    // gets a device of the node. It never rolls the stopped release.
    let deleted = delete_stopped_rollout(&env).await?;
    wait_rules(&env, |rs| rs.is_empty()).await?;
    let done = wait_pod(&env, "on-canary", |p| phase(p) == "Succeeded").await?;
    assert_eq!(done.spec.and_then(|s| s.node_name).as_deref(), Some(CANARY));
    deleted
        .no_agent_changes_for(Duration::from_secs(60))
        .await?;
    Ok(())
}

#[tokio::test]
async fn a_quarantine_of_effect_none_previews_what_no_execute_would_evict() -> anyhow::Result<()> {
    let env = setup("quarantine-none").await?;
    create_driver(&env, V1).await?;
    let mut spec = quarantine_spec(&env);
    spec["quarantine"] = json!({"effect": "None"});
    create_rollout(&env, spec).await?;
    set_image(&env, "registry.example/sim-dra-driver:v2.0.0-fewer").await?;
    wait_status(&env, TIMEOUT, |st| st.stopped.is_some()).await?;
    let found = wait_rules(&env, |rs| !rs.is_empty()).await?;
    assert_eq!(found.len(), 1, "{found:#?}");
    assert_eq!(found[0].spec.taint.effect, "None");
    // The device-taint controller reports what NoExecute would do; the
    // operator copies it to status and says it in the Stalled condition.
    let st = wait_status(&env, TIMEOUT, |st| {
        st.stopped
            .as_ref()
            .and_then(|s| s.quarantine.as_ref())
            .is_some_and(|q| !q.preview.is_empty())
    })
    .await?;
    let q = st.stopped.as_ref().unwrap().quarantine.clone().unwrap();
    eprintln!("MEASURE quarantine preview: {:?}", q.preview);
    assert_eq!(q.effect, "None");
    assert!(
        q.preview[0].starts_with(&format!("{CANARY}/{CANARY}: "))
            && q.preview[0].contains("if the effect was NoExecute"),
        "{:?}",
        q.preview
    );
    let stalled = support::condition(&st, "Stalled").unwrap();
    assert!(
        stalled
            .message
            .contains("preview only (DeviceTaintRule effect None)"),
        "{}",
        stalled.message
    );
    // Nothing is out of service: the canary's remaining devices still allocate.
    ask_for_a_device(&env, "on-canary", CANARY).await?;
    let done = wait_pod(&env, "on-canary", |p| {
        matches!(phase(p), "Succeeded" | "Failed")
    })
    .await?;
    assert_eq!(phase(&done), "Succeeded", "{:#?}", done.status);
    // Rules are cluster-scoped: the deletion takes this one away.
    srs(&env).delete("driver", &Default::default()).await?;
    wait_rules(&env, |rs| rs.is_empty()).await?;
    Ok(())
}

/// What a watch of the driver's pods saw created after a point.
struct PodCreations {
    created: std::sync::Arc<std::sync::Mutex<Vec<(String, String)>>>,
    task: tokio::task::JoinHandle<()>,
}

impl PodCreations {
    /// Watches the driver's agent pods; records each one created from now on
    /// (name, image).
    async fn watch(env: &Env) -> anyhow::Result<Self> {
        use futures::TryStreamExt;
        use kube::runtime::{WatchStreamExt, watcher};
        let api: Api<Pod> = Api::namespaced(env.client.clone(), &env.ns.name);
        let existing: std::collections::BTreeSet<String> = api
            .list(&ListParams::default().labels("app=driver"))
            .await?
            .items
            .iter()
            .filter_map(|p| p.uid())
            .collect();
        let created = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let seen = created.clone();
        let task = tokio::spawn(async move {
            let stream = watcher(api, watcher::Config::default().labels("app=driver"))
                .default_backoff()
                .applied_objects();
            futures::pin_mut!(stream);
            let mut known = existing;
            while let Ok(Some(p)) = stream.try_next().await {
                if known.insert(p.uid().unwrap_or_default()) {
                    seen.lock()
                        .unwrap()
                        .push((p.name_any(), support::image_of(&p).to_string()));
                }
            }
        });
        Ok(PodCreations { created, task })
    }

    /// The agent pods created so far: (name, image).
    fn created(&self) -> Vec<(String, String)> {
        self.created.lock().unwrap().clone()
    }

    /// No agent pod is created (no node's agent changes revision) for `window`.
    async fn no_agent_changes_for(self, window: Duration) -> anyhow::Result<()> {
        // Nothing to wait for: the assertion is that nothing happens.
        tokio::time::sleep(window).await;
        self.task.abort();
        let created = self.created.lock().unwrap().clone();
        anyhow::ensure!(
            created.is_empty(),
            "agent pods created after the deletion: {created:?}"
        );
        Ok(())
    }
}

/// Deletes the stopped (Halted or Quarantined) rollout and checks how the
/// DaemonSet was handed back: the last good template written back, OnDelete
/// kept while agents run the stopped release, an Event saying so. Returns
/// the watch of agent pod creations started before the deletion.
async fn delete_stopped_rollout(env: &Env) -> anyhow::Result<PodCreations> {
    let before = wait_status(env, TIMEOUT, |st| st.stopped.is_some()).await?;
    let stopped = before.stopped.clone().unwrap();
    let dss = Api::<DaemonSet>::namespaced(env.client.clone(), &env.ns.name);
    let image = |ds: &DaemonSet| {
        ds.spec.template.spec.as_ref().unwrap().containers[0]
            .image
            .clone()
            .unwrap_or_default()
    };
    let stopped_image = image(&dss.get("driver").await?);
    assert_ne!(
        stopped_image, V1,
        "the DaemonSet carries the stopped release"
    );
    let creations = PodCreations::watch(env).await?;
    srs(env).delete("driver", &Default::default()).await?;
    wait_for_object(&srs(env), "driver", TIMEOUT, |s| s.is_none()).await?;
    let ds = dss.get("driver").await?;
    assert_eq!(image(&ds), V1, "the last good template is back");
    assert_eq!(
        ds.spec.update_strategy.and_then(|s| s.type_).as_deref(),
        Some("OnDelete"),
        "the failed nodes keep what they run: nothing is replaced"
    );
    let said = wait_events(env, "HandedBack").await?;
    assert!(
        said.iter().any(|m| m.contains(&format!(
            "revision {} was stopped by its gates: wrote the last good template",
            stopped.revision
        )) && m.contains("stays OnDelete")),
        "{said:?}"
    );
    Ok(creations)
}

/// A counter of the operator's metrics.
fn counter(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(name))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[tokio::test]
async fn halt_stops_and_changes_nothing_more() -> anyhow::Result<()> {
    let mut env = setup("halt").await?;
    // This test reads the operator's metrics: run it on a known port.
    let port = free_loopback_port()?;
    let args = support::operator_args(&env.ns.name, &format!("127.0.0.1:{port}"), 3);
    drop(std::mem::replace(
        &mut env.op,
        Operator::start(
            Identity::Impersonate(cluster().kubeconfig(), OPERATOR_SA),
            &args,
            &format!("{}-metrics", env.ns.name),
        )?,
    ));
    create_driver(&env, V1).await?;
    let mut spec = quarantine_spec(&env);
    spec["onFailure"] = json!("Halt");
    create_rollout(&env, spec).await?;
    let fault = slices_fault(&env, CANARY, GPUS as usize);
    let broken = "registry.example/sim-dra-driver:v2.0.0-broken";
    set_image(&env, broken).await?;
    let st = wait_status(&env, TIMEOUT, |st| st.stopped.is_some()).await?;
    measure(
        &env.name,
        "-broken, Halt",
        fault.seen()?,
        Instant::now(),
        "resourceSlices soak 2s",
    );
    assert_eq!(st.stopped.as_ref().unwrap().policy, OnFailure::Halt);
    assert!(st.stopped.as_ref().unwrap().quarantine.is_none());
    let stalled = support::condition(&st, "Stalled").unwrap();
    assert_eq!(stalled.reason, "Halted");
    assert!(
        stalled.message.contains("onFailure: Halt"),
        "{}",
        stalled.message
    );
    let halted = wait_events(&env, "Halted").await?;
    assert_eq!(halted.len(), 1, "{halted:?}");

    // What the cluster looks like when the rollout stopped ...
    let picture = |env: &Env| {
        let client = env.client.clone();
        let ns = env.ns.name.clone();
        let id = rollout_id(env);
        async move {
            let pods: BTreeMap<String, String> = Api::<Pod>::namespaced(client.clone(), &ns)
                .list(&ListParams::default().labels("app=driver"))
                .await?
                .items
                .iter()
                .filter(|p| p.metadata.deletion_timestamp.is_none())
                .map(|p| {
                    (
                        p.uid().unwrap_or_default(),
                        support::image_of(p).to_string(),
                    )
                })
                .collect();
            let ds = Api::<DaemonSet>::namespaced(client.clone(), &ns)
                .get("driver")
                .await?;
            let node = Api::<k8s_openapi::api::core::v1::Node>::all(client.clone())
                .get(CANARY)
                .await?;
            let rules = Api::<DeviceTaintRule>::all(client.clone())
                .list(&ListParams::default().labels(&format!("{ROLLOUT_LABEL}={id}")))
                .await?
                .items
                .len();
            anyhow::Ok((
                pods,
                serde_json::to_string(&ds.spec.template)?,
                node.labels().get(ROLLOUT_LABEL).cloned(),
                rules,
            ))
        }
    };
    let before = picture(&env).await?;
    assert!(
        before.0.values().any(|i| i == broken),
        "the canary keeps the release: {before:?}"
    );
    assert!(before.1.contains(broken), "the DaemonSet keeps the release");
    assert_eq!(
        before.2.as_deref(),
        Some(rollout_id(&env).as_str()),
        "labels stay"
    );
    assert_eq!(before.3, 0, "Halt quarantines nothing");
    // ... stays so through further reconciles (a node change wakes every
    // rollout; the operator's reconcile counter shows it looked again).
    let reconciles = |port| -> anyhow::Result<f64> {
        let (_, text) = http_get(port, "/metrics")?;
        Ok(counter(&text, "saferollout_reconciles_total"))
    };
    let seen = reconciles(port)?;
    let _nudge = NodeLabel::set(CANARY, "saferollout.test/nudge", "1")?;
    poll(
        "the operator to reconcile again",
        Duration::from_secs(30),
        || Ok((reconciles(port)? >= seen + 1.0).then_some(())),
    )
    .await?;
    let after = picture(&env).await?;
    assert_eq!(before, after, "Halt changed something");
    let st = wait_status(&env, TIMEOUT, |st| st.stopped.is_some()).await?;
    assert_eq!(support::condition(&st, "Stalled").unwrap().reason, "Halted");
    assert_eq!(
        events(&env, "Halted").await?.len(),
        1,
        "one Event, not one per pass"
    );

    // Deleting the halted SafeRollout never rolls the stopped release.
    delete_stopped_rollout(&env)
        .await?
        .no_agent_changes_for(Duration::from_secs(60))
        .await?;
    Ok(())
}

/// The operator ended right after it wrote a quarantine's DeviceTaintRule
/// (debug-build hook `SAFEROLLOUT_DEBUG_CRASH_AFTER=devicetaintrule:1`:
/// SIGABRT, no clean-up, the lease kept), before anything after that write.
/// The next operator converges on the same quarantine: the Stalled
/// condition, the one rule, the same object (not lifted and made anew), the
/// canary left on the stopped release and no other agent touched. Deleting the
/// SafeRollout then leaves no rule, no node taint and no label of it.
#[tokio::test]
async fn a_crash_right_after_a_device_taint_rule_write_converges_and_deletion_leaves_nothing()
-> anyhow::Result<()> {
    let mut env = setup("crash-rule").await?;
    create_driver(&env, V1).await?;
    create_rollout(&env, quarantine_spec(&env)).await?;
    let hook = "devicetaintrule:1";
    drop(std::mem::replace(
        &mut env.op,
        start_operator_with(
            &env.ns.name,
            &[("SAFEROLLOUT_DEBUG_CRASH_AFTER", hook)],
            &format!("{}-crashing", env.ns.name),
        )?,
    ));
    let creations = PodCreations::watch(&env).await?;
    let broken = "registry.example/sim-dra-driver:v2.0.0-broken";
    set_image(&env, broken).await?;
    poll(
        "the operator ending after its DeviceTaintRule write",
        TIMEOUT,
        || Ok((!env.op.is_running()).then_some(())),
    )
    .await?;
    assert!(
        env.op
            .log_text()
            .contains("ending the process after devicetaintrule write 1"),
        "the operator ended for another reason than the hook: {}",
        env.op.log.display()
    );
    let written = the_rule(&env).await?;

    let port = free_loopback_port()?;
    let args = support::operator_args(&env.ns.name, &format!("127.0.0.1:{port}"), 3);
    drop(std::mem::replace(
        &mut env.op,
        Operator::start(
            Identity::Impersonate(cluster().kubeconfig(), OPERATOR_SA),
            &args,
            &format!("{}-after", env.ns.name),
        )?,
    ));
    let st = wait_status(&env, TIMEOUT, |st| {
        support::condition(st, "Stalled").is_some_and(|c| c.reason == "Quarantined")
    })
    .await?;
    let stopped = st.stopped.clone().unwrap();
    assert_eq!(stopped.policy, OnFailure::Quarantine);
    assert_eq!(stopped.nodes, [CANARY]);
    // The status may be the crashed operator's: the rule is judged once the
    // next one has made a pass (on caches synced before it leads), which
    // would have written it again.
    poll("a pass of the next operator", TIMEOUT, || {
        let (_, text) = http_get(port, "/metrics")?;
        Ok((counter(&text, "saferollout_reconciles_total") >= 1.0).then_some(()))
    })
    .await?;
    let rule = the_rule(&env).await?;
    assert_eq!(
        rule.uid(),
        written.uid(),
        "the rule was lifted and made anew: {rule:#?}"
    );
    let created = creations.created();
    assert_eq!(
        created.len(),
        1,
        "one agent pod, the canary's stopped release: {created:?}"
    );
    assert_eq!(created[0].1, broken, "{created:?}");
    eprintln!(
        "MEASURE crash after the DeviceTaintRule write: converged on {:?}, rule {} kept",
        stopped.quarantine,
        rule.name_any()
    );

    delete_stopped_rollout(&env).await?;
    wait_rules(&env, |rs| rs.is_empty()).await?;
    let id = rollout_id(&env);
    let nodes = Api::<k8s_openapi::api::core::v1::Node>::all(env.client.clone())
        .list(&Default::default())
        .await?;
    for n in &nodes.items {
        assert_ne!(
            n.labels().get(ROLLOUT_LABEL),
            Some(&id),
            "node {} kept the rollout's label",
            n.name_any()
        );
        let taints: Vec<&str> = n
            .spec
            .iter()
            .flat_map(|s| s.taints.iter().flatten())
            .map(|t| t.key.as_str())
            .filter(|k| {
                k.starts_with(saferollout_api::QUARANTINE_NODE_TAINT_PREFIX)
                    || *k == saferollout_api::QUARANTINE_TAINT_KEY
            })
            .collect();
        assert!(
            taints.is_empty(),
            "node {} kept a quarantine taint: {taints:?}",
            n.name_any()
        );
    }
    Ok(())
}
