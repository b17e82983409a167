//! What an agent does at a given moment: whether its container runs, whether
//! it is Ready, what it advertises, and when that next changes.

use std::time::Duration;

use jiff::Timestamp;

use super::Fault;
use super::time::{add, elapsed, nth_boundary};

/// Timing knobs of the simulation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timings {
    /// Stand-in for the kubelet's node-status update: how long after a plugin
    /// goes away its allocatable drops to 0 (and a driver's slice is deleted).
    pub status_delay: Duration,
    /// How long the kubelet device manager keeps a stopped plugin's resource
    /// in capacity before removing it.
    pub endpoint_stop_grace: Duration,
    /// How long a `-slow` agent takes to become Ready and advertise.
    pub slow_delay: Duration,
    /// How often a `-flap` agent switches between advertising and not.
    pub flap_period: Duration,
    /// How often a `-crashloop` container is "restarted".
    pub crash_restart_interval: Duration,
    /// How long devices read Unknown in workload pods'
    /// `allocatedResourcesStatus` after their agent stops serving (the
    /// kubelet's DRA health cache times out after 30 s).
    pub health_handover: Duration,
    /// How long a run-to-completion workload pod runs before it ends.
    pub workload_run_time: Duration,
}

impl Default for Timings {
    fn default() -> Self {
        Self {
            status_delay: Duration::from_secs(1),
            endpoint_stop_grace: Duration::from_secs(30),
            slow_delay: Duration::from_secs(20),
            flap_period: Duration::from_secs(4),
            crash_restart_interval: Duration::from_secs(5),
            health_handover: Duration::from_secs(5),
            workload_run_time: Duration::from_secs(1),
        }
    }
}

/// How the agent container is (not) running.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ContainerRun {
    /// Running since the pod started.
    Running,
    /// Back-off after crashing: `restarts` restarts so far, the last attempt
    /// started and died at `last_attempt_at`.
    CrashLooping {
        restarts: u32,
        last_attempt_at: Timestamp,
    },
}

/// What the agent advertises right now, before it is turned into a device
/// count for one role or the other.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Offer {
    /// Not serving: no plugin endpoint is registered, no slice is published.
    Nothing,
    /// Serving, but with no usable device (`-broken`).
    Broken,
    /// Serving, with 0 devices for now (`-flap`'s off phase).
    Zero,
    /// Serving the node's physical devices.
    Physical,
    /// Serving twice the physical devices (`-overcount`).
    Double,
    /// Serving half the physical devices, rounded down (`-fewer`).
    Half,
}

impl Offer {
    /// Devices a device plugin registers with the kubelet; `None` means no
    /// endpoint at all.
    pub fn plugin_devices(self, physical: u64) -> Option<u64> {
        match self {
            Self::Nothing => None,
            Self::Broken | Self::Zero => Some(0),
            Self::Physical => Some(physical),
            Self::Double => Some(physical.saturating_mul(2)),
            Self::Half => Some(physical / 2),
        }
    }

    /// Devices a DRA driver publishes in its slice; `None` means no slice.
    /// A broken driver publishes no slices at all, whereas a flapping one
    /// keeps its (then empty) slice, so its pool generation stays put.
    pub fn driver_devices(self, physical: u64) -> Option<u64> {
        match self {
            Self::Nothing | Self::Broken => None,
            Self::Zero => Some(0),
            Self::Physical => Some(physical),
            Self::Double => Some(physical.saturating_mul(2)),
            Self::Half => Some(physical / 2),
        }
    }

    /// Whether the agent serves at all (a plugin endpoint is registered or
    /// the driver talks to the kubelet), whatever it advertises.
    pub fn serving(self) -> bool {
        self != Self::Nothing
    }
}

/// The agent's behaviour at one moment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AgentMoment {
    pub run: ContainerRun,
    pub ready: bool,
    pub offer: Offer,
    /// When any of the above changes next without outside events.
    pub next_change: Option<Timestamp>,
}

/// The behaviour of an agent with `fault` whose pod the sim started at
/// `started_at`, seen at `now`.
pub fn agent_moment(
    fault: Fault,
    started_at: Timestamp,
    now: Timestamp,
    timings: &Timings,
) -> AgentMoment {
    let steady = |ready, offer| AgentMoment {
        run: ContainerRun::Running,
        ready,
        offer,
        next_change: None,
    };
    match fault {
        Fault::Healthy
        | Fault::Taint
        | Fault::ClearTaints
        | Fault::Unhealthy
        | Fault::DropClaims
        | Fault::FatalLog
        | Fault::NoisyFatal => steady(true, Offer::Physical),
        Fault::Fewer => steady(true, Offer::Half),
        Fault::Broken => steady(true, Offer::Broken),
        Fault::Overcount => steady(true, Offer::Double),
        Fault::Unready => steady(false, Offer::Physical),
        Fault::Slow => {
            let ready_at = add(started_at, timings.slow_delay);
            if now >= ready_at {
                steady(true, Offer::Physical)
            } else {
                AgentMoment {
                    next_change: Some(ready_at),
                    ..steady(false, Offer::Nothing)
                }
            }
        }
        Fault::Flap => {
            let Some((phase, next_change)) = period_of(started_at, now, timings.flap_period) else {
                return steady(true, Offer::Physical);
            };
            let offer = if phase % 2 == 0 {
                Offer::Physical
            } else {
                Offer::Zero
            };
            AgentMoment {
                next_change: Some(next_change),
                ..steady(true, offer)
            }
        }
        Fault::Crashloop => {
            // A zero interval would mean infinitely many restarts.
            let interval = timings
                .crash_restart_interval
                .max(Duration::from_millis(100));
            let (attempt, next_change) =
                period_of(started_at, now, interval).expect("interval is not zero");
            AgentMoment {
                run: ContainerRun::CrashLooping {
                    restarts: u32::try_from(attempt).unwrap_or(u32::MAX),
                    last_attempt_at: nth_boundary(started_at, interval, attempt),
                },
                ready: false,
                offer: Offer::Nothing,
                next_change: Some(next_change),
            }
        }
    }
}

