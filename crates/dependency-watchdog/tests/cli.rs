//! The binary's command line: the reference's flag set, `--help`, Go-style flags, and
//! configuration errors that stop the process before it talks to any cluster.

// A test crate: a failed assumption is a failed test (outside tests the workspace denies these).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::process::Command;

use clap::Parser;
use dependency_watchdog::observe::logging::{
    LogSettings, Output, TimeEncoding, ZapEncoder, ZapLevel,
};
use dependency_watchdog::process::cli::{Cli, CommonArgs, long_flag_names, normalize_go_flags};

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_dependency-watchdog"))
}

/// docs/behaviour.md §4.1 plus our additive `--log-format`, `--shadow` and `--shadow-window`
/// (§5) and `--run-memory-budget` (§4.1).
const CONTRACT_FLAGS: &[&str] = &[
    "concurrent-reconciles",
    "config-file",
    "enable-leader-election",
    "health-bind-addr",
    "kube-api-burst",
    "kube-api-qps",
    "kubeconfig",
    "leader-elect-lease-duration",
    "leader-elect-renew-deadline",
    "leader-elect-retry-period",
    "leader-election-namespace",
    "log-format",
    "metrics-bind-addr",
    "pprof-bind-addr",
    "run-memory-budget",
    "shadow",
    "shadow-window",
    "zap-devel",
    "zap-encoder",
    "zap-log-level",
    "zap-stacktrace-level",
    "zap-time-encoding",
];

#[test]
fn flag_set_matches_the_contract() {
    let mut expected: Vec<String> = CONTRACT_FLAGS.iter().map(|s| s.to_string()).collect();
    expected.sort();
    assert_eq!(long_flag_names(), expected);
}

#[test]
fn the_run_memory_budget_takes_bytes_with_binary_suffixes_and_a_bad_value_names_the_flag() {
    let budget = |args: &[&str]| {
        let mut all = vec!["dependency-watchdog", "prober", "--config-file", "x.yaml"];
        all.extend_from_slice(args);
        Cli::try_parse_from(all).map(|cli| match cli.command {
            dependency_watchdog::process::cli::Command::Prober(a) => a.run_memory_budget,
            _ => panic!("prober"),
        })
    };
    assert_eq!(budget(&[]).expect("absent"), None);
    for (text, bytes) in [
        ("134217728", 128 << 20),
        ("128Mi", 128 << 20),
        ("512Ki", 512 << 10),
        ("1Gi", 1 << 30),
    ] {
        assert_eq!(
            budget(&["--run-memory-budget", text]).expect(text),
            Some(bytes),
            "{text}"
        );
    }
    for bad in ["128MB", "-1", "Mi", "1.5Gi", "99999999999999999999Gi"] {
        let error = budget(&[&format!("--run-memory-budget={bad}")])
            .expect_err(bad)
            .to_string();
        assert!(
            error.contains("--run-memory-budget") && error.contains("not a byte count"),
            "{bad}: {error}"
        );
    }
}

#[test]
fn shadow_mode_is_off_by_default_and_a_window_under_a_second_is_refused_naming_the_flag() {
    let parse = |args: &[&str]| {
        let mut all = vec!["dependency-watchdog", "prober", "--config-file", "x.yaml"];
        all.extend_from_slice(args);
        Cli::try_parse_from(all)
    };
    let dependency_watchdog::process::cli::Command::Prober(a) = parse(&[]).expect("parse").command
    else {
        panic!("prober")
    };
    assert!(!a.shadow);
    assert_eq!(a.shadow_window, None);
    let dependency_watchdog::process::cli::Command::Prober(a) =
        parse(&["--shadow", "--shadow-window=90s"])
            .expect("parse")
            .command
    else {
        panic!("prober")
    };
    assert!(a.shadow);
    assert_eq!(a.shadow_window, Some(std::time::Duration::from_secs(90)));
    let error = parse(&["--shadow", "--shadow-window=500ms"])
        .expect_err("a window under 1s")
        .to_string();
    assert!(
        error.contains("--shadow-window") && error.contains("must be at least 1s"),
        "{error}"
    );
}

