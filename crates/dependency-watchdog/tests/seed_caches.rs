//! The prober's seed caches (`prober::seed_caches::SeedCaches`) against a real seed
//! kube-apiserver, started on their own: what the configured names and kinds, and a seed that
//! misbehaves while they start, do to the caches every decision waits for.
//!
//! Its own binary: the tests start the caches without a prober, on the shared seed or on a
//! seed of their own behind the test environment's front door.

// A test crate: a failed assumption is a failed test (outside tests the workspace denies these).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod harness;

use dependency_watchdog::prober::seed_caches::SeedCaches;
use dwd_testenv::eventually;
use harness::in_process::{DEADLINE, seed_client};

/// The prober config's targets with `extra` appended (YAML list items).
fn targets_with(extra: &str) -> Vec<dwd_core::DependentResourceInfo> {
    dwd_core::ProberConfig::from_yaml(&format!("{}{extra}", harness::in_process::PROBER_CONFIG))
        .expect("config")
        .config
        .dependent_resource_infos
}

/// Waits until every cache is in sync, failing with what is still pending.
async fn wait_synced(caches: &SeedCaches) {
    eventually(DEADLINE, "every seed cache in sync", || {
        let pending = caches.pending();
        async move {
            if pending.is_empty() {
                Ok(Some(()))
            } else {
                Err(format!("pending: {pending:?}"))
            }
        }
    })
    .await
    .expect("the seed caches sync");
}

/// Starts the caches for the config's targets on a task of their own, so that a test can
/// watch the seed while startup is under way; the task returns the caches and their tasks.
fn spawn_start(
    client: &kube::Client,
    shutdown: &tokio_util::sync::CancellationToken,
) -> tokio::task::JoinHandle<(
    dependency_watchdog::Result<SeedCaches>,
    tokio::task::JoinSet<&'static str>,
)> {
    let (client, shutdown) = (client.clone(), shutdown.clone());
    tokio::spawn(async move {
        let mut tasks = tokio::task::JoinSet::new();
        let caches = SeedCaches::start(
            &client,
            "probe-secret",
            &targets_with(""),
            &mut tasks,
            &shutdown,
        )
        .await;
        (caches, tasks)
    })
}

/// Names go into field selectors (`metadata.name=<name>`). The config accepts any name, as the
/// reference does (it GETs targets by name: such a target is merely missing); a `,` or `=`
/// unescaped made the apiserver refuse the selector, so the cache never synced and no decision
/// was taken for any shoot (docs/faults.md).
#[tokio::test]
async fn names_with_selector_syntax_are_escaped_and_the_caches_sync() {
    let seed = seed_client().await.expect("seed client");
    let targets = targets_with(
        "  - ref: {kind: Deployment, name: 'kube,apiserver=x\\y', apiVersion: apps/v1}\n    scaleUp: {level: 0}\n    scaleDown: {level: 0}\n",
    );
    let mut tasks = tokio::task::JoinSet::new();
    let shutdown = tokio_util::sync::CancellationToken::new();
    let caches = SeedCaches::start(&seed, "probe,secret=x", &targets, &mut tasks, &shutdown)
        .await
        .expect("caches start");
    wait_synced(&caches).await;
    assert!(caches.is_ready());
    assert!(
        caches
            .targets
            .iter()
            .any(|t| t.info.target.name == "kube,apiserver=x\\y"),
        "the odd target has a cache"
    );
    tasks.shutdown().await;
}

