//! One shoot's probe: a tokio task (never a thread) that runs the API-server probe and the
//! lease probe every `probeInterval` (jittered; from each run's start while runs are short), and hands a scaling flow over to the
//! shoot's executor ([`super::executor`], polled by the same task) when the lease decision
//! says so: the probe never waits for a flow, so it keeps its schedule while the seed's budget
//! holds the flow back, and its newest verdict supersedes the flow it handed over before.
//! Everything it reads from the seed comes from watch caches; everything it reads from the
//! shoot goes through a client built for this run only and dropped at its end,
//! so every run proves reachability anew (the reference disables keep-alive for the same
//! reason). A slow or dead shoot only delays its own task: every call has `probeTimeout`.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use chrono::Utc;
use dwd_core::lease::LeaseReport;
use dwd_core::verdict::VerdictMemory;
use dwd_core::{
    EffectiveProbeSettings, Hysteresis, LeaseDecision, evaluate_leases, leases_alone_suffice,
};
use kube::Client;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, info, info_span, warn};

use super::context::ProberContext;
use super::executor::Executor;
use super::report::{Judged, NotMade, RunReport, ShootRef};
use super::scaler::{self, PlannedFlow};
use super::shoot_reads;
use crate::Error;
use crate::client::kube_client::{
    HttpVersion, PreparedShootConfig, ResponseLimits, is_response_too_large,
};
use crate::memory_budget::{self, Claim, MemoryGrant, NoRunMemory, SlowHistory};
use crate::metrics::{ApiLabel, ApiLabels, RunLabels, RunResult, ShootSeries};

/// What one run found, for the loop and for tests.
#[derive(Debug, Default)]
pub struct RunOutcome {
    /// When a call of this run was answered 429, if one was.
    pub(crate) throttled_at: Option<Instant>,
}

/// What a probe carries from one run to the next.
#[derive(Debug)]
pub struct RunMemory {
    /// What the verdicts remember: the hysteresis streaks, and the zones disrupted at the last
    /// run that judged zones (the next verdict names each zone that joins or leaves that set,
    /// docs/behaviour.md §2.19).
    pub verdicts: VerdictMemory,
    /// Which of the shoot's last runs did not end within the prompt limit (shoot time): its
    /// place in line for the memory budget ([`crate::memory_budget`]).
    pub slow_history: SlowHistory,
    /// The shoot's place among equals in the budget's line, kept while its runs are not made
    /// for room ([`Claim::ticket`]).
    pub ticket: Option<u64>,
    /// Whether the last finding saw an expired candidate lease: a decision may be due, so the
    /// next run gets room first.
    pub expired_seen: bool,
    /// Whether the current run asked for room with a decision pending.
    pub pending: bool,
    /// The way the shoot's runs keep failing, if they do: logged at warn when it starts or
    /// changes, then summarised ([`FailingSince`]).
    pub failing: Option<FailingSince>,
}

/// How long a run may take when the config gives no `probeTimeout` (zero or less: no call
/// deadline, as in the reference): the run is ended this long after its admission, so a
/// shoot apiserver that accepts and never answers does not hold the shoot's probe forever.
pub const RUN_LIMIT_WITHOUT_TIMEOUT: Duration = Duration::from_secs(300);

/// How often a shoot whose runs keep failing the same way is summarised at info level.
pub const FAILURE_SUMMARY_EVERY: Duration = Duration::from_secs(300);

/// Since when, and how often, a shoot's runs have failed the same way.
#[derive(Debug, Clone)]
pub struct FailingSince {
    /// The failure's kind ([`ProbeFailure::kind`]).
    pub kind: &'static str,
    /// When the first run of the streak failed.
    pub since: Instant,
    /// Failed runs in the streak.
    pub runs: u64,
    /// When it was last logged (at warn when it began, at info since).
    pub logged_at: Instant,
}

impl RunMemory {
    /// Whether a decision is pending as far as the probe knows: a scale-down streak is
    /// building, a zone is disrupted, or the last finding saw expired leases. (The executor
    /// knows the rest: [`Executor::decision_pending`].)
    pub fn decision_pending(&self) -> bool {
        self.verdicts.hysteresis.streaks().1 > 0
            || !self.verdicts.disrupted_zones.is_empty()
            || self.expired_seen
    }

    /// Notes a failed run of `kind`: whether it starts a streak (or changes its kind), and
    /// whether a summary of a streak is due.
    fn note_failure(&mut self, kind: &'static str, now: Instant) -> FailureLog {
        match &mut self.failing {
            Some(f) if f.kind == kind => {
                f.runs += 1;
                if now.saturating_duration_since(f.logged_at) >= FAILURE_SUMMARY_EVERY {
                    f.logged_at = now;
                    return FailureLog::Summary {
                        runs: f.runs,
                        since: now.saturating_duration_since(f.since),
                    };
                }
                FailureLog::Repeat
            }
            _ => {
                self.failing = Some(FailingSince {
                    kind,
                    since: now,
                    runs: 1,
                    logged_at: now,
                });
                FailureLog::First
            }
        }
    }
}

/// How a failed run is logged (see [`RunMemory::note_failure`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FailureLog {
    /// The first of its kind in a row: at warn level.
    First,
    /// The same again: at debug level.
    Repeat,
    /// The same again, and a summary is due: at info level.
    Summary {
        /// Failed runs in the streak.
        runs: u64,
        /// Since the first.
        since: Duration,
    },
}

impl RunMemory {
    /// A new probe's memory: no streak, no disrupted zone.
    pub fn new(config: &dwd_core::ProberConfig) -> Self {
        RunMemory {
            verdicts: VerdictMemory {
                hysteresis: Hysteresis::from_config(config),
                disrupted_zones: BTreeSet::new(),
            },
            slow_history: SlowHistory::default(),
            ticket: None,
            expired_seen: false,
            pending: false,
            failing: None,
        }
    }
}

/// What a successful lease probe found.
enum Finding {
    /// The full verdict over nodes, machines and leases, judged at `judged_at` (when the
    /// leases were asked for).
    Report {
        report: LeaseReport,
        judged_at: chrono::DateTime<Utc>,
    },
    /// Every lease was fresh and no target waited to be restored: nothing can change, so
    /// the nodes were not listed.
    AllLeasesFresh {
        /// Leases seen.
        leases: usize,
    },
}

