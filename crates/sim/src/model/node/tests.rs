//! Scenario tests of [`plan_node`]: a tiny in-memory "API server" applies
//! each plan, and the next plan is computed from what it holds, as the real
//! loop does with its watch caches.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, NodeAddress, NodeStatus, PodSpec};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    FieldsV1, ManagedFieldsEntry, ObjectMeta, Time,
};
use serde_json::json;

use super::*;

const NODE: &str = "node-1";

fn ts(second: i64) -> Timestamp {
    Timestamp::from_second(1_700_000_000 + second).unwrap()
}

fn agent_pod(name: &str, agent: &str, image: &str, created: i64) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("agents".into()),
            uid: Some(format!("uid-{name}")),
            creation_timestamp: Some(Time(ts(created))),
            labels: Some(BTreeMap::from([(AGENT_LABEL.into(), agent.into())])),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            node_name: Some(NODE.into()),
            containers: vec![Container {
                name: "agent".into(),
                image: Some(image.into()),
                ..Container::default()
            }],
            ..PodSpec::default()
        }),
        status: None,
    }
}

fn plugin(name: &str, image: &str, created: i64) -> Pod {
    agent_pod(name, "device-plugin", image, created)
}

fn driver(name: &str, image: &str, created: i64) -> Pod {
    agent_pod(name, "dra-driver", image, created)
}

fn node_facts(devices: u64) -> NodeFacts {
    NodeFacts {
        uid: "node-uid".into(),
        internal_ip: Some("192.168.0.10".into()),
        physical_devices: devices,
        faulty: BTreeSet::new(),
        capacity: BTreeMap::from([("cpu".into(), "1k".into())]),
        allocatable: BTreeMap::from([("cpu".into(), "1k".into())]),
        sim_owned: BTreeSet::new(),
        not_ready: false,
        // Most scenarios leave the node's conditions to KWOK; those of the
        // kubelet's heartbeat set one.
        has_ready_condition: false,
        status_written: None,
    }
}

/// The cluster as the sim's caches would show it, plus the sim's memory.
struct World {
    node: Option<NodeFacts>,
    pods: Vec<Pod>,
    workloads: Vec<Pod>,
    claims: Vec<ResourceClaim>,
    slices: Vec<ResourceSlice>,
    memory: NodeMemory,
    timings: Timings,
    slices_known: bool,
}

impl World {
    fn new(devices: u64, pods: Vec<Pod>) -> Self {
        Self {
            node: Some(node_facts(devices)),
            pods,
            workloads: Vec::new(),
            claims: Vec::new(),
            slices: Vec::new(),
            memory: NodeMemory::default(),
            // No health handover: its wakeups would mix into the timing
            // assertions of the advertisement scenarios (tests of the
            // handover set it).
            timings: Timings {
                health_handover: Duration::ZERO,
                ..Timings::default()
            },
            slices_known: true,
        }
    }

    fn plan(&mut self, at: i64) -> NodePlan {
        self.plan_at(ts(at))
    }

    fn plan_at(&mut self, now: Timestamp) -> NodePlan {
        let pods: Vec<&Pod> = self.pods.iter().collect();
        let workloads: Vec<&Pod> = self.workloads.iter().collect();
        let claims: Vec<&ResourceClaim> = self.claims.iter().collect();
        let slices: Vec<&ResourceSlice> = self.slices.iter().collect();
        let view = NodeView {
            name: NODE,
            node: self.node.as_ref(),
            pods: &pods,
            workloads: &workloads,
            claims: &claims,
            slices: &slices,
            slices_known: self.slices_known,
            claims_known: true,
        };
        plan_node(view, &mut self.memory, now, &self.timings)
    }

    /// Plans at `at`, applies the plan as the API server would, and checks
    /// that planning again right away wants nothing more.
    fn step(&mut self, at: i64) -> NodePlan {
        let plan = self.plan(at);
        self.apply(&plan);
        let again = self.plan(at);
        assert!(again.is_empty(), "plan not settled at {at}: {again:#?}");
        plan
    }

    fn apply(&mut self, plan: &NodePlan) {
        for update in &plan.pod_statuses {
            let pod = self
                .pods
                .iter_mut()
                .chain(self.workloads.iter_mut())
                .find(|p| p.metadata.uid.as_deref() == Some(&update.uid))
                .unwrap();
            // Round-trip through JSON: what the API server would store.
            let json = serde_json::to_string(&update.status).unwrap();
            pod.status = Some(serde_json::from_str(&json).unwrap());
        }
        if let Some(node) = &mut self.node {
            if let Some(beat) = plan.status_heartbeat {
                node.status_written = Some(beat);
            }
            for (resource, entries) in &plan.node_entries {
                for (map, value) in [
                    (&mut node.capacity, &entries.capacity),
                    (&mut node.allocatable, &entries.allocatable),
                ] {
                    match value {
                        Some(v) => map.insert(resource.clone(), v.clone()),
                        None => map.remove(resource),
                    };
                }
                if entries.capacity.is_some() || entries.allocatable.is_some() {
                    node.sim_owned.insert(resource.clone());
                } else {
                    node.sim_owned.remove(resource);
                }
            }
        }
        for slice in &plan.slice_applies {
            self.slices
                .retain(|s| s.metadata.name != slice.metadata.name);
            self.slices.push(slice.clone());
        }
        self.slices.retain(|s| {
            !plan
                .slice_deletes
                .contains(s.metadata.name.as_ref().unwrap())
        });
    }

    fn delete_pod(&mut self, name: &str) {
        self.pods
            .retain(|p| p.metadata.name.as_deref() != Some(name));
    }

    fn entries(&self, resource: &str) -> (Option<&str>, Option<&str>) {
        let node = self.node.as_ref().unwrap();
        (
            node.capacity.get(resource).map(String::as_str),
            node.allocatable.get(resource).map(String::as_str),
        )
    }

    fn pod_ready(&self, name: &str) -> bool {
        let pod = self
            .pods
            .iter()
            .find(|p| p.metadata.name.as_deref() == Some(name))
            .unwrap();
        pod.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
            .is_some_and(|c| c.status == "True")
    }

    /// The names of the devices in the first slice.
    fn device_names(&self) -> Vec<String> {
        self.slices[0]
            .spec
            .devices
            .iter()
            .flatten()
            .map(|d| d.name.clone())
            .collect()
    }

    fn slice_devices(&self) -> Option<(usize, i64)> {
        let slice = self.slices.first()?;
        Some((
            slice.spec.devices.as_ref().map_or(0, Vec::len),
            slice.spec.pool.generation,
        ))
    }
}

const GPU: &str = "example.com/gpu";

#[test]
fn healthy_plugin_advertises_physical_devices_once() {
    let mut world = World::new(4, vec![plugin("p1", "plugin:v1", 0)]);
    let plan = world.step(0);
    assert_eq!(plan.pod_statuses.len(), 1);
    assert_eq!(
        plan.pod_statuses[0].status.host_ip.as_deref(),
        Some("192.168.0.10")
    );
    assert_eq!(plan.next_change, None);
    assert!(world.pod_ready("p1"));
    assert_eq!(world.entries(GPU), (Some("4"), Some("4")));
    // Nothing to do later either: no churn.
    assert!(world.plan(100).is_empty());
    // The cpu entry written by someone else is untouched.
    assert_eq!(world.node.as_ref().unwrap().capacity["cpu"], "1k");
}

