//! The node's devices as its agents present them to the kubelet: which
//! devices an agent advertises, which it reports healthy, which it taints,
//! and which of its devices a workload can actually use.
//!
//! Physical GPUs are `gpu-0` .. `gpu-<n-1>` (n from the node's
//! `sim.saferollout.dev/devices` label); the node label
//! `sim.saferollout.dev/faulty-devices` names the ones that are really
//! broken. Device plugins and DRA drivers use the same device names.

use std::collections::BTreeSet;
use std::time::Duration;

use jiff::Timestamp;

use super::agent::Offer;
use super::slice::gpu_index;
use super::time::add;
use super::{AgentKind, Fault};

/// What a driver reports for a faulty device (and what `-unhealthy` claims).
pub const XID_MESSAGE: &str = "XID 79: GPU has fallen off the bus";

/// Health of a device as the kubelet reports it in `allocatedResourcesStatus`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Health {
    Healthy,
    Unhealthy,
    Unknown,
}

impl Health {
    /// The API's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Healthy => "Healthy",
            Self::Unhealthy => "Unhealthy",
            Self::Unknown => "Unknown",
        }
    }
}

/// Reads the faulty-devices label: device names or bare indices separated
/// by `_`, `.` or `,` (label values allow no commas, annotations do), e.g.
/// `gpu-3_gpu-5` or `3_5`. Anything unreadable is ignored.
pub fn parse_faulty_devices(value: &str) -> BTreeSet<u64> {
    value
        .split(['_', '.', ','])
        .map(str::trim)
        .filter_map(|item| item.parse().ok().or_else(|| gpu_index(item)))
        .collect()
}

/// The node's GPUs: how many, and which are physically faulty.
#[derive(Clone, Copy, Debug)]
pub struct Hardware<'a> {
    pub physical: u64,
    pub faulty: &'a BTreeSet<u64>,
}

/// Where a service is in its health handover.
#[derive(Clone, Copy, Debug)]
pub struct Handover {
    /// Since when no agent serves (`None`: unknown, e.g. never served).
    pub unserved_since: Option<Timestamp>,
    /// How long devices read Unknown after that.
    pub window: Duration,
    pub now: Timestamp,
}

/// What the node's newest agent for one resource (device plugin) or driver
/// (DRA) does right now, as far as its devices' health is concerned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AgentService {
    pub kind: AgentKind,
    pub fault: Fault,
    pub offer: Offer,
    /// Device names it advertises (device plugin) or publishes (DRA driver).
    pub advertised: BTreeSet<String>,
}

impl AgentService {
    /// Whether the agent talks to the kubelet at all.
    pub fn serving(&self) -> bool {
        self.offer.serving()
    }
}

/// Device names a device plugin advertises: `gpu-0` .. for its count.
pub fn plugin_device_names(count: u64) -> BTreeSet<String> {
    (0..count).map(|i| format!("gpu-{i}")).collect()
}

/// GPUs whose devices a driver taints: every one for `-taint`, none for
/// `-cleartaints`, else the physically faulty ones.
pub fn tainted_gpus(fault: Fault, published: u64, faulty: &BTreeSet<u64>) -> BTreeSet<u64> {
    match fault {
        Fault::Taint => (0..published).collect(),
        Fault::ClearTaints => BTreeSet::new(),
        _ => faulty.iter().copied().filter(|&i| i < published).collect(),
    }
}

/// How many of a plugin's `advertised` devices the kubelet counts as
/// allocatable: the healthy ones (the device manager's allocatable excludes
/// devices the plugin reports Unhealthy).
pub fn plugin_healthy_count(fault: Fault, advertised: u64, faulty: &BTreeSet<u64>) -> u64 {
    match fault {
        Fault::Unhealthy => 0,
        Fault::ClearTaints => advertised,
        _ => advertised - faulty.iter().filter(|&&i| i < advertised).count() as u64,
    }
}

