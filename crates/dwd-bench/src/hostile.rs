//! The hostile scenario (issue 17, item 1): the normal world of `--shoots` shoots next to two
//! shoots whose tenants turned against the watchdog, each on a shoot apiserver of its own (so
//! what they cost their apiserver is not charged to the normal shoots' apiservers):
//!
//! - `hostile-many`: a few healthy nodes, plus `--hostile-leases` (default 100,000) plain small
//!   leases in its `kube-node-lease` namespace;
//! - `hostile-fat`: a few healthy nodes, plus `--fat-leases` (default 1,000) leases carrying
//!   `--fat-lease-kib` (default 250) KiB of annotations each (the apiserver allows 256 KiB of
//!   annotations per object). The filler is pseudo-random text, so gzip on the wire can't hide
//!   its size.
//!
//! The watchdog runs as in `steady`; the bench reads its memory from `/proc` every second and
//! stops it if its RSS passes `--rss-limit-mib` (a finding, not a crash of the bench). What it
//! reports: peak RSS and RSS over time; for every normal shoot the probe schedule (the shoot
//! apiservers' audit logs: runs, gaps between consecutive runs, runs missed); whether anything
//! was scaled; and what happened to each hostile shoot (its apiserver's audit log: requests,
//! their codes and durations; and, where the binary serves them, its per-shoot metrics such
//! as `dwd_prober_oversized_responses_total`).

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, BufReader, Write as _};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use chrono::{DateTime, Utc};
use dwd_sim::shoot::DEFAULT_POOL;
use dwd_sim::{SeedControlPlane, ShootState, SimShoot, SimShootOptions, node_specs_with_prefix};
use dwd_testenv::{ApiServer, ApiServerOptions, TestEnv};
use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use kube::api::PostParams;
use serde_json::{Value, json};

use crate::scenario::{Watchdog, secs};
use crate::setup::{self, World, lock};
use crate::stats::Summary;
use crate::{Cli, procstat, report};

/// Healthy nodes (with kubelets) of each hostile shoot, next to its filler leases.
const HOSTILE_NODES: usize = 3;

/// Small filler leases created at once (the apiserver takes a few thousand a second).
const SMALL_CREATE_CONCURRENCY: usize = 48;

/// Fat filler leases created at once (each is a 250 KiB etcd write).
const FAT_CREATE_CONCURRENCY: usize = 8;

/// Attempts per filler lease (a busy apiserver may answer 429 or 5xx, or time out).
const CREATE_ATTEMPTS: usize = 6;

/// How much later than the config's `probeTimeout` the slow shoots answer.
pub(crate) const SLOW_MARGIN: Duration = Duration::from_secs(5);

/// Slow shoots' seed objects created at once during setup (namespace, secret, Cluster each).
const SLOW_CREATE_CONCURRENCY: usize = 24;

/// With `--outage-normal`: probe intervals of the measured window before the normal shoots'
/// kubelets go silent (they are probed next to the hostile ones for that long first).
pub(crate) const OUTAGE_LEAD_INTERVALS: u32 = 3;

/// What the hostile shoots hold.
#[derive(Debug, Clone, Copy)]
pub(crate) struct HostileShape {
    /// Plain small leases of `hostile-many`.
    pub many_leases: usize,
    /// Fat leases of `hostile-fat`.
    pub fat_leases: usize,
    /// Annotation bytes per fat lease.
    pub fat_bytes: usize,
    /// Slow shoots: each answers every request only after `slow_delay`
    /// ([`crate::fake_shoots::Tarpit`]).
    pub slow_shoots: usize,
    /// How long the slow shoots take to answer (longer than the config's `probeTimeout`).
    pub slow_delay: Duration,
    /// Empty items per list page of the amplification shoot; 0: no such shoot
    /// ([`crate::fake_shoots::Amplifier`]).
    pub amplify_items: usize,
}

/// Namespace of slow shoot `i`: project `tarpit`, apart from the normal shoots' `bench`.
pub(crate) fn slow_namespace(i: usize) -> String {
    format!("shoot--tarpit--n{i:04}")
}

/// Prefix of every slow shoot's namespace (and its per-shoot series' `shoot` label).
const SLOW_PREFIX: &str = "shoot--tarpit--";

/// The shoots behind fake apiservers: the slow ones and the amplification shoot.
pub(crate) struct Fakes {
    /// The slow shoots' server, if there are slow shoots.
    pub tarpit: Option<crate::fake_shoots::Tarpit>,
    /// How many slow shoots point at it.
    pub slow_shoots: usize,
    /// The amplification shoots (namespace, server): one oversized page, endless pages.
    pub amplifiers: Vec<(String, crate::fake_shoots::Amplifier)>,
    /// How long creating their seed objects took.
    pub setup_seconds: f64,
}

/// The amplification shoots' targets: anything scaled to 0 is a wrong scaling. The normal
/// shoots' replicas, which the reset between two runs of a comparison restores
/// ([`crate::reset`]: with KCM at 1 here it "repaired" both amplification shoots' KCM to 2
/// before the second binary ran).
const AMPLIFIER_TARGETS: [(&str, i32); 3] = dwd_sim::seed::DEFAULT_DEPLOYMENTS;

