//! Evidence newer than the change: a gate judges a node only on what was
//! written after the node's new agent pod became Ready, whatever its soak.
//! What a node shows a moment after its agent was replaced may still be what
//! the old agent advertised (the kubelet has not written the node's status
//! since, the driver has not published yet); judged then, a gate without soak
//! passed a plugin that advertised nothing (bench/results, "false pass"), and
//! one with a soak could do the same whenever nothing was written for longer
//! than the soak. Until fresh evidence is there, the node is not judged: the
//! gate waits (Pending, which is no pass) and says for what.
//!
//! The bound is the new pod's Ready condition's `lastTransitionTime`, written
//! by the node's kubelet. Times in the API have whole seconds, so "after"
//! means a later whole second: a status written in the same second as the
//! Ready may have been computed before it (12:00:00.3 and 12:00:00.7 both read
//! 12:00:00) and does not count; the next write, a second or more later, does.
//!
//! - The node's status (allocatable, and anything else read from the Node):
//!   the kubelet stamps every write of the node's status with the Ready
//!   condition's `lastHeartbeatTime` (`nodestatus.ReadyCondition` sets it to
//!   the time it computed the status), so a heartbeat after the Ready proves
//!   the status, allocatable included, was computed after it. Both times come
//!   from the same kubelet's clock. A kubelet computes the status every
//!   `nodeStatusUpdateFrequency` (10 s) and writes it when it changed (a
//!   plugin that registers, or whose devices change, changes allocatable;
//!   the device manager marks a departed plugin's devices unhealthy at once,
//!   so a replacement usually shows as 0 and back), and otherwise every
//!   `nodeStatusReportFrequency` (5 min by default; 2.5-7.5 min after a
//!   change, its jitter): a replacement that changed nothing the kubelet
//!   reports waits that long here.
//! - A driver's ResourceSlices: the API server records when a writer last
//!   changed a slice (its newest `managedFields[].time`; a created slice's
//!   creation). A pool counts once some slice of its newest generation was
//!   written after the driver pod's Ready: the driver's ResourceSlice
//!   controller writes only after comparing its whole pool with what is
//!   published, so one write proves the pool is what the new driver
//!   publishes. The slices name the Node as their owner (the kubelet-plugin
//!   helper's `Owner`), not the driver pod, so ownership says nothing of
//!   which instance published them. A pool the new driver finds unchanged is
//!   not written again (the helper keeps the generation and skips the
//!   update): such a node waits until the driver publishes again (a driver
//!   can ask for that at start by setting `Pool.Generation`). The write time
//!   is the API server's clock and the Ready the node's: a node clock ahead of
//!   the API server's makes a fresh publication look older (the gate waits
//!   longer), one behind lets a publication up to that skew before the Ready
//!   count.
//! - A driver that publishes no slice at all leaves nothing to date: a
//!   withdrawal is judged as seen (it can only fail a gate, never pass one)
//!   under the gate's soak.

use jiff::Timestamp;
use k8s_openapi::api::resource::v1::ResourceSlice;

use crate::views::{AgentPod, NodeView};

/// `written` is a later whole second than `ready` (both known).
pub fn written_after(written: Option<Timestamp>, ready: Option<Timestamp>) -> bool {
    match (written, ready) {
        (Some(w), Some(r)) => w.as_second() > r.as_second(),
        _ => false,
    }
}

/// The node's status was written after `pod` (its new agent) became Ready.
pub fn node_status_fresh(node: &NodeView, pod: &AgentPod) -> bool {
    written_after(node.status_written, pod.ready_since)
}

/// When a slice was last written: its newest managed-fields time (the API
/// server updates a writer's entry whenever the writer changes a value), or
/// its creation.
pub fn slice_written(slice: &ResourceSlice) -> Option<Timestamp> {
    let managed = slice
        .metadata
        .managed_fields
        .iter()
        .flatten()
        .filter_map(|m| m.time.as_ref().map(|t| t.0));
    let created = slice.metadata.creation_timestamp.as_ref().map(|t| t.0);
    managed.chain(created).max()
}

/// What a driver's slices on a node say of its publication since `ready`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Publication {
    /// No slice of the driver: nothing to date (judged as seen).
    Withdrawn,
    /// Some pool's newest generation was not written since the Ready: it may
    /// be what the old driver published.
    Stale,
    /// Every pool's newest generation was written after the Ready.
    Fresh,
}

