//! Shadow mode of the prober (`--shadow`, docs/behaviour.md §5) against real apiservers: a
//! shadow prober beside an acting one (ours, in normal mode) on one seed, and a shadow prober
//! alone on a seed of its own (a prober probes every Cluster of its seed, so the lone shadow
//! needs a seed no acting prober watches).
//!
//! - beside the acting prober, an outage both catch is a scale-down both agree on, and the
//!   recovery a scale-up both agree on, each with the acting watchdog's lag;
//! - alone, an outage is a would-scale-down that leaves every target as it was (replicas,
//!   annotations, generation), and past the window a comparison "only us".
//!
//! Each seed apiserver also serves its shoot's nodes and leases (one apiserver fewer to start).

// A test crate: a failed assumption is a failed test (outside tests the workspace denies these).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod harness;

use std::sync::Arc;
use std::time::Duration;

use dependency_watchdog::metrics::Metrics;
use dependency_watchdog::observe::events::Component;
use dependency_watchdog::observe::health::Health;
use dependency_watchdog::shadow::{Record, Selection, Shadow};
use dwd_core::scaling::{MELTDOWN_ANNOTATION, REPLICAS_ANNOTATION};
use dwd_core::shadow::{ShadowAction, Side};
use dwd_sim::{SimShoot, SimShootOptions};
use dwd_testenv::{ApiServer, ApiServerOptions, TestEnv, eventually};
use harness::in_process::{
    CA, DEADLINE, KCM, MCM, PROBER_CONFIG, RENEW, init_tracing, wait_replicas,
};
use k8s_openapi::api::apps::v1::Deployment;
use kube::Api;
use tokio_util::sync::CancellationToken;

/// The shadow's matching window: short, so that "only us" shows within a test.
const WINDOW: Duration = Duration::from_secs(8);

