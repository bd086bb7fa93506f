//! Side-by-side parity runner: the same scripted scenario on our `dependency-watchdog` and on
//! the reference (Gardener's v1.7.0), their timelines printed side by side, differences
//! marked.
//!
//! A scenario ([`scenario::Scenario`], all of them in [`catalogue`]) builds a seed and a shoot
//! with the simulator (real kube-apiservers from `dwd-testenv`, kubelets, Deployments whose
//! status follows spec, pods and EndpointSlices from `dwd-sim`), starts one binary with
//! Gardener's command line and config (`deploy/gardener/*.yaml`, intervals shortened), applies
//! timed actions (silence/resume kubelets, edit annotations, scale, edit the Cluster, change an
//! EndpointSlice, answer 429 with `Retry-After` at the seed's or the shoot's front door,
//! answer the first write with 409, SIGTERM) and records a [`timeline::Timeline`]: replicas,
//! dependency-watchdog annotations, pod deletions, the leader Lease, the exit code, warning
//! and error log lines.
//!
//! Two binaries, each scenario on fresh worlds, both at once (one lane each):
//!
//! ```sh
//! cargo build -p dependency-watchdog
//! crates/dwd-bench/build-reference.sh            # the reference, into ~/dwd-ref
//! cargo run -p dwd-parity -- --ours target/debug/dependency-watchdog \
//!     --reference ~/dwd-ref/dependency-watchdog [SCENARIO...]
//! ```
//!
//! prints, per scenario, both timelines side by side (`~`: the same event more than
//! `--tolerance` seconds apart, default 1.5 s; `≠`: an event only one binary produced), each
//! binary's warnings with counts, and whether our timeline meets the scenario's expectations.
//! Without `--reference` it runs ours alone and checks every scenario's expected timeline,
//! which is what CI does (`cargo test -p dwd-parity --test scenarios`). `--list` lists the
//! scenarios; `--keep DIR` keeps every run's config and log in `DIR`.
//!
//! Shadow mode (issue 16) is shown the other way round: the reference acts and ours watches
//! with `--shadow` under `deploy/shadow/`'s read-only RBAC, on one seed with an audit log
//! ([`shadow`], `cargo test -p dwd-parity --test shadow`).
//!
//! The swap (issue 23): the reference and ours hand a live seed, mid-outage, over to each
//! other through the leader Lease as a rolling update of gardenlet's Deployment does, both
//! directions ([`swap`], `cargo test -p dwd-parity --test swap`).

#![forbid(unsafe_code)]

pub mod catalogue;
pub mod check;
pub mod compare;
pub mod runner;
pub mod scenario;
pub mod shadow;
pub mod swap;
pub mod timeline;
pub mod world;

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use anyhow::{Context, Result, bail};
use dwd_testenv::TestEnv;

use crate::runner::RunResult;
use crate::scenario::Scenario;
use crate::world::Lane;

/// A test environment with `n` lanes (a seed and a shoot apiserver each).
pub struct Lanes {
    /// The lanes.
    pub lanes: Vec<Lane>,
    /// Owns the processes; dropped last.
    pub env: TestEnv,
}

impl Lanes {
    /// Starts etcd and `n` lanes; configs, kubeconfigs and logs go to `out` (kept), or to the
    /// environment's directory (removed with it) when `None`.
    pub async fn start(n: usize, out: Option<&Path>) -> Result<Lanes> {
        let env = TestEnv::start().await?;
        let mut lanes = Vec::with_capacity(n);
        for i in 0..n {
            let name = format!("lane{i}");
            let dir = match out {
                Some(out) => out.join(&name),
                None => env.dir().join(format!("parity-{name}")),
            };
            lanes.push(Lane::start(&env, &name, dir).await?);
        }
        Ok(Lanes { lanes, env })
    }
}

/// One scenario's outcome with our binary alone.
#[derive(Debug)]
pub struct Checked {
    /// The scenario.
    pub scenario: Scenario,
    /// The run (or why it could not run).
    pub run: Result<RunResult, String>,
    /// Missed expectations (empty: passed).
    pub failures: Vec<String>,
}

/// Runs every scenario with `bin`, spread over the lanes (each lane one at a time), and
/// checks each timeline; `progress` is told about each as it finishes.
pub async fn run_checked(
    lanes: &[Lane],
    scenarios: &[Scenario],
    bin: &Path,
    progress: &(dyn Fn(&Checked) + Sync),
) -> Vec<Checked> {
    let next = Mutex::new(0usize);
    let results: Mutex<Vec<(usize, Checked)>> = Mutex::new(Vec::new());
    let take = || {
        let mut n = next.lock().unwrap_or_else(|e| e.into_inner());
        let i = *n;
        *n += 1;
        (i < scenarios.len()).then_some(i)
    };
    let workers = lanes.iter().map(|lane| {
        let take = &take;
        let results = &results;
        async move {
            while let Some(i) = take() {
                let scenario = scenarios[i].clone();
                let run = runner::run(lane, &scenario, bin, "ours")
                    .await
                    .map_err(|e| format!("{e:#}"));
                let failures = match &run {
                    Ok(r) => check::check(&scenario, &r.timeline),
                    Err(e) => vec![format!("the run failed: {e}")],
                };
                let checked = Checked {
                    scenario,
                    run,
                    failures,
                };
                progress(&checked);
                results
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push((i, checked));
            }
        }
    });
    futures::future::join_all(workers).await;
    let mut out = results.into_inner().unwrap_or_else(|e| e.into_inner());
    out.sort_by_key(|(i, _)| *i);
    out.into_iter().map(|(_, c)| c).collect()
}

/// Renders one checked run: the timeline, then PASS or each missed expectation.
pub fn render_checked(c: &Checked) -> String {
    let mut out = format!("== {} — {}\n", c.scenario.name, c.scenario.about);
    match &c.run {
        Ok(r) => {
            out.push_str(&r.timeline.render());
            out.push_str(&format!("  log: {}\n", r.log.display()));
        }
        Err(e) => out.push_str(&format!("  run failed: {e}\n")),
    }
    if c.failures.is_empty() {
        out.push_str("  PASS: every expectation met\n");
    } else {
        for f in &c.failures {
            out.push_str(&format!("  FAIL: {f}\n"));
        }
    }
    out
}

/// Selects scenarios by name (all when `names` is empty); an unknown name is an error.
pub fn select(names: &[String]) -> Result<Vec<Scenario>> {
    if names.is_empty() {
        return Ok(catalogue::all());
    }
    names
        .iter()
        .map(|n| {
            catalogue::find(n).with_context(|| {
                let known: Vec<&str> = catalogue::all().iter().map(|s| s.name).collect();
                format!("no scenario {n:?}; known: {}", known.join(", "))
            })
        })
        .collect()
}

/// Our binary: `DWD_PARITY_OURS` when set, else built by cargo from this workspace (as
/// dwd-sandbox does: `cargo build -p dependency-watchdog`, which is quick when up to date),
/// its path taken from cargo's own report.
pub fn locate_ours() -> Result<PathBuf> {
    if let Some(bin) = std::env::var_os("DWD_PARITY_OURS") {
        let bin = PathBuf::from(bin);
        if !bin.is_file() {
            bail!("DWD_PARITY_OURS={} is not a file", bin.display());
        }
        return Ok(bin);
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    dwd_testenv::cargo::build_bin(&root, "dependency-watchdog", "dependency-watchdog", false)
        .context("build dependency-watchdog yourself or set DWD_PARITY_OURS")
}
