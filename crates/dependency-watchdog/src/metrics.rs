//! Prometheus metrics (prometheus-client), registered under the `dwd` prefix.
//!
//! The redesign document promised these and the reference never shipped them. Per-shoot
//! series carry a `shoot` label and are removed when the shoot's probe is removed, so the
//! label cardinality stays bounded by the shoots this seed hosts.

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;

/// Label set `{shoot}`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ShootLabels {
    /// Shoot namespace in the seed.
    pub shoot: String,
}

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
    /// Lease probe decided not to scale (single candidate, hysteresis).
    NoScaling,
    /// The API server probe failed.
    ApiServerProbeFailed,
    /// The lease probe failed.
    LeaseProbeFailed,
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
}

/// Label set `{outcome}`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EventLabels {
    /// Outcome.
    pub outcome: EventOutcome,
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
    /// Per shoot: last expired-lease fraction.
    pub expired_lease_fraction: Family<ShootLabels, Gauge<f64, AtomicU64>>,
    /// Per shoot: scaling flows started, by direction.
    pub scaling_attempts: Family<ShootDirectionLabels, Counter>,
    /// 1 while this replica leads (or acts alone), 0 otherwise.
    pub leader: Gauge,
    /// Duration of probe runs (API-server probe, lease probe and any scaling flow).
    pub probe_run_duration: DurationHistogram,
    /// Weeders running now.
    pub active_weeders: Gauge,
    /// Pods deleted by the weeder, by service.
    pub pods_deleted: Family<ServiceLabels, Counter>,
    /// Cluster reconciles.
    pub reconciles: Counter,
    /// Cluster reconcile errors.
    pub reconcile_errors: Counter,
    /// Kubernetes Events by outcome (published, dropped, failed).
    pub events: Family<EventLabels, Counter>,
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

impl Metrics {
    /// Registers every metric under the `dwd` prefix.
    pub fn register(&self, registry: &mut Registry) {
        let r = registry.sub_registry_with_prefix("dwd");
        let p = r.sub_registry_with_prefix("prober");
        p.register(
            "probe_run_duration_seconds",
            "Duration of probe runs, including any scaling flow",
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
            "expired_lease_fraction",
            "Last expired node-lease fraction per shoot",
            self.expired_lease_fraction.clone(),
        );
        p.register(
            "scaling_attempts",
            "Scaling flows started per shoot and direction",
            self.scaling_attempts.clone(),
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
        let w = registry
            .sub_registry_with_prefix("dwd")
            .sub_registry_with_prefix("weeder");
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
    }

    /// Drops every per-shoot series of `shoot` (its probe was removed).
    pub fn forget_shoot(&self, shoot: &str) {
        let labels = ShootLabels {
            shoot: shoot.to_string(),
        };
        self.shoot_probe_runs.remove(&labels);
        self.api_server_probe_failures.remove(&labels);
        self.lease_probe_failures.remove(&labels);
        self.expired_lease_fraction.remove(&labels);
        for direction in [DirectionLabel::Up, DirectionLabel::Down] {
            self.scaling_attempts.remove(&ShootDirectionLabels {
                shoot: shoot.to_string(),
                direction,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_metric_is_exposed_and_per_shoot_series_are_forgotten() {
        let m = Metrics::default();
        let mut registry = Registry::default();
        m.register(&mut registry);
        let shoot = ShootLabels {
            shoot: "shoot--p--s".into(),
        };
        m.shoot_probe_runs.get_or_create(&shoot).inc();
        m.api_server_probe_failures.get_or_create(&shoot).inc();
        m.lease_probe_failures.get_or_create(&shoot).inc();
        m.expired_lease_fraction.get_or_create(&shoot).set(0.5);
        m.scaling_attempts
            .get_or_create(&ShootDirectionLabels {
                shoot: shoot.shoot.clone(),
                direction: DirectionLabel::Down,
            })
            .inc();
        // Families without series are not encoded at all; give each one a series.
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
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).expect("encode");
        for name in [
            "dwd_prober_active_probes",
            "dwd_prober_probe_run_duration_seconds_bucket",
            "dwd_leader",
            "dwd_prober_probe_runs",
            "dwd_prober_scale_operations",
            "dwd_prober_shoot_probe_runs_total{shoot=\"shoot--p--s\"} 1",
            "dwd_prober_api_server_probe_failures_total{shoot=\"shoot--p--s\"} 1",
            "dwd_prober_lease_probe_failures_total{shoot=\"shoot--p--s\"} 1",
            "dwd_prober_expired_lease_fraction{shoot=\"shoot--p--s\"} 0.5",
            "dwd_prober_scaling_attempts_total{shoot=\"shoot--p--s\",direction=\"Down\"} 1",
            "dwd_prober_cluster_reconciles",
            "dwd_weeder_active_weeders",
            "dwd_weeder_pods_deleted",
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
}
