//! One memory budget for every probe run in flight (issue 24), and the order in which runs
//! get room from it (issue 34: protection first).
//!
//! Per run, the shoot client already bounds what one run may receive (16 MiB a response,
//! 64 MiB a run: `kube_client::ResponseLimits`); nothing bounded the sum. Two things grow it:
//! runs that wait on slow shoots (each holds a connection, TLS state, buffers and tasks while
//! it waits) and runs that receive large answers. Both are charged here, in bytes, against one
//! process-wide pool of `P` bytes:
//!
//! - every run is **admitted** before it opens its connection: it reserves [`RUN_RESERVE`]
//!   bytes, what a run in flight costs before its first response byte plus a floor for a
//!   healthy shoot's small answers;
//! - what a run holds past that floor while it reads (the page being decoded, the decoded
//!   views) is **charged** to the pool; the views stay charged until the run ends;
//! - everything returns to the pool when the run ends (its [`MemoryGrant`] is dropped).
//!
//! So the runs in flight never hold more than `P`, however many shoots are slow or send fat
//! answers; README ("Memory: one limit") states the whole formula.
//!
//! **Who gets room first** (docs/behaviour.md §2.21, the protection bound; docs/architecture.md
//! "Admission" for the alternatives rejected). The budget must never cost a shoot in outage
//! its scale-down or its restore, and no tenant may buy room by looking urgent. A run waits in
//! one line, ordered by what its shoot did and needs ([`Claim`]):
//!
//! 1. fewer slow runs among its shoot's last [`REMEMBERED_RUNS`] first ([`SlowHistory`]): a
//!    run is *slow* when it did not end within the prompt limit `F` ([`prompt_limit`]: half
//!    the `probeTimeout`, at most 5 s, in shoot time); a shoot that hangs is behind every
//!    shoot that answers, whatever else it claims, and one that was slow once among many
//!    prompt runs is ahead of one that is slow every time;
//! 2. then a shoot with a decision pending before one without (its leases were expired at its
//!    last finding, a scale-down streak is building, a zone is disrupted, a target waits to be
//!    restored, a flow is queued or under way): protection first;
//! 3. then a charge of a run in flight before an admission, then first come, first served (a
//!    shoot whose run was not made for room keeps its place: [`Claim::ticket`]).
//!
//! A run in flight also waits in that line for the bytes it reads past its floor (never
//! refused for bytes its apiserver sends in time, unless they are more than the pool could
//! ever give it), ahead of admissions of its rank.
//! Runs whose shoot was slow more than once of late hold at most half of the pool of their own; beyond it
//! they borrow only while no prompt run waits.
//!
//! What makes room free in a bounded time is `F`: while a run waits, room is taken back
//! ("ended for room") from
//!
//! - a slow run that borrows past the slow runs' half, at once, for a waiter that is not slow;
//! - else a run that has been in flight longer than `F` (slow now: judged with one more slow
//!   run in its shoot's streak) and not ahead of the waiter in line so judged: the last in
//!   line first, then the oldest.
//!
//! Only a waiter whose shoot was slow at most once among its last runs
//! ([`TAKES_ROOM_BACK_UP_TO`]) takes room back: shoots that hang run after run wait their turn
//! among themselves instead of ending each other's runs. A run younger than `F` is never ended
//! for room, so such a waiter finds room within `F` of arriving when fewer runs wait ahead of
//! it than the pool holds (`P / RUN_RESERVE` runs), whatever the shoots behind it do: a shoot
//! that hangs holds room at most `F` while it waits, and falls behind every prompt shoot after
//! its first slow run.
//!
//! **Shoot time.** "In flight longer than `F`" is measured on the [`LagClock`]: wall time less
//! the time this process could not run its tasks (a CPU-starved prober, a throttled cgroup).
//! A prober short of CPU makes every run take longer in wall time; that is not the shoot's
//! doing, and it must not turn prompt shoots slow nor end their runs.
//!
//! Why hand-written rather than on `tokio::sync::Semaphore` (as before): a semaphore hands
//! released permits to queued waiters first, so while any admission waited every charge of a
//! run already in flight failed (a shoot in outage could not read its nodes), and it can
//! neither order waiters by level nor take room back. The state below is one lock around a
//! few maps, touched once per admission, charge and release.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use std::fmt::Write as _;

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::oneshot;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// What a run reserves at admission: 128 KiB for a run in flight before its first response
/// byte (connection, TLS state, HTTP buffers, the client's tasks: the hostile bench measured
/// about 0.1 MiB per run waiting on a slow shoot), plus a floor of [`RUN_FLOOR`] for the
/// answers of a healthy shoot, which so never draws on the shared pool.
pub const RUN_RESERVE: u64 = (128 << 10) + RUN_FLOOR;

/// The part of [`RUN_RESERVE`] a run's charges use first: `GET /version`, a lease page being
/// decoded and the views of a shoot's leases and nodes (a few hundred bytes each) fit.
pub const RUN_FLOOR: u64 = 64 << 10;

/// The smallest pool: room for 64 runs in flight whatever the container's limit says.
pub const MIN_CAPACITY: u64 = 64 * RUN_RESERVE;

/// The pool without a memory limit to derive it from, nor a flag: 128 MiB (a quarter of the
/// 512 MiB limit `deploy/prober/deployment.yaml` sets).
pub const DEFAULT_CAPACITY: u64 = 128 << 20;

/// The share of a container's memory limit given to runs in flight; the rest is the base
/// (caches, per-shoot state, the runtime): see README, "Memory: one limit".
pub const LIMIT_SHARE: f64 = 0.25;

/// The longest a prompt run takes from its admission, in shoot time: a shoot apiserver
/// answers `/version` and a lease page in milliseconds, a busy one in a second or two, and a
/// 500-node shoot's nodes (about 10 MB) arrive in well under a second over the seed's network.
pub const PROMPT_WITHIN: Duration = Duration::from_secs(5);

/// A run of a shoot with this `probe_timeout` is prompt if it ends within this long after
/// its admission, in shoot time: half its timeout, at most [`PROMPT_WITHIN`].
pub fn prompt_limit(probe_timeout: Duration) -> Duration {
    (probe_timeout / 2).min(PROMPT_WITHIN)
}

