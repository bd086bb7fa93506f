//! The benchmark's world: one seed and K shoot kube-apiservers (audit logs on), N simulated
//! shoots spread over them, one Deployment status simulation for the whole seed, and a
//! watch recording every replica change of every target. The weeder storm needs only the
//! seed: its namespaces, slices and pods come from [`crate::weeder::populate`].
//!
//! The world is built once per `bench` invocation and shared by every run of a comparison
//! (building it is what takes minutes at N=1000).

use std::collections::{BTreeMap, HashMap};
use std::io::Write as _;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use chrono::{DateTime, Utc};
use dwd_sim::shoot::DEFAULT_POOL;
use dwd_sim::{
    AbortOnDrop, DeploymentStatusOptions, DeploymentStatusSim, SimShoot, SimShootOptions,
    node_specs_with_prefix,
};
use dwd_testenv::{ApiServer, ApiServerOptions, TestEnv};

use crate::shoot_proxy::{self, ShootProxy};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::Deployment;
use kube::Api;
use kube::runtime::{WatchStreamExt, watcher};

/// User of the watchdog's seed kubeconfig: its seed requests are told apart by this name.
pub(crate) const WATCHDOG_USER: &str = "dependency-watchdog";

/// Lease writes in flight at once across all shoots, at least: bounds the burst a small shape
/// sends, so the watchdog, not the kubelets, is what the machine spends its cores on.
const MIN_RENEW_PERMITS: usize = 32;

/// How long one renewal may take end to end (queueing in the simulator, the request, the
/// apiserver) with the kubelets still keeping their interval; see [`renew_permits`].
const RENEWAL_LATENCY_BUDGET: Duration = Duration::from_millis(500);

/// The simulated kubelets' renewals in flight at once across all shoots. A renewal holds its
/// permit for its whole duration, so the kubelets keep their interval only while
/// `permits ≥ renewals a second × a renewal's duration`; anything less and every round
/// stretches, leases lapse and the shoots flap between healthy and scaled down, which no
/// watchdog causes. Sized for renewals taking up to [`RENEWAL_LATENCY_BUDGET`]. Measured on 2
/// cores at 1,000 shoots × 50 nodes, renewing every 120 s (417 a second), loaded by a storm:
/// 0.23 s end to end (the apiserver's share 33 ms), so the former fixed 32 permits gave 139
/// renewals a second, a round took 6 minutes and 32 of every 50 leases lapsed.
fn renew_permits(shoots: usize, nodes: usize, renew_interval: Duration) -> usize {
    let per_second = (shoots * nodes) as f64 / renew_interval.as_secs_f64().max(1.0);
    let needed = (per_second * RENEWAL_LATENCY_BUDGET.as_secs_f64()).ceil() as usize;
    needed.max(MIN_RENEW_PERMITS)
}

/// Shoots created at once during setup (each one already keeps 16 writes in flight).
pub(crate) const SETUP_CONCURRENCY: usize = 4;

/// The world's shape.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Shape {
    /// N: shoots.
    pub shoots: usize,
    /// M: nodes per shoot.
    pub nodes: usize,
    /// K: shoot apiservers.
    pub apiservers: usize,
    /// Kubelet lease renew interval.
    pub renew_interval: Duration,
    /// Whether to create shoots (prober scenarios) or leave the seed empty (weeder storm).
    pub with_shoots: bool,
    /// Whether each shoot's probe kubeconfig goes through its own front
    /// ([`crate::shoot_proxy`]), so that it sees only its own nodes and leases.
    pub shoot_fronts: bool,
    /// Whether each shoot apiserver has an etcd of its own (else all share the seed's).
    pub etcd_per_shoot_apiserver: bool,
    /// Whether the shoots' Nodes are the size a real kubelet makes them
    /// ([`dwd_sim::NodeSpec::kubelet_sized`]) rather than small.
    pub kubelet_sized_nodes: bool,
    /// The hostile shoots to add (hostile scenario), each on an apiserver of its own.
    pub hostile: Option<crate::hostile::HostileShape>,
}

/// One shoot of the benchmark.
pub(crate) struct BenchShoot {
    /// Index i (user `shoot-<i>`).
    pub index: usize,
    /// The simulated shoot.
    pub sim: SimShoot,
    /// Its front, if the probe kubeconfig goes through one (stops when dropped).
    _front: Option<ShootProxy>,
}

impl BenchShoot {
    /// The client-certificate user its probe secret carries.
    pub(crate) fn user(&self) -> String {
        shoot_user(self.index)
    }
}

