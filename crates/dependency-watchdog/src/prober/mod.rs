//! The prober: one probe per shoot control plane hosted by this seed (SPEC §2).
//!
//! - [`seed_caches`]: watch caches of probe secrets, Machines and scaling targets;
//! - [`controller`]: the Cluster controller deciding which shoots get a probe;
//! - [`manager`]: the registry of running probe tasks;
//! - [`probe`]: one shoot's probe loop (API-server probe, lease probe, decision);
//! - [`scaler`]: executes scaling flows;
//! - [`shoot_reads`]: consistent, paginated, bounded lists of a shoot's objects.

pub mod controller;
pub mod manager;
pub mod probe;
pub mod scaler;
pub mod seed_caches;
pub mod shoot_reads;
pub mod slim;

use std::sync::Arc;

use dwd_core::ProberConfig;
use kube::Client;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::Result;
use crate::events::{Component, Events, PodRef};
use crate::health::Health;
use crate::metrics::Metrics;
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
}

/// Runs the prober until `shutdown` is cancelled or a critical task dies.
pub async fn run(
    config: ProberConfig,
    seed: Client,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    concurrent_reconciles: u16,
    own_pod: PodRef,
    shutdown: CancellationToken,
) -> Result<()> {
    let mut tasks = tokio::task::JoinSet::new();
    let caches = SeedCaches::start(
        &seed,
        &config.kube_config_secret_name,
        &config.dependent_resource_infos,
        &mut tasks,
    )
    .await?;
    let events = Events::start(seed.clone(), Component::Prober, own_pod, metrics.clone());
    let ctx = Arc::new(ProberContext {
        config,
        seed,
        caches,
        metrics,
        events,
    });
    let manager = Arc::new(ProbeManager::new(ctx.clone(), shutdown.child_token()));

    let (synced_tx, mut synced_rx) = tokio::sync::watch::channel(false);
    tasks.spawn({
        let (ctx, manager, shutdown) = (ctx.clone(), manager.clone(), shutdown.clone());
        async move {
            controller::run(
                ctx,
                manager,
                concurrent_reconciles.max(1),
                shutdown,
                synced_tx,
            )
            .await;
            "cluster controller"
        }
    });
    tasks.spawn({
        let (ctx, health) = (ctx.clone(), health.clone());
        async move {
            // Say what is still missing every 10 s: an operator looking at a 503 from /readyz
            // should find the reason in the log.
            let mut report = tokio::time::interval(std::time::Duration::from_secs(10));
            report.tick().await;
            loop {
                let mut receivers = ctx.caches.ready_receivers();
                let clusters_synced = *synced_rx.borrow_and_update();
                let mut pending = ctx.caches.pending();
                if clusters_synced && pending.is_empty() {
                    break;
                }
                let any_cache_changed = futures::future::select_all(
                    receivers.iter_mut().map(|r| Box::pin(r.changed())),
                );
                tokio::select! {
                    _ = synced_rx.changed() => {}
                    _ = any_cache_changed => {}
                    _ = report.tick() => {
                        if !clusters_synced {
                            pending.push("clusters".into());
                        }
                        warn!(waiting_for = ?pending, "not ready yet: watch caches not synced");
                    }
                }
            }
            health.set_ready(true);
            info!("caches synced; prober ready");
            std::future::pending::<()>().await;
            "readiness"
        }
    });

    let result = crate::supervise("prober", &mut tasks, &shutdown, &health).await;
    manager.stop_all();
    tasks.shutdown().await;
    result
}
