//! One shoot's probe: a tokio task (never a thread) that runs the API-server probe and the
//! lease probe every `probeInterval` (sliding jitter), and runs a scaling flow when the lease
//! decision says so. Everything it reads from the seed comes from watch caches; everything it
//! reads from the shoot goes through a client built for this run only and dropped at its end,
//! so every run proves reachability anew (the reference disables keep-alive for the same
//! reason). A slow or dead shoot only delays its own task: every call has `probeTimeout`.

use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use dwd_core::lease::LeaseReport;
use dwd_core::{
    Direction, EffectiveProbeSettings, Hysteresis, LeaseDecision, evaluate_leases,
    leases_alone_suffice,
};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use kube::{Api, Client};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, info, info_span, warn};

use super::ProberContext;
use super::scaler;
use super::shoot_reads::{LEASE_PAGE, NODE_PAGE, list_all};
use super::slim::{NodeLease, ProbedNode};
use crate::Error;
use crate::kube_client::{PreparedShootConfig, ResponseLimits, is_response_too_large};
use crate::metrics::{
    ApiLabel, ApiLabels, RunLabels, RunResult, ShootDirectionLabels, ShootLabels,
};

/// Namespace of node leases in the shoot.
pub const NODE_LEASE_NAMESPACE: &str = "kube-node-lease";

/// What one run found, for the loop and for tests.
#[derive(Debug, Default)]
pub struct RunOutcome {
    /// When a call of this run was answered 429, if one was.
    pub throttled_at: Option<Instant>,
}

/// What a successful lease probe found.
enum Finding {
    /// The full verdict over nodes, machines and leases.
    Report(LeaseReport),
    /// Every lease was fresh and no target waited to be restored: nothing can change, so
    /// the nodes were not listed.
    AllLeasesFresh {
        /// Leases seen.
        leases: usize,
    },
}

/// One shoot's probe.
pub struct Probe {
    /// Shoot namespace in the seed (= Cluster name).
    pub namespace: String,
    /// Effective settings (grace period, pool conditions).
    pub settings: EffectiveProbeSettings,
    /// UID of the shoot's Cluster, which the decision events are about (known from the
    /// controller's watch, so publishing them costs no lookup).
    pub cluster_uid: Option<String>,
    /// Shared prober context.
    pub ctx: Arc<ProberContext>,
    /// Cancelled when the probe is removed or the process shuts down.
    pub cancel: CancellationToken,
    /// The probe secret's kubeconfig as last prepared (parsed, TLS configured): reused while
    /// the secret holds the same text, prepared anew when it changes.
    pub shoot_config: std::sync::Mutex<Option<Arc<PreparedShootConfig>>>,
}

/// The report's summary without its trailing decision ("4/5 node leases expired (0.80 ≥
/// 0.60)" of "…: scale down"): events append what was done to it.
pub fn decision_reason(report: &LeaseReport) -> String {
    let text = report.to_string();
    let decision = format!(": {}", report.decision);
    match text.strip_suffix(&decision) {
        Some(reason) => reason.to_string(),
        None => text,
    }
}

impl Probe {
    /// Runs until cancelled.
    pub async fn run(self) {
        let span = info_span!("probe", shoot = %self.namespace);
        self.run_loop().instrument(span).await;
    }

    async fn run_loop(self) {
        let cfg = &self.ctx.config;
        debug!(initial_delay = ?cfg.initial_delay, grace = ?self.settings.node_monitor_grace, "probe started");
        if !self.sleep_until(Instant::now() + cfg.initial_delay).await {
            return;
        }
        let mut hysteresis = Hysteresis::from_config(cfg);
        loop {
            let started = Instant::now();
            let outcome = tokio::select! {
                _ = self.cancel.cancelled() => return,
                outcome = self.run_once(&mut hysteresis) => outcome,
            };
            self.ctx
                .metrics
                .probe_run_duration
                .0
                .observe(started.elapsed().as_secs_f64());
            let delay = dwd_core::schedule::next_delay(
                cfg.probe_interval,
                cfg.backoff_jitter_factor,
                rand::random::<f64>(),
            );
            let next = dwd_core::schedule::earliest_next_start(
                Instant::now(),
                delay,
                outcome.throttled_at,
            );
            if let Some(t) = outcome.throttled_at {
                debug!(wait = ?next.saturating_duration_since(t), "throttled (429): next run no earlier than 10s after it");
            }
            if !self.sleep_until(next).await {
                return;
            }
        }
    }

    /// Sleeps until `deadline`; false when cancelled first.
    async fn sleep_until(&self, deadline: Instant) -> bool {
        tokio::select! {
            _ = self.cancel.cancelled() => false,
            _ = tokio::time::sleep_until(deadline) => true,
        }
    }