#[test]
fn removed_plugin_goes_through_status_delay_and_grace() {
    let mut world = World::new(4, vec![plugin("p1", "plugin:v1", 0)]);
    world.step(0);
    world.delete_pod("p1");

    let plan = world.step(10);
    assert!(
        plan.node_entries.is_empty(),
        "allocatable waits for the status update"
    );
    assert_eq!(plan.next_change, Some(ts(11)));

    let plan = world.step(11);
    assert_eq!(world.entries(GPU), (Some("4"), Some("0")));
    assert_eq!(plan.next_change, Some(ts(40)));

    world.step(39);
    assert_eq!(world.entries(GPU), (Some("4"), Some("0")));

    let plan = world.step(40);
    assert_eq!(world.entries(GPU), (None, None));
    assert_eq!(plan.next_change, None);
    assert!(world.memory.is_empty(), "{:?}", world.memory);
    assert!(world.plan(100).is_empty());
}

#[test]
fn replacement_plugin_restores_allocatable() {
    let mut world = World::new(4, vec![plugin("p1", "plugin:v1", 0)]);
    world.step(0);
    world.delete_pod("p1");
    world.step(10);
    world.step(11);
    assert_eq!(world.entries(GPU), (Some("4"), Some("0")));
    world.pods.push(plugin("p2", "plugin:v2", 12));
    world.step(12);
    assert_eq!(world.entries(GPU), (Some("4"), Some("4")));
    // The old stop no longer matters.
    assert!(world.plan(45).is_empty());
}

#[test]
fn quick_replacement_within_the_status_delay_shows_no_dip() {
    let mut world = World::new(4, vec![plugin("p1", "plugin:v1", 0)]);
    world.step(0);
    world.delete_pod("p1");
    world.step(10);
    world.pods.push(plugin("p2", "plugin:v2", 10));
    world.step(10);
    assert_eq!(world.entries(GPU), (Some("4"), Some("4")));
}

#[test]
fn broken_and_overcount_plugins() {
    let mut broken = World::new(4, vec![plugin("p1", "plugin:v1-broken", 0)]);
    broken.step(0);
    assert!(broken.pod_ready("p1"));
    assert_eq!(broken.entries(GPU), (Some("0"), Some("0")));

    let mut overcount = World::new(4, vec![plugin("p1", "plugin:v1-overcount", 0)]);
    overcount.step(0);
    assert_eq!(overcount.entries(GPU), (Some("8"), Some("8")));
}

#[test]
fn crashlooping_plugin_never_advertises_and_its_restarts_rise() {
    let mut world = World::new(4, vec![plugin("p1", "plugin:v1-crashloop", 0)]);
    let plan = world.step(0);
    assert!(plan.node_entries.is_empty());
    assert_eq!(plan.next_change, Some(ts(5)));
    assert!(!world.pod_ready("p1"));
    assert_eq!(world.entries(GPU), (None, None));

    // Nothing changes before the next restart...
    assert!(world.plan(4).is_empty());
    // ...which then shows in the status.
    let plan = world.step(5);
    assert_eq!(plan.pod_statuses.len(), 1);
    assert_eq!(
        plan.pod_statuses[0]
            .status
            .container_statuses
            .as_ref()
            .unwrap()[0]
            .restart_count,
        1
    );
}

#[test]
fn crashlooping_upgrade_of_a_healthy_plugin_stops_the_endpoint() {
    let mut world = World::new(4, vec![plugin("p1", "plugin:v1", 0)]);
    world.step(0);
    world.delete_pod("p1");
    world.pods.push(plugin("p2", "plugin:v2-crashloop", 20));
    world.step(20);
    world.step(21);
    assert_eq!(world.entries(GPU), (Some("4"), Some("0")));
    world.step(50);
    assert_eq!(world.entries(GPU), (None, None));
}

#[test]
fn unready_plugin_still_advertises() {
    let mut world = World::new(2, vec![plugin("p1", "plugin:v1-unready", 0)]);
    world.step(0);
    assert!(!world.pod_ready("p1"));
    assert_eq!(world.entries(GPU), (Some("2"), Some("2")));
}

#[test]
fn slow_plugin_advertises_after_the_delay() {
    let mut world = World::new(4, vec![plugin("p1", "plugin:v1-slow", 0)]);
    let plan = world.step(0);
    assert_eq!(plan.next_change, Some(ts(20)));
    assert!(!world.pod_ready("p1"));
    assert_eq!(world.entries(GPU), (None, None));
    world.step(20);
    assert!(world.pod_ready("p1"));
    assert_eq!(world.entries(GPU), (Some("4"), Some("4")));
}

#[test]
fn slow_delay_counts_from_the_first_start_even_before_start_time_lands() {
    let mut world = World::new(4, vec![plugin("p1", "plugin:v1-slow", 0)]);
    // The first status write is lost: the pod still has no startTime.
    let first = world.plan(0);
    assert_eq!(first.next_change, Some(ts(20)));
    let retry = world.plan(15);
    assert_eq!(retry.next_change, Some(ts(20)));
    assert_eq!(retry.pod_statuses[0].status.start_time, Some(Time(ts(0))));
}

#[test]
fn flapping_plugin_alternates() {
    let mut world = World::new(4, vec![plugin("p1", "plugin:v1-flap", 0)]);
    let plan = world.step(0);
    assert_eq!(plan.next_change, Some(ts(4)));
    assert_eq!(world.entries(GPU), (Some("4"), Some("4")));
    world.step(4);
    assert_eq!(world.entries(GPU), (Some("0"), Some("0")));
    assert!(world.pod_ready("p1"));
    world.step(8);
    assert_eq!(world.entries(GPU), (Some("4"), Some("4")));
}

#[test]
fn newest_non_deleting_plugin_wins() {
    let mut old = plugin("old", "plugin:v1", 0);
    let new = plugin("new", "plugin:v1-overcount", 5);
    let mut world = World::new(4, vec![old.clone(), new]);
    world.step(5);
    assert_eq!(world.entries(GPU), (Some("8"), Some("8")));

    // A deleting pod counts for nothing, and gets no status writes.
    old.metadata.name = Some("newer".into());
    old.metadata.uid = Some("uid-newer".into());
    old.metadata.creation_timestamp = Some(Time(ts(9)));
    old.metadata.deletion_timestamp = Some(Time(ts(9)));
    world.pods.push(old);
    let plan = world.step(9);
    assert!(plan.pod_statuses.is_empty());
    assert_eq!(world.entries(GPU), (Some("8"), Some("8")));
}

