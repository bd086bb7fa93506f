//! The weeder against a real seed kube-apiserver: EndpointSlices turn ready, crash-looping
//! dependants (simulated pod status) are deleted, everything else is left alone.
//!
//! Each test runs its own `weeder::run` in-process with its own service names and namespaces,
//! so tests running in parallel on the shared seed never see each other's slices. Negative
//! checks ("nothing started") are ordered behind a *sentinel*: a later slice event in another
//! namespace whose effect we wait for. The slice watch is one ordered stream, so once the
//! sentinel's weeder runs, every earlier slice event has been handled.

// A test crate: a failed assumption is a failed test (outside tests the workspace denies these).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, ensure};
use dwd_sim::seed::endpoint_slice_name;
use dwd_sim::{AbortOnDrop, EndpointsState, SeedControlPlane};
use dwd_testenv::{ApiServer, ApiServerOptions, TestEnv, eventually};
use futures::StreamExt;
use http_body_util::BodyExt;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, ListParams};

mod harness;

use harness::in_process::weeder_harness::{
    DEADLINE, Running, assert_kept, config, namespace, pod_uid, uid_of, wait_gone,
};
use harness::in_process::{seed_client, wait_until};

#[tokio::test]
async fn only_crashlooping_dependants_in_the_ready_slices_namespace_are_deleted() -> Result<()> {
    const SVC: &str = "etcd-only";
    let client = seed_client().await?;
    let ns = namespace(&client, "wd-only-a").await?;
    let other = namespace(&client, "wd-only-other").await?;
    let sentinel = namespace(&client, "wd-only-sentinel").await?;
    ns.create_crashlooping_pod("kapi-crash", &[("role", "apiserver")])
        .await?;
    ns.create_running_pod("kapi-healthy", &[("role", "apiserver")])
        .await?;
    ns.create_crashlooping_pod("etcd-crash", &[("role", "etcd")])
        .await?;
    other
        .create_crashlooping_pod("kapi-crash", &[("role", "apiserver")])
        .await?;
    sentinel
        .create_crashlooping_pod("kapi-crash", &[("role", "apiserver")])
        .await?;
    let etcd_uid = uid_of(&ns, "etcd-crash").await?;
    let other_uid = uid_of(&other, "kapi-crash").await?;
    ns.set_endpoint_slice(SVC, 2, EndpointsState::NotReady)
        .await?;
    other
        .set_endpoint_slice(SVC, 2, EndpointsState::NotReady)
        .await?;

    let w = Running::start(client.clone(), config("6s", &[(SVC, &["apiserver"])])).await?;
    let started = Instant::now();
    ns.set_endpoint_slice(SVC, 2, EndpointsState::AllReady)
        .await?;
    wait_gone(&ns, "kapi-crash").await?;
    eprintln!(
        "crash-looping pod deleted {:?} after its slice turned ready",
        started.elapsed()
    );
    w.wait_started(ns.namespace(), SVC).await?;

    // A dependant that starts crash-looping while the weeder runs is deleted too.
    ensure!(w.weeders.active() == 1, "the weeder must still run");
    ns.set_crashlooping("kapi-healthy", true).await?;
    wait_gone(&ns, "kapi-healthy").await?;
    ensure!(
        started.elapsed() < Duration::from_secs(6),
        "second deletion must fall within watchDuration for this test to mean anything"
    );

    // After watchDuration the weeder is gone; a pod crash-looping now stays.
    w.wait_idle().await?;
    ensure!(w.weeders.started_total() == 1);
    ns.create_crashlooping_pod("kapi-late", &[("role", "apiserver")])
        .await?;
    let late_uid = uid_of(&ns, "kapi-late").await?;
    sentinel
        .set_endpoint_slice(SVC, 1, EndpointsState::AllReady)
        .await?;
    wait_gone(&sentinel, "kapi-crash").await?;
    ensure!(
        w.weeders.keys() == [format!("wd-only-sentinel/{}", endpoint_slice_name(SVC))],
        "only the sentinel's weeder runs: {:?}",
        w.weeders.keys()
    );
    assert_kept(&ns, "kapi-late", &late_uid).await?;
    assert_kept(&ns, "etcd-crash", &etcd_uid).await?;
    assert_kept(&other, "kapi-crash", &other_uid).await?;
    w.expect_deleted(SVC, 3).await?;
    w.stop().await
}