/// How long a run may wait for admission: its `probeTimeout` when it has one, else its
/// `probeInterval` (its next run would be due), at least [`PROMPT_WITHIN`].
pub fn admission_limit(probe_timeout: Duration, probe_interval: Duration) -> Duration {
    if probe_timeout >= dwd_core::config::prober::NO_TIMEOUT {
        return probe_interval.max(PROMPT_WITHIN);
    }
    probe_timeout
}

/// How long the reclaimer sleeps when no run in flight is young (it is woken when one is).
const RECLAIMER_IDLE: Duration = Duration::from_secs(3600);

/// How many of a shoot's last runs its place in line remembers ([`SlowHistory`]).
pub const REMEMBERED_RUNS: u32 = 8;

/// The most slow runs among its last remembered a shoot may have and still take room back for
/// its run (see the module documentation): a shoot in outage whose last run was slow, yes; a
/// shoot that hangs run after run, no.
pub const TAKES_ROOM_BACK_UP_TO: u32 = 1;

/// What a waiting run is, for the metrics (`dwd_prober_run_memory_waiting_runs{level}`): its
/// place in line is its [`Claim`]'s rank (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Level {
    /// A decision is pending for the shoot.
    Pending,
    /// The shoot was slow at most once of late (or it has not run yet).
    Prompt,
    /// The shoot was slow more than once of late ([`TAKES_ROOM_BACK_UP_TO`]).
    Slow,
}

impl Level {
    /// The level's name, as in metrics and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Level::Pending => "pending",
            Level::Prompt => "prompt",
            Level::Slow => "slow",
        }
    }
}

/// Which of a shoot's last [`REMEMBERED_RUNS`] admitted runs were slow (did not end within
/// the prompt limit, in shoot time), newest in the lowest bit. A shoot's place in line: a
/// shoot that hangs has every bit set after a few runs, one that was slow once among many
/// prompt runs has one, and a new shoot none.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SlowHistory(u8);

impl SlowHistory {
    /// The history after a run that took `shoot_time` (from admission to its end, on the
    /// [`LagClock`]): slow when it did not end within `prompt_limit`, whatever its result (a
    /// quick failure holds no room). A run that was not admitted adds nothing (waiting is not
    /// the shoot's doing).
    pub fn after(self, shoot_time: Duration, prompt_limit: Duration) -> SlowHistory {
        SlowHistory((self.0 << 1) | u8::from(shoot_time >= prompt_limit))
    }

    /// A history whose newest `slow` runs were slow (tests, tools).
    pub fn of_slow_runs(slow: u32) -> SlowHistory {
        SlowHistory(u8::try_from((1u16 << slow.min(REMEMBERED_RUNS)) - 1).unwrap_or(u8::MAX))
    }

    /// Slow runs among the last remembered.
    pub fn slow_runs(self) -> u32 {
        self.0.count_ones()
    }

    /// Whether the last run was slow.
    pub fn last_slow(self) -> bool {
        self.0 & 1 == 1
    }
}

/// What the budget is told about a run's shoot when the run asks for room.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Claim {
    /// A decision is pending for the shoot.
    pub pending: bool,
    /// Which of the shoot's last runs were slow.
    pub history: SlowHistory,
    /// The shoot's place among equals: a run not made for room keeps the ticket of the first
    /// one ([`MemoryBudget::ticket`]), so a shoot does not fall to the back of its rank each
    /// time it is refused; `None`: arrival order.
    pub ticket: Option<u64>,
}

impl Claim {
    /// What the run is, for the metrics.
    pub fn level(&self) -> Level {
        if self.pending {
            Level::Pending
        } else if self.slow() {
            Level::Slow
        } else {
            Level::Prompt
        }
    }
}

/// Why a run got no memory, or lost it. Never the shoot's failure: the run was not made (or
/// not finished) for want of room, and the prober counts it as its own
/// (`dwd_prober_runs_not_made_total{cause}`, [`NoRunMemory::cause`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NoRunMemory {
    /// Admission waited its whole limit.
    #[error(
        "no memory for the run: waited {waited:?} for {RUN_RESERVE} bytes of the runs' memory budget ({capacity} bytes, held by other runs in flight)"
    )]
    Admission {
        /// How long it waited.
        waited: Duration,
        /// The pool's capacity.
        capacity: u64,
    },
    /// The run was in flight longer than its prompt limit (shoot time) while other runs
    /// waited for room, and was ended to make room for them.
    #[error(
        "run ended for room: in flight {in_flight:?} (shoot time), past its prompt limit of {limit:?}, while runs waited for the runs' memory budget"
    )]
    EndedForRoom {
        /// How long it had been in flight, in shoot time.
        in_flight: Duration,
        /// Its prompt limit.
        limit: Duration,
    },
    /// A slow run borrowed room past the slow runs' half and was ended at once for a waiter
    /// of a higher level.
    #[error(
        "run ended for room: it borrowed room past the slow runs' share of the budget ({share} bytes) and a run of a higher level waited"
    )]
    Reclaimed {
        /// Bytes of the slow runs' share.
        share: u64,
    },
    /// A response needed more than the pool could ever give a run.
    #[error(
        "no memory for the run: a response needed {wanted} more bytes than the runs' memory budget ({capacity} bytes) can ever give one run"
    )]
    Exhausted {
        /// Bytes the charge asked for.
        wanted: u64,
        /// The pool's capacity.
        capacity: u64,
    },
}

impl NoRunMemory {
    /// The stable category: the `cause` label of `dwd_prober_runs_not_made_total`.
    pub fn cause(&self) -> NotMadeCause {
        match self {
            NoRunMemory::Admission { .. } => NotMadeCause::NoRoomInTime,
            NoRunMemory::EndedForRoom { .. } | NoRunMemory::Reclaimed { .. } => {
                NotMadeCause::EndedForRoom
            }
            NoRunMemory::Exhausted { .. } => NotMadeCause::ResponseRefused,
        }
    }
}