/// A seed that fails discovery while the prober starts (here: every request answered 429 by
/// the front door, as an overloaded apiserver does; a 5xx or a refused connection is the same
/// to discovery) does not end the prober: the target kinds are looked up again with a growing
/// pause until the seed answers, and the caches then sync. The reference resolves kinds
/// lazily and keeps running; ours used to exit at once (docs/faults.md).
#[tokio::test]
async fn discovery_failing_at_start_is_retried_until_the_seed_recovers() {
    let env = dwd_testenv::TestEnv::shared()
        .await
        .expect("test environment");
    let seed = env
        .start_apiserver_with(
            "seed-discovery-fails",
            dwd_testenv::ApiServerOptions::seed(),
        )
        .await
        .expect("seed apiserver");
    let client = seed.client().await.expect("seed client");
    seed.set_throttled(true);
    let before = seed.throttled_responses();
    let shutdown = tokio_util::sync::CancellationToken::new();
    let starting = spawn_start(&client, &shutdown);
    // Several failed lookups (each a few throttled requests), and startup has not given up.
    eventually(DEADLINE, "discovery answered 429 again and again", || {
        let (throttled, ended) = (seed.throttled_responses() - before, starting.is_finished());
        async move {
            if ended {
                return Err(format!(
                    "startup ended after {throttled} throttled responses"
                ));
            }
            Ok((throttled >= 12).then_some(()))
        }
    })
    .await
    .expect("startup keeps trying while the seed fails");
    seed.set_throttled(false);
    let (caches, mut tasks) = tokio::time::timeout(DEADLINE, starting)
        .await
        .expect("startup ends once the seed answers")
        .expect("startup task");
    let caches = caches.expect("the caches start once the seed recovered");
    wait_synced(&caches).await;
    assert_eq!(caches.targets.len(), targets_with("").len());
    tasks.shutdown().await;

    // Shutdown while the seed still fails ends startup at once, as a task ended by shutdown.
    // A client of its own: the first one's pooled connections may still reach the seed past
    // the throttled front door (seen once under load: startup then succeeded).
    let client = seed.client().await.expect("seed client");
    seed.set_throttled(true);
    let shutdown = tokio_util::sync::CancellationToken::new();
    let starting = spawn_start(&client, &shutdown);
    let before = seed.throttled_responses();
    eventually(DEADLINE, "discovery failing again", || {
        let throttled = seed.throttled_responses() - before;
        async move { Ok((throttled >= 3).then_some(())) }
    })
    .await
    .expect("discovery fails");
    shutdown.cancel();
    let ended = tokio::time::timeout(std::time::Duration::from_secs(5), starting)
        .await
        .expect("startup ends promptly on shutdown")
        .expect("startup task")
        .0
        .map(|_| ());
    assert!(
        matches!(ended, Err(dependency_watchdog::Error::TaskDied(..))),
        "{ended:?}"
    );
    seed.set_throttled(false);
}

/// An optional target whose watch the seed refuses (here: the prober's user may not list
/// StatefulSets; a kind removed after startup answers 404 the same way) counts as absent, so it
/// is skipped in every flow, and the caches every decision waits for are in sync. It used to stay
/// "listing" for ever: no decision for any shoot, `/readyz` 503 (docs/faults.md).
#[tokio::test]
async fn an_optional_target_whose_watch_is_refused_does_not_hold_back_the_others() {
    use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
    const USER: &str = "dwd-caches-without-statefulsets";
    let env = dwd_testenv::TestEnv::shared()
        .await
        .expect("test environment");
    let seed = env.apiserver("seed").expect("seed apiserver");
    let admin = seed.client().await.expect("admin client");
    let role: ClusterRole = serde_json::from_value(serde_json::json!({
        "metadata": {"name": USER},
        "rules": [
            {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get", "list", "watch"]},
            {"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["get", "list", "watch"]},
            {"apiGroups": ["machine.sapcloud.io"], "resources": ["machines"], "verbs": ["get", "list", "watch"]}
        ]
    }))
    .expect("role");
    let binding: ClusterRoleBinding = serde_json::from_value(serde_json::json!({
        "metadata": {"name": USER},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": USER},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": USER}]
    }))
    .expect("binding");
    let pp = kube::api::PostParams::default();
    let _ = kube::Api::<ClusterRole>::all(admin.clone())
        .create(&pp, &role)
        .await;
    let _ = kube::Api::<ClusterRoleBinding>::all(admin.clone())
        .create(&pp, &binding)
        .await;
    let kubeconfig = kube::config::Kubeconfig::from_yaml(seed.kubeconfig()).expect("kubeconfig");
    let mut config = kube::Config::from_custom_kubeconfig(
        kubeconfig,
        &kube::config::KubeConfigOptions::default(),
    )
    .await
    .expect("config");
    config.auth_info.impersonate = Some(USER.into());
    let limited = kube::Client::try_from(config).expect("client");
    // RBAC takes effect asynchronously: wait until the user may list Deployments.
    eventually(DEADLINE, "the limited user's RBAC in effect", || {
        let api = kube::Api::<k8s_openapi::api::apps::v1::Deployment>::all(limited.clone());
        async move {
            Ok(api
                .list(&kube::api::ListParams::default().limit(1))
                .await
                .ok()
                .map(|_| ()))
        }
    })
    .await
    .expect("RBAC");

    let targets = targets_with(
        "  - ref: {kind: StatefulSet, name: forbidden-target, apiVersion: apps/v1}\n    optional: true\n    scaleUp: {level: 0}\n    scaleDown: {level: 0}\n",
    );
    let mut tasks = tokio::task::JoinSet::new();
    let shutdown = tokio_util::sync::CancellationToken::new();
    let caches = SeedCaches::start(&limited, "probe-secret", &targets, &mut tasks, &shutdown)
        .await
        .expect("caches start");
    wait_synced(&caches).await;
    let forbidden = caches
        .targets
        .iter()
        .find(|t| t.info.target.name == "forbidden-target")
        .expect("the forbidden target has a cache");
    assert!(
        forbidden.cache.is_ready() && forbidden.cache.is_empty(),
        "absent"
    );
    tasks.shutdown().await;
}