#[test]
fn defaults_match_the_reference() {
    let cli = Cli::try_parse_from(["dependency-watchdog", "prober", "--config-file", "x.yaml"])
        .expect("parse");
    let dependency_watchdog::process::cli::Command::Prober(a) = cli.command else {
        panic!("prober")
    };
    assert_eq!(a.concurrent_reconciles, 1);
    assert_eq!(a.kube_api_qps, 5.0);
    assert_eq!(a.kube_api_burst, 10);
    assert_eq!(a.metrics_bind_addr, ":9643");
    assert_eq!(a.health_bind_addr, ":9644");
    assert!(!a.enable_leader_election);
    assert_eq!(a.leader_election_namespace, "garden");
    assert_eq!(a.leader_elect_lease_duration.as_secs(), 15);
    assert_eq!(a.leader_elect_renew_deadline.as_secs(), 10);
    assert_eq!(a.leader_elect_retry_period.as_secs(), 2);
    assert_eq!(a.pprof_bind_addr, ":8081");
    // dwd.go sets Level: debug and the RFC 3339 time encoder before binding the zap flags.
    assert_eq!(a.zap_log_level, ZapLevel::DEBUG);
    assert_eq!(a.zap_time_encoding, TimeEncoding::Rfc3339);
    assert!(!a.zap_devel);
    assert_eq!(a.zap_encoder, None);
    assert_eq!(
        LogSettings::from_args(&a).output,
        Output::Json,
        "JSON lines by default"
    );
}

#[test]
fn gardener_style_arguments_parse() {
    let args = dependency_watchdog::process::cli::normalize_go_flags(
        [
            "dependency-watchdog",
            "prober",
            "-config-file=/etc/dependency-watchdog/config/dep-config.yaml",
            "--kube-api-qps=20",
            "--kube-api-burst=100",
            "--zap-log-level=INFO",
            "--enable-leader-election=true",
            "--zap-devel",
        ]
        .map(Into::into),
    );
    let cli = Cli::try_parse_from(args).expect("parse");
    let dependency_watchdog::process::cli::Command::Prober(a) = cli.command else {
        panic!("prober")
    };
    assert!(a.enable_leader_election);
    assert_eq!(a.kube_api_qps, 20.0);
    assert_eq!(
        a.config_file.to_str(),
        Some("/etc/dependency-watchdog/config/dep-config.yaml")
    );
}

#[test]
fn help_works_for_the_binary_and_each_subcommand() {
    for args in [
        vec!["--help"],
        vec!["prober", "--help"],
        vec!["weeder", "--help"],
    ] {
        let out = bin().args(&args).output().expect("run");
        assert!(out.status.success(), "{args:?}");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("Usage"), "{args:?}: {text}");
    }
    let out = bin().args(["prober", "--help"]).output().expect("run");
    assert!(String::from_utf8_lossy(&out.stdout).contains("--config-file"));
}

#[test]
fn invalid_prober_config_exits_before_touching_a_cluster_naming_every_field() {
    let dir = tempfile_dir();
    let config = dir.join("dep-config.yaml");
    std::fs::write(
        &config,
        "probeInterval: 10x\nkcmNodeMonitorGraceDuration: 0s\ndependentResourceInfos:\n- ref: {kind: Deployment, name: kcm, apiVersion: apps/v1}\n  scaleUp: {level: 0}\n",
    )
    .expect("write");
    // A kubeconfig pointing nowhere: if the process tried the cluster, the error would say so.
    let kubeconfig = dir.join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        "apiVersion: v1\nkind: Config\nclusters: []\nusers: []\ncontexts: []\n",
    )
    .expect("write");
    let out = bin()
        .args(["prober", "--config-file"])
        .arg(&config)
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .arg("--metrics-bind-addr=127.0.0.1:0")
        .arg("--health-bind-addr=127.0.0.1:0")
        .output()
        .expect("run");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    for field in [
        "kubeConfigSecretName",
        "probeInterval",
        "kcmNodeMonitorGraceDuration",
        "dependentResourceInfos[0].scaleDown",
    ] {
        assert!(err.contains(field), "error must name {field}:\n{err}");
    }
    assert!(
        !err.contains("seed cluster client"),
        "must fail on the config first:\n{err}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn missing_config_file_is_a_clear_error() {
    let out = bin()
        .args(["prober", "--config-file", "/nonexistent/dep-config.yaml"])
        .output()
        .expect("run");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("/nonexistent/dep-config.yaml"), "{err}");
}

/// The hard open-files limit of this process (the child inherits it): `None` if unlimited.
fn hard_open_files_limit() -> Option<u64> {
    let limits = std::fs::read_to_string("/proc/self/limits").expect("/proc/self/limits");
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .expect("Max open files line");
    let hard = line.split_whitespace().nth(4).expect("hard limit column");
    hard.parse().ok()
}

