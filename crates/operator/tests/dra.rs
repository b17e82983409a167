//! The device gates on the real control plane: a simulated DRA driver (and a
//! device plugin) of the test's own, the real scheduler allocating claims,
//! the real claim controller, the fixture as the kubelet of workload pods.
//!
//! Each failure test prints a `MEASURE` line: from the moment the cluster
//! shows the fault (seen by a watch) to the moment the operator's decision
//! (the blocked revision) shows in status. Tests share the nodes and run one
//! at a time.

mod support;

use std::sync::{Arc, Mutex};
use std::time::Instant;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use saferollout_api::{GateStatus, Phase};
use saferollout_testkit::wait_for_all;
use serde_json::json;
use support::dra::*;
use support::{GPUS, TIMEOUT};

const V1: &str = "registry.example/sim-dra-driver:v1.0.0";

/// Every device gate, with short soaks, and a probe the fixture runs.
fn all_gates(env: &Env) -> serde_json::Value {
    json!({
        "resourceSlices": {"driver": env.driver, "soak": "3s"},
        "claims": {"driver": env.driver, "probe": {
            "deviceClassName": env.driver, "timeout": "60s",
            "labels": {WORKLOAD_LABEL: "probe"}}},
        "deviceHealth": {"driver": env.driver, "handover": "3s"},
        "deviceTaints": {"driver": env.driver, "soak": "3s"}
    })
}

#[tokio::test]
async fn a_healthy_driver_upgrade_passes_every_gate_and_claims_survive() -> anyhow::Result<()> {
    let mut env = setup("healthy").await?;
    // One node's pods watched alone, more by one cluster-wide watch: the
    // last stage (4 nodes) takes the cluster-wide path.
    let log = format!("{}-pod-watches", env.ns.name);
    drop(std::mem::replace(
        &mut env.op,
        start_operator_with(
            &env.ns.name,
            &[("SAFEROLLOUT_PER_NODE_POD_WATCHES", "1")],
            &log,
        )?,
    ));
    create_driver(&env, V1).await?;
    // A running workload with an allocated claim on the canary.
    let uid = claim_workload(&env, "trainer", CANARY).await?;
    create_rollout(&env, rollout_spec(&env, V1, all_gates(&env))).await?;
    let stable = wait_status(&env, TIMEOUT, |st| st.stable_revision.is_some())
        .await?
        .stable_revision
        .unwrap_or_default();
    // Watch the probe claims: one must be allocated by the scheduler on the canary.
    let probe_claims = Api::<ResourceClaim>::namespaced(env.client.clone(), &env.ns.name);
    let probes_allocated = tokio::spawn(async move {
        wait_for_all(
            &probe_claims,
            watcher::Config::default().labels(saferollout_api::PROBE_LABEL),
            TIMEOUT,
            |cs| {
                cs.iter().any(|c| {
                    saferollout_core::devices::claim_node(c) == Some(CANARY)
                        && c.status
                            .as_ref()
                            .and_then(|s| s.allocation.as_ref())
                            .and_then(|a| a.devices.as_ref())
                            .and_then(|d| d.results.as_ref())
                            .is_some_and(|r| r.iter().all(|r| r.pool == CANARY))
                })
            },
        )
        .await
    });
    let started = Instant::now();
    set_image(&env, "registry.example/sim-dra-driver:v1.1.0").await?;
    let st = wait_succeeded(&env, &stable).await?;
    eprintln!(
        "MEASURE {}: a healthy DRA driver upgrade on 4 nodes with every device gate: {:.1}s",
        env.name,
        started.elapsed().as_secs_f64()
    );
    probes_allocated.await??;
    // Every gate of every stage passed, the probe was allocated everywhere.
    for stage in &st.stages {
        let names: Vec<&str> = stage.gates.iter().map(|g| g.gate.as_str()).collect();
        assert_eq!(
            names,
            [
                "podsReady",
                "resourceSlices",
                "claims",
                "deviceHealth",
                "deviceTaints"
            ]
        );
        for g in &stage.gates {
            assert_eq!(g.status, GateStatus::Passed, "{g:?}");
        }
    }
    let claims = &st.stages[0].gates[2];
    assert!(
        claims.message.contains("1 claim(s)")
            && claims.message.contains("probe claim was allocated"),
        "{claims:?}"
    );
    assert_eq!(st.stages[0].probed, [CANARY]);
    let judged = &st.stages[0].gates[3];
    assert!(
        judged.message.contains("1 device(s)"),
        "the workload's device was judged: {judged:?}"
    );
    // The claim and its pod survived the driver's restart on the canary.
    let pod = Api::<Pod>::namespaced(env.client.clone(), &env.ns.name)
        .get("trainer")
        .await?;
    assert_eq!(pod.metadata.uid.as_deref(), Some(uid.as_str()));
    assert_eq!(phase(&pod), "Running");
    assert!(health(&pod).iter().all(|(_, h)| h == "Healthy"));
    let claim = Api::<ResourceClaim>::namespaced(env.client.clone(), &env.ns.name)
        .get("trainer")
        .await?;
    assert_eq!(saferollout_core::devices::claim_node(&claim), Some(CANARY));
    let log = env.op.log_text();
    assert!(
        log.contains("watching the pods of the rollouts' nodes with one cluster-wide watch"),
        "the last stage watched its pods cluster-wide"
    );
    // Probes never outlive their stage.
    wait_for_all(
        &Api::<Pod>::namespaced(env.client.clone(), &env.ns.name),
        watcher::Config::default().labels(saferollout_api::PROBE_LABEL),
        TIMEOUT,
        |ps| ps.is_empty(),
    )
    .await?;
    Ok(())
}

