//! The pod status the simulated kubelet reports for an agent pod.
//!
//! The fault applies to the pod's first container (the agent); any other
//! container runs and is Ready, and init containers have completed (or, for
//! sidecars, run and are Ready), as a kubelet would report them.

use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{
    Container, ContainerState, ContainerStateRunning, ContainerStateTerminated,
    ContainerStateWaiting, ContainerStatus, HostIP, Pod, PodCondition, PodIP, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde_json::Value;

use super::agent::{AgentMoment, ContainerRun};
use super::ids;

/// Pod condition types the simulated kubelet owns; any other condition (a
/// readiness gate's, say) belongs to someone else and is left alone.
pub const KUBELET_CONDITIONS: [&str; 5] = [
    "PodReadyToStartContainers",
    "Initialized",
    "ContainersReady",
    "Ready",
    "PodScheduled",
];

/// Everything besides the pod itself that decides its status.
#[derive(Clone, Copy, Debug)]
pub struct PodStatusInputs<'a> {
    /// What the agent does right now.
    pub moment: &'a AgentMoment,
    /// When the sim started the pod: its `startTime`.
    pub started_at: Timestamp,
    /// The node's InternalIP (or a stand-in).
    pub host_ip: &'a str,
    /// Shown in the crash-loop back-off message.
    pub crash_restart_interval: Duration,
    /// The node's Ready condition is not True: the pod is not Ready, as
    /// the node lifecycle controller marks every pod of a node that stopped
    /// reporting (its containers' states are left as they were).
    pub node_not_ready: bool,
    pub now: Timestamp,
}

/// The status fields the simulated kubelet owns, as they should be now.
/// Timestamps are whole seconds (as the API stores them) and are reused from
/// the current status wherever the thing they date has not changed.
pub fn desired_pod_status(pod: &Pod, inputs: &PodStatusInputs<'_>) -> PodStatus {
    let spec = pod.spec.as_ref();
    let current = pod.status.as_ref();
    let uid = pod.metadata.uid.as_deref().unwrap_or_default();
    let generation = pod.metadata.generation;
    let started_at = super::time::whole_seconds(inputs.started_at);
    let now = super::time::whole_seconds(inputs.now);
    let start_time = current
        .and_then(|s| s.start_time.clone())
        .unwrap_or(Time(started_at));

    let containers: &[Container] = spec.map_or(&[], |s| &s.containers);
    let container_statuses: Vec<ContainerStatus> = containers
        .iter()
        .enumerate()
        .map(|(index, container)| {
            if index == 0 {
                agent_container_status(pod, container, inputs, started_at)
            } else {
                running_container_status(uid, container, started_at, true)
            }
        })
        .collect();
    let init_container_statuses: Vec<ContainerStatus> = spec
        .and_then(|s| s.init_containers.as_deref())
        .unwrap_or_default()
        .iter()
        .map(|container| {
            if is_sidecar(container) {
                running_container_status(uid, container, started_at, true)
            } else {
                completed_init_container_status(uid, container, started_at)
            }
        })
        .collect();

    // Sidecars count towards readiness like regular containers do.
    let unready: Vec<&str> = container_statuses
        .iter()
        .chain(init_container_statuses.iter().filter(|s| {
            containers_named(spec.and_then(|s| s.init_containers.as_deref()), &s.name)
                .is_some_and(is_sidecar)
        }))
        .filter(|s| !s.ready)
        .map(|s| s.name.as_str())
        .collect();
    let containers_ready = unready.is_empty();
    let unready_message = format!("containers with unready status: [{}]", unready.join(" "));

    let existing: &[PodCondition] = current
        .and_then(|s| s.conditions.as_deref())
        .unwrap_or_default();
    let gate_problem = readiness_gate_problem(pod, existing);
    let (ready, ready_reason, ready_message) = match (&gate_problem, containers_ready) {
        _ if inputs.node_not_ready => (
            false,
            Some("NodeNotReady"),
            Some("the node is not Ready".to_owned()),
        ),
        (_, false) => (
            false,
            Some("ContainersNotReady"),
            Some(unready_message.clone()),
        ),
        (Some(problem), true) => (false, Some("ReadinessGatesNotReady"), Some(problem.clone())),
        (None, true) => (true, None, None),
    };
    let condition = |type_: &str, ok: bool, reason: Option<&str>, message: Option<String>| {
        kubelet_condition(existing, type_, ok, reason, message, generation, now)
    };
    let scheduled = existing
        .iter()
        .find(|c| c.type_ == "PodScheduled" && c.status == "True")
        .cloned()
        // The scheduler's condition is the scheduler's; one is made up only
        // for pods bound without it (spec.nodeName set at creation).
        .unwrap_or_else(|| condition("PodScheduled", true, None, None));
    let (containers_reason, containers_message) = if containers_ready {
        (None, None)
    } else {
        (Some("ContainersNotReady"), Some(unready_message))
    };
    let conditions = vec![
        condition("PodReadyToStartContainers", true, None, None),
        condition("Initialized", true, None, None),
        condition("Ready", ready, ready_reason, ready_message),
        condition(
            "ContainersReady",
            containers_ready,
            containers_reason,
            containers_message,
        ),
        scheduled,
    ];

    // Addresses never change once reported, as with a real kubelet (and the
    // API server may refuse changes): a node whose InternalIP shows up late
    // does not move its running pods.
    let host_ip = current
        .and_then(|s| s.host_ip.clone())
        .unwrap_or_else(|| inputs.host_ip.to_owned());
    let pod_ip = current
        .and_then(|s| s.pod_ip.clone())
        .unwrap_or_else(|| ids::pod_ip(uid));
    PodStatus {
        phase: Some("Running".into()),
        observed_generation: generation,
        conditions: Some(conditions),
        host_ips: Some(vec![HostIP {
            ip: host_ip.clone(),
        }]),
        host_ip: Some(host_ip),
        pod_ips: Some(vec![PodIP { ip: pod_ip.clone() }]),
        pod_ip: Some(pod_ip),
        start_time: Some(start_time),
        container_statuses: Some(container_statuses),
        init_container_statuses: (!init_container_statuses.is_empty())
            .then_some(init_container_statuses),
        ..PodStatus::default()
    }
}

