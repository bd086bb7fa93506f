//! The weeder storm: `--shoots` namespaces, each with an `etcd-main-client` EndpointSlice
//! that is not ready, a crash-looping pod labelled like Gardener's kube-apiserver
//! (`gardener.cloud/role=controlplane`, `role=apiserver`) and a healthy one. The weeder runs
//! Gardener's config (`deploy/gardener/weeder.yaml`) unchanged. Once the weeder is watching, every slice turns ready at once; the
//! weeder must delete each crash-looping pod (and no healthy one). Per pod the bench times
//! its namespace's slice write response → the pod's deletion seen by the bench's own watch.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use chrono::{DateTime, Utc};
use dwd_sim::{AbortOnDrop, EndpointsState, SeedControlPlane};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::ListParams;
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::{Value, json};

use crate::chart::{self, Dists};
use crate::gardener;
use crate::scenario::{
    self, Measured, RunOutput, Watchdog, WindowEnd, WindowSizes, secs, sleep_watching,
};
use crate::setup::{self, World, lock};
use crate::stats::Summary;
use crate::{Cli, Subject, procstat};

/// The service whose readiness releases the pods (the seeds' example: etcd).
const SERVICE: &str = "etcd-main-client";
/// The pod the weeder must delete.
const CRASHING_POD: &str = "kube-apiserver-crashlooping";
/// The pod the weeder must keep (same labels, running and ready).
const HEALTHY_POD: &str = "kube-apiserver-healthy";
/// Label of both pods that Gardener's weeder config selects on `role In [apiserver]`; the
/// bench's own pod watch selects on it too.
const ROLE: (&str, &str) = ("role", "apiserver");
/// Labels of both pods: Gardener's for a kube-apiserver pod.
const LABELS: [(&str, &str); 2] = [ROLE, ("gardener.cloud/role", "controlplane")];
/// Endpoints in each slice (one not-ready endpoint keeps the whole slice not ready).
const ENDPOINTS: usize = 1;
/// Namespaces populated, reset or flipped at once.
const CONCURRENCY: usize = 32;
/// The weeder must be watching EndpointSlices within this (else the run goes on, with a
/// warning: a binary that never watches simply never weeds).
const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// The weeder config: Gardener's, unchanged (etcd-main-client releases kube-apiservers,
/// kube-apiserver releases the other control-plane pods; watchDuration 5m0s).
pub(crate) fn config() -> Result<gardener::Derived<dwd_core::WeederConfig>> {
    gardener::weeder(None)
}

/// `(namespace, pod)` → every deletion the bench's watch saw, stamped on arrival.
type DeletionLog = Arc<Mutex<HashMap<(String, String), Vec<DateTime<Utc>>>>>;

/// The storm's namespaces and the bench's pod deletion watch.
pub(crate) struct Storm {
    namespaces: Vec<String>,
    deletions: DeletionLog,
    _watch: AbortOnDrop,
}

/// Creates `n` namespaces with a not-ready slice, a crash-looping and a healthy pod each.
pub(crate) async fn populate(world: &mut World, n: usize) -> Result<()> {
    let started = Instant::now();
    let deletions: DeletionLog = Arc::default();
    let watch = AbortOnDrop::spawn(watch_deletions(
        world.seed_client.clone(),
        deletions.clone(),
    ));
    let namespaces: Vec<String> = (0..n).map(setup::shoot_namespace).collect();
    let client = world.seed_client.clone();
    let mut done = 0usize;
    let mut stream = futures::stream::iter(namespaces.clone())
        .map(|ns| {
            let seed = SeedControlPlane::new(client.clone(), ns);
            async move {
                seed.create_namespace().await?;
                seed.set_endpoint_slice(SERVICE, ENDPOINTS, EndpointsState::NotReady)
                    .await?;
                seed.create_crashlooping_pod(CRASHING_POD, &LABELS).await?;
                seed.create_running_pod(HEALTHY_POD, &LABELS).await?;
                anyhow::Ok(())
            }
        })
        .buffer_unordered(CONCURRENCY);
    while stream.try_next().await?.is_some() {
        done += 1;
        if done.is_multiple_of(100) || done == n {
            eprintln!(
                "setup: {done}/{n} weeder namespaces after {:.1}s",
                started.elapsed().as_secs_f64()
            );
        }
    }
    drop(stream);
    world.setup_seconds += started.elapsed().as_secs_f64();
    world.storm = Some(Storm {
        namespaces,
        deletions,
        _watch: watch,
    });
    Ok(())
}

