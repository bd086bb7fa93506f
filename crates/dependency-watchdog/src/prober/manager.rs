//! The registry of running probes: at most one per shoot namespace.
//!
//! The Cluster controller tells the manager what each shoot should have (`ensure`/`remove`);
//! the manager starts and cancels probe tasks. A removed probe stops at once and never scales
//! anything on its way out.
//!
//! Nothing dies quietly: each probe runs under a small supervisor ([`keep_running`]) that
//! restarts it when it panics or ends although nobody stopped it, counts that in
//! `dwd_prober_probe_task_restarts_total`, and logs it as an error — a dead probe would leave
//! its shoot unprotected until its Cluster next changed. A restarted probe resumes its
//! schedule one `probeInterval` later (which also keeps a probe that keeps panicking from
//! spinning); it does not wait `initialDelay` again.
//!
//! New settings from the Cluster (grace period, pool conditions, a new Cluster UID) reach the
//! running probe through a `watch` channel and apply from its next run: a Cluster edit never
//! restarts the probe, so it never re-arms `initialDelay` (docs/behaviour.md §2.3).

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use dwd_core::EffectiveProbeSettings;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::error;

use super::context::ProberContext;
use super::executor::Executors;
use super::probe::{Probe, ProbeSpec};
use crate::metrics::{RestartCause, RestartLabels, ShootSeries};

/// Shortest pause before a probe that died is started again, whatever `probeInterval` says.
const MIN_RESTART_DELAY: Duration = Duration::from_millis(100);

struct RunningProbe {
    /// What the probe should use; it reads the newest value at the start of each run.
    spec: watch::Sender<ProbeSpec>,
    /// The probe's right to write its shoot's metric series; kept across restarts.
    series: ShootSeries,
    cancel: CancellationToken,
    /// The supervisor (see [`keep_running`]).
    task: JoinHandle<()>,
}

/// Running probes by shoot namespace.
type Registry = HashMap<String, RunningProbe>;

/// What `ensure` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EnsureOutcome {
    /// A probe was started.
    Started,
    /// The running probe got new settings (or a new Cluster UID); they apply from its next
    /// run, without a restart.
    Updated,
    /// The probe's supervisor had ended (it never should) and the probe was started again.
    Restarted,
    /// The running probe already has these settings.
    Unchanged,
}

/// Running probes by shoot namespace.
pub struct ProbeManager {
    ctx: Arc<ProberContext>,
    /// The executor every probe task gets for its shoot, of the mode chosen at start.
    executors: Arc<Executors>,
    registry: Mutex<Registry>,
    shutdown: CancellationToken,
}

impl ProbeManager {
    /// A manager whose probes share `ctx`, each with an executor from `executors`, and all
    /// stop when `shutdown` is cancelled.
    pub fn new(
        ctx: Arc<ProberContext>,
        executors: Arc<Executors>,
        shutdown: CancellationToken,
    ) -> Self {
        ProbeManager {
            ctx,
            executors,
            registry: Mutex::new(Registry::default()),
            shutdown,
        }
    }

    fn registry(&self) -> MutexGuard<'_, Registry> {
        // Entries are inserted and removed whole: a panic elsewhere can't leave one torn.
        self.registry
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn set_active(&self, registry: &Registry) {
        self.ctx
            .metrics
            .active_probes
            .set(i64::try_from(registry.len()).unwrap_or(i64::MAX));
    }

