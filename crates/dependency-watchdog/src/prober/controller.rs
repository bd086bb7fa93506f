//! The Cluster controller: keeps one probe per shoot whose Cluster says it should have one
//! (docs/behaviour.md §2.2), by feeding `dwd_core::probe_lifecycle` into the [`ProbeManager`].
//!
//! One loop, [`run`], reads the Cluster watch and is the only writer of the probe set:
//!
//! - an added or changed Cluster is decided at once ([`decide`]): start its probe, hand the
//!   running one new settings, remove it, or leave it;
//! - a deleted Cluster's probe is removed at once;
//! - when a list is complete (`InitDone`: the first one, and every re-list after the watch
//!   lost its place), the whole probe set is brought in step with the Cluster store ([`plan`]):
//!   every listed Cluster is decided again, and every probe whose Cluster is not in the list
//!   is removed (its Cluster was deleted while no watch saw it).
//!
//! The decisions are pure functions returning [`ProbeAction`]s; `execute` is the one place that
//! carries them out. Since nothing else changes the probe set while the loop looks at the
//! store, a probe can't be removed for a Cluster that arrived after the look.
//!
//! Cluster objects embed the whole Shoot, Seed and CloudProfile; a thousand of them would
//! cost hundreds of megabytes. The watch stream strips each object down to the few Shoot
//! fields the lifecycle rules read before it reaches the cache.
//!
//! A changed Cluster (grace period, pool conditions) updates the running probe, which applies
//! the new settings from its next run: unlike the reference, which restarts the probe when
//! the pools' node conditions change (re-arming `initialDelay`), and ignores a changed grace
//! period until the next restart.

use std::collections::HashSet;
use std::sync::Arc;

use dwd_core::shoot::{RemoveReason, WaitReason};
use dwd_core::{
    EffectiveProbeSettings, ProbeLifecycle, ProberConfig, ShootError, ShootView, probe_lifecycle,
};
use futures::StreamExt;
use kube::api::{ApiResource, DynamicObject};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, ResourceExt};
use serde_json::{Map, Value};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::ProberContext;
use super::manager::{EnsureOutcome, ProbeManager};
use crate::metrics::Metrics;

