//! Executes scaling flows (docs/behaviour.md §2.11–2.13): levels in ascending order, the targets of
//! one level concurrently, a level only after every earlier level succeeded; each target tried up
//! to three times, 100 ms apart. What to do with a target is decided by `dwd_core::scaling` from
//! the watch cache; this module only performs the writes and waits (by watching the cache) until
//! the target reaches its goal, at most [`READINESS_WAIT`](dwd_core::scaling::READINESS_WAIT): a
//! lagging seed never holds the next level back longer than the reference's fixed wait.
//!
//! For apps/v1 workloads (Deployment, StatefulSet, ReplicaSet) each step is one merge patch
//! that changes annotations and `spec.replicas` together, with the cached resourceVersion as
//! precondition: atomic, so a crash can't split it, and half the writes of the reference's
//! annotate-then-scale (which matters when a thousand shoots share the seed's QPS budget).
//! Other kinds keep the two writes, in the crash-safe order (annotations first on the way
//! down, replicas first on the way up), each with the version the previous one returned as
//! precondition (a Scale carries its parent's resourceVersion). Each flow's writes are
//! ranked by level on the seed client's budget ([`crate::client::rate_limit`]). Every call is
//! bounded by the target's `timeout`, `Retry-After` waits included ([`crate::client::retry_after`]).
//! Both travel with the requests (`TargetApi`, see [`crate::client::request_settings`]).
//!
//! A flow stops when its `stop` token is cancelled (a newer verdict superseded it, see
//! [`super::executor`]): before a level, before a target's attempt, during its initial delay
//! or its wait for the goal, and while the first write of a step waits for the seed's budget
//! (not sent). A write on the wire, and the second write of a two-write step, are finished:
//! a step is never left half done by a stop.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use dwd_core::intent::{Intent, Seen, Step as IntentStep, intent, step_for};
use dwd_core::scaling::{
    FlowScope, ReplicaChange, TargetPlan, WriteTo, call_timeout, clear_annotations_patch,
    clear_meltdown_patch, readiness_wait, replica_writes, scale_info_for, with_resource_version,
};
use dwd_core::{DependentResourceInfo, Direction, TargetAction, TargetSnapshot};
use kube::api::{ApiResource, DynamicObject, Patch, PatchParams};
use kube::{Api, Client};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, info, info_span, warn};

use super::context::ProberContext;
use super::seed_caches::{TargetCache, TargetState};
use crate::client::cache::WaitEnd;
use crate::client::rate_limit::{OnSent, Priority, StopWaiting};
use crate::client::retry_after::Deadline;
use crate::metrics::{ApiLabel, Outcome, ScaleOpLabels};
use crate::observe::events::TargetRef;
use crate::{Error, Result};

/// Attempts per target.
pub(crate) const ATTEMPTS: u32 = 3;
/// Pause between attempts.
pub(crate) const ATTEMPT_INTERVAL: Duration = Duration::from_millis(100);

/// A scaling flow a run decided on: what [`run_flow`] carries out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedFlow {
    /// Its direction, scope and levels, each target judged from the seed caches when the run
    /// decided ([`intent_from_caches`]); the flow judges each again, at write time, from the
    /// newest object.
    pub intent: Intent,
    /// The lease probe's summary, for the events on the targets it changes.
    pub reason: String,
    /// The id of the decision record of the run that handed it over, once the executor
    /// took it ([`crate::decisions`]); its events and log lines carry it.
    pub decision: Option<String>,
}

/// Time a target's writes waited for the seed's request budget, in all (microseconds).
#[derive(Debug, Default)]
pub(crate) struct BudgetWait(AtomicU64);

impl BudgetWait {
    fn add(&self, waited: Duration) {
        let micros = u64::try_from(waited.as_micros()).unwrap_or(u64::MAX);
        self.0.fetch_add(micros, Ordering::Relaxed);
    }

    /// The time waited so far.
    pub(crate) fn get(&self) -> Duration {
        Duration::from_micros(self.0.load(Ordering::Relaxed))
    }
}

/// How one target's step of a flow ended.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct TargetReport {
    /// The target's name.
    pub name: String,
    /// Its level in the flow.
    pub level: u32,
    /// What happened to it.
    pub outcome: TargetOutcome,
    /// When its step ended.
    pub ended_at: chrono::DateTime<chrono::Utc>,
    /// How long its writes waited for the seed's budget, in all.
    pub budget_wait: Duration,
}

/// What happened to one target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum TargetOutcome {
    /// Replicas changed from `from` to `to` and the target reached its goal.
    Scaled {
        /// Replicas before.
        from: i32,
        /// Replicas after.
        to: i32,
        /// The count a scale-down recorded in the `replicas` annotation.
        recorded: Option<i32>,
    },
    /// Nothing to scale; why.
    Skipped(String),
}

/// Outcome of a flow: per target, in execution order.
#[derive(Debug, Default)]
pub(crate) struct FlowReport {
    /// Each target's step, in the order they ended.
    pub targets: Vec<TargetReport>,
    /// Whether any call of the flow was answered 429.
    pub throttled: bool,
    /// Whether the flow stopped because a newer verdict superseded it (later levels not run).
    pub superseded: bool,
}

impl FlowReport {
    /// Names of the targets whose replicas changed.
    pub(crate) fn changed(&self) -> Vec<&str> {
        self.targets
            .iter()
            .filter(|t| matches!(t.outcome, TargetOutcome::Scaled { .. }))
            .map(|t| t.name.as_str())
            .collect()
    }
}

/// A failed flow: the error of the first failed target and what ran before it.
#[derive(Debug)]
pub(crate) struct FlowError {
    /// Targets that finished before the failure.
    pub report: FlowReport,
    /// The failed target and why.
    pub target: String,
    /// The error.
    pub error: Error,
}

/// The intent of the flow in `dir` over `scope` for shoot `namespace`
/// ([`dwd_core::intent`]), each target as the seed caches show it (no API call): a kind
/// without a cache is not served by the seed, a cache not in sync does not know.
pub(crate) fn intent_from_caches(
    ctx: &ProberContext,
    namespace: &str,
    dir: Direction,
    scope: FlowScope,
) -> Intent {
    intent(&ctx.config.dependent_resource_infos, dir, scope, |info| {
        seen_in_caches(ctx.caches.target(info), namespace, info).0
    })
}

/// Every configured target of shoot `namespace` as the seed caches show it now (for a
/// decision record).
pub(crate) fn seen_in_caches_all(
    ctx: &ProberContext,
    namespace: &str,
) -> Vec<(DependentResourceInfo, Seen)> {
    ctx.config
        .dependent_resource_infos
        .iter()
        .map(|info| {
            let seen = seen_in_caches(ctx.caches.target(info), namespace, info).0;
            (info.clone(), seen)
        })
        .collect()
}