/// User name of shoot `i`.
pub(crate) fn shoot_user(i: usize) -> String {
    format!("shoot-{i}")
}

/// Namespace (and Cluster name) of shoot `i`; `shoot--<project>--<name>` like Gardener's.
pub(crate) fn shoot_namespace(i: usize) -> String {
    format!("shoot--bench--s{i:04}")
}

/// `(namespace, deployment)` → every observed `spec.replicas` change, in order.
pub(crate) type ReplicaLog = Arc<Mutex<HashMap<(String, String), Vec<(DateTime<Utc>, i32)>>>>;

/// Locks a mutex, recovering the data after a panic elsewhere (the log is always valid).
pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Everything the benchmark runs against. Field order is drop order: background tasks
/// (watch, status sim, kubelets) stop before the environment tears the apiservers down.
pub(crate) struct World {
    /// Replica changes seen by the bench's own watch.
    pub replicas: ReplicaLog,
    _replica_watch: AbortOnDrop,
    _deployment_status: DeploymentStatusSim,
    /// The weeder storm's namespaces and pod deletion watch (weeder-storm only).
    pub storm: Option<crate::weeder::Storm>,
    /// The shoots, by index.
    pub shoots: Vec<BenchShoot>,
    /// The hostile shoots (hostile scenario only), apart from the normal ones: their
    /// apiservers are their own, not among `shoot_apis`.
    pub hostile: Vec<crate::hostile::HostileShoot>,
    /// The shoots behind fake apiservers (hostile scenario only): slow shoots and the
    /// amplification shoot.
    pub fakes: Option<crate::hostile::Fakes>,
    /// The seed apiserver.
    pub seed: ApiServer,
    /// The shoot apiservers.
    pub shoot_apis: Vec<ApiServer>,
    /// The watchdog's seed kubeconfig (user [`WATCHDOG_USER`]).
    pub watchdog_kubeconfig: PathBuf,
    /// Directory for the watchdog's config and log.
    pub dir: PathBuf,
    /// Admin client of the seed (the bench's own reads and repairs; not the watchdog's user).
    pub seed_client: kube::Client,
    /// Admin clients of the shoot apiservers, by index.
    pub shoot_clients: Vec<kube::Client>,
    /// How long building the world took.
    pub setup_seconds: f64,
    /// Last: stops etcd and every apiserver, removes its directory (held only to be dropped).
    _env: TestEnv,
}

/// Starts etcd, the seed apiserver and `shape.apiservers` shoot apiservers, each with an
/// audit log (the seed with the CRDs; each shoot apiserver with its own etcd when asked).
async fn start_control_plane(
    shape: Shape,
    started: Instant,
) -> Result<(TestEnv, ApiServer, Vec<ApiServer>)> {
    eprintln!(
        "setup: starting etcd, a seed and {} shoot apiserver(s)…",
        shape.apiservers
    );
    let env = TestEnv::start().await.context("start test environment")?;
    let audit = |install_crds, own_etcd| ApiServerOptions {
        install_crds,
        audit_log: true,
        extra_args: Vec::new(),
        own_etcd,
    };
    let seed = env
        .start_apiserver_with("seed", audit(true, false))
        .await
        .context("start seed apiserver")?;
    let mut shoot_apis = Vec::with_capacity(shape.apiservers);
    for j in 0..shape.apiservers {
        let api = env
            .start_apiserver_with(
                &format!("shoot-api-{j}"),
                audit(false, shape.etcd_per_shoot_apiserver),
            )
            .await
            .with_context(|| format!("start shoot apiserver {j}"))?;
        shoot_apis.push(api);
    }
    eprintln!(
        "setup: control plane up after {:.1}s",
        started.elapsed().as_secs_f64()
    );
    Ok((env, seed, shoot_apis))
}