/// What the Cluster says a shoot's probe should use; the controller updates it and the probe
/// takes the newest at the start of each run (docs/behaviour.md §2.3: no restart, no new initial
/// delay).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeSpec {
    /// Effective settings (grace period, pool conditions).
    pub settings: EffectiveProbeSettings,
    /// UID of the shoot's Cluster.
    pub cluster_uid: Option<String>,
}

/// The largest `backoffJitterFactor` the probe loop uses: a run every `probeInterval × 11` at
/// worst. Larger factors only push runs apart (and at about 1e9 overflow the clock).
pub(crate) const MAX_JITTER_FACTOR: f64 = 10.0;

/// Farthest a probe ever plans ahead: beyond it, time arithmetic could overflow.
const FAR_FUTURE: Duration = Duration::from_secs(30 * 365 * 24 * 3600);

/// The jitter factor the probe loop uses for `configured`: within `[0, MAX_JITTER_FACTOR]`,
/// 0 for NaN.
pub(crate) fn effective_jitter(configured: f64) -> f64 {
    if configured.is_nan() {
        return 0.0;
    }
    configured.clamp(0.0, MAX_JITTER_FACTOR)
}

/// What to tell the operator, once at start, when [`effective_jitter`] changed the factor.
pub(crate) fn jitter_warning(configured: f64) -> Option<String> {
    let used = effective_jitter(configured);
    // NaN never equals itself, so it is reported too.
    if used == configured {
        return None;
    }
    Some(format!(
        "backoffJitterFactor {configured} is outside [0, {MAX_JITTER_FACTOR}]: using {used}"
    ))
}

/// `now + delay`, without overflowing: at most [`FAR_FUTURE`] ahead.
fn deadline_after(now: Instant, delay: Duration) -> Instant {
    now.checked_add(delay.min(FAR_FUTURE))
        .or_else(|| now.checked_add(FAR_FUTURE))
        .unwrap_or(now)
}

/// Why a probe run ended without a finding: nothing is scaled this run. Made by the run,
/// reported in one place (`Probe::report_failure`: metrics, log line, 429 spacing).
#[derive(Debug)]
pub(crate) enum ProbeFailure {
    /// Seed caches not in sync (their names): the run was not made. When unsure, do not
    /// scale: a cache that fell out of sync may hold a target or machine as it was minutes
    /// ago.
    SeedCachesNotSynced(String),
    /// No usable shoot client (the probe secret's kubeconfig).
    NoShootClient(Error),
    /// The API server probe (`GET /version`) failed.
    ApiServer(Error),
    /// A list of the lease probe (leases, nodes) failed.
    ShootList(Error),
    /// The Machine cache has not synced yet.
    MachinesNotSynced,
    /// The memory budget had no room for the run within `probeTimeout` (nothing was sent),
    /// or none for it once it turned out slow (it was ended at its prompt limit).
    NoRunMemory(NoRunMemory),
}

impl std::fmt::Display for ProbeFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ProbeFailure::SeedCachesNotSynced(pending) => {
                write!(f, "seed caches not in sync: {pending}")
            }
            ProbeFailure::NoShootClient(e) => write!(f, "no usable kubeconfig: {e}"),
            ProbeFailure::ApiServer(e) => write!(f, "API server probe failed: {e}"),
            ProbeFailure::ShootList(e) => write!(f, "lease probe failed: {e}"),
            ProbeFailure::MachinesNotSynced => f.write_str("machine cache not synced yet"),
            ProbeFailure::NoRunMemory(e) => f.write_str(&e.to_string()),
        }
    }
}

impl ProbeFailure {
    /// The stable category of the failure: the `result` label of the run counters (and which
    /// per-shoot failure counter it counts in).
    pub(crate) fn category(&self) -> RunResult {
        match self {
            // Like a kubeconfig that gives no client: the API server could not be asked.
            ProbeFailure::NoShootClient(_) | ProbeFailure::ApiServer(_) => {
                RunResult::ApiServerProbeFailed
            }
            // The prober's doing, not the shoot's.
            ProbeFailure::NoRunMemory(_) => RunResult::NotMadeForRoom,
            ProbeFailure::SeedCachesNotSynced(_)
            | ProbeFailure::ShootList(_)
            | ProbeFailure::MachinesNotSynced => RunResult::LeaseProbeFailed,
        }
    }

    /// The failure's kind in one word, for telling a repeated failure from a new one in the
    /// logs (a shoot that keeps failing the same way is logged once, then summarised).
    fn kind(&self) -> &'static str {
        match self {
            ProbeFailure::SeedCachesNotSynced(_) => "seed caches",
            ProbeFailure::NoShootClient(_) => "kubeconfig",
            ProbeFailure::ApiServer(_) => "API server probe",
            ProbeFailure::ShootList(_) => "lease probe",
            ProbeFailure::MachinesNotSynced => "machine cache",
            ProbeFailure::NoRunMemory(e) => e.cause().as_str(),
        }
    }

    /// What the failure means for this run, in words (the log line's message).
    fn consequence(&self) -> &'static str {
        match self {
            ProbeFailure::SeedCachesNotSynced(_) => {
                "seed caches not in sync: no probe, no scaling this run"
            }
            ProbeFailure::NoShootClient(_) => {
                "API server probe failed; no usable kubeconfig; no scaling this run"
            }
            ProbeFailure::ApiServer(_) => {
                "API server probe failed; no lease probe, no scaling this run"
            }
            ProbeFailure::ShootList(_) | ProbeFailure::MachinesNotSynced => {
                "lease probe failed; no scaling this run"
            }
            ProbeFailure::NoRunMemory(
                NoRunMemory::EndedForRoom { .. } | NoRunMemory::Reclaimed { .. },
            ) => {
                "probe ended for room in the runs' memory budget (the prober's, not the shoot's); no scaling this run"
            }
            ProbeFailure::NoRunMemory(_) => {
                "probe not made for room in the runs' memory budget (the prober's, not the shoot's); no scaling this run"
            }
        }
    }

    /// Whether a shoot call of the run was answered 429 (the next run is spaced out).
    pub(crate) fn throttled(&self) -> bool {
        match self {
            ProbeFailure::ApiServer(e) | ProbeFailure::ShootList(e) => e.is_throttled(),
            _ => false,
        }
    }
}