#[tokio::test]
async fn withdrawn_and_fewer_slices_are_reverted_at_the_canary() -> anyhow::Result<()> {
    let env = setup("slices").await?;
    create_driver(&env, V1).await?;
    let gates = json!({"resourceSlices": {"driver": env.driver, "soak": "2s"}});
    create_rollout(&env, rollout_spec(&env, V1, gates)).await?;

    for (image, reason, observed) in [
        (
            "registry.example/sim-dra-driver:v2.0.0-broken",
            "SlicesWithdrawn",
            "0",
        ),
        (
            "registry.example/sim-dra-driver:v2.1.0-fewer",
            "BelowMinimum",
            "4",
        ),
    ] {
        let before = wait_status(&env, TIMEOUT, |st| st.phase.is_some()).await?;
        let blocked_before = before.blocked_revisions.len();
        let fault = slices_fault(&env, CANARY, GPUS as usize);
        set_image(&env, image).await?;
        let st = wait_status(&env, TIMEOUT, |st| {
            st.blocked_revisions.len() > blocked_before
        })
        .await?;
        let decided = Instant::now();
        measure(
            &env.name,
            image,
            fault.seen()?,
            decided,
            "resourceSlices soak 2s",
        );
        let g = failed_gate(&st, "resourceSlices").expect("resourceSlices failed");
        assert_eq!(g.reason, reason, "{g:?}");
        assert_eq!(g.node.as_deref(), Some(CANARY), "{g:?}");
        assert_eq!(g.observed.as_deref(), Some(observed), "{g:?}");
        assert_eq!(g.expected.as_deref(), Some(">= 8"), "{g:?}");
        assert!(g.message.contains(&format!("pool {CANARY}")), "{g:?}");
        let blocked = st.blocked_revisions.last().unwrap();
        assert!(blocked.message.contains(CANARY), "{blocked:?}");
        // Reverted at the canary: only it got the release; its slices come back.
        let st = wait_reverted(&env).await?;
        let failed = st
            .stages
            .iter()
            .find(|s| s.state == saferollout_api::StageState::Failed)
            .unwrap();
        assert_eq!(
            (failed.index, failed.nodes.as_slice()),
            (0, &[CANARY.to_string()][..])
        );
        wait_pools(&env, |_, d| d == GPUS as usize).await?;
    }
    Ok(())
}

