//! The journal: everything the sandbox saw, printed live and kept for the report.
//!
//! Every timeline entry goes to the terminal at once (elapsed time, shoot, what happened, why)
//! and into the journal; the samples (expired-lease fraction, replicas, silenced kubelets,
//! etcd availability) and markers (steps, decisions) feed the HTML report's charts. One mutex
//! serialises terminal output so the spinner never tears a timeline line.
//!
//! The clock starts with the story, not with the process: setup (building the watchdog and,
//! on a machine's first run, the control-plane binaries; starting etcd and the apiservers)
//! can take minutes and says nothing about the watchdog. Entries before
//! [`Journal::start_clock`] are setup entries, shown as `setup` instead of a time.

use std::collections::BTreeMap;
use std::io::{IsTerminal, Write};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

/// One line of the timeline.
#[derive(Debug, Clone)]
pub(crate) struct Entry {
    /// Seconds since the clock started (0 for setup entries).
    pub t: f64,
    /// Logged during setup, before the clock started.
    pub setup: bool,
    /// Short shoot name (`alpha`), or `-` for the sandbox as a whole.
    pub shoot: String,
    /// What happened, in plain words.
    pub what: String,
    /// Why it happened, when known.
    pub why: Option<String>,
}

/// What a vertical marker on the charts stands for (it picks the colour).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MarkerKind {
    /// A step of the story (or an interactive command).
    Step,
    /// The prober decided to scale down.
    ScaleDown,
    /// The prober decided to scale up.
    ScaleUp,
    /// The weeder deleted crash-looping pods.
    Weeder,
}

/// A vertical line on the charts.
#[derive(Debug, Clone)]
pub(crate) struct Marker {
    /// Seconds since start.
    pub t: f64,
    /// Shoot it belongs to; `None`: every chart.
    pub shoot: Option<String>,
    /// Short label.
    pub label: String,
    /// Kind.
    pub kind: MarkerKind,
}

/// Zone → `(t, fraction)` samples of one shoot.
pub(crate) type ZoneSamples = BTreeMap<String, Vec<(f64, Option<f64>)>>;

/// Everything recorded, as the report needs it.
#[derive(Debug, Clone, Default)]
pub(crate) struct Record {
    /// Timeline entries in order.
    pub entries: Vec<Entry>,
    /// Markers in order.
    pub markers: Vec<Marker>,
    /// Shoot → `(t, fraction)` samples; `None` while the prober reports none.
    pub fraction: BTreeMap<String, Vec<(f64, Option<f64>)>>,
    /// Shoot → `(t, fraction)` computed by the sandbox from the leases themselves.
    pub lease_truth: BTreeMap<String, Vec<(f64, Option<f64>)>>,
    /// Shoot → zone → `(t, fraction)` the prober reported for the zone
    /// (`dwd_prober_zone_expired_lease_fraction`); `None` while it reports none.
    pub zone_fraction: BTreeMap<String, ZoneSamples>,
    /// Shoot → zone → `(t, fraction)` computed by the sandbox from the zone's leases.
    pub zone_truth: BTreeMap<String, ZoneSamples>,
    /// Shoot → controller → `(t, spec.replicas)` at each change.
    pub replicas: BTreeMap<String, BTreeMap<String, Vec<(f64, i32)>>>,
    /// Shoot → `(t, silenced kubelets)` at each change.
    pub silenced: BTreeMap<String, Vec<(f64, usize)>>,
    /// Shoot → `(t, etcd-main-client ready)` at each change.
    pub etcd_ready: BTreeMap<String, Vec<(f64, bool)>>,
}

struct Terminal {
    /// What the sandbox waits for now, and until when.
    waiting: Option<(String, Instant)>,
    /// Whether a spinner line is on screen (to be erased before the next line).
    spinner_shown: bool,
    frame: usize,
}

/// The journal; share it as `Arc<Journal>`.
pub(crate) struct Journal {
    /// When the journal was made: the start of setup.
    created: Instant,
    /// When the clock started: t = 0 of the timeline.
    origin: OnceLock<Instant>,
    tty: bool,
    terminal: Mutex<Terminal>,
    record: Mutex<Record>,
}

/// Locks a mutex, recovering the data if a panic poisoned it: the journal must keep working
/// while the sandbox reports a failure.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The entry of `key` in `map`, created empty if it is not there yet.
fn series<'a, T: Default>(map: &'a mut BTreeMap<String, T>, key: &str) -> &'a mut T {
    map.entry(key.to_string()).or_default()
}