/// One shoot's probe.
pub struct Probe {
    /// Shoot namespace in the seed (= Cluster name).
    pub namespace: String,
    /// Effective settings (grace period, pool conditions) of the current run, taken from
    /// `updates` at its start.
    pub settings: EffectiveProbeSettings,
    /// UID of the shoot's Cluster, which the decision events are about (known from the
    /// controller's watch, so publishing them costs no lookup); taken from `updates` too.
    pub cluster_uid: Option<String>,
    /// The newest [`ProbeSpec`] the controller wrote.
    pub updates: tokio::sync::watch::Receiver<ProbeSpec>,
    /// The right to write this shoot's per-shoot metric series (revoked when it is removed).
    pub series: ShootSeries,
    /// Shared prober context.
    pub(crate) ctx: Arc<ProberContext>,
    /// Cancelled when the probe is removed or the process shuts down.
    pub cancel: CancellationToken,
    /// The probe secret's kubeconfig as last prepared (parsed, TLS configured): reused while
    /// the secret holds the same text, prepared anew when it changes.
    pub(crate) shoot_config: std::sync::Mutex<Option<Arc<PreparedShootConfig>>>,
    /// Whether the shoot's last `GET /version` came over HTTP/2: the next run that needs its
    /// nodes may then send all its reads at once (`probe_shoot`).
    multiplexed: AtomicBool,
    /// Test-only (absent outside unit tests): makes each run's shoot client in place of the
    /// probe secret's kubeconfig, e.g. a client on a fake shoot apiserver.
    #[cfg(test)]
    pub(crate) shoot_connector: Option<ShootConnector>,
}

/// What a run read before judging its leases ([`Probe::read_version_and_leases`]).
struct LeaseReads {
    /// The shoot's node leases.
    leases: Vec<dwd_core::lease::NodeLeaseView>,
    /// When the leases were asked for: their expiry is judged against it.
    listed_at: chrono::DateTime<Utc>,
    /// The node list, when it was sent with the leases.
    nodes_at_once: Option<Result<Vec<dwd_core::lease::NodeView>, Error>>,
}

/// Test-only: what makes a run's shoot client (see [`Probe::shoot_connector`]).
#[cfg(test)]
pub(crate) type ShootConnector = Arc<dyn Fn(HttpVersion) -> Client + Send + Sync>;

impl Probe {
    /// A probe of `namespace` following `updates` (its current value applies to the first run).
    pub fn new(
        namespace: String,
        mut updates: tokio::sync::watch::Receiver<ProbeSpec>,
        series: ShootSeries,
        ctx: Arc<ProberContext>,
        cancel: CancellationToken,
    ) -> Self {
        let spec = updates.borrow_and_update().clone();
        Probe {
            namespace,
            settings: spec.settings,
            cluster_uid: spec.cluster_uid,
            updates,
            series,
            ctx,
            cancel,
            shoot_config: Default::default(),
            multiplexed: AtomicBool::new(false),
            #[cfg(test)]
            shoot_connector: None,
        }
    }

    /// Runs until cancelled, the first run after `first_delay` (`initialDelay` for a new
    /// probe; a restarted one resumes its schedule).
    pub async fn run(self, first_delay: Duration, executor: Executor) {
        let span = info_span!("probe", shoot = %self.namespace);
        self.run_loop(first_delay, executor).instrument(span).await;
    }

    /// The probe loop and the shoot's executor, polled together by this task: both end with
    /// it (a flow's write on the wire is then dropped, as a process stop would).
    async fn run_loop(self, first_delay: Duration, executor: Executor) {
        let ctx = self.ctx.clone();
        let namespace = self.namespace.clone();
        tokio::select! {
            _ = self.probe_loop(first_delay, &executor) => {}
            _ = executor.run(&ctx, &namespace) => {}
        }
    }

    async fn probe_loop(mut self, first_delay: Duration, executor: &Executor) {
        let ctx = self.ctx.clone();
        let cfg = &ctx.config;
        debug!(?first_delay, grace = ?self.settings.node_monitor_grace, "probe started");
        if !self
            .sleep_until(deadline_after(Instant::now(), first_delay))
            .await
        {
            return;
        }
        // Clamped (and warned about once, at start, by `prober::run`): an absurd factor must
        // not overflow the clock.
        let jitter = effective_jitter(cfg.backoff_jitter_factor);
        let mut memory = RunMemory::new(cfg);
        loop {
            #[cfg(test)]
            if end_for_test::requested(&self.namespace) {
                warn!("probe task ends: asked to by a test");
                return;
            }
            self.take_updates();
            let started = Instant::now();
            let outcome = match self.unsynced_caches() {
                Some(pending) => {
                    let mut outcome = RunOutcome::default();
                    let failure = ProbeFailure::SeedCachesNotSynced(pending);
                    self.report_failure(failure, &mut outcome, &mut memory, executor);
                    outcome
                }
                // Boxed: a run's state (three reads at once at its deepest) lives on the heap
                // only while the run does; inline, it sized every shoot's task for it between
                // runs too (9.9 KiB against 5.9 KiB before the reads at once, 2.3 KiB boxed,
                // debug build; 6 MiB of peak RSS at 5,203 shoots in the hostile bench).
                None => tokio::select! {
                    _ = self.cancel.cancelled() => return,
                    outcome = Box::pin(self.run_once(&mut memory, executor)) => outcome,
                },
            };
            // A flow's 429 spaces the runs out as the run's own does.
            let throttled_at = executor.take_throttled().max(outcome.throttled_at);
            self.ctx
                .metrics
                .probe_run_duration
                .0
                .observe(started.elapsed().as_secs_f64());
            let delay =
                dwd_core::schedule::next_delay(cfg.probe_interval, jitter, rand::random::<f64>())
                    .min(FAR_FUTURE);
            // From the run's start while runs are short, never back to back (§2.4).
            let next = dwd_core::schedule::earliest_next_start(
                Instant::now(),
                started.elapsed(),
                cfg.probe_interval,
                delay,
                throttled_at,
            );
            if let Some(t) = throttled_at {
                debug!(wait = ?next.saturating_duration_since(t), "throttled (429): next run no earlier than 10s after it");
            }
            if !self.sleep_until(next).await {
                return;
            }
        }
    }