/// Why a run was not made (or not finished) for room: the `cause` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NotMadeCause {
    /// It waited its admission limit and found no room.
    NoRoomInTime,
    /// It was ended to make room for waiting runs.
    EndedForRoom,
    /// A response needed more than the pool could ever give one run.
    ResponseRefused,
}

impl NotMadeCause {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            NotMadeCause::NoRoomInTime => "no_room_in_time",
            NotMadeCause::EndedForRoom => "ended_for_room",
            NotMadeCause::ResponseRefused => "response_refused",
        }
    }
}

impl EncodeLabelValue for NotMadeCause {
    fn encode(&self, encoder: &mut LabelValueEncoder<'_>) -> std::fmt::Result {
        encoder.write_str(self.as_str())
    }
}

impl EncodeLabelValue for Level {
    fn encode(&self, encoder: &mut LabelValueEncoder<'_>) -> std::fmt::Result {
        encoder.write_str(self.as_str())
    }
}

/// Labels of the runs not made.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct CauseLabels {
    /// Why.
    pub cause: NotMadeCause,
}

/// Labels of the waiting runs.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct LevelLabels {
    /// At which level.
    pub level: Level,
}

/// Where the pool's capacity came from, for the start-up log line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sizing {
    /// Bytes.
    pub capacity: u64,
    /// In words: the flag, the container's limit, or the default.
    pub source: String,
}

/// The pool's capacity: `flag` when given, else [`LIMIT_SHARE`] of the container's memory
/// limit (`cgroup_limit`, bytes) when one is set, else [`DEFAULT_CAPACITY`]; never below
/// [`MIN_CAPACITY`].
pub fn size(flag: Option<u64>, cgroup_limit: Option<u64>) -> Sizing {
    let (capacity, source) = match (flag, cgroup_limit) {
        (Some(bytes), _) => (bytes, "--run-memory-budget".to_owned()),
        (None, Some(limit)) => {
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            let share = (limit as f64 * LIMIT_SHARE) as u64;
            (
                share,
                format!("{LIMIT_SHARE} of the container's memory limit ({limit} bytes)"),
            )
        }
        (None, None) => (
            DEFAULT_CAPACITY,
            "the default (no container memory limit found)".to_owned(),
        ),
    };
    if capacity < MIN_CAPACITY {
        return Sizing {
            capacity: MIN_CAPACITY,
            source: format!("the minimum (64 runs; {source} gives {capacity} bytes)"),
        };
    }
    Sizing { capacity, source }
}

/// The container's memory limit in bytes, from the cgroup v2 `memory.max` or the cgroup v1
/// `memory.limit_in_bytes` text (`None`: no limit, or the file does not hold one).
pub fn cgroup_limit_from(
    v2_memory_max: Option<&str>,
    v1_limit_in_bytes: Option<&str>,
) -> Option<u64> {
    if let Some(text) = v2_memory_max {
        // "max" is no limit.
        return text.trim().parse::<u64>().ok();
    }
    // cgroup v1 says "no limit" with a huge number (the page-rounded i64 maximum).
    let limit = v1_limit_in_bytes?.trim().parse::<u64>().ok()?;
    (limit < 1 << 60).then_some(limit)
}

/// The container's memory limit, read from the process's cgroup files (see
/// [`cgroup_limit_from`]).
pub fn cgroup_limit() -> Option<u64> {
    let read = |path: &str| std::fs::read_to_string(path).ok();
    cgroup_limit_from(
        read("/sys/fs/cgroup/memory.max").as_deref(),
        read("/sys/fs/cgroup/memory/memory.limit_in_bytes").as_deref(),
    )
}

/// The metrics of the pool (registered by `crate::metrics`).
#[derive(Debug, Clone, Default)]
pub struct BudgetMetrics {
    /// Bytes held by runs in flight (reserves and charges).
    pub held: Gauge,
    /// The pool's capacity.
    pub capacity: Gauge,
    /// Runs waiting for admission, by level.
    pub waiting: Family<LevelLabels, Gauge>,
    /// Runs not made, or ended, for want of room, by cause.
    pub not_made: Family<CauseLabels, Counter>,
}

/// How late this process runs its tasks: the sum, since start, of how late a ticker woke
/// past its tolerance. A run's *shoot time* is its wall time less the lag accrued meanwhile
/// (see the module documentation).
#[derive(Debug, Default)]
pub struct LagClock {
    lag_micros: AtomicU64,
}

/// How often the [`LagClock`]'s ticker wakes.
pub const LAG_TICK: Duration = Duration::from_millis(100);

/// Lateness of a tick that is not counted: timer resolution and ordinary scheduling.
const LAG_TOLERANCE: Duration = Duration::from_millis(20);

impl LagClock {
    /// The lag accrued since start.
    pub fn lag(&self) -> Duration {
        Duration::from_micros(self.lag_micros.load(Ordering::Relaxed))
    }

    /// Adds `late` to the lag.
    pub fn add(&self, late: Duration) {
        let micros = u64::try_from(late.as_micros()).unwrap_or(u64::MAX);
        self.lag_micros.fetch_add(micros, Ordering::Relaxed);
    }

    /// The ticker: wakes every [`LAG_TICK`] and adds how late it woke (past
    /// [`LAG_TOLERANCE`]) to the lag, until `stop` is cancelled. One task per process: a
    /// starved process wakes it late, and so does a runtime whose threads are all busy.
    pub async fn run(&self, stop: tokio_util::sync::CancellationToken) {
        let mut expected = Instant::now() + LAG_TICK;
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep_until(expected) => {}
            }
            let now = Instant::now();
            let late = now.saturating_duration_since(expected);
            if late > LAG_TOLERANCE {
                self.add(late - LAG_TOLERANCE);
            }
            expected = now + LAG_TICK;
        }
    }
}

/// The process-wide pool of bytes for runs in flight. One per process, shared through the
/// prober's context.
#[derive(Debug)]
pub struct MemoryBudget {
    capacity: u64,
    /// What slow runs hold of their own; beyond it they borrow.
    slow_share: u64,
    /// The prompt limit `F` of every run (from the config's `probeTimeout`).
    prompt_limit: Duration,
    /// Shoot time.
    lag: Arc<LagClock>,
    state: Mutex<State>,
    metrics: BudgetMetrics,
    /// Runs not made for room since the last log line about it (never held with `state`'s
    /// lock taken after it).
    short: Mutex<Shortage>,
    /// Signalled when the moment to look at the line again moved earlier: the reclaimer sleeps
    /// until it ([`MemoryBudget::ensure_reclaimer`]).
    moved: tokio::sync::Notify,
    /// Whether the reclaimer task was started.
    reclaimer: AtomicBool,
}