    /// Makes sure `namespace` has a probe with `settings`, for the Cluster with `cluster_uid`
    /// (its events name the Cluster by UID). A running probe gets changed settings from its
    /// next run on; it is not restarted.
    pub fn ensure(
        &self,
        namespace: &str,
        settings: EffectiveProbeSettings,
        cluster_uid: Option<String>,
    ) -> EnsureOutcome {
        let spec = ProbeSpec {
            settings,
            cluster_uid,
        };
        let mut registry = self.registry();
        let (outcome, series) = match registry.get_mut(namespace) {
            Some(p) if !p.task.is_finished() => {
                if *p.spec.borrow() == spec {
                    return EnsureOutcome::Unchanged;
                }
                p.spec.send_replace(spec);
                return EnsureOutcome::Updated;
            }
            Some(p) => {
                // The supervisor itself ended: it only returns when cancelled, so this is a
                // panic outside the probe. Counted and started again, like a probe that died.
                self.ctx
                    .metrics
                    .probe_task_restarts
                    .get_or_create(&RestartLabels {
                        cause: RestartCause::Ended,
                    })
                    .inc();
                error!(shoot = %namespace, "probe supervisor had ended; starting the probe again");
                p.cancel.cancel();
                (EnsureOutcome::Restarted, p.series.clone())
            }
            None => (
                EnsureOutcome::Started,
                self.ctx.metrics.open_shoot(namespace),
            ),
        };
        let (tx, rx) = watch::channel(spec);
        let cancel = self.shutdown.child_token();
        let first_delay = match outcome {
            EnsureOutcome::Started => self.ctx.config.initial_delay,
            _ => restart_delay(self.ctx.config.probe_interval),
        };
        let task = tokio::spawn(supervise_probe(
            ProbeTask {
                namespace: namespace.to_string(),
                updates: rx,
                series: series.clone(),
                cancel: cancel.clone(),
                first_delay,
            },
            self.ctx.clone(),
            self.executors.clone(),
        ));
        registry.insert(
            namespace.to_string(),
            RunningProbe {
                spec: tx,
                series,
                cancel,
                task,
            },
        );
        self.set_active(&registry);
        outcome
    }

    /// Stops the probe of `namespace`, if any; true if one was running.
    pub fn remove(&self, namespace: &str) -> bool {
        let mut registry = self.registry();
        let Some(removed) = registry.remove(namespace) else {
            return false;
        };
        self.set_active(&registry);
        drop(registry);
        removed.cancel.cancel();
        self.ctx.metrics.forget_shoot(namespace);
        self.ctx.decisions.forget(namespace);
        self.forget_shadow(namespace);
        true
    }

    /// Namespaces with a probe.
    pub fn namespaces(&self) -> Vec<String> {
        self.registry().keys().cloned().collect()
    }

    #[cfg(test)]
    /// Whether `namespace` has a probe.
    pub(crate) fn has_probe(&self, namespace: &str) -> bool {
        self.registry().contains_key(namespace)
    }

    /// Stops every probe.
    pub(crate) fn stop_all(&self) {
        let drained: Vec<_> = self.registry().drain().collect();
        for (ns, p) in drained {
            p.cancel.cancel();
            self.ctx.metrics.forget_shoot(&ns);
            self.ctx.decisions.forget(&ns);
            self.forget_shadow(&ns);
        }
        self.ctx.metrics.active_probes.set(0);
    }

    /// Shadow mode forgets a removed shoot: our latest finding and would-be state (a probe
    /// started for it later begins from the acting watchdog's state at that time).
    fn forget_shadow(&self, namespace: &str) {
        self.executors.forget(namespace);
    }
}

/// How long a probe that died waits before it runs again: its interval, as if the run that
/// died had ended normally.
fn restart_delay(probe_interval: Duration) -> Duration {
    probe_interval.max(MIN_RESTART_DELAY)
}

/// One shoot's probe task, as the manager starts it.
struct ProbeTask {
    /// The shoot's namespace.
    namespace: String,
    /// The probe's settings, newest first at each run.
    updates: watch::Receiver<ProbeSpec>,
    /// The probe's right to write its shoot's metric series.
    series: ShootSeries,
    /// Cancelled when the probe is removed or the prober stops.
    cancel: CancellationToken,
    /// When its first run is due.
    first_delay: Duration,
}

/// Runs the probe `task` under [`keep_running`], each start with a new executor from
/// `executors` (a task that died takes its flows with it).
async fn supervise_probe(task: ProbeTask, ctx: Arc<ProberContext>, executors: Arc<Executors>) {
    let ProbeTask {
        namespace,
        updates,
        series,
        cancel,
        first_delay,
    } = task;
    let restart_after = restart_delay(ctx.config.probe_interval);
    let restarts = ctx.metrics.probe_task_restarts.clone();
    let start = {
        let (namespace, cancel) = (namespace.clone(), cancel.clone());
        move |first: bool| {
            let probe = Probe::new(
                namespace.clone(),
                updates.clone(),
                series.clone(),
                ctx.clone(),
                cancel.clone(),
            );
            // A restart waits out its pause in `keep_running`, then runs at once.
            let first_delay = if first { first_delay } else { Duration::ZERO };
            probe.run(first_delay, executors.for_shoot())
        }
    };
    keep_running(&namespace, start, &cancel, restart_after, &restarts).await;
}

