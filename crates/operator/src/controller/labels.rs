//! Node label writes, made beside the passes rather than inside them.
//!
//! A stage's labels are one write per node. At 5,000 nodes they took the
//! bench's API server about 30 s, and a pass that waited for them acted on
//! nothing else meanwhile: a gate failing on the canary then was reverted
//! half a minute late. So a pass only queues its label actions, and one
//! writer task per SafeRollout makes them, in order (a removal queued after
//! a stage's labels lands after them), [`PARALLEL_WRITES`] at a time.
//!
//! The rollout's expectations remember each queued write from the moment it
//! is queued: the next passes see the node as labelled (or unlabelled, the
//! write marked queued) and queue nothing again; a write that fails, or is
//! dropped because this replica no longer leads, is forgotten, and the next
//! pass decides it again from the cache. A stage's pods are replaced only
//! once all its nodes' labels are made (`sync_labels` in the core); gates
//! and the disruption budget never read them.

use std::sync::Arc;

use futures::StreamExt;
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Node;
use kube::Client;
use kube::api::{Api, Patch};
use kube::runtime::reflector::ObjectRef;
use saferollout_api::{ROLLOUT_LABEL, STAGE_LABEL};
use serde_json::json;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tracing::{debug, info, warn};

use super::caches::triggers::{Cause, Triggers};
use super::{Memories, RolloutKey, with_memory, writing};
use crate::leader::Fence;

/// Label patches in flight at once, per SafeRollout (all of them together
/// keep to [`writing::API_WRITES_IN_FLIGHT`]).
///
/// A stage's labels slow the replacements that run meanwhile: each patch
/// costs the cluster about 5 ms of CPU (the API server, and every node
/// watcher). At 1,000 nodes and `maxUnavailable: 1` the 1,000 labels took
/// 3.3-3.6 s, during which the operator's deletions took the API server
/// 85-103 ms instead of 8-9 and the replacements came 300-460 ms apart
/// instead of 70-80 (audit log): about 3 s of each rollout. Fewer at a time
/// does not help: with 4 the labels took 7.2 s, the replacements meanwhile
/// came 160 ms apart, and the same time was lost; at 10% the labelling
/// stretched from 5 s to 14 s. The cost is the writes' CPU, not their burst.
const PARALLEL_WRITES: usize = 32;

/// How long after a failed label write the pass that decides it again is
/// woken.
const FAILED_WRITES_PAUSE: std::time::Duration = std::time::Duration::from_secs(1);

/// One queued action: this rollout's labels with `stage` on `nodes`, or
/// (`None`) their removal.
struct Job {
    nodes: Vec<String>,
    stage: Option<usize>,
}

/// The writer of one SafeRollout: its queue and its task.
pub struct Writer {
    jobs: mpsc::UnboundedSender<Job>,
    task: JoinHandle<()>,
}

/// What a writer task needs of the context (it outlives any one pass).
#[derive(Clone)]
pub struct Shared {
    pub client: Client,
    pub fence: Arc<Fence>,
    pub memory: Memories,
    pub triggers: Arc<Triggers>,
    pub write_slots: writing::WriteSlots,
}

/// Queues writing this rollout's labels (`stage`; `None`: removing them) on
/// `nodes`, remembered at once in the rollout's expectations.
pub fn queue(
    shared: &Shared,
    key: &RolloutKey,
    rollout_id: &str,
    nodes: &[String],
    stage: Option<usize>,
) {
    let now = Timestamp::now();
    let job = Job {
        nodes: nodes.to_vec(),
        stage,
    };
    with_memory(&shared.memory, key, |m| {
        for n in nodes {
            m.expectations.label_queued(n, stage, now);
        }
        // A writer whose task ended (it never does but by panicking) is
        // replaced; its queue went with it.
        let writer = match m.labels.take() {
            Some(w) if !w.task.is_finished() => w,
            _ => spawn(shared.clone(), key.clone(), rollout_id.to_string()),
        };
        if let Err(mpsc::error::SendError(job)) = writer.jobs.send(job) {
            for n in &job.nodes {
                m.expectations.label_failed(n, stage);
            }
        }
        m.labels = Some(writer);
    });
}

/// Waits until every label write queued for `key` is made (or dropped), and
/// ends its writer: a SafeRollout's clean-up removes its labels only after
/// that, or a write still queued would put one back.
pub async fn drain(shared: &Shared, key: &RolloutKey) {
    let writer = with_memory(&shared.memory, key, |m| m.labels.take());
    if let Some(Writer { jobs, task }) = writer {
        drop(jobs);
        let _ = task.await;
    }
}

