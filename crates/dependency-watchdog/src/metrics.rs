//! Prometheus metrics (prometheus-client): ours under the `dwd` prefix, and the standard
//! families every controller-runtime controller (so the reference) exports, which operators'
//! dashboards and alerts already use.
//!
//! The `dwd_*` families are those the redesign document promised and the reference never
//! shipped. Per-shoot series carry a `shoot` label and are removed when the shoot's probe is
//! removed, so the label cardinality stays bounded by the shoots this seed hosts.
//!
//! The standard ones, with client_golang's and client-go's names, labels and help texts:
//! `process_*` (read from `/proc/self` at each scrape by [`ProcessCollector`]),
//! `leader_election_master_status{name}` (1 while this replica holds the Lease `name`, 0 while
//! it is a candidate that follows; no series without leader election, as in client-go) and
//! `rest_client_requests_total{code,method,host}` (every request of every Kubernetes client
//! of the process, counted by [`CountRequestsLayer`]; `host` is the apiserver's host:port, so
//! there is one value per shoot, as with client-go, and like client-go's its series stay).

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::AtomicU64;
use std::task::{Context, Poll};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

/// Label set `{shoot}`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ShootLabels {
    /// Shoot namespace in the seed.
    pub shoot: String,
}

/// Label set `{shoot, zone}`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ShootZoneLabels {
    /// Shoot namespace in the seed.
    pub shoot: String,
    /// The zone (node label `topology.kubernetes.io/zone`), at most [`ZONE_LABEL_LIMIT`] bytes.
    pub zone: String,
}

/// At most this many zones of one shoot get a series: zone names come from the tenant's node
/// labels, and a hostile shoot must not grow the scrape without bound. Disrupted zones first,
/// then by name. Real shoots span 1 to 3 zones, rarely more.
pub(crate) const ZONES_PER_SHOOT_LIMIT: usize = 8;
/// Longest zone label value kept (a Kubernetes label value's limit); longer ones are cut.
pub(crate) const ZONE_LABEL_LIMIT: usize = 63;

/// Scaling direction label value.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
pub enum DirectionLabel {
    /// Scale up (restore).
    Up,
    /// Scale down (meltdown protection).
    Down,
}

impl From<dwd_core::Direction> for DirectionLabel {
    fn from(d: dwd_core::Direction) -> Self {
        match d {
            dwd_core::Direction::Up => DirectionLabel::Up,
            dwd_core::Direction::Down => DirectionLabel::Down,
        }
    }
}

/// Label set `{shoot, direction}`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ShootDirectionLabels {
    /// Shoot namespace.
    pub shoot: String,
    /// Direction.
    pub direction: DirectionLabel,
}

/// Outcome of one scale operation on one target.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
pub enum Outcome {
    /// Replicas changed and the target reached its goal.
    Scaled,
    /// Nothing to do (already scaled, ignored, optional and missing).
    Skipped,
    /// Failed after all attempts.
    Failed,
}

/// Label set `{direction, target, outcome}`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ScaleOpLabels {
    /// Direction.
    pub direction: DirectionLabel,
    /// Target name (kube-controller-manager, …): bounded by the config.
    pub target: String,
    /// Outcome.
    pub outcome: Outcome,
}

/// Which API a request went to.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
pub enum ApiLabel {
    /// The seed's kube-apiserver.
    Seed,
    /// A shoot's kube-apiserver.
    Shoot,
}

/// Label set `{api}`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ApiLabels {
    /// Which API.
    pub api: ApiLabel,
}

/// Result of one probe run.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
pub enum RunResult {
    /// Lease probe decided to scale up (or leases are healthy).
    ScaleUp,
    /// Lease probe decided to scale down.
    ScaleDown,
    /// Lease probe decided to scale the zonal targets down (a zone is disrupted).
    ZonalScaleDown,
    /// Lease probe decided not to scale (single candidate, hysteresis).
    NoScaling,
    /// The API server probe failed.
    ApiServerProbeFailed,
    /// The lease probe failed.
    LeaseProbeFailed,
    /// The run was not made, or was ended, for want of room in the runs' memory budget: the
    /// prober's doing, never the shoot's (`dwd_prober_runs_not_made_total{cause}` says why).
    NotMadeForRoom,
}

/// Label set `{result}`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RunLabels {
    /// Result.
    pub result: RunResult,
}

/// What became of one Kubernetes Event.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
pub enum EventOutcome {
    /// Written to the apiserver (created, or counted into an existing series).
    Published,
    /// Not queued: the event queue was full (or its worker gone).
    Dropped,
    /// Queued, but the write failed or timed out.
    Failed,
    /// Refused by the apiserver's authorization (403): the RBAC does not allow events there.
    /// Gardener grants core/v1 events in `garden` only, so every events.k8s.io event on a
    /// Cluster or target is refused in a Gardener seed; the core/v1 event on the watchdog's own
    /// pod carries the same story.
    Refused,
}

/// Label set `{outcome}`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EventLabels {
    /// Outcome.
    pub outcome: EventOutcome,
}

/// Why a probe task had to be restarted.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
pub(crate) enum RestartCause {
    /// The task panicked.
    Panicked,
    /// The task returned although nobody stopped it.
    Ended,
}

/// Label set `{cause}`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct RestartLabels {
    /// Why.
    pub cause: RestartCause,
}

/// A probe's right to write its shoot's per-shoot series, from [`Metrics::open_shoot`].
///
/// Writes go through [`Metrics::for_shoot`], which drops them once [`Metrics::forget_shoot`]
/// (or a newer `open_shoot`) revoked the handle: a run or flow that finishes after its probe
/// was removed cannot bring the removed series back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShootSeries {
    labels: ShootLabels,
    id: u64,
}

impl ShootSeries {
    /// The shoot namespace.
    pub fn shoot(&self) -> &str {
        &self.labels.shoot
    }
}

/// Label set `{name}` of `leader_election_master_status`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LeaseLabels {
    /// Name of the leader-election Lease (client-go: the lock's name).
    pub name: String,
}

/// Label set `{code, method, host}` of `rest_client_requests_total`, as client-go's.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    /// HTTP status code, or `<error>` when no response came (connection failed, timed out,
    /// or the caller gave up waiting).
    pub code: String,
    /// HTTP method (`GET`, `PATCH`, …).
    pub method: String,
    /// The apiserver's host:port as the kubeconfig names it (client-go: the URL's host).
    pub host: String,
}

