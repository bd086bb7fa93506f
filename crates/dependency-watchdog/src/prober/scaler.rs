//! Executes scaling flows (SPEC §2.3): levels in ascending order, the targets of one level
//! concurrently, a level only after every earlier level succeeded; each target tried up to
//! three times, 100 ms apart. What to do with a target is decided by `dwd_core::scaling`
//! from the watch cache; this module only performs the writes and waits (by watching the
//! cache) until the target reaches its goal.
//!
//! For apps/v1 workloads (Deployment, StatefulSet, ReplicaSet) each step is one merge patch
//! that changes annotations and `spec.replicas` together, with the cached resourceVersion as
//! precondition: atomic, so a crash can't split it, and half the writes of the reference's
//! annotate-then-scale (which matters when a thousand shoots share the seed's QPS budget).
//! Other kinds keep the two writes, in the crash-safe order (annotations first on the way
//! down, replicas first on the way up). Each flow's writes are ranked by level on the seed
//! client's budget ([`crate::rate_limit`]).

use std::time::Duration;

use dwd_core::scaling::{
    clear_annotations_patch, clear_meltdown_patch, decide_target_action, plan_levels,
    replicas_in_spec, scale_down_annotation_patch, scale_down_patch, scale_up_patch,
};
use dwd_core::{Direction, TargetAction, TargetSnapshot};
use kube::Api;
use kube::api::{DynamicObject, Patch, PatchParams};
use tracing::{Instrument, debug, info, info_span, warn};

use super::ProberContext;
use super::seed_caches::TargetCache;
use crate::cache::WaitEnd;
use crate::events::TargetRef;
use crate::metrics::{ApiLabel, ApiLabels, Outcome, ScaleOpLabels};
use crate::rate_limit::{Priority, with_priority};
use crate::{Error, Result};

/// Attempts per target.
pub const ATTEMPTS: u32 = 3;
/// Pause between attempts.
pub const ATTEMPT_INTERVAL: Duration = Duration::from_millis(100);
/// Limit for one API call of the scaler.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// What happened to one target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TargetOutcome {
    /// Replicas changed from `from` to `to` and the target reached its goal.
    Scaled {
        /// Replicas before.
        from: i32,
        /// Replicas after.
        to: i32,
    },
    /// Nothing to scale; why.
    Skipped(String),
}

/// Outcome of a flow: per target, in execution order.
#[derive(Debug, Default)]
pub struct FlowReport {
    /// (target name, outcome).
    pub targets: Vec<(String, TargetOutcome)>,
    /// Whether any call of the flow was answered 429.
    pub throttled: bool,
}

impl FlowReport {
    /// Names of the targets whose replicas changed.
    pub fn changed(&self) -> Vec<&str> {
        self.targets
            .iter()
            .filter(|(_, o)| matches!(o, TargetOutcome::Scaled { .. }))
            .map(|(n, _)| n.as_str())
            .collect()
    }
}

/// A failed flow: the error of the first failed target and what ran before it.
#[derive(Debug)]
pub struct FlowError {
    /// Targets that finished before the failure.
    pub report: FlowReport,
    /// The failed target and why.
    pub target: String,
    /// The error.
    pub error: Error,
}

/// Names of the targets the flow in `dir` would act on, in the flow's level order, judged
/// from the caches (no API call): empty lets a healthy shoot's run end without touching the
/// seed; otherwise it is what the decision event on the Cluster lists.
pub fn targets_to_scale(ctx: &ProberContext, namespace: &str, dir: Direction) -> Vec<String> {
    plan_levels(&ctx.config.dependent_resource_infos, dir)
        .iter()
        .flat_map(|level| level.targets.iter())
        .filter(|info| {
            ctx.caches
                .targets
                .iter()
                .find(|t| t.info == **info)
                .is_some_and(|t| target_needs_flow(t, namespace, dir))
        })
        .map(|info| info.target.name.clone())
        .collect()
}

fn target_needs_flow(t: &TargetCache, namespace: &str, dir: Direction) -> bool {
    if !t.cache.is_ready() {
        return true;
    }
    match t.cache.get(namespace, &t.info.target.name) {
        None => !t.info.optional,
        Some(state) => {
            let snapshot = TargetSnapshot {
                spec_replicas: state.spec_replicas,
                annotations: state.annotations.clone(),
            };
            !matches!(
                decide_target_action(dir, &snapshot),
                Ok(TargetAction::AlreadyDone {
                    clear_marker: false
                }) | Ok(TargetAction::Ignored {
                    clear_marker: false
                })
            )
        }
    }
}

