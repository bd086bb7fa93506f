//! The weeder's loops on a paused clock against the in-memory seed ([`crate::fake_seed`]):
//! `weeder::run` as the runtime starts it, the seed's EndpointSlices and Pods as the tests
//! set them, every request the weeder sends recorded. One test per rule of docs/behaviour.md
//! §3 (and shadow mode's weeder, §5), each in milliseconds.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use dwd_core::shadow::{ShadowAction, Side};
use dwd_core::{DependantSelectors, PodSelector, WeederConfig};
use serde_json::{Value, json};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{WeederStart, Weeders, run};
use crate::fake_seed::FakeSeed;
use crate::metrics::{DeletionFailure, DeletionFailureLabels, Metrics, ServiceLabels};
use crate::observe::events::{Component, PodRef};
use crate::observe::health::Health;
use crate::shadow::Shadow;

/// The shoot namespace the tests weed.
const NS: &str = "shoot--p--a";
/// The service whose slices start weeders, and its dependants' `role` label.
const ETCD: &str = "etcd-main-client";
const APISERVER: &str = "apiserver";
/// A second service, with dependants of `role=controller-manager`.
const KAPI: &str = "kube-apiserver";
const KCM: &str = "controller-manager";
/// `watchDuration` of the tests' weeders.
const WATCH: Duration = Duration::from_secs(60);

/// The state of a pod's one container.
#[derive(Clone, Copy)]
enum Container {
    Running,
    CrashLooping,
    /// Its init container crash-loops.
    InitCrashLooping,
    /// Waiting for another reason.
    Creating,
}

/// Pod `kapi-1` (uid `uid-kapi-1`) of [`NS`], a kube-apiserver crash-looping.
fn crashing_kapi() -> Value {
    pod(
        NS,
        "kapi-1",
        "uid-kapi-1",
        APISERVER,
        Container::CrashLooping,
    )
}

/// A running `weeder::run` on a fake seed, and what the tests need to look at it.
struct World {
    seed: FakeSeed,
    weeders: Arc<Weeders>,
    health: Arc<Health>,
    metrics: Arc<Metrics>,
    shadow: Option<Arc<Shadow>>,
    shutdown: CancellationToken,
    task: JoinHandle<crate::Result<()>>,
    t0: Instant,
}

fn selector(role: &str) -> PodSelector {
    PodSelector::new(
        BTreeMap::from([("role".to_string(), role.to_string())]),
        Vec::new(),
    )
    .expect("valid selector")
}

fn config(watch_duration: Duration, services: &[(&str, &[&str])]) -> WeederConfig {
    WeederConfig {
        watch_duration,
        services_and_dependant_selectors: services
            .iter()
            .map(|(service, roles)| {
                let pod_selectors = roles.iter().map(|r| selector(r)).collect();
                ((*service).to_string(), DependantSelectors { pod_selectors })
            })
            .collect(),
    }
}

/// An EndpointSlice `namespace/name` of `service` with one endpoint per entry of `ready`.
fn slice(namespace: &str, name: &str, service: &str, ready: &[bool]) -> Value {
    let endpoints: Vec<Value> = ready
        .iter()
        .enumerate()
        .map(|(i, r)| json!({"addresses": [format!("10.0.0.{i}")], "conditions": {"ready": r}}))
        .collect();
    json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": name, "namespace": namespace, "uid": format!("uid-{name}"),
                     "labels": {"kubernetes.io/service-name": service}},
        "addressType": "IPv4", "endpoints": endpoints})
}

/// Pod `namespace/name` (UID `uid`) with label `role` and one container in `state`.
fn pod(namespace: &str, name: &str, uid: &str, role: &str, state: Container) -> Value {
    let status = |name: &str, reason: Option<&str>| {
        let state = match reason {
            Some(reason) => json!({"waiting": {"reason": reason}}),
            None => json!({"running": {}}),
        };
        json!({"name": name, "ready": reason.is_none(), "restartCount": 3, "image": "img",
               "imageID": "", "state": state})
    };
    let (init, main) = match state {
        Container::Running => (vec![], vec![status("main", None)]),
        Container::CrashLooping => (vec![], vec![status("main", Some("CrashLoopBackOff"))]),
        Container::InitCrashLooping => (
            vec![status("wait", Some("CrashLoopBackOff"))],
            vec![status("main", Some("PodInitializing"))],
        ),
        Container::Creating => (vec![], vec![status("main", Some("ContainerCreating"))]),
    };
    json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "uid": uid, "labels": {"role": role}},
        "status": {"initContainerStatuses": init, "containerStatuses": main}})
}

impl World {
    /// Starts an acting weeder of `services` (service → dependants' roles).
    async fn start(watch_duration: Duration, services: &[(&str, &[&str])]) -> World {
        Self::start_on(FakeSeed::default(), watch_duration, services, None).await
    }

    /// Starts a shadow weeder (`--shadow`, window `watchDuration`) of `services`.
    async fn start_shadow(services: &[(&str, &[&str])]) -> World {
        let shadow = Shadow::new(Component::Weeder, WATCH);
        Self::start_on(FakeSeed::default(), WATCH, services, Some(shadow)).await
    }

    /// Starts `weeder::run` of `services` on `seed` and waits until the slices are listed.
    async fn start_on(
        seed: FakeSeed,
        watch_duration: Duration,
        services: &[(&str, &[&str])],
        shadow: Option<Arc<Shadow>>,
    ) -> World {
        Self::start_with(seed, config(watch_duration, services), shadow).await
    }

    /// Starts `weeder::run` of `config` on `seed` and waits until the slices are listed.
    async fn start_with(
        seed: FakeSeed,
        config: WeederConfig,
        shadow: Option<Arc<Shadow>>,
    ) -> World {
        let world = Self::spawn(seed, config, shadow);
        world
            .eventually("the slices are listed", |w| w.health.is_ready())
            .await;
        world
    }