/// `rest_client_requests_total`: one family for the whole process, like client-go's global
/// metrics adapter. Clients are built where no [`Metrics`] is at hand (the shoot
/// configurations the probes keep, `explain`), and every [`Metrics`] of a process shows the
/// same requests, so [`Default`] hands out the one process-wide family.
#[derive(Debug, Clone)]
pub struct RestClientRequests(pub Family<RequestLabels, Counter>);

impl Default for RestClientRequests {
    fn default() -> Self {
        static REQUESTS: std::sync::OnceLock<Family<RequestLabels, Counter>> =
            std::sync::OnceLock::new();
        RestClientRequests(REQUESTS.get_or_init(Family::default).clone())
    }
}

/// All metrics of the process.
#[derive(Debug, Default)]
pub struct Metrics {
    /// Probes running now.
    pub active_probes: Gauge,
    /// Probe runs by result.
    pub probe_runs: Family<RunLabels, Counter>,
    /// API requests made, by API.
    pub api_requests: Family<ApiLabels, Counter>,
    /// 429 responses received, by API.
    pub throttled_responses: Family<ApiLabels, Counter>,
    /// Scale operations by direction, target and outcome.
    pub scale_operations: Family<ScaleOpLabels, Counter>,
    /// Per shoot: probe runs (any result); shows a probe is making progress.
    pub shoot_probe_runs: Family<ShootLabels, Counter>,
    /// Per shoot: API server probe failures.
    pub api_server_probe_failures: Family<ShootLabels, Counter>,
    /// Per shoot: lease probe failures.
    pub lease_probe_failures: Family<ShootLabels, Counter>,
    /// Per shoot: shoot responses cut off because they passed the response limits (a shoot
    /// whose objects are too large to read safely; each also fails its probe run).
    pub oversized_responses: Family<ShootLabels, Counter>,
    /// The process-wide memory budget of the probe runs in flight (bytes held, capacity,
    /// refusals): [`crate::memory_budget`].
    pub run_memory: crate::memory_budget::BudgetMetrics,
    /// Per shoot: last expired-lease fraction.
    pub expired_lease_fraction: Family<ShootLabels, Gauge<f64, AtomicU64>>,
    /// Per shoot: when (Unix seconds) the finding the expired-lease fraction is from was made;
    /// a fraction older than a few intervals is stale (the shoot's runs fail or are not made).
    pub(crate) expired_lease_fraction_timestamp: Family<ShootLabels, Gauge<f64, AtomicU64>>,
    /// Per shoot: 1 while the shoot's last run was not made (or was ended) for want of room in
    /// the runs' memory budget, 0 once a run is admitted and ends on its own.
    pub(crate) shoot_waiting_for_room: Family<ShootLabels, Gauge>,
    /// Per shoot: 1 while a decision is pending for the shoot (its runs wait for room first),
    /// 0 otherwise.
    pub(crate) shoot_decision_pending: Family<ShootLabels, Gauge>,
    /// Per shoot: its slow runs among its last 8 (runs that did not end within the prompt
    /// limit): its place in the runs' memory budget's line.
    pub(crate) shoot_slow_runs: Family<ShootLabels, Gauge>,
    /// Per shoot and zone: last expired-lease fraction of the zone's candidates (at most
    /// [`ZONES_PER_SHOOT_LIMIT`] zones per shoot; written by [`Metrics::set_zone_fractions`]).
    pub(crate) zone_expired_lease_fraction: Family<ShootZoneLabels, Gauge<f64, AtomicU64>>,
    /// Per shoot and zone: 1 while the zone is disrupted, 0 otherwise.
    pub(crate) zone_disrupted: Family<ShootZoneLabels, Gauge>,
    /// Per shoot: scaling flows started, by direction.
    pub scaling_attempts: Family<ShootDirectionLabels, Counter>,
    /// 1 while this replica leads (or acts alone), 0 otherwise.
    pub leader: Gauge,
    /// Duration of probe runs (API-server probe, lease probe; a scaling flow runs beside them,
    /// in the shoot's executor).
    pub probe_run_duration: DurationHistogram,
    /// Weeders running now.
    pub active_weeders: Gauge,
    /// Pods deleted by the weeder, by service.
    pub pods_deleted: Family<ServiceLabels, Counter>,
    /// Deletions of crash-looping pods that failed all their attempts, by service and the
    /// failure's stable category.
    pub(crate) pod_deletion_failures: Family<DeletionFailureLabels, Counter>,
    /// Cluster reconciles.
    pub reconciles: Counter,
    /// Cluster reconcile errors.
    pub reconcile_errors: Counter,
    /// Kubernetes Events by outcome (published, dropped, failed).
    pub events: Family<EventLabels, Counter>,
    /// client-go's `leader_election_master_status{name}`.
    pub leader_election_master_status: Family<LeaseLabels, Gauge>,
    /// client-go's `rest_client_requests_total{code,method,host}`.
    pub rest_client_requests: RestClientRequests,
    /// Probe tasks restarted because they panicked or ended on their own.
    pub(crate) probe_task_restarts: Family<RestartLabels, Counter>,
    /// Shoots whose per-shoot series may be written, with the id of the handle that may and
    /// the zones that have series.
    open_shoots: std::sync::Mutex<std::collections::HashMap<String, OpenShoot>>,
    /// Source of [`ShootSeries`] ids.
    next_series_id: AtomicU64,
}

/// A shoot whose per-shoot series may be written.
#[derive(Debug, Default)]
struct OpenShoot {
    /// The [`ShootSeries`] id that may write.
    id: u64,
    /// Zones with a series now (so a vanished zone's series, and all of them when the probe
    /// is removed, can be dropped).
    zones: std::collections::BTreeSet<String>,
}

/// A histogram of seconds with buckets from 5 ms to ~40 s (probe runs span both).
#[derive(Debug, Clone)]
pub struct DurationHistogram(pub Histogram);

impl Default for DurationHistogram {
    fn default() -> Self {
        DurationHistogram(Histogram::new(exponential_buckets(0.005, 2.0, 14)))
    }
}

/// Label set `{service}`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ServiceLabels {
    /// Configured service name (bounded by the config).
    pub service: String,
}

