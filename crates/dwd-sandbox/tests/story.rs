//! End to end: the `dwd-sandbox` binary plays the whole story against the real
//! `dependency-watchdog` binary, real kube-apiservers and etcd, and exits 0; its timeline
//! tells the scale-down in level order, the restore and the weeder's deletions; the HTML
//! report exists with its charts; and no process outlives it.

use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The story takes about a minute; past this something hangs.
const DEADLINE: Duration = Duration::from_secs(150);

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

    // Scale-down in level order: KCM (0), MCM (1), CA (2) — after the outage started.
    let outage = position(&out, "4 of 5 kubelets silenced");
    let expired = position(&out, "node leases: 4/5 expired (0.80 ≥ 0.60)");
    let decision = position(&out, "prober decides to scale down");
    let kcm_down = position(&out, "kube-controller-manager scaled 2 → 0 (level 0");
    let mcm_down = position(&out, "machine-controller-manager scaled 1 → 0 (level 1");
    let ca_down = position(&out, "cluster-autoscaler scaled 1 → 0 (level 2");
    assert!(
        outage < expired && expired < decision && decision < kcm_down,
        "outage, expiry, decision, effect out of order:\n{out}"
    );
    assert!(
        kcm_down < mcm_down && mcm_down < ca_down,
        "scale-down not in level order:\n{out}"
    );
    // Restore: CA (level 0) before KCM and MCM (level 1), to the recorded replicas.
    let healed = position(&out, "all 5 kubelets renew their leases again");
    let ca_up = position(&out, "cluster-autoscaler restored 0 → 1 (level 0");
    let kcm_up = position(&out, "kube-controller-manager restored 0 → 2 (level 1");
    let mcm_up = position(&out, "machine-controller-manager restored 0 → 1 (level 1");
    assert!(
        healed < ca_up && ca_up < kcm_up && ca_up < mcm_up,
        "restore out of order:\n{out}"
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
    position(&out, "story complete");

    let html = std::fs::read_to_string(&report).expect("the report exists");
    assert!(html.contains("<svg"), "the report has no chart");
    assert!(
        !html.contains("<script"),
        "the report must not need JavaScript"
    );

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
        pids.len() >= 6,
        "expected etcd, 3 apiservers, prober, weeder: {line}"
    );
    let alive: Vec<u32> = pids.into_iter().filter(|p| pid_alive(*p)).collect();
    assert!(
        alive.is_empty(),
        "still running after the sandbox exited: {alive:?}"
    );
}

/// Sends SIGTERM through `kill(1)` (std can only SIGKILL).
fn terminate(pid: u32) {
    let _ = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status();
}
