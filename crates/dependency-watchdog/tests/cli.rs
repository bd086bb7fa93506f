//! The binary's command line: the reference's flag set, `--help`, Go-style flags, and
//! configuration errors that stop the process before it talks to any cluster.

use std::process::Command;

use dependency_watchdog::cli::{Cli, long_flag_names};

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_dependency-watchdog"))
}

/// SPEC §4 plus our additive `--log-format`.
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
fn defaults_match_the_reference() {
    use clap::Parser;
    let cli = Cli::try_parse_from(["dependency-watchdog", "prober", "--config-file", "x.yaml"])
        .expect("parse");
    let dependency_watchdog::cli::Command::Prober(a) = cli.command else {
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
    assert_eq!(a.zap_log_level, "info");
}

#[test]
fn gardener_style_arguments_parse() {
    use clap::Parser;
    let args = dependency_watchdog::cli::normalize_go_flags(
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
    let dependency_watchdog::cli::Command::Prober(a) = cli.command else {
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
