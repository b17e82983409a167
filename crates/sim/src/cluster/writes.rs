//! Writes to the API server, and the bookkeeping that keeps them from
//! piling up: one write per object at a time, no rewrite of what was just
//! written while the watch catches up, and backoff after failures.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::{Api, Client};
use serde_json::Value;
use tokio::time::Instant;

use crate::FIELD_MANAGER;

/// The object a write goes to.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum WriteKey {
    /// `namespace/name`
    PodStatus(String),
    NodeStatus(String),
    Slice(String),
}

/// A write, ready to send.
#[derive(Clone, Debug)]
pub enum WriteOp {
    /// Strategic merge patch of a pod's status subresource.
    PodStatus {
        namespace: String,
        name: String,
        patch: Value,
    },
    /// Strategic merge patch of a node's status subresource (extended
    /// resources, and the Ready condition's heartbeat merged by its type).
    NodeStatus {
        name: String,
        patch: Value,
    },
    /// Server-side apply of a whole slice.
    ApplySlice {
        name: String,
        slice: Box<ResourceSlice>,
    },
    DeleteSlice {
        name: String,
    },
}

impl WriteOp {
    pub fn key(&self) -> WriteKey {
        match self {
            Self::PodStatus {
                namespace, name, ..
            } => WriteKey::PodStatus(format!("{namespace}/{name}")),
            Self::NodeStatus { name, .. } => WriteKey::NodeStatus(name.clone()),
            Self::ApplySlice { name, .. } | Self::DeleteSlice { name } => {
                WriteKey::Slice(name.clone())
            }
        }
    }

    /// What the write says, to recognise a repeat of it.
    pub fn content(&self) -> Value {
        match self {
            Self::PodStatus { patch, .. } | Self::NodeStatus { patch, .. } => patch.clone(),
            Self::ApplySlice { slice, .. } => serde_json::to_value(slice).unwrap_or(Value::Null),
            Self::DeleteSlice { .. } => Value::Null,
        }
    }

    pub fn describe(&self) -> String {
        match self {
            Self::PodStatus {
                namespace, name, ..
            } => format!("status of pod {namespace}/{name}"),
            Self::NodeStatus { name, patch } => {
                format!("status of node {name} ({})", patch["status"])
            }
            Self::ApplySlice { name, slice } => format!(
                "ResourceSlice {name} ({} devices, pool generation {})",
                slice.spec.devices.as_ref().map_or(0, Vec::len),
                slice.spec.pool.generation
            ),
            Self::DeleteSlice { name } => format!("deletion of ResourceSlice {name}"),
        }
    }
}

/// What the API server answered, for the mirrors.
#[derive(Debug)]
pub enum Written {
    Pod(Box<Pod>),
    Node(Box<Node>),
    Slice(Box<ResourceSlice>),
    SliceDeleted(String),
}

/// Why a write failed.
#[derive(Debug)]
pub enum WriteError {
    /// The object is gone; the watch will tell.
    Gone,
    /// Anything else; retried with backoff.
    Failed(kube::Error),
}

/// Sends one write.
pub async fn perform(client: Client, op: WriteOp) -> Result<Written, WriteError> {
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.to_owned()),
        ..PatchParams::default()
    };
    let result = match op {
        WriteOp::PodStatus {
            namespace,
            name,
            patch,
        } => Api::<Pod>::namespaced(client, &namespace)
            .patch_status(&name, &params, &Patch::Strategic(patch))
            .await
            .map(|pod| Written::Pod(Box::new(pod))),
        WriteOp::NodeStatus { name, patch } => Api::<Node>::all(client)
            .patch_status(&name, &params, &Patch::Strategic(patch))
            .await
            .map(|node| Written::Node(Box::new(node))),
        WriteOp::ApplySlice { name, slice } => Api::<ResourceSlice>::all(client)
            .patch(
                &name,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(*slice),
            )
            .await
            .map(|slice| Written::Slice(Box::new(slice))),
        WriteOp::DeleteSlice { name } => {
            match Api::<ResourceSlice>::all(client)
                .delete(&name, &DeleteParams::default())
                .await
            {
                Ok(_) => Ok(Written::SliceDeleted(name)),
                // Already gone is what was wanted.
                Err(e) if is_not_found(&e) => Ok(Written::SliceDeleted(name)),
                Err(e) => Err(e),
            }
        }
    };
    result.map_err(|e| {
        if is_not_found(&e) {
            WriteError::Gone
        } else {
            WriteError::Failed(e)
        }
    })
}

fn is_not_found(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(status) if status.code == 404)
}

/// How long a write is trusted to show up in the watch before the sim
/// writes the same thing again. Besides covering watch lag, this bounds the
/// damage if the API server stores something other than what was written
/// (the sim would otherwise rewrite it on every event).
pub const SETTLE_TIME: Duration = Duration::from_secs(5);

const FIRST_RETRY: Duration = Duration::from_millis(500);
const MAX_RETRY: Duration = Duration::from_secs(30);

/// Whether and when to send a write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    Send,
    /// The same write was just made; look again at the given time.
    WaitUntil(Instant),
    /// A write to the object is in flight; look again when it completes.
    AfterInFlight,
}

/// Per-object write bookkeeping.
#[derive(Debug, Default)]
pub struct WriteTracker {
    in_flight: HashSet<WriteKey>,
    /// Objects whose node wants another look once their write completes.
    deferred: HashSet<WriteKey>,
    /// The last write sent per object, and when.
    recent: HashMap<WriteKey, (Value, Instant)>,
    /// Consecutive failures per object, and when to try again.
    failures: HashMap<WriteKey, (u32, Instant)>,
}