/// How often a budget that stays short is summarised in the log.
pub const SHORTAGE_SUMMARY_EVERY: Duration = Duration::from_secs(300);

/// Runs not made for room since the budget's last log line about it: the shortage is the
/// prober's, logged once at warn when it begins and summarised every
/// [`SHORTAGE_SUMMARY_EVERY`] while it lasts (not once per shoot and run).
#[derive(Debug, Default)]
struct Shortage {
    logged_at: Option<Instant>,
    counts: BTreeMap<&'static str, u64>,
}

/// A run's place in line, and whose runs it may end for room: fewer slow runs of its shoot's
/// last [`REMEMBERED_RUNS`] first, then a decision pending before none (see the module
/// documentation). Smaller goes first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Rank {
    /// Slow runs among the shoot's last remembered.
    slow: u32,
    /// 0 with a decision pending, 1 without.
    not_pending: u8,
}

impl Claim {
    fn rank(&self) -> Rank {
        Rank {
            slow: self.history.slow_runs(),
            not_pending: u8::from(!self.pending),
        }
    }

    /// Whether the run counts against the slow runs' share (and may be taken back at once when
    /// it borrows): its shoot was slow more than once of late, as for taking room back. A shoot
    /// in outage whose last run was slow is not: counted slow, its run would be taken back at
    /// once by any prompt waiter while the slow half is full (and hanging shoots slow once went
    /// round that way for ever: admitted as borrowers, taken back young, never slow twice).
    fn slow(&self) -> bool {
        self.history.slow_runs() > TAKES_ROOM_BACK_UP_TO
    }
}

/// Where a run in flight past its prompt limit stands in line: judged with one more slow run
/// (it is slow now, whatever it was).
fn now_rank(run: &InFlight) -> Rank {
    Claim {
        history: SlowHistory((run.claim.history.0 << 1) | 1),
        ..run.claim
    }
    .rank()
}

/// A run in flight.
#[derive(Debug)]
struct InFlight {
    claim: Claim,
    admitted: Instant,
    lag_at_admission: Duration,
    /// Bytes it holds: its reserve and what it was charged past it.
    held: u64,
    /// Told to end for room (its bytes are on their way back).
    ending: bool,
    /// Cancelled to end it for room; why, once ended.
    end: CancellationToken,
    ended_because: Option<NoRunMemory>,
    /// While its charge waits in line: the charge's place and since when. Time waiting for
    /// the budget is the prober's doing, not the shoot's: it is not shoot time.
    charge_waits: Option<(WaitKey, Instant)>,
    /// Time its charges waited, in all.
    waited: Duration,
}

impl InFlight {
    /// Marks its charge served (or given up) at `now`.
    fn charge_done(&mut self, now: Instant) {
        if let Some((_, since)) = self.charge_waits.take() {
            self.waited += now.saturating_duration_since(since);
        }
    }
}

/// A run past its prompt limit as [`MemoryBudget::reclaim`] orders them: where it stands in
/// line now, its age (older first), its id.
type PastRun = (Rank, std::cmp::Reverse<(Instant, u64)>, u64);

/// The runs [`MemoryBudget::reclaim`] may end, each list in the order they are ended.
#[derive(Clone, Copy)]
struct Candidates<'a> {
    /// Past their prompt limit.
    past: &'a [PastRun],
    /// Whose charge waits: its place in line, the run.
    stalled: &'a [(WaitKey, u64)],
    /// Slow runs, the youngest first: admitted at, the run.
    slow: &'a [(Instant, u64)],
}

/// A waiter's place in line: its rank, a charge before an admission of the same rank (a run
/// in flight finishing frees its room sooner), its ticket (or arrival), then arrival (unique).
type WaitKey = (Rank, u8, u64, u64);

/// Who waits for room.
#[derive(Debug)]
enum Waiter {
    /// A run to admit: its claim; told its id once admitted.
    Admission(Claim, oneshot::Sender<u64>),
    /// A charge of a run in flight with a decision pending: the run, the bytes; told once
    /// charged.
    Charge(u64, u64, oneshot::Sender<()>),
}

impl Waiter {
    fn need(&self) -> u64 {
        match self {
            Waiter::Admission(..) => RUN_RESERVE,
            Waiter::Charge(_, bytes, _) => *bytes,
        }
    }
}

/// Everything the pool knows, under one lock.
#[derive(Debug, Default)]
struct State {
    /// Bytes held by runs in flight.
    held: u64,
    /// Of which by slow runs.
    slow_held: u64,
    /// Of which by runs told to end for room.
    reclaiming: u64,
    /// Of which by slow runs told to end.
    slow_reclaiming: u64,
    runs: HashMap<u64, InFlight>,
    /// Who waits, in the order they are served.
    line: BTreeMap<WaitKey, Waiter>,
    /// When the line should be looked at again: the first moment a run in flight may pass
    /// its prompt limit ([`MemoryBudget::reclaim`]).
    recheck_at: Option<Instant>,
    next: u64,
}

impl State {
    fn free(&self, capacity: u64) -> u64 {
        capacity.saturating_sub(self.held)
    }

    fn take_next(&mut self) -> u64 {
        self.next += 1;
        self.next
    }

    /// Whether a waiter that is not slow waits (slow runs then borrow nothing).
    fn prompt_waits(&self) -> bool {
        self.line.keys().next().is_some_and(|k| k.0.slow == 0)
    }
}

