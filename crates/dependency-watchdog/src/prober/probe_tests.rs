//! The probe loop itself ([`Probe::run`]) on a paused clock, against two fake apiservers
//! ([`crate::fake_seed`]): one the seed (caches of secrets, Machines and targets; the scaling
//! writes), one the shoot (`/version`, node leases, nodes), reached through
//! [`Probe::shoot_connector`] instead of a kubeconfig. Waits of minutes take no time, and the
//! instants of the requests are exact: the assertions read the fakes' recorded requests.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use dwd_core::EffectiveProbeSettings;
use http::Method;
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
use serde_json::{Value, json};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{Probe, ProbeSpec};
use crate::client::cache::{Cache, OnRefusal, run_cache};
use crate::client::kube_client::HttpVersion;
use crate::fake_seed::{Call, DEPLOYMENT, FakeSeed, Outage};
use crate::memory_budget::MemoryBudget;
use crate::metrics::{Metrics, RunLabels, RunResult};
use crate::observe::events::{Component, Events};
use crate::prober::executor::Executors;
use crate::prober::seed_caches::{
    SecretKubeconfig, SeedCaches, TargetCache, machine_gvk, project_machine, project_target,
};
use crate::prober::{ProberContext, shadow_observer};
use crate::shadow::Shadow;
use dwd_core::scaling::{IGNORE_SCALING_ANNOTATION, MELTDOWN_ANNOTATION, REPLICAS_ANNOTATION};
use dwd_core::shadow::{ShadowAction, Side};
use kube::api::{Patch, PatchParams};

/// The shoot's namespace in the seed.
const NS: &str = "shoot--p--a";

/// kcm goes down first and comes up last; mcm the other way round.
const TARGETS: &str = "
dependentResourceInfos:
- ref: {apiVersion: apps/v1, kind: Deployment, name: kcm}
  scaleUp: {level: 1}
  scaleDown: {level: 0}
- ref: {apiVersion: apps/v1, kind: Deployment, name: mcm}
  scaleUp: {level: 0}
  scaleDown: {level: 1}
";

/// How the probe runs.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// As the acting watchdog.
    Normal,
    /// In shadow mode, the targets at 2 replicas.
    Shadow,
    /// In shadow mode, started when the acting watchdog has already scaled the targets down
    /// (marked, at 0, 2 recorded).
    ShadowOfMarkedTargets,
}

/// Shadow mode's matching window in these tests.
const WINDOW: Duration = Duration::from_secs(60);

/// A running probe and the fakes it talks to.
struct Harness {
    seed: FakeSeed,
    shoot: FakeSeed,
    /// Shadow mode's book, when the probe runs in shadow mode.
    shadow: Option<Arc<Shadow>>,
    /// The probe's metrics.
    metrics: Arc<Metrics>,
    /// What the probe shares, for a restarted one.
    ctx: Arc<ProberContext>,
    /// The mode's executors (a restarted probe gets a new one).
    executors: Arc<Executors>,
    spec: watch::Sender<ProbeSpec>,
    cancel: CancellationToken,
    task: tokio::task::JoinHandle<()>,
    /// When the probe was started.
    t0: Instant,
}

/// The seed (the two targets as `mode` wants them, a running Machine per node) and the shoot
/// (a Ready node and its lease per age in `ages`, named `n1`…).
fn world(mode: Mode, ages: [Duration; 3]) -> (FakeSeed, FakeSeed) {
    let seed = FakeSeed::default();
    seed.lock().status_delay = Some(Duration::from_secs(1));
    for name in ["kcm", "mcm"] {
        match mode {
            Mode::ShadowOfMarkedTargets => seed.create(
                &DEPLOYMENT,
                NS,
                name,
                0,
                &[(MELTDOWN_ANNOTATION, ""), (REPLICAS_ANNOTATION, "2")],
            ),
            _ => seed.create(&DEPLOYMENT, NS, name, 2, &[]),
        }
    }
    let shoot = FakeSeed::default();
    for (i, age) in ages.into_iter().enumerate() {
        let node = format!("n{}", i + 1);
        seed.insert(
            "machines",
            json!({"apiVersion": "machine.sapcloud.io/v1alpha1", "kind": "Machine",
                "metadata": {"name": format!("m-{node}"), "namespace": NS,
                             "labels": {"node": node}},
                "status": {"currentStatus": {"phase": "Running"}}}),
        );
        shoot.insert(
            "nodes",
            json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node},
                "status": {"conditions": [{"type": "Ready", "status": "True"}]}}),
        );
        shoot.insert("leases", lease(&node, age));
    }
    (seed, shoot)
}

fn settings(grace: Duration) -> ProbeSpec {
    ProbeSpec {
        settings: EffectiveProbeSettings {
            node_monitor_grace: grace,
            pool_conditions: BTreeMap::new(),
        },
        cluster_uid: Some("uid-cluster".into()),
    }
}

/// A lease of node `node` last renewed `age` ago (by the wall clock: a paused tokio clock does
/// not move it, so ages are set, not waited for).
fn lease(node: &str, age: Duration) -> Value {
    let renewed = Utc::now() - chrono::Duration::from_std(age).expect("age");
    json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": node, "namespace": "kube-node-lease"},
        "spec": {"holderIdentity": node,
                 "renewTime": renewed.format("%Y-%m-%dT%H:%M:%S%.6fZ").to_string()}})
}

impl Harness {
    /// Seed: kcm and mcm at 2 replicas (status follows spec after 1 s), a Running Machine
    /// per node. Shoot: nodes n1..n3 whose leases were renewed `ages` ago. The probe runs
    /// with `config` (prober config lines, without targets) and `grace`, its first run after
    /// the config's `initialDelay`.
    async fn start(config: &str, grace: Duration, ages: [Duration; 3]) -> Harness {
        Harness::start_with(config, grace, ages, Mode::Normal).await
    }

    /// [`Harness::start`] in `mode`. In shadow mode the observer of the acting watchdog and
    /// the book's expiry run too, the window [`WINDOW`].
    async fn start_with(config: &str, grace: Duration, ages: [Duration; 3], mode: Mode) -> Harness {
        Harness::launch(config, grace, ages, mode, None).await
    }

    /// [`Harness::start_with`], the seed's writes on a request budget of `(qps, burst)` when
    /// `budget` is given.
    async fn launch(
        config: &str,
        grace: Duration,
        ages: [Duration; 3],
        mode: Mode,
        budget: Option<(f32, u32)>,
    ) -> Harness {
        Harness::launch_in(config, grace, ages, mode, budget, MemoryBudget::unbounded()).await
    }

