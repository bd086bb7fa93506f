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
//! Cluster objects embed the whole Shoot, Seed and CloudProfile (about 120 KiB each with a
//! public cloud's profile); decoded whole, listing 5,000 of them peaked at 866 MiB. The watch
//! decodes each Cluster slim ([`SlimCluster`]): the Seed, the CloudProfile and the status are
//! skipped while decoding and the Shoot is cut to the few fields the lifecycle rules read, in
//! pages of [`CLUSTER_PAGE_SIZE`].
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

use super::context::ProberContext;
use super::manager::{EnsureOutcome, ProbeManager};
use crate::client::cache::{FailureStreak, SyncState};
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
pub fn plan<'a>(
    clusters: impl IntoIterator<Item = &'a DynamicObject>,
    running: &[String],
    config: &ProberConfig,
) -> Vec<ProbeAction> {
    let mut listed: Vec<&DynamicObject> = clusters.into_iter().collect();
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
pub(crate) async fn run(
    ctx: Arc<ProberContext>,
    manager: Arc<ProbeManager>,
    shutdown: CancellationToken,
    synced: tokio::sync::watch::Sender<SyncState>,
) {
    let resource = ApiResource::from_gvk(&cluster_gvk());
    // The Cluster watch feeds a cache like the others: ahead of every write in the seed budget.
    let feed = crate::client::cache::feed_client(&ctx.seed);
    let api: Api<SlimCluster> = Api::all_with(feed, &resource);
    let (mut store, mut events) = cluster_watch(&api, &resource);
    let mut streak = FailureStreak::default();
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
                let stale = streak.record(&error, tokio::time::Instant::now());
                if let Some(why) = stale.filter(|_| *synced.borrow() == SyncState::Synced) {
                    warn!(cache = "clusters", %error, %why,
                        "watch keeps failing or the seed went silent: not ready until the Clusters are listed again (the probes keep running as they are)");
                    synced.send_replace(SyncState::Stale(why));
                    // The watcher would resume from its last resourceVersion without a word;
                    // a new one lists, and its `InitDone` brings the probe set in step.
                    (store, events) = cluster_watch(&api, &resource);
                } else {
                    // The stream's back-off already delays the retry; just report it.
                    warn!(cache = "clusters", %error, "watch failed, retrying");
                }
                continue;
            }
            Some(Ok(event)) => {
                streak.succeeded();
                match event {
                    watcher::Event::Apply(cluster) => {
                        (vec![decide(&cluster.0, &ctx.config)], false)
                    }
                    watcher::Event::Delete(cluster) => {
                        let shoot = cluster.0.name_any();
                        (vec![ProbeAction::Gone { shoot }], false)
                    }
                    // A list in progress: the store takes it whole at `InitDone`, and so do we.
                    watcher::Event::Init | watcher::Event::InitApply(_) => continue,
                    watcher::Event::InitDone => {
                        let running = manager.namespaces();
                        let listed = store.state();
                        (
                            plan(listed.iter().map(|c| &c.0), &running, &ctx.config),
                            true,
                        )
                    }
                }
            }
        };
        for action in actions {
            execute(action, &manager, &ctx.metrics);
        }
        if list_done {
            // Readiness comes from the watch's own `InitDone`, not `Store::wait_until_ready`:
            // in kube-runtime 5 that future wakes only the last task that polled it.
            if *synced.borrow() != SyncState::Synced {
                info!(cache = "clusters", "Clusters listed: in sync");
            }
            synced.send_replace(SyncState::Synced);
        }
    }
}

/// A watch of every Cluster from a new list, decoded slim ([`SlimCluster`]) and reflected into
/// the store returned with it. `reflect` applies each event to the store before the stream
/// yields it: at `InitDone` the store holds exactly the new list.
fn cluster_watch(
    api: &Api<SlimCluster>,
    resource: &ApiResource,
) -> (
    Store<SlimCluster>,
    futures::stream::BoxStream<'static, Result<watcher::Event<SlimCluster>, watcher::Error>>,
) {
    let writer = reflector::store::Writer::new(resource.clone());
    let store = writer.as_reader();
    let events = watcher(
        api.clone(),
        watcher::Config::default().page_size(CLUSTER_PAGE_SIZE),
    )
    .default_backoff()
    .reflect(writer)
    .boxed();
    (store, events)
}

/// Clusters per list page. Each Cluster embeds a Shoot, a Seed and a CloudProfile (about
/// 120 KiB of JSON with a public cloud's profile); a page is read whole before it is decoded,
/// so 500 (the watcher's default) held 62 MB of body at once, and the prober peaked at 866 MiB
/// listing 5,000 Clusters when each was decoded whole (crates/dwd-bench/results/cluster-pages/).
/// 100 keeps a page near 12 MB; 5,000 Clusters are 50 requests.
pub(crate) const CLUSTER_PAGE_SIZE: u32 = 100;

/// A Cluster as the Cluster watch decodes it: its name, UID and resourceVersion, and
/// `spec.shoot` reduced by [`strip_cluster`]. The embedded Seed and CloudProfile (most of a
/// Cluster's bytes), the status and every other metadata field are skipped while decoding,
/// never built.
#[derive(Debug, Clone)]
pub(crate) struct SlimCluster(pub(crate) DynamicObject);

impl<'de> serde::Deserialize<'de> for SlimCluster {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(serde::Deserialize)]
        struct Wire {
            #[serde(default)]
            metadata: WireMeta,
            #[serde(default)]
            spec: WireSpec,
        }
        #[derive(serde::Deserialize, Default)]
        #[serde(rename_all = "camelCase")]
        struct WireMeta {
            name: Option<String>,
            uid: Option<String>,
            resource_version: Option<String>,
        }
        #[derive(serde::Deserialize, Default)]
        struct WireSpec {
            shoot: Option<Value>,
        }
        let wire = Wire::deserialize(deserializer)?;
        let spec = match wire.spec.shoot {
            Some(shoot) => serde_json::json!({ "shoot": shoot }),
            None => Value::Object(Map::new()),
        };
        let mut cluster = DynamicObject {
            types: None,
            metadata: kube::api::ObjectMeta {
                name: wire.metadata.name,
                uid: wire.metadata.uid,
                resource_version: wire.metadata.resource_version,
                ..Default::default()
            },
            data: serde_json::json!({ "spec": spec }),
        };
        strip_cluster(&mut cluster);
        Ok(SlimCluster(cluster))
    }
}

impl kube::Resource for SlimCluster {
    type DynamicType = ApiResource;
    type Scope = kube::core::DynamicResourceScope;

    fn kind(resource: &ApiResource) -> std::borrow::Cow<'_, str> {
        DynamicObject::kind(resource)
    }
    fn group(resource: &ApiResource) -> std::borrow::Cow<'_, str> {
        DynamicObject::group(resource)
    }
    fn version(resource: &ApiResource) -> std::borrow::Cow<'_, str> {
        DynamicObject::version(resource)
    }
    fn api_version(resource: &ApiResource) -> std::borrow::Cow<'_, str> {
        DynamicObject::api_version(resource)
    }
    fn plural(resource: &ApiResource) -> std::borrow::Cow<'_, str> {
        DynamicObject::plural(resource)
    }
    fn meta(&self) -> &kube::api::ObjectMeta {
        &self.0.metadata
    }
    fn meta_mut(&mut self) -> &mut kube::api::ObjectMeta {
        &mut self.0.metadata
    }
}

#[cfg(test)]
#[path = "controller_tests.rs"]
mod controller_tests;
