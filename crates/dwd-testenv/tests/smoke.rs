//! Smoke tests of the test environment against the real kube-apiserver and etcd: the API
//! features the watchdog relies on, isolation between apiservers, fault injection, teardown.

// A test crate: a failed assumption is a failed test (outside tests the workspace denies these).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use dwd_testenv::{TestEnv, eventually, process::pid_alive};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Namespace;
use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};

fn deployment(name: &str, replicas: i32) -> Deployment {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}},
                         "spec": {"containers": [{"name": "c", "image": "registry.invalid/none"}]}}
        }
    }))
    .expect("static deployment JSON")
}

async fn ensure_namespace(client: &kube::Client, name: &str) -> Result<()> {
    let api: Api<Namespace> = Api::all(client.clone());
    let ns: Namespace = serde_json::from_value(serde_json::json!({"metadata": {"name": name}}))?;
    match api.create(&PostParams::default(), &ns).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Deployment `name` with `replicas` created in namespace `ns` of the shared seed; the
/// Deployments of `ns`.
async fn seed_deployment(ns: &str, name: &str, replicas: i32) -> Result<Api<Deployment>> {
    let env = TestEnv::shared().await?;
    let client = env.apiserver("seed").context("seed")?.client().await?;
    ensure_namespace(&client, ns).await?;
    let api: Api<Deployment> = Api::namespaced(client, ns);
    api.create(&PostParams::default(), &deployment(name, replicas))
        .await?;
    Ok(api)
}

#[tokio::test]
async fn scale_subresource_changes_spec_replicas() -> Result<()> {
    let api = seed_deployment("smoke-scale", "kcm", 3).await?;
    let scale = api.get_scale("kcm").await?;
    assert_eq!(scale.spec.and_then(|s| s.replicas), Some(3));
    api.patch_scale(
        "kcm",
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"spec": {"replicas": 0}})),
    )
    .await?;
    let d = api.get("kcm").await?;
    assert_eq!(d.spec.and_then(|s| s.replicas), Some(0));
    Ok(())
}

#[tokio::test]
async fn merge_patch_sets_and_removes_annotations() -> Result<()> {
    let api = seed_deployment("smoke-annotations", "mcm", 2).await?;
    let set = serde_json::json!({"metadata": {"annotations": {"a/replicas": "2", "a/active": ""}}});
    api.patch("mcm", &PatchParams::default(), &Patch::Merge(set))
        .await?;
    let got = api.get("mcm").await?.annotations().clone();
    assert_eq!(got.get("a/replicas").map(String::as_str), Some("2"));
    assert_eq!(got.get("a/active").map(String::as_str), Some(""));
    let clear =
        serde_json::json!({"metadata": {"annotations": {"a/replicas": null, "a/active": null}}});
    api.patch("mcm", &PatchParams::default(), &Patch::Merge(clear))
        .await?;
    let got = api.get("mcm").await?.annotations().clone();
    assert!(
        !got.contains_key("a/replicas") && !got.contains_key("a/active"),
        "{got:?}"
    );
    Ok(())
}

#[tokio::test]
async fn leases_in_kube_node_lease_can_be_listed_and_watched() -> Result<()> {
    let env = TestEnv::shared().await?;
    let shoot = env.start_apiserver("smoke-leases").await?;
    let client = shoot.client().await?;
    let api: Api<Lease> = Api::namespaced(client, "kube-node-lease");
    let mut events = watcher(api.clone(), watcher::Config::default())
        .applied_objects()
        .boxed();
    let lease: Lease = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "node-1"},
        "spec": {"holderIdentity": "node-1", "leaseDurationSeconds": 40,
                 "renewTime": "2026-01-01T00:00:00.000000Z"}
    }))?;
    api.create(&PostParams::default(), &lease).await?;
    let seen = tokio::time::timeout(Duration::from_secs(20), async {
        while let Some(l) = events.try_next().await? {
            if l.metadata.name.as_deref() == Some("node-1") {
                return Ok::<_, anyhow::Error>(l);
            }
        }
        bail!("watch ended")
    })
    .await
    .context("no watch event for the lease")??;
    assert!(seen.spec.and_then(|s| s.renew_time).is_some());
    let listed = api.list(&ListParams::default()).await?;
    assert_eq!(listed.items.len(), 1);
    shoot.stop().await?;
    Ok(())
}

