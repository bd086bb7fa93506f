//! Kubernetes Events against the real seed apiserver: the prober's scaling decisions appear on
//! the (cluster-scoped) Cluster and its replica changes on each target Deployment; the weeder's
//! deletions appear on the deleted pod. Events are read back the way operators read them:
//! `events.k8s.io/v1` (what the recorder writes) and the core/v1 view `kubectl describe` uses.

// A test crate: a failed assumption is a failed test (outside tests the workspace denies these).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod harness;

use std::sync::Arc;

use dependency_watchdog::metrics::{EventLabels, EventOutcome, Metrics};
use dependency_watchdog::observe::events::{
    Component, Events, REASON_POD_DELETED, REASON_SCALE_DOWN, REASON_SCALE_UP, REASON_SCALED_DOWN,
    REASON_SCALED_UP,
};
use dwd_core::Direction;
use dwd_sim::EndpointsState;
use dwd_testenv::eventually;
use harness::in_process::*;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Event as CoreEvent, Pod};
use k8s_openapi::api::events::v1::Event;
use kube::Api;
use kube::api::{DynamicObject, ListParams};

const PROBER: &str = "dependency-watchdog-prober";
const WEEDER: &str = "dependency-watchdog-weeder";

/// Waits until at least one such event exists and returns them.
async fn wait_events(
    client: &kube::Client,
    namespace: &str,
    kind: &str,
    name: &str,
    reason: &str,
) -> Vec<Event> {
    let what = format!("{reason} event on {kind} {namespace}/{name}");
    eventually(DEADLINE, &what, || async {
        let found = events_about(client, namespace, kind, name, reason).await;
        Ok((!found.is_empty()).then_some(found))
    })
    .await
    .unwrap_or_else(|e| panic!("{e}"))
}

fn note(e: &Event) -> &str {
    e.note.as_deref().unwrap_or_default()
}

/// "N/5 node leases expired (F ≥ 0.60)" with N ≥ 3: the fraction crossed the threshold.
fn assert_down_reason(text: &str) {
    let (count, rest) = text
        .split_once("/5 node leases expired (")
        .unwrap_or_else(|| {
            panic!("no lease summary in {text:?}");
        });
    let expired: usize = count
        .parse()
        .unwrap_or_else(|_| panic!("count in {text:?}"));
    assert!(expired >= 3, "{text:?}");
    assert!(rest.starts_with("0.") || rest.starts_with("1."), "{text:?}");
    assert!(rest.contains(" ≥ 0.60)"), "{text:?}");
}

async fn uid_of_deployment(client: &kube::Client, ns: &str, name: &str) -> String {
    Api::<Deployment>::namespaced(client.clone(), ns)
        .get(name)
        .await
        .expect("deployment")
        .metadata
        .uid
        .expect("uid")
}

/// Checks every scale-down decision on the Cluster: the first names every target in order, a
/// retried flow's later ones a tail of that order; all are `Normal` `Scale` events from the
/// prober, on the cluster-scoped Cluster (so in `default`, with no namespace in `regarding`).
fn assert_scale_down_decisions(decisions: &[Event], cluster_uid: &str) {
    let all = "kube-controller-manager, machine-controller-manager, cluster-autoscaler";
    for (i, e) in decisions.iter().enumerate() {
        let (reason, scaled) = note(e)
            .split_once(": ")
            .unwrap_or_else(|| panic!("{:?}", note(e)));
        assert_down_reason(reason);
        // The decision's record id ends the note: the Event leads to its record.
        let (scaled, decision) = scaled
            .rsplit_once(" (decision ")
            .unwrap_or_else(|| panic!("no decision id in {scaled:?}"));
        assert!(
            decision.starts_with("shoot--") && decision.ends_with(')'),
            "{decision:?}"
        );
        let targets = scaled
            .strip_prefix("scaling down ")
            .unwrap_or_else(|| panic!("{scaled:?}"));
        if i == 0 {
            assert_eq!(targets, all);
        } else {
            assert!(all.ends_with(targets), "retry decision {scaled:?}");
        }
        assert_eq!(e.type_.as_deref(), Some("Normal"));
        assert_eq!(e.action.as_deref(), Some("Scale"));
        assert_eq!(e.reporting_controller.as_deref(), Some(PROBER));
        assert_eq!(e.metadata.namespace.as_deref(), Some("default"));
        let r = e.regarding.as_ref().expect("regarding");
        assert_eq!(
            r.api_version.as_deref(),
            Some("extensions.gardener.cloud/v1alpha1")
        );
        assert_eq!(r.namespace, None);
        assert_eq!(r.uid.as_deref(), Some(cluster_uid));
    }
}

