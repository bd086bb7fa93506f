//! The command line: the reference's subcommands and flags (docs/behaviour.md §4.1), plus ours.
//!
//! The reference parses its flags with Go's flag package, so ours take the same syntax:
//! `-flag value`, `-flag=value`, `--flag value`, `--flag=value` ([`normalize_go_flags`]
//! rewrites single-dash long flags before clap parses); booleans as `--flag` or
//! `--flag=<Go bool>` ([`parse_go_bool`]); a repeated flag's last value wins
//! (`args_override_self`). The `--zap-*` flags take the values controller-runtime's
//! `zap.Options.BindFlags` takes, checked the same way (see [`crate::observe::logging`]).

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::observe::logging::{
    LogSettings, Output, TimeEncoding, ZapEncoder, ZapLevel, parse_stacktrace_level,
};

/// Gardener's dependency watchdog: meltdown protection (prober) and crash-loop recovery (weeder).
#[derive(Debug, Parser)]
#[command(name = "dependency-watchdog", version, about, long_about = None)]
pub struct Cli {
    /// What to run.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Probe every shoot's API server and node leases; scale kube-controller-manager,
    /// machine-controller-manager and cluster-autoscaler down when kubelets lose their control
    /// plane, and back up when they recover.
    #[command(args_override_self = true)]
    Prober(CommonArgs),
    /// Delete dependants stuck in CrashLoopBackOff as soon as the service they depend on
    /// (etcd, kube-apiserver, …) becomes ready again.
    #[command(args_override_self = true)]
    Weeder(CommonArgs),
    /// Evaluate one shoot now with the prober's rules and print every step: whether a probe
    /// runs, the API server probe, each node's verdict, the fraction against the threshold, the
    /// decision and the flow it would run. Changes nothing.
    Explain(ExplainArgs),
}

/// Output format of `explain`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OutputFormat {
    /// For people.
    Text,
    /// For machines.
    Json,
}

/// Flags of `explain`.
#[derive(Debug, Clone, Args)]
pub struct ExplainArgs {
    /// The prober's config file (the one the prober runs with). With `--record`: replay the
    /// recorded decision under this config too, and say whether it would differ.
    #[arg(long = "config-file", value_name = "PATH")]
    pub config_file: Option<PathBuf>,
    /// Path of a kubeconfig for the seed; in-cluster configuration when absent.
    #[arg(long, value_name = "PATH")]
    pub kubeconfig: Option<PathBuf>,
    /// The shoot namespace in the seed (= the Cluster's name), e.g. shoot--project--name.
    /// Required live; with `--record`, picks the shoot's records.
    #[arg(long, short = 'n')]
    pub namespace: Option<String>,
    /// Explain a past decision from its decision record instead of the shoot now: a saved
    /// prober log, the output of /debug/decisions, or `-` for stdin. Contacts no apiserver.
    #[arg(long, value_name = "FILE|-")]
    pub record: Option<String>,
    /// With `--record`: the record with this decision id (as Events and log lines carry it).
    #[arg(long, requires = "record", conflicts_with = "at")]
    pub id: Option<String>,
    /// With `--record`: the shoot's last decision at or before this time (RFC 3339, e.g.
    /// 2026-11-29T03:12:00Z); needs `--namespace`.
    #[arg(long, requires_all = ["record", "namespace"], value_parser = parse_time)]
    pub at: Option<chrono::DateTime<chrono::Utc>>,
    /// Output format.
    #[arg(long, short = 'o', value_enum, default_value = "text")]
    pub output: OutputFormat,
}

/// An RFC 3339 time.
fn parse_time(s: &str) -> Result<chrono::DateTime<chrono::Utc>, String> {
    chrono::DateTime::parse_from_rfc3339(s)
        .map(|t| t.with_timezone(&chrono::Utc))
        .map_err(|e| format!("{s:?} is not an RFC 3339 time (e.g. 2026-11-29T03:12:00Z): {e}"))
}

/// A byte count: digits, optionally followed by `Ki`, `Mi` or `Gi` (Kubernetes' binary
/// suffixes).
pub(crate) fn parse_bytes(s: &str) -> Result<u64, String> {
    let (digits, shift) = match s {
        _ if s.ends_with("Ki") => (&s[..s.len() - 2], 10),
        _ if s.ends_with("Mi") => (&s[..s.len() - 2], 20),
        _ if s.ends_with("Gi") => (&s[..s.len() - 2], 30),
        _ => (s, 0),
    };
    let bad = || format!("{s:?} is not a byte count (digits, optionally followed by Ki, Mi or Gi)");
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    let n: u64 = digits.parse().map_err(|_| bad())?;
    n.checked_mul(1u64 << shift).ok_or_else(bad)
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    dwd_core::parse_go_duration(s).map_err(|e| e.to_string())
}