/// Why a deletion of a crash-looping pod failed, as a stable label value.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
pub(crate) enum DeletionFailure {
    /// No answer within the deletion's timeout.
    Timeout,
    /// 401/403: the weeder may not delete pods there (RBAC).
    Forbidden,
    /// 429: the seed throttled us.
    Throttled,
    /// 5xx from the seed.
    ServerError,
    /// Any other status the seed answered with.
    Refused,
    /// No answer at all: connection, TLS or decoding failed.
    Transport,
}

/// Label set `{service, reason}`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct DeletionFailureLabels {
    /// Configured service name (bounded by the config).
    pub service: String,
    /// The failure's category.
    pub reason: DeletionFailure,
}

impl Metrics {
    /// Registers every metric under the `dwd` prefix.
    pub fn register(&self, registry: &mut Registry) {
        let p = registry
            .sub_registry_with_prefix("dwd")
            .sub_registry_with_prefix("prober");
        self.register_probe_runs(p);
        self.register_run_memory(p);
        self.register_per_shoot(p);
        self.register_zones_and_flows(p);
        let w = registry
            .sub_registry_with_prefix("dwd")
            .sub_registry_with_prefix("weeder");
        self.register_weeder(w);
        self.register_common(registry);
    }

    /// The prober's runs (`dwd_prober_*`): durations, results, scale operations, failures.
    fn register_probe_runs(&self, p: &mut Registry) {
        p.register(
            "probe_run_duration_seconds",
            "Duration of probe runs (the scaling flows run beside them)",
            self.probe_run_duration.0.clone(),
        );
        p.register(
            "active_probes",
            "Probes running now",
            self.active_probes.clone(),
        );
        p.register(
            "probe_runs",
            "Probe runs by result",
            self.probe_runs.clone(),
        );
        p.register(
            "scale_operations",
            "Scale operations by direction, target and outcome",
            self.scale_operations.clone(),
        );
        p.register(
            "shoot_probe_runs",
            "Probe runs per shoot",
            self.shoot_probe_runs.clone(),
        );
        p.register(
            "api_server_probe_failures",
            "API server probe failures per shoot",
            self.api_server_probe_failures.clone(),
        );
        p.register(
            "lease_probe_failures",
            "Lease probe failures per shoot",
            self.lease_probe_failures.clone(),
        );
        p.register(
            "oversized_responses",
            "Shoot responses cut off past the response size limits, per shoot",
            self.oversized_responses.clone(),
        );
    }

    /// The probe runs' memory budget (`dwd_prober_run_memory_*`, `dwd_prober_runs_not_made`).
    fn register_run_memory(&self, p: &mut Registry) {
        p.register(
            "run_memory_held_bytes",
            "Bytes the probe runs in flight hold of the memory budget (reserves and responses)",
            self.run_memory.held.clone(),
        );
        p.register(
            "run_memory_capacity_bytes",
            "The probe runs' memory budget (--run-memory-budget, or a quarter of the container's memory limit)",
            self.run_memory.capacity.clone(),
        );
        p.register(
            "run_memory_waiting_runs",
            "Probe runs waiting for room in the memory budget, by level (pending: a decision is pending for the shoot)",
            self.run_memory.waiting.clone(),
        );
        p.register(
            "runs_not_made",
            "Probe runs not made, or ended, for want of room in the memory budget, by cause (the prober's doing, not the shoot's)",
            self.run_memory.not_made.clone(),
        );
    }

    /// Each shoot's last finding and its place in the memory budget's line.
    fn register_per_shoot(&self, p: &mut Registry) {
        p.register(
            "expired_lease_fraction",
            "Last expired node-lease fraction per shoot",
            self.expired_lease_fraction.clone(),
        );
        p.register(
            "expired_lease_fraction_timestamp_seconds",
            "When (Unix seconds) the finding the shoot's expired-lease fraction is from was made",
            self.expired_lease_fraction_timestamp.clone(),
        );
        p.register(
            "shoot_waiting_for_room",
            "1 while the shoot's last probe run was not made, or was ended, for want of room in the memory budget",
            self.shoot_waiting_for_room.clone(),
        );
        p.register(
            "shoot_slow_runs",
            "The shoot's probe runs among its last 8 that did not end within the prompt limit: its place in the memory budget's line (0 first)",
            self.shoot_slow_runs.clone(),
        );
        p.register(
            "shoot_decision_pending",
            "1 while a decision is pending for the shoot (its probe runs get room first)",
            self.shoot_decision_pending.clone(),
        );
    }

    /// Zones, scaling flows, probe supervision and the Cluster loop.
    fn register_zones_and_flows(&self, p: &mut Registry) {
        p.register(
            "zone_expired_lease_fraction",
            "Last expired node-lease fraction per shoot and zone (node label topology.kubernetes.io/zone)",
            self.zone_expired_lease_fraction.clone(),
        );
        p.register(
            "zone_disrupted",
            "1 while a zone of a shoot is disrupted (its expired fraction reached zoneLeaseFailureFraction), whether or not zonal protection is configured",
            self.zone_disrupted.clone(),
        );
        p.register(
            "scaling_attempts",
            "Scaling flows started per shoot and direction",
            self.scaling_attempts.clone(),
        );
        p.register(
            "probe_task_restarts",
            "Probe tasks restarted because they panicked or ended on their own",
            self.probe_task_restarts.clone(),
        );
        p.register(
            "cluster_reconciles",
            "Cluster reconciles",
            self.reconciles.clone(),
        );
        p.register(
            "cluster_reconcile_errors",
            "Cluster reconcile errors",
            self.reconcile_errors.clone(),
        );
    }

    /// The weeder's (`dwd_weeder_*`).
    fn register_weeder(&self, w: &mut Registry) {
        w.register(
            "active_weeders",
            "Weeders running now",
            self.active_weeders.clone(),
        );
        w.register(
            "pods_deleted",
            "Crash-looping pods deleted by service",
            self.pods_deleted.clone(),
        );
        w.register(
            "pod_deletion_failures",
            "Deletions of crash-looping pods that failed all their attempts, by service and reason",
            self.pod_deletion_failures.clone(),
        );
    }

