//! The Cluster controller's decisions ([`decide`], [`plan`]) as pure functions, then the
//! controller itself ([`run`]) on a paused clock, against the fake seed apiserver
//! ([`crate::fake_seed`]): the real kube-runtime watcher lists and watches the fake's
//! Clusters, and the tests push `ADDED`, `MODIFIED` and `DELETED` events by writing Clusters
//! there, or make the watch list again. What the controller decided is read from the
//! [`ProbeManager`] it feeds; the probes it starts run for real (against seed caches that never
//! sync, so each run is only counted). Waits of a minute take no time.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use dwd_core::shoot::{RemoveReason, WaitReason};
use dwd_core::{EffectiveProbeSettings, ShootError};
use kube::api::DynamicObject;
use serde_json::{Value, json};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{ProbeAction, SlimCluster, decide, plan, run, strip_cluster};
use crate::client::cache::SyncState;
use crate::client::kube_client::SEED_RESPONSE_HEADERS_TIMEOUT;
use crate::fake_seed::{FakeSeed, Outage};
use crate::metrics::{RestartCause, RestartLabels, ShootLabels};
use crate::prober::ProberContext;
use crate::prober::context::test_support::{config, context};
use crate::prober::manager::{EnsureOutcome, ProbeManager};

/// The Clusters' resource path on the seed.
const CLUSTERS: &str = "/apis/extensions.gardener.cloud/v1alpha1/clusters";

/// The controller running against a fake seed.
struct Harness {
    /// The Cluster watch's sync state, as readiness sees it.
    synced: tokio::sync::watch::Receiver<SyncState>,
    fake: FakeSeed,
    ctx: Arc<ProberContext>,
    manager: Arc<ProbeManager>,
    shutdown: CancellationToken,
    controller: tokio::task::JoinHandle<()>,
}

/// A Cluster whose Shoot is a healthy one: one worker pool, last operation a reconcile.
/// `edit` changes the Shoot (`spec.shoot`) before it is returned.
fn cluster(name: &str, edit: impl FnOnce(&mut Value)) -> Value {
    let mut shoot = json!({
        "apiVersion": "core.gardener.cloud/v1beta1", "kind": "Shoot",
        "metadata": {"name": "a", "namespace": "garden-p"},
        "spec": {"provider": {"type": "aws", "workers": [{"name": "pool-a", "minimum": 1}]}},
        "status": {"lastOperation": {"type": "Reconcile", "state": "Succeeded"}},
    });
    edit(&mut shoot);
    json!({
        "apiVersion": "extensions.gardener.cloud/v1alpha1", "kind": "Cluster",
        "metadata": {"name": name, "uid": format!("uid-{name}")},
        "spec": {"shoot": shoot, "seed": {"kind": "Seed"}, "cloudProfile": {"kind": "CloudProfile"}},
    })
}

/// The settings a probe of a [`cluster`] with a grace period of `grace` runs with.
fn settings(grace: Duration) -> EffectiveProbeSettings {
    EffectiveProbeSettings {
        node_monitor_grace: grace,
        pool_conditions: BTreeMap::from([(
            "pool-a".to_string(),
            dwd_core::shoot::default_unhealthy_conditions(),
        )]),
    }
}

