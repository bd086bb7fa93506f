//! The registry of running probes: at most one per shoot namespace.
//!
//! The Cluster controller tells the manager what each shoot should have (`ensure`/`remove`);
//! the manager starts, restarts (settings changed, or the task died) and cancels probe tasks.
//! A removed probe stops at once and never scales anything on its way out.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use dwd_core::EffectiveProbeSettings;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::ProberContext;
use super::probe::Probe;

struct RunningProbe {
    settings: EffectiveProbeSettings,
    cluster_uid: Option<String>,
    cancel: CancellationToken,
    task: JoinHandle<()>,
}

/// What `ensure` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EnsureOutcome {
    /// A probe was started.
    Started,
    /// The probe's settings or Cluster changed (or it had died) and it was restarted.
    Restarted,
    /// The running probe already has these settings.
    Unchanged,
}

/// Running probes by shoot namespace.
pub struct ProbeManager {
    ctx: Arc<ProberContext>,
    probes: Mutex<HashMap<String, RunningProbe>>,
    shutdown: CancellationToken,
}

impl ProbeManager {
    /// A manager whose probes all stop when `shutdown` is cancelled.
    pub fn new(ctx: Arc<ProberContext>, shutdown: CancellationToken) -> Self {
        ProbeManager {
            ctx,
            probes: Mutex::new(HashMap::new()),
            shutdown,
        }
    }

    fn probes(&self) -> MutexGuard<'_, HashMap<String, RunningProbe>> {
        self.probes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Makes sure `namespace` has a probe with `settings`, for the Cluster with `cluster_uid`
    /// (its events name the Cluster by UID; a re-created Cluster gets a new probe).
    pub fn ensure(
        &self,
        namespace: &str,
        settings: EffectiveProbeSettings,
        cluster_uid: Option<String>,
    ) -> EnsureOutcome {
        let mut probes = self.probes();
        let outcome = match probes.get(namespace) {
            Some(p)
                if p.settings == settings
                    && p.cluster_uid == cluster_uid
                    && !p.task.is_finished() =>
            {
                return EnsureOutcome::Unchanged;
            }
            Some(p) => {
                p.cancel.cancel();
                EnsureOutcome::Restarted
            }
            None => EnsureOutcome::Started,
        };
        let cancel = self.shutdown.child_token();
        let probe = Probe {
            namespace: namespace.to_string(),
            settings: settings.clone(),
            cluster_uid: cluster_uid.clone(),
            ctx: self.ctx.clone(),
            cancel: cancel.clone(),
            shoot_config: Default::default(),
        };
        let task = tokio::spawn(probe.run());
        probes.insert(
            namespace.to_string(),
            RunningProbe {
                settings,
                cluster_uid,
                cancel,
                task,
            },
        );
        self.ctx
            .metrics
            .active_probes
            .set(i64::try_from(probes.len()).unwrap_or(i64::MAX));
        outcome
    }

    /// Stops the probe of `namespace`, if any; true if one was running.
    pub fn remove(&self, namespace: &str) -> bool {
        let mut probes = self.probes();
        let removed = probes.remove(namespace);
        self.ctx
            .metrics
            .active_probes
            .set(i64::try_from(probes.len()).unwrap_or(i64::MAX));
        drop(probes);
        match removed {
            Some(p) => {
                p.cancel.cancel();
                self.ctx.metrics.forget_shoot(namespace);
                true
            }
            None => false,
        }
    }

    /// Namespaces with a probe.
    pub fn namespaces(&self) -> Vec<String> {
        self.probes().keys().cloned().collect()
    }

    /// Whether `namespace` has a probe.
    pub fn has_probe(&self, namespace: &str) -> bool {
        self.probes().contains_key(namespace)
    }

    /// Stops every probe.
    pub fn stop_all(&self) {
        let drained: Vec<_> = self.probes().drain().collect();
        for (ns, p) in drained {
            p.cancel.cancel();
            self.ctx.metrics.forget_shoot(&ns);
        }
        self.ctx.metrics.active_probes.set(0);
    }
}