#[tokio::test]
async fn dropped_claims_fail_the_claims_gate() -> anyhow::Result<()> {
    let env = setup("dropclaims").await?;
    create_driver(&env, V1).await?;
    claim_workload(&env, "trainer", CANARY).await?;
    let gates = json!({"claims": {"driver": env.driver}});
    create_rollout(&env, rollout_spec(&env, V1, gates)).await?;
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), &env.ns.name);
    let fault = FaultClock::watch(
        pods.clone(),
        watcher::Config::default().fields("metadata.name=trainer"),
        |ps| ps.iter().any(|p| phase(p) == "Failed"),
    );
    set_image(&env, "registry.example/sim-dra-driver:v2.0.0-dropclaims").await?;
    let (st, decided) = wait_blocked(&env).await?;
    measure(
        &env.name,
        "-dropclaims",
        fault.seen()?,
        decided,
        "claims gate, no soak",
    );
    let g = failed_gate(&st, "claims").expect("claims failed");
    assert_eq!(g.reason, "ClaimPodFailed", "{g:?}");
    assert_eq!(g.node.as_deref(), Some(CANARY));
    assert!(
        g.message
            .contains("NodePrepareResources failed for ResourceClaim trainer"),
        "the kubelet's reason is carried: {g:?}"
    );
    wait_reverted(&env).await?;
    Ok(())
}

#[tokio::test]
async fn unhealthy_devices_fail_device_health_for_a_dra_driver_and_a_device_plugin()
-> anyhow::Result<()> {
    let env = setup("unhealthy").await?;
    // DRA: a workload's claim on the canary reads Unhealthy under -unhealthy.
    create_driver(&env, V1).await?;
    claim_workload(&env, "trainer", CANARY).await?;
    let gates = json!({"deviceHealth": {"driver": env.driver, "handover": "3s"}});
    create_rollout(&env, rollout_spec(&env, V1, gates)).await?;
    let unhealthy = |name: &'static str| {
        FaultClock::watch(
            Api::<Pod>::namespaced(env.client.clone(), &env.ns.name),
            watcher::Config::default().fields(&format!("metadata.name={name}")),
            |ps| {
                ps.iter()
                    .any(|p| health(p).iter().any(|(_, h)| h == "Unhealthy"))
            },
        )
    };
    let fault = unhealthy("trainer");
    set_image(&env, "registry.example/sim-dra-driver:v2.0.0-unhealthy").await?;
    let (st, decided) = wait_blocked(&env).await?;
    measure(
        &env.name,
        "DRA -unhealthy",
        fault.seen()?,
        decided,
        "handover 3s",
    );
    let g = failed_gate(&st, "deviceHealth").expect("deviceHealth failed");
    assert_eq!(
        (g.reason.as_str(), g.node.as_deref()),
        ("Unhealthy", Some(CANARY))
    );
    assert!(
        g.message.contains(&format!("{}/{CANARY}/gpu-", env.driver))
            && g.message.contains("XID 79"),
        "the device and the driver's message: {g:?}"
    );
    wait_reverted(&env).await?;
    srs(&env).delete("driver", &Default::default()).await?;
    saferollout_testkit::wait_for_object(&srs(&env), "driver", TIMEOUT, |s| s.is_none()).await?;

    // Device plugin: the same gate on an extended resource.
    let resource = "example.com/gpu-unhealthy";
    support::create_plugin_daemonset(
        &env.client,
        &env.ns.name,
        resource,
        "registry.example/sim-device-plugin:v1.0.0",
    )
    .await?;
    Api::<Pod>::namespaced(env.client.clone(), &env.ns.name)
        .create(
            &PostParams::default(),
            &workload("plugin-work", CANARY, "Always", None, Some((resource, 1)))?,
        )
        .await?;
    wait_pod(&env, "plugin-work", |p| {
        health(p).iter().any(|(_, h)| h == "Healthy")
    })
    .await?;
    let mut spec = support::default_spec(resource, "registry.example/sim-device-plugin:v1.0.0");
    spec["canary"] = json!({"nodeSelector": {"matchLabels": {"kubernetes.io/hostname": CANARY}}});
    spec["stages"] = json!([{"nodes": 1}, {"nodes": "100%"}]);
    spec["gates"] = json!({"deviceHealth": {"resource": resource, "handover": "3s"}});
    support::create_rollout(&env.client, &env.ns.name, "plugin", spec).await?;
    support::wait_adopted(&env.client, &env.ns.name, "plugin").await?;
    let fault = unhealthy("plugin-work");
    support::set_template_image(
        &env.client,
        &env.ns.name,
        "plugin",
        resource,
        "registry.example/sim-device-plugin:v1.1.0-unhealthy",
    )
    .await?;
    let st = support::wait_status(&env.client, &env.ns.name, "plugin", TIMEOUT, |st| {
        !st.blocked_revisions.is_empty()
    })
    .await?;
    measure(
        &env.name,
        "device plugin -unhealthy",
        fault.seen()?,
        Instant::now(),
        "handover 3s",
    );
    let g = failed_gate(&st, "deviceHealth").expect("deviceHealth failed");
    assert_eq!(
        (g.reason.as_str(), g.node.as_deref()),
        ("Unhealthy", Some(CANARY))
    );
    assert!(g.message.contains("device gpu-0 is Unhealthy"), "{g:?}");
    Ok(())
}

