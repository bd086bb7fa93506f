//! The weeder in shadow mode (`--shadow`) against a real seed kube-apiserver: it deletes
//! nothing, reports the crash-looping pods it would have deleted, sees the acting watchdog's
//! deletions, and compares the two (agree / only_us).
//!
//! Each test runs its weeders in-process (`weeder::run` acting, and with a `Shadow`
//! in shadow mode) with its own service names and namespaces, so tests running in parallel on
//! the shared seed never see each other's slices.

// A test crate: a failed assumption is a failed test (outside tests the workspace denies these).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use dependency_watchdog::observe::events::Component;
use dependency_watchdog::shadow::{Shadow, pod_key};
use dwd_sim::EndpointsState;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, Patch, PatchParams};

mod harness;

use harness::in_process::weeder_harness::{DEADLINE, Running, config, namespace, pod_uid, uid_of};
use harness::in_process::{seed_client, wait_until};

/// `base`, counting the pod watches whose response began: from then on the apiserver has the
/// watch registered, so every later pod change reaches it, in resourceVersion order.
fn counting_pod_watches(base: kube::Client, answered: Arc<AtomicUsize>) -> kube::Client {
    let service = tower::service_fn(move |request: http::Request<kube::client::Body>| {
        let (base, answered) = (base.clone(), answered.clone());
        async move {
            let pod_watch = request.uri().path().ends_with("/pods")
                && request
                    .uri()
                    .query()
                    .is_some_and(|q| q.split('&').any(|p| p == "watch=true" || p == "watch=1"));
            let response = base.send(request).await.map_err(tower::BoxError::from)?;
            if pod_watch && response.status().is_success() {
                answered.fetch_add(1, Ordering::SeqCst);
            }
            Ok::<_, tower::BoxError>(response)
        }
    });
    kube::Client::new(service, "default")
}

/// Our acting weeder and our shadow weeder on the same seed: the service turns ready while a
/// dependant is healthy, then the dependant crash-loops. The acting one deletes it; the shadow
/// deletes nothing, would have, sees the deletion, and records an agreement.
#[tokio::test]
async fn the_shadow_agrees_with_the_acting_weeders_deletion() -> Result<()> {
    const SVC: &str = "etcd-shadow-agree";
    let client = seed_client().await?;
    let ns = namespace(&client, "wd-shadow-agree").await?;
    ns.create_running_pod("kapi", &[("role", "apiserver")])
        .await?;
    let uid = uid_of(&ns, "kapi").await?;
    ns.set_endpoint_slice(SVC, 1, EndpointsState::NotReady)
        .await?;

    let acting = Running::start(client.clone(), config("60s", &[(SVC, &["apiserver"])])).await?;
    let shadow_watches = Arc::new(AtomicUsize::new(0));
    let shadow = Running::start_with_shadow(
        counting_pod_watches(client.clone(), shadow_watches.clone()),
        config("60s", &[(SVC, &["apiserver"])]),
        Some(Shadow::new(Component::Weeder, Duration::from_secs(20))),
    )
    .await?;

    // Both weeders start and watch the healthy pod; only then does it crash-loop, so the
    // shadow's watch sees the crash loop before the acting weeder's deletion, whatever the
    // timing of the two.
    ns.set_endpoint_slice(SVC, 1, EndpointsState::AllReady)
        .await?;
    acting.wait_started(ns.namespace(), SVC).await?;
    shadow.wait_started(ns.namespace(), SVC).await?;
    wait_until(DEADLINE, "the shadow weeder's pod watch", || {
        shadow_watches.load(Ordering::SeqCst) >= 1
    })
    .await?;
    ensure!(pod_uid(&ns, "kapi").await? == Some(uid.clone()));
    ns.set_crashlooping("kapi", true).await?;

    let key = pod_key(ns.namespace(), "kapi", &uid);
    let record = shadow.wait_record(&key).await?;
    eprintln!("shadow record: {record:?}");
    ensure!(
        (record.action, record.verdict) == ("delete_pod", "agree"),
        "{record:?}"
    );
    let lag = record.reference_lag_seconds.context("an agreement's lag")?;
    ensure!((0.0..20.0).contains(&lag), "lag {lag} s: {record:?}");
    let ours = record.ours.as_deref().unwrap_or_default();
    ensure!(
        ours.contains("container") && ours.contains("CrashLoopBackOff") && ours.contains(SVC),
        "{record:?}"
    );
    let reference = record.reference.as_deref().unwrap_or_default();
    ensure!(
        reference.starts_with("pod deleted (by the acting weeder or anyone else"),
        "{record:?}"
    );
    ensure!(
        pod_uid(&ns, "kapi").await?.is_none(),
        "the acting weeder deleted it"
    );
    ensure!(
        acting.deleted(SVC) == 1,
        "acting deletions {}",
        acting.deleted(SVC)
    );
    ensure!(
        shadow.deleted(SVC) == 0,
        "the shadow deleted {}",
        shadow.deleted(SVC)
    );
    ensure!(shadow.would_delete() == 1);
    ensure!(shadow.comparisons("agree") == 1.0);
    ensure!(shadow.comparisons("only_us") == 0.0 && shadow.comparisons("only_reference") == 0.0);
    shadow.stop().await?;
    acting.stop().await
}