impl MemoryBudget {
    /// A pool of `capacity` bytes (at least one [`RUN_RESERVE`]) for runs whose prompt limit
    /// is `prompt_limit`, measured on `lag`.
    pub fn new(
        capacity: u64,
        prompt_limit: Duration,
        lag: Arc<LagClock>,
        metrics: BudgetMetrics,
    ) -> Arc<Self> {
        let capacity = capacity.max(RUN_RESERVE);
        metrics
            .capacity
            .set(i64::try_from(capacity).unwrap_or(i64::MAX));
        Arc::new(MemoryBudget {
            capacity,
            slow_share: (capacity / 2).max(RUN_RESERVE),
            prompt_limit,
            lag,
            state: Mutex::new(State::default()),
            metrics,
            short: Mutex::default(),
            moved: tokio::sync::Notify::new(),
            reclaimer: AtomicBool::new(false),
        })
    }

    /// A pool too large to ever refuse (tests that are not about memory).
    #[cfg(test)]
    pub(crate) fn unbounded() -> Arc<Self> {
        Self::new(
            1 << 50,
            PROMPT_WITHIN,
            Arc::default(),
            BudgetMetrics::default(),
        )
    }

    /// The pool's capacity in bytes.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// The prompt limit of every run.
    pub fn prompt_limit(&self) -> Duration {
        self.prompt_limit
    }

    /// The clock of shoot time.
    pub fn lag_clock(&self) -> &Arc<LagClock> {
        &self.lag
    }

    /// A place among equals for a shoot's runs ([`Claim::ticket`]): later than every ticket
    /// and arrival before it.
    pub fn ticket(&self) -> u64 {
        self.lock().take_next()
    }