#[tokio::test]
async fn slices_not_fully_ready_start_nothing_until_they_turn_ready() -> Result<()> {
    const SVC: &str = "etcd-partial";
    let client = seed_client().await?;
    let cases = [
        ("wd-partial-notready", EndpointsState::NotReady),
        ("wd-partial-partly", EndpointsState::PartlyReady(2)),
        ("wd-partial-empty", EndpointsState::Empty),
    ];
    let mut spaces = Vec::new();
    for (name, _) in &cases {
        let ns = namespace(&client, name).await?;
        ns.create_crashlooping_pod("kapi-crash", &[("role", "apiserver")])
            .await?;
        spaces.push(ns);
    }
    let sentinel = namespace(&client, "wd-partial-sentinel").await?;
    sentinel
        .create_crashlooping_pod("kapi-crash", &[("role", "apiserver")])
        .await?;

    let w = Running::start(client.clone(), config("60s", &[(SVC, &["apiserver"])])).await?;
    // Created not ready, then updated while staying not (fully) ready.
    for (ns, (_, state)) in spaces.iter().zip(&cases) {
        ns.set_endpoint_slice(SVC, 3, EndpointsState::NotReady)
            .await?;
        ns.set_endpoint_slice(SVC, 3, *state).await?;
    }
    sentinel
        .set_endpoint_slice(SVC, 1, EndpointsState::AllReady)
        .await?;
    wait_gone(&sentinel, "kapi-crash").await?;
    ensure!(
        w.weeders.started_total() == 1,
        "only the sentinel started a weeder: {:?}",
        w.weeders.keys()
    );
    for ns in &spaces {
        ensure!(
            pod_uid(ns, "kapi-crash").await?.is_some(),
            "{}: nothing may be deleted before the slice is ready",
            ns.namespace()
        );
    }

    for ns in &spaces {
        ns.set_endpoint_slice(SVC, 3, EndpointsState::AllReady)
            .await?;
        wait_gone(ns, "kapi-crash").await?;
    }
    ensure!(w.weeders.started_total() == 4);
    ensure!(w.weeders.active() == 4 && w.metrics.active_weeders.get() == 4);
    w.stop().await
}

#[tokio::test]
async fn a_slice_ready_at_startup_starts_a_weeder_and_a_deleted_slice_starts_nothing() -> Result<()>
{
    const SVC: &str = "etcd-startup";
    let client = seed_client().await?;
    let ns = namespace(&client, "wd-startup").await?;
    ns.set_endpoint_slice(SVC, 1, EndpointsState::AllReady)
        .await?;
    ns.create_crashlooping_pod("kapi-crash", &[("role", "apiserver")])
        .await?;
    let w = Running::start(client.clone(), config("60s", &[(SVC, &["apiserver"])])).await?;
    wait_gone(&ns, "kapi-crash").await?;
    ensure!(w.weeders.started_total() == 1);

    // Deleting the slice starts nothing; re-creating it ready is a creation and does.
    ns.delete_endpoint_slice(SVC).await?;
    ns.set_endpoint_slice(SVC, 1, EndpointsState::AllReady)
        .await?;
    wait_until(DEADLINE, "second weeder", || w.weeders.started_total() == 2).await?;
    ensure!(w.weeders.active() == 1, "{:?}", w.weeders.keys());
    w.stop().await
}