    /// Takes the controller's newest settings and Cluster UID, if they changed.
    fn take_updates(&mut self) {
        // An error means the manager dropped this probe; its cancellation ends the loop.
        if !self.updates.has_changed().unwrap_or(false) {
            return;
        }
        let spec = self.updates.borrow_and_update().clone();
        if spec.settings != self.settings {
            info!(grace = ?spec.settings.node_monitor_grace, pools = ?spec.settings.pool_conditions,
                "the Cluster changed this probe's settings: they apply from this run");
        }
        self.settings = spec.settings;
        self.cluster_uid = spec.cluster_uid;
    }

    /// The seed caches that are not in sync, in words, or `None` when all are.
    fn unsynced_caches(&self) -> Option<String> {
        if self.ctx.caches.is_ready() {
            return None;
        }
        Some(self.ctx.caches.pending().join(", "))
    }

    /// Reports a run that ended in `failure`, the one place that does: a 429 spaces the next
    /// run out, the failure counts in its category's per-shoot counter and as a run of its
    /// category, and is logged.
    ///
    /// A run not made, or ended, for room in the runs' memory budget is the prober's doing:
    /// counted as such (`NotMadeForRoom`, and by cause in the budget's metrics), never as the
    /// shoot's API-server or lease probe failure, and the shoot is marked as waiting for room.
    /// A shoot whose runs keep failing the same way is logged at warn when that starts (or
    /// changes), then at debug, with a summary at info every [`FAILURE_SUMMARY_EVERY`].
    fn report_failure(
        &self,
        failure: ProbeFailure,
        outcome: &mut RunOutcome,
        memory: &mut RunMemory,
        executor: &Executor,
    ) {
        if failure.throttled() {
            outcome.throttled_at = Some(Instant::now());
        }
        let category = failure.category();
        let m = &self.ctx.metrics;
        m.for_shoot(&self.series, |l| match category {
            RunResult::ApiServerProbeFailed => {
                m.api_server_probe_failures.get_or_create(l).inc();
            }
            RunResult::NotMadeForRoom => {
                m.shoot_waiting_for_room.get_or_create(l).set(1);
            }
            _ => {
                m.lease_probe_failures.get_or_create(l).inc();
            }
        });
        self.count_run(category);
        match &failure {
            ProbeFailure::NoRunMemory(refused) => {
                let not_made = NotMade {
                    why: &failure,
                    cause: refused.cause().as_str(),
                    decision_pending: memory.pending,
                    expired_seen: memory.expired_seen,
                    grace: self.settings.node_monitor_grace,
                };
                self.publish(executor, &RunReport::NotMade(not_made));
            }
            _ => self.publish(executor, &RunReport::Failed(&failure)),
        }
        let consequence = failure.consequence();
        if let ProbeFailure::SeedCachesNotSynced(pending) = &failure {
            // Logged at debug: the caches and the readiness report it once, not every probe
            // at every interval.
            debug!(caches = %pending, "{consequence}");
            return;
        }
        let error = match &failure {
            ProbeFailure::NoShootClient(e)
            | ProbeFailure::ApiServer(e)
            | ProbeFailure::ShootList(e) => e.to_string(),
            ProbeFailure::NoRunMemory(e) => e.to_string(),
            other => other.to_string(),
        };
        // Not made for room: the prober's shortage, logged by the budget once for all shoots;
        // here only for a shoot with a decision pending, the one that must not wait.
        let quiet = matches!(failure, ProbeFailure::NoRunMemory(_)) && !memory.pending;
        match memory.note_failure(failure.kind(), Instant::now()) {
            _ if quiet => debug!(%error, "{consequence}"),
            FailureLog::First => warn!(%error, "{consequence}"),
            FailureLog::Repeat => debug!(%error, "{consequence}"),
            FailureLog::Summary { runs, since } => info!(%error, runs, since = ?since,
                "still failing the same way: {runs} runs in a row over {since:.0?}; {consequence}"),
        }
    }

    /// Notes a run that got a finding: a streak of failed runs ends (logged at info).
    fn note_success(&self, memory: &mut RunMemory) {
        if let Some(failing) = memory.failing.take() {
            info!(failed_runs = failing.runs, since = ?failing.since.elapsed(),
                "probe runs succeed again after {} failed run(s) ({})", failing.runs, failing.kind);
        }
    }

    /// Marks whether this shoot's last run was not made, or was ended, for room.
    fn set_waiting_for_room(&self, waiting: bool) {
        let m = &self.ctx.metrics;
        m.for_shoot(&self.series, |l| {
            m.shoot_waiting_for_room
                .get_or_create(l)
                .set(i64::from(waiting));
        });
    }

    /// Sleeps until `deadline`; false when cancelled first.
    async fn sleep_until(&self, deadline: Instant) -> bool {
        tokio::select! {
            _ = self.cancel.cancelled() => false,
            _ = tokio::time::sleep_until(deadline) => true,
        }
    }

    /// Sets this shoot's expired-lease fraction (unless the probe was removed meanwhile).
    fn set_expired_fraction(&self, fraction: f64) {
        let m = &self.ctx.metrics;
        // Unix seconds of the finding: the fraction of a shoot whose runs fail or are not made
        // is that of its last finding, and this says how old it is.
        #[allow(clippy::cast_precision_loss)]
        let now = Utc::now().timestamp_millis() as f64 / 1000.0;
        m.for_shoot(&self.series, |l| {
            m.expired_lease_fraction.get_or_create(l).set(fraction);
            m.expired_lease_fraction_timestamp.get_or_create(l).set(now);
        });
    }

    fn count_run(&self, result: RunResult) {
        // A removed probe's last run is not counted; its per-shoot series are guarded by
        // `series` (a removal revokes it), so they can't come back either.
        if self.cancel.is_cancelled() {
            return;
        }
        let m = &self.ctx.metrics;
        m.probe_runs.get_or_create(&RunLabels { result }).inc();
        m.for_shoot(&self.series, |l| m.shoot_probe_runs.get_or_create(l).inc());
    }

