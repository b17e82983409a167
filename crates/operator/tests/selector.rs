//! `strategy: Selector` end to end: the operator against the real control
//! plane (the DaemonSet controller and the garbage collector decide what the
//! labels, taints and deletions do), the simulated device plugin on KWOK
//! nodes. The operator runs as the ServiceAccount of the chart's RBAC with
//! `selector.enabled` (create and delete DaemonSets, patch pods), and with
//! `--selector-strategy`. Tests share the nodes: one at a time.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use saferollout_api::{Phase, REVISION_HASH_LABEL, SafeRollout, SafeRolloutStatus};
use saferollout_core::selector::{HANDOVER_LABEL_PREFIX, canary_name};
use saferollout_testkit::{TestNamespace, cluster};
use serde_json::json;

mod support;

use support::{Identity, TIMEOUT, condition, image_of, pod_ready};

const OPERATOR_SA: &str = "system:serviceaccount:saferollout-system:saferollout-operator";
const NODES: usize = 4;
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

struct Env {
    _serial: tokio::sync::MutexGuard<'static, ()>,
    ns: TestNamespace,
    client: Client,
    op: support::Operator,
    resource: String,
}

/// The CRD, the chart's RBAC with `selector.enabled`, a namespace, and the
/// operator watching it with `--selector-strategy`.
async fn setup(name: &str) -> anyhow::Result<Env> {
    let serial = SERIAL.lock().await;
    let c = cluster();
    support::install(c)?;
    support::grant_selector_rbac(c)?;
    let ns = c.namespace(name).await?;
    let client = c.client().await?;
    let mut args = support::operator_args(&ns.name, "127.0.0.1:0", 3);
    args.push("--selector-strategy=true".into());
    let op = support::Operator::start(
        Identity::Impersonate(c.kubeconfig(), OPERATOR_SA),
        &args,
        &ns.name,
    )?;
    Ok(Env {
        _serial: serial,
        resource: format!("example.com/gpu-{name}"),
        ns,
        client,
        op,
    })
}

fn spec(env: &Env, image: &str) -> serde_json::Value {
    json!({
        "targetRef": {"name": "plugin"},
        "strategy": "Selector",
        "template": support::agent_template(&env.resource, image),
        // Each of the first two stages pauses once passed: the test looks
        // at the cluster there, then approves.
        "stages": [{"nodes": 1, "pause": true}, {"nodes": "50%", "pause": true}, {"nodes": "100%"}],
        "progressDeadline": "3m",
        "gates": {"allocatable": [{"resource": env.resource, "min": "baseline", "max": "baseline", "soak": "2s"}]}
    })
}

async fn wait_status(
    env: &Env,
    done: impl Fn(&SafeRolloutStatus) -> bool,
) -> anyhow::Result<SafeRolloutStatus> {
    support::wait_status(&env.client, &env.ns.name, "plugin", TIMEOUT, done).await
}

fn node_of(p: &Pod) -> String {
    p.spec
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .unwrap_or_default()
}

fn controller_uid(p: &Pod) -> Option<String> {
    p.owner_references()
        .iter()
        .find(|o| o.controller == Some(true))
        .map(|o| o.uid.clone())
}

/// Pod creations seen by a watch started before the release: (uid, node,
/// owner uid, image).
#[derive(Default)]
struct Created(Vec<(String, String, Option<String>, String)>);