/// Waits for the one scale-down event on target `name`'s Deployment and checks it names the
/// replicas it came `from`, the lease reason, and that Deployment by UID.
async fn assert_scaled_down_event(seed: &kube::Client, ns: &str, name: &str, from: i32) {
    let found = wait_events(seed, ns, "Deployment", name, REASON_SCALED_DOWN).await;
    assert_eq!(found.len(), 1, "{name}: {found:?}");
    let text = note(&found[0]);
    let prefix = format!("scaled down from {from} to 0: ");
    let reason = text
        .strip_prefix(&prefix)
        .unwrap_or_else(|| panic!("{name}: {text:?}"));
    assert_down_reason(reason);
    let r = found[0].regarding.as_ref().expect("regarding");
    assert_eq!(r.namespace.as_deref(), Some(ns));
    assert_eq!(
        r.uid.as_deref(),
        Some(uid_of_deployment(seed, ns, name).await.as_str()),
        "{name}"
    );
    assert_eq!(found[0].reporting_controller.as_deref(), Some(PROBER));
}

/// Waits for the one scale-up event on target `name`'s Deployment and checks it names the
/// replicas it went `to` and the lease reason.
async fn assert_scaled_up_event(seed: &kube::Client, ns: &str, name: &str, to: i32) {
    let found = wait_events(seed, ns, "Deployment", name, REASON_SCALED_UP).await;
    assert_eq!(found.len(), 1, "{name}: {found:?}");
    let text = note(&found[0]);
    assert!(
        text.starts_with(&format!("scaled up from 0 to {to}: "))
            && text.contains(" node leases expired (")
            && text.ends_with(" < 0.60)"),
        "{name}: {text:?}"
    );
}

#[tokio::test]
async fn scaling_decisions_are_events_on_the_cluster_and_on_every_target() {
    let h = harness().await;
    let seed = h.seed_client().await;
    let shoot = h.shoot("events", &h.shoots, |_| {}).await;
    let ns = shoot.namespace().to_string();
    let cluster_uid =
        Api::<DynamicObject>::all_with(seed.clone(), &dwd_sim::seed::cluster_resource())
            .get(&ns)
            .await
            .expect("cluster")
            .metadata
            .uid
            .expect("cluster uid");

    // Healthy runs decide "scale up" every time, but with nothing to do: no events.
    h.wait_runs(&ns, 3).await;
    for reason in [REASON_SCALE_DOWN, REASON_SCALE_UP] {
        let found = events_about(&seed, "default", "Cluster", &ns, reason).await;
        assert!(
            found.is_empty(),
            "healthy shoot got {reason} events: {found:?}"
        );
    }

    shoot.kubelets().silence_count(4);
    wait_replicas(&seed, &ns, &[(KCM, 0), (MCM, 0), (CA, 0)]).await;

    // The decision, on the cluster-scoped Cluster: its events live in `default`. A flow that
    // stopped at a slow target is retried by a later run, whose decision lists only what is
    // left: the first decision names every target, later ones a tail of the same order.
    let decisions = wait_events(&seed, "default", "Cluster", &ns, REASON_SCALE_DOWN).await;
    assert_scale_down_decisions(&decisions, &cluster_uid);
    if decisions.len() > 1 {
        eprintln!(
            "{} scale-down decisions (a flow was retried): {:?}",
            decisions.len(),
            decisions.iter().map(note).collect::<Vec<_>>()
        );
    }
    eprintln!("Cluster event: {}", note(&decisions[0]));
    // What `kubectl describe cluster` lists: core/v1 events selected by name, kind and UID.
    let described = Api::<CoreEvent>::namespaced(seed.clone(), "default")
        .list(&ListParams::default().fields(&format!(
            "involvedObject.kind=Cluster,involvedObject.name={ns},involvedObject.uid={cluster_uid}"
        )))
        .await
        .expect("core events");
    assert!(
        described
            .items
            .iter()
            .any(|e| e.reason.as_deref() == Some(REASON_SCALE_DOWN)),
        "{described:?}"
    );

    // One event per target, on the Deployment, with the replicas and the reason.
    for (name, from) in [(KCM, 3), (MCM, 2), (CA, 2)] {
        assert_scaled_down_event(&seed, &ns, name, from).await;
    }

    shoot.kubelets().resume_all();
    wait_replicas(&seed, &ns, &[(KCM, 3), (MCM, 2), (CA, 2)]).await;
    let ups = wait_events(&seed, "default", "Cluster", &ns, REASON_SCALE_UP).await;
    let last = note(ups.last().expect("an event"));
    assert!(
        last.contains(" < 0.60): scaling up cluster-autoscaler, kube-controller-manager, machine-controller-manager"),
        "{last:?}"
    );
    eprintln!("Cluster event: {last}");
    for (name, to) in [(KCM, 3), (MCM, 2), (CA, 2)] {
        assert_scaled_up_event(&seed, &ns, name, to).await;
    }

    let metrics = h.metrics_text();
    let events: Vec<&str> = metrics
        .lines()
        .filter(|l| l.starts_with("dwd_events_total"))
        .collect();
    eprintln!("{events:?}");
    assert!(events.iter().any(|l| l.contains("Published")), "{events:?}");
    assert!(
        !events
            .iter()
            .any(|l| l.contains("Failed") || l.contains("Dropped")),
        "every event is written: {events:?}"
    );
}