    /// A shoot whose every lease expired, probed every `STEADY` interval under [`GRACE`],
    /// its runs admitted to `memory`.
    async fn all_expired_in(memory: Arc<MemoryBudget>) -> Harness {
        let (mode, budget) = (Mode::Normal, None);
        Harness::launch_in(STEADY, GRACE, [EXPIRED; 3], mode, budget, memory).await
    }

    /// [`Harness::launch`], the probe's runs admitted to `memory`.
    async fn launch_in(
        config: &str,
        grace: Duration,
        ages: [Duration; 3],
        mode: Mode,
        budget: Option<(f32, u32)>,
        memory: Arc<MemoryBudget>,
    ) -> Harness {
        let config = dwd_core::ProberConfig::from_yaml(&format!(
            "kubeConfigSecretName: probe\n{config}{TARGETS}"
        ))
        .expect("config")
        .config;
        let (seed, shoot) = world(mode, ages);
        let caches = caches(&seed, &config).await;
        let metrics = Arc::new(Metrics::default());
        let shadow = match mode {
            Mode::Normal => None,
            _ => Some(Shadow::new(Component::Prober, WINDOW)),
        };
        let events = Events::disabled(metrics.clone());
        let ctx = Arc::new(ProberContext {
            config,
            seed: match budget {
                Some((qps, burst)) => seed.limited_client(qps, burst),
                None => seed.client(),
            },
            caches,
            events: events.clone(),
            metrics: metrics.clone(),
            memory,
            decisions: Arc::new(crate::decisions::DecisionLog::new(3)),
        });
        let cancel = CancellationToken::new();
        let executors = Arc::new(Executors::of(shadow.clone()));
        if let Some(recorder) = executors.recorder() {
            tokio::spawn({
                let (shadow, cancel) = (recorder.book.clone(), cancel.clone());
                async move { shadow.run_expiry(events, cancel).await }
            });
            tokio::spawn(shadow_observer::observe(
                ctx.clone(),
                recorder.clone(),
                cancel.clone(),
            ));
        }
        let (spec, _) = watch::channel(settings(grace));
        let t0 = Instant::now();
        let task = spawn_probe(&ctx, &executors, &spec, &shoot, &cancel);
        Harness {
            seed,
            shoot,
            shadow,
            metrics,
            ctx,
            executors,
            spec,
            cancel,
            task,
            t0,
        }
    }

    /// [`Harness::start`] of a healthy shoot (every lease fresh) under [`GRACE`], on the
    /// schedule `config`.
    async fn healthy(config: &str) -> Harness {
        Harness::start(config, GRACE, [FRESH; 3]).await
    }

    /// [`Harness::start_with`] with the schedule most tests use ([`STEADY`]) and [`GRACE`].
    async fn steady(ages: [Duration; 3], mode: Mode) -> Harness {
        Harness::start_with(STEADY, GRACE, ages, mode).await
    }

    /// Lets the probe run until `at` after its start.
    async fn until(&self, at: Duration) {
        tokio::time::sleep_until(self.t0 + at).await;
    }

    /// When the shoot was asked for requests whose path contains `part`, after the start.
    fn shoot_calls(&self, part: &str) -> Vec<(Duration, u16)> {
        self.shoot
            .calls_to(part)
            .iter()
            .map(|c| (c.at - self.t0, c.status))
            .collect()
    }

    /// The seed's writes (scaling patches), as (after the start, target, spec.replicas
    /// written).
    fn scaling_writes(&self) -> Vec<(Duration, String, Value)> {
        self.seed
            .writes()
            .iter()
            .map(|c: &Call| {
                assert_eq!(c.method, Method::PATCH, "{c:?}");
                assert_eq!(c.status, 200, "{c:?}");
                let target = c.path.rsplit('/').next().unwrap_or_default().to_owned();
                (c.at - self.t0, target, c.body["spec"]["replicas"].clone())
            })
            .collect()
    }

    /// Shadow mode's count of what we would have done (`would`) or saw the acting watchdog
    /// do (`reference`), by action label.
    fn shadow_counts(&self) -> (u64, u64, u64, u64) {
        (
            self.shadow().count(Side::Ours, ShadowAction::ScaleDown),
            self.shadow().count(Side::Ours, ShadowAction::ScaleUp),
            self.shadow()
                .count(Side::Reference, ShadowAction::ScaleDown),
            self.shadow().count(Side::Reference, ShadowAction::ScaleUp),
        )
    }

    /// As the acting watchdog writes it: `name`'s replicas and annotations (merge patch; a
    /// `null` annotation removes it).
    async fn act_on(&self, name: &str, replicas: i32, annotations: Value) {
        let resource = ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("apps", "v1", "Deployment"),
            "deployments",
        );
        Api::<DynamicObject>::namespaced_with(self.seed.client(), NS, &resource)
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"annotations": annotations},
                                     "spec": {"replicas": replicas}})),
            )
            .await
            .expect("the acting watchdog's patch");
    }

    /// Shadow mode's book (the probe runs in shadow mode).
    fn shadow(&self) -> &Shadow {
        self.shadow.as_deref().expect("shadow mode")
    }

    /// The shoot's `nodes` renew their leases now.
    fn renew(&self, nodes: &[&str]) {
        for node in nodes {
            self.shoot.insert("leases", lease(node, FRESH));
        }
    }

    /// Asserts that not one write of any kind reached the seed.
    fn assert_no_writes(&self) {
        assert!(self.seed.writes().is_empty(), "{:?}", self.seed.writes());
    }

    fn replicas(&self, name: &str) -> Value {
        self.seed.object("deployments", NS, name)["spec"]["replicas"].clone()
    }

    async fn stop(self) {
        self.cancel.cancel();
        self.task.await.expect("probe task");
    }

    /// Stops the probe and starts a new one on the same seed and shoot, as a restarted
    /// process would (a new executor, the first run after `initialDelay`).
    async fn restart(&mut self) {
        self.cancel.cancel();
        (&mut self.task).await.expect("probe task");
        self.cancel = CancellationToken::new();
        self.task = spawn_probe(
            &self.ctx,
            &self.executors,
            &self.spec,
            &self.shoot,
            &self.cancel,
        );
    }
}

