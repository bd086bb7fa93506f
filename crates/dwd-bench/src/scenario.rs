//! One benchmark run: build the world, start the watchdog, play the scenario, then read
//! the measurements back from `/proc` samples, audit logs and the replica watch.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use chrono::{DateTime, Utc};
use dwd_testenv::process::ManagedProcess;
use serde_json::{Value, json};

use crate::setup::{self, Shape, WATCHDOG_USER, World, lock};
use crate::stats::{Summary, go_duration};
use crate::{Cli, Scenario, audit, procstat, report};

/// `nodeLeaseFailureFraction` of the prober config (the reference default).
const THRESHOLD: f64 = 0.6;

/// Kubelet lease renew interval (the kubelet's).
const RENEW_INTERVAL: Duration = Duration::from_secs(10);

/// The scalable targets with their (scale-down, scale-up) levels: the seeds' example
/// ("Configure Dependency Watchdog Components": KCM 0/1, MCM 1/1, CA 2/0).
const TARGETS: [(&str, u32, u32); 3] = [
    ("kube-controller-manager", 0, 1),
    ("machine-controller-manager", 1, 1),
    ("cluster-autoscaler", 2, 0),
];

/// Writes per scaled target (annotate, then scale): used for the mass-outage bound.
const WRITES_PER_TARGET: f64 = 2.0;

/// The prober configuration for this run.
fn prober_config(cli: &Cli) -> String {
    let mut out = format!(
        "kubeConfigSecretName: shoot-access-dependency-watchdog-probe\n\
         probeInterval: {}\ninitialDelay: {}\nprobeTimeout: 10s\nbackoffJitterFactor: {}\n\
         kcmNodeMonitorGraceDuration: {}\nnodeLeaseFailureFraction: {THRESHOLD}\n\
         dependentResourceInfos:\n",
        go_duration(cli.probe_interval),
        go_duration(cli.initial_delay),
        cli.jitter,
        go_duration(cli.kcm_grace),
    );
    for (name, down, up) in TARGETS {
        out.push_str(&format!(
            "  - ref: {{kind: Deployment, name: {name}, apiVersion: apps/v1}}\n    optional: false\n    \
             scaleUp: {{level: {up}, timeout: 30s}}\n    scaleDown: {{level: {down}, timeout: 30s}}\n"
        ));
    }
    out
}

/// The watchdog subprocess; killed when dropped (and by the kernel if the bench dies).
struct Watchdog {
    process: ManagedProcess,
    log: std::path::PathBuf,
}

impl Watchdog {
    fn start(cli: &Cli, bin: &Path, world: &World) -> Result<Watchdog> {
        let config = world.dir.join("dep-config.yaml");
        std::fs::write(&config, prober_config(cli))
            .with_context(|| format!("write {}", config.display()))?;
        let metrics = SocketAddr::from((Ipv4Addr::LOCALHOST, dwd_testenv::free_port()?));
        let health = SocketAddr::from((Ipv4Addr::LOCALHOST, dwd_testenv::free_port()?));
        let log = world.dir.join("watchdog.log");
        // Exactly the reference's flags, so any drop-in binary runs unchanged.
        let args = vec![
            "prober".to_string(),
            format!("--config-file={}", config.display()),
            format!("--kubeconfig={}", world.watchdog_kubeconfig.display()),
            format!("--kube-api-qps={}", cli.kube_api_qps),
            format!("--kube-api-burst={}", cli.kube_api_burst),
            format!("--metrics-bind-addr={metrics}"),
            format!("--health-bind-addr={health}"),
        ];
        let process = ManagedProcess::spawn("watchdog", bin, &args, &log)
            .with_context(|| format!("start {}", bin.display()))?;
        Ok(Watchdog { process, log })
    }

    fn pid(&self) -> Result<u32> {
        self.process
            .pid()
            .context("watchdog process has no pid (already stopped)")
    }

