//! Shared harness of the prober integration tests: the shared test environment (a real seed
//! kube-apiserver), a shared shoot apiserver, and ONE prober running in-process on its own
//! runtime for the whole test binary — like production, one prober for many shoots. Every
//! test creates its own shoot namespaces, so tests don't see each other's objects.

// Test helpers: a failed assumption is a failed test (outside tests the workspace denies these).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dependency_watchdog::metrics::Metrics;
use dependency_watchdog::observe::health::Health;
use dwd_sim::{SimShoot, SimShootOptions};
use dwd_testenv::{ApiServer, TestEnv, eventually};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::events::v1::Event;
use kube::Api;
use kube::api::ListParams;
use kube::runtime::WatchStreamExt;
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;

/// The text of [`PROBER_CONFIG_THREE_TARGETS`]: a macro, so that [`PROBER_CONFIG`] can extend
/// it with `concat!`.
macro_rules! prober_config_core {
    () => {
        r#"
kubeConfigSecretName: shoot-access-dependency-watchdog-probe
probeInterval: 400ms
initialDelay: 200ms
probeTimeout: 3s
backoffJitterFactor: 0.2
kcmNodeMonitorGraceDuration: 4s
nodeLeaseFailureFraction: 0.6
dependentResourceInfos:
  - ref: {kind: Deployment, name: kube-controller-manager, apiVersion: apps/v1}
    scaleUp: {level: 1, timeout: 10s}
    scaleDown: {level: 0, timeout: 10s}
  - ref: {kind: Deployment, name: machine-controller-manager, apiVersion: apps/v1}
    scaleUp: {level: 1, timeout: 10s}
    scaleDown: {level: 1, timeout: 10s}
  - ref: {kind: Deployment, name: cluster-autoscaler, apiVersion: apps/v1}
    scaleUp: {level: 0, timeout: 10s}
    scaleDown: {level: 2, timeout: 10s}
"#
    };
}

/// The seeds' three targets with their levels, intervals shrunk to fractions of a second: the
/// config of the tests that run the binary on a seed of their own (leader.rs).
pub(crate) const PROBER_CONFIG_THREE_TARGETS: &str = prober_config_core!();

/// The prober config every test runs with: the seeds' three targets with their levels, an
/// optional target that no shoot has, and intervals shrunk to fractions of a second.
pub(crate) const PROBER_CONFIG: &str = concat!(
    prober_config_core!(),
    r#"  - ref: {kind: Deployment, name: dwd-optional-target, apiVersion: apps/v1}
    optional: true
    scaleUp: {level: 0}
    scaleDown: {level: 0}
"#
);

/// Kubelet renew interval of simulated shoots (grace 4 s → leases expire 3 s after renewal).
pub(crate) const RENEW: Duration = Duration::from_millis(250);
/// Generous deadline for a condition that needs several probe runs.
pub(crate) const DEADLINE: Duration = Duration::from_secs(45);

pub(crate) const KCM: &str = "kube-controller-manager";
pub(crate) const MCM: &str = "machine-controller-manager";
pub(crate) const CA: &str = "cluster-autoscaler";
/// The targets' replicas of a shoot [`Harness::shoot`] creates (unless customized).
pub(crate) const SHOOT_REPLICAS: &[(&str, i32)] = &[(KCM, 3), (MCM, 2), (CA, 2)];

pub(crate) struct Harness {
    pub(crate) env: &'static TestEnv,
    pub(crate) seed: ApiServer,
    /// A shoot apiserver shared by shoots whose tests don't break their apiserver.
    pub(crate) shoots: ApiServer,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) registry: Arc<Mutex<Registry>>,
    pub(crate) health: Arc<Health>,
}

pub(crate) async fn harness() -> &'static Harness {
    static HARNESS: tokio::sync::OnceCell<Harness> = tokio::sync::OnceCell::const_new();
    let harness = HARNESS
        .get_or_init(|| async {
            init_tracing();
            let env = TestEnv::shared().await.expect("test environment");
            let seed = env.apiserver("seed").expect("seed apiserver");
            let shoots = env
                .start_apiserver("shoots")
                .await
                .expect("shared shoot apiserver");
            Harness::start(
                seed,
                shoots,
                PROBER_CONFIG,
                "dwd-prober-test",
                CancellationToken::new(),
            )
            .await
        })
        .await;
    // Every test waits for readiness (not only the first), so a slow cold start under load
    // fails no test that could still pass, and the prober is never started twice.
    wait_ready(&harness.health).await;
    harness
}