    /// One probe run, top to bottom: the run asks the memory budget for room (first in line
    /// when a decision is pending), the probe makes a finding or a typed failure, one place
    /// reports either, and the flow the finding calls for is handed over to `executor`.
    pub async fn run_once(&self, memory: &mut RunMemory, executor: &Executor) -> RunOutcome {
        let mut outcome = RunOutcome::default();
        let cfg = &self.ctx.config;
        let budget = &self.ctx.memory;
        // Protection first: a shoot with a decision pending gets room before everyone.
        let pending =
            memory.decision_pending() || executor.decision_pending(&self.ctx, &self.namespace);
        self.set_decision_pending(pending);
        memory.pending = pending;
        let claim = Claim {
            pending,
            history: memory.slow_history,
            ticket: Some(*memory.ticket.get_or_insert_with(|| budget.ticket())),
        };
        let wait = memory_budget::admission_limit(cfg.probe_timeout, cfg.probe_interval);
        let probed = match budget.admit(claim, wait).await {
            Err(refused) => Err(ProbeFailure::NoRunMemory(refused)),
            Ok(grant) => {
                memory.ticket = None;
                self.set_waiting_for_room(false);
                // Asked once admitted, so the snapshot is as new as the run's: nodes can
                // only change the outcome when a scale-down is building up, a zone was
                // disrupted (its recovery event says how many of its leases are fresh), or the
                // executor holds a decision (a target waits to be restored, see
                // `leases_alone_suffice`, or a flow is queued or under way: the verdict must
                // reach it even when every lease is fresh, to stop it).
                let nodes_may_matter = memory.verdicts.hysteresis.streaks().1 > 0
                    || !memory.verdicts.disrupted_zones.is_empty()
                    || executor.decision_pending(&self.ctx, &self.namespace);
                let grant = Arc::new(grant);
                let probed = self.probe_within_budget(nodes_may_matter, &grant).await;
                // The shoot's place in line: by how long it kept the run, in shoot time. A
                // slow run that borrowed room and was reclaimed young says nothing of it.
                if !matches!(
                    probed,
                    Err(ProbeFailure::NoRunMemory(NoRunMemory::Reclaimed { .. }))
                ) {
                    memory.slow_history = memory
                        .slow_history
                        .after(grant.shoot_time(), budget.prompt_limit());
                    let m = &self.ctx.metrics;
                    m.for_shoot(&self.series, |l| {
                        m.shoot_slow_runs.get_or_create(l).set(i64::from(
                            u8::try_from(memory.slow_history.slow_runs()).unwrap_or(u8::MAX),
                        ));
                    });
                }
                probed
            }
        };
        match probed {
            Err(failure) => self.report_failure(failure, &mut outcome, memory, executor),
            Ok(finding) => {
                self.note_success(memory);
                self.report_finding(finding, memory, executor);
            }
        }
        outcome
    }

    /// The probe of an admitted run, until it ends or the budget ends it for room (a run in
    /// flight past its prompt limit while others wait: `memory_budget`). The probe only reads
    /// the shoot, so ending it leaves nothing half-done. Without a `probeTimeout` (zero or
    /// less: no call deadline), the run is ended [`RUN_LIMIT_WITHOUT_TIMEOUT`] after its
    /// admission.
    async fn probe_within_budget(
        &self,
        nodes_may_matter: bool,
        grant: &Arc<MemoryGrant>,
    ) -> Result<Finding, ProbeFailure> {
        let unbounded = self.ctx.config.probe_timeout >= dwd_core::config::prober::NO_TIMEOUT;
        let limit = if unbounded {
            RUN_LIMIT_WITHOUT_TIMEOUT
        } else {
            // Each call has its own deadline; this one never comes first.
            dwd_core::config::prober::NO_TIMEOUT
        };
        let probe = tokio::time::timeout(limit, self.probe_shoot(nodes_may_matter, grant));
        tokio::select! {
            probed = probe => probed.unwrap_or_else(|_| Err(ProbeFailure::ApiServer(Error::Timeout {
                action: format!(
                    "shoot {}: probe run (no probeTimeout is configured: a run is ended {} after its admission)",
                    self.namespace,
                    dwd_core::format_go_duration(RUN_LIMIT_WITHOUT_TIMEOUT)
                ),
                timeout: RUN_LIMIT_WITHOUT_TIMEOUT,
            }))),
            why = grant.ended_for_room() => Err(ProbeFailure::NoRunMemory(why)),
        }
    }

    /// Marks whether a decision is pending for this shoot (its runs get room first).
    fn set_decision_pending(&self, pending: bool) {
        let m = &self.ctx.metrics;
        m.for_shoot(&self.series, |l| {
            m.shoot_decision_pending
                .get_or_create(l)
                .set(i64::from(pending));
        });
    }

    /// Reports what a run found, the one place that does: the probe's own series (expired
    /// fractions, zone series, the run counter) and the verdict, then the run's report to
    /// `executor`, which publishes it (zone events, the flow it takes, its log line).
    fn report_finding(&self, finding: Finding, memory: &mut RunMemory, executor: &Executor) {
        let (report, judged_at) = match finding {
            Finding::Report { report, judged_at } => (report, judged_at),
            Finding::AllLeasesFresh { leases } => {
                memory.expired_seen = false;
                self.set_expired_fraction(0.0);
                self.ctx.metrics.zones_all_fresh(&self.series);
                self.count_run(RunResult::ScaleUp);
                debug!(
                    leases,
                    "all {leases} node leases fresh and nothing to restore: nodes not listed, no scaling"
                );
                self.publish(executor, &RunReport::AllLeasesFresh { leases });
                return;
            }
        };
        memory.expired_seen = report.expired > 0;
        self.set_expired_fraction(report.fraction.unwrap_or(0.0));
        self.ctx.metrics.set_zone_fractions(
            &self.series,
            report
                .zones
                .iter()
                .map(|z| (z.zone.as_str(), z.fraction(), z.disrupted)),
        );
        let (verdict, next) = dwd_core::verdict::verdict(&report, &memory.verdicts);
        let memory_before = std::mem::replace(&mut memory.verdicts, next);
        self.count_run(match report.decision {
            LeaseDecision::ScaleDown => RunResult::ScaleDown,
            LeaseDecision::ZonalScaleDown => RunResult::ZonalScaleDown,
            LeaseDecision::ScaleUp(_) => RunResult::ScaleUp,
            LeaseDecision::NoScaling(_) => RunResult::NoScaling,
        });
        // The intent of the verdict's flow, judged once, from one snapshot of the caches.
        let flow = verdict.flow().map(|flow| PlannedFlow {
            intent: scaler::intent_from_caches(&self.ctx, &self.namespace, flow.dir, flow.scope),
            reason: verdict.why.clone(),
            decision: None,
        });
        // A flow the hysteresis holds: its intent, for the decision record of the hold.
        let held = match (verdict.asked, verdict.streak.met()) {
            (Some(asked), false) => Some(scaler::intent_from_caches(
                &self.ctx,
                &self.namespace,
                asked.dir,
                asked.scope,
            )),
            _ => None,
        };
        let judged = Judged {
            report: &report,
            judged_at,
            grace: self.settings.node_monitor_grace,
            memory_before: &memory_before,
            verdict: &verdict,
            flow,
            held,
        };
        self.publish(executor, &RunReport::Judged(judged));
    }

