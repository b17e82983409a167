//! The ResourceSlices a simulated DRA driver publishes for its node: one pool
//! per node and driver (pool name = node name), whose generation moves on
//! whenever a different driver pod (a new UID) takes over publishing.
//!
//! A pool is one slice of devices (`<node>-<driver with dashes>`), more when
//! the devices do not fit in one (`...-1`, `...-2`), and, for partitionable
//! devices, slices of shared counters (`...-counters-0`, ...): the API allows
//! devices and counter sets only in separate slices.

use std::collections::{BTreeMap, BTreeSet};

use jiff::Timestamp;
use k8s_openapi::api::resource::v1::{
    Counter, CounterSet, Device, DeviceAttribute, DeviceCapacity, DeviceCounterConsumption,
    DeviceTaint, ResourcePool, ResourceSlice, ResourceSliceSpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use serde_json::Value;

use super::agent::Timings;
use super::time::add;
use crate::{SLICE_NODE_LABEL, SLICE_PUBLISHER_ANNOTATION};

/// Device model attribute of every simulated device.
pub const DEVICE_MODEL: &str = "sim-gpu";
/// Memory capacity of every simulated GPU, in MiB (80Gi).
pub const DEVICE_MEMORY_MIB: u64 = 80 * 1024;
/// Key of the health taint a driver puts on faulty devices.
pub const HEALTH_TAINT_KEY: &str = "gpu.sim.saferollout.dev/unhealthy";
/// Value of the health taint (the simulated XID error).
pub const HEALTH_TAINT_VALUE: &str = "xid-79";
/// Effect of the health taint.
pub const HEALTH_TAINT_EFFECT: &str = "NoSchedule";
/// Most devices a slice may hold (the API's limit, 64 once any device has
/// taints or consumes counters).
const MAX_DEVICES: usize = 128;
const MAX_DEVICES_WITH_ADVANCED_FEATURES: usize = 64;
/// Most counter sets a slice may hold.
const MAX_COUNTER_SETS: usize = 8;

/// The sim's record of one driver's pool on one node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DriverPool {
    /// Generation of the pool as last published.
    pub generation: i64,
    /// UID of the driver pod that published `generation`, or that withdrew
    /// the pool since (`-broken`): a pod that publishes after it, even one
    /// that published before (an older instance taking back), moves the
    /// generation on.
    pub publisher: Option<String>,
    /// Since when no driver pod publishes (the slice goes after the status
    /// delay); `None` while one does.
    pub stopped_since: Option<Timestamp>,
}

/// The pool as found in an existing slice: where the record starts from
/// after a restart of the sim.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PublishedPool<'a> {
    pub generation: i64,
    pub publisher: Option<&'a str>,
}

/// What a driver publishes in its pool.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PoolContent {
    /// Whole GPUs, `gpu-0` .. `gpu-<devices - 1>`.
    pub devices: u64,
    /// Partitions per GPU; below 2 the devices are not partitionable. With
    /// N >= 2 each GPU `gpu-i` has a counter set `gpu-i` holding its memory,
    /// the whole device consumes all of it, and N partition devices
    /// `gpu-i-part-j` consume 1/N each.
    pub partitions: u32,
    /// Multiplier of every capacity and counter (2 for `-overcount`).
    pub scale: u64,
    /// GPU indices whose devices carry the health taint.
    pub tainted: BTreeSet<u64>,
    /// Device names left out (`-dropclaims`: devices allocated to claims).
    pub withheld: BTreeSet<String>,
}

impl PoolContent {
    /// `devices` plain GPUs, nothing else.
    pub fn plain(devices: u64) -> Self {
        Self {
            devices,
            scale: 1,
            ..Self::default()
        }
    }

    /// Names of the devices published, in order.
    pub fn device_names(&self) -> Vec<String> {
        self.all_devices()
            .into_iter()
            .map(|d| d.name)
            .filter(|name| !self.withheld.contains(name))
            .collect()
    }

    fn partitioned(&self) -> bool {
        self.partitions >= 2
    }