#[test]
fn resource_annotation_picks_the_resource() {
    let mut pod = plugin("p1", "plugin:v1", 0);
    pod.metadata.annotations = Some(BTreeMap::from([(
        RESOURCE_ANNOTATION.into(),
        "vendor.io/accel".into(),
    )]));
    let mut world = World::new(3, vec![pod, plugin("p2", "plugin:v1-broken", 0)]);
    world.step(0);
    assert_eq!(world.entries("vendor.io/accel"), (Some("3"), Some("3")));
    assert_eq!(world.entries(GPU), (Some("0"), Some("0")));
}

#[test]
fn missing_device_label_means_zero_devices() {
    let mut world = World::new(0, vec![plugin("p1", "plugin:v1", 0)]);
    world.step(0);
    assert_eq!(world.entries(GPU), (Some("0"), Some("0")));
}

#[test]
fn device_count_change_is_followed() {
    let mut world = World::new(4, vec![plugin("p1", "plugin:v1", 0)]);
    world.step(0);
    world.node.as_mut().unwrap().physical_devices = 6;
    world.step(1);
    assert_eq!(world.entries(GPU), (Some("6"), Some("6")));
}

#[test]
fn nodes_without_agents_are_not_touched() {
    let mut world = World::new(4, vec![]);
    let mut foreign = node_facts(4);
    // Someone else's extended resource, even one with the default name.
    foreign.capacity.insert(GPU.into(), "4".into());
    world.node = Some(foreign);
    assert!(world.plan(0).is_empty());
    assert!(world.memory.is_empty());
}

#[test]
fn leftover_advertisement_is_retired_after_a_sim_restart() {
    let mut world = World::new(4, vec![]);
    let node = world.node.as_mut().unwrap();
    node.capacity.insert(GPU.into(), "4".into());
    node.allocatable.insert(GPU.into(), "4".into());
    node.sim_owned.insert(GPU.into());
    world.step(0);
    world.step(1);
    assert_eq!(world.entries(GPU), (Some("4"), Some("0")));
    world.step(30);
    assert_eq!(world.entries(GPU), (None, None));
}

#[test]
fn leftover_allocatable_only_entry_is_retired_too() {
    let mut world = World::new(4, vec![]);
    let node = world.node.as_mut().unwrap();
    node.allocatable.insert(GPU.into(), "2".into());
    node.sim_owned.insert(GPU.into());
    // Capacity is filled in from the count until the grace period ends.
    world.step(0);
    assert_eq!(world.entries(GPU), (Some("2"), Some("2")));
    world.step(30);
    assert_eq!(world.entries(GPU), (None, None));
}

#[test]
fn unknown_agent_kind_gets_a_status_but_advertises_nothing() {
    let mut world = World::new(4, vec![agent_pod("x", "something-else", "x:v1", 0)]);
    let plan = world.step(0);
    assert_eq!(plan.pod_statuses.len(), 1);
    assert!(plan.node_entries.is_empty() && plan.slice_applies.is_empty());
}

#[test]
fn pods_on_a_missing_node_get_statuses_only() {
    let mut world = World::new(
        4,
        vec![plugin("p1", "plugin:v1", 0), driver("d1", "driver:v1", 0)],
    );
    world.node = None;
    world.memory.endpoints.insert(
        GPU.into(),
        Endpoint::Registered {
            devices: 4,
            unhealthy: 0,
        },
    );
    let plan = world.plan(0);
    assert_eq!(plan.pod_statuses.len(), 2);
    assert!(
        plan.pod_statuses[0]
            .status
            .host_ip
            .as_deref()
            .unwrap()
            .starts_with("10.0.")
    );
    assert!(plan.node_entries.is_empty() && plan.slice_applies.is_empty());
    assert!(world.memory.endpoints.is_empty() && world.memory.pools.is_empty());
}

#[test]
fn pods_bound_elsewhere_are_ignored() {
    let mut elsewhere = plugin("p1", "plugin:v1", 0);
    elsewhere.spec.as_mut().unwrap().node_name = Some("node-2".into());
    let mut world = World::new(4, vec![elsewhere]);
    assert!(world.plan(0).is_empty());
}

#[test]
fn dra_driver_publishes_one_slice_and_bumps_generation_on_pod_change() {
    let mut world = World::new(2, vec![driver("d1", "driver:v1", 0)]);
    // Ready at 0, published in the next second (after the Ready).
    let plan = world.step(0);
    assert!(plan.slice_applies.is_empty());
    assert_eq!(plan.next_change, Some(ts(1)));
    let plan = world.step(1);
    assert_eq!(plan.slice_applies.len(), 1);
    assert_eq!(
        plan.slice_applies[0].metadata.name.as_deref(),
        Some("node-1-gpu-sim-saferollout-dev")
    );
    assert_eq!(world.slice_devices(), Some((2, 1)));

    // Restart of the driver pod: the slice lingers for the status delay.
    world.delete_pod("d1");
    let plan = world.step(5);
    assert!(plan.slice_deletes.is_empty());
    assert_eq!(plan.next_change, Some(ts(6)));
    let plan = world.step(6);
    assert_eq!(plan.slice_deletes, ["node-1-gpu-sim-saferollout-dev"]);
    assert_eq!(world.slice_devices(), None);

    world.pods.push(driver("d2", "driver:v2", 7));
    world.step(7);
    world.step(8);
    assert_eq!(world.slice_devices(), Some((2, 2)));
}

#[test]
fn dra_faults() {
    let mut broken = World::new(2, vec![driver("d1", "driver:v1-broken", 0)]);
    let plan = broken.step(0);
    assert!(plan.slice_applies.is_empty());
    assert_eq!(broken.slice_devices(), None);

    let mut overcount = World::new(2, vec![driver("d1", "driver:v1-overcount", 0)]);
    overcount.step(0);
    overcount.step(1);
    assert_eq!(overcount.slice_devices(), Some((4, 1)));

    // Never Ready: nothing to publish after.
    let mut unready = World::new(2, vec![driver("d1", "driver:v1-unready", 0)]);
    unready.step(0);
    assert_eq!(unready.slice_devices(), Some((2, 1)));

    let mut slow = World::new(2, vec![driver("d1", "driver:v1-slow", 0)]);
    slow.step(0);
    assert_eq!(slow.slice_devices(), None);
    slow.step(20);
    assert_eq!(slow.slice_devices(), None);
    slow.step(21);
    assert_eq!(slow.slice_devices(), Some((2, 1)));

    let mut flap = World::new(2, vec![driver("d1", "driver:v1-flap", 0)]);
    flap.step(0);
    flap.step(1);
    assert_eq!(flap.slice_devices(), Some((2, 1)));
    flap.step(4);
    assert_eq!(flap.slice_devices(), Some((0, 1)));
    flap.step(8);
    assert_eq!(flap.slice_devices(), Some((2, 1)));

    let mut crashloop = World::new(2, vec![driver("d1", "driver:v1-crashloop", 0)]);
    crashloop.step(0);
    assert_eq!(crashloop.slice_devices(), None);
}