/// Creates `count` slow shoots in the seed (namespace, probe secret pointing at the tarpit by
/// `kubeconfig`, and Cluster each), telling the progress every 2 s since `started`.
async fn create_slow_shoots(
    seed_client: &kube::Client,
    count: usize,
    kubeconfig: &str,
    started: Instant,
) -> Result<()> {
    let mut done = 0usize;
    let mut last_report = Instant::now();
    let mut stream = futures::stream::iter(0..count)
        .map(|i| {
            let plane = SeedControlPlane::new(seed_client.clone(), slow_namespace(i));
            let kubeconfig = kubeconfig.to_string();
            async move {
                plane.create_namespace().await?;
                plane
                    .create_probe_secret(dwd_sim::seed::DEFAULT_PROBE_SECRET, &kubeconfig)
                    .await?;
                plane
                    .create_cluster(&ShootState::with_pools(&[DEFAULT_POOL]))
                    .await?;
                anyhow::Ok(())
            }
        })
        .buffer_unordered(SLOW_CREATE_CONCURRENCY);
    while let Some(r) = stream.next().await {
        r.context("create a slow shoot in the seed")?;
        done += 1;
        if last_report.elapsed() >= Duration::from_secs(2) || done == count {
            last_report = Instant::now();
            eprint!(
                "\rsetup: {done}/{} slow shoots after {:.1}s   ",
                count,
                started.elapsed().as_secs_f64()
            );
            let _ = std::io::stderr().flush();
        }
    }
    eprintln!();
    Ok(())
}

/// Starts the fake apiservers and creates their shoots in the seed: `shape.slow_shoots` slow
/// shoots (namespace, probe secret and Cluster each; no targets: their runs can only fail)
/// and, unless `shape.amplify_items` is 0, two amplification shoots, one of each
/// [`crate::fake_shoots::Pages`] (with Gardener's three targets, so a wrong scaling would
/// show). `kubeconfig` is any kubeconfig of the
/// environment served at `server` (its CA and a client certificate); each fake shoot's is
/// that one pointed at its server.
pub(crate) async fn build_fakes(
    env: &TestEnv,
    seed_client: &kube::Client,
    shape: HostileShape,
    kubeconfig: &str,
    server: SocketAddr,
) -> Result<Fakes> {
    let started = Instant::now();
    let tls = crate::shoot_proxy::server_tls(env.dir())?;
    let pointed_at = |addr: SocketAddr| {
        kubeconfig.replace(&format!("https://{server}"), &format!("https://{addr}"))
    };
    let tarpit = if shape.slow_shoots > 0 {
        Some(crate::fake_shoots::Tarpit::start(tls.clone(), shape.slow_delay).await?)
    } else {
        None
    };
    if let Some(tarpit) = &tarpit {
        create_slow_shoots(
            seed_client,
            shape.slow_shoots,
            &pointed_at(tarpit.addr),
            started,
        )
        .await?;
    }
    let mut amplifiers = Vec::new();
    if shape.amplify_items > 0 {
        for (kind, pages) in [
            (
                "amplify",
                crate::fake_shoots::Pages::Oversized(shape.amplify_items),
            ),
            ("amplify-paged", crate::fake_shoots::Pages::Endless),
        ] {
            let amplifier = crate::fake_shoots::Amplifier::start(tls.clone(), pages).await?;
            let ns = namespace(kind);
            let plane = SeedControlPlane::new(seed_client.clone(), ns.clone());
            plane.create_namespace().await?;
            plane
                .create_probe_secret(
                    dwd_sim::seed::DEFAULT_PROBE_SECRET,
                    &pointed_at(amplifier.addr),
                )
                .await?;
            plane
                .create_cluster(&ShootState::with_pools(&[DEFAULT_POOL]))
                .await?;
            plane
                .create_deployments(
                    &AMPLIFIER_TARGETS
                        .iter()
                        .map(|(n, r)| (n.to_string(), *r))
                        .collect::<Vec<_>>(),
                )
                .await?;
            eprintln!("setup: amplification shoot {ns}: {pages:?}");
            amplifiers.push((ns, amplifier));
        }
    }
    Ok(Fakes {
        tarpit,
        slow_shoots: shape.slow_shoots,
        amplifiers,
        setup_seconds: started.elapsed().as_secs_f64(),
    })
}

/// One hostile shoot: its own apiserver, a simulated shoot with a few healthy nodes, and a
/// tenant's filler leases.
pub(crate) struct HostileShoot {
    /// `many` or `fat`.
    pub kind: &'static str,
    /// Namespace in the seed (and Cluster name).
    pub namespace: String,
    /// The client-certificate user of its probe secret (names it in its audit log).
    pub user: String,
    /// Filler leases created.
    pub filler_leases: usize,
    /// Annotation bytes per filler lease.
    pub filler_bytes: usize,
    /// How long creating the filler leases took.
    pub fill_seconds: f64,
    /// The simulated shoot, held for its kubelets (they stop when it is dropped).
    _sim: SimShoot,
    /// Its own shoot apiserver.
    pub api: ApiServer,
}

/// Namespace of hostile shoot `kind`.
pub(crate) fn namespace(kind: &str) -> String {
    format!("shoot--bench--hostile-{kind}")
}