/// Target `info` of shoot `namespace` as its cache (`None`: its kind is not served by the
/// seed) shows it now, and its cached state when it is there.
fn seen_in_caches(
    cache: Option<&TargetCache>,
    namespace: &str,
    info: &DependentResourceInfo,
) -> (Seen, Option<Arc<TargetState>>) {
    let Some(t) = cache else {
        return (Seen::NotServed, None);
    };
    if !t.cache.is_ready() {
        let why = format!("the {} cache is not in sync", t.cache.what());
        return (Seen::Unknown(why), None);
    }
    match t.cache.get(namespace, &info.target.name) {
        None => (Seen::Absent, None),
        Some(state) => {
            let snapshot = TargetSnapshot {
                spec_replicas: state.spec_replicas,
                annotations: state.annotations.clone(),
            };
            (Seen::Present(snapshot), Some(state))
        }
    }
}

/// The outcome for a target the flow does not scale: skipped, or why the flow stops there.
/// The rule (what an absent, optional, unserved or unknown target means) is
/// [`step_for`]'s; this only words it.
fn not_planned(
    step: &IntentStep,
    seen: &Seen,
    namespace: &str,
    info: &DependentResourceInfo,
) -> Result<TargetOutcome> {
    let r = &info.target;
    let what = format!("{} {namespace}/{}", r.kind, r.name);
    match (step, seen) {
        (IntentStep::Skipped, Seen::NotServed) => Ok(TargetOutcome::Skipped(
            "optional target: its kind is not served by the seed".into(),
        )),
        (IntentStep::Skipped, _) => {
            debug!("optional target not found, nothing to do");
            Ok(TargetOutcome::Skipped("optional target not found".into()))
        }
        (IntentStep::Fails, Seen::NotServed) => Err(Error::Scaling(format!(
            "target {}: its kind {}/{} is not served by the seed",
            r.name, r.api_version, r.kind
        ))),
        (IntentStep::Fails, _) => Err(Error::Scaling(format!(
            "{what} not found (and not optional)"
        ))),
        (IntentStep::Unknown(why), _) => Err(Error::Scaling(format!("{what}: {why}"))),
        (IntentStep::Planned(_), _) => Err(Error::Scaling(format!(
            "{what}: planned without a state to write against"
        ))),
    }
}

/// Runs `flow` (its direction over the targets of its scope) for shoot `namespace` until it
/// is done or `stop` is cancelled (see the module docs). Its `reason` (the lease probe's
/// summary, e.g. "4/5 node leases expired (0.80 ≥ 0.60)") goes into the event on every target
/// it changes.
pub(crate) async fn run_flow(
    ctx: &ProberContext,
    namespace: &str,
    flow: &PlannedFlow,
    stop: &CancellationToken,
) -> Result<FlowReport, Box<FlowError>> {
    let dir = flow.intent.dir;
    // The targets' events keep the reason alone: a repeat of one aggregates into a series.
    // The decision's id is on the Cluster's event and on every log line of the flow.
    let reason = &flow.reason;
    let mut report = FlowReport::default();
    for level in &flow.intent.levels {
        if stop.is_cancelled() {
            report.superseded = true;
            return Ok(report);
        }
        // Every shoot's level 0 gets the seed budget before anyone's later levels.
        let step = |info| Step {
            writes: WriteSettings {
                priority: Priority::scaling_level(level.level),
                timeout: scale_info_for(info, dir).timeout,
                stop,
            },
            reason,
        };
        let decision = flow.decision.as_deref().unwrap_or_default();
        let runs = level.targets.iter().map(|t| async move {
            let name = t.info.target.name.clone();
            let waited = BudgetWait::default();
            let result = match ctx.caches.target(&t.info) {
                Some(target) => scale_target(TargetStep { ctx, namespace, target, dir, step: step(&t.info), waited: &waited })
                    .instrument(info_span!("scale", target = %name, direction = %dir, scale_level = level.level, decision_id = %decision))
                    .await,
                // Its kind is not served by the seed: that does not change while the prober
                // runs, so the step the intent judged stands.
                None => not_planned(&t.step, &t.seen, namespace, &t.info),
            };
            let ended = Ended {
                name,
                level: level.level,
                at: chrono::Utc::now(),
                waited: waited.get(),
            };
            (ended, result)
        });
        let results = futures::future::join_all(runs).await;
        if let Some((target, error)) = tally(ctx, dir, results, &mut report) {
            return Err(Box::new(FlowError {
                report,
                target,
                error,
            }));
        }
        if report.superseded {
            return Ok(report);
        }
    }
    Ok(report)
}

/// A target's step that ended, before its outcome is told.
struct Ended {
    name: String,
    level: u32,
    at: chrono::DateTime<chrono::Utc>,
    waited: Duration,
}

/// Counts the outcomes of one level's targets into `report` and the metrics; the first
/// failed target and its error, if one failed (a stopped target is neither done nor failed).
fn tally(
    ctx: &ProberContext,
    dir: Direction,
    results: Vec<(Ended, Result<TargetOutcome>)>,
    report: &mut FlowReport,
) -> Option<(String, Error)> {
    let mut failure = None;
    for (ended, result) in results {
        let name = ended.name.clone();
        let labels = |outcome| ScaleOpLabels {
            direction: dir.into(),
            target: name.clone(),
            outcome,
        };
        match result {
            Err(Error::Superseded { .. }) => report.superseded = true,
            Ok(outcome) => {
                let o = if matches!(outcome, TargetOutcome::Scaled { .. }) {
                    Outcome::Scaled
                } else {
                    Outcome::Skipped
                };
                ctx.metrics.scale_operations.get_or_create(&labels(o)).inc();
                report.targets.push(TargetReport {
                    name: ended.name,
                    level: ended.level,
                    outcome,
                    ended_at: ended.at,
                    budget_wait: ended.waited,
                });
            }
            Err(error) => {
                ctx.metrics
                    .scale_operations
                    .get_or_create(&labels(Outcome::Failed))
                    .inc();
                report.throttled |= error.is_throttled();
                if failure.is_none() {
                    failure = Some((name, error));
                }
            }
        }
    }
    failure
}