/// Logs of the code under test go to the test's output (`RUST_LOG` or warnings and the
/// watchdog's info); the first call of a test binary installs the subscriber.
pub(crate) fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "warn,dependency_watchdog=info".into()),
        )
        .with_test_writer()
        .try_init();
}

/// Waits until a prober is ready (its caches synced); a cold start under load may be slow.
pub(crate) async fn wait_ready(health: &Arc<Health>) {
    eventually(
        Duration::from_secs(90),
        "prober ready (caches synced)",
        || {
            let h = health.clone();
            async move { Ok(h.is_ready().then_some(())) }
        },
    )
    .await
    .expect("prober ready");
}

impl Harness {
    /// Starts a prober with `config` against `seed` as pod `default/<pod>` on a runtime of its
    /// own (it outlives every test's runtime), stopped by `stop`, with `shoots` for the shoots
    /// of its tests; returns once it is ready.
    pub(crate) async fn start(
        seed: ApiServer,
        shoots: ApiServer,
        config: &str,
        pod: &str,
        stop: CancellationToken,
    ) -> Harness {
        let env = TestEnv::shared().await.expect("test environment");
        let config = dwd_core::ProberConfig::from_yaml(config)
            .expect("config")
            .config;
        let metrics = Arc::new(Metrics::default());
        let mut registry = Registry::default();
        metrics.register(&mut registry);
        let health = Arc::new(Health::default());
        let kubeconfig = seed.kubeconfig().to_string();
        spawn_prober(
            kubeconfig,
            config,
            metrics.clone(),
            health.clone(),
            pod,
            stop,
        );
        wait_ready(&health).await;
        Harness {
            env,
            seed,
            shoots,
            metrics,
            registry: Arc::new(Mutex::new(registry)),
            health,
        }
    }

    pub(crate) async fn seed_client(&self) -> kube::Client {
        self.seed.client().await.expect("seed client")
    }

    /// Creates shoot `name` (namespace `shoot--it--<name>`) on `api`: 5 nodes, KCM 3, MCM 2,
    /// CA 2 replicas; `customize` adjusts the options.
    pub(crate) async fn shoot(
        &self,
        name: &str,
        api: &ApiServer,
        customize: impl FnOnce(&mut SimShootOptions),
    ) -> SimShoot {
        let mut options = SimShootOptions::new(format!("shoot--it--{name}"))
            .with_nodes(5)
            .with_renew_interval(RENEW);
        options.node_prefix = format!("{name}-");
        options.deployments = vec![(KCM.into(), 3), (MCM.into(), 2), (CA.into(), 2)];
        customize(&mut options);
        SimShoot::create(
            self.seed_client().await,
            api.client().await.expect("shoot client"),
            api.kubeconfig(),
            options,
        )
        .await
        .expect("simulated shoot")
    }

    /// [`Harness::shoot`] on `api` with a 2 minute node-monitor grace period: its leases
    /// don't expire while the kubelets are silent for a while (or can't renew while `api` is
    /// down).
    pub(crate) async fn shoot_with_long_grace(&self, name: &str, api: &ApiServer) -> SimShoot {
        self.shoot(name, api, |o| {
            o.shoot_state = Some(dwd_sim::ShootState {
                node_monitor_grace_period: Some("2m".into()),
                ..dwd_sim::ShootState::default()
            })
        })
        .await
    }

    /// The metrics text.
    pub(crate) fn metrics_text(&self) -> String {
        metrics_text_of(&self.registry)
    }

    /// Value of `metric{shoot="ns"...}` if the series exists.
    pub(crate) fn shoot_metric(&self, metric: &str, ns: &str) -> Option<f64> {
        shoot_sample(&self.metrics_text(), metric, ns)
    }

    pub(crate) fn runs(&self, ns: &str) -> u64 {
        self.shoot_metric("dwd_prober_shoot_probe_runs_total", ns)
            .unwrap_or(0.0) as u64
    }

