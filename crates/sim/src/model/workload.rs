//! The status the simulated kubelet reports for a workload pod (label
//! `sim.saferollout.dev/workload`) that uses the node's simulated devices.
//!
//! - Run-to-completion pods (`restartPolicy` Never or OnFailure, e.g. probe
//!   pods) run for the workload run time, then end: Succeeded with exit code
//!   0 when every device they use is usable (healthy, advertised, untainted),
//!   else Failed with exit code 1 and the reason in the container's message.
//! - Long-running pods (`Always`) keep Running and Ready.
//! - Either kind fails at once (phase Failed, exit code 1, a
//!   NodePrepareResources message) when a device it was allocated is lost
//!   (a `-dropclaims` driver withdrew it).
//!
//! Every container that uses devices carries `allocatedResourcesStatus` in
//! the kubelet's format (KEP-4680).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{
    Container, ContainerState, ContainerStateTerminated, ContainerStatus, Pod, PodStatus,
    ResourceHealth, ResourceStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::agent::{AgentMoment, ContainerRun, Offer};
use super::devices::Health;
use super::ids;
use super::pod_status::{PodStatusInputs, desired_pod_status, image_of, kubelet_condition};
use super::time::{add, whole_seconds};

/// One device a container uses, as the kubelet would see it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UsedDevice {
    /// `allocatedResourcesStatus[].name`: the extended resource (device
    /// plugin) or `claim:<pod claim name>[/<request>]` (DRA).
    pub status_name: String,
    /// `resources[].resourceID`: the device ID (device plugin) or
    /// `<driver>/<pool>/<device>` (DRA).
    pub resource_id: String,
    pub health: Health,
    /// `resources[].message`: what the DRA driver says about the device's
    /// health (the kubelet passes a driver's message on; device plugins
    /// have none).
    pub health_message: Option<String>,
    /// Why a workload cannot use it, `None` when it can.
    pub problem: Option<String>,
    /// Set when the device was taken away from the pod (`-dropclaims`): the
    /// kubelet's NodePrepareResources failure.
    pub lost: Option<String>,
}

/// The devices each container uses, by container name.
pub type DeviceUse = BTreeMap<String, Vec<UsedDevice>>;

/// Whether the pod runs to completion (its containers are not restarted
/// after succeeding).
pub fn runs_to_completion(pod: &Pod) -> bool {
    matches!(
        pod.spec.as_ref().and_then(|s| s.restart_policy.as_deref()),
        Some("Never" | "OnFailure")
    )
}

/// Whether the pod's phase is final.
pub fn is_terminal(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

/// How the pod ends, once it does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    Succeeded,
    /// Exit code 1 with this message.
    Failed(String),
}

/// The workload's state at `now`: still running (until when, if it ends on
/// its own) or ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WorkloadMoment {
    Running { ends_at: Option<Timestamp> },
    Ended { at: Timestamp, outcome: Outcome },
}

/// Decides where the workload is at `now`. `lost_at` is when the sim first
/// saw a device of the pod lost (the pod ends then, a time that must not
/// move, or its status and log would be rewritten forever).
pub fn workload_moment(
    pod: &Pod,
    devices: &DeviceUse,
    started_at: Timestamp,
    run_time: Duration,
    now: Timestamp,
    lost_at: Option<Timestamp>,
) -> WorkloadMoment {
    let all = || devices.values().flatten();
    if let Some(lost) = all().find_map(|d| d.lost.clone()) {
        return WorkloadMoment::Ended {
            at: lost_at.unwrap_or(now),
            outcome: Outcome::Failed(lost),
        };
    }
    if !runs_to_completion(pod) {
        return WorkloadMoment::Running { ends_at: None };
    }
    let ends_at = add(started_at, run_time);
    if now < ends_at {
        return WorkloadMoment::Running {
            ends_at: Some(ends_at),
        };
    }
    let problems: Vec<String> = all().filter_map(|d| d.problem.clone()).collect();
    let outcome = if problems.is_empty() {
        Outcome::Succeeded
    } else {
        Outcome::Failed(problems.join("; "))
    };
    WorkloadMoment::Ended {
        at: ends_at,
        outcome,
    }
}