    /// Both subcommands' (`dwd_*`), and the standard families, without prefix and with
    /// client-go's help texts.
    fn register_common(&self, registry: &mut Registry) {
        let c = registry.sub_registry_with_prefix("dwd");
        c.register(
            "leader",
            "1 while this replica leads (or acts alone without leader election)",
            self.leader.clone(),
        );
        c.register(
            "api_requests",
            "Kubernetes API requests by API",
            self.api_requests.clone(),
        );
        c.register(
            "throttled_responses",
            "429 Too Many Requests responses by API",
            self.throttled_responses.clone(),
        );
        c.register(
            "events",
            "Kubernetes Events by outcome: published, dropped (queue full) or failed",
            self.events.clone(),
        );
        registry.register(
            "leader_election_master_status",
            "Gauge of if the reporting system is master of the relevant lease, 0 indicates backup, 1 indicates master. 'name' is the string used to identify the lease. Please make sure to group by name.",
            self.leader_election_master_status.clone(),
        );
        registry.register(
            "rest_client_requests",
            "Number of HTTP requests, partitioned by status code, method, and host.",
            self.rest_client_requests.0.clone(),
        );
        registry.register_collector(Box::new(ProcessCollector));
    }

    /// Counts one request to `api` (`dwd_api_requests_total{api}`).
    pub(crate) fn count_api_request(&self, api: ApiLabel) {
        self.api_requests.get_or_create(&ApiLabels { api }).inc();
    }

    /// Counts one answer of `api` that throttled us (429, or 503 with `Retry-After`).
    pub(crate) fn count_throttled_response(&self, api: ApiLabel) {
        self.throttled_responses
            .get_or_create(&ApiLabels { api })
            .inc();
    }

    /// Records whether this replica holds the leader-election Lease `lease`.
    pub fn set_leading(&self, lease: &str, leading: bool) {
        self.leader_election_master_status
            .get_or_create(&LeaseLabels {
                name: lease.to_string(),
            })
            .set(i64::from(leading));
    }

    fn lock_open_shoots(
        &self,
    ) -> std::sync::MutexGuard<'_, std::collections::HashMap<String, OpenShoot>> {
        // Only whole entries are inserted or removed: a panic elsewhere can't leave one torn.
        self.open_shoots
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Lets a new probe of `shoot` write its per-shoot series; handles of earlier probes of
    /// the same shoot stop counting.
    pub(crate) fn open_shoot(&self, shoot: &str) -> ShootSeries {
        let id = self
            .next_series_id
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut open = self.lock_open_shoots();
        let old = open.insert(
            shoot.to_string(),
            OpenShoot {
                id,
                zones: Default::default(),
            },
        );
        // A probe replaced without a removal: its zones' series go with it.
        if let Some(old) = old {
            self.remove_zone_series(shoot, old.zones.iter());
        }
        drop(open);
        ShootSeries {
            labels: ShootLabels {
                shoot: shoot.to_string(),
            },
            id,
        }
    }

    /// Runs `write` with the shoot's labels if `series` still may write (its probe was not
    /// removed meanwhile); otherwise does nothing. The check and the write happen under the
    /// lock [`Self::forget_shoot`] takes, so no write can slip in after the series were dropped.
    pub(crate) fn for_shoot<R>(&self, series: &ShootSeries, write: impl FnOnce(&ShootLabels) -> R) {
        let open = self.lock_open_shoots();
        if open.get(&series.labels.shoot).map(|o| o.id) == Some(series.id) {
            write(&series.labels);
        }
    }

    /// Sets the per-zone series of `series`'s shoot to `zones` (zone, expired fraction,
    /// disrupted): at most [`ZONES_PER_SHOOT_LIMIT`], disrupted first; the series of zones no
    /// longer given are dropped. Nothing happens once the probe was removed.
    pub(crate) fn set_zone_fractions<'a>(
        &self,
        series: &ShootSeries,
        zones: impl IntoIterator<Item = (&'a str, f64, bool)>,
    ) {
        let mut zones: Vec<(&str, f64, bool)> = zones.into_iter().collect();
        zones.sort_by(|a, b| b.2.cmp(&a.2).then_with(|| a.0.cmp(b.0)));
        let mut kept = std::collections::BTreeSet::new();
        let mut open = self.lock_open_shoots();
        let Some(entry) = open.get_mut(&series.labels.shoot) else {
            return;
        };
        if entry.id != series.id {
            return;
        }
        for (zone, fraction, disrupted) in zones {
            if kept.len() >= ZONES_PER_SHOOT_LIMIT {
                break;
            }
            let zone = crate::text::truncate(zone, ZONE_LABEL_LIMIT).into_owned();
            if !kept.insert(zone.clone()) {
                continue;
            }
            let labels = ShootZoneLabels {
                shoot: series.labels.shoot.clone(),
                zone,
            };
            self.zone_expired_lease_fraction
                .get_or_create(&labels)
                .set(fraction);
            self.zone_disrupted
                .get_or_create(&labels)
                .set(i64::from(disrupted));
        }
        let gone: Vec<String> = entry.zones.difference(&kept).cloned().collect();
        self.remove_zone_series(&series.labels.shoot, gone.iter());
        entry.zones = kept;
    }

    /// Every lease of the shoot is fresh (its nodes were not listed): each zone with a series
    /// is at 0 and not disrupted.
    pub(crate) fn zones_all_fresh(&self, series: &ShootSeries) {
        let open = self.lock_open_shoots();
        let Some(entry) = open.get(&series.labels.shoot) else {
            return;
        };
        if entry.id != series.id {
            return;
        }
        for zone in &entry.zones {
            let labels = ShootZoneLabels {
                shoot: series.labels.shoot.clone(),
                zone: zone.clone(),
            };
            self.zone_expired_lease_fraction
                .get_or_create(&labels)
                .set(0.0);
            self.zone_disrupted.get_or_create(&labels).set(0);
        }
    }