    fn shoot_labels(&self) -> ShootLabels {
        ShootLabels {
            shoot: self.namespace.clone(),
        }
    }

    fn count_run(&self, result: RunResult) {
        // A removed probe must not resurrect the per-shoot series its removal dropped.
        if self.cancel.is_cancelled() {
            return;
        }
        self.ctx
            .metrics
            .probe_runs
            .get_or_create(&RunLabels { result })
            .inc();
        self.ctx
            .metrics
            .shoot_probe_runs
            .get_or_create(&self.shoot_labels())
            .inc();
    }

    /// One probe run: API-server probe, lease probe, decision, maybe a scaling flow.
    pub async fn run_once(&self, hysteresis: &mut Hysteresis) -> RunOutcome {
        let mut outcome = RunOutcome::default();
        // Nodes can only change the outcome when a scale-down is building up or a target waits
        // to be restored (see `leases_alone_suffice`).
        let nodes_may_matter = hysteresis.streaks().1 > 0
            || !scaler::targets_to_scale(&self.ctx, &self.namespace, Direction::Up).is_empty();
        let report = match self.probe_shoot(&mut outcome, nodes_may_matter).await {
            Ok(Finding::Report(report)) => report,
            Ok(Finding::AllLeasesFresh { leases }) => {
                self.ctx
                    .metrics
                    .expired_lease_fraction
                    .get_or_create(&self.shoot_labels())
                    .set(0.0);
                self.count_run(RunResult::ScaleUp);
                debug!(
                    leases,
                    "all {leases} node leases fresh and nothing to restore: nodes not listed, no scaling"
                );
                return outcome;
            }
            Err(()) => return outcome,
        };
        let threshold = report.threshold;
        self.ctx
            .metrics
            .expired_lease_fraction
            .get_or_create(&self.shoot_labels())
            .set(report.fraction.unwrap_or(0.0));
        let action = hysteresis.observe(&report.decision);
        self.count_run(match report.decision {
            LeaseDecision::ScaleDown => RunResult::ScaleDown,
            LeaseDecision::ScaleUp(_) => RunResult::ScaleUp,
            LeaseDecision::NoScaling(_) => RunResult::NoScaling,
        });
        let Some(dir) = action else {
            debug!(candidates = report.candidates, expired = report.expired, fraction = ?report.fraction, threshold,
                decision = %report.decision, "{report}; no scaling this run");
            return outcome;
        };
        let targets = scaler::targets_to_scale(&self.ctx, &self.namespace, dir);
        if targets.is_empty() {
            debug!(candidates = report.candidates, expired = report.expired, fraction = ?report.fraction, threshold,
                decision = %report.decision, "{report}; targets already there");
            return outcome;
        }
        info!(candidates = report.candidates, expired = report.expired, fraction = ?report.fraction, threshold,
            action = %dir, "{report}");
        self.ctx
            .metrics
            .scaling_attempts
            .get_or_create(&ShootDirectionLabels {
                shoot: self.namespace.clone(),
                direction: dir.into(),
            })
            .inc();
        let reason = decision_reason(&report);
        let names: Vec<&str> = targets.iter().map(String::as_str).collect();
        self.ctx.events.scaling_decision(
            &self.namespace,
            self.cluster_uid.as_deref(),
            dir,
            &reason,
            &names,
        );
        match scaler::run_flow(&self.ctx, &self.namespace, dir, &reason).await {
            Ok(flow) => {
                if flow.throttled {
                    outcome.throttled_at = Some(Instant::now());
                }
                let changed = flow.changed();
                if changed.is_empty() {
                    debug!(action = %dir, "flow finished, nothing changed");
                } else {
                    info!(action = %dir, targets = ?changed, "flow finished");
                }
            }
            Err(failure) => {
                if failure.report.throttled || failure.error.is_throttled() {
                    outcome.throttled_at = Some(Instant::now());
                }
                warn!(action = %dir, target = %failure.target, error = %failure.error,
                    "flow stopped at a failed target; later levels not run, next run retries");
            }
        }
        outcome
    }

