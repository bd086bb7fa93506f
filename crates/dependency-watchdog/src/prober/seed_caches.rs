//! The seed-side watch caches the prober reads instead of issuing GETs on every run:
//! kubeconfig secrets, Machines, and each configured scaling target. Each is ready only while
//! in sync (see [`crate::client::cache`]); the prober's readiness and every probe run ask them.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use dwd_core::{DependentResourceInfo, MachineView};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
use kube::runtime::watcher;
use kube::{Api, Client};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::client::cache::{Cache, OnRefusal, SyncState, name_field_selector, run_cache};

/// Pause before a target's kind is looked up again after a discovery error that says nothing
/// about the kind (seed unreachable, 5xx, throttled, forbidden); doubled after each further
/// failure.
pub(crate) const DISCOVERY_FIRST_RETRY: Duration = Duration::from_millis(500);
/// The longest such pause: a seed that stays down is asked twice a minute, and logged as often.
pub(crate) const DISCOVERY_MAX_RETRY: Duration = Duration::from_secs(30);

/// Key of the kubeconfig in the probe secret.
pub const KUBECONFIG_KEY: &str = "kubeconfig";

/// What a probe secret holds: the kubeconfig text, or why it is unusable.
#[derive(Debug, Clone)]
pub struct SecretKubeconfig(pub Result<Arc<str>, String>);

/// What the scaler needs of a target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetState {
    /// `metadata.annotations`.
    pub annotations: BTreeMap<String, String>,
    /// `spec.replicas` (absent means the API default, 1).
    pub spec_replicas: i32,
    /// `status.readyReplicas` (absent means 0).
    pub ready_replicas: i32,
    /// `metadata.resourceVersion`: the precondition of the one-patch scaling writes.
    pub resource_version: Option<String>,
    /// `metadata.uid`: events about the target name it without a lookup.
    pub uid: Option<String>,
}

/// One configured target and its cache.
#[derive(Debug)]
pub struct TargetCache {
    /// The config entry.
    pub info: DependentResourceInfo,
    /// The API resource (plural etc.), once discovered.
    pub resource: ApiResource,
    /// Cached state per shoot namespace (name = the target's name).
    pub cache: Arc<Cache<TargetState>>,
}

/// All prober caches.
#[derive(Debug)]
pub struct SeedCaches {
    /// Probe kubeconfigs by namespace (the watch selects only the configured secret name).
    pub secrets: Arc<Cache<SecretKubeconfig>>,
    /// Machines, projected to name, node label and phase.
    pub machines: Arc<Cache<MachineView>>,
    /// Scaling targets, in config order.
    pub targets: Vec<TargetCache>,
}

pub(crate) use crate::gardener::machine_gvk;

fn project_secret(secret: &Secret) -> Option<SecretKubeconfig> {
    let value = match secret.data.as_ref().and_then(|d| d.get(KUBECONFIG_KEY)) {
        None => Err(format!("has no key {KUBECONFIG_KEY:?}")),
        Some(bytes) => match std::str::from_utf8(&bytes.0) {
            Ok(text) => Ok(Arc::from(text)),
            Err(_) => Err(format!("key {KUBECONFIG_KEY:?} is not UTF-8")),
        },
    };
    Some(SecretKubeconfig(value))
}

/// Projects a Machine to what the lease probe needs.
pub(crate) fn project_machine(machine: &DynamicObject) -> Option<MachineView> {
    let phase = machine
        .data
        .pointer("/status/currentStatus/phase")
        .and_then(|v| v.as_str())
        .map(str::to_string);
    Some(MachineView {
        name: machine.metadata.name.clone()?,
        node: machine
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("node"))
            .cloned(),
        phase,
    })
}

/// Projects a scaling target to what the scaler needs.
pub(crate) fn project_target(obj: &DynamicObject) -> Option<TargetState> {
    let int = |ptr: &str| obj.data.pointer(ptr).and_then(serde_json::Value::as_i64);
    Some(TargetState {
        annotations: obj.metadata.annotations.clone().unwrap_or_default(),
        spec_replicas: int("/spec/replicas").map_or(1, |v| i32::try_from(v).unwrap_or(i32::MAX)),
        ready_replicas: int("/status/readyReplicas")
            .map_or(0, |v| i32::try_from(v).unwrap_or(i32::MAX)),
        resource_version: obj.metadata.resource_version.clone(),
        uid: obj.metadata.uid.clone(),
    })
}