    /// Bytes held by runs in flight now.
    pub fn held(&self) -> u64 {
        self.lock().held
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Nothing panics while the lock is held; if something did, the state is whole.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn publish(&self, state: &State) {
        self.metrics
            .held
            .set(i64::try_from(state.held).unwrap_or(i64::MAX));
    }

    /// How long `run` has been in flight, in shoot time, at `now`.
    fn shoot_time(&self, run: &InFlight, now: Instant) -> Duration {
        let wall = now.saturating_duration_since(run.admitted);
        let lag = self.lag.lag().saturating_sub(run.lag_at_admission);
        let waiting = run.charge_waits.map_or(Duration::ZERO, |(_, since)| {
            now.saturating_duration_since(since)
        });
        wall.saturating_sub(lag)
            .saturating_sub(run.waited)
            .saturating_sub(waiting)
    }

    /// Admits a run of a shoot as `claim` says: waits at most `wait` for its
    /// [`RUN_RESERVE`], in line by rank (see the module documentation). While it waits, room
    /// is taken back from runs in flight past their prompt limit.
    pub async fn admit(
        self: &Arc<Self>,
        claim: Claim,
        wait: Duration,
    ) -> Result<MemoryGrant, NoRunMemory> {
        let level = claim.level();
        let deadline = Instant::now() + wait;
        let (key, granted) = {
            let mut state = self.lock();
            let seq = state.take_next();
            let key = (claim.rank(), 1, claim.ticket.unwrap_or(seq), seq);
            let ahead = state.line.keys().next().is_some_and(|k| *k < key);
            if !ahead && self.room_for(&state, claim) {
                let id = self.start_run(&mut state, claim);
                drop(state);
                return Ok(self.grant(id, claim));
            }
            let (tx, rx) = oneshot::channel();
            state.line.insert(key, Waiter::Admission(claim, tx));
            self.metrics
                .waiting
                .get_or_create(&LevelLabels { level })
                .inc();
            self.reclaim(&mut state, Instant::now());
            (key, rx)
        };
        self.ensure_reclaimer();
        // Leaves the line however the wait ends (granted, refused, or this future dropped).
        let mut place = Place {
            budget: self,
            key,
            level,
            granted,
            left: false,
        };
        // Only the grant or the deadline wakes a waiter: room is taken back for it by the
        // passes (on joining, on every release, and the reclaimer's timer).
        tokio::select! {
            id = &mut place.granted => {
                place.leave();
                match id {
                    Ok(id) => Ok(self.grant(id, claim)),
                    // The sender is only dropped with the line's entry: refused.
                    Err(_) => Err(self.refused(wait)),
                }
            }
            () = tokio::time::sleep_until(deadline) => {
                // Granted at the last moment? Then the run goes ahead.
                if let Ok(id) = place.granted.try_recv() {
                    place.leave();
                    return Ok(self.grant(id, claim));
                }
                place.leave();
                Err(self.refused(wait))
            }
        }
    }

    /// Starts the one task that runs the pass of [`MemoryBudget::reclaim`] when a run in
    /// flight may have passed its prompt limit, once (on the first wait). One timer for the
    /// whole line: when every waiter slept until that moment, thousands woke at each of them,
    /// and that cost more CPU than the passes (the hostile bench: 17 s a minute).
    fn ensure_reclaimer(self: &Arc<Self>) {
        if self.reclaimer.swap(true, Ordering::Relaxed) {
            return;
        }
        let budget = self.clone();
        tokio::spawn(async move {
            loop {
                // Registered before looking, so that a moment moved earlier is not missed.
                let moved = budget.moved.notified();
                tokio::pin!(moved);
                moved.as_mut().enable();
                let until = budget.look_again(Instant::now() + RECLAIMER_IDLE);
                tokio::select! {
                    () = moved => {}
                    () = tokio::time::sleep_until(until) => {}
                }
            }
        });
    }

    fn refused(&self, waited: Duration) -> NoRunMemory {
        let refused = NoRunMemory::Admission {
            waited,
            capacity: self.capacity,
        };
        self.count_not_made(&refused);
        refused
    }

    /// Counts a run not made (or ended) for room, and logs the shortage (see [`Shortage`]).
    fn count_not_made(&self, why: &NoRunMemory) {
        let cause = why.cause();
        self.metrics
            .not_made
            .get_or_create(&CauseLabels { cause })
            .inc();
        let mut short = self.short.lock().unwrap_or_else(PoisonError::into_inner);
        *short.counts.entry(cause.as_str()).or_default() += 1;
        let now = Instant::now();
        match short.logged_at {
            None => {
                tracing::warn!(error = %why, capacity = self.capacity,
                    "the probe runs' memory budget is short: a run was not made, or was ended, for room (the prober's doing, not the shoot's); runs of shoots with a decision pending get room first; summarised every {} while it lasts (dwd_prober_runs_not_made_total)",
                    dwd_core::format_go_duration(SHORTAGE_SUMMARY_EVERY));
            }
            Some(at) if now.saturating_duration_since(at) >= SHORTAGE_SUMMARY_EVERY => {
                tracing::warn!(runs = ?short.counts, capacity = self.capacity,
                    "the probe runs' memory budget stayed short: runs not made, or ended, for room since the last summary, by cause");
            }
            Some(_) => return,
        }
        short.logged_at = Some(now);
        short.counts.clear();
    }

    fn grant(self: &Arc<Self>, id: u64, claim: Claim) -> MemoryGrant {
        let end = self
            .lock()
            .runs
            .get(&id)
            .map(|run| run.end.clone())
            .unwrap_or_default();
        MemoryGrant {
            budget: self.clone(),
            id,
            claim,
            end,
            state: Mutex::new(GrantState {
                floor_left: RUN_FLOOR,
                responses: 0,
            }),
        }
    }

    /// Whether a run of `claim` can be admitted now: a reserve is free and, for a slow run,
    /// it fits the slow runs' share or no run that is not slow waits (it borrows).
    fn room_for(&self, state: &State, claim: Claim) -> bool {
        state.free(self.capacity) >= RUN_RESERVE
            && (!claim.slow()
                || state.slow_held + RUN_RESERVE <= self.slow_share
                || !state.prompt_waits())
    }

    fn start_run(&self, state: &mut State, claim: Claim) -> u64 {
        let id = state.take_next();
        state.held += RUN_RESERVE;
        if claim.slow() {
            state.slow_held += RUN_RESERVE;
        }
        state.runs.insert(
            id,
            InFlight {
                claim,
                admitted: Instant::now(),
                lag_at_admission: self.lag.lag(),
                held: RUN_RESERVE,
                ending: false,
                end: CancellationToken::new(),
                ended_because: None,
                charge_waits: None,
                waited: Duration::ZERO,
            },
        );
        self.publish(state);
        id
    }

    /// Gives free room to those waiting, in line order; a waiter that cannot be served stops
    /// the line there (nobody overtakes).
    fn serve(&self, state: &mut State) {
        self.serve_line(state);
        // What was counted on for those still waiting may have gone to one ahead of them.
        self.reclaim(state, Instant::now());
    }

    fn serve_line(&self, state: &mut State) {
        while let Some((&key, waiter)) = state.line.first_key_value() {
            let ready = match waiter {
                Waiter::Admission(claim, _) => self.room_for(state, *claim),
                Waiter::Charge(run, bytes, _) => {
                    !state.runs.contains_key(run) || state.free(self.capacity) >= *bytes
                }
            };
            if !ready {
                break;
            }
            let Some(waiter) = state.line.remove(&key) else {
                break;
            };
            match waiter {
                Waiter::Admission(claim, tx) => {
                    let id = self.start_run(state, claim);
                    if let Err(id) = tx.send(id) {
                        // Its admission was given up meanwhile: the room goes back.
                        self.end_run(state, id);
                    }
                }
                Waiter::Charge(run, bytes, wake) => {
                    if let Some(flight) = state.runs.get_mut(&run) {
                        flight.charge_done(Instant::now());
                    }
                    self.add_held(state, run, bytes);
                    // A charge given up meanwhile (its read dropped) returns at the run's end.
                    let _ = wake.send(());
                }
            }
        }
        self.publish(state);
    }

    fn add_held(&self, state: &mut State, run: u64, bytes: u64) {
        let Some(flight) = state.runs.get_mut(&run) else {
            return;
        };
        flight.held += bytes;
        state.held += bytes;
        if flight.claim.slow() {
            state.slow_held += bytes;
        }
        if flight.ending {
            state.reclaiming += bytes;
            if flight.claim.slow() {
                state.slow_reclaiming += bytes;
            }
        }
    }

    fn sub_held(&self, state: &mut State, run: u64, bytes: u64) {
        let Some(flight) = state.runs.get_mut(&run) else {
            return;
        };
        let bytes = bytes.min(flight.held.saturating_sub(RUN_RESERVE));
        flight.held -= bytes;
        state.held -= bytes;
        if flight.claim.slow() {
            state.slow_held -= bytes;
        }
        if flight.ending {
            state.reclaiming -= bytes;
            if flight.claim.slow() {
                state.slow_reclaiming -= bytes;
            }
        }
    }

    /// Removes a run, returning everything it held.
    fn end_run(&self, state: &mut State, id: u64) {
        let Some(run) = state.runs.remove(&id) else {
            return;
        };
        state.held -= run.held;
        if run.claim.slow() {
            state.slow_held -= run.held;
        }
        if run.ending {
            state.reclaiming -= run.held;
            if run.claim.slow() {
                state.slow_reclaiming -= run.held;
            }
        }
    }

    /// Takes room back for the line, in one pass: for each waiter in order, ends runs (as the
    /// module documentation says) until what is free or on its way back covers the need of
    /// the line up to it; sets when to look again (the first moment a run in flight may pass
    /// its prompt limit), and wakes the waiters when that moment moved earlier. One pass costs
    /// a sort of the runs in flight and a walk of the line: it runs when someone joins the
    /// line, when room is given out, and when that moment comes (the first waiter to wake
    /// does it), not once per waiter (which cost 30 s of CPU a minute with 3,000 waiters and
    /// 700 runs in flight in the hostile bench).
    fn reclaim(&self, state: &mut State, now: Instant) {
        let before = state.recheck_at;
        state.recheck_at = None;
        if state.line.is_empty() {
            return;
        }
        // Runs past F, the best to end first: the last in line (judged slow now), then the
        // oldest; runs whose charge waits, the last in line first; slow runs, the youngest
        // (the last to borrow) first.
        let mut past: Vec<PastRun> = Vec::new();
        let mut stalled: Vec<(WaitKey, u64)> = Vec::new();
        let mut slow: Vec<(Instant, u64)> = Vec::new();
        let mut soonest: Option<Duration> = None;
        for (&id, run) in state.runs.iter().filter(|(_, run)| !run.ending) {
            if run.claim.slow() {
                slow.push((run.admitted, id));
            }
            if let Some((key, _)) = run.charge_waits {
                stalled.push((key, id));
            }
            let t = self.shoot_time(run, now);
            if t >= self.prompt_limit {
                past.push((now_rank(run), std::cmp::Reverse((run.admitted, id)), id));
            } else if run.charge_waits.is_none() {
                // A run whose charge waits does not age: looking again for it would spin.
                let left = self.prompt_limit - t;
                soonest = Some(soonest.map_or(left, |s| s.min(left)));
            }
        }
        past.sort_unstable_by(|a, b| b.cmp(a));
        stalled.sort_unstable_by(|a, b| b.cmp(a));
        slow.sort_unstable_by(|a, b| b.cmp(a));
        let candidates = Candidates {
            past: &past,
            stalled: &stalled,
            slow: &slow,
        };
        let mut next = (0, 0, 0);
        let mut need = 0u64;
        let waiters: Vec<(WaitKey, u64, Option<u64>)> = state
            .line
            .iter()
            .map(|(key, waiter)| {
                let own = match waiter {
                    Waiter::Charge(run, ..) => Some(*run),
                    Waiter::Admission(..) => None,
                };
                (*key, waiter.need(), own)
            })
            .collect();
        for (key, waiter_need, own) in waiters {
            need += waiter_need;
            while state.free(self.capacity) + state.reclaiming < need {
                match self.victim(state, key, own, candidates, &mut next, now) {
                    Some((id, why)) => self.end(state, id, why),
                    None => break,
                }
            }
        }
        state.recheck_at = soonest.map(|left| now + left);
        if state
            .recheck_at
            .is_some_and(|at| before.is_none_or(|b| at < b))
        {
            self.moved.notify_waiters();
        }
    }

    /// The next run to end for the waiter at `key` (whose own run, if its charge waits, is
    /// `own`), from the candidates of [`MemoryBudget::reclaim`] (`next`: how far each list was
    /// used), and why; `None` when none may be ended for it.
    fn victim(
        &self,
        state: &State,
        key: WaitKey,
        own: Option<u64>,
        Candidates {
            past,
            stalled,
            slow,
        }: Candidates<'_>,
        next: &mut (usize, usize, usize),
        now: Instant,
    ) -> Option<(u64, NoRunMemory)> {
        let rank = key.0;
        // A shoot slow more than once among its last runs waits its turn: it takes no room
        // back. Hanging shoots would otherwise end each other's runs every F, each ended run
        // a new connection for nothing (the hostile bench: 25 s of CPU a minute, 230 runs
        // ended a second among 5,000 slow shoots).
        if rank.slow > TAKES_ROOM_BACK_UP_TO {
            return None;
        }
        let usable =
            |id: u64| Some(id) != own && state.runs.get(&id).is_some_and(|run| !run.ending);
        // A slow run borrowing past the slow runs' share, for a waiter that is not slow.
        if rank.slow == 0 && state.slow_held - state.slow_reclaiming > self.slow_share {
            while next.2 < slow.len() && !usable(slow[next.2].1) {
                next.2 += 1;
            }
            if let Some(&(_, id)) = slow.get(next.2) {
                return Some((
                    id,
                    NoRunMemory::Reclaimed {
                        share: self.slow_share,
                    },
                ));
            }
        }
        // Past F and not ahead of the waiter.
        while next.0 < past.len() && !usable(past[next.0].2) {
            next.0 += 1;
        }
        if let Some(&(victim_rank, _, id)) = past.get(next.0)
            && victim_rank >= rank
        {
            let in_flight = state
                .runs
                .get(&id)
                .map_or(Duration::ZERO, |run| self.shoot_time(run, now));
            return Some((
                id,
                NoRunMemory::EndedForRoom {
                    in_flight,
                    limit: self.prompt_limit,
                },
            ));
        }
        // A run whose own charge waits behind this waiter makes no progress: ended at once, so
        // that runs never wait on each other's room for good.
        while next.1 < stalled.len() && !usable(stalled[next.1].1) {
            next.1 += 1;
        }
        match stalled.get(next.1) {
            Some(&(charge, id)) if charge > key => Some((
                id,
                NoRunMemory::EndedForRoom {
                    in_flight: Duration::ZERO,
                    limit: self.prompt_limit,
                },
            )),
            _ => None,
        }
    }

    /// Ends run `id` for room, `why`: its bytes are on their way back.
    fn end(&self, state: &mut State, id: u64, why: NoRunMemory) {
        let Some(run) = state.runs.get_mut(&id) else {
            return;
        };
        run.ending = true;
        run.ended_because = Some(why.clone());
        run.end.cancel();
        let (held, slow) = (run.held, run.claim.slow());
        state.reclaiming += held;
        if slow {
            state.slow_reclaiming += held;
        }
        self.count_not_made(&why);
    }

    /// Runs the pass of [`MemoryBudget::reclaim`] if its moment has come; when to look again
    /// (at most `deadline`).
    fn look_again(&self, deadline: Instant) -> Instant {
        let mut state = self.lock();
        let now = Instant::now();
        if state.recheck_at.is_some_and(|at| at <= now) {
            self.reclaim(&mut state, now);
        }
        state.recheck_at.map_or(deadline, |at| at.min(deadline))
    }

    /// Returns a released run's room and serves those waiting.
    fn release(&self, id: u64) {
        let mut state = self.lock();
        self.end_run(&mut state, id);
        self.serve(&mut state);
    }
}

/// A waiter's place in line. Leaving it removes the entry; when the waiting future is dropped
/// instead, a grant that arrived but was not taken goes back too.
struct Place<'a> {
    budget: &'a Arc<MemoryBudget>,
    key: WaitKey,
    level: Level,
    /// The id of the run once admitted.
    granted: oneshot::Receiver<u64>,
    left: bool,
}

