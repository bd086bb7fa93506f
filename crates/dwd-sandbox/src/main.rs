//! `dwd-sandbox`: watch the real dependency-watchdog protect a shoot, on one machine, in a
//! minute.
//!
//! It starts etcd and four real kube-apiservers (a seed and the shoots `alpha`, `beta` and
//! `gamma`, whose nodes are in three zones),
//! simulates the shoots' data plane (nodes whose kubelets renew leases, the controllers,
//! control-plane pods, the EndpointSlices), runs the real `dependency-watchdog prober` and
//! `weeder` as subprocesses with Gardener's generated configs (intervals shortened), and then
//! either plays a scripted story (default) or takes commands (`--interactive`). A live
//! timeline says what happens and why, its clock starting when the watchdog starts; at the
//! end an HTML report charts it. Everything is torn down on exit, on Ctrl-C and on SIGTERM.

mod config;
mod decisions;
mod gardener;
mod interactive;
mod journal;
mod metrics;
mod monitor;
mod report;
mod sandbox;
mod story;
mod svg;
mod watchdog;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Parser;
use futures::FutureExt;

use crate::config::SandboxConfig;
use crate::journal::Journal;
use crate::report::ReportMeta;
use crate::sandbox::{Sandbox, Workdir};

/// Watch the real dependency-watchdog protect a shoot: a seed and three shoot kube-apiservers on
/// loopback, a simulated data plane, the real prober and weeder, and a scripted outage story.
#[derive(Debug, Parser)]
#[command(
    name = "dwd-sandbox",
    version,
    long_about = None,
    after_help = "Without --interactive it plays the story (about a minute and a half: a NAT outage, its end, an etcd outage, a zone outage and its end), prints a live timeline and writes an HTML report. The prober and weeder run Gardener's generated configs (deploy/gardener/) with shortened intervals. Set DWD_WATCHDOG_BIN to run another dependency-watchdog binary."
)]
struct Args {
    /// Keep the sandbox running and take commands on stdin instead of playing the story.
    #[arg(long)]
    interactive: bool,
    /// Where to write the HTML report [default: <temp dir>/dwd-sandbox-report.html].
    #[arg(long, value_name = "PATH")]
    report: Option<PathBuf>,
    /// Keep the sandbox's files (configs, kubeconfigs, watchdog logs, apiserver logs) after exit.
    #[arg(long)]
    keep: bool,
}

