//! The Cluster controller (kube-runtime `Controller`): keeps one probe per shoot whose
//! Cluster says it should have one (docs/behaviour.md §2.2), by feeding `dwd_core::probe_lifecycle`
//! into the [`ProbeManager`].
//!
//! Cluster objects embed the whole Shoot, Seed and CloudProfile; a thousand of them would
//! cost hundreds of megabytes. The watch stream strips each object down to the few Shoot
//! fields the lifecycle rules read before it reaches the cache.
//!
//! Deleted Clusters: the controller reports them as `ObjectNotFound` (they are no longer in
//! its store), which removes the probe; a periodic sweep also removes probes whose Cluster
//! vanished while the watch was re-listing (never one ensured after the sweep looked).
//!
//! A changed Cluster (grace period, pool conditions) updates the running probe, which applies
//! the new settings from its next run: unlike the reference, which restarts the probe when
//! the pools' node conditions change (re-arming `initialDelay`), and ignores a changed grace
//! period until the next restart.

use std::sync::Arc;
use std::time::Duration;

use dwd_core::{ProbeLifecycle, ShootView, probe_lifecycle};
use futures::StreamExt;
use kube::api::{ApiResource, DynamicObject};
use kube::runtime::controller::{self, Action, Controller};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, ResourceExt};
use serde_json::{Map, Value};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::ProberContext;
use super::manager::{EnsureOutcome, ProbeManager};
use crate::Error;
use crate::rate_limit::{Priority, prioritized};

pub use crate::gardener::cluster_gvk;

/// Shoot fields the lifecycle rules read (JSON pointers into the Shoot).
const KEPT_SHOOT_FIELDS: &[&str] = &[
    "/metadata/name",
    "/metadata/deletionTimestamp",
    "/spec/hibernation/enabled",
    "/spec/kubernetes/kubeControllerManager/nodeMonitorGracePeriod",
    "/status/isHibernated",
    "/status/lastOperation/type",
    "/status/lastOperation/state",
];

fn copy_pointer(src: &Value, dst: &mut Value, pointer: &str) {
    let Some(v) = src.pointer(pointer) else {
        return;
    };
    let mut cur = dst;
    let parts: Vec<&str> = pointer.split('/').skip(1).collect();
    for (i, part) in parts.iter().enumerate() {
        if !cur.is_object() {
            *cur = Value::Object(Map::new());
        }
        let Value::Object(map) = cur else { return };
        if i + 1 == parts.len() {
            map.insert((*part).to_string(), v.clone());
            return;
        }
        cur = map
            .entry((*part).to_string())
            .or_insert_with(|| Value::Object(Map::new()));
    }
}

/// Reduces a Cluster to `spec.shoot` with only the fields the lifecycle rules read.
pub fn strip_cluster(obj: &mut DynamicObject) {
    obj.metadata.managed_fields = None;
    obj.metadata.annotations = None;
    let Some(shoot) = obj.data.pointer("/spec/shoot") else {
        // Leave it as is: reconcile reports the missing shoot by name.
        return;
    };
    let mut kept = Value::Object(Map::new());
    for pointer in KEPT_SHOOT_FIELDS {
        copy_pointer(shoot, &mut kept, pointer);
    }
    if let Some(workers) = shoot
        .pointer("/spec/provider/workers")
        .and_then(Value::as_array)
    {
        let workers: Vec<Value> = workers
            .iter()
            .map(|w| {
                let mut slim = Value::Object(Map::new());
                copy_pointer(w, &mut slim, "/name");
                copy_pointer(w, &mut slim, "/machineControllerManager/nodeConditions");
                slim
            })
            .collect();
        copy_pointer(
            &serde_json::json!({"spec": {"provider": {"workers": workers}}}),
            &mut kept,
            "/spec/provider/workers",
        );
    }
    obj.data = serde_json::json!({ "spec": { "shoot": kept } });
}

struct ReconcileData {
    ctx: Arc<ProberContext>,
    manager: Arc<ProbeManager>,
}

