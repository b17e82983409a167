//! Maintenance windows (`spec.maintenanceWindows` of a policy): when a
//! governed rollout may start a stage, and when the next window opens.
//!
//! A window is weekly: on each of its days, from `start` to `end` local
//! time in its IANA time zone; an `end` earlier than `start` crosses
//! midnight and belongs to the day it opens on. Local times are turned into
//! instants with jiff's "compatible" rule (RFC 5545's, java.time's): a time
//! skipped by a daylight-saving change is moved forward by the length of
//! the gap (02:30 on the spring-forward night in Paris is 03:30 CEST), a
//! time that happens twice is its first occurrence. So a window is one
//! interval of instants per day it opens on; it may last an hour less or
//! more on a change day, and an occurrence a change leaves empty (02:30 to
//! 03:00 on the spring-forward night: 03:30 to 03:00) does not open.
//!
//! Only starting is held: the caller asks [`may_start`] before starting a
//! stage (or the next node of one); a node in progress finishes when the
//! window closes. A revert is never held: [`may_start`] takes the kind of
//! change, and a [`Change::Revert`] starts without the windows being read.
//!
//! Pure: the caller passes the time.

use jiff::civil::{self, Date, Time};
use jiff::tz::TimeZone;
use jiff::{Timestamp, Zoned};
use saferollout_api::{MaintenanceWindow, Weekday};

/// A window, parsed: its time zone looked up.
#[derive(Debug, Clone)]
pub struct Window {
    days: [bool; 7],
    start: Time,
    end: Time,
    zone: TimeZone,
}

/// A window that cannot be used (the client-side validator refuses each of
/// these; the API server only the malformed ones).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WindowError {
    #[error("maintenanceWindows[{index}].timeZone: {zone:?} is not a time zone the operator knows")]
    UnknownTimeZone { index: usize, zone: String },
    #[error("maintenanceWindows[{index}].{field}: {value:?} is not a time of day HH:MM")]
    BadTime {
        index: usize,
        field: &'static str,
        value: String,
    },
    #[error("maintenanceWindows[{index}]: start and end are equal")]
    Empty { index: usize },
}

fn civil_weekday(day: Weekday) -> civil::Weekday {
    match day {
        Weekday::Monday => civil::Weekday::Monday,
        Weekday::Tuesday => civil::Weekday::Tuesday,
        Weekday::Wednesday => civil::Weekday::Wednesday,
        Weekday::Thursday => civil::Weekday::Thursday,
        Weekday::Friday => civil::Weekday::Friday,
        Weekday::Saturday => civil::Weekday::Saturday,
        Weekday::Sunday => civil::Weekday::Sunday,
    }
}

impl Window {
    /// Parses `spec.maintenanceWindows[index]`.
    pub fn parse(index: usize, w: &MaintenanceWindow) -> Result<Self, WindowError> {
        let time = |field: &'static str, value: &str, parsed: Option<(i8, i8)>| {
            parsed
                .and_then(|(h, m)| Time::new(h, m, 0, 0).ok())
                .ok_or_else(|| WindowError::BadTime {
                    index,
                    field,
                    value: value.to_string(),
                })
        };
        let start = time("start", &w.start, w.start_time())?;
        let end = time("end", &w.end, w.end_time())?;
        if start == end {
            return Err(WindowError::Empty { index });
        }
        let zone = TimeZone::get(&w.time_zone).map_err(|_| WindowError::UnknownTimeZone {
            index,
            zone: w.time_zone.clone(),
        })?;
        let mut days = [false; 7];
        for d in &w.days {
            days[civil_weekday(*d).to_monday_zero_offset() as usize] = true;
        }
        Ok(Window {
            days,
            start,
            end,
            zone,
        })
    }

    /// The occurrence opening on local date `date`, as [open, close): `None`
    /// when the window does not open that day or a daylight-saving change
    /// leaves it empty.
    fn occurrence(&self, date: Date) -> Option<(Zoned, Timestamp)> {
        if !self.days[date.weekday().to_monday_zero_offset() as usize] {
            return None;
        }
        let close_date = if self.end < self.start {
            date.tomorrow().ok()?
        } else {
            date
        };
        let open = date
            .to_datetime(self.start)
            .to_zoned(self.zone.clone())
            .ok()?;
        let close = close_date
            .to_datetime(self.end)
            .to_zoned(self.zone.clone())
            .ok()?
            .timestamp();
        (open.timestamp() < close).then_some((open, close))
    }

    /// The occurrences that could contain or follow `now` within a week,
    /// in order: from the day before now's local date (one crossing
    /// midnight into today) to eight days after.
    fn occurrences_around(&self, now: Timestamp) -> impl Iterator<Item = (Zoned, Timestamp)> + '_ {
        let today = now.to_zoned(self.zone.clone()).date();
        (-1..=8).filter_map(move |offset: i64| {
            let date = today.checked_add(jiff::Span::new().days(offset)).ok()?;
            self.occurrence(date)
        })
    }

    /// Whether this window is open at `now`.
    pub fn contains(&self, now: Timestamp) -> bool {
        self.occurrences_around(now)
            .any(|(open, close)| open.timestamp() <= now && now < close)
    }
}

