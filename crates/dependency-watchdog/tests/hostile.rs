//! A shoot is run by a tenant: what its apiserver or its probe kubeconfig sends must hurt that
//! shoot alone. One real prober binary, at debug level, protects a normal shoot next to
//! hostile ones on real kube-apiservers:
//!
//! - a shoot whose kube-node-lease namespace holds leases fattened with 256 KiB of annotations
//!   each: its lease list is cut off at the response limit, its run fails with a warning and a
//!   metric, nothing of it is scaled, and the process stays small;
//! - shoots whose probe kubeconfig asks for a file of ours (`tokenFile`), a command (`exec`,
//!   which would create a marker file and carries a planted secret in its environment), a
//!   proxy with planted credentials, or a client key for an apiserver that is not there: each
//!   run fails for that shoot, naming the field; no command runs;
//! - meanwhile the normal shoot is probed on schedule, scaled down in an outage and restored;
//! - everything the binary wrote at debug level is searched for the planted token, key,
//!   environment and proxy credentials: none of them appears.

// A test crate: a failed assumption is a failed test (outside tests the workspace denies these).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use anyhow::{Context, Result, ensure};
use dwd_sim::{SeedControlPlane, ShootState, SimShoot, SimShootOptions};
use dwd_testenv::{ApiServer, ApiServerOptions, TestEnv};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use kube::api::PostParams;

mod harness;
use harness::binary::{Watchdog, sum};

const KCM: &str = "kube-controller-manager";
const MCM: &str = "machine-controller-manager";
const CA: &str = "cluster-autoscaler";
const PROBE_SECRET: &str = "shoot-access-dependency-watchdog-probe";

const CONFIG: &str = r#"
kubeConfigSecretName: shoot-access-dependency-watchdog-probe
probeInterval: 500ms
initialDelay: 200ms
probeTimeout: 5s
kcmNodeMonitorGraceDuration: 4s
dependentResourceInfos:
  - ref: {kind: Deployment, name: kube-controller-manager, apiVersion: apps/v1}
    scaleUp: {level: 0, timeout: 10s}
    scaleDown: {level: 1, timeout: 10s}
  - ref: {kind: Deployment, name: machine-controller-manager, apiVersion: apps/v1}
    scaleUp: {level: 1, timeout: 10s}
    scaleDown: {level: 0, timeout: 10s}
  - ref: {kind: Deployment, name: cluster-autoscaler, apiVersion: apps/v1}
    optional: true
    scaleUp: {level: 2, timeout: 10s}
    scaleDown: {level: 0, timeout: 10s}
"#;

/// Secrets planted in the hostile kubeconfigs; none may ever reach the log.
const PLANTED_TOKEN: &str = "PLANTED-SEED-TOKEN-7c1e9b2f4d";
const PLANTED_ENV: &str = "PLANTED-EXEC-ENV-3a8d5e61";
const PLANTED_PROXY_USER: &str = "plantedproxyuser91";
const PLANTED_PROXY_PASS: &str = "plantedproxypass27";

/// Fat leases: 80 × 250 KiB of annotations (the apiserver allows 256 KiB) is 20 MB in one
/// page, past the 16 MiB limit.
const FAT_LEASES: usize = 80;
const FAT_BYTES: usize = 250 << 10;

fn kubeconfig(server: &str, cluster_extra: &str, user: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: shoot\n  cluster:\n    server: {server}\n{cluster_extra}contexts:\n- name: shoot\n  context: {{cluster: shoot, user: shoot}}\ncurrent-context: shoot\nusers:\n- name: shoot\n  user:\n{user}"
    )
}

/// Shoot `ns` with `nodes` nodes on its apiserver `api`, kubelets renewing every 500 ms.
async fn shoot_on(
    seed: &kube::Client,
    api: &ApiServer,
    ns: &str,
    nodes: usize,
) -> Result<SimShoot> {
    Ok(SimShoot::create(
        seed.clone(),
        api.client().await?,
        api.kubeconfig(),
        SimShootOptions::new(ns)
            .with_nodes(nodes)
            .with_renew_interval(Duration::from_millis(500)),
    )
    .await?)
}

/// A shoot namespace in the seed with targets and a Cluster, whose probe secret holds
/// `kubeconfig`; no data plane (its apiserver is never reached).
async fn seed_only_shoot(seed: &kube::Client, ns: &str, kubeconfig: &str) -> Result<()> {
    let plane = SeedControlPlane::new(seed.clone(), ns);
    plane.create_namespace().await?;
    plane.create_probe_secret(PROBE_SECRET, kubeconfig).await?;
    plane
        .create_deployments(&[(KCM.into(), 2), (MCM.into(), 1), (CA.into(), 1)])
        .await?;
    plane
        .create_cluster(&ShootState::with_pools(&["worker-a"]))
        .await?;
    Ok(())
}