/// Whether discovery failed because the seed does not serve the kind: its group/version is
/// unknown (404) or the group/version lacks the kind.
pub(crate) fn is_not_served(e: &kube::Error) -> bool {
    match e {
        kube::Error::Api(status) => status.code == 404,
        kube::Error::Discovery(
            kube::error::DiscoveryError::MissingKind(_)
            | kube::error::DiscoveryError::MissingApiGroup(_),
        ) => true,
        _ => false,
    }
}

/// `apiVersion` → (group, version).
pub(crate) fn split_api_version(api_version: &str) -> (&str, &str) {
    match api_version.split_once('/') {
        Some((group, version)) => (group, version),
        None => ("", api_version),
    }
}

/// Looks up `gvk` for the target `info` until the seed answers: the resource, or the error that
/// says the kind is not served ([`is_not_served`]). Other errors say nothing about the kind and
/// are retried with a growing pause; `Err` only when `shutdown` is cancelled meanwhile.
async fn discover(
    seed: &Client,
    gvk: &GroupVersionKind,
    info: &DependentResourceInfo,
    shutdown: &CancellationToken,
) -> crate::Result<Result<ApiResource, kube::Error>> {
    let mut pause = DISCOVERY_FIRST_RETRY;
    let mut attempt: u32 = 1;
    let ended = || {
        crate::Error::TaskDied(
            "seed discovery",
            format!(
                "shutdown while discovering the kind of target {}",
                info.target.name
            ),
        )
    };
    loop {
        // Raced with shutdown too: one discovery call may wait out the seed's `Retry-After`s.
        let found = tokio::select! {
            found = kube::discovery::pinned_kind(seed, gvk) => found,
            () = shutdown.cancelled() => return Err(ended()),
        };
        let error = match found {
            Ok((resource, _caps)) => {
                if attempt > 1 {
                    info!(target = %info.target.name, attempt, "the target's kind was discovered after the seed recovered");
                }
                return Ok(Ok(resource));
            }
            Err(e) if is_not_served(&e) => return Ok(Err(e)),
            Err(e) => e,
        };
        warn!(
            target = %info.target.name,
            kind = %format!("{}/{}", info.target.api_version, info.target.kind),
            attempt,
            retry_in = ?pause,
            error = %error,
            "discovering the target's kind failed (the seed unreachable or failing); retrying, \
             not ready meanwhile"
        );
        tokio::select! {
            () = tokio::time::sleep(pause) => {}
            () = shutdown.cancelled() => return Err(ended()),
        }
        pause = (pause * 2).min(DISCOVERY_MAX_RETRY);
        attempt = attempt.saturating_add(1);
    }
}

impl SeedCaches {
    /// The cache of target `info`; `None` when the seed does not serve its kind.
    pub(crate) fn target(&self, info: &DependentResourceInfo) -> Option<&TargetCache> {
        self.targets.iter().find(|t| t.info == *info)
    }