    /// Every device before withholding.
    fn all_devices(&self) -> Vec<Device> {
        let memory_mib = DEVICE_MEMORY_MIB.saturating_mul(self.scale.max(1));
        let mut devices = Vec::new();
        for index in 0..self.devices {
            let taints = self.tainted.contains(&index).then(|| {
                vec![DeviceTaint {
                    key: HEALTH_TAINT_KEY.to_owned(),
                    value: Some(HEALTH_TAINT_VALUE.to_owned()),
                    effect: HEALTH_TAINT_EFFECT.to_owned(),
                    time_added: None,
                }]
            });
            let counter_set = format!("gpu-{index}");
            let consumes = |mib: u64| {
                Some(vec![DeviceCounterConsumption {
                    counter_set: counter_set.clone(),
                    counters: BTreeMap::from([("memory".to_owned(), counter(mib))]),
                    ..DeviceCounterConsumption::default()
                }])
            };
            devices.push(Device {
                name: format!("gpu-{index}"),
                attributes: Some(attributes(index, None)),
                capacity: Some(memory_capacity(memory_mib)),
                consumes_counters: if self.partitioned() {
                    consumes(memory_mib)
                } else {
                    None
                },
                taints: taints.clone(),
                ..Device::default()
            });
            if self.partitioned() {
                let part_mib = memory_mib / u64::from(self.partitions);
                for part in 0..self.partitions {
                    devices.push(Device {
                        name: format!("gpu-{index}-part-{part}"),
                        attributes: Some(attributes(index, Some(part))),
                        capacity: Some(memory_capacity(part_mib)),
                        consumes_counters: consumes(part_mib),
                        taints: taints.clone(),
                        ..Device::default()
                    });
                }
            }
        }
        devices
    }

    fn counter_sets(&self) -> Vec<CounterSet> {
        if !self.partitioned() {
            return Vec::new();
        }
        let memory_mib = DEVICE_MEMORY_MIB.saturating_mul(self.scale.max(1));
        (0..self.devices)
            .map(|index| CounterSet {
                name: format!("gpu-{index}"),
                counters: BTreeMap::from([("memory".to_owned(), counter(memory_mib))]),
            })
            .collect()
    }
}

fn counter(mib: u64) -> Counter {
    Counter {
        value: Quantity(mib_quantity(mib)),
    }
}

fn memory_capacity(mib: u64) -> BTreeMap<String, DeviceCapacity> {
    BTreeMap::from([(
        "memory".to_owned(),
        DeviceCapacity {
            value: Quantity(mib_quantity(mib)),
            ..DeviceCapacity::default()
        },
    )])
}

/// A MiB amount in the API server's canonical form (the largest binary
/// suffix that keeps it whole: `80Gi`, `27306Mi`), so that what the sim
/// writes is what it reads back and never looks changed.
fn mib_quantity(mib: u64) -> String {
    match mib {
        0 => "0".to_owned(),
        _ if mib.is_multiple_of(1024 * 1024) => format!("{}Ti", mib / (1024 * 1024)),
        _ if mib.is_multiple_of(1024) => format!("{}Gi", mib / 1024),
        _ => format!("{mib}Mi"),
    }
}

fn attributes(index: u64, partition: Option<u32>) -> BTreeMap<String, DeviceAttribute> {
    let int = |value: i64| DeviceAttribute {
        int: Some(value),
        ..DeviceAttribute::default()
    };
    let mut attributes = BTreeMap::from([
        (
            "index".to_owned(),
            int(i64::try_from(index).unwrap_or(i64::MAX)),
        ),
        (
            "model".to_owned(),
            DeviceAttribute {
                string: Some(DEVICE_MODEL.to_owned()),
                ..DeviceAttribute::default()
            },
        ),
    ]);
    if let Some(part) = partition {
        attributes.insert("partition".to_owned(), int(i64::from(part)));
    }
    attributes
}

/// The GPU index a device name stands for: `gpu-3` and `gpu-3-part-1` are 3.
pub fn gpu_index(device: &str) -> Option<u64> {
    let rest = device.strip_prefix("gpu-")?;
    let digits = rest.split('-').next()?;
    digits.parse().ok()
}