    /// Hands `run` to `executor` to publish, unless the probe was removed: its last run must
    /// not decide (its executor ends with it) nor bring back what its removal forgot.
    fn publish(&self, executor: &Executor, run: &RunReport<'_>) {
        if self.cancel.is_cancelled() {
            return;
        }
        let shoot = ShootRef {
            namespace: &self.namespace,
            cluster_uid: self.cluster_uid.as_deref(),
            series: &self.series,
        };
        executor.publish(&self.ctx, &shoot, run);
    }

    /// API-server probe, then lease probe: what they found, or why they failed (nothing is
    /// reported here: the caller reports either). Unless `nodes_may_matter`, a run whose
    /// leases are all fresh ends without listing nodes.
    async fn probe_shoot(
        &self,
        nodes_may_matter: bool,
        grant: &MemoryGrant,
    ) -> Result<Finding, ProbeFailure> {
        let cfg = &self.ctx.config;
        let (client, version) = self
            .shoot_client(nodes_may_matter)
            .await
            .map_err(ProbeFailure::NoShootClient)?;
        let LeaseReads {
            leases,
            listed_at,
            nodes_at_once,
        } = self
            .read_version_and_leases(&client, grant, version == HttpVersion::Http2Only)
            .await?;
        if leases_alone_suffice(
            &leases,
            self.settings.node_monitor_grace,
            cfg.node_lease_failure_fraction,
            listed_at,
            nodes_may_matter,
        ) {
            return Ok(Finding::AllLeasesFresh {
                leases: leases.len(),
            });
        }
        let nodes = match nodes_at_once {
            Some(nodes) => nodes,
            None => self.list_nodes(&client, grant).await,
        };
        drop(client);
        let nodes = nodes.map_err(ProbeFailure::ShootList)?;
        if !self.ctx.caches.machines.is_ready() {
            return Err(ProbeFailure::MachinesNotSynced);
        }
        let machines: Vec<_> = self
            .ctx
            .caches
            .machines
            .in_namespace(&self.namespace)
            .iter()
            .map(|m| (**m).clone())
            .collect();
        let report = evaluate_leases(
            &nodes,
            &machines,
            &leases,
            &self.settings,
            cfg.node_lease_failure_fraction,
            &cfg.zone_rule(),
            listed_at,
        );
        for node in &report.nodes {
            debug!(node = %node.node, verdict = %node.verdict, "node verdict");
        }
        Ok(Finding::Report {
            report,
            judged_at: listed_at,
        })
    }

    /// The API-server probe, then the lease probe's consistent, paginated, bounded lists
    /// (`shoot_reads`). Leases first: when all are fresh and nothing waits to be restored, no
    /// node can change the outcome. Expiry is judged against the moment the leases were asked
    /// for: a body that takes long to arrive (a slow link, a tenant's fat leases) must not age
    /// the renewals it carries.
    ///
    /// `at_once` (the nodes will be needed whatever the leases say, as in every run of a shoot
    /// that is scaled down or going down, and the client speaks HTTP/2 only: the shoot's last
    /// `GET /version` came over it): the three reads go at once on the run's one connection,
    /// so such a run is two answers shorter. The API-server probe still decides first: a
    /// failed one ends the run, whatever the lists said, and the next run negotiates the
    /// protocol again (a shoot that stopped offering HTTP/2 fails one run, not every one).
    async fn read_version_and_leases(
        &self,
        client: &Client,
        grant: &MemoryGrant,
        at_once: bool,
    ) -> Result<LeaseReads, ProbeFailure> {
        let version = || {
            self.shoot_call(
                "GET /version",
                shoot_reads::apiserver_version(client, Some(grant)),
            )
        };
        let list_leases = || {
            self.shoot_call(
                "listing node leases",
                shoot_reads::node_leases(client, Some(grant)),
            )
        };
        let (connection, leases, nodes_at_once, listed_at) = if at_once {
            let listed_at = Utc::now();
            let (version, leases, nodes) =
                tokio::join!(version(), list_leases(), self.list_nodes(client, grant));
            let connection = version.map_err(|e| {
                self.multiplexed.store(false, Ordering::Relaxed);
                ProbeFailure::ApiServer(e)
            })?;
            (connection, leases, Some(nodes), listed_at)
        } else {
            let connection = version().await.map_err(ProbeFailure::ApiServer)?;
            let listed_at = Utc::now();
            (connection, list_leases().await, None, listed_at)
        };
        self.multiplexed
            .store(connection == http::Version::HTTP_2, Ordering::Relaxed);
        Ok(LeaseReads {
            leases: leases.map_err(ProbeFailure::ShootList)?,
            listed_at,
            nodes_at_once,
        })
    }

    /// The lease probe's node list.
    async fn list_nodes(
        &self,
        client: &Client,
        grant: &MemoryGrant,
    ) -> Result<Vec<dwd_core::lease::NodeView>, Error> {
        self.shoot_call("listing nodes", shoot_reads::nodes(client, Some(grant)))
            .await
    }

