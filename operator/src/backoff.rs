//! Backoff arithmetic, kept pure so it can be tested to the cap.

use std::time::Duration;

/// Delay before the next destroy of a tombstone after `attempts` failures: `base`, doubling
/// each time, never more than `cap` (2 minutes to 6 hours by default).
pub fn tombstone_delay(attempts: u32, base: Duration, cap: Duration) -> Duration {
    let doublings = attempts.saturating_sub(1).min(32);
    base.checked_mul(1u32 << doublings.min(31))
        .unwrap_or(cap)
        .min(cap)
}

/// Delay before retrying an object whose reconcile failed `failures` times in a row: 1 s,
/// doubling, at most 5 minutes.
pub fn failure_delay(failures: u32) -> Duration {
    tombstone_delay(
        failures.max(1),
        Duration::from_secs(1),
        Duration::from_secs(300),
    )
}

/// Delay before a session's open is tried again after `waits` refusals in a row (a cap, no
/// host, a name held by another object): 1 s, doubling, at most 30 s. Without it every waiting
/// session asked its host once a second for ever, so a tenant creating sessions far over its
/// cap made the operator hammer the host with opens.
pub fn wait_delay(waits: u32) -> Duration {
    tombstone_delay(
        waits.max(1),
        Duration::from_secs(1),
        Duration::from_secs(30),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: Duration = Duration::from_secs(60);

    #[test]
    fn tombstones_back_off_from_two_minutes_doubling_to_six_hours() {
        let (base, cap) = (2 * MIN, 360 * MIN);
        let delays: Vec<u64> = (1..=10)
            .map(|a| tombstone_delay(a, base, cap).as_secs() / 60)
            .collect();
        assert_eq!(delays, [2, 4, 8, 16, 32, 64, 128, 256, 360, 360]);
        assert_eq!(tombstone_delay(0, base, cap), base);
        assert_eq!(tombstone_delay(u32::MAX, base, cap), cap);
    }

    #[test]
    fn failures_back_off_to_five_minutes() {
        assert_eq!(failure_delay(1), Duration::from_secs(1));
        assert_eq!(failure_delay(4), Duration::from_secs(8));
        assert_eq!(failure_delay(40), Duration::from_secs(300));
    }

    #[test]
    fn waits_back_off_to_thirty_seconds() {
        let delays: Vec<u64> = (1..=7).map(|w| wait_delay(w).as_secs()).collect();
        assert_eq!(delays, [1, 2, 4, 8, 16, 30, 30]);
        assert_eq!(wait_delay(0), Duration::from_secs(1));
        assert_eq!(wait_delay(u32::MAX), Duration::from_secs(30));
    }
}
