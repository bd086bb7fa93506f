//! The real binary killed with SIGKILL in the middle of a scale-down flow: after a restart it
//! finishes the flow, and after recovery every target is back at its recorded replicas.

// A test crate: a failed assumption is a failed test (outside tests the workspace denies these).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod harness;

use std::process::Stdio;
use std::time::Duration;

use dwd_core::scaling::{MELTDOWN_ANNOTATION, REPLICAS_ANNOTATION};
use dwd_sim::{SimShoot, SimShootOptions};
use dwd_testenv::process::ManagedProcess;
use dwd_testenv::{ApiServer, ApiServerOptions, TestEnv, eventually};
use harness::in_process::deployment_state;

const DEADLINE: Duration = Duration::from_secs(60);

/// MCM (level 1) waits 3 s before scaling down: a window in which the process is killed with
/// level 0 done and level 1 not started.
const CONFIG: &str = r#"
kubeConfigSecretName: shoot-access-dependency-watchdog-probe
probeInterval: 400ms
initialDelay: 200ms
probeTimeout: 3s
kcmNodeMonitorGraceDuration: 4s
dependentResourceInfos:
  - ref: {kind: Deployment, name: kube-controller-manager, apiVersion: apps/v1}
    scaleUp: {level: 1}
    scaleDown: {level: 0}
  - ref: {kind: Deployment, name: machine-controller-manager, apiVersion: apps/v1}
    scaleUp: {level: 1}
    scaleDown: {level: 1, initialDelay: 3s}
  - ref: {kind: Deployment, name: cluster-autoscaler, apiVersion: apps/v1}
    scaleUp: {level: 0}
    scaleDown: {level: 2}
"#;

/// Starts the prober (RUST_LOG=info, its log on the test's stderr); the [`ManagedProcess`] is
/// SIGKILLed and reaped on drop, so a failing test leaks no process.
fn start_prober(config: &std::path::Path, kubeconfig: &std::path::Path) -> ManagedProcess {
    ManagedProcess::builder("prober", env!("CARGO_BIN_EXE_dependency-watchdog"))
        .args([
            "prober",
            "--metrics-bind-addr=127.0.0.1:0",
            "--health-bind-addr=127.0.0.1:0",
        ])
        .arg("--config-file")
        .arg(config)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start dependency-watchdog")
}

async fn wait_for(client: &kube::Client, ns: &str, want: &[(&str, i32)]) {
    eventually(DEADLINE, &format!("replicas {want:?}"), || async {
        for (name, n) in want {
            if deployment_state(client, ns, name).await.0 != *n {
                return Ok(None);
            }
        }
        Ok(Some(()))
    })
    .await
    .expect("replicas");
}

/// The shoot of this test: 5 nodes renewing every 250 ms, KCM at 3, MCM and CA at 2 replicas.
async fn create_shoot(client: &kube::Client, shoot_api: &ApiServer) -> SimShoot {
    let mut options = SimShootOptions::new("shoot--crash--one")
        .with_nodes(5)
        .with_renew_interval(Duration::from_millis(250));
    options.deployments = vec![
        ("kube-controller-manager".into(), 3),
        ("machine-controller-manager".into(), 2),
        ("cluster-autoscaler".into(), 2),
    ];
    SimShoot::create(
        client.clone(),
        shoot_api.client().await.expect("c"),
        shoot_api.kubeconfig(),
        options,
    )
    .await
    .expect("shoot")
}

#[tokio::test]
async fn sigkill_mid_flow_then_restart_finishes_and_restores_recorded_replicas() {
    let env = TestEnv::shared().await.expect("env");
    // A seed of its own: no other prober may touch this shoot.
    let seed = env
        .start_apiserver_with("crash-seed", ApiServerOptions::seed())
        .await
        .expect("seed");
    let shoot_api = env.start_apiserver("crash-shoot").await.expect("shoot");
    let client = seed.client().await.expect("client");
    let shoot = create_shoot(&client, &shoot_api).await;
    let ns = shoot.namespace().to_string();
    let dir = std::env::temp_dir().join(format!("dwd-crash-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let config = dir.join("dep-config.yaml");
    std::fs::write(&config, CONFIG).expect("config");

    let mut first = start_prober(&config, &seed.kubeconfig_path());
    shoot.kubelets().silence_count(5);
    // Level 0 done (KCM at 0, its replicas recorded); MCM is in its 3 s initial delay.
    wait_for(&client, &ns, &[("kube-controller-manager", 0)]).await;
    let (mcm, _) = deployment_state(&client, &ns, "machine-controller-manager").await;
    assert_eq!(mcm, 2, "killed before level 1 started");
    first.kill();
    let (_, kcm_annotations) = deployment_state(&client, &ns, "kube-controller-manager").await;
    assert_eq!(
        kcm_annotations.get(REPLICAS_ANNOTATION).map(String::as_str),
        Some("3")
    );

    // Restarted during the outage: it completes the scale-down.
    let mut second = start_prober(&config, &seed.kubeconfig_path());
    wait_for(
        &client,
        &ns,
        &[
            ("kube-controller-manager", 0),
            ("machine-controller-manager", 0),
            ("cluster-autoscaler", 0),
        ],
    )
    .await;
    // Recovery restores what was recorded before the crash, not a default of 1.
    shoot.kubelets().resume_all();
    wait_for(
        &client,
        &ns,
        &[
            ("kube-controller-manager", 3),
            ("machine-controller-manager", 2),
            ("cluster-autoscaler", 2),
        ],
    )
    .await;
    // Scale-up sets the replicas first and removes the annotations after: wait for both.
    eventually(DEADLINE, "annotations removed", || async {
        for name in [
            "kube-controller-manager",
            "machine-controller-manager",
            "cluster-autoscaler",
        ] {
            let (_, a) = deployment_state(&client, &ns, name).await;
            if a.contains_key(REPLICAS_ANNOTATION) || a.contains_key(MELTDOWN_ANNOTATION) {
                return Err(format!("{name}: {a:?}"));
            }
        }
        Ok(Some(()))
    })
    .await
    .expect("annotations removed");
    second.kill();
    let _ = std::fs::remove_dir_all(dir);
    drop(shoot);
    seed.stop().await.expect("stop seed");
    shoot_api.stop().await.expect("stop shoot");
}