    /// A client for this run only, from the secret's current kubeconfig (the reads charge
    /// what they hold to the run's grant). When the run wants to send its reads at once, the
    /// client speaks HTTP/2 only if the shoot's last `GET /version` with this kubeconfig came
    /// over HTTP/2 (so the reads share one connection from the start); which it got is
    /// returned with it.
    async fn shoot_client(
        &self,
        wants_reads_at_once: bool,
    ) -> Result<(Client, HttpVersion), Error> {
        let version = || {
            if wants_reads_at_once && self.multiplexed.load(Ordering::Relaxed) {
                HttpVersion::Http2Only
            } else {
                HttpVersion::Negotiated
            }
        };
        #[cfg(test)]
        if let Some(connect) = &self.shoot_connector {
            let version = version();
            return Ok((connect(version), version));
        }
        let secret = &self.ctx.config.kube_config_secret_name;
        let err = |reason: String| Error::ShootKubeconfig {
            namespace: self.namespace.clone(),
            secret: secret.clone(),
            reason,
        };
        if !self.ctx.caches.secrets.is_ready() {
            return Err(err("secret cache not synced yet".into()));
        }
        let entry = self
            .ctx
            .caches
            .secrets
            .get(&self.namespace, secret)
            .ok_or_else(|| err("not found".into()))?;
        let text = entry.0.as_ref().map_err(|reason| err(reason.clone()))?;
        let kept = self
            .lock_shoot_config()
            .clone()
            .filter(|prepared| prepared.matches(text));
        let prepared = match kept {
            Some(prepared) => prepared,
            None => {
                let prepared = PreparedShootConfig::prepare(text, self.ctx.config.probe_timeout)
                    .await
                    .map_err(|e| err(e.to_string()))?;
                let prepared = Arc::new(prepared);
                *self.lock_shoot_config() = Some(prepared.clone());
                // Another kubeconfig may name another server: learn its protocol anew.
                self.multiplexed.store(false, Ordering::Relaxed);
                prepared
            }
        };
        let version = version();
        let client = prepared
            .client(ResponseLimits::DEFAULT, version)
            .map_err(|e| err(e.to_string()))?;
        Ok((client, version))
    }

    fn lock_shoot_config(&self) -> std::sync::MutexGuard<'_, Option<Arc<PreparedShootConfig>>> {
        // Only ever replaced whole: a panic elsewhere can't leave it half-written.
        self.shoot_config
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// One shoot API call with `probeTimeout`, counted in the metrics.
    async fn shoot_call<T>(
        &self,
        action: &str,
        fut: impl std::future::Future<Output = kube::Result<T>>,
    ) -> Result<T, Error> {
        let timeout: Duration = self.ctx.config.probe_timeout;
        self.ctx
            .metrics
            .api_requests
            .get_or_create(&ApiLabels {
                api: ApiLabel::Shoot,
            })
            .inc();
        let lag = self.ctx.memory.lag_clock();
        match within_shoot_time(lag, timeout, fut).await.ok_or(()) {
            Err(()) => Err(Error::Timeout {
                action: format!("shoot {}: {action}", self.namespace),
                timeout,
            }),
            Ok(Err(e)) => {
                if is_response_too_large(&e) {
                    let m = &self.ctx.metrics;
                    m.for_shoot(&self.series, |l| {
                        m.oversized_responses.get_or_create(l).inc()
                    });
                }
                let err = Error::kube(format!("shoot {}: {action}", self.namespace), bounded(e));
                if err.is_throttled() {
                    self.ctx
                        .metrics
                        .throttled_responses
                        .get_or_create(&ApiLabels {
                            api: ApiLabel::Shoot,
                        })
                        .inc();
                }
                Err(err)
            }
            Ok(Ok(v)) => Ok(v),
        }
    }
}

/// Runs `fut` within `timeout` counted in shoot time (`None` when it did not end in time): the time this process could not run its
/// tasks ([`crate::memory_budget::LagClock`]) moves the deadline, by at most one `timeout`
/// more. A call's deadline says how long the shoot may take to answer; a prober short of CPU
/// (gardenlet requests 200 millicores and sets no limit) reads an answer that came in time
/// late, and must not fail the shoot for it: the same shoot time as the prompt limit's.
async fn within_shoot_time<T>(
    lag: &crate::memory_budget::LagClock,
    timeout: Duration,
    fut: impl std::future::Future<Output = T>,
) -> Option<T> {
    let started = Instant::now();
    let lag_at = lag.lag();
    tokio::pin!(fut);
    let mut deadline = deadline_after(started, timeout);
    loop {
        tokio::select! {
            // An answer that is there wins over a deadline that passed meanwhile.
            biased;
            value = &mut fut => return Some(value),
            () = tokio::time::sleep_until(deadline) => {
                let owed = lag.lag().saturating_sub(lag_at).min(timeout);
                let extended = deadline_after(started, timeout.saturating_add(owed));
                if extended <= deadline {
                    return None;
                }
                deadline = extended;
            }
        }
    }
}

/// How much of a shoot's error message goes into our logs and errors: enough to tell what
/// went wrong, not a tenant's megabyte.
pub(crate) const SHOOT_MESSAGE_LIMIT: usize = 300;

/// `error` with the text a shoot's apiserver chose (its Status message and reason) cut to
/// [`SHOOT_MESSAGE_LIMIT`] bytes.
pub fn bounded(error: kube::Error) -> kube::Error {
    match error {
        kube::Error::Api(mut status) => {
            status.message = crate::text::cut(&status.message, SHOOT_MESSAGE_LIMIT);
            status.reason = crate::text::cut(&status.reason, SHOOT_MESSAGE_LIMIT / 4);
            // Causes and list metadata are the server's too, and nothing of ours reads them.
            status.details = None;
            status.metadata = None;
            kube::Error::Api(status)
        }
        other => other,
    }
}

/// Test seam: makes the probe task of `namespace` end at the start of its next run, as a
/// task that died would, so the supervisor's unit test can see it restarted. Compiled into
/// tests only: in the binary a probe task ends only when it is cancelled.
#[cfg(test)]
pub(crate) mod end_for_test {
    use std::sync::Mutex;

    static END_REQUESTS: Mutex<Vec<String>> = Mutex::new(Vec::new());

    /// Asks the probe task of `namespace` to end at the start of its next run.
    pub(crate) fn end_probe_task(namespace: &str) {
        END_REQUESTS
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(namespace.to_string());
    }

    /// Whether a test asked the probe of `namespace` to end (the request is used up).
    pub(crate) fn requested(namespace: &str) -> bool {
        let mut requests = END_REQUESTS
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let Some(i) = requests.iter().position(|ns| ns == namespace) else {
            return false;
        };
        requests.swap_remove(i);
        true
    }
}