pub(crate) use crate::gardener::cluster_gvk;

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
pub(crate) fn strip_cluster(obj: &mut DynamicObject) {
    obj.metadata.managed_fields = None;
    obj.metadata.annotations = None;
    let Some(shoot) = obj.data.pointer("/spec/shoot") else {
        // Leave it as is: `decide` reports the missing shoot by name (`Unreadable`).
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

/// What to do with one shoot's probe: a decision, before anything is done.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProbeAction {
    /// The Cluster says: probe the shoot with these settings (start the probe, or hand the
    /// running one the settings and the Cluster's UID).
    Run {
        /// The shoot namespace (= Cluster name).
        shoot: String,
        /// The settings the probe runs with.
        settings: EffectiveProbeSettings,
        /// The Cluster's UID, which the probe's events name.
        cluster_uid: Option<String>,
    },
    /// The Cluster says: no probe (the shoot hibernates, is deleted, migrates, ...). Stop the
    /// running one, if any.
    Remove {
        /// The shoot namespace.
        shoot: String,
        /// Why, for the log.
        reason: RemoveReason,
    },
    /// The Cluster says: no probe yet (the shoot is being created or woken up). Start none;
    /// leave a running one alone.
    Wait {
        /// The shoot namespace.
        shoot: String,
        /// Why, for the log.
        reason: WaitReason,
    },
    /// The Cluster's Shoot can't be read: its probe (if any) is left as it is.
    Unreadable {
        /// The shoot namespace.
        shoot: String,
        /// What is wrong with it.
        error: ShootError,
    },
    /// The Cluster no longer exists: stop its probe, if one runs.
    Gone {
        /// The shoot namespace.
        shoot: String,
    },
}

/// What `cluster` (stripped or not) asks of its shoot's probe (docs/behaviour.md §2.2).
pub fn decide(cluster: &DynamicObject, config: &ProberConfig) -> ProbeAction {
    let shoot = cluster.name_any();
    let spec = cluster.data.get("spec").unwrap_or(&Value::Null);
    let view = match ShootView::from_cluster_spec(spec) {
        Ok(view) => view,
        Err(error) => return ProbeAction::Unreadable { shoot, error },
    };
    match probe_lifecycle(Some(&view), config) {
        ProbeLifecycle::Run(settings) => ProbeAction::Run {
            shoot,
            settings,
            cluster_uid: cluster.metadata.uid.clone(),
        },
        ProbeLifecycle::Remove(reason) => ProbeAction::Remove { shoot, reason },
        ProbeLifecycle::NotYet(reason) => ProbeAction::Wait { shoot, reason },
    }
}

/// What brings the probe set in step with a complete list of Clusters: every Cluster of
/// `clusters` decided ([`decide`]), by name, then every shoot of `running` (those with a
/// probe) whose Cluster is not in the list, [`ProbeAction::Gone`], by name.
pub fn plan(
    clusters: &[Arc<DynamicObject>],
    running: &[String],
    config: &ProberConfig,
) -> Vec<ProbeAction> {
    let mut listed: Vec<&DynamicObject> = clusters.iter().map(Arc::as_ref).collect();
    listed.sort_by_key(|c| c.name_any());
    let names: HashSet<String> = listed.iter().map(|c| c.name_any()).collect();
    let mut gone: Vec<&String> = running.iter().filter(|ns| !names.contains(*ns)).collect();
    gone.sort();
    gone.dedup();
    listed
        .into_iter()
        .map(|c| decide(c, config))
        .chain(
            gone.into_iter()
                .map(|ns| ProbeAction::Gone { shoot: ns.clone() }),
        )
        .collect()
}

/// Carries out `action` on the probe set, logs it, and counts it: every action about a Cluster
/// at hand is one Cluster reconcile (`Unreadable` a failed one too); a vanished Cluster's is
/// not. The one place probes are started, updated and removed.
fn execute(action: ProbeAction, manager: &ProbeManager, metrics: &Metrics) {
    if !matches!(action, ProbeAction::Gone { .. }) {
        metrics.reconciles.inc();
    }
    match action {
        ProbeAction::Run {
            shoot,
            settings,
            cluster_uid,
        } => {
            let grace = settings.node_monitor_grace;
            match manager.ensure(&shoot, settings, cluster_uid) {
                EnsureOutcome::Started => info!(%shoot, ?grace, "probe started"),
                EnsureOutcome::Updated => {
                    info!(%shoot, ?grace, "probe settings or Cluster changed: they apply from its next run, without a restart")
                }
                EnsureOutcome::Restarted => {
                    info!(%shoot, ?grace, "probe started again: its task had ended")
                }
                EnsureOutcome::Unchanged => {}
            }
        }
        ProbeAction::Remove { shoot, reason } => remove(manager, &shoot, &reason),
        ProbeAction::Gone { shoot } => remove(manager, &shoot, &RemoveReason::ClusterGone),
        ProbeAction::Wait { shoot, reason } => debug!(%shoot, %reason, "no probe started yet"),
        ProbeAction::Unreadable { shoot, error } => {
            metrics.reconcile_errors.inc();
            warn!(
                cluster = %shoot,
                error = %format!("Cluster {shoot}: {error}; its probe (if any) is left as it is"),
                "reconcile failed"
            );
        }
    }
}

fn remove(manager: &ProbeManager, shoot: &str, reason: &RemoveReason) {
    if manager.remove(shoot) {
        info!(%shoot, %reason, "probe removed");
    } else {
        debug!(%shoot, %reason, "no probe");
    }
}

/// Runs the controller until `shutdown`. `synced` turns true once the first list of Clusters
/// is in the store and the probe set is in step with it.
///
/// Nothing is retried per Cluster: a decision is a pure function of the Cluster as stored, so
/// deciding again would fail (or succeed) the same way. A changed Cluster comes as an event,
/// and every re-list decides every Cluster again. Nothing here sends a request either: the
/// watch is the controller's only traffic.
pub async fn run(
    ctx: Arc<ProberContext>,
    manager: Arc<ProbeManager>,
    shutdown: CancellationToken,
    synced: tokio::sync::watch::Sender<bool>,
) {
    let resource = ApiResource::from_gvk(&cluster_gvk());
    // The Cluster watch feeds a cache like the others: ahead of every write in the seed budget.
    let feed = crate::cache::feed_client(&ctx.seed);
    let api: Api<DynamicObject> = Api::all_with(feed, &resource);
    let writer = reflector::store::Writer::new(resource);
    let store: Store<DynamicObject> = writer.as_reader();
    // `reflect` applies each event to the store before this loop sees it: at `InitDone` the
    // store holds exactly the new list.
    let mut events = std::pin::pin!(
        watcher(api, watcher::Config::default())
            .default_backoff()
            .modify(strip_cluster)
            .reflect(writer)
    );
    loop {
        let event = tokio::select! {
            biased;
            _ = shutdown.cancelled() => return,
            event = events.next() => event,
        };
        let (actions, list_done) = match event {
            // A watcher retries for ever; its stream ends only with the process.
            None => return,
            Some(Err(error)) => {
                // The stream's back-off already delays the retry; just report it.
                warn!(cache = "clusters", %error, "watch failed, retrying");
                continue;
            }
            Some(Ok(watcher::Event::Apply(cluster))) => {
                (vec![decide(&cluster, &ctx.config)], false)
            }
            Some(Ok(watcher::Event::Delete(cluster))) => {
                let shoot = cluster.name_any();
                (vec![ProbeAction::Gone { shoot }], false)
            }
            // A list in progress: the store takes it whole at `InitDone`, and so do we.
            Some(Ok(watcher::Event::Init | watcher::Event::InitApply(_))) => continue,
            Some(Ok(watcher::Event::InitDone)) => {
                let running = manager.namespaces();
                (plan(&store.state(), &running, &ctx.config), true)
            }
        };
        for action in actions {
            execute(action, &manager, &ctx.metrics);
        }
        if list_done {
            // Readiness comes from the watch's own `InitDone`, not `Store::wait_until_ready`:
            // in kube-runtime 5 that future wakes only the last task that polled it.
            synced.send_replace(true);
        }
    }
}

#[cfg(test)]
#[path = "controller_tests.rs"]
mod controller_tests;
