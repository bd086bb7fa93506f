//! `bench`: runs any drop-in dependency-watchdog binary (ours by default, or the reference)
//! against a seed with N simulated shoots and measures it from outside — `/proc` for memory
//! and CPU, the apiservers' audit logs for requests and probe timing, a Deployment watch
//! for how fast targets are scaled. See `crates/dwd-bench/README.md`.

#![forbid(unsafe_code)]

mod audit;
mod chart;
mod compare;
mod fake_shoots;
// Gardener's configs (deploy/gardener/) and how a run's config derives from them: the
// sandbox's module, compiled into both so the bench and the sandbox run exactly what Gardener
// runs, changed in the same checked way. The bench does not read everything the sandbox does
// (Gardener's own values beside ours), hence the allowance, for this module in this crate only.
#[path = "../../dwd-sandbox/src/gardener.rs"]
#[allow(dead_code)]
mod gardener;
mod hostile;
mod metrics;
mod procstat;
mod protection;
mod report;
mod reset;
mod runner;
mod scenario;
mod setup;
mod shoot_proxy;
mod stats;
mod storm;
// The root element and escaping of hand-written SVG: the sandbox's module, so the bench's
// chart and the sandbox's report write them one way.
#[path = "../../dwd-sandbox/src/svg.rs"]
mod svg;
mod weeder;

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::{Parser, ValueEnum};

/// What happens to the shoots while the watchdog runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Scenario {
    /// Nothing: every kubelet renews; measures the cost of probing.
    Steady,
    /// Every kubelet of shoot 0 goes silent, then comes back.
    Outage,
    /// Every kubelet of every shoot goes silent, then comes back.
    MassOutage,
    /// `--shoots` namespaces, each with a crash-looping kube-apiserver pod held back by a
    /// not-ready `etcd-main-client` EndpointSlice; all slices turn ready at once and the
    /// weeder must delete every crash-looping pod (and keep the healthy ones).
    WeederStorm,
    /// `--shoots` normal shoots next to two hostile ones, each on its own shoot apiserver:
    /// one with `--hostile-leases` plain leases, one with `--fat-leases` leases of
    /// `--fat-lease-kib` KiB of annotations each; measures memory, the normal shoots' probe
    /// schedule and what became of the hostile ones (issue 17, item 1).
    Hostile,
}