#[cfg(test)]
#[path = "probe_tests.rs"]
mod loop_tests;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_run_counts_in_its_stable_category_and_only_a_429_spaces_the_next_one_out() {
        let throttled = || {
            let status = kube::core::Status::failure("slow down", "TooManyRequests").with_code(429);
            Error::kube("shoot ns: GET /version", kube::Error::Api(status.boxed()))
        };
        let timeout = || Error::Timeout {
            action: "shoot ns: listing nodes".into(),
            timeout: Duration::from_secs(10),
        };
        use ProbeFailure as F;
        let (lease, api) = (RunResult::LeaseProbeFailed, RunResult::ApiServerProbeFailed);
        let cases = [
            (F::SeedCachesNotSynced("machines".into()), lease, false),
            (F::NoShootClient(timeout()), api, false),
            (F::ApiServer(throttled()), api, true),
            (F::ApiServer(timeout()), api, false),
            (F::ShootList(throttled()), lease, true),
            (F::MachinesNotSynced, lease, false),
        ];
        for (failure, category, is_throttled) in cases {
            assert_eq!(failure.category(), category, "{failure:?}");
            assert_eq!(failure.throttled(), is_throttled, "{failure:?}");
        }
    }

    #[test]
    fn absurd_jitter_factors_are_clamped_and_no_schedule_overflows_the_clock() {
        assert_eq!(effective_jitter(2e18), MAX_JITTER_FACTOR);
        assert_eq!(effective_jitter(f64::NAN), 0.0);
        assert_eq!(effective_jitter(-1.0), 0.0);
        assert_eq!(effective_jitter(0.2), 0.2);
        assert!(jitter_warning(2e18).is_some_and(|w| w.starts_with("backoffJitterFactor 2")));
        assert!(jitter_warning(f64::NAN).is_some());
        assert_eq!(jitter_warning(0.2), None);
        assert_eq!(jitter_warning(0.0), None);
        let now = Instant::now();
        assert_eq!(deadline_after(now, Duration::MAX), now + FAR_FUTURE);
        assert_eq!(
            deadline_after(now, Duration::from_secs(1)),
            now + Duration::from_secs(1)
        );
        // The longest interval the config takes (Go's largest duration) with the largest
        // factor: what the loop computes must not panic.
        let interval = Duration::from_nanos(i64::MAX as u64);
        for factor in [2e18, f64::MAX, MAX_JITTER_FACTOR] {
            let delay = dwd_core::schedule::next_delay(interval, effective_jitter(factor), 1.0)
                .min(FAR_FUTURE);
            let next = dwd_core::schedule::earliest_next_start(
                now,
                Duration::ZERO,
                interval,
                delay,
                Some(now),
            );
            assert!(next > now);
        }
    }

    #[test]
    fn a_run_not_made_for_room_is_the_probers_and_a_repeated_failure_is_logged_once_then_summarised()
     {
        let refused = crate::memory_budget::NoRunMemory::Admission {
            waited: Duration::from_secs(10),
            capacity: 1 << 20,
        };
        let failure = ProbeFailure::NoRunMemory(refused);
        assert_eq!(failure.category(), RunResult::NotMadeForRoom);
        assert_eq!(failure.kind(), "no_room_in_time");
        let config = dwd_core::ProberConfig::from_yaml(
            "kubeConfigSecretName: s\ndependentResourceInfos:\n- ref: {apiVersion: apps/v1, kind: Deployment, name: kcm}\n  scaleUp: {level: 0}\n  scaleDown: {level: 0}\n",
        )
        .expect("config")
        .config;
        let mut memory = RunMemory::new(&config);
        let t0 = Instant::now();
        assert_eq!(
            memory.note_failure("API server probe", t0),
            FailureLog::First
        );
        let later = |s| t0 + Duration::from_secs(s);
        assert_eq!(
            memory.note_failure("API server probe", later(30)),
            FailureLog::Repeat
        );
        assert_eq!(
            memory.note_failure("API server probe", later(300)),
            FailureLog::Summary {
                runs: 3,
                since: Duration::from_secs(300)
            }
        );
        assert_eq!(
            memory.note_failure("API server probe", later(330)),
            FailureLog::Repeat
        );
        // Another way of failing is news again.
        assert_eq!(
            memory.note_failure("lease probe", later(360)),
            FailureLog::First
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_calls_deadline_moves_by_the_time_the_process_could_not_run_once_at_most() {
        let lag = crate::memory_budget::LagClock::default();
        let timeout = Duration::from_secs(4);
        let answer_after = |d: Duration| async move {
            tokio::time::sleep(d).await;
            "answer"
        };
        // In time: the answer.
        assert_eq!(
            within_shoot_time(&lag, timeout, answer_after(Duration::from_secs(3))).await,
            Some("answer")
        );
        // Late, the process running all along: none, at the deadline.
        let started_late = Instant::now();
        assert_eq!(
            within_shoot_time(&lag, timeout, answer_after(Duration::from_secs(5))).await,
            None
        );
        assert_eq!(started_late.elapsed(), timeout);
        // Late by 1 s of wall time, but the process could not run for 2 s meanwhile: in time.
        let starved = async {
            tokio::time::sleep(Duration::from_secs(1)).await;
            lag.add(Duration::from_secs(2));
            tokio::time::sleep(Duration::from_secs(4)).await;
            "answer"
        };
        assert_eq!(
            within_shoot_time(&lag, timeout, starved).await,
            Some("answer")
        );
        // However long the process could not run, at most one timeout more.
        let starved_for_ever = async {
            lag.add(Duration::from_secs(3600));
            tokio::time::sleep(Duration::from_secs(3600)).await;
            "answer"
        };
        let t = Instant::now();
        assert_eq!(
            within_shoot_time(&lag, timeout, starved_for_ever).await,
            None
        );
        assert_eq!(t.elapsed(), 2 * timeout);
    }

    #[test]
    fn a_shoots_error_text_is_cut() {
        let status = kube::core::Status {
            message: "é".repeat(100_000),
            reason: "x".repeat(10_000),
            code: 500,
            ..kube::core::Status::default()
        };
        let kube::Error::Api(cut) = bounded(kube::Error::Api(Box::new(status))) else {
            panic!("not an API error");
        };
        assert!(
            cut.message.len() < SHOOT_MESSAGE_LIMIT + 30,
            "{}",
            cut.message.len()
        );
        assert!(cut.message.ends_with("… (200000 bytes)"), "{}", cut.message);
        assert!(
            cut.reason.len() < SHOOT_MESSAGE_LIMIT,
            "{}",
            cut.reason.len()
        );
        assert_eq!(cut.code, 500);
    }
}