/// The shadow weeder alone: a crash-looping dependant is not deleted; after the window the
/// would-be deletion is `only_us`. A crash-looping dependant someone else deletes gracefully (a
/// finalizer keeps it terminating) is seen by its `deletionTimestamp` and agrees.
#[tokio::test]
async fn the_shadow_weeder_alone_deletes_nothing_and_reports_only_us() -> Result<()> {
    const SVC: &str = "etcd-shadow-alone";
    const HOLD: &str = "dwd.test/hold";
    let client = seed_client().await?;
    let ns = namespace(&client, "wd-shadow-alone").await?;
    ns.create_crashlooping_pod("kapi-crash", &[("role", "apiserver")])
        .await?;
    ns.create_crashlooping_pod("kapi-held", &[("role", "apiserver")])
        .await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns.namespace());
    let finalizers =
        |list: Vec<&str>| Patch::Merge(serde_json::json!({"metadata": {"finalizers": list}}));
    pods.patch(
        "kapi-held",
        &PatchParams::default(),
        &finalizers(vec![HOLD]),
    )
    .await?;
    let crash_uid = uid_of(&ns, "kapi-crash").await?;
    let held_uid = uid_of(&ns, "kapi-held").await?;
    ns.set_endpoint_slice(SVC, 1, EndpointsState::NotReady)
        .await?;

    let window = Duration::from_secs(4);
    let deletes = Arc::new(AtomicUsize::new(0));
    let shadow = Running::start_with_shadow(
        counting_deletes(client.clone(), deletes.clone()),
        config("30s", &[(SVC, &["apiserver"])]),
        Some(Shadow::new(Component::Weeder, window)),
    )
    .await?;
    ns.set_endpoint_slice(SVC, 1, EndpointsState::AllReady)
        .await?;
    wait_until(DEADLINE, "two would-be deletions", || {
        shadow.would_delete() >= 2
    })
    .await?;
    ensure!(
        pod_uid(&ns, "kapi-crash").await? == Some(crash_uid.clone()),
        "shadow mode must not delete"
    );

    // Someone else (the acting watchdog, here the test) deletes the held pod: it stays,
    // terminating, until its finalizer goes.
    pods.delete("kapi-held", &DeleteParams::default()).await?;
    let held = shadow
        .wait_record(&pod_key(ns.namespace(), "kapi-held", &held_uid))
        .await?;
    ensure!(held.verdict == "agree", "{held:?}");
    ensure!(
        held.reference
            .as_deref()
            .is_some_and(|r| r.contains("(deletionTimestamp ")),
        "{held:?}"
    );

    let crash = shadow
        .wait_record(&pod_key(ns.namespace(), "kapi-crash", &crash_uid))
        .await?;
    eprintln!("shadow record: {crash:?}");
    ensure!(
        (crash.action, crash.verdict) == ("delete_pod", "only_us"),
        "{crash:?}"
    );
    ensure!(
        crash.reference.is_none() && crash.ours.is_some(),
        "{crash:?}"
    );
    ensure!(
        pod_uid(&ns, "kapi-crash").await? == Some(crash_uid),
        "still there after the window"
    );
    ensure!(shadow.deleted(SVC) == 0);
    ensure!(
        deletes.load(Ordering::SeqCst) == 0,
        "the shadow sent no DELETE"
    );
    ensure!(shadow.would_delete() == 2, "one would-be deletion per pod");
    ensure!(shadow.comparisons("only_us") == 1.0 && shadow.comparisons("agree") == 1.0);

    pods.patch("kapi-held", &PatchParams::default(), &finalizers(vec![]))
        .await?;
    shadow.stop().await
}