/// Waits until `condition` holds, at most `deadline` (paused time); panics naming `what`.
async fn eventually(deadline: Duration, what: &str, mut condition: impl FnMut() -> bool) {
    let until = Instant::now() + deadline;
    while !condition() {
        assert!(Instant::now() < until, "not within {deadline:?}: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Runs `f` while the paused clock is allowed to advance, at most `deadline`.
async fn within<T>(deadline: Duration, what: &str, f: impl Future<Output = T>) -> T {
    match tokio::time::timeout(deadline, f).await {
        Ok(v) => v,
        Err(_) => panic!("not within {deadline:?}: {what}"),
    }
}

impl Harness {
    /// Stores `clusters` in the fake, then starts the controller and waits until its first
    /// list is in the store.
    async fn start(clusters: Vec<Value>) -> Harness {
        let fake = FakeSeed::default();
        for c in clusters {
            fake.apply("clusters", c);
        }
        let ctx = context(fake.client());
        let shutdown = CancellationToken::new();
        let executors = Arc::new(crate::prober::executor::Executors::Acting);
        let manager = Arc::new(ProbeManager::new(
            ctx.clone(),
            executors,
            shutdown.child_token(),
        ));
        let (synced_tx, synced) = tokio::sync::watch::channel(SyncState::Listing);
        let controller = tokio::spawn(run(
            ctx.clone(),
            manager.clone(),
            shutdown.clone(),
            synced_tx,
        ));
        within(
            Duration::from_secs(5),
            "the first list of Clusters",
            synced.clone().wait_for(|s| *s == SyncState::Synced),
        )
        .await
        .expect("synced");
        Harness {
            synced,
            fake,
            ctx,
            manager,
            shutdown,
            controller,
        }
    }

    /// Starts with a healthy Cluster for each of `names` and waits until each has its probe.
    async fn probing(names: &[&str]) -> Harness {
        let h = Harness::start(names.iter().map(|n| cluster(n, |_| {})).collect()).await;
        h.reconciled(names.len() as u64).await;
        for name in names {
            assert!(h.manager.has_probe(name), "no probe for {name}");
        }
        h
    }

    fn reconciles(&self) -> u64 {
        self.ctx.metrics.reconciles.get()
    }

    /// Waits until the controller has reconciled `n` times in all.
    async fn reconciled(&self, n: u64) {
        eventually(Duration::from_secs(5), &format!("{n} reconciles"), || {
            self.reconciles() >= n
        })
        .await;
    }

    /// Writes `cluster` (an `ADDED` or `MODIFIED` event) and waits until it is reconciled.
    async fn apply(&self, cluster: Value) {
        let before = self.reconciles();
        self.fake.apply("clusters", cluster);
        self.reconciled(before + 1).await;
    }

    fn runs(&self, ns: &str) -> u64 {
        self.ctx
            .metrics
            .shoot_probe_runs
            .get(&ShootLabels { shoot: ns.into() })
            .map_or(0, |c| c.get())
    }

    fn restarts(&self) -> u64 {
        [RestartCause::Panicked, RestartCause::Ended]
            .into_iter()
            .map(|cause| {
                self.ctx
                    .metrics
                    .probe_task_restarts
                    .get(&RestartLabels { cause })
                    .map_or(0, |c| c.get())
            })
            .sum()
    }

    /// Stops the controller and its probes; the controller must end.
    async fn stop(self) {
        self.shutdown.cancel();
        within(
            Duration::from_secs(5),
            "the controller to end",
            self.controller,
        )
        .await
        .expect("controller task");
        self.manager.stop_all();
    }
}

#[tokio::test(start_paused = true)]
async fn a_normal_shoot_gets_a_probe_from_the_list_and_from_a_watch_event() {
    let h = Harness::start(vec![cluster("shoot--p--listed", |_| {})]).await;
    h.reconciled(1).await;
    assert!(h.manager.has_probe("shoot--p--listed"));
    // A Cluster created later arrives as an ADDED event on the watch.
    h.apply(cluster("shoot--p--added", |_| {})).await;
    assert!(h.manager.has_probe("shoot--p--added"));
    // The controller's requests: one list of all Clusters, then a watch resuming from its
    // version; nothing else (reconciling sends no requests).
    let calls = h.fake.calls_to("clusters");
    assert!(calls.iter().all(|c| c.path == CLUSTERS), "{calls:?}");
    assert_eq!(calls.len(), 2, "{calls:?}");
    assert!(!calls[0].query.contains("watch=true"), "{:?}", calls[0]);
    assert!(
        calls[1].query.contains("watch=true") && calls[1].query.contains("resourceVersion=1"),
        "{:?}",
        calls[1]
    );
    // Both probes run: after the initial delay, every second.
    tokio::time::sleep(Duration::from_secs(32)).await;
    assert!(h.runs("shoot--p--listed") >= 1 && h.runs("shoot--p--added") >= 1);
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn shoots_that_must_not_be_probed_get_no_probe() {
    let h = Harness::start(vec![
        cluster("shoot--p--hibernated", |s| {
            s["spec"]["hibernation"] = json!({"enabled": true});
            s["status"]["isHibernated"] = json!(true);
        }),
        // Hibernation enabled, not yet hibernated: hibernating.
        cluster("shoot--p--hibernating", |s| {
            s["spec"]["hibernation"] = json!({"enabled": true});
        }),
        // Hibernation disabled again, still hibernated: waking up.
        cluster("shoot--p--waking", |s| {
            s["status"]["isHibernated"] = json!(true);
        }),
        cluster("shoot--p--creating", |s| {
            s["status"]["lastOperation"] = json!({"type": "Create", "state": "Processing"});
        }),
        cluster("shoot--p--migrating", |s| {
            s["status"]["lastOperation"] = json!({"type": "Migrate", "state": "Succeeded"});
        }),
        cluster("shoot--p--deleting", |s| {
            s["metadata"]["deletionTimestamp"] = json!("2026-11-22T08:00:00Z");
        }),
        cluster("shoot--p--no-workers", |s| {
            s["spec"]["provider"]["workers"] = json!([]);
        }),
        cluster("shoot--p--no-operation", |s| {
            s["status"]
                .as_object_mut()
                .expect("status")
                .remove("lastOperation");
        }),
    ])
    .await;
    h.reconciled(8).await;
    // Half a minute on: nothing started meanwhile, and nothing decided again.
    tokio::time::sleep(Duration::from_secs(31)).await;
    assert_eq!(h.manager.namespaces(), Vec::<String>::new());
    assert_eq!(h.reconciles(), 8, "reconciled again without a change");
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_create_that_succeeds_starts_the_probe() {
    let ns = "shoot--p--new";
    let creating = |state: &'static str| {
        cluster(ns, move |s| {
            s["status"]["lastOperation"] = json!({"type": "Create", "state": state});
        })
    };
    let h = Harness::start(vec![creating("Processing")]).await;
    h.reconciled(1).await;
    assert!(!h.manager.has_probe(ns));
    h.apply(creating("Error")).await;
    assert!(!h.manager.has_probe(ns));
    h.apply(creating("Succeeded")).await;
    assert!(h.manager.has_probe(ns));
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_probed_shoot_loses_its_probe_when_it_hibernates_migrates_or_is_deleted() {
    let hibernating = |s: &mut Value| s["spec"]["hibernation"] = json!({"enabled": true});
    let migrating = |s: &mut Value| {
        s["status"]["lastOperation"] = json!({"type": "Migrate", "state": "Processing"})
    };
    let deleting =
        |s: &mut Value| s["metadata"]["deletionTimestamp"] = json!("2026-11-22T08:00:00Z");
    let names = ["shoot--p--h", "shoot--p--m", "shoot--p--d"];
    let h = Harness::probing(&names).await;
    h.apply(cluster(names[0], hibernating)).await;
    assert!(
        !h.manager.has_probe(names[0]),
        "hibernating shoot kept its probe"
    );
    h.apply(cluster(names[1], migrating)).await;
    assert!(
        !h.manager.has_probe(names[1]),
        "migrating shoot kept its probe"
    );
    h.apply(cluster(names[2], deleting)).await;
    assert!(
        !h.manager.has_probe(names[2]),
        "shoot being deleted kept its probe"
    );
    // Woken up again (hibernation off, still hibernated): the probe waits for the wake-up.
    h.apply(cluster(names[0], |s| {
        s["status"]["isHibernated"] = json!(true)
    }))
    .await;
    assert!(
        !h.manager.has_probe(names[0]),
        "probe started while waking up"
    );
    h.apply(cluster(names[0], |_| {})).await;
    assert!(h.manager.has_probe(names[0]), "no probe once awake");
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_deleted_cluster_removes_its_probe_at_once() {
    let ns = "shoot--p--gone";
    let h = Harness::probing(&[ns, "shoot--p--stays"]).await;
    let deleted_at = Instant::now();
    h.fake.delete("clusters", "", ns);
    // Through the DELETED event.
    eventually(Duration::from_secs(1), "the probe removed", || {
        !h.manager.has_probe(ns)
    })
    .await;
    assert!(deleted_at.elapsed() < Duration::from_secs(1));
    assert!(h.manager.has_probe("shoot--p--stays"));
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_grace_period_edit_updates_the_running_probe_without_restarting_it() {
    let ns = "shoot--p--edited";
    let h = Harness::start(vec![cluster(ns, |_| {})]).await;
    h.reconciled(1).await;
    tokio::time::sleep(Duration::from_secs(31)).await;
    let before = h.runs(ns);
    assert!(before >= 1, "no run after the initial delay");
    h.apply(cluster(ns, |s| {
        s["spec"]["kubernetes"] =
            json!({"kubeControllerManager": {"nodeMonitorGracePeriod": "2m"}});
    }))
    .await;
    // The probe goes on running every second: neither removed (its runs would be forgotten)
    // nor started anew (it would wait its 30 s initial delay again).
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        h.runs(ns) >= before + 2,
        "runs stopped after the edit: {before} then {}",
        h.runs(ns)
    );
    assert_eq!(h.restarts(), 0);
    // The running probe has the new grace period: ensuring it again with exactly those
    // settings changes nothing.
    assert_eq!(
        h.manager.ensure(
            ns,
            settings(Duration::from_secs(120)),
            Some(format!("uid-{ns}"))
        ),
        EnsureOutcome::Unchanged
    );
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_cluster_deleted_while_the_watch_was_away_loses_its_probe_when_the_re_list_completes() {
    let ns = "shoot--p--vanished";
    let h = Harness::probing(&[ns, "shoot--p--stays"]).await;
    let reconciles = h.reconciles();
    // The Cluster is deleted while no watch sees it; the watch resumes into 410 Gone and the
    // watcher lists again. No DELETED event ever comes: the re-list's end removes the probe.
    h.fake.delete_unseen("clusters", "", ns);
    h.fake.expire_watches("clusters");
    let lists = || {
        h.fake
            .calls_to("clusters")
            .iter()
            .filter(|c| !c.query.contains("watch=true"))
            .count()
    };
    eventually(Duration::from_secs(5), "a second list of Clusters", || {
        lists() == 2
    })
    .await;
    let listed_at = Instant::now();
    eventually(
        Duration::from_secs(1),
        "the probe removed at the re-list's end",
        || !h.manager.has_probe(ns),
    )
    .await;
    assert!(listed_at.elapsed() < Duration::from_secs(1));
    // The Cluster still listed was decided again, once, and its probe left running.
    assert!(h.manager.has_probe("shoot--p--stays"));
    h.reconciled(reconciles + 1).await;
    assert_eq!(h.reconciles(), reconciles + 1);
    assert_eq!(h.restarts(), 0);
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_silent_seed_makes_the_cluster_watch_stale_until_it_has_listed_again() {
    let ns = "shoot--p--kept";
    let h = Harness::probing(&[ns]).await;
    // The seed stops answering, and the open watch is lost: the watcher's next watch gets no
    // headers within the client's bound.
    h.fake.outage(Outage::Hang, Duration::from_secs(120));
    h.fake.expire_watches("clusters");
    let silent_from = Instant::now();
    let mut synced = h.synced.clone();
    let stale = within(
        Duration::from_secs(60),
        "the Cluster watch stale",
        synced.wait_for(|s| matches!(s, SyncState::Stale(_))),
    )
    .await
    .expect("sync state")
    .clone();
    let SyncState::Stale(why) = stale else {
        unreachable!()
    };
    assert!(why.starts_with("the seed went silent"), "{why}");
    let after = silent_from.elapsed();
    assert!(
        after >= SEED_RESPONSE_HEADERS_TIMEOUT
            && after <= SEED_RESPONSE_HEADERS_TIMEOUT + Duration::from_secs(2),
        "stale {after:?} after the seed went silent"
    );
    // The probes keep running as they are; the Clusters are listed again once the seed
    // answers, and the watch is in sync again.
    assert!(h.manager.has_probe(ns));
    within(
        Duration::from_secs(300),
        "the Cluster watch in sync again",
        synced.wait_for(|s| *s == SyncState::Synced),
    )
    .await
    .expect("sync state");
    assert!(silent_from.elapsed() >= Duration::from_secs(120));
    assert!(h.manager.has_probe(ns));
    assert_eq!(h.restarts(), 0);
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn an_unreadable_cluster_is_counted_and_leaves_its_probe_and_the_others_alone() {
    let ns = "shoot--p--broken";
    let h = Harness::probing(&[ns, "shoot--p--fine"]).await;
    // The Shoot's hibernation flag is not a boolean: the Cluster can't be decided.
    h.apply(cluster(ns, |s| {
        s["spec"]["hibernation"] = json!({"enabled": "maybe"});
    }))
    .await;
    assert_eq!(h.ctx.metrics.reconcile_errors.get(), 1);
    assert!(
        h.manager.has_probe(ns),
        "the unreadable Cluster's probe was removed"
    );
    // The next Cluster is decided as usual, and the broken one once it is fixed.
    h.apply(cluster("shoot--p--new", |_| {})).await;
    assert!(h.manager.has_probe("shoot--p--new"));
    h.apply(cluster(ns, |s| {
        s["spec"]["hibernation"] = json!({"enabled": true});
    }))
    .await;
    assert!(!h.manager.has_probe(ns));
    assert!(h.manager.has_probe("shoot--p--fine"));
    assert_eq!(h.ctx.metrics.reconcile_errors.get(), 1);
    h.stop().await;
}

/// [`cluster`] as the watch delivers it, before stripping.
fn object(name: &str, edit: impl FnOnce(&mut Value)) -> DynamicObject {
    serde_json::from_value(cluster(name, edit)).expect("a Cluster")
}

#[test]
fn decide_reads_the_lifecycle_from_the_cluster_stripped_or_not() {
    let config = config();
    let run = ProbeAction::Run {
        shoot: "shoot--p--a".into(),
        settings: settings(Duration::from_secs(40)),
        cluster_uid: Some("uid-shoot--p--a".into()),
    };
    let healthy = object("shoot--p--a", |_| {});
    assert_eq!(decide(&healthy, &config), run);
    let mut stripped = healthy.clone();
    strip_cluster(&mut stripped);
    assert_ne!(stripped.data, healthy.data);
    assert_eq!(decide(&stripped, &config), run);

    let hibernating = object("shoot--p--h", |s| {
        s["spec"]["hibernation"] = json!({"enabled": true});
    });
    assert_eq!(
        decide(&hibernating, &config),
        ProbeAction::Remove {
            shoot: "shoot--p--h".into(),
            reason: RemoveReason::HibernationEnabled,
        }
    );
    let creating = object("shoot--p--c", |s| {
        s["status"]["lastOperation"] = json!({"type": "Create", "state": "Processing"});
    });
    assert!(matches!(
        decide(&creating, &config),
        ProbeAction::Wait { shoot, reason: WaitReason::OperationNotSucceeded { .. } }
            if shoot == "shoot--p--c"
    ));
    let mut no_shoot = object("shoot--p--x", |_| {});
    no_shoot.data = json!({"spec": {"seed": {}}});
    strip_cluster(&mut no_shoot);
    assert_eq!(
        decide(&no_shoot, &config),
        ProbeAction::Unreadable {
            shoot: "shoot--p--x".into(),
            error: ShootError::MissingShoot,
        }
    );
}

#[test]
fn a_cluster_is_decoded_slim_and_decided_as_the_whole_one() {
    let config = config();
    type Edit = fn(&mut Value);
    let edits: [(&str, Edit); 3] = [
        ("shoot--p--a", |_| {}),
        ("shoot--p--h", |s| {
            s["spec"]["hibernation"] = json!({"enabled": true})
        }),
        ("shoot--p--g", |s| {
            s["spec"]["kubernetes"] =
                json!({"kubeControllerManager": {"nodeMonitorGracePeriod": "2m"}});
            s["spec"]["provider"]["workers"][0]["machineControllerManager"] =
                json!({"nodeConditions": ["KernelDeadlock"]});
        }),
    ];
    for (name, edit) in edits {
        let mut whole = cluster(name, edit);
        // What a seed adds that the rules never read: the Cluster's status and managed
        // fields, a big CloudProfile.
        whole["metadata"]["resourceVersion"] = json!("42");
        whole["metadata"]["managedFields"] = json!([{"manager": "gardenlet", "fieldsV1": {}}]);
        whole["metadata"]["annotations"] = json!({"a": "b"});
        whole["spec"]["cloudProfile"]["spec"] =
            json!({"machineTypes": vec![json!({"name": "m5"}); 1000]});
        whole["status"] = json!({"x": 1});
        let slim: SlimCluster = serde_json::from_value(whole.clone()).expect("slim");
        let full: DynamicObject = serde_json::from_value(whole).expect("whole");
        assert_eq!(decide(&slim.0, &config), decide(&full, &config), "{name}");
        assert_eq!(slim.0.metadata.resource_version.as_deref(), Some("42"));
        assert_eq!(slim.0.metadata.uid, full.metadata.uid);
        assert!(slim.0.metadata.managed_fields.is_none() && slim.0.metadata.annotations.is_none());
        let mut stripped = full.clone();
        strip_cluster(&mut stripped);
        assert_eq!(
            slim.0.data, stripped.data,
            "{name}: only spec.shoot, stripped"
        );
    }
    // A list page decodes item by item the same way; a Cluster without a shoot is
    // unreadable, by name, as before.
    let page = json!({"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": "7"},
        "items": [cluster("shoot--p--a", |_| {}), {"metadata": {"name": "shoot--p--x"}, "spec": {"seed": {}}}]});
    let list: kube::core::ObjectList<SlimCluster> = serde_json::from_value(page).expect("page");
    assert!(matches!(
        decide(&list.items[0].0, &config),
        ProbeAction::Run { .. }
    ));
    assert_eq!(
        decide(&list.items[1].0, &config),
        ProbeAction::Unreadable {
            shoot: "shoot--p--x".into(),
            error: ShootError::MissingShoot,
        }
    );
}

#[test]
fn plan_decides_every_listed_cluster_and_removes_the_probes_of_the_others() {
    let config = config();
    let listed: Vec<Arc<DynamicObject>> = [
        object("shoot--p--b", |_| {}),
        object("shoot--p--a", |s| {
            s["metadata"]["deletionTimestamp"] = json!("2026-11-22T08:00:00Z");
        }),
    ]
    .into_iter()
    .map(Arc::new)
    .collect();
    // "b" and "gone-1/2" have probes; "a" has one too, which its Cluster now removes.
    let running: Vec<String> = [
        "shoot--p--gone-2",
        "shoot--p--b",
        "shoot--p--gone-1",
        "shoot--p--a",
    ]
    .map(String::from)
    .to_vec();
    let gone = |shoot: &str| ProbeAction::Gone {
        shoot: shoot.into(),
    };
    assert_eq!(
        plan(listed.iter().map(Arc::as_ref), &running, &config),
        vec![
            ProbeAction::Remove {
                shoot: "shoot--p--a".into(),
                reason: RemoveReason::DeletionRequested,
            },
            decide(&listed[0], &config),
            gone("shoot--p--gone-1"),
            gone("shoot--p--gone-2"),
        ]
    );
    assert!(matches!(
        decide(&listed[0], &config),
        ProbeAction::Run { .. }
    ));
    // The first list, no probe yet: only decisions. An empty list: every probe goes.
    assert_eq!(
        plan(listed.iter().map(Arc::as_ref), &[], &config),
        vec![decide(&listed[1], &config), decide(&listed[0], &config)]
    );
    assert_eq!(
        plan(std::iter::empty(), &running, &config),
        vec![
            gone("shoot--p--a"),
            gone("shoot--p--b"),
            gone("shoot--p--gone-1"),
            gone("shoot--p--gone-2"),
        ]
    );
    assert_eq!(plan(&[], &[], &config), vec![]);
}