/// Starts a probe of [`NS`] in `ctx`, following `spec`, its shoot client on `shoot`, its
/// first run after the config's `initialDelay`.
fn spawn_probe(
    ctx: &Arc<ProberContext>,
    executors: &Executors,
    spec: &watch::Sender<ProbeSpec>,
    shoot: &FakeSeed,
    cancel: &CancellationToken,
) -> tokio::task::JoinHandle<()> {
    let series = ctx.metrics.open_shoot(NS);
    let mut probe = Probe::new(
        NS.into(),
        spec.subscribe(),
        series,
        ctx.clone(),
        cancel.clone(),
    );
    let (fake_shoot, probe_timeout) = (shoot.clone(), ctx.config.probe_timeout);
    probe.shoot_connector = Some(Arc::new(move |version| {
        fake_shoot.lock().clients.push(version);
        fake_shoot.shoot_client(probe_timeout)
    }));
    tokio::spawn(probe.run(ctx.config.initial_delay, executors.for_shoot()))
}

/// The seed caches on `seed`, synced: probe secrets (never read: the shoot client comes from
/// the connector), Machines, and the targets of `config`.
async fn caches(seed: &FakeSeed, config: &dwd_core::ProberConfig) -> SeedCaches {
    let client = seed.client();
    let secrets = Cache::new("probe kubeconfig secrets");
    tokio::spawn(run_cache(
        Api::<Secret>::all(client.clone()),
        kube::runtime::watcher::Config::default().fields("metadata.name=probe"),
        secrets.clone(),
        |_: &Secret| Some(SecretKubeconfig(Err("not read in these tests".into()))),
        OnRefusal::Unsynced,
    ));
    let machines = Cache::new("machines");
    tokio::spawn(run_cache(
        Api::<DynamicObject>::all_with(client.clone(), &ApiResource::from_gvk(&machine_gvk())),
        kube::runtime::watcher::Config::default(),
        machines.clone(),
        project_machine,
        OnRefusal::Unsynced,
    ));
    let mut targets = Vec::new();
    for info in &config.dependent_resource_infos {
        let resource = ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("apps", "v1", "Deployment"),
            "deployments",
        );
        let cache = Cache::new("scaling targets");
        tokio::spawn(run_cache(
            Api::<DynamicObject>::all_with(client.clone(), &resource),
            kube::runtime::watcher::Config::default()
                .fields(&format!("metadata.name={}", info.target.name)),
            cache.clone(),
            project_target,
            OnRefusal::Unsynced,
        ));
        cache.wait_ready().await;
        targets.push(TargetCache {
            info: info.clone(),
            resource,
            cache,
        });
    }
    secrets.wait_ready().await;
    machines.wait_ready().await;
    assert_eq!(machines.in_namespace(NS).len(), 3);
    SeedCaches {
        secrets,
        machines,
        targets,
    }
}

const FRESH: Duration = Duration::ZERO;
const EXPIRED: Duration = Duration::from_secs(300);
const GRACE: Duration = Duration::from_secs(40);

/// Runs every 10 s from 30 s on, no jitter, a 5 s probe timeout (prober config lines).
const STEADY: &str =
    "probeInterval: 10s\ninitialDelay: 30s\nprobeTimeout: 5s\nbackoffJitterFactor: 0\n";

/// The scaling writes of one scale-down flow that starts at `at`: kcm (level 0) to 0, then
/// mcm (level 1) to 0 once kcm is ready, 1 s later (see [`Harness::scaling_writes`]).
fn scaled_down_at(at: Duration) -> [(Duration, String, Value); 2] {
    [
        (at, "kcm".into(), json!(0)),
        (at + secs(1), "mcm".into(), json!(0)),
    ]
}

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

/// Requests as [`Harness::shoot_calls`] lists them, from (seconds after the start, status).
fn calls(at_secs: &[(u64, u16)]) -> Vec<(Duration, u16)> {
    at_secs
        .iter()
        .map(|&(s, status)| (secs(s), status))
        .collect()
}

/// Gaps between consecutive instants.
fn gaps(at: &[Duration]) -> Vec<Duration> {
    at.windows(2).map(|w| w[1] - w[0]).collect()
}