/// A prober running until it is dropped.
struct Running {
    health: Arc<Health>,
    stop: CancellationToken,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// Runs `prober::run` (shadow mode when `shadow` is given) with the common test
/// config against `seed`, on a runtime and thread of its own, as pod `default/<pod>`; waits
/// until it is ready.
async fn start_prober(seed: &ApiServer, pod: &str, shadow: Option<Arc<Shadow>>) -> Running {
    let config = dwd_core::ProberConfig::from_yaml(PROBER_CONFIG)
        .expect("config")
        .config;
    let health = Arc::new(Health::default());
    let stop = CancellationToken::new();
    harness::in_process::spawn_prober_with_shadow(
        seed.kubeconfig().to_string(),
        config,
        Arc::new(Metrics::default()),
        health.clone(),
        pod,
        shadow,
        stop.clone(),
    );
    harness::in_process::wait_ready(&health).await;
    Running { health, stop }
}

/// A seed apiserver of its own (the shared one carries the common harness's prober).
async fn seed(name: &str) -> ApiServer {
    init_tracing();
    let env = TestEnv::shared().await.expect("test environment");
    env.start_apiserver_with(name, ApiServerOptions::seed())
        .await
        .expect("seed apiserver")
}

/// Shoot `shoot--shadow--<name>` on `seed` whose nodes and leases live on `shoots`: 5
/// nodes, KCM 3, MCM 2, CA 2 replicas.
async fn shoot(name: &str, seed: &ApiServer, shoots: &ApiServer) -> SimShoot {
    let mut options = SimShootOptions::new(format!("shoot--shadow--{name}"))
        .with_nodes(5)
        .with_renew_interval(RENEW);
    options.node_prefix = format!("shadow-{name}-");
    options.deployments = vec![(KCM.into(), 3), (MCM.into(), 2), (CA.into(), 2)];
    SimShoot::create(
        seed.client().await.expect("seed client"),
        shoots.client().await.expect("shoot client"),
        shoots.kubeconfig(),
        options,
    )
    .await
    .expect("simulated shoot")
}

/// The whole shadow book as text, for a failed assertion to show.
fn book(shadow: &Shadow) -> String {
    shadow.render_text(&Selection::parse(None))
}

/// Waits until the shadow kept a comparison of `ns` for `action`, and returns it.
async fn wait_record(shadow: &Shadow, ns: &str, action: &str) -> Record {
    eventually(
        DEADLINE,
        &format!("a shadow comparison of {ns}: {action}"),
        || async {
            let records = shadow.records(usize::MAX);
            Ok(records
                .iter()
                .find(|r| r.key == ns && r.action == action)
                .cloned())
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", book(shadow)))
}

/// Every target's (name, spec.replicas, metadata.generation, has a scaling annotation).
async fn targets(seed: &kube::Client, ns: &str) -> Vec<(String, i32, i64, bool)> {
    let api: Api<Deployment> = Api::namespaced(seed.clone(), ns);
    let mut seen = Vec::new();
    for name in [KCM, MCM, CA] {
        let d = api.get(name).await.expect("deployment");
        let annotations = d.metadata.annotations.unwrap_or_default();
        seen.push((
            name.to_string(),
            d.spec.and_then(|s| s.replicas).unwrap_or(1),
            d.metadata.generation.unwrap_or_default(),
            annotations.contains_key(MELTDOWN_ANNOTATION)
                || annotations.contains_key(REPLICAS_ANNOTATION),
        ));
    }
    seen
}

#[tokio::test]
async fn beside_the_acting_prober_an_outage_and_its_recovery_are_agreements_with_the_acting_lag() {
    let seed = seed("shadow-pair-seed").await;
    let shadow = Shadow::new(Component::Prober, WINDOW);
    let _acting = start_prober(&seed, "dwd-acting", None).await;
    let shadowing = start_prober(&seed, "dwd-shadow", Some(shadow.clone())).await;
    let sick = shoot("pair", &seed, &seed).await;
    let ns = sick.namespace().to_string();
    let client = seed.client().await.expect("seed client");
    assert!(shadowing.health.is_ready());

    sick.kubelets().silence_count(4);
    // The acting prober scales the shoot down; the shadow would have, and saw it do so.
    wait_replicas(&client, &ns, &[(KCM, 0), (MCM, 0), (CA, 0)]).await;
    let down = wait_record(&shadow, &ns, "scale_down").await;
    assert_eq!(down.verdict, "agree", "{}", book(&shadow));
    let lag = down.reference_lag_seconds.expect("an agreement's lag");
    assert!(lag.abs() < WINDOW.as_secs_f64(), "{lag}");
    let ours = down.ours.as_deref().unwrap_or_default();
    assert!(
        ours.contains("node leases expired")
            && ours.ends_with(&format!("all targets: {KCM}, {MCM}, {CA}")),
        "{ours}"
    );
    let reference = down.reference.as_deref().unwrap_or_default();
    assert!(
        reference.starts_with(&format!("{MELTDOWN_ANNOTATION} on ")),
        "{reference}"
    );

    sick.kubelets().resume_all();
    wait_replicas(&client, &ns, &[(KCM, 3), (MCM, 2), (CA, 2)]).await;
    let up = wait_record(&shadow, &ns, "scale_up").await;
    assert_eq!(up.verdict, "agree", "{}", book(&shadow));
    assert!(up.reference_lag_seconds.is_some());
    // One of each: the runs between changed nothing.
    assert_eq!(
        (
            shadow.count(Side::Ours, ShadowAction::ScaleDown),
            shadow.count(Side::Ours, ShadowAction::ScaleUp),
            shadow.count(Side::Reference, ShadowAction::ScaleDown),
            shadow.count(Side::Reference, ShadowAction::ScaleUp),
        ),
        (1, 1, 1, 1),
        "{}",
        book(&shadow)
    );
    let text = book(&shadow);
    assert!(
        text.contains(&format!("{ns}: scale down: both agree")),
        "{text}"
    );
}

#[tokio::test]
async fn alone_an_outage_is_a_would_scale_down_that_writes_nothing_and_past_the_window_only_us() {
    let seed = seed("shadow-alone-seed").await;
    let shadow = Shadow::new(Component::Prober, WINDOW);
    let _shadowing = start_prober(&seed, "dwd-shadow-alone", Some(shadow.clone())).await;
    let sick = shoot("alone", &seed, &seed).await;
    let ns = sick.namespace().to_string();
    let client = seed.client().await.expect("seed client");
    let before = eventually(DEADLINE, "the shoot's targets", || async {
        Ok(Some(targets(&client, &ns).await))
    })
    .await
    .expect("targets");
    assert_eq!(
        before.iter().map(|t| (t.1, t.3)).collect::<Vec<_>>(),
        [(3, false), (2, false), (2, false)]
    );

    sick.kubelets().silence_count(4);
    eventually(DEADLINE, "a would-scale-down", || async {
        Ok((shadow.count(Side::Ours, ShadowAction::ScaleDown) >= 1).then_some(()))
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", book(&shadow)));
    // Nobody acts: past the window the scale-down is ours alone.
    let down = wait_record(&shadow, &ns, "scale_down").await;
    assert_eq!(down.verdict, "only_us", "{}", book(&shadow));
    assert!(down.reference.is_none());
    // The shadow wrote nothing to the targets: same replicas, no annotation, same generation.
    assert_eq!(targets(&client, &ns).await, before);
    assert_eq!(shadow.count(Side::Ours, ShadowAction::ScaleDown), 1);
    assert_eq!(shadow.count(Side::Reference, ShadowAction::ScaleDown), 0);
}
