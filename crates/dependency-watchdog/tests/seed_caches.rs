//! The prober's seed caches (`prober::seed_caches::SeedCaches`) against a real seed
//! kube-apiserver, started on their own: what the configured names and kinds, and a seed that
//! misbehaves while they start, do to the caches every decision waits for.
//!
//! Its own binary: the tests start the caches without a prober, on the shared seed or on a
//! seed of their own behind the test environment's front door.

// A test crate: a failed assumption is a failed test (outside tests the workspace denies these).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::{DEADLINE, seed_client};
use dependency_watchdog::prober::seed_caches::SeedCaches;
use dwd_testenv::eventually;

/// The prober config's targets with `extra` appended (YAML list items).
fn targets_with(extra: &str) -> Vec<dwd_core::DependentResourceInfo> {
    dwd_core::ProberConfig::from_yaml(&format!("{}{extra}", common::PROBER_CONFIG))
        .expect("config")
        .config
        .dependent_resource_infos
}

/// Waits until every cache is in sync, failing with what is still pending.
async fn wait_synced(caches: &SeedCaches) {
    eventually(DEADLINE, "every seed cache in sync", || {
        let pending = caches.pending();
        async move {
            if pending.is_empty() {
                Ok(Some(()))
            } else {
                Err(format!("pending: {pending:?}"))
            }
        }
    })
    .await
    .expect("the seed caches sync");
}

/// Names go into field selectors (`metadata.name=<name>`). The config accepts any name, as the
/// reference does (it GETs targets by name: such a target is merely missing); a `,` or `=`
/// unescaped made the apiserver refuse the selector, so the cache never synced and no decision
/// was taken for any shoot (docs/faults.md).
#[tokio::test]
async fn names_with_selector_syntax_are_escaped_and_the_caches_sync() {
    let seed = seed_client().await.expect("seed client");
    let targets = targets_with(
        "  - ref: {kind: Deployment, name: 'kube,apiserver=x\\y', apiVersion: apps/v1}\n    scaleUp: {level: 0}\n    scaleDown: {level: 0}\n",
    );
    let mut tasks = tokio::task::JoinSet::new();
    let caches = SeedCaches::start(&seed, "probe,secret=x", &targets, &mut tasks)
        .await
        .expect("caches start");
    wait_synced(&caches).await;
    assert!(caches.is_ready());
    assert!(
        caches
            .targets
            .iter()
            .any(|t| t.info.target.name == "kube,apiserver=x\\y"),
        "the odd target has a cache"
    );
    tasks.shutdown().await;
}