/// A repeated identical event becomes a series on the first one (also for the cluster-scoped
/// Cluster, whose events live in `default`); a different message is a new event, never folded
/// into the earlier one.
#[tokio::test]
async fn repeated_events_aggregate_and_new_messages_stay_separate() {
    let client = seed_client().await.expect("seed client");
    let metrics = Arc::new(Metrics::default());
    let events = Events::start(
        client.clone(),
        Component::Prober,
        dependency_watchdog::observe::events::PodRef {
            namespace: "default".into(),
            name: "dwd-events-series-test".into(),
        },
        metrics.clone(),
    );
    // No such Cluster: the UID lookup finds nothing and the event is written without one.
    let cluster = "shoot--ev--series";
    let first = "4/5 node leases expired (0.80 ≥ 0.60)";
    let second = "5/5 node leases expired (1.00 ≥ 0.60)";
    events.scaling_decision(cluster, None, Direction::Down, first, &[KCM], None);
    events.scaling_decision(cluster, None, Direction::Down, first, &[KCM], None);
    events.scaling_decision(cluster, None, Direction::Down, second, &[KCM], None);
    let published = |n: u64| {
        let m = metrics.clone();
        async move {
            let got = m
                .events
                .get_or_create(&EventLabels {
                    outcome: EventOutcome::Published,
                })
                .get();
            let failed = m
                .events
                .get_or_create(&EventLabels {
                    outcome: EventOutcome::Failed,
                })
                .get();
            if failed > 0 {
                return Err(format!("{failed} event writes failed"));
            }
            Ok((got >= n).then_some(()))
        }
    };
    // Each event is written twice: events.k8s.io about the Cluster, core/v1 about the pod.
    eventually(DEADLINE, "3 events written twice", || published(6))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let found = events_about(&client, "default", "Cluster", cluster, REASON_SCALE_DOWN).await;
    let notes: Vec<(&str, Option<i32>)> = found
        .iter()
        .map(|e| (note(e), e.series.as_ref().map(|s| s.count)))
        .collect();
    assert_eq!(
        notes,
        [
            (format!("{first}: scaling down {KCM}").as_str(), Some(2)),
            (format!("{second}: scaling down {KCM}").as_str(), None),
        ],
    );

    // The core/v1 copies about the watchdog's own pod aggregate the same way, client-go
    // style: one event per message, its `count` raised by each repetition.
    let mut copies: Vec<(String, i32)> = Api::<CoreEvent>::namespaced(client.clone(), "default")
        .list(&ListParams::default())
        .await
        .expect("list core events")
        .items
        .into_iter()
        .filter(|e| {
            e.involved_object.kind.as_deref() == Some("Pod")
                && e.involved_object.name.as_deref() == Some("dwd-events-series-test")
                && e.reason.as_deref() == Some(REASON_SCALE_DOWN)
        })
        .map(|e| (e.message.unwrap_or_default(), e.count.unwrap_or(0)))
        .collect();
    copies.sort();
    assert_eq!(
        copies,
        [
            (format!("Cluster {cluster}: {first}: scaling down {KCM}"), 2),
            (
                format!("Cluster {cluster}: {second}: scaling down {KCM}"),
                1
            ),
        ],
    );
}

#[tokio::test]
async fn a_pod_the_weeder_deletes_gets_an_event_naming_container_and_service() {
    const SVC: &str = "etcd-events";
    // The weeder needs only the seed, not the prober harness.
    let client = seed_client().await.expect("seed client");
    let ns = weeder_harness::namespace(&client, "ev-weeder")
        .await
        .expect("namespace");
    ns.create_crashlooping_pod("kapi-crash", &[("role", "apiserver")])
        .await
        .expect("pod");
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns.namespace());
    let uid = weeder_harness::uid_of(&ns, "kapi-crash")
        .await
        .expect("uid");
    ns.set_endpoint_slice(SVC, 1, EndpointsState::NotReady)
        .await
        .expect("slice");

    let weeder = weeder_harness::Running::start(
        client.clone(),
        weeder_harness::config("30s", &[(SVC, &["apiserver"])]),
    )
    .await
    .expect("weeder ready");

    ns.set_endpoint_slice(SVC, 1, EndpointsState::AllReady)
        .await
        .expect("slice ready");
    let found = wait_events(
        &client,
        ns.namespace(),
        "Pod",
        "kapi-crash",
        REASON_POD_DELETED,
    )
    .await;
    assert!(
        pods.get_opt("kapi-crash").await.expect("get").is_none(),
        "the pod is deleted"
    );
    assert_eq!(found.len(), 1, "{found:?}");
    let e = &found[0];
    assert_eq!(
        note(e),
        format!("deleted: container main in CrashLoopBackOff; service {SVC} is ready again")
    );
    assert_eq!(e.reporting_controller.as_deref(), Some(WEEDER));
    assert_eq!(e.action.as_deref(), Some("Delete"));
    let r = e.regarding.as_ref().expect("regarding");
    assert_eq!(r.uid.as_deref(), Some(uid.as_str()));
    assert_eq!(r.namespace.as_deref(), Some(ns.namespace()));
    eprintln!("Pod event: {}", note(e));

    weeder.stop().await.expect("weeder ended cleanly");
}