fn record_creations(env: &Env) -> (Arc<Mutex<Created>>, tokio::task::JoinHandle<()>) {
    let rec = Arc::new(Mutex::new(Created::default()));
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), &env.ns.name);
    let r = rec.clone();
    let task = tokio::spawn(async move {
        let mut seen = BTreeSet::new();
        let mut known = BTreeSet::new();
        let mut first_list = true;
        let mut stream = watcher(pods, watcher::Config::default().labels("app=plugin")).boxed();
        while let Some(ev) = stream.next().await {
            let Ok(ev) = ev else { continue };
            match ev {
                // The pods that exist when the watch starts are not creations.
                watcher::Event::InitApply(p) if first_list => {
                    known.insert(p.uid().unwrap_or_default());
                }
                watcher::Event::InitDone => first_list = false,
                watcher::Event::Apply(p) | watcher::Event::InitApply(p) => {
                    let uid = p.uid().unwrap_or_default();
                    let node = node_of(&p);
                    if known.contains(&uid) || node.is_empty() || !seen.insert(uid.clone()) {
                        continue;
                    }
                    r.lock().unwrap().0.push((
                        uid,
                        node,
                        controller_uid(&p),
                        image_of(&p).to_string(),
                    ));
                }
                _ => {}
            }
        }
    });
    (rec, task)
}

/// The live agent pods by owner: node -> owner uid.
async fn owners_by_node(env: &Env) -> anyhow::Result<BTreeMap<String, Vec<String>>> {
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), &env.ns.name);
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for p in pods
        .list(&ListParams::default().labels("app=plugin"))
        .await?
    {
        if p.metadata.deletion_timestamp.is_none() {
            out.entry(node_of(&p))
                .or_default()
                .push(controller_uid(&p).unwrap_or_default());
        }
    }
    Ok(out)
}

/// Nodes carrying any handover label, with its value.
async fn handover_labels(env: &Env) -> anyhow::Result<BTreeMap<String, String>> {
    let nodes: Api<Node> = Api::all(env.client.clone());
    let mut out = BTreeMap::new();
    for n in nodes.list(&ListParams::default()).await? {
        for (k, v) in n.labels() {
            if k.starts_with(HANDOVER_LABEL_PREFIX) {
                out.insert(n.name_any(), v.clone());
            }
        }
    }
    Ok(out)
}

async fn set_image(env: &Env, image: &str) -> anyhow::Result<()> {
    support::set_template_image(&env.client, &env.ns.name, "plugin", &env.resource, image).await
}

async fn approve(env: &Env, value: &str) -> anyhow::Result<()> {
    let patch = json!({"metadata": {"annotations": {"saferollout.dev/approve": value}}});
    Api::<SafeRollout>::namespaced(env.client.clone(), &env.ns.name)
        .patch("plugin", &PatchParams::default(), &Patch::Merge(patch))
        .await?;
    Ok(())
}

/// Waits until every node runs exactly one Ready agent with `image`.
async fn wait_every_node_on(env: &Env, image: &str) -> anyhow::Result<Vec<Arc<Pod>>> {
    support::wait_live_pods(&env.client, &env.ns.name, "app=plugin", |live| {
        live.len() == NODES && live.iter().all(|p| pod_ready(p) && image_of(p) == image)
    })
    .await
}

/// Waits until a new revision (not `settled`'s stable one) succeeded and its
/// promotion is over: Ready, the canary gone, every node on `image`, no
/// handover label or promotion taint left; the pods.
async fn wait_promoted(
    env: &Env,
    image: &str,
    settled: &SafeRolloutStatus,
) -> anyhow::Result<Vec<Arc<Pod>>> {
    let st = wait_status(env, |st| {
        st.phase == Some(Phase::Succeeded)
            && st.stable_revision.is_some()
            && st.stable_revision != settled.stable_revision
    })
    .await?;
    assert!(condition(&st, "Ready").is_some_and(|c| c.status == "True"));
    let dss: Api<DaemonSet> = Api::namespaced(env.client.clone(), &env.ns.name);
    saferollout_testkit::wait_for_object(&dss, &canary_name("plugin"), TIMEOUT, |d| d.is_none())
        .await?;
    saferollout_testkit::wait_for_all(
        &Api::<Node>::all(env.client.clone()),
        watcher::Config::default(),
        TIMEOUT,
        |ns| {
            ns.iter().all(|n| {
                let promoting = n
                    .spec
                    .as_ref()
                    .and_then(|s| s.taints.as_ref())
                    .is_some_and(|ts| ts.iter().any(|t| t.key == saferollout_api::PROMOTING_TAINT));
                !promoting
                    && !n
                        .labels()
                        .keys()
                        .any(|k| k.starts_with(HANDOVER_LABEL_PREFIX))
            })
        },
    )
    .await?;
    // Read once the promotion ended: the taints stay until the target has
    // adopted every released pod.
    wait_every_node_on(env, image).await
}

