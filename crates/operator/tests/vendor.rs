//! Owner-aware mode end to end (issue 39), against stand-ins of the three
//! vendor operators that reconcile the device-plugin DaemonSet as their
//! upstream sources do (`support::vendors`: NVIDIA's hash-and-update, AMD's
//! revert-on-generation, Intel's revert-selected-fields), on the real
//! control plane, the operator as its ServiceAccount. The stand-in builds
//! the DaemonSet from its custom resource; every release is made in the
//! custom resource, as a person using the vendor's operator makes it.
//!
//! What each test shows, for its vendor:
//! - NVIDIA and AMD, the vendor's own OnDelete unset: the rollout refuses
//!   (`OwnerNotOnDelete`), naming the custom resource's field, and does not
//!   write the DaemonSet (its generation does not move, no managed field of
//!   the operator under `spec`); the field set in the custom resource, the
//!   stand-in writes the DaemonSet once and the rollout adopts it.
//! - Intel, which has no such field and leaves an outside OnDelete in place:
//!   the operator sets OnDelete itself, and the stand-in, having reconciled
//!   the DaemonSet since, leaves it so without a write.
//! - A release made in the custom resource goes through three stages, every
//!   node replaced once, never more than one down; the operator owns no
//!   field of the template, and the stand-in wrote the DaemonSet exactly
//!   once for the change (no fight).
//! - A broken release made in the custom resource stops (Halt), naming the
//!   vendor's version fields; the template stays the vendor's. Put back in
//!   the custom resource, the last good release returns on every node and
//!   the rollout says `RolledBack`.
//! - With `spec.ownerRevert` naming the custom resource (the operator run
//!   with `--owner-revert` and the chart's RBAC for it), the next broken
//!   release is reverted through it: the operator puts the version fields
//!   back (its field manager is on the custom resource's spec), the
//!   stand-in writes the last good template (once), every node returns to
//!   it within the budget, and the operator still owns no field of the
//!   template.
//! - The custom resource then marked as Argo CD's (its tracking
//!   annotation), the next broken release halts instead, naming the
//!   application and the field to revert in Git (in the stop, and in the
//!   `Degraded` condition, which Argo CD's health check, run by its Lua
//!   interpreter, shows as `Degraded` with that message); the custom
//!   resource is left as it is.
//!
//! A fourth test checks the stand-ins themselves: an outside write of the
//! DaemonSet is answered as each vendor answers it (NVIDIA keeps it until
//! its ClusterPolicy changes, AMD reverts the whole spec at once, Intel
//! reverts the image and keeps an outside OnDelete), so that the first three
//! would see a fight if owner-aware mode wrote what the owner reconciles.

mod support;

use std::collections::BTreeSet;
use std::time::Instant;

use anyhow::Context;
use k8s_openapi::api::apps::v1::DaemonSet;
use kube::api::Api;
use kube::{Client, ResourceExt};
use saferollout_api::{FIELD_MANAGER, OnFailure, Phase};
use saferollout_testkit::{TestNamespace, cluster, wait_for_object};
use serde_json::{Value, json};
use support::vendors::{DAEMONSET, StandIn, Vendor};
use support::{
    Identity, Operator, TIMEOUT, condition, create_rollout, sample_pods, wait_adopted, wait_agents,
    wait_status,
};

const OPERATOR_SA: &str = "system:serviceaccount:saferollout-system:saferollout-operator";
const V1: &str = "registry.example/plugin:v1";
const V2: &str = "registry.example/plugin:v2";
const BROKEN: &str = "registry.example/plugin:v3-broken";
const BROKEN_AGAIN: &str = "registry.example/plugin:v4-broken";
const BROKEN_IN_GIT: &str = "registry.example/plugin:v5-broken";
/// The tests share the cluster's nodes (stage labels live there) and the
/// operator's lease: one at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Dropped in this order: the operator, the stand-in (and its custom
/// resource), the namespace, then the next test may start.
struct Env {
    /// When the test got the cluster to itself.
    start: Instant,
    _op: Operator,
    vendor: StandIn,
    ns: TestNamespace,
    client: Client,
    resource: String,
    _serial: tokio::sync::MutexGuard<'static, ()>,
}