    /// API-server probe, then lease probe. `Err(())` means: failed, reported, no scaling.
    /// Unless `nodes_may_matter`, a run whose leases are all fresh ends without listing nodes.
    async fn probe_shoot(
        &self,
        outcome: &mut RunOutcome,
        nodes_may_matter: bool,
    ) -> Result<Finding, ()> {
        let cfg = &self.ctx.config;
        let client = match self.shoot_client().await {
            Ok(client) => client,
            Err(error) => {
                self.api_server_probe_failed(&error, "no usable kubeconfig; no scaling this run");
                return Err(());
            }
        };
        // 1. API server probe.
        if let Err(error) = self
            .shoot_call("GET /version", client.apiserver_version())
            .await
        {
            if error.is_throttled() {
                outcome.throttled_at = Some(Instant::now());
            }
            self.api_server_probe_failed(&error, "no lease probe, no scaling this run");
            return Err(());
        }
        // 2. Lease probe: consistent, paginated, bounded lists (`shoot_reads`). Leases first:
        //    when all are fresh and nothing waits to be restored, no node can change the
        //    outcome. Expiry is judged against the moment the lease list was asked for: a body
        //    that takes long to arrive (a slow link, a tenant's fat leases) must not age the
        //    renewals it carries.
        let leases_api: Api<NodeLease> = Api::namespaced(client.clone(), NODE_LEASE_NAMESPACE);
        let listed_at = Utc::now();
        let leases = match self
            .shoot_call("listing node leases", list_all(&leases_api, LEASE_PAGE))
            .await
        {
            Ok(list) => list
                .into_iter()
                .map(NodeLease::into_lease)
                .collect::<Vec<Lease>>(),
            Err(error) => {
                self.lease_list_failed(&error, outcome);
                return Err(());
            }
        };
        if leases_alone_suffice(
            &leases,
            self.settings.node_monitor_grace,
            cfg.node_lease_failure_fraction,
            listed_at,
            nodes_may_matter,
        ) {
            return Ok(Finding::AllLeasesFresh {
                leases: leases.len(),
            });
        }
        let nodes_api: Api<ProbedNode> = Api::all(client.clone());
        let nodes = self
            .shoot_call("listing nodes", list_all(&nodes_api, NODE_PAGE))
            .await;
        drop(client);
        let nodes = match nodes {
            Ok(nodes) => nodes,
            Err(error) => {
                self.lease_list_failed(&error, outcome);
                return Err(());
            }
        };
        if !self.ctx.caches.machines.is_ready() {
            self.lease_probe_failed("machine cache not synced yet");
            return Err(());
        }
        let machines: Vec<_> = self
            .ctx
            .caches
            .machines
            .in_namespace(&self.namespace)
            .iter()
            .map(|m| (**m).clone())
            .collect();
        let nodes: Vec<Node> = nodes.into_iter().map(ProbedNode::into_node).collect();
        let report = evaluate_leases(
            &nodes,
            &machines,
            &leases,
            &self.settings,
            cfg.node_lease_failure_fraction,
            listed_at,
        );
        for node in &report.nodes {
            debug!(node = %node.node, verdict = %node.verdict, "node verdict");
        }
        Ok(Finding::Report(report))
    }

    /// A failed list of the lease probe: noted (429s space the next run out) and reported.
    fn lease_list_failed(&self, error: &Error, outcome: &mut RunOutcome) {
        if error.is_throttled() {
            outcome.throttled_at = Some(Instant::now());
        }
        self.lease_probe_failed(&error.to_string());
    }

    fn api_server_probe_failed(&self, error: &Error, consequence: &str) {
        self.ctx
            .metrics
            .api_server_probe_failures
            .get_or_create(&self.shoot_labels())
            .inc();
        self.count_run(RunResult::ApiServerProbeFailed);
        warn!(%error, "API server probe failed; {consequence}");
    }

    fn lease_probe_failed(&self, error: &str) {
        self.ctx
            .metrics
            .lease_probe_failures
            .get_or_create(&self.shoot_labels())
            .inc();
        self.count_run(RunResult::LeaseProbeFailed);
        warn!(%error, "lease probe failed; no scaling this run");
    }

    /// A client for this run only, from the secret's current kubeconfig.
    async fn shoot_client(&self) -> Result<Client, Error> {
        let secret = &self.ctx.config.kube_config_secret_name;
        let err = |reason: String| Error::ShootKubeconfig {
            namespace: self.namespace.clone(),
            secret: secret.clone(),
            reason,
        };
        if !self.ctx.caches.secrets.is_ready() {
            return Err(err("secret cache not synced yet".into()));
        }
        let entry = self
            .ctx
            .caches
            .secrets
            .get(&self.namespace, secret)
            .ok_or_else(|| err("not found".into()))?;
        let text = entry.0.as_ref().map_err(|reason| err(reason.clone()))?;
        let kept = self
            .lock_shoot_config()
            .clone()
            .filter(|prepared| prepared.matches(text));
        let prepared = match kept {
            Some(prepared) => prepared,
            None => {
                let prepared = PreparedShootConfig::prepare(text, self.ctx.config.probe_timeout)
                    .await
                    .map_err(|e| err(e.to_string()))?;
                let prepared = Arc::new(prepared);
                *self.lock_shoot_config() = Some(prepared.clone());
                prepared
            }
        };
        prepared
            .client(ResponseLimits::DEFAULT)
            .map_err(|e| err(e.to_string()))
    }