const SPINNER: [&str; 10] = ["⠋", "⠙", "⠹", "⠸", "⠼", "⠴", "⠦", "⠧", "⠇", "⠏"];

impl Journal {
    /// A journal in setup; its clock starts with [`Journal::start_clock`].
    pub(crate) fn new() -> Arc<Journal> {
        Self::created_at(Instant::now())
    }

    /// A journal whose setup began at `created`.
    fn created_at(created: Instant) -> Arc<Journal> {
        Arc::new(Journal {
            created,
            origin: OnceLock::new(),
            tty: std::io::stdout().is_terminal(),
            terminal: Mutex::new(Terminal {
                waiting: None,
                spinner_shown: false,
                frame: 0,
            }),
            record: Mutex::new(Record::default()),
        })
    }

    /// Starts the timeline's clock (once; later calls change nothing) and returns how long
    /// setup took.
    pub(crate) fn start_clock(&self) -> Duration {
        let origin = *self.origin.get_or_init(Instant::now);
        origin.saturating_duration_since(self.created)
    }

    /// How long setup took, once the clock runs.
    pub(crate) fn setup_took(&self) -> Option<Duration> {
        self.origin
            .get()
            .map(|o| o.saturating_duration_since(self.created))
    }

    /// Seconds on the timeline's clock; 0 during setup.
    pub(crate) fn now(&self) -> f64 {
        self.origin.get().map_or(0.0, |o| o.elapsed().as_secs_f64())
    }

    /// Whether the clock has not started yet.
    fn in_setup(&self) -> bool {
        self.origin.get().is_none()
    }

    /// Prints a line as is (setup notes, hints), erasing the spinner first.
    pub(crate) fn say(&self, text: &str) {
        let mut term = lock(&self.terminal);
        let mut out = std::io::stdout().lock();
        if term.spinner_shown {
            let _ = write!(out, "\r\x1b[2K");
            term.spinner_shown = false;
        }
        let _ = writeln!(out, "{text}");
        let _ = out.flush();
    }

    /// Adds a timeline entry and prints it.
    pub(crate) fn log(&self, shoot: &str, what: impl Into<String>, why: Option<String>) {
        let entry = Entry {
            t: self.now(),
            setup: self.in_setup(),
            shoot: shoot.to_string(),
            what: what.into(),
            why,
        };
        let time = time_column(&entry);
        let line = match &entry.why {
            Some(why) => format!("{time}  {:<5}  {} ({why})", entry.shoot, entry.what),
            None => format!("{time}  {:<5}  {}", entry.shoot, entry.what),
        };
        lock(&self.record).entries.push(entry);
        self.say(&line);
    }

    /// Starts a numbered step: a heading in the terminal, a timeline entry, a chart marker.
    pub(crate) fn step(&self, label: &str, title: &str) {
        let t = self.now();
        self.say(&format!("\n── {title} ──"));
        let mut record = lock(&self.record);
        record.entries.push(Entry {
            t,
            setup: self.in_setup(),
            shoot: "-".into(),
            what: format!("── {title}"),
            why: None,
        });
        record.markers.push(Marker {
            t,
            shoot: None,
            label: label.to_string(),
            kind: MarkerKind::Step,
        });
    }

    /// Adds a chart marker.
    pub(crate) fn marker(&self, shoot: Option<&str>, label: &str, kind: MarkerKind) {
        let t = self.now();
        lock(&self.record).markers.push(Marker {
            t,
            shoot: shoot.map(str::to_string),
            label: label.to_string(),
            kind,
        });
    }

    /// Records a fraction sample.
    pub(crate) fn sample_fraction(&self, shoot: &str, fraction: Option<f64>) {
        self.push_sample(|r| series(&mut r.fraction, shoot), fraction);
    }

    /// Records a fraction computed from the leases.
    pub(crate) fn sample_lease_truth(&self, shoot: &str, fraction: Option<f64>) {
        self.push_sample(|r| series(&mut r.lease_truth, shoot), fraction);
    }

    /// Records a zone's fraction as the prober reported it.
    pub(crate) fn sample_zone_fraction(&self, shoot: &str, zone: &str, fraction: Option<f64>) {
        self.push_sample(
            |r| series(series(&mut r.zone_fraction, shoot), zone),
            fraction,
        );
    }