/// `base`, holding every pod list and watch request until `gate` has permits; `arrived` counts
/// the requests that came to the gate.
fn gated_pod_reads(
    base: kube::Client,
    gate: Arc<tokio::sync::Semaphore>,
    arrived: Arc<AtomicUsize>,
) -> kube::Client {
    let service = tower::service_fn(move |request: http::Request<kube::client::Body>| {
        let (base, gate, arrived) = (base.clone(), gate.clone(), arrived.clone());
        async move {
            if request.method() == http::Method::GET && request.uri().path().ends_with("/pods") {
                arrived.fetch_add(1, Ordering::SeqCst);
                drop(gate.acquire().await.map_err(tower::BoxError::from)?);
            }
            base.send(request).await.map_err(tower::BoxError::from)
        }
    });
    kube::Client::new(service, "default")
}

/// `base`, counting the DELETE requests it sends.
fn counting_deletes(base: kube::Client, deletes: Arc<AtomicUsize>) -> kube::Client {
    let service = tower::service_fn(move |request: http::Request<kube::client::Body>| {
        let (base, deletes) = (base.clone(), deletes.clone());
        async move {
            if request.method() == http::Method::DELETE {
                deletes.fetch_add(1, Ordering::SeqCst);
            }
            base.send(request).await.map_err(tower::BoxError::from)
        }
    });
    kube::Client::new(service, "default")
}

/// The acting watchdog's weeder started on the same slice event as ours and deleted a
/// crash-looping dependant (gracefully: it stays terminating) before our watch listed it. Our
/// list shows it crash-looping and already terminating: we would have deleted it, the acting
/// watchdog did, first — an agreement with the acting watchdog ahead.
#[tokio::test]
async fn a_deletion_that_beats_the_shadows_first_list_still_agrees() -> Result<()> {
    const SVC: &str = "etcd-shadow-race";
    const HOLD: &str = "dwd.test/hold";
    let client = seed_client().await?;
    let ns = namespace(&client, "wd-shadow-race").await?;
    ns.create_crashlooping_pod("kapi", &[("role", "apiserver")])
        .await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns.namespace());
    let finalizers =
        |list: Vec<&str>| Patch::Merge(serde_json::json!({"metadata": {"finalizers": list}}));
    pods.patch("kapi", &PatchParams::default(), &finalizers(vec![HOLD]))
        .await?;
    let uid = uid_of(&ns, "kapi").await?;
    ns.set_endpoint_slice(SVC, 1, EndpointsState::NotReady)
        .await?;

    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let arrived = Arc::new(AtomicUsize::new(0));
    let shadow = Running::start_with_shadow(
        gated_pod_reads(client.clone(), gate.clone(), arrived.clone()),
        config("30s", &[(SVC, &["apiserver"])]),
        Some(Shadow::new(Component::Weeder, Duration::from_secs(20))),
    )
    .await?;
    ns.set_endpoint_slice(SVC, 1, EndpointsState::AllReady)
        .await?;
    shadow.wait_started(ns.namespace(), SVC).await?;
    wait_until(DEADLINE, "the shadow weeder's first pod list, held", || {
        arrived.load(Ordering::SeqCst) >= 1
    })
    .await?;
    // The acting watchdog is faster.
    pods.delete("kapi", &DeleteParams::default()).await?;
    gate.add_permits(tokio::sync::Semaphore::MAX_PERMITS / 2);

    let record = shadow
        .wait_record(&pod_key(ns.namespace(), "kapi", &uid))
        .await?;
    eprintln!("shadow record: {record:?}");
    ensure!(
        (record.action, record.verdict) == ("delete_pod", "agree"),
        "{record:?}"
    );
    let lag = record.reference_lag_seconds.context("an agreement's lag")?;
    ensure!(lag <= 0.0, "the acting watchdog was first: lag {lag} s");
    ensure!(
        record
            .reference
            .as_deref()
            .is_some_and(|r| r.contains("before our weeder's first list")),
        "{record:?}"
    );
    ensure!(
        record
            .ours
            .as_deref()
            .is_some_and(|r| r.contains("when our weeder first listed the pod")),
        "{record:?}"
    );
    ensure!(shadow.would_delete() == 1 && shadow.deleted(SVC) == 0);

    pods.patch("kapi", &PatchParams::default(), &finalizers(vec![]))
        .await?;
    shadow.stop().await
}
