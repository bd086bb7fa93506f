//! End to end: the `dwd-sandbox` binary plays the whole story against the real
//! `dependency-watchdog` binary, real kube-apiservers and etcd, and exits 0; it says which of
//! Gardener's intervals it shortened; its timeline starts at 0 s when the watchdog starts
//! (setup before it is untimed) and tells the scale-down in Gardener's level order, the
//! restore (MCM after its scale-up delay) and the weeder's deletions for both of Gardener's
//! services; then zone eu-1a of the zoned shoot gamma is cut off: the zone is reported disrupted
//! (Event ZoneDisrupted) and the zonal protection the sandbox adds (and says it adds) scales
//! only MCM and CA down, never KCM, and restores them when the zone heals (ZoneRecovered); the
//! HTML report exists with its charts, the per-zone one included; and no process outlives it.

// A test crate: a failed assumption is a failed test (outside tests the workspace denies these).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The story takes about a minute and a half; past this something hangs.
const DEADLINE: Duration = Duration::from_secs(180);

/// Position of `needle` in `haystack`, failing with the whole output when absent.
fn position(haystack: &str, needle: &str) -> usize {
    haystack
        .find(needle)
        .unwrap_or_else(|| panic!("timeline lacks {needle:?}:\n{haystack}"))
}

fn pid_alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        let state = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next());
        !matches!(state, Some("Z") | Some("X"))
    })
}