/// Every node's agent was created exactly once in `created`.
fn assert_each_node_created_once(created: &[(String, String, Option<String>, String)]) {
    let mut per_node: BTreeMap<&str, usize> = BTreeMap::new();
    for (_, node, _, _) in created {
        *per_node.entry(node.as_str()).or_default() += 1;
    }
    assert_eq!(created.len(), NODES, "{created:?}");
    assert!(per_node.values().all(|n| *n == 1), "{per_node:?}");
}

/// Creates the plugin DaemonSet on v1 and the `Selector` SafeRollout, and
/// waits until it settles (adopting v1 replaces nothing).
async fn start(env: &Env, v1: &str) -> anyhow::Result<(DaemonSet, SafeRolloutStatus)> {
    support::create_plugin_daemonset(&env.client, &env.ns.name, &env.resource, v1).await?;
    support::create_rollout(&env.client, &env.ns.name, "plugin", spec(env, v1)).await?;
    let st = wait_status(env, |st| {
        st.phase == Some(Phase::Succeeded) && st.last_good_template.is_some()
    })
    .await?;
    let ds = Api::<DaemonSet>::namespaced(env.client.clone(), &env.ns.name)
        .get("plugin")
        .await?;
    Ok((ds, st))
}

#[tokio::test]
async fn a_healthy_release_moves_stage_by_stage_to_the_canary_and_is_promoted_without_a_second_restart()
-> anyhow::Result<()> {
    let env = setup("selector-healthy").await?;
    let (v1, v2) = ("registry.example/plugin:v1", "registry.example/plugin:v2");
    let (target, settled) = start(&env, v1).await?;
    let target_uid = target.uid().unwrap_or_default();
    let dss: Api<DaemonSet> = Api::namespaced(env.client.clone(), &env.ns.name);

    let (rec, task) = record_creations(&env);
    set_image(&env, v2).await?;
    // At each pause the canary's pods are exactly on the handed-over nodes
    // (those of the stages passed so far), the target's on the rest.
    for (index, want) in [(0usize, 1usize), (1, 2)] {
        let st = wait_status(&env, |st| {
            st.phase == Some(Phase::Paused)
                && st.current_stage == Some(index as i32)
                && st.target_revision != settled.stable_revision
        })
        .await?;
        let stage_nodes: BTreeSet<String> = st.stages[..=index]
            .iter()
            .flat_map(|s| s.nodes.iter().cloned())
            .collect();
        assert_eq!(stage_nodes.len(), want, "{st:#?}");
        let canary = dss
            .get(&canary_name("plugin"))
            .await?
            .uid()
            .unwrap_or_default();
        let handed: BTreeMap<String, String> = handover_labels(&env).await?;
        let handed_nodes: BTreeSet<String> = handed.keys().cloned().collect();
        assert_eq!(handed_nodes, stage_nodes, "labels {handed:?}");
        assert!(handed.values().all(|v| v == "new"), "{handed:?}");
        let owners = owners_by_node(&env).await?;
        for (node, on) in &owners {
            let expected = if stage_nodes.contains(node) {
                &canary
            } else {
                &target_uid
            };
            assert_eq!(on, &vec![expected.clone()], "{node}: {owners:?}");
        }
        assert_eq!(owners.len(), NODES, "{owners:?}");
        let approval = saferollout_core::rollout::approval_value(
            st.target_revision.as_deref().unwrap_or_default(),
            index,
        );
        approve(&env, &approval).await?;
    }
    // The promotion: the canary gone, the target holding every pod with the
    // new template and its own current hash, nothing of the strategy left.
    let pods = wait_promoted(&env, v2, &settled).await?;
    let t = dss.get("plugin").await?;
    assert_eq!(
        t.spec
            .template
            .spec
            .as_ref()
            .and_then(|s| s.containers.first())
            .and_then(|c| c.image.as_deref()),
        Some(v2)
    );
    assert!(
        t.spec
            .template
            .spec
            .as_ref()
            .and_then(|s| s.affinity.as_ref())
            .is_none(),
        "the target's template keeps no handover expression: {:?}",
        t.spec.template.spec.as_ref().map(|s| &s.affinity)
    );
    assert_eq!(
        t.spec.update_strategy.and_then(|s| s.type_).as_deref(),
        Some("OnDelete"),
        "the target stays OnDelete between rollouts, as under InPlace"
    );
    let hashes: BTreeSet<String> = pods
        .iter()
        .filter_map(|p| p.labels().get(REVISION_HASH_LABEL).cloned())
        .collect();
    assert_eq!(hashes.len(), 1, "one hash: {hashes:?}");
    for p in &pods {
        assert_eq!(controller_uid(p).as_deref(), Some(target_uid.as_str()));
    }
    // Every node's agent was created exactly once, by the canary, and the
    // promotion created none.
    task.abort();
    let created = std::mem::take(&mut rec.lock().unwrap().0);
    assert_each_node_created_once(&created);
    assert!(
        created.iter().all(|(_, _, owner, image)| {
            image == v2 && owner.as_deref() != Some(target_uid.as_str())
        }),
        "every new agent was the canary's: {created:?}"
    );
    let now: BTreeSet<String> = pods.iter().map(|p| p.uid().unwrap_or_default()).collect();
    let made: BTreeSet<String> = created.iter().map(|(u, _, _, _)| u.clone()).collect();
    assert_eq!(
        now, made,
        "the pods running now are the ones the canary made"
    );
    Ok(())
}

