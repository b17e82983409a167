//! The ResourceSlice a simulated DRA driver publishes for its node: one slice
//! per node and driver, whose pool generation moves on whenever a different
//! driver pod (a new UID) takes over publishing.

use std::collections::BTreeMap;

use jiff::Timestamp;
use k8s_openapi::api::resource::v1::{
    Device, DeviceAttribute, DeviceCapacity, ResourcePool, ResourceSlice, ResourceSliceSpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use serde_json::Value;

use super::agent::Timings;
use super::time::add;
use crate::{SLICE_NODE_LABEL, SLICE_PUBLISHER_ANNOTATION};

/// Device model attribute of every simulated device.
pub const DEVICE_MODEL: &str = "sim-gpu";
/// Memory capacity of every simulated device.
pub const DEVICE_MEMORY: &str = "80Gi";

/// The sim's record of one driver's pool on one node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DriverPool {
    /// Generation of the pool as last published.
    pub generation: i64,
    /// UID of the driver pod that published `generation`.
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

/// The newest running driver pod for the pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DriverPod<'a> {
    pub uid: &'a str,
    /// Devices it publishes now; `None` when it publishes no slice.
    pub devices: Option<u64>,
}

/// What should happen to the slice.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SliceTarget {
    /// Publish these contents.
    Publish {
        devices: u64,
        generation: i64,
        publisher: String,
    },
    /// Leave the slice as it is: its driver just stopped and the kubelet has
    /// not noticed yet.
    Keep,
    /// No slice.
    Absent,
}

/// Advances the pool record to `now` and says what to do with the slice and
/// when to look again.
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
    match driver.and_then(|d| d.devices.map(|devices| (d.uid, devices))) {
        Some((uid, devices)) => {
            if pool.publisher.as_deref() != Some(uid) {
                pool.generation += 1;
                pool.publisher = Some(uid.to_owned());
            }
            pool.stopped_since = None;
            let target = SliceTarget::Publish {
                devices,
                generation: pool.generation,
                publisher: uid.to_owned(),
            };
            (pool, target, None)
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

/// `<node>-<driver with dots replaced by dashes>`.
pub fn slice_name(node: &str, driver: &str) -> String {
    format!("{node}-{}", driver.replace('.', "-"))
}

/// Identifies the node a slice belongs to, for its owner reference.
#[derive(Clone, Copy, Debug)]
pub struct NodeRef<'a> {
    pub name: &'a str,
    pub uid: &'a str,
}

/// The full slice for a pool: `devices` devices `gpu-0..`, each with an
/// `index`, a `model` and 80Gi of `memory`; owned by the node so it goes
/// when the node does.
pub fn desired_slice(
    node: NodeRef<'_>,
    driver: &str,
    devices: u64,
    generation: i64,
    publisher: &str,
) -> ResourceSlice {
    let devices = (0..devices)
        .map(|index| Device {
            name: format!("gpu-{index}"),
            attributes: Some(BTreeMap::from([
                (
                    "index".to_owned(),
                    DeviceAttribute {
                        int: Some(i64::try_from(index).unwrap_or(i64::MAX)),
                        ..DeviceAttribute::default()
                    },
                ),
                (
                    "model".to_owned(),
                    DeviceAttribute {
                        string: Some(DEVICE_MODEL.to_owned()),
                        ..DeviceAttribute::default()
                    },
                ),
            ])),
            capacity: Some(BTreeMap::from([(
                "memory".to_owned(),
                DeviceCapacity {
                    value: Quantity(DEVICE_MEMORY.to_owned()),
                    ..DeviceCapacity::default()
                },
            )])),
            ..Device::default()
        })
        .collect();
    ResourceSlice {
        metadata: ObjectMeta {
            name: Some(slice_name(node.name, driver)),
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
        spec: ResourceSliceSpec {
            driver: driver.to_owned(),
            node_name: Some(node.name.to_owned()),
            pool: ResourcePool {
                name: node.name.to_owned(),
                generation,
                resource_slice_count: 1,
            },
            devices: Some(devices),
            ..ResourceSliceSpec::default()
        },
    }
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
            devices,
            generation,
            publisher: publisher.into(),
        }
    }

    fn pod(uid: &str, devices: Option<u64>) -> Option<DriverPod<'_>> {
        Some(DriverPod { uid, devices })
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
}