#[tokio::test]
async fn apiservers_sharing_etcd_do_not_see_each_others_objects() -> Result<()> {
    let env = TestEnv::shared().await?;
    let (a, b) = tokio::try_join!(
        env.start_apiserver("smoke-iso-a"),
        env.start_apiserver("smoke-iso-b")
    )?;
    let (ca, cb) = (a.client().await?, b.client().await?);
    ensure_namespace(&ca, "only-in-a").await?;
    let ns_b: Api<Namespace> = Api::all(cb);
    assert!(
        ns_b.get_opt("only-in-a").await?.is_none(),
        "b sees a's namespace"
    );
    let ns_a: Api<Namespace> = Api::all(ca);
    assert!(ns_a.get_opt("only-in-a").await?.is_some());
    // Each apiserver has its own kube-node-lease namespace (created by the apiserver itself).
    assert!(ns_a.get_opt("kube-node-lease").await?.is_some());
    a.stop().await?;
    b.stop().await?;
    Ok(())
}

/// `ApiServerOptions::own_etcd`: the apiserver stores its objects in an etcd of its own (its
/// data directory under the apiserver's), which keeps them while the apiserver is stopped.
#[tokio::test]
async fn an_apiserver_with_its_own_etcd_keeps_its_objects_there_across_a_restart() -> Result<()> {
    let env = TestEnv::shared().await?;
    let options = dwd_testenv::ApiServerOptions {
        own_etcd: true,
        ..Default::default()
    };
    let api = env.start_apiserver_with("smoke-own-etcd", options).await?;
    let data = env.dir().join("smoke-own-etcd").join("etcd");
    assert!(data.is_dir(), "no etcd data in {}", data.display());
    ensure_namespace(&api.client().await?, "kept-in-own-etcd").await?;
    api.stop().await?;
    api.start().await?;
    let namespaces: Api<Namespace> = Api::all(api.client().await?);
    assert!(namespaces.get_opt("kept-in-own-etcd").await?.is_some());
    api.stop().await?;
    Ok(())
}

#[tokio::test]
async fn stopped_apiserver_refuses_connections_and_serves_after_restart() -> Result<()> {
    let env = TestEnv::shared().await?;
    let shoot = env.start_apiserver("smoke-stop").await?;
    let version = shoot.client().await?.apiserver_version().await?;
    assert_eq!(
        version.git_version, "v1.34.4",
        "the real release reports its version"
    );
    shoot.stop().await?;
    let refused = std::net::TcpStream::connect(shoot.addr());
    assert!(
        refused.is_err(),
        "connection to a stopped apiserver must be refused"
    );
    assert!(shoot.client().await?.apiserver_version().await.is_err());
    shoot.start().await?;
    let version = shoot.client().await?.apiserver_version().await?;
    assert_eq!(version.git_version, "v1.34.4");
    shoot.stop().await?;
    Ok(())
}

#[tokio::test]
async fn throttle_switch_answers_429_over_real_http() -> Result<()> {
    let env = TestEnv::shared().await?;
    let shoot = env.start_apiserver("smoke-429").await?;
    shoot.set_throttled(true);
    match shoot.client().await?.apiserver_version().await {
        Err(kube::Error::Api(status)) => {
            assert_eq!(status.code, 429);
            assert_eq!(status.reason, "TooManyRequests");
        }
        other => bail!("expected a 429, got {other:?}"),
    }
    assert!(shoot.throttled_responses() >= 1);
    shoot.set_throttled(false);
    shoot.client().await?.apiserver_version().await?;
    shoot.stop().await?;
    Ok(())
}

#[tokio::test]
async fn rbac_is_enforced_for_non_admin_users() -> Result<()> {
    let env = TestEnv::shared().await?;
    let seed = env.apiserver("seed").context("seed")?;
    let client = seed.client_for("nobody", &[]).await?;
    let api: Api<Namespace> = Api::all(client);
    match api.list(&ListParams::default()).await {
        Err(kube::Error::Api(s)) if s.code == 403 => Ok(()),
        other => Err(anyhow!("expected 403 for an unbound user, got {other:?}")),
    }
}

async fn assert_all_gone(pids: &[u32], dir: &std::path::Path) -> Result<()> {
    eventually(Duration::from_secs(10), "processes to exit", || async {
        Ok(pids.iter().all(|p| !pid_alive(*p)).then_some(()))
    })
    .await
    .map_err(|e| {
        anyhow!(
            "{e}; alive: {:?}",
            pids.iter().filter(|p| pid_alive(**p)).collect::<Vec<_>>()
        )
    })?;
    assert!(!dir.exists(), "{} left behind", dir.display());
    Ok(())
}

