//! `dwd-parity`: runs the parity scenarios on our binary alone (checking each expected
//! timeline) or on ours and the reference side by side. See the library's documentation.

#![forbid(unsafe_code)]

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::Parser;
use dwd_parity::scenario::Scenario;
use dwd_parity::world::Lane;
use dwd_parity::{Lanes, catalogue, check, compare, render_checked, runner, select};

/// Scripted scenarios on a simulated seed and shoot, run on one or two dependency-watchdog
/// binaries; timelines compared side by side.
#[derive(Parser, Debug)]
#[command(name = "dwd-parity")]
struct Cli {
    /// Our binary (default: `cargo build -p dependency-watchdog`, or DWD_PARITY_OURS).
    #[arg(long)]
    ours: Option<PathBuf>,
    /// The reference binary (crates/dwd-bench/build-reference.sh builds it); with it every
    /// scenario runs on both and the timelines are printed side by side.
    #[arg(long)]
    reference: Option<PathBuf>,
    /// Seconds two runs' same event may lie apart before it is marked `~`.
    #[arg(long, default_value_t = 1.5)]
    tolerance: f64,
    /// Lanes (scenarios at once) when running ours alone.
    #[arg(long, default_value_t = 2)]
    lanes: usize,
    /// List the scenarios and exit.
    #[arg(long)]
    list: bool,
    /// Print the path of the reference binary the tests use and exit: DWD_REFERENCE_BIN, else
    /// the per-user cache, else built there once (minutes; CI runs this up front).
    #[arg(long)]
    locate_reference: bool,
    /// Keep every run's config and log in this directory (else they go with the
    /// environment's temporary directory).
    #[arg(long, value_name = "DIR")]
    keep: Option<PathBuf>,
    /// Scenarios to run (default: all).
    scenarios: Vec<String>,
}

#[tokio::main]
async fn main() -> ExitCode {
    match run(Cli::parse()).await {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("dwd-parity: {e:#}");
            ExitCode::from(2)
        }
    }
}

async fn run(cli: Cli) -> Result<bool> {
    if cli.locate_reference {
        let bin = dwd_testenv::reference::binary()?;
        println!("{}", bin.display());
        return Ok(true);
    }
    if cli.list {
        for s in catalogue::all() {
            println!("{:<28} {:?}  {}", s.name, s.role, s.about);
        }
        return Ok(true);
    }
    let scenarios = select(&cli.scenarios)?;
    let ours = match cli.ours {
        Some(p) => p,
        None => dwd_parity::locate_ours()?,
    };
    let lanes_wanted = if cli.reference.is_some() {
        2
    } else {
        cli.lanes.max(1)
    };
    eprintln!("starting etcd and {lanes_wanted} lane(s) of seed + shoot kube-apiservers…");
    let lanes = Lanes::start(lanes_wanted, cli.keep.as_deref()).await?;
    eprintln!("environment in {}", lanes.env.dir().display());

    match cli.reference {
        None => Ok(run_ours_checked(&lanes.lanes, &scenarios, &ours).await),
        Some(reference) => {
            run_side_by_side(&lanes.lanes, &scenarios, &ours, &reference, cli.tolerance).await
        }
    }
}

/// Each scenario on our binary alone, checked against its expectations (lanes in parallel);
/// true when all are met.
async fn run_ours_checked(lanes: &[Lane], scenarios: &[Scenario], ours: &Path) -> bool {
    let results = dwd_parity::run_checked(lanes, scenarios, ours, &|c| {
        println!("{}", render_checked(c));
    })
    .await;
    let failed: Vec<&str> = results
        .iter()
        .filter(|c| !c.failures.is_empty())
        .map(|c| c.scenario.name)
        .collect();
    println!(
        "{} scenarios, {} passed{}",
        results.len(),
        results.len() - failed.len(),
        if failed.is_empty() {
            String::new()
        } else {
            format!(", failed: {}", failed.join(", "))
        }
    );
    failed.is_empty()
}

/// Each scenario on ours and on the reference at once (lanes 0 and 1), their timelines printed
/// side by side, with ours' missed expectations; true when ours met them all.
async fn run_side_by_side(
    lanes: &[Lane],
    scenarios: &[Scenario],
    ours: &Path,
    reference: &Path,
    tolerance: f64,
) -> Result<bool> {
    let (a, b) = (&lanes[0], &lanes[1]);
    let mut differing = Vec::new();
    let mut ours_failed = Vec::new();
    for s in scenarios {
        eprintln!("running {} on both…", s.name);
        let (ra, rb) = tokio::join!(
            runner::run(a, s, ours, "ours"),
            runner::run(b, s, reference, "reference")
        );
        let ra = ra.with_context(|| format!("{}: ours", s.name))?;
        let rb = rb.with_context(|| format!("{}: reference", s.name))?;
        let sbs = compare::side_by_side(
            &format!("ours ({})", ours.display()),
            &ra.timeline,
            &format!("reference ({})", reference.display()),
            &rb.timeline,
            tolerance,
        );
        println!("== {} — {}", s.name, s.about);
        print!("{}", sbs.text);
        let failures = check::check(s, &ra.timeline);
        for f in &failures {
            println!("   ours misses an expectation: {f}");
        }
        println!(
            "   {} marked row(s); logs: {} | {}\n",
            sbs.differences,
            ra.log.display(),
            rb.log.display()
        );
        if sbs.differences > 0 {
            differing.push(format!("{} ({})", s.name, sbs.differences));
        }
        if !failures.is_empty() {
            ours_failed.push(s.name);
        }
    }
    println!(
        "{} scenarios; differing: {}; ours missed expectations in: {}",
        scenarios.len(),
        if differing.is_empty() {
            "none".to_string()
        } else {
            differing.join(", ")
        },
        if ours_failed.is_empty() {
            "none".to_string()
        } else {
            ours_failed.join(", ")
        }
    );
    Ok(ours_failed.is_empty())
}