/// The driver pod that serves the pool: the newest running one, or of two
/// instances side by side the one the kubelet uses (see
/// `model::node`'s driver instances).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DriverPod<'a> {
    pub uid: &'a str,
    /// What it publishes now; `None` when it publishes no slice.
    pub content: Option<PoolContent>,
    /// Its container runs and talks to the kubelet (registered), whatever
    /// it publishes: the kubelet then keeps the pool's slices (it wipes
    /// them only once no driver is registered).
    pub registered: bool,
    /// When its first publication is written (`None`: it is not Ready, or
    /// never will be, and publishes as it runs). The sim writes a new driver
    /// pod's publication in the whole second after its pod became Ready
    /// (later by its report delay), so that a gate can tell it from the old
    /// driver's (API times keep whole seconds: written in the Ready's own
    /// second, it could not be told from one written before it).
    pub report_at: Option<Timestamp>,
}

impl DriverPod<'_> {
    /// When this pod's first publication is due, if not yet.
    fn first_publication_at(&self, now: Timestamp) -> Option<Timestamp> {
        self.report_at.filter(|at| now < *at)
    }
}

/// What should happen to the pool's slices.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SliceTarget {
    /// Publish these contents.
    Publish {
        content: PoolContent,
        generation: i64,
        publisher: String,
    },
    /// Leave the slices as they are: their driver just stopped and the
    /// kubelet has not noticed yet.
    Keep,
    /// No slices.
    Absent,
}

/// Advances the pool record to `now` and says what to do with the slices
/// and when to look again.
pub fn plan_pool(
    previous: Option<DriverPool>,
    published: Option<PublishedPool<'_>>,
    driver: Option<DriverPod<'_>>,
    now: Timestamp,
    timings: &Timings,
) -> (DriverPool, SliceTarget, Option<Timestamp>) {
    let mut pool = previous.unwrap_or_else(|| DriverPool {
        generation: published.map_or(0, |p| p.generation),
        publisher: published.and_then(|p| p.publisher.map(str::to_owned)),
        stopped_since: None,
    });
    let registered = driver.filter(|d| d.registered);
    // A new driver pod, registered: the kubelet keeps the old slices (no
    // wipe), and the new driver's publication (or withdrawal) comes once its
    // pod's Ready is behind it.
    if let Some(d) = &registered
        && pool.publisher.as_deref() != Some(d.uid)
        && let Some(at) = d.first_publication_at(now)
    {
        pool.stopped_since = None;
        return (pool, SliceTarget::Keep, Some(at));
    }
    match registered.map(|d| (d.uid, d.content)) {
        Some((uid, Some(content))) => {
            if pool.publisher.as_deref() != Some(uid) {
                pool.generation += 1;
                pool.publisher = Some(uid.to_owned());
            }
            pool.stopped_since = None;
            let target = SliceTarget::Publish {
                content,
                generation: pool.generation,
                publisher: uid.to_owned(),
            };
            (pool, target, None)
        }
        // Registered, publishing nothing (`-broken`): it withdraws the pool.
        // Whoever publishes next takes over from it, so the generation moves
        // on even when that is the pod that published before (an older
        // instance the kubelet falls back to).
        Some((uid, None)) => {
            pool.publisher = Some(uid.to_owned());
            pool.stopped_since = None;
            (pool, SliceTarget::Absent, None)
        }
        None => {
            let since = *pool.stopped_since.get_or_insert(now);
            let removed_at = add(since, timings.status_delay);
            if now >= removed_at {
                (pool, SliceTarget::Absent, None)
            } else {
                (pool, SliceTarget::Keep, Some(removed_at))
            }
        }
    }
}

/// `<node>-<driver with dots replaced by dashes>`: the pool's first slice;
/// the others carry suffixes.
pub fn slice_name(node: &str, driver: &str) -> String {
    format!("{node}-{}", driver.replace('.', "-"))
}

/// Whether `name` is one of the pool's slice names.
pub fn is_pool_slice_name(name: &str, node: &str, driver: &str) -> bool {
    let base = slice_name(node, driver);
    let Some(rest) = name.strip_prefix(base.as_str()) else {
        return false;
    };
    let numbered = |rest: &str| {
        rest.strip_prefix('-')
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
    };
    match rest.strip_prefix("-counters") {
        Some(counters) => numbered(counters),
        None => rest.is_empty() || numbered(rest),
    }
}

/// Identifies the node a slice belongs to, for its owner reference.
#[derive(Clone, Copy, Debug)]
pub struct NodeRef<'a> {
    pub name: &'a str,
    pub uid: &'a str,
}