#[tokio::test]
async fn a_broken_release_is_reverted_by_the_labels_and_only_the_canary_node_changed()
-> anyhow::Result<()> {
    let env = setup("selector-broken").await?;
    let (v1, broken) = (
        "registry.example/plugin:v1",
        "registry.example/plugin:v2-broken",
    );
    let (target, _) = start(&env, v1).await?;
    let target_uid = target.uid().unwrap_or_default();
    let before = owners_by_node(&env).await?;
    let pods_api: Api<Pod> = Api::namespaced(env.client.clone(), &env.ns.name);
    let uids_before = support::uids_by_node(
        &pods_api
            .list(&ListParams::default().labels("app=plugin"))
            .await?
            .items,
    );
    let (rec, task) = record_creations(&env);
    set_image(&env, broken).await?;
    let st = wait_status(&env, |st| st.phase == Some(Phase::Degraded)).await?;
    let degraded = condition(&st, "Degraded").unwrap();
    assert_eq!(degraded.reason, "AllocatableFailed", "{st:#?}");
    let pods = wait_every_node_on(&env, v1).await?;
    let dss: Api<DaemonSet> = Api::namespaced(env.client.clone(), &env.ns.name);
    saferollout_testkit::wait_for_object(&dss, &canary_name("plugin"), TIMEOUT, |d| d.is_none())
        .await?;
    assert!(handover_labels(&env).await?.is_empty());
    task.abort();
    let created = std::mem::take(&mut rec.lock().unwrap().0);
    // The canary node got the broken agent and the target's back; no other
    // node's agent changed.
    let canary_node = st.stages[0].nodes[0].clone();
    let broken_made: Vec<_> = created.iter().filter(|c| c.3 == broken).collect();
    assert_eq!(broken_made.len(), 1, "{created:?}");
    assert_eq!(broken_made[0].1, canary_node);
    let back: Vec<_> = created.iter().filter(|c| c.3 == v1).collect();
    assert_eq!(back.len(), 1, "{created:?}");
    assert_eq!(back[0].1, canary_node);
    assert_eq!(back[0].2.as_deref(), Some(target_uid.as_str()));
    for p in &pods {
        let node = node_of(p);
        if node != canary_node {
            assert_eq!(
                uids_before.get(&node),
                p.uid().as_ref(),
                "{node}'s agent untouched"
            );
        }
        assert_eq!(controller_uid(p).as_deref(), Some(target_uid.as_str()));
    }
    assert_eq!(before.len(), NODES);
    // The target's template is the stable one, without the handover expression.
    let t = dss.get("plugin").await?;
    assert!(
        t.spec
            .template
            .spec
            .as_ref()
            .and_then(|s| s.affinity.as_ref())
            .is_none()
    );
    Ok(())
}

