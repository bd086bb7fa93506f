//! Client-side rate limiting of the seed client against the real kube-apiserver:
//! `--kube-api-qps` / `--kube-api-burst` make N requests take (N − burst) / qps, and a watch
//! costs one request when it starts while its events flow unthrottled.

// A test crate: a failed assumption is a failed test (outside tests the workspace denies these).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod harness;

use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow};
use dependency_watchdog::client::kube_client;
use dwd_testenv::TestEnv;
use futures::{StreamExt, TryStreamExt};
use harness::gardener::ensure_namespace;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{Api, PostParams, WatchEvent, WatchParams};

async fn limited_client(qps: f32, burst: u32) -> Result<kube::Client> {
    let env = TestEnv::shared().await?;
    let seed = env.apiserver("seed").context("seed apiserver")?;
    Ok(kube_client::seed_client(Some(&seed.kubeconfig_path()), qps, burst).await?)
}

/// Sends `n` GETs (sequentially or all at once); returns how long they took.
async fn timed_gets(client: &kube::Client, n: usize, concurrent: bool) -> Result<Duration> {
    let api: Api<Namespace> = Api::all(client.clone());
    let start = Instant::now();
    if concurrent {
        let gets = (0..n).map(|_| api.get("default"));
        futures::future::try_join_all(gets).await?;
    } else {
        for _ in 0..n {
            api.get("default").await?;
        }
    }
    Ok(start.elapsed())
}

#[tokio::test]
async fn n_requests_take_n_minus_burst_over_qps() -> Result<()> {
    // 25 requests, burst 5, 10 qps: the first 5 at once, then one every 100 ms → 2 s.
    let expected = Duration::from_secs(2);
    for concurrent in [false, true] {
        let client = limited_client(10.0, 5).await?;
        let took = timed_gets(&client, 25, concurrent).await?;
        println!("25 requests (concurrent: {concurrent}), burst 5 at 10 qps: {took:?}");
        assert!(
            took >= expected - Duration::from_millis(20),
            "too fast for the limit: {took:?} (concurrent: {concurrent})"
        );
        assert!(
            took < expected + Duration::from_secs(1),
            "far slower than the limit explains: {took:?} (concurrent: {concurrent})"
        );
    }
    // The same requests with a burst that covers them all: the limiter was the only brake.
    let unlimited = limited_client(10.0, 100).await?;
    let took = timed_gets(&unlimited, 25, false).await?;
    assert!(
        took < Duration::from_millis(1500),
        "25 requests within the burst took {took:?}"
    );
    Ok(())
}

#[tokio::test]
async fn a_watch_takes_one_token_and_its_events_are_not_limited() -> Result<()> {
    let env = TestEnv::shared().await?;
    let admin = env
        .apiserver("seed")
        .context("seed apiserver")?
        .client()
        .await?;
    ensure_namespace(&admin, "rate-limit-watch").await?;
    // Burst 2 at 1 qps: the watch takes one token, one GET the other, the next GET waits 1 s.
    let created = Instant::now();
    let client = limited_client(1.0, 2).await?;
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), "rate-limit-watch");
    let mut events = api.watch(&WatchParams::default(), "0").await?.boxed();

    let writer: Api<ConfigMap> = Api::namespaced(admin, "rate-limit-watch");
    for i in 0..5 {
        let cm: ConfigMap =
            serde_json::from_value(serde_json::json!({"metadata": {"name": format!("cm-{i}")}}))?;
        writer.create(&PostParams::default(), &cm).await?;
    }
    let mut added = 0;
    while added < 5 {
        let event = tokio::time::timeout(Duration::from_secs(10), events.try_next())
            .await
            .map_err(|_| anyhow!("no watch event within 10 s ({added} seen)"))??
            .context("watch ended")?;
        if matches!(event, WatchEvent::Added(_)) {
            added += 1;
        }
    }
    let events_done = created.elapsed();
    assert!(
        events_done < Duration::from_millis(900),
        "5 watch events took {events_done:?}: events must not wait for tokens"
    );

    api.get("cm-0").await?;
    let second = created.elapsed();
    assert!(
        second < Duration::from_millis(900),
        "the second token was free: {second:?}"
    );
    api.get("cm-1").await?;
    let third = created.elapsed();
    assert!(
        third >= Duration::from_millis(980),
        "the third request must wait for a refilled token: {third:?}"
    );
    println!("watch events by {events_done:?}, 2nd request {second:?}, 3rd request {third:?}");
    Ok(())
}