    pub(crate) fn api_failures(&self, ns: &str) -> u64 {
        self.shoot_metric("dwd_prober_api_server_probe_failures_total", ns)
            .unwrap_or(0.0) as u64
    }

    pub(crate) fn lease_failures(&self, ns: &str) -> u64 {
        self.shoot_metric("dwd_prober_lease_probe_failures_total", ns)
            .unwrap_or(0.0) as u64
    }

    /// Whether the shoot has per-shoot series (i.e. a probe that has run).
    pub(crate) fn has_series(&self, ns: &str) -> bool {
        self.metrics_text().contains(&format!("shoot=\"{ns}\""))
    }

    /// Waits until the shoot's probe has run `more` more times (successful or not).
    pub(crate) async fn wait_runs(&self, ns: &str, more: u64) {
        self.wait_more(ns, more, DEADLINE, "probe runs", Self::runs)
            .await;
    }

    /// Waits until the shoot's probe has run `more` more times within `deadline`; `what`
    /// names these runs (and why the deadline) in the failure.
    pub(crate) async fn wait_runs_within(
        &self,
        ns: &str,
        more: u64,
        deadline: Duration,
        what: &str,
    ) {
        self.wait_more(ns, more, deadline, what, Self::runs).await;
    }

    /// Waits until the shoot's API-server probe has failed `more` more times.
    pub(crate) async fn wait_api_failures(&self, ns: &str, more: u64) {
        self.wait_more(
            ns,
            more,
            DEADLINE,
            "API server probe failures",
            Self::api_failures,
        )
        .await;
    }

    /// Waits until the shoot's lease probe has failed `more` more times.
    pub(crate) async fn wait_lease_failures(&self, ns: &str, more: u64) {
        self.wait_more(
            ns,
            more,
            DEADLINE,
            "lease probe failures",
            Self::lease_failures,
        )
        .await;
    }

    /// Waits until the prober sees every candidate lease of shoot `ns` expired
    /// (`dwd_prober_expired_lease_fraction` 1).
    pub(crate) async fn wait_all_leases_expired(&self, ns: &str) {
        let metric = "dwd_prober_expired_lease_fraction";
        eventually(
            DEADLINE,
            &format!("every candidate lease of {ns} expired"),
            || {
                let fraction = self.shoot_metric(metric, ns);
                async move { Ok((fraction == Some(1.0)).then_some(())) }
            },
        )
        .await
        .unwrap_or_else(|e| panic!("{e}\nmetrics:\n{}", self.metrics_text()));
    }

    /// Waits until `counter` of shoot `ns` (named `what`) has grown by `more`, within
    /// `deadline`.
    async fn wait_more(
        &self,
        ns: &str,
        more: u64,
        deadline: Duration,
        what: &str,
        counter: fn(&Self, &str) -> u64,
    ) {
        let target = counter(self, ns) + more;
        eventually(
            deadline,
            &format!("{more} more {what} of {ns}"),
            || async move { Ok((counter(self, ns) >= target).then_some(())) },
        )
        .await
        .unwrap_or_else(|e| panic!("{e}\nmetrics:\n{}", self.metrics_text()));
    }
}

/// Waits until every lease of `shoot` is older than `age`.
pub(crate) async fn leases_older_than(shoot: &dwd_sim::SimShoot, age: Duration) {
    let nodes = shoot.node_names();
    let age = chrono::Duration::from_std(age).expect("age");
    eventually(
        DEADLINE,
        &format!("all leases older than {age}"),
        || async {
            for node in &nodes {
                let renewed = shoot
                    .shoot()
                    .lease_renew_time(node)
                    .await
                    .map_err(|e| e.to_string())?;
                if renewed.is_none_or(|t| chrono::Utc::now() - t < age) {
                    return Ok(None);
                }
            }
            Ok(Some(()))
        },
    )
    .await
    .expect("stale leases");
}

/// The metrics text of `registry`, as `/metrics` serves it.
pub(crate) fn metrics_text_of(registry: &Mutex<Registry>) -> String {
    let mut text = String::new();
    let registry = registry.lock().expect("registry");
    prometheus_client::encoding::text::encode(&mut text, &registry).expect("encode");
    text
}