#[tokio::test]
async fn deleting_a_rollout_mid_way_hands_the_canarys_pods_to_the_target_and_leaves_nothing()
-> anyhow::Result<()> {
    let env = setup("selector-delete").await?;
    let (v1, v2) = ("registry.example/plugin:v1", "registry.example/plugin:v2");
    let (target, settled) = start(&env, v1).await?;
    let target_uid = target.uid().unwrap_or_default();
    // The strategy the DaemonSet had before the SafeRollout took it over.
    let original = settled.original_update_strategy.clone();
    assert!(original.is_some(), "{settled:#?}");
    set_image(&env, v2).await?;
    let st = wait_status(&env, |st| {
        st.phase == Some(Phase::Paused) && st.target_revision != settled.stable_revision
    })
    .await?;
    let canary_node = st.stages[0].nodes[0].clone();
    let pods_api: Api<Pod> = Api::namespaced(env.client.clone(), &env.ns.name);
    let canary_pod = pods_api
        .list(&ListParams::default().labels("app=plugin"))
        .await?
        .into_iter()
        .find(|p| node_of(p) == canary_node && image_of(p) == v2)
        .expect("the canary's pod on the stage node");
    let canary_pod_uid = canary_pod.uid().unwrap_or_default();
    // Watch that pod: the target adopts it (its controller becomes the target).
    let adopted = Arc::new(Mutex::new(false));
    let seen = adopted.clone();
    let (uid, t_uid) = (canary_pod_uid.clone(), target_uid.clone());
    let watch_api = pods_api.clone();
    let task = tokio::spawn(async move {
        let mut stream =
            watcher(watch_api, watcher::Config::default().labels("app=plugin")).boxed();
        while let Some(Ok(ev)) = stream.next().await {
            if let watcher::Event::Apply(p) | watcher::Event::InitApply(p) = ev
                && p.uid().as_deref() == Some(uid.as_str())
                && controller_uid(&p).as_deref() == Some(t_uid.as_str())
            {
                *seen.lock().unwrap() = true;
            }
        }
    });

    let srs: Api<SafeRollout> = Api::namespaced(env.client.clone(), &env.ns.name);
    srs.delete("plugin", &Default::default()).await?;
    saferollout_testkit::wait_for_object(&srs, "plugin", TIMEOUT, |s| s.is_none()).await?;
    let dss: Api<DaemonSet> = Api::namespaced(env.client.clone(), &env.ns.name);
    assert!(dss.get_opt(&canary_name("plugin")).await?.is_none());
    assert!(handover_labels(&env).await?.is_empty());
    let t = dss.get("plugin").await?;
    assert_eq!(
        t.spec.update_strategy, original,
        "the original strategy is back"
    );
    assert!(
        t.spec
            .template
            .spec
            .as_ref()
            .and_then(|s| s.affinity.as_ref())
            .is_none(),
        "no handover expression left"
    );
    let nodes: Api<Node> = Api::all(env.client.clone());
    for n in nodes.list(&ListParams::default()).await? {
        let taints = n.spec.and_then(|s| s.taints).unwrap_or_default();
        assert!(
            !taints
                .iter()
                .any(|t| t.key == saferollout_api::PROMOTING_TAINT),
            "{taints:?}"
        );
    }
    // The target, given back its own strategy, runs its own template on
    // every node (it replaced the adopted pod by its own rules).
    let pods = wait_every_node_on(&env, v1).await?;
    task.abort();
    assert!(
        *adopted.lock().unwrap(),
        "the canary's pod was adopted by the target, not deleted with the canary"
    );
    for p in &pods {
        assert_eq!(controller_uid(p).as_deref(), Some(target_uid.as_str()));
    }
    Ok(())
}