/// Command line.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "bench",
    about = "Benchmark a dependency-watchdog binary against N simulated shoots"
)]
pub struct Cli {
    /// N: simulated shoots (weeder-storm: namespaces).
    #[arg(long, default_value_t = 20)]
    pub shoots: usize,
    /// M: nodes per shoot.
    #[arg(long, default_value_t = 10)]
    pub nodes: usize,
    /// K: shoot kube-apiservers; shoot i is served by apiserver i mod K.
    #[arg(long, default_value_t = 2)]
    pub shoot_apiservers: usize,
    /// What happens while the watchdog runs.
    #[arg(long, value_enum, default_value_t = Scenario::Steady)]
    pub scenario: Scenario,
    /// Measured time after warm-up (outage scenarios run at least until recovery).
    #[arg(long, default_value = "60s", value_parser = dwd_core::parse_go_duration)]
    pub duration: Duration,
    /// `probeInterval` of the prober config (Gardener's: 30s). The config is otherwise
    /// Gardener's (deploy/gardener/prober.yaml): its targets, levels and delays.
    #[arg(long, default_value = "10s", value_parser = dwd_core::parse_go_duration)]
    pub probe_interval: Duration,
    /// `initialDelay` of the prober config (Gardener's: the default, 30s).
    #[arg(long, default_value = "2s", value_parser = dwd_core::parse_go_duration)]
    pub initial_delay: Duration,
    /// `kcmNodeMonitorGraceDuration` of the prober config (Gardener's: the default, 40s;
    /// leases expire 0.75 × this after their last renewal).
    #[arg(long, default_value = "40s", value_parser = dwd_core::parse_go_duration)]
    pub kcm_grace: Duration,
    /// Every scale-up `initialDelay` the prober config sets (Gardener sets one: MCM's 30s);
    /// default: Gardener's.
    #[arg(long, value_parser = dwd_core::parse_go_duration)]
    pub scale_up_delay: Option<Duration>,
    /// How often the simulated kubelets renew their node leases (the kubelet's 10 s). Large
    /// N×M needs a longer interval (and a `--kcm-grace` with 0.75 × grace well above it).
    #[arg(long, default_value = "10s", value_parser = dwd_core::parse_go_duration)]
    pub renew_interval: Duration,
    /// `backoffJitterFactor` of the prober config (0.2, Gardener's default; 0 makes probe
    /// lateness pure scheduling delay).
    #[arg(long, default_value_t = 0.2)]
    pub jitter: f64,
    /// Outage scenarios: the kubelets renew again this long after they went silent, whether
    /// or not the scaling flows are done (a storm that ends while flows still queue behind
    /// the seed's budget; the result's `storm` object measures it). Default: they renew once
    /// every target is down.
    #[arg(long, value_parser = dwd_core::parse_go_duration)]
    pub outage_for: Option<Duration>,
    /// `--kube-api-qps` passed to the watchdog.
    #[arg(long, default_value_t = 20.0)]
    pub kube_api_qps: f64,
    /// `--kube-api-burst` passed to the watchdog.
    #[arg(long, default_value_t = 100)]
    pub kube_api_burst: u32,
    /// Stop this shoot apiserver (0-based) for the measured window: its shoots can't be
    /// probed; the others must not be delayed by it.
    #[arg(long)]
    pub stop_shoot_apiserver: Option<usize>,
    /// Make this shoot apiserver (0-based) answer slowly for the measured window.
    #[arg(long)]
    pub slow_shoot_apiserver: Option<usize>,
    /// Added latency of `--slow-shoot-apiserver`.
    #[arg(long, default_value = "2s", value_parser = dwd_core::parse_go_duration)]
    pub slow_latency: Duration,
    /// Point the probe kubeconfigs straight at the shared shoot apiservers, without the
    /// per-shoot fronts: every probe run then lists the nodes and leases of all N/K shoots on
    /// its apiserver, not just its own M.
    #[arg(long)]
    pub shared_shoot_lists: bool,
    /// Give each shoot apiserver an etcd of its own, as every real shoot has, instead of one
    /// etcd for the seed and all of them (`dwd_testenv::ApiServerOptions::own_etcd`: on a
    /// shared etcd each consistent list waits for a revision that every apiserver's writes
    /// move).
    #[arg(long)]
    pub etcd_per_shoot_apiserver: bool,
    /// Binary to run (any that takes the reference's flags and config); default: the
    /// `dependency-watchdog` next to this executable.
    #[arg(long)]
    pub watchdog_bin: Option<PathBuf>,
    /// Label of this run in the output (default: the binary's file name).
    #[arg(long)]
    pub label: Option<String>,
    /// Compare mode: binary B, run alternately with `--watchdog-bin` (A) on the same world,
    /// A B A B …; ratios are A ÷ B.
    #[arg(long)]
    pub compare_bin: Option<PathBuf>,
    /// Label of `--compare-bin` (default: its file name, or its directory's name when both
    /// binaries have the same file name).
    #[arg(long)]
    pub compare_label: Option<String>,
    /// Compare mode: how many A B pairs to run.
    #[arg(long, default_value_t = 1)]
    pub rounds: usize,
    /// Hostile scenario: plain small leases in the `kube-node-lease` namespace of shoot
    /// `hostile-many`.
    #[arg(long, default_value_t = 100_000)]
    pub hostile_leases: usize,
    /// Hostile scenario: fat leases in the `kube-node-lease` namespace of shoot `hostile-fat`.
    #[arg(long, default_value_t = 1_000)]
    pub fat_leases: usize,
    /// Hostile scenario: KiB of annotations per fat lease (the apiserver allows 256 KiB of
    /// annotations per object, keys included).
    #[arg(long, default_value_t = 250)]
    pub fat_lease_kib: usize,
    /// Hostile scenario: shoots whose apiserver answers every request only after the
    /// config's `probeTimeout` (one TLS listener behind all of them): each probe run waits
    /// its whole timeout and fails.
    #[arg(long, default_value_t = 5_000)]
    pub slow_shoots: usize,
    /// Hostile scenario: empty items (`{}`) in each list page of the amplification shoot,
    /// whose fake apiserver answers every Lease and Node list with them whatever `limit` was
    /// asked (0: no such shoot). The default page is 15 MB, under the 16 MiB response limit.
    #[arg(long, default_value_t = 5_000_000)]
    pub amplify_items: usize,
    /// Hostile scenario: the bench stops the watchdog once its RSS passes this many MiB (and
    /// reports it): a binary that balloons must not take the shared machine down.
    #[arg(long, default_value_t = 3072)]
    pub rss_limit_mib: u64,
    /// Hostile scenario: an outage of the normal shoots while the slow crowd and the hostile
    /// shoots run. Three probe intervals into the measured window every kubelet of every
    /// normal shoot goes silent (after a last renewal stamped with that moment, as in
    /// `mass-outage`), and renews again this long after; the run then waits until every
    /// target is back and nothing has changed for two probe intervals. The result's
    /// `hostile.normal_outage` holds crossing → each target 0 and recovery → restored per
    /// normal shoot against the protection bound (README, *Hostile shoots*). Must be longer
    /// than the leases' validity (0.75 × `--kcm-grace`). Default: no outage.
    #[arg(long, value_parser = dwd_core::parse_go_duration)]
    pub outage_normal: Option<Duration>,
    /// Give the normal shoots' Nodes the size a real kubelet makes them (19-21 KiB each as
    /// served: managedFields, ~45 images, conditions; `dwd_sim::NodeSpec::kubelet_sized`)
    /// instead of the small default. `--nodes` gives their count.
    #[arg(long)]
    pub kubelet_sized_nodes: bool,
    /// Write the machine-readable result here.
    #[arg(long)]
    pub output: Option<PathBuf>,
    /// Write an SVG chart of the latency distributions here (default: next to `--output`,
    /// same stem, `.svg`; none without either).
    #[arg(long)]
    pub chart: Option<PathBuf>,
}

