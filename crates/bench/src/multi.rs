//! Many SafeRollouts at once: `count` DaemonSets in as many namespaces, each
//! on its own pool of nodes (a node label), each with a SafeRollout (the
//! default stages, maxUnavailable 1, allocatable gate with a soak: with fifty
//! rollouts at once the fixture's allocatable lags its pods' Ready and a gate
//! without soak falsely reverts healthy releases); the operator starts with
//! all of them present, adopts them, then every template changes at once.
//!
//! The other scenarios' DaemonSet is deleted first: its pods would double
//! what KWOK, the fixture and the controller manager play, and on 2 cores at
//! 5,000 nodes that load made KWOK's nodes flap NotReady mid-run.

use std::collections::BTreeMap;
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use jiff::Timestamp;
use serde_json::json;

use crate::ctx::{Ctx, secs};
use crate::k8s;
use crate::overhead;
use crate::results::MultiRun;

const RESOURCE: &str = "example.com/npu";

/// The allocatable gate's soak: 5 s, longer from 1,000 nodes on (1 s per
/// 200 nodes). At 5,000 nodes under fifty rollouts the fixture's allocatable
/// lagged its pods' Ready by more than 5 s, and 2 of 50 rollouts reverted a
/// healthy release.
fn soak_secs(nodes: usize) -> usize {
    (nodes / 200).max(5)
}

fn ns(i: usize) -> String {
    format!("multi-{i}")
}

pub async fn run(ctx: &Ctx, count: usize) -> anyhow::Result<MultiRun> {
    let count = count.min(ctx.nodes).max(1);
    let nodes_each = ctx.nodes / count;
    eprintln!(
        "bench: {} nodes: {count} SafeRollouts in {count} namespaces, {nodes_each} nodes each",
        ctx.nodes
    );
    k8s::delete_daemonset_and_pods(
        &ctx.client,
        overhead::NS,
        overhead::DS,
        Duration::from_secs(600 + ctx.nodes as u64 / 5),
    )
    .await?;
    let pools: Vec<(String, BTreeMap<String, String>)> = ctx
        .node_names
        .iter()
        .enumerate()
        .map(|(i, n)| {
            let pool = format!("p{}", (i % count));
            (n.clone(), [(k8s::POOL_LABEL.to_string(), pool)].into())
        })
        .collect();
    k8s::label_nodes(&ctx.client, pools, 16).await?;
    let v1 = ctx.image("");
    futures::stream::iter(0..count)
        .map(|i| {
            let v1 = v1.clone();
            async move {
                k8s::namespace(&ctx.client, &ns(i)).await?;
                let pool = format!("p{i}");
                k8s::create_daemonset(
                    &ctx.client,
                    &ns(i),
                    "agent",
                    k8s::plugin_template(RESOURCE, &v1),
                    Some((k8s::POOL_LABEL, &pool)),
                )
                .await
            }
        })
        .buffer_unordered(8)
        .try_collect::<Vec<_>>()
        .await?;
    let fleet = Duration::from_secs(600 + ctx.nodes as u64 / 2);
    for i in 0..count {
        k8s::wait_daemonset_complete(&ctx.client, &ns(i), "agent", fleet).await?;
    }
    k8s::wait_nodes_advertise(&ctx.client, RESOURCE, nodes_each * count, fleet).await?;
    let soak = soak_secs(ctx.nodes);
    for i in 0..count {
        let spec = json!({
            "targetRef": {"name": "agent"},
            "maxUnavailable": 1,
            "progressDeadline": "30m",
            "gates": {"allocatable": [{"resource": RESOURCE, "soak": format!("{soak}s")}]}
        });
        k8s::create_rollout(&ctx.client, &ns(i), "agent", spec).await?;
    }
    let op = ctx.start_operator("multi")?;
    let slow = Duration::from_secs(600 + ctx.nodes as u64 / 5);
    let mut stable = Vec::new();
    for i in 0..count {
        let st = k8s::wait_adopted(&ctx.client, &ns(i), "agent", slow).await?;
        stable.push(st.stable_revision);
    }
    let adopted = Timestamp::now();
    let adopt_secs = secs(op.started, adopted);
    eprintln!("bench:   {count} adopted {adopt_secs:.1}s after the operator started");
    let v2 = ctx.image("");
    let t0 = Timestamp::now();
    futures::stream::iter(0..count)
        .map(|i| {
            let v2 = v2.clone();
            async move {
                k8s::set_daemonset(
                    &ctx.client,
                    &ns(i),
                    "agent",
                    k8s::plugin_template(RESOURCE, &v2),
                    None,
                )
                .await
            }
        })
        .buffer_unordered(8)
        .try_collect::<Vec<_>>()
        .await?;
    // A false revert (a healthy release blocked) is counted, not fatal: the
    // run still measures the operator, and the report shows the count.
    let mut false_reverts = Vec::new();
    for (i, old) in stable.iter().enumerate() {
        let st = k8s::wait_rollout(&ctx.client, &ns(i), "agent", slow, |st| {
            (st.phase == Some(saferollout_api::Phase::Succeeded)
                && st.stable_revision.is_some()
                && st.stable_revision != *old)
                || !st.blocked_revisions.is_empty()
        })
        .await?;
        if let Some(b) = st.blocked_revisions.first() {
            eprintln!("bench:   a false revert in {}: {}", ns(i), b.message);
            false_reverts.push(format!("{}: {}", ns(i), b.message));
        }
    }
    let rollout_secs = secs(t0, Timestamp::now());
    eprintln!("bench:   {count} rolled out in {rollout_secs:.1}s");
    let operator = ctx.finish_operator(op, "multi", count)?;
    Ok(MultiRun {
        rollouts: count,
        nodes_each,
        adopt_secs,
        rollout_secs,
        soak_secs: soak,
        false_reverts,
        operator,
    })
}
