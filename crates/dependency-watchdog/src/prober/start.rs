//! Starting the prober ([`run`]): its seed caches, Events, memory budget and shared context,
//! shadow mode's tasks, the Cluster controller, and readiness kept in step with the caches
//! ([`track_readiness`]); all supervised until shutdown.

use std::sync::Arc;

use dwd_core::ProberConfig;
use kube::Client;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::context::ProberContext;
use super::executor::Executors;
use super::manager::ProbeManager;
use super::seed_caches::SeedCaches;
use super::{controller, probe, shadow_observer};
use crate::Result;
use crate::decisions::DecisionLog;
use crate::memory_budget::MemoryBudget;
use crate::metrics::Metrics;
use crate::observe::events::{Component, Events, PodRef};
use crate::observe::health::Health;
use crate::shadow::Shadow;

/// What the prober is started with: by the runtime from the command line, or by a test.
pub struct ProberStart {
    /// The validated prober configuration.
    pub config: ProberConfig,
    /// Bytes of the probe runs' memory budget ([`crate::memory_budget`]).
    pub run_memory_capacity: u64,
    /// Client of the seed's kube-apiserver.
    pub seed: Client,
    /// Process metrics.
    pub metrics: Arc<Metrics>,
    /// Readiness and liveness of the process.
    pub health: Arc<Health>,
    /// This pod, for the Events about it.
    pub own_pod: PodRef,
    /// Shadow mode's book when running with `--shadow`: decide, never scale.
    pub shadow: Option<Arc<Shadow>>,
    /// Where decision records go (the metrics endpoint serves its rings).
    pub decisions: Arc<DecisionLog>,
}

/// Runs the prober started with `start` until `shutdown` is cancelled or a critical task
/// dies; in shadow mode when `start.shadow` is given: every decision is taken as usual, none
/// is carried out, and the book compares them with what the acting watchdog does.
///
/// There is no concurrency to set (the command line accepts the reference's
/// `--concurrent-reconciles` and ignores it): deciding what a Cluster asks of its probe is
/// in-memory work of microseconds (no request), done by one loop in event order
/// ([`controller`]), so there is nothing to run concurrently.
pub async fn run(start: ProberStart, shutdown: CancellationToken) -> Result<()> {
    warn_about_settings(&start.config);
    let health = start.health.clone();
    let mut tasks = tokio::task::JoinSet::new();
    // The executors every shoot gets, chosen once: acting ones, or in shadow mode (`--shadow`:
    // decide, never scale, and compare with the acting watchdog, [`crate::shadow`]) recording
    // ones, which keep shadow mode's state.
    let executors = Arc::new(Executors::of(start.shadow.clone()));
    let ctx = Arc::new(context(start, &mut tasks, &shutdown).await?);
    let manager = Arc::new(ProbeManager::new(
        ctx.clone(),
        executors.clone(),
        shutdown.child_token(),
    ));
    spawn_shadow_tasks(&ctx, &executors, &mut tasks, &shutdown);
    let (synced_tx, synced_rx) =
        tokio::sync::watch::channel(crate::client::cache::SyncState::Listing);
    tasks.spawn({
        let (ctx, manager, shutdown) = (ctx.clone(), manager.clone(), shutdown.clone());
        async move {
            controller::run(ctx, manager, shutdown, synced_tx).await;
            "cluster controller"
        }
    });
    tasks.spawn({
        let (ctx, health) = (ctx.clone(), health.clone());
        async move {
            track_readiness(&ctx.caches, synced_rx, &health).await;
            "readiness"
        }
    });
    let result = crate::supervision::supervise("prober", &mut tasks, &shutdown, &health).await;
    manager.stop_all();
    tasks.shutdown().await;
    result
}

/// Warns once, at start, about settings every probe would otherwise warn about.
fn warn_about_settings(config: &ProberConfig) {
    if let Some(warning) = probe::jitter_warning(config.backoff_jitter_factor) {
        warn!("{warning}");
    }
    // Without a probe timeout a hanging shoot would hold its probe.
    if config.probe_timeout >= dwd_core::config::prober::NO_TIMEOUT {
        warn!(
            run_limit = %dwd_core::format_go_duration(probe::RUN_LIMIT_WITHOUT_TIMEOUT),
            "probeTimeout is zero or less: shoot calls have no deadline of their own (as in the reference), but every probe run is ended {} after its admission, sooner when its room in the memory budget is needed, and waits for admission at most its probeInterval",
            dwd_core::format_go_duration(probe::RUN_LIMIT_WITHOUT_TIMEOUT)
        );
    }
}