    fn remove_zone_series<'a>(&self, shoot: &str, zones: impl Iterator<Item = &'a String>) {
        for zone in zones {
            let labels = ShootZoneLabels {
                shoot: shoot.to_string(),
                zone: zone.clone(),
            };
            self.zone_expired_lease_fraction.remove(&labels);
            self.zone_disrupted.remove(&labels);
        }
    }

    /// Drops every per-shoot series of `shoot` (its probe was removed) and revokes every
    /// [`ShootSeries`] handle of it.
    pub(crate) fn forget_shoot(&self, shoot: &str) {
        let mut open = self.lock_open_shoots();
        if let Some(gone) = open.remove(shoot) {
            self.remove_zone_series(shoot, gone.zones.iter());
        }
        let labels = ShootLabels {
            shoot: shoot.to_string(),
        };
        self.shoot_probe_runs.remove(&labels);
        self.api_server_probe_failures.remove(&labels);
        self.lease_probe_failures.remove(&labels);
        self.oversized_responses.remove(&labels);
        self.expired_lease_fraction.remove(&labels);
        self.expired_lease_fraction_timestamp.remove(&labels);
        self.shoot_waiting_for_room.remove(&labels);
        self.shoot_decision_pending.remove(&labels);
        self.shoot_slow_runs.remove(&labels);
        for direction in [DirectionLabel::Up, DirectionLabel::Down] {
            self.scaling_attempts.remove(&ShootDirectionLabels {
                shoot: shoot.to_string(),
                direction,
            });
        }
    }
}

/// The process metrics client_golang's process collector exports on Linux (which the
/// reference's controller-runtime registers), read from `/proc` at each scrape.
///
/// Ours because the maintained collector for prometheus-client (`kubert-prometheus-process`)
/// is built on prometheus-client 0.23, whose `Collector` trait is not 0.25's, and pulls in
/// `procfs`; the six values are a few lines of `/proc` parsing. A value that can't be read
/// (not Linux, `/proc` not mounted) is left out of the scrape rather than reported as 0.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct ProcessCollector;

/// One reading of `/proc/self`.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub(crate) struct ProcessStats {
    /// User + system CPU seconds.
    pub(crate) cpu_seconds: Option<f64>,
    /// Resident set size in bytes.
    pub(crate) resident_memory_bytes: Option<i64>,
    /// Virtual memory size in bytes.
    pub(crate) virtual_memory_bytes: Option<i64>,
    /// Open file descriptors.
    pub(crate) open_fds: Option<i64>,
    /// The soft limit on open file descriptors.
    pub(crate) max_fds: Option<i64>,
    /// Start time, seconds since the Unix epoch.
    pub(crate) start_time_seconds: Option<f64>,
}

impl ProcessStats {
    /// Reads this process's statistics.
    pub(crate) fn read() -> ProcessStats {
        let stat = std::fs::read_to_string("/proc/self/stat").ok();
        let mut stats = stat
            .as_deref()
            .map(|s| Self::from_stat(s, clock_ticks(), page_size(), boot_time()))
            .unwrap_or_default();
        stats.open_fds = std::fs::read_dir("/proc/self/fd")
            .ok()
            .and_then(|dir| i64::try_from(dir.count()).ok());
        stats.max_fds = std::fs::read_to_string("/proc/self/limits")
            .ok()
            .and_then(|limits| max_open_files(&limits));
        stats
    }

    /// Parses `/proc/<pid>/stat` (proc(5)): `utime` and `stime` (fields 14 and 15, in clock
    /// ticks), `starttime` (22, ticks after boot), `vsize` (23, bytes), `rss` (24, pages).
    pub(crate) fn from_stat(
        stat: &str,
        ticks: Option<f64>,
        page: Option<i64>,
        boot: Option<f64>,
    ) -> ProcessStats {
        // The command name (field 2) is in parentheses and may contain anything, spaces and
        // parentheses included: the fields that follow start after the last ')'.
        let Some(rest) = stat.rfind(')').map(|at| &stat[at + 1..]) else {
            return ProcessStats::default();
        };
        // `rest` starts with field 3 (state): field n is at index n - 3.
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let field = |n: usize| fields.get(n - 3).and_then(|f| f.parse::<u64>().ok());
        let seconds = |t: u64| ticks.map(|hz| t as f64 / hz);
        ProcessStats {
            cpu_seconds: field(14)
                .zip(field(15))
                .and_then(|(u, s)| seconds(u.saturating_add(s))),
            start_time_seconds: field(22)
                .and_then(seconds)
                .zip(boot)
                .map(|(since_boot, boot)| boot + since_boot),
            virtual_memory_bytes: field(23).and_then(|v| i64::try_from(v).ok()),
            resident_memory_bytes: field(24)
                .and_then(|p| i64::try_from(p).ok())
                .zip(page)
                .map(|(p, size)| p.saturating_mul(size)),
            open_fds: None,
            max_fds: None,
        }
    }
}

/// The soft "Max open files" of `/proc/<pid>/limits`; "unlimited" is `i64::MAX`.
pub(crate) fn max_open_files(limits: &str) -> Option<i64> {
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    let soft = line
        .trim_start_matches("Max open files")
        .split_whitespace()
        .next()?;
    if soft == "unlimited" {
        return Some(i64::MAX);
    }
    soft.parse().ok()
}

/// `btime` of `/proc/stat`: boot time, seconds since the Unix epoch (read once).
fn boot_time() -> Option<f64> {
    static BOOT: std::sync::OnceLock<Option<f64>> = std::sync::OnceLock::new();
    *BOOT.get_or_init(|| {
        let stat = std::fs::read_to_string("/proc/stat").ok()?;
        stat.lines()
            .find_map(|l| l.strip_prefix("btime "))
            .and_then(|v| v.trim().parse::<f64>().ok())
    })
}

/// Clock ticks per second (`sysconf(_SC_CLK_TCK)`), the unit of `/proc` CPU times.
fn clock_ticks() -> Option<f64> {
    let hz = rustix::param::clock_ticks_per_second();
    (hz > 0).then_some(hz as f64)
}

/// Page size in bytes (`sysconf(_SC_PAGESIZE)`), the unit of `/proc`'s `rss`.
fn page_size() -> Option<i64> {
    i64::try_from(rustix::param::page_size())
        .ok()
        .filter(|size| *size > 0)
}