fn spawn(shared: Shared, key: RolloutKey, rollout_id: String) -> Writer {
    let (jobs, mut queue) = mpsc::unbounded_channel::<Job>();
    let task = tokio::spawn(async move {
        while let Some(job) = queue.recv().await {
            write(&shared, &key, &rollout_id, job).await;
        }
    });
    Writer { jobs, task }
}

async fn write(shared: &Shared, key: &RolloutKey, rollout_id: &str, job: Job) {
    let Job { nodes, stage } = job;
    let labels = match stage {
        Some(stage) => {
            json!({"metadata": {"labels": {STAGE_LABEL: stage.to_string(), ROLLOUT_LABEL: rollout_id}}})
        }
        None => json!({"metadata": {"labels": {STAGE_LABEL: null, ROLLOUT_LABEL: null}}}),
    };
    match stage {
        Some(stage) => {
            info!(ns = %key.0, name = %key.1, nodes = nodes.len(), stage, "labelling nodes")
        }
        None => info!(ns = %key.0, name = %key.1, nodes = nodes.len(), "removing node labels"),
    }
    let api: Api<Node> = Api::all(shared.client.clone());
    let labels = Arc::new(labels);
    let params = writing::patch_params();
    let fence = shared.fence.clone();
    let (memory, rollout) = (shared.memory.clone(), key.clone());
    let slots = shared.write_slots.clone();
    // Owned per write: the task is spawned, so no borrow may cross it.
    let writes = nodes.into_iter().map(move |node| {
        let (api, labels, params, fence, slots) = (
            api.clone(),
            labels.clone(),
            params.clone(),
            fence.clone(),
            slots.clone(),
        );
        let (memory, rollout) = (memory.clone(), rollout.clone());
        async move {
            // Checked before each write: a replica that lost the lease writes
            // nothing more (the new leader decides from its own caches).
            if !fence.is_open() {
                return (node, Err(None));
            }
            // A revert's removal queued behind a stage's labels: a node not
            // labelled yet is not labelled at all (the removal still runs).
            let superseded = with_memory(&memory, &rollout, |m| {
                m.expectations.label_superseded(&node, stage)
            });
            if superseded {
                return (node, Ok(None));
            }
            // Answered with the node's metadata only (PartialObjectMetadata):
            // not its status, for each of a stage's thousands of writes.
            let r = slots
                .run(api.patch_metadata(&node, &params, &Patch::Merge(&*labels)))
                .await;
            (node, r.map(Some).map_err(Some))
        }
    });
    let mut results = futures::stream::iter(writes).buffer_unordered(PARALLEL_WRITES);
    let (mut written, mut skipped, mut failed) = (0, 0, 0);
    while let Some((node, result)) = results.next().await {
        let now = Timestamp::now();
        match result {
            // Superseded: the later write's expectation stays.
            Ok(None) => skipped += 1,
            Ok(Some(_)) => {
                written += 1;
                with_memory(&shared.memory, key, |m| {
                    m.expectations.label_written(&node, stage, now)
                });
                writing::crash_point("label");
            }
            Err(e) => {
                match e {
                    // Gone: the next pass no longer sees the node.
                    Some(kube::Error::Api(s)) if s.code == 404 => {}
                    Some(e) => {
                        failed += 1;
                        warn!(ns = %key.0, name = %key.1, node = %node, error = %e, "node label write failed; the next pass decides it again");
                    }
                    None => failed += 1,
                }
                with_memory(&shared.memory, key, |m| {
                    m.expectations.label_failed(&node, stage)
                });
            }
        }
    }
    debug!(ns = %key.0, name = %key.1, written, skipped, failed, "node label writes done");
    // The next pass must run now: the watch may have shown the labels before
    // their writes were recorded here (that pass still saw them queued and
    // waited), and a failed write is decided again only by a pass. No event
    // of the cluster may come to wake it.
    let rollout = ObjectRef::new(&key.1).within(&key.0);
    if failed == 0 {
        shared.triggers.send(rollout, Cause::LabelWrites);
        return;
    }
    // After a failed write, not at once: that pass queues it again, and an
    // API server that refuses every write (down behind a proxy, or
    // answering 5xx at once) was asked again as fast as it answered (1,803
    // refused writes in 5 s; faults.rs). Other events still wake passes.
    let triggers = shared.triggers.clone();
    tokio::spawn(async move {
        tokio::time::sleep(FAILED_WRITES_PAUSE).await;
        triggers.send(rollout, Cause::LabelWrites);
    });
}