#[tokio::test]
async fn a_second_ready_transition_replaces_the_first_weeder() -> Result<()> {
    const SVC: &str = "etcd-replace";
    let client = seed_client().await?;
    let ns = namespace(&client, "wd-replace").await?;
    ns.set_endpoint_slice(SVC, 1, EndpointsState::NotReady)
        .await?;
    let proxy = Proxy::start(client.clone(), false).await?;
    let pods_path = format!("/api/v1/namespaces/{}/pods", ns.namespace());
    // Two selectors: each weeder holds two pod watches.
    let cfg = config("60s", &[(SVC, &["apiserver", "scheduler"])]);
    let w = Running::start(proxy.client()?, cfg).await?;

    ns.set_endpoint_slice(SVC, 1, EndpointsState::AllReady)
        .await?;
    w.wait_started(ns.namespace(), SVC).await?;
    proxy.wait_open_watches(&pods_path, 2).await?;

    ns.set_endpoint_slice(SVC, 1, EndpointsState::NotReady)
        .await?;
    ns.set_endpoint_slice(SVC, 1, EndpointsState::AllReady)
        .await?;
    wait_until(DEADLINE, "replacement weeder", || {
        w.weeders.started_total() == 2
    })
    .await?;
    wait_until(DEADLINE, "one weeder, one task", || {
        w.weeders.active() == 1
            && w.weeders.live_tasks() == 1
            && w.metrics.active_weeders.get() == 1
    })
    .await?;
    // The first weeder's watches are closed: two open, four opened in all. Wait for the
    // replacement's watches to start first: until then the old weeder's two also make "two open".
    wait_until(DEADLINE, "the replacement's pod watches", || {
        proxy.watches_started(&pods_path) >= 4
    })
    .await?;
    proxy.wait_open_watches(&pods_path, 2).await?;
    ensure!(
        proxy.watches_started(&pods_path) == 4,
        "pod watches opened: {}",
        proxy.watches_started(&pods_path)
    );

    // The replacement weeds; each pod is deleted once though two selectors may see it.
    ns.create_crashlooping_pod("kapi-crash", &[("role", "apiserver")])
        .await?;
    ns.create_crashlooping_pod("scheduler-crash", &[("role", "scheduler")])
        .await?;
    wait_gone(&ns, "kapi-crash").await?;
    wait_gone(&ns, "scheduler-crash").await?;
    w.expect_deleted(SVC, 2).await?;
    w.stop().await?;
    proxy.wait_open_watches(&pods_path, 0).await
}

/// An apiserver of its own, in the shared environment, started with `extra_arg`.
async fn apiserver_with_arg(name: &str, extra_arg: &str) -> Result<ApiServer> {
    let options = ApiServerOptions {
        extra_args: vec![extra_arg.into()],
        ..Default::default()
    };
    Ok(TestEnv::shared()
        .await?
        .start_apiserver_with(name, options)
        .await?)
}

#[tokio::test]
async fn deletions_continue_after_the_server_ends_the_watches() -> Result<()> {
    const SVC: &str = "etcd-timeout";
    // The apiserver ends every watch that asks for no timeout after 2–4 s; the proxy drops
    // the client's `timeoutSeconds`, so the server's limit is the one that applies.
    let server = apiserver_with_arg("weeder-watch-timeout", "--min-request-timeout=2").await?;
    let client = server.client().await?;
    let proxy = Proxy::start(client.clone(), true).await?;
    let ns = namespace(&client, "wd-timeout").await?;
    let pods_path = format!("/api/v1/namespaces/{}/pods", ns.namespace());
    let slices_path = "/apis/discovery.k8s.io/v1/endpointslices";

    let w = Running::start(proxy.client()?, config("60s", &[(SVC, &["apiserver"])])).await?;
    ns.set_endpoint_slice(SVC, 1, EndpointsState::AllReady)
        .await?;
    w.wait_started(ns.namespace(), SVC).await?;
    // Watch 1 is the first; before each round the server has ended the current pod watch
    // and the weeder has made a new one.
    for round in 0..3u64 {
        wait_until(
            DEADLINE,
            "the server ended the pod watch and it was re-made",
            || proxy.watches_started(&pods_path) >= round + 2,
        )
        .await?;
        let pod = format!("kapi-crash-{round}");
        ns.create_crashlooping_pod(&pod, &[("role", "apiserver")])
            .await?;
        wait_gone(&ns, &pod).await?;
    }
    eprintln!(
        "pod watches opened: {}, endpoint slice watches opened: {}",
        proxy.watches_started(&pods_path),
        proxy.watches_started(slices_path)
    );
    ensure!(proxy.watches_started(&pods_path) >= 4);
    ensure!(proxy.watches_started(slices_path) >= 2);
    // Re-made slice watches resume where they were: no weeder restarts.
    ensure!(w.weeders.started_total() == 1);
    w.expect_deleted(SVC, 3).await?;
    w.stop().await
}