async fn reconcile(cluster: Arc<DynamicObject>, data: Arc<ReconcileData>) -> Result<Action, Error> {
    data.ctx.metrics.reconciles.inc();
    let name = cluster.name_any();
    let spec = cluster.data.get("spec").cloned().unwrap_or(Value::Null);
    let view = ShootView::from_cluster_spec(&spec).map_err(|e| {
        Error::Scaling(format!(
            "Cluster {name}: {e}; its probe (if any) is left as it is"
        ))
    })?;
    match probe_lifecycle(Some(&view), &data.ctx.config) {
        ProbeLifecycle::Remove(reason) => {
            if data.manager.remove(&name) {
                info!(shoot = %name, %reason, "probe removed");
            } else {
                debug!(shoot = %name, %reason, "no probe");
            }
        }
        ProbeLifecycle::Run(settings) => {
            let grace = settings.node_monitor_grace;
            let uid = cluster.metadata.uid.clone();
            match data.manager.ensure(&name, settings, uid) {
                EnsureOutcome::Started => info!(shoot = %name, ?grace, "probe started"),
                EnsureOutcome::Updated => {
                    info!(shoot = %name, ?grace, "probe settings or Cluster changed: they apply from its next run, without a restart")
                }
                EnsureOutcome::Restarted => {
                    info!(shoot = %name, ?grace, "probe started again: its task had ended")
                }
                EnsureOutcome::Unchanged => {}
            }
        }
        ProbeLifecycle::NotYet(reason) => debug!(shoot = %name, %reason, "no probe started yet"),
    }
    Ok(Action::await_change())
}

fn error_policy(cluster: Arc<DynamicObject>, error: &Error, data: Arc<ReconcileData>) -> Action {
    data.ctx.metrics.reconcile_errors.inc();
    warn!(cluster = %cluster.name_any(), %error, "reconcile failed");
    Action::requeue(Duration::from_secs(30))
}

/// Runs the controller until `shutdown`. `synced` turns true once the first list of Clusters
/// is in the store.
///
/// Readiness is signalled from the watch's own `InitDone` rather than with
/// `Store::wait_until_ready`: in kube-runtime 5 that future keeps only the waker of the last
/// task that polled it, so with two waiters (readiness and the orphan sweep) one was never
/// woken and `/readyz` stayed 503 in about half the starts.
pub async fn run(
    ctx: Arc<ProberContext>,
    manager: Arc<ProbeManager>,
    concurrency: u16,
    shutdown: CancellationToken,
    synced: tokio::sync::watch::Sender<bool>,
) {
    let resource = ApiResource::from_gvk(&cluster_gvk());
    // The Cluster watch feeds a cache like the others: ahead of every write in the seed budget
    // (reconciling sends no requests).
    let feed = prioritized(&ctx.seed, Priority::WATCH_CACHES);
    let api: Api<DynamicObject> = Api::all_with(feed, &resource);
    let writer = reflector::store::Writer::new(resource.clone());
    let reader = writer.as_reader();
    let synced_for_stream = synced.clone();
    let stream = watcher(api, watcher::Config::default())
        .default_backoff()
        .modify(strip_cluster)
        .reflect(writer)
        .inspect(move |event| {
            // After `reflect`, so the store already holds the list when this fires.
            if matches!(event, Ok(watcher::Event::InitDone)) {
                synced_for_stream.send_replace(true);
            }
        })
        .touched_objects();

    let sweeper = tokio::spawn(sweep_orphans(
        reader.clone(),
        synced.subscribe(),
        manager.clone(),
        shutdown.clone(),
    ));
    let data = Arc::new(ReconcileData {
        ctx,
        manager: manager.clone(),
    });
    let controller = Controller::for_stream_with(stream, reader, resource)
        .with_config(controller::Config::default().concurrency(concurrency))
        .graceful_shutdown_on(shutdown.clone().cancelled_owned())
        .run(reconcile, error_policy, data)
        .for_each(|result| {
            if let Err(controller::Error::ObjectNotFound(obj)) = &result
                && manager.remove(&obj.name)
            {
                info!(shoot = %obj.name, reason = "the Cluster no longer exists", "probe removed");
            }
            futures::future::ready(())
        });
    controller.await;
    sweeper.abort();
}

/// Removes probes whose Cluster is no longer in the store (deleted during a re-list).
async fn sweep_orphans(
    store: Store<DynamicObject>,
    mut synced: tokio::sync::watch::Receiver<bool>,
    manager: Arc<ProbeManager>,
    shutdown: CancellationToken,
) {
    if synced.wait_for(|s| *s).await.is_err() {
        return;
    }
    let mut tick = tokio::time::interval(Duration::from_secs(30));
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        // Marked before the store is read: a probe started (or confirmed) for a Cluster
        // that arrived after this look is spared, not taken for an orphan.
        let mark = manager.mark();
        let present: std::collections::HashSet<String> =
            store.state().iter().map(|c| c.name_any()).collect();
        for ns in manager.namespaces() {
            if !present.contains(&ns) && manager.remove_unless_ensured_since(&ns, mark) {
                info!(shoot = %ns, reason = "the Cluster no longer exists", "probe removed");
            }
        }
    }
}

#[cfg(test)]
#[path = "controller_tests.rs"]
mod controller_tests;