/// Scales the step's target, its writes ranked at the step's priority on the seed budget,
/// until done or the step's `stop` is cancelled ([`Error::Superseded`]).
async fn scale_target(target_step: TargetStep<'_>) -> Result<TargetOutcome> {
    let (namespace, target, stop) = (
        target_step.namespace,
        target_step.target,
        target_step.step.writes.stop,
    );
    let superseded = || Error::Superseded {
        action: format!(
            "scaling {} {namespace}/{}",
            target.info.target.kind, target.info.target.name
        ),
    };
    let scale_info = scale_info_for(&target.info, target_step.dir);
    // Once per flow, not once per attempt as in the reference: the delay gives the earlier
    // levels time to take effect, which a retry 100 ms later does not need again. Sleeping
    // it per attempt would add a whole `initialDelay` (KCM's is 30 s on the way up) to a
    // restoration for every transient write error.
    if !scale_info.initial_delay.is_zero() {
        tokio::select! {
            _ = stop.cancelled() => return Err(superseded()),
            _ = tokio::time::sleep(scale_info.initial_delay) => {}
        }
    }
    let limit = call_timeout(scale_info.timeout);
    let mut attempt = 1;
    loop {
        if stop.is_cancelled() {
            return Err(superseded());
        }
        let seen = cached_version(target, namespace);
        match attempt_once(target_step).await {
            Ok(outcome) => return Ok(outcome),
            Err(error @ Error::Superseded { .. }) => return Err(error),
            Err(error) if attempt < ATTEMPTS => {
                warn!(attempt, %error, "scaling attempt failed, retrying");
                attempt += 1;
                tokio::time::sleep(ATTEMPT_INTERVAL).await;
                if error.is_conflict() {
                    // The write was based on an older version than the apiserver's; retrying
                    // before the watch has brought the newer one would only conflict again.
                    wait_for_newer(target, namespace, &seen, limit).await;
                }
            }
            Err(error) => {
                let uid = target
                    .cache
                    .get(namespace, &target.info.target.name)
                    .and_then(|s| s.uid.clone());
                target_step.ctx.events.target_failed(
                    target_ref(namespace, target, uid.as_deref()),
                    &target.resource,
                    target_step.dir,
                    attempt,
                    &error.to_string(),
                    target_step.step.reason,
                );
                return Err(error);
            }
        }
    }
}

/// The `resourceVersion` of the cached target (`None` when not cached).
fn cached_version(target: &TargetCache, namespace: &str) -> Option<Option<String>> {
    target
        .cache
        .get(namespace, &target.info.target.name)
        .map(|s| s.resource_version.clone())
}

/// Waits (at most `limit`) until the cached target differs from version `seen`.
async fn wait_for_newer(
    target: &TargetCache,
    namespace: &str,
    seen: &Option<Option<String>>,
    limit: Duration,
) {
    let newer = target
        .cache
        .wait_until(namespace, &target.info.target.name, limit, |s| {
            s.map(|s| s.resource_version.clone()) != *seen
        })
        .await;
    if newer.is_err() {
        debug!(
            ?limit,
            "cache still at the conflicting version; retrying anyway"
        );
    }
}

/// A target's API on the seed for the writes of one flow: every request at the flow level's
/// priority, each call with a deadline of its own.
struct TargetApi<'a> {
    seed: &'a Client,
    priority: Priority,
    namespace: &'a str,
    resource: &'a ApiResource,
    /// Stops a write still waiting for the seed's budget (`None` once a step's first write
    /// was sent: its second write is never abandoned).
    stop: Option<&'a CancellationToken>,
}

impl TargetApi<'_> {
    /// The API for one call that must end by `deadline`: no `Retry-After` wait is started
    /// that would end past it (so a 429 comes back as a 429, not as a timeout).
    /// `sent` is told when the request leaves the seed's budget queue (see [`call`]).
    fn until(&self, deadline: Deadline, sent: &Arc<Notify>) -> Api<DynamicObject> {
        let mut settings = http::Extensions::new();
        settings.insert(self.priority);
        settings.insert(deadline);
        settings.insert(OnSent(sent.clone()));
        if let Some(stop) = self.stop {
            settings.insert(StopWaiting(stop.clone()));
        }
        let client = crate::client::request_settings::with_settings(self.seed, settings);
        Api::namespaced_with(client, self.namespace, self.resource)
    }
}

/// The deadline of a call bounded by `limit`, starting now.
fn deadline_in(limit: Duration) -> Deadline {
    Deadline(tokio::time::Instant::now() + limit)
}

/// One seed call of a scaling step, bounded by `limit` (the target's call timeout) from the
/// moment it leaves the seed's budget queue (`sent`, see [`TargetApi::until`]); the time it
/// queued is added to `waited` (for the flow's decision record). The wait for
/// the budget is not bounded by it: on the worst day hundreds of flows queue for minutes, and
/// a write that gave up its place after `timeout` (as the reference's does) would only queue
/// again at the back, fail its flow after three attempts and be decided anew; a newer verdict
/// stops the wait instead ([`StopWaiting`]). `limit` also bounds any `Retry-After` wait
/// within the call (`fut` carries the deadline of [`deadline_in`]`(limit)`).
async fn call<T>(
    ctx: &ProberContext,
    action: String,
    limit: Duration,
    waited: &BudgetWait,
    sent: &Notify,
    fut: impl std::future::Future<Output = kube::Result<T>>,
) -> Result<T> {
    ctx.metrics.count_api_request(ApiLabel::Seed);
    tokio::pin!(fut);
    let queued_at = tokio::time::Instant::now();
    let answered = tokio::select! {
        biased;
        answer = &mut fut => Ok(answer),
        () = sent.notified() => Err(()),
    };
    if answered.is_err() {
        waited.add(queued_at.elapsed());
    }
    let answer = match answered {
        Ok(answer) => Ok(answer),
        Err(()) => tokio::time::timeout(limit, fut).await,
    };
    match answer {
        Err(_) => Err(Error::Timeout {
            action,
            timeout: limit,
        }),
        // Stopped while it waited for the budget: never sent.
        Ok(Err(e)) if crate::client::rate_limit::is_not_sent(&e) => {
            Err(Error::Superseded { action })
        }
        Ok(Err(e)) => {
            let err = Error::kube(action, e);
            if err.is_throttled() {
                ctx.metrics.count_throttled_response(ApiLabel::Seed);
            }
            Err(err)
        }
        Ok(Ok(v)) => Ok(v),
    }
}

/// The writes of one scaling step to one target, each through [`call`] within `limit`.
struct TargetWrites<'a> {
    ctx: &'a ProberContext,
    api: TargetApi<'a>,
    /// The target's name.
    name: &'a str,
    limit: Duration,
    /// Where each call adds its wait for the seed's budget.
    waited: &'a BudgetWait,
}