#[tokio::test]
async fn new_taints_fail_and_cleared_health_taints_are_reported_or_fail() -> anyhow::Result<()> {
    let env = setup("taints").await?;
    // The canary has a faulty GPU: the healthy driver taints it.
    let _faulty = NodeLabel::set(CANARY, FAULTY_LABEL, "gpu-3")?;
    create_driver(&env, V1).await?;
    let gates = |cleared: &str| json!({"deviceTaints": {"driver": env.driver, "soak": "2s", "clearedTaints": cleared}});
    create_rollout(&env, rollout_spec(&env, V1, gates("Fail"))).await?;
    let tainted_count = |below_or_above: fn(usize) -> bool| {
        let (driver, node) = (env.driver.clone(), CANARY.to_string());
        FaultClock::watch(
            Api::<k8s_openapi::api::resource::v1::ResourceSlice>::all(env.client.clone()),
            watcher::Config::default(),
            move |ss| {
                let n = ss
                    .iter()
                    .filter(|s| {
                        s.spec.driver == driver && s.spec.node_name.as_deref() == Some(&node)
                    })
                    .flat_map(|s| s.spec.devices.iter().flatten())
                    .filter(|d| d.taints.as_ref().is_some_and(|t| !t.is_empty()))
                    .count();
                below_or_above(n)
            },
        )
    };

    // -taint: every device newly tainted.
    let fault = tainted_count(|n| n > 1);
    set_image(&env, "registry.example/sim-dra-driver:v2.0.0-taint").await?;
    let (st, decided) = wait_blocked(&env).await?;
    measure(
        &env.name,
        "-taint",
        fault.seen()?,
        decided,
        "deviceTaints soak 2s",
    );
    let g = failed_gate(&st, "deviceTaints").expect("deviceTaints failed");
    assert_eq!(
        (g.reason.as_str(), g.node.as_deref()),
        ("NewTaints", Some(CANARY))
    );
    assert_eq!(
        g.observed.as_deref(),
        Some("7 tainted"),
        "gpu-3 was tainted before: {g:?}"
    );
    wait_reverted(&env).await?;

    // -cleartaints with clearedTaints: Fail: the faulty GPU's taint is gone.
    let fault = tainted_count(|n| n == 0);
    set_image(&env, "registry.example/sim-dra-driver:v2.1.0-cleartaints").await?;
    let st = wait_status(&env, TIMEOUT, |st| st.blocked_revisions.len() == 2).await?;
    measure(
        &env.name,
        "-cleartaints (Fail)",
        fault.seen()?,
        Instant::now(),
        "deviceTaints soak 2s",
    );
    let g = failed_gate(&st, "deviceTaints").expect("deviceTaints failed");
    assert_eq!(
        (g.reason.as_str(), g.node.as_deref()),
        ("TaintsCleared", Some(CANARY))
    );
    assert!(g.message.contains(&format!("{CANARY}/gpu-3")), "{g:?}");
    let revision = st.blocked_revisions[1].revision.clone();
    wait_reverted(&env).await?;

    // clearedTaints: Report, and a retry: the release rolls, reported by an Event.
    srs(&env)
        .patch(
            "driver",
            &PatchParams::default(),
            &Patch::Merge(json!({
                "metadata": {"annotations": {"saferollout.dev/retry": revision}},
                "spec": {"gates": gates("Report")}
            })),
        )
        .await?;
    let st = wait_status(&env, TIMEOUT, |st| {
        st.phase == Some(Phase::Succeeded) && st.stable_revision.as_deref() == Some(&revision)
    })
    .await?;
    let g = st.stages[0]
        .gates
        .iter()
        .find(|g| g.gate == "deviceTaints")
        .unwrap();
    assert_eq!(
        (g.status, g.reason.as_str()),
        (GateStatus::Passed, "TaintsCleared"),
        "{g:?}"
    );
    let warned = wait_events(&env, "TaintsCleared").await?;
    assert!(
        warned
            .iter()
            .any(|m| m.contains("cleared the health taints")),
        "{warned:?}"
    );
    Ok(())
}