/// The stand-in of `vendor` and its custom resource, the DaemonSet it made
/// serving on every node, and the operator as its ServiceAccount.
async fn setup(vendor: Vendor) -> anyhow::Result<Env> {
    let serial = SERIAL.lock().await;
    let start = Instant::now();
    let c = cluster();
    support::install(c)?;
    support::grant_chart_rbac(c, "ownerRevert.enabled=true")?;
    let prefix = format!("vendor-{}", format!("{vendor:?}").to_lowercase());
    let ns = c.namespace(&prefix).await?;
    let client = c.client().await?;
    let resource = format!("example.com/gpu-{prefix}");
    let stand_in = StandIn::start(vendor, &client, &ns.name, &resource, V1).await?;
    wait_agents(&client, &ns.name, V1).await?;
    support::wait_every_node_advertises(&client, &resource).await?;
    let mut args = support::operator_args(&ns.name, "127.0.0.1:0", 3);
    args.push("--owner-revert=true".into());
    let op = Operator::start(
        Identity::Impersonate(c.kubeconfig(), OPERATOR_SA),
        &args,
        &format!("{prefix}-{}", ns.name),
    )?;
    Ok(Env {
        start,
        _op: op,
        vendor: stand_in,
        ns,
        client,
        resource,
        _serial: serial,
    })
}

fn generation(ds: &DaemonSet) -> i64 {
    ds.metadata.generation.unwrap_or_default()
}

fn image(ds: &DaemonSet) -> &str {
    ds.spec
        .template
        .spec
        .as_ref()
        .and_then(|p| p.containers.first())
        .and_then(|c| c.image.as_deref())
        .unwrap_or_default()
}

fn strategy(ds: &DaemonSet) -> &str {
    ds.spec
        .update_strategy
        .as_ref()
        .and_then(|u| u.type_.as_deref())
        .unwrap_or_default()
}

/// The fields under `spec` of the DaemonSet the operator's field manager
/// owns (`f:updateStrategy`, `f:template`, ...), across its entries.
fn operator_spec_fields(ds: &DaemonSet) -> BTreeSet<String> {
    ds.managed_fields()
        .iter()
        .filter(|m| m.manager.as_deref() == Some(FIELD_MANAGER))
        .filter_map(|m| m.fields_v1.as_ref()?.0.get("f:spec")?.as_object().cloned())
        .flat_map(|spec| spec.into_iter().map(|(k, _)| k))
        .filter(|k| k != ".")
        .collect()
}

/// What the operator's conditions and stops must name: the vendor's
/// OnDelete field (none for Intel) and its version fields
/// (`saferollout_core::owner`).
fn expected_fields(vendor: Vendor, name: &str) -> (Option<String>, String) {
    match vendor {
        Vendor::Nvidia => (
            Some(format!(
                "spec.daemonsets.updateStrategy: OnDelete in ClusterPolicy {name}"
            )),
            format!(
                "spec.devicePlugin.repository, image and version together (or the operand's own fields) in ClusterPolicy {name}"
            ),
        ),
        Vendor::Amd => (
            Some(format!(
                "spec.devicePlugin.upgradePolicy.upgradeStrategy: OnDelete (spec.draDriver.upgradePolicy for its DRA driver) in DeviceConfig {name}"
            )),
            format!(
                "spec.devicePlugin.devicePluginImage (spec.draDriver.image for its DRA driver) in DeviceConfig {name}"
            ),
        ),
        Vendor::Intel => (None, format!("spec.image in GpuDevicePlugin {name}")),
    }
}

fn rollout_spec(resource: &str) -> Value {
    json!({
        "targetRef": {"name": DAEMONSET},
        "stages": [{"nodes": 1}, {"nodes": "50%"}, {"nodes": "100%"}],
        "maxUnavailable": 1,
        "progressDeadline": "1m",
        "gates": {"allocatable": [{"resource": resource, "min": "baseline", "max": "baseline", "soak": "2s"}]}
    })
}