impl Place<'_> {
    fn leave(&mut self) {
        if self.left {
            return;
        }
        self.left = true;
        let budget = self.budget;
        let mut state = budget.lock();
        if state.line.remove(&self.key).is_some() {
            // Still in line: nothing was granted. Those behind may be served now.
            budget.serve(&mut state);
        }
        drop(state);
        budget
            .metrics
            .waiting
            .get_or_create(&LevelLabels { level: self.level })
            .dec();
    }
}

impl Drop for Place<'_> {
    fn drop(&mut self) {
        if self.left {
            return;
        }
        self.leave();
        // Admitted while the future was being dropped: nobody will run it.
        if let Ok(id) = self.granted.try_recv() {
            self.budget.release(id);
        }
    }
}

/// One run's hold on the pool: its reserve and what it was charged. Everything returns to the
/// pool when it is dropped (the run's end); a response body's bytes return earlier, once the
/// run has decoded them ([`MemoryGrant::release_response`]).
#[derive(Debug)]
pub struct MemoryGrant {
    budget: Arc<MemoryBudget>,
    id: u64,
    claim: Claim,
    end: CancellationToken,
    state: Mutex<GrantState>,
}

#[derive(Debug)]
struct GrantState {
    /// What is left of the reserve's floor.
    floor_left: u64,
    /// Bytes of response bodies charged and not yet released (from the floor or the pool).
    responses: u64,
}