impl<'a> TargetWrites<'a> {
    /// The writes of `step` to `target` in `namespace`.
    fn of(
        ctx: &'a ProberContext,
        namespace: &'a str,
        target: &'a TargetCache,
        settings: &WriteSettings<'a>,
        waited: &'a BudgetWait,
    ) -> TargetWrites<'a> {
        TargetWrites {
            ctx,
            api: TargetApi {
                seed: &ctx.seed,
                priority: settings.priority,
                namespace,
                resource: &target.resource,
                stop: Some(settings.stop),
            },
            name: &target.info.target.name,
            limit: call_timeout(settings.timeout),
            waited,
        }
    }

    /// The same writes, never stopped: for the second write of a step whose first was sent.
    fn unstoppable(&self) -> TargetWrites<'a> {
        TargetWrites {
            ctx: self.ctx,
            api: TargetApi {
                stop: None,
                ..self.api
            },
            name: self.name,
            limit: self.limit,
            waited: self.waited,
        }
    }

    /// One merge patch of the target object.
    async fn merge(&self, action: String, patch: &serde_json::Value) -> Result<DynamicObject> {
        let sent = Arc::new(Notify::new());
        let api = self.api.until(deadline_in(self.limit), &sent);
        let (pp, patch) = (PatchParams::default(), Patch::Merge(patch));
        let write = api.patch(self.name, &pp, &patch);
        call(self.ctx, action, self.limit, self.waited, &sent, write).await
    }

    /// Removes what `patch` clears (`what`), conditional on the target's version `rv`.
    async fn remove(&self, what: String, patch: serde_json::Value, rv: Option<&str>) -> Result<()> {
        let patch = with_resource_version(patch, rv);
        self.merge(format!("removing {what}"), &patch).await?;
        Ok(())
    }

    /// One merge patch of the target's `scale` subresource; returns the target's new
    /// resourceVersion and UID (a Scale carries its parent's).
    async fn scale(
        &self,
        action: String,
        patch: &serde_json::Value,
    ) -> Result<(Option<String>, Option<String>)> {
        let sent = Arc::new(Notify::new());
        let api = self.api.until(deadline_in(self.limit), &sent);
        let (pp, patch) = (PatchParams::default(), Patch::Merge(patch));
        let write = api.patch_scale(self.name, &pp, &patch);
        let scale = call(self.ctx, action, self.limit, self.waited, &sent, write).await?;
        Ok((scale.metadata.resource_version, scale.metadata.uid))
    }
}

/// Problems with a target's `replicas` annotation already warned about, per (namespace,
/// target): an unchanged problem is said once, not on every run that meets it. Process-wide
/// (one prober per process); an entry goes when its target is seen without the problem.
static WARNED: Mutex<BTreeMap<(String, String), String>> = Mutex::new(BTreeMap::new());

/// Whether `problem` of `namespace/target` is new (or changed) and should be warned about;
/// `None` forgets the target's last problem.
fn first_time(namespace: &str, target: &str, problem: Option<&str>) -> bool {
    let mut warned = WARNED.lock().unwrap_or_else(PoisonError::into_inner);
    let key = (namespace.to_owned(), target.to_owned());
    match problem {
        None => {
            warned.remove(&key);
            false
        }
        Some(p) => warned.insert(key, p.to_owned()).as_deref() != Some(p),
    }
}

/// `target` in `namespace` as its events name it.
fn target_ref<'a>(
    namespace: &'a str,
    target: &'a TargetCache,
    uid: Option<&'a str>,
) -> TargetRef<'a> {
    let r = &target.info.target;
    TargetRef {
        namespace,
        api_version: &r.api_version,
        kind: &r.kind,
        name: &r.name,
        uid,
    }
}

/// How a flow's writes to one target go out, the one bundle of a write's settings: their
/// rank on the seed's budget, the target's timeout (each call's limit, and the wait for its
/// goal), and the flow's stop token.
#[derive(Clone, Copy)]
struct WriteSettings<'a> {
    priority: Priority,
    timeout: Duration,
    stop: &'a CancellationToken,
}

/// How one target's step of a flow goes: how its writes go out, and why (for the events).
#[derive(Clone, Copy)]
struct Step<'a> {
    writes: WriteSettings<'a>,
    reason: &'a str,
}

/// One target's step of a flow: the shoot's namespace, the target, the direction and how.
#[derive(Clone, Copy)]
struct TargetStep<'a> {
    ctx: &'a ProberContext,
    namespace: &'a str,
    target: &'a TargetCache,
    dir: Direction,
    step: Step<'a>,
    /// Where its writes add the time they waited for the seed's budget.
    waited: &'a BudgetWait,
}

/// One attempt of a target's step: judged again from the newest cached object, then written.
async fn attempt_once(target_step: TargetStep<'_>) -> Result<TargetOutcome> {
    let TargetStep {
        ctx,
        namespace,
        target,
        dir,
        step,
        waited,
    } = target_step;
    let r = &target.info.target;
    let what = format!("{} {namespace}/{}", r.kind, r.name);
    // Judged again from the newest object, by the intent's own rule.
    let (seen, state) = seen_in_caches(Some(target), namespace, &target.info);
    let (plan, state) = match (step_for(dir, &target.info, &seen), state) {
        (IntentStep::Planned(plan), Some(state)) => (plan, state),
        (step, _) => return not_planned(&step, &seen, namespace, &target.info),
    };
    // The event on the target says why it got the count it got.
    let reason = match replicas_problem(namespace, &what, &r.name, &plan, state.spec_replicas) {
        Some(problem) => format!("{}; {problem}", step.reason),
        None => step.reason.to_owned(),
    };
    let change = Change {
        of: TargetStep {
            step: Step {
                reason: &reason,
                ..step
            },
            ..target_step
        },
        from: state.spec_replicas,
    };
    let writes = TargetWrites::of(ctx, namespace, target, &step.writes, waited);
    let rv = state.resource_version.as_deref();
    match plan.action {
        TargetAction::Ignored { clear_marker } => {
            if clear_marker {
                let what = format!("meltdown annotation of {what}");
                writes.remove(what, clear_meltdown_patch(), rv).await?;
            }
            info!("ignore-scaling is set, target left alone");
            Ok(TargetOutcome::Skipped("ignore-scaling annotation".into()))
        }
        TargetAction::AlreadyDone { clear_marker } => {
            if clear_marker {
                let what = format!("annotations of {what}");
                writes.remove(what, clear_annotations_patch(), rv).await?;
            }
            Ok(TargetOutcome::Skipped(format!(
                "already at {} replicas",
                state.spec_replicas
            )))
        }
        TargetAction::ScaleDown { record_replicas } => {
            let replicas = ReplicaChange::Down {
                record: record_replicas,
            };
            change_replicas(&change, &writes, &what, replicas, rv).await
        }
        TargetAction::ScaleUp { replicas } => {
            let replicas = ReplicaChange::Up { replicas };
            change_replicas(&change, &writes, &what, replicas, rv).await
        }
    }
}

/// What a step found wrong with the target's `replicas` record and did instead, in words;
/// warned about once per problem (see [`first_time`]).
fn replicas_problem(
    namespace: &str,
    what: &str,
    name: &str,
    plan: &TargetPlan,
    spec_replicas: i32,
) -> Option<String> {
    let Some(p) = &plan.replicas_problem else {
        first_time(namespace, name, None);
        return None;
    };
    let text = match plan.action {
        TargetAction::ScaleUp { replicas } => {
            format!("{what}: {p}; restoring {replicas} replica(s) instead")
        }
        _ => format!("{what}: {p}; recording the current {spec_replicas} replica(s) instead"),
    };
    if first_time(namespace, name, Some(&text)) {
        warn!("{text}");
    }
    Some(text)
}

/// One replica change of a step: the step (its target and direction; why, for its event;
/// its timeout and stop token, for the wait for its goal) and the count it is found at.
struct Change<'a> {
    of: TargetStep<'a>,
    from: i32,
}