/// The pool's slices: devices (at least one slice, maybe empty) then
/// counter sets; all owned by the node so they go when the node does.
pub fn desired_slices(
    node: NodeRef<'_>,
    driver: &str,
    content: &PoolContent,
    generation: i64,
    publisher: &str,
) -> Vec<ResourceSlice> {
    let devices: Vec<Device> = content
        .all_devices()
        .into_iter()
        .filter(|d| !content.withheld.contains(&d.name))
        .collect();
    let advanced = content.partitioned() || !content.tainted.is_empty();
    let per_slice = if advanced {
        MAX_DEVICES_WITH_ADVANCED_FEATURES
    } else {
        MAX_DEVICES
    };
    let mut device_chunks: Vec<Vec<Device>> =
        devices.chunks(per_slice).map(<[Device]>::to_vec).collect();
    if device_chunks.is_empty() {
        device_chunks.push(Vec::new());
    }
    let counter_sets = content.counter_sets();
    let counter_chunks: Vec<Vec<CounterSet>> = counter_sets
        .chunks(MAX_COUNTER_SETS)
        .map(<[CounterSet]>::to_vec)
        .collect();
    let count = i64::try_from(device_chunks.len() + counter_chunks.len()).unwrap_or(i64::MAX);
    let base = slice_name(node.name, driver);
    let pool = ResourcePool {
        name: node.name.to_owned(),
        generation,
        resource_slice_count: count,
    };
    let mut slices = Vec::new();
    for (k, chunk) in device_chunks.into_iter().enumerate() {
        let name = if k == 0 {
            base.clone()
        } else {
            format!("{base}-{k}")
        };
        let spec = ResourceSliceSpec {
            devices: Some(chunk),
            ..pool_spec(node, driver, &pool)
        };
        slices.push(slice(name, node, publisher, spec));
    }
    for (k, chunk) in counter_chunks.into_iter().enumerate() {
        let spec = ResourceSliceSpec {
            shared_counters: Some(chunk),
            ..pool_spec(node, driver, &pool)
        };
        slices.push(slice(format!("{base}-counters-{k}"), node, publisher, spec));
    }
    slices
}

fn pool_spec(node: NodeRef<'_>, driver: &str, pool: &ResourcePool) -> ResourceSliceSpec {
    ResourceSliceSpec {
        driver: driver.to_owned(),
        node_name: Some(node.name.to_owned()),
        pool: pool.clone(),
        ..ResourceSliceSpec::default()
    }
}

fn slice(
    name: String,
    node: NodeRef<'_>,
    publisher: &str,
    spec: ResourceSliceSpec,
) -> ResourceSlice {
    ResourceSlice {
        metadata: ObjectMeta {
            name: Some(name),
            labels: Some(BTreeMap::from([(
                SLICE_NODE_LABEL.to_owned(),
                node.name.to_owned(),
            )])),
            annotations: Some(BTreeMap::from([(
                SLICE_PUBLISHER_ANNOTATION.to_owned(),
                publisher.to_owned(),
            )])),
            owner_references: Some(vec![OwnerReference {
                api_version: "v1".into(),
                kind: "Node".into(),
                name: node.name.to_owned(),
                uid: node.uid.to_owned(),
                ..OwnerReference::default()
            }]),
            ..ObjectMeta::default()
        },
        spec,
    }
}

/// The one slice of a plain pool of `devices` GPUs.
pub fn desired_slice(
    node: NodeRef<'_>,
    driver: &str,
    devices: u64,
    generation: i64,
    publisher: &str,
) -> ResourceSlice {
    desired_slices(
        node,
        driver,
        &PoolContent::plain(devices),
        generation,
        publisher,
    )
    .remove(0)
}

/// Whether `current` lacks anything `desired` says: labels, annotations,
/// owner references and spec must hold what `desired` has; whatever else
/// the API server adds (defaults, other labels) does not count.
pub fn slice_differs(current: &ResourceSlice, desired: &ResourceSlice) -> bool {
    let view = |slice: &ResourceSlice| {
        serde_json::json!({
            "labels": slice.metadata.labels,
            "annotations": slice.metadata.annotations,
            "ownerReferences": slice.metadata.owner_references,
            "spec": slice.spec,
        })
    };
    !json_contains(&view(current), &view(desired))
}