/// Which `period`-long slice of time since `start` `now` falls in (0-based),
/// and when the next one begins; `None` for a zero period.
fn period_of(start: Timestamp, now: Timestamp, period: Duration) -> Option<(u128, Timestamp)> {
    if period.is_zero() {
        return None;
    }
    let index = elapsed(start, now).as_nanos() / period.as_nanos();
    Some((index, nth_boundary(start, period, index + 1)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ts(second: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + second).unwrap()
    }

    fn moment(fault: Fault, at: i64) -> AgentMoment {
        agent_moment(fault, ts(0), ts(at), &Timings::default())
    }

    #[test]
    fn steady_faults_never_change() {
        for (fault, ready, offer) in [
            (Fault::Healthy, true, Offer::Physical),
            (Fault::Broken, true, Offer::Broken),
            (Fault::Overcount, true, Offer::Double),
            (Fault::Unready, false, Offer::Physical),
            (Fault::Fewer, true, Offer::Half),
            (Fault::Taint, true, Offer::Physical),
            (Fault::ClearTaints, true, Offer::Physical),
            (Fault::Unhealthy, true, Offer::Physical),
            (Fault::DropClaims, true, Offer::Physical),
            (Fault::FatalLog, true, Offer::Physical),
            (Fault::NoisyFatal, true, Offer::Physical),
        ] {
            for at in [0, 1, 1000] {
                let m = moment(fault, at);
                assert_eq!(m.run, ContainerRun::Running, "{fault:?}");
                assert_eq!(m.ready, ready, "{fault:?}");
                assert_eq!(m.offer, offer, "{fault:?}");
                assert_eq!(m.next_change, None, "{fault:?}");
            }
        }
    }

    #[test]
    fn slow_agent_serves_after_the_delay() {
        let before = moment(Fault::Slow, 19);
        assert_eq!(before.run, ContainerRun::Running);
        assert!(!before.ready);
        assert_eq!(before.offer, Offer::Nothing);
        assert_eq!(before.next_change, Some(ts(20)));

        let after = moment(Fault::Slow, 20);
        assert!(after.ready);
        assert_eq!(after.offer, Offer::Physical);
        assert_eq!(after.next_change, None);
    }

    #[test]
    fn flapping_agent_alternates_every_period() {
        let expected = [
            (0, Offer::Physical, 4),
            (3, Offer::Physical, 4),
            (4, Offer::Zero, 8),
            (7, Offer::Zero, 8),
            (8, Offer::Physical, 12),
            (13, Offer::Zero, 16),
        ];
        for (at, offer, next) in expected {
            let m = moment(Fault::Flap, at);
            assert!(m.ready);
            assert_eq!(m.offer, offer, "at {at}");
            assert_eq!(m.next_change, Some(ts(next)), "at {at}");
        }
    }

    #[test]
    fn flapping_with_zero_period_stays_on() {
        let timings = Timings {
            flap_period: Duration::ZERO,
            ..Timings::default()
        };
        let m = agent_moment(Fault::Flap, ts(0), ts(9), &timings);
        assert_eq!(m.offer, Offer::Physical);
        assert_eq!(m.next_change, None);
    }

    #[test]
    fn crashlooping_agent_restarts_on_a_timer_and_never_serves() {
        let first = moment(Fault::Crashloop, 0);
        assert_eq!(
            first.run,
            ContainerRun::CrashLooping {
                restarts: 0,
                last_attempt_at: ts(0)
            }
        );
        assert!(!first.ready);
        assert_eq!(first.offer, Offer::Nothing);
        assert_eq!(first.next_change, Some(ts(5)));

        let later = moment(Fault::Crashloop, 17);
        assert_eq!(
            later.run,
            ContainerRun::CrashLooping {
                restarts: 3,
                last_attempt_at: ts(15)
            }
        );
        assert_eq!(later.next_change, Some(ts(20)));
    }

    #[test]
    fn clock_before_start_counts_as_start() {
        let m = moment(Fault::Crashloop, -30);
        assert_eq!(
            m.run,
            ContainerRun::CrashLooping {
                restarts: 0,
                last_attempt_at: ts(0)
            }
        );
    }

    #[test]
    fn offers_per_role() {
        assert_eq!(Offer::Nothing.plugin_devices(4), None);
        assert_eq!(Offer::Broken.plugin_devices(4), Some(0));
        assert_eq!(Offer::Zero.plugin_devices(4), Some(0));
        assert_eq!(Offer::Physical.plugin_devices(4), Some(4));
        assert_eq!(Offer::Double.plugin_devices(4), Some(8));

        assert_eq!(Offer::Nothing.driver_devices(4), None);
        assert_eq!(Offer::Broken.driver_devices(4), None);
        assert_eq!(Offer::Zero.driver_devices(4), Some(0));
        assert_eq!(Offer::Physical.driver_devices(4), Some(4));
        assert_eq!(Offer::Double.driver_devices(4), Some(8));
        assert_eq!(Offer::Half.plugin_devices(5), Some(2));
        assert_eq!(Offer::Half.driver_devices(5), Some(2));
        assert_eq!(Offer::Half.driver_devices(1), Some(0));
        assert!(!Offer::Nothing.serving());
        assert!(Offer::Broken.serving());
    }
}
