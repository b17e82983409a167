//! Small, saturating timestamp arithmetic.

use std::time::Duration;

use jiff::Timestamp;

/// `at + duration`, saturating at the end of time.
pub fn add(at: Timestamp, duration: Duration) -> Timestamp {
    at.saturating_add(duration).unwrap_or(Timestamp::MAX)
}

/// Time from `since` to `now`; zero when `now` is earlier.
pub fn elapsed(since: Timestamp, now: Timestamp) -> Duration {
    Duration::try_from(now.duration_since(since)).unwrap_or(Duration::ZERO)
}

/// `start + index * period`, saturating.
pub fn nth_boundary(start: Timestamp, period: Duration, index: u128) -> Timestamp {
    let nanos = period.as_nanos().saturating_mul(index);
    let Ok(seconds) = u64::try_from(nanos / 1_000_000_000) else {
        return Timestamp::MAX;
    };
    let subsec = u32::try_from(nanos % 1_000_000_000).expect("below one billion");
    add(start, Duration::new(seconds, subsec))
}

/// `at` without its fraction of a second: API timestamps carry whole seconds,
/// so anything compared with what the API server returns must too.
pub fn whole_seconds(at: Timestamp) -> Timestamp {
    Timestamp::from_second(at.as_second()).unwrap_or(at)
}

/// The first whole second after `ready`: when the sim writes the report of
/// an agent whose pod became Ready at `ready` (the node's status with the new
/// plugin's devices, a new driver's slices). API times keep whole seconds,
/// so anything written in `ready`'s own second cannot be told from what was
/// written before the Ready, and a gate judges only what was written after
/// it (`saferollout_core::gates::freshness`).
pub fn reported_after(ready: Timestamp) -> Timestamp {
    Timestamp::from_second(ready.as_second().saturating_add(1)).unwrap_or(Timestamp::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arithmetic_saturates_and_truncates() {
        let t = Timestamp::from_second(100).unwrap();
        assert_eq!(add(t, Duration::from_secs(5)).as_second(), 105);
        assert_eq!(add(Timestamp::MAX, Duration::from_secs(5)), Timestamp::MAX);
        assert_eq!(
            elapsed(t, add(t, Duration::from_millis(1500))),
            Duration::from_millis(1500)
        );
        assert_eq!(elapsed(add(t, Duration::from_secs(1)), t), Duration::ZERO);
        assert_eq!(nth_boundary(t, Duration::from_secs(4), 3).as_second(), 112);
        assert_eq!(
            nth_boundary(t, Duration::from_secs(4), u128::MAX),
            Timestamp::MAX
        );
        let fractional = Timestamp::new(100, 999_999_999).unwrap();
        assert_eq!(whole_seconds(fractional), t);
        // A report comes in the whole second after the Ready, however late
        // in its second the Ready came.
        assert_eq!(reported_after(t).as_second(), 101);
        assert_eq!(reported_after(fractional).as_second(), 101);
    }
}