#[test]
fn the_open_files_soft_limit_is_raised_to_the_hard_limit_at_start() {
    let Some(hard) = hard_open_files_limit().filter(|h| *h > 256) else {
        eprintln!("skipped: the hard open-files limit is unlimited or at most 256");
        return;
    };
    // A soft limit of 256 for the child; it must raise it before it does anything else (the
    // missing config file ends it right after).
    let out = Command::new("sh")
        .args([
            "-c",
            "ulimit -Sn 256 && exec \"$0\" prober --zap-log-level=debug --config-file /nonexistent/dep-config.yaml",
            env!("CARGO_BIN_EXE_dependency-watchdog"),
        ])
        .output()
        .expect("run");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    let line = err
        .lines()
        .find(|l| l.contains("raised the open-files limit"))
        .unwrap_or_else(|| panic!("no line about the open-files limit: {err}"));
    assert!(line.contains(r#""from":"256""#), "{line}");
    assert!(line.contains(&format!(r#""to":"{hard}""#)), "{line}");
}

/// Parses `prober <args>` as the binary does (Go-style flags normalized first).
fn parse(args: &[&str]) -> Result<CommonArgs, clap::Error> {
    let mut all = vec!["dependency-watchdog", "prober"];
    all.extend_from_slice(args);
    let cli = Cli::try_parse_from(normalize_go_flags(all.into_iter().map(Into::into)))?;
    match cli.command {
        dependency_watchdog::process::cli::Command::Prober(a) => Ok(a),
        other => panic!("parsed as {other:?}"),
    }
}

/// Every flag of the reference's command line (its `SetSharedOpts`, controller-runtime's
/// `--kubeconfig` and `zap.Options.BindFlags`) with a non-default value, in each of the four
/// spellings Go's flag package accepts.
#[test]
fn every_reference_flag_parses_in_every_go_spelling() {
    let flags: &[(&str, &str)] = &[
        (
            "config-file",
            "/etc/dependency-watchdog/config/dep-config.yaml",
        ),
        ("kubeconfig", "/tmp/seed.kubeconfig"),
        ("concurrent-reconciles", "4"),
        ("kube-api-qps", "20.0"),
        ("kube-api-burst", "100"),
        ("metrics-bind-addr", ":19643"),
        ("health-bind-addr", "127.0.0.1:19644"),
        ("pprof-bind-addr", ":18081"),
        ("enable-leader-election", "true"),
        ("leader-election-namespace", "dwd"),
        ("leader-elect-lease-duration", "1m30s"),
        ("leader-elect-renew-deadline", "20s"),
        ("leader-elect-retry-period", "500ms"),
        ("zap-devel", "true"),
        ("zap-encoder", "json"),
        ("zap-log-level", "INFO"),
        ("zap-stacktrace-level", "panic"),
        ("zap-time-encoding", "iso8601"),
    ];
    // Go's separate-value spellings don't apply to booleans: `-flag` alone sets them.
    let is_bool = |f: &str| matches!(f, "enable-leader-election" | "zap-devel");
    // Each of Go's four spellings: `-flag value`, `-flag=value`, `--flag value`, `--flag=value`.
    let spellings = ["-", "--"]
        .into_iter()
        .flat_map(|dashes| [(dashes, false), (dashes, true)]);
    for (dashes, joined) in spellings {
        let args: Vec<String> = flags
            .iter()
            .flat_map(|(f, v)| {
                if joined {
                    vec![format!("{dashes}{f}={v}")]
                } else if is_bool(f) {
                    vec![format!("{dashes}{f}")]
                } else {
                    vec![format!("{dashes}{f}"), v.to_string()]
                }
            })
            .collect();
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let a = parse(&args).unwrap_or_else(|e| panic!("{args:?}: {e}"));
        assert_eq!(
            a.config_file.to_str(),
            Some("/etc/dependency-watchdog/config/dep-config.yaml")
        );
        assert_eq!(
            a.kubeconfig.as_deref().and_then(|p| p.to_str()),
            Some("/tmp/seed.kubeconfig")
        );
        assert_eq!(a.concurrent_reconciles, 4);
        assert_eq!(a.kube_api_qps, 20.0);
        assert_eq!(a.kube_api_burst, 100);
        assert_eq!(a.metrics_bind_addr, ":19643");
        assert_eq!(a.health_bind_addr, "127.0.0.1:19644");
        assert_eq!(a.pprof_bind_addr, ":18081");
        assert!(a.enable_leader_election);
        assert_eq!(a.leader_election_namespace, "dwd");
        assert_eq!(a.leader_elect_lease_duration.as_secs(), 90);
        assert_eq!(a.leader_elect_renew_deadline.as_secs(), 20);
        assert_eq!(a.leader_elect_retry_period.as_millis(), 500);
        assert!(a.zap_devel);
        assert_eq!(a.zap_encoder, Some(ZapEncoder::Json));
        assert_eq!(a.zap_log_level, ZapLevel::INFO);
        assert_eq!(a.zap_stacktrace_level.as_deref(), Some("panic"));
        assert_eq!(a.zap_time_encoding, TimeEncoding::Iso8601);
        // An explicit encoder wins over development mode, as in controller-runtime.
        assert_eq!(LogSettings::from_args(&a).output, Output::Json);
    }
}

#[test]
fn booleans_take_gos_syntax_and_the_last_of_a_repeated_flag_wins() {
    let base = ["--config-file=x.yaml"];
    let with = |extra: &[&str]| {
        let mut args = base.to_vec();
        args.extend_from_slice(extra);
        parse(&args).unwrap_or_else(|e| panic!("{extra:?}: {e}"))
    };
    for on in [
        "--enable-leader-election",
        "-enable-leader-election",
        "--enable-leader-election=1",
        "--enable-leader-election=t",
        "--enable-leader-election=TRUE",
        "--enable-leader-election=True",
    ] {
        assert!(with(&[on]).enable_leader_election, "{on}");
    }
    for off in [
        "--enable-leader-election=false",
        "--enable-leader-election=0",
        "--enable-leader-election=F",
        "--enable-leader-election=FALSE",
    ] {
        assert!(!with(&[off]).enable_leader_election, "{off}");
    }
    assert!(parse(&["--config-file=x.yaml", "--enable-leader-election=yes"]).is_err());
    assert!(with(&["--zap-devel"]).zap_devel);
    assert_eq!(
        LogSettings::from_args(&with(&["--zap-devel"])).output,
        Output::Console
    );
    assert_eq!(
        LogSettings::from_args(&with(&["--zap-encoder=CONSOLE"])).output,
        Output::Console
    );
    assert_eq!(
        LogSettings::from_args(&with(&["--zap-devel", "--log-format", "text"])).output,
        Output::Text
    );
    // Go's flag package keeps the last value of a repeated flag.
    let a = with(&[
        "--kube-api-qps=1",
        "--kube-api-qps=2",
        "--zap-log-level=error",
        "--zap-log-level=3",
    ]);
    assert_eq!(a.kube_api_qps, 2.0);
    assert_eq!(a.zap_log_level, ZapLevel(-3));
    assert_eq!(
        with(&["-config-file", "y.yaml"]).config_file.to_str(),
        Some("y.yaml")
    );
}

#[test]
fn invalid_zap_values_are_rejected_like_the_reference_with_the_flag_named() {
    for (flag, value) in [
        ("--zap-log-level", "0"),
        ("--zap-log-level", "verbose"),
        ("--zap-encoder", "text"),
        ("--zap-time-encoding", "nano"),
        ("--zap-stacktrace-level", "debug"),
        ("--zap-devel", "maybe"),
    ] {
        let out = bin()
            .args(["prober", "--config-file=x.yaml", &format!("{flag}={value}")])
            .output()
            .expect("run");
        assert_eq!(out.status.code(), Some(2), "{flag}={value}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(flag) && err.contains(value),
            "{flag}={value}: {err}"
        );
    }
}

#[test]
fn help_says_pprof_is_accepted_without_a_profiler() {
    let out = bin().args(["prober", "--help"]).output().expect("run");
    let text = String::from_utf8_lossy(&out.stdout).replace('\n', " ");
    let text = text.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(text.contains("--pprof-bind-addr"), "{text}");
    assert!(text.contains("nothing listens there"), "{text}");
    let out = bin().args(["prober", "-help"]).output().expect("run");
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).contains("--pprof-bind-addr")
    );
}

/// A valid prober config with a field the watchdog does not know (logged as a warning).
const CONFIG_WITH_UNKNOWN_FIELD: &str = "kubeConfigSecretName: s\nsurpriseField: 1\ndependentResourceInfos:\n- ref: {kind: Deployment, name: kcm, apiVersion: apps/v1}\n  scaleUp: {level: 0}\n  scaleDown: {level: 0}\n";

/// Runs the prober with that config and a kubeconfig that does not exist: it logs the
/// warning, then fails on the kubeconfig. Returns stdout and stderr.
fn run_until_the_kubeconfig_fails(extra: &[&str]) -> (String, String) {
    let dir = tempfile_dir();
    let config = dir.join("dep-config.yaml");
    std::fs::write(&config, CONFIG_WITH_UNKNOWN_FIELD).expect("write");
    let out = bin()
        .arg("prober")
        .arg(format!("--config-file={}", config.display()))
        .arg(format!(
            "--kubeconfig={}",
            dir.join("missing.kubeconfig").display()
        ))
        .args(extra)
        .env_remove("RUST_LOG")
        .output()
        .expect("run");
    let _ = std::fs::remove_dir_all(dir);
    assert_eq!(out.status.code(), Some(1));
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn the_binary_logs_zap_json_lines_on_stderr_by_default() {
    let (stdout, stderr) = run_until_the_kubeconfig_fails(&[]);
    assert_eq!(stdout, "", "logs go to stderr, as zap's");
    // Every line is JSON, the fatal error included (a pipeline parses each one).
    let lines: Vec<serde_json::Value> = stderr
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    let warning = lines
        .iter()
        .find(|l| l["level"] == "warn")
        .unwrap_or_else(|| panic!("no warning in\n{stderr}"));
    let error = lines
        .iter()
        .find(|l| l["level"] == "error")
        .unwrap_or_else(|| panic!("no error in\n{stderr}"));
    for line in [warning, error] {
        let keys: Vec<&str> = line
            .as_object()
            .expect("object")
            .keys()
            .map(String::as_str)
            .collect();
        assert!(keys.len() >= 4, "{line}");
        let ts = line["ts"].as_str().expect("ts");
        assert!(
            chrono::DateTime::parse_from_rfc3339(ts).is_ok()
                && ts.ends_with('Z')
                && !ts.contains('.'),
            "ts {ts} is not zap's RFC 3339"
        );
        assert!(
            line["logger"]
                .as_str()
                .is_some_and(|l| l.starts_with("dwd")),
            "{line}"
        );
    }
    // Key order as zap writes it: level, ts, logger, msg, then fields.
    let first = stderr
        .lines()
        .find(|l| l.contains("surpriseField"))
        .expect("warning line");
    assert!(first.starts_with(r#"{"level":"warn","ts":""#), "{first}");
    let at = |key: &str| {
        first
            .find(&format!("\"{key}\":"))
            .unwrap_or_else(|| panic!("{key} in {first}"))
    };
    assert!(
        at("ts") < at("logger") && at("logger") < at("msg") && at("msg") < at("file"),
        "{first}"
    );
    assert!(
        warning["file"]
            .as_str()
            .is_some_and(|f| f.ends_with("dep-config.yaml"))
    );
    assert!(
        error["msg"]
            .as_str()
            .is_some_and(|m| m.contains("missing.kubeconfig")),
        "{error}"
    );
}

#[test]
fn zap_flags_choose_level_and_layout() {
    // --zap-log-level=error: the warning is gone, the error stays.
    let (_, stderr) = run_until_the_kubeconfig_fails(&["--zap-log-level=error"]);
    assert!(!stderr.contains("surpriseField"), "{stderr}");
    assert!(
        stderr.lines().any(|l| l.starts_with(r#"{"level":"error""#)),
        "{stderr}"
    );
    // --zap-log-level=panic: no log line at all; the error still reaches a person.
    let (_, stderr) = run_until_the_kubeconfig_fails(&["--zap-log-level=panic"]);
    assert!(
        stderr.starts_with("Error: ")
            && stderr.contains("missing.kubeconfig")
            && stderr.lines().count() == 1,
        "{stderr}"
    );
    // --zap-devel: zap's console layout, tab-separated, fields as JSON at the end.
    let (_, stderr) = run_until_the_kubeconfig_fails(&["--zap-devel", "--zap-time-encoding=epoch"]);
    let warning = stderr
        .lines()
        .find(|l| l.contains("surpriseField"))
        .expect("warning");
    let parts: Vec<&str> = warning.split('\t').collect();
    assert_eq!(parts.len(), 5, "{warning}");
    assert!(
        parts[0].parse::<f64>().is_ok_and(|t| t > 1.7e9),
        "epoch seconds: {warning}"
    );
    assert_eq!(parts[1], "WARN");
    assert!(parts[2].starts_with("dwd"));
    assert!(parts[4].starts_with(r#"{"file": ""#), "{warning}");
    // --log-format text: tracing's layout for people, not JSON.
    let (_, stderr) = run_until_the_kubeconfig_fails(&["--log-format", "text"]);
    let warning = stderr
        .lines()
        .find(|l| l.contains("surpriseField"))
        .expect("warning");
    assert!(
        !warning.starts_with('{') && warning.contains("WARN"),
        "{warning}"
    );
}

fn tempfile_dir() -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "dwd-cli-test-{}-{}",
        std::process::id(),
        rand_suffix()
    ));
    std::fs::create_dir_all(&dir).expect("mkdir");
    dir
}

fn rand_suffix() -> u64 {
    use std::time::{SystemTime, UNIX_EPOCH};
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}