/// (name, help) of the process gauges, as client_golang's process collector has them.
const PROCESS_GAUGES: [(&str, &str); 5] = [
    ("process_open_fds", "Number of open file descriptors."),
    (
        "process_max_fds",
        "Maximum number of open file descriptors.",
    ),
    (
        "process_virtual_memory_bytes",
        "Virtual memory size in bytes.",
    ),
    (
        "process_resident_memory_bytes",
        "Resident memory size in bytes.",
    ),
    (
        "process_start_time_seconds",
        "Start time of the process since unix epoch in seconds.",
    ),
];

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let stats = ProcessStats::read();
        if let Some(cpu) = stats.cpu_seconds {
            // A counter: the text encoding adds `_total`.
            let counter = ConstCounter::new(cpu);
            counter.encode(encoder.encode_descriptor(
                "process_cpu_seconds",
                "Total user and system CPU time spent in seconds.",
                None,
                counter.metric_type(),
            )?)?;
        }
        let as_f64 = |v: Option<i64>| v.map(|v| v as f64);
        // In the order of PROCESS_GAUGES.
        let values = [
            as_f64(stats.open_fds),
            as_f64(stats.max_fds),
            as_f64(stats.virtual_memory_bytes),
            as_f64(stats.resident_memory_bytes),
            stats.start_time_seconds,
        ];
        for ((name, help), value) in PROCESS_GAUGES.into_iter().zip(values) {
            if let Some(value) = value {
                let gauge = ConstGauge::new(value);
                gauge.encode(encoder.encode_descriptor(
                    name,
                    help,
                    None,
                    gauge.metric_type(),
                )?)?;
            }
        }
        Ok(())
    }
}

/// A tower layer counting every request of a Kubernetes client into
/// `rest_client_requests_total`, under the apiserver's `host`.
///
/// Requests are counted when they end: by the response's status code, or `<error>` when the
/// service failed or the caller dropped the request before an answer (a probe timeout), as
/// client-go counts a request whose context expired. Placed inside any rate limiter, so only
/// requests that were sent count.
#[derive(Debug, Clone)]
pub(crate) struct CountRequestsLayer {
    host: String,
    requests: RestClientRequests,
}

impl CountRequestsLayer {
    /// Counts into the process-wide family under `host`.
    pub(crate) fn new(host: String) -> Self {
        CountRequestsLayer {
            host,
            requests: RestClientRequests::default(),
        }
    }

    /// client-go's `host` label for a cluster URL: host and port as written (no port when
    /// the URL has none, like Go's `URL.Host`).
    pub(crate) fn host_of(url: &http::Uri) -> String {
        match (url.host(), url.port_u16()) {
            (Some(host), Some(port)) => format!("{host}:{port}"),
            (Some(host), None) => host.to_string(),
            (None, _) => String::new(),
        }
    }
}

impl<S> tower::Layer<S> for CountRequestsLayer {
    type Service = CountRequests<S>;

    fn layer(&self, inner: S) -> CountRequests<S> {
        CountRequests {
            inner,
            layer: self.clone(),
        }
    }
}

/// The service of [`CountRequestsLayer`].
#[derive(Debug, Clone)]
pub(crate) struct CountRequests<S> {
    inner: S,
    layer: CountRequestsLayer,
}

/// Counts one request exactly once: with the code it ended with, or `<error>` if it ended
/// without one (including being dropped while in flight).
struct CountOnDrop {
    requests: RestClientRequests,
    method: String,
    host: String,
    code: Option<String>,
}

impl CountOnDrop {
    /// The request got a response with `status`.
    fn answered(&mut self, status: http::StatusCode) {
        self.code = Some(status.as_u16().to_string());
    }
}

impl Drop for CountOnDrop {
    fn drop(&mut self) {
        let code = self.code.take().unwrap_or_else(|| "<error>".to_string());
        self.requests
            .0
            .get_or_create(&RequestLabels {
                code,
                method: std::mem::take(&mut self.method),
                host: std::mem::take(&mut self.host),
            })
            .inc();
    }
}

