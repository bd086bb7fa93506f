//! The prober: one probe per shoot control plane hosted by this seed (docs/behaviour.md §2).
//!
//! - [`seed_caches`]: watch caches of probe secrets, Machines and scaling targets;
//! - [`controller`]: the Cluster controller deciding which shoots get a probe;
//! - [`manager`]: the registry of running probe tasks;
//! - [`probe`]: one shoot's probe loop (API-server probe, lease probe, decision);
//! - [`executor`]: one shoot's flows, one at a time, the newest verdict winning;
//! - [`scaler`]: executes scaling flows;
//! - [`shadow_observer`]: in shadow mode, what the acting watchdog did to each shoot;
//! - [`shoot_reads`]: consistent, paginated, bounded lists of a shoot's objects, decoded as
//!   they stream in ([`page_stream`] splits a page into its items);
//! - [`view`]: the prober's reads as a public API, for tools (`explain`).

pub mod controller;
pub mod executor;
pub mod manager;
mod page_stream;
pub mod probe;
pub mod recording;
pub mod report;
pub mod scaler;
pub mod seed_caches;
pub mod shadow_observer;
pub mod shoot_reads;
pub mod slim;
pub mod view;

use std::sync::Arc;

use dwd_core::ProberConfig;
use kube::Client;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::Result;
use crate::events::{Component, Events, PodRef};
use crate::health::Health;
use crate::memory_budget::MemoryBudget;
use crate::metrics::Metrics;
use crate::shadow::Shadow;
use executor::Executors;
use manager::ProbeManager;
use seed_caches::SeedCaches;

/// What every probe shares.
pub struct ProberContext {
    /// The validated prober configuration.
    pub config: ProberConfig,
    /// Client of the seed's kube-apiserver.
    pub seed: Client,
    /// Watch caches of seed objects (secrets, machines, targets).
    pub caches: SeedCaches,
    /// Process metrics.
    pub metrics: Arc<Metrics>,
    /// Kubernetes Events for scaling decisions and target changes.
    pub events: Events,
    /// The executors every shoot gets, chosen once at startup: acting ones, or in shadow mode
    /// (`--shadow`: decide, never scale, and compare with the acting watchdog,
    /// [`crate::shadow`]) recording ones, which keep shadow mode's state.
    pub(crate) executors: Executors,
    /// The one pool of bytes every probe run in flight is admitted to and charged against
    /// ([`crate::memory_budget`]).
    pub(crate) memory: Arc<MemoryBudget>,
}

