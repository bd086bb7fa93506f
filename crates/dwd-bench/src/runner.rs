//! The whole invocation: build the world once, run the binary (or A B A B … in compare
//! mode) on it, resetting it to steady state between runs, then print the table and write
//! the JSON and the chart.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use serde_json::{Value, json};

use crate::scenario::RunOutput;
use crate::setup::{self, Shape};
use crate::{Cli, Scenario, Subject, chart, compare, gardener, report, reset, scenario, weeder};

/// Says what the binaries will run before the (long) setup: Gardener's config, and what the
/// command line changed in it. Returns the prober config's probe timeout (none for the
/// weeder): the slow shoots answer after it.
fn announce_config(cli: &Cli, storm: bool) -> Result<Option<Duration>> {
    Ok(if storm {
        let c = weeder::config()?;
        eprintln!(
            "weeder config: Gardener's ({}); changed (Gardener's → the bench's): {}",
            gardener::WEEDER_FIXTURE_PATH,
            gardener::changes_text(&c.changes)
        );
        None
    } else {
        let c = scenario::prober_config(cli)?;
        eprintln!(
            "prober config: Gardener's ({}): its targets, levels and delays; changed (Gardener's → the bench's): {}",
            gardener::PROBER_FIXTURE_PATH,
            gardener::changes_text(&c.changes)
        );
        Some(c.config.probe_timeout)
    })
}

/// The world the command line asks for (`storm`: the weeder's, on the seed alone).
fn world_shape(cli: &Cli, storm: bool, probe_timeout: Option<Duration>) -> Shape {
    Shape {
        shoots: cli.shoots,
        nodes: cli.nodes,
        // The weeder works on the seed alone.
        apiservers: if storm { 0 } else { cli.shoot_apiservers },
        renew_interval: cli.renew_interval,
        with_shoots: !storm,
        shoot_fronts: !cli.shared_shoot_lists,
        etcd_per_shoot_apiserver: cli.etcd_per_shoot_apiserver,
        kubelet_sized_nodes: cli.kubelet_sized_nodes,
        hostile: (cli.scenario == Scenario::Hostile).then_some(crate::hostile::HostileShape {
            many_leases: cli.hostile_leases,
            fat_leases: cli.fat_leases,
            fat_bytes: cli.fat_lease_kib * 1024,
            slow_shoots: cli.slow_shoots,
            // Past the probe timeout by a margin: each run waits its whole timeout.
            slow_delay: probe_timeout.unwrap_or_default() + crate::hostile::SLOW_MARGIN,
            amplify_items: cli.amplify_items,
        }),
    }
}

/// Runs the subject once, or in compare mode every subject `cli.rounds` times in turn, the
/// world reset to steady state before each run but the first.
async fn run_plan(
    cli: &Cli,
    subjects: &[Subject],
    world: &setup::World,
    storm: bool,
) -> Result<Vec<RunOutput>> {
    let compare_mode = subjects.len() > 1;
    // A B A B …: drift of the shared machine (other load, disk, page cache) hits both.
    let plan: Vec<&Subject> = if compare_mode {
        (0..cli.rounds).flat_map(|_| subjects.iter()).collect()
    } else {
        subjects.iter().take(1).collect()
    };
    let mut outputs: Vec<RunOutput> = Vec::with_capacity(plan.len());
    for (k, subject) in plan.iter().enumerate() {
        let run = k + 1;
        let reset = if k == 0 {
            None
        } else if storm {
            Some(weeder::reset(world).await?)
        } else {
            Some(reset::prober_world(cli, world).await?)
        };
        if compare_mode {
            eprintln!("=== run {run}/{}: {} ===", plan.len(), subject.label);
        }
        let round = scenario::Round {
            cli,
            subject,
            world,
            number: run,
        };
        let mut out = if storm {
            weeder::run_once(round).await?
        } else {
            scenario::run_once(round).await?
        };
        if compare_mode {
            out.json["run"] = json!(run);
            out.json["reset_before_run"] = reset.unwrap_or(Value::Null);
            // Each run's own table as it finishes; the side-by-side one comes at the end.
            eprintln!("{}", report::table(&out.json));
        }
        outputs.push(out);
    }
    Ok(outputs)
}

/// Writes the latency chart of the runs' `outputs`, if one is asked for.
fn write_chart(cli: &Cli, subjects: &[Subject], outputs: &[RunOutput]) -> Result<()> {
    let Some(path) = chart_path(cli) else {
        return Ok(());
    };
    let title = format!(
        "dwd-bench {:?}: {}",
        cli.scenario,
        subjects
            .iter()
            .map(|s| s.label.as_str())
            .collect::<Vec<_>>()
            .join(" vs ")
    );
    let series: Vec<(String, &chart::Dists)> = outputs
        .iter()
        .map(|o| {
            (
                o.json["label"].as_str().unwrap_or_default().to_string(),
                &o.dists,
            )
        })
        .collect();
    match chart::render(&title, &series) {
        Some(svg) => {
            std::fs::write(&path, svg).with_context(|| format!("write {}", path.display()))?;
            eprintln!("wrote {}", path.display());
        }
        None => eprintln!("no latency samples: no chart written"),
    }
    Ok(())
}

/// Runs the benchmark and prints/writes the results.
pub(crate) async fn run(cli: &Cli, subjects: &[Subject]) -> Result<()> {
    let storm = cli.scenario == Scenario::WeederStorm;
    let probe_timeout = announce_config(cli, storm)?;
    let mut world = setup::build(world_shape(cli, storm, probe_timeout)).await?;
    if storm {
        weeder::populate(&mut world, cli.shoots).await?;
    }
    eprintln!("setup: world ready after {:.1}s", world.setup_seconds);

    let outputs = run_plan(cli, subjects, &world, storm).await?;
    let compare_mode = subjects.len() > 1;
    let runs: Vec<Value> = outputs.iter().map(|o| o.json.clone()).collect();
    let result = if compare_mode {
        let summary = compare::summarise(subjects, &runs);
        println!("{}", compare::table(&summary, &runs));
        json!({
            "runs": runs,
            "labels": summary["labels"],
            "ratio": summary["ratio"],
            "means": summary["means"],
            "ratios": summary["ratios"],
        })
    } else {
        let only = runs.into_iter().next().unwrap_or(Value::Null);
        println!("{}", report::table(&only));
        only
    };
    if let Some(path) = &cli.output {
        let text = serde_json::to_string_pretty(&result).context("serialize result")?;
        std::fs::write(path, text).with_context(|| format!("write {}", path.display()))?;
        eprintln!("wrote {}", path.display());
    }
    write_chart(cli, subjects, &outputs)?;
    eprintln!("teardown…");
    drop(world);
    Ok(())
}

/// `--chart`, else `--output` with extension `.svg`, else none.
fn chart_path(cli: &Cli) -> Option<PathBuf> {
    cli.chart
        .clone()
        .or_else(|| cli.output.as_ref().map(|o| o.with_extension("svg")))
}