    /// Spawns `weeder::run` of `config` on `seed`.
    fn spawn(seed: FakeSeed, config: WeederConfig, shadow: Option<Arc<Shadow>>) -> World {
        let metrics = Arc::new(Metrics::default());
        let shutdown = CancellationToken::new();
        let weeders = Weeders::new(metrics.clone(), shutdown.child_token());
        let health = Arc::new(Health::default());
        let own_pod = PodRef {
            namespace: "garden".into(),
            name: "dependency-watchdog-weeder-0".into(),
        };
        let start = WeederStart {
            config,
            seed: seed.client(),
            weeders: weeders.clone(),
            health: health.clone(),
            own_pod,
            shadow: shadow.clone(),
        };
        let task = tokio::spawn(run(start, shutdown.clone()));
        World {
            seed,
            weeders,
            health,
            metrics,
            shadow,
            shutdown,
            task,
            t0: Instant::now(),
        }
    }

    /// Waits (on the paused clock, at most 10 minutes) until `done` holds.
    async fn eventually(&self, what: &str, done: impl Fn(&World) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(600);
        while !done(self) {
            assert!(Instant::now() < deadline, "not within 10 min: {what}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Lets the weeder run for `length` of paused time.
    async fn pass(&self, length: Duration) {
        tokio::time::sleep(length).await;
    }

    /// Sets slice `name` of `service` in [`NS`] (created or changed).
    fn slice(&self, name: &str, service: &str, ready: &[bool]) {
        self.seed
            .apply("endpointslices", slice(NS, name, service, ready));
    }

    /// Sets pod `name` in `namespace` (UID `uid-{name}`).
    fn pod_in(&self, namespace: &str, name: &str, role: &str, state: Container) {
        let uid = format!("uid-{name}");
        self.seed
            .apply("pods", pod(namespace, name, &uid, role, state));
    }

    /// Sets pod `name` in [`NS`].
    fn pod(&self, name: &str, role: &str, state: Container) {
        self.pod_in(NS, name, role, state);
    }

    /// Waits until pod `name` of [`NS`] is gone from the seed.
    async fn until_gone(&self, name: &str) {
        let what = format!("{name} deleted");
        self.eventually(&what, |w| !w.has_pod(name)).await;
    }

    /// [`World::start_on`] `seed` with one service, etcd, whose dependants are the
    /// kube-apiservers, weeded for [`WATCH`], in normal mode.
    async fn etcd_on(seed: FakeSeed) -> World {
        World::start_on(seed, WATCH, &[(ETCD, &[APISERVER])], None).await
    }

    /// Requests to paths containing `part` answered `status`.
    fn answered(&self, part: &str, status: u16) -> usize {
        let calls = self.seed.calls_to(part);
        calls.iter().filter(|c| c.status == status).count()
    }

    /// Whether pod `name` of [`NS`] is still stored.
    fn has_pod(&self, name: &str) -> bool {
        let key = ("pods".to_owned(), NS.to_owned(), name.to_owned());
        self.seed.lock().objects.contains_key(&key)
    }

    /// The DELETEs the seed received: (after the start, path, uid precondition, status).
    fn deletes(&self) -> Vec<(Duration, String, String, u16)> {
        self.seed
            .writes()
            .into_iter()
            .filter(|c| c.method == http::Method::DELETE)
            .map(|c| {
                let uid = c.body["preconditions"]["uid"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned();
                (c.at - self.t0, c.path, uid, c.status)
            })
            .collect()
    }

    /// The names of the pods a DELETE was answered 200 for.
    fn deleted(&self) -> Vec<String> {
        self.deletes()
            .into_iter()
            .filter(|(_, _, _, status)| *status == 200)
            .map(|(_, path, _, _)| path.rsplit('/').next().unwrap_or_default().to_owned())
            .collect()
    }

    /// `dwd_weeder_pods_deleted_total{service}`.
    fn deleted_count(&self, service: &str) -> i64 {
        let labels = ServiceLabels {
            service: service.into(),
        };
        i64::try_from(self.metrics.pods_deleted.get_or_create(&labels).get()).unwrap_or(-1)
    }

    /// `dwd_weeder_pod_deletion_failures_total{service=ETCD, reason}`.
    fn failures(&self, reason: DeletionFailure) -> u64 {
        let labels = DeletionFailureLabels {
            service: ETCD.into(),
            reason,
        };
        self.metrics
            .pod_deletion_failures
            .get_or_create(&labels)
            .get()
    }

    /// Holds each answer to a request whose path contains `path` (`/pods/{name}`: the pod's
    /// DELETEs) back by `delay`.
    fn delay_answers(&self, path: &'static str, delay: Duration) {
        self.seed.lock().delays.push((path, delay));
    }

    /// Waits until one weeder runs.
    async fn weeder_runs(&self) {
        self.eventually("a weeder runs", |w| w.weeders.active() == 1)
            .await;
    }

    /// Waits until a pod watch is open.
    async fn pod_watch_opened(&self) {
        self.eventually("a pod watch", |w| {
            w.seed
                .calls_to("/pods")
                .iter()
                .any(|c| c.query.contains("watch=true"))
        })
        .await;
    }

    /// How often the shadow book counted `side` deleting a pod.
    fn shadow_count(&self, side: Side) -> u64 {
        self.shadow
            .as_ref()
            .expect("a shadow weeder")
            .count(side, ShadowAction::DeletePod)
    }

    /// Stops the weeder and waits for `run` to return.
    async fn stop(self) {
        self.shutdown.cancel();
        let ended = tokio::time::timeout(Duration::from_secs(60), self.task).await;
        assert!(
            matches!(ended, Ok(Ok(Ok(())))),
            "run did not end cleanly: {ended:?}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_slice_ready_at_start_weeds_the_crashlooping_dependants_of_its_namespace() {
    let seed = FakeSeed::default();
    seed.apply("endpointslices", slice(NS, "etcd-abc", ETCD, &[true]));
    for (ns, name, role, state) in [
        (NS, "kapi-1", APISERVER, Container::CrashLooping),
        (NS, "kapi-2", APISERVER, Container::Running),
        (NS, "kapi-3", APISERVER, Container::Creating),
        (NS, "kcm-1", KCM, Container::CrashLooping),
        ("shoot--p--b", "kapi-4", APISERVER, Container::CrashLooping),
    ] {
        seed.apply("pods", pod(ns, name, &format!("uid-{name}"), role, state));
    }
    let w = World::etcd_on(seed).await;
    w.until_gone("kapi-1").await;
    w.pass(Duration::from_secs(5)).await;
    let deletes = w.deletes();
    assert_eq!(deletes.len(), 1, "{deletes:?}");
    let (_, path, uid, status) = &deletes[0];
    assert_eq!(path, &format!("/api/v1/namespaces/{NS}/pods/kapi-1"));
    assert_eq!((uid.as_str(), *status), ("uid-kapi-1", 200));
    assert_eq!(w.deleted_count(ETCD), 1);
    assert!(w.has_pod("kapi-2") && w.has_pod("kapi-3") && w.has_pod("kcm-1"));
    assert_eq!(w.weeders.keys(), [format!("{NS}/etcd-abc")]);
    w.stop().await;
}

#[tokio::test(start_paused = true)]
async fn slices_not_ready_or_empty_start_nothing_until_one_turns_ready() {
    let w = World::start(WATCH, &[(ETCD, &[APISERVER])]).await;
    w.pod("kapi-1", APISERVER, Container::CrashLooping);
    w.slice("etcd-abc", ETCD, &[]);
    w.slice("etcd-def", ETCD, &[true, false]);
    w.pass(Duration::from_secs(10)).await;
    assert_eq!(w.weeders.started_total(), 0);
    assert!(w.deletes().is_empty());
    w.slice("etcd-def", ETCD, &[true, true]);
    w.until_gone("kapi-1").await;
    assert_eq!(w.weeders.keys(), [format!("{NS}/etcd-def")]);
    // A slice of a service not configured starts nothing, ready or not.
    w.slice("other-abc", "other", &[true]);
    w.pass(Duration::from_secs(5)).await;
    assert_eq!(w.weeders.started_total(), 1);
    w.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_pod_that_enters_crashloopbackoff_while_watched_is_deleted_and_one_that_left_it_is_not() {
    let w = World::start(WATCH, &[(ETCD, &[APISERVER])]).await;
    // Crash-looped while etcd was down, recovered before it came back: nothing to weed.
    w.pod("kapi-1", APISERVER, Container::CrashLooping);
    w.pod("kapi-1", APISERVER, Container::Running);
    w.pod("kapi-2", APISERVER, Container::Running);
    w.slice("etcd-abc", ETCD, &[true]);
    w.pass(Duration::from_secs(10)).await;
    assert!(w.deletes().is_empty());
    // Crash-loops later while the weeder watches.
    w.pod("kapi-2", APISERVER, Container::CrashLooping);
    w.eventually("kapi-2 deleted", |w| !w.has_pod("kapi-2"))
        .await;
    assert_eq!(w.deleted(), ["kapi-2"]);
    assert!(w.has_pod("kapi-1"));
    w.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_crashlooping_init_container_is_weeded_and_a_terminating_pod_left_alone() {
    let w = World::start(WATCH, &[(ETCD, &[APISERVER])]).await;
    w.pod("kapi-init", APISERVER, Container::InitCrashLooping);
    let mut terminating = pod(
        NS,
        "kapi-old",
        "uid-kapi-old",
        APISERVER,
        Container::CrashLooping,
    );
    terminating["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
    w.seed.apply("pods", terminating);
    w.slice("etcd-abc", ETCD, &[true]);
    w.eventually("kapi-init deleted", |w| !w.has_pod("kapi-init"))
        .await;
    w.pass(Duration::from_secs(5)).await;
    assert_eq!(w.deleted(), ["kapi-init"]);
    assert!(w.has_pod("kapi-old"));
    w.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_weeder_ends_after_its_watch_duration_and_deletes_nothing_after() {
    let w = World::start(WATCH, &[(ETCD, &[APISERVER])]).await;
    w.slice("etcd-abc", ETCD, &[true]);
    w.weeder_runs().await;
    let started = Instant::now();
    w.pass(WATCH - Duration::from_secs(1)).await;
    w.pod("kapi-1", APISERVER, Container::CrashLooping);
    w.until_gone("kapi-1").await;
    w.eventually("the weeder ended", |w| w.weeders.active() == 0)
        .await;
    let lived = started.elapsed();
    assert!(
        (WATCH..WATCH + Duration::from_millis(100)).contains(&lived),
        "{lived:?}"
    );
    w.eventually("its task is gone", |w| w.weeders.live_tasks() == 0)
        .await;
    w.pod("kapi-2", APISERVER, Container::CrashLooping);
    w.pass(Duration::from_secs(30)).await;
    assert_eq!(w.deleted(), ["kapi-1"]);
    assert!(w.has_pod("kapi-2"));
    w.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_watch_duration_of_zero_ends_each_weeder_at_once() {
    let w = World::start(Duration::ZERO, &[(ETCD, &[APISERVER])]).await;
    w.pod("kapi-1", APISERVER, Container::CrashLooping);
    w.slice("etcd-abc", ETCD, &[true]);
    w.eventually("a weeder started", |w| w.weeders.started_total() == 1)
        .await;
    w.eventually("and ended", |w| w.weeders.live_tasks() == 0)
        .await;
    w.pass(Duration::from_secs(10)).await;
    assert_eq!(w.weeders.active(), 0);
    assert!(w.has_pod("kapi-1"));
    w.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_flapping_slice_replaces_its_weeder_which_gets_a_fresh_watch_duration() {
    let w = World::start(WATCH, &[(ETCD, &[APISERVER])]).await;
    w.slice("etcd-abc", ETCD, &[true]);
    w.weeder_runs().await;
    let first = Instant::now();
    w.pass(Duration::from_secs(40)).await;
    w.slice("etcd-abc", ETCD, &[false]);
    w.pass(Duration::from_secs(1)).await;
    // Not ready, the slice keeps its weeder; ready again, it gets a new one.
    assert_eq!(w.weeders.started_total(), 1);
    w.slice("etcd-abc", ETCD, &[true]);
    w.eventually("a second weeder", |w| w.weeders.started_total() == 2)
        .await;
    w.eventually("the first wound down", |w| w.weeders.live_tasks() == 1)
        .await;
    assert_eq!(w.weeders.active(), 1);
    // Past the first weeder's end, the second one still weeds.
    tokio::time::sleep_until(first + WATCH + Duration::from_secs(10)).await;
    w.pod("kapi-1", APISERVER, Container::CrashLooping);
    w.until_gone("kapi-1").await;
    w.eventually("the second weeder ended", |w| w.weeders.active() == 0)
        .await;
    let lived = first.elapsed();
    assert!(
        lived >= Duration::from_secs(41) + WATCH,
        "ended {lived:?} after the first start"
    );
    // A ready slice that changes while ready starts nothing.
    w.slice("etcd-abc", ETCD, &[true, true]);
    w.pass(Duration::from_secs(5)).await;
    assert_eq!(w.weeders.started_total(), 2);
    w.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_deleted_slice_starts_nothing_and_one_created_again_ready_starts_a_weeder() {
    let w = World::start(WATCH, &[(ETCD, &[APISERVER])]).await;
    w.slice("etcd-abc", ETCD, &[true]);
    w.eventually("a weeder started", |w| w.weeders.started_total() == 1)
        .await;
    w.seed.delete("endpointslices", NS, "etcd-abc");
    w.pass(Duration::from_secs(5)).await;
    assert_eq!(w.weeders.started_total(), 1);
    w.slice("etcd-abc", ETCD, &[true]);
    w.eventually("a second weeder", |w| w.weeders.started_total() == 2)
        .await;
    w.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_relist_of_the_slices_restarts_no_weeder_but_starts_one_for_a_slice_turned_ready() {
    let w = World::start(WATCH, &[(ETCD, &[APISERVER])]).await;
    w.slice("etcd-abc", ETCD, &[true]);
    w.slice("etcd-def", ETCD, &[false]);
    w.eventually("a weeder started", |w| w.weeders.started_total() == 1)
        .await;
    // The watch loses its place; meanwhile etcd-def turned ready, unseen.
    w.seed
        .insert("endpointslices", slice(NS, "etcd-def", ETCD, &[true]));
    w.seed.expire_watches("endpointslices");
    w.eventually("a weeder for etcd-def", |w| w.weeders.started_total() == 2)
        .await;
    w.pass(Duration::from_secs(5)).await;
    assert_eq!(
        w.weeders.keys(),
        [format!("{NS}/etcd-abc"), format!("{NS}/etcd-def")]
    );
    assert_eq!(w.weeders.started_total(), 2);
    w.stop().await;
}

#[tokio::test(start_paused = true)]
async fn only_dependants_in_the_slices_namespace_matching_a_selector_are_touched() {
    let w = World::start(WATCH, &[(ETCD, &[APISERVER]), (KAPI, &[KCM])]).await;
    w.pod("kapi-1", APISERVER, Container::CrashLooping);
    w.pod("kcm-1", KCM, Container::CrashLooping);
    w.pod_in("shoot--p--b", "kapi-2", APISERVER, Container::CrashLooping);
    w.slice("etcd-abc", ETCD, &[true]);
    w.until_gone("kapi-1").await;
    w.pass(Duration::from_secs(5)).await;
    assert_eq!(w.deleted(), ["kapi-1"]);
    assert_eq!(w.deleted_count(ETCD), 1);
    // The other service's slice weeds its own dependants.
    w.slice("kapi-abc", KAPI, &[true]);
    w.eventually("kcm-1 deleted", |w| !w.has_pod("kcm-1")).await;
    assert_eq!(w.deleted_count(KAPI), 1);
    let key = (
        "pods".to_owned(),
        "shoot--p--b".to_owned(),
        "kapi-2".to_owned(),
    );
    assert!(w.seed.lock().objects.contains_key(&key));
    // Every pod request stayed in the slices' namespace.
    let other = w.seed.calls_to("/pods");
    assert!(
        other
            .iter()
            .all(|c| c.path.starts_with(&format!("/api/v1/namespaces/{NS}/pods"))),
        "{:?}",
        other.iter().map(|c| &c.path).collect::<Vec<_>>()
    );
    w.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_deletion_that_failed_its_three_attempts_is_tried_again_after_a_doubling_pause() {
    let w = World::start(WATCH, &[(ETCD, &[APISERVER])]).await;
    // Two rounds of three failed attempts; the third round's first attempt succeeds.
    w.seed.lock().fail_writes.extend([(503, None); 6]);
    w.pod("kapi-1", APISERVER, Container::CrashLooping);
    w.slice("etcd-abc", ETCD, &[true]);
    w.until_gone("kapi-1").await;
    let deletes = w.deletes();
    let statuses: Vec<u16> = deletes.iter().map(|d| d.3).collect();
    assert_eq!(statuses, [503, 503, 503, 503, 503, 503, 200]);
    assert!(deletes.iter().all(|d| d.2 == "uid-kapi-1"));
    let gaps: Vec<Duration> = deletes.windows(2).map(|p| p[1].0 - p[0].0).collect();
    let ms = Duration::from_millis;
    // 100 ms, 200 ms between attempts; 1 s, then 2 s, before a new list tries again.
    for (gap, least) in gaps
        .iter()
        .zip([ms(100), ms(200), ms(1000), ms(100), ms(200), ms(2000)])
    {
        assert!(*gap >= least && *gap < least + ms(50), "gaps {gaps:?}");
    }
    assert_eq!(w.deleted_count(ETCD), 1);
    let failures = w.failures(DeletionFailure::ServerError);
    assert_eq!(failures, 2);
    w.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_deletion_the_seed_never_answers_gives_up_after_its_timeouts() {
    let w = World::start(WATCH, &[(ETCD, &[APISERVER])]).await;
    w.slice("etcd-abc", ETCD, &[true]);
    w.pod_watch_opened().await;
    // From now the seed answers nothing for 31 s; the open watch still reports.
    w.seed
        .outage(crate::fake_seed::Outage::Hang, Duration::from_secs(31));
    w.pod("kapi-1", APISERVER, Container::CrashLooping);
    w.until_gone("kapi-1").await;
    let deletes = w.deletes();
    let statuses: Vec<u16> = deletes.iter().map(|d| d.3).collect();
    // Three attempts without an answer (status 0), then one after the new list.
    assert_eq!(statuses, [0, 0, 0, 200]);
    let since_first: Vec<Duration> = deletes.iter().map(|d| d.0 - deletes[0].0).collect();
    let ms = Duration::from_millis;
    // 10 s each, with pauses of 100 and 200 ms between them.
    assert_eq!(since_first[1], ms(10_100));
    assert_eq!(since_first[2], ms(20_300));
    // Given up at 30.3 s; the new list after a pause of 1 s finds the pod again.
    assert!(since_first[3] >= ms(31_300), "{since_first:?}");
    let timeouts = w.failures(DeletionFailure::Timeout);
    assert_eq!(timeouts, 1);
    w.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_pod_replaced_under_its_name_before_the_delete_arrives_is_left_alone() {
    let w = World::start(WATCH, &[(ETCD, &[APISERVER])]).await;
    // The DELETE reaches the seed a second late; meanwhile the pod was re-created.
    w.delay_answers("/pods/etcd-main-0", Duration::from_secs(1));
    w.pod("etcd-main-0", APISERVER, Container::CrashLooping);
    w.slice("etcd-abc", ETCD, &[true]);
    w.eventually("a DELETE sent", |w| {
        !w.seed.calls_to("/pods/etcd-main-0").is_empty() || w.weeders.active() == 0
    })
    .await;
    w.pass(Duration::from_millis(1)).await;
    let mut fresh = pod(NS, "etcd-main-0", "uid-new", APISERVER, Container::Running);
    fresh["metadata"]["labels"]["generation"] = json!("2");
    w.seed.apply("pods", fresh);
    w.pass(Duration::from_secs(5)).await;
    let deletes = w.deletes();
    assert_eq!(deletes.len(), 1, "{deletes:?}");
    assert_eq!(
        (deletes[0].2.as_str(), deletes[0].3),
        ("uid-etcd-main-0", 409)
    );
    assert!(w.has_pod("etcd-main-0"));
    assert_eq!(w.deleted_count(ETCD), 0);
    w.stop().await;
}

#[tokio::test(start_paused = true)]
async fn two_slices_of_one_service_delete_a_pod_once() {
    let seed = FakeSeed::default();
    // Scheduled pods: a DELETE leaves them terminating, and a second one would succeed too.
    seed.lock().graceful_pod_deletes = true;
    let w = World::etcd_on(seed).await;
    w.pod("kapi-1", APISERVER, Container::CrashLooping);
    w.slice("etcd-ipv4", ETCD, &[true]);
    w.slice("etcd-ipv6", ETCD, &[true]);
    w.eventually("two weeders", |w| w.weeders.active() == 2)
        .await;
    w.eventually("kapi-1 deleted", |w| w.deleted() == ["kapi-1"])
        .await;
    w.pass(Duration::from_secs(10)).await;
    assert_eq!(w.deletes().len(), 1, "{:?}", w.deletes());
    assert_eq!(w.deleted_count(ETCD), 1);
    w.stop().await;
}

#[tokio::test(start_paused = true)]
async fn two_selectors_picking_one_pod_delete_it_once() {
    let any_role = PodSelector::new(
        BTreeMap::new(),
        vec![dwd_core::selector::RawRequirement {
            key: "role".into(),
            operator: "Exists".into(),
            values: None,
        }],
    )
    .expect("valid selector");
    let seed = FakeSeed::default();
    seed.lock().graceful_pod_deletes = true;
    let mut config = config(WATCH, &[(ETCD, &[APISERVER])]);
    if let Some(deps) = config.services_and_dependant_selectors.get_mut(ETCD) {
        deps.pod_selectors.push(any_role);
    }
    let w = World::start_with(seed, config, None).await;
    w.pod("kapi-1", APISERVER, Container::CrashLooping);
    w.slice("etcd-abc", ETCD, &[true]);
    w.eventually("kapi-1 deleted", |w| w.deleted() == ["kapi-1"])
        .await;
    w.pass(Duration::from_secs(10)).await;
    assert_eq!(w.deletes().len(), 1, "{:?}", w.deletes());
    w.stop().await;
}

#[tokio::test(start_paused = true)]
async fn deletions_continue_after_the_server_ends_the_pod_watches() {
    let w = World::start(WATCH, &[(ETCD, &[APISERVER])]).await;
    w.slice("etcd-abc", ETCD, &[true]);
    w.pod_watch_opened().await;
    // The watch ends and its place is lost; a pod crash-loops meanwhile, unseen.
    w.seed.insert("pods", crashing_kapi());
    w.seed.expire_watches("pods");
    w.until_gone("kapi-1").await;
    // Later changes reach the new watch.
    w.pod("kapi-2", APISERVER, Container::CrashLooping);
    w.eventually("kapi-2 deleted", |w| !w.has_pod("kapi-2"))
        .await;
    w.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_seed_without_watch_list_gets_list_and_watch() {
    let seed = FakeSeed::default();
    seed.lock().refuse_streaming_lists = true;
    seed.apply("pods", crashing_kapi());
    let w = World::etcd_on(seed).await;
    w.slice("etcd-abc", ETCD, &[true]);
    w.until_gone("kapi-1").await;
    w.pod("kapi-2", APISERVER, Container::CrashLooping);
    w.eventually("kapi-2 deleted", |w| !w.has_pod("kapi-2"))
        .await;
    let plain_list = w
        .seed
        .calls_to("/pods")
        .iter()
        .any(|c| c.method == http::Method::GET && !c.query.contains("watch=true"));
    assert!(plain_list, "no list");
    w.stop().await;
}

#[tokio::test(start_paused = true)]
async fn shutdown_stops_every_weeder_and_run_returns() {
    let w = World::start(Duration::from_secs(3600), &[(ETCD, &[APISERVER])]).await;
    w.slice("etcd-abc", ETCD, &[true]);
    w.slice("etcd-def", ETCD, &[true]);
    w.eventually("two weeders", |w| w.weeders.active() == 2)
        .await;
    let weeders = w.weeders.clone();
    w.stop().await;
    assert_eq!(weeders.active(), 0);
    let deadline = Instant::now() + Duration::from_secs(10);
    while weeders.live_tasks() > 0 {
        assert!(Instant::now() < deadline, "weeder tasks left");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(start_paused = true)]
async fn each_deletion_is_an_event_about_the_pod() {
    let w = World::start(WATCH, &[(ETCD, &[APISERVER])]).await;
    w.pod("kapi-1", APISERVER, Container::CrashLooping);
    w.slice("etcd-abc", ETCD, &[true]);
    w.eventually("an Event about kapi-1", |w| {
        w.seed.writes().iter().any(|c| {
            c.method == http::Method::POST
                && c.path.contains("/events")
                && c.body.to_string().contains("uid-kapi-1")
        })
    })
    .await;
    w.stop().await;
}

#[tokio::test(start_paused = true)]
async fn in_shadow_mode_a_crashlooping_pod_is_a_would_delete_and_nothing_is_deleted() {
    let w = World::start_shadow(&[(ETCD, &[APISERVER])]).await;
    w.pod("kapi-1", APISERVER, Container::CrashLooping);
    w.pod("kapi-2", APISERVER, Container::Running);
    w.slice("etcd-abc", ETCD, &[true]);
    w.eventually("a would-be deletion", |w| w.shadow_count(Side::Ours) == 1)
        .await;
    w.pass(Duration::from_secs(10)).await;
    assert!(w.deletes().is_empty());
    assert!(w.has_pod("kapi-1"));
    assert_eq!(w.shadow_count(Side::Reference), 0);
    // Its only writes are Events about its own pod.
    for call in w.seed.writes() {
        assert!(
            call.path.contains("/namespaces/garden/") && call.path.contains("events"),
            "{} {}",
            call.method,
            call.path
        );
    }
    // Past the window, ours alone.
    w.pass(WATCH + Duration::from_secs(30)).await;
    let shadow = w.shadow.clone().expect("shadow");
    let records = shadow.records(10);
    assert_eq!(records.len(), 1, "{records:?}");
    assert_eq!(records[0].verdict, "only_us");
    w.stop().await;
}

#[tokio::test(start_paused = true)]
async fn in_shadow_mode_the_acting_weeders_deletion_agrees_with_ours() {
    let w = World::start_shadow(&[(ETCD, &[APISERVER])]).await;
    w.pod("kapi-1", APISERVER, Container::CrashLooping);
    w.slice("etcd-abc", ETCD, &[true]);
    w.eventually("a would-be deletion", |w| w.shadow_count(Side::Ours) == 1)
        .await;
    // The acting weeder deletes it (gracefully, then for good).
    let mut terminating = crashing_kapi();
    terminating["metadata"]["deletionTimestamp"] =
        json!(k8s_openapi::jiff::Timestamp::now().to_string());
    w.seed.apply("pods", terminating);
    w.seed.delete("pods", NS, "kapi-1");
    w.eventually("its deletion seen", |w| {
        w.shadow_count(Side::Reference) == 1
    })
    .await;
    let shadow = w.shadow.clone().expect("shadow");
    w.eventually("an agreement", |_| {
        shadow.records(10).iter().any(|r| r.verdict == "agree")
    })
    .await;
    w.pass(Duration::from_secs(5)).await;
    assert_eq!(w.shadow_count(Side::Reference), 1);
    assert!(w.deletes().is_empty());
    w.stop().await;
}

#[tokio::test(start_paused = true)]
async fn in_shadow_mode_a_deletion_that_beat_our_first_list_is_both_sides() {
    let seed = FakeSeed::default();
    let w = World::start_on(
        seed,
        WATCH,
        &[(ETCD, &[APISERVER])],
        Some(Shadow::new(Component::Weeder, WATCH)),
    )
    .await;
    // The pod lists crash-looping and already terminating, deleted just now.
    let mut raced = crashing_kapi();
    raced["metadata"]["deletionTimestamp"] = json!(k8s_openapi::jiff::Timestamp::now().to_string());
    raced["metadata"]["deletionGracePeriodSeconds"] = json!(0);
    w.seed.apply("pods", raced);
    w.slice("etcd-abc", ETCD, &[true]);
    w.eventually("both sides", |w| {
        w.shadow_count(Side::Reference) == 1 && w.shadow_count(Side::Ours) == 1
    })
    .await;
    w.pass(Duration::from_secs(5)).await;
    assert_eq!(w.shadow_count(Side::Ours), 1);
    w.stop().await;
}

#[tokio::test(start_paused = true)]
async fn in_shadow_mode_a_crashlooping_pod_missing_from_a_relist_was_the_acting_weeders() {
    let w = World::start_shadow(&[(ETCD, &[APISERVER])]).await;
    w.pod("kapi-1", APISERVER, Container::CrashLooping);
    w.slice("etcd-abc", ETCD, &[true]);
    w.eventually("a would-be deletion", |w| w.shadow_count(Side::Ours) == 1)
        .await;
    // Deleted while the watch was away.
    w.seed.delete_unseen("pods", NS, "kapi-1");
    w.seed.expire_watches("pods");
    w.eventually("its deletion seen", |w| {
        w.shadow_count(Side::Reference) == 1
    })
    .await;
    w.stop().await;
}

#[tokio::test(start_paused = true)]
async fn in_shadow_mode_a_healthy_or_relabelled_pods_deletion_is_nobodys_weeding() {
    let w = World::start_shadow(&[(ETCD, &[APISERVER])]).await;
    w.pod("kapi-1", APISERVER, Container::Running);
    w.pod("kapi-2", APISERVER, Container::Creating);
    w.slice("etcd-abc", ETCD, &[true]);
    w.weeder_runs().await;
    w.pass(Duration::from_secs(1)).await;
    w.seed.delete("pods", NS, "kapi-1");
    // Crash-looping, seen as a would-be deletion, then relabelled out of the selector.
    w.pod("kapi-2", APISERVER, Container::CrashLooping);
    w.eventually("a would-be deletion", |w| w.shadow_count(Side::Ours) == 1)
        .await;
    w.pod("kapi-2", "other", Container::CrashLooping);
    w.pass(Duration::from_secs(10)).await;
    assert_eq!(w.shadow_count(Side::Reference), 0);
    w.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_pod_gone_before_its_delete_arrives_is_done_and_not_counted() {
    let w = World::start(WATCH, &[(ETCD, &[APISERVER])]).await;
    w.delay_answers("/pods/kapi-1", Duration::from_secs(1));
    w.pod("kapi-1", APISERVER, Container::CrashLooping);
    w.slice("etcd-abc", ETCD, &[true]);
    w.weeder_runs().await;
    w.pass(Duration::from_millis(500)).await;
    // Someone else deleted it while our DELETE was on its way.
    w.seed.delete("pods", NS, "kapi-1");
    w.pass(Duration::from_secs(10)).await;
    let statuses: Vec<u16> = w.deletes().iter().map(|d| d.3).collect();
    assert_eq!(statuses, [404]);
    assert_eq!(w.deleted_count(ETCD), 0);
    let events = w
        .seed
        .writes()
        .into_iter()
        .filter(|c| c.path.contains("/events"))
        .count();
    assert_eq!(events, 0);
    w.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_pod_relabelled_into_a_selector_while_watched_is_deleted() {
    let w = World::start(WATCH, &[(ETCD, &[APISERVER])]).await;
    w.pod("kapi-1", "other", Container::CrashLooping);
    w.slice("etcd-abc", ETCD, &[true]);
    w.weeder_runs().await;
    w.pass(Duration::from_secs(5)).await;
    assert!(w.deletes().is_empty());
    w.pod("kapi-1", APISERVER, Container::CrashLooping);
    w.until_gone("kapi-1").await;
    w.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_terminating_pods_further_changes_send_no_second_delete() {
    let seed = FakeSeed::default();
    seed.lock().graceful_pod_deletes = true;
    let w = World::etcd_on(seed).await;
    w.pod("kapi-1", APISERVER, Container::CrashLooping);
    w.slice("etcd-abc", ETCD, &[true]);
    w.eventually("kapi-1 deleted", |w| w.deleted() == ["kapi-1"])
        .await;
    // Still terminating; its status changes as its containers stop.
    let mut terminating = w.seed.object("pods", NS, "kapi-1");
    assert!(terminating["metadata"]["deletionTimestamp"].is_string());
    terminating["status"]["containerStatuses"][0]["restartCount"] = json!(4);
    w.seed.apply("pods", terminating);
    w.pass(Duration::from_secs(10)).await;
    assert_eq!(w.deletes().len(), 1);
    w.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_restarted_weeder_weeds_again_from_its_first_list() {
    let seed = FakeSeed::default();
    let w = World::start_on(seed.clone(), WATCH, &[(ETCD, &[APISERVER])], None).await;
    w.slice("etcd-abc", ETCD, &[true]);
    w.weeder_runs().await;
    w.stop().await;
    // While no weeder runs, a dependant crash-loops; the slice is still ready.
    seed.apply("pods", crashing_kapi());
    let w = World::etcd_on(seed).await;
    w.until_gone("kapi-1").await;
    assert_eq!(w.weeders.keys(), [format!("{NS}/etcd-abc")]);
    w.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_failing_slice_watch_is_retried_and_then_weeds() {
    let seed = FakeSeed::default();
    seed.lock()
        .fail_requests
        .extend([("endpointslices", 503, None); 3]);
    seed.apply("endpointslices", slice(NS, "etcd-abc", ETCD, &[true]));
    seed.apply("pods", crashing_kapi());
    let w = World::etcd_on(seed).await;
    w.until_gone("kapi-1").await;
    let failed = w.answered("endpointslices", 503);
    assert_eq!(failed, 3);
    w.stop().await;
}

#[tokio::test(start_paused = true)]
async fn pod_watches_that_idle_out_resume_and_keep_weeding() {
    let w = World::start(Duration::from_secs(900), &[(ETCD, &[APISERVER])]).await;
    w.slice("etcd-abc", ETCD, &[true]);
    w.weeder_runs().await;
    // Past the watches' idle timeout (290 s and a margin): they were re-created.
    w.pass(Duration::from_secs(600)).await;
    let watches = w
        .seed
        .calls_to("/pods")
        .iter()
        .filter(|c| c.query.contains("watch=true"))
        .count();
    assert!(watches >= 2, "{watches} pod watches");
    w.pod("kapi-1", APISERVER, Container::CrashLooping);
    w.until_gone("kapi-1").await;
    w.stop().await;
}

#[tokio::test(start_paused = true)]
async fn in_shadow_mode_a_pod_two_slices_pick_is_one_would_be_deletion() {
    let w = World::start_shadow(&[(ETCD, &[APISERVER])]).await;
    w.pod("kapi-1", APISERVER, Container::CrashLooping);
    w.slice("etcd-ipv4", ETCD, &[true]);
    w.slice("etcd-ipv6", ETCD, &[true]);
    w.eventually("two weeders", |w| w.weeders.active() == 2)
        .await;
    w.eventually("a would-be deletion", |w| w.shadow_count(Side::Ours) == 1)
        .await;
    w.pass(Duration::from_secs(10)).await;
    assert_eq!(w.shadow_count(Side::Ours), 1);
    // The acting weeder deletes it: one sighting, though two watches see it go.
    w.seed.delete("pods", NS, "kapi-1");
    w.eventually("its deletion seen", |w| {
        w.shadow_count(Side::Reference) == 1
    })
    .await;
    w.pass(Duration::from_secs(10)).await;
    assert_eq!(w.shadow_count(Side::Reference), 1);
    assert!(w.deletes().is_empty());
    w.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_forbidden_deletion_is_counted_as_forbidden_and_tried_again() {
    let w = World::start(WATCH, &[(ETCD, &[APISERVER])]).await;
    w.seed.lock().fail_writes.extend([(403, None); 3]);
    w.pod("kapi-1", APISERVER, Container::CrashLooping);
    w.slice("etcd-abc", ETCD, &[true]);
    w.until_gone("kapi-1").await;
    let statuses: Vec<u16> = w.deletes().iter().map(|d| d.3).collect();
    assert_eq!(statuses, [403, 403, 403, 200]);
    assert_eq!(w.failures(DeletionFailure::Forbidden), 1);
    assert_eq!(w.failures(DeletionFailure::ServerError), 0);
    w.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_weeder_replaced_mid_deletion_releases_the_pod_to_its_successor() {
    let w = World::start(WATCH, &[(ETCD, &[APISERVER])]).await;
    // The first DELETE waits 5 s for its answer; the slice flaps meanwhile.
    w.delay_answers("/pods/kapi-1", Duration::from_secs(5));
    w.pod("kapi-1", APISERVER, Container::CrashLooping);
    w.slice("etcd-abc", ETCD, &[true]);
    w.weeder_runs().await;
    w.pass(Duration::from_secs(1)).await;
    w.seed.lock().delays.clear();
    w.slice("etcd-abc", ETCD, &[false]);
    w.slice("etcd-abc", ETCD, &[true]);
    w.until_gone("kapi-1").await;
    assert_eq!(w.weeders.started_total(), 2);
    assert_eq!(w.deleted(), ["kapi-1"]);
    assert_eq!(w.deleted_count(ETCD), 1);
    w.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_service_name_that_is_no_label_value_leaves_the_other_services_weeded() {
    let w = World::start(WATCH, &[("etcd main", &[KCM]), (ETCD, &[APISERVER])]).await;
    let lists = w.seed.calls_to("endpointslices");
    assert!(
        lists
            .iter()
            // Only the valid name, encoded: `kubernetes.io/service-name in (etcd-main-client)`.
            .all(|c| c.query.contains("service-name+in+%28etcd-main-client%29&")),
        "{:?}",
        lists.iter().map(|c| &c.query).collect::<Vec<_>>()
    );
    w.pod("kapi-1", APISERVER, Container::CrashLooping);
    w.slice("etcd-abc", ETCD, &[true]);
    w.until_gone("kapi-1").await;
    w.stop().await;
}

#[tokio::test(start_paused = true)]
async fn with_no_service_name_that_can_label_a_slice_the_weeder_is_ready_and_weeds_nothing() {
    let w = World::start(WATCH, &[("etcd main", &[APISERVER])]).await;
    w.pod("kapi-1", APISERVER, Container::CrashLooping);
    w.slice("etcd-abc", "etcd main", &[true]);
    w.pass(Duration::from_secs(30)).await;
    assert!(w.seed.calls_to("endpointslices").is_empty());
    assert_eq!(w.weeders.started_total(), 0);
    assert!(w.has_pod("kapi-1"));
    w.stop().await;
}

#[tokio::test(start_paused = true)]
async fn the_weeder_is_ready_only_once_the_slices_are_listed() {
    let seed = FakeSeed::default();
    seed.outage(crate::fake_seed::Outage::Fail(503), Duration::from_secs(20));
    let w = World::spawn(seed, config(WATCH, &[(ETCD, &[APISERVER])]), None);
    w.pass(Duration::from_secs(10)).await;
    assert!(!w.health.is_ready(), "ready before the slices were listed");
    w.eventually("ready after the outage", |w| w.health.is_ready())
        .await;
    w.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_pod_watch_failing_at_start_is_retried_and_weeds() {
    let w = World::start(WATCH, &[(ETCD, &[APISERVER])]).await;
    w.seed
        .lock()
        .fail_requests
        .extend([("/pods", 503, None); 2]);
    w.pod("kapi-1", APISERVER, Container::CrashLooping);
    w.slice("etcd-abc", ETCD, &[true]);
    w.until_gone("kapi-1").await;
    let failed = w.answered("/pods", 503);
    assert_eq!(failed, 2);
    w.stop().await;
}

#[tokio::test(start_paused = true)]
async fn each_service_weeds_only_its_own_dependants() {
    let w = World::start(WATCH, &[(ETCD, &[APISERVER]), (KAPI, &[KCM])]).await;
    w.pod("kcm-1", KCM, Container::CrashLooping);
    w.slice("etcd-abc", ETCD, &[true]);
    w.pass(Duration::from_secs(10)).await;
    // etcd came back; the controller-manager depends on kube-apiserver, still down.
    assert!(w.has_pod("kcm-1"));
    w.slice("kapi-abc", KAPI, &[true]);
    w.eventually("kcm-1 deleted", |w| !w.has_pod("kcm-1")).await;
    assert_eq!((w.deleted_count(ETCD), w.deleted_count(KAPI)), (0, 1));
    w.stop().await;
}