/// What the make-before-break test records, in etcd order (resource
/// versions are comparable across kinds: one etcd).
#[derive(Debug, Clone)]
enum Seen {
    Pod {
        rv: u64,
        uid: String,
        node: String,
        ready: bool,
        deleting: bool,
    },
    Slice {
        rv: u64,
        node: String,
        publisher: Option<String>,
        deleted: bool,
    },
}

/// The object of an applied or deleted watch event, and whether it was deleted.
fn applied_or_deleted<K>(e: watcher::Event<K>) -> Option<(K, bool)> {
    match e {
        watcher::Event::Apply(o) | watcher::Event::InitApply(o) => Some((o, false)),
        watcher::Event::Delete(o) => Some((o, true)),
        _ => None,
    }
}

fn rv_of(meta: &kube::api::ObjectMeta) -> u64 {
    meta.resource_version
        .as_deref()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// `strategy: Selector` with `agent: {kind: DRADriver, handover:
/// MakeBeforeBreak}` on a driver that supports the kubelet's rolling
/// update (two instances a node): on each node the new instance is Ready
/// and publishes the pool before the old pod's deletion begins, the pool's
/// slices are never deleted, a claim allocated before the upgrade stays
/// allocated and its pod runs on (same UID); then the same driver with a
/// `-broken` release is reverted with the old pod never deleted.
#[tokio::test]
async fn a_selector_rollout_hands_each_node_over_make_before_break_and_claims_survive()
-> anyhow::Result<()> {
    use futures::StreamExt;
    use k8s_openapi::api::resource::v1::ResourceSlice;
    use kube::ResourceExt;
    let mut env = setup("mbb").await?;
    let log = format!("{}-selector", env.ns.name);
    drop(std::mem::replace(
        &mut env.op,
        start_selector_operator(&env.ns.name, &log)?,
    ));
    let template = |image: &str| {
        let mut t = driver_template(&env.driver, image);
        t["metadata"]["annotations"]["sim.saferollout.dev/rolling-update"] = json!("true");
        t
    };
    let ds: k8s_openapi::api::apps::v1::DaemonSet = serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "driver"},
        "spec": {"selector": {"matchLabels": {"app": "driver"}}, "template": template(V1)}
    }))?;
    Api::<k8s_openapi::api::apps::v1::DaemonSet>::namespaced(env.client.clone(), &env.ns.name)
        .create(&PostParams::default(), &ds)
        .await?;
    wait_pools(&env, |_, devices| devices == GPUS as usize).await?;
    let trainer = claim_workload(&env, "trainer", CANARY).await?;
    let mut spec = rollout_spec(
        &env,
        V1,
        json!({"resourceSlices": {"driver": env.driver, "soak": "3s"}}),
    );
    spec["template"] = template(V1);
    spec["strategy"] = json!("Selector");
    spec["agent"] = json!({"kind": "DRADriver", "handover": "MakeBeforeBreak"});
    create_rollout(&env, spec).await?;
    let stable = wait_status(&env, TIMEOUT, |st| {
        st.stable_revision.is_some() && st.last_good_template.is_some()
    })
    .await?
    .stable_revision
    .unwrap_or_default();
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), &env.ns.name);
    let old = support::uids_by_node(
        &pods
            .list(&ListParams::default().labels("app=driver"))
            .await?
            .items,
    );
    assert_eq!(old.len(), NODES.len(), "{old:?}");

    // Record every driver pod and slice change from here.
    let seen = Arc::new(Mutex::new(Vec::<Seen>::new()));
    let rec = seen.clone();
    let driver = env.driver.clone();
    let (pod_api, slice_api) = (pods.clone(), Api::<ResourceSlice>::all(env.client.clone()));
    let task = tokio::spawn(async move {
        enum Ev {
            Pod(Box<watcher::Event<Pod>>),
            Slice(Box<watcher::Event<ResourceSlice>>),
        }
        let mut all = futures::stream::select(
            watcher(pod_api, watcher::Config::default().labels("app=driver"))
                .map(|e| e.map(|e| Ev::Pod(Box::new(e))))
                .boxed(),
            watcher(slice_api, watcher::Config::default())
                .map(|e| e.map(|e| Ev::Slice(Box::new(e))))
                .boxed(),
        );
        while let Some(ev) = all.next().await {
            let Ok(ev) = ev else { continue };
            let mut r = rec.lock().unwrap();
            match ev {
                Ev::Pod(e) => {
                    let Some((p, gone)) = applied_or_deleted(*e) else {
                        continue;
                    };
                    r.push(Seen::Pod {
                        rv: rv_of(&p.metadata),
                        uid: p.uid().unwrap_or_default(),
                        node: p
                            .spec
                            .as_ref()
                            .and_then(|s| s.node_name.clone())
                            .unwrap_or_default(),
                        ready: support::pod_ready(&p),
                        deleting: gone || p.metadata.deletion_timestamp.is_some(),
                    })
                }
                Ev::Slice(e) => {
                    let Some((s, deleted)) = applied_or_deleted(*e) else {
                        continue;
                    };
                    if s.spec.driver != driver {
                        continue;
                    }
                    r.push(Seen::Slice {
                        rv: rv_of(&s.metadata),
                        node: s.spec.node_name.clone().unwrap_or_default(),
                        publisher: s
                            .annotations()
                            .get("sim.saferollout.dev/publisher-pod-uid")
                            .cloned(),
                        deleted,
                    })
                }
            }
        }
    });
    let write = |image: &str| {
        let patch = json!({"spec": {"template": template(image)}});
        let srs = srs(&env);
        async move {
            srs.patch("driver", &PatchParams::default(), &Patch::Merge(patch))
                .await
        }
    };
    write("registry.example/sim-dra-driver:v1.1.0").await?;
    let st = wait_succeeded(&env, &stable).await?;
    // Promoted: one Ready v1.1.0 driver pod a node, all the target's, the
    // canary gone.
    let dss =
        Api::<k8s_openapi::api::apps::v1::DaemonSet>::namespaced(env.client.clone(), &env.ns.name);
    let target_uid = dss.get("driver").await?.uid().unwrap_or_default();
    saferollout_testkit::wait_for_object(
        &dss,
        &saferollout_core::selector::canary_name("driver"),
        TIMEOUT,
        |d| d.is_none(),
    )
    .await?;
    support::wait_live_pods(&env.client, &env.ns.name, "app=driver", |live| {
        live.len() == NODES.len()
            && live.iter().all(|p| {
                support::pod_ready(p)
                    && support::image_of(p) == "registry.example/sim-dra-driver:v1.1.0"
                    && p.owner_references().iter().any(|o| o.uid == target_uid)
            })
    })
    .await?;
    // The recorder's own watch shows every old pod's deletion too.
    support::poll("the recorder seeing every old pod go", TIMEOUT, || {
        let seen = seen.lock().unwrap();
        let gone = old.values().all(|u| {
            seen.iter()
                .any(|s| matches!(s, Seen::Pod { uid, deleting: true, .. } if uid == u))
        });
        Ok(gone.then_some(()))
    })
    .await?;
    task.abort();
    let seen = std::mem::take(&mut *seen.lock().unwrap());
    assert!(
        !seen
            .iter()
            .any(|s| matches!(s, Seen::Slice { deleted: true, .. })),
        "a slice of the driver was deleted during the handover"
    );
    for (node, old_uid) in &old {
        // The old pod's deletion began at this resource version.
        let deleted_at = seen
            .iter()
            .find_map(|s| match s {
                Seen::Pod {
                    rv,
                    uid,
                    deleting: true,
                    ..
                } if uid == old_uid => Some(*rv),
                _ => None,
            })
            .unwrap_or_else(|| panic!("{node}: the old pod was never deleted"));
        let new_uid = seen
            .iter()
            .find_map(|s| match s {
                Seen::Pod { uid, node: n, .. } if n == node && uid != old_uid => Some(uid.clone()),
                _ => None,
            })
            .unwrap_or_else(|| panic!("{node}: no new pod"));
        let new_ready = seen.iter().find_map(|s| match s {
            Seen::Pod {
                rv,
                uid,
                ready: true,
                ..
            } if *uid == new_uid => Some(*rv),
            _ => None,
        });
        let published = seen.iter().find_map(|s| match s {
            Seen::Slice {
                rv,
                node: n,
                publisher: Some(p),
                ..
            } if n == node && *p == new_uid => Some(*rv),
            _ => None,
        });
        assert!(
            new_ready.is_some_and(|r| r < deleted_at),
            "{node}: the new pod was not Ready before the old one's deletion ({new_ready:?} vs {deleted_at})"
        );
        assert!(
            published.is_some_and(|r| r < deleted_at),
            "{node}: the new pod had not published the pool before the old one's deletion ({published:?} vs {deleted_at})"
        );
    }
    // The workload with its claim ran throughout.
    let now = wait_pod(&env, "trainer", |p| phase(p) == "Running").await?;
    assert_eq!(now.metadata.uid.as_deref(), Some(trainer.as_str()));
    let claim = Api::<ResourceClaim>::namespaced(env.client.clone(), &env.ns.name)
        .get("trainer")
        .await?;
    assert!(
        claim
            .status
            .as_ref()
            .and_then(|s| s.allocation.as_ref())
            .is_some(),
        "the claim stays allocated"
    );
    assert!(
        st.stages
            .iter()
            .all(|s| s.gates.iter().any(|g| g.gate == "resourceSlices"))
    );

    // A -broken release under make-before-break: reverted at the canary
    // with the old pod never deleted.
    let before = support::uids_by_node(
        &pods
            .list(&ListParams::default().labels("app=driver"))
            .await?
            .items,
    );
    let stable = st.stable_revision.clone().unwrap_or_default();
    write("registry.example/sim-dra-driver:v1.2.0-broken").await?;
    let (blocked, _) = wait_blocked(&env).await?;
    assert_ne!(blocked.blocked_revisions[0].revision, stable);
    wait_status(&env, TIMEOUT, |st| st.phase == Some(Phase::Degraded)).await?;
    // Back to one driver a node, each the very pod it had before.
    let after = support::wait_live_pods(&env.client, &env.ns.name, "app=driver", |live| {
        live.len() == NODES.len()
    })
    .await?;
    assert_eq!(
        support::uids_by_node(after.iter().map(AsRef::as_ref)),
        before,
        "every node's old driver pod was kept through the failed handover"
    );
    Ok(())
}