#[test]
fn broken_upgrade_of_a_driver_deletes_its_slice() {
    let mut world = World::new(2, vec![driver("d1", "driver:v1", 0)]);
    world.step(0);
    world.step(1);
    world.delete_pod("d1");
    world.pods.push(driver("d2", "driver:v2-broken", 3));
    world.step(3);
    assert_eq!(world.slice_devices(), Some((2, 1)));
    world.step(4);
    assert_eq!(world.slice_devices(), None);
}

#[test]
fn driver_annotation_picks_the_driver_and_sim_restart_keeps_generation() {
    let mut pod = driver("d1", "driver:v1", 0);
    pod.metadata.annotations = Some(BTreeMap::from([(
        DRIVER_ANNOTATION.into(),
        "accel.example.com".into(),
    )]));
    let mut world = World::new(1, vec![pod]);
    world.step(0);
    world.step(1);
    let slice = world.slices[0].clone();
    assert_eq!(
        slice.metadata.name.as_deref(),
        Some("node-1-accel-example-com")
    );
    assert_eq!(slice.spec.driver, "accel.example.com");

    // A restarted sim has no memory but finds the slice: nothing to do.
    world.memory = NodeMemory::default();
    assert!(world.plan(50).is_empty());
}

#[test]
fn stray_labelled_slices_are_left_alone() {
    let mut world = World::new(2, vec![]);
    let mut stray = crate::model::slice::desired_slice(
        NodeRef {
            name: NODE,
            uid: "node-uid",
        },
        "x.y",
        1,
        1,
        "p",
    );
    stray.metadata.name = Some("something-else".into());
    world.slices.push(stray);
    assert!(world.plan(0).is_empty());
}

#[test]
fn pod_status_uses_sub_second_clock_without_churn() {
    let mut world = World::new(1, vec![plugin("p1", "plugin:v1", 0)]);
    let now = ts(3).checked_add(Duration::from_millis(700)).unwrap();
    let plan = world.plan_at(now);
    world.apply(&plan);
    assert!(world.plan_at(now).is_empty());
    assert!(world.plan(4).is_empty());
}

#[test]
fn node_facts_from_a_node() {
    let node = Node {
        metadata: ObjectMeta {
            name: Some(NODE.into()),
            uid: Some("node-uid".into()),
            labels: Some(BTreeMap::from([(DEVICES_LABEL.into(), "8".into())])),
            managed_fields: Some(vec![
                ManagedFieldsEntry {
                    manager: Some(FIELD_MANAGER.into()),
                    operation: Some("Update".into()),
                    subresource: Some("status".into()),
                    fields_v1: Some(FieldsV1(json!({
                        "f:status": {
                            "f:allocatable": {"f:example.com/gpu": {}},
                            "f:capacity": {"f:example.com/gpu": {}, "f:vendor.io/x": {}}
                        }
                    }))),
                    ..ManagedFieldsEntry::default()
                },
                ManagedFieldsEntry {
                    manager: Some("kwok".into()),
                    fields_v1: Some(FieldsV1(json!({
                        "f:status": {"f:capacity": {"f:cpu": {}}}
                    }))),
                    ..ManagedFieldsEntry::default()
                },
            ]),
            ..ObjectMeta::default()
        },
        spec: None,
        status: Some(NodeStatus {
            addresses: Some(vec![
                NodeAddress {
                    type_: "Hostname".into(),
                    address: NODE.into(),
                },
                NodeAddress {
                    type_: "InternalIP".into(),
                    address: "10.9.8.7".into(),
                },
            ]),
            capacity: Some(BTreeMap::from([("cpu".into(), Quantity("1k".into()))])),
            ..NodeStatus::default()
        }),
    };
    let facts = NodeFacts::from_node(&node);
    assert_eq!(facts.uid, "node-uid");
    assert_eq!(facts.internal_ip.as_deref(), Some("10.9.8.7"));
    assert_eq!(facts.physical_devices, 8);
    assert_eq!(facts.capacity["cpu"], "1k");
    assert!(facts.allocatable.is_empty());
    assert_eq!(
        facts.sim_owned,
        BTreeSet::from(["example.com/gpu".to_owned(), "vendor.io/x".to_owned()])
    );

    for bad in ["", "x", "-1", "1.5"] {
        let mut unlabelled = node.clone();
        unlabelled.metadata.labels = Some(BTreeMap::from([(DEVICES_LABEL.into(), bad.into())]));
        assert_eq!(
            NodeFacts::from_node(&unlabelled).physical_devices,
            0,
            "{bad:?}"
        );
    }
    let bare = NodeFacts::from_node(&Node::default());
    assert_eq!((bare.physical_devices, bare.internal_ip), (0, None));
}

#[test]
fn dra_waits_until_slices_are_known() {
    let mut world = World::new(
        2,
        vec![driver("d1", "driver:v1", 0), plugin("p1", "plugin:v1", 0)],
    );
    world.slices_known = false;
    let plan = world.plan(0);
    assert_eq!(plan.pod_statuses.len(), 2);
    assert_eq!(plan.node_entries.len(), 1);
    assert!(plan.slice_applies.is_empty());
    assert!(world.memory.pools.is_empty());
}

// --- workload pods, device health, taints, dropped claims, metrics -------

fn workload(name: &str, restart: &str, gpus: Option<u64>, claim: Option<&str>) -> Pod {
    let mut pod = agent_pod(name, "unused", "cuda:1", 10);
    pod.metadata.labels = Some(BTreeMap::from([(
        crate::WORKLOAD_LABEL.into(),
        "probe".into(),
    )]));
    let spec = pod.spec.as_mut().unwrap();
    spec.restart_policy = Some(restart.into());
    let container = &mut spec.containers[0];
    container.name = "work".into();
    let mut resources = k8s_openapi::api::core::v1::ResourceRequirements::default();
    if let Some(gpus) = gpus {
        resources.limits = Some(BTreeMap::from([(GPU.into(), Quantity(gpus.to_string()))]));
    }
    if let Some(claim) = claim {
        resources.claims = Some(vec![k8s_openapi::api::core::v1::ResourceClaim {
            name: "gpu".into(),
            ..Default::default()
        }]);
        spec.resource_claims = Some(vec![k8s_openapi::api::core::v1::PodResourceClaim {
            name: "gpu".into(),
            resource_claim_name: Some(claim.into()),
            ..Default::default()
        }]);
    }
    container.resources = Some(resources);
    pod
}

fn allocated_claim(name: &str, device: &str) -> ResourceClaim {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "agents"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "c"}}]}},
        "status": {"allocation": {"devices": {"results": [
            {"request": "gpu", "driver": DEFAULT_DRIVER, "pool": NODE, "device": device}
        ]}}}
    }))
    .unwrap()
}

impl World {
    fn workload_status(&self, name: &str) -> &PodStatus {
        self.workloads
            .iter()
            .find(|p| p.metadata.name.as_deref() == Some(name))
            .and_then(|p| p.status.as_ref())
            .unwrap_or_else(|| panic!("no status for {name}"))
    }