    /// Creates the caches and spawns the watches feeding them (they run until `shutdown`).
    /// Target kinds are resolved through discovery. A kind the seed does not serve is an
    /// error naming the target, since scaling it could never succeed, unless the target is
    /// optional: then it is warned about once and gets no cache (the scaler skips it).
    ///
    /// Any other discovery error (the seed unreachable, 5xx, throttled, forbidden) says nothing
    /// about the kind: the lookup is retried, logged each time, after a pause growing from
    /// [`DISCOVERY_FIRST_RETRY`] to [`DISCOVERY_MAX_RETRY`], until it succeeds or `shutdown` is
    /// cancelled (then [`crate::Error::TaskDied`], which a shutdown takes as a graceful end).
    /// The reference resolves kinds lazily and keeps running through a seed hiccup at start;
    /// so do we, not ready meanwhile.
    pub async fn start(
        seed: &Client,
        secret_name: &str,
        targets: &[DependentResourceInfo],
        tasks: &mut tokio::task::JoinSet<&'static str>,
        shutdown: &CancellationToken,
    ) -> crate::Result<Self> {
        // The watches feeding the caches go ahead of every write in the seed budget (see
        // `Priority::WATCH_CACHES`); discovery below goes at the default priority.
        let feeds = crate::client::cache::feed_client(seed);
        let secrets = Cache::new("probe kubeconfig secrets");
        tasks.spawn({
            let api: Api<Secret> = Api::all(feeds.clone());
            let config = watcher::Config::default().fields(&name_field_selector(secret_name));
            let cache = secrets.clone();
            async move {
                run_cache(api, config, cache, project_secret, OnRefusal::Unsynced).await;
                "secret cache"
            }
        });

        let machines = Cache::new("machines");
        tasks.spawn({
            let api: Api<DynamicObject> =
                Api::all_with(feeds.clone(), &ApiResource::from_gvk(&machine_gvk()));
            let cache = machines.clone();
            async move {
                let config = watcher::Config::default();
                run_cache(api, config, cache, project_machine, OnRefusal::Unsynced).await;
                "machine cache"
            }
        });

        let mut target_caches = Vec::new();
        for info in targets {
            let (group, version) = split_api_version(&info.target.api_version);
            let gvk = GroupVersionKind::gvk(group, version, &info.target.kind);
            let resource = match discover(seed, &gvk, info, shutdown).await? {
                Ok(resource) => resource,
                // An optional target may be absent; a kind this seed does not serve (e.g. a
                // CRD not installed here) is the same absence, for good. Startup goes on
                // without its cache and the scaler skips it in every flow, so the other
                // targets stay protected.
                // `discover` returns an error only when the kind is not served.
                Err(_) if dwd_core::intent::skipped_when_not_served(info) => {
                    warn!(
                        target = %info.target.name,
                        kind = %format!("{}/{}", info.target.api_version, info.target.kind),
                        "optional target: its kind is not served by the seed; it is skipped \
                         in every scaling flow (restart the prober once the kind is served)"
                    );
                    continue;
                }
                Err(e) => {
                    return Err(crate::Error::Scaling(format!(
                        "target {}: its kind {}/{} is not served by the seed and the target \
                         is not optional ({e})",
                        info.target.name, info.target.api_version, info.target.kind
                    )));
                }
            };
            let cache = Cache::new("scaling targets");
            tasks.spawn({
                let api: Api<DynamicObject> = Api::all_with(feeds.clone(), &resource);
                let config =
                    watcher::Config::default().fields(&name_field_selector(&info.target.name));
                let cache = cache.clone();
                // An optional target's refused watch must not hold back the others.
                let on_refusal = if dwd_core::intent::skipped_when_not_served(info) {
                    OnRefusal::Absent
                } else {
                    OnRefusal::Unsynced
                };
                async move {
                    run_cache(api, config, cache, project_target, on_refusal).await;
                    "target cache"
                }
            });
            target_caches.push(TargetCache {
                info: info.clone(),
                resource,
                cache,
            });
        }
        Ok(SeedCaches {
            secrets,
            machines,
            targets: target_caches,
        })
    }

    /// The caches that are not in sync, each named with why (still listing, or its watch
    /// failing).
    pub fn pending(&self) -> Vec<String> {
        let mut pending = Vec::new();
        let mut note = |name: String, cache_state: SyncState| match cache_state {
            SyncState::Synced => {}
            SyncState::Listing => pending.push(format!("{name} (listing)")),
            SyncState::Stale(why) => pending.push(format!("{name} ({why})")),
        };
        note(
            "probe kubeconfig secrets".to_string(),
            self.secrets.sync_state(),
        );
        note("machines".to_string(), self.machines.sync_state());
        for t in &self.targets {
            note(
                format!("target {}/{}", t.info.target.kind, t.info.target.name),
                t.cache.sync_state(),
            );
        }
        pending
    }

    /// Receivers of every cache's sync state; take them *before* checking
    /// [`Self::pending`] so that no change in between is missed.
    pub(crate) fn sync_receivers(&self) -> Vec<tokio::sync::watch::Receiver<SyncState>> {
        let mut rxs = vec![
            self.secrets.subscribe_sync(),
            self.machines.subscribe_sync(),
        ];
        rxs.extend(self.targets.iter().map(|t| t.cache.subscribe_sync()));
        rxs
    }

    /// Whether every cache is in sync.
    pub fn is_ready(&self) -> bool {
        self.secrets.is_ready()
            && self.machines.is_ready()
            && self.targets.iter().all(|t| t.cache.is_ready())
    }
}