/// A configured service name that cannot be a label value (a space, a `/`, over 63
/// characters) is dead alone, as in the reference (which matches client-side): the other
/// services are weeded. In the server-side selector it made the apiserver refuse the slice
/// watch, and then no service was weeded at all (docs/faults.md).
#[tokio::test]
async fn a_service_name_that_is_no_label_value_leaves_the_other_services_weeded() -> Result<()> {
    const SVC: &str = "etcd-next-to-bad-names";
    let client = seed_client().await?;
    let ns = namespace(&client, "wd-bad-names").await?;
    ns.create_crashlooping_pod("kapi-crash", &[("role", "apiserver")])
        .await?;
    let long = "x".repeat(64);
    let config = config(
        "6s",
        &[
            (SVC, &["apiserver"]),
            ("etcd main", &["apiserver"]),
            ("garden/etcd", &["apiserver"]),
            (long.as_str(), &["apiserver"]),
        ],
    );
    let w = Running::start(client.clone(), config).await?;
    ns.set_endpoint_slice(SVC, 1, EndpointsState::AllReady)
        .await?;
    wait_gone(&ns, "kapi-crash").await?;
    w.expect_deleted(SVC, 1).await?;
    w.stop().await
}

/// The answers (HTTP codes) to every DELETE of pod `kapi` in `namespace` that `server`'s
/// audit log records, once the log has caught up with this call.
async fn audited_deletes_of_kapi(
    server: &ApiServer,
    client: &kube::Client,
    namespace: &str,
) -> Result<Vec<i64>> {
    // The audit log is written in batches; a request after everything else marks the end.
    let marker = format!("/api/v1/namespaces/{namespace}/configmaps/audit-marker");
    let _ = Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(client.clone(), namespace)
        .get_opt("audit-marker")
        .await?;
    let log = server.audit_log_path();
    let (log, marker) = (&log, &marker);
    eventually(DEADLINE, "the audit log flushed", || async move {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        let entries: Vec<serde_json::Value> = text
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .filter(|e: &serde_json::Value| e["stage"] == "ResponseComplete")
            .collect();
        if !entries.iter().any(|e| e["requestURI"] == marker.as_str()) {
            return Ok(None);
        }
        Ok(Some(
            entries
                .into_iter()
                .filter(|e| {
                    e["verb"] == "delete"
                        && e["objectRef"]["resource"] == "pods"
                        && e["objectRef"]["name"] == "kapi"
                })
                .map(|e| e["responseStatus"]["code"].as_i64().unwrap_or(0))
                .collect::<Vec<_>>(),
        ))
    })
    .await
    .map_err(anyhow::Error::msg)
}

/// A dual-stack service has two EndpointSlices (IPv4, IPv6); both turning ready start two
/// weeders (one per slice) watching the same pods. A scheduled pod is deleted gracefully, so it
/// stays, terminating, and a second DELETE of it succeeds again: without the namespace's shared
/// claims both weeders, having both seen it crash-loop, each deleted it once. The seed's audit
/// log counts every successful DELETE (docs/faults.md).
#[tokio::test]
async fn a_pod_of_a_dual_stack_service_is_deleted_once() -> Result<()> {
    const SVC: &str = "etcd-dual-stack";
    let options = ApiServerOptions {
        audit_log: true,
        ..Default::default()
    };
    let server = TestEnv::shared()
        .await?
        .start_apiserver_with("weeder-dual-stack", options)
        .await?;
    let client = server.client().await?;
    let proxy = Proxy::start(client.clone(), false).await?;
    let ns = namespace(&client, "wd-dual-stack").await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns.namespace());
    // Scheduled (a node name) with a grace period: the apiserver deletes it gracefully, as
    // it does the seed's real pods; an unscheduled pod would vanish at the first DELETE.
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "kapi", "labels": {"role": "apiserver"}},
        "spec": {"nodeName": "node-a", "terminationGracePeriodSeconds": 300,
                 "containers": [{"name": "kube-apiserver", "image": "registry.invalid/kapi:1"}]}
    }))?;
    pods.create(&Default::default(), &pod).await?;
    ns.set_crashlooping("kapi", false).await?;
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), ns.namespace());
    let slice = |family: &str, address: &str| -> Result<EndpointSlice> {
        Ok(serde_json::from_value(serde_json::json!({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": format!("{SVC}-{}", family.to_lowercase()),
                         "labels": {"kubernetes.io/service-name": SVC}},
            "addressType": family,
            "endpoints": [{"addresses": [address], "conditions": {"ready": true}}],
            "ports": [{"name": "https", "port": 443, "protocol": "TCP"}]
        }))?)
    };

    let w = Running::start(proxy.client()?, config("8s", &[(SVC, &["apiserver"])])).await?;
    let started = Instant::now();
    slices
        .create(&Default::default(), &slice("IPv4", "10.0.0.1")?)
        .await?;
    slices
        .create(&Default::default(), &slice("IPv6", "fd00::1")?)
        .await?;
    wait_until(DEADLINE, "a weeder per slice", || w.weeders.active() == 2).await?;
    // Both weeders watch the pods before the pod crash-loops: each sees the crash-loop first.
    let pods_path = format!("/api/v1/namespaces/{}/pods", ns.namespace());
    proxy.wait_open_watches(&pods_path, 2).await?;
    ns.set_crashlooping("kapi", true).await?;
    let pods_ref = &pods;
    eventually(DEADLINE, "pod kapi terminating", || async move {
        match pods_ref.get_opt("kapi").await {
            Ok(p) => Ok(p.and_then(|p| p.metadata.deletion_timestamp).map(|_| ())),
            Err(e) => Err(e.to_string()),
        }
    })
    .await
    .map_err(anyhow::Error::msg)?;
    // Both weeders live until their watchDuration: a second deletion would happen by then.
    w.wait_idle().await?;
    ensure!(
        started.elapsed() > Duration::from_secs(8),
        "the weeders must have lived their watchDuration"
    );
    let deletes = audited_deletes_of_kapi(&server, &client, ns.namespace()).await?;
    ensure!(
        deletes == [200],
        "one successful DELETE of the pod expected, the audit log has these answers: {deletes:?}"
    );
    w.expect_deleted(SVC, 1).await?;
    w.stop().await
}