    fn health(&self, name: &str) -> Vec<(String, String, String)> {
        self.workload_status(name)
            .container_statuses
            .iter()
            .flatten()
            .flat_map(|c| c.allocated_resources_status.iter().flatten())
            .flat_map(|r| {
                r.resources.iter().flatten().map(|h| {
                    (
                        r.name.clone(),
                        h.resource_id.clone(),
                        h.health.clone().unwrap_or_default(),
                    )
                })
            })
            .collect()
    }

    fn phase(&self, name: &str) -> &str {
        self.workload_status(name).phase.as_deref().unwrap_or("")
    }

    fn gpu_healthy(&mut self, at: i64) -> Vec<bool> {
        let plan = self.plan(at);
        plan.gpus.unwrap().iter().map(|g| g.healthy).collect()
    }
}

fn health_of(entries: &[(&str, &str, &str)]) -> Vec<(String, String, String)> {
    entries
        .iter()
        .map(|(a, b, c)| ((*a).into(), (*b).into(), (*c).into()))
        .collect()
}

#[test]
fn probe_runs_then_succeeds_and_long_runner_reports_health() {
    let mut world = World::new(4, vec![plugin("p1", "plugin:v1", 0)]);
    world.workloads = vec![
        workload("probe", "Never", Some(1), None),
        workload("trainer", "Always", Some(2), None),
    ];
    world.step(20);
    assert_eq!(world.phase("probe"), "Running");
    // Devices are handed out lowest first and not shared.
    assert_eq!(
        world.health("probe"),
        health_of(&[(GPU, "gpu-0", "Healthy")])
    );
    assert_eq!(
        world.health("trainer"),
        health_of(&[(GPU, "gpu-1", "Healthy"), (GPU, "gpu-2", "Healthy")])
    );
    let plan = world.step(21);
    assert_eq!(world.phase("probe"), "Succeeded");
    assert_eq!(world.phase("trainer"), "Running");
    let logs = plan.logs.iter().find(|l| l.name == "probe").unwrap();
    assert!(logs.containers["work"].contains("Test PASSED"), "{logs:?}");
    // Ended pods are never written again.
    assert!(
        world
            .plan(100)
            .pod_statuses
            .iter()
            .all(|u| u.name != "probe")
    );

    // An -unhealthy release: Unhealthy; allocatable 0, capacity kept.
    world.pods = vec![plugin("p2", "plugin:v2-unhealthy", 30)];
    world.step(30);
    assert_eq!(
        world.health("trainer"),
        health_of(&[(GPU, "gpu-1", "Unhealthy"), (GPU, "gpu-2", "Unhealthy")])
    );
    assert_eq!(world.entries(GPU), (Some("4"), Some("0")));
    // The agent goes: Unknown for the handover window, then Unhealthy.
    world.timings.health_handover = Duration::from_secs(5);
    world.pods.clear();
    world.step(40);
    assert!(
        world
            .health("trainer")
            .iter()
            .all(|(_, _, h)| h == "Unknown")
    );
    world.step(45);
    assert!(
        world
            .health("trainer")
            .iter()
            .all(|(_, _, h)| h == "Unhealthy")
    );
    assert_eq!(world.phase("trainer"), "Running");
}

#[test]
fn a_restarted_sim_keeps_device_assignments_from_the_statuses() {
    let mut world = World::new(4, vec![plugin("p1", "plugin:v1", 0)]);
    world.workloads = vec![workload("trainer", "Always", Some(1), None)];
    world.step(5);
    assert_eq!(
        world.health("trainer"),
        health_of(&[(GPU, "gpu-0", "Healthy")])
    );
    // The sim restarts (memory gone, statuses remain) and meets a pod it
    // has not started, older than "trainer", so handed devices first: it
    // must not get the gpu-0 that "trainer"'s status says it holds.
    world.memory = NodeMemory::default();
    let mut older = workload("older", "Always", Some(1), None);
    older.metadata.creation_timestamp = Some(Time(ts(1)));
    world.workloads.push(older);
    world.step(7);
    assert_eq!(
        world.health("trainer"),
        health_of(&[(GPU, "gpu-0", "Healthy")])
    );
    assert_eq!(
        world.health("older"),
        health_of(&[(GPU, "gpu-1", "Healthy")])
    );
}

#[test]
fn probe_on_faulty_hardware_fails_even_under_a_laundering_plugin() {
    let mut world = World::new(2, vec![plugin("p1", "plugin:v1-cleartaints", 0)]);
    world.node.as_mut().unwrap().faulty = BTreeSet::from([0, 1]);
    world.workloads = vec![workload("probe", "OnFailure", Some(1), None)];
    world.step(10);
    assert_eq!(world.entries(GPU), (Some("2"), Some("2")));
    assert_eq!(
        world.health("probe"),
        health_of(&[(GPU, "gpu-0", "Healthy")])
    );
    world.step(12);
    assert_eq!(world.phase("probe"), "Failed");
    let terminated = world
        .workload_status("probe")
        .container_statuses
        .as_ref()
        .unwrap()[0]
        .state
        .as_ref()
        .unwrap()
        .terminated
        .clone()
        .unwrap();
    assert_eq!(terminated.exit_code, 1);
    assert!(terminated.message.unwrap().contains("hardware fault"));

    // A healthy plugin counts the faulty GPUs out and reports them Unhealthy.
    let mut honest = World::new(4, vec![plugin("p1", "plugin:v1", 0)]);
    honest.node.as_mut().unwrap().faulty = BTreeSet::from([0]);
    honest.workloads = vec![workload("probe", "Never", Some(1), None)];
    honest.step(10);
    assert_eq!(honest.entries(GPU), (Some("4"), Some("3")));
    // ... and never hands them out.
    assert_eq!(
        honest.health("probe"),
        health_of(&[(GPU, "gpu-1", "Healthy")])
    );
}

#[test]
fn drivers_taint_faulty_devices_unless_they_launder_them() {
    let mut world = World::new(4, vec![driver("d1", "driver:v1", 0)]);
    world.node.as_mut().unwrap().faulty = BTreeSet::from([2]);
    world.step(0);
    world.step(1);
    let tainted = |world: &World| -> Vec<String> {
        world.slices[0]
            .spec
            .devices
            .iter()
            .flatten()
            .filter(|d| d.taints.is_some())
            .map(|d| d.name.clone())
            .collect()
    };
    assert_eq!(tainted(&world), ["gpu-2"]);
    // Each replacement publishes in the second after its Ready.
    world.pods = vec![driver("d2", "driver:v2-cleartaints", 5)];
    world.step(5);
    assert_eq!(tainted(&world), ["gpu-2"], "still the old driver's");
    world.step(6);
    assert!(tainted(&world).is_empty());
    world.pods = vec![driver("d3", "driver:v3-taint", 7)];
    world.step(7);
    world.step(8);
    assert_eq!(tainted(&world), ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]);
    world.pods = vec![driver("d4", "driver:v4-fewer", 9)];
    world.step(9);
    world.step(10);
    assert_eq!(world.slice_devices(), Some((2, 4)));
}