/// The kubelet-owned status of a workload pod.
pub fn desired_workload_status(
    pod: &Pod,
    moment: &WorkloadMoment,
    devices: &DeviceUse,
    started_at: Timestamp,
    host_ip: &str,
    now: Timestamp,
) -> PodStatus {
    let running = AgentMoment {
        run: ContainerRun::Running,
        ready: true,
        offer: Offer::Nothing,
        next_change: None,
    };
    let mut status = desired_pod_status(
        pod,
        &PodStatusInputs {
            moment: &running,
            started_at,
            host_ip,
            crash_restart_interval: Duration::ZERO,
            node_not_ready: false,
            now,
        },
    );
    let containers: &[Container] = pod.spec.as_ref().map_or(&[], |s| &s.containers);
    if let WorkloadMoment::Ended { at, outcome } = moment {
        let finished = Time(whole_seconds(*at));
        let started = Time(whole_seconds(started_at));
        let uid = pod.metadata.uid.as_deref().unwrap_or_default();
        let (phase, exit_code, reason, message) = match outcome {
            Outcome::Succeeded => ("Succeeded", 0, "Completed", None),
            Outcome::Failed(message) => ("Failed", 1, "Error", Some(message.clone())),
        };
        status.phase = Some(phase.into());
        status.container_statuses = Some(
            containers
                .iter()
                .map(|c| {
                    let container_id = ids::container_id(uid, &c.name, 0);
                    ContainerStatus {
                        name: c.name.clone(),
                        image: image_of(c),
                        image_id: ids::image_id(&image_of(c)),
                        container_id: Some(container_id.clone()),
                        ready: false,
                        started: Some(false),
                        restart_count: 0,
                        state: Some(ContainerState {
                            terminated: Some(ContainerStateTerminated {
                                exit_code,
                                reason: Some(reason.into()),
                                message: message.clone(),
                                started_at: Some(started.clone()),
                                finished_at: Some(finished.clone()),
                                container_id: Some(container_id),
                                ..ContainerStateTerminated::default()
                            }),
                            ..ContainerState::default()
                        }),
                        last_state: Some(ContainerState::default()),
                        ..ContainerStatus::default()
                    }
                })
                .collect(),
        );
        let existing = pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_deref())
            .unwrap_or_default();
        let generation = pod.metadata.generation;
        let now = whole_seconds(now);
        for condition in status.conditions.iter_mut().flatten() {
            match condition.type_.as_str() {
                "Ready" | "ContainersReady" => {
                    *condition = kubelet_condition(
                        existing,
                        &condition.type_.clone(),
                        false,
                        Some("PodCompleted"),
                        None,
                        generation,
                        now,
                    );
                }
                "PodReadyToStartContainers" => {
                    *condition = kubelet_condition(
                        existing,
                        "PodReadyToStartContainers",
                        false,
                        None,
                        None,
                        generation,
                        now,
                    );
                }
                _ => {}
            }
        }
        if let Outcome::Failed(message) = outcome
            && devices.values().flatten().any(|d| d.lost.is_some())
        {
            status.message = Some(message.clone());
        }
    }
    for container_status in status.container_statuses.iter_mut().flatten() {
        if let Some(used) = devices.get(&container_status.name) {
            container_status.allocated_resources_status = allocated_resources_status(used);
        }
    }
    status
}

/// `allocatedResourcesStatus` of one container: one entry per resource
/// name, devices sorted by ID.
fn allocated_resources_status(used: &[UsedDevice]) -> Option<Vec<ResourceStatus>> {
    // Per resource name: (resource ID, health, message), sorted by ID.
    type Entries<'a> = BTreeSet<(&'a str, Health, Option<&'a str>)>;
    let mut by_name: BTreeMap<&str, Entries<'_>> = BTreeMap::new();
    for device in used {
        by_name.entry(&device.status_name).or_default().insert((
            &device.resource_id,
            device.health,
            device.health_message.as_deref(),
        ));
    }
    if by_name.is_empty() {
        return None;
    }
    Some(
        by_name
            .into_iter()
            .map(|(name, devices)| ResourceStatus {
                name: name.to_owned(),
                resources: Some(
                    devices
                        .into_iter()
                        .map(|(id, health, message)| ResourceHealth {
                            resource_id: id.to_owned(),
                            health: Some(health.as_str().to_owned()),
                            message: message.map(str::to_owned),
                        })
                        .collect(),
                ),
            })
            .collect(),
    )
}