/// How the run ended.
enum Outcome {
    /// Story finished (duration) or interactive session ended.
    Done(String),
    /// Something failed.
    Failed(anyhow::Error),
    /// Ctrl-C or SIGTERM.
    Interrupted(&'static str),
}

// `set_var` is `unsafe` since Rust 2024; it runs here before any other thread exists.
#[allow(unsafe_code)]
fn main() -> ExitCode {
    let args = Args::parse();
    // SAFETY (both): no other thread exists yet (the runtime is built below), so nothing can
    // read the environment concurrently.
    if args.keep {
        // The test environment reads this to keep its directory (apiserver and etcd logs).
        unsafe { std::env::set_var("DWD_TESTENV_KEEP", "1") };
    }
    if std::env::var_os("NO_COLOR").is_none() {
        // The watchdog subprocesses inherit it: their logs are files, not terminals.
        unsafe { std::env::set_var("NO_COLOR", "1") };
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("dwd-sandbox: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let code = runtime.block_on(run(args));
    runtime.shutdown_timeout(Duration::from_secs(2));
    code
}

/// Resolves on Ctrl-C or SIGTERM, naming which.
async fn interrupted() -> &'static str {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => "Ctrl-C",
        _ = term => "SIGTERM",
    }
}

async fn run(args: Args) -> ExitCode {
    let started = chrono::Local::now().format("%Y-%m-%d %H:%M:%S").to_string();
    // One listener for the whole run, polled once now so the handlers are installed: a
    // signal arriving while nothing awaits it (between setup and story) is kept, not lost.
    let mut interrupt = interrupted().boxed().shared();
    if let Some(signal) = (&mut interrupt).now_or_never() {
        eprintln!("dwd-sandbox: {signal} before start");
        return ExitCode::from(130);
    }
    // Setup starts now; the timeline's clock starts only when the watchdog does (see
    // `Sandbox::start`), so neither a build nor the control plane's start-up counts.
    let journal = Journal::new();
    let (config, bin) = match config_and_binary(&journal) {
        Ok(found) => found,
        Err(e) => {
            eprintln!("dwd-sandbox: {e:#}");
            return ExitCode::FAILURE;
        }
    };
    let _spinner = dwd_sim::AbortOnDrop::spawn(journal.clone().run_spinner());
    let mut workdir = match Workdir::new() {
        Ok(w) => w,
        Err(e) => {
            eprintln!("dwd-sandbox: {e:#}");
            return ExitCode::FAILURE;
        }
    };
    if args.keep {
        workdir.keep();
    }
    journal.say(&format!(
        "dwd-sandbox: the real dependency-watchdog against a local seed and three shoots\n  files: {}",
        workdir.path.display()
    ));
    for line in config.summary_lines() {
        journal.say(&format!("  {line}"));
    }

    let sandbox = tokio::select! {
        r = Sandbox::start(journal.clone(), &workdir.path, &bin, config.clone()) => r,
        signal = interrupt.clone() => {
            journal.say(&format!("\n{signal}: stopping (setup interrupted; everything started so far is torn down)"));
            return ExitCode::from(130);
        }
    };
    let sandbox = match sandbox {
        Ok(s) => s,
        Err(e) => {
            journal.done_waiting();
            eprintln!("\ndwd-sandbox: setup failed: {e:#}");
            workdir.keep();
            eprintln!("files kept in {}", workdir.path.display());
            return ExitCode::FAILURE;
        }
    };

    let outcome = tokio::select! {
        r = play(&sandbox, &args, &workdir) => match r {
            Ok(summary) => Outcome::Done(summary),
            Err(e) => Outcome::Failed(e),
        },
        signal = interrupt => Outcome::Interrupted(signal),
    };
    journal.done_waiting();

    say_how_it_ended(&sandbox, &journal, &mut workdir, &outcome);

    let report_path = args
        .report
        .clone()
        .unwrap_or_else(|| std::env::temp_dir().join("dwd-sandbox-report.html"));
    let report_written = write_report(
        &sandbox,
        &journal,
        &outcome,
        &args,
        &started,
        &report_path,
        workdir.is_kept(),
    );

    tear_down(sandbox, &journal).await;

    final_words(&journal, report_written, &report_path, &workdir, outcome)
}

/// Gardener's config as the sandbox runs it, and the watchdog binary (found or built) — both
/// before anything starts: a build failure should not wait for apiservers.
fn config_and_binary(journal: &Journal) -> Result<(Arc<SandboxConfig>, PathBuf)> {
    let config = SandboxConfig::derive().context("Gardener's config")?;
    let bin = watchdog::locate_binary(journal)?;
    Ok((Arc::new(config), bin))
}

/// Says how the run ended when it did not finish: a failure with the logs that explain it
/// (the files are then kept), or the signal that stopped it.
fn say_how_it_ended(
    sandbox: &Sandbox,
    journal: &Journal,
    workdir: &mut Workdir,
    outcome: &Outcome,
) {
    if let Outcome::Failed(e) = outcome {
        // The logs are what explains a failure: keep them.
        workdir.keep();
        journal.say(&format!(
            "\nFAILED: {e:#}\n\n  prober log: {}\n  weeder log: {}\n  files kept in {}\n\nlast lines of the prober log:\n{}",
            sandbox.prober.log.display(),
            sandbox.weeder.log.display(),
            workdir.path.display(),
            tail_lines(&sandbox.prober.log_tail(6000), 15)
        ));
    }
    if let Outcome::Interrupted(signal) = outcome {
        journal.say(&format!("\n{signal}: stopping"));
    }
}

/// Stops everything the sandbox started and says whether any process outlived it.
async fn tear_down(sandbox: Sandbox, journal: &Journal) {
    journal.say("tearing down: watchdog processes, kube-apiservers, etcd");
    let pids = sandbox.pids();
    sandbox.teardown().await;
    let left: Vec<u32> = pids
        .iter()
        .copied()
        .filter(|p| dwd_testenv::process::pid_alive(*p))
        .collect();
    if left.is_empty() {
        let list: Vec<String> = pids.iter().map(u32::to_string).collect();
        journal.say(&format!(
            "all {} processes stopped (pids {})",
            pids.len(),
            list.join(", ")
        ));
    } else {
        journal.say(&format!(
            "warning: processes still alive after teardown: {left:?}"
        ));
    }
}

/// The run's last lines (where the report is, whether files are kept, the story's summary)
/// and its exit code.
fn final_words(
    journal: &Journal,
    report_written: Result<()>,
    report_path: &std::path::Path,
    workdir: &Workdir,
    outcome: Outcome,
) -> ExitCode {
    match report_written {
        Ok(()) => journal.say(&format!(
            "report: {}  (open it in a browser)",
            report_path.display()
        )),
        Err(e) => journal.say(&format!("could not write the report: {e:#}")),
    }
    if workdir.is_kept() {
        journal.say(&format!("files kept in {}", workdir.path.display()));
    }
    match outcome {
        Outcome::Done(summary) => {
            journal.say(&summary);
            ExitCode::SUCCESS
        }
        Outcome::Failed(_) => ExitCode::FAILURE,
        Outcome::Interrupted(_) => ExitCode::from(130),
    }
}

/// Plays the story or runs the interactive session.
async fn play(sandbox: &Sandbox, args: &Args, workdir: &Workdir) -> Result<String> {
    if args.interactive {
        interactive::run(sandbox, &workdir.path).await?;
        Ok("interactive session ended".into())
    } else {
        let took = story::run(sandbox).await?;
        let setup = sandbox.journal.setup_took().map_or(String::new(), |s| {
            format!(" (after {:.0}s of setup)", s.as_secs_f64())
        });
        Ok(format!(
            "the watchdog did its job: story played in {took:.0}s{setup}"
        ))
    }
}

/// The last `n` lines of `text`, indented, without terminal colour codes.
fn tail_lines(text: &str, n: usize) -> String {
    let mut plain = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\x1b' {
            // Skip `ESC [ … letter`.
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            plain.push(c);
        }
    }
    let lines: Vec<&str> = plain.lines().collect();
    let start = lines.len().saturating_sub(n);
    lines[start..]
        .iter()
        .map(|l| format!("  {l}"))
        .collect::<Vec<_>>()
        .join("\n")
}