/// A seed without WatchList refuses the streaming list the pod watches start with; the
/// weeder falls back to list + watch and still deletes.
#[tokio::test]
async fn a_seed_without_watch_list_gets_list_and_watch() -> Result<()> {
    const SVC: &str = "etcd-no-watchlist";
    let server =
        apiserver_with_arg("weeder-no-watchlist", "--feature-gates=WatchList=false").await?;
    let client = server.client().await?;
    let ns = namespace(&client, "wd-no-watchlist").await?;
    ns.create_crashlooping_pod("kapi-crash", &[("role", "apiserver")])
        .await?;
    let w = Running::start(client.clone(), config("60s", &[(SVC, &["apiserver"])])).await?;
    ns.set_endpoint_slice(SVC, 1, EndpointsState::AllReady)
        .await?;
    wait_gone(&ns, "kapi-crash").await?;
    w.expect_deleted(SVC, 1).await?;
    w.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crashlooping_apiservers_of_200_shoots_are_deleted_when_etcd_comes_back() -> Result<()> {
    const SHOOTS: usize = 200;
    const ETCD: &str = "etcd-main-client";
    let client = seed_client().await?;
    let setup = Instant::now();
    let spaces: Vec<SeedControlPlane> = futures::stream::iter(0..SHOOTS)
        .map(|i| {
            let client = client.clone();
            async move {
                let ns = namespace(&client, &format!("shoot--wd--scale-{i:03}")).await?;
                ns.create_crashlooping_pod("kube-apiserver-0", &[("role", "apiserver")])
                    .await?;
                ns.create_running_pod("kube-apiserver-1", &[("role", "apiserver")])
                    .await?;
                ns.set_endpoint_slice(ETCD, 1, EndpointsState::NotReady)
                    .await?;
                Ok::<_, anyhow::Error>(ns)
            }
        })
        .buffer_unordered(16)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Result<_>>()?;
    eprintln!("{SHOOTS} shoot namespaces set up in {:?}", setup.elapsed());

    // The seeds' weeder config.
    let cfg = config(
        "60s",
        &[
            (ETCD, &["apiserver"]),
            ("kube-apiserver", &["controller-manager", "scheduler"]),
        ],
    );
    let w = Running::start(client.clone(), cfg).await?;
    ensure!(w.weeders.started_total() == 0);

    let started = Instant::now();
    futures::stream::iter(&spaces)
        .map(|ns| ns.set_endpoint_slice(ETCD, 1, EndpointsState::AllReady))
        .buffer_unordered(32)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Result<Vec<()>, _>>()?;
    let all_ready = started.elapsed();
    wait_until(
        Duration::from_secs(60),
        "every crash-looping kube-apiserver deleted",
        || w.deleted(ETCD) == SHOOTS as u64,
    )
    .await?;
    let took = started.elapsed();
    eprintln!(
        "{SHOOTS} etcd slices turned ready within {all_ready:?}; all {SHOOTS} crash-looping \
         kube-apiserver pods deleted {took:?} after the first turned ready"
    );

    let pods: Api<Pod> = Api::all(client.clone());
    let left: Vec<String> = pods
        .list(&ListParams::default().labels("role=apiserver"))
        .await?
        .items
        .into_iter()
        .filter(|p| {
            p.metadata
                .namespace
                .as_deref()
                .is_some_and(|n| n.starts_with("shoot--wd--scale-"))
        })
        .filter_map(|p| p.metadata.name)
        .collect();
    ensure!(
        left.len() == SHOOTS && left.iter().all(|n| n == "kube-apiserver-1"),
        "only the healthy kube-apiservers remain: {} pods, e.g. {:?}",
        left.len(),
        left.iter().find(|n| *n != "kube-apiserver-1")
    );
    ensure!(w.weeders.active() == SHOOTS);
    w.stop().await
}

/// The seeds' weeder config, as Gardener mounts it (dwd-core's config tests load the same file).
const SEEDS_WEEDER_CONFIG: &str = include_str!("../../dwd-core/tests/support/seeds-weeder.yaml");

/// The binary, killed when the test ends however it ends.
struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// JSON log lines of the binary so far.
fn log_lines(path: &std::path::Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// Sends the binary SIGTERM and waits for it to exit.
async fn sigterm_and_wait(mut child: Child) -> Result<std::process::ExitStatus> {
    let pid = child.0.id().to_string();
    std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()?;
    Ok(tokio::task::spawn_blocking(move || {
        let status = child.0.wait();
        drop(child);
        status
    })
    .await??)
}

/// The log at `log_path` has three deletions in namespace `shoot--dev--e2e`, each naming its
/// pod, service, selector and container; kube-controller-manager's names service kube-apiserver.
fn assert_three_deletions_logged(log_path: &std::path::Path) -> Result<()> {
    let deletions: Vec<serde_json::Value> = log_lines(log_path)
        .into_iter()
        .filter(|l| {
            l["msg"]
                .as_str()
                .is_some_and(|m| m.starts_with("deleted crash-looping pod"))
        })
        .collect();
    ensure!(
        deletions.len() == 3,
        "three deletions logged: {deletions:#?}"
    );
    for d in &deletions {
        for field in ["namespace", "pod", "service", "selector", "container"] {
            ensure!(d[field].is_string(), "deletion log lacks {field}: {d}");
        }
        ensure!(d["namespace"] == "shoot--dev--e2e", "{d}");
    }
    let kcm = deletions
        .iter()
        .find(|d| d["pod"] == "kube-controller-manager")
        .context("kube-controller-manager deletion logged")?;
    ensure!(kcm["service"] == "kube-apiserver", "{kcm}");
    ensure!(kcm["selector"] == "role in (controller-manager)", "{kcm}");
    Ok(())
}

#[tokio::test]
async fn the_weeder_command_with_the_seeds_config_weeds_a_shoot() -> Result<()> {
    let env = TestEnv::shared().await?;
    // Its own apiserver: the binary watches these service names in every namespace.
    let server = env.start_apiserver("weeder-e2e").await?;
    let client = server.client().await?;
    let ns = namespace(&client, "shoot--dev--e2e").await?;
    let other = namespace(&client, "shoot--dev--other").await?;
    for space in [&ns, &other] {
        for (pod, role) in [
            ("kube-apiserver-a", "apiserver"),
            ("kube-apiserver-b", "apiserver"),
            ("kube-controller-manager", "controller-manager"),
        ] {
            space
                .create_crashlooping_pod(pod, &[("role", role)])
                .await?;
        }
        space
            .create_crashlooping_pod("etcd-main-0", &[("role", "main"), ("app", "etcd")])
            .await?;
        space
            .set_endpoint_slice("etcd-main-client", 1, EndpointsState::NotReady)
            .await?;
        space
            .set_endpoint_slice("kube-apiserver", 3, EndpointsState::NotReady)
            .await?;
    }
    let mut kept = Vec::new();
    for pod in [
        "kube-apiserver-a",
        "kube-apiserver-b",
        "kube-controller-manager",
        "etcd-main-0",
    ] {
        kept.push((other.clone(), pod, uid_of(&other, pod).await?));
    }
    kept.push((ns.clone(), "etcd-main-0", uid_of(&ns, "etcd-main-0").await?));

    let dir = server.kubeconfig_path().with_file_name("weeder-e2e-run");
    std::fs::create_dir_all(&dir)?;
    let config_path = dir.join("weeder-config.yaml");
    std::fs::write(&config_path, SEEDS_WEEDER_CONFIG)?;
    let log_path = dir.join("weeder.log");
    let log = std::fs::File::create(&log_path)?;
    let child = Child(
        std::process::Command::new(env!("CARGO_BIN_EXE_dependency-watchdog"))
            .arg("weeder")
            .arg("--config-file")
            .arg(&config_path)
            .arg("--kubeconfig")
            .arg(server.kubeconfig_path())
            .args(["--metrics-bind-addr", "127.0.0.1:0"])
            .args(["--health-bind-addr", "127.0.0.1:0"])
            .args(["--zap-log-level", "info", "--log-format", "json"])
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()?,
    );
    wait_until(DEADLINE, "weeder binary ready", || {
        log_lines(&log_path).iter().any(|l| {
            l["msg"]
                .as_str()
                .is_some_and(|m| m.contains("weeder ready"))
        })
    })
    .await?;

    ns.set_endpoint_slice("etcd-main-client", 1, EndpointsState::AllReady)
        .await?;
    wait_gone(&ns, "kube-apiserver-a").await?;
    wait_gone(&ns, "kube-apiserver-b").await?;
    // kube-controller-manager depends on kube-apiserver, which is not back yet.
    ensure!(pod_uid(&ns, "kube-controller-manager").await?.is_some());
    ns.set_endpoint_slice("kube-apiserver", 3, EndpointsState::AllReady)
        .await?;
    wait_gone(&ns, "kube-controller-manager").await?;
    for (space, pod, uid) in &kept {
        assert_kept(space, pod, uid).await?;
    }

    let status = sigterm_and_wait(child).await?;
    ensure!(status.success(), "weeder exited with {status}");

    assert_three_deletions_logged(&log_path)
}

// --- a recording proxy ------------------------------------------------------------------

/// A plain-HTTP reverse proxy in front of an apiserver (forwarding through an admin client),
/// which counts the watch requests it forwarded and the watch responses still open, per path.
/// With `strip_timeout`, it drops the client's `timeoutSeconds`, so the server's
/// `--min-request-timeout` decides when a watch ends.
struct Proxy {
    addr: SocketAddr,
    counts: Arc<Mutex<HashMap<String, (u64, i64)>>>,
    _task: AbortOnDrop,
}

/// Counts one open watch response from creation to drop.
struct OpenWatch {
    counts: Arc<Mutex<HashMap<String, (u64, i64)>>>,
    path: String,
}

impl Drop for OpenWatch {
    fn drop(&mut self) {
        let mut counts = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = counts.get_mut(&self.path) {
            c.1 -= 1;
        }
    }
}

impl Proxy {
    async fn start(backend: kube::Client, strip_timeout: bool) -> Result<Proxy> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let counts = Arc::new(Mutex::new(HashMap::new()));
        let c = counts.clone();
        let task = AbortOnDrop::spawn(async move {
            let mut connections = tokio::task::JoinSet::new();
            while let Ok((stream, _)) = listener.accept().await {
                let (backend, counts) = (backend.clone(), c.clone());
                let service = hyper::service::service_fn(move |req| {
                    forward(backend.clone(), counts.clone(), strip_timeout, req)
                });
                connections.spawn(async move {
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Ok(Proxy {
            addr,
            counts,
            _task: task,
        })
    }

    /// A client talking to the apiserver through this proxy.
    fn client(&self) -> Result<kube::Client> {
        let mut config = kube::Config::new(format!("http://{}", self.addr).parse()?);
        config.default_retry = false;
        Ok(kube::Client::try_from(config)?)
    }

    fn watches_started(&self, path: &str) -> u64 {
        let counts = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        counts.get(path).map_or(0, |c| c.0)
    }

    fn open_watches(&self, path: &str) -> i64 {
        let counts = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        counts.get(path).map_or(0, |c| c.1)
    }

    async fn wait_open_watches(&self, path: &str, n: i64) -> Result<()> {
        eventually(DEADLINE, &format!("{n} open watches on {path}"), || {
            let open = self.open_watches(path);
            async move {
                if open == n {
                    Ok(Some(()))
                } else {
                    Err(format!("{open} open"))
                }
            }
        })
        .await
        .map_err(|e| anyhow!(e))
    }
}

type Frame = hyper::body::Frame<hyper::body::Bytes>;
type ProxyBody = http_body_util::combinators::MapFrame<
    kube::client::Body,
    Box<dyn FnMut(Frame) -> Frame + Send + Sync>,
>;

async fn forward(
    backend: kube::Client,
    counts: Arc<Mutex<HashMap<String, (u64, i64)>>>,
    strip_timeout: bool,
    req: http::Request<hyper::body::Incoming>,
) -> Result<http::Response<ProxyBody>, kube::Error> {
    let (parts, body) = req.into_parts();
    let body = body
        .collect()
        .await
        .map(|b| b.to_bytes().to_vec())
        .unwrap_or_default();
    let path = parts.uri.path().to_string();
    let query = parts.uri.query().unwrap_or("");
    let is_watch = query
        .split('&')
        .any(|p| p == "watch=true" || p == "watch=1");
    let query: Vec<&str> = query
        .split('&')
        .filter(|p| !(p.is_empty() || strip_timeout && p.starts_with("timeoutSeconds=")))
        .collect();
    let uri = if query.is_empty() {
        path.clone()
    } else {
        format!("{path}?{}", query.join("&"))
    };
    let mut out = http::Request::builder().method(parts.method).uri(uri);
    for (name, value) in &parts.headers {
        if name != http::header::HOST {
            out = out.header(name, value);
        }
    }
    let out = out
        .body(kube::client::Body::from(body))
        .map_err(kube::Error::HttpError)?;
    let guard = is_watch.then(|| {
        let mut c = counts.lock().unwrap_or_else(|e| e.into_inner());
        let entry = c.entry(path.clone()).or_insert((0, 0));
        entry.0 += 1;
        entry.1 += 1;
        OpenWatch {
            counts: counts.clone(),
            path,
        }
    });
    let response = backend.send(out).await?;
    let (parts, body) = response.into_parts();
    // The guard lives as long as the response body: until the watch ends or the client hangs up.
    let keep: Box<dyn FnMut(Frame) -> Frame + Send + Sync> = Box::new(move |frame| {
        let _ = &guard;
        frame
    });
    let body = body.map_frame(keep);
    Ok(http::Response::from_parts(parts, body))
}

/// `base`, except that the first `failures` pod DELETEs fail before reaching the seed, as
/// they would while the seed is down; everything else goes through to the real apiserver.
fn failing_deletes(base: kube::Client, failures: usize) -> kube::Client {
    let remaining = Arc::new(std::sync::atomic::AtomicUsize::new(failures));
    let service = tower::service_fn(move |request: http::Request<kube::client::Body>| {
        let (base, remaining) = (base.clone(), remaining.clone());
        async move {
            let fail = request.method() == http::Method::DELETE
                && request.uri().path().contains("/pods/")
                && remaining
                    .fetch_update(
                        std::sync::atomic::Ordering::SeqCst,
                        std::sync::atomic::Ordering::SeqCst,
                        |n| n.checked_sub(1),
                    )
                    .is_ok();
            if fail {
                return Err::<http::Response<kube::client::Body>, tower::BoxError>(
                    "connection refused (injected: the seed is down)".into(),
                );
            }
            base.send(request).await.map_err(tower::BoxError::from)
        }
    });
    kube::Client::new(service, "default")
}

/// A deletion that failed all its attempts (the seed down) is tried again, although the pod
/// does not change and so sends no new event: the weeder lists its pods again after a pause.
/// Without that, the pod would wait for its next crash-loop restart (here: for ever).
#[tokio::test]
async fn a_deletion_that_failed_all_its_attempts_is_retried_though_the_pod_never_changes()
-> Result<()> {
    const SVC: &str = "etcd-retry";
    let client = seed_client().await?;
    let ns = namespace(&client, "wd-retry").await?;
    ns.create_crashlooping_pod("kapi-crash", &[("role", "apiserver")])
        .await?;
    ns.set_endpoint_slice(SVC, 1, EndpointsState::NotReady)
        .await?;
    // Every attempt of the first deletion fails (3 attempts per deletion).
    let w = Running::start(
        failing_deletes(client.clone(), 3),
        config("2m", &[(SVC, &["apiserver"])]),
    )
    .await?;
    let started = Instant::now();
    ns.set_endpoint_slice(SVC, 1, EndpointsState::AllReady)
        .await?;
    wait_gone(&ns, "kapi-crash").await?;
    eprintln!(
        "deleted {:?} after the slice turned ready, its first deletion having failed",
        started.elapsed()
    );
    w.expect_deleted(SVC, 1).await?;
    w.stop().await
}
