//! When the next probe run may start (SPEC §2.2 and step 6).
//!
//! Runs are spaced with sliding jitter, like the reference's `wait.JitterUntil(…, sliding=true)`:
//! the delay is measured from the end of the previous run. After a `429 Too Many Requests` the next
//! run waits at least [`THROTTLE_BACKOFF`] after that response. The randomness is a parameter so
//! schedules are reproducible in tests.

use std::ops::Add;
use std::time::Duration;

/// Minimum spacing between a 429 response and the next run.
pub const THROTTLE_BACKOFF: Duration = Duration::from_secs(10);

/// `interval × (1 + rand01 × jitter_factor)`, as Go's `wait.JitterUntil` does it: a jitter factor
/// `<= 0` (or not finite) means no jitter. `rand01` is clamped into `[0, 1]`.
pub fn next_delay(interval: Duration, jitter_factor: f64, rand01: f64) -> Duration {
    if !(jitter_factor > 0.0 && jitter_factor.is_finite()) {
        return interval;
    }
    let r = if rand01.is_nan() {
        0.0
    } else {
        rand01.clamp(0.0, 1.0)
    };
    let extra = interval.as_secs_f64() * r * jitter_factor;
    // An absurd jitter could overflow Duration; the plain interval is the safe fallback.
    Duration::try_from_secs_f64(extra)
        .ok()
        .and_then(|e| interval.checked_add(e))
        .unwrap_or(interval)
}

/// The earliest instant the next run may start: `delay` after the previous run ended, but not
/// before [`THROTTLE_BACKOFF`] after the last throttled response. Generic over the instant type
/// (`std::time::Instant`, `tokio::time::Instant`, or a test clock).
pub fn earliest_next_start<T>(ended_at: T, delay: Duration, last_throttled_at: Option<T>) -> T
where
    T: Add<Duration, Output = T> + Ord + Copy,
{
    let regular = ended_at + delay;
    match last_throttled_at {
        Some(throttled) => regular.max(throttled + THROTTLE_BACKOFF),
        None => regular,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    fn jitter_stretches_interval_by_random_fraction() {
        let i = Duration::from_secs(10);
        assert_eq!(next_delay(i, 0.2, 0.0), i);
        assert_eq!(next_delay(i, 0.2, 0.5), Duration::from_secs(11));
        assert_eq!(next_delay(i, 0.2, 1.0), Duration::from_secs(12));
    }

    #[test]
    fn non_positive_jitter_means_plain_interval() {
        let i = Duration::from_secs(10);
        assert_eq!(next_delay(i, 0.0, 0.7), i);
        assert_eq!(next_delay(i, -1.0, 0.7), i);
        assert_eq!(next_delay(i, f64::NAN, 0.7), i);
        assert_eq!(next_delay(i, f64::INFINITY, 0.7), i);
    }

    #[test]
    fn out_of_range_random_is_clamped() {
        let i = Duration::from_secs(10);
        assert_eq!(next_delay(i, 0.2, 5.0), Duration::from_secs(12));
        assert_eq!(next_delay(i, 0.2, -5.0), i);
        assert_eq!(next_delay(i, 0.2, f64::NAN), i);
        assert_eq!(next_delay(Duration::MAX, 1e300, 1.0), Duration::MAX);
    }

    #[test]
    fn without_throttling_next_start_is_end_plus_delay() {
        let t0 = Instant::now();
        let d = Duration::from_secs(3);
        assert_eq!(earliest_next_start(t0, d, None), t0 + d);
    }

    #[test]
    fn throttling_pushes_next_start_to_ten_seconds_after_the_429() {
        let t0 = Instant::now();
        let d = Duration::from_secs(2);
        let throttled = t0 - Duration::from_secs(1);
        assert_eq!(
            earliest_next_start(t0, d, Some(throttled)),
            throttled + THROTTLE_BACKOFF
        );
    }

    #[test]
    fn old_throttling_does_not_delay_a_long_interval() {
        let t0 = Instant::now();
        let d = Duration::from_secs(30);
        assert_eq!(earliest_next_start(t0, d, Some(t0)), t0 + d);
    }
}
