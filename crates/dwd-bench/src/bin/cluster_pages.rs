//! How long a seed takes to serve the pages of Clusters the prober lists, to size the seed
//! client's deadline on response bodies (`seed_transport::SEED_BODY_DEADLINE`, issue 24).
//!
//! Starts a seed kube-apiserver of its own (the test environment's, CRDs installed), creates
//! `--clusters` Clusters whose `spec` embeds a Shoot, a Seed and a CloudProfile of realistic
//! size (see [`cluster`]), then lists them `--rounds` times in pages of 500 as the prober's
//! watcher does (`GET …/clusters?limit=500&continue=…`), timing each page's headers and its
//! whole body. Prints a JSON report (and writes it to `--output` when given).
//!
//! ```sh
//! cargo run --release -p dwd-bench --bin cluster-pages -- --clusters 5000 --output r.json
//! ```

#![forbid(unsafe_code)]

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Parser;
use futures::{StreamExt, TryStreamExt};
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, PostParams};
use serde_json::{Value, json};

/// The page size of kube-runtime's watcher (and client-go's reflector).
const PAGE: usize = 500;

#[derive(Parser, Debug)]
#[command(name = "cluster-pages", about = "Time a seed's pages of Clusters")]
struct Cli {
    /// Clusters to create.
    #[arg(long, default_value_t = 5000)]
    clusters: usize,
    /// Full lists to time.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Creates in flight.
    #[arg(long, default_value_t = 16)]
    parallel: usize,
    /// Where to write the JSON report.
    #[arg(long)]
    output: Option<std::path::PathBuf>,
    /// A dependency-watchdog binary to start as `prober` on the seed once the Clusters are
    /// there (Gardener's config and command line): reports when its `/readyz` first says 200
    /// (every Cluster listed and stripped) and its peak RSS.
    #[arg(long)]
    watchdog_bin: Option<std::path::PathBuf>,
}

/// Gardener's prober config (deploy/gardener/prober.yaml).
const PROBER_CONFIG: &str = "dependentResourceInfos:
- optional: false
  ref: {apiVersion: apps/v1, kind: Deployment, name: kube-controller-manager}
  scaleDown: {level: 1}
  scaleUp: {level: 0}
- optional: false
  ref: {apiVersion: apps/v1, kind: Deployment, name: machine-controller-manager}
  scaleDown: {level: 0}
  scaleUp: {initialDelay: 30s, level: 1}
- optional: true
  ref: {apiVersion: apps/v1, kind: Deployment, name: cluster-autoscaler}
  scaleDown: {level: 0}
  scaleUp: {level: 2}
kubeConfigSecretName: shoot-access-dependency-watchdog-probe
probeInterval: 30s
";

/// `VmRSS` and `VmHWM` of `pid`, in KiB.
fn rss_kib(pid: u32) -> Option<(u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))?
            .split_whitespace()
            .nth(1)?
            .parse::<u64>()
            .ok()
    };
    Some((field("VmRSS:")?, field("VmHWM:")?))
}

/// The status code `GET /readyz` gets from `addr` (`None`: no answer).
async fn readyz(addr: std::net::SocketAddr) -> Option<u16> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.ok()?;
    stream
        .write_all(b"GET /readyz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .ok()?;
    let mut head = [0u8; 12];
    stream.read_exact(&mut head).await.ok()?;
    std::str::from_utf8(&head[9..12]).ok()?.parse().ok()
}