/// Starts the two hostile shoots' apiservers, creates the shoots and fills their
/// `kube-node-lease` namespaces, printing progress to stderr.
pub(crate) async fn build(
    env: &TestEnv,
    seed_client: &kube::Client,
    shape: HostileShape,
    renew_interval: Duration,
    limiter: Arc<tokio::sync::Semaphore>,
) -> Result<Vec<HostileShoot>> {
    let mut out = Vec::new();
    for (kind, count, bytes) in [
        ("many", shape.many_leases, 0usize),
        ("fat", shape.fat_leases, shape.fat_bytes),
    ] {
        let api = env
            .start_apiserver_with(
                &format!("hostile-{kind}"),
                ApiServerOptions {
                    install_crds: false,
                    audit_log: true,
                    extra_args: Vec::new(),
                    own_etcd: false,
                },
            )
            .await
            .with_context(|| format!("start the apiserver of hostile shoot {kind}"))?;
        let user = format!("hostile-{kind}");
        let kubeconfig = api
            .kubeconfig_for(&user, &["system:masters"])
            .with_context(|| format!("kubeconfig of hostile shoot {kind}"))?;
        let admin = api.client().await.context("hostile shoot admin client")?;
        let ns = namespace(kind);
        let mut options = SimShootOptions::new(ns.clone())
            .with_nodes(HOSTILE_NODES)
            .with_renew_interval(renew_interval);
        options.node_specs = Some(node_specs_with_prefix(
            &format!("h{kind}-node-"),
            HOSTILE_NODES,
            &[DEFAULT_POOL],
        ));
        options.renew_limiter = Some(limiter.clone());
        options.deployment_status_delay = None;
        let sim = SimShoot::create(seed_client.clone(), admin.clone(), &kubeconfig, options)
            .await
            .with_context(|| format!("create hostile shoot {kind}"))?;
        let started = Instant::now();
        fill(&admin, kind, count, bytes).await?;
        let fill_seconds = started.elapsed().as_secs_f64();
        eprintln!(
            "setup: hostile shoot {kind}: {count} filler leases ({} KiB of annotations each) in {fill_seconds:.1}s",
            bytes / 1024
        );
        out.push(HostileShoot {
            kind,
            namespace: ns,
            user,
            filler_leases: count,
            filler_bytes: bytes,
            fill_seconds,
            _sim: sim,
            api,
        });
    }
    Ok(out)
}

/// `n` pseudo-random letters and digits (xorshift; no dependency, deterministic): a tenant's
/// filler that gzip can shrink only to ~¾, unlike a run of one letter.
fn filler_text(n: usize) -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            ALPHABET[(x % ALPHABET.len() as u64) as usize] as char
        })
        .collect()
}

/// Creates `count` filler leases `tenant-<i>` in `kube-node-lease`, `bytes` of annotations
/// each (none when 0), with bounded concurrency and retries.
async fn fill(client: &kube::Client, kind: &str, count: usize, bytes: usize) -> Result<()> {
    let api: Api<Lease> = Api::namespaced(client.clone(), dwd_core::lease::NODE_LEASE_NAMESPACE);
    let filler = Arc::new(filler_text(bytes));
    let concurrency = if bytes > 0 {
        FAT_CREATE_CONCURRENCY
    } else {
        SMALL_CREATE_CONCURRENCY
    };
    let started = Instant::now();
    let mut last_report = Instant::now();
    let mut done = 0usize;
    let mut stream = futures::stream::iter(0..count)
        .map(|i| {
            let api = api.clone();
            let filler = filler.clone();
            async move {
                let name = format!("tenant-{i:06}");
                let mut metadata = json!({"name": name});
                if !filler.is_empty() {
                    metadata["annotations"] = json!({"tenant.example/filler": *filler});
                }
                let lease: Lease = serde_json::from_value(json!({
                    "metadata": metadata,
                    "spec": {
                        "holderIdentity": name,
                        "leaseDurationSeconds": 40,
                        "renewTime": Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
                    }
                }))
                .context("filler lease")?;
                let mut last_error = None;
                for attempt in 0..CREATE_ATTEMPTS {
                    match api.create(&PostParams::default(), &lease).await {
                        Ok(_) => return anyhow::Ok(()),
                        // A retried create that had gone through the first time.
                        Err(kube::Error::Api(e)) if e.code == 409 => return Ok(()),
                        Err(e) => last_error = Some(e),
                    }
                    tokio::time::sleep(Duration::from_millis(200 << attempt)).await;
                }
                Err(anyhow::anyhow!(
                    "create filler lease {name}: {last_error:?}"
                ))
            }
        })
        .buffer_unordered(concurrency);
    while let Some(r) = stream.next().await {
        r?;
        done += 1;
        if last_report.elapsed() >= Duration::from_secs(2) {
            last_report = Instant::now();
            eprint!(
                "\rsetup: hostile shoot {kind}: {done}/{count} filler leases after {:.1}s   ",
                started.elapsed().as_secs_f64()
            );
            let _ = std::io::stderr().flush();
        }
    }
    if count > 0 {
        eprintln!();
    }
    Ok(())
}

/// How the watchdog's run ended.
#[derive(Debug, Clone)]
pub(crate) enum Ended {
    /// It ran for the whole time.
    Completed,
    /// Its RSS passed the limit; the bench stopped it.
    KilledAtLimit {
        /// When.
        at: DateTime<Utc>,
        /// The RSS seen, bytes.
        rss: u64,
    },
    /// It exited on its own.
    Exited {
        /// When the bench noticed.
        at: DateTime<Utc>,
        /// The end of its log.
        log_tail: String,
    },
}

impl Ended {
    /// Whether the process still runs.
    pub(crate) fn running(&self) -> bool {
        matches!(self, Ended::Completed)
    }

    /// The `ended` object of the result.
    pub(crate) fn to_json(&self) -> Value {
        match self {
            Ended::Completed => json!({"how": "ran the whole time"}),
            Ended::KilledAtLimit { at, rss } => json!({
                "how": "stopped by the bench: RSS passed --rss-limit-mib",
                "at": at.to_rfc3339(), "rss_bytes": rss,
            }),
            Ended::Exited { at, log_tail } => json!({
                "how": "exited on its own", "at": at.to_rfc3339(), "log_tail": log_tail,
            }),
        }
    }
}