#[test]
fn partitioned_driver_publishes_a_complete_two_slice_pool() {
    let mut pod = driver("d1", "driver:v1", 0);
    pod.metadata.annotations = Some(BTreeMap::from([(
        crate::PARTITIONS_ANNOTATION.into(),
        "2".into(),
    )]));
    let mut world = World::new(2, vec![pod]);
    world.step(0);
    world.step(1);
    assert_eq!(world.slices.len(), 2);
    assert!(
        world
            .slices
            .iter()
            .all(|s| s.spec.pool.resource_slice_count == 2)
    );
    // The driver goes: every slice of the pool is withdrawn.
    world.pods.clear();
    world.step(2);
    world.step(3);
    assert!(world.slices.is_empty());
}

#[test]
fn workloads_wait_for_their_claims_to_be_allocated() {
    let mut world = World::new(4, vec![driver("d1", "driver:v1", 0)]);
    world.workloads = vec![workload("probe", "Never", None, Some("c1"))];
    // Unknown claim, then a claim not allocated yet: the pod does not start.
    let plan = world.step(5);
    assert!(
        plan.pod_statuses.iter().all(|u| u.name != "probe"),
        "{plan:#?}"
    );
    let mut pending = allocated_claim("c1", "gpu-0");
    pending.status = None;
    world.claims = vec![pending];
    world.step(6);
    assert!(world.workloads[0].status.is_none());
    // Allocated: it starts then, and runs its full time.
    world.claims = vec![allocated_claim("c1", "gpu-0")];
    world.step(7);
    assert_eq!(world.phase("probe"), "Running");
    assert_eq!(world.workload_status("probe").start_time, Some(Time(ts(7))));
    world.step(8);
    assert_eq!(world.phase("probe"), "Succeeded");
    assert_eq!(referenced_claims(&world.workloads[0]), ["c1"]);
}

#[test]
fn dra_workloads_report_claim_health_and_dropped_claims_fail_their_pods() {
    let mut world = World::new(4, vec![driver("d1", "driver:v1", 0)]);
    world.claims = vec![allocated_claim("c1", "gpu-1")];
    world.workloads = vec![workload("trainer", "Always", None, Some("c1"))];
    world.step(5);
    let id = format!("{DEFAULT_DRIVER}/{NODE}/gpu-1");
    assert_eq!(
        world.health("trainer"),
        health_of(&[("claim:gpu", &id, "Healthy")])
    );

    world.pods = vec![driver("d2", "driver:v2-unhealthy", 6)];
    world.step(6);
    assert_eq!(
        world.health("trainer"),
        health_of(&[("claim:gpu", &id, "Unhealthy")])
    );
    let message = world
        .workload_status("trainer")
        .container_statuses
        .as_ref()
        .unwrap()[0]
        .allocated_resources_status
        .as_ref()
        .unwrap()[0]
        .resources
        .as_ref()
        .unwrap()[0]
        .message
        .clone();
    assert_eq!(
        message.as_deref(),
        Some("XID 79: GPU has fallen off the bus")
    );
    assert_eq!(world.phase("trainer"), "Running");

    world.pods = vec![driver("d3", "driver:v3-dropclaims", 7)];
    world.step(7);
    world.step(8);
    assert_eq!(world.device_names(), ["gpu-0", "gpu-2", "gpu-3"]);
    assert_eq!(world.phase("trainer"), "Failed");
    // Planned again a second later (before the ended status is seen), the
    // pod ends at the same time, with the same log: the sim holds an ended
    // status back until its log is published, so a log that moved with the
    // clock would hold it back forever.
    let mut again = World::new(4, vec![driver("d1", "driver:v1-dropclaims", 0)]);
    again.claims = vec![allocated_claim("c1", "gpu-1")];
    again.workloads = vec![workload("trainer", "Always", None, Some("c1"))];
    let first = again.plan(20);
    let second = again.plan(21);
    // (Condition transition times are "now" for conditions that change:
    // only the container's end and the log must hold still.)
    let status = |plan: &NodePlan| {
        plan.pod_statuses
            .iter()
            .find(|u| u.name == "trainer")
            .map(|u| (u.status.phase.clone(), u.status.container_statuses.clone()))
    };
    assert!(status(&first).is_some());
    assert_eq!(status(&first), status(&second));
    let log = |plan: &NodePlan| plan.logs.iter().find(|l| l.name == "trainer").cloned();
    assert_eq!(log(&first), log(&second));
    let message = world.workload_status("trainer").message.clone().unwrap();
    assert!(
        message.starts_with("NodePrepareResources failed for ResourceClaim c1: device gpu-1"),
        "{message}"
    );
    // Once the claim is released the device comes back.
    // (Generation 1: d1 and d2 were replaced before their publications came.)
    world.claims.clear();
    world.step(9);
    assert_eq!(world.slice_devices(), Some((4, 1)));
}

#[test]
fn gpu_metrics_follow_the_agents() {
    let mut world = World::new(2, vec![plugin("p1", "plugin:v1", 0)]);
    world.timings.health_handover = Duration::from_secs(5);
    assert_eq!(world.gpu_healthy(0), [true, true]);
    world.step(0);
    // A quick replacement shows no dip; an agent gone for good does.
    world.pods.clear();
    assert_eq!(world.gpu_healthy(1), [true, true]);
    world.step(1);
    assert_eq!(world.gpu_healthy(6), [false, false]);
    world.step(6);
    world.pods = vec![plugin("p2", "plugin:v2-broken", 7)];
    assert_eq!(world.gpu_healthy(7), [false, false]);
    world.pods = vec![plugin("p3", "plugin:v3-fewer", 8)];
    assert_eq!(world.gpu_healthy(8), [true, false]);
    world.step(8);

    // A driver that came and went does not spoil a plugin that serves.
    world.pods = vec![driver("d1", "driver:v1", 9), plugin("p4", "plugin:v4", 9)];
    world.step(9);
    world.pods = vec![plugin("p4", "plugin:v4", 9)];
    world.step(10);
    world.step(11);
    assert_eq!(world.gpu_healthy(30), [true, true]);

    // A faulty GPU reads unhealthy with XID 79; -unhealthy raises the XID.
    world.node.as_mut().unwrap().faulty = BTreeSet::from([1]);
    let plan = world.plan(31);
    let gpus = plan.gpus.unwrap();
    assert_eq!(
        gpus.iter().map(|g| (g.healthy, g.xid)).collect::<Vec<_>>(),
        [(true, 0), (false, 79)]
    );
    world.pods = vec![plugin("p5", "plugin:v5-unhealthy", 32)];
    let gpus = world.plan(32).gpus.unwrap();
    assert!(gpus.iter().all(|g| !g.healthy && g.xid == 79));

    // No Node: no metrics.
    world.node = None;
    assert_eq!(world.plan(33).gpus, None);
}