/// Parses every window of a policy; the first unusable one is the error.
pub fn parse(windows: &[MaintenanceWindow]) -> Result<Vec<Window>, WindowError> {
    windows
        .iter()
        .enumerate()
        .map(|(i, w)| Window::parse(i, w))
        .collect()
}

/// Whether a stage may start at `now`: inside any window, or always when
/// the policy has none.
pub fn is_open(windows: &[Window], now: Timestamp) -> bool {
    windows.is_empty() || windows.iter().any(|w| w.contains(now))
}

/// The first instant at or after `now` at which a window is open, in that
/// window's time zone (for "next window: Sat 22:00 CET"): `now` itself when
/// one is open now, or always when there are none. `None` only when no
/// window opens within the next eight days, which a validated policy rules
/// out (every window has a day and a non-empty span).
pub fn next_open(windows: &[Window], now: Timestamp) -> Option<Zoned> {
    if windows.is_empty() {
        return Some(now.to_zoned(TimeZone::UTC));
    }
    let mut best: Option<Zoned> = None;
    for w in windows {
        for (open, close) in w.occurrences_around(now) {
            let at = if open.timestamp() <= now && now < close {
                now.to_zoned(w.zone.clone())
            } else if open.timestamp() > now {
                open
            } else {
                continue;
            };
            if best.as_ref().is_none_or(|b| at.timestamp() < b.timestamp()) {
                best = Some(at);
            }
        }
    }
    best
}

/// What a rollout is about to start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// A stage (or the next node of one) of the new revision.
    Forward,
    /// Going back to the last good revision: never held by a window, since
    /// holding it would leave a failed agent in place.
    Revert,
}

/// Whether a change may start now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admission {
    Start,
    /// Outside every window; the next opens then (`None`: never, see
    /// [`next_open`]).
    Wait {
        next_open: Option<Zoned>,
    },
}

impl Admission {
    /// The message of a waiting rollout's condition.
    pub fn message(&self, policy: &str) -> Option<String> {
        match self {
            Admission::Start => None,
            Admission::Wait {
                next_open: Some(at),
            } => Some(format!(
                "waiting for a maintenance window of SafeRolloutPolicy {policy}: the next opens {}",
                at.strftime("%A %Y-%m-%d %H:%M %Z (%:z)")
            )),
            Admission::Wait { next_open: None } => Some(format!(
                "waiting for a maintenance window of SafeRolloutPolicy {policy}: none opens in the next week"
            )),
        }
    }
}