/// One binary under test and its name in the output.
#[derive(Debug, Clone)]
pub struct Subject {
    /// Name in tables, JSON and the chart.
    pub label: String,
    /// The executable.
    pub bin: PathBuf,
}

/// `--watchdog-bin`, or `dependency-watchdog` next to this executable (cargo puts both in
/// the same target directory).
fn watchdog_binary(cli: &Cli) -> Result<PathBuf> {
    if let Some(bin) = &cli.watchdog_bin {
        if !bin.is_file() {
            bail!("--watchdog-bin {} is not a file", bin.display());
        }
        return Ok(bin.clone());
    }
    let exe = std::env::current_exe().context("locate the bench executable")?;
    let dir = exe
        .parent()
        .context("the bench executable has no directory")?;
    let bin = dir.join("dependency-watchdog");
    if !bin.is_file() {
        bail!(
            "no dependency-watchdog next to {}; build it into the same target directory \
             (cargo build --release -p dependency-watchdog --bin dependency-watchdog) or pass --watchdog-bin",
            exe.display()
        );
    }
    Ok(bin)
}

/// File name of `p`, or `""`.
fn file_name(p: &Path) -> String {
    p.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// Name of the directory holding `p`, or `""`.
fn parent_name(p: &Path) -> String {
    p.parent().map(file_name).unwrap_or_default()
}

/// The binaries to run: A alone, or A and B with labels that tell them apart. Both
/// binaries are usually called `dependency-watchdog`, so default labels fall back to their
/// directories' names, then to `A`/`B`.
fn subjects(cli: &Cli, a: PathBuf) -> Result<Vec<Subject>> {
    let Some(b) = cli.compare_bin.clone() else {
        let label = cli.label.clone().unwrap_or_else(|| file_name(&a));
        return Ok(vec![Subject { label, bin: a }]);
    };
    if !b.is_file() {
        bail!("--compare-bin {} is not a file", b.display());
    }
    let (la, lb) = match (cli.label.clone(), cli.compare_label.clone()) {
        (Some(la), Some(lb)) => (la, lb),
        (la, lb) => {
            let mut pair = (
                la.clone().unwrap_or_else(|| file_name(&a)),
                lb.clone().unwrap_or_else(|| file_name(&b)),
            );
            if pair.0 == pair.1 {
                pair = (
                    la.clone().unwrap_or_else(|| parent_name(&a)),
                    lb.clone().unwrap_or_else(|| parent_name(&b)),
                );
            }
            if pair.0 == pair.1 || pair.0.is_empty() || pair.1.is_empty() {
                pair = (
                    la.unwrap_or_else(|| "A".into()),
                    lb.unwrap_or_else(|| "B".into()),
                );
            }
            pair
        }
    };
    if la == lb {
        bail!("--label and --compare-label must differ (both are {la:?})");
    }
    Ok(vec![
        Subject { label: la, bin: a },
        Subject { label: lb, bin: b },
    ])
}

fn validate(cli: &Cli) -> Result<()> {
    if cli.shoots == 0 || cli.nodes == 0 || cli.shoot_apiservers == 0 {
        bail!("--shoots, --nodes and --shoot-apiservers must be at least 1");
    }
    if cli.rounds == 0 {
        bail!("--rounds must be at least 1");
    }
    if cli.rounds > 1 && cli.compare_bin.is_none() {
        bail!("--rounds needs --compare-bin (rounds alternate two binaries)");
    }
    if matches!(cli.scenario, Scenario::Outage | Scenario::MassOutage) && cli.nodes < 2 {
        bail!("outage scenarios need --nodes >= 2 (a single-node shoot is never scaled)");
    }
    if cli.outage_for.is_some() && !matches!(cli.scenario, Scenario::Outage | Scenario::MassOutage)
    {
        bail!("--outage-for needs --scenario outage or mass-outage");
    }
    if cli.scenario == Scenario::WeederStorm
        && (cli.stop_shoot_apiserver.is_some() || cli.slow_shoot_apiserver.is_some())
    {
        bail!("--scenario weeder-storm has no shoot apiservers to stop or slow down");
    }
    if let Some(outage) = cli.outage_normal {
        if cli.scenario != Scenario::Hostile {
            bail!("--outage-normal needs --scenario hostile");
        }
        if cli.nodes < 2 {
            bail!("--outage-normal needs --nodes >= 2 (a single-node shoot is never scaled)");
        }
        let validity = cli.kcm_grace.mul_f64(0.75);
        if outage <= validity {
            bail!(
                "--outage-normal {outage:?} ends before the leases expire (0.75 × --kcm-grace = \
                 {validity:?}): nothing would cross the threshold"
            );
        }
    }
    if cli.kubelet_sized_nodes && cli.scenario == Scenario::WeederStorm {
        bail!("--kubelet-sized-nodes: the weeder storm has no nodes");
    }
    if cli.scenario == Scenario::Hostile && cli.fat_lease_kib >= 256 {
        bail!("--fat-lease-kib must be below 256 (the apiserver refuses more annotations)");
    }
    if cli.scenario != Scenario::WeederStorm {
        // A lease is valid 0.75 × grace after its renewal; the next renewal comes one
        // interval later, later still when the apiservers are busy. Without margin healthy
        // nodes would look expired and the "steady" world would trigger scale-downs.
        let validity = cli.kcm_grace.mul_f64(0.75);
        if cli.renew_interval.is_zero() || validity < cli.renew_interval.mul_f64(1.5) {
            bail!(
                "--kcm-grace {:?} keeps leases valid for 0.75 × grace = {validity:?}, which must be at \
                 least 1.5 × --renew-interval {:?} (= {:?}); raise --kcm-grace or lower --renew-interval",
                cli.kcm_grace,
                cli.renew_interval,
                cli.renew_interval.mul_f64(1.5)
            );
        }
    }
    for j in [cli.stop_shoot_apiserver, cli.slow_shoot_apiserver]
        .into_iter()
        .flatten()
    {
        if j >= cli.shoot_apiservers {
            bail!(
                "shoot apiserver {j} does not exist (--shoot-apiservers {})",
                cli.shoot_apiservers
            );
        }
    }
    if cli.stop_shoot_apiserver.is_some() && cli.stop_shoot_apiserver == cli.slow_shoot_apiserver {
        bail!("--stop-shoot-apiserver and --slow-shoot-apiserver must name different apiservers");
    }
    if cli.probe_interval.is_zero() {
        bail!("--probe-interval must be positive");
    }
    Ok(())
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    validate(&cli)?;
    let subjects = subjects(&cli, watchdog_binary(&cli)?)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("tokio runtime")?;
    let interrupted = runtime.block_on(async {
        // Ctrl-C ends the run early; dropping the run drops the watchdog process and the
        // test environment (their guards kill and tear down), so nothing is left behind.
        tokio::select! {
            result = runner::run(&cli, &subjects) => result.map(|()| false),
            _ = tokio::signal::ctrl_c() => Ok(true),
        }
    })?;
    drop(runtime);
    if interrupted {
        eprintln!("interrupted: watchdog stopped, apiservers and etcd torn down");
        // 128 + SIGINT, as shells report an interrupted command.
        std::process::exit(130);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The duration flags take the config's syntax (Go's `time.ParseDuration`, dwd-core's
    /// parser), so one value can be passed to the bench and written into the config unchanged.
    #[test]
    fn duration_flags_take_go_durations() {
        let parse = |v: &str| Cli::try_parse_from(["bench", "--duration", v]).map(|c| c.duration);
        assert_eq!(parse("10s").ok(), Some(Duration::from_secs(10)));
        assert_eq!(parse("1m30s").ok(), Some(Duration::from_secs(90)));
        assert_eq!(parse("250ms").ok(), Some(Duration::from_millis(250)));
        assert!(parse("10").is_err());
        assert!(parse("x").is_err());
        assert!(parse("-1s").is_err());
    }

    /// Every `$B …` command of the README parses: its flags and values still mean something.
    #[test]
    fn readme_commands_parse() {
        let readme = include_str!("../README.md").replace("\\\n", " ");
        let mut parsed = 0;
        for line in readme.lines() {
            let Some(start) = line.find("$B ") else {
                continue;
            };
            // In running text a command ends with its backquote.
            let command = line[start + 3..].split('`').next().unwrap_or_default();
            let args = std::iter::once("bench").chain(command.split_whitespace());
            if let Err(e) = Cli::try_parse_from(args) {
                panic!("README: {command}\n{e}");
            }
            parsed += 1;
        }
        assert!(parsed >= 10, "only {parsed} commands found");
    }
}