/// The health of one device as the kubelet would report it.
///
/// - A serving agent: Unhealthy when it does not advertise the device, when
///   the device does not physically exist (an over-advertising agent's
///   phantoms), when the agent is `-unhealthy`, or when the device is
///   physically faulty (unless a `-cleartaints` agent hides it); Healthy
///   otherwise.
/// - No serving agent (gone, crash-looping, not started): Unknown for the
///   handover window since the last one stopped; after it, a device plugin's
///   devices read Unhealthy (the device manager marks a stopped plugin's
///   devices unhealthy) and a DRA driver's stay Unknown (the kubelet's
///   health cache has nothing newer).
pub fn device_health(
    service: Option<&AgentService>,
    kind: AgentKind,
    device: &str,
    hardware: &Hardware<'_>,
    handover: &Handover,
) -> Health {
    let Hardware { physical, faulty } = *hardware;
    let Handover {
        unserved_since,
        window: handover,
        now,
    } = *handover;
    match service.filter(|s| s.serving()) {
        Some(service) => {
            let index = gpu_index(device);
            let exists = index.is_some_and(|i| i < physical);
            let faulty_here = index.is_some_and(|i| faulty.contains(&i));
            let hidden_fault = faulty_here && service.fault == Fault::ClearTaints;
            if !service.advertised.contains(device)
                || !exists
                || service.fault == Fault::Unhealthy
                || (faulty_here && !hidden_fault)
            {
                Health::Unhealthy
            } else {
                Health::Healthy
            }
        }
        None => {
            let within_handover = unserved_since.is_none_or(|since| now < add(since, handover));
            match (within_handover, kind) {
                (true, _) | (false, AgentKind::DraDriver) => Health::Unknown,
                (false, AgentKind::DevicePlugin) => Health::Unhealthy,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ts(second: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + second).unwrap()
    }

    fn service(kind: AgentKind, fault: Fault, offer: Offer, count: u64) -> AgentService {
        AgentService {
            kind,
            fault,
            offer,
            advertised: plugin_device_names(count),
        }
    }

    #[test]
    fn faulty_devices_label_reads_names_and_indices() {
        assert_eq!(parse_faulty_devices("gpu-3_gpu-5"), BTreeSet::from([3, 5]));
        assert_eq!(parse_faulty_devices("3.5"), BTreeSet::from([3, 5]));
        assert_eq!(parse_faulty_devices("gpu-1,2"), BTreeSet::from([1, 2]));
        assert_eq!(parse_faulty_devices("x_gpu-y_"), BTreeSet::new());
        assert_eq!(parse_faulty_devices(""), BTreeSet::new());
    }

    #[test]
    fn taints_follow_the_fault() {
        let faulty = BTreeSet::from([1, 9]);
        assert_eq!(
            tainted_gpus(Fault::Healthy, 4, &faulty),
            BTreeSet::from([1])
        );
        assert_eq!(
            tainted_gpus(Fault::Taint, 3, &faulty),
            BTreeSet::from([0, 1, 2])
        );
        assert!(tainted_gpus(Fault::ClearTaints, 4, &faulty).is_empty());
    }

    #[test]
    fn plugin_allocatable_counts_healthy_devices() {
        let faulty = BTreeSet::from([1, 9]);
        assert_eq!(plugin_healthy_count(Fault::Healthy, 8, &faulty), 7);
        assert_eq!(plugin_healthy_count(Fault::Healthy, 8, &BTreeSet::new()), 8);
        assert_eq!(plugin_healthy_count(Fault::ClearTaints, 8, &faulty), 8);
        assert_eq!(plugin_healthy_count(Fault::Unhealthy, 8, &faulty), 0);
        assert_eq!(plugin_healthy_count(Fault::Healthy, 0, &faulty), 0);
    }

    #[test]
    fn serving_agents_report_per_device_health() {
        let none = BTreeSet::new();
        let h = |service: &AgentService, device: &str, faulty: &BTreeSet<u64>| {
            device_health(
                Some(service),
                service.kind,
                device,
                &Hardware {
                    physical: 8,
                    faulty,
                },
                &Handover {
                    unserved_since: None,
                    window: Duration::from_secs(5),
                    now: ts(0),
                },
            )
        };
        let healthy = service(AgentKind::DevicePlugin, Fault::Healthy, Offer::Physical, 8);
        assert_eq!(h(&healthy, "gpu-0", &none), Health::Healthy);
        assert_eq!(
            h(&healthy, "gpu-3", &BTreeSet::from([3])),
            Health::Unhealthy
        );
        let laundering = service(AgentKind::DraDriver, Fault::ClearTaints, Offer::Physical, 8);
        assert_eq!(
            h(&laundering, "gpu-3", &BTreeSet::from([3])),
            Health::Healthy
        );
        let unhealthy = service(AgentKind::DraDriver, Fault::Unhealthy, Offer::Physical, 8);
        assert_eq!(h(&unhealthy, "gpu-0", &none), Health::Unhealthy);
        let fewer = service(AgentKind::DevicePlugin, Fault::Fewer, Offer::Half, 4);
        assert_eq!(h(&fewer, "gpu-3", &none), Health::Healthy);
        assert_eq!(h(&fewer, "gpu-4", &none), Health::Unhealthy);
        let over = service(AgentKind::DevicePlugin, Fault::Overcount, Offer::Double, 16);
        assert_eq!(h(&over, "gpu-7", &none), Health::Healthy);
        assert_eq!(
            h(&over, "gpu-12", &none),
            Health::Unhealthy,
            "phantom device"
        );
        let broken = service(AgentKind::DevicePlugin, Fault::Broken, Offer::Broken, 0);
        assert_eq!(h(&broken, "gpu-0", &none), Health::Unhealthy);
        // Partitions are judged by their GPU.
        let mut partitioned = service(AgentKind::DraDriver, Fault::Healthy, Offer::Physical, 0);
        partitioned.advertised.insert("gpu-2-part-1".into());
        assert_eq!(h(&partitioned, "gpu-2-part-1", &none), Health::Healthy);
        assert_eq!(
            h(&partitioned, "gpu-2-part-1", &BTreeSet::from([2])),
            Health::Unhealthy
        );
    }

    #[test]
    fn without_a_serving_agent_health_is_unknown_then_per_kind() {
        let handover = Duration::from_secs(5);
        let none = BTreeSet::new();
        let crashing = service(AgentKind::DevicePlugin, Fault::Crashloop, Offer::Nothing, 0);
        for (service, kind, at, expected) in [
            (None, AgentKind::DevicePlugin, 4, Health::Unknown),
            (Some(&crashing), AgentKind::DevicePlugin, 4, Health::Unknown),
            (None, AgentKind::DevicePlugin, 5, Health::Unhealthy),
            (None, AgentKind::DraDriver, 4, Health::Unknown),
            (None, AgentKind::DraDriver, 500, Health::Unknown),
        ] {
            assert_eq!(
                device_health(
                    service,
                    kind,
                    "gpu-0",
                    &Hardware {
                        physical: 8,
                        faulty: &none
                    },
                    &Handover {
                        unserved_since: Some(ts(0)),
                        window: handover,
                        now: ts(at)
                    },
                ),
                expected,
                "{kind:?} at {at}"
            );
        }
    }
}