/// Whether `change` may start at `now` under `windows`. A revert always
/// starts: the windows are not read.
pub fn may_start(change: Change, windows: &[Window], now: Timestamp) -> Admission {
    match change {
        Change::Revert => Admission::Start,
        Change::Forward if is_open(windows, now) => Admission::Start,
        Change::Forward => Admission::Wait {
            next_open: next_open(windows, now),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window(days: &[Weekday], start: &str, end: &str, tz: &str) -> Window {
        Window::parse(
            0,
            &MaintenanceWindow {
                days: days.to_vec(),
                start: start.into(),
                end: end.into(),
                time_zone: tz.into(),
            },
        )
        .unwrap()
    }

    fn ts(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    #[test]
    fn no_windows_is_always_open() {
        let now = ts("2026-12-06T03:00:00Z");
        assert!(is_open(&[], now));
        assert_eq!(next_open(&[], now).unwrap().timestamp(), now);
        assert_eq!(may_start(Change::Forward, &[], now), Admission::Start);
    }

    #[test]
    fn a_window_crossing_midnight_belongs_to_the_day_it_opens() {
        // Friday 22:00 to Saturday 02:00 UTC. 2026-12-04 is a Friday.
        let w = [window(&[Weekday::Friday], "22:00", "02:00", "UTC")];
        assert!(!is_open(&w, ts("2026-12-04T21:59:59Z")));
        assert!(is_open(&w, ts("2026-12-04T22:00:00Z")));
        assert!(is_open(&w, ts("2026-12-05T01:59:59Z")));
        assert!(!is_open(&w, ts("2026-12-05T02:00:00Z")));
        // Not opened on Saturday night: Saturday is not one of its days.
        assert!(!is_open(&w, ts("2026-12-05T23:00:00Z")));
        // Thursday night is not inside either.
        assert!(!is_open(&w, ts("2026-12-04T01:00:00Z")));
        assert_eq!(
            next_open(&w, ts("2026-12-05T03:00:00Z"))
                .unwrap()
                .timestamp(),
            ts("2026-12-11T22:00:00Z")
        );
        assert_eq!(
            next_open(&w, ts("2026-12-05T01:00:00Z"))
                .unwrap()
                .timestamp(),
            ts("2026-12-05T01:00:00Z"),
            "open now: now"
        );
    }

    #[test]
    fn the_earliest_of_several_windows_in_several_zones_is_next() {
        let w = [
            window(&[Weekday::Sunday], "03:00", "05:00", "Europe/Paris"),
            window(&[Weekday::Saturday], "20:00", "23:00", "America/New_York"),
        ];
        // Saturday 2026-12-05 12:00Z: New York opens 20:00 EST = Sunday 01:00Z,
        // Paris Sunday 03:00 CET = 02:00Z.
        let next = next_open(&w, ts("2026-12-05T12:00:00Z")).unwrap();
        assert_eq!(next.timestamp(), ts("2026-12-06T01:00:00Z"));
        assert_eq!(next.time_zone().iana_name(), Some("America/New_York"));
        assert_eq!(next.hour(), 20);
    }

    #[test]
    fn paris_spring_forward_shortens_a_window_and_moves_a_skipped_start() {
        // 2026-03-29 (Sunday): 02:00 CET becomes 03:00 CEST (01:00Z).
        let w = [window(&[Weekday::Sunday], "01:00", "04:00", "Europe/Paris")];
        // 01:00 CET = 00:00Z; 04:00 CEST = 02:00Z: two hours, not three.
        assert!(!is_open(&w, ts("2026-03-28T23:59:59Z")));
        assert!(is_open(&w, ts("2026-03-29T00:00:00Z")));
        assert!(is_open(&w, ts("2026-03-29T01:30:00Z")));
        assert!(!is_open(&w, ts("2026-03-29T02:00:00Z")));

        // A start inside the gap opens at the same local time plus the gap.
        let skipped = [window(&[Weekday::Sunday], "02:30", "05:00", "Europe/Paris")];
        let next = next_open(&skipped, ts("2026-03-28T12:00:00Z")).unwrap();
        assert_eq!(next.timestamp(), ts("2026-03-29T01:30:00Z"));
        assert_eq!((next.hour(), next.minute()), (3, 30));
        assert!(!is_open(&skipped, ts("2026-03-29T01:00:00Z")));
        assert!(is_open(&skipped, ts("2026-03-29T01:30:00Z")));
        // A week later, no change: 02:30 CEST = 00:30Z.
        assert_eq!(
            next_open(&skipped, ts("2026-03-29T04:00:00Z"))
                .unwrap()
                .timestamp(),
            ts("2026-04-05T00:30:00Z")
        );

        // A window wholly inside the gap's shadow is empty that night only.
        let shadow = [window(&[Weekday::Sunday], "02:30", "03:00", "Europe/Paris")];
        assert_eq!(
            next_open(&shadow, ts("2026-03-28T12:00:00Z"))
                .unwrap()
                .timestamp(),
            ts("2026-04-05T00:30:00Z")
        );
    }

    #[test]
    fn paris_fall_back_lengthens_a_window_across_the_repeated_hour() {
        // 2026-10-25 (Sunday): 03:00 CEST becomes 02:00 CET (01:00Z).
        let w = [window(&[Weekday::Sunday], "02:30", "03:30", "Europe/Paris")];
        // 02:30 is ambiguous: its first occurrence, CEST = 00:30Z; 03:30 CET = 02:30Z.
        assert!(!is_open(&w, ts("2026-10-25T00:29:59Z")));
        assert!(is_open(&w, ts("2026-10-25T00:30:00Z")));
        // 02:45 CET, the repeated hour's second pass: still open.
        assert!(is_open(&w, ts("2026-10-25T01:45:00Z")));
        assert!(!is_open(&w, ts("2026-10-25T02:30:00Z")));
    }

    #[test]
    fn new_york_dst_days() {
        // 2026-03-08 (Sunday): 02:00 EST becomes 03:00 EDT (07:00Z).
        let spring = [window(
            &[Weekday::Sunday],
            "01:00",
            "03:00",
            "America/New_York",
        )];
        // 01:00 EST = 06:00Z to 03:00 EDT = 07:00Z: one hour.
        assert!(is_open(&spring, ts("2026-03-08T06:30:00Z")));
        assert!(!is_open(&spring, ts("2026-03-08T07:00:00Z")));
        // A Saturday-night window crossing into the change.
        let night = [window(
            &[Weekday::Saturday],
            "23:00",
            "03:00",
            "America/New_York",
        )];
        // 23:00 EST Saturday = 04:00Z; 03:00 EDT Sunday = 07:00Z: three hours.
        assert!(is_open(&night, ts("2026-03-08T04:00:00Z")));
        assert!(is_open(&night, ts("2026-03-08T06:59:59Z")));
        assert!(!is_open(&night, ts("2026-03-08T07:00:00Z")));

        // 2026-11-01 (Sunday): 02:00 EDT becomes 01:00 EST (06:00Z).
        let fall = [window(
            &[Weekday::Sunday],
            "01:30",
            "02:30",
            "America/New_York",
        )];
        // 01:30 is ambiguous: first occurrence EDT = 05:30Z; 02:30 EST = 07:30Z.
        assert!(!is_open(&fall, ts("2026-11-01T05:29:00Z")));
        assert!(is_open(&fall, ts("2026-11-01T05:30:00Z")));
        assert!(is_open(&fall, ts("2026-11-01T07:00:00Z")));
        assert!(!is_open(&fall, ts("2026-11-01T07:30:00Z")));
    }

    #[test]
    fn a_revert_is_never_held_and_a_forward_change_waits_for_the_next_window() {
        let w = [window(
            &[Weekday::Saturday],
            "22:00",
            "04:00",
            "Europe/Paris",
        )];
        let tuesday = ts("2026-12-08T10:00:00Z");
        assert_eq!(may_start(Change::Revert, &w, tuesday), Admission::Start);
        let wait = may_start(Change::Forward, &w, tuesday);
        let Admission::Wait {
            next_open: Some(at),
        } = &wait
        else {
            panic!("{wait:?}");
        };
        assert_eq!(at.timestamp(), ts("2026-12-12T21:00:00Z"));
        assert_eq!(
            wait.message("gpu-stack").unwrap(),
            "waiting for a maintenance window of SafeRolloutPolicy gpu-stack: the next opens Saturday 2026-12-12 22:00 CET (+01:00)"
        );
        assert_eq!(
            may_start(Change::Forward, &w, ts("2026-12-13T02:00:00Z")),
            Admission::Start
        );
    }

    #[test]
    fn unusable_windows_are_errors() {
        let mut w = MaintenanceWindow {
            days: vec![Weekday::Monday],
            start: "22:00".into(),
            end: "02:00".into(),
            time_zone: "Mars/Olympus_Mons".into(),
        };
        assert_eq!(
            parse(std::slice::from_ref(&w)).unwrap_err(),
            WindowError::UnknownTimeZone {
                index: 0,
                zone: "Mars/Olympus_Mons".into()
            }
        );
        w.time_zone = "UTC".into();
        w.end = "22:00".into();
        assert_eq!(
            Window::parse(3, &w).unwrap_err(),
            WindowError::Empty { index: 3 }
        );
        w.start = "25:00".into();
        assert!(matches!(
            Window::parse(0, &w),
            Err(WindowError::BadTime { field: "start", .. })
        ));
    }

    #[test]
    fn the_bundled_database_resolves_zones_without_the_system_one() {
        // tzdb-bundle-always: the operator's image may have no
        // /usr/share/zoneinfo; the bundled copy must know the zones.
        let bundled = jiff::tz::TimeZoneDatabase::bundled();
        for zone in ["Europe/Paris", "America/New_York", "Asia/Kolkata", "UTC"] {
            assert!(bundled.get(zone).is_ok(), "{zone}");
        }
    }
}