fn write_report(
    sandbox: &Sandbox,
    journal: &Arc<Journal>,
    outcome: &Outcome,
    args: &Args,
    started: &str,
    path: &std::path::Path,
    logs_kept: bool,
) -> Result<()> {
    let meta = ReportMeta {
        outcome: match outcome {
            Outcome::Done(s) => Ok(s.clone()),
            Outcome::Failed(e) => Err(format!("{e:#}")),
            Outcome::Interrupted(signal) => Err(format!("interrupted by {signal}")),
        },
        mode: if args.interactive {
            "interactive"
        } else {
            "story"
        },
        shoots: sandbox
            .shoots
            .iter()
            .map(|s| (s.name.clone(), s.namespace.clone(), s.nodes))
            .collect(),
        config: sandbox.config.clone(),
        setup_seconds: journal.setup_took().map(|d| d.as_secs_f64()),
        logs: [&sandbox.prober.log, &sandbox.weeder.log]
            .iter()
            .map(|p| p.display().to_string())
            .collect(),
        logs_kept,
        started: started.to_string(),
    };
    let decisions = decisions::read(&sandbox.prober.log);
    let html = report::render(&journal.record(), &decisions, &meta);
    if let Some(parent) = path.parent()
        && !parent.as_os_str().is_empty()
    {
        std::fs::create_dir_all(parent).with_context(|| format!("create {}", parent.display()))?;
    }
    std::fs::write(path, html).with_context(|| format!("write {}", path.display()))
}
