//! Resource use of the watchdog process, read from `/proc` once a second: the numbers any
//! binary can be held to, whatever it reports about itself.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};

/// One reading of `/proc/<pid>`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Sample {
    /// When it was taken.
    pub at: DateTime<Utc>,
    /// Resident set size (`VmRSS`), bytes.
    pub rss: u64,
    /// Peak resident set size so far (`VmHWM`), bytes.
    pub hwm: u64,
    /// User plus system CPU time so far, seconds.
    pub cpu: f64,
}

/// Reads one sample; `None` once the process is gone (or /proc is unreadable).
pub(crate) fn read(pid: u32) -> Option<Sample> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kb = |key: &str| -> Option<u64> {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|v| v.parse::<u64>().ok())
            .map(|v| v * 1024)
    };
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may contain spaces and parentheses: fields are counted from
    // after the last ')'. utime and stime are fields 14 and 15, i.e. 12th and 13th after it.
    let after = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = after.split_whitespace().collect();
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    let ticks = rustix::param::clock_ticks_per_second();
    let ticks = if ticks > 0 { ticks as f64 } else { 100.0 };
    Some(Sample {
        at: Utc::now(),
        rss: kb("VmRSS:")?,
        hwm: kb("VmHWM:").unwrap_or(0),
        cpu: (utime + stime) as f64 / ticks,
    })
}

/// The RSS of process `pid` when it passed `limit` bytes (said on stderr: the caller stops
/// it), else `None`.
pub(crate) fn rss_over(pid: u32, limit: u64) -> Option<u64> {
    let s = read(pid).filter(|s| s.rss > limit)?;
    eprintln!(
        "run: the watchdog's RSS {:.0} MiB passed the limit {:.0} MiB: stopping it",
        s.rss as f64 / 1048576.0,
        limit as f64 / 1048576.0
    );
    Some(s.rss)
}

/// Samples a process every second in the background until dropped.
pub(crate) struct Sampler {
    samples: Arc<Mutex<Vec<Sample>>>,
    _task: dwd_sim::AbortOnDrop,
}

impl Sampler {
    /// Starts sampling `pid`.
    pub(crate) fn start(pid: u32) -> Sampler {
        let samples = Arc::new(Mutex::new(Vec::new()));
        let sink = samples.clone();
        let task = dwd_sim::AbortOnDrop::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            loop {
                tick.tick().await;
                match read(pid) {
                    Some(s) => lock(&sink).push(s),
                    None => break,
                }
            }
        });
        Sampler {
            samples,
            _task: task,
        }
    }

    /// Every sample so far.
    pub(crate) fn samples(&self) -> Vec<Sample> {
        lock(&self.samples).clone()
    }
}

/// Locks a mutex, recovering the data after a panic elsewhere (samples are always valid).
/// The machine's CPU pressure so far: microseconds in which at least one runnable task
/// waited for a CPU (`/proc/pressure/cpu`, the `some` line's `total`); `None` where the kernel
/// has no pressure stall information. Over a window, its growth ÷ the window's length is the
/// share of the time the machine, not only the binary under test, was short of CPU.
pub(crate) fn cpu_waiting_us() -> Option<u64> {
    parse_cpu_waiting_us(&std::fs::read_to_string("/proc/pressure/cpu").ok()?)
}

fn parse_cpu_waiting_us(text: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix("some "))?
        .split_whitespace()
        .find_map(|field| field.strip_prefix("total="))?
        .parse()
        .ok()
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// What the samples say about a time window.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Usage {
    /// Largest `VmHWM` seen over the whole run (the kernel's peak, between samples too).
    pub peak_rss: u64,
    /// Median RSS within the window.
    pub steady_rss: u64,
    /// CPU seconds per wall-clock minute within the window.
    pub cpu_per_minute: f64,
    /// CPU seconds over the whole run.
    pub cpu_total: f64,
    /// Number of samples in the window.
    pub samples: usize,
}

impl Usage {
    /// The `process` object of a run's result.
    pub(crate) fn to_json(self) -> serde_json::Value {
        serde_json::json!({
            "peak_rss_bytes": self.peak_rss, "steady_rss_bytes": self.steady_rss,
            "cpu_seconds_per_minute": self.cpu_per_minute, "cpu_seconds_total": self.cpu_total,
            "samples": self.samples,
        })
    }
}

/// Summarises `samples` for the window `[from, to]`.
pub(crate) fn usage(samples: &[Sample], from: DateTime<Utc>, to: DateTime<Utc>) -> Usage {
    let peak_rss = samples.iter().map(|s| s.hwm.max(s.rss)).max().unwrap_or(0);
    let cpu_total = samples.last().map(|s| s.cpu).unwrap_or(0.0);
    let window: Vec<&Sample> = samples
        .iter()
        .filter(|s| s.at >= from && s.at <= to)
        .collect();
    let mut rss: Vec<u64> = window.iter().map(|s| s.rss).collect();
    rss.sort_unstable();
    let steady_rss = rss.get(rss.len() / 2).copied().unwrap_or(0);
    let cpu_per_minute = match (window.first(), window.last()) {
        (Some(a), Some(b)) if b.at > a.at => {
            let secs = (b.at - a.at).num_milliseconds() as f64 / 1000.0;
            (b.cpu - a.cpu) / secs * 60.0
        }
        _ => 0.0,
    };
    Usage {
        peak_rss,
        steady_rss,
        cpu_per_minute,
        cpu_total,
        samples: window.len(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_waiting_is_the_some_lines_total() {
        let text = "some avg10=99.99 avg60=99.68 avg300=93.92 total=7173466887\n\
                    full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n";
        assert_eq!(parse_cpu_waiting_us(text), Some(7_173_466_887));
        assert_eq!(parse_cpu_waiting_us("full total=3\n"), None);
        assert_eq!(parse_cpu_waiting_us("some avg10=1.00 total=x\n"), None);
    }
}
