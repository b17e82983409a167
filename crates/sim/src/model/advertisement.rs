//! What a node advertises for one extended resource, following the kubelet
//! device manager: a registered plugin sets capacity = allocatable = its
//! device count; when its endpoint stops, allocatable drops to 0 at the next
//! node-status update (`status_delay`) while capacity keeps the old count
//! until `endpoint_stop_grace` has passed, after which the resource is
//! removed from both.

use jiff::Timestamp;

use super::agent::Timings;
use super::time::add;

/// The simulated device manager's record of one resource's plugin endpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endpoint {
    /// A plugin is registered and reports `devices`, `unhealthy` of them
    /// Unhealthy (not allocatable).
    Registered { devices: u64, unhealthy: u64 },
    /// The plugin endpoint stopped at `since`, having last reported
    /// `devices`, `unhealthy` of them Unhealthy.
    Stopped {
        since: Timestamp,
        devices: u64,
        unhealthy: u64,
    },
}

/// Advances the endpoint record to `now`.
///
/// `plugin_devices` is what the running plugin reports (`None`: no plugin):
/// its devices and how many of them are unhealthy.
/// `owned_capacity` is the capacity the sim finds on the node for a resource
/// it wrote there earlier; it stands in for a lost record after a restart of
/// the sim, so a stale advertisement still goes through the grace period and
/// gets removed.
pub fn next_endpoint(
    previous: Option<Endpoint>,
    plugin_devices: Option<(u64, u64)>,
    owned_capacity: Option<u64>,
    now: Timestamp,
) -> Option<Endpoint> {
    match (plugin_devices, previous) {
        (Some((devices, unhealthy)), _) => Some(Endpoint::Registered { devices, unhealthy }),
        (None, Some(Endpoint::Registered { devices, unhealthy })) => Some(Endpoint::Stopped {
            since: now,
            devices,
            unhealthy,
        }),
        (None, Some(stopped @ Endpoint::Stopped { .. })) => Some(stopped),
        (None, None) => owned_capacity.map(|devices| Endpoint::Stopped {
            since: now,
            devices,
            unhealthy: 0,
        }),
    }
}

/// A resource's entries in node `status.capacity` / `status.allocatable`;
/// `None` means the key is absent.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ResourceEntries {
    pub capacity: Option<String>,
    pub allocatable: Option<String>,
}

/// What the node should show for the resource, and when that changes next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AdvertisementPlan {
    pub entries: ResourceEntries,
    pub next_change: Option<Timestamp>,
    /// The record has run its course (the resource is gone from the node)
    /// and can be dropped once the node shows `entries`.
    pub finished: bool,
}

/// The node entries an endpoint record calls for at `now`.
pub fn advertisement(endpoint: &Endpoint, now: Timestamp, timings: &Timings) -> AdvertisementPlan {
    match *endpoint {
        Endpoint::Registered { devices, unhealthy } => AdvertisementPlan {
            entries: ResourceEntries {
                capacity: Some(count(devices)),
                allocatable: Some(count(devices.saturating_sub(unhealthy))),
            },
            next_change: None,
            finished: false,
        },
        Endpoint::Stopped {
            since,
            devices,
            unhealthy,
        } => {
            let zeroed_at = add(since, timings.status_delay);
            let removed_at = add(since, timings.endpoint_stop_grace);
            if now >= removed_at {
                return AdvertisementPlan {
                    entries: ResourceEntries::default(),
                    next_change: None,
                    finished: true,
                };
            }
            let entries = if now >= zeroed_at {
                ResourceEntries {
                    capacity: Some(count(devices)),
                    allocatable: Some("0".into()),
                }
            } else {
                // Until the node status catches up it shows what the plugin
                // last reported, unhealthy devices not allocatable.
                ResourceEntries {
                    capacity: Some(count(devices)),
                    allocatable: Some(count(devices.saturating_sub(unhealthy))),
                }
            };
            let next_change = [zeroed_at, removed_at]
                .into_iter()
                .filter(|&t| t > now)
                .min();
            AdvertisementPlan {
                entries,
                next_change,
                finished: false,
            }
        }
    }
}

/// A whole count as the API server writes it back (its canonical decimal
/// form: `8`, `1500`, `8k`, `16M`), so what the sim writes and what it reads
/// back compare equal and it never rewrites a value the server reformatted.
pub fn count(n: u64) -> String {
    const SUFFIXES: [&str; 7] = ["", "k", "M", "G", "T", "P", "E"];
    let (mut n, mut i) = (n, 0);
    while n != 0 && n % 1000 == 0 && i + 1 < SUFFIXES.len() {
        n /= 1000;
        i += 1;
    }
    format!("{n}{}", SUFFIXES[i])
}

