//! One prober run on a built world: start the watchdog, play the scenario, then read the
//! measurements back from `/proc` samples, audit logs, the apiservers' metrics and the
//! replica watch. Also the pieces the weeder run shares (the subprocess, seed requests).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use chrono::{DateTime, Utc};
use dwd_core::ProberConfig;
use dwd_testenv::process::ManagedProcess;
use serde_json::{Value, json};

use crate::chart::{self, Dists};
use crate::gardener::{self, Derived, ProberChanges};
use crate::setup::{self, WATCHDOG_USER, World, lock};
use crate::stats::Summary;
use crate::{Cli, Scenario, Subject, audit, hostile, metrics, procstat, protection, storm};

/// Node → its renew times, in order.
type RenewTimes = HashMap<String, Vec<storm::Renewal>>;

/// User → the receive times of some of its requests, sorted.
type TimesByUser = HashMap<String, Vec<DateTime<Utc>>>;
/// Per user, each request's (receive, completion) times.
type SpansByUser = HashMap<String, Vec<audit::Span>>;

/// Writes per scaled target (annotate, then scale): used for the mass-outage bound.
const WRITES_PER_TARGET: f64 = 2.0;

/// The prober configuration both binaries get: Gardener's (`deploy/gardener/prober.yaml`:
/// targets, levels, delays, threshold, timeouts), with the intervals of the command line
/// (`--probe-interval`, `--initial-delay`, `--kcm-grace`, `--jitter`, `--scale-up-delay`)
/// where they differ from Gardener's.
pub(crate) fn prober_config(cli: &Cli) -> Result<Derived<ProberConfig>> {
    gardener::prober(&ProberChanges {
        probe_interval: Some(cli.probe_interval),
        initial_delay: Some(cli.initial_delay),
        kcm_node_monitor_grace: Some(cli.kcm_grace),
        backoff_jitter_factor: Some(cli.jitter),
        scale_up_delay: cli.scale_up_delay,
    })
}

/// `(target, scale-down level, scale-up level)` of every target of the config.
fn targets(config: &ProberConfig) -> Vec<(&str, u32, u32)> {
    config
        .dependent_resource_infos
        .iter()
        .map(|i| (i.target.name.as_str(), i.scale_down.level, i.scale_up.level))
        .collect()
}

/// How long a whole scale-up waits in `initialDelay`s: each level waits for its longest.
fn scale_up_delays(config: &ProberConfig) -> Duration {
    protection::level_delays(config, false)
}

/// The watchdog subprocess; killed when dropped (and by the kernel if the bench dies).
pub(crate) struct Watchdog {
    /// The process.
    pub process: ManagedProcess,
    log: std::path::PathBuf,
    /// Where it serves its metrics (the prober; `None` when not known).
    pub metrics_addr: Option<SocketAddr>,
    /// Stop the process once its RSS passes this many bytes ([`Self::check_alive`]; the
    /// hostile scenario's `--rss-limit-mib`).
    pub rss_limit: Option<u64>,
    /// When the bench stopped it at [`Self::rss_limit`], and the RSS it saw.
    pub killed_at_limit: Option<(DateTime<Utc>, u64)>,
}

impl Watchdog {
    /// Starts `bin args…`, its output appended to `log`.
    pub(crate) fn spawn(bin: &Path, args: &[String], log: std::path::PathBuf) -> Result<Watchdog> {
        let process = ManagedProcess::spawn("watchdog", bin, args, &log)
            .with_context(|| format!("start {}", bin.display()))?;
        Ok(Watchdog {
            process,
            log,
            metrics_addr: None,
            rss_limit: None,
            killed_at_limit: None,
        })
    }

    /// Starts the prober with exactly the reference's flags, so any drop-in binary runs
    /// unchanged.
    fn start_prober(
        cli: &Cli,
        prober: &Derived<ProberConfig>,
        subject: &Subject,
        world: &World,
        run: usize,
    ) -> Result<Watchdog> {
        let (args, metrics, _) =
            reference_args(cli, world, "prober", "dep-config.yaml", &prober.yaml)?;
        let mut watchdog = Watchdog::spawn(&subject.bin, &args, log_path(world, subject, run))?;
        watchdog.metrics_addr = Some(metrics);
        Ok(watchdog)
    }

    /// Pid of the running process.
    pub(crate) fn pid(&self) -> Result<u32> {
        self.process
            .pid()
            .context("watchdog process has no pid (already stopped)")
    }

    /// Fails with the log's tail when the process has exited; with an [`Self::rss_limit`],
    /// stops it (and fails) once its RSS passes the limit.
    pub(crate) fn check_alive(&mut self) -> Result<()> {
        if self.process.has_exited() {
            bail!(
                "the watchdog exited; log {}:\n{}",
                self.log.display(),
                self.process.log_tail(3000)
            );
        }
        if let (Some(limit), Some(pid)) = (self.rss_limit, self.process.pid())
            && let Some(rss) = procstat::rss_over(pid, limit)
        {
            self.process.kill();
            self.killed_at_limit = Some((Utc::now(), rss));
            bail!("the watchdog's RSS passed the limit; stopped");
        }
        Ok(())
    }
}

/// The command line of `component` (`prober`, `weeder`) with exactly the reference's flags,
/// so any drop-in binary runs unchanged: its config `yaml` written to `file` in the world's
/// directory; with the metrics and the health address it is given. The prober's log level is
/// gardenlet's (`--zap-log-level=INFO`; its weeder line has none): both binaries default to
/// debug, and a storm at debug is mostly log writing (ours wrote 544 MB in 12 minutes, a line
/// per node per run), load no seed carries. Leader election, gardenlet's other flag, is left
/// out: rounds share one seed, and each would first wait out the previous binary's Lease.
pub(crate) fn reference_args(
    cli: &Cli,
    world: &World,
    component: &str,
    file: &str,
    yaml: &str,
) -> Result<(Vec<String>, SocketAddr, SocketAddr)> {
    let config = world.dir.join(file);
    std::fs::write(&config, yaml).with_context(|| format!("write {}", config.display()))?;
    let (metrics, health) = bind_addrs()?;
    let mut args = vec![
        component.to_string(),
        format!("--config-file={}", config.display()),
        format!("--kubeconfig={}", world.watchdog_kubeconfig.display()),
        format!("--kube-api-qps={}", cli.kube_api_qps),
        format!("--kube-api-burst={}", cli.kube_api_burst),
        format!("--metrics-bind-addr={metrics}"),
        format!("--health-bind-addr={health}"),
    ];
    if component == "prober" {
        args.push("--zap-log-level=INFO".to_string());
    }
    Ok((args, metrics, health))
}

/// Free loopback addresses for the watchdog's metrics and health endpoints.
pub(crate) fn bind_addrs() -> Result<(SocketAddr, SocketAddr)> {
    Ok((
        SocketAddr::from((Ipv4Addr::LOCALHOST, dwd_testenv::free_port()?)),
        SocketAddr::from((Ipv4Addr::LOCALHOST, dwd_testenv::free_port()?)),
    ))
}

/// `watchdog-<run>-<label>.log` in the run directory: one log per run, kept for a look.
pub(crate) fn log_path(world: &World, subject: &Subject, run: usize) -> std::path::PathBuf {
    let safe: String = subject
        .label
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    world.dir.join(format!("watchdog-{run}-{safe}.log"))
}

