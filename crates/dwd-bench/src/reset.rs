//! Back to steady state between two runs on one world (compare mode): every shoot apiserver
//! up and fast, every kubelet renewing and every lease fresh, every target at its original
//! replicas without the watchdog's annotations. The next binary must find exactly the world
//! the first one found, or the comparison compares worlds, not binaries.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use chrono::Utc;
use dwd_sim::seed::DEFAULT_DEPLOYMENTS;
use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams};
use serde_json::{Value, json};

use crate::Cli;
use crate::setup::World;

// The meltdown marker is set while the watchdog protects a target (the reference removes it
// after scale-up); the replicas record stays after scale-up in the reference (harmless for it,
// but the next binary must start from the same objects).
use dwd_core::scaling::{MELTDOWN_ANNOTATION, REPLICAS_ANNOTATION};

/// Writes in flight while repairing targets.
const REPAIR_CONCURRENCY: usize = 16;

/// A target that is not as the world was built.
struct Off {
    namespace: String,
    name: String,
    want: i32,
    replicas: i32,
    meltdown: bool,
    recorded: bool,
}

/// Targets not at their original replicas or still carrying the watchdog's annotations.
async fn off_targets(world: &World) -> Result<Vec<Off>> {
    let api: Api<Deployment> = Api::all(world.seed_client.clone());
    let list = api
        .list(&ListParams::default())
        .await
        .context("list Deployments")?;
    let mut off = Vec::new();
    for d in list {
        let (Some(namespace), Some(name)) = (d.metadata.namespace.clone(), d.metadata.name.clone())
        else {
            continue;
        };
        let Some(want) = DEFAULT_DEPLOYMENTS
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, r)| *r)
        else {
            continue;
        };
        let replicas = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
        let annotations = d.metadata.annotations.unwrap_or_default();
        let meltdown = annotations.contains_key(MELTDOWN_ANNOTATION);
        let recorded = annotations.contains_key(REPLICAS_ANNOTATION);
        if replicas != want || meltdown || recorded {
            off.push(Off {
                namespace,
                name,
                want,
                replicas,
                meltdown,
                recorded,
            });
        }
    }
    Ok(off)
}

/// Nodes whose last renewal is older than `max_age` (their kubelets are not keeping up, or
/// their apiserver was stopped).
fn stale_nodes(world: &World, max_age: Duration) -> usize {
    let now = Utc::now();
    let max_age = chrono::Duration::from_std(max_age).unwrap_or(chrono::Duration::MAX);
    world
        .shoots
        .iter()
        .map(|s| {
            let renewals = s.sim.kubelets().renewals();
            s.sim
                .kubelets()
                .nodes()
                .iter()
                .filter(|n| renewals.get(*n).is_none_or(|t| now - *t > max_age))
                .count()
        })
        .sum()
}

/// Brings the prober world back to steady state after a run (whose watchdog has been
/// stopped): waits (with a deadline) for the kubelets to renew every lease, then repairs
/// the targets the watchdog left scaled down (nobody else would restore them). Returns what
/// had to be repaired (JSON, for the next run's result).
pub(crate) async fn prober_world(cli: &Cli, world: &World) -> Result<Value> {
    let started = Instant::now();
    for (j, api) in world.shoot_apis.iter().enumerate() {
        api.set_latency(Duration::ZERO);
        if !api.is_running() {
            eprintln!("reset: starting shoot apiserver {j} again");
            api.start()
                .await
                .with_context(|| format!("restart shoot apiserver {j}"))?;
        }
    }
    for shoot in &world.shoots {
        shoot.sim.kubelets().resume_all();
    }
    // Fresh: renewed within halfway between the renew interval and expiry (0.75 × grace),
    // so no lease can expire during the next warm-up.
    let validity = cli.kcm_grace.mul_f64(0.75);
    let max_age = cli.renew_interval + validity.saturating_sub(cli.renew_interval) / 2;
    let deadline = (cli.renew_interval * 3).max(Duration::from_secs(60)) + Duration::from_secs(30);
    let mut last_print = Instant::now();
    loop {
        let off = off_targets(world).await?;
        // The reference leaves the recorded replicas after scale-up: not a sign of a flow
        // still running, so it alone doesn't keep us waiting.
        let busy = off
            .iter()
            .filter(|o| o.replicas != o.want || o.meltdown)
            .count();
        let stale = stale_nodes(world, max_age);
        if busy == 0 && stale == 0 {
            let cleaned = clean_recorded(world, &off).await?;
            eprintln!(
                "reset: steady after {:.1}s{}",
                started.elapsed().as_secs_f64(),
                if cleaned > 0 {
                    format!(" (removed {cleaned} leftover replicas annotations)")
                } else {
                    String::new()
                }
            );
            return Ok(
                json!({"repaired_targets": 0, "replicas_annotations_removed": cleaned,
                             "seconds": started.elapsed().as_secs_f64()}),
            );
        }
        if stale == 0 {
            eprintln!(
                "reset: {busy} target(s) left scaled down by the stopped watchdog; repairing them"
            );
            repair(world, &off).await?;
            return Ok(json!({"repaired_targets": busy,
                             "repaired": off.iter().filter(|o| o.replicas != o.want || o.meltdown)
                                 .map(|o| format!("{}/{}", o.namespace, o.name)).collect::<Vec<_>>(),
                             "seconds": started.elapsed().as_secs_f64()}));
        }
        if started.elapsed() >= deadline {
            bail!(
                "world not steady after {deadline:?}: {stale} node leases older than {max_age:?} \
                 (kubelets can't keep up: raise --renew-interval and --kcm-grace, see the README)"
            );
        }
        if last_print.elapsed() >= Duration::from_secs(10) {
            last_print = Instant::now();
            eprintln!(
                "reset: waiting: {stale} stale lease(s) after {:.0}s ({busy} target(s) to repair)",
                started.elapsed().as_secs_f64()
            );
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

/// Removes the recorded-replicas annotation wherever only that is left.
async fn clean_recorded(world: &World, off: &[Off]) -> Result<usize> {
    let recorded: Vec<&Off> = off.iter().filter(|o| o.recorded).collect();
    let n = recorded.len();
    let results: Vec<Result<()>> = futures::stream::iter(recorded)
        .map(|o| patch(world, o, None))
        .buffer_unordered(REPAIR_CONCURRENCY)
        .collect()
        .await;
    results.into_iter().collect::<Result<Vec<()>>>()?;
    Ok(n)
}

/// Scales every off target back and removes the watchdog's annotations.
async fn repair(world: &World, off: &[Off]) -> Result<()> {
    let results: Vec<Result<()>> = futures::stream::iter(off)
        .map(|o| patch(world, o, Some(o.want)))
        .buffer_unordered(REPAIR_CONCURRENCY)
        .collect()
        .await;
    results.into_iter().collect::<Result<Vec<()>>>()?;
    Ok(())
}

/// Removes both annotations of `o` and, with `replicas`, scales it.
async fn patch(world: &World, o: &Off, replicas: Option<i32>) -> Result<()> {
    let api: Api<Deployment> = Api::namespaced(world.seed_client.clone(), &o.namespace);
    let mut body = json!({"metadata": {"annotations": {MELTDOWN_ANNOTATION: null, REPLICAS_ANNOTATION: null}}});
    if let Some(r) = replicas {
        body["spec"] = json!({"replicas": r});
    }
    api.patch(&o.name, &PatchParams::default(), &Patch::Merge(body))
        .await
        .with_context(|| format!("repair Deployment {}/{}", o.namespace, o.name))?;
    Ok(())
}