/// Reads a quantity as a whole count (`8`, `8k`, `2Ki`); anything else (which
/// the sim never writes) counts as 0.
pub fn parse_count(quantity: &str) -> u64 {
    kube_quantity::ParsedQuantity::try_from(quantity.trim())
        .ok()
        .and_then(|q| q.to_bytes_f64())
        .filter(|v| v.is_finite() && *v >= 0.0 && v.fract() == 0.0)
        .map_or(0, |v| v as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn counts_are_written_as_the_api_server_writes_them_back() {
        for (n, text) in [
            (0, "0"),
            (8, "8"),
            (1500, "1500"),
            (8000, "8k"),
            (16_000_000, "16M"),
        ] {
            assert_eq!(count(n), text);
            assert_eq!(parse_count(text), n);
        }
        assert_eq!(parse_count("2Ki"), 2048);
        assert_eq!(parse_count("500m"), 0);
    }

    fn ts(second: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + second).unwrap()
    }

    fn entries(capacity: Option<&str>, allocatable: Option<&str>) -> ResourceEntries {
        ResourceEntries {
            capacity: capacity.map(Into::into),
            allocatable: allocatable.map(Into::into),
        }
    }

    #[test]
    fn endpoint_record_follows_the_plugin() {
        let registered = next_endpoint(None, Some((4, 0)), None, ts(0));
        assert_eq!(
            registered,
            Some(Endpoint::Registered {
                devices: 4,
                unhealthy: 0
            })
        );
        let changed = next_endpoint(registered, Some((0, 0)), None, ts(1));
        assert_eq!(
            changed,
            Some(Endpoint::Registered {
                devices: 0,
                unhealthy: 0
            })
        );

        let stopped = next_endpoint(
            Some(Endpoint::Registered {
                devices: 4,
                unhealthy: 0,
            }),
            None,
            None,
            ts(5),
        );
        assert_eq!(
            stopped,
            Some(Endpoint::Stopped {
                since: ts(5),
                devices: 4,
                unhealthy: 0,
            })
        );
        // Staying stopped keeps the original stop time.
        assert_eq!(next_endpoint(stopped, None, Some(4), ts(9)), stopped);
        // A replacement plugin registers afresh.
        assert_eq!(
            next_endpoint(stopped, Some((8, 0)), None, ts(9)),
            Some(Endpoint::Registered {
                devices: 8,
                unhealthy: 0
            })
        );
    }

    #[test]
    fn untouched_resources_stay_untouched() {
        assert_eq!(next_endpoint(None, None, None, ts(0)), None);
    }

    #[test]
    fn leftover_advertisement_is_retired_after_a_sim_restart() {
        assert_eq!(
            next_endpoint(None, None, Some(4), ts(7)),
            Some(Endpoint::Stopped {
                since: ts(7),
                devices: 4,
                unhealthy: 0,
            })
        );
    }

    #[test]
    fn registered_plugin_sets_capacity_and_allocatable() {
        let plan = advertisement(
            &Endpoint::Registered {
                devices: 8,
                unhealthy: 0,
            },
            ts(0),
            &Timings::default(),
        );
        assert_eq!(plan.entries, entries(Some("8"), Some("8")));
        assert_eq!(plan.next_change, None);
        assert!(!plan.finished);

        let broken = advertisement(
            &Endpoint::Registered {
                devices: 0,
                unhealthy: 0,
            },
            ts(0),
            &Timings::default(),
        );
        assert_eq!(broken.entries, entries(Some("0"), Some("0")));

        // Unhealthy devices count in capacity, not in allocatable.
        let unhealthy = advertisement(
            &Endpoint::Registered {
                devices: 8,
                unhealthy: 3,
            },
            ts(0),
            &Timings::default(),
        );
        assert_eq!(unhealthy.entries, entries(Some("8"), Some("5")));
    }

    #[test]
    fn stopped_endpoint_zeroes_allocatable_then_drops_the_resource() {
        let timings = Timings::default(); // 1s status delay, 30s grace
        let stopped = Endpoint::Stopped {
            since: ts(100),
            devices: 4,
            unhealthy: 0,
        };

        let before_status_update =
            advertisement(&stopped, add(ts(100), Duration::from_millis(500)), &timings);
        assert_eq!(before_status_update.entries, entries(Some("4"), Some("4")));
        assert_eq!(before_status_update.next_change, Some(ts(101)));

        let in_grace = advertisement(&stopped, ts(101), &timings);
        assert_eq!(in_grace.entries, entries(Some("4"), Some("0")));
        assert_eq!(in_grace.next_change, Some(ts(130)));
        assert!(!in_grace.finished);

        let gone = advertisement(&stopped, ts(130), &timings);
        assert_eq!(gone.entries, entries(None, None));
        assert_eq!(gone.next_change, None);
        assert!(gone.finished);
    }

    #[test]
    fn grace_shorter_than_status_delay_removes_at_grace() {
        let timings = Timings {
            status_delay: Duration::from_secs(10),
            endpoint_stop_grace: Duration::from_secs(2),
            ..Timings::default()
        };
        let stopped = Endpoint::Stopped {
            since: ts(0),
            devices: 4,
            unhealthy: 0,
        };
        let early = advertisement(&stopped, ts(1), &timings);
        assert_eq!(early.entries, entries(Some("4"), Some("4")));
        assert_eq!(early.next_change, Some(ts(2)));
        assert!(advertisement(&stopped, ts(2), &timings).finished);
    }

    #[test]
    fn counts_parse_leniently() {
        assert_eq!(parse_count("8"), 8);
        assert_eq!(parse_count(" 3 "), 3);
        // Quantities in any notation (the doc above): 1k is 1000.
        assert_eq!(parse_count("1k"), 1000);
        assert_eq!(parse_count("2Ki"), 2048);
        assert_eq!(parse_count("500m"), 0);
        assert_eq!(parse_count(""), 0);
        assert_eq!(parse_count("eight"), 0);
    }

    #[test]
    fn stopping_plugin_with_unhealthy_devices_never_shows_them_allocatable() {
        let stopped = next_endpoint(
            Some(Endpoint::Registered {
                devices: 8,
                unhealthy: 8,
            }),
            None,
            None,
            ts(0),
        )
        .unwrap();
        let plan = advertisement(&stopped, ts(0), &Timings::default());
        assert_eq!(plan.entries, entries(Some("8"), Some("0")));
    }
}