    /// Fails with the log's tail when the process has exited.
    fn check_alive(&mut self) -> Result<()> {
        if self.process.has_exited() {
            bail!(
                "the watchdog exited; log {}:\n{}",
                self.log.display(),
                self.process.log_tail(3000)
            );
        }
        Ok(())
    }
}

/// Sleeps `d`, checking every few seconds that the watchdog is still alive.
async fn sleep_watching(watchdog: &mut Watchdog, d: Duration) -> Result<()> {
    let end = tokio::time::Instant::now() + d;
    while tokio::time::Instant::now() < end {
        watchdog.check_alive()?;
        let left = end - tokio::time::Instant::now();
        tokio::time::sleep(left.min(Duration::from_secs(2))).await;
    }
    watchdog.check_alive()
}

/// The first replica change of `(ns, target)` after `after` matching `pred`.
fn first_change(
    world: &World,
    ns: &str,
    target: &str,
    after: DateTime<Utc>,
    pred: impl Fn(i32) -> bool,
) -> Option<DateTime<Utc>> {
    let log = lock(&world.replicas);
    log.get(&(ns.to_string(), target.to_string()))?
        .iter()
        .find(|(t, r)| *t >= after && pred(*r))
        .map(|(t, _)| *t)
}

// Every argument is a distinct knob of one wait; a struct would only rename them.
#[allow(clippy::too_many_arguments)]
/// Waits until every target of every affected shoot changed as `pred` wants after `after`.
async fn wait_all(
    world: &World,
    watchdog: &mut Watchdog,
    affected: &[usize],
    after: DateTime<Utc>,
    pred: impl Fn(i32) -> bool + Copy,
    timeout: Duration,
    what: &str,
    mut on_tick: impl FnMut(),
) -> Result<bool> {
    let start = tokio::time::Instant::now();
    let total = affected.len() * TARGETS.len();
    let mut last_print = start;
    loop {
        watchdog.check_alive()?;
        on_tick();
        let done = affected
            .iter()
            .flat_map(|&i| TARGETS.iter().map(move |(t, _, _)| (i, *t)))
            .filter(|(i, t)| {
                first_change(world, &setup::shoot_namespace(*i), t, after, pred).is_some()
            })
            .count();
        if done == total {
            eprintln!(
                "run: {what}: {done}/{total} targets after {:.1}s",
                start.elapsed().as_secs_f64()
            );
            return Ok(true);
        }
        if start.elapsed() >= timeout {
            eprintln!("run: {what}: only {done}/{total} targets within {timeout:?}; going on");
            return Ok(false);
        }
        if last_print.elapsed() >= Duration::from_secs(5) {
            last_print = tokio::time::Instant::now();
            eprintln!(
                "run: {what}: {done}/{total} targets after {:.0}s",
                start.elapsed().as_secs_f64()
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Smallest number of expired leases out of `m` that reaches the threshold, computed like
/// the watchdog does (`expired / candidates >= fraction` in floating point).
fn expired_needed(m: usize) -> usize {
    (1..=m)
        .find(|k| *k as f64 / m as f64 >= THRESHOLD)
        .unwrap_or(m)
}

/// What an outage scenario observed, per affected shoot.
struct OutageRecord {
    silenced_at: DateTime<Utc>,
    resumed_at: DateTime<Utc>,
    restored_by: DateTime<Utc>,
    /// Shoot index → renew times at the moment of resumption (the silenced nodes' last).
    before: Vec<(usize, HashMap<String, DateTime<Utc>>)>,
    /// Shoot index → each node's first renew time after resumption.
    after: Vec<(usize, HashMap<String, DateTime<Utc>>)>,
    all_down: bool,
    all_up: bool,
}

/// Runs the benchmark and prints/writes the results.
pub async fn run(cli: &Cli, bin: &Path) -> Result<()> {
    let shape = Shape {
        shoots: cli.shoots,
        nodes: cli.nodes,
        apiservers: cli.shoot_apiservers,
        renew_interval: RENEW_INTERVAL,
    };
    if cli.scenario != Scenario::Steady && cli.nodes < 2 {
        bail!("outage scenarios need --nodes >= 2 (a single-node shoot is never scaled)");
    }
    let world = setup::build(shape).await?;
    eprintln!(
        "run: starting {} (files in {})",
        bin.display(),
        world.dir.display()
    );
    let started = Utc::now();
    let mut watchdog = Watchdog::start(cli, bin, &world)?;
    let sampler = procstat::Sampler::start(watchdog.pid()?);

    // Warm-up: start-up, cache sync and the first two probe rounds are not steady state.
    let warmup = cli.initial_delay + cli.probe_interval * 2;
    eprintln!("run: warm-up {warmup:?}");
    sleep_watching(&mut watchdog, warmup).await?;
    if let Some(j) = cli.stop_shoot_apiserver {
        eprintln!("run: stopping shoot apiserver {j}");
        world.shoot_apis[j]
            .stop()
            .await
            .context("stop shoot apiserver")?;
    }
    if let Some(j) = cli.slow_shoot_apiserver {
        eprintln!(
            "run: shoot apiserver {j} answers {:?} late",
            cli.slow_latency
        );
        world.shoot_apis[j].set_latency(cli.slow_latency);
    }
    let window_from = Utc::now();

    let outage = match cli.scenario {
        Scenario::Steady => {
            eprintln!("run: steady for {:?}", cli.duration);
            sleep_watching(&mut watchdog, cli.duration).await?;
            None
        }
        Scenario::Outage | Scenario::MassOutage | Scenario::WeederStorm => {
            let affected: Vec<usize> = if cli.scenario == Scenario::Outage {
                vec![0]
            } else {
                (0..cli.shoots).collect()
            };
            Some(run_outage(cli, &world, &mut watchdog, &affected, window_from).await?)
        }
    };
    let window_to = Utc::now();
    eprintln!("run: stopping the watchdog");
    let samples = sampler.samples();
    watchdog.process.stop(Duration::from_secs(3));
    // The audit logs are written in batches of at most 1 s.
    tokio::time::sleep(Duration::from_secs(3)).await;

    let result = analyse(
        cli,
        bin,
        &world,
        started,
        window_from,
        window_to,
        &samples,
        outage.as_ref(),
    )?;
    println!("{}", report::table(&result));
    if let Some(path) = &cli.output {
        let text = serde_json::to_string_pretty(&result).context("serialize result")?;
        std::fs::write(path, text).with_context(|| format!("write {}", path.display()))?;
        eprintln!("wrote {}", path.display());
    }
    drop(watchdog);
    eprintln!("teardown…");
    drop(world);
    Ok(())
}

async fn run_outage(
    cli: &Cli,
    world: &World,
    watchdog: &mut Watchdog,
    affected: &[usize],
    window_from: DateTime<Utc>,
) -> Result<OutageRecord> {
    let silenced_at = Utc::now();
    for &i in affected {
        world.shoots[i].sim.kubelets().silence_count(cli.nodes);
    }
    eprintln!("run: silenced every kubelet of {} shoot(s)", affected.len());
    // Leases expire 0.75 × grace after their last renewal (≤ one renew interval before
    // silencing); then a probe run, then the flow. Mass outages add the QPS-bound writes.
    let writes = affected.len() as f64 * TARGETS.len() as f64 * WRITES_PER_TARGET;
    let slack = cli.probe_interval * 3
        + Duration::from_secs(60)
        + Duration::from_secs_f64(writes / cli.kube_api_qps.max(0.1) * 2.0);
    let down_timeout = cli.kcm_grace.mul_f64(0.75) + RENEW_INTERVAL + slack;
    let all_down = wait_all(
        world,
        watchdog,
        affected,
        silenced_at,
        |r| r == 0,
        down_timeout,
        "scaled down",
        || {},
    )
    .await?;

    let before = affected
        .iter()
        .map(|&i| (i, world.shoots[i].sim.kubelets().renewals()))
        .collect();
    let resumed_at = Utc::now();
    for &i in affected {
        world.shoots[i].sim.kubelets().resume_all();
    }
    eprintln!("run: kubelets of {} shoot(s) renew again", affected.len());
    // The kubelets keep only each node's latest renewal; recovery is decided by the first
    // one after resumption, so catch it while polling (well within the 10 s renew interval).
    let mut after: Vec<(usize, HashMap<String, DateTime<Utc>>)> =
        affected.iter().map(|&i| (i, HashMap::new())).collect();
    let mut record_first_renewals = || {
        for (i, first) in after.iter_mut() {
            for (node, t) in world.shoots[*i].sim.kubelets().renewals() {
                if t > resumed_at {
                    first.entry(node).or_insert(t);
                }
            }
        }
    };
    let all_up = wait_all(
        world,
        watchdog,
        affected,
        resumed_at,
        |r| r > 0,
        RENEW_INTERVAL + slack,
        "restored",
        &mut record_first_renewals,
    )
    .await?;
    record_first_renewals();
    let restored_by = Utc::now();

    // Keep measuring steady state for whatever is left of --duration.
    let spent = (Utc::now() - window_from).to_std().unwrap_or_default();
    if let Some(rest) = cli.duration.checked_sub(spent) {
        eprintln!("run: steady for the remaining {rest:?}");
        sleep_watching(watchdog, rest).await?;
    }
    Ok(OutageRecord {
        silenced_at,
        resumed_at,
        restored_by,
        before,
        after,
        all_down,
        all_up,
    })
}

/// Seconds from `a` to `b` (negative when `b` is earlier).
fn secs(a: DateTime<Utc>, b: DateTime<Utc>) -> f64 {
    (b - a).num_microseconds().unwrap_or(i64::MAX) as f64 / 1e6
}

// The run's inputs and measurements, passed once to one pure function.
#[allow(clippy::too_many_arguments)]
fn analyse(
    cli: &Cli,
    bin: &Path,
    world: &World,
    started: DateTime<Utc>,
    window_from: DateTime<Utc>,
    window_to: DateTime<Utc>,
    samples: &[procstat::Sample],
    outage: Option<&OutageRecord>,
) -> Result<Value> {
    let window_secs = secs(window_from, window_to).max(1e-3);
    let usage = procstat::usage(samples, window_from, window_to);

    // Seed: the watchdog's own user only (the simulator and the bench use `admin`).
    let seed_requests = audit::read(&world.seed.audit_log_path(), started, |u| {
        u == WATCHDOG_USER
    })?;
    let mut shoot_requests = Vec::new();
    for api in &world.shoot_apis {
        shoot_requests.extend(audit::read(&api.audit_log_path(), started, |u| {
            u.starts_with("shoot-")
        })?);
    }
    let in_window = |r: &&audit::Request| r.received >= window_from && r.received <= window_to;
    let seed_window: Vec<&audit::Request> = seed_requests.iter().filter(in_window).collect();
    // Start-up (initial lists, watches, first probes) is reported apart: a cache-based
    // binary pays here once what a GET-based one pays every run.
    let seed_startup: Vec<&audit::Request> = seed_requests
        .iter()
        .filter(|r| r.received < window_from)
        .collect();
    let shoot_window: Vec<&audit::Request> = shoot_requests.iter().filter(in_window).collect();
    let probes = audit::version_probes(&shoot_requests);
    let probe_runs = shoot_window
        .iter()
        .filter(|r| r.verb == "get" && r.what == "/version")
        .count();
    let per_minute = |counts: BTreeMap<String, u64>| -> Value {
        counts
            .into_iter()
            .map(|(k, v)| {
                (
                    k,
                    json!((v as f64 / window_secs * 60.0 * 10.0).round() / 10.0),
                )
            })
            .collect::<serde_json::Map<_, _>>()
            .into()
    };

    // Probe lateness: gaps between consecutive `GET /version` of one shoot, both in the
    // window, minus the configured interval.
    let interval = cli.probe_interval.as_secs_f64();
    let mut gaps = Vec::new();
    let mut worst_per_shoot = Vec::new();
    let mut slow_gaps = Vec::new();
    let mut unprobed = 0usize;
    for shoot in &world.shoots {
        let j = shoot.index % cli.shoot_apiservers;
        // A stopped apiserver logs nothing: its shoots' probes can't be timed.
        if cli.stop_shoot_apiserver == Some(j) {
            continue;
        }
        let slow = cli.slow_shoot_apiserver == Some(j);
        let times: Vec<DateTime<Utc>> = probes
            .get(&shoot.user())
            .map(|v| {
                v.iter()
                    .copied()
                    .filter(|t| *t >= window_from && *t <= window_to)
                    .collect()
            })
            .unwrap_or_default();
        if times.is_empty() {
            unprobed += 1;
            continue;
        }
        let lateness: Vec<f64> = times
            .windows(2)
            .map(|w| secs(w[0], w[1]) - interval)
            .collect();
        // The time since the last probe counts too: a shoot that stopped being probed is late.
        let tail = times
            .last()
            .map(|t| secs(*t, window_to) - interval)
            .unwrap_or(0.0)
            .max(0.0);
        if slow {
            // Reported apart: these shoots are slow by design; the others must not be.
            slow_gaps.extend(lateness);
            continue;
        }
        worst_per_shoot.push(lateness.iter().copied().fold(tail, f64::max));
        gaps.extend(lateness);
    }

    let outage_json = outage.map(|o| outage_results(cli, world, o, &seed_requests));

    Ok(json!({
        "label": cli.label.clone().unwrap_or_else(|| bin.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()),
        "binary": bin.display().to_string(),
        "scenario": format!("{:?}", cli.scenario),
        "shape": {"shoots": cli.shoots, "nodes_per_shoot": cli.nodes, "shoot_apiservers": cli.shoot_apiservers},
        "config": {
            "probe_interval_s": interval, "initial_delay_s": cli.initial_delay.as_secs_f64(),
            "kcm_grace_s": cli.kcm_grace.as_secs_f64(), "jitter": cli.jitter, "threshold": THRESHOLD,
            "kube_api_qps": cli.kube_api_qps, "kube_api_burst": cli.kube_api_burst,
            "stopped_shoot_apiserver": cli.stop_shoot_apiserver,
            "slow_shoot_apiserver": cli.slow_shoot_apiserver.map(|j| json!({"index": j, "latency_s": cli.slow_latency.as_secs_f64()})),
        },
        "window": {"from": window_from.to_rfc3339(), "to": window_to.to_rfc3339(), "seconds": window_secs},
        "process": {
            "peak_rss_bytes": usage.peak_rss, "steady_rss_bytes": usage.steady_rss,
            "cpu_seconds_per_minute": usage.cpu_per_minute, "cpu_seconds_total": usage.cpu_total,
            "samples": usage.samples,
        },
        "seed_requests": {
            "total": seed_window.len(),
            "per_minute": per_minute(audit::by_key(seed_window.iter().copied())),
            "failures_by_code": audit::failures_by_code(seed_window.iter().copied()),
            "warmup_total": seed_startup.len(),
            "warmup_by_verb_resource": audit::by_key(seed_startup.iter().copied()),
        },
        "shoot_requests": {
            "total": shoot_window.len(),
            "probe_runs": probe_runs,
            "per_probe_run": if probe_runs > 0 { shoot_window.len() as f64 / probe_runs as f64 } else { 0.0 },
            "per_minute": per_minute(audit::by_key(shoot_window.iter().copied())),
            "failures_by_code": audit::failures_by_code(shoot_window.iter().copied()),
        },
        "probe_lateness_s": {
            "all_gaps": Summary::of(&gaps).to_json(),
            "worst_per_shoot": Summary::of(&worst_per_shoot).to_json(),
            "shoots_never_probed_in_window": unprobed,
            "slow_apiserver_gaps": Summary::of(&slow_gaps).to_json(),
            "shoots_on_stopped_apiserver": cli.stop_shoot_apiserver.map(|j| world.shoots.iter().filter(|s| s.index % cli.shoot_apiservers == j).count()),
        },
        "outage": outage_json,
        "response_bytes": null,
    }))
}

fn outage_results(
    cli: &Cli,
    world: &World,
    o: &OutageRecord,
    seed_requests: &[audit::Request],
) -> Value {
    let grace = chrono::Duration::from_std(cli.kcm_grace.mul_f64(0.75)).unwrap_or_default();
    let k = expired_needed(cli.nodes);
    let mut down: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    let mut up: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    let mut level0_latest: Option<DateTime<Utc>> = None;
    let mut first_crossing: Option<DateTime<Utc>> = None;
    let mut missing_down = 0usize;
    let mut missing_up = 0usize;
    for ((i, before), (_, after)) in o.before.iter().zip(&o.after) {
        let ns = setup::shoot_namespace(*i);
        // Down: the k-th lease to expire (k = fewest expired leases reaching the threshold).
        let mut expiries: Vec<DateTime<Utc>> = before.values().map(|t| *t + grace).collect();
        expiries.sort();
        let crossed = expiries.get(k - 1).copied();
        // Up: once more than m − k leases renewed after resumption, fewer than k are expired.
        let mut renewed: Vec<DateTime<Utc>> = after
            .values()
            .copied()
            .filter(|t| *t > o.resumed_at)
            .collect();
        renewed.sort();
        let recovered = renewed.get(cli.nodes - k).copied();
        if let Some(c) = crossed {
            first_crossing = Some(first_crossing.map_or(c, |f: DateTime<Utc>| f.min(c)));
        }
        for (target, down_level, _) in TARGETS {
            match (
                crossed,
                first_change(world, &ns, target, o.silenced_at, |r| r == 0),
            ) {
                (Some(c), Some(t)) => {
                    down.entry(target).or_default().push(secs(c, t));
                    if down_level == 0 {
                        level0_latest = Some(level0_latest.map_or(t, |l: DateTime<Utc>| l.max(t)));
                    }
                }
                _ => missing_down += 1,
            }
            match (
                recovered,
                first_change(world, &ns, target, o.resumed_at, |r| r > 0),
            ) {
                (Some(c), Some(t)) => up.entry(target).or_default().push(secs(c, t)),
                _ => missing_up += 1,
            }
        }
    }
    let affected: HashSet<String> = o
        .before
        .iter()
        .map(|(i, _)| setup::shoot_namespace(*i))
        .collect();
    let outage_seed: Vec<&audit::Request> = seed_requests
        .iter()
        .filter(|r| r.received >= o.silenced_at && r.received <= o.restored_by)
        .filter(|r| r.namespace.as_ref().is_some_and(|ns| affected.contains(ns)))
        .collect();
    let summarise = |m: &BTreeMap<&str, Vec<f64>>| -> Value {
        m.iter()
            .map(|(k, v)| (k.to_string(), Summary::of(v).to_json()))
            .collect::<serde_json::Map<_, _>>()
            .into()
    };
    let all_down: Vec<f64> = down.values().flatten().copied().collect();
    let all_up: Vec<f64> = up.values().flatten().copied().collect();
    let bound = 1.2 * (o.before.len() as f64 * WRITES_PER_TARGET / cli.kube_api_qps.max(0.1));
    json!({
        "affected_shoots": o.before.len(),
        "expired_leases_needed": k,
        "all_scaled_down": o.all_down,
        "all_restored": o.all_up,
        "scale_down_s": {"all": Summary::of(&all_down).to_json(), "by_target": summarise(&down)},
        "restore_s": {"all": Summary::of(&all_up).to_json(), "by_target": summarise(&up)},
        "targets_missing_down": missing_down,
        "targets_missing_up": missing_up,
        "level0_all_zero_after_first_crossing_s": match (first_crossing, level0_latest) { (Some(c), Some(l)) => json!(secs(c, l)), _ => Value::Null },
        "level0_bound_s": bound,
        "seed_requests_in_affected_namespaces": {
            "total": outage_seed.len(),
            "by_verb_resource": audit::by_key(outage_seed.iter().copied()),
        },
    })
}
