//! An optional target whose kind the seed does not serve, against a real seed apiserver.
//!
//! The prober config is the shared one (`harness::in_process::PROBER_CONFIG`) plus a target of a made-up
//! kind, `example.com/v1` `Widget`, that no seed serves. Optional, it is warned about once at
//! startup and skipped: the prober gets ready, an outage scales the other targets down in level
//! order and recovery restores them, although the widget sits in a level of both flows (the
//! reference fails that level on every run and never reaches the later ones). Not optional, it
//! stops startup with an error naming it. Its own test binary: it runs its own prober, not
//! the shared harness's.

// A test crate: a failed assumption is a failed test (outside tests the workspace denies these).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod harness;

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dependency_watchdog::metrics::Metrics;
use dependency_watchdog::observe::health::Health;
use dependency_watchdog::prober::ProberStart;
use dwd_sim::{SimShoot, SimShootOptions};
use dwd_testenv::{TestEnv, eventually};
use harness::in_process::*;
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;

/// The widget target: scale-down level 1 (between KCM and CA), scale-up level 0 (before KCM
/// and MCM), so in both flows a later level runs only if its level goes on.
fn config_with_widget(optional: bool) -> dwd_core::ProberConfig {
    let widget = format!(
        "  - ref: {{kind: Widget, name: widget, apiVersion: example.com/v1}}\n    optional: {optional}\n    scaleUp: {{level: 0}}\n    scaleDown: {{level: 1}}\n"
    );
    dwd_core::ProberConfig::from_yaml(&format!("{PROBER_CONFIG}{widget}"))
        .expect("config")
        .config
}

/// Log output shared with the global subscriber (every thread, the prober's runtime too).
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("log").extend_from_slice(buf);
        std::io::stderr().write_all(buf)?;
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().expect("log")).into_owned()
    }

    /// The lines that warn of a target whose kind the seed does not serve.
    fn unserved_kind_warnings(&self) -> Vec<String> {
        self.text()
            .lines()
            .filter(|l| l.contains("WARN") && l.contains("not served"))
            .map(str::to_string)
            .collect()
    }
}

fn runs(registry: &Mutex<Registry>, ns: &str) -> u64 {
    let text = metrics_text_of(registry);
    shoot_sample(&text, "dwd_prober_shoot_probe_runs_total", ns).unwrap_or(0.0) as u64
}

/// The prober's start for the shared config plus the widget, `optional` or not.
fn prober_start(
    seed: &kube::Client,
    optional: bool,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
) -> ProberStart {
    ProberStart {
        config: config_with_widget(optional),
        run_memory_capacity: dependency_watchdog::memory_budget::DEFAULT_CAPACITY,
        seed: seed.clone(),
        metrics,
        health,
        own_pod: dependency_watchdog::observe::events::PodRef {
            namespace: "default".into(),
            name: "dwd-prober-test".into(),
        },
        shadow: None,
        decisions: Arc::new(dependency_watchdog::decisions::DecisionLog::new(4)),
    }
}

/// A mandatory widget ends startup at once with an error naming the target and its kind.
async fn assert_mandatory_widget_stops_startup(seed: &kube::Client) {
    let start = prober_start(
        seed,
        false,
        Arc::new(Metrics::default()),
        Arc::new(Health::default()),
    );
    let mandatory = tokio::time::timeout(
        Duration::from_secs(60),
        dependency_watchdog::prober::run(start, CancellationToken::new()),
    )
    .await
    .expect("a mandatory target of an unserved kind ends startup at once");
    let error = mandatory
        .expect_err("a mandatory target of an unserved kind must stop startup")
        .to_string();
    assert!(
        error.contains("target widget")
            && error.contains("example.com/v1/Widget")
            && error.contains("not optional"),
        "{error}"
    );
}

/// A shoot of 5 nodes named `widget-*`, with the three targets at 3, 2 and 2 replicas.
async fn create_widget_shoot(seed: &kube::Client, shoots: &dwd_testenv::ApiServer) -> SimShoot {
    let mut options = SimShootOptions::new("shoot--it--widget")
        .with_nodes(5)
        .with_renew_interval(RENEW);
    options.node_prefix = "widget-".into();
    options.deployments = vec![(KCM.into(), 3), (MCM.into(), 2), (CA.into(), 2)];
    SimShoot::create(
        seed.clone(),
        shoots.client().await.expect("shoot client"),
        shoots.kubeconfig(),
        options,
    )
    .await
    .expect("simulated shoot")
}