/// Lets the watchdog run for `d`, reading its RSS every 250 ms: past `limit` bytes it is
/// stopped (a balloon is a finding, not a reason to take the shared machine down).
pub(crate) async fn watch(watchdog: &mut Watchdog, d: Duration, limit: u64) -> Result<Ended> {
    let pid = watchdog.pid()?;
    let end = tokio::time::Instant::now() + d;
    while tokio::time::Instant::now() < end {
        if watchdog.process.has_exited() {
            return Ok(Ended::Exited {
                at: Utc::now(),
                log_tail: watchdog.process.log_tail(2000),
            });
        }
        if let Some(rss) = procstat::rss_over(pid, limit) {
            watchdog.process.kill();
            return Ok(Ended::KilledAtLimit {
                at: Utc::now(),
                rss,
            });
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    Ok(Ended::Completed)
}

/// The watchdog's own `/metrics` text (any binary serving Prometheus text there), or `None`.
pub(crate) async fn scrape_watchdog(addr: SocketAddr) -> Option<String> {
    match dwd_testenv::http::get(addr, "/metrics", Duration::from_secs(10)).await {
        Ok((200, body)) => Some(body),
        _ => None,
    }
}

/// Per-shoot series of the watchdog's metrics for namespace `ns`: `{metric: value}` (the
/// label spelling of ours is `shoot="<ns>"`; any series with a label naming the namespace is
/// taken).
fn series_for(metrics: &str, ns: &str) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for s in dwd_testenv::metrics::parse(metrics) {
        if s.labels.values().any(|v| v == ns) {
            *out.entry(s.name).or_insert(0.0) += s.value;
        }
    }
    out
}

/// Sum of every series of `name` whose `shoot` label starts with `prefix`.
fn sum_shoots(metrics: &str, name: &str, prefix: &str) -> f64 {
    dwd_testenv::metrics::parse(metrics)
        .into_iter()
        .filter(|s| s.name == name && s.labels.get("shoot").is_some_and(|v| v.starts_with(prefix)))
        .map(|s| s.value)
        // An empty sum is -0.0; +0.0 makes it print as 0.
        .sum::<f64>()
        + 0.0
}

/// One request of a hostile shoot's user, with how long it took.
struct Timed {
    received: DateTime<Utc>,
    verb: String,
    what: String,
    code: i64,
    seconds: f64,
}

/// The requests of `user` in an audit log since `since` (`ResponseComplete`), with their
/// durations (`stageTimestamp − requestReceivedTimestamp`). Lines of other users (the filler's
/// 100,000 creates) are skipped before parsing.
fn timed_requests(path: &std::path::Path, user: &str, since: DateTime<Utc>) -> Result<Vec<Timed>> {
    let file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e).with_context(|| format!("open {}", path.display())),
    };
    let needle = format!("\"username\":\"{user}\"");
    let mut out = Vec::new();
    for line in BufReader::new(file).lines() {
        let line = line.with_context(|| format!("read {}", path.display()))?;
        if !line.contains(&needle) {
            continue;
        }
        let Ok(e) = serde_json::from_str::<Value>(&line) else {
            continue;
        };
        if e["stage"].as_str() != Some("ResponseComplete") {
            continue;
        }
        let t = |k: &str| {
            e[k].as_str()
                .and_then(|s| DateTime::parse_from_rfc3339(s).ok())
                .map(|t| t.with_timezone(&Utc))
        };
        let (Some(received), Some(done)) = (t("requestReceivedTimestamp"), t("stageTimestamp"))
        else {
            continue;
        };
        if received < since {
            continue;
        }
        let what = match e["objectRef"]["resource"].as_str() {
            Some(r) => r.to_string(),
            None => e["requestURI"]
                .as_str()
                .unwrap_or_default()
                .split('?')
                .next()
                .unwrap_or_default()
                .to_string(),
        };
        out.push(Timed {
            received,
            verb: e["verb"].as_str().unwrap_or_default().to_string(),
            what,
            code: e["responseStatus"]["code"].as_i64().unwrap_or(0),
            seconds: secs(received, done),
        });
    }
    Ok(out)
}

/// Replica changes to 0 of any target in `namespaces` since `since`: `[ns, target, when]`.
fn scaled_down(world: &World, since: DateTime<Utc>, namespaces: &[String]) -> Vec<Value> {
    let log = lock(&world.replicas);
    let mut out = Vec::new();
    for ((ns, target), changes) in log.iter() {
        if !namespaces.contains(ns) {
            continue;
        }
        for (t, r) in changes {
            if *t >= since && *r == 0 {
                out.push(json!({"namespace": ns, "target": target, "at": t.to_rfc3339()}));
            }
        }
    }
    out
}

/// What the run measured besides the common prober numbers.
pub(crate) struct Observed<'a> {
    /// When the watchdog was started.
    pub started: DateTime<Utc>,
    /// The measured window (after warm-up).
    pub window_from: DateTime<Utc>,
    /// End of the window.
    pub window_to: DateTime<Utc>,
    /// `/proc` samples of the whole run.
    pub samples: &'a [procstat::Sample],
    /// How the run ended.
    pub ended: &'a Ended,
    /// The watchdog's `/metrics` at the start of the window, if it serves them.
    pub metrics_at_window_start: Option<String>,
    /// The watchdog's `/metrics` at the end of the window, if it serves them.
    pub metrics: Option<String>,
    /// With `--outage-normal`: when the normal shoots' kubelets went silent (their scaling
    /// from then on is the outage's, judged in the run's `outage.protection`).
    pub outage_silenced_at: Option<DateTime<Utc>>,
}

/// How the normal shoots' probe runs kept to their schedule in the window: per shoot, the
/// runs and the worst gap between two; over all, the late gaps and the missed runs.
struct ProbeSchedule {
    runs_per_shoot: Vec<f64>,
    max_gap_per_shoot: Vec<f64>,
    /// Gaps longer than a run on schedule takes.
    late_gaps: usize,
    /// Runs that should have started and did not (see `missed_run_means`).
    missed: usize,
    /// Namespaces of the shoots never probed or with a missed run.
    shoots_missing_runs: Vec<String>,
    /// Shoots not probed at all in the window.
    never: usize,
}