#[tokio::test(start_paused = true)]
async fn runs_start_after_initial_delay_and_keep_the_jittered_interval_from_each_short_runs_start()
{
    let h = Harness::healthy(
        "probeInterval: 10s\ninitialDelay: 30s\nprobeTimeout: 5s\nbackoffJitterFactor: 0.5\n",
    )
    .await;
    // Each run takes 1 s (the shoot answers /version late), less than a fifth of the interval:
    // the next starts its jittered interval after the run's start, so the run's duration does
    // not stretch the period (the reference slides: it would wait from the end, 11-16 s apart).
    h.shoot.lock().delays.push(("/version", secs(1)));
    h.until(secs(600)).await;
    let versions: Vec<Duration> = h.shoot_calls("/version").iter().map(|c| c.0).collect();
    assert_eq!(versions.first(), Some(&secs(30)), "{versions:?}");
    assert!(versions.len() > (600 - 30) / 15, "{versions:?}");
    let gaps = gaps(&versions);
    for gap in &gaps {
        assert!(
            (secs(10)..=secs(15)).contains(gap),
            "gap {gap:?} outside [10 s, 15 s] from the previous start: {versions:?}"
        );
    }
    // Jittered, not a fixed 10 s (with 50 runs, equal draws are out of the question).
    assert!(gaps.iter().any(|g| *g != gaps[0]), "{gaps:?}");
    // Every lease fresh, nothing to restore: no node list, no scaling.
    assert_eq!(h.shoot_calls("/leases").len(), versions.len());
    assert!(h.shoot_calls("/nodes").is_empty());
    h.assert_no_writes();
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_long_run_is_followed_after_the_interval_less_a_fifth_of_it_never_back_to_back() {
    let h = Harness::healthy(
        "probeInterval: 2s\ninitialDelay: 5s\nprobeTimeout: 5s\nbackoffJitterFactor: 0\n",
    )
    .await;
    // The lease list takes 3 s, longer than the interval: a start-anchored schedule would
    // follow each run at once; ours waits the interval less its fifth (2 s - 0.4 s) after the
    // run's end, so runs of one shoot never overlap and never go back to back.
    h.shoot.lock().delays.push(("/leases", secs(3)));
    h.until(secs(40)).await;
    let versions: Vec<Duration> = h.shoot_calls("/version").iter().map(|c| c.0).collect();
    assert_eq!(versions.first(), Some(&secs(5)), "{versions:?}");
    assert!(versions.len() > 5, "{versions:?}");
    for gap in gaps(&versions) {
        assert_eq!(gap, Duration::from_millis(4_600), "{versions:?}");
    }
    h.assert_no_writes();
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_429_spaces_the_next_run_at_least_ten_seconds_after_it() {
    let h = Harness::healthy(
        "probeInterval: 2s\ninitialDelay: 5s\nprobeTimeout: 5s\nbackoffJitterFactor: 0\n",
    )
    .await;
    {
        let mut s = h.shoot.lock();
        // The first run's /version: Retry-After past the probe timeout, so not retried within
        // the call. Then the second run's lease list.
        s.fail_requests.push_back(("/version", 429, Some("30")));
        s.fail_requests.push_back(("/leases", 429, Some("30")));
        // Retried within the call (1 s < probe timeout): the run succeeds, no spacing.
        s.fail_requests.push_back(("/leases", 429, Some("1")));
    }
    h.until(secs(40)).await;
    let versions = h.shoot_calls("/version");
    let leases = h.shoot_calls("/leases");
    // 5 s: 429 → next run 10 s after it, not 2 s. 15 s: lease list 429 → 25 s. 25 s: its
    // lease list 429, retried after 1 s and answered (a 429 that did not end the run): the
    // run took 1 s, more than a fifth of the interval, so the next comes 2 s - 0.4 s after its
    // end (§2.4); the runs after it take no time and keep 2 s from start to start.
    let at_27_6 = Duration::from_millis(27_600);
    let mut expected = calls(&[(5, 429), (15, 200), (25, 200)]);
    expected.push((at_27_6, 200));
    assert_eq!(versions[..4], expected, "{versions:?}");
    let mut expected = calls(&[(15, 429), (25, 429), (26, 200)]);
    expected.push((at_27_6, 200));
    assert_eq!(leases[..4], expected, "{leases:?}");
    for gap in gaps(&versions.iter().map(|c| c.0).collect::<Vec<_>>())[3..].iter() {
        assert_eq!(*gap, secs(2), "{versions:?}");
    }
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_new_grace_period_applies_from_the_next_run_without_a_new_initial_delay() {
    // Leases renewed 60 s ago: fresh under a 120 s grace period, expired under 40 s.
    let h = Harness::start(STEADY, secs(120), [secs(60); 3]).await;
    h.until(secs(45)).await;
    assert_eq!(h.shoot_calls("/version").len(), 2);
    assert!(h.shoot_calls("/nodes").is_empty());
    h.assert_no_writes();
    h.spec.send_replace(settings(GRACE));
    h.until(secs(75)).await;
    let versions: Vec<Duration> = h.shoot_calls("/version").iter().map(|c| c.0).collect();
    // The same schedule: no restart, no second initial delay (and the flow the run at 50 s
    // handed over does not hold the next run back).
    assert_eq!(
        versions,
        [secs(30), secs(40), secs(50), secs(60), secs(70)],
        "{versions:?}"
    );
    // The run at 50 s judged with 40 s: every lease expired, so it scaled down.
    assert_eq!(h.shoot_calls("/nodes")[0].0, secs(50));
    assert_eq!(h.scaling_writes(), scaled_down_at(secs(50)));
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn an_expired_majority_scales_down_once_in_level_order_and_recovery_restores() {
    let h = Harness::steady([EXPIRED, EXPIRED, FRESH], Mode::Normal).await;
    h.until(secs(95)).await;
    // One flow: kcm (level 0), then mcm (level 1) once kcm is ready at 0 (status follows
    // after 1 s). The runs after it find the targets already down.
    assert_eq!(h.scaling_writes(), scaled_down_at(secs(30)));
    assert_eq!((h.replicas("kcm"), h.replicas("mcm")), (json!(0), json!(0)));
    assert!(h.shoot_calls("/version").len() >= 7);
    // The nodes renew their leases.
    h.renew(&["n1", "n2"]);
    h.until(secs(135)).await;
    let writes = h.scaling_writes();
    // The next run (at 100 s: runs keep their schedule, the flow ran beside them) restores
    // them: mcm (up level 0) first, then kcm once mcm is ready; nothing after.
    assert_eq!(
        writes[2..],
        [
            (secs(100), "mcm".into(), json!(2)),
            (secs(101), "kcm".into(), json!(2))
        ],
        "{writes:?}"
    );
    assert_eq!((h.replicas("kcm"), h.replicas("mcm")), (json!(2), json!(2)));
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_scaled_down_shoots_reads_go_at_once_over_http2_and_one_after_the_other_over_http1() {
    for http2 in [true, false] {
        let h = Harness::steady([EXPIRED, EXPIRED, FRESH], Mode::Normal).await;
        {
            let mut shoot = h.shoot.lock();
            shoot.http2 = http2;
            shoot.delays.push(("/version", secs(1)));
            shoot.delays.push(("/leases", secs(1)));
        }
        h.until(secs(90)).await;
        assert_eq!((h.replicas("kcm"), h.replicas("mcm")), (json!(0), json!(0)));
        let versions = h.shoot_calls("/version");
        let leases = h.shoot_calls("/leases");
        let nodes = h.shoot_calls("/nodes");
        assert!(versions.len() >= 3, "{versions:?}");
        assert_eq!(versions.len(), leases.len(), "{versions:?} {leases:?}");
        assert_eq!(leases.len(), nodes.len(), "{leases:?} {nodes:?}");
        // (lease list after /version, node list after the lease list) per run. The first
        // run: one after the other (each answer takes 1 s), as nothing is down yet and its
        // connection's protocol is not known. Once the targets wait to be restored, every run
        // needs its nodes: over HTTP/2 (the last /version said so) all three reads at once;
        // over HTTP/1.1 one after the other (a request at once would open a second
        // connection).
        let offsets: Vec<(Duration, Duration)> = versions
            .iter()
            .zip(&leases)
            .zip(&nodes)
            .map(|((v, l), n)| (l.0 - v.0, n.0 - l.0))
            .collect();
        let later_runs = if http2 {
            (Duration::ZERO, Duration::ZERO)
        } else {
            (secs(1), secs(1))
        };
        // Reads at once only on a client that speaks HTTP/2 only: negotiated, requests sent at
        // once before the connection is up would each open their own.
        let clients = h.shoot.lock().clients.clone();
        let later_clients = if http2 {
            HttpVersion::Http2Only
        } else {
            HttpVersion::Negotiated
        };
        assert_eq!(clients[0], HttpVersion::Negotiated, "{clients:?}");
        assert!(
            clients[1..versions.len()]
                .iter()
                .all(|v| *v == later_clients),
            "http2 {http2}: {clients:?}"
        );
        assert_eq!(offsets[0], (secs(1), secs(1)), "http2 {http2}: {offsets:?}");
        assert!(
            offsets[1..].iter().all(|o| *o == later_runs),
            "http2 {http2}: {offsets:?}"
        );
        // The recovery is seen and restored as ever.
        h.renew(&["n1", "n2"]);
        h.until(secs(140)).await;
        assert_eq!((h.replicas("kcm"), h.replicas("mcm")), (json!(2), json!(2)));
        h.stop().await;
    }
}

#[tokio::test(start_paused = true)]
async fn a_failed_api_server_probe_sent_with_the_lists_ends_the_run_whatever_they_said() {
    let h = Harness::steady([EXPIRED, EXPIRED, FRESH], Mode::Normal).await;
    h.shoot.lock().http2 = true;
    h.until(secs(45)).await;
    assert_eq!(h.scaling_writes(), scaled_down_at(secs(30)));
    // The kubelets are back, but the run at 50 s (its reads at once) gets a 500 for its
    // /version: its lease list, fresh, must not restore anything.
    h.renew(&["n1", "n2"]);
    h.shoot
        .lock()
        .fail_requests
        .push_back(("/version", 500, None));
    h.until(secs(55)).await;
    assert_eq!(h.shoot_calls("/version").last(), Some(&(secs(50), 500)));
    assert_eq!(h.shoot_calls("/leases").last(), Some(&(secs(50), 200)));
    assert_eq!(h.scaling_writes().len(), 2, "{:?}", h.scaling_writes());
    // The next run restores.
    h.until(secs(75)).await;
    assert_eq!(
        h.scaling_writes()[2..],
        [
            (secs(60), "mcm".into(), json!(2)),
            (secs(61), "kcm".into(), json!(2))
        ]
    );
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn runs_keep_their_schedule_while_a_flow_waits_for_the_seed_and_a_recovery_supersedes_it() {
    // A seed busy with a storm: its budget gives one write now and one every 40 s after (a
    // write's wait stays within the target's 30 s call timeout in this test).
    let h = Harness::launch(STEADY, GRACE, [EXPIRED; 3], Mode::Normal, Some((0.025, 1))).await;
    // 30 s: scale down; kcm (level 0) takes the one write at hand, mcm (level 1) waits for the
    // next (70 s). 40 s: the same verdict, the same flow under way: nothing new.
    h.until(secs(45)).await;
    assert_eq!(h.scaling_writes(), [(secs(30), "kcm".into(), json!(0))]);
    // The kubelets renew: the run at 50 s, on schedule, finds the shoot recovered. Its
    // scale-up supersedes the scale-down: mcm's write, still waiting, is never sent; kcm is
    // restored with the next write the budget gives (70 s); mcm, never scaled down, is left
    // alone.
    h.renew(&["n1", "n2", "n3"]);
    h.until(secs(125)).await;
    assert_eq!(
        h.scaling_writes(),
        [
            (secs(30), "kcm".into(), json!(0)),
            (secs(70), "kcm".into(), json!(2))
        ]
    );
    for name in ["kcm", "mcm"] {
        let target = h.seed.object("deployments", NS, name);
        assert_eq!(target["spec"]["replicas"], json!(2), "{target}");
        let annotations = target["metadata"]["annotations"].as_object();
        assert!(annotations.is_none_or(|a| a.is_empty()), "{target}");
    }
    // Every run on schedule (10 s apart) while the flows waited for the seed.
    let versions: Vec<Duration> = h.shoot_calls("/version").iter().map(|c| c.0).collect();
    let expected: Vec<Duration> = (3..=12).map(|k| secs(10 * k)).collect();
    assert_eq!(versions, expected);
    // One decision each way: the runs that found their flow under way decided nothing anew.
    let attempts = |direction: dwd_core::Direction| {
        let labels = crate::metrics::ShootDirectionLabels {
            shoot: NS.into(),
            direction: direction.into(),
        };
        h.metrics.scaling_attempts.get_or_create(&labels).get()
    };
    assert_eq!(attempts(dwd_core::Direction::Down), 1);
    assert_eq!(attempts(dwd_core::Direction::Up), 1);
    h.stop().await;
}

/// Takes the seed budget's one token through the probe's own (rate-limited) seed client, so
/// the next write waits for the refill.
async fn use_up_the_write_budget(h: &Harness) {
    let resource = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("apps", "v1", "Deployment"),
        "deployments",
    );
    Api::<DynamicObject>::namespaced_with(h.ctx.seed.clone(), NS, &resource)
        .get("kcm")
        .await
        .expect("a read that takes the token");
}

#[tokio::test(start_paused = true)]
async fn a_queued_scale_down_of_a_shoot_whose_leases_are_fresh_again_before_its_first_write_writes_nothing()
 {
    // One write every 40 s, the token taken at 25 s: the scale-down decided at 30 s waits
    // for the seed's budget (its first write could go at 65 s).
    let h = Harness::launch(STEADY, GRACE, [EXPIRED; 3], Mode::Normal, Some((0.025, 1))).await;
    h.until(secs(25)).await;
    use_up_the_write_budget(&h).await;
    h.until(secs(35)).await;
    h.assert_no_writes();
    // The kubelets renew before the flow wrote anything: the run at 40 s finds every lease
    // fresh. Nothing waits to be restored, yet its verdict stops the queued scale-down.
    h.renew(&["n1", "n2", "n3"]);
    h.until(secs(125)).await;
    h.assert_no_writes();
    assert_eq!(h.replicas("kcm"), json!(2));
    assert_eq!(h.replicas("mcm"), json!(2));
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_queued_restore_of_a_shoot_whose_leases_expired_again_writes_nothing() {
    // The shoot was scaled down before (marked, at 0, 2 recorded) and its leases are fresh:
    // the run at 30 s decides to restore, and the flow waits for the seed's budget.
    let h = Harness::launch(STEADY, GRACE, [FRESH; 3], Mode::Normal, Some((0.025, 1))).await;
    for name in ["kcm", "mcm"] {
        h.act_on(
            name,
            0,
            json!({MELTDOWN_ANNOTATION: "", REPLICAS_ANNOTATION: "2"}),
        )
        .await;
    }
    let before = h.seed.writes().len();
    h.until(secs(25)).await;
    use_up_the_write_budget(&h).await;
    // The leases expire again before the restore wrote: the run at 40 s decides to scale
    // down. Every target is down already, yet the verdict stops the queued restore, so kcm
    // is not brought back while the kubelets are cut off.
    h.until(secs(35)).await;
    for node in ["n1", "n2", "n3"] {
        h.shoot.insert("leases", lease(node, EXPIRED));
    }
    h.until(secs(125)).await;
    let writes = h.seed.writes();
    assert_eq!(writes.len(), before, "{:?}", &writes[before..]);
    assert_eq!(h.replicas("kcm"), json!(0));
    assert_eq!(h.replicas("mcm"), json!(0));
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_healthy_shoot_whose_running_targets_keep_the_references_records_needs_nothing() {
    let h = Harness::steady([FRESH; 3], Mode::Normal).await;
    // As the reference leaves every target it restored: running, `replicas` recorded.
    for name in ["kcm", "mcm"] {
        h.act_on(name, 2, json!({REPLICAS_ANNOTATION: "2"})).await;
    }
    let before = h.seed.writes().len();
    h.until(secs(95)).await;
    assert!(h.shoot_calls("/version").len() >= 7);
    // Nothing waits to be restored: no node list, no write, no scale-up decided.
    assert!(h.shoot_calls("/nodes").is_empty());
    assert_eq!(h.seed.writes().len(), before, "{:?}", h.seed.writes());
    let labels = crate::metrics::ShootDirectionLabels {
        shoot: NS.into(),
        direction: dwd_core::Direction::Up.into(),
    };
    assert_eq!(h.metrics.scaling_attempts.get_or_create(&labels).get(), 0);
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_failed_run_scales_nothing() {
    let h = Harness::steady([EXPIRED; 3], Mode::Normal).await;
    {
        let mut s = h.shoot.lock();
        // Run 1: the API server probe fails; run 2: the lease list; run 3: the node list.
        s.fail_requests.push_back(("/version", 500, None));
        s.fail_requests.push_back(("/leases", 500, None));
        s.fail_requests.push_back(("/nodes", 500, None));
    }
    h.until(secs(55)).await;
    assert_eq!(
        h.shoot_calls("/version"),
        [(secs(30), 500), (secs(40), 200), (secs(50), 200)]
    );
    // No lease probe after a failed API server probe, no node list after a failed lease list.
    assert_eq!(h.shoot_calls("/leases"), [(secs(40), 500), (secs(50), 200)]);
    assert_eq!(h.shoot_calls("/nodes"), [(secs(50), 500)]);
    h.assert_no_writes();
    // The fourth run gets every answer: the same shoot is scaled down.
    h.until(secs(65)).await;
    assert_eq!(h.scaling_writes(), scaled_down_at(secs(60)));
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn in_shadow_mode_an_outage_is_one_would_scale_down_and_recovery_one_would_scale_up_and_nothing_is_written()
 {
    let h = Harness::steady([EXPIRED, EXPIRED, FRESH], Mode::Shadow).await;
    h.until(secs(95)).await;
    // Seven runs, each deciding "scale down": one would-scale-down, at the first.
    assert!(h.shoot_calls("/version").len() >= 7);
    assert_eq!(h.shadow_counts(), (1, 0, 0, 0));
    // No acting watchdog here: past the window it is ours alone, with our evidence (the
    // targets in the scale-down flow's level order).
    let records = h.shadow().records(10);
    assert_eq!(records.len(), 1, "{records:?}");
    assert_eq!(
        (records[0].action, records[0].verdict),
        ("scale_down", "only_us")
    );
    assert_eq!(
        records[0].ours.as_deref(),
        Some("2/3 node leases expired (0.67 ≥ 0.60); all targets: kcm, mcm")
    );
    // The nodes renew their leases.
    h.renew(&["n1", "n2"]);
    h.until(secs(135)).await;
    assert_eq!(h.shadow_counts(), (1, 1, 0, 0));
    // Not one write of any kind reached the seed: the targets are as they were.
    h.assert_no_writes();
    for name in ["kcm", "mcm"] {
        let object = h.seed.object("deployments", NS, name);
        assert_eq!(object["spec"]["replicas"], json!(2), "{object}");
        assert_eq!(object["metadata"]["annotations"], json!({}), "{object}");
    }
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn in_shadow_mode_a_start_with_targets_already_scaled_down_reports_no_scale_down() {
    let h = Harness::steady([EXPIRED, EXPIRED, FRESH], Mode::ShadowOfMarkedTargets).await;
    h.until(secs(95)).await;
    // The acting watchdog had scaled the shoot down before we looked: neither it nor we
    // scaled down now.
    assert_eq!(h.shadow_counts(), (0, 0, 0, 0));
    // Our would-be state is "scaled down", so the recovery is a would-scale-up.
    h.renew(&["n1", "n2"]);
    h.until(secs(105)).await;
    assert_eq!(h.shadow_counts(), (0, 1, 0, 0));
    h.assert_no_writes();
    h.stop().await;
}

/// The observer reads `ignore-scaling` as the scaler does: `"true"` leaves a target out
/// (the acting watchdog does not scale it), `"false"` does not (it once counted as ignored
/// there: the acting watchdog's scale-down of such a target went unseen).
#[tokio::test(start_paused = true)]
async fn in_shadow_mode_ignore_scaling_is_read_as_the_scaler_reads_it() {
    let h = Harness::steady([FRESH; 3], Mode::Shadow).await;
    h.until(secs(35)).await;
    let marked = |ignore: &str| json!({MELTDOWN_ANNOTATION: "", REPLICAS_ANNOTATION: "2", IGNORE_SCALING_ANNOTATION: ignore});
    h.act_on("mcm", 0, marked("true")).await;
    h.until(secs(36)).await;
    assert_eq!(h.shadow_counts(), (0, 0, 0, 0));
    h.act_on("kcm", 0, marked("false")).await;
    h.until(secs(37)).await;
    assert_eq!(h.shadow_counts(), (0, 0, 1, 0));
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn in_shadow_mode_the_acting_watchdogs_markers_are_its_sightings_and_our_finding_says_why_not()
 {
    let h = Harness::steady([FRESH; 3], Mode::Shadow).await;
    h.until(secs(35)).await;
    assert_eq!(h.shadow_counts(), (0, 0, 0, 0));
    // The acting watchdog scales the healthy shoot down (kcm first, then mcm): one
    // sighting, when the first marker appears.
    let marked = json!({MELTDOWN_ANNOTATION: "", REPLICAS_ANNOTATION: "2"});
    h.act_on("kcm", 0, marked.clone()).await;
    h.until(secs(36)).await;
    h.act_on("mcm", 0, marked).await;
    h.until(secs(40)).await;
    assert_eq!(h.shadow_counts(), (0, 0, 1, 0));
    // And up again: one sighting, when the last marker leaves.
    let cleared = json!({MELTDOWN_ANNOTATION: null, REPLICAS_ANNOTATION: null});
    h.act_on("mcm", 2, cleared.clone()).await;
    h.until(secs(41)).await;
    assert_eq!(h.shadow_counts(), (0, 0, 1, 0));
    h.act_on("kcm", 2, cleared).await;
    h.until(secs(42)).await;
    assert_eq!(h.shadow_counts(), (0, 0, 1, 1));
    // Past the window both are the acting watchdog's alone, each with what it was seen
    // doing and our latest finding.
    h.until(secs(110)).await;
    let records = h.shadow().records(10);
    let seen: Vec<(&str, &str)> = records.iter().map(|r| (r.action, r.verdict)).collect();
    assert_eq!(
        seen,
        [
            ("scale_down", "only_reference"),
            ("scale_up", "only_reference")
        ],
        "{records:?}"
    );
    assert_eq!(
        records[0].reference.as_deref(),
        Some(
            "dependency-watchdog.gardener.cloud/meltdown-protection-active on kcm (replicas 0, recorded 2)"
        )
    );
    assert_eq!(
        records[1].reference.as_deref(),
        Some(
            "dependency-watchdog.gardener.cloud/meltdown-protection-active on no target; replicas kcm 2, mcm 2"
        )
    );
    assert_eq!(
        records[0].our_latest_finding.as_deref(),
        Some("all 3 node leases fresh: no scaling")
    );
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn in_shadow_mode_a_failed_run_is_our_latest_finding() {
    let h = Harness::steady([FRESH; 3], Mode::Shadow).await;
    // The shoot's apiserver answers nothing but 500 from now on.
    h.shoot.outage(Outage::Fail(500), secs(600));
    h.until(secs(31)).await;
    h.act_on("kcm", 0, json!({MELTDOWN_ANNOTATION: ""})).await;
    h.until(secs(95)).await;
    let records = h.shadow().records(10);
    assert_eq!(records.len(), 1, "{records:?}");
    assert_eq!(records[0].verdict, "only_reference");
    let finding = records[0].our_latest_finding.as_deref().unwrap_or_default();
    assert!(
        finding.starts_with("probe failed: API server probe failed: ")
            && finding.ends_with("; no scaling this run"),
        "{finding}"
    );
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn in_shadow_mode_nodes_are_listed_while_we_would_have_the_shoot_scaled_down() {
    // Started when the acting watchdog has the shoot scaled down though every lease is fresh:
    // our would-be state is "scaled down", so the first run lists the nodes (no streak, no
    // disrupted zone, and the real targets are not what decides) and would scale up.
    let h = Harness::steady([FRESH; 3], Mode::ShadowOfMarkedTargets).await;
    h.until(secs(35)).await;
    assert_eq!(h.shoot_calls("/nodes").first().map(|c| c.0), Some(secs(30)));
    assert_eq!(h.shadow_counts(), (0, 1, 0, 0));
    // From then on we would have it as it should be: all leases fresh, no node list.
    h.until(secs(65)).await;
    assert_eq!(h.shoot_calls("/nodes").len(), 1);
    assert_eq!(h.shadow_counts(), (0, 1, 0, 0));
    h.assert_no_writes();
    h.stop().await;
}

#[path = "interleavings_tests.rs"]
mod interleavings;

/// A pool of room for `runs` runs, the prompt limit of [`STEADY`]'s 5 s probe timeout.
fn memory_for(runs: u64) -> (Arc<MemoryBudget>, crate::memory_budget::BudgetMetrics) {
    use crate::memory_budget::{BudgetMetrics, RUN_RESERVE, prompt_limit};
    let metrics = BudgetMetrics::default();
    let memory = MemoryBudget::new(
        runs * RUN_RESERVE,
        prompt_limit(secs(5)),
        Arc::default(),
        metrics.clone(),
    );
    (memory, metrics)
}

/// Another shoot's run that holds room until it is ended for room (or the test drops it).
fn other_run(grant: crate::memory_budget::MemoryGrant) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        grant.ended_for_room().await;
        drop(grant);
    })
}

/// Runs of `NS` counted with `result`.
fn runs_with(h: &Harness, result: RunResult) -> u64 {
    h.metrics
        .probe_runs
        .get_or_create(&RunLabels { result })
        .get()
}

#[tokio::test(start_paused = true)]
async fn a_run_in_flight_past_its_prompt_limit_is_ended_for_a_waiting_run_which_scales_down() {
    use crate::memory_budget::{CauseLabels, Claim, NotMadeCause};
    // Room for one run, taken at 0 s by another shoot's run that never ends on its own (its
    // apiserver hangs).
    let (memory, metrics) = memory_for(1);
    let hanging = other_run(
        memory
            .admit(Claim::default(), Duration::ZERO)
            .await
            .expect("room for one"),
    );
    let h = Harness::all_expired_in(memory.clone()).await;
    // The shoot's first run (30 s) waits: the hanging run, past its 2.5 s prompt limit, is
    // ended for it at once, and the run probes and hands the scale-down over.
    h.until(secs(35)).await;
    assert!(hanging.is_finished());
    assert_eq!(h.shoot_calls("/version"), calls(&[(30, 200)]));
    assert_eq!(h.scaling_writes(), scaled_down_at(secs(30)));
    let ended = metrics
        .not_made
        .get_or_create(&CauseLabels {
            cause: NotMadeCause::EndedForRoom,
        })
        .get();
    assert_eq!(ended, 1);
    assert_eq!(memory.held(), 0, "every run's hold returned");
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_run_the_memory_budget_has_no_room_for_sends_nothing_and_scales_nothing() {
    use crate::memory_budget::Claim;
    // Room for one run, held until 58 s by another shoot's run with a decision pending (it
    // is not ended for a run of a lower level).
    let (memory, _) = memory_for(1);
    let held = memory
        .admit(
            Claim {
                pending: true,
                ..Claim::default()
            },
            Duration::ZERO,
        )
        .await
        .expect("room for one");
    let h = Harness::all_expired_in(memory.clone()).await;
    h.until(secs(58)).await;
    // Every lease expired, but no run got room within its 5 s probe timeout (the runs of
    // 30 and 43 s, refused at 35 and 48 s: each took 5 s, so the next comes 10 s - 2 s after
    // its end, §2.4; the one of 56 s still waiting): nothing sent to the shoot, nothing
    // scaled; each counted as the prober's (not made for room), not as the shoot's failure,
    // and the shoot is shown waiting for room.
    assert!(h.shoot_calls("/version").is_empty());
    h.assert_no_writes();
    assert_eq!(
        runs_with(&h, RunResult::NotMadeForRoom),
        2,
        "runs at 30 and 43 s refused (56 s still waiting)"
    );
    assert_eq!(runs_with(&h, RunResult::ApiServerProbeFailed), 0);
    let shoot = crate::metrics::ShootLabels { shoot: NS.into() };
    assert_eq!(
        h.metrics
            .api_server_probe_failures
            .get_or_create(&shoot)
            .get(),
        0
    );
    assert_eq!(
        h.metrics.shoot_waiting_for_room.get_or_create(&shoot).get(),
        1
    );
    // The other run ends: the waiting run gets the room at once (a run refused for room
    // leaves its shoot's place in line as it was), probes and hands the scale-down over.
    drop(held);
    h.until(secs(60)).await;
    assert_eq!(
        h.shoot_calls("/version").first().map(|c| c.0),
        Some(secs(58))
    );
    h.until(secs(90)).await;
    assert!(!h.scaling_writes().is_empty(), "{:?}", h.scaling_writes());
    assert_eq!(memory.held(), 0, "every run's hold returned");
    assert_eq!(
        h.metrics.shoot_waiting_for_room.get_or_create(&shoot).get(),
        0
    );
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn without_a_probe_timeout_a_hanging_run_still_ends_at_its_run_limit() {
    // `probeTimeout: 0`: no call deadline (as the reference), and an apiserver that never
    // answers `/version`.
    let config =
        "probeInterval: 10s\ninitialDelay: 30s\nprobeTimeout: 0s\nbackoffJitterFactor: 0\n";
    let h = Harness::start(config, GRACE, [EXPIRED; 3]).await;
    h.shoot.lock().delays.push(("/version", secs(1_000_000)));
    let limit = super::RUN_LIMIT_WITHOUT_TIMEOUT;
    // The run of 30 s hangs (the fake records a request when it answers it: never); from then
    // on the apiserver answers.
    h.until(secs(31)).await;
    h.shoot.lock().delays.clear();
    // It is ended at its run limit, and the next run follows 10 s - 2 s after its end (§2.4).
    h.until(secs(30) + limit + secs(9)).await;
    let at: Vec<Duration> = h.shoot_calls("/version").iter().map(|c| c.0).collect();
    assert_eq!(at, [secs(30) + limit + secs(8)]);
    assert_eq!(
        runs_with(&h, RunResult::ApiServerProbeFailed),
        1,
        "the hanging run ended as a failed API-server probe"
    );
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_shoot_answer_read_late_because_the_prober_could_not_run_is_not_a_failure() {
    // `probeTimeout: 4s`, and a `/version` answered after 5 s of wall time, 2 s of which this
    // process could not run (the lag clock): in shoot time the answer came in time.
    let config =
        "probeInterval: 10s\ninitialDelay: 30s\nprobeTimeout: 4s\nbackoffJitterFactor: 0\n";
    let h = Harness::start(config, GRACE, [FRESH; 3]).await;
    h.shoot.lock().delays.push(("/version", secs(5)));
    h.until(secs(31)).await;
    h.ctx.memory.lag_clock().add(secs(2));
    h.until(secs(36)).await;
    assert_eq!(
        runs_with(&h, RunResult::ApiServerProbeFailed),
        0,
        "an answer within probeTimeout of shoot time fails nothing"
    );
    assert_eq!(
        runs_with(&h, RunResult::ScaleUp),
        1,
        "the run found every lease fresh"
    );
    h.stop().await;
}

/// The shoot's decision records, parsed, oldest first.
fn decision_records(h: &Harness) -> Vec<dwd_core::record::DecisionRecord> {
    h.ctx
        .decisions
        .records(NS)
        .iter()
        .map(|text| serde_json::from_str(text).expect("a record"))
        .collect()
}

#[tokio::test(start_paused = true)]
async fn an_outage_and_its_recovery_leave_one_record_per_decision_and_flow_and_replay_as_decided() {
    use dwd_core::record::{Because, FlowOutcome, RecordBody, StepKind, TakenRecord};
    let h = Harness::steady([EXPIRED, EXPIRED, FRESH], Mode::Normal).await;
    h.until(secs(95)).await;
    let records = decision_records(&h);
    // The scale-down's run, then its flow's outcome; the runs after it (targets already
    // down) decide nothing new and keep no record.
    assert_eq!(records.len(), 2, "{records:#?}");
    let (run, flow) = (&records[0], &records[1]);
    assert_eq!(run.recorded_because, [Because::VerdictToScale]);
    let RecordBody::Run(r) = &run.body else {
        panic!("a run first: {run:?}")
    };
    let finding = r.finding.as_ref().expect("a finding");
    assert_eq!((finding.candidates, finding.expired), (3, 2));
    assert_eq!(finding.expired_leases.len(), 2);
    assert!(r.verdict.as_ref().is_some_and(|v| v.acts));
    let steps: Vec<_> = r
        .intent
        .iter()
        .flat_map(|i| &i.levels)
        .flat_map(|l| &l.targets)
        .map(|t| (t.target.as_str(), t.step, t.replicas))
        .collect();
    assert_eq!(
        steps,
        [
            ("Deployment/kcm", StepKind::ScaleDown, Some(2)),
            ("Deployment/mcm", StepKind::ScaleDown, Some(2))
        ]
    );
    assert!(
        matches!(&r.taken, Some(TakenRecord::Queued { targets, superseding: false }) if targets.len() == 2)
    );
    let RecordBody::Flow(f) = &flow.body else {
        panic!("the flow's outcome second: {flow:?}")
    };
    assert_eq!(f.decision, run.id, "the outcome leads back to its decision");
    assert_eq!(f.outcome, FlowOutcome::Finished);
    let written: Vec<_> = f
        .writes
        .iter()
        .map(|w| (w.target.as_str(), w.from, w.to, w.recorded_replicas))
        .collect();
    assert_eq!(
        written,
        [
            ("kcm", Some(2), Some(0), Some(2)),
            ("mcm", Some(2), Some(0), Some(2))
        ]
    );
    // Replayed as recorded: the decision the run made.
    let replayed = crate::explain::replay::replayed(run, None).expect("replay");
    assert_eq!(replayed.decision, "scale down (all targets)");
    let text = replayed.to_string();
    assert!(text.contains("level 0  Deployment/kcm"), "{text}");
    // Recovery: the restore's run and its flow.
    h.renew(&["n1", "n2"]);
    h.until(secs(135)).await;
    let records = decision_records(&h);
    assert_eq!(records.len(), 4, "{records:#?}");
    assert_eq!(records[2].recorded_because, [Because::VerdictToScale]);
    assert!(matches!(&records[3].body, RecordBody::Flow(f) if f.decision == records[2].id));
    h.stop().await;
}