/// The ports of this machine's established IPv4 TCP connections to `port` whose keepalive
/// timer runs (`/proc/net/tcp`: state 01, timer 2), each with its local port.
fn keepalive_connections_to(port: u16) -> Vec<u16> {
    let table = std::fs::read_to_string("/proc/net/tcp").expect("/proc/net/tcp");
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let port_of = |addr: &str| u16::from_str_radix(addr.split(':').nth(1)?, 16).ok();
            let (local, remote, state, timer) = (fields[1], fields[2], fields[3], fields[5]);
            (port_of(remote)? == port && state == "01" && timer.starts_with("02:"))
                .then(|| port_of(local))
                .flatten()
        })
        .collect()
}

/// A seed that goes silent (a network partition: nothing refused or reset, every byte held,
/// on the open connections and on new ones) turns every cache stale within the bound
/// docs/faults.md states. The seed client speaks HTTP/2 with the seed and checks the
/// connection with a PING after 30 s without a frame, closing it when no answer comes within
/// 15 s: every watch on it fails at 45 s. Each watcher retries after its first back-off (at most
/// 1.6 s) on a new connection, which gets no answer either: no headers within 30 s is the
/// seed's silence, and makes the cache stale at once. Kube's own stack (HTTP/1.1, a 295 s read
/// timeout) held the caches "in sync" for 295 s and more. The connections also carry TCP
/// keepalive, and the caches are in sync again once the partition is lifted.
#[tokio::test]
async fn a_silent_seed_turns_the_caches_stale_within_the_stated_bound() {
    use std::time::{Duration, Instant};
    let env = dwd_testenv::TestEnv::shared()
        .await
        .expect("test environment");
    let seed = env
        .start_apiserver_with("seed-goes-silent", dwd_testenv::ApiServerOptions::seed())
        .await
        .expect("seed apiserver");
    let config =
        dependency_watchdog::client::kube_client::seed_config(Some(&seed.kubeconfig_path()))
            .await
            .expect("seed config");
    let client = dependency_watchdog::client::kube_client::rate_limited_client(config, 100.0, 200)
        .expect("seed client");
    let mut tasks = tokio::task::JoinSet::new();
    let shutdown = tokio_util::sync::CancellationToken::new();
    let before = seed.connections();
    let caches = SeedCaches::start(
        &client,
        "probe-secret",
        &targets_with(""),
        &mut tasks,
        &shutdown,
    )
    .await
    .expect("caches start");
    wait_synced(&caches).await;
    // Five watches and the discovery before them share one HTTP/2 connection (HTTP/1.1 would
    // hold one connection per watch).
    let watches = 2 + caches.targets.len();
    let connections = seed.connections() - before;
    assert!(
        connections < watches as u64,
        "{connections} connections for {watches} watches: not multiplexed over HTTP/2"
    );
    let door = seed.addr().port();
    eventually(DEADLINE, "TCP keepalive on the seed connection", || {
        let with_keepalive = keepalive_connections_to(door);
        async move { Ok((!with_keepalive.is_empty()).then_some(())) }
    })
    .await
    .expect("the seed connection has TCP keepalive");

    seed.set_partitioned(true);
    let silent_from = Instant::now();
    // The bound of docs/faults.md: the PING after 30 s without a frame, 15 s for its answer,
    // the watcher's first back-off, 30 s for the new watch's headers.
    let bound = Duration::from_secs(30 + 15 + 2 + 30);
    eventually(bound + Duration::from_secs(15), "every cache stale", || {
        let pending = caches.pending();
        async move {
            let stale = pending
                .iter()
                .filter(|p| p.contains("the seed went silent"))
                .count();
            if stale == watches {
                Ok(Some(pending))
            } else {
                Err(format!("pending: {pending:?}"))
            }
        }
    })
    .await
    .expect("the caches turn stale");
    let after = silent_from.elapsed();
    eprintln!("every cache stale {after:?} after the seed went silent");
    assert!(
        after <= bound + Duration::from_secs(3),
        "stale only {after:?} after the seed went silent (bound {bound:?})"
    );
    seed.set_partitioned(false);
    wait_synced(&caches).await;
    eprintln!(
        "in sync again {:?} after the partition was lifted",
        silent_from.elapsed() - after
    );
    tasks.shutdown().await;
}