#[tokio::test]
async fn drop_tears_everything_down() -> Result<()> {
    let env = TestEnv::start().await?;
    env.start_apiserver("drop-me").await?;
    let (pids, dir) = (env.pids(), env.dir().to_path_buf());
    assert_eq!(pids.len(), 2, "etcd and one apiserver");
    assert!(pids.iter().all(|p| pid_alive(*p)));
    drop(env);
    assert_all_gone(&pids, &dir).await
}

#[tokio::test]
async fn panic_tears_everything_down() -> Result<()> {
    let seen = std::sync::Arc::new(std::sync::Mutex::new(None));
    let seen2 = seen.clone();
    let result = tokio::spawn(async move {
        let env = TestEnv::start().await.expect("start");
        env.start_apiserver("panic-me").await.expect("apiserver");
        *seen2.lock().expect("lock") = Some((env.pids(), env.dir().to_path_buf()));
        panic!("deliberate panic while the environment runs");
    })
    .await;
    assert!(result.is_err(), "the task panicked");
    let (pids, dir) = seen
        .lock()
        .map_err(|_| anyhow!("poisoned"))?
        .clone()
        .context("env started")?;
    assert_all_gone(&pids, &dir).await
}

/// Runs as a child process (see the two tests below): starts the shared environment, prints
/// its pids and directory, then either returns (normal exit) or waits to be killed.
#[tokio::test]
#[ignore = "helper run as a child process by the exit tests"]
async fn child_holding_shared_env() -> Result<()> {
    let env = TestEnv::shared().await?;
    let pids: Vec<String> = env.pids().iter().map(u32::to_string).collect();
    println!("\nPIDS={}", pids.join(","));
    println!("DIR={}", env.dir().display());
    if std::env::var_os("DWD_CHILD_WAIT").is_some() {
        println!("WAITING");
        tokio::time::sleep(Duration::from_secs(600)).await;
    }
    Ok(())
}

fn parse_child_output(out: &str) -> Result<(Vec<u32>, std::path::PathBuf)> {
    let mut fields = BTreeMap::new();
    for line in out.lines() {
        if let Some((k, v)) = line.split_once('=') {
            fields.insert(k.trim().to_string(), v.trim().to_string());
        }
    }
    let pids = fields
        .get("PIDS")
        .context("child printed no PIDS")?
        .split(',')
        .map(|p| p.parse::<u32>().map_err(|e| anyhow!("pid {p}: {e}")))
        .collect::<Result<Vec<_>>>()?;
    let dir = fields.get("DIR").context("child printed no DIR")?.into();
    Ok((pids, dir))
}

fn child_command() -> Result<std::process::Command> {
    let mut cmd = std::process::Command::new(std::env::current_exe()?);
    cmd.args([
        "--exact",
        "child_holding_shared_env",
        "--ignored",
        "--nocapture",
        "--test-threads=1",
    ]);
    Ok(cmd)
}

#[tokio::test]
async fn process_exit_tears_down_the_shared_environment() -> Result<()> {
    let out =
        tokio::task::spawn_blocking(|| child_command()?.output().map_err(anyhow::Error::from))
            .await??;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "child failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (pids, dir) = parse_child_output(&stdout)?;
    assert_all_gone(&pids, &dir).await
}

#[tokio::test]
async fn sigkilled_test_process_leaves_no_control_plane_running() -> Result<()> {
    use std::io::BufRead;
    let mut child = child_command()?
        .env("DWD_CHILD_WAIT", "1")
        .stdout(std::process::Stdio::piped())
        .spawn()?;
    let stdout = child.stdout.take().context("child stdout")?;
    let collected = tokio::task::spawn_blocking(move || {
        let mut text = String::new();
        for line in std::io::BufReader::new(stdout).lines() {
            let line = line?;
            text.push_str(&line);
            text.push('\n');
            if line.contains("WAITING") {
                break;
            }
        }
        Ok::<_, anyhow::Error>(text)
    })
    .await??;
    let (pids, dir) = parse_child_output(&collected)?;
    assert!(pids.iter().all(|p| pid_alive(*p)));
    child.kill()?;
    child.wait()?;
    // The kernel kills the children (PDEATHSIG); the next environment sweeps the directory.
    let pids_only = pids.clone();
    eventually(
        Duration::from_secs(10),
        "control plane to die with its parent",
        || {
            let pids = pids_only.clone();
            async move { Ok(pids.iter().all(|p| !pid_alive(*p)).then_some(())) }
        },
    )
    .await
    .map_err(|e| anyhow!(e))?;
    let env = TestEnv::start().await?;
    drop(env);
    assert!(!dir.exists(), "stale directory {} not swept", dir.display());
    Ok(())
}
