//! When the next probe run may start (docs/behaviour.md §2.4, §2.10).
//!
//! The jittered delay is the reference's (`wait.JitterUntil`), which slides: it is measured from
//! the end of the previous run, so every second a run takes stretches the shoot's period. Ours
//! takes the run's duration out of the wait, up to [`absorbed_run_time`] (a fifth of
//! `probeInterval`): while a shoot's runs are shorter than that, its runs start on the configured
//! cadence, from start to start; a longer run is followed after the delay less that fifth.
//!
//! Why a cap and not the whole duration: a start-anchored schedule follows an overlong run at
//! once, and on a saturated seed that was measured to feed on itself (commit c70b32f: 1,000 shoots
//! probed back to back, runs of 10–20 s, restores stalled). With the cap a run is never followed
//! sooner than `0.8 × probeInterval` after it ended, and a shoot never gets more than 1.2× the
//! runs the reference's spacing gives it, whatever its runs take: for a run of duration `D`, a
//! delay `d ≥ probeInterval = I`, the periods are `D + d` (reference) and `D + d − min(D, I/5)`
//! (ours), whose ratio is largest at `D = I/5`: `1 + (I/5)/d ≤ 1.2`. After a
//! `429 Too Many Requests` the next run waits at least [`THROTTLE_BACKOFF`] after that response.
//! The randomness is a parameter so schedules are reproducible in tests.

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

/// The most of a run's duration the wait after it takes back: a fifth of `probeInterval`.
pub fn absorbed_run_time(probe_interval: Duration) -> Duration {
    probe_interval / 5
}

/// The earliest instant the next run may start: `delay` after the previous run ended, less the
/// time the run took up to [`absorbed_run_time`] (so `delay` after it started while runs are
/// short), but not before [`THROTTLE_BACKOFF`] after the last throttled response. Generic over
/// the instant type (`std::time::Instant`, `tokio::time::Instant`, or a test clock).
pub fn earliest_next_start<T>(
    ended_at: T,
    run_took: Duration,
    probe_interval: Duration,
    delay: Duration,
    last_throttled_at: Option<T>,
) -> T
where
    T: Add<Duration, Output = T> + Ord + Copy,
{
    let absorbed = run_took.min(absorbed_run_time(probe_interval));
    let regular = ended_at + delay.saturating_sub(absorbed);
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

    const INTERVAL: Duration = Duration::from_secs(10);

    #[test]
    fn a_run_shorter_than_a_fifth_of_the_interval_is_followed_delay_after_its_start() {
        let started = Instant::now();
        let d = Duration::from_secs(11);
        for took_ms in [0, 1, 700, 1999, 2000] {
            let took = Duration::from_millis(took_ms);
            assert_eq!(
                earliest_next_start(started + took, took, INTERVAL, d, None),
                started + d,
                "run took {took:?}"
            );
        }
    }

    #[test]
    fn a_longer_run_is_followed_after_the_delay_less_a_fifth_of_the_interval_never_at_once() {
        let started = Instant::now();
        let d = Duration::from_secs(10);
        for took_s in [3, 9, 25, 600] {
            let took = Duration::from_secs(took_s);
            let ended = started + took;
            assert_eq!(
                earliest_next_start(ended, took, INTERVAL, d, None),
                ended + Duration::from_secs(8),
                "run took {took:?}"
            );
        }
        // A delay shorter than the fifth (Go's overflow to 0) starts at once, as before.
        let took = Duration::from_secs(5);
        assert_eq!(
            earliest_next_start(started + took, took, INTERVAL, Duration::ZERO, None),
            started + took
        );
    }

    #[test]
    fn no_shoot_gets_more_than_a_fifth_more_runs_than_the_sliding_spacing_gives() {
        // The bound the module doc states, over run durations from 0 to 100 intervals and every
        // jittered delay from 1 to 3 intervals.
        let t0 = Instant::now();
        for took_ms in (0..1_000_000).step_by(997) {
            for delay_ms in (10_000..30_000).step_by(1_001) {
                let took = Duration::from_millis(took_ms);
                let delay = Duration::from_millis(delay_ms);
                let ended = t0 + took;
                let ours = earliest_next_start(ended, took, INTERVAL, delay, None) - t0;
                let sliding = took + delay;
                assert!(
                    sliding.as_secs_f64() <= 1.2 * ours.as_secs_f64() + 1e-9,
                    "took {took:?}, delay {delay:?}: period {ours:?} against {sliding:?}"
                );
                assert!(
                    ours >= took + INTERVAL * 4 / 5,
                    "took {took:?}, delay {delay:?}"
                );
            }
        }
    }

    #[test]
    fn throttling_pushes_next_start_to_ten_seconds_after_the_429() {
        let t0 = Instant::now();
        let d = Duration::from_secs(2);
        let throttled = t0 - Duration::from_secs(1);
        assert_eq!(
            earliest_next_start(t0, Duration::ZERO, INTERVAL, d, Some(throttled)),
            throttled + THROTTLE_BACKOFF
        );
    }

    #[test]
    fn old_throttling_does_not_delay_a_long_interval() {
        let t0 = Instant::now();
        let d = Duration::from_secs(30);
        assert_eq!(
            earliest_next_start(t0, Duration::ZERO, INTERVAL, d, Some(t0)),
            t0 + d
        );
    }
}