/// Waits until the stand-in has reconciled the DaemonSet as it is now and
/// returns it: whatever the stand-in wanted to write about it is written
/// (and counted) by then.
async fn settled(client: &Client, ns: &str, stand_in: &StandIn) -> anyhow::Result<DaemonSet> {
    let dss: Api<DaemonSet> = Api::namespaced(client.clone(), ns);
    // (The stand-in may not have created it yet.)
    let ds = wait_for_object(&dss, DAEMONSET, TIMEOUT, |d| d.is_some())
        .await?
        .context("exists")?;
    stand_in.wait_synced(generation(&ds)).await?;
    // It may have written since: the DaemonSet as that write left it.
    let now = dss.get(DAEMONSET).await?;
    stand_in.wait_synced(generation(&now)).await?;
    Ok(now)
}

async fn scenario(vendor: Vendor) -> anyhow::Result<()> {
    let env = setup(vendor).await?;
    let start = env.start;
    let (ns, client) = (env.ns.name.as_str(), &env.client);
    let cr = env.vendor.name.clone();
    let (on_delete_field, version_fields) = expected_fields(vendor, &cr);
    let owner = format!("owned by {}/{cr}", vendor.kind());
    let log = || env.vendor.write_log();

    // The DaemonSet as the vendor made it: its controller owner is the
    // custom resource, and the stand-in created it and wrote nothing since.
    let ds = settled(client, ns, &env.vendor).await?;
    let refs = ds.owner_references();
    assert!(
        refs.iter().any(|r| r.controller == Some(true)
            && r.kind == vendor.kind()
            && r.name == cr
            && r.api_version == vendor.api_version()),
        "{refs:?}"
    );
    assert_eq!(env.vendor.writes(), 1, "{:?}", log());
    let created = generation(&ds);
    eprintln!("{vendor:?}: set up in {:?}", start.elapsed());

    create_rollout(client, ns, "plugin", rollout_spec(&env.resource)).await?;
    let adopted = match on_delete_field {
        Some(field) => {
            // The vendor's OnDelete unset: refused, naming the field in the
            // custom resource; the DaemonSet untouched.
            let st = wait_status(client, ns, "plugin", TIMEOUT, |st| {
                condition(st, "Ready").is_some_and(|c| c.reason == "OwnerNotOnDelete")
            })
            .await?;
            let message = &condition(&st, "Ready").unwrap().message;
            assert!(message.contains(&field), "{message}");
            let ds = settled(client, ns, &env.vendor).await?;
            assert_eq!(generation(&ds), created, "nothing written to the DaemonSet");
            assert_eq!(strategy(&ds), "RollingUpdate");
            assert_eq!(operator_spec_fields(&ds), BTreeSet::new());
            assert_eq!(env.vendor.writes(), 1, "{:?}", log());

            // Set in the custom resource: the stand-in writes the DaemonSet
            // once, OnDelete, and the rollout adopts it.
            env.vendor.set_on_delete().await?;
            let st = wait_adopted(client, ns, "plugin").await?;
            let ds = settled(client, ns, &env.vendor).await?;
            assert_eq!(strategy(&ds), "OnDelete");
            assert_eq!(image(&ds), V1);
            assert_eq!(
                env.vendor.writes(),
                2,
                "one write for OnDelete: {:?}",
                log()
            );
            assert_eq!(operator_spec_fields(&ds), BTreeSet::new());
            st
        }
        None => {
            // Intel: the operator sets OnDelete itself; the stand-in, having
            // reconciled the DaemonSet since, leaves it, without a write.
            let st = wait_adopted(client, ns, "plugin").await?;
            let ds = settled(client, ns, &env.vendor).await?;
            assert!(generation(&ds) > created, "OnDelete written");
            assert_eq!(strategy(&ds), "OnDelete", "the stand-in left OnDelete");
            assert_eq!(env.vendor.writes(), 1, "no write for OnDelete: {:?}", log());
            assert_eq!(
                operator_spec_fields(&ds),
                BTreeSet::from(["f:updateStrategy".to_string()]),
                "the operator wrote only the update strategy"
            );
            st
        }
    };
    let stable = adopted.stable_revision.clone();
    eprintln!("{vendor:?}: adopted at {:?}", start.elapsed());

    // A healthy release made in the custom resource.
    let writes = env.vendor.writes();
    let nodes: Vec<String> = (0..4).map(|i| format!("sim-gpu-{i}")).collect();
    let (samples, task) = sample_pods(client, ns, nodes.clone());
    env.vendor.release(V2).await?;
    let st = wait_status(client, ns, "plugin", TIMEOUT, |st| {
        st.phase == Some(Phase::Succeeded)
            && st.stable_revision.is_some()
            && st.stable_revision != stable
    })
    .await?;
    wait_agents(client, ns, V2).await?;
    task.abort();
    {
        let samples = samples.lock().unwrap();
        samples.assert_each_node_got_one(V2, nodes.len());
        let (most, which) = samples.max_unavailable(&BTreeSet::new());
        assert!(most <= 1, "{which:?} down at once at maxUnavailable 1");
    }
    assert_eq!(st.stages.len(), 3, "{st:#?}");
    let released = st;
    let ds = settled(client, ns, &env.vendor).await?;
    assert_eq!(image(&ds), V2);
    assert_eq!(strategy(&ds), "OnDelete");
    let fields = operator_spec_fields(&ds);
    assert!(!fields.contains("f:template"), "{fields:?}");
    assert_eq!(
        env.vendor.writes() - writes,
        1,
        "one write of the stand-in for the release: {:?}",
        log()
    );
    eprintln!("{vendor:?}: released at {:?}", start.elapsed());

    // A broken release made in the custom resource: stopped, naming the
    // version fields to put back; the template stays the vendor's.
    env.vendor.release(BROKEN).await?;
    let st = wait_status(client, ns, "plugin", TIMEOUT, |st| st.stopped.is_some()).await?;
    let stopped = st.stopped.clone().unwrap();
    assert_eq!(stopped.policy, OnFailure::Halt, "{stopped:?}");
    assert!(
        stopped.message.contains(&owner) && stopped.message.contains(&version_fields),
        "{}",
        stopped.message
    );
    let ds = settled(client, ns, &env.vendor).await?;
    assert_eq!(image(&ds), BROKEN, "the template the vendor wrote is left");
    let fields = operator_spec_fields(&ds);
    assert!(!fields.contains("f:template"), "{fields:?}");
    eprintln!("{vendor:?}: halted at {:?}", start.elapsed());

    // Put back in the custom resource, as the message says: the last good
    // release returns on every node, and the rollout says so.
    env.vendor.release(V2).await?;
    wait_agents(client, ns, V2).await?;
    let st = wait_status(client, ns, "plugin", TIMEOUT, |st| {
        condition(st, "Ready").is_some_and(|c| c.reason == "RolledBack")
    })
    .await?;
    assert_eq!(st.stable_revision, released.stable_revision, "{st:#?}");
    eprintln!(
        "{vendor:?}: after the put-back: phase {:?}, Ready {:?}",
        st.phase,
        condition(&st, "Ready").map(|c| &c.message)
    );
    let ds = settled(client, ns, &env.vendor).await?;
    assert_eq!(image(&ds), V2);
    assert_eq!(strategy(&ds), "OnDelete");
    let fields = operator_spec_fields(&ds);
    assert!(!fields.contains("f:template"), "{fields:?}");
    eprintln!(
        "{vendor:?}: back on the last good release at {:?}",
        start.elapsed()
    );

    // spec.ownerRevert naming the custom resource: the next broken release
    // is reverted through it, by the operator, with no write of the
    // DaemonSet's template; the stand-in writes the last good one back.
    let revert = json!({"spec": {"ownerRevert": {"resource": vendor.resource(), "name": cr}}});
    kube::Api::<saferollout_api::SafeRollout>::namespaced(client.clone(), ns)
        .patch(
            "plugin",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&revert),
        )
        .await?;
    let writes = env.vendor.writes();
    let (samples, task) = sample_pods(client, ns, nodes.clone());
    env.vendor.release(BROKEN_AGAIN).await?;
    let st = wait_status(client, ns, "plugin", TIMEOUT, |st| {
        st.blocked_revisions.len() == 2
            && condition(st, "Ready").is_some_and(|c| c.message.contains("reverting through"))
    })
    .await?;
    // Reverted, not halted: the only stop recorded is the earlier one.
    assert_eq!(
        st.stopped.as_ref().map(|s| &s.message),
        Some(&stopped.message),
        "{st:#?}"
    );
    let message = condition(&st, "Ready").unwrap().message.clone();
    assert!(
        message.contains(&format!("reverting through {}/{cr}", vendor.kind())),
        "{message}"
    );
    eprintln!("{vendor:?}: reverting through the owner: {message}");
    wait_agents(client, ns, V2).await?;
    let st = wait_status(client, ns, "plugin", TIMEOUT, |st| {
        condition(st, "Ready").is_some_and(|c| c.reason == "RolledBack")
    })
    .await?;
    task.abort();
    assert_eq!(st.stable_revision, released.stable_revision, "{st:#?}");
    {
        let samples = samples.lock().unwrap();
        let (most, which) = samples.max_unavailable(&BTreeSet::new());
        assert!(most <= 1, "{which:?} down at once at maxUnavailable 1");
    }
    // The operator wrote the custom resource's version fields, the stand-in
    // the DaemonSet (once for the broken release, once for the revert).
    let written = env.vendor.cr_managers().await?;
    assert!(written.contains(FIELD_MANAGER), "{written:?}");
    assert_eq!(
        env.vendor.writes() - writes,
        2,
        "the stand-in's writes: {:?}",
        log()
    );
    let ds = settled(client, ns, &env.vendor).await?;
    assert_eq!(image(&ds), V2);
    let fields = operator_spec_fields(&ds);
    assert!(!fields.contains("f:template"), "{fields:?}");
    eprintln!(
        "{vendor:?}: reverted through the owner at {:?}; the stand-in's writes: {:#?}",
        start.elapsed(),
        log()
    );

    // Argo CD manages the custom resource (its tracking annotation): a
    // revert written there would be undone at its next sync, so the next
    // broken release halts, naming the application and the field to revert
    // in Git, and nothing is written to the custom resource.
    env.vendor
        .patch(&json!({"metadata": {"annotations": {
            "argocd.argoproj.io/tracking-id": format!("gpu-operator:{}/{}:/{cr}", vendor.api_version(), vendor.kind())
        }}}))
        .await?;
    env.vendor.release(BROKEN_IN_GIT).await?;
    let st = wait_status(client, ns, "plugin", TIMEOUT, |st| {
        st.stopped
            .as_ref()
            .is_some_and(|s| s.message != stopped.message)
    })
    .await?;
    let halted = st.stopped.clone().unwrap();
    assert_eq!(halted.policy, OnFailure::Halt, "{halted:?}");
    assert!(
        halted
            .message
            .contains("managed by Argo CD (application gpu-operator)")
            && halted.message.contains("in Git"),
        "{}",
        halted.message
    );
    let degraded = condition(&st, "Degraded").map(|c| c.message.clone());
    assert!(
        degraded.as_deref().is_some_and(|m| m.contains("in Git")),
        "what Argo CD's health shows: {degraded:?}"
    );
    // Argo CD's health of the SafeRollout, by its own Lua interpreter
    // running deploy/argocd/health.lua on the object as it is now.
    let sr = kube::Api::<kube::api::DynamicObject>::namespaced_with(
        client.clone(),
        ns,
        &kube::api::ApiResource::erase::<saferollout_api::SafeRollout>(&()),
    )
    .get("plugin")
    .await?;
    let file = std::env::temp_dir().join(format!("saferollout-vendor-health-{ns}.json"));
    std::fs::write(&file, serde_json::to_vec(&sr)?)?;
    let out = support::run(
        std::process::Command::new(support::tool("gitops-check"))
            .arg("-lua")
            .arg(saferollout_testkit::repo_root().join("deploy/argocd/health.lua"))
            .arg(&file),
    )?;
    let verdict: Value = serde_json::from_str(out.lines().next().unwrap_or_default())?;
    assert_eq!(verdict["argocd"]["status"], "Degraded", "{verdict}");
    let shown = verdict["argocd"]["message"].as_str().unwrap_or_default();
    assert!(
        shown.contains("managed by Argo CD (application gpu-operator)") && shown.contains("in Git"),
        "Argo CD's health message: {shown}"
    );
    let ds = settled(client, ns, &env.vendor).await?;
    assert_eq!(
        image(&ds),
        BROKEN_IN_GIT,
        "not reverted: Git is the owner's source"
    );
    eprintln!("{vendor:?}: halted for Git; Argo CD shows Degraded: {shown}");
    Ok(())
}