/// The strategic merge patch that writes `status` to the pod with `uid`.
///
/// Conditions are merged by type, field by field, so a field a condition
/// no longer has (the `reason` of a now-Ready condition, say) must be
/// nulled explicitly or the stale value stays. The UID makes the patch fail
/// on a different pod that reuses the name, as the kubelet's does.
pub fn pod_status_patch(uid: &str, status: &PodStatus) -> Value {
    let mut status_json = serde_json::to_value(status).unwrap_or(Value::Null);
    if let Some(Value::Array(conditions)) = status_json.get_mut("conditions") {
        for condition in conditions.iter_mut().filter_map(Value::as_object_mut) {
            for field in ["reason", "message"] {
                condition.entry(field).or_insert(Value::Null);
            }
        }
    }
    serde_json::json!({"metadata": {"uid": uid}, "status": status_json})
}

/// Whether `current` differs from `desired` in the fields the simulated
/// kubelet owns, i.e. whether `desired` needs writing.
pub fn pod_status_differs(current: Option<&PodStatus>, desired: &PodStatus) -> bool {
    let Some(current) = current else {
        return true;
    };
    // An API server that does not track observed generations drops them;
    // insisting on them would rewrite the status forever.
    let keep_generation = current.observed_generation.is_some();
    owned_view(current, keep_generation) != owned_view(desired, keep_generation)
}

/// The kubelet-owned part of a status as normalised JSON: conditions
/// filtered to the kubelet's and sorted, empty/null fields dropped (the API
/// server returns `lastState: {}` where the sim sends nothing).
fn owned_view(status: &PodStatus, keep_generation: bool) -> Value {
    let mut conditions: Vec<PodCondition> = status
        .conditions
        .iter()
        .flatten()
        .filter(|c| KUBELET_CONDITIONS.contains(&c.type_.as_str()))
        .cloned()
        .map(|mut c| {
            if !keep_generation {
                c.observed_generation = None;
            }
            c.last_probe_time = None;
            c
        })
        .collect();
    conditions.sort_by(|a, b| a.type_.cmp(&b.type_));
    let owned = PodStatus {
        phase: status.phase.clone(),
        observed_generation: status.observed_generation.filter(|_| keep_generation),
        conditions: Some(conditions),
        host_ip: status.host_ip.clone(),
        host_ips: status.host_ips.clone(),
        pod_ip: status.pod_ip.clone(),
        pod_ips: status.pod_ips.clone(),
        start_time: status.start_time.clone(),
        container_statuses: status.container_statuses.clone(),
        init_container_statuses: status.init_container_statuses.clone(),
        ..PodStatus::default()
    };
    let mut value = serde_json::to_value(owned).unwrap_or(Value::Null);
    prune_empty(&mut value);
    value
}

