//! When the next probe run may start (docs/behaviour.md §2.4, §2.10).
//!
//! Runs are spaced with sliding jitter, like the reference's `wait.JitterUntil(…, sliding=true)`:
//! the delay is measured from the end of the previous run. After a `429 Too Many Requests` the next
//! run waits at least [`THROTTLE_BACKOFF`] after that response. The randomness is a parameter so
//! schedules are reproducible in tests.

use std::ops::Add;
use std::time::Duration;

/// Minimum spacing between a 429 response and the next run.
pub const THROTTLE_BACKOFF: Duration = Duration::from_secs(10);

/// `interval × (1 + rand01 × jitter_factor)`, exactly as Go's `wait.JitterUntil` computes it in
/// the reference: a jitter factor `<= 0` (or not finite) means no jitter, and the arithmetic is
/// Go's `time.Duration` (int64 nanoseconds). When the jittered delay does not fit in an int64
/// (a factor so large that interval × factor passes about 292 years), Go's conversion overflows
/// into a negative duration and the next run starts at once; so does ours, and the config loader
/// warns about such factors ([`jitter_can_overflow`]). `rand01` is clamped into `[0, 1]`.
pub fn next_delay(interval: Duration, jitter_factor: f64, rand01: f64) -> Duration {
    if !(jitter_factor > 0.0 && jitter_factor.is_finite()) {
        return interval;
    }
    // Intervals beyond Go's range can't come from a config; leave them unjittered.
    let Ok(d) = i64::try_from(interval.as_nanos()) else {
        return interval;
    };
    let r = if rand01.is_nan() {
        0.0
    } else {
        rand01.clamp(0.0, 1.0)
    };
    // Go: time.Duration(rand*maxFactor*float64(duration)); an out-of-range float converts to
    // math.MinInt64 on amd64 (and saturates on arm64, which wraps negative below just the same).
    let extra = r * jitter_factor * d as f64;
    #[allow(clippy::cast_possible_truncation)]
    let extra = if (-GO_DURATION_END..GO_DURATION_END).contains(&extra) {
        extra as i64
    } else {
        i64::MIN
    };
    let wait = d.wrapping_add(extra);
    Duration::from_nanos(u64::try_from(wait).unwrap_or(0))
}

/// 2^63 nanoseconds, as f64: the first value past Go's largest `time.Duration`.
const GO_DURATION_END: f64 = 9_223_372_036_854_775_808.0;

/// Whether some runs of a probe with this interval and jitter factor start at once because the
/// jittered delay overflows Go's `time.Duration` (see [`next_delay`]).
pub fn jitter_can_overflow(interval: Duration, jitter_factor: f64) -> bool {
    if !(jitter_factor > 0.0 && jitter_factor.is_finite()) {
        return false;
    }
    let d = interval.as_nanos() as f64;
    d > 0.0 && d + jitter_factor * d >= GO_DURATION_END
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
    fn a_jittered_delay_beyond_go_durations_starts_the_next_run_at_once_as_in_go() {
        let i = Duration::from_secs(30);
        // 30 s × 1e9 × 0.5 ≈ 475 years: Go's int64 conversion overflows.
        assert_eq!(next_delay(i, 1e9, 0.5), Duration::ZERO);
        // With a small random draw the same factor still fits.
        assert_eq!(next_delay(i, 1e9, 1e-9), Duration::from_secs(60));
        assert!(jitter_can_overflow(i, 1e9));
        assert!(!jitter_can_overflow(i, 1e6));
        assert!(!jitter_can_overflow(i, 0.2));
        assert!(!jitter_can_overflow(Duration::ZERO, 1e300));
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
