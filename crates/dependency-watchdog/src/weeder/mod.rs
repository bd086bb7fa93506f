//! The weeder: when a service comes back, delete its dependants that crash-loop
//! (docs/behaviour.md §3).
//!
//! While etcd or kube-apiserver of a shoot control plane is down, the pods depending on it
//! crash and sit in a growing `CrashLoopBackOff`; once the dependency is back they would wait
//! up to five minutes for their next restart. The weeder deletes them so they restart at once.
//!
//! - [`slices`]: the EndpointSlice watch over all namespaces, which starts a weeder when a
//!   configured service's slice turns ready;
//! - [`registry`]: the running weeders, at most one per `namespace/slice`;
//! - [`claims`]: the pods claimed by a namespace's weeders, so each pod is deleted once even
//!   when several slices of one service (dual-stack) each start a weeder;
//! - [`pods`]: one weeder: for `watchDuration`, a pod watch per selector in the slice's
//!   namespace, whose events go to the pure stepper `dwd_core::weeder::PodWatch` (weed this
//!   pod, wait, give up until a new list) and to the watch's hands, which carry its steps out;
//! - `deleter`: the acting hands, which delete;
//! - `shadow`: shadow mode's hands (`--shadow`), which delete nothing: they record the pods
//!   we would have deleted and the acting watchdog's deletions of crash-looping pods they
//!   saw, for the comparison ([`crate::shadow`]). All shadow-only weeder code is there.
//!
//! Which hands the weeders get is chosen once, in [`run`]; the loops never ask which mode
//! they run in. The rules (which slice is ready, which event starts a weeder, which pod is
//! deleted, how a deletion is retried) are pure functions of `dwd_core::weeder` and of this
//! module's submodules; this module does the I/O.

pub mod claims;
mod deleter;
#[cfg(test)]
mod loop_tests;
pub mod pods;
pub mod registry;
mod shadow;
pub mod slices;

use std::collections::HashMap;
use std::sync::Arc;

use dwd_core::{PodSelector, WeederConfig};
use kube::Client;
use tokio_util::sync::CancellationToken;
use tracing::debug;

use crate::Result;
use crate::observe::events::{Component, Events, PodRef};
use crate::observe::health::Health;
use crate::shadow::Shadow;
pub(crate) use claims::PodClaims;
use deleter::Deleters;
use pods::Hands;
pub use pods::Weeder;
pub use registry::Weeders;
use shadow::Recorders;

/// What the EndpointSlice watch needs to start weeders.
pub(crate) struct WeederContext {
    /// How long each weeder lives.
    pub(crate) watch_duration: std::time::Duration,
    /// Service name → selectors of its dependants, shared by every weeder of that service.
    pub(crate) selectors: HashMap<String, Arc<[PodSelector]>>,
    /// Client of the seed's kube-apiserver.
    pub(crate) seed: Client,
    /// What every weeder does with the pods its rules pick: delete them, or in shadow mode
    /// (`--shadow`) record them ([`crate::shadow`]); chosen once, in [`run`].
    pub(crate) hands: Arc<dyn Hands>,
    /// The pods claimed by each namespace's weeders (one weeder per slice; one DELETE per pod).
    pub(crate) claims: PodClaims,
}

impl WeederContext {
    /// The context of `config` against the seed behind `seed`, whose weeders' watches use
    /// `hands`.
    pub(crate) fn new(config: WeederConfig, seed: Client, hands: Arc<dyn Hands>) -> Self {
        let selectors = config
            .services_and_dependant_selectors
            .into_iter()
            .map(|(service, deps)| (service, Arc::from(deps.pod_selectors)))
            .collect();
        WeederContext {
            watch_duration: config.watch_duration,
            selectors,
            seed,
            hands,
            claims: PodClaims::default(),
        }
    }
}

/// What the weeder is started with: by the runtime from the command line, or by a test.
pub struct WeederStart {
    /// The validated weeder configuration.
    pub config: WeederConfig,
    /// Client of the seed's kube-apiserver.
    pub seed: Client,
    /// The registry of weeders, kept by the caller (so it can see which run).
    pub weeders: Arc<Weeders>,
    /// Readiness and liveness of the process.
    pub health: Arc<Health>,
    /// This pod, for the Events about it.
    pub own_pod: PodRef,
    /// Shadow mode's book when running with `--shadow`: no pod is deleted; what would have
    /// been is compared with what the acting watchdog deletes.
    pub shadow: Option<Arc<Shadow>>,
}

/// Runs the weeder started with `start` until `shutdown` is cancelled or a critical task
/// dies.
pub async fn run(start: WeederStart, shutdown: CancellationToken) -> Result<()> {
    let WeederStart {
        config,
        seed,
        weeders,
        health,
        own_pod,
        shadow,
    } = start;
    let metrics = weeders.metrics().clone();
    let mut tasks = tokio::task::JoinSet::new();
    // The mode is chosen here, once: the weeders' loops run the same in both.
    let hands: Arc<dyn Hands> = match shadow {
        Some(shadow) => {
            // Shadow mode writes nothing but the events about its own pod.
            let events =
                Events::start_own_pod_only(seed.clone(), Component::Weeder, own_pod, metrics);
            shadow.spawn_expiry(events.clone(), &mut tasks, shutdown.clone());
            Arc::new(Recorders::new(shadow, events))
        }
        None => {
            let events = Events::start(seed.clone(), Component::Weeder, own_pod, metrics.clone());
            Arc::new(Deleters::new(metrics, events))
        }
    };
    let ctx = Arc::new(WeederContext::new(config, seed, hands));
    tasks.spawn({
        let (ctx, weeders, health) = (ctx.clone(), weeders.clone(), health.clone());
        async move {
            slices::watch(ctx, weeders, health).await;
            "endpointslice watch"
        }
    });
    debug!(
        services = ctx.selectors.len(),
        watch_duration = ?ctx.watch_duration,
        "weeder watching endpoint slices"
    );

    let result = crate::supervision::supervise("weeder", &mut tasks, &shutdown, &health).await;
    weeders.stop_all();
    tasks.shutdown().await;
    result
}