/// Drops nulls, empty objects and empty arrays, recursively.
fn prune_empty(value: &mut Value) {
    match value {
        Value::Object(map) => {
            map.values_mut().for_each(prune_empty);
            map.retain(|_, v| !is_empty(v));
        }
        Value::Array(items) => items.iter_mut().for_each(prune_empty),
        _ => {}
    }
}

fn is_empty(value: &Value) -> bool {
    match value {
        Value::Null => true,
        Value::Object(map) => map.is_empty(),
        Value::Array(items) => items.is_empty(),
        _ => false,
    }
}

/// A condition of the kubelet's, keeping the existing transition time when
/// the status has not changed.
pub(super) fn kubelet_condition(
    existing: &[PodCondition],
    type_: &str,
    ok: bool,
    reason: Option<&str>,
    message: Option<String>,
    generation: Option<i64>,
    now: Timestamp,
) -> PodCondition {
    let status = if ok { "True" } else { "False" };
    let last_transition_time = existing
        .iter()
        .find(|c| c.type_ == type_ && c.status == status)
        .and_then(|c| c.last_transition_time.clone())
        .unwrap_or(Time(now));
    PodCondition {
        type_: type_.to_owned(),
        status: status.to_owned(),
        reason: reason.map(str::to_owned),
        message,
        last_transition_time: Some(last_transition_time),
        last_probe_time: None,
        observed_generation: generation,
    }
}

/// Why the pod's readiness gates hold it back, in the kubelet's words, or
/// `None` when they all pass.
fn readiness_gate_problem(pod: &Pod, existing: &[PodCondition]) -> Option<String> {
    let gates = pod.spec.as_ref()?.readiness_gates.as_deref()?;
    gates.iter().find_map(|gate| {
        let kind = &gate.condition_type;
        match existing.iter().find(|c| &c.type_ == kind) {
            None => Some(format!(
                "corresponding condition of pod readiness gate \"{kind}\" does not exist."
            )),
            Some(c) if c.status != "True" => Some(format!(
                "the status of pod readiness gate \"{kind}\" is not \"True\", but {}",
                c.status
            )),
            Some(_) => None,
        }
    })
}

fn is_sidecar(container: &Container) -> bool {
    container.restart_policy.as_deref() == Some("Always")
}

fn containers_named<'a>(containers: Option<&'a [Container]>, name: &str) -> Option<&'a Container> {
    containers?.iter().find(|c| c.name == name)
}

fn agent_container_status(
    pod: &Pod,
    container: &Container,
    inputs: &PodStatusInputs<'_>,
    started_at: Timestamp,
) -> ContainerStatus {
    let uid = pod.metadata.uid.as_deref().unwrap_or_default();
    match inputs.moment.run {
        ContainerRun::Running => {
            running_container_status(uid, container, started_at, inputs.moment.ready)
        }
        ContainerRun::CrashLooping {
            restarts,
            last_attempt_at,
        } => {
            let last_attempt_at = Time(super::time::whole_seconds(last_attempt_at));
            let container_id = ids::container_id(uid, &container.name, restarts);
            let pod_name = pod.metadata.name.as_deref().unwrap_or_default();
            let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
            ContainerStatus {
                name: container.name.clone(),
                image: image_of(container),
                image_id: ids::image_id(&image_of(container)),
                container_id: Some(container_id.clone()),
                ready: false,
                started: Some(false),
                restart_count: i32::try_from(restarts).unwrap_or(i32::MAX),
                state: Some(ContainerState {
                    waiting: Some(ContainerStateWaiting {
                        reason: Some("CrashLoopBackOff".into()),
                        message: Some(format!(
                            "back-off {}s restarting failed container={} pod={pod_name}_{namespace}({uid})",
                            inputs.crash_restart_interval.as_secs().max(1),
                            container.name,
                        )),
                    }),
                    ..ContainerState::default()
                }),
                last_state: Some(ContainerState {
                    terminated: Some(ContainerStateTerminated {
                        exit_code: 1,
                        reason: Some("Error".into()),
                        started_at: Some(last_attempt_at.clone()),
                        finished_at: Some(last_attempt_at),
                        container_id: Some(container_id),
                        ..ContainerStateTerminated::default()
                    }),
                    ..ContainerState::default()
                }),
                ..ContainerStatus::default()
            }
        }
    }
}