/// The context every probe shares: the seed caches (their watches and the lag clock spawned
/// into `tasks`), the Events (shadow mode's only about its own pod), the memory budget.
async fn context(
    start: ProberStart,
    tasks: &mut tokio::task::JoinSet<&'static str>,
    shutdown: &CancellationToken,
) -> Result<ProberContext> {
    let ProberStart {
        config,
        run_memory_capacity,
        seed,
        metrics,
        health: _,
        own_pod,
        shadow,
        decisions,
    } = start;
    let caches = SeedCaches::start(
        &seed,
        &config.kube_config_secret_name,
        &config.dependent_resource_infos,
        tasks,
        shutdown,
    )
    .await?;
    let events = match shadow {
        // Shadow mode writes nothing but the events about its own pod.
        Some(_) => {
            Events::start_own_pod_only(seed.clone(), Component::Prober, own_pod, metrics.clone())
        }
        None => Events::start(seed.clone(), Component::Prober, own_pod, metrics.clone()),
    };
    let lag = Arc::new(crate::memory_budget::LagClock::default());
    tasks.spawn({
        let (lag, shutdown) = (lag.clone(), shutdown.clone());
        async move {
            lag.run(shutdown).await;
            "lag clock"
        }
    });
    let memory = MemoryBudget::new(
        run_memory_capacity,
        crate::memory_budget::prompt_limit(config.probe_timeout),
        lag,
        metrics.run_memory.clone(),
    );
    Ok(ProberContext {
        config,
        seed,
        caches,
        metrics,
        events,
        memory,
        decisions,
    })
}

/// Shadow mode's own tasks: its comparisons expire, and the acting watchdog is watched.
/// Nothing in normal operation.
fn spawn_shadow_tasks(
    ctx: &Arc<ProberContext>,
    executors: &Executors,
    tasks: &mut tokio::task::JoinSet<&'static str>,
    shutdown: &CancellationToken,
) {
    let Some(recorder) = executors.recorder() else {
        return;
    };
    recorder
        .book
        .spawn_expiry(ctx.events.clone(), tasks, shutdown.clone());
    tasks.spawn({
        let (ctx, recorder, shutdown) = (ctx.clone(), recorder.clone(), shutdown.clone());
        async move {
            shadow_observer::observe(ctx, recorder, shutdown).await;
            "shadow observer of the acting watchdog"
        }
    });
}

/// Keeps `/readyz` in step with the caches for the life of the prober: ready once the Clusters
/// and every seed cache are in sync; not ready, naming which cache and why, while any is not,
/// at start or because its watch kept failing; ready again once it has listed everything anew.
/// Says what is missing every 10 s while not ready: an operator looking at a 503 from
/// `/readyz` should find the reason in the log too.
async fn track_readiness(
    caches: &SeedCaches,
    mut clusters_synced: tokio::sync::watch::Receiver<crate::client::cache::SyncState>,
    health: &Health,
) {
    let mut report = tokio::time::interval(std::time::Duration::from_secs(10));
    report.tick().await;
    let mut was_ready = false;
    let mut cluster_watch_open = true;
    loop {
        // Subscribed before looking, so that no change in between is missed.
        let mut receivers = caches.sync_receivers();
        let clusters = clusters_synced.borrow_and_update().clone();
        let mut pending = caches.pending();
        match clusters {
            crate::client::cache::SyncState::Synced => {}
            crate::client::cache::SyncState::Listing => {
                pending.insert(0, "clusters (listing)".into())
            }
            crate::client::cache::SyncState::Stale(why) => {
                pending.insert(0, format!("clusters ({why})"))
            }
        }
        let ready = pending.is_empty();
        if ready {
            if !was_ready {
                health.set_ready(true);
                info!("caches synced; prober ready");
            }
        } else {
            let reason = format!("caches not synced: {}", pending.join(", "));
            health.set_not_ready(reason.clone());
            if was_ready {
                warn!(%reason, "prober not ready: a seed cache fell out of sync; no decision is taken from it until it has listed again");
            }
        }
        was_ready = ready;
        let any_cache_changed =
            futures::future::select_all(receivers.iter_mut().map(|r| Box::pin(r.changed())));
        tokio::select! {
            changed = clusters_synced.changed(), if cluster_watch_open => {
                // The Cluster controller ended (the prober is going down): stop listening to it.
                cluster_watch_open = changed.is_ok();
            }
            _ = any_cache_changed => {}
            _ = report.tick() => {
                if !ready {
                    warn!(waiting_for = ?pending, "not ready: watch caches not in sync");
                }
            }
        }
    }
}