/// Runs `start(first)` as a task of its own until `cancel`; when the task panics or ends
/// anyway, counts it in `restarts`, logs it, waits `restart_after` and starts it again
/// (`first` false). Cancelling aborts the task at once.
pub(crate) async fn keep_running<F, Fut>(
    namespace: &str,
    mut start: F,
    cancel: &CancellationToken,
    restart_after: Duration,
    restarts: &Family<RestartLabels, Counter>,
) where
    F: FnMut(bool) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let mut first = true;
    loop {
        let mut task = tokio::spawn(start(first));
        first = false;
        let ended = tokio::select! {
            _ = cancel.cancelled() => {
                task.abort();
                return;
            }
            ended = &mut task => ended,
        };
        if cancel.is_cancelled() {
            return;
        }
        let cause = match &ended {
            Err(e) if e.is_panic() => RestartCause::Panicked,
            _ => RestartCause::Ended,
        };
        restarts.get_or_create(&RestartLabels { cause }).inc();
        match ended {
            Err(e) if e.is_panic() => {
                let payload = e.into_panic();
                let message = payload
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| payload.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "(no message)".into());
                error!(shoot = %namespace, panic = %message, ?restart_after, "probe task panicked; restarting it");
            }
            _ => {
                error!(shoot = %namespace, ?restart_after, "probe task ended although nobody stopped it; restarting it");
            }
        }
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(restart_after) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::ShootLabels;
    use std::collections::BTreeMap;
    use std::sync::atomic::AtomicUsize;
    use std::sync::atomic::Ordering;

    /// A context whose seed never answers and whose caches never sync: every probe run is a
    /// counted "caches not in sync" run, which is all these tests need to see runs happen.
    fn context() -> Arc<ProberContext> {
        let never = tower::service_fn(|_req: http::Request<kube::client::Body>| {
            std::future::pending::<Result<http::Response<kube::client::Body>, std::io::Error>>()
        });
        crate::prober::context::test_support::context(kube::Client::new(never, "default"))
    }

    fn settings(grace_s: u64) -> EffectiveProbeSettings {
        EffectiveProbeSettings {
            node_monitor_grace: Duration::from_secs(grace_s),
            pool_conditions: BTreeMap::new(),
        }
    }

    fn runs(ctx: &ProberContext, ns: &str) -> u64 {
        ctx.metrics
            .shoot_probe_runs
            .get(&ShootLabels { shoot: ns.into() })
            .map_or(0, |c| c.get())
    }

    fn restarts(ctx: &ProberContext, cause: RestartCause) -> u64 {
        ctx.metrics
            .probe_task_restarts
            .get(&RestartLabels { cause })
            .map_or(0, |c| c.get())
    }

    /// Advances the paused clock by `d` and lets every task catch up.
    async fn advance(d: Duration) {
        tokio::time::sleep(d).await;
        tokio::time::sleep(Duration::from_millis(1)).await;
    }

    /// A manager running a probe for `ns` that has run at least once (past its 30 s initial
    /// delay).
    async fn a_probe_that_ran(ns: &str) -> (Arc<ProberContext>, ProbeManager) {
        let ctx = context();
        let manager = ProbeManager::new(
            ctx.clone(),
            Arc::new(Executors::Acting),
            CancellationToken::new(),
        );
        manager.ensure(ns, settings(40), None);
        advance(Duration::from_secs(31)).await;
        assert!(runs(&ctx, ns) >= 1, "no run after the initial delay");
        (ctx, manager)
    }

    #[tokio::test(start_paused = true)]
    async fn a_cluster_edit_updates_the_running_probe_without_re_arming_the_initial_delay() {
        let ctx = context();
        let manager = ProbeManager::new(
            ctx.clone(),
            Arc::new(Executors::Acting),
            CancellationToken::new(),
        );
        assert_eq!(
            manager.ensure("a", settings(40), Some("uid-1".into())),
            EnsureOutcome::Started
        );
        advance(Duration::from_secs(29)).await;
        assert_eq!(runs(&ctx, "a"), 0, "ran before its initial delay");
        advance(Duration::from_secs(2)).await;
        let before = runs(&ctx, "a");
        assert!(before >= 1, "no run after the initial delay");
        // The Cluster changes the grace period, then the pools, then its UID: one probe all
        // along, and runs go on every second.
        assert_eq!(
            manager.ensure("a", settings(40), Some("uid-1".into())),
            EnsureOutcome::Unchanged
        );
        assert_eq!(
            manager.ensure("a", settings(120), Some("uid-1".into())),
            EnsureOutcome::Updated
        );
        let mut pools = settings(120);
        pools
            .pool_conditions
            .insert("worker-a".into(), vec!["CustomProblem".into()]);
        assert_eq!(
            manager.ensure("a", pools.clone(), Some("uid-1".into())),
            EnsureOutcome::Updated
        );
        assert_eq!(
            manager.ensure("a", pools, Some("uid-2".into())),
            EnsureOutcome::Updated
        );
        advance(Duration::from_secs(3)).await;
        assert!(
            runs(&ctx, "a") >= before + 2,
            "runs stopped after a Cluster edit: {} then {}",
            before,
            runs(&ctx, "a")
        );
        assert_eq!(restarts(&ctx, RestartCause::Ended), 0);
        assert!(manager.remove("a"));
    }

    #[tokio::test(start_paused = true)]
    async fn a_probe_task_that_ends_is_restarted_and_counted_without_a_new_initial_delay() {
        let (ctx, manager) = a_probe_that_ran("b").await;
        crate::prober::probe::end_for_test::end_probe_task("b");
        advance(Duration::from_secs(1)).await;
        let after_end = runs(&ctx, "b");
        assert_eq!(restarts(&ctx, RestartCause::Ended), 1);
        // Back one interval later, not 30 s later.
        advance(Duration::from_secs(3)).await;
        assert!(
            runs(&ctx, "b") >= after_end + 2,
            "no runs after the restart"
        );
        assert!(manager.has_probe("b"));
        manager.stop_all();
        assert!(!manager.has_probe("b"));
    }

    #[tokio::test(start_paused = true)]
    async fn a_panicking_task_is_restarted_after_the_pause_and_cancel_stops_it_for_good() {
        let restarts = Family::<RestartLabels, Counter>::default();
        let starts = Arc::new(AtomicUsize::new(0));
        let cancel = CancellationToken::new();
        let seen = starts.clone();
        let start = move |first: bool| {
            let n = seen.fetch_add(1, Ordering::SeqCst);
            async move {
                assert_eq!(first, n == 0);
                match n {
                    0 => panic!("probe bug"),
                    1 => {}
                    _ => std::future::pending::<()>().await,
                }
            }
        };
        let supervisor = {
            let (cancel, restarts) = (cancel.clone(), restarts.clone());
            tokio::spawn(async move {
                keep_running("c", start, &cancel, Duration::from_secs(5), &restarts).await;
            })
        };
        advance(Duration::from_secs(4)).await;
        assert_eq!(
            starts.load(Ordering::SeqCst),
            1,
            "restarted before the pause"
        );
        advance(Duration::from_secs(2)).await;
        assert_eq!(starts.load(Ordering::SeqCst), 2);
        advance(Duration::from_secs(5)).await;
        assert_eq!(starts.load(Ordering::SeqCst), 3);
        let count = |cause| {
            restarts
                .get(&RestartLabels { cause })
                .map_or(0, |c| c.get())
        };
        assert_eq!(count(RestartCause::Panicked), 1);
        assert_eq!(count(RestartCause::Ended), 1);
        cancel.cancel();
        advance(Duration::from_secs(60)).await;
        assert!(supervisor.is_finished());
        assert_eq!(starts.load(Ordering::SeqCst), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn a_removed_probe_leaves_no_series_behind_even_when_a_run_ends_later() {
        let (ctx, manager) = a_probe_that_ran("d").await;
        let series = {
            let registry = manager.registry();
            registry.get("d").map(|p| p.series.clone())
        };
        manager.remove("d");
        // A run or flow of the removed probe finishing now writes through its old handle.
        if let Some(series) = series {
            ctx.metrics.for_shoot(&series, |l| {
                ctx.metrics.shoot_probe_runs.get_or_create(l).inc();
            });
        }
        advance(Duration::from_secs(5)).await;
        assert_eq!(runs(&ctx, "d"), 0);
        assert!(
            ctx.metrics
                .lease_probe_failures
                .get(&ShootLabels { shoot: "d".into() })
                .is_none()
        );
    }
}