    fn lock_shoot_config(&self) -> std::sync::MutexGuard<'_, Option<Arc<PreparedShootConfig>>> {
        // Only ever replaced whole: a panic elsewhere can't leave it half-written.
        self.shoot_config
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// One shoot API call with `probeTimeout`, counted in the metrics.
    async fn shoot_call<T>(
        &self,
        action: &str,
        fut: impl std::future::Future<Output = kube::Result<T>>,
    ) -> Result<T, Error> {
        let timeout: Duration = self.ctx.config.probe_timeout;
        self.ctx
            .metrics
            .api_requests
            .get_or_create(&ApiLabels {
                api: ApiLabel::Shoot,
            })
            .inc();
        match tokio::time::timeout(timeout, fut).await {
            Err(_) => Err(Error::Timeout {
                action: format!("shoot {}: {action}", self.namespace),
                timeout,
            }),
            Ok(Err(e)) => {
                if is_response_too_large(&e) {
                    self.ctx
                        .metrics
                        .oversized_responses
                        .get_or_create(&self.shoot_labels())
                        .inc();
                }
                let err = Error::kube(format!("shoot {}: {action}", self.namespace), bounded(e));
                if err.is_throttled() {
                    self.ctx
                        .metrics
                        .throttled_responses
                        .get_or_create(&ApiLabels {
                            api: ApiLabel::Shoot,
                        })
                        .inc();
                }
                Err(err)
            }
            Ok(Ok(v)) => Ok(v),
        }
    }
}

/// How much of a shoot's error message goes into our logs and errors: enough to tell what
/// went wrong, not a tenant's megabyte.
pub const SHOOT_MESSAGE_LIMIT: usize = 300;

/// `error` with the text a shoot's apiserver chose (its Status message and reason) cut to
/// [`SHOOT_MESSAGE_LIMIT`] bytes.
pub fn bounded(error: kube::Error) -> kube::Error {
    match error {
        kube::Error::Api(mut status) => {
            status.message = cut(&status.message, SHOOT_MESSAGE_LIMIT);
            status.reason = cut(&status.reason, SHOOT_MESSAGE_LIMIT / 4);
            // Causes and list metadata are the server's too, and nothing of ours reads them.
            status.details = None;
            status.metadata = None;
            kube::Error::Api(status)
        }
        other => other,
    }
}

/// `text` cut to at most `limit` bytes on a character boundary, marked with `…` when cut.
fn cut(text: &str, limit: usize) -> String {
    if text.len() <= limit {
        return text.to_string();
    }
    let mut end = limit;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… ({} bytes)", &text[..end], text.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use dwd_core::lease::UpReason;

    fn report(expired: usize, decision: LeaseDecision) -> LeaseReport {
        LeaseReport {
            nodes: Vec::new(),
            orphan_leases: Vec::new(),
            candidates: 5,
            expired,
            fraction: Some(expired as f64 / 5.0),
            threshold: 0.6,
            decision,
        }
    }

    #[test]
    fn a_shoots_error_text_is_cut() {
        let status = kube::core::Status {
            message: "é".repeat(100_000),
            reason: "x".repeat(10_000),
            code: 500,
            ..kube::core::Status::default()
        };
        let kube::Error::Api(cut) = bounded(kube::Error::Api(Box::new(status))) else {
            panic!("not an API error");
        };
        assert!(
            cut.message.len() < SHOOT_MESSAGE_LIMIT + 30,
            "{}",
            cut.message.len()
        );
        assert!(cut.message.ends_with("… (200000 bytes)"), "{}", cut.message);
        assert!(
            cut.reason.len() < SHOOT_MESSAGE_LIMIT,
            "{}",
            cut.reason.len()
        );
        assert_eq!(cut.code, 500);
    }

    #[test]
    fn decision_reason_is_the_summary_without_the_decision() {
        assert_eq!(
            decision_reason(&report(4, LeaseDecision::ScaleDown)),
            "4/5 node leases expired (0.80 ≥ 0.60)"
        );
        assert_eq!(
            decision_reason(&report(0, LeaseDecision::ScaleUp(UpReason::BelowThreshold))),
            "0/5 node leases expired (0.00 < 0.60)"
        );
    }
}