// One sandbox run, its output checked in the order the story tells it (outage, scale-down,
// restore, weeder, zone outage, charts); the checks cite behaviour.md in that order, and the run
// is too long to repeat per check.
#[allow(clippy::too_many_lines)]
#[test]
fn the_story_plays_to_the_end() {
    // Build the watchdog first, outside the timed run (the sandbox would build it itself
    // when missing, but then its build time would count against the deadline).
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = Command::new(cargo)
        .args([
            "build",
            "-p",
            "dependency-watchdog",
            "--bin",
            "dependency-watchdog",
        ])
        .current_dir(&workspace)
        .status()
        .expect("run cargo build");
    assert!(
        status.success(),
        "cargo build -p dependency-watchdog failed"
    );

    let dir = tempfile::tempdir().expect("temp dir");
    let report = dir.path().join("report.html");
    let started = Instant::now();
    let mut child = Command::new(env!("CARGO_BIN_EXE_dwd-sandbox"))
        .arg("--report")
        .arg(&report)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start dwd-sandbox");
    // Read output on threads so a full pipe never blocks the sandbox.
    let mut stdout = child.stdout.take().expect("stdout");
    let mut stderr = child.stderr.take().expect("stderr");
    let out = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stdout.read_to_string(&mut s);
        s
    });
    let err = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if started.elapsed() > DEADLINE {
            // SIGTERM first: the sandbox tears its processes down on it.
            terminate(child.id());
            std::thread::sleep(Duration::from_secs(5));
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "dwd-sandbox still running after {DEADLINE:?}:\n{}",
                out.join().unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let took = started.elapsed();
    let out = out.join().expect("stdout thread");
    let err = err.join().expect("stderr thread");
    assert!(
        status.success(),
        "dwd-sandbox failed ({status}) after {took:?}\nstdout:\n{out}\nstderr:\n{err}"
    );
    eprintln!("dwd-sandbox played the story in {took:?}");

    // Gardener's config, and what was shortened, on screen before anything runs.
    let shortened = position(&out, "intervals shortened");
    for change in [
        "probeInterval 30s → 1s",
        "kcmNodeMonitorGraceDuration 40s (default) → 8s",
        "machine-controller-manager scaleUp.initialDelay 30s → 5s",
        "watchDuration 5m0s → 15s",
    ] {
        assert!(position(&out, change) > shortened, "{change}:\n{out}");
    }
    position(&out, "deploy/gardener/prober.yaml");
    // Zonal protection is ours, added on top of Gardener's config, and said so before the clock.
    let added = position(&out, "zonal protection switched on (added");
    for addition in [
        "machine-controller-manager scaleDownOnZoneOutage false (default) → true",
        "cluster-autoscaler scaleDownOnZoneOutage false (default) → true",
    ] {
        assert!(position(&out, addition) > added, "{addition}:\n{out}");
    }
    assert!(
        added < position(&out, "the clock starts now"),
        "zonal protection disclosed only after the start:\n{out}"
    );

    // The clock starts with the story: setup lines carry no time, and the first timed line
    // is near 0 s however long setup took (the control plane's start-up, here).
    let timed: Vec<f64> = out.lines().filter_map(timeline_seconds).collect();
    let first = timed
        .first()
        .copied()
        .unwrap_or_else(|| panic!("no timed timeline line:\n{out}"));
    assert!(first < 3.0, "the timeline starts at {first}s:\n{out}");
    assert!(
        out.lines().any(|l| l.trim_start().starts_with("setup ")),
        "no setup line:\n{out}"
    );
    assert!(
        position(&out, "control plane ready") < position(&out, "the clock starts now"),
        "setup after the clock started:\n{out}"
    );

    // Scale-down in Gardener's level order: MCM and CA (0), then KCM (1) — after the outage.
    let outage = position(&out, "4 of 5 kubelets silenced");
    let expired = position(&out, "node leases: 4/5 expired (0.80 ≥ 0.60)");
    let decision = position(
        &out,
        "prober decides to scale down: MCM + CA (level 0) → KCM (level 1)",
    );
    let mcm_down = position(&out, "machine-controller-manager scaled 1 → 0 (level 0");
    let ca_down = position(&out, "cluster-autoscaler scaled 1 → 0 (level 0");
    let kcm_down = position(&out, "kube-controller-manager scaled 2 → 0 (level 1");
    assert!(
        outage < expired && expired < decision && decision < mcm_down && decision < ca_down,
        "outage, expiry, decision, effect out of order:\n{out}"
    );
    assert!(
        mcm_down < kcm_down && ca_down < kcm_down,
        "scale-down not in level order:\n{out}"
    );
    // Restore: KCM (level 0), MCM (level 1, after its delay), CA (level 2), to the recorded
    // replicas.
    let healed = position(&out, "all 5 kubelets renew their leases again");
    let kcm_up = position(&out, "kube-controller-manager restored 0 → 2 (level 0");
    let mcm_up = position(
        &out,
        "machine-controller-manager restored 0 → 1 (level 1 of the scale-up, after its initialDelay of 5s",
    );
    let ca_up = position(&out, "cluster-autoscaler restored 0 → 1 (level 2");
    assert!(
        healed < kcm_up && kcm_up < mcm_up && mcm_up < ca_up,
        "restore out of order:\n{out}"
    );
    let seconds_of = |needle: &str| {
        out.lines()
            .find(|l| l.contains(needle))
            .and_then(timeline_seconds)
            .unwrap_or_else(|| panic!("no timed line with {needle:?}:\n{out}"))
    };
    let delay = seconds_of("machine-controller-manager restored")
        - seconds_of("kube-controller-manager restored");
    assert!(
        delay >= 4.5,
        "MCM restored {delay}s after KCM, not after its 5s delay:\n{out}"
    );
    // beta is never scaled: no timeline line of shoot beta (second column) tells a change.
    assert!(
        !out.lines()
            .any(|l| l.split_whitespace().nth(1) == Some("beta")
                && (l.contains("scaled") || l.contains("restored") || l.contains("decides"))),
        "beta was scaled:\n{out}"
    );
    // The weeder deletes the crash-looping kube-apiservers once etcd is back, not before.
    let etcd_back = position(&out, "etcd-main-client: all 3 endpoints ready again");
    let weeded = position(&out, "kube-apiserver-0 deleted by the weeder");
    assert!(
        etcd_back < weeded,
        "weeder acted before etcd was back:\n{out}"
    );
    position(&out, "kube-apiserver-1 deleted by the weeder");
    // Gardener's second service: the kube-scheduler, which needs the kube-apiserver, is
    // deleted once a new kube-apiserver runs and its service is ready, not before.
    let apiserver_back = position(&out, "kube-apiserver: endpoints ready again");
    let scheduler = position(&out, "kube-scheduler-0 deleted by the weeder");
    assert!(
        weeded < apiserver_back && apiserver_back < scheduler,
        "kube-scheduler deleted before the kube-apiserver was back:\n{out}"
    );
    // gamma's zone outage: only its lines (shoot column `gamma`), by line number.
    let lines: Vec<&str> = out.lines().collect();
    let gamma_line = |needle: &str, after: usize| {
        lines
            .iter()
            .enumerate()
            .skip(after)
            .find(|(_, l)| l.split_whitespace().nth(1) == Some("gamma") && l.contains(needle))
            .map(|(i, _)| i)
            .unwrap_or_else(|| panic!("no gamma line with {needle:?} after line {after}:\n{out}"))
    };
    let zone_out = gamma_line("zone eu-1a: all 2 kubelets silenced", 0);
    let zone_expired = gamma_line(
        "node leases: 2/6 expired (0.33 < 0.60); zone eu-1a 2/2 expired (1.00 ≥ 0.60)",
        zone_out,
    );
    let zonal_decision = gamma_line(
        "prober decides to scale down for the zone: MCM + CA (level 0); KCM not scaled",
        zone_out,
    );
    let disrupted = gamma_line(
        "Warning Event ZoneDisrupted on the Cluster: \"zone eu-1a: 2/2 node leases expired; zonal protection scales down machine-controller-manager, cluster-autoscaler\"",
        zone_out,
    );
    let g_mcm_down = gamma_line("machine-controller-manager scaled 1 → 0 (level 0", zone_out);
    let g_ca_down = gamma_line("cluster-autoscaler scaled 1 → 0 (level 0", zone_out);
    assert!(
        zone_expired < zonal_decision && zonal_decision < g_mcm_down && zonal_decision < g_ca_down,
        "gamma: zone expiry, zonal decision, scale-down out of order:\n{out}"
    );
    let zone_healed = gamma_line(
        "zone eu-1a: its 2 kubelets renew their leases again",
        zone_out,
    );
    assert!(
        disrupted < zone_healed && g_mcm_down < zone_healed && g_ca_down < zone_healed,
        "gamma: zone healed before the zonal protection acted:\n{out}"
    );
    let recovered = gamma_line(
        "Kubernetes Event ZoneRecovered on the Cluster: \"zone eu-1a recovered",
        zone_healed,
    );
    let g_mcm_up = gamma_line(
        "machine-controller-manager restored 0 → 1 (level 1 of the scale-up, after its initialDelay of 5s",
        zone_healed,
    );
    let g_ca_up = gamma_line("cluster-autoscaler restored 0 → 1 (level 2", zone_healed);
    assert!(
        g_mcm_up < g_ca_up && recovered > zone_healed,
        "gamma: restore out of order:\n{out}"
    );
    // gamma's KCM is never scaled, and its controllers never scaled before the zone outage.
    assert!(
        !lines
            .iter()
            .any(|l| l.split_whitespace().nth(1) == Some("gamma")
                && l.contains("kube-controller-manager")
                && (l.contains("scaled") || l.contains("restored"))),
        "gamma's KCM was scaled:\n{out}"
    );
    assert!(
        !lines[..zone_out]
            .iter()
            .any(|l| l.split_whitespace().nth(1) == Some("gamma")
                && (l.contains("scaled") || l.contains("restored") || l.contains("decides"))),
        "gamma was scaled before its zone outage:\n{out}"
    );
    // After the fact: alpha's scale-down replayed from the prober's log with a threshold
    // above the fraction it reached says "no scale-down", without any apiserver.
    let after = position(&out, "6/6  after the fact");
    assert!(after > zone_healed, "step 6 before step 5 ended:\n{out}");
    let decided = position(&out, "it decided scale down (all targets)");
    let replayed = position(
        &out,
        "with nodeLeaseFailureFraction 0.90 it would have decided: no scale-down",
    );
    assert!(
        after < decided && decided < replayed,
        "step 6 out of order:\n{out}"
    );
    position(&out, "story complete");

    let html = std::fs::read_to_string(&report).expect("the report exists");
    // Each decision, a click away from its leases and rule.
    assert!(
        html.contains("<h2>Decisions</h2>"),
        "the report lists no decisions"
    );
    assert!(
        html.matches("<details><summary>").count() >= 4,
        "expected a row per decision and flow (alpha down and up, gamma down and up)"
    );
    assert!(
        html.contains("alpha</td><td>a verdict to scale"),
        "no alpha decision row"
    );
    assert!(html.contains("<svg"), "the report has no chart");
    assert!(
        !html.contains("<script"),
        "the report must not need JavaScript"
    );
    assert!(
        html.contains("probeInterval 30s → 1s"),
        "the report does not say what was shortened"
    );
    assert!(
        html.contains("cluster-autoscaler scaleDownOnZoneOutage false (default) → true"),
        "the report does not say zonal protection was added"
    );
    // gamma (zoned) has a per-zone chart from the prober's zone metric, with the zone
    // threshold; alpha and beta (no zones) have none.
    assert_eq!(
        html.matches("class=\"chart zones\"").count(),
        1,
        "expected one per-zone chart"
    );
    assert!(html.contains("gamma · zones"), "no zone chart for gamma");
    assert!(
        html.contains("zone threshold 0.60"),
        "no zone threshold line"
    );
    for zone in ["eu-1a", "eu-1b", "eu-1c"] {
        assert!(
            html.contains(&format!("class=\"zone-fraction\" data-zone=\"{zone}\"")),
            "no line of the prober's fraction for zone {zone}"
        );
    }

    // Nothing survives the sandbox: it lists every pid it stopped.
    let line = out
        .lines()
        .find(|l| l.contains("processes stopped"))
        .unwrap_or_else(|| panic!("no teardown line:\n{out}"));
    let pids: Vec<u32> = line
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|n| n.parse().ok())
        .skip(1) // the count
        .collect();
    assert!(
        pids.len() >= 7,
        "expected etcd, 4 apiservers, prober, weeder: {line}"
    );
    let alive: Vec<u32> = pids.into_iter().filter(|p| pid_alive(*p)).collect();
    assert!(
        alive.is_empty(),
        "still running after the sandbox exited: {alive:?}"
    );
}

/// The time of a timeline line (`   12.3s  alpha  …`); `None` for any other line.
fn timeline_seconds(line: &str) -> Option<f64> {
    let first = line.split_whitespace().next()?;
    first.strip_suffix('s')?.parse().ok()
}

/// Sends SIGTERM through `kill(1)` (std can only SIGKILL).
fn terminate(pid: u32) {
    let _ = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status();
}