impl WriteTracker {
    /// Decides about `op` at `now`; on [`Decision::Send`] the write counts
    /// as in flight.
    pub fn decide(&mut self, op: &WriteOp, now: Instant) -> Decision {
        let key = op.key();
        if self.in_flight.contains(&key) {
            self.deferred.insert(key);
            return Decision::AfterInFlight;
        }
        if let Some(&(_, retry_at)) = self.failures.get(&key)
            && now < retry_at
        {
            return Decision::WaitUntil(retry_at);
        }
        let content = op.content();
        if let Some((last, sent_at)) = self.recent.get(&key) {
            let settled_at = *sent_at + SETTLE_TIME;
            if *last == content && now < settled_at {
                return Decision::WaitUntil(settled_at);
            }
        }
        self.recent.insert(key.clone(), (content, now));
        self.in_flight.insert(key);
        Decision::Send
    }

    /// Records the end of a write. Returns whether the object's node wants
    /// another look right away, and (after a failure) when to retry.
    pub fn complete(&mut self, key: &WriteKey, ok: bool, now: Instant) -> (bool, Option<Instant>) {
        self.in_flight.remove(key);
        let deferred = self.deferred.remove(key);
        if ok {
            self.failures.remove(key);
            return (deferred, None);
        }
        // A failed write is no reason to hold back the same write later.
        self.recent.remove(key);
        let failures = self.failures.get(key).map_or(0, |(n, _)| *n) + 1;
        let delay = FIRST_RETRY
            .saturating_mul(2u32.saturating_pow(failures.saturating_sub(1).min(16)))
            .min(MAX_RETRY);
        let retry_at = now + delay;
        self.failures.insert(key.clone(), (failures, retry_at));
        (deferred, Some(retry_at))
    }

    /// Forgets writes old enough not to matter any more.
    pub fn prune(&mut self, now: Instant) {
        self.recent
            .retain(|_, (_, sent_at)| now < *sent_at + SETTLE_TIME);
        self.failures.retain(|key, (_, retry_at)| {
            self.in_flight.contains(key) || now < *retry_at + MAX_RETRY
        });
    }

    pub fn in_flight(&self) -> usize {
        self.in_flight.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn node_write(value: &str) -> WriteOp {
        WriteOp::NodeStatus {
            name: "n1".into(),
            patch: json!({"status": {"capacity": {"example.com/gpu": value}}}),
        }
    }

    #[test]
    fn repeats_wait_for_the_watch_but_changes_go_out() {
        let mut tracker = WriteTracker::default();
        let t0 = Instant::now();
        assert_eq!(tracker.decide(&node_write("4"), t0), Decision::Send);
        assert_eq!(
            tracker.decide(&node_write("4"), t0),
            Decision::AfterInFlight
        );
        assert_eq!(
            tracker.complete(&node_write("4").key(), true, t0),
            (true, None)
        );
        assert_eq!(tracker.in_flight(), 0);

        let later = t0 + Duration::from_secs(1);
        assert_eq!(
            tracker.decide(&node_write("4"), later),
            Decision::WaitUntil(t0 + SETTLE_TIME)
        );
        assert_eq!(tracker.decide(&node_write("0"), later), Decision::Send);
        tracker.complete(&node_write("0").key(), true, later);
        assert_eq!(
            tracker.decide(&node_write("0"), later + SETTLE_TIME),
            Decision::Send
        );
    }

    #[test]
    fn failures_back_off_exponentially() {
        let mut tracker = WriteTracker::default();
        let t0 = Instant::now();
        let key = node_write("4").key();
        let mut expected = Vec::new();
        let mut now = t0;
        for _ in 0..8 {
            assert_eq!(tracker.decide(&node_write("4"), now), Decision::Send);
            let (_, retry_at) = tracker.complete(&key, false, now);
            let retry_at = retry_at.unwrap();
            expected.push(retry_at - now);
            assert_eq!(
                tracker.decide(&node_write("4"), now),
                Decision::WaitUntil(retry_at)
            );
            now = retry_at;
        }
        assert_eq!(expected[0], Duration::from_millis(500));
        assert_eq!(expected[1], Duration::from_secs(1));
        assert_eq!(expected[2], Duration::from_secs(2));
        assert_eq!(*expected.last().unwrap(), MAX_RETRY);

        // Success resets the backoff.
        assert_eq!(tracker.decide(&node_write("4"), now), Decision::Send);
        tracker.complete(&key, true, now);
        assert_eq!(tracker.decide(&node_write("5"), now), Decision::Send);
        let (_, retry_at) = tracker.complete(&key, false, now);
        assert_eq!(retry_at, Some(now + FIRST_RETRY));
    }

    #[test]
    fn prune_forgets_settled_writes() {
        let mut tracker = WriteTracker::default();
        let t0 = Instant::now();
        tracker.decide(&node_write("4"), t0);
        tracker.complete(&node_write("4").key(), true, t0);
        tracker.prune(t0 + SETTLE_TIME);
        assert!(tracker.recent.is_empty());
        assert_eq!(
            tracker.decide(&node_write("4"), t0 + SETTLE_TIME),
            Decision::Send
        );
    }

    #[test]
    fn keys_and_descriptions() {
        let pod = WriteOp::PodStatus {
            namespace: "ns".into(),
            name: "p".into(),
            patch: json!({}),
        };
        assert_eq!(pod.key(), WriteKey::PodStatus("ns/p".into()));
        let delete = WriteOp::DeleteSlice { name: "s".into() };
        assert_eq!(delete.key(), WriteKey::Slice("s".into()));
        assert_eq!(delete.content(), Value::Null);
        assert!(node_write("4").describe().contains("example.com/gpu"));
    }
}
