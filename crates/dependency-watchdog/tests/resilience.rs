//! Nothing dies quietly, and no Cluster edit delays protection: the prober against real
//! apiservers when a Cluster changes during an outage, and when the seed's watches keep
//! failing. (A probe task that ends is restarted: `prober::manager`'s paused-clock tests.)
//!
//! Its own binary (not `tests/prober.rs`): the probers here need a long `initialDelay` (so a
//! re-armed one shows) and a seed that can be stopped, which the shared prober of
//! `tests/prober.rs` must not see.

// A test crate: a failed assumption is a failed test (outside tests the workspace denies these).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod harness;

use std::time::Duration;

use dwd_sim::{ShootState, WorkerPool};
use dwd_testenv::{ApiServer, ApiServerOptions, TestEnv, eventually};
use harness::in_process::*;
use tokio_util::sync::CancellationToken;

/// Long enough that a probe restarted by a Cluster edit (or a restart that waited it out)
/// shows as a gap no test deadline below tolerates.
const INITIAL_DELAY: Duration = Duration::from_secs(15);
/// Deadline for "the next runs came": several intervals, well under [`INITIAL_DELAY`].
const SOON: Duration = Duration::from_secs(8);

/// The shoot apiserver every test of this binary shares.
async fn shoots() -> ApiServer {
    static SHOOTS: tokio::sync::OnceCell<ApiServer> = tokio::sync::OnceCell::const_new();
    SHOOTS
        .get_or_init(|| async {
            let env = TestEnv::shared().await.expect("test environment");
            env.start_apiserver("shoots")
                .await
                .expect("shoot apiserver")
        })
        .await
        .clone()
}

/// Starts a prober with `config` against `seed` on a runtime of its own (it outlives the
/// test's), stopped by `stop`; returns once it is ready.
async fn start_prober(seed: ApiServer, config: &str, stop: CancellationToken) -> Harness {
    Harness::start(seed, shoots().await, config, "dwd-prober-resilience", stop).await
}

/// The prober of the shared seed with a long initial delay, for the whole binary.
async fn slow_starter() -> &'static Harness {
    static HARNESS: tokio::sync::OnceCell<Harness> = tokio::sync::OnceCell::const_new();
    HARNESS
        .get_or_init(|| async {
            init_tracing();
            let env = TestEnv::shared().await.expect("test environment");
            let seed = env.apiserver("seed").expect("seed apiserver");
            let config = PROBER_CONFIG.replace(
                "initialDelay: 200ms",
                &format!("initialDelay: {}s", INITIAL_DELAY.as_secs()),
            );
            assert_ne!(config, PROBER_CONFIG, "the initial delay was not replaced");
            start_prober(seed, &config, CancellationToken::new()).await
        })
        .await
}

/// Waits until the probe of `ns` has run `more` more times, within [`SOON`].
async fn runs_soon(h: &Harness, ns: &str, more: u64, after: &str) {
    let what = format!("runs {after} (a re-armed initial delay would take {INITIAL_DELAY:?})");
    h.wait_runs_within(ns, more, SOON, &what).await;
}

#[tokio::test]
async fn cluster_edits_during_an_outage_apply_from_the_next_run_without_a_new_initial_delay() {
    let h = slow_starter().await;
    let seed = h.seed_client().await;
    let state = |conditions: Option<Vec<String>>, grace: Option<&str>| ShootState {
        workers: vec![WorkerPool {
            name: "worker-a".into(),
            node_conditions: conditions,
        }],
        node_monitor_grace_period: grace.map(Into::into),
        ..ShootState::default()
    };
    // A 2 minute grace period: a silence of seconds expires nothing.
    let shoot = h
        .shoot("edits", &h.shoots, |o| {
            o.shoot_state = Some(state(None, Some("2m")));
        })
        .await;
    let ns = shoot.namespace().to_string();
    h.wait_runs(&ns, 2).await;
    // The outage: every kubelet falls silent.
    shoot.kubelets().silence_count(5);
    leases_older_than(&shoot, Duration::from_millis(4_500)).await;
    h.wait_runs(&ns, 2).await;
    assert_eq!(
        h.shoot_metric("dwd_prober_expired_lease_fraction", &ns),
        Some(0.0),
        "the shoot's 2m grace period applies"
    );
    // The pools' node conditions change: the probe keeps running on schedule.
    shoot
        .set_shoot_state(&state(Some(vec!["CustomProblem".into()]), Some("2m")))
        .await
        .expect("pool conditions");
    runs_soon(h, &ns, 3, "after a pool edit").await;
    // The grace period goes back to the config's 4 s: the next run sees the outage and
    // protects the shoot, long before a restarted probe's first run.
    shoot
        .set_shoot_state(&state(Some(vec!["CustomProblem".into()]), None))
        .await
        .expect("grace period");
    eventually(SOON, "KCM scaled down after the grace edit", || async {
        let (replicas, _) = deployment_state(&seed, &ns, KCM).await;
        Ok((replicas == 0).then_some(()))
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\nmetrics:\n{}", h.metrics_text()));
}

#[tokio::test]
async fn a_failing_seed_watch_turns_readiness_off_and_nothing_scales_until_it_has_listed_again() {
    let env = TestEnv::shared().await.expect("test environment");
    // A seed of its own: stopping it must not disturb the other tests' prober.
    let own_seed = env
        .start_apiserver_with("seed-stale", ApiServerOptions::seed())
        .await
        .expect("seed apiserver");
    let stop = CancellationToken::new();
    let _stop_prober = stop.clone().drop_guard();
    let h = start_prober(own_seed, PROBER_CONFIG, stop).await;
    let shoot = h.shoot("stale", &h.shoots, |_| {}).await;
    let ns = shoot.namespace().to_string();
    h.wait_runs(&ns, 2).await;

    h.seed.stop().await.expect("stop seed");
    // Each cache's watch fails on its own schedule. The Clusters' watch may be judged stale
    // first, and that alone does not stop a probe (the probes decide from the secrets,
    // Machines and targets): wait until one of those is stale too, which stops them all.
    let reason = eventually(
        Duration::from_secs(60),
        "readiness off: a probe's seed watch failing",
        || async {
            Ok(h.health.readiness().err().filter(|r| {
                [
                    "probe kubeconfig secrets (watch failing",
                    "machines (watch failing",
                ]
                .iter()
                .any(|cache| r.contains(cache))
            }))
        },
    )
    .await
    .expect("readiness off");
    assert!(reason.starts_with("caches not synced:"), "{reason}");

    // An outage while the caches are stale: probes run, and nothing scales from them.
    shoot.kubelets().silence_count(5);
    leases_older_than(&shoot, Duration::from_secs(4)).await;
    h.wait_runs(&ns, 3).await;
    assert_eq!(
        h.shoot_metric("dwd_prober_scaling_attempts_total", &ns),
        None,
        "scaled from a stale cache:\n{}",
        h.metrics_text()
    );
    assert!(!h.health.is_ready());

    // The seed comes back: the caches list again, readiness returns, the shoot is protected.
    h.seed.start().await.expect("start seed");
    eventually(
        Duration::from_secs(90),
        "ready again after the re-list",
        || async { Ok(h.health.is_ready().then_some(())) },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}: {:?}", h.health.readiness()));
    let seed = h.seed_client().await;
    wait_replicas(&seed, &ns, &[(KCM, 0)]).await;
    h.seed.stop().await.expect("stop seed");
}