/// Runs the prober until `shutdown` is cancelled or a critical task dies; in shadow mode when
/// `shadow` is given: every decision is taken as usual, none is
/// carried out, and the book compares them with what the acting watchdog does.
///
/// There is no concurrency to set (the command line accepts the reference's
/// `--concurrent-reconciles` and ignores it): deciding what a Cluster asks of its probe is
/// in-memory work of microseconds (no request), done by one loop in event order
/// ([`controller`]), so there is nothing to run concurrently.
// Eight dependencies, each named at the call (runtime and tests): a struct bundling them would
// hide which one a caller forgot.
#[allow(clippy::too_many_arguments)]
pub async fn run(
    config: ProberConfig,
    run_memory_capacity: u64,
    seed: Client,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    own_pod: PodRef,
    shadow: Option<Arc<Shadow>>,
    shutdown: CancellationToken,
) -> Result<()> {
    // Said once here rather than by every probe.
    if let Some(warning) = probe::jitter_warning(config.backoff_jitter_factor) {
        warn!("{warning}");
    }
    let mut tasks = tokio::task::JoinSet::new();
    let caches = SeedCaches::start(
        &seed,
        &config.kube_config_secret_name,
        &config.dependent_resource_infos,
        &mut tasks,
        &shutdown,
    )
    .await?;
    let events = match shadow {
        // Shadow mode writes nothing but the events about its own pod.
        Some(_) => {
            Events::start_own_pod_only(seed.clone(), Component::Prober, own_pod, metrics.clone())
        }
        None => Events::start(seed.clone(), Component::Prober, own_pod, metrics.clone()),
    };
    // Said once at start: without a probe timeout a hanging shoot would hold its probe.
    if config.probe_timeout >= dwd_core::config::prober::NO_TIMEOUT {
        warn!(
            run_limit = %dwd_core::format_go_duration(probe::RUN_LIMIT_WITHOUT_TIMEOUT),
            "probeTimeout is zero or less: shoot calls have no deadline of their own (as in the reference), but every probe run is ended {} after its admission, sooner when its room in the memory budget is needed, and waits for admission at most its probeInterval",
            dwd_core::format_go_duration(probe::RUN_LIMIT_WITHOUT_TIMEOUT)
        );
    }
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
    let ctx = Arc::new(ProberContext {
        config,
        seed,
        caches,
        metrics,
        events,
        executors: Executors::of(shadow),
        memory,
    });
    let manager = Arc::new(ProbeManager::new(ctx.clone(), shutdown.child_token()));
    if let Some(recorder) = ctx.executors.recorder() {
        // Shadow mode's own tasks: its comparisons expire, and the acting watchdog is watched.
        recorder
            .book
            .spawn_expiry(ctx.events.clone(), &mut tasks, shutdown.clone());
        tasks.spawn({
            let (ctx, recorder, shutdown) = (ctx.clone(), recorder.clone(), shutdown.clone());
            async move {
                shadow_observer::observe(ctx, recorder, shutdown).await;
                "shadow observer of the acting watchdog"
            }
        });
    }

    let (synced_tx, synced_rx) = tokio::sync::watch::channel(crate::cache::SyncState::Listing);
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

/// Keeps `/readyz` in step with the caches for the life of the prober: ready once the Clusters
/// and every seed cache are in sync; not ready, naming which cache and why, while any is not,
/// at start or because its watch kept failing; ready again once it has listed everything anew.
/// Says what is missing every 10 s while not ready: an operator looking at a 503 from
/// `/readyz` should find the reason in the log too.
async fn track_readiness(
    caches: &SeedCaches,
    mut clusters_synced: tokio::sync::watch::Receiver<crate::cache::SyncState>,
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
            crate::cache::SyncState::Synced => {}
            crate::cache::SyncState::Listing => pending.insert(0, "clusters (listing)".into()),
            crate::cache::SyncState::Stale(why) => pending.insert(0, format!("clusters ({why})")),
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

/// What the prober's unit tests share.
#[cfg(test)]
pub(crate) mod test_support {
    use std::sync::Arc;

    use super::{ProberContext, SeedCaches};
    use crate::cache::Cache;
    use crate::events::Events;
    use crate::metrics::Metrics;

    /// Probes every second after a 30 s initial delay; 40 s grace unless the Shoot says
    /// otherwise; one target, at level 0 both ways.
    pub(crate) const CONFIG: &str = r#"
kubeConfigSecretName: probe
probeInterval: 1s
initialDelay: 30s
probeTimeout: 1s
backoffJitterFactor: 0
kcmNodeMonitorGraceDuration: 40s
dependentResourceInfos:
  - ref: {kind: Deployment, name: kube-controller-manager, apiVersion: apps/v1}
    scaleUp: {level: 0}
    scaleDown: {level: 0}
"#;

    /// [`CONFIG`], loaded.
    pub(crate) fn config() -> dwd_core::ProberConfig {
        match dwd_core::ProberConfig::from_yaml(CONFIG) {
            Ok(loaded) => loaded.config,
            Err(e) => panic!("config: {e}"),
        }
    }

    /// A context on `seed` with [`CONFIG`], whose seed caches never sync (so every probe run
    /// is only counted) and whose Events go nowhere.
    pub(crate) fn context(seed: kube::Client) -> Arc<ProberContext> {
        let config = config();
        let metrics = Arc::new(Metrics::default());
        Arc::new(ProberContext {
            config,
            seed,
            caches: SeedCaches {
                secrets: Cache::new("secrets"),
                machines: Cache::new("machines"),
                targets: Vec::new(),
            },
            events: Events::disabled(metrics.clone()),
            metrics,
            executors: super::executor::Executors::Acting,
            memory: crate::memory_budget::MemoryBudget::unbounded(),
        })
    }
}