impl ProbeSchedule {
    /// The schedule of `world`'s normal shoots from their `probes` (times of `GET /version` by
    /// user), a gap over `on_schedule` late, one of 2 × `interval` or more with missed runs.
    fn of(
        world: &World,
        o: &Observed<'_>,
        probes: &HashMap<String, Vec<DateTime<Utc>>>,
        interval: f64,
        on_schedule: f64,
    ) -> ProbeSchedule {
        let missed_from = 2.0 * interval;
        let mut runs_per_shoot = Vec::new();
        let mut max_gap_per_shoot = Vec::new();
        let mut late_gaps = 0usize;
        let mut missed = 0usize;
        let mut shoots_missing_runs = Vec::new();
        let mut never = 0usize;
        for shoot in &world.shoots {
            let times: Vec<DateTime<Utc>> = probes
                .get(&shoot.user())
                .map(|v| {
                    v.iter()
                        .copied()
                        .filter(|t| *t >= o.window_from && *t <= o.window_to)
                        .collect()
                })
                .unwrap_or_default();
            if times.is_empty() {
                never += 1;
                shoots_missing_runs.push(setup::shoot_namespace(shoot.index));
                continue;
            }
            runs_per_shoot.push(times.len() as f64);
            // The time before the first and after the last run count: a probe that stopped is late.
            let mut gaps: Vec<f64> = times.windows(2).map(|w| secs(w[0], w[1])).collect();
            gaps.push(secs(o.window_from, times[0]));
            if let Some(last) = times.last() {
                gaps.push(secs(*last, o.window_to));
            }
            let worst = gaps.iter().copied().fold(0.0, f64::max);
            late_gaps += gaps.iter().filter(|g| **g > on_schedule).count();
            let m = gaps
                .iter()
                .filter(|g| **g >= missed_from)
                .map(|g| (g / interval).floor() as usize - 1)
                .sum::<usize>();
            if m > 0 {
                shoots_missing_runs.push(setup::shoot_namespace(shoot.index));
            }
            missed += m;
            max_gap_per_shoot.push(worst);
        }
        ProbeSchedule {
            runs_per_shoot,
            max_gap_per_shoot,
            late_gaps,
            missed,
            shoots_missing_runs,
            never,
        }
    }
}

/// The `normal` object: the normal shoots' probe runs against their schedule, their failed
/// requests, what was scaled down, and the watchdog's metrics of them.
fn analyse_normal(cli: &Cli, world: &World, o: &Observed<'_>) -> Result<Value> {
    let interval = cli.probe_interval.as_secs_f64();
    // The next run starts interval × (1 + rand·jitter) after the previous one ended: a gap
    // up to that (plus the run itself) is on schedule; one of 2 × interval or more means a run
    // that should have started did not.
    let on_schedule = interval * (1.0 + cli.jitter) + 1.0;
    let window_secs = secs(o.window_from, o.window_to).max(1e-3);
    // Normal shoots: every `GET /version` of user shoot-<i> on the shared apiservers.
    let mut requests = Vec::new();
    for api in &world.shoot_apis {
        requests.extend(crate::audit::read(&api.audit_log_path(), o.started, |u| {
            u.starts_with("shoot-")
        })?);
    }
    let probes = crate::audit::version_probes(&requests);
    let failures = crate::audit::failures_by_code(
        requests
            .iter()
            .filter(|r| r.received >= o.window_from && r.received <= o.window_to),
    );
    let schedule = ProbeSchedule::of(world, o, &probes, interval, on_schedule);
    let normal_namespaces: Vec<String> = world
        .shoots
        .iter()
        .map(|s| setup::shoot_namespace(s.index))
        .collect();
    let metrics = o.metrics.as_deref();
    let normal_metric = |name: &str| metrics.map(|m| sum_shoots(m, name, "shoot--bench--s"));
    Ok(json!({
        "shoots": world.shoots.len(),
        "probe_interval_s": interval,
        "expected_runs_per_shoot": window_secs / (interval * (1.0 + cli.jitter / 2.0)),
        "runs_per_shoot": {
            "min": schedule.runs_per_shoot.iter().copied().fold(f64::INFINITY, f64::min),
            "p50": Summary::of(&schedule.runs_per_shoot).p50,
            "max": Summary::of(&schedule.runs_per_shoot).max,
        },
        "max_gap_per_shoot_s": Summary::of(&schedule.max_gap_per_shoot).to_json(),
        "max_gap_s": schedule.max_gap_per_shoot.iter().copied().fold(0.0, f64::max),
        "on_schedule_gap_s": on_schedule,
        "gaps_longer_than_on_schedule": schedule.late_gaps,
        "missed_runs": schedule.missed,
        "missed_run_means": format!("a gap of g ≥ 2 × interval counts floor(g / interval) − 1 missed runs"),
        "shoots_never_probed": schedule.never,
        "shoots_with_missed_runs": schedule.shoots_missing_runs,
        "failed_requests_by_code": failures,
        // With an outage, only what went down before it (the outage's own scaling is judged in
        // the run's `outage.protection`).
        "scaled_down": scaled_down(world, o.started, &normal_namespaces)
            .into_iter()
            .filter(|v| {
                o.outage_silenced_at.is_none_or(|s| {
                    v["at"]
                        .as_str()
                        .and_then(|t| DateTime::parse_from_rfc3339(t).ok())
                        .is_some_and(|t| t < s)
                })
            })
            .collect::<Vec<_>>(),
        "outage": o.outage_silenced_at.map(|s| json!({
            "silenced_after_window_start_s": secs(o.window_from, s),
            "outage_s": cli.outage_normal.map(|d| d.as_secs_f64()),
            "kubelet_sized_nodes": cli.kubelet_sized_nodes,
            "judged_in": "the run's outage.protection (crossing → each target 0, recovery → restored, against the protection bound) and storm",
        })),
        "watchdog_metrics": {
            "lease_probe_failures": normal_metric("dwd_prober_lease_probe_failures_total"),
            "api_server_probe_failures": normal_metric("dwd_prober_api_server_probe_failures_total"),
            "oversized_responses": normal_metric("dwd_prober_oversized_responses_total"),
            "shoots_waiting_for_room_at_end": normal_metric("dwd_prober_shoot_waiting_for_room"),
            "shoots_decision_pending_at_end": normal_metric("dwd_prober_shoot_decision_pending"),
        },
    }))
}