impl<S, ReqBody, ResBody> tower::Service<http::Request<ReqBody>> for CountRequests<S>
where
    S: tower::Service<http::Request<ReqBody>, Response = http::Response<ResBody>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<ReqBody>) -> Self::Future {
        let mut count = CountOnDrop {
            requests: self.layer.requests.clone(),
            method: request.method().as_str().to_string(),
            host: self.layer.host.clone(),
            code: None,
        };
        let response = self.inner.call(request);
        Box::pin(async move {
            let result = response.await;
            if let Ok(response) = &result {
                count.answered(response.status());
            }
            result
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Gives every family a series (families without series are not encoded at all), the
    /// per-shoot ones for `shoot`.
    fn one_series_in_every_family(m: &Metrics, shoot: &ShootLabels) {
        m.shoot_probe_runs.get_or_create(shoot).inc();
        m.api_server_probe_failures.get_or_create(shoot).inc();
        m.lease_probe_failures.get_or_create(shoot).inc();
        m.oversized_responses.get_or_create(shoot).inc();
        m.expired_lease_fraction.get_or_create(shoot).set(0.5);
        m.expired_lease_fraction_timestamp
            .get_or_create(shoot)
            .set(1.7e9);
        m.shoot_waiting_for_room.get_or_create(shoot).set(1);
        m.shoot_decision_pending.get_or_create(shoot).set(1);
        m.shoot_slow_runs.get_or_create(shoot).set(2);
        m.run_memory
            .waiting
            .get_or_create(&crate::memory_budget::LevelLabels {
                level: crate::memory_budget::Level::Pending,
            })
            .set(0);
        m.run_memory
            .not_made
            .get_or_create(&crate::memory_budget::CauseLabels {
                cause: crate::memory_budget::NotMadeCause::EndedForRoom,
            })
            .inc();
        m.scaling_attempts
            .get_or_create(&ShootDirectionLabels {
                shoot: shoot.shoot.clone(),
                direction: DirectionLabel::Down,
            })
            .inc();
        m.probe_runs
            .get_or_create(&RunLabels {
                result: RunResult::ScaleUp,
            })
            .inc();
        m.scale_operations
            .get_or_create(&ScaleOpLabels {
                direction: DirectionLabel::Up,
                target: "kcm".into(),
                outcome: Outcome::Scaled,
            })
            .inc();
        m.probe_run_duration.0.observe(0.2);
        m.pods_deleted
            .get_or_create(&ServiceLabels {
                service: "etcd".into(),
            })
            .inc();
        m.pod_deletion_failures
            .get_or_create(&DeletionFailureLabels {
                service: "etcd".into(),
                reason: DeletionFailure::Forbidden,
            })
            .inc();
        m.api_requests
            .get_or_create(&ApiLabels {
                api: ApiLabel::Seed,
            })
            .inc();
        m.throttled_responses
            .get_or_create(&ApiLabels {
                api: ApiLabel::Shoot,
            })
            .inc();
        m.events
            .get_or_create(&EventLabels {
                outcome: EventOutcome::Dropped,
            })
            .inc();
    }

    #[test]
    fn every_metric_is_exposed_and_per_shoot_series_are_forgotten() {
        let m = Metrics::default();
        let mut registry = Registry::default();
        m.register(&mut registry);
        let shoot = ShootLabels {
            shoot: "shoot--p--s".into(),
        };
        one_series_in_every_family(&m, &shoot);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).expect("encode");
        for name in [
            "dwd_prober_active_probes",
            "dwd_prober_probe_run_duration_seconds_bucket",
            "dwd_prober_run_memory_held_bytes",
            "dwd_prober_run_memory_capacity_bytes",
            "dwd_prober_run_memory_waiting_runs{level=\"pending\"} 0",
            "dwd_prober_runs_not_made_total{cause=\"ended_for_room\"} 1",
            "dwd_prober_expired_lease_fraction_timestamp_seconds{shoot=\"shoot--p--s\"} 1700000000",
            "dwd_prober_shoot_waiting_for_room{shoot=\"shoot--p--s\"} 1",
            "dwd_prober_shoot_decision_pending{shoot=\"shoot--p--s\"} 1",
            "dwd_prober_shoot_slow_runs{shoot=\"shoot--p--s\"} 2",
            "dwd_leader",
            "dwd_prober_probe_runs",
            "dwd_prober_scale_operations",
            "dwd_prober_shoot_probe_runs_total{shoot=\"shoot--p--s\"} 1",
            "dwd_prober_api_server_probe_failures_total{shoot=\"shoot--p--s\"} 1",
            "dwd_prober_lease_probe_failures_total{shoot=\"shoot--p--s\"} 1",
            "dwd_prober_oversized_responses_total{shoot=\"shoot--p--s\"} 1",
            "dwd_prober_expired_lease_fraction{shoot=\"shoot--p--s\"} 0.5",
            "dwd_prober_scaling_attempts_total{shoot=\"shoot--p--s\",direction=\"Down\"} 1",
            "dwd_prober_cluster_reconciles",
            "dwd_weeder_active_weeders",
            "dwd_weeder_pods_deleted",
            "dwd_weeder_pod_deletion_failures_total{service=\"etcd\",reason=\"Forbidden\"} 1",
            "dwd_api_requests",
            "dwd_throttled_responses",
            "dwd_events_total{outcome=\"Dropped\"} 1",
        ] {
            assert!(text.contains(name), "missing {name} in\n{text}");
        }
        m.forget_shoot("shoot--p--s");
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).expect("encode");
        assert!(
            !text.contains("shoot--p--s"),
            "per-shoot series left behind:\n{text}"
        );
    }

    #[test]
    fn zone_series_are_bounded_replaced_and_forgotten_with_their_shoot() {
        let m = Metrics::default();
        let mut registry = Registry::default();
        m.register(&mut registry);
        let scrape = |registry: &Registry| {
            let mut text = String::new();
            prometheus_client::encoding::text::encode(&mut text, registry).unwrap();
            text.lines()
                .filter(|l| l.starts_with("dwd_prober_zone_"))
                .map(str::to_owned)
                .collect::<Vec<_>>()
        };
        let series = m.open_shoot("s");
        m.set_zone_fractions(&series, [("b", 0.0, false), ("a", 1.0, true)]);
        let lines = scrape(&registry);
        assert!(
            lines.contains(
                &"dwd_prober_zone_expired_lease_fraction{shoot=\"s\",zone=\"a\"} 1.0".to_owned()
            ),
            "{lines:?}"
        );
        assert!(
            lines.contains(&"dwd_prober_zone_disrupted{shoot=\"s\",zone=\"a\"} 1".to_owned()),
            "{lines:?}"
        );
        // A hostile shoot's thousand zones: the disrupted one first, then by name, at most
        // the limit; a zone no longer given loses its series.
        let many: Vec<String> = (0..1000)
            .map(|i| format!("z{i:04}{}", "x".repeat(100)))
            .collect();
        let mut zones: Vec<(&str, f64, bool)> =
            many.iter().map(|z| (z.as_str(), 0.0, false)).collect();
        zones.push(("zzz-down", 1.0, true));
        m.set_zone_fractions(&series, zones);
        let lines = scrape(&registry);
        let fractions: Vec<&String> = lines
            .iter()
            .filter(|l| l.starts_with("dwd_prober_zone_expired"))
            .collect();
        assert_eq!(fractions.len(), ZONES_PER_SHOOT_LIMIT, "{lines:?}");
        assert!(fractions.iter().any(|l| l.contains("zone=\"zzz-down\"")));
        assert!(
            !lines.iter().any(|l| l.contains("zone=\"a\"")),
            "zone a is gone"
        );
        assert!(
            fractions.iter().all(|l| l.len() < 200),
            "zone names are cut: {fractions:?}"
        );
        // All fresh: every known zone at 0.
        m.zones_all_fresh(&series);
        assert!(
            scrape(&registry)
                .iter()
                .filter(|l| l.starts_with("dwd_prober_zone_disrupted"))
                .all(|l| l.ends_with(" 0"))
        );
        m.forget_shoot("s");
        assert!(scrape(&registry).is_empty(), "{:?}", scrape(&registry));
        // A revoked handle writes nothing.
        m.set_zone_fractions(&series, [("a", 1.0, true)]);
        assert!(scrape(&registry).is_empty());
    }

    #[test]
    fn a_revoked_series_handle_never_brings_removed_series_back() {
        let m = Metrics::default();
        let count = |series: &ShootSeries| {
            m.for_shoot(series, |l| m.shoot_probe_runs.get_or_create(l).inc());
        };
        let runs = |shoot: &str| {
            m.shoot_probe_runs
                .get(&ShootLabels {
                    shoot: shoot.into(),
                })
                .map(|c| c.get())
        };
        let old = m.open_shoot("a");
        count(&old);
        assert_eq!(runs("a"), Some(1));
        // Removed: a run finishing afterwards writes nothing.
        m.forget_shoot("a");
        count(&old);
        assert_eq!(runs("a"), None);
        // A new probe of the same shoot counts; the old one's late writes still don't.
        let new = m.open_shoot("a");
        count(&old);
        assert_eq!(runs("a"), None);
        count(&new);
        assert_eq!(runs("a"), Some(1));
        assert_eq!(new.shoot(), "a");
    }

    /// The value of the sample line starting with `prefix` (name and labels).
    fn sample(text: &str, prefix: &str) -> Option<f64> {
        text.lines()
            .find(|l| l.starts_with(prefix))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
    }

    #[test]
    fn process_metrics_are_read_from_proc_at_each_scrape() {
        let m = Metrics::default();
        let mut registry = Registry::default();
        m.register(&mut registry);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).expect("encode");
        let value = |name: &str| {
            sample(&text, &format!("{name} ")).unwrap_or_else(|| panic!("no {name} in\n{text}"))
        };
        assert!(
            text.contains("# TYPE process_cpu_seconds counter"),
            "{text}"
        );
        // A test process may not have used a whole clock tick yet.
        assert!(value("process_cpu_seconds_total") >= 0.0);
        assert!(value("process_resident_memory_bytes") > 1e6);
        assert!(value("process_virtual_memory_bytes") >= value("process_resident_memory_bytes"));
        assert!(value("process_open_fds") >= 3.0);
        assert!(value("process_max_fds") >= value("process_open_fds"));
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock")
            .as_secs_f64();
        let started = value("process_start_time_seconds");
        assert!(
            started > now - 3600.0 && started <= now + 1.0,
            "{started} vs {now}"
        );
    }

    #[test]
    fn proc_stat_and_limits_parse_like_client_golang() {
        // A command name with spaces and parentheses; utime 250 + stime 150 ticks, started
        // 1000 ticks after boot, 200 MiB virtual, 5000 pages resident.
        let stat = "4242 (dwd (x) y) S 1 4242 4242 0 -1 4194560 900 0 0 0 250 150 0 0 20 0 9 0 1000 209715200 5000 18446744073709551615";
        let stats = ProcessStats::from_stat(stat, Some(100.0), Some(4096), Some(1_700_000_000.0));
        assert_eq!(stats.cpu_seconds, Some(4.0));
        assert_eq!(stats.start_time_seconds, Some(1_700_000_010.0));
        assert_eq!(stats.virtual_memory_bytes, Some(209_715_200));
        assert_eq!(stats.resident_memory_bytes, Some(5000 * 4096));
        assert_eq!(
            ProcessStats::from_stat("garbage", Some(100.0), None, None),
            ProcessStats::default()
        );
        let limits = "Limit                     Soft Limit           Hard Limit           Units\n\
                      Max open files            1024                 524288               files\n";
        assert_eq!(max_open_files(limits), Some(1024));
        assert_eq!(
            max_open_files(
                "Max open files            unlimited            unlimited            files"
            ),
            Some(i64::MAX)
        );
        assert_eq!(max_open_files("nothing"), None);
    }

    /// An apiserver for the request counter: `/fail` fails, `/hang` never answers, a `PATCH`
    /// is answered 429, anything else 200.
    async fn answer(req: http::Request<()>) -> Result<http::Response<()>, &'static str> {
        match req.uri().path() {
            "/fail" => Err("connection refused"),
            "/hang" => std::future::pending().await,
            _ => Ok(http::Response::builder()
                .status(if req.method() == http::Method::PATCH {
                    429
                } else {
                    200
                })
                .body(())
                .expect("response")),
        }
    }

    fn request(method: http::Method, path: &str) -> http::Request<()> {
        http::Request::builder()
            .method(method)
            .uri(path)
            .body(())
            .expect("request")
    }

    #[tokio::test]
    async fn requests_are_counted_by_code_method_and_host_once_each() {
        use tower::{Layer, Service, ServiceExt};
        let m = Metrics::default();
        let mut registry = Registry::default();
        m.register(&mut registry);
        m.set_leading("dwd-prober-leader-election", true);
        m.set_leading("other-lease", false);

        // A host of this test only: the family is process-wide.
        let host =
            CountRequestsLayer::host_of(&"https://count-test.invalid:6443".parse().expect("uri"));
        assert_eq!(host, "count-test.invalid:6443");
        assert_eq!(
            CountRequestsLayer::host_of(&"https://10.0.0.1".parse().expect("uri")),
            "10.0.0.1"
        );
        let layer = CountRequestsLayer::new(host);
        let mut svc = layer.layer(tower::service_fn(answer));
        // (method, path, whether the request fails: no answer)
        let sent = [
            (http::Method::GET, "/version", false),
            (http::Method::GET, "/version", false),
            (http::Method::PATCH, "/x", false),
            (http::Method::GET, "/fail", true),
        ];
        for (method, path, fails) in sent {
            let result = svc
                .ready()
                .await
                .expect("ready")
                .call(request(method, path))
                .await;
            assert_eq!(result.is_err(), fails, "{path}: {result:?}");
        }
        // Dropped in flight (a probe timeout): counted as an error too.
        let hang = svc
            .ready()
            .await
            .expect("ready")
            .call(request(http::Method::DELETE, "/hang"));
        assert!(
            tokio::time::timeout(std::time::Duration::from_millis(1), hang)
                .await
                .is_err()
        );

        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).expect("encode");
        for (line, want) in [
            (
                r#"rest_client_requests_total{code="200",method="GET",host="count-test.invalid:6443"}"#,
                2.0,
            ),
            (
                r#"rest_client_requests_total{code="429",method="PATCH",host="count-test.invalid:6443"}"#,
                1.0,
            ),
            (
                r#"rest_client_requests_total{code="<error>",method="GET",host="count-test.invalid:6443"}"#,
                1.0,
            ),
            (
                r#"rest_client_requests_total{code="<error>",method="DELETE",host="count-test.invalid:6443"}"#,
                1.0,
            ),
            (
                r#"leader_election_master_status{name="dwd-prober-leader-election"}"#,
                1.0,
            ),
            (r#"leader_election_master_status{name="other-lease"}"#, 0.0),
        ] {
            assert_eq!(sample(&text, line), Some(want), "{line} in\n{text}");
        }
    }
}