impl MemoryGrant {
    /// The level the run was admitted at.
    pub fn level(&self) -> Level {
        self.claim.level()
    }

    /// How long the run has been in flight, in shoot time.
    pub fn shoot_time(&self) -> Duration {
        let state = self.budget.lock();
        state.runs.get(&self.id).map_or(Duration::ZERO, |run| {
            self.budget.shoot_time(run, Instant::now())
        })
    }

    /// Resolves when the run is ended for room; why.
    pub async fn ended_for_room(&self) -> NoRunMemory {
        self.end.cancelled().await;
        self.budget
            .lock()
            .runs
            .get(&self.id)
            .and_then(|run| run.ended_because.clone())
            .unwrap_or(NoRunMemory::Reclaimed {
                share: self.budget.slow_share,
            })
    }

    fn lock(&self) -> MutexGuard<'_, GrantState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Charges `bytes` the run holds until it ends (its decoded views), like
    /// [`MemoryGrant::charge_response`] but never returned early.
    pub async fn charge(&self, bytes: u64) -> Result<(), NoRunMemory> {
        self.take(bytes, false).await
    }

    /// Charges `bytes` of a response body as the run reads them: from the floor while it
    /// lasts, then from the pool. Room that is not free is waited for in line (ahead of the
    /// admissions of the run's rank, taking room back from runs past their prompt limit): a
    /// run is never refused bytes its apiserver sends in time, unless they are more than the
    /// pool could ever give it (its capacity less the run's reserve). They return with
    /// [`MemoryGrant::release_response`] or at the run's end.
    pub async fn charge_response(&self, bytes: u64) -> Result<(), NoRunMemory> {
        self.take(bytes, true).await
    }

    /// Returns up to `bytes` of what response bodies were charged (never views, never the
    /// reserve): the run decoded them.
    pub fn release_response(&self, bytes: u64) {
        let mut grant = self.lock();
        let n = bytes.min(grant.responses);
        grant.responses -= n;
        let budget = &self.budget;
        let mut state = budget.lock();
        let taken = state
            .runs
            .get(&self.id)
            .map_or(0, |run| run.held.saturating_sub(RUN_RESERVE));
        let from_pool = n.min(taken);
        budget.sub_held(&mut state, self.id, from_pool);
        grant.floor_left = (grant.floor_left + (n - from_pool)).min(RUN_FLOOR);
        budget.serve(&mut state);
    }

    async fn take(&self, bytes: u64, response: bool) -> Result<(), NoRunMemory> {
        let rest = {
            let mut grant = self.lock();
            let from_floor = grant.floor_left.min(bytes);
            grant.floor_left -= from_floor;
            if response {
                grant.responses += from_floor;
            }
            bytes - from_floor
        };
        if rest == 0 {
            return Ok(());
        }
        let budget = &self.budget;
        let waiting = {
            let mut state = budget.lock();
            let seq = state.take_next();
            let key = (self.claim.rank(), 0, seq, seq);
            let ahead = state.line.keys().next().is_some_and(|k| *k < key);
            if !ahead && state.free(budget.capacity) >= rest {
                budget.add_held(&mut state, self.id, rest);
                budget.publish(&state);
                None
            } else if rest <= budget.capacity - RUN_RESERVE {
                let (tx, rx) = oneshot::channel();
                state.line.insert(key, Waiter::Charge(self.id, rest, tx));
                if let Some(flight) = state.runs.get_mut(&self.id) {
                    flight.charge_waits = Some((key, Instant::now()));
                }
                budget.reclaim(&mut state, Instant::now());
                Some((key, rx))
            } else {
                drop(state);
                let refused = NoRunMemory::Exhausted {
                    wanted: rest,
                    capacity: budget.capacity,
                };
                budget.count_not_made(&refused);
                return Err(refused);
            }
        };
        if let Some((key, mut rx)) = waiting {
            // Leaves the line if this read is dropped while it waits.
            let _place = ChargePlace {
                budget,
                run: self.id,
                key,
            };
            budget.ensure_reclaimer();
            tokio::select! {
                done = &mut rx => {
                    if done.is_err() {
                        // Dropped only with the run's end.
                        return Ok(());
                    }
                }
                // The run was ended for room while its charge waited: the charge ends too
                // (what the run holds returns when its grant is dropped).
                why = self.ended_for_room() => return Err(why),
            }
        }
        if response {
            self.lock().responses += rest;
        }
        Ok(())
    }
}

/// A pending run's charge in line; removed when the read is dropped while it waits.
struct ChargePlace<'a> {
    budget: &'a MemoryBudget,
    run: u64,
    key: WaitKey,
}

impl Drop for ChargePlace<'_> {
    fn drop(&mut self) {
        let mut state = self.budget.lock();
        if let Some(flight) = state.runs.get_mut(&self.run) {
            flight.charge_done(Instant::now());
        }
        if state.line.remove(&self.key).is_some() {
            self.budget.serve(&mut state);
        }
    }
}

impl Drop for MemoryGrant {
    fn drop(&mut self) {
        self.budget.release(self.id);
    }
}

#[cfg(test)]
mod tests;