/// Writes the watchdog's seed kubeconfig to a directory of the bench's own, outside the
/// environment's directory (removed at teardown): the watchdog's log and config stay for a
/// look after the run. Returns the directory and the kubeconfig's path.
fn write_watchdog_kubeconfig(seed: &ApiServer) -> Result<(PathBuf, PathBuf)> {
    let dir = std::env::temp_dir().join(format!("dwd-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
    let watchdog_kubeconfig = dir.join("watchdog-seed.kubeconfig");
    // system:masters: the bench measures load and latency, not RBAC (the RBAC tests do that).
    let kubeconfig = seed
        .kubeconfig_for(WATCHDOG_USER, &["system:masters"])
        .context("watchdog seed kubeconfig")?;
    std::fs::write(&watchdog_kubeconfig, kubeconfig)
        .with_context(|| format!("write {}", watchdog_kubeconfig.display()))?;
    Ok((dir, watchdog_kubeconfig))
}

/// Shoot `i`'s kubeconfig for the watchdog: its own certificate (the shoot apiserver's audit
/// log names the shoot), pointed at a front of its own when `front_tls` is given.
async fn shoot_kubeconfig(
    i: usize,
    api: &ApiServer,
    front_tls: Option<Arc<rustls::ServerConfig>>,
) -> Result<(String, Option<ShootProxy>)> {
    // Its own certificate: the shoot apiserver's audit log names the shoot.
    let direct = api
        .kubeconfig_for(&shoot_user(i), &["system:masters"])
        .with_context(|| format!("kubeconfig of shoot {i}"))?;
    Ok(match front_tls {
        Some(tls) => {
            let front = ShootProxy::start(i, api.addr(), &direct, tls).await?;
            let via_front = direct.replace(
                &format!("https://{}", api.addr()),
                &format!("https://{}", front.addr),
            );
            (via_front, Some(front))
        }
        None => (direct, None),
    })
}

/// Shoot `i`'s simulation: `shape.nodes` nodes (kubelet-sized when asked) and their leases
/// labelled with the shoot's index, so its front can select them; renewals share `limiter`.
fn sim_options(i: usize, shape: Shape, limiter: Arc<tokio::sync::Semaphore>) -> SimShootOptions {
    let label = (shoot_proxy::SHOOT_LABEL, i.to_string());
    let mut options = SimShootOptions::new(shoot_namespace(i))
        .with_nodes(shape.nodes)
        .with_renew_interval(shape.renew_interval);
    options.node_specs = Some(
        node_specs_with_prefix(&format!("s{i}-node-"), shape.nodes, &[DEFAULT_POOL])
            .into_iter()
            .map(|n| n.with_label(label.0, &label.1))
            .map(|n| {
                if shape.kubelet_sized_nodes {
                    n.kubelet_sized()
                } else {
                    n
                }
            })
            .collect(),
    );
    options.lease_labels = BTreeMap::from([(label.0.to_string(), label.1.clone())]);
    options.renew_limiter = Some(limiter);
    options.deployment_status_delay = None;
    options
}

/// The progress line of the shoots' creation.
fn report_progress(created: usize, shape: Shape, started: Instant) {
    eprint!(
        "\rsetup: {created}/{} shoots ({} {}nodes each) after {:.1}s   ",
        shape.shoots,
        shape.nodes,
        if shape.kubelet_sized_nodes {
            "kubelet-sized "
        } else {
            ""
        },
        started.elapsed().as_secs_f64()
    );
    let _ = std::io::stderr().flush();
}

/// The hostile scenario's shoots and fake shoots (none for the other scenarios).
async fn build_hostile(
    env: &TestEnv,
    seed_client: &kube::Client,
    shape: Shape,
    limiter: Arc<tokio::sync::Semaphore>,
) -> Result<(
    Vec<crate::hostile::HostileShoot>,
    Option<crate::hostile::Fakes>,
)> {
    Ok(match shape.hostile {
        Some(h) => {
            let hostile =
                crate::hostile::build(env, seed_client, h, shape.renew_interval, limiter).await?;
            // The fake shoots' kubeconfigs: a hostile shoot apiserver's (its CA, a client
            // certificate of the environment), pointed at the fake servers.
            let (kubeconfig, server) = match hostile.first() {
                Some(s) => (
                    s.api
                        .kubeconfig_for("fake-shoot", &[])
                        .context("kubeconfig of the fake shoots")?,
                    s.api.addr(),
                ),
                None => anyhow::bail!("the hostile scenario has no hostile shoot apiserver"),
            };
            let fakes =
                crate::hostile::build_fakes(env, seed_client, h, &kubeconfig, server).await?;
            (hostile, Some(fakes))
        }
        None => (Vec::new(), None),
    })
}

/// An admin client of each shoot apiserver, by index.
async fn shoot_clients(shoot_apis: &[ApiServer]) -> Result<Vec<kube::Client>> {
    let mut clients = Vec::with_capacity(shoot_apis.len());
    for api in shoot_apis {
        clients.push(api.client().await.context("shoot client")?);
    }
    Ok(clients)
}

/// Builds the world, printing progress to stderr.
pub(crate) async fn build(shape: Shape) -> Result<World> {
    let started = Instant::now();
    let (env, seed, shoot_apis) = start_control_plane(shape, started).await?;

    let (dir, watchdog_kubeconfig) = write_watchdog_kubeconfig(&seed)?;

    let seed_client = seed.client().await.context("seed client")?;
    let shoot_clients = shoot_clients(&shoot_apis).await?;

    // One status simulation and one replica watch for all namespaces: per-shoot watches
    // would cost the seed more than the watchdog under test.
    let deployment_status =
        DeploymentStatusSim::start(seed_client.clone(), DeploymentStatusOptions::default());
    let replicas: ReplicaLog = Arc::default();
    let replica_watch = AbortOnDrop::spawn(watch_replicas(seed_client.clone(), replicas.clone()));

    let shoot_count = if shape.with_shoots { shape.shoots } else { 0 };
    let limiter = Arc::new(tokio::sync::Semaphore::new(renew_permits(
        shoot_count,
        shape.nodes,
        shape.renew_interval,
    )));
    let front_tls = if shape.shoot_fronts && shape.with_shoots {
        Some(shoot_proxy::server_tls(env.dir())?)
    } else {
        None
    };
    let mut created = 0usize;
    let mut last_report = Instant::now();
    let mut stream = futures::stream::iter(0..shoot_count)
        .map(|i| {
            let j = i % shape.apiservers;
            let seed_client = seed_client.clone();
            let shoot_client = shoot_clients[j].clone();
            let api = shoot_apis[j].clone();
            let limiter = limiter.clone();
            let front_tls = front_tls.clone();
            async move {
                let (kubeconfig, front) = shoot_kubeconfig(i, &api, front_tls).await?;
                let options = sim_options(i, shape, limiter);
                let sim = SimShoot::create(seed_client, shoot_client, &kubeconfig, options)
                    .await
                    .with_context(|| format!("create shoot {i}"))?;
                anyhow::Ok(BenchShoot {
                    index: i,
                    sim,
                    _front: front,
                })
            }
        })
        .buffer_unordered(SETUP_CONCURRENCY);
    let mut shoots = Vec::with_capacity(shoot_count);
    while let Some(shoot) = stream.try_next().await? {
        shoots.push(shoot);
        created += 1;
        if last_report.elapsed() >= Duration::from_secs(2) || created == shoot_count {
            last_report = Instant::now();
            report_progress(created, shape, started);
        }
    }
    drop(stream);
    if shoot_count > 0 {
        eprintln!();
    }
    shoots.sort_by_key(|s| s.index);
    let (hostile, fakes) = build_hostile(&env, &seed_client, shape, limiter).await?;
    Ok(World {
        hostile,
        fakes,
        seed_client,
        shoot_clients,
        setup_seconds: started.elapsed().as_secs_f64(),
        replicas,
        _replica_watch: replica_watch,
        _deployment_status: deployment_status,
        storm: None,
        shoots,
        seed,
        shoot_apis,
        watchdog_kubeconfig,
        dir,
        _env: env,
    })
}

/// Records every `spec.replicas` change of every Deployment in the seed, stamped on arrival.
async fn watch_replicas(client: kube::Client, log: ReplicaLog) {
    let api: Api<Deployment> = Api::all(client);
    loop {
        let mut stream = watcher(api.clone(), watcher::Config::default())
            .default_backoff()
            .applied_objects()
            .boxed();
        while let Some(item) = stream.next().await {
            let Ok(d) = item else { continue };
            let (Some(ns), Some(name)) = (d.metadata.namespace.clone(), d.metadata.name.clone())
            else {
                continue;
            };
            let replicas = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
            let mut log = lock(&log);
            let changes = log.entry((ns, name)).or_default();
            if changes.last().map(|(_, r)| *r) != Some(replicas) {
                changes.push((Utc::now(), replicas));
            }
        }
        // The stream only ends if the watcher gives up; start it again.
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

#[cfg(test)]
mod tests {
    //! The kubelet simulator's sizing.

    use super::*;

    #[test]
    fn renew_permits_cover_the_renewal_rate_for_the_latency_budget_and_never_fewer_than_the_floor()
    {
        // 1,000 shoots × 50 nodes every 120 s: 416.7 renewals a second × 0.5 s.
        assert_eq!(renew_permits(1000, 50, Duration::from_secs(120)), 209);
        // Small shapes keep the floor.
        assert_eq!(
            renew_permits(100, 5, Duration::from_secs(10)),
            MIN_RENEW_PERMITS
        );
        assert_eq!(
            renew_permits(0, 50, Duration::from_secs(120)),
            MIN_RENEW_PERMITS
        );
        // A zero interval (refused by the CLI) counts as 1 s, not a division by zero.
        assert_eq!(renew_permits(1000, 1, Duration::ZERO), 500);
    }
}