/// Sleeps `d`, checking every few seconds that the watchdog is still alive (four times a
/// second with an RSS limit).
pub(crate) async fn sleep_watching(watchdog: &mut Watchdog, d: Duration) -> Result<()> {
    let end = tokio::time::Instant::now() + d;
    let tick = if watchdog.rss_limit.is_some() {
        Duration::from_millis(250)
    } else {
        Duration::from_secs(2)
    };
    while tokio::time::Instant::now() < end {
        watchdog.check_alive()?;
        let left = end - tokio::time::Instant::now();
        tokio::time::sleep(left.min(tick)).await;
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
/// Waits until every one of `targets` (shoot index, target name) changed as `pred` wants
/// after `after`.
async fn wait_all(
    world: &World,
    watchdog: &mut Watchdog,
    targets: &[(usize, &str)],
    after: DateTime<Utc>,
    pred: impl Fn(i32) -> bool + Copy,
    timeout: Duration,
    what: &str,
    mut on_tick: impl FnMut(),
) -> Result<bool> {
    let start = tokio::time::Instant::now();
    let total = targets.len();
    let mut last_print = start;
    loop {
        watchdog.check_alive()?;
        on_tick();
        let done = targets
            .iter()
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

/// Waits until every one of `targets` runs (its last replica change, if any, is above 0) and
/// no target of the seed has changed for `quiet`; false after `timeout`.
async fn wait_settled(
    world: &World,
    watchdog: &mut Watchdog,
    targets: &[(usize, &str)],
    quiet: Duration,
    timeout: Duration,
    mut on_tick: impl FnMut(),
) -> Result<bool> {
    let start = tokio::time::Instant::now();
    let mut last_print = start;
    loop {
        watchdog.check_alive()?;
        on_tick();
        let (down, last_change) = {
            let log = lock(&world.replicas);
            let down = targets
                .iter()
                .filter(|(i, t)| {
                    log.get(&(setup::shoot_namespace(*i), t.to_string()))
                        .and_then(|c| c.last())
                        .is_some_and(|(_, r)| *r == 0)
                })
                .count();
            let last = log.values().filter_map(|c| c.last()).map(|(t, _)| *t).max();
            (down, last)
        };
        let quiet_for = last_change.map_or(f64::MAX, |t| secs(t, Utc::now()));
        if down == 0 && quiet_for >= quiet.as_secs_f64() {
            eprintln!(
                "run: restored and settled after {:.1}s",
                start.elapsed().as_secs_f64()
            );
            return Ok(true);
        }
        if start.elapsed() >= timeout {
            eprintln!("run: {down} targets still down after {timeout:?}; going on");
            return Ok(false);
        }
        if last_print.elapsed() >= Duration::from_secs(5) {
            last_print = tokio::time::Instant::now();
            eprintln!(
                "run: waiting to settle: {down} targets down after {:.0}s",
                start.elapsed().as_secs_f64()
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Smallest number of expired leases out of `m` that reaches `threshold`, computed like
/// the watchdog does (`expired / candidates >= fraction` in floating point).
fn expired_needed(m: usize, threshold: f64) -> usize {
    (1..=m)
        .find(|k| *k as f64 / m as f64 >= threshold)
        .unwrap_or(m)
}

/// What an outage scenario observed, per affected shoot.
struct OutageRecord {
    silenced_at: DateTime<Utc>,
    /// When every silenced kubelet's last renewal (stamped `silenced_at`) had been written.
    last_words_written: Option<DateTime<Utc>>,
    resumed_at: DateTime<Utc>,
    restored_by: DateTime<Utc>,
    /// Shoot index → renew times at the moment of resumption (the silenced nodes' last).
    before: Vec<(usize, HashMap<String, DateTime<Utc>>)>,
    /// The machine's CPU waiting (`procstat::cpu_waiting_us`) at the silence and at
    /// `restored_by`.
    cpu_waiting_us: (Option<u64>, Option<u64>),
    /// Shoot index → each node's renew times after resumption, in order (a relapse shows
    /// as a gap longer than the leases' validity).
    after: Vec<(usize, RenewTimes)>,
    all_down: bool,
    all_up: bool,
}

/// What one run produced: the JSON result and the raw latency samples for the chart.
pub(crate) struct RunOutput {
    /// The run's result (what `--output` holds in single-binary mode).
    pub json: Value,
    /// Raw latency samples by metric, for the chart.
    pub dists: Dists,
}

/// One run of one subject: what the bench was asked, the binary, the world it runs on, and
/// the run's number (in file names and progress lines). Each subject's `run_once` takes it.
#[derive(Clone, Copy)]
pub(crate) struct Round<'a> {
    pub(crate) cli: &'a Cli,
    pub(crate) subject: &'a Subject,
    pub(crate) world: &'a World,
    pub(crate) number: usize,
}

/// Runs one prober binary on `world`: start it, warm up, play the scenario, stop it, and
/// read the measurements back. Leaves the world as the scenario left it (see
/// [`crate::reset`] for getting back to steady state).
pub(crate) async fn run_once(round: Round<'_>) -> Result<RunOutput> {
    let Round {
        cli,
        subject,
        world,
        number: run,
    } = round;
    eprintln!(
        "run {run}: starting {} ({}; files in {})",
        subject.label,
        subject.bin.display(),
        world.dir.display()
    );
    let prober = prober_config(cli)?;
    let started = Utc::now();
    let mut watchdog = Watchdog::start_prober(cli, &prober, subject, world, run)?;
    let sampler = procstat::Sampler::start(watchdog.pid()?);

    // Warm-up: start-up, cache sync and the first two probe rounds are not steady state.
    let mut warmup = cli.initial_delay + cli.probe_interval * 2;
    if cli.scenario == Scenario::Hostile && cli.slow_shoots > 0 {
        // Every shoot's first run starts at once, before any is known to be slow: until the
        // slow shoots' first runs have failed (their probe timeout) they are not yet told
        // apart from prompt ones (README "Memory: one limit"). The window starts after that;
        // what the start cost the normal shoots is in their failure counters.
        warmup += prober.config.probe_timeout + hostile::SLOW_MARGIN;
    }
    eprintln!("run {run}: warm-up {warmup:?}");
    if cli.scenario == Scenario::Hostile {
        return run_hostile(
            cli, &prober, subject, world, watchdog, sampler, started, warmup,
        )
        .await;
    }
    sleep_watching(&mut watchdog, warmup).await?;
    if let Some(j) = cli.stop_shoot_apiserver {
        eprintln!("run {run}: stopping shoot apiserver {j}");
        world.shoot_apis[j]
            .stop()
            .await
            .context("stop shoot apiserver")?;
    }
    if let Some(j) = cli.slow_shoot_apiserver {
        eprintln!(
            "run {run}: shoot apiserver {j} answers {:?} late",
            cli.slow_latency
        );
        world.shoot_apis[j].set_latency(cli.slow_latency);
    }
    let window_from = Utc::now();
    let sizes_from = WindowSizes::scrape(world).await;

    let outage = match cli.scenario {
        Scenario::Steady => {
            eprintln!("run {run}: steady for {:?}", cli.duration);
            sleep_watching(&mut watchdog, cli.duration).await?;
            None
        }
        Scenario::Outage | Scenario::MassOutage => {
            let affected: Vec<usize> = if cli.scenario == Scenario::Outage {
                vec![0]
            } else {
                (0..cli.shoots).collect()
            };
            Some(
                run_outage(
                    cli,
                    &prober.config,
                    world,
                    &mut watchdog,
                    &affected,
                    cli.outage_for,
                    window_from,
                )
                .await?,
            )
        }
        Scenario::WeederStorm => bail!("the weeder storm is not a prober scenario"),
        Scenario::Hostile => bail!("the hostile scenario runs in run_hostile"),
    };
    let end = WindowEnd::now(world, &sizes_from).await;
    let records = decision_records(&watchdog, prober.config.dependent_resource_infos.len()).await;
    eprintln!("run {run}: stopping the watchdog");
    let measured = stop_watchdog(&mut watchdog, sampler, started, window_from, end).await;
    let analysed = analyse(cli, &prober, subject, world, &measured, outage.as_ref()).await;
    analysed.map(|out| out.with("decision_records", records))
}

impl RunOutput {
    /// The same output with `key` set to `value` in its JSON.
    fn with(mut self, key: &str, value: Value) -> RunOutput {
        self.json[key] = value;
        self
    }
}

/// What the prober's decision-record rings hold at the end of the run (its
/// `/debug/decisions`, issue 36), against the README's bound `min(S × 8 ×
/// record_bound(T), 16 MiB)` for `S` shoots with records and `T` targets; `null` for a
/// binary without the endpoint (the reference).
async fn decision_records(watchdog: &Watchdog, targets: usize) -> Value {
    let Some(addr) = watchdog.metrics_addr else {
        return Value::Null;
    };
    let index =
        match dwd_testenv::http::get(addr, "/debug/decisions", Duration::from_secs(10)).await {
            Ok((200, body)) => serde_json::from_str::<Value>(&body).unwrap_or(Value::Null),
            _ => return Value::Null,
        };
    let shoots = index["shoots"].as_array().map_or(0, Vec::len);
    let records: u64 = index["shoots"]
        .as_array()
        .map_or(0, |s| s.iter().filter_map(|x| x["records"].as_u64()).sum());
    let bytes = index["bytes"].as_u64().unwrap_or(0);
    let per_record = dwd_core::record::record_bound(targets) as u64;
    let bound = (shoots as u64 * 8 * per_record).min(16 << 20);
    json!({
        "shoots_with_records": shoots,
        "records": records,
        "bytes": bytes,
        "bytes_per_record": if records == 0 { 0.0 } else { bytes as f64 / records as f64 },
        "bound_bytes": bound,
        "bound": "min(S × 8 × record_bound(T), 16 MiB)",
        "within_bound": bytes <= bound,
    })
}

/// How the run ended when its outage failed with `e`: a binary that balloons or exits ends the
/// run, not the bench (the normal shoots' kubelets resume); any other failure is the bench's.
fn outage_ended_early(
    watchdog: &mut Watchdog,
    world: &World,
    e: anyhow::Error,
) -> Result<hostile::Ended> {
    let ended = if let Some((at, rss)) = watchdog.killed_at_limit {
        hostile::Ended::KilledAtLimit { at, rss }
    } else if watchdog.process.has_exited() {
        hostile::Ended::Exited {
            at: Utc::now(),
            log_tail: watchdog.process.log_tail(2000),
        }
    } else {
        return Err(e);
    };
    eprintln!("run: the outage ended early: {e:#}");
    for shoot in &world.shoots {
        shoot.sim.kubelets().resume_all();
    }
    Ok(ended)
}

// The pieces of one run, handed over from `run_once` after the watchdog started.
#[allow(clippy::too_many_arguments)]
/// The hostile scenario's run: warm-up and window watched for the RSS limit (a binary that
/// passes it is stopped and the run still analysed), the watchdog's metrics read before it
/// stops, then the common analysis plus the `hostile` object.
async fn run_hostile(
    cli: &Cli,
    prober: &Derived<ProberConfig>,
    subject: &Subject,
    world: &World,
    mut watchdog: Watchdog,
    sampler: procstat::Sampler,
    started: DateTime<Utc>,
    warmup: Duration,
) -> Result<RunOutput> {
    let limit = cli.rss_limit_mib.saturating_mul(1 << 20);
    let mut ended = hostile::watch(&mut watchdog, warmup, limit).await?;
    let window_from = Utc::now();
    let sizes_from = WindowSizes::scrape(world).await;
    let metrics_from = match (ended.running(), watchdog.metrics_addr) {
        (true, Some(addr)) => hostile::scrape_watchdog(addr).await,
        _ => None,
    };
    let mut outage = None;
    match (ended.running(), cli.outage_normal) {
        (false, _) => {}
        (true, None) => {
            eprintln!(
                "run: hostile shoots next to normal ones for {:?}",
                cli.duration
            );
            ended = hostile::watch(&mut watchdog, cli.duration, limit).await?;
        }
        (true, Some(outage_for)) => {
            // The normal shoots are probed for a while next to the hostile ones first.
            let lead = cli.probe_interval * hostile::OUTAGE_LEAD_INTERVALS;
            eprintln!(
                "run: hostile shoots next to normal ones; every normal shoot's kubelets go silent in {lead:?} for {outage_for:?}"
            );
            ended = hostile::watch(&mut watchdog, lead, limit).await?;
            if ended.running() {
                watchdog.rss_limit = Some(limit);
                let affected: Vec<usize> = (0..world.shoots.len()).collect();
                let record = run_outage(
                    cli,
                    &prober.config,
                    world,
                    &mut watchdog,
                    &affected,
                    Some(outage_for),
                    window_from,
                )
                .await;
                watchdog.rss_limit = None;
                match record {
                    Ok(o) => outage = Some(o),
                    Err(e) => ended = outage_ended_early(&mut watchdog, world, e)?,
                }
            }
        }
    }
    let end = WindowEnd::now(world, &sizes_from).await;
    let metrics = match (ended.running(), watchdog.metrics_addr) {
        (true, Some(addr)) => hostile::scrape_watchdog(addr).await,
        _ => None,
    };
    eprintln!("run: stopping the watchdog ({})", ended.to_json()["how"]);
    let measured = stop_watchdog(&mut watchdog, sampler, started, window_from, end).await;
    let mut out = analyse(cli, prober, subject, world, &measured, outage.as_ref()).await?;
    out.json["hostile"] = hostile::analyse(
        cli,
        world,
        &hostile::Observed {
            started,
            window_from,
            window_to: measured.window_to,
            samples: &measured.samples,
            ended: &ended,
            metrics_at_window_start: metrics_from,
            metrics,
            outage_silenced_at: outage.as_ref().map(|o| o.silenced_at),
        },
    )?;
    out.json["hostile"]["done_when"] = hostile::done_when(cli, &out.json, &ended);
    Ok(out)
}

/// Response-size counters of the seed and every reachable shoot apiserver at one moment.
pub(crate) struct WindowSizes {
    seed: Option<metrics::Snapshot>,
    shoots: Vec<Option<metrics::Snapshot>>,
}

impl WindowSizes {
    /// Reads every apiserver's `/metrics`; a stopped apiserver reads as `None`.
    pub(crate) async fn scrape(world: &World) -> WindowSizes {
        let seed = metrics::scrape(&world.seed_client).await.ok();
        let mut shoots = Vec::with_capacity(world.shoot_clients.len());
        for (j, client) in world.shoot_clients.iter().enumerate() {
            shoots.push(if world.shoot_apis[j].is_running() {
                metrics::scrape(client).await.ok()
            } else {
                None
            });
        }
        WindowSizes { seed, shoots }
    }

    /// The window's deltas: the seed's, the shoot apiservers' summed, and which shoot
    /// apiservers could not be read at both ends.
    pub(crate) fn delta(&self, to: &WindowSizes) -> SizeDeltas {
        let seed = match (&self.seed, &to.seed) {
            (Some(a), Some(b)) => Some(metrics::delta(a, b)),
            _ => None,
        };
        let mut shoot = metrics::Snapshot::new();
        let mut unread = Vec::new();
        for (j, (a, b)) in self.shoots.iter().zip(&to.shoots).enumerate() {
            match (a, b) {
                (Some(a), Some(b)) => metrics::add(&mut shoot, &metrics::delta(a, b)),
                _ => unread.push(j),
            }
        }
        SizeDeltas {
            seed,
            shoot,
            shoot_unread: unread,
        }
    }
}

/// Response-size deltas over the measured window.
pub(crate) struct SizeDeltas {
    /// The seed's (`None`: not readable).
    pub seed: Option<metrics::Snapshot>,
    /// All readable shoot apiservers', summed.
    pub shoot: metrics::Snapshot,
    /// Shoot apiservers not readable at both ends (stopped).
    pub shoot_unread: Vec<usize>,
}

/// The end of a measured window, read while the watchdog still runs.
pub(crate) struct WindowEnd {
    at: DateTime<Utc>,
    sizes: SizeDeltas,
}

impl WindowEnd {
    /// Now, and the response sizes' growth since `sizes_from` (the window's start).
    pub(crate) async fn now(world: &World, sizes_from: &WindowSizes) -> WindowEnd {
        let at = Utc::now();
        let sizes_to = WindowSizes::scrape(world).await;
        WindowEnd {
            at,
            sizes: sizes_from.delta(&sizes_to),
        }
    }
}

/// Stops the watchdog after its measured window (`window_from` to `end`) and hands the run's
/// measurements over once the apiservers' audit logs hold everything it did.
pub(crate) async fn stop_watchdog(
    watchdog: &mut Watchdog,
    sampler: procstat::Sampler,
    started: DateTime<Utc>,
    window_from: DateTime<Utc>,
    end: WindowEnd,
) -> Measured {
    let samples = sampler.samples();
    watchdog.process.stop(Duration::from_secs(3));
    // The audit logs are written in batches of at most 1 s.
    tokio::time::sleep(Duration::from_secs(3)).await;
    Measured {
        started,
        window_from,
        window_to: end.at,
        samples,
        sizes: end.sizes,
    }
}

/// What a run measured, handed to the analysis in one piece.
pub(crate) struct Measured {
    /// When the watchdog was started.
    pub started: DateTime<Utc>,
    /// Start of the measured window (after warm-up).
    pub window_from: DateTime<Utc>,
    /// End of the measured window.
    pub window_to: DateTime<Utc>,
    /// `/proc` samples of the watchdog.
    pub samples: Vec<procstat::Sample>,
    /// Response-size deltas over the window.
    pub sizes: SizeDeltas,
}

/// Sizes of the bench's own GET of each non-resource path (`/version`, …) on `client`.
async fn non_resource_sizes(client: &kube::Client, paths: &[String]) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for p in paths {
        if let Ok(n) = metrics::get_size(client, p).await {
            out.insert(p.clone(), n);
        }
    }
    out
}

/// The watchdog's seed requests: everything from its start to the end of the run
/// (`ResponseComplete` events; long watches are logged when they end, stamped with their
/// start). Shared by the prober and the weeder analysis.
pub(crate) fn seed_requests(world: &World, started: DateTime<Utc>) -> Result<Vec<audit::Request>> {
    audit::read(&world.seed.audit_log_path(), started, |u| {
        u == WATCHDOG_USER
    })
}

/// `{key: count per minute}` over a window of `window_secs`.
pub(crate) fn per_minute(counts: BTreeMap<String, u64>, window_secs: f64) -> Value {
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
}

/// The `seed_requests` object and the seed part of `response_bytes`, shared by both kinds of
/// run. Requests at or after `window_to` belong to the next run and are left out.
pub(crate) async fn seed_json(world: &World, m: &Measured) -> Result<(Value, Value)> {
    let window_secs = secs(m.window_from, m.window_to).max(1e-3);
    let requests = seed_requests(world, m.started)?;
    let window: Vec<&audit::Request> = requests
        .iter()
        .filter(|r| r.received >= m.window_from && r.received <= m.window_to)
        .collect();
    // Start-up (initial lists, watches) is reported apart: a cache-based binary pays here
    // once what a GET-based one pays every run.
    let startup: Vec<&audit::Request> = requests
        .iter()
        .filter(|r| r.received < m.window_from)
        .collect();
    let counts = audit::by_key(window.iter().copied());
    let seed_requests = json!({
        "total": window.len(),
        "per_minute": per_minute(counts.clone(), window_secs),
        "failures_by_code": audit::failures_by_code(window.iter().copied()),
        "warmup_total": startup.len(),
        "warmup_by_verb_resource": audit::by_key(startup.iter().copied()),
    });
    let bytes = match &m.sizes.seed {
        Some(delta) => {
            let paths = metrics::non_resource_paths(window.iter().copied());
            let sizes = non_resource_sizes(&world.seed_client, &paths).await;
            let (rows, total) = metrics::attribute(delta, &counts, &sizes);
            json!({
                "watchdog_total_bytes": total.round(),
                "watchdog_by_verb_resource": rows,
                "all_clients_by_verb_resource": metrics::to_json(delta),
            })
        }
        None => Value::Null,
    };
    Ok((seed_requests, bytes))
}

/// How long the outage's targets may take to go down, and then to come back: leases expire
/// 0.75 × grace after the stamp; then a probe run, then the flow; mass outages add the
/// QPS-bound writes of `affected` shoots, and the scale-up waits out its levels'
/// initialDelays (Gardener: MCM's 30 s) on top.
fn outage_timeouts(cli: &Cli, config: &ProberConfig, affected: usize) -> (Duration, Duration) {
    let writes = affected as f64 * targets(config).len() as f64 * WRITES_PER_TARGET;
    let slack = cli.probe_interval * 3
        + Duration::from_secs(60)
        + Duration::from_secs_f64(writes / cli.kube_api_qps.max(0.1) * 2.0);
    let down_timeout = cli.kcm_grace.mul_f64(0.75) + cli.renew_interval + slack;
    let up_timeout = cli.renew_interval + slack + scale_up_delays(config);
    (down_timeout, up_timeout)
}

/// The `(shoot, target)`s of `targets` scaled to 0 since `since`.
fn gone_to_zero<'a>(
    world: &World,
    targets: &[(usize, &'a str)],
    since: DateTime<Utc>,
) -> Vec<(usize, &'a str)> {
    targets
        .iter()
        .copied()
        .filter(|(i, t)| {
            first_change(world, &setup::shoot_namespace(*i), t, since, |r| r == 0).is_some()
        })
        .collect()
}

/// A storm of `outage` from `silenced_at` ends when it ends, flows done or not: waits it out
/// (the watchdog alive, `on_tick` polled), then says whether every target went down by then.
async fn wait_outage_over(
    world: &World,
    watchdog: &mut Watchdog,
    every_target: &[(usize, &str)],
    (silenced_at, outage): (DateTime<Utc>, Duration),
    mut note_last_words: impl FnMut(),
) -> Result<bool> {
    let elapsed = (Utc::now() - silenced_at).to_std().unwrap_or_default();
    let until = tokio::time::Instant::now() + outage.saturating_sub(elapsed);
    while tokio::time::Instant::now() < until {
        watchdog.check_alive()?;
        note_last_words();
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let down = gone_to_zero(world, every_target, silenced_at).len();
    eprintln!(
        "run: outage over after {outage:?}: {down}/{} targets went down by then",
        every_target.len()
    );
    Ok(down == every_target.len())
}

/// What one outage works on: the affected shoots of the world, each of their targets, and
/// how long it lasts (`None`: until every target is down) and may take.
struct Outage<'a> {
    cli: &'a Cli,
    world: &'a World,
    affected: &'a [usize],
    /// Every `(shoot, target)` of the affected shoots.
    every_target: Vec<(usize, &'a str)>,
    outage_for: Option<Duration>,
    /// How long the targets may take to go down, and then to come back.
    down_timeout: Duration,
    up_timeout: Duration,
}

/// How the silence went: when it began, when the last renewals stamped then were written, and
/// whether every target went down.
struct Silenced {
    silenced_at: DateTime<Utc>,
    cpu_waiting_at_silence: Option<u64>,
    last_words_written: Option<DateTime<Utc>>,
    all_down: bool,
}

/// How the recovery went: the renewals before and after the kubelets resumed, and whether
/// every target came back.
struct Resumed {
    before: Vec<(usize, HashMap<String, DateTime<Utc>>)>,
    resumed_at: DateTime<Utc>,
    after: Vec<(usize, RenewTimes)>,
    all_up: bool,
}

/// The affected shoots' renewals after the kubelets resumed. The kubelets keep only each
/// node's latest renewal; recovery is decided by the first one after resumption, and a relapse
/// by a later gap, so catch every one while polling: once a second is well within the renew
/// interval (the times are the renewTimes written, not the poll's), and the copies of N × M
/// renewals cost the shared machine little.
struct RenewalLog<'a> {
    world: &'a World,
    resumed_at: DateTime<Utc>,
    after: Vec<(usize, RenewTimes)>,
    last_recorded: Option<tokio::time::Instant>,
}

impl<'a> RenewalLog<'a> {
    fn new(world: &'a World, affected: &[usize], resumed_at: DateTime<Utc>) -> RenewalLog<'a> {
        RenewalLog {
            world,
            resumed_at,
            after: affected.iter().map(|&i| (i, HashMap::new())).collect(),
            last_recorded: None,
        }
    }

    /// Records the renewals since the last time, at most once a second unless `force`d.
    fn record(&mut self, force: bool) {
        if !force
            && self
                .last_recorded
                .is_some_and(|t| t.elapsed() < Duration::from_secs(1))
        {
            return;
        }
        self.last_recorded = Some(tokio::time::Instant::now());
        for (i, seen) in self.after.iter_mut() {
            for (node, (t, landed)) in self.world.shoots[*i].sim.kubelets().renewals_landed() {
                if t > self.resumed_at {
                    let times = seen.entry(node).or_default();
                    if times.last().map(|r| r.at) != Some(t) {
                        times.push(storm::Renewal { at: t, landed });
                    }
                }
            }
        }
    }
}

impl Outage<'_> {
    /// Silences every kubelet of the affected shoots and waits for their targets to go down
    /// (or `outage_for` after the silence, flows done or not).
    async fn silence_until_down(&self, watchdog: &mut Watchdog) -> Result<Silenced> {
        let (cli, world, affected) = (self.cli, self.world, self.affected);
        // Every silenced kubelet's last renewal is stamped `silenced_at` (written at once, in
        // the background): all leases of all affected shoots expire at the same instant, the
        // hardest case, and the crossing is exact instead of spread over a renew interval.
        let silenced_at = dwd_sim::now_micros();
        let cpu_waiting_at_silence = procstat::cpu_waiting_us();
        for &i in affected {
            world.shoots[i]
                .sim
                .kubelets()
                .silence_count_stamped(cli.nodes, silenced_at);
        }
        eprintln!(
            "run: silencing every kubelet of {} shoot(s) after a last renewal stamped {silenced_at}",
            affected.len()
        );
        let mut last_words_written: Option<DateTime<Utc>> = None;
        let mut note_last_words = || {
            if last_words_written.is_none()
                && affected
                    .iter()
                    .all(|&i| world.shoots[i].sim.kubelets().last_words_pending() == 0)
            {
                let now = Utc::now();
                eprintln!(
                    "run: last renewals written after {:.1}s",
                    secs(silenced_at, now)
                );
                last_words_written = Some(now);
            }
        };
        let every_target = &self.every_target;
        let all_down = match self.outage_for {
            // The storm ends when it ends, flows done or not.
            Some(outage) => {
                wait_outage_over(
                    world,
                    watchdog,
                    every_target,
                    (silenced_at, outage),
                    &mut note_last_words,
                )
                .await?
            }
            None => {
                wait_all(
                    world,
                    watchdog,
                    every_target,
                    silenced_at,
                    |r| r == 0,
                    self.down_timeout,
                    "scaled down",
                    &mut note_last_words,
                )
                .await?
            }
        };
        note_last_words();
        Ok(Silenced {
            silenced_at,
            cpu_waiting_at_silence,
            last_words_written,
            all_down,
        })
    }

    /// Resumes the kubelets and waits for every target that went down since `silenced_at` to
    /// be back (with `outage_for`, for every target up and settled), recording the renewals.
    async fn resume_until_restored(
        &self,
        watchdog: &mut Watchdog,
        silenced_at: DateTime<Utc>,
    ) -> Result<Resumed> {
        let (cli, world, affected) = (self.cli, self.world, self.affected);
        let before = affected
            .iter()
            .map(|&i| (i, world.shoots[i].sim.kubelets().renewals()))
            .collect();
        let resumed_at = Utc::now();
        for &i in affected {
            world.shoots[i].sim.kubelets().resume_all();
        }
        eprintln!("run: kubelets of {} shoot(s) renew again", affected.len());
        let mut renewals = RenewalLog::new(world, affected, resumed_at);
        let all_up = match self.outage_for {
            // Flows may still take targets down after the kubelets are back: wait until every
            // target is up and nothing has changed for two probe intervals.
            Some(_) => {
                let quiet = cli
                    .probe_interval
                    .mul_f64(2.0 * (1.0 + cli.jitter.max(0.0)))
                    + Duration::from_secs(5);
                // The flows of the storm may still be under way (a binary that waits for them
                // restores only after them).
                let timeout = self.down_timeout + self.up_timeout;
                wait_settled(world, watchdog, &self.every_target, quiet, timeout, || {
                    renewals.record(false)
                })
                .await?
            }
            None => {
                // Only what went down can be restored (a binary that missed some must not make
                // the bench wait out the whole timeout for them).
                let went_down = gone_to_zero(world, &self.every_target, silenced_at);
                wait_all(
                    world,
                    watchdog,
                    &went_down,
                    resumed_at,
                    |r| r > 0,
                    self.up_timeout,
                    "restored",
                    || renewals.record(false),
                )
                .await?
            }
        };
        renewals.record(true);
        Ok(Resumed {
            before,
            resumed_at,
            after: renewals.after,
            all_up,
        })
    }
}

/// Silences every kubelet of the `affected` shoots, waits for their targets to go down (or
/// `outage_for` after the silence, flows done or not), resumes the kubelets, waits for every
/// target to be back, then measures steady state for what is left of `--duration` after
/// `window_from`.
async fn run_outage(
    cli: &Cli,
    config: &ProberConfig,
    world: &World,
    watchdog: &mut Watchdog,
    affected: &[usize],
    outage_for: Option<Duration>,
    window_from: DateTime<Utc>,
) -> Result<OutageRecord> {
    let targets = targets(config);
    let (down_timeout, up_timeout) = outage_timeouts(cli, config, affected.len());
    let outage = Outage {
        cli,
        world,
        affected,
        every_target: affected
            .iter()
            .flat_map(|&i| targets.iter().map(move |(t, _, _)| (i, *t)))
            .collect(),
        outage_for,
        down_timeout,
        up_timeout,
    };
    let silenced = outage.silence_until_down(watchdog).await?;
    let resumed = outage
        .resume_until_restored(watchdog, silenced.silenced_at)
        .await?;
    let restored_by = Utc::now();
    let cpu_waiting_us = (silenced.cpu_waiting_at_silence, procstat::cpu_waiting_us());

    // Keep measuring steady state for whatever is left of --duration.
    let spent = (Utc::now() - window_from).to_std().unwrap_or_default();
    if let Some(rest) = cli.duration.checked_sub(spent) {
        eprintln!("run: steady for the remaining {rest:?}");
        sleep_watching(watchdog, rest).await?;
    }
    Ok(OutageRecord {
        silenced_at: silenced.silenced_at,
        last_words_written: silenced.last_words_written,
        resumed_at: resumed.resumed_at,
        restored_by,
        before: resumed.before,
        cpu_waiting_us,
        after: resumed.after,
        all_down: silenced.all_down,
        all_up: resumed.all_up,
    })
}

/// Seconds from `a` to `b` (negative when `b` is earlier).
pub(crate) fn secs(a: DateTime<Utc>, b: DateTime<Utc>) -> f64 {
    (b - a).num_microseconds().unwrap_or(i64::MAX) as f64 / 1e6
}

/// Probe lateness: gaps between consecutive `GET /version` of one shoot, both in the window,
/// minus the configured interval.
struct ProbeLateness {
    /// Every gap of the shoots on healthy apiservers.
    gaps: Vec<f64>,
    /// Per such shoot, its worst gap (the time since its last probe included).
    worst_per_shoot: Vec<f64>,
    /// The gaps of the shoots on the slow apiserver (slow by design: reported apart).
    slow_gaps: Vec<f64>,
    /// Shoots not probed at all in the window.
    unprobed: usize,
}

impl ProbeLateness {
    /// The lateness of `world`'s shoots from their `probes` in `(window_from, window_to)`.
    fn of(
        cli: &Cli,
        world: &World,
        probes: &TimesByUser,
        (window_from, window_to): (DateTime<Utc>, DateTime<Utc>),
    ) -> ProbeLateness {
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
        ProbeLateness {
            gaps,
            worst_per_shoot,
            slow_gaps,
            unprobed,
        }
    }

    /// The `probe_lateness_s` object (with the count of shoots whose probes a stopped
    /// apiserver could not log).
    fn to_json(&self, cli: &Cli, world: &World) -> Value {
        json!({
            "all_gaps": Summary::of(&self.gaps).to_json(),
            "worst_per_shoot": Summary::of(&self.worst_per_shoot).to_json(),
            "shoots_never_probed_in_window": self.unprobed,
            "slow_apiserver_gaps": Summary::of(&self.slow_gaps).to_json(),
            "shoots_on_stopped_apiserver": cli.stop_shoot_apiserver.map(|j| world.shoots.iter().filter(|s| s.index % cli.shoot_apiservers == j).count()),
        })
    }
}

/// Whether the simulated kubelets kept up: at N × M in the tens of thousands a short renew
/// interval is more than the shoot apiservers can take on a small machine, and leases then
/// age towards expiry on their own.
fn kubelets_json(cli: &Cli, world: &World) -> Value {
    let now = Utc::now();
    let mut ages: Vec<f64> = Vec::new();
    let mut renew_failures = 0u64;
    for shoot in &world.shoots {
        let kubelets = shoot.sim.kubelets();
        renew_failures += kubelets.failures();
        let silenced: HashSet<String> = kubelets.silenced().into_iter().collect();
        let renewals = kubelets.renewals();
        ages.extend(
            kubelets
                .nodes()
                .iter()
                .filter(|n| !silenced.contains(*n))
                .filter_map(|n| renewals.get(n))
                .map(|t| secs(*t, now)),
        );
    }
    json!({
        "renew_interval_s": cli.renew_interval.as_secs_f64(),
        "lease_age_at_end_s": Summary::of(&ages).to_json(),
        "lease_validity_s": cli.kcm_grace.as_secs_f64() * 0.75,
        "renew_failures_since_setup": renew_failures,
    })
}

/// The `config` object: the intervals, qps and apiserver faults of the command line and the
/// prober config both binaries ran.
fn config_json(cli: &Cli, prober: &Derived<ProberConfig>) -> Value {
    json!({
        "probe_interval_s": cli.probe_interval.as_secs_f64(), "initial_delay_s": cli.initial_delay.as_secs_f64(),
        "kcm_grace_s": cli.kcm_grace.as_secs_f64(), "jitter": cli.jitter,
        "threshold": prober.config.node_lease_failure_fraction,
        "prober_config": {
            "from": gardener::PROBER_FIXTURE_PATH,
            "changed_from_gardener": prober.changes.iter().map(|c| c.to_string()).collect::<Vec<_>>(),
            "scale_down": flow(&prober.config, true),
            "scale_up": flow(&prober.config, false),
        },
        "renew_interval_s": cli.renew_interval.as_secs_f64(),
        "kube_api_qps": cli.kube_api_qps, "kube_api_burst": cli.kube_api_burst,
        "stopped_shoot_apiserver": cli.stop_shoot_apiserver,
        "slow_shoot_apiserver": cli.slow_shoot_apiserver.map(|j| json!({"index": j, "latency_s": cli.slow_latency.as_secs_f64()})),
    })
}

/// The sizes of the non-resource `paths`, read on a healthy shoot apiserver (a slow one would
/// only be slower, a stopped one mute); none without one.
async fn healthy_non_resource_sizes(
    cli: &Cli,
    world: &World,
    paths: &[String],
) -> BTreeMap<String, usize> {
    let healthy = (0..world.shoot_clients.len())
        .find(|j| cli.stop_shoot_apiserver != Some(*j) && cli.slow_shoot_apiserver != Some(*j));
    match healthy {
        Some(j) => non_resource_sizes(&world.shoot_clients[j], paths).await,
        None => BTreeMap::new(),
    }
}

/// Reads the audit logs and samples back into the run's result.
async fn analyse(
    cli: &Cli,
    prober: &Derived<ProberConfig>,
    subject: &Subject,
    world: &World,
    m: &Measured,
    outage: Option<&OutageRecord>,
) -> Result<RunOutput> {
    let (window_from, window_to) = (m.window_from, m.window_to);
    let window_secs = secs(window_from, window_to).max(1e-3);
    let usage = procstat::usage(&m.samples, window_from, window_to);

    // Seed: the watchdog's own user only (the simulator and the bench use `admin`).
    let (seed_json, seed_bytes) = seed_json(world, m).await?;
    let mut shoot_requests = Vec::new();
    for api in &world.shoot_apis {
        shoot_requests.extend(audit::read(&api.audit_log_path(), m.started, |u| {
            u.starts_with("shoot-")
        })?);
    }
    let in_window = |r: &&audit::Request| r.received >= window_from && r.received <= window_to;
    let shoot_window: Vec<&audit::Request> = shoot_requests.iter().filter(in_window).collect();
    let probes = audit::version_probes(&shoot_requests);
    let probe_runs = shoot_window
        .iter()
        .filter(|r| r.verb == "get" && r.what == "/version")
        .count();

    // Shoot response bytes: the watchdog's reads times the window's mean response size.
    let shoot_counts = audit::by_key(shoot_window.iter().copied());
    let paths = metrics::non_resource_paths(shoot_window.iter().copied());
    let sizes = healthy_non_resource_sizes(cli, world, &paths).await;
    let (shoot_rows, shoot_total) = metrics::attribute(&m.sizes.shoot, &shoot_counts, &sizes);
    let response_bytes = json!({
        "method": "per verb and resource: the watchdog's request count (audit log) × the mean \
                   response size of all clients in the window (apiserver_response_sizes Δsum ÷ Δcount; \
                   GET and LIST only); non-resource GETs sized by the bench's own GET",
        "shoot": {
            "watchdog_total_bytes": shoot_total.round(),
            "watchdog_per_probe_run": if probe_runs > 0 { (shoot_total / probe_runs as f64).round() } else { 0.0 },
            "watchdog_by_verb_resource": shoot_rows,
            "all_clients_by_verb_resource": metrics::to_json(&m.sizes.shoot),
            "apiservers_not_read": m.sizes.shoot_unread,
        },
        "seed": seed_bytes,
    });

    let lateness = ProbeLateness::of(cli, world, &probes, (window_from, window_to));
    let kubelets = kubelets_json(cli, world);

    let mut dists = Dists::default();
    dists.insert(chart::PROBE_LATENESS.into(), lateness.gaps.clone());
    let outage_json = outage.map(|o| {
        let requests = audit::spans_by_user(shoot_requests.iter());
        let (json, down, up) =
            outage_results(cli, &prober.config, world, o, m.started, &probes, &requests);
        dists.insert(chart::SCALE_DOWN.into(), down);
        dists.insert(chart::RESTORE.into(), up);
        json
    });
    let outage_json = match outage_json {
        Some(r) => r?,
        None => Value::Null,
    };

    let json = json!({
        "label": subject.label,
        "binary": subject.bin.display().to_string(),
        "scenario": format!("{:?}", cli.scenario),
        "shape": {"shoots": cli.shoots, "nodes_per_shoot": cli.nodes, "shoot_apiservers": cli.shoot_apiservers, "kubelet_sized_nodes": cli.kubelet_sized_nodes},
        "config": config_json(cli, prober),
        "setup_s": world.setup_seconds,
        "window": {"from": window_from.to_rfc3339(), "to": window_to.to_rfc3339(), "seconds": window_secs},
        "process": usage.to_json(),
        "seed_requests": seed_json,
        "shoot_requests": {
            "total": shoot_window.len(),
            "probe_runs": probe_runs,
            "per_probe_run": if probe_runs > 0 { shoot_window.len() as f64 / probe_runs as f64 } else { 0.0 },
            "per_minute": per_minute(shoot_counts, window_secs),
            "failures_by_code": audit::failures_by_code(shoot_window.iter().copied()),
        },
        "probe_lateness_s": lateness.to_json(cli, world),
        "storm": outage_json.get("storm").cloned().unwrap_or(Value::Null),
        "outage": outage_json,
        "response_bytes": response_bytes,
        "kubelets": kubelets,
    });
    Ok(RunOutput { json, dists })
}

/// The outage's target timings, gathered shoot by shoot: crossing → 0 and recovery →
/// restored by target, the last level-0 target down, and what never went down or came back.
/// A target's time at 0 is the seed's ([`audit::first_write_completed`]); how much later the bench's
/// watch saw it is kept apart (`watch_lag`), to tell a starved bench from a late watchdog.
#[derive(Default)]
struct TargetTimes<'a> {
    down: BTreeMap<&'a str, Vec<f64>>,
    /// Per target taken to 0: the bench's watch stamp − the seed's completion, seconds.
    watch_lag: Vec<f64>,
    up: BTreeMap<&'a str, Vec<f64>>,
    level0_latest: Option<DateTime<Utc>>,
    missing_down: usize,
    level0_missing: usize,
    missing_up: usize,
}

impl<'a> TargetTimes<'a> {
    /// How much later than the seed the bench's watch saw the targets go to 0.
    fn watch_lag_json(&self) -> Value {
        json!({
            "means": "per target taken to 0: when the bench's Deployment watch saw it minus when the seed completed the write (its audit log); scale_down_s and protection count from the seed's time",
            "summary": Summary::of(&self.watch_lag).to_json(),
        })
    }

    /// Adds shoot `ns`'s `targets`, given when it `crossed` and `recovered`; returns each
    /// target's crossing → its first 0 (for the protection bound).
    fn add_shoot(
        &mut self,
        (world, seed_requests): (&World, &[audit::Request]),
        ns: &str,
        targets: &[(&'a str, u32, u32)],
        o: &OutageRecord,
        (crossed, recovered): (Option<DateTime<Utc>>, Option<DateTime<Utc>>),
    ) -> Vec<(String, Option<f64>)> {
        let mut shoot_down = Vec::new();
        for &(target, down_level, _) in targets {
            let seen = first_change(world, ns, target, o.silenced_at, |r| r == 0);
            // The seed's time when its audit has the write; the watch's only without it.
            let went_down = seen.map(|seen| {
                match audit::first_write_completed(seed_requests, (ns, target), o.silenced_at) {
                    Some(done) if done <= seen => {
                        self.watch_lag.push(secs(done, seen));
                        done
                    }
                    _ => seen,
                }
            });
            shoot_down.push((
                target.to_string(),
                crossed.zip(went_down).map(|(c, t)| secs(c, t)),
            ));
            match (crossed, went_down) {
                (Some(c), Some(t)) => {
                    self.down.entry(target).or_default().push(secs(c, t));
                    if down_level == 0 {
                        self.level0_latest =
                            Some(self.level0_latest.map_or(t, |l: DateTime<Utc>| l.max(t)));
                    }
                }
                _ => {
                    self.missing_down += 1;
                    self.level0_missing += usize::from(down_level == 0);
                }
            }
            // What never went down can't be restored (counted above).
            if went_down.is_none() {
                continue;
            }
            match (
                recovered,
                first_change(world, ns, target, o.resumed_at, |r| r > 0),
            ) {
                (Some(c), Some(t)) => self.up.entry(target).or_default().push(secs(c, t)),
                _ => self.missing_up += 1,
            }
        }
        shoot_down
    }
}

/// When a shoot crossed its threshold and when it recovered, from its renewals `before` and
/// `after` the resumption: down at the k-th lease to expire (k = fewest expired leases
/// reaching the threshold; a lease expires `grace` after its renewal), up once more than
/// m − k leases renewed after resumption (as the apiserver holds them: when each renewal
/// landed), fewer than k then being expired.
fn crossing_and_recovery(
    cli: &Cli,
    o: &OutageRecord,
    (before, after): (&HashMap<String, DateTime<Utc>>, &RenewTimes),
    (grace, k): (chrono::Duration, usize),
) -> (Option<DateTime<Utc>>, Option<DateTime<Utc>>) {
    // Down: the k-th lease to expire (k = fewest expired leases reaching the threshold).
    let mut expiries: Vec<DateTime<Utc>> = before.values().map(|t| *t + grace).collect();
    expiries.sort();
    let crossed = expiries.get(k - 1).copied();
    // Up: once more than m − k leases renewed after resumption (as the apiserver holds
    // them: when each renewal landed), fewer than k are expired.
    let mut renewed: Vec<DateTime<Utc>> = after
        .values()
        .filter_map(|times| times.first())
        .filter(|r| r.at > o.resumed_at)
        .map(|r| r.landed)
        .collect();
    renewed.sort();
    let recovered = renewed.get(cli.nodes - k).copied();
    (crossed, recovered)
}

/// The seed requests from the silence until every target was back, in the affected shoots'
/// namespaces.
fn requests_in_affected_namespaces<'r>(
    seed_requests: &'r [audit::Request],
    o: &OutageRecord,
) -> Vec<&'r audit::Request> {
    let affected: HashSet<String> = o
        .before
        .iter()
        .map(|(i, _)| setup::shoot_namespace(*i))
        .collect();
    seed_requests
        .iter()
        .filter(|r| r.received >= o.silenced_at && r.received <= o.restored_by)
        .filter(|r| r.namespace.as_ref().is_some_and(|ns| affected.contains(ns)))
        .collect()
}

/// Per target, the summary of its samples.
fn summarise_by_target(m: &BTreeMap<&str, Vec<f64>>) -> Value {
    m.iter()
        .map(|(k, v)| (k.to_string(), Summary::of(v).to_json()))
        .collect::<serde_json::Map<_, _>>()
        .into()
}

/// The storm's frame: its times, the intervals and qps, and what makes a shoot cross.
fn storm_frame(
    cli: &Cli,
    config: &ProberConfig,
    o: &OutageRecord,
    grace: chrono::Duration,
    k: usize,
) -> storm::StormFrame {
    storm::StormFrame {
        silenced_at: o.silenced_at,
        resumed_at: o.resumed_at,
        restored_by: o.restored_by,
        interval_s: cli.probe_interval.as_secs_f64(),
        jitter: cli.jitter,
        qps: cli.kube_api_qps,
        scale_up_delays_s: scale_up_delays(config).as_secs_f64(),
        lease_validity_s: grace.num_milliseconds() as f64 / 1000.0,
        expired_needed: k,
    }
}

/// Near 1: the machine was short of CPU throughout, and every latency above is as much the
/// machine's as the binary's.
fn cpu_pressure_json(o: &OutageRecord) -> Value {
    match o.cpu_waiting_us {
        (Some(a), Some(b)) => json!({
            "share": (b.saturating_sub(a) as f64 / 1e6) / secs(o.silenced_at, o.restored_by).max(1e-3),
            "means": "share of the storm (silence to every target back) in which at least one runnable task waited for a CPU (/proc/pressure/cpu, some)",
        }),
        _ => Value::Null,
    }
}

/// Every node's renew times: its last before the resumption, then each one after.
fn renew_times(
    before: &HashMap<String, DateTime<Utc>>,
    after: &RenewTimes,
) -> Vec<Vec<storm::Renewal>> {
    before
        .iter()
        .map(|(node, last)| {
            let mut times = vec![storm::Renewal::at_once(*last)];
            times.extend(after.get(node).into_iter().flatten().copied());
            times
        })
        .collect()
}

/// The outage part of the result, and the raw crossing → 0 and recovery → restored samples.
fn outage_results(
    cli: &Cli,
    config: &ProberConfig,
    world: &World,
    o: &OutageRecord,
    started: DateTime<Utc>,
    probes: &TimesByUser,
    requests: &SpansByUser,
) -> (Result<Value>, Vec<f64>, Vec<f64>) {
    let seed_requests = match seed_requests(world, started) {
        Ok(r) => r,
        Err(e) => return (Err(e), Vec::new(), Vec::new()),
    };
    let grace = chrono::Duration::from_std(cli.kcm_grace.mul_f64(0.75)).unwrap_or_default();
    let k = expired_needed(cli.nodes, config.node_lease_failure_fraction);
    let targets = targets(config);
    let level0 = targets.iter().filter(|(_, down, _)| *down == 0).count();
    let mut times = TargetTimes::default();
    let mut first_crossing: Option<DateTime<Utc>> = None;
    let mut last_crossing: Option<DateTime<Utc>> = None;
    let mut storm_shoots = Vec::new();
    // Per shoot, each target: crossing → its first 0 (for the protection bound; how it came
    // back is filled in from its storm record below).
    let mut protection_shoots: Vec<protection::ShootOutage> = Vec::new();
    for ((i, before), (_, after)) in o.before.iter().zip(&o.after) {
        let ns = setup::shoot_namespace(*i);
        let (crossed, recovered) = crossing_and_recovery(cli, o, (before, after), (grace, k));
        storm_shoots.push(storm_record(
            world,
            &seed_requests,
            (*i, &ns),
            recovered,
            renew_times(before, after),
            &targets,
            (probes, requests),
        ));
        if let Some(c) = crossed {
            first_crossing = Some(first_crossing.map_or(c, |f: DateTime<Utc>| f.min(c)));
            last_crossing = Some(last_crossing.map_or(c, |l: DateTime<Utc>| l.max(c)));
        }
        let seen = (world, seed_requests.as_slice());
        let shoot_down = times.add_shoot(seen, &ns, &targets, o, (crossed, recovered));
        protection_shoots.push(protection::ShootOutage {
            namespace: ns,
            down_s: shoot_down,
            restore: storm::Restore::NotDown,
        });
    }
    let outage_seed = requests_in_affected_namespaces(&seed_requests, o);
    let all_down: Vec<f64> = times.down.values().flatten().copied().collect();
    let all_up: Vec<f64> = times.up.values().flatten().copied().collect();
    // The bound, 1.2 × N × 2 writes ÷ qps, was set for one level-0 target per shoot
    // (the seeds' example: KCM); Gardener's level 0 holds MCM and CA, so it counts each.
    let bound = 1.2
        * (o.before.len() as f64 * level0 as f64 * WRITES_PER_TARGET / cli.kube_api_qps.max(0.1));
    let frame = storm_frame(cli, config, o, grace, k);
    // Each shoot judged against the protection bound (issue 34).
    for (p, storm) in protection_shoots.iter_mut().zip(&storm_shoots) {
        p.restore = storm.restore(&frame);
    }
    let protection = protection::judge(
        &protection::Terms::new(config, o.before.len(), cli.kube_api_qps),
        &protection_shoots,
    );
    let json = json!({
        "storm": storm::analyse(&frame, &storm_shoots),
        "protection": protection,
        "affected_shoots": o.before.len(),
        "expired_leases_needed": k,
        "all_scaled_down": o.all_down,
        "all_restored": o.all_up,
        "scale_down_s": {"all": Summary::of(&all_down).to_json(), "by_target": summarise_by_target(&times.down)},
        "restore_s": {"all": Summary::of(&all_up).to_json(), "by_target": summarise_by_target(&times.up)},
        "targets_missing_down": times.missing_down,
        "scale_down_seen_by_bench_watch_late_s": times.watch_lag_json(),
        "targets_missing_up": times.missing_up,
        // Near 1: the machine was short of CPU throughout, and every latency above is as much
        // the machine's as the binary's.
        "storm_cpu_pressure_some": cpu_pressure_json(o),
        "last_renewals_written_after_silence_s": o.last_words_written.map(|t| secs(o.silenced_at, t)),
        "crossing_spread_s": match (first_crossing, last_crossing) { (Some(f), Some(l)) => json!(secs(f, l)), _ => Value::Null },
        // Only defined when every level-0 target got there.
        "level0_all_zero_after_first_crossing_s": match (first_crossing, times.level0_latest, times.level0_missing) { (Some(c), Some(l), 0) => json!(secs(c, l)), _ => Value::Null },
        "level0_targets_never_down": times.level0_missing,
        "level0_bound_s": bound,
        "seed_requests_in_affected_namespaces": {
            "total": outage_seed.len(),
            "by_verb_resource": audit::by_key(outage_seed.iter().copied()),
        },
    });
    (Ok(json), all_down, all_up)
}

/// Shoot `i`'s record of the storm: its targets' replica changes, its probes, the watchdog's
/// writes to its targets.
fn storm_record(
    world: &World,
    seed_requests: &[audit::Request],
    (i, ns): (usize, &str),
    recovered: Option<DateTime<Utc>>,
    renewals: Vec<Vec<storm::Renewal>>,
    targets: &[(&str, u32, u32)],
    (probes, requests): (&TimesByUser, &SpansByUser),
) -> storm::ShootStorm {
    let log = lock(&world.replicas);
    let replicas = targets
        .iter()
        .map(|(t, _, _)| {
            let changes = log
                .get(&(ns.to_string(), t.to_string()))
                .cloned()
                .unwrap_or_default();
            (t.to_string(), changes)
        })
        .collect();
    let writes = seed_requests
        .iter()
        .filter(|r| r.namespace.as_deref() == Some(ns))
        .filter(|r| matches!(r.verb.as_str(), "patch" | "update"))
        .filter(|r| r.what.starts_with("deployments"))
        .filter_map(|r| {
            let name = r.name.as_deref()?;
            targets
                .iter()
                .any(|(t, _, _)| *t == name)
                .then(|| (r.received, name.to_string()))
        })
        .collect();
    storm::ShootStorm {
        namespace: ns.to_string(),
        recovered,
        replicas,
        probes: probes
            .get(&world.shoots[i].user())
            .cloned()
            .unwrap_or_default(),
        requests: requests
            .get(&world.shoots[i].user())
            .cloned()
            .unwrap_or_default(),
        renewals,
        writes,
    }
}

/// `machine-controller-manager, cluster-autoscaler (level 0) → kube-controller-manager (level 1)`.
fn flow(config: &ProberConfig, down: bool) -> String {
    let mut levels: BTreeMap<u32, Vec<String>> = BTreeMap::new();
    for i in &config.dependent_resource_infos {
        let (info, level) = if down {
            (&i.scale_down, i.scale_down.level)
        } else {
            (&i.scale_up, i.scale_up.level)
        };
        let name = if info.initial_delay.is_zero() {
            i.target.name.clone()
        } else {
            format!(
                "{} after {}",
                i.target.name,
                dwd_core::format_go_duration(info.initial_delay)
            )
        };
        levels.entry(level).or_default().push(name);
    }
    levels
        .iter()
        .map(|(l, names)| format!("{} (level {l})", names.join(", ")))
        .collect::<Vec<_>>()
        .join(" → ")
}