/// `explain` shows that every flow skips the optional widget because the seed does not serve it.
async fn assert_explain_skips_widget(seed: &kube::Client, ns: &str) {
    let explanation = dependency_watchdog::explain::explain(seed, &config_with_widget(true), ns)
        .await
        .expect("explain");
    let widget = explanation
        .flow
        .iter()
        .flat_map(|level| &level.targets)
        .find(|t| t.target.contains("Widget"))
        .unwrap_or_else(|| panic!("the widget in explain's flow: {explanation:?}"));
    assert!(
        widget
            .action
            .contains("kind not served by the seed; optional, so every flow skips it"),
        "{widget:?}"
    );
}

#[tokio::test]
async fn an_optional_target_of_an_unserved_kind_is_skipped_and_the_other_levels_run() {
    let logs = Captured::default();
    let _ = tracing_subscriber::fmt()
        .with_env_filter("warn,dependency_watchdog=info")
        .with_ansi(false)
        .with_writer({
            let logs = logs.clone();
            move || logs.clone()
        })
        .try_init();
    let env = TestEnv::shared().await.expect("test environment");
    let seed_api = env.apiserver("seed").expect("seed apiserver");
    let shoots = env
        .start_apiserver("shoots")
        .await
        .expect("shoot apiserver");
    let seed = seed_api.client().await.expect("seed client");

    // Not optional: startup stops, naming the target and its kind.
    assert_mandatory_widget_stops_startup(&seed).await;

    // Optional: the prober starts and gets ready.
    let metrics = Arc::new(Metrics::default());
    let mut registry = Registry::default();
    metrics.register(&mut registry);
    let health = Arc::new(Health::default());
    let shutdown = CancellationToken::new();
    let start = prober_start(&seed, true, metrics, health.clone());
    let prober = tokio::spawn(dependency_watchdog::prober::run(start, shutdown.clone()));
    eventually(Duration::from_secs(90), "prober ready", || {
        let (health, done) = (health.clone(), prober.is_finished());
        async move {
            if done {
                return Err("the prober ended".into());
            }
            Ok(health.is_ready().then_some(()))
        }
    })
    .await
    .expect("prober ready with an optional target of an unserved kind");
    let warnings = logs.unserved_kind_warnings();
    assert_eq!(warnings.len(), 1, "one startup warning: {warnings:?}");
    assert!(
        warnings[0].contains("widget") && warnings[0].contains("example.com/v1/Widget"),
        "the warning names the target and its kind: {warnings:?}"
    );

    let shoot = create_widget_shoot(&seed, &shoots).await;
    let ns = shoot.namespace().to_string();
    let registry = Mutex::new(registry);
    eventually(DEADLINE, "2 probe runs", || {
        let n = runs(&registry, &ns);
        async move { Ok((n >= 2).then_some(())) }
    })
    .await
    .expect("probe runs");

    // Scale-down: KCM (0), then MCM past the widget's level (1), then CA (2).
    let (log, watch) = record_replica_changes(seed.clone(), &ns);
    shoot.kubelets().silence_count(4);
    wait_replicas(&seed, &ns, &[(KCM, 0), (MCM, 0), (CA, 0)]).await;
    let scaled_down = assert_level_order(
        &log,
        &[&[(KCM, 0)], &[(MCM, 0)], &[(CA, 0)]],
        0,
        "scale-down order must be KCM (0) < MCM (1, with the widget) < CA (2)",
    )
    .await;
    assert_recorded(&seed, &ns, &[(KCM, "3"), (MCM, "2"), (CA, "2")]).await;

    // explain says what every flow does with the widget.
    assert_explain_skips_widget(&seed, &ns).await;

    // Scale-up: CA with the widget (0), then KCM and MCM (1).
    shoot.kubelets().resume_all();
    wait_replicas(&seed, &ns, &[(KCM, 3), (MCM, 2), (CA, 2)]).await;
    assert_level_order(
        &log,
        &[&[(CA, 2)], &[(KCM, 3), (MCM, 2)]],
        scaled_down,
        "scale-up: CA (0, with the widget) before KCM and MCM (1)",
    )
    .await;
    wait_annotations_cleared(&seed, &ns, &[KCM, MCM, CA]).await;
    watch.abort();

    // Still exactly one warning about the widget: runs skip it silently.
    let count = logs.unserved_kind_warnings().len();
    assert_eq!(count, 1, "warned once, not per run");
    shutdown.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(30), prober).await;
}
