//! CI: every parity scenario on our binary alone, each timeline checked against what README's
//! "Different behaviour on the same input" and our code say. One control plane for the whole
//! test binary, two lanes (scenarios two at a time). The two-binary comparison is the
//! documented command (`cargo run -p dwd-parity -- --reference …`), not part of CI.
//!
//! Our binary is built by `cargo build -p dependency-watchdog` first (quick when up to date),
//! or taken from `DWD_PARITY_OURS`. `DWD_PARITY_SCENARIOS=a,b` runs only those.

// A test crate: a failed assumption is a failed test (outside tests the workspace denies these).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Instant;

use dwd_parity::{Lanes, render_checked, run_checked, select};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_scenario_meets_its_expected_timeline_on_our_binary() {
    let names: Vec<String> = std::env::var("DWD_PARITY_SCENARIOS")
        .map(|v| {
            v.split(',')
                .filter(|s| !s.is_empty())
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default();
    let scenarios = select(&names).expect("known scenarios");
    let ours = dwd_parity::locate_ours().expect("our dependency-watchdog binary");
    let started = Instant::now();
    let lanes = Lanes::start(2, None).await.expect("control plane");
    eprintln!(
        "control plane up after {:.1}s",
        started.elapsed().as_secs_f64()
    );
    let results = run_checked(&lanes.lanes, &scenarios, &ours, &|c| {
        eprintln!("{}", render_checked(c));
    })
    .await;
    let failed: Vec<String> = results
        .iter()
        .filter(|c| !c.failures.is_empty())
        .map(|c| format!("{}: {}", c.scenario.name, c.failures.join("; ")))
        .collect();
    eprintln!(
        "{} scenarios in {:.1}s",
        results.len(),
        started.elapsed().as_secs_f64()
    );
    assert!(
        failed.is_empty(),
        "scenarios failed:\n{}",
        failed.join("\n")
    );
}