impl Change<'_> {
    /// Reports `change` on the target (when the replicas changed, not when the goal is
    /// reached: a retry after a slow goal finds the target already scaled and would report
    /// nothing), then waits for its goal.
    async fn scaled(&self, uid: Option<&str>, change: ReplicaChange) -> Result<TargetOutcome> {
        let to = change.to();
        let goal =
            |s: &super::seed_caches::TargetState| change.reached(s.spec_replicas, s.ready_replicas);
        let (namespace, target, step) = (self.of.namespace, self.of.target, self.of.step);
        let target_ref = target_ref(namespace, target, uid);
        let events = &self.of.ctx.events;
        events.target_scaled(target_ref, self.of.dir, self.from, to, step.reason);
        let written = |s: &super::seed_caches::TargetState| s.spec_replicas == to;
        wait_for_goal(
            target,
            namespace,
            step.writes.timeout,
            step.writes.stop,
            written,
            goal,
        )
        .await?;
        Ok(TargetOutcome::Scaled {
            from: self.from,
            to,
            recorded: match change {
                ReplicaChange::Down { record } => Some(record),
                ReplicaChange::Up { .. } => None,
            },
        })
    }
}

/// Makes `replica_change` to the target: the writes [`replica_writes`] lists, in order, the
/// first conditional on `rv` (the version the step was decided from), each later one on the
/// version the write before it produced and sent even if the flow was stopped meanwhile;
/// then reports the change and waits for its goal.
async fn change_replicas(
    change: &Change<'_>,
    writes: &TargetWrites<'_>,
    what: &str,
    replica_change: ReplicaChange,
    rv: Option<&str>,
) -> Result<TargetOutcome> {
    let r = &change.of.target.info.target;
    let mut version = rv.map(str::to_owned);
    let mut uid = None;
    for (i, write) in replica_writes(&r.api_version, &r.kind, replica_change, what)
        .into_iter()
        .enumerate()
    {
        let writes = if i == 0 {
            writes
        } else {
            &writes.unstoppable()
        };
        let patch = with_resource_version(write.patch, version.as_deref());
        let (written_version, written_uid) = match write.to {
            WriteTo::Object => {
                let object = writes.merge(write.doing, &patch).await?;
                (object.metadata.resource_version, object.metadata.uid)
            }
            WriteTo::Scale => writes.scale(write.doing, &patch).await?,
        };
        // The Scale carries its parent's UID, so the first write's is the target's.
        uid = uid.or(written_uid);
        version = written_version;
    }
    let to = replica_change.to();
    match replica_change {
        ReplicaChange::Down { record } => {
            info!(from = change.from, to, recorded = record, "scaled down");
        }
        ReplicaChange::Up { .. } => info!(from = change.from, to, "scaled up"),
    }
    change.scaled(uid.as_deref(), replica_change).await
}