/// Starts `bin` as the prober on `apiserver` and measures it until it is ready.
async fn measure_watchdog(
    bin: &std::path::Path,
    apiserver: &dwd_testenv::ApiServer,
    dir: &std::path::Path,
) -> Result<Value> {
    let config = dir.join("dep-config.yaml");
    std::fs::write(&config, PROBER_CONFIG)?;
    let port =
        |what: &str| dwd_testenv::free_port().with_context(|| format!("a free port for {what}"));
    let health = std::net::SocketAddr::from(([127, 0, 0, 1], port("health")?));
    let metrics = std::net::SocketAddr::from(([127, 0, 0, 1], port("metrics")?));
    let log = std::fs::File::create(dir.join("watchdog.log"))?;
    let started = Instant::now();
    let mut child = tokio::process::Command::new(bin)
        .arg("prober")
        .arg(format!("--config-file={}", config.display()))
        .arg(format!(
            "--kubeconfig={}",
            apiserver.kubeconfig_path().display()
        ))
        .arg("--kube-api-qps=20")
        .arg("--kube-api-burst=100")
        .arg(format!("--metrics-bind-addr={metrics}"))
        .arg(format!("--health-bind-addr={health}"))
        .arg("--zap-log-level=error")
        .stdout(log.try_clone()?)
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("starting {}", bin.display()))?;
    let pid = child.id().context("no pid")?;
    let deadline = started + Duration::from_secs(600);
    let ready_after = loop {
        if let Some(status) = child.try_wait()? {
            bail!("the watchdog exited ({status}) before it was ready");
        }
        if readyz(health).await == Some(200) {
            break started.elapsed();
        }
        if Instant::now() > deadline {
            bail!("the watchdog not ready after 600 s");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    // Settled: every probe started (each waits for its missing secret).
    tokio::time::sleep(Duration::from_secs(20)).await;
    let (rss, peak) = rss_kib(pid).context("the watchdog's RSS")?;
    child.kill().await?;
    Ok(json!({
        "ready_after_s": ready_after.as_secs_f64(),
        "rss_mib_20s_after_ready": rss as f64 / 1024.0,
        "peak_rss_mib": peak as f64 / 1024.0,
    }))
}

/// A Shoot as a production seed's Cluster embeds it: a few workers pools, the usual
/// extensions and a status with Gardener's conditions, constraints and addresses. About
/// 10 KiB of JSON.
// One JSON literal shaped like a production Shoot, kept in that shape so it can be compared
// with a real one field by field; cut up, its parts would no longer read as the object.
#[allow(clippy::too_many_lines)]
fn shoot(i: usize) -> Value {
    let name = format!("s{i:05}");
    let condition = |kind: &str| {
        json!({"type": kind, "status": "True", "lastTransitionTime": "2026-11-20T10:00:00Z",
               "lastUpdateTime": "2026-11-27T05:00:00Z", "reason": format!("{kind}Healthy"),
               "message": format!("All {kind} checks passed: every managed resource of the shoot is applied and healthy, every deployment has its replicas available.")})
    };
    let pools: Vec<Value> = (0..3)
        .map(|p| {
            json!({"name": format!("pool-{p}"), "minimum": 3, "maximum": 30, "maxSurge": 1, "maxUnavailable": 0,
                   "machine": {"type": "m5.2xlarge", "image": {"name": "gardenlinux", "version": "1592.4.0"}, "architecture": "amd64"},
                   "volume": {"type": "gp3", "size": "50Gi"}, "zones": ["eu-west-1a", "eu-west-1b", "eu-west-1c"],
                   "labels": {"pool": format!("pool-{p}"), "team": "platform", "cost-center": "cc-4711"},
                   "taints": [{"key": "dedicated", "value": format!("pool-{p}"), "effect": "NoSchedule"}],
                   "cri": {"name": "containerd"}, "systemComponents": {"allow": true},
                   "kubernetes": {"kubelet": {"evictionHard": {"memoryAvailable": "100Mi", "imageFSAvailable": "5%"}, "kubeReserved": {"cpu": "80m", "memory": "1Gi"}}}})
        })
        .collect();
    let conditions: Vec<Value> = [
        "APIServerAvailable",
        "ControlPlaneHealthy",
        "ObservabilityComponentsHealthy",
        "EveryNodeReady",
        "SystemComponentsHealthy",
    ]
    .iter()
    .map(|k| condition(k))
    .collect();
    let constraints: Vec<Value> = [
        "HibernationPossible",
        "MaintenancePreconditionsSatisfied",
        "CACertificateValiditiesAcceptable",
        "CRDsWithProblematicConversionWebhooks",
    ]
    .iter()
    .map(|k| condition(k))
    .collect();
    json!({
        "apiVersion": "core.gardener.cloud/v1beta1", "kind": "Shoot",
        "metadata": {"name": name, "namespace": "garden-project", "uid": format!("8c0b3f6e-0000-4000-8000-{i:012}"),
                     "resourceVersion": "123456789", "generation": 42, "creationTimestamp": "2025-01-01T00:00:00Z",
                     "labels": {"shoot.gardener.cloud/status": "healthy", "name": name, "project.gardener.cloud/name": "project",
                                "extensions.extensions.gardener.cloud/shoot-dns-service": "true", "networking.extensions.gardener.cloud/calico": "true",
                                "provider.extensions.gardener.cloud/aws": "true", "operatingsystemconfig.extensions.gardener.cloud/gardenlinux": "true"},
                     "annotations": {"gardener.cloud/created-by": "someone@example.com", "shoot.gardener.cloud/tasks": "",
                                     "maintenance.gardener.cloud/operation": "", "gardener.cloud/timestamp": "2026-11-27T05:00:00Z"}},
        "spec": {"cloudProfile": {"kind": "CloudProfile", "name": "aws"}, "region": "eu-west-1", "secretBindingName": "aws-credentials",
                 "purpose": "production", "seedName": "aws-eu1",
                 "kubernetes": {"version": "1.34.4", "enableStaticTokenKubeconfig": false,
                                "kubeAPIServer": {"enableAnonymousAuthentication": false, "requests": {"maxNonMutatingInflight": 400, "maxMutatingInflight": 200},
                                                  "eventTTL": "1h0m0s", "logging": {"verbosity": 2}},
                                "kubeControllerManager": {"nodeMonitorGracePeriod": "40s", "nodeCIDRMaskSize": 24},
                                "kubeScheduler": {"profile": "balanced"}, "kubeProxy": {"mode": "IPTables", "enabled": true},
                                "kubelet": {"failSwapOn": true, "serializeImagePulls": false, "imageGCHighThresholdPercent": 50}},
                 "networking": {"type": "calico", "nodes": "10.250.0.0/16", "pods": "100.96.0.0/11", "services": "100.64.0.0/13", "ipFamilies": ["IPv4"],
                                "providerConfig": {"apiVersion": "calico.networking.extensions.gardener.cloud/v1alpha1", "kind": "NetworkConfig", "backend": "bird", "ipam": {"type": "host-local", "cidr": "usePodCIDR"}}},
                 "provider": {"type": "aws", "workers": pools,
                              "infrastructureConfig": {"apiVersion": "aws.provider.extensions.gardener.cloud/v1alpha1", "kind": "InfrastructureConfig",
                                                       "networks": {"vpc": {"cidr": "10.250.0.0/16"},
                                                                    "zones": [{"name": "eu-west-1a", "internal": "10.250.112.0/22", "public": "10.250.96.0/22", "workers": "10.250.0.0/19"},
                                                                              {"name": "eu-west-1b", "internal": "10.250.116.0/22", "public": "10.250.100.0/22", "workers": "10.250.32.0/19"},
                                                                              {"name": "eu-west-1c", "internal": "10.250.120.0/22", "public": "10.250.104.0/22", "workers": "10.250.64.0/19"}]}},
                              "controlPlaneConfig": {"apiVersion": "aws.provider.extensions.gardener.cloud/v1alpha1", "kind": "ControlPlaneConfig", "cloudControllerManager": {"useCustomRouteController": true}}},
                 "maintenance": {"autoUpdate": {"kubernetesVersion": true, "machineImageVersion": true}, "timeWindow": {"begin": "220000+0100", "end": "230000+0100"}},
                 "hibernation": {"enabled": false, "schedules": [{"start": "00 20 * * 1,2,3,4,5", "end": "00 07 * * 1,2,3,4,5", "location": "Europe/Berlin"}]},
                 "addons": {"kubernetesDashboard": {"enabled": false}, "nginxIngress": {"enabled": false}},
                 "dns": {"domain": format!("{name}.project.shoot.example.com")},
                 "extensions": [{"type": "shoot-dns-service"}, {"type": "shoot-cert-service"}, {"type": "shoot-networking-problemdetector"}],
                 "systemComponents": {"coreDNS": {"autoscaling": {"mode": "horizontal"}}, "nodeLocalDNS": {"enabled": true}},
                 "controlPlane": {"highAvailability": {"failureTolerance": {"type": "zone"}}}},
        "status": {"conditions": conditions, "constraints": constraints,
                   "gardener": {"id": "b312835d1784c3628983205c05452b2eaa95b645", "name": "gardenlet-7d9f8c6b5d-x2x4z", "version": "v1.130.0"},
                   "hibernated": false, "isHibernated": false, "observedGeneration": 42, "seedName": "aws-eu1",
                   "technicalID": format!("shoot--project--{name}"), "uid": format!("8c0b3f6e-0000-4000-8000-{i:012}"),
                   "clusterIdentity": format!("shoot--project--{name}-8c0b3f6e-0000-4000-8000-{i:012}-garden"),
                   "lastOperation": {"type": "Reconcile", "state": "Succeeded", "progress": 100, "lastUpdateTime": "2026-11-27T05:00:00Z",
                                     "description": "Shoot cluster has been successfully reconciled."},
                   "advertisedAddresses": [{"name": "external", "url": format!("https://api.{name}.project.shoot.example.com")},
                                           {"name": "internal", "url": format!("https://api.{name}.project.internal.example.com")},
                                           {"name": "service-account-issuer", "url": format!("https://discovery.example.com/projects/project/shoots/{i}/issuer")}],
                   "credentials": {"rotation": {"certificateAuthorities": {"phase": "Completed", "lastCompletionTime": "2026-06-01T00:00:00Z"},
                                                "serviceAccountKey": {"phase": "Completed", "lastCompletionTime": "2026-06-01T00:00:00Z"},
                                                "etcdEncryptionKey": {"phase": "Completed", "lastCompletionTime": "2026-06-01T00:00:00Z"}}},
                   "networking": {"nodes": ["10.250.0.0/16"], "pods": ["100.96.0.0/11"], "services": ["100.64.0.0/13"]}}
    })
}

/// A Seed as embedded in a Cluster: about 3 KiB.
fn seed() -> Value {
    let conditions: Vec<Value> = ["GardenletReady", "BackupBucketsReady", "ExtensionsReady", "SeedSystemComponentsHealthy"]
        .iter()
        .map(|k| json!({"type": k, "status": "True", "lastTransitionTime": "2026-11-20T10:00:00Z", "lastUpdateTime": "2026-11-27T05:00:00Z", "reason": "Ready", "message": "Seed component is healthy and ready."}))
        .collect();
    json!({
        "apiVersion": "core.gardener.cloud/v1beta1", "kind": "Seed",
        "metadata": {"name": "aws-eu1", "uid": "3d1f0a4c-0000-4000-8000-000000000001", "resourceVersion": "987654321",
                     "labels": {"seed.gardener.cloud/gardenlet": "true", "name": "aws-eu1", "provider": "aws"}},
        "spec": {"provider": {"type": "aws", "region": "eu-west-1", "zones": ["eu-west-1a", "eu-west-1b", "eu-west-1c"]},
                 "networks": {"nodes": "10.242.0.0/16", "pods": "10.243.128.0/17", "services": "10.243.0.0/17",
                              "shootDefaults": {"pods": "100.96.0.0/11", "services": "100.64.0.0/13"}},
                 "dns": {"provider": {"type": "aws-route53", "secretRef": {"name": "seed-dns", "namespace": "garden"}}},
                 "ingress": {"domain": "ingress.aws-eu1.seed.example.com", "controller": {"kind": "nginx"}},
                 "backup": {"provider": "aws", "region": "eu-west-1", "secretRef": {"name": "backup", "namespace": "garden"}},
                 "settings": {"dependencyWatchdog": {"prober": {"enabled": true}, "weeder": {"enabled": true}},
                              "excessCapacityReservation": {"enabled": true}, "scheduling": {"visible": true},
                              "verticalPodAutoscaler": {"enabled": true}, "topologyAwareRouting": {"enabled": true}},
                 "taints": [{"key": "seed.gardener.cloud/protected"}]},
        "status": {"gardener": {"id": "b312835d1784c3628983205c05452b2eaa95b645", "version": "v1.130.0"},
                   "kubernetesVersion": "v1.34.4", "clusterIdentity": "aws-eu1", "observedGeneration": 7,
                   "allocatable": {"shoots": "250"}, "capacity": {"shoots": "250"},
                   "conditions": conditions}
    })
}

/// A CloudProfile as embedded in a Cluster: Gardener's public AWS profiles list ~100 machine
/// types, several images with a dozen versions each, ~25 regions with their zones and image
/// mappings, and the Kubernetes versions with expiry dates: about 60 KiB here.
fn cloud_profile() -> Value {
    let machine_types: Vec<Value> = (0..100)
        .map(|m| json!({"name": format!("m{}.{}xlarge", 5 + m % 4, 1 << (m % 6)), "cpu": format!("{}", 2 << (m % 6)), "gpu": "0",
                        "memory": format!("{}Gi", 8 << (m % 6)), "architecture": if m % 3 == 0 { "arm64" } else { "amd64" }, "usable": true}))
        .collect();
    let regions: Vec<Value> = (0..25)
        .map(|r| json!({"name": format!("region-{r}"), "zones": [{"name": format!("region-{r}a")}, {"name": format!("region-{r}b")}, {"name": format!("region-{r}c")}]}))
        .collect();
    let images: Vec<Value> = ["gardenlinux", "suse-chost", "ubuntu", "flatcar"].iter()
        .map(|img| json!({"name": img, "updateStrategy": "minor", "versions": (0..12).map(|v| json!({
            "version": format!("1592.{v}.0"), "classification": if v < 10 { "deprecated" } else { "supported" },
            "expirationDate": "2027-06-01T00:00:00Z", "architectures": ["amd64", "arm64"], "cri": [{"name": "containerd"}]})).collect::<Vec<_>>()}))
        .collect();
    let image_mappings: Vec<Value> = ["gardenlinux", "suse-chost", "ubuntu", "flatcar"].iter()
        .map(|img| json!({"name": img, "versions": (0..12).map(|v| json!({"version": format!("1592.{v}.0"),
            "regions": (0..25).map(|r| json!({"name": format!("region-{r}"), "ami": format!("ami-{:017x}", v * 1000 + r), "architecture": "amd64"})).collect::<Vec<_>>()})).collect::<Vec<_>>()}))
        .collect();
    json!({
        "apiVersion": "core.gardener.cloud/v1beta1", "kind": "CloudProfile",
        "metadata": {"name": "aws", "uid": "5e2a1b3c-0000-4000-8000-000000000002", "resourceVersion": "55555"},
        "spec": {"type": "aws", "machineTypes": machine_types, "regions": regions, "machineImages": images,
                 "kubernetes": {"versions": (28..35).flat_map(|minor| (0..4).map(move |p| json!({"version": format!("1.{minor}.{p}"), "classification": "supported", "expirationDate": "2027-01-01T00:00:00Z"}))).collect::<Vec<_>>()},
                 "volumeTypes": [{"name": "gp3", "class": "standard", "usable": true}, {"name": "io1", "class": "premium", "usable": true}],
                 "providerConfig": {"apiVersion": "aws.provider.extensions.gardener.cloud/v1alpha1", "kind": "CloudProfileConfig", "machineImages": image_mappings}}
    })
}

/// Cluster `i`: named like its shoot's namespace, embedding the three objects.
fn cluster(i: usize, seed: &Value, cloud_profile: &Value) -> Value {
    json!({
        "apiVersion": "extensions.gardener.cloud/v1alpha1", "kind": "Cluster",
        "metadata": {"name": format!("shoot--project--s{i:05}")},
        "spec": {"shoot": shoot(i), "seed": seed, "cloudProfile": cloud_profile}
    })
}

/// One page: when its headers came, when its body ended, its size.
struct Page {
    headers: Duration,
    whole: Duration,
    bytes: usize,
}

async fn list_pages(client: &kube::Client) -> Result<(Vec<Page>, usize)> {
    use http_body_util::BodyExt;
    let mut pages = Vec::new();
    let mut items = 0;
    let mut next: Option<String> = None;
    loop {
        let mut uri = format!("/apis/extensions.gardener.cloud/v1alpha1/clusters?limit={PAGE}");
        if let Some(token) = &next {
            uri.push_str("&continue=");
            uri.push_str(&form_urlencode(token));
        }
        let request = http::Request::get(&uri)
            .header(http::header::ACCEPT, "application/json")
            .body(kube::client::Body::empty())?;
        let started = Instant::now();
        let response = client.send(request).await.context("list page")?;
        let headers = started.elapsed();
        if !response.status().is_success() {
            bail!("{uri}: {}", response.status());
        }
        let body = response.into_body().collect().await?.to_bytes();
        let whole = started.elapsed();
        let list: Value = serde_json::from_slice(&body)?;
        items += list["items"].as_array().map_or(0, Vec::len);
        pages.push(Page {
            headers,
            whole,
            bytes: body.len(),
        });
        next = list["metadata"]["continue"]
            .as_str()
            .filter(|c| !c.is_empty())
            .map(str::to_owned);
        if next.is_none() {
            return Ok((pages, items));
        }
    }
}

/// Percent-encodes a continue token for a query string.
fn form_urlencode(token: &str) -> String {
    token
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Creates `cli.clusters` Clusters embedding `seed` and `cloud_profile`, `cli.parallel` at a
/// time.
async fn create_clusters(
    api: &Api<DynamicObject>,
    cli: &Cli,
    seed: &Value,
    cloud_profile: &Value,
) -> Result<()> {
    futures::stream::iter(0..cli.clusters)
        .map(|i| {
            let (api, object) = (api.clone(), cluster(i, seed, cloud_profile));
            async move {
                let object: DynamicObject = serde_json::from_value(object)?;
                api.create(&PostParams::default(), &object)
                    .await
                    .with_context(|| format!("creating Cluster {i}"))?;
                anyhow::Ok(())
            }
        })
        .buffer_unordered(cli.parallel)
        .try_collect::<Vec<()>>()
        .await?;
    Ok(())
}

#[tokio::main]
async fn main() -> Result<()> {
    let cli = Cli::parse();
    let env = dwd_testenv::TestEnv::start().await?;
    let apiserver = env
        .start_apiserver_with("seed", dwd_testenv::ApiServerOptions::seed())
        .await?;
    let client = apiserver.client().await?;
    let gvk = GroupVersionKind::gvk("extensions.gardener.cloud", "v1alpha1", "Cluster");
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &ApiResource::from_gvk(&gvk));
    let (seed, cloud_profile) = (seed(), cloud_profile());
    let sample = cluster(0, &seed, &cloud_profile);
    let sizes = json!({
        "cluster_bytes": serde_json::to_vec(&sample)?.len(),
        "shoot_bytes": serde_json::to_vec(&sample["spec"]["shoot"])?.len(),
        "seed_bytes": serde_json::to_vec(&seed)?.len(),
        "cloud_profile_bytes": serde_json::to_vec(&cloud_profile)?.len(),
    });
    eprintln!("one Cluster: {sizes}");
    let started = Instant::now();
    create_clusters(&api, &cli, &seed, &cloud_profile).await?;
    let created_s = started.elapsed().as_secs_f64();
    eprintln!("{} Clusters created in {created_s:.1}s", cli.clusters);

    let mut rounds = Vec::new();
    let (mut worst_headers, mut worst_whole, mut biggest) = (0f64, 0f64, 0usize);
    for round in 0..cli.rounds {
        let started = Instant::now();
        let (pages, items) = list_pages(&client).await?;
        let total = started.elapsed().as_secs_f64();
        if items != cli.clusters {
            bail!(
                "round {round}: listed {items} Clusters, created {}",
                cli.clusters
            );
        }
        for p in &pages {
            worst_headers = worst_headers.max(p.headers.as_secs_f64());
            worst_whole = worst_whole.max(p.whole.as_secs_f64());
            biggest = biggest.max(p.bytes);
        }
        eprintln!(
            "round {round}: {} pages in {total:.2}s; slowest page {:.2}s",
            pages.len(),
            pages
                .iter()
                .map(|p| p.whole.as_secs_f64())
                .fold(0.0, f64::max)
        );
        rounds.push(json!({
            "list_s": total,
            "pages": pages.iter().map(|p| json!({"headers_s": p.headers.as_secs_f64(), "whole_s": p.whole.as_secs_f64(), "bytes": p.bytes})).collect::<Vec<_>>(),
        }));
    }
    let watchdog = match &cli.watchdog_bin {
        Some(bin) => {
            let measured = measure_watchdog(bin, &apiserver, env.dir()).await?;
            eprintln!("watchdog: {measured}");
            measured
        }
        None => Value::Null,
    };
    let report = json!({
        "clusters": cli.clusters,
        "watchdog": watchdog,
        "page_size": PAGE,
        "sizes": sizes,
        "create_s": created_s,
        "worst_page_headers_s": worst_headers,
        "worst_page_whole_s": worst_whole,
        "biggest_page_bytes": biggest,
        "rounds": rounds,
        "machine": "2 cores, kube-apiserver v1.34.4 and etcd v3.6.4 of the test environment, loopback",
    });
    let text = serde_json::to_string_pretty(&report)?;
    println!("{text}");
    if let Some(path) = cli.output {
        std::fs::write(&path, format!("{text}\n"))
            .with_context(|| format!("writing {}", path.display()))?;
    }
    env.teardown();
    Ok(())
}