/// The `hostile` shoots' objects by kind: the requests their apiservers saw (by verb,
/// resource and code, and how long they took), the probe runs in the window, what was scaled
/// down, and the watchdog's metrics of them.
fn analyse_hostile(world: &World, o: &Observed<'_>) -> Result<serde_json::Map<String, Value>> {
    let metrics = o.metrics.as_deref();
    let mut hostile = serde_json::Map::new();
    for h in &world.hostile {
        let reqs = timed_requests(&h.api.audit_log_path(), &h.user, o.started)?;
        let window: Vec<&Timed> = reqs
            .iter()
            .filter(|r| r.received >= o.window_from && r.received <= o.window_to)
            .collect();
        let mut by: BTreeMap<String, BTreeMap<String, u64>> = BTreeMap::new();
        let mut durations: BTreeMap<String, Vec<f64>> = BTreeMap::new();
        for r in &reqs {
            let key = format!("{} {}", r.verb, r.what);
            *by.entry(key.clone())
                .or_default()
                .entry(r.code.to_string())
                .or_insert(0) += 1;
            durations.entry(key).or_default().push(r.seconds);
        }
        let runs = window
            .iter()
            .filter(|r| r.verb == "get" && r.what == "/version")
            .count();
        hostile.insert(
            h.kind.to_string(),
            json!({
                "namespace": h.namespace,
                "filler_leases": h.filler_leases,
                "filler_annotation_bytes_each": h.filler_bytes,
                "healthy_nodes": HOSTILE_NODES,
                "fill_seconds": h.fill_seconds,
                "probe_runs_in_window": runs,
                "requests_since_start_by_verb_resource_and_code": by,
                "request_seconds_since_start": durations
                    .iter()
                    .map(|(k, v)| (k.clone(), Summary::of(v).to_json()))
                    .collect::<serde_json::Map<_, _>>(),
                "scaled_down": scaled_down(world, o.started, std::slice::from_ref(&h.namespace)),
                "watchdog_metrics": metrics.map(|m| series_for(m, &h.namespace)),
            }),
        );
    }
    Ok(hostile)
}

/// `{label value: n}` of the metric family `name` in the scrape `m` by one label (`None`: the
/// binary serves no such metrics); `since` subtracts an earlier scrape.
fn by_label(
    m: Option<&str>,
    name: &str,
    label: &str,
    since: Option<&str>,
) -> Option<BTreeMap<String, f64>> {
    let read = |text: &str| {
        let mut out: BTreeMap<String, f64> = BTreeMap::new();
        for s in dwd_testenv::metrics::parse(text) {
            if s.name == name {
                let key = s.labels.get(label).cloned().unwrap_or_default();
                *out.entry(key).or_insert(0.0) += s.value;
            }
        }
        out
    };
    m.map(|m| {
        let mut now = read(m);
        if let Some(before) = since.map(read) {
            for (k, v) in now.iter_mut() {
                *v -= before.get(k).copied().unwrap_or(0.0);
            }
        }
        now
    })
}

/// The sum of every series of `name` in the scrape `metrics` (`None` without one).
fn metric_sum(metrics: Option<&str>, name: &str) -> Option<f64> {
    metrics.map(|m| {
        dwd_testenv::metrics::parse(m)
            .into_iter()
            .filter(|s| s.name == name)
            .map(|s| s.value)
            .sum::<f64>()
            + 0.0
    })
}

/// The `fakes` object: what the fake shoots' servers saw and what the watchdog says of them
/// (`None` without fake shoots).
fn analyse_fakes(world: &World, o: &Observed<'_>) -> Option<Value> {
    let metrics = o.metrics.as_deref();
    world.fakes.as_ref().map(|f| {
        let slow_metric = |name: &str| metrics.map(|m| sum_shoots(m, name, SLOW_PREFIX));
        let start = o.metrics_at_window_start.as_deref();
        let amplification: serde_json::Map<String, Value> = f
            .amplifiers
            .iter()
            .map(|(ns, a)| {
                (
                    ns.clone(),
                    json!({
                        "server": a.to_json(),
                        "scaled_down": scaled_down(world, o.started, std::slice::from_ref(ns)),
                        "watchdog_metrics": metrics.map(|m| series_for(m, ns)),
                    }),
                )
            })
            .collect();
        json!({
            "setup_seconds": f.setup_seconds,
            "slow": {
                "shoots": f.slow_shoots,
                "server": f.tarpit.as_ref().map(|t| t.to_json()),
                "targets": "none: their runs can only fail",
                "watchdog_metrics": {
                    "probe_runs": slow_metric("dwd_prober_shoot_probe_runs_total"),
                    "api_server_probe_failures": slow_metric("dwd_prober_api_server_probe_failures_total"),
                    "shoots_waiting_for_room_at_end": slow_metric("dwd_prober_shoot_waiting_for_room"),
                },
            },
            "amplification": amplification,
            // Null for a binary without the budget (the reference).
            "run_memory_budget": metrics.filter(|m| m.contains("dwd_prober_run_memory_capacity_bytes")).map(|_| json!({
                "capacity_bytes": metric_sum(metrics, "dwd_prober_run_memory_capacity_bytes"),
                "held_bytes_at_end": metric_sum(metrics, "dwd_prober_run_memory_held_bytes"),
                // dwd_prober_runs_not_made_total{cause}: since the start, and in the window.
                "not_made_for_room": by_label(metrics, "dwd_prober_runs_not_made_total", "cause", None),
                "not_made_for_room_in_window": start.and(by_label(metrics, "dwd_prober_runs_not_made_total", "cause", start)),
                "waiting_runs_at_end": by_label(metrics, "dwd_prober_run_memory_waiting_runs", "level", None),
            })),
        })
    })
}