/// Value of the first series `metric{shoot="ns"...}` in the metrics `text`, if there is one.
pub(crate) fn shoot_sample(text: &str, metric: &str, ns: &str) -> Option<f64> {
    let prefix = format!("{metric}{{shoot=\"{ns}\"");
    text.lines()
        .find(|l| l.starts_with(&prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// `spec.replicas` and annotations of a Deployment.
pub(crate) async fn deployment_state(
    client: &kube::Client,
    ns: &str,
    name: &str,
) -> (i32, BTreeMap<String, String>) {
    let d = Api::<Deployment>::namespaced(client.clone(), ns)
        .get(name)
        .await
        .expect("deployment");
    (
        d.spec.and_then(|s| s.replicas).unwrap_or(1),
        d.metadata.annotations.unwrap_or_default(),
    )
}

/// Asserts that every named Deployment has `replicas` now; `what` says when, in the message.
pub(crate) async fn assert_replicas(
    client: &kube::Client,
    ns: &str,
    expect: &[(&str, i32)],
    what: &str,
) {
    for (name, want) in expect {
        let got = deployment_state(client, ns, name).await.0;
        assert_eq!(got, *want, "{what}: {name}");
    }
}

/// Asserts every target of a shoot [`Harness::shoot`] created has its replicas and neither
/// scaling annotation; `what` says when, in the message.
pub(crate) async fn assert_untouched(client: &kube::Client, ns: &str, what: &str) {
    use dwd_core::scaling::{MELTDOWN_ANNOTATION, REPLICAS_ANNOTATION};
    for (name, want) in SHOOT_REPLICAS {
        let (replicas, a) = deployment_state(client, ns, name).await;
        assert_eq!(replicas, *want, "{what}: {name}");
        assert!(
            !a.contains_key(REPLICAS_ANNOTATION) && !a.contains_key(MELTDOWN_ANNOTATION),
            "{what}: {name}: {a:?}"
        );
    }
}

/// Asserts each named Deployment was scaled down behind the marker: its replicas annotation
/// records the given replicas and its meltdown annotation is set (empty).
pub(crate) async fn assert_recorded(client: &kube::Client, ns: &str, recorded: &[(&str, &str)]) {
    use dwd_core::scaling::{MELTDOWN_ANNOTATION, REPLICAS_ANNOTATION};
    for (name, replicas) in recorded {
        let (_, a) = deployment_state(client, ns, name).await;
        assert_eq!(
            a.get(REPLICAS_ANNOTATION).map(String::as_str),
            Some(*replicas),
            "{name}: {a:?}"
        );
        assert_eq!(
            a.get(MELTDOWN_ANNOTATION).map(String::as_str),
            Some(""),
            "{name}: {a:?}"
        );
    }
}

/// Waits until every named Deployment has `replicas`.
pub(crate) async fn wait_replicas(client: &kube::Client, ns: &str, expect: &[(&str, i32)]) {
    let what = format!("{ns}: replicas {expect:?}");
    eventually(DEADLINE, &what, || async {
        let mut seen = Vec::new();
        for (name, want) in expect {
            let (got, _) = deployment_state(client, ns, name).await;
            seen.push((name.to_string(), got));
            if got != *want {
                return Err(format!("seen {seen:?}"));
            }
        }
        Ok(Some(()))
    })
    .await
    .expect("replicas");
}

/// Waits until none of the named Deployments carries the replicas or meltdown annotation.
/// Scale-up sets replicas first and removes the annotations after, so a test that saw the
/// replicas restored must still wait for the second write.
pub(crate) async fn wait_annotations_cleared(client: &kube::Client, ns: &str, names: &[&str]) {
    use dwd_core::scaling::{MELTDOWN_ANNOTATION, REPLICAS_ANNOTATION};
    eventually(
        DEADLINE,
        &format!("{ns}: annotations removed from {names:?}"),
        || async {
            for name in names {
                let (_, a) = deployment_state(client, ns, name).await;
                if a.contains_key(REPLICAS_ANNOTATION) || a.contains_key(MELTDOWN_ANNOTATION) {
                    return Err(format!("{name}: {a:?}"));
                }
            }
            Ok(Some(()))
        },
    )
    .await
    .expect("annotations removed");
}

/// `(deployment, spec.replicas)` changes in the order the watch delivered them.
pub(crate) type ReplicaLog = Arc<Mutex<Vec<(String, i32)>>>;

/// Records, in watch order, every change of a Deployment's `spec.replicas` in `ns`.
pub(crate) fn record_replica_changes(
    client: kube::Client,
    ns: &str,
) -> (ReplicaLog, tokio::task::JoinHandle<()>) {
    let log = Arc::new(Mutex::new(Vec::<(String, i32)>::new()));
    let api: Api<Deployment> = Api::namespaced(client, ns);
    let sink = log.clone();
    let task = tokio::spawn(async move {
        let mut last = std::collections::HashMap::<String, i32>::new();
        let mut stream = std::pin::pin!(
            kube::runtime::watcher(api, kube::runtime::watcher::Config::default())
                .applied_objects()
        );
        while let Ok(Some(d)) = futures::TryStreamExt::try_next(&mut stream).await {
            let name = d.metadata.name.clone().unwrap_or_default();
            let replicas = d.spec.and_then(|s| s.replicas).unwrap_or(1);
            if last.insert(name.clone(), replicas) != Some(replicas) {
                sink.lock().expect("log").push((name, replicas));
            }
        }
    });
    (log, task)
}

/// Where in `log` `name` first reached `replicas` (panics naming it when it never did).
pub(crate) fn position(log: &[(String, i32)], name: &str, replicas: i32) -> usize {
    position_from(log, name, replicas, 0)
}

/// Where in `log`, at or after index `from`, `name` first reached `replicas` (panics naming
/// it when it never did).
pub(crate) fn position_from(
    log: &[(String, i32)],
    name: &str,
    replicas: i32,
    from: usize,
) -> usize {
    log.iter()
        .skip(from)
        .position(|(n, r)| n == name && *r == replicas)
        .map(|i| i + from)
        .unwrap_or_else(|| panic!("{name} never reached {replicas} after entry {from}: {log:?}"))
}

/// Waits until the replica log holds every `(name, replicas)` of `levels` at or after entry
/// `from`, then asserts the flow's level order: every entry of a level comes before any entry
/// of a later level (targets of one level run together, in any order). `what` names the flow
/// in the failure message. Returns the index just after the last of these entries.
pub(crate) async fn assert_level_order(
    log: &ReplicaLog,
    levels: &[&[(&str, i32)]],
    from: usize,
    what: &str,
) -> usize {
    let wanted: Vec<(&str, i32)> = levels.iter().flat_map(|l| l.iter().copied()).collect();
    let log = logged(log, &wanted, from).await;
    let positions: Vec<Vec<usize>> = levels
        .iter()
        .map(|level| {
            level
                .iter()
                .map(|(name, replicas)| position_from(&log, name, *replicas, from))
                .collect()
        })
        .collect();
    for pair in positions.windows(2) {
        let (earlier, later) = (&pair[0], &pair[1]);
        assert!(
            earlier.iter().max() < later.iter().min(),
            "{what}: levels must run in order {levels:?}: {log:?}"
        );
    }
    positions
        .iter()
        .flatten()
        .max()
        .map_or(from, |last| last + 1)
}

/// A copy of `log` once it holds every `(name, replicas)` of `wanted` at or after index
/// `from`. The recording watch may lag a direct read of the Deployments by a moment, so an
/// order is judged only once the log itself has seen every change.
pub(crate) async fn logged(
    log: &ReplicaLog,
    wanted: &[(&str, i32)],
    from: usize,
) -> Vec<(String, i32)> {
    eventually(DEADLINE, "the replica log to see every change", || {
        let log = log.lock().expect("log").clone();
        let complete = wanted.iter().all(|(name, replicas)| {
            log.iter()
                .skip(from)
                .any(|(n, r)| n == name && r == replicas)
        });
        async move { Ok(complete.then_some(log)) }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}: wanted {wanted:?} after entry {from}"))
}

/// Waits up to `deadline` until `condition` holds; `what` names the condition in the error.
pub(crate) async fn wait_until(
    deadline: Duration,
    what: &str,
    mut condition: impl FnMut() -> bool,
) -> anyhow::Result<()> {
    eventually(deadline, what, || {
        let holds = condition();
        async move { Ok(holds.then_some(())) }
    })
    .await
    .map_err(anyhow::Error::msg)
}

/// Who holds Lease `namespace/name`, if anyone (an empty holder is none).
pub(crate) async fn lease_holder(
    admin: &kube::Client,
    namespace: &str,
    name: &str,
) -> anyhow::Result<Option<String>> {
    use k8s_openapi::api::coordination::v1::Lease;
    Ok(Api::<Lease>::namespaced(admin.clone(), namespace)
        .get_opt(name)
        .await?
        .and_then(|l| l.spec)
        .and_then(|s| s.holder_identity)
        .filter(|h| !h.is_empty()))
}

/// Events in `namespace` about `kind`/`name` with `reason`, oldest first.
pub(crate) async fn events_about(
    client: &kube::Client,
    namespace: &str,
    kind: &str,
    name: &str,
    reason: &str,
) -> Vec<Event> {
    let mut found: Vec<Event> = Api::<Event>::namespaced(client.clone(), namespace)
        .list(&ListParams::default())
        .await
        .expect("list events")
        .items
        .into_iter()
        .filter(|e| {
            e.reason.as_deref() == Some(reason)
                && e.regarding.as_ref().is_some_and(|r| {
                    r.kind.as_deref() == Some(kind) && r.name.as_deref() == Some(name)
                })
        })
        .collect();
    found.sort_by_key(|e| e.event_time.as_ref().map(|t| t.0));
    found
}

/// Runs `dependency_watchdog::prober::run` on a runtime and thread of its own (it outlives
/// every test's runtime) against the seed of `kubeconfig`, as pod `pod` in `default`, until
/// `stop`.
pub(crate) fn spawn_prober(
    kubeconfig: String,
    config: dwd_core::ProberConfig,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    pod: &str,
    stop: CancellationToken,
) {
    spawn_prober_with_shadow(kubeconfig, config, metrics, health, pod, None, stop);
}

/// [`spawn_prober`], in shadow mode when `shadow` is given
/// (`dependency_watchdog::prober::run`).
pub(crate) fn spawn_prober_with_shadow(
    kubeconfig: String,
    config: dwd_core::ProberConfig,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    pod: &str,
    shadow: Option<Arc<dependency_watchdog::shadow::Shadow>>,
    stop: CancellationToken,
) {
    let pod = pod.to_string();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("prober runtime");
        rt.block_on(async move {
            let client = dwd_testenv::client_from_kubeconfig("seed", &kubeconfig)
                .await
                .expect("seed client");
            let start = dependency_watchdog::prober::ProberStart {
                config,
                run_memory_capacity: dependency_watchdog::memory_budget::DEFAULT_CAPACITY,
                seed: client,
                metrics,
                health,
                own_pod: dependency_watchdog::observe::events::PodRef {
                    namespace: "default".into(),
                    name: pod,
                },
                shadow,
                decisions: Arc::new(dependency_watchdog::decisions::DecisionLog::new(3)),
            };
            let result = dependency_watchdog::prober::run(start, stop).await;
            eprintln!("prober ended: {result:?}");
        });
    });
}

/// A client of the shared test environment's seed apiserver, for tests that need no prober.
pub(crate) async fn seed_client() -> anyhow::Result<kube::Client> {
    use anyhow::Context;
    let seed = TestEnv::shared().await?.apiserver("seed");
    Ok(seed.context("seed apiserver")?.client().await?)
}

/// In-process weeders against the shared seed, for the test binaries that run
/// `weeder::run` themselves (weeder.rs, shadow_weeder.rs, events.rs): the config they
/// run with, the running weeder with its counters and shadow, and the pods it works on.
pub(crate) mod weeder_harness {
    use std::sync::Arc;
    use std::time::Duration;

    use anyhow::{Context, Result, anyhow, ensure};
    use dependency_watchdog::metrics::{Metrics, ServiceLabels};
    use dependency_watchdog::observe::health::Health;
    use dependency_watchdog::shadow::{ActionLabels, Record, Shadow};
    use dependency_watchdog::weeder::Weeders;
    use dwd_sim::SeedControlPlane;
    use dwd_sim::seed::endpoint_slice_name;
    use dwd_testenv::eventually;
    use k8s_openapi::api::core::v1::Pod;
    use kube::Api;
    use tokio_util::sync::CancellationToken;

    /// Generous deadline for anything the weeder should do within a second or two.
    pub(crate) const DEADLINE: Duration = Duration::from_secs(30);

    /// A weeder config: `services` each with one selector per role (`role In [<role>]`).
    pub(crate) fn config(
        watch_duration: &str,
        services: &[(&str, &[&str])],
    ) -> dwd_core::WeederConfig {
        let mut yaml = format!("watchDuration: {watch_duration}\nservicesAndDependantSelectors:\n");
        for (service, roles) in services {
            yaml.push_str(&format!("  {service}:\n    podSelectors:\n"));
            for role in *roles {
                yaml.push_str(&format!(
                    "    - matchExpressions:\n      - {{key: role, operator: In, values: [{role}]}}\n"
                ));
            }
        }
        dwd_core::WeederConfig::from_yaml(&yaml)
            .expect("test weeder config is valid")
            .config
    }

    /// One in-process weeder (acting, or in shadow mode), stopped (and checked to stop
    /// cleanly) by [`Running::stop`].
    pub(crate) struct Running {
        pub(crate) weeders: Arc<Weeders>,
        pub(crate) metrics: Arc<Metrics>,
        shadow: Option<Arc<Shadow>>,
        shutdown: CancellationToken,
        task: tokio::task::JoinHandle<dependency_watchdog::Result<()>>,
    }

    impl Running {
        /// Starts an acting weeder (`weeder::run` without a shadow) on `client` and waits until its slice
        /// list is through.
        pub(crate) async fn start(
            client: kube::Client,
            config: dwd_core::WeederConfig,
        ) -> Result<Running> {
            Self::start_with_shadow(client, config, None).await
        }

        /// Starts `weeder::run` on `client` (in shadow mode when `shadow` is given)
        /// and waits until its slice list is through.
        pub(crate) async fn start_with_shadow(
            client: kube::Client,
            config: dwd_core::WeederConfig,
            shadow: Option<Arc<Shadow>>,
        ) -> Result<Running> {
            let metrics = Arc::new(Metrics::default());
            let health = Arc::new(Health::default());
            let shutdown = CancellationToken::new();
            let weeders = Weeders::new(metrics.clone(), shutdown.child_token());
            let start = dependency_watchdog::weeder::WeederStart {
                config,
                seed: client,
                weeders: weeders.clone(),
                health: health.clone(),
                own_pod: dependency_watchdog::observe::events::PodRef {
                    namespace: "default".into(),
                    name: "dwd-weeder-test".into(),
                },
                shadow: shadow.clone(),
            };
            let task = tokio::spawn(dependency_watchdog::weeder::run(start, shutdown.clone()));
            super::wait_until(DEADLINE, "weeder ready", || health.is_ready()).await?;
            Ok(Running {
                weeders,
                metrics,
                shadow,
                shutdown,
                task,
            })
        }

        /// Waits until `service`'s deletion counter reaches `n` (the pod disappears at the
        /// server a moment before the weeder's delete call returns and counts it), then checks
        /// it is exactly `n`: no pod deleted twice.
        pub(crate) async fn expect_deleted(&self, service: &str, n: u64) -> Result<()> {
            eventually(
                DEADLINE,
                &format!("{n} deletions counted for {service}"),
                || async { Ok((self.deleted(service) >= n).then_some(())) },
            )
            .await
            .map_err(anyhow::Error::msg)?;
            ensure!(
                self.deleted(service) == n,
                "pods_deleted = {}, expected {n}",
                self.deleted(service)
            );
            Ok(())
        }

        /// `dwd_weeder_pods_deleted_total` of `service`.
        pub(crate) fn deleted(&self, service: &str) -> u64 {
            self.metrics
                .pods_deleted
                .get_or_create(&ServiceLabels {
                    service: service.into(),
                })
                .get()
        }

        fn shadow(&self) -> &Shadow {
            self.shadow.as_deref().expect("a weeder in shadow mode")
        }

        /// Shadow mode: how many pod deletions we would have made.
        pub(crate) fn would_delete(&self) -> u64 {
            self.shadow()
                .metrics
                .would
                .get_or_create(&ActionLabels {
                    component: "weeder".into(),
                    action: "delete_pod".into(),
                })
                .get()
        }

        /// Shadow mode: the kept record of `key`, once there is one.
        pub(crate) async fn wait_record(&self, key: &str) -> Result<Record> {
            eventually(DEADLINE, &format!("a shadow record of {key}"), || {
                let record = self
                    .shadow()
                    .records(usize::MAX)
                    .into_iter()
                    .find(|r| r.key == key);
                async move { Ok(record) }
            })
            .await
            .map_err(|e| anyhow!(e))
        }

        /// Shadow mode: `dwd_shadow_comparisons_total{component="weeder",action="delete_pod",
        /// verdict}` as the metrics endpoint shows it.
        pub(crate) fn comparisons(&self, verdict: &str) -> f64 {
            let mut registry = prometheus_client::registry::Registry::default();
            self.shadow().metrics.register(&mut registry);
            let mut text = String::new();
            prometheus_client::encoding::text::encode(&mut text, &registry).expect("encodes");
            dwd_testenv::metrics::sample(
                &text,
                "dwd_shadow_comparisons_total",
                &[
                    ("component", "weeder"),
                    ("action", "delete_pod"),
                    ("verdict", verdict),
                ],
            )
            .unwrap_or(0.0)
        }

        /// Waits until a weeder runs for `namespace/<slice of service>`.
        pub(crate) async fn wait_started(&self, namespace: &str, service: &str) -> Result<()> {
            let key = format!("{namespace}/{}", endpoint_slice_name(service));
            super::wait_until(DEADLINE, &format!("weeder for {key}"), || {
                self.weeders.keys().contains(&key)
            })
            .await
        }

        /// Waits until no weeder runs and no weeder task is left.
        pub(crate) async fn wait_idle(&self) -> Result<()> {
            super::wait_until(DEADLINE, "all weeders ended", || {
                self.weeders.active() == 0
                    && self.weeders.live_tasks() == 0
                    && self.metrics.active_weeders.get() == 0
            })
            .await
        }

        /// Cancels the weeder; it must end with `Ok` and leave no weeder task behind.
        pub(crate) async fn stop(mut self) -> Result<()> {
            self.shutdown.cancel();
            tokio::time::timeout(Duration::from_secs(10), &mut self.task)
                .await
                .context("weeder did not stop within 10 s")??
                .context("weeder::run ended with an error")?;
            self.wait_idle().await
        }
    }

    /// A namespace with the simulator's helpers for pods and slices.
    pub(crate) async fn namespace(client: &kube::Client, name: &str) -> Result<SeedControlPlane> {
        let ns = SeedControlPlane::new(client.clone(), name);
        ns.create_namespace().await?;
        Ok(ns)
    }

    /// The pod's UID, or `None` when it no longer exists.
    pub(crate) async fn pod_uid(ns: &SeedControlPlane, pod: &str) -> Result<Option<String>> {
        let api: Api<Pod> = Api::namespaced(ns.client().clone(), ns.namespace());
        Ok(api.get_opt(pod).await?.and_then(|p| p.metadata.uid))
    }

    /// The UID of a pod that must exist.
    pub(crate) async fn uid_of(ns: &SeedControlPlane, pod: &str) -> Result<String> {
        pod_uid(ns, pod)
            .await?
            .with_context(|| format!("pod {}/{pod} exists", ns.namespace()))
    }

    /// Waits until the pod no longer exists.
    pub(crate) async fn wait_gone(ns: &SeedControlPlane, pod: &str) -> Result<()> {
        let what = format!("pod {}/{pod} deleted", ns.namespace());
        eventually(DEADLINE, &what, || async {
            match pod_uid(ns, pod).await {
                Ok(uid) => Ok(uid.is_none().then_some(())),
                Err(e) => Err(e.to_string()),
            }
        })
        .await
        .map_err(|e| anyhow!(e))
    }

    /// Checks the pod is still the one of `uid`: neither deleted nor re-created.
    pub(crate) async fn assert_kept(ns: &SeedControlPlane, pod: &str, uid: &str) -> Result<()> {
        let now = pod_uid(ns, pod).await?;
        ensure!(
            now.as_deref() == Some(uid),
            "pod {}/{pod} should be untouched (uid {uid}), now {now:?}",
            ns.namespace()
        );
        Ok(())
    }
}