/// Runs the flow in `dir` for shoot `namespace`. `reason` (the lease probe's summary, e.g.
/// "4/5 node leases expired (0.80 ≥ 0.60)") goes into the event on every target it changes.
pub async fn run_flow(
    ctx: &ProberContext,
    namespace: &str,
    dir: Direction,
    reason: &str,
) -> Result<FlowReport, Box<FlowError>> {
    let mut report = FlowReport::default();
    for level in plan_levels(&ctx.config.dependent_resource_infos, dir) {
        let runs = level.targets.iter().map(|info| {
            let target = ctx.caches.targets.iter().find(|t| t.info == *info);
            let name = info.target.name.clone();
            async move {
                let result = match target {
                    // Every shoot's level 0 gets the seed budget before anyone's later levels.
                    Some(t) => with_priority(
                        Priority::scaling_level(level.level),
                        scale_target(ctx, namespace, t, dir, reason),
                    )
                    .instrument(
                        info_span!("scale", target = %name, direction = %dir, level = level.level),
                    )
                    .await,
                    None => Err(Error::Scaling(format!("target {name} has no cache"))),
                };
                (name, result)
            }
        });
        let results = futures::future::join_all(runs).await;
        let mut failure = None;
        for (name, result) in results {
            let labels = |outcome| ScaleOpLabels {
                direction: dir.into(),
                target: name.clone(),
                outcome,
            };
            match result {
                Ok(outcome) => {
                    let o = if matches!(outcome, TargetOutcome::Scaled { .. }) {
                        Outcome::Scaled
                    } else {
                        Outcome::Skipped
                    };
                    ctx.metrics.scale_operations.get_or_create(&labels(o)).inc();
                    report.targets.push((name, outcome));
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
        if let Some((target, error)) = failure {
            return Err(Box::new(FlowError {
                report,
                target,
                error,
            }));
        }
    }
    Ok(report)
}

async fn scale_target(
    ctx: &ProberContext,
    namespace: &str,
    target: &TargetCache,
    dir: Direction,
    reason: &str,
) -> Result<TargetOutcome> {
    let scale_info = match dir {
        Direction::Up => &target.info.scale_up,
        Direction::Down => &target.info.scale_down,
    };
    if !scale_info.initial_delay.is_zero() {
        tokio::time::sleep(scale_info.initial_delay).await;
    }
    let mut attempt = 1;
    loop {
        let seen = cached_version(target, namespace);
        match attempt_once(ctx, namespace, target, dir, scale_info.timeout, reason).await {
            Ok(outcome) => return Ok(outcome),
            Err(error) if attempt < ATTEMPTS => {
                warn!(attempt, %error, "scaling attempt failed, retrying");
                attempt += 1;
                tokio::time::sleep(ATTEMPT_INTERVAL).await;
                if error.is_conflict() {
                    // The write was based on an older version than the apiserver's; retrying
                    // before the watch has brought the newer one would only conflict again.
                    wait_for_newer(target, namespace, &seen, CALL_TIMEOUT).await;
                }
            }
            Err(error) => {
                let uid = target
                    .cache
                    .get(namespace, &target.info.target.name)
                    .and_then(|s| s.uid.clone());
                ctx.events.target_failed(
                    target_ref(namespace, target, uid.as_deref()),
                    &target.resource,
                    dir,
                    attempt,
                    &error.to_string(),
                    reason,
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

async fn call<T>(
    ctx: &ProberContext,
    action: String,
    fut: impl std::future::Future<Output = kube::Result<T>>,
) -> Result<T> {
    ctx.metrics
        .api_requests
        .get_or_create(&ApiLabels {
            api: ApiLabel::Seed,
        })
        .inc();
    match tokio::time::timeout(CALL_TIMEOUT, fut).await {
        Err(_) => Err(Error::Timeout {
            action,
            timeout: CALL_TIMEOUT,
        }),
        Ok(Err(e)) => {
            let err = Error::kube(action, e);
            if err.is_throttled() {
                ctx.metrics
                    .throttled_responses
                    .get_or_create(&ApiLabels {
                        api: ApiLabel::Seed,
                    })
                    .inc();
            }
            Err(err)
        }
        Ok(Ok(v)) => Ok(v),
    }
}

/// One merge patch of the target object, through [`call`].
async fn merge_patch(
    ctx: &ProberContext,
    api: &Api<DynamicObject>,
    name: &str,
    action: String,
    patch: &serde_json::Value,
) -> Result<DynamicObject> {
    call(
        ctx,
        action,
        api.patch(name, &PatchParams::default(), &Patch::Merge(patch)),
    )
    .await
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

async fn attempt_once(
    ctx: &ProberContext,
    namespace: &str,
    target: &TargetCache,
    dir: Direction,
    timeout: Duration,
    reason: &str,
) -> Result<TargetOutcome> {
    let r = &target.info.target;
    let what = format!("{} {namespace}/{}", r.kind, r.name);
    if !target.cache.is_ready() {
        return Err(Error::Scaling(format!(
            "{what}: target cache not synced yet"
        )));
    }
    let Some(state) = target.cache.get(namespace, &r.name) else {
        if target.info.optional {
            debug!("optional target not found, nothing to do");
            return Ok(TargetOutcome::Skipped("optional target not found".into()));
        }
        return Err(Error::Scaling(format!(
            "{what} not found (and not optional)"
        )));
    };
    let snapshot = TargetSnapshot {
        spec_replicas: state.spec_replicas,
        annotations: state.annotations.clone(),
    };
    let action =
        decide_target_action(dir, &snapshot).map_err(|e| Error::Scaling(format!("{what}: {e}")))?;
    let api: Api<DynamicObject> =
        Api::namespaced_with(ctx.seed.clone(), namespace, &target.resource);
    let pp = PatchParams::default();
    // apps/v1 workloads: one write per step; other kinds: annotations and scale subresource.
    let one_patch = replicas_in_spec(&r.api_version, &r.kind);
    match action {
        TargetAction::Ignored { clear_marker } => {
            if clear_marker {
                let patch = clear_meltdown_patch();
                merge_patch(
                    ctx,
                    &api,
                    &r.name,
                    format!("removing meltdown annotation of {what}"),
                    &patch,
                )
                .await?;
            }
            info!("ignore-scaling is set, target left alone");
            Ok(TargetOutcome::Skipped("ignore-scaling annotation".into()))
        }
        TargetAction::AlreadyDone { clear_marker } => {
            if clear_marker {
                let patch = clear_annotations_patch();
                merge_patch(
                    ctx,
                    &api,
                    &r.name,
                    format!("removing annotations of {what}"),
                    &patch,
                )
                .await?;
            }
            Ok(TargetOutcome::Skipped(format!(
                "already at {} replicas",
                state.spec_replicas
            )))
        }
        TargetAction::ScaleDown { record_replicas } => {
            let uid = if one_patch {
                // Annotations and replicas in one atomic write.
                let patch = scale_down_patch(record_replicas, state.resource_version.as_deref());
                let patched = merge_patch(
                    ctx,
                    &api,
                    &r.name,
                    format!("scaling {what} to 0 (recording {record_replicas} replicas)"),
                    &patch,
                )
                .await?;
                patched.metadata.uid
            } else {
                // Record first, then scale: a crash in between leaves the recorded count behind.
                let patch = scale_down_annotation_patch(record_replicas);
                let recorded = merge_patch(
                    ctx,
                    &api,
                    &r.name,
                    format!("recording replicas of {what}"),
                    &patch,
                )
                .await?;
                let scale = serde_json::json!({"spec": {"replicas": 0}});
                call(
                    ctx,
                    format!("scaling {what} to 0"),
                    api.patch_scale(&r.name, &pp, &Patch::Merge(&scale)),
                )
                .await?;
                recorded.metadata.uid
            };
            info!(from = record_replicas, to = 0, "scaled down");
            // Reported when the replicas changed, not when the goal is reached: a retry after
            // a slow goal finds the target already scaled and would report nothing.
            ctx.events.target_scaled(
                target_ref(namespace, target, uid.as_deref()),
                dir,
                record_replicas,
                0,
                reason,
            );
            wait_for_goal(target, namespace, &what, timeout, |s| {
                s.spec_replicas == 0 && s.ready_replicas == 0
            })
            .await?;
            Ok(TargetOutcome::Scaled {
                from: record_replicas,
                to: 0,
            })
        }
        TargetAction::ScaleUp { replicas } => {
            let uid = if one_patch {
                let patch = scale_up_patch(replicas, state.resource_version.as_deref());
                let patched = merge_patch(
                    ctx,
                    &api,
                    &r.name,
                    format!("scaling {what} to {replicas}"),
                    &patch,
                )
                .await?;
                patched.metadata.uid
            } else {
                let scale = serde_json::json!({"spec": {"replicas": replicas}});
                let scaled = call(
                    ctx,
                    format!("scaling {what} to {replicas}"),
                    api.patch_scale(&r.name, &pp, &Patch::Merge(&scale)),
                )
                .await?;
                let patch = clear_annotations_patch();
                merge_patch(
                    ctx,
                    &api,
                    &r.name,
                    format!("removing annotations of {what}"),
                    &patch,
                )
                .await?;
                // The Scale subresource carries its parent's UID.
                scaled.metadata.uid
            };
            ctx.events.target_scaled(
                target_ref(namespace, target, uid.as_deref()),
                dir,
                state.spec_replicas,
                replicas,
                reason,
            );
            info!(from = 0, to = replicas, "scaled up");
            wait_for_goal(target, namespace, &what, timeout, |s| {
                s.spec_replicas == replicas && s.ready_replicas >= 1
            })
            .await?;
            Ok(TargetOutcome::Scaled {
                from: 0,
                to: replicas,
            })
        }
    }
}

/// Waits (watching the cache, no polling) until the target's state satisfies `goal`.
async fn wait_for_goal(
    target: &TargetCache,
    namespace: &str,
    what: &str,
    timeout: Duration,
    goal: impl Fn(&super::seed_caches::TargetState) -> bool,
) -> Result<()> {
    let name = &target.info.target.name;
    let reached = target
        .cache
        .wait_until(namespace, name, timeout, |s| s.is_some_and(&goal))
        .await;
    match reached {
        Ok(()) => Ok(()),
        Err(WaitEnd::Closed) => Err(Error::Scaling(format!(
            "{what}: target cache closed while waiting"
        ))),
        Err(WaitEnd::TimedOut) => Err(Error::Timeout {
            action: format!("waiting for {what} to reach its replicas"),
            timeout,
        }),
    }
}