/// Whether `driver`'s pools in `slices` were published after `ready` (the
/// driver pod's Ready; `None`: not known, so nothing is fresh).
pub fn publication(
    slices: &[&ResourceSlice],
    driver: &str,
    ready: Option<Timestamp>,
) -> Publication {
    let mut pools: std::collections::BTreeMap<&str, (i64, bool)> = Default::default();
    for s in slices.iter().filter(|s| s.spec.driver == driver) {
        let fresh = written_after(slice_written(s), ready);
        let generation = s.spec.pool.generation;
        let entry = pools
            .entry(s.spec.pool.name.as_str())
            .or_insert((generation, false));
        if generation > entry.0 {
            *entry = (generation, fresh);
        } else if generation == entry.0 {
            entry.1 |= fresh;
        }
    }
    if pools.is_empty() {
        Publication::Withdrawn
    } else if pools.values().all(|(_, fresh)| *fresh) {
        Publication::Fresh
    } else {
        Publication::Stale
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ManagedFieldsEntry, Time};
    use serde_json::json;

    use super::*;
    use crate::gates::test_support::ts;

    #[test]
    fn only_a_later_whole_second_is_after() {
        let ready = ts(100) + jiff::SignedDuration::from_millis(700);
        // Written in the Ready's second, before or after it: cannot tell, so no.
        assert!(!written_after(Some(ts(100)), Some(ready)));
        assert!(!written_after(
            Some(ts(100) + jiff::SignedDuration::from_millis(900)),
            Some(ready)
        ));
        assert!(!written_after(Some(ts(99)), Some(ready)));
        assert!(written_after(Some(ts(101)), Some(ready)));
        // As read back from the API, whole seconds on both sides.
        assert!(!written_after(Some(ts(100)), Some(ts(100))));
        assert!(written_after(Some(ts(101)), Some(ts(100))));
        // Unknown on either side: not fresh.
        assert!(!written_after(None, Some(ts(100))));
        assert!(!written_after(Some(ts(101)), None));
    }

    fn slice(pool: &str, generation: i64, written: i64) -> ResourceSlice {
        let mut s: ResourceSlice = serde_json::from_value(json!({
            "metadata": {"name": format!("{pool}-{generation}-{written}"),
                "creationTimestamp": Time(ts(0))},
            "spec": {"driver": "gpu.example.com", "nodeName": "n",
                "pool": {"name": pool, "generation": generation, "resourceSliceCount": 1}}
        }))
        .unwrap();
        s.metadata.managed_fields = Some(vec![ManagedFieldsEntry {
            time: Some(Time(ts(written))),
            ..Default::default()
        }]);
        s
    }

    #[test]
    fn a_pool_counts_once_its_newest_generation_was_written_after_the_ready() {
        let ready = Some(ts(100));
        let (old, new) = (slice("a", 3, 50), slice("a", 4, 101));
        let p = |slices: &[&ResourceSlice]| publication(slices, "gpu.example.com", ready);
        assert_eq!(p(&[]), Publication::Withdrawn);
        assert_eq!(p(&[&old]), Publication::Stale, "the old driver's");
        assert_eq!(
            p(&[&old, &new]),
            Publication::Fresh,
            "generation 4 is newer"
        );
        assert_eq!(
            p(&[&slice("a", 4, 100)]),
            Publication::Stale,
            "written in the Ready's second"
        );
        // One slice of the newest generation rewritten: the driver compared
        // the whole pool before writing it.
        assert_eq!(p(&[&slice("a", 4, 60), &new]), Publication::Fresh);
        // An older generation written later does not make the pool fresh.
        assert_eq!(
            p(&[&slice("a", 2, 120), &slice("a", 4, 60)]),
            Publication::Stale
        );
        // Every pool must be fresh.
        assert_eq!(p(&[&new, &slice("b", 1, 60)]), Publication::Stale);
        assert_eq!(p(&[&new, &slice("b", 1, 102)]), Publication::Fresh);
        // Another driver's slices are not this driver's.
        assert_eq!(
            publication(&[&new], "other.example.com", ready),
            Publication::Withdrawn
        );
        // The Ready unknown: nothing is fresh.
        assert_eq!(
            publication(&[&new], "gpu.example.com", None),
            Publication::Stale
        );
    }

    #[test]
    fn a_slice_was_written_at_its_newest_managed_fields_time_or_its_creation() {
        let mut s = slice("a", 1, 40);
        assert_eq!(slice_written(&s), Some(ts(40)));
        s.metadata.managed_fields = None;
        assert_eq!(slice_written(&s), Some(ts(0)), "its creation");
    }
}