async fn replicas(seed: &kube::Client, ns: &str, name: &str) -> Result<i32> {
    Ok(Api::<Deployment>::namespaced(seed.clone(), ns)
        .get(name)
        .await?
        .spec
        .and_then(|s| s.replicas)
        .unwrap_or(1))
}

/// Peak resident memory of `pid` in MiB (`VmHWM`).
fn peak_rss_mib(pid: u32) -> Result<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .context("no VmHWM")?;
    Ok(kib / 1024.0)
}

// One prober meets every hostile shoot and the normal one at once: the normal shoot's outage
// runs while the hostile ones keep failing, and the closing memory and log checks cover that
// whole run, so setup, failures, outage and leak checks stay in the order they happen.
#[allow(clippy::too_many_lines)]
#[tokio::test]
async fn a_hostile_shoot_hurts_only_itself_and_leaks_nothing() -> Result<()> {
    let env = TestEnv::start().await?;
    let seed_api = env
        .start_apiserver_with("hostile-seed", ApiServerOptions::seed())
        .await?;
    let seed = seed_api.client().await?;
    let normal_api = env.start_apiserver("hostile-normal").await?;
    let fat_api = env.start_apiserver("hostile-fat").await?;
    let dir = env.dir().join("hostile-test");
    std::fs::create_dir_all(&dir)?;

    // The normal shoot.
    let normal_ns = "shoot--hostile--normal";
    let normal = shoot_on(&seed, &normal_api, normal_ns, 5).await?;

    // The fat shoot: healthy nodes, plus leases a tenant fattened.
    let fat_ns = "shoot--hostile--fat";
    let _fat = shoot_on(&seed, &fat_api, fat_ns, 3).await?;
    let fat_leases: Api<Lease> = Api::namespaced(fat_api.client().await?, "kube-node-lease");
    let filler = "x".repeat(FAT_BYTES);
    for i in 0..FAT_LEASES {
        let lease: Lease = serde_json::from_value(serde_json::json!({
            "metadata": {"name": format!("fat-{i}"), "annotations": {"filler": filler}},
            "spec": {"holderIdentity": "tenant"}
        }))?;
        fat_leases.create(&PostParams::default(), &lease).await?;
    }

    // Shoots whose kubeconfigs ask for what only inline material may give.
    let token_file = dir.join("seed-token");
    std::fs::write(&token_file, PLANTED_TOKEN)?;
    let marker = dir.join("exec-ran");
    let server = normal_api.url();
    let hostile = [
        (
            "shoot--hostile--tokenfile",
            kubeconfig(
                &server,
                "",
                &format!("    tokenFile: {}\n", token_file.display()),
            ),
            "field tokenFile",
        ),
        (
            "shoot--hostile--exec",
            kubeconfig(
                &server,
                "",
                &format!(
                    "    exec:\n      apiVersion: client.authentication.k8s.io/v1\n      command: /bin/sh\n      args: [\"-c\", \"touch {}\"]\n      env: [{{name: DWD_PLANTED, value: {PLANTED_ENV}}}]\n",
                    marker.display()
                ),
            ),
            "field exec",
        ),
        (
            "shoot--hostile--proxy",
            kubeconfig(
                &server,
                &format!(
                    "    proxy-url: http://{PLANTED_PROXY_USER}:{PLANTED_PROXY_PASS}@127.0.0.1:9\n"
                ),
                &format!("    token: {PLANTED_TOKEN}\n"),
            ),
            "field proxy-url",
        ),
    ];
    for (ns, kc, _) in &hostile {
        seed_only_shoot(&seed, ns, kc).await?;
    }
    // A real client certificate and key (issued by the test CA) for an apiserver that is not
    // there: every run fails to connect; the key must not show up in what is logged about it.
    let with_key = normal_api.kubeconfig_for("planted-user", &[])?;
    let key_b64 = with_key
        .lines()
        .find_map(|l| l.trim().strip_prefix("client-key-data: "))
        .context("no client-key-data")?
        .to_string();
    let closed = dwd_testenv::free_port()?;
    let key_ns = "shoot--hostile--key";
    seed_only_shoot(
        &seed,
        key_ns,
        &with_key.replace(
            &normal_api.addr().to_string(),
            &format!("127.0.0.1:{closed}"),
        ),
    )
    .await?;

    // The prober, at debug level.
    let config = dir.join("config.yaml");
    std::fs::write(&config, CONFIG)?;
    let seed_kubeconfig = dir.join("seed.kubeconfig");
    std::fs::write(&seed_kubeconfig, seed_api.kubeconfig())?;
    let metrics_port = dwd_testenv::free_port()?;
    let health_port = dwd_testenv::free_port()?;
    let args: Vec<String> = [
        "prober".to_string(),
        format!("--config-file={}", config.display()),
        format!("--kubeconfig={}", seed_kubeconfig.display()),
        "--zap-log-level=debug".into(),
        format!("--metrics-bind-addr=127.0.0.1:{metrics_port}"),
        format!("--health-bind-addr=127.0.0.1:{health_port}"),
    ]
    .into();
    let wd = Watchdog::spawn("hostile-prober", &args, &[], &dir, metrics_port)?;

    // Each hostile shoot fails alone, naming the field; the fat one at the response limit.
    for (ns, _, field) in &hostile {
        wd.until(&format!("{ns} refused naming {field}"), || async {
            let m = wd.metrics().await?;
            let failed = sum(
                &m,
                "dwd_prober_api_server_probe_failures_total",
                &[("shoot", ns)],
            );
            let named = wd
                .log()
                .lines()
                .any(|l| l.contains(ns) && l.contains(field));
            Ok((failed >= 2.0 && named).then_some(()))
        })
        .await?;
    }
    wd.until("the key shoot's runs fail", || async {
        let m = wd.metrics().await?;
        Ok((sum(
            &m,
            "dwd_prober_api_server_probe_failures_total",
            &[("shoot", key_ns)],
        ) >= 2.0)
            .then_some(()))
    })
    .await?;
    wd.until("the fat shoot's lease list cut off", || async {
        let m = wd.metrics().await?;
        let cut = sum(
            &m,
            "dwd_prober_oversized_responses_total",
            &[("shoot", fat_ns)],
        );
        let failed = sum(
            &m,
            "dwd_prober_lease_probe_failures_total",
            &[("shoot", fat_ns)],
        );
        Ok((cut >= 2.0 && failed >= 2.0).then_some(()))
    })
    .await?;
    ensure!(
        wd.warnings()
            .iter()
            .any(|l| l.contains(fat_ns) && l.contains("shoot response too large")),
        "no warning about the fat shoot's response\n{}",
        wd.tail()
    );

    // The normal shoot is protected all the while.
    let runs_before = sum(
        &wd.metrics().await?,
        "dwd_prober_shoot_probe_runs_total",
        &[("shoot", normal_ns)],
    );
    normal.kubelets().silence_count(4);
    wd.until("the normal shoot scaled down", || async {
        let mut all = true;
        for t in [KCM, MCM, CA] {
            all &= replicas(&seed, normal_ns, t).await? == 0;
        }
        Ok(all.then_some(()))
    })
    .await?;
    normal.kubelets().resume_all();
    wd.until("the normal shoot restored", || async {
        Ok((replicas(&seed, normal_ns, KCM).await? == 2
            && replicas(&seed, normal_ns, MCM).await? == 1
            && replicas(&seed, normal_ns, CA).await? == 1)
            .then_some(()))
    })
    .await?;
    let m = wd.metrics().await?;
    let runs = sum(
        &m,
        "dwd_prober_shoot_probe_runs_total",
        &[("shoot", normal_ns)],
    ) - runs_before;
    ensure!(
        runs >= 5.0,
        "only {runs} runs of the normal shoot during its outage"
    );
    ensure!(
        sum(
            &m,
            "dwd_prober_api_server_probe_failures_total",
            &[("shoot", normal_ns)]
        ) == 0.0
            && sum(
                &m,
                "dwd_prober_lease_probe_failures_total",
                &[("shoot", normal_ns)]
            ) == 0.0,
        "the normal shoot had failed runs\n{}",
        wd.tail()
    );

    // Nothing of the hostile shoots was scaled; no command ran.
    for ns in hostile.iter().map(|(ns, _, _)| *ns).chain([key_ns, fat_ns]) {
        ensure!(replicas(&seed, ns, KCM).await? == 2, "{ns}: KCM scaled");
    }
    ensure!(
        !marker.exists(),
        "the exec command ran: {} exists",
        marker.display()
    );

    // Memory stayed bounded: a fat page is cut at 16 MiB, never buffered whole.
    let pid = wd.pid().context("no pid")?;
    let peak = peak_rss_mib(pid)?;
    ensure!(peak < 200.0, "peak RSS {peak:.0} MiB");

    // Nothing planted reached the log, at debug level.
    let log = wd.log();
    for planted in [
        PLANTED_TOKEN,
        PLANTED_ENV,
        PLANTED_PROXY_USER,
        PLANTED_PROXY_PASS,
        &key_b64,
    ] {
        ensure!(
            !log.contains(planted),
            "the log contains planted material {planted:.20}…"
        );
    }
    use base64::Engine as _;
    let key_pem = String::from_utf8(base64::engine::general_purpose::STANDARD.decode(&key_b64)?)?;
    for line in key_pem
        .lines()
        .filter(|l| l.len() > 20 && !l.starts_with("-----"))
    {
        ensure!(
            !log.contains(line),
            "the log contains a line of the planted key"
        );
    }
    wd.stop().await?;
    Ok(())
}