#[tokio::test]
async fn a_daemonset_the_nvidia_gpu_operator_owns_is_staged_through_its_clusterpolicy()
-> anyhow::Result<()> {
    scenario(Vendor::Nvidia).await
}

#[tokio::test]
async fn a_daemonset_the_amd_gpu_operator_owns_is_staged_through_its_deviceconfig()
-> anyhow::Result<()> {
    scenario(Vendor::Amd).await
}

#[tokio::test]
async fn a_daemonset_the_intel_operator_owns_is_staged_with_an_ondelete_it_leaves()
-> anyhow::Result<()> {
    scenario(Vendor::Intel).await
}

/// The stand-ins themselves, without the operator: an outside write of the
/// DaemonSet (what saferollout does to a plain DaemonSet: `OnDelete` and a
/// template) is answered as each vendor's operator answers it, so the tests
/// above would see a fight if owner-aware mode wrote there.
/// - NVIDIA: both survive (the hash annotation still matches) until the
///   ClusterPolicy changes, which overwrites the whole object.
/// - AMD: the generation moved, so the whole spec is put back at once.
/// - Intel: the image is put back, `OnDelete` survives, also after a release.
#[tokio::test]
async fn the_stand_ins_answer_an_outside_write_as_their_vendors_do() -> anyhow::Result<()> {
    let _serial = SERIAL.lock().await;
    let c = cluster();
    let client = c.client().await?;
    let outside = "registry.example/plugin:outside";
    for vendor in [Vendor::Nvidia, Vendor::Amd, Vendor::Intel] {
        let prefix = format!("vendor-edit-{}", format!("{vendor:?}").to_lowercase());
        let ns = c.namespace(&prefix).await?;
        let resource = format!("example.com/gpu-{prefix}");
        let stand_in = StandIn::start(vendor, &client, &ns.name, &resource, V1).await?;
        let ds = settled(&client, &ns.name, &stand_in).await?;
        assert_eq!(strategy(&ds), "RollingUpdate");
        assert_eq!(stand_in.writes(), 1, "{:?}", stand_in.write_log());

        let patch = json!({"spec": {
            "updateStrategy": {"type": "OnDelete", "rollingUpdate": null},
            "template": support::agent_template(&resource, outside)}});
        Api::<DaemonSet>::namespaced(client.clone(), &ns.name)
            .patch(
                DAEMONSET,
                &kube::api::PatchParams {
                    field_manager: Some("someone-else".into()),
                    ..Default::default()
                },
                &kube::api::Patch::Merge(patch),
            )
            .await?;
        let ds = settled(&client, &ns.name, &stand_in).await?;
        let (writes, kept) = match vendor {
            Vendor::Nvidia => (1, ("OnDelete", outside)),
            Vendor::Amd => (2, ("RollingUpdate", V1)),
            Vendor::Intel => (2, ("OnDelete", V1)),
        };
        assert_eq!(
            (stand_in.writes(), (strategy(&ds), image(&ds))),
            (writes, kept),
            "{vendor:?} after an outside write: {:?}",
            stand_in.write_log()
        );

        stand_in.release(V2).await?;
        let ds = settled(&client, &ns.name, &stand_in).await?;
        let kept = match vendor {
            Vendor::Nvidia | Vendor::Amd => ("RollingUpdate", V2),
            Vendor::Intel => ("OnDelete", V2),
        };
        assert_eq!(
            (stand_in.writes(), (strategy(&ds), image(&ds))),
            (writes + 1, kept),
            "{vendor:?} after a release: {:?}",
            stand_in.write_log()
        );
    }
    Ok(())
}