/// Whether `outer` holds everything in `inner`: objects may have extra keys,
/// arrays must match item by item, nulls in `inner` match anything absent.
fn json_contains(outer: &Value, inner: &Value) -> bool {
    match (outer, inner) {
        (_, Value::Null) => true,
        (Value::Object(outer), Value::Object(inner)) => inner.iter().all(|(key, value)| {
            outer
                .get(key)
                .map_or(value.is_null(), |found| json_contains(found, value))
        }),
        (Value::Array(outer), Value::Array(inner)) => {
            outer.len() == inner.len() && outer.iter().zip(inner).all(|(o, i)| json_contains(o, i))
        }
        _ => outer == inner,
    }
}

/// The pool a slice holds, if the slice is one of the sim's.
pub fn published_pool(slice: &ResourceSlice) -> PublishedPool<'_> {
    PublishedPool {
        generation: slice.spec.pool.generation,
        publisher: slice
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(SLICE_PUBLISHER_ANNOTATION))
            .map(String::as_str),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn ts(second: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + second).unwrap()
    }

    fn publish(devices: u64, generation: i64, publisher: &str) -> SliceTarget {
        SliceTarget::Publish {
            content: PoolContent::plain(devices),
            generation,
            publisher: publisher.into(),
        }
    }

    /// A driver pod that publishes `devices` (registered) or, with `None`,
    /// does not run yet (not registered); Ready long ago.
    fn pod(uid: &str, devices: Option<u64>) -> Option<DriverPod<'_>> {
        Some(DriverPod {
            uid,
            content: devices.map(PoolContent::plain),
            registered: devices.is_some(),
            report_at: None,
        })
    }

    #[test]
    fn a_new_driver_publishes_in_the_second_after_its_pod_became_ready() {
        let timings = Timings::default();
        let (pool, _, _) = plan_pool(None, None, pod("a", Some(4)), ts(0), &timings);
        let ready = ts(10) + jiff::SignedDuration::from_millis(400);
        let new = |devices: Option<u64>| {
            Some(DriverPod {
                uid: "b",
                content: devices.map(PoolContent::plain),
                registered: true,
                report_at: Some(super::super::time::reported_after(ready)),
            })
        };
        // Until then the old driver's slices stay (the kubelet wipes none
        // while a driver is registered), whatever the status delay.
        let (pool, target, wake) = plan_pool(Some(pool), None, new(Some(4)), ready, &timings);
        assert_eq!((target, wake), (SliceTarget::Keep, Some(ts(11))));
        let (pool, target, _) = plan_pool(Some(pool), None, new(Some(4)), ts(11), &timings);
        assert_eq!(target, publish(4, 2, "b"));
        // A registered driver that publishes nothing withdraws the pool, at
        // the same moment.
        let (pool, target, wake) = plan_pool(Some(pool), None, None, ts(20), &timings);
        assert_eq!((target, wake), (SliceTarget::Keep, Some(ts(21))));
        let broken = Some(DriverPod {
            uid: "c",
            content: None,
            registered: true,
            report_at: Some(ts(21)),
        });
        let (pool, target, wake) = plan_pool(Some(pool), None, broken.clone(), ts(20), &timings);
        assert_eq!((target, wake), (SliceTarget::Keep, Some(ts(21))));
        let (_, target, _) = plan_pool(Some(pool), None, broken, ts(21), &timings);
        assert_eq!(target, SliceTarget::Absent);
    }

    #[test]
    fn a_pod_publishing_after_a_withdrawal_takes_over_even_when_it_published_before() {
        let timings = Timings::default();
        let (pool, _, _) = plan_pool(None, None, pod("old", Some(4)), ts(0), &timings);
        let broken = Some(DriverPod {
            uid: "new",
            content: None,
            registered: true,
            report_at: None,
        });
        let (pool, target, _) = plan_pool(Some(pool), None, broken, ts(5), &timings);
        assert_eq!(target, SliceTarget::Absent);
        assert_eq!(pool.publisher.as_deref(), Some("new"));
        // The older instance the kubelet falls back to publishes anew.
        let (pool, target, _) = plan_pool(Some(pool), None, pod("old", Some(4)), ts(6), &timings);
        assert_eq!(target, publish(4, 2, "old"));
        assert_eq!(pool.publisher.as_deref(), Some("old"));
    }

    #[test]
    fn first_publication_is_generation_one() {
        let timings = Timings::default();
        let (pool, target, wake) = plan_pool(None, None, pod("a", Some(4)), ts(0), &timings);
        assert_eq!(target, publish(4, 1, "a"));
        assert_eq!(wake, None);
        assert_eq!(pool.publisher.as_deref(), Some("a"));

        // Same pod, other device count (flapping): same generation.
        let (pool, target, _) = plan_pool(Some(pool), None, pod("a", Some(0)), ts(4), &timings);
        assert_eq!(target, publish(0, 1, "a"));
        assert_eq!(pool.generation, 1);
    }

    #[test]
    fn replacement_pod_bumps_the_generation() {
        let timings = Timings::default();
        let (pool, _, _) = plan_pool(None, None, pod("a", Some(4)), ts(0), &timings);
        // The old pod is gone: the slice is kept until the status delay passes.
        let (pool, target, wake) = plan_pool(Some(pool), None, None, ts(10), &timings);
        assert_eq!(target, SliceTarget::Keep);
        assert_eq!(wake, Some(ts(11)));
        let (pool, target, wake) = plan_pool(Some(pool), None, None, ts(11), &timings);
        assert_eq!(target, SliceTarget::Absent);
        assert_eq!(wake, None);
        // A new pod that does not publish yet (slow) does not bump anything.
        let (pool, target, _) = plan_pool(Some(pool), None, pod("b", None), ts(12), &timings);
        assert_eq!(target, SliceTarget::Absent);
        assert_eq!(pool.generation, 1);
        let (pool, target, _) = plan_pool(Some(pool), None, pod("b", Some(4)), ts(32), &timings);
        assert_eq!(target, publish(4, 2, "b"));
        assert_eq!(pool.stopped_since, None);
        // A pod swap before the slice was deleted bumps too.
        let (_, target, _) = plan_pool(Some(pool), None, pod("c", Some(4)), ts(33), &timings);
        assert_eq!(target, publish(4, 3, "c"));
    }

    #[test]
    fn restarted_sim_continues_from_the_published_slice() {
        let timings = Timings::default();
        let published = PublishedPool {
            generation: 7,
            publisher: Some("a"),
        };
        let (_, same, _) = plan_pool(None, Some(published), pod("a", Some(4)), ts(0), &timings);
        assert_eq!(same, publish(4, 7, "a"));
        let (_, replaced, _) = plan_pool(None, Some(published), pod("b", Some(4)), ts(0), &timings);
        assert_eq!(replaced, publish(4, 8, "b"));
    }

    #[test]
    fn status_delay_of_zero_removes_at_once() {
        let timings = Timings {
            status_delay: Duration::ZERO,
            ..Timings::default()
        };
        let (_, target, _) = plan_pool(None, None, pod("a", None), ts(0), &timings);
        assert_eq!(target, SliceTarget::Absent);
    }

    #[test]
    fn slice_follows_the_naming_and_device_conventions() {
        let node = NodeRef {
            name: "node-7",
            uid: "node-uid",
        };
        let slice = desired_slice(node, "gpu.sim.saferollout.dev", 2, 3, "pod-uid");
        assert_eq!(
            slice.metadata.name.as_deref(),
            Some("node-7-gpu-sim-saferollout-dev")
        );
        assert_eq!(
            slice.metadata.labels.as_ref().unwrap()[SLICE_NODE_LABEL],
            "node-7"
        );
        let owner = &slice.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.name.as_str(), owner.uid.as_str()),
            ("Node", "node-7", "node-uid")
        );
        assert_eq!(slice.spec.driver, "gpu.sim.saferollout.dev");
        assert_eq!(slice.spec.node_name.as_deref(), Some("node-7"));
        assert_eq!(
            slice.spec.pool,
            ResourcePool {
                name: "node-7".into(),
                generation: 3,
                resource_slice_count: 1
            }
        );
        let devices = slice.spec.devices.as_ref().unwrap();
        assert_eq!(
            devices.iter().map(|d| d.name.as_str()).collect::<Vec<_>>(),
            ["gpu-0", "gpu-1"]
        );
        let attributes = devices[1].attributes.as_ref().unwrap();
        assert_eq!(attributes["index"].int, Some(1));
        assert_eq!(attributes["model"].string.as_deref(), Some("sim-gpu"));
        assert_eq!(
            devices[1].capacity.as_ref().unwrap()["memory"].value,
            Quantity("80Gi".into())
        );
        assert_eq!(
            published_pool(&slice),
            PublishedPool {
                generation: 3,
                publisher: Some("pod-uid")
            }
        );

        // The API's ResourceSlice serialisation is what gets applied.
        let json = serde_json::to_value(&slice).unwrap();
        assert_eq!(json["apiVersion"], "resource.k8s.io/v1");
        assert_eq!(json["kind"], "ResourceSlice");
    }

    #[test]
    fn slice_differs_ignores_what_the_server_adds() {
        let node = NodeRef {
            name: "n",
            uid: "u",
        };
        let desired = desired_slice(node, "d", 2, 1, "p");
        let mut current = desired.clone();
        current.metadata.resource_version = Some("42".into());
        current
            .metadata
            .labels
            .as_mut()
            .unwrap()
            .insert("other".into(), "x".into());
        current.spec.devices.as_mut().unwrap()[0].allow_multiple_allocations = Some(false);
        assert!(!slice_differs(&current, &desired));

        assert!(slice_differs(
            &current,
            &desired_slice(node, "d", 3, 1, "p")
        ));
        assert!(slice_differs(
            &current,
            &desired_slice(node, "d", 2, 2, "p")
        ));
        assert!(slice_differs(
            &current,
            &desired_slice(node, "d", 2, 1, "q")
        ));
        assert!(slice_differs(
            &current,
            &desired_slice(
                NodeRef {
                    name: "n",
                    uid: "v"
                },
                "d",
                2,
                1,
                "p"
            )
        ));
        assert!(slice_differs(
            &desired_slice(node, "d", 3, 1, "p"),
            &desired
        ));
    }

    #[test]
    fn json_contains_semantics() {
        use serde_json::json;
        assert!(json_contains(&json!({"a": 1, "b": 2}), &json!({"a": 1})));
        assert!(!json_contains(&json!({"a": 1}), &json!({"a": 1, "b": 2})));
        assert!(json_contains(&json!({}), &json!({"a": null})));
        assert!(!json_contains(&json!([1, 2]), &json!([1])));
        assert!(json_contains(
            &json!([{"a": 1, "x": 0}]),
            &json!([{"a": 1}])
        ));
    }

    #[test]
    fn quantities_are_canonical() {
        assert_eq!(mib_quantity(81920), "80Gi");
        assert_eq!(mib_quantity(27306), "27306Mi");
        assert_eq!(mib_quantity(1024 * 1024), "1Ti");
        assert_eq!(mib_quantity(0), "0");
    }

    #[test]
    fn gpu_indices_and_pool_slice_names() {
        assert_eq!(gpu_index("gpu-3"), Some(3));
        assert_eq!(gpu_index("gpu-12-part-1"), Some(12));
        assert_eq!(gpu_index("nic-1"), None);
        assert_eq!(gpu_index("gpu-x"), None);
        for name in ["n-d-x", "n-d-x-1", "n-d-x-counters-0", "n-d-x-counters-12"] {
            assert!(is_pool_slice_name(name, "n", "d.x"), "{name}");
        }
        for name in [
            "n-d-x-",
            "n-d-x-a",
            "n-d-xy",
            "m-d-x",
            "n-d-x-counters",
            "n-d-x-counters-",
        ] {
            assert!(!is_pool_slice_name(name, "n", "d.x"), "{name}");
        }
    }

    fn node() -> NodeRef<'static> {
        NodeRef {
            name: "n",
            uid: "u",
        }
    }

    #[test]
    fn partitionable_pool_has_a_counter_slice_and_partition_devices() {
        let content = PoolContent {
            devices: 2,
            partitions: 2,
            scale: 1,
            ..PoolContent::default()
        };
        let slices = desired_slices(node(), "d.x", &content, 4, "p");
        assert_eq!(slices.len(), 2);
        for slice in &slices {
            assert_eq!(slice.spec.pool.resource_slice_count, 2);
            assert_eq!(slice.spec.pool.generation, 4);
            assert_eq!(slice.spec.node_name.as_deref(), Some("n"));
        }
        let devices = slices[0].spec.devices.as_ref().unwrap();
        assert!(slices[0].spec.shared_counters.is_none());
        assert_eq!(
            devices.iter().map(|d| d.name.as_str()).collect::<Vec<_>>(),
            [
                "gpu-0",
                "gpu-0-part-0",
                "gpu-0-part-1",
                "gpu-1",
                "gpu-1-part-0",
                "gpu-1-part-1"
            ]
        );
        let part = &devices[2];
        assert_eq!(part.capacity.as_ref().unwrap()["memory"].value.0, "40Gi");
        assert_eq!(part.attributes.as_ref().unwrap()["partition"].int, Some(1));
        let consumed = &part.consumes_counters.as_ref().unwrap()[0];
        assert_eq!(consumed.counter_set, "gpu-0");
        assert_eq!(consumed.counters["memory"].value.0, "40Gi");
        let whole = &devices[0].consumes_counters.as_ref().unwrap()[0];
        assert_eq!(whole.counters["memory"].value.0, "80Gi");

        assert_eq!(slices[1].metadata.name.as_deref(), Some("n-d-x-counters-0"));
        assert!(slices[1].spec.devices.is_none());
        let sets = slices[1].spec.shared_counters.as_ref().unwrap();
        assert_eq!(sets.len(), 2);
        assert_eq!(sets[1].name, "gpu-1");
        assert_eq!(sets[1].counters["memory"].value.0, "80Gi");
        assert_eq!(content.device_names().len(), 6);
    }

    #[test]
    fn overcount_scales_capacity_and_counters_and_pools_split_at_the_limits() {
        let content = PoolContent {
            devices: 24,
            partitions: 2,
            scale: 2,
            ..PoolContent::default()
        };
        let slices = desired_slices(node(), "d", &content, 1, "p");
        // 72 devices (64 per slice with counters) and 24 counter sets (8 per slice).
        let names: Vec<_> = slices
            .iter()
            .map(|s| s.metadata.name.clone().unwrap())
            .collect();
        assert_eq!(
            names,
            [
                "n-d",
                "n-d-1",
                "n-d-counters-0",
                "n-d-counters-1",
                "n-d-counters-2"
            ]
        );
        assert!(slices.iter().all(|s| s.spec.pool.resource_slice_count == 5));
        assert_eq!(slices[0].spec.devices.as_ref().unwrap().len(), 64);
        assert_eq!(slices[1].spec.devices.as_ref().unwrap().len(), 8);
        let gpu0 = &slices[0].spec.devices.as_ref().unwrap()[0];
        assert_eq!(gpu0.capacity.as_ref().unwrap()["memory"].value.0, "160Gi");
        assert_eq!(
            slices[2].spec.shared_counters.as_ref().unwrap()[0].counters["memory"]
                .value
                .0,
            "160Gi"
        );
    }

    #[test]
    fn taints_and_withheld_devices() {
        let content = PoolContent {
            devices: 3,
            partitions: 0,
            scale: 1,
            tainted: BTreeSet::from([1]),
            withheld: BTreeSet::from(["gpu-2".to_owned()]),
        };
        let slices = desired_slices(node(), "d", &content, 1, "p");
        assert_eq!(slices.len(), 1);
        let devices = slices[0].spec.devices.as_ref().unwrap();
        assert_eq!(
            devices.iter().map(|d| d.name.as_str()).collect::<Vec<_>>(),
            ["gpu-0", "gpu-1"]
        );
        assert!(devices[0].taints.is_none());
        let taint = &devices[1].taints.as_ref().unwrap()[0];
        assert_eq!(
            (
                taint.key.as_str(),
                taint.value.as_deref(),
                taint.effect.as_str()
            ),
            (HEALTH_TAINT_KEY, Some("xid-79"), "NoSchedule")
        );
        assert_eq!(content.device_names(), ["gpu-0", "gpu-1"]);
        // Nothing to publish still makes one (empty) slice.
        let empty = desired_slices(node(), "d", &PoolContent::plain(0), 1, "p");
        assert_eq!(empty.len(), 1);
        assert_eq!(empty[0].spec.devices.as_deref(), Some(&[][..]));
    }
}