/// Records every pod deletion (of pods labelled like the storm's) with the time it arrived.
async fn watch_deletions(client: kube::Client, log: DeletionLog) {
    let api: Api<Pod> = Api::all(client);
    let config = watcher::Config::default().labels(&format!("{}={}", ROLE.0, ROLE.1));
    loop {
        let mut stream = watcher(api.clone(), config.clone())
            .default_backoff()
            .boxed();
        while let Some(event) = stream.next().await {
            if let Ok(watcher::Event::Delete(pod)) = event {
                let (Some(ns), Some(name)) = (pod.metadata.namespace, pod.metadata.name) else {
                    continue;
                };
                lock(&log).entry((ns, name)).or_default().push(Utc::now());
            }
        }
        // The stream only ends if the watcher gives up; start it again.
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// The first deletion of `(ns, pod)` at or after `after`.
fn deleted_at(storm: &Storm, ns: &str, pod: &str, after: DateTime<Utc>) -> Option<DateTime<Utc>> {
    lock(&storm.deletions)
        .get(&(ns.to_string(), pod.to_string()))?
        .iter()
        .copied()
        .find(|t| *t >= after)
}

/// The status code of `GET http://addr/path`, `None` when nothing answers.
async fn http_status(addr: SocketAddr, path: &str) -> Option<u16> {
    dwd_testenv::http::get(addr, path, Duration::from_secs(2))
        .await
        .ok()
        .map(|(status, _)| status)
}

/// Waits until the weeder is ready and holds a watch on EndpointSlices at the seed
/// (`apiserver_longrunning_requests`; nothing else in the bench watches slices). Ready:
/// `/readyz` answers 200, or 404 — the reference registers no health checks, so its health
/// server answers 404 to everything and only the watch tells.
async fn wait_watching(world: &World, watchdog: &mut Watchdog, health: SocketAddr) -> Result<bool> {
    let start = Instant::now();
    while start.elapsed() < READY_TIMEOUT {
        watchdog.check_alive()?;
        let ready = matches!(http_status(health, "/readyz").await, Some(200 | 404));
        let watching = match crate::metrics::scrape_text(&world.seed_client).await {
            Ok(text) => crate::metrics::longrunning(&text, "watch", "endpointslices") >= 1.0,
            Err(_) => false,
        };
        if ready && watching {
            eprintln!(
                "weeder ready and watching EndpointSlices after {:.1}s",
                start.elapsed().as_secs_f64()
            );
            return Ok(true);
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    eprintln!("weeder not ready and watching within {READY_TIMEOUT:?}; flipping anyway");
    Ok(false)
}

/// Runs one weeder binary on the storm world.
pub(crate) async fn run_once(round: scenario::Round<'_>) -> Result<RunOutput> {
    let (cli, subject, world, run) = (round.cli, round.subject, round.world, round.number);
    let storm = world
        .storm
        .as_ref()
        .context("the weeder world has no storm")?;
    let weeder_config = self::config()?;
    let (args, _, health) = scenario::reference_args(
        cli,
        world,
        "weeder",
        "weeder-config.yaml",
        &weeder_config.yaml,
    )?;
    eprintln!(
        "run {run}: starting {} weeder ({})",
        subject.label,
        subject.bin.display()
    );
    let started = Utc::now();
    let mut watchdog =
        Watchdog::spawn(&subject.bin, &args, scenario::log_path(world, subject, run))?;
    let sampler = procstat::Sampler::start(watchdog.pid()?);
    let watching = wait_watching(world, &mut watchdog, health).await?;
    // A moment for the initial list to reach the weeder's handlers.
    sleep_watching(&mut watchdog, Duration::from_secs(3)).await?;

    let window_from = Utc::now();
    let sizes_from = WindowSizes::scrape(world).await;
    let flipped = flip(world, storm).await?;
    let flip_end = Utc::now();
    eprintln!(
        "run {run}: {} slices ready in {:.2}s",
        flipped.len(),
        secs(window_from, flip_end)
    );

    let n = storm.namespaces.len();
    let timeout = Duration::from_secs(60)
        + Duration::from_secs_f64(4.0 * n as f64 / cli.kube_api_qps.max(0.1));
    let wait_start = Instant::now();
    let mut last_print = Instant::now();
    loop {
        watchdog.check_alive()?;
        let deleted = storm
            .namespaces
            .iter()
            .filter(|ns| deleted_at(storm, ns, CRASHING_POD, window_from).is_some())
            .count();
        if deleted == n {
            eprintln!(
                "run {run}: all {n} crash-looping pods deleted after {:.1}s",
                wait_start.elapsed().as_secs_f64()
            );
            break;
        }
        if wait_start.elapsed() >= timeout {
            eprintln!("run {run}: only {deleted}/{n} deleted within {timeout:?}; going on");
            break;
        }
        if last_print.elapsed() >= Duration::from_secs(5) {
            last_print = Instant::now();
            eprintln!(
                "run {run}: {deleted}/{n} deleted after {:.0}s",
                wait_start.elapsed().as_secs_f64()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let spent = (Utc::now() - window_from).to_std().unwrap_or_default();
    if let Some(rest) = cli.duration.checked_sub(spent) {
        eprintln!("run {run}: measuring for the remaining {rest:?}");
        sleep_watching(&mut watchdog, rest).await?;
    }
    let end = WindowEnd::now(world, &sizes_from).await;
    let measured = scenario::stop_watchdog(&mut watchdog, sampler, started, window_from, end).await;
    analyse(cli, subject, world, storm, &measured, &flipped, watching).await
}

/// Turns every slice ready at once; returns namespace → time of the write's response.
async fn flip(world: &World, storm: &Storm) -> Result<HashMap<String, DateTime<Utc>>> {
    let client = world.seed_client.clone();
    futures::stream::iter(storm.namespaces.clone())
        .map(|ns| {
            let seed = SeedControlPlane::new(client.clone(), ns.clone());
            async move {
                seed.set_endpoint_slice(SERVICE, ENDPOINTS, EndpointsState::AllReady)
                    .await?;
                anyhow::Ok((ns, Utc::now()))
            }
        })
        .buffer_unordered(CONCURRENCY * 2)
        .try_collect()
        .await
}

/// The weeder storm's result.
async fn analyse(
    cli: &Cli,
    subject: &Subject,
    world: &World,
    storm: &Storm,
    m: &Measured,
    flipped: &HashMap<String, DateTime<Utc>>,
    watching: bool,
) -> Result<RunOutput> {
    let weeder_config = config()?;
    let usage = procstat::usage(&m.samples, m.window_from, m.window_to);
    let (seed_json, seed_bytes) = scenario::seed_json(world, m).await?;
    let mut latencies = Vec::new();
    let mut healthy_deleted = 0usize;
    let mut last: Option<DateTime<Utc>> = None;
    for ns in &storm.namespaces {
        if let (Some(ready), Some(gone)) = (
            flipped.get(ns),
            deleted_at(storm, ns, CRASHING_POD, m.window_from),
        ) {
            latencies.push(secs(*ready, gone));
            last = Some(last.map_or(gone, |l: DateTime<Utc>| l.max(gone)));
        }
        if deleted_at(storm, ns, HEALTHY_POD, m.started).is_some() {
            healthy_deleted += 1;
        }
    }
    let first_ready = flipped.values().min().copied();
    let n = storm.namespaces.len();
    let within_5s = latencies.iter().filter(|l| **l <= 5.0).count();
    let json = json!({
        "label": subject.label,
        "binary": subject.bin.display().to_string(),
        "scenario": "WeederStorm",
        "shape": {"namespaces": n},
        "config": {
            "kube_api_qps": cli.kube_api_qps, "kube_api_burst": cli.kube_api_burst, "service": SERVICE,
            "weeder_config": {
                "from": gardener::WEEDER_FIXTURE_PATH,
                "changed_from_gardener": weeder_config.changes.iter().map(|c| c.to_string()).collect::<Vec<_>>(),
            },
        },
        "setup_s": world.setup_seconds,
        "window": {"from": m.window_from.to_rfc3339(), "to": m.window_to.to_rfc3339(), "seconds": secs(m.window_from, m.window_to)},
        "process": usage.to_json(),
        "seed_requests": seed_json,
        "shoot_requests": Value::Null,
        "probe_lateness_s": Value::Null,
        "outage": Value::Null,
        "weeder": {
            "namespaces": n,
            "watching_before_flip": watching,
            "flip_s": match (first_ready, flipped.values().max()) { (Some(a), Some(b)) => json!(secs(a, *b)), _ => Value::Null },
            "crashlooping_deleted": latencies.len(),
            "all_deleted": latencies.len() == n,
            "deleted_within_5s": within_5s,
            "healthy_deleted": healthy_deleted,
            "healthy_kept": healthy_deleted == 0,
            "deletion_latency_s": Summary::of(&latencies).to_json(),
            "last_deletion_after_first_ready_s": match (first_ready, last) { (Some(a), Some(b)) => json!(secs(a, b)), _ => Value::Null },
        },
        "response_bytes": {"seed": seed_bytes, "shoot": Value::Null},
    });
    let mut dists = Dists::new();
    dists.insert(chart::WEEDER_DELETION.into(), latencies);
    Ok(RunOutput { json, dists })
}

/// Back to the storm's start: every slice not ready, every pod present (the crash-looping
/// ones recreated). Returns what was done.
pub(crate) async fn reset(world: &World) -> Result<Value> {
    let storm = world
        .storm
        .as_ref()
        .context("the weeder world has no storm")?;
    let started = Instant::now();
    let api: Api<Pod> = Api::all(world.seed_client.clone());
    let pods = api
        .list(&ListParams::default().labels(&format!("{}={}", ROLE.0, ROLE.1)))
        .await
        .context("list pods")?;
    let present: HashSet<(String, String)> = pods
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter_map(|p| Some((p.metadata.namespace?, p.metadata.name?)))
        .collect();
    let client = world.seed_client.clone();
    let recreated: Vec<usize> = futures::stream::iter(storm.namespaces.clone())
        .map(|ns| {
            let seed = SeedControlPlane::new(client.clone(), ns.clone());
            let missing: Vec<(&str, bool)> = [(CRASHING_POD, true), (HEALTHY_POD, false)]
                .into_iter()
                .filter(|(pod, _)| !present.contains(&(ns.clone(), pod.to_string())))
                .collect();
            async move {
                seed.set_endpoint_slice(SERVICE, ENDPOINTS, EndpointsState::NotReady)
                    .await?;
                for (pod, crashlooping) in &missing {
                    seed.create_pod(pod, &LABELS, *crashlooping).await?;
                }
                anyhow::Ok(missing.len())
            }
        })
        .buffer_unordered(CONCURRENCY)
        .try_collect()
        .await?;
    let recreated: usize = recreated.iter().sum();
    eprintln!(
        "reset: {} slices not ready, {recreated} pods recreated in {:.1}s",
        storm.namespaces.len(),
        started.elapsed().as_secs_f64()
    );
    Ok(json!({"pods_recreated": recreated, "seconds": started.elapsed().as_secs_f64()}))
}