/// Waits (watching the cache, no polling) until the target's state satisfies `goal`, at
/// most [`readiness_wait`]`(timeout)`: as soon as it is there, and never longer than the
/// reference's fixed wait. A target that is not there by then does not fail its level (the
/// reference's level goes on too: its retry finds the target scaled and succeeds); its
/// replicas are set, and readiness is the target's own business. A stopped flow stops
/// waiting for the goal (its write is done; the flow ends before its next level), but not
/// for the cache to show its write (`written`, within the same limit): the flow that stopped
/// it plans from the cache next, and a cache that trails the write would make it find the
/// target "already there" and leave it as the stopped flow left it (seen in a storm: a KCM
/// scaled down by a superseded flow stayed down until the next run).
async fn wait_for_goal(
    target: &TargetCache,
    namespace: &str,
    timeout: Duration,
    stop: &CancellationToken,
    written: impl Fn(&super::seed_caches::TargetState) -> bool,
    goal: impl Fn(&super::seed_caches::TargetState) -> bool,
) -> Result<()> {
    let name = &target.info.target.name;
    let limit = readiness_wait(timeout);
    let reached = tokio::select! {
        _ = stop.cancelled() => {
            let seen = target.cache.wait_until(namespace, name, limit, |s| s.is_some_and(&written)).await;
            if seen.is_err() {
                debug!(?limit, "stopped flow: the cache does not show its last write yet");
            }
            return Ok(());
        }
        reached = target.cache.wait_until(namespace, name, limit, |s| s.is_some_and(&goal)) => reached,
    };
    match reached {
        Ok(()) => Ok(()),
        Err(WaitEnd::Closed) => Err(Error::Scaling(format!(
            "{} {namespace}/{name}: target cache closed while waiting",
            target.info.target.kind
        ))),
        Err(WaitEnd::TimedOut) => {
            info!(waited = ?limit, "replicas set; target not ready yet, the next level starts anyway");
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    //! The executor against the fake seed apiserver ([`crate::fake_seed`]: list, watch and
    //! merge patches of targets, preconditions enforced), on a paused clock: waits of seconds
    //! take no time, and the instants of the writes are exact.

    use super::*;

    use kube::api::{ApiResource, GroupVersionKind};
    use serde_json::{Value, json};
    use tokio::time::Instant;

    use crate::client::cache::{Cache, run_cache};
    use crate::fake_seed::{Call, DEPLOYMENT, FakeSeed, RC};
    use crate::metrics::Metrics;
    use crate::observe::events::Events;
    use crate::observe::logging::LogBuffer;
    use crate::prober::seed_caches::{SeedCaches, project_target};
    use dwd_core::scaling::{MELTDOWN_ANNOTATION, READINESS_WAIT, REPLICAS_ANNOTATION};

    /// A prober context on `fake` for `config` (YAML of dependentResourceInfos entries, with
    /// plural names: Deployments and ReplicationControllers), the target caches fed by the
    /// fake's watch; returns once they are synced.
    async fn context(fake: &FakeSeed, infos: &str, skip_caches: &[&str]) -> ProberContext {
        let config = dwd_core::ProberConfig::from_yaml(&format!(
            "kubeConfigSecretName: probe\ndependentResourceInfos:\n{infos}"
        ))
        .expect("config")
        .config;
        let seed = fake.client();
        let mut targets = Vec::new();
        for info in &config.dependent_resource_infos {
            if skip_caches.contains(&info.target.name.as_str()) {
                continue;
            }
            let resource = match info.target.kind.as_str() {
                "Deployment" => ApiResource::from_gvk_with_plural(
                    &GroupVersionKind::gvk("apps", "v1", "Deployment"),
                    "deployments",
                ),
                _ => ApiResource::from_gvk_with_plural(
                    &GroupVersionKind::gvk("", "v1", "ReplicationController"),
                    "replicationcontrollers",
                ),
            };
            let cache = Cache::new("scaling targets");
            let api: Api<DynamicObject> = Api::all_with(seed.clone(), &resource);
            let watch = kube::runtime::watcher::Config::default()
                .fields(&format!("metadata.name={}", info.target.name));
            let on_refusal = crate::client::cache::OnRefusal::Unsynced;
            tokio::spawn(run_cache(
                api,
                watch,
                cache.clone(),
                project_target,
                on_refusal,
            ));
            cache.wait_ready().await;
            targets.push(TargetCache {
                info: info.clone(),
                resource,
                cache,
            });
        }
        let metrics = Arc::new(Metrics::default());
        ProberContext {
            config,
            seed,
            caches: SeedCaches {
                secrets: Cache::new("secrets"),
                machines: Cache::new("machines"),
                targets,
            },
            events: Events::disabled(metrics.clone()),
            metrics,
            memory: crate::memory_budget::MemoryBudget::unbounded(),
            decisions: Arc::new(crate::decisions::DecisionLog::new(3)),
        }
    }

    /// A dependentResourceInfos entry (YAML) for `reference` (the fields of `ref`), with
    /// the fields of its scaleUp and scaleDown.
    fn entry(reference: &str, up: &str, down: &str) -> String {
        format!("- ref: {{{reference}}}\n  scaleUp: {{{up}}}\n  scaleDown: {{{down}}}\n")
    }

    /// [`entry`] for Deployment `name`.
    fn deployment(name: &str, up: &str, down: &str) -> String {
        entry(
            &format!("apiVersion: apps/v1, kind: Deployment, name: {name}"),
            up,
            down,
        )
    }

    /// `entry`, optional.
    fn optional(entry: String) -> String {
        entry.replacen('\n', "\n  optional: true\n", 1)
    }

    /// kcm down at level 0 and up at 1; mcm at level 1 both ways.
    fn kcm_mcm() -> String {
        deployment("kcm", "level: 1", "level: 0") + &deployment("mcm", "level: 1", "level: 1")
    }

    fn deployments(fake: &FakeSeed, ns: &str, replicas: i32, annotations: &[(&str, &str)]) {
        for name in ["kcm", "mcm"] {
            fake.create(&DEPLOYMENT, ns, name, replicas, annotations);
        }
    }

    /// Runs the flow of `dir` over all of `ns`'s targets.
    async fn flow(
        ctx: &ProberContext,
        ns: &str,
        dir: Direction,
    ) -> std::result::Result<FlowReport, Box<FlowError>> {
        run_flow(ctx, ns, &planned(ctx, ns, dir), &CancellationToken::new()).await
    }

    /// The flow of `dir` over all of `ns`'s targets, its intent judged from the caches now.
    fn planned(ctx: &ProberContext, ns: &str, dir: Direction) -> PlannedFlow {
        PlannedFlow {
            intent: intent_from_caches(ctx, ns, dir, FlowScope::All),
            reason: "test".into(),
            decision: None,
        }
    }

    /// (answer, time since `start`) of each write.
    fn writes_answered(fake: &FakeSeed, start: Instant) -> Vec<(u16, Duration)> {
        fake.writes()
            .iter()
            .map(|w| (w.status, w.at - start))
            .collect()
    }

    /// A ReplicationController kcm of 3 replicas in `ns`, scaled through its scale
    /// subresource at level 0 both ways, and a context for it.
    async fn one_rc(fake: &FakeSeed, ns: &str) -> ProberContext {
        fake.create(&RC, ns, "kcm", 3, &[]);
        let reference = "apiVersion: v1, kind: ReplicationController, name: kcm";
        context(fake, &entry(reference, "level: 0", "level: 0"), &[]).await
    }

    /// When the first successful write to `name` happened.
    fn written_at(writes: &[Call], name: &str) -> Instant {
        writes
            .iter()
            .find(|w| w.status == 200 && w.path.contains(&format!("/{name}")))
            .unwrap_or_else(|| panic!("no write to {name}: {writes:?}"))
            .at
    }

    #[tokio::test(start_paused = true)]
    async fn a_stopped_flow_finishes_the_step_it_started_and_starts_no_other() {
        let fake = FakeSeed::default();
        fake.create(&RC, "stop", "kcm", 3, &[]);
        fake.create(&DEPLOYMENT, "stop", "mcm", 2, &[]);
        let rc = "apiVersion: v1, kind: ReplicationController, name: kcm";
        let infos = entry(rc, "level: 0", "level: 0") + &deployment("mcm", "level: 1", "level: 1");
        let mut ctx = context(&fake, &infos, &[]).await;
        // One write at hand, the next after 1 s.
        ctx.seed = fake.limited_client(1.0, 1);
        let stop = CancellationToken::new();
        let planned = planned(&ctx, "stop", Direction::Down);
        let start = Instant::now();
        // Stopped while kcm's step (record, then scale) waits for its second write.
        let (report, ()) = tokio::join!(run_flow(&ctx, "stop", &planned, &stop), async {
            tokio::time::sleep(Duration::from_millis(500)).await;
            stop.cancel();
        });
        let report = report.expect("a stopped flow is not a failed one");
        assert!(report.superseded);
        assert_eq!(report.changed(), ["kcm"]);
        // The step's second write went when the budget gave it; mcm (level 1) was never
        // written.
        assert_eq!(
            writes_answered(&fake, start),
            [(200, Duration::ZERO), (200, Duration::from_secs(1))]
        );
        let kcm = fake.object("replicationcontrollers", "stop", "kcm");
        assert_eq!(kcm["spec"]["replicas"], 0, "{kcm}");
        assert_eq!(
            kcm["metadata"]["annotations"][REPLICAS_ANNOTATION], "3",
            "{kcm}"
        );
        let mcm = fake.object("deployments", "stop", "mcm");
        assert_eq!(mcm["spec"]["replicas"], 2, "{mcm}");
        // A flow stopped before it began sends nothing.
        let report = run_flow(&ctx, "stop", &planned, &stop).await.expect("flow");
        assert!(report.superseded && report.targets.is_empty());
        assert_eq!(fake.writes().len(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_stopped_flow_ends_only_once_the_cache_shows_its_last_write_so_the_next_flow_undoes_it()
     {
        let fake = FakeSeed::default();
        fake.create(&DEPLOYMENT, "race", "kcm", 2, &[]);
        let ctx = context(&fake, &deployment("kcm", "level: 0", "level: 0"), &[]).await;
        // The watch trails the writes by 2 s: for that long the cache still says 2.
        fake.lock().watch_delay = Some(Duration::from_secs(2));
        let stop = CancellationToken::new();
        let down = planned(&ctx, "race", Direction::Down);
        // Superseded right after its write was answered, while it waits for the goal.
        let (report, ()) = tokio::join!(run_flow(&ctx, "race", &down, &stop), async {
            tokio::time::sleep(Duration::from_millis(100)).await;
            stop.cancel();
        });
        assert_eq!(report.expect("flow").changed(), ["kcm"]);
        let kcm = fake.object("deployments", "race", "kcm");
        assert_eq!(kcm["spec"]["replicas"], 0, "{kcm}");
        // The superseding scale-up plans from the cache at once, as the executor starts it.
        let report = flow(&ctx, "race", Direction::Up).await.expect("flow");
        assert_eq!(report.changed(), ["kcm"], "{report:?}");
        let kcm = fake.object("deployments", "race", "kcm");
        assert_eq!(kcm["spec"]["replicas"], 2, "{kcm}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_write_waits_for_the_seed_budget_longer_than_its_timeout_and_is_sent_once() {
        let fake = FakeSeed::default();
        deployments(&fake, "queue", 2, &[]);
        // Both at level 0 (30 s timeout): one write at hand, the next after 100 s.
        let infos =
            deployment("kcm", "level: 0", "level: 0") + &deployment("mcm", "level: 0", "level: 0");
        let mut ctx = context(&fake, &infos, &[]).await;
        ctx.seed = fake.limited_client(0.01, 1);
        let start = Instant::now();
        let report = flow(&ctx, "queue", Direction::Down).await.expect("flow");
        assert_eq!(report.changed(), ["kcm", "mcm"]);
        // Each write sent once, the second when the budget gave it: no attempt timed out in
        // the queue.
        assert_eq!(
            writes_answered(&fake, start),
            [(200, Duration::ZERO), (200, Duration::from_secs(100))]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_lagging_target_holds_its_level_at_most_five_seconds() {
        let fake = FakeSeed::default();
        fake.lock().status_delay = None; // status never follows
        deployments(&fake, "lag", 2, &[]);
        let ctx = context(&fake, &kcm_mcm(), &[]).await;
        let start = Instant::now();
        let report = flow(&ctx, "lag", Direction::Down).await.expect("flow");
        assert_eq!(report.changed(), ["kcm", "mcm"]);
        let writes = fake.writes();
        assert_eq!(written_at(&writes, "kcm") - start, Duration::ZERO);
        // The reference's fixed wait, not the target's 30 s timeout.
        assert_eq!(written_at(&writes, "mcm") - start, READINESS_WAIT);
        assert_eq!(writes.len(), 2, "{writes:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn the_next_level_starts_as_soon_as_the_targets_are_ready() {
        let fake = FakeSeed::default();
        fake.lock().status_delay = Some(Duration::from_millis(1200));
        deployments(&fake, "quick", 2, &[]);
        let ctx = context(&fake, &kcm_mcm(), &[]).await;
        let start = Instant::now();
        flow(&ctx, "quick", Direction::Down).await.expect("flow");
        let writes = fake.writes();
        assert_eq!(
            written_at(&writes, "mcm") - start,
            Duration::from_millis(1200)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn initial_delay_is_slept_once_per_flow_not_once_per_attempt() {
        let fake = FakeSeed::default();
        deployments(&fake, "delay", 2, &[]);
        fake.lock().fail_writes.push_back((500, None));
        let kcm = deployment("kcm", "level: 0", "level: 0, initialDelay: 2s");
        let ctx = context(&fake, &kcm, &[]).await;
        let start = Instant::now();
        flow(&ctx, "delay", Direction::Down).await.expect("flow");
        let at = writes_answered(&fake, start);
        // Failed at 2 s, retried 100 ms later (the reference sleeps the 2 s again).
        assert_eq!(
            at,
            [
                (500, Duration::from_secs(2)),
                (200, Duration::from_millis(2100))
            ]
        );
    }

    /// Collects what `tracing` writes while it lives (this thread only).
    #[derive(Default)]
    struct Logs(LogBuffer);

    impl Logs {
        fn capture(&self) -> tracing::subscriber::DefaultGuard {
            let logs = self.0.clone();
            let subscriber = tracing_subscriber::fmt()
                .with_writer(move || logs.clone())
                .with_ansi(false)
                .with_max_level(tracing::Level::WARN)
                .finish();
            tracing::subscriber::set_default(subscriber)
        }

        fn count(&self, needle: &str) -> usize {
            String::from_utf8_lossy(&self.0.bytes())
                .matches(needle)
                .count()
        }
    }

    #[tokio::test(start_paused = true)]
    async fn an_unusable_record_restores_one_replica_and_is_warned_about_once() {
        let logs = Logs::default();
        let _guard = logs.capture();
        let fake = FakeSeed::default();
        for (name, record) in [("kcm", "0"), ("mcm", "garbage")] {
            fake.create(
                &DEPLOYMENT,
                "bad",
                name,
                0,
                &[(REPLICAS_ANNOTATION, record), (MELTDOWN_ANNOTATION, "")],
            );
        }
        let ctx = context(&fake, &kcm_mcm(), &[]).await;
        // Two runs whose writes are refused: the problem stays, the warning is said once.
        for _ in 0..2 {
            fake.lock().fail_writes.extend([(403, None); 6]);
            flow(&ctx, "bad", Direction::Up).await.expect_err("refused");
        }
        assert_eq!(logs.count("\"garbage\" is not a valid replica count"), 1);
        assert_eq!(logs.count("\"0\" is not a valid replica count"), 1);
        // Then the write goes through: 1 replica, neither annotation left behind.
        fake.lock().status_delay = Some(Duration::ZERO);
        let report = flow(&ctx, "bad", Direction::Up).await.expect("flow");
        assert_eq!(report.changed(), ["kcm", "mcm"]);
        for name in ["kcm", "mcm"] {
            let object = fake.object("deployments", "bad", name);
            assert_eq!(object["spec"]["replicas"], 1, "{object}");
            assert_eq!(object["metadata"]["annotations"], json!({}), "{object}");
        }
        // The same problem on another shoot is its own.
        assert!(first_time("other", "kcm", Some("x")));
        assert!(!first_time("other", "kcm", Some("x")));
        assert!(first_time("other", "kcm", Some("y")));
        assert!(!first_time("other", "kcm", None));
        assert!(first_time("other", "kcm", Some("y")));
    }

    #[tokio::test(start_paused = true)]
    async fn scale_subresource_writes_carry_the_version_they_were_decided_from() {
        let fake = FakeSeed::default();
        fake.lock().status_delay = Some(Duration::ZERO);
        let ctx = one_rc(&fake, "rc").await;
        let rv = |o: &Value| {
            o["metadata"]["resourceVersion"]
                .as_str()
                .expect("rv")
                .to_owned()
        };
        let before = rv(&fake.object("replicationcontrollers", "rc", "kcm"));
        flow(&ctx, "rc", Direction::Down).await.expect("down");
        let writes = fake.writes();
        assert_eq!(writes.len(), 2, "{writes:?}");
        // Annotations first, conditional on the cached version; then the scale, conditional
        // on the version the first write produced.
        assert!(!writes[0].path.ends_with("/scale"));
        assert_eq!(writes[0].body["metadata"]["resourceVersion"], json!(before));
        assert_eq!(
            writes[0].body["metadata"]["annotations"][REPLICAS_ANNOTATION],
            "3"
        );
        assert!(writes[1].path.ends_with("/scale"));
        assert_eq!(writes[1].body["spec"]["replicas"], 0);
        let after_first: u64 = before.parse::<u64>().expect("rv") + 1;
        assert_eq!(
            writes[1].body["metadata"]["resourceVersion"],
            json!(after_first.to_string())
        );

        // Up: the scale first, conditional on the cached version; then the annotations'
        // removal, conditional on the version the scale produced.
        let cached = rv(&fake.object("replicationcontrollers", "rc", "kcm"));
        flow(&ctx, "rc", Direction::Up).await.expect("up");
        let writes = &fake.writes()[2..];
        assert!(writes[0].path.ends_with("/scale"));
        assert_eq!(writes[0].body["metadata"]["resourceVersion"], json!(cached));
        assert_eq!(writes[0].body["spec"]["replicas"], 3);
        let scaled: u64 = cached.parse::<u64>().expect("rv") + 1;
        assert_eq!(
            writes[1].body["metadata"]["resourceVersion"],
            json!(scaled.to_string())
        );
        let object = fake.object("replicationcontrollers", "rc", "kcm");
        assert_eq!(object["spec"]["replicas"], 3);
        assert_eq!(object["metadata"]["annotations"], json!({}));
    }

    #[tokio::test(start_paused = true)]
    async fn a_stale_version_conflicts_instead_of_overwriting() {
        let fake = FakeSeed::default();
        let ctx = one_rc(&fake, "stale").await;
        // The apiserver has moved on without the watch telling us (yet).
        {
            let mut s = fake.lock();
            s.rv += 1;
            let rv = s.rv.to_string();
            let key = (
                "replicationcontrollers".to_owned(),
                "stale".to_owned(),
                "kcm".to_owned(),
            );
            s.objects.get_mut(&key).expect("rc")["metadata"]["resourceVersion"] = json!(rv);
        }
        let failure = flow(&ctx, "stale", Direction::Down)
            .await
            .expect_err("every attempt conflicts");
        assert!(failure.error.is_conflict(), "{}", failure.error);
        let object = fake.object("replicationcontrollers", "stale", "kcm");
        assert_eq!(
            object["spec"]["replicas"], 3,
            "nothing overwritten: {object}"
        );
        assert!(fake.writes().iter().all(|w| w.status == 409));
    }

    #[tokio::test(start_paused = true)]
    async fn an_optional_target_whose_kind_is_not_served_is_skipped_a_mandatory_one_fails() {
        let fake = FakeSeed::default();
        deployments(&fake, "kinds", 2, &[]);
        let gadget = entry(
            "apiVersion: example.com/v1, kind: Gadget, name: gadget",
            "level: 0",
            "level: 0",
        );
        let kcm = deployment("kcm", "level: 1", "level: 1");
        let ctx = context(&fake, &(optional(gadget.clone()) + &kcm), &["gadget"]).await;
        assert_eq!(
            intent_from_caches(&ctx, "kinds", Direction::Down, FlowScope::All).taken_up(),
            ["kcm"]
        );
        let report = flow(&ctx, "kinds", Direction::Down).await.expect("flow");
        assert_eq!(report.changed(), ["kcm"]);

        let mandatory = gadget + &kcm;
        let ctx = context(&fake, &mandatory, &["gadget"]).await;
        assert_eq!(
            intent_from_caches(&ctx, "kinds", Direction::Up, FlowScope::All).taken_up(),
            ["gadget", "kcm"]
        );
        let failure = flow(&ctx, "kinds", Direction::Up)
            .await
            .expect_err("mandatory target without a served kind");
        assert_eq!(failure.target, "gadget");
        assert!(
            failure.error.to_string().contains("example.com/v1/Gadget"),
            "{}",
            failure.error
        );
    }

    #[tokio::test(start_paused = true)]
    async fn targets_in_scope_ignore_what_was_done_to_them_but_not_ignore_scaling() {
        let fake = FakeSeed::default();
        // kcm already scaled down and marked (by the acting watchdog), mcm to be left alone.
        fake.create(
            &DEPLOYMENT,
            "scope",
            "kcm",
            0,
            &[(MELTDOWN_ANNOTATION, ""), (REPLICAS_ANNOTATION, "2")],
        );
        fake.create(
            &DEPLOYMENT,
            "scope",
            "mcm",
            2,
            &[(dwd_core::scaling::IGNORE_SCALING_ANNOTATION, "true")],
        );
        let infos = [
            deployment("mcm", "level: 0", "level: 1"),
            deployment("kcm", "level: 1", "level: 0"),
            optional(deployment("absent-optional", "level: 0", "level: 0")),
            deployment("absent-mandatory", "level: 0", "level: 2"),
        ]
        .concat();
        let ctx = context(&fake, &infos, &[]).await;
        // Level order of the scale-down flow; kcm though it is already down.
        assert_eq!(
            intent_from_caches(&ctx, "scope", Direction::Down, FlowScope::All).in_scope(),
            ["kcm", "absent-mandatory"]
        );
        assert!(
            intent_from_caches(&ctx, "scope", Direction::Down, FlowScope::All)
                .taken_up()
                .iter()
                .all(|t| t != "kcm")
        );
        // None of them is zonal; and which are in scope does not depend on the direction
        // (a scale-up names them in its own level order).
        assert!(
            intent_from_caches(&ctx, "scope", Direction::Up, FlowScope::Zonal)
                .in_scope()
                .is_empty()
        );
        assert_eq!(
            intent_from_caches(&ctx, "scope", Direction::Up, FlowScope::All).in_scope(),
            ["absent-mandatory", "kcm"]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_429_with_retry_after_is_retried_within_the_call_and_a_long_one_returns_the_429() {
        let fake = FakeSeed::default();
        fake.lock().status_delay = Some(Duration::ZERO);
        fake.create(&DEPLOYMENT, "busy", "kcm", 2, &[]);
        let kcm = deployment("kcm", "level: 0, timeout: 3s", "level: 0, timeout: 3s");
        let ctx = context(&fake, &kcm, &[]).await;
        let start = Instant::now();
        fake.lock()
            .fail_writes
            .extend([(429, Some("1")), (503, Some("1"))]);
        let report = flow(&ctx, "busy", Direction::Down).await.expect("flow");
        assert_eq!(report.changed(), ["kcm"]);
        assert!(!report.throttled);
        // One attempt: answered 429 and 503, each retried after its second.
        let at = writes_answered(&fake, start);
        assert_eq!(
            at,
            [
                (429, Duration::ZERO),
                (503, Duration::from_secs(1)),
                (200, Duration::from_secs(2))
            ]
        );

        // A wait longer than the call's 3 s is not started: each attempt sees its 429 (not a
        // timeout), and the flow reports being throttled (the next run is spaced out).
        fake.lock().fail_writes.extend([(429, Some("5")); 3]);
        let failure = flow(&ctx, "busy", Direction::Up)
            .await
            .expect_err("throttled");
        assert!(failure.error.is_throttled(), "{}", failure.error);
        assert_eq!(fake.writes().len(), 6);
    }
}
