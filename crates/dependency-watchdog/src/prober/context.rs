//! What every probe of the prober shares: one [`ProberContext`] in an `Arc`, made once at
//! start ([`super::start`]).

use std::sync::Arc;

use dwd_core::ProberConfig;
use kube::Client;

use super::seed_caches::SeedCaches;
use crate::decisions::DecisionLog;
use crate::memory_budget::MemoryBudget;
use crate::metrics::Metrics;
use crate::observe::events::Events;

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
    /// The one pool of bytes every probe run in flight is admitted to and charged against
    /// ([`crate::memory_budget`]).
    pub(crate) memory: Arc<MemoryBudget>,
    /// Where decision records go: log lines and a ring per shoot ([`crate::decisions`]).
    pub decisions: Arc<DecisionLog>,
}

/// What the prober's unit tests share.
#[cfg(test)]
pub(crate) mod test_support {
    use std::sync::Arc;

    use super::ProberContext;
    use crate::client::cache::Cache;
    use crate::metrics::Metrics;
    use crate::observe::events::Events;
    use crate::prober::seed_caches::SeedCaches;

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
            memory: crate::memory_budget::MemoryBudget::unbounded(),
            decisions: Arc::new(crate::decisions::DecisionLog::new(1)),
        })
    }
}