#[test]
fn agent_logs_are_planned_per_container() {
    let mut pod = plugin("p1", "plugin:v1-fatallog", 0);
    pod.spec.as_mut().unwrap().containers.push(Container {
        name: "exporter".into(),
        image: Some("exp:1".into()),
        ..Container::default()
    });
    let mut world = World::new(2, vec![pod]);
    let plan = world.step(0);
    assert_eq!(plan.logs.len(), 1);
    let logs = &plan.logs[0];
    assert_eq!(
        (logs.namespace.as_str(), logs.name.as_str()),
        ("agents", "p1")
    );
    assert!(logs.containers["agent"].contains(" stdout F E"), "{logs:?}");
    assert!(logs.containers["agent"].contains("could not load NVML library"));
    assert!(logs.containers["exporter"].contains("exporter started"));
}

/// A node with a Ready condition whose status KWOK wrote long ago.
fn with_heartbeat(mut world: World) -> World {
    let node = world.node.as_mut().unwrap();
    node.has_ready_condition = true;
    node.status_written = Some(ts(-100));
    world
}

#[test]
fn a_plugin_is_reported_in_the_second_after_its_pod_became_ready() {
    // The pod turns Ready at 0.3 s: its devices and the heartbeat are
    // written together at 1 s, the first status a gate can tell is after
    // the Ready (API times keep whole seconds).
    let mut world = with_heartbeat(World::new(4, vec![plugin("p1", "plugin:v1", 0)]));
    let plan = world.plan_at(ts(0) + jiff::SignedDuration::from_millis(300));
    world.apply(&plan);
    assert!(world.pod_ready("p1"));
    assert_eq!(plan.status_heartbeat, None);
    assert_eq!(world.entries(GPU), (None, None), "held until the report");
    assert_eq!(plan.next_change, Some(ts(1)));
    assert!(
        world
            .plan_at(ts(0) + jiff::SignedDuration::from_millis(900))
            .is_empty()
    );
    let plan = world.step(1);
    assert_eq!(plan.status_heartbeat, Some(ts(1)));
    assert_eq!(world.entries(GPU), (Some("4"), Some("4")));
    assert!(world.plan(100).is_empty(), "reported once");
}

#[test]
fn a_replacement_that_changes_nothing_is_still_reported() {
    // Replaced within the status delay: allocatable never changes, yet the
    // node's status is written after the new pod's Ready (as a kubelet's
    // whose sync saw the old plugin's devices go unhealthy and come back).
    let mut world = with_heartbeat(World::new(4, vec![plugin("p1", "plugin:v1", 0)]));
    world.step(0);
    world.step(1);
    world.delete_pod("p1");
    world.pods.push(plugin("p2", "plugin:v2", 10));
    let plan = world.step(10);
    assert!(plan.node_entries.is_empty() && plan.status_heartbeat.is_none());
    let plan = world.step(11);
    assert!(plan.node_entries.is_empty(), "nothing changed");
    assert_eq!(plan.status_heartbeat, Some(ts(11)));
    assert_eq!(world.entries(GPU), (Some("4"), Some("4")));
}

#[test]
fn a_broken_plugin_shows_its_zero_in_a_status_written_after_its_ready() {
    let mut world = with_heartbeat(World::new(4, vec![plugin("p1", "plugin:v1", 0)]));
    world.step(0);
    world.step(1);
    world.delete_pod("p1");
    world.pods.push(plugin("p2", "plugin:v2-broken", 10));
    world.step(10);
    assert!(world.pod_ready("p2"));
    assert_eq!(
        world.entries(GPU),
        (Some("4"), Some("4")),
        "the old plugin's, written before the Ready"
    );
    let plan = world.step(11);
    assert_eq!(plan.status_heartbeat, Some(ts(11)));
    assert_eq!(world.entries(GPU), (Some("0"), Some("0")));
}

#[test]
fn every_status_write_carries_a_heartbeat() {
    // The old plugin gone: allocatable drops after the status delay, in a
    // status write stamped like any kubelet's.
    let mut world = with_heartbeat(World::new(4, vec![plugin("p1", "plugin:v1", 0)]));
    world.step(0);
    world.step(1);
    world.delete_pod("p1");
    world.step(10);
    let plan = world.step(11);
    assert_eq!(world.entries(GPU), (Some("4"), Some("0")));
    assert_eq!(plan.status_heartbeat, Some(ts(11)));
}

#[test]
fn a_report_delay_holds_the_plugins_devices_back_that_much_longer() {
    // A broken plugin Ready at 10 s whose kubelet reports it 3 s later: the
    // node shows the old plugin's devices, written before the Ready, until
    // 14 s (the whole second after 10 s, plus 3 s).
    let mut world = with_heartbeat(World::new(4, vec![plugin("p1", "plugin:v1", 0)]));
    world.step(0);
    world.step(1);
    world.delete_pod("p1");
    let mut late = plugin("p2", "plugin:v2-broken", 10);
    late.metadata.annotations = Some(BTreeMap::from([(
        REPORT_DELAY_ANNOTATION.into(),
        "3s".into(),
    )]));
    world.pods.push(late);
    let plan = world.step(10);
    assert_eq!(plan.next_change, Some(ts(14)));
    assert!(world.pod_ready("p2"));
    world.step(13);
    assert_eq!(world.entries(GPU), (Some("4"), Some("4")));
    let plan = world.step(14);
    assert_eq!(plan.status_heartbeat, Some(ts(14)));
    assert_eq!(world.entries(GPU), (Some("0"), Some("0")));
}

// --- two instances of one DRA driver (rolling update) --------------------

/// A driver pod that registers on a socket of its own.
fn rolling(mut pod: Pod) -> Pod {
    pod.metadata
        .annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(ROLLING_UPDATE_ANNOTATION.into(), "true".into());
    pod
}

impl World {
    /// The pool's first slice: (its publisher pod UID, generation), if any.
    fn pool(&self) -> Option<(String, i64)> {
        let slice = self.slices.first()?;
        let publisher = published_pool(slice).publisher?.to_owned();
        Some((publisher, slice.spec.pool.generation))
    }

    /// Steps through `from..=to`, checking that no step deletes a slice of
    /// the pool (the pool always has its slices).
    fn step_without_gap(&mut self, from: i64, to: i64) {
        for at in from..=to {
            let plan = self.step(at);
            assert!(plan.slice_deletes.is_empty(), "slice deleted at {at}");
            assert!(!self.slices.is_empty(), "no slice at {at}");
        }
    }
}

/// A world whose rolling-update driver `d1` has published its pool
/// (generation 1) by second 1.
fn published_by_d1(devices: u64) -> World {
    let mut world = World::new(devices, vec![rolling(driver("d1", "driver:v1", 0))]);
    world.step(0);
    world.step(1);
    assert_eq!(world.pool(), Some(("uid-d1".into(), 1)));
    world
}

#[test]
fn the_newer_registered_instance_serves_from_its_first_publication_without_a_gap() {
    let mut world = published_by_d1(2);
    world.pods.push(rolling(driver("d2", "driver:v2", 5)));
    // d2 is Ready at 5 and publishes in the next second; d1 serves until
    // then (its pod keeps running beside d2's).
    let plan = world.step(5);
    assert!(world.pod_ready("d2"));
    assert_eq!(plan.next_change, Some(ts(6)));
    assert_eq!(world.pool(), Some(("uid-d1".into(), 1)));
    world.step_without_gap(6, 6);
    assert_eq!(world.pool(), Some(("uid-d2".into(), 2)));
    assert_eq!(world.slice_devices(), Some((2, 2)));
    // Both keep running; nothing more to do.
    assert!(world.pod_ready("d1"));
    assert!(world.plan(30).is_empty());
}