/// What a workload's container prints: a line per device and a verdict.
pub fn workload_log_lines(moment: &WorkloadMoment, devices: &[UsedDevice]) -> Vec<String> {
    let mut lines = vec![format!(
        "sim workload: {} device(s) visible: {}",
        devices.len(),
        devices
            .iter()
            .map(|d| d.resource_id.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    )];
    if let WorkloadMoment::Ended { outcome, .. } = moment {
        for device in devices {
            match &device.problem {
                None => lines.push(format!(
                    "[{}] vector add on {}: Test PASSED",
                    device.status_name, device.resource_id
                )),
                Some(problem) => lines.push(format!("[{}] error: {problem}", device.status_name)),
            }
        }
        lines.push(match outcome {
            Outcome::Succeeded => "Done: all devices usable".to_owned(),
            Outcome::Failed(message) => format!("Test FAILED: {message}"),
        });
    }
    lines
}

/// Device-plugin device IDs for a pod that asks for `count` devices:
/// those it was given before (its status or the sim's memory), else the
/// lowest IDs no other pod holds, as the device manager hands them out.
pub fn assign_plugin_devices(
    previous: Option<&[String]>,
    count: usize,
    taken: &BTreeSet<String>,
) -> Vec<String> {
    if let Some(previous) = previous
        && previous.len() == count
    {
        return previous.to_vec();
    }
    let mut assigned = Vec::with_capacity(count);
    let mut index = 0u64;
    while assigned.len() < count {
        let name = format!("gpu-{index}");
        if !taken.contains(&name) {
            assigned.push(name);
        }
        index += 1;
    }
    assigned
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::PodSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn ts(second: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + second).unwrap()
    }

    fn pod(restart_policy: &str) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some("probe".into()),
                namespace: Some("ns".into()),
                uid: Some("uid-p".into()),
                ..ObjectMeta::default()
            },
            spec: Some(PodSpec {
                restart_policy: Some(restart_policy.into()),
                node_name: Some("node-1".into()),
                containers: vec![Container {
                    name: "work".into(),
                    image: Some("cuda:1".into()),
                    ..Container::default()
                }],
                ..PodSpec::default()
            }),
            status: None,
        }
    }

    fn used(health: Health, problem: Option<&str>, lost: Option<&str>) -> DeviceUse {
        BTreeMap::from([(
            "work".to_owned(),
            vec![UsedDevice {
                status_name: "example.com/gpu".into(),
                resource_id: "gpu-0".into(),
                health,
                health_message: None,
                problem: problem.map(Into::into),
                lost: lost.map(Into::into),
            }],
        )])
    }

    #[test]
    fn probe_runs_then_succeeds_on_usable_devices() {
        let pod = pod("Never");
        let devices = used(Health::Healthy, None, None);
        let run = Duration::from_secs(2);
        let m = workload_moment(&pod, &devices, ts(0), run, ts(1), None);
        assert_eq!(
            m,
            WorkloadMoment::Running {
                ends_at: Some(ts(2))
            }
        );
        let status = desired_workload_status(&pod, &m, &devices, ts(0), "127.0.0.1", ts(1));
        assert_eq!(status.phase.as_deref(), Some("Running"));
        let c = &status.container_statuses.as_ref().unwrap()[0];
        assert!(c.ready);
        let rs = c.allocated_resources_status.as_ref().unwrap();
        assert_eq!(rs[0].name, "example.com/gpu");
        let health = &rs[0].resources.as_ref().unwrap()[0];
        assert_eq!(
            (health.resource_id.as_str(), health.health.as_deref()),
            ("gpu-0", Some("Healthy"))
        );

        let m = workload_moment(&pod, &devices, ts(0), run, ts(3), None);
        assert_eq!(
            m,
            WorkloadMoment::Ended {
                at: ts(2),
                outcome: Outcome::Succeeded
            }
        );
        let status = desired_workload_status(&pod, &m, &devices, ts(0), "127.0.0.1", ts(3));
        assert_eq!(status.phase.as_deref(), Some("Succeeded"));
        let t = status.container_statuses.as_ref().unwrap()[0]
            .state
            .as_ref()
            .unwrap()
            .terminated
            .clone()
            .unwrap();
        assert_eq!((t.exit_code, t.reason.as_deref()), (0, Some("Completed")));
        assert_eq!(t.finished_at, Some(Time(ts(2))));
        let ready = status
            .conditions
            .as_ref()
            .unwrap()
            .iter()
            .find(|c| c.type_ == "Ready")
            .unwrap();
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_deref()),
            ("False", Some("PodCompleted"))
        );
        let lines = workload_log_lines(&m, &devices["work"]);
        assert!(
            lines.last().unwrap().contains("all devices usable"),
            "{lines:?}"
        );
    }

    #[test]
    fn probe_fails_on_unusable_devices_with_the_reason() {
        let pod = pod("OnFailure");
        let devices = used(
            Health::Unhealthy,
            Some("device gpu-0 is not advertised"),
            None,
        );
        let m = workload_moment(&pod, &devices, ts(0), Duration::from_secs(1), ts(5), None);
        let WorkloadMoment::Ended {
            outcome: Outcome::Failed(message),
            ..
        } = &m
        else {
            panic!("{m:?}")
        };
        assert!(message.contains("not advertised"));
        let status = desired_workload_status(&pod, &m, &devices, ts(0), "127.0.0.1", ts(5));
        assert_eq!(status.phase.as_deref(), Some("Failed"));
        let t = status.container_statuses.as_ref().unwrap()[0]
            .state
            .as_ref()
            .unwrap()
            .terminated
            .clone()
            .unwrap();
        assert_eq!(t.exit_code, 1);
        assert_eq!(t.reason.as_deref(), Some("Error"));
        assert!(t.message.unwrap().contains("not advertised"));
        assert_eq!(
            status.message, None,
            "only lost devices set the pod message"
        );
        let lines = workload_log_lines(&m, &devices["work"]);
        assert!(lines.iter().any(|l| l.contains("Test FAILED")), "{lines:?}");
    }

    #[test]
    fn long_running_pods_keep_running_until_their_devices_are_lost() {
        let pod = pod("Always");
        let devices = used(Health::Unknown, Some("unknown"), None);
        let m = workload_moment(&pod, &devices, ts(0), Duration::from_secs(1), ts(100), None);
        assert_eq!(m, WorkloadMoment::Running { ends_at: None });
        let status = desired_workload_status(&pod, &m, &devices, ts(0), "127.0.0.1", ts(100));
        assert_eq!(status.phase.as_deref(), Some("Running"));
        let rs = status.container_statuses.as_ref().unwrap()[0]
            .allocated_resources_status
            .clone()
            .unwrap();
        assert_eq!(
            rs[0].resources.as_ref().unwrap()[0].health.as_deref(),
            Some("Unknown")
        );

        let lost = used(
            Health::Unhealthy,
            Some("gone"),
            Some("NodePrepareResources failed for ResourceClaim c: device gone"),
        );
        let m = workload_moment(
            &pod,
            &lost,
            ts(0),
            Duration::from_secs(1),
            ts(100),
            Some(ts(90)),
        );
        assert!(matches!(m, WorkloadMoment::Ended { at, .. } if at == ts(90)));
        let status = desired_workload_status(&pod, &m, &lost, ts(0), "127.0.0.1", ts(100));
        assert_eq!(status.phase.as_deref(), Some("Failed"));
        assert!(status.message.unwrap().contains("NodePrepareResources"));
    }

    #[test]
    fn plugin_devices_are_handed_out_lowest_first_and_kept() {
        let taken = BTreeSet::from(["gpu-0".to_owned(), "gpu-2".to_owned()]);
        assert_eq!(assign_plugin_devices(None, 2, &taken), ["gpu-1", "gpu-3"]);
        let previous = vec!["gpu-5".to_owned()];
        assert_eq!(assign_plugin_devices(Some(&previous), 1, &taken), ["gpu-5"]);
        // A changed request is assigned afresh.
        assert_eq!(
            assign_plugin_devices(Some(&previous), 2, &taken),
            ["gpu-1", "gpu-3"]
        );
    }
}