/// The operator ended (SIGABRT right after a write, no clean-up, the lease
/// kept: as a SIGKILL) at ten points of one `Selector` rollout, each
/// process started again with the next point: the target's expression, the
/// canary's creation, handover and stage labels, a status write, the
/// promotion's steps. The rollout converges with every node's agent created
/// exactly once (by the canary), the promotion creating none, and nothing
/// of the strategy left. The crash comes from the operator's debug-build
/// hook `SAFEROLLOUT_DEBUG_CRASH_AFTER` (`<kind>:<n>`: after its n-th write
/// of that kind).
#[tokio::test]
async fn killed_at_ten_points_of_a_rollout_it_converges_with_no_agent_restarted_twice()
-> anyhow::Result<()> {
    let mut env = setup("selector-crash").await?;
    let c = cluster();
    let (v1, v2) = ("registry.example/plugin:v1", "registry.example/plugin:v2");
    let mut spec = spec(&env, v1);
    spec["stages"] =
        json!([{"nodes": 1, "soak": "1s"}, {"nodes": "50%", "soak": "1s"}, {"nodes": "100%"}]);
    support::create_plugin_daemonset(&env.client, &env.ns.name, &env.resource, v1).await?;
    support::create_rollout(&env.client, &env.ns.name, "plugin", spec).await?;
    let settled = wait_status(&env, |st| {
        st.phase == Some(Phase::Succeeded) && st.last_good_template.is_some()
    })
    .await?;
    let target_uid = Api::<DaemonSet>::namespaced(env.client.clone(), &env.ns.name)
        .get("plugin")
        .await?
        .uid()
        .unwrap_or_default();
    // The operator of `setup` goes: each process below has its crash point.
    env.op.kill();
    let start = |log: &str, hook: Option<&str>| {
        let mut args = support::operator_args(&env.ns.name, "127.0.0.1:0", 3);
        args.push("--selector-strategy=true".into());
        let vars: Vec<(&str, &str)> = hook
            .map(|h| ("SAFEROLLOUT_DEBUG_CRASH_AFTER", h))
            .into_iter()
            .collect();
        support::Operator::start_with_env(
            Identity::Impersonate(c.kubeconfig(), OPERATOR_SA),
            &args,
            &vars,
            &format!("{log}-{}", env.ns.name),
        )
    };
    let (rec, task) = record_creations(&env);
    set_image(&env, v2).await?;
    let points = [
        "template:1",
        "template:1",
        "label:1",
        "label:1",
        "status:2",
        "label:1",
        "label:1",
        "promotion:1",
        "promotion:1",
        "promotion:2",
    ];
    for (i, hook) in points.iter().enumerate() {
        let mut crashing = start(&format!("crash-{i}"), Some(hook))?;
        support::poll(
            &format!("the operator ending after write {hook} (point {})", i + 1),
            TIMEOUT,
            || Ok((!crashing.is_running()).then_some(())),
        )
        .await?;
        assert!(
            crashing
                .log_text()
                .contains("SAFEROLLOUT_DEBUG_CRASH_AFTER: ending the process"),
            "point {}: the operator ended for another reason than the hook: {}",
            i + 1,
            crashing.log.display()
        );
    }
    let _after = start("after", None)?;
    let pods = wait_promoted(&env, v2, &settled).await?;
    task.abort();
    let created = std::mem::take(&mut rec.lock().unwrap().0);
    assert_each_node_created_once(&created);
    for p in &pods {
        assert_eq!(controller_uid(p).as_deref(), Some(target_uid.as_str()));
    }
    Ok(())
}