/// The shortest `--shadow-window`: the two watchdogs' runs are not in step, so a shorter
/// window would report nearly every action of either as a disagreement.
pub(crate) const MIN_SHADOW_WINDOW: Duration = Duration::from_secs(1);

fn parse_shadow_window(s: &str) -> Result<Duration, String> {
    let window = parse_duration(s)?;
    if window < MIN_SHADOW_WINDOW {
        return Err(format!(
            "{s}: must be at least {MIN_SHADOW_WINDOW:?} (a shorter window reports nearly every action as a disagreement)"
        ));
    }
    Ok(window)
}

/// Log output format (ours).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum LogFormat {
    /// Human-readable lines (tracing's layout).
    Text,
    /// zap's JSON lines, as without the flag.
    Json,
}

/// Go's `strconv.ParseBool`, which the reference's boolean flags use.
pub fn parse_go_bool(value: &str) -> Result<bool, String> {
    match value {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Ok(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Ok(false),
        _ => Err(format!(
            "invalid boolean value {value:?}: one of true, false, 1, 0, t, f"
        )),
    }
}

/// Flags shared by both subcommands (the reference's, with its defaults and value syntax).
#[derive(Debug, Clone, Args)]
pub struct CommonArgs {
    /// Path of the config file (prober: probe configuration; weeder: services and dependants).
    #[arg(long = "config-file", value_name = "PATH")]
    pub config_file: PathBuf,
    /// Path of a kubeconfig for the seed; in-cluster configuration when absent.
    #[arg(long, value_name = "PATH")]
    pub kubeconfig: Option<PathBuf>,
    /// Accepted for compatibility, no effect: one loop decides every Cluster change (in
    /// memory, no request), so there is nothing to run concurrently.
    #[arg(long, default_value_t = 1)]
    pub concurrent_reconciles: u16,
    /// Queries per second to the seed's kube-apiserver (0 means the default, 5).
    #[arg(long, default_value_t = 5.0)]
    pub kube_api_qps: f32,
    /// Burst of queries to the seed's kube-apiserver (0 means the default, 10).
    #[arg(long, default_value_t = 10)]
    pub kube_api_burst: u32,
    /// Address of the Prometheus metrics endpoint.
    #[arg(long, default_value = ":9643")]
    pub metrics_bind_addr: String,
    /// Address of the health endpoints (/healthz, /readyz).
    #[arg(long, default_value = ":9644")]
    pub health_bind_addr: String,
    /// Accepted for compatibility; nothing listens there. The reference serves Go's pprof
    /// profiler on this address; this binary has no Go runtime to profile. Profile it with
    /// `perf` instead, and watch it with the process_* metrics on --metrics-bind-addr.
    #[arg(long, default_value = ":8081", value_name = "ADDR")]
    pub pprof_bind_addr: String,
    /// Elect a leader among replicas; only the leader acts.
    #[arg(long, default_value = "false", num_args = 0..=1, default_missing_value = "true", value_parser = parse_go_bool, action = clap::ArgAction::Set)]
    pub enable_leader_election: bool,
    /// Namespace of the leader-election Lease.
    #[arg(long, default_value = "garden")]
    pub leader_election_namespace: String,
    /// How long a leader's lease is valid without renewal.
    #[arg(long, default_value = "15s", value_parser = parse_duration)]
    pub leader_elect_lease_duration: Duration,
    /// How long the leader keeps trying to renew before it stops leading.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub leader_elect_renew_deadline: Duration,
    /// Interval between attempts to acquire or renew leadership.
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    pub leader_elect_retry_period: Duration,
    /// Log level: debug, info, warn, error, panic, or an integer > 0 for debug verbosity
    /// (zap semantics; 1 is debug). The default is debug, as in the reference.
    #[arg(long, default_value = "debug", value_name = "LEVEL", value_parser = ZapLevel::parse)]
    pub zap_log_level: ZapLevel,
    /// Development mode: zap's console layout instead of JSON (an explicit --zap-encoder
    /// wins).
    #[arg(long, default_value = "false", num_args = 0..=1, default_missing_value = "true", value_parser = parse_go_bool, action = clap::ArgAction::Set)]
    pub zap_devel: bool,
    /// Log encoding: json (zap's production JSON lines, the default) or console.
    #[arg(long, value_name = "ENCODER", value_parser = ZapEncoder::parse)]
    pub zap_encoder: Option<ZapEncoder>,
    /// Accepted for compatibility (info, error or panic): the reference adds Go stack traces
    /// to lines at this level; this binary writes none.
    #[arg(long, value_name = "LEVEL", value_parser = parse_stacktrace_level)]
    pub zap_stacktrace_level: Option<String>,
    /// How the ts key is written: epoch, millis, nanos, iso8601, rfc3339 or rfc3339nano.
    #[arg(long, default_value = "rfc3339", value_name = "ENCODING", value_parser = TimeEncoding::parse)]
    pub zap_time_encoding: TimeEncoding,
    /// Log format (ours): text for people; json is the default. Wins over --zap-encoder
    /// and --zap-devel.
    #[arg(long, value_enum)]
    pub(crate) log_format: Option<LogFormat>,
    /// Shadow mode (ours): decide exactly as usual but never scale a target or delete a pod;
    /// report what would have been done (log, dwd_shadow_* metrics, Events about our own pod)
    /// and compare it with what the acting watchdog does (GET /shadow on the metrics
    /// address). Needs read rights only (deploy/shadow); with --enable-leader-election it
    /// elects on a Lease of its own (`<lease>-shadow`), never the acting watchdog's.
    #[arg(long, default_value = "false", num_args = 0..=1, default_missing_value = "true", value_parser = parse_go_bool, action = clap::ArgAction::Set)]
    pub shadow: bool,
    /// Shadow mode: how long one side's action waits for the other's before it is reported
    /// as a disagreement. Default: prober 3 × probeInterval (at least 2m), weeder the
    /// watchDuration (at least 1m).
    #[arg(long, value_name = "DURATION", value_parser = parse_shadow_window)]
    pub shadow_window: Option<Duration>,
    /// Prober (ours): bytes the probe runs in flight may hold together, their reserves and
    /// response bodies (e.g. 128Mi). Default: a quarter of the container's memory limit
    /// (cgroup), or 128Mi without one. See README, "Memory: one limit".
    #[arg(long, value_name = "BYTES", value_parser = parse_bytes)]
    pub run_memory_budget: Option<u64>,
}

impl CommonArgs {
    /// Seed QPS, with 0 meaning the default.
    pub fn qps(&self) -> f32 {
        if self.kube_api_qps <= 0.0 {
            5.0
        } else {
            self.kube_api_qps
        }
    }

    /// Seed burst, with 0 meaning the default.
    pub fn burst(&self) -> u32 {
        if self.kube_api_burst == 0 {
            10
        } else {
            self.kube_api_burst
        }
    }
}

/// Every long flag name (without dashes) of [`CommonArgs`].
pub fn long_flag_names() -> Vec<String> {
    use clap::CommandFactory;
    let cmd = Cli::command();
    let mut names = Vec::new();
    // The reference's flags: those of its two subcommands (explain is ours).
    for sub in cmd.get_subcommands().filter(|s| s.get_name() != "explain") {
        for arg in sub.get_arguments() {
            if let Some(long) = arg.get_long() {
                names.push(long.to_string());
            }
        }
    }
    names.sort();
    names.dedup();
    names
}

/// Rewrites Go-style single-dash long flags (`-config-file=x`) to `--config-file=x`.
pub fn normalize_go_flags(args: impl IntoIterator<Item = OsString>) -> Vec<OsString> {
    let known = long_flag_names();
    args.into_iter()
        .map(|arg| {
            let Some(s) = arg.to_str() else { return arg };
            if s.starts_with('-') && !s.starts_with("--") && s.len() > 2 {
                let name = s[1..].split('=').next().unwrap_or_default();
                // `-help` too: Go's flag package prints the usage for it.
                if name == "help" || known.iter().any(|k| k == name) {
                    return OsString::from(format!("-{s}"));
                }
            }
            arg
        })
        .collect()
}

impl LogSettings {
    /// `--log-format` (ours) wins, then `--zap-encoder`, then `--zap-devel` (console, as in
    /// controller-runtime, where an explicit encoder also wins over development mode).
    ///
    /// Here rather than in [`crate::observe::logging`]: reading flags is the command line's job, and
    /// logging then needs nothing from it.
    pub fn from_args(args: &CommonArgs) -> LogSettings {
        let output = match (args.log_format, args.zap_encoder, args.zap_devel) {
            (Some(LogFormat::Text), _, _) => Output::Text,
            (Some(LogFormat::Json), _, _) => Output::Json,
            (None, Some(ZapEncoder::Json), _) => Output::Json,
            (None, Some(ZapEncoder::Console), _) | (None, None, true) => Output::Console,
            (None, None, false) => Output::Json,
        };
        LogSettings {
            output,
            level: args.zap_log_level,
            time: args.zap_time_encoding,
        }
    }
}