fn running_container_status(
    uid: &str,
    container: &Container,
    started_at: Timestamp,
    ready: bool,
) -> ContainerStatus {
    ContainerStatus {
        name: container.name.clone(),
        image: image_of(container),
        image_id: ids::image_id(&image_of(container)),
        container_id: Some(ids::container_id(uid, &container.name, 0)),
        ready,
        started: Some(true),
        restart_count: 0,
        state: Some(ContainerState {
            running: Some(ContainerStateRunning {
                started_at: Some(Time(started_at)),
            }),
            ..ContainerState::default()
        }),
        last_state: Some(ContainerState::default()),
        ..ContainerStatus::default()
    }
}

fn completed_init_container_status(
    uid: &str,
    container: &Container,
    started_at: Timestamp,
) -> ContainerStatus {
    let container_id = ids::container_id(uid, &container.name, 0);
    ContainerStatus {
        name: container.name.clone(),
        image: image_of(container),
        image_id: ids::image_id(&image_of(container)),
        container_id: Some(container_id.clone()),
        ready: true,
        started: Some(false),
        restart_count: 0,
        state: Some(ContainerState {
            terminated: Some(ContainerStateTerminated {
                exit_code: 0,
                reason: Some("Completed".into()),
                started_at: Some(Time(started_at)),
                finished_at: Some(Time(started_at)),
                container_id: Some(container_id),
                ..ContainerStateTerminated::default()
            }),
            ..ContainerState::default()
        }),
        last_state: Some(ContainerState::default()),
        ..ContainerStatus::default()
    }
}