/// RSS over time: every 5 s from the start, `[s, VmRSS MiB, VmHWM MiB]` (the peak so far
/// tells when it was reached, between two samples too).
fn rss_over_time(o: &Observed<'_>) -> Vec<Value> {
    let mut rss = Vec::new();
    let mut next = 0.0;
    // A sample taken before the process had mapped anything reads 0: not a measurement.
    for s in o.samples.iter().filter(|s| s.rss > 0) {
        let t = secs(o.started, s.at);
        if t >= next {
            rss.push(json!([
                (t * 10.0).round() / 10.0,
                (s.rss as f64 / 1048576.0 * 10.0).round() / 10.0,
                (s.hwm as f64 / 1048576.0 * 10.0).round() / 10.0
            ]));
            next = t + 5.0;
        }
    }
    rss
}

/// The `hostile` object of a run's result.
pub(crate) fn analyse(cli: &Cli, world: &World, o: &Observed<'_>) -> Result<Value> {
    let hostile_namespaces: Vec<String> =
        world.hostile.iter().map(|h| h.namespace.clone()).collect();
    let window_rss: Vec<f64> = o
        .samples
        .iter()
        .filter(|s| s.at >= o.window_from && s.at <= o.window_to)
        .map(|s| s.rss as f64 / 1048576.0)
        .collect();
    Ok(json!({
        "ended": o.ended.to_json(),
        "rss_limit_mib": cli.rss_limit_mib,
        "rss_window_mib": Summary::of(&window_rss).to_json(),
        "rss_hwm_over_time_s_mib": rss_over_time(o),
        "normal": analyse_normal(cli, world, o)?,
        "hostile": analyse_hostile(world, o)?,
        "hostile_namespaces": hostile_namespaces,
        "fakes": analyse_fakes(world, o),
    }))
}

/// Peak RSS the hostile run must stay under (issue 24): half of the 512 MiB limit Gardener
/// sets on the prober, whatever the tenants do.
pub(crate) const PEAK_RSS_BOUND_MIB: f64 = 256.0;

/// Issue 24's verdict on a hostile run's result `r` (the common analysis with its `hostile`
/// object): peak RSS within [`PEAK_RSS_BOUND_MIB`], the normal shoots' probe lateness p99
/// within `probeInterval × jitter + 2 s`, and no target of any shoot scaled to 0 (nothing in
/// this world should scale), with the process running to the end.
pub(crate) fn done_when(cli: &Cli, r: &Value, ended: &Ended) -> Value {
    let peak_mib = r["process"]["peak_rss_bytes"]
        .as_f64()
        .unwrap_or(f64::INFINITY)
        / 1048576.0;
    let lateness_bound = cli.probe_interval.as_secs_f64() * cli.jitter + 2.0;
    let lateness = r["probe_lateness_s"]["all_gaps"]["p99"]
        .as_f64()
        .unwrap_or(f64::INFINITY);
    let h = &r["hostile"];
    let count = |v: &Value| v.as_array().map_or(0, Vec::len);
    let mut wrongly = count(&h["normal"]["scaled_down"]);
    if let Some(hs) = h["hostile"].as_object() {
        wrongly += hs.values().map(|v| count(&v["scaled_down"])).sum::<usize>();
    }
    if let Some(amplifiers) = h["fakes"]["amplification"].as_object() {
        wrongly += amplifiers
            .values()
            .map(|v| count(&v["scaled_down"]))
            .sum::<usize>();
    }
    json!({
        "peak_rss_mib": peak_mib,
        "peak_rss_bound_mib": PEAK_RSS_BOUND_MIB,
        "normal_probe_lateness_p99_s": lateness,
        "probe_lateness_bound_s": lateness_bound,
        "wrongly_scaled": wrongly,
        "ran_to_the_end": ended.running(),
        "met": ended.running()
            && peak_mib <= PEAK_RSS_BOUND_MIB
            && lateness <= lateness_bound
            && wrongly == 0,
    })
}

/// How many shoots a `scaled_down` list names.
fn scaled_count(list: &Value) -> usize {
    list.as_array().map_or(0, Vec::len)
}