#[test]
fn an_unregistered_newer_instance_leaves_the_older_one_serving() {
    // Crash-looping: never registers, d1 serves throughout.
    let mut world = published_by_d1(2);
    world
        .pods
        .push(rolling(driver("d2", "driver:v2-crashloop", 5)));
    world.step_without_gap(5, 30);
    assert_eq!(world.pool(), Some(("uid-d1".into(), 1)));

    // Slow: registers after the slow delay (Ready at 25), publishes at 26.
    let mut world = published_by_d1(2);
    world.pods.push(rolling(driver("d2", "driver:v2-slow", 5)));
    world.step_without_gap(5, 25);
    assert_eq!(world.pool(), Some(("uid-d1".into(), 1)));
    world.step_without_gap(26, 26);
    assert_eq!(world.pool(), Some(("uid-d2".into(), 2)));
}

#[test]
fn the_older_instance_takes_back_when_the_newer_goes_without_a_gap() {
    let mut world = published_by_d1(2);
    world.pods.push(rolling(driver("d2", "driver:v2", 5)));
    world.step_without_gap(5, 6);
    assert_eq!(world.pool(), Some(("uid-d2".into(), 2)));

    // Deleted (its deletion under way): the kubelet falls back to d1 at
    // once, which publishes a new generation.
    let d2 = world
        .pods
        .iter_mut()
        .find(|p| p.metadata.name.as_deref() == Some("d2"))
        .unwrap();
    d2.metadata.deletion_timestamp = Some(Time(ts(10)));
    world.step_without_gap(10, 10);
    assert_eq!(world.pool(), Some(("uid-d1".into(), 3)));
    // Gone for good: still d1.
    world.delete_pod("d2");
    world.step_without_gap(11, 20);
    assert_eq!(world.pool(), Some(("uid-d1".into(), 3)));

    // Only once no instance is left does the pool go, after the status delay.
    world.delete_pod("d1");
    let plan = world.step(30);
    assert!(plan.slice_deletes.is_empty());
    assert_eq!(plan.next_change, Some(ts(31)));
    world.step(31);
    assert_eq!(world.slice_devices(), None);
}

#[test]
fn the_new_instances_faults_apply_while_it_serves_and_the_old_takes_back_its_own_content() {
    // -broken: withdraws the pool when its turn comes; d1 republishes once
    // it goes.
    let mut world = published_by_d1(2);
    world
        .pods
        .push(rolling(driver("d2", "driver:v2-broken", 5)));
    world.step(5);
    assert_eq!(world.pool(), Some(("uid-d1".into(), 1)));
    world.step(6);
    assert_eq!(world.slice_devices(), None);
    world.delete_pod("d2");
    world.step(8);
    assert_eq!(world.pool(), Some(("uid-d1".into(), 2)));
    assert_eq!(world.slice_devices(), Some((2, 2)));

    // -fewer: half the devices while it serves, all again after.
    let mut world = published_by_d1(4);
    world.pods.push(rolling(driver("d2", "driver:v2-fewer", 5)));
    world.step_without_gap(5, 6);
    assert_eq!(world.slice_devices(), Some((2, 2)));
    world.delete_pod("d2");
    world.step_without_gap(7, 7);
    assert_eq!(world.slice_devices(), Some((4, 3)));
}

#[test]
fn a_claim_allocated_before_the_handover_stays_usable_through_it() {
    let mut world = published_by_d1(4);
    world.claims = vec![allocated_claim("c1", "gpu-1")];
    world.workloads = vec![workload("trainer", "Always", None, Some("c1"))];
    let id = format!("{DEFAULT_DRIVER}/{NODE}/gpu-1");
    let healthy = health_of(&[("claim:gpu", &id, "Healthy")]);
    world.step(2);
    assert_eq!(world.health("trainer"), healthy);

    // A healthy new instance serves the same devices: the pod runs on.
    world.pods.push(rolling(driver("d2", "driver:v2", 5)));
    for at in 5..=8 {
        world.step_without_gap(at, at);
        assert_eq!(world.phase("trainer"), "Running", "at {at}");
        assert_eq!(world.health("trainer"), healthy, "at {at}");
    }
    assert_eq!(world.pool(), Some(("uid-d2".into(), 2)));
    world.delete_pod("d2");
    world.step_without_gap(9, 9);
    assert_eq!(world.pool(), Some(("uid-d1".into(), 3)));
    assert_eq!(world.phase("trainer"), "Running");
    assert_eq!(world.health("trainer"), healthy);

    // A -dropclaims new instance withdraws the allocated device once it
    // serves, and the pod fails then (not before).
    world
        .pods
        .push(rolling(driver("d3", "driver:v3-dropclaims", 10)));
    world.step(10);
    assert_eq!(world.phase("trainer"), "Running");
    let plan = world.plan(11);
    world.apply(&plan);
    assert_eq!(world.phase("trainer"), "Running");
    world.step(11);
    assert_eq!(world.device_names(), ["gpu-0", "gpu-2", "gpu-3"]);
    assert_eq!(world.phase("trainer"), "Failed");
}

#[test]
fn without_the_annotation_the_newer_instance_replaces_the_older_for_good() {
    // Both on the driver's one socket: the newer serves from its first
    // publication (as before) ...
    let mut world = World::new(2, vec![driver("d1", "driver:v1", 0)]);
    world.step(0);
    world.step(1);
    world.pods.push(driver("d2", "driver:v2", 5));
    world.step(5);
    world.step(6);
    assert_eq!(world.pool(), Some(("uid-d2".into(), 2)));
    // ... and once d2 goes, d1 (the newest left) is the driver again (as
    // before: the sim keeps no record of whose socket was taken).
    world.delete_pod("d2");
    world.step(10);
    assert_eq!(world.pool(), Some(("uid-d1".into(), 3)));

    // A newer instance that never registers takes the socket all the same:
    // the pool goes.
    let mut world = World::new(2, vec![driver("d1", "driver:v1", 0)]);
    world.step(0);
    world.step(1);
    world.pods.push(driver("d2", "driver:v2-crashloop", 5));
    world.step(5);
    world.step(6);
    assert_eq!(world.slice_devices(), None);

    // One annotated instance beside one that is not: two sockets, so two
    // instances (the newer one serves, the older is its fallback).
    let mut world = World::new(2, vec![driver("d1", "driver:v1", 0)]);
    world.step(0);
    world.step(1);
    world
        .pods
        .push(rolling(driver("d2", "driver:v2-crashloop", 5)));
    world.step_without_gap(5, 10);
    assert_eq!(world.pool(), Some(("uid-d1".into(), 1)));
}