    /// Records a zone's fraction computed from its leases.
    pub(crate) fn sample_zone_truth(&self, shoot: &str, zone: &str, fraction: Option<f64>) {
        self.push_sample(|r| series(series(&mut r.zone_truth, shoot), zone), fraction);
    }

    /// Appends `(now, value)` to the series of the record that `pick` selects.
    fn push_sample<V>(&self, pick: impl FnOnce(&mut Record) -> &mut Vec<(f64, V)>, value: V) {
        let t = self.now();
        pick(&mut lock(&self.record)).push((t, value));
    }

    /// Records a controller's replicas (call on every change).
    pub(crate) fn sample_replicas(&self, shoot: &str, controller: &str, replicas: i32) {
        self.push_sample(
            |r| series(series(&mut r.replicas, shoot), controller),
            replicas,
        );
    }

    /// Records how many kubelets of a shoot are silenced (call on every change).
    pub(crate) fn sample_silenced(&self, shoot: &str, silenced: usize) {
        self.push_sample(|r| series(&mut r.silenced, shoot), silenced);
    }

    /// Records whether a shoot's etcd-main-client is ready (call on every change).
    pub(crate) fn sample_etcd(&self, shoot: &str, ready: bool) {
        self.push_sample(|r| series(&mut r.etcd_ready, shoot), ready);
    }

    /// A copy of everything recorded so far.
    pub(crate) fn record(&self) -> Record {
        lock(&self.record).clone()
    }

    /// Shows a spinner with `what` until [`Journal::done_waiting`] (only on a terminal).
    pub(crate) fn waiting(&self, what: &str, timeout: Duration) {
        lock(&self.terminal).waiting = Some((what.to_string(), Instant::now() + timeout));
    }

    /// Removes the spinner.
    pub(crate) fn done_waiting(&self) {
        let mut term = lock(&self.terminal);
        term.waiting = None;
        if term.spinner_shown {
            let mut out = std::io::stdout().lock();
            let _ = write!(out, "\r\x1b[2K");
            let _ = out.flush();
            term.spinner_shown = false;
        }
    }

    /// Redraws the spinner line; called every ~100 ms by [`Journal::run_spinner`].
    fn tick(&self) {
        if !self.tty {
            return;
        }
        let mut term = lock(&self.terminal);
        let Some((what, deadline)) = term.waiting.clone() else {
            return;
        };
        term.frame = (term.frame + 1) % SPINNER.len();
        let left = deadline.saturating_duration_since(Instant::now()).as_secs();
        let time = if self.in_setup() {
            format!("{:>8}", "setup")
        } else {
            format!("{:>7.1}s", self.now())
        };
        let mut out = std::io::stdout().lock();
        let _ = write!(
            out,
            "\r\x1b[2K{time}  {}  waiting for {what} (gives up in {left}s)",
            SPINNER[term.frame]
        );
        let _ = out.flush();
        term.spinner_shown = true;
    }

    /// Animates the spinner until the task is dropped.
    pub(crate) async fn run_spinner(self: Arc<Self>) {
        if !self.tty {
            return;
        }
        let mut ticker = tokio::time::interval(Duration::from_millis(100));
        loop {
            ticker.tick().await;
            self.tick();
        }
    }
}

/// The time column of a timeline line: `   12.3s`, or `   setup` before the clock started.
pub(crate) fn time_column(entry: &Entry) -> String {
    if entry.setup {
        format!("{:>8}", "setup")
    } else {
        format!("{:>7.1}s", entry.t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_clock_starts_with_the_story_not_with_setup() {
        // A setup as long as a first run's (building the control plane): 281 s.
        let created = Instant::now()
            .checked_sub(Duration::from_secs(281))
            .unwrap_or_else(Instant::now);
        let journal = Journal::created_at(created);
        journal.log("-", "starting etcd", None);
        assert_eq!(journal.now(), 0.0);
        assert!(journal.setup_took().is_none());
        let setup = journal.start_clock();
        journal.log("-", "dependency-watchdog prober running", None);
        let entries = journal.record().entries;
        assert!(entries[0].setup);
        assert_eq!(time_column(&entries[0]), "   setup");
        assert!(!entries[1].setup);
        assert!(
            entries[1].t < 1.0,
            "first timed entry at {}s, after a setup of {setup:?}",
            entries[1].t
        );
        if created.elapsed() >= Duration::from_secs(281) {
            assert!(setup >= Duration::from_secs(281), "setup took {setup:?}");
        }
        // Starting it again changes nothing.
        assert_eq!(journal.start_clock(), setup);
    }
}