/// Rows of the fake shoots (`f`, the `fakes` object): the slow shoots, each amplification
/// shoot, and the run memory budget.
fn fake_rows(rows: &mut Vec<(String, String)>, f: &Value) {
    if !f.is_object() {
        return;
    }
    let s = &f["slow"];
    rows.push((
        "slow shoots: shoots / requests answered / open connections max".into(),
        format!(
            "{} / {} / {}",
            s["shoots"], s["server"]["requests_answered"], s["server"]["connections_open_max"]
        ),
    ));
    report::counts(rows, "  ", &s["watchdog_metrics"]);
    if let Some(amplifiers) = f["amplification"].as_object() {
        for (ns, a) in amplifiers {
            rows.push((
                format!("{ns}: lease / node lists served, scaled"),
                format!(
                    "{} / {} / {}",
                    a["server"]["requests_by_path"]["leases list"],
                    a["server"]["requests_by_path"]["nodes list"],
                    scaled_count(&a["scaled_down"])
                ),
            ));
            report::counts(rows, "  ", &a["watchdog_metrics"]);
        }
    }
    report::counts(rows, "run memory budget: ", &f["run_memory_budget"]);
}

/// Rows of issue 24's verdict (`d`, the `done_when` object).
fn done_when_rows(rows: &mut Vec<(String, String)>, d: &Value) {
    if !d.is_object() {
        return;
    }
    rows.push((
        "done when: peak RSS MiB (bound)".into(),
        format!(
            "{:.1} ({})",
            d["peak_rss_mib"].as_f64().unwrap_or(0.0),
            d["peak_rss_bound_mib"]
        ),
    ));
    rows.push((
        "done when: normal lateness p99 s (bound)".into(),
        format!(
            "{:.2} ({})",
            d["normal_probe_lateness_p99_s"].as_f64().unwrap_or(0.0),
            d["probe_lateness_bound_s"]
        ),
    ));
    rows.push((
        "done when: wrongly scaled".into(),
        d["wrongly_scaled"].to_string(),
    ));
    rows.push(("done when: met".into(), d["met"].to_string()));
}

/// Rows of the summary table.
pub(crate) fn rows(rows: &mut Vec<(String, String)>, h: &Value) {
    if !h.is_object() {
        return;
    }
    let n = &h["normal"];
    rows.push(("hostile: run ended".into(), h["ended"]["how"].to_string()));
    rows.push((
        "hostile: RSS in window p50/p99/max MiB".into(),
        format!(
            "{:.1} / {:.1} / {:.1}",
            h["rss_window_mib"]["p50"].as_f64().unwrap_or(0.0),
            h["rss_window_mib"]["p99"].as_f64().unwrap_or(0.0),
            h["rss_window_mib"]["max"].as_f64().unwrap_or(0.0)
        ),
    ));
    rows.push((
        "normal shoots: runs per shoot min/p50 (expected)".into(),
        format!(
            "{} / {} ({:.1})",
            n["runs_per_shoot"]["min"],
            n["runs_per_shoot"]["p50"],
            n["expected_runs_per_shoot"].as_f64().unwrap_or(0.0)
        ),
    ));
    rows.push((
        "normal shoots: max gap between runs, s".into(),
        format!(
            "{:.2} (on schedule ≤ {:.1}; interval {})",
            n["max_gap_s"].as_f64().unwrap_or(0.0),
            n["on_schedule_gap_s"].as_f64().unwrap_or(0.0),
            n["probe_interval_s"]
        ),
    ));
    rows.push((
        "normal shoots: missed runs / never probed".into(),
        format!("{} / {}", n["missed_runs"], n["shoots_never_probed"]),
    ));
    rows.push((
        "normal shoots: scaled down".into(),
        scaled_count(&n["scaled_down"]).to_string(),
    ));
    fake_rows(rows, &h["fakes"]);
    done_when_rows(rows, &h["done_when"]);
    if let Some(hs) = h["hostile"].as_object() {
        for (kind, v) in hs {
            rows.push((
                format!("hostile {kind}: probe runs (window) / scaled"),
                format!(
                    "{} / {}",
                    v["probe_runs_in_window"],
                    scaled_count(&v["scaled_down"])
                ),
            ));
            report::counts(rows, "  ", &v["watchdog_metrics"]);
            report::counts(
                rows,
                "  ",
                &v["requests_since_start_by_verb_resource_and_code"],
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const METRICS: &str = r#"# HELP dwd_prober_oversized_responses_total x
dwd_prober_oversized_responses_total{shoot="shoot--bench--hostile-fat"} 16
dwd_prober_lease_probe_failures_total{shoot="shoot--bench--hostile-fat"} 16
dwd_prober_lease_probe_failures_total{shoot="shoot--bench--s0001"} 2
dwd_prober_lease_probe_failures_total{shoot="shoot--bench--s0002"} 1
dwd_prober_shoot_probe_runs_total{shoot="shoot--bench--hostile-fat-2"} 7
"#;

    #[test]
    fn per_shoot_series_and_sums() {
        let fat = series_for(METRICS, "shoot--bench--hostile-fat");
        assert_eq!(fat.get("dwd_prober_oversized_responses_total"), Some(&16.0));
        assert_eq!(
            fat.get("dwd_prober_lease_probe_failures_total"),
            Some(&16.0)
        );
        // Another shoot whose name starts the same is not this one.
        assert!(!fat.contains_key("dwd_prober_shoot_probe_runs_total"));
        let normal = |name| sum_shoots(METRICS, name, "shoot--bench--s");
        assert_eq!(normal("dwd_prober_lease_probe_failures_total"), 3.0);
        let none = normal("dwd_prober_oversized_responses_total");
        assert_eq!((none, none.is_sign_negative()), (0.0, false));
    }

    #[test]
    fn filler_is_as_long_as_asked_and_not_one_letter() {
        let f = filler_text(250 << 10);
        assert_eq!(f.len(), 250 << 10);
        assert!(f.bytes().all(|b| b.is_ascii_alphanumeric()));
        let distinct: std::collections::HashSet<u8> = f.bytes().collect();
        assert!(distinct.len() > 50);
    }
}