pub(super) fn image_of(container: &Container) -> String {
    container.image.clone().unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Fault;
    use crate::model::agent::{Offer, Timings, agent_moment};
    use k8s_openapi::api::core::v1::{PodReadinessGate, PodSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn ts(second: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + second).unwrap()
    }

    fn container(name: &str, image: &str) -> Container {
        Container {
            name: name.into(),
            image: Some(image.into()),
            ..Container::default()
        }
    }

    fn pod(containers: Vec<Container>) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some("plugin-abc".into()),
                namespace: Some("kube-system".into()),
                uid: Some("uid-1".into()),
                generation: Some(1),
                ..ObjectMeta::default()
            },
            spec: Some(PodSpec {
                containers,
                node_name: Some("node-1".into()),
                ..PodSpec::default()
            }),
            status: None,
        }
    }

    fn status_at(pod: &Pod, fault: Fault, at: i64) -> PodStatus {
        let moment = agent_moment(fault, ts(0), ts(at), &Timings::default());
        desired_pod_status(
            pod,
            &PodStatusInputs {
                moment: &moment,
                started_at: ts(0),
                host_ip: "10.1.2.3",
                node_not_ready: false,
                crash_restart_interval: Duration::from_secs(5),
                now: ts(at),
            },
        )
    }

    fn condition<'a>(status: &'a PodStatus, type_: &str) -> &'a PodCondition {
        status
            .conditions
            .as_ref()
            .unwrap()
            .iter()
            .find(|c| c.type_ == type_)
            .unwrap_or_else(|| panic!("no {type_} condition"))
    }

    /// What the API server would hand back after storing `status`.
    fn stored(mut pod: Pod, status: PodStatus) -> Pod {
        let json = serde_json::to_string(&status).unwrap();
        pod.status = Some(serde_json::from_str(&json).unwrap());
        pod
    }

    #[test]
    fn a_pod_on_a_node_that_is_not_ready_is_not_ready() {
        let pod = pod(vec![container("agent", "plugin:v1")]);
        let moment = agent_moment(Fault::Healthy, ts(0), ts(3), &Timings::default());
        let status = desired_pod_status(
            &pod,
            &PodStatusInputs {
                moment: &moment,
                started_at: ts(0),
                host_ip: "10.1.2.3",
                node_not_ready: true,
                crash_restart_interval: Duration::from_secs(5),
                now: ts(3),
            },
        );
        let ready = condition(&status, "Ready");
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_deref()),
            ("False", Some("NodeNotReady"))
        );
        // The container itself is left as it was.
        assert_eq!(condition(&status, "ContainersReady").status, "True");
    }

    #[test]
    fn healthy_pod_runs_and_is_ready() {
        let pod = pod(vec![
            container("agent", "plugin:v1"),
            container("exporter", "exp:v2"),
        ]);
        let status = status_at(&pod, Fault::Healthy, 3);
        assert_eq!(status.phase.as_deref(), Some("Running"));
        assert_eq!(status.host_ip.as_deref(), Some("10.1.2.3"));
        assert_eq!(status.host_ips.as_ref().unwrap()[0].ip, "10.1.2.3");
        assert_eq!(
            status.pod_ip.as_deref(),
            Some(ids::pod_ip("uid-1").as_str())
        );
        assert_eq!(status.pod_ips.as_ref().unwrap()[0].ip, ids::pod_ip("uid-1"));
        assert_eq!(status.start_time, Some(Time(ts(0))));
        assert_eq!(status.observed_generation, Some(1));
        for type_ in KUBELET_CONDITIONS {
            let c = condition(&status, type_);
            assert_eq!(c.status, "True", "{type_}");
            assert_eq!(c.last_transition_time, Some(Time(ts(3))), "{type_}");
        }
        let containers = status.container_statuses.as_ref().unwrap();
        assert_eq!(containers.len(), 2);
        for (c, image) in containers.iter().zip(["plugin:v1", "exp:v2"]) {
            assert!(c.ready && c.started == Some(true));
            assert_eq!(c.image, image);
            assert!(c.image_id.contains("@sha256:"));
            assert!(
                c.container_id
                    .as_deref()
                    .unwrap()
                    .starts_with("containerd://")
            );
            assert_eq!(c.restart_count, 0);
            let running = c.state.as_ref().unwrap().running.as_ref().unwrap();
            assert_eq!(running.started_at, Some(Time(ts(0))));
        }
        assert_eq!(status.init_container_statuses, None);
    }

    #[test]
    fn unready_pod_runs_without_being_ready() {
        let pod = pod(vec![
            container("agent", "plugin:v1-unready"),
            container("exporter", "exp:v2"),
        ]);
        let status = status_at(&pod, Fault::Unready, 3);
        for type_ in ["Ready", "ContainersReady"] {
            let c = condition(&status, type_);
            assert_eq!(c.status, "False");
            assert_eq!(c.reason.as_deref(), Some("ContainersNotReady"));
            assert_eq!(
                c.message.as_deref(),
                Some("containers with unready status: [agent]")
            );
        }
        assert_eq!(condition(&status, "Initialized").status, "True");
        let containers = status.container_statuses.as_ref().unwrap();
        assert!(!containers[0].ready && containers[0].started == Some(true));
        assert!(containers[0].state.as_ref().unwrap().running.is_some());
        assert!(containers[1].ready);
    }

    #[test]
    fn crashlooping_pod_waits_in_back_off_with_rising_restarts() {
        let pod = pod(vec![container("agent", "plugin:v1-crashloop")]);
        let status = status_at(&pod, Fault::Crashloop, 12);
        assert_eq!(status.phase.as_deref(), Some("Running"));
        assert_eq!(condition(&status, "Ready").status, "False");
        let agent = &status.container_statuses.as_ref().unwrap()[0];
        assert!(!agent.ready);
        assert_eq!(agent.started, Some(false));
        assert_eq!(agent.restart_count, 2);
        let waiting = agent.state.as_ref().unwrap().waiting.as_ref().unwrap();
        assert_eq!(waiting.reason.as_deref(), Some("CrashLoopBackOff"));
        assert!(
            waiting
                .message
                .as_deref()
                .unwrap()
                .contains("container=agent pod=plugin-abc_kube-system(uid-1)")
        );
        let terminated = agent
            .last_state
            .as_ref()
            .unwrap()
            .terminated
            .as_ref()
            .unwrap();
        assert_eq!(terminated.exit_code, 1);
        assert_eq!(terminated.reason.as_deref(), Some("Error"));
        assert_eq!(terminated.finished_at, Some(Time(ts(10))));
        assert_eq!(terminated.container_id, agent.container_id);

        let later = status_at(&pod, Fault::Crashloop, 15);
        assert_eq!(
            later.container_statuses.as_ref().unwrap()[0].restart_count,
            3
        );
    }

    #[test]
    fn slow_pod_becomes_ready_after_the_delay() {
        let pod = pod(vec![container("agent", "plugin:v1-slow")]);
        assert_eq!(
            condition(&status_at(&pod, Fault::Slow, 19), "Ready").status,
            "False"
        );
        assert_eq!(
            condition(&status_at(&pod, Fault::Slow, 20), "Ready").status,
            "True"
        );
    }

    #[test]
    fn transition_times_and_start_time_are_kept_while_nothing_changes() {
        let fresh = pod(vec![container("agent", "plugin:v1-slow")]);
        let first = status_at(&fresh, Fault::Slow, 1);
        let stored_pod = stored(fresh, first.clone());

        // Ten seconds later nothing changed: same status, no write.
        let again = status_at(&stored_pod, Fault::Slow, 11);
        assert_eq!(again, first);
        assert!(!pod_status_differs(stored_pod.status.as_ref(), &again));

        // Once Ready flips, only the flipped conditions get a new time.
        let ready = status_at(&stored_pod, Fault::Slow, 25);
        assert!(pod_status_differs(stored_pod.status.as_ref(), &ready));
        assert_eq!(
            condition(&ready, "Ready").last_transition_time,
            Some(Time(ts(25)))
        );
        assert_eq!(
            condition(&ready, "Initialized").last_transition_time,
            Some(Time(ts(1)))
        );
        assert_eq!(ready.start_time, Some(Time(ts(0))));
    }

    #[test]
    fn reported_addresses_stay_put() {
        let fresh = pod(vec![container("agent", "plugin:v1")]);
        let first = status_at(&fresh, Fault::Healthy, 1);
        let stored_pod = stored(fresh, first.clone());
        let moment = agent_moment(Fault::Healthy, ts(0), ts(2), &Timings::default());
        let later = desired_pod_status(
            &stored_pod,
            &PodStatusInputs {
                moment: &moment,
                started_at: ts(0),
                host_ip: "10.99.99.99",
                node_not_ready: false,
                crash_restart_interval: Duration::from_secs(5),
                now: ts(2),
            },
        );
        assert_eq!(later.host_ip.as_deref(), Some("10.1.2.3"));
        assert_eq!(later.host_ips, first.host_ips);
        assert_eq!(later.pod_ip, first.pod_ip);
        assert!(!pod_status_differs(stored_pod.status.as_ref(), &later));
    }

    #[test]
    fn status_differs_ignores_foreign_conditions_and_empty_fields() {
        let fresh = pod(vec![container("agent", "plugin:v1")]);
        let desired = status_at(&fresh, Fault::Healthy, 1);
        assert!(pod_status_differs(None, &desired));

        let mut current = desired.clone();
        current.qos_class = Some("BestEffort".into());
        current.conditions.as_mut().unwrap().insert(
            0,
            PodCondition {
                type_: "example.com/gate".into(),
                status: "True".into(),
                ..PodCondition::default()
            },
        );
        // Sub-second precision never survives the API; empty `lastState` does
        // not matter either way.
        current.container_statuses.as_mut().unwrap()[0].last_state = None;
        assert!(!pod_status_differs(Some(&current), &desired));

        current.phase = Some("Pending".into());
        assert!(pod_status_differs(Some(&current), &desired));
    }

    #[test]
    fn patch_clears_fields_a_condition_no_longer_has() {
        let fresh = pod(vec![container("agent", "plugin:v1")]);
        let status = status_at(&fresh, Fault::Healthy, 1);
        let patch = pod_status_patch("uid-1", &status);
        assert_eq!(patch["metadata"]["uid"], "uid-1");
        assert_eq!(patch["status"]["phase"], "Running");
        for condition in patch["status"]["conditions"].as_array().unwrap() {
            let fields = condition.as_object().unwrap();
            assert_eq!(fields.get("reason"), Some(&Value::Null), "{condition}");
            assert_eq!(fields.get("message"), Some(&Value::Null), "{condition}");
        }

        let unready = status_at(
            &pod(vec![container("agent", "plugin:v1-unready")]),
            Fault::Unready,
            1,
        );
        let patch = pod_status_patch("uid-1", &unready);
        let ready = patch["status"]["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["type"] == "Ready")
            .unwrap();
        assert_eq!(ready["reason"], "ContainersNotReady");
    }

    #[test]
    fn missing_observed_generation_support_does_not_cause_rewrites() {
        let fresh = pod(vec![container("agent", "plugin:v1")]);
        let desired = status_at(&fresh, Fault::Healthy, 1);
        let mut current = desired.clone();
        current.observed_generation = None;
        for c in current.conditions.as_mut().unwrap() {
            c.observed_generation = None;
        }
        assert!(!pod_status_differs(Some(&current), &desired));
    }

    #[test]
    fn readiness_gates_hold_ready_back() {
        let mut gated = pod(vec![container("agent", "plugin:v1")]);
        gated.spec.as_mut().unwrap().readiness_gates = Some(vec![PodReadinessGate {
            condition_type: "example.com/verified".into(),
        }]);
        let status = status_at(&gated, Fault::Healthy, 1);
        let ready = condition(&status, "Ready");
        assert_eq!(ready.status, "False");
        assert_eq!(ready.reason.as_deref(), Some("ReadinessGatesNotReady"));
        assert_eq!(condition(&status, "ContainersReady").status, "True");

        let mut with_gate = stored(gated.clone(), status);
        let gate = PodCondition {
            type_: "example.com/verified".into(),
            status: "False".into(),
            ..PodCondition::default()
        };
        with_gate
            .status
            .as_mut()
            .unwrap()
            .conditions
            .as_mut()
            .unwrap()
            .push(gate.clone());
        let status = status_at(&with_gate, Fault::Healthy, 2);
        assert!(
            condition(&status, "Ready")
                .message
                .as_deref()
                .unwrap()
                .contains("but False")
        );
        // The gate condition is not the kubelet's to write.
        assert!(
            status
                .conditions
                .as_ref()
                .unwrap()
                .iter()
                .all(|c| c.type_ != gate.type_)
        );

        for c in with_gate
            .status
            .as_mut()
            .unwrap()
            .conditions
            .as_mut()
            .unwrap()
        {
            if c.type_ == gate.type_ {
                c.status = "True".into();
            }
        }
        assert_eq!(
            condition(&status_at(&with_gate, Fault::Healthy, 3), "Ready").status,
            "True"
        );
    }

    #[test]
    fn scheduler_condition_is_kept_as_is() {
        let mut scheduled = pod(vec![container("agent", "plugin:v1")]);
        let by_scheduler = PodCondition {
            type_: "PodScheduled".into(),
            status: "True".into(),
            last_transition_time: Some(Time(ts(-5))),
            observed_generation: None,
            ..PodCondition::default()
        };
        scheduled.status = Some(PodStatus {
            phase: Some("Pending".into()),
            conditions: Some(vec![by_scheduler.clone()]),
            ..PodStatus::default()
        });
        let status = status_at(&scheduled, Fault::Healthy, 1);
        assert_eq!(condition(&status, "PodScheduled"), &by_scheduler);
    }

    #[test]
    fn init_containers_are_completed_and_sidecars_run() {
        let mut with_init = pod(vec![container("agent", "plugin:v1")]);
        let mut sidecar = container("proxy", "proxy:v1");
        sidecar.restart_policy = Some("Always".into());
        with_init.spec.as_mut().unwrap().init_containers =
            Some(vec![container("setup", "setup:v1"), sidecar]);
        let status = status_at(&with_init, Fault::Healthy, 1);
        let init = status.init_container_statuses.as_ref().unwrap();
        let terminated = init[0].state.as_ref().unwrap().terminated.as_ref().unwrap();
        assert_eq!(
            (terminated.exit_code, terminated.reason.as_deref()),
            (0, Some("Completed"))
        );
        assert!(init[1].ready && init[1].state.as_ref().unwrap().running.is_some());
        assert_eq!(condition(&status, "Ready").status, "True");
    }

    #[test]
    fn pod_without_containers_still_gets_a_status() {
        let empty = pod(vec![]);
        let moment = AgentMoment {
            run: ContainerRun::Running,
            ready: true,
            offer: Offer::Physical,
            next_change: None,
        };
        let status = desired_pod_status(
            &empty,
            &PodStatusInputs {
                moment: &moment,
                started_at: ts(0),
                host_ip: "10.0.0.1",
                node_not_ready: false,
                crash_restart_interval: Duration::from_secs(5),
                now: ts(0),
            },
        );
        assert_eq!(status.container_statuses, Some(vec![]));
        assert_eq!(condition(&status, "Ready").status, "True");
    }
}
