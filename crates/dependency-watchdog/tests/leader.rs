//! Leader election and graceful shutdown of the real binary against a real seed apiserver.
//!
//! Each test runs several `dependency-watchdog prober` processes with leader election on,
//! against a seed apiserver of its own (the processes probe every Cluster of their seed, so
//! they must not see other tests' shoots), with one simulated shoot. The tests run one at a
//! time: two apiservers and two or three watchdogs each are plenty for two cores.

// A test crate: a failed assumption is a failed test (outside tests the workspace denies these).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod harness;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, ensure};
use dependency_watchdog::process::leader::PROBER_LEASE;
use dwd_core::scaling::REPLICAS_ANNOTATION;
use dwd_sim::{SimShoot, SimShootOptions};
use dwd_testenv::process::Signal;
use dwd_testenv::{ApiServer, ApiServerOptions, TestEnv, eventually};
use futures::TryStreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::PostParams;
use kube::runtime::{WatchStreamExt, watcher};

use harness::gardener::ensure_namespace;
use harness::in_process::{CA, KCM, MCM, PROBER_CONFIG_THREE_TARGETS};

const LEASE_NAMESPACE: &str = "dwd-leader-election";
/// Deadline for conditions that need process start-up, cache sync or several probe runs.
const DEADLINE: Duration = Duration::from_secs(60);

/// One environment (etcd only; each test starts its apiservers) for this binary.
async fn env() -> Result<&'static TestEnv> {
    static ENV: tokio::sync::OnceCell<TestEnv> = tokio::sync::OnceCell::const_new();
    Ok(ENV.get_or_try_init(TestEnv::start).await?)
}

/// Held for a whole test: the tests run one after the other.
async fn serial() -> tokio::sync::MutexGuard<'static, ()> {
    static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    SERIAL.lock().await
}

/// Leader-election flags.
#[derive(Debug, Clone, Copy)]
struct Timing {
    lease: Duration,
    renew: Duration,
    retry: Duration,
}

fn go_duration(d: Duration) -> String {
    format!("{}ms", d.as_millis())
}

/// A `dependency-watchdog prober` process (tests/harness/binary.rs's [`harness::binary::Watchdog`]: its log,
/// metrics, signals; killed on drop and by the kernel if the test process dies) and its health
/// port.
struct Candidate {
    dog: harness::binary::Watchdog,
    health_port: u16,
}

impl std::ops::Deref for Candidate {
    type Target = harness::binary::Watchdog;
    fn deref(&self) -> &harness::binary::Watchdog {
        &self.dog
    }
}

impl Candidate {
    /// Starts `name`; with `timing`, as a leader-election candidate.
    fn spawn(
        name: &str,
        dir: &Path,
        seed: &ApiServer,
        timing: Option<Timing>,
    ) -> Result<Candidate> {
        // One file per process: rewriting a shared one could truncate it under another reader.
        let config = dir.join(format!("{name}-config.yaml"));
        std::fs::write(&config, PROBER_CONFIG_THREE_TARGETS)?;
        let (metrics_port, health_port) = (dwd_testenv::free_port()?, dwd_testenv::free_port()?);
        let mut args = vec![
            "prober".to_string(),
            format!("--config-file={}", config.display()),
            format!("--kubeconfig={}", seed.kubeconfig_path().display()),
        ];
        if let Some(timing) = timing {
            args.extend([
                "--enable-leader-election=true".to_string(),
                format!("--leader-election-namespace={LEASE_NAMESPACE}"),
                format!(
                    "--leader-elect-lease-duration={}",
                    go_duration(timing.lease)
                ),
                format!(
                    "--leader-elect-renew-deadline={}",
                    go_duration(timing.renew)
                ),
                format!("--leader-elect-retry-period={}", go_duration(timing.retry)),
            ]);
        }
        args.extend([
            format!("--metrics-bind-addr=127.0.0.1:{metrics_port}"),
            format!("--health-bind-addr=127.0.0.1:{health_port}"),
            "--log-format=json".to_string(),
        ]);
        let env = [("RUST_LOG", "info,kube=warn,hyper=warn")];
        let dog = harness::binary::Watchdog::spawn(name, &args, &env, dir, metrics_port)?;
        Ok(Candidate { dog, health_port })
    }

    /// The identity it announced (`leader election: candidate` log line).
    fn identity(&self) -> Option<String> {
        self.log()
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .find(|v| v["msg"] == "leader election: candidate")
            .and_then(|v| v["identity"].as_str().map(str::to_string))
    }

    async fn ready(&self) -> bool {
        matches!(
            harness::binary::http_get(self.health_port, "/readyz").await,
            Ok((200, _))
        )
    }

    /// Probe runs for `shoot` so far (0 without a series).
    async fn probe_runs(&self, shoot: &str) -> Result<u64> {
        let runs = self
            .sample("dwd_prober_shoot_probe_runs_total", &[("shoot", shoot)])
            .await?;
        Ok(runs as u64)
    }

    /// Fails unless this process has never probed `shoot` and runs no probe.
    async fn assert_idle(&self, shoot: &str) -> Result<()> {
        let text = self.metrics().await?;
        ensure!(
            !text.contains(&format!("shoot=\"{shoot}\"")),
            "follower {} acted on {shoot}:\n{text}",
            self.name
        );
        ensure!(
            harness::binary::sample(&text, "dwd_prober_active_probes", &[]) == Some(0.0),
            "follower {} runs probes:\n{text}",
            self.name
        );
        Ok(())
    }
}

/// A test's world, the serial lock held while it lives: a seed and a shoot apiserver of
/// its own, the lease namespace, one simulated shoot, a directory for the candidates.
struct World {
    _serial: tokio::sync::MutexGuard<'static, ()>,
    seed: ApiServer,
    shoots: ApiServer,
    admin: kube::Client,
    shoot: SimShoot,
    dir: std::path::PathBuf,
}

impl World {
    /// The world of test `name`: `le-seed-<name>`, `le-shoot-<name>`, shoot
    /// `shoot--le--<name>`, directory `le-<name>`.
    async fn new(name: &str) -> Result<World> {
        let serial = serial().await;
        let env = env().await?;
        let seed = env
            .start_apiserver_with(&format!("le-seed-{name}"), ApiServerOptions::seed())
            .await?;
        let shoots = env.start_apiserver(&format!("le-shoot-{name}")).await?;
        let admin = seed.client().await?;
        ensure_namespace(&admin, LEASE_NAMESPACE).await?;
        let shoot = sim_shoot(&seed, &shoots, name).await?;
        let dir = env.dir().join(format!("le-{name}"));
        std::fs::create_dir_all(&dir)?;
        Ok(World {
            _serial: serial,
            seed,
            shoots,
            admin,
            shoot,
            dir,
        })
    }
}

/// A shoot of 5 nodes on `shoots`, KCM 3, MCM 2, CA 2, kubelets renewing every 250 ms.
async fn sim_shoot(seed: &ApiServer, shoots: &ApiServer, name: &str) -> Result<SimShoot> {
    let mut options = SimShootOptions::new(format!("shoot--le--{name}"))
        .with_nodes(5)
        .with_renew_interval(Duration::from_millis(250));
    options.node_prefix = format!("{name}-");
    options.deployments = vec![(KCM.into(), 3), (MCM.into(), 2), (CA.into(), 2)];
    Ok(SimShoot::create(
        seed.client().await?,
        shoots.client().await?,
        shoots.kubeconfig(),
        options,
    )
    .await?)
}

/// The current holder of the prober's Lease (`None`: no Lease, or released).
async fn holder(client: &kube::Client) -> Result<Option<String>> {
    let api: Api<Lease> = Api::namespaced(client.clone(), LEASE_NAMESPACE);
    Ok(api
        .get_opt(PROBER_LEASE)
        .await?
        .and_then(|l| l.spec)
        .and_then(|s| s.holder_identity)
        .filter(|h| !h.is_empty()))
}

async fn lease_transitions(client: &kube::Client) -> Result<i32> {
    let api: Api<Lease> = Api::namespaced(client.clone(), LEASE_NAMESPACE);
    Ok(api
        .get(PROBER_LEASE)
        .await?
        .spec
        .and_then(|s| s.lease_transitions)
        .unwrap_or(0))
}

/// Waits until every process is ready and one of them holds the Lease; returns its index.
async fn wait_for_leader(client: &kube::Client, dogs: &[Candidate]) -> Result<usize> {
    let what = "all candidates ready and one of them leading";
    eventually(DEADLINE, what, || async {
        for dog in dogs {
            if !dog.ready().await {
                return Err(format!("{} not ready", dog.name));
            }
        }
        let Some(h) = holder(client).await.map_err(|e| e.to_string())? else {
            return Err("no holder".into());
        };
        let ids: Vec<Option<String>> = dogs.iter().map(Candidate::identity).collect();
        match ids.iter().position(|id| id.as_deref() == Some(h.as_str())) {
            Some(i) => Ok(Some(i)),
            None => Err(format!("holder {h} is none of {ids:?}")),
        }
    })
    .await
    .map_err(|e| anyhow!("{e}\n{}", logs(dogs)))
}

/// Waits until `holder` of the Lease is `dog`; returns when that was seen.
async fn wait_for_holder(client: &kube::Client, dog: &Candidate, timeout: Duration) -> Result<()> {
    let id = dog.identity().context("candidate announced no identity")?;
    eventually(
        timeout,
        &format!("{} to hold the lease", dog.name),
        || async {
            let h = holder(client).await.map_err(|e| e.to_string())?;
            if h.as_deref() == Some(id.as_str()) {
                Ok(Some(()))
            } else {
                Err(format!("holder {h:?}"))
            }
        },
    )
    .await
    .map_err(|e| anyhow!("{e}\n{}", dog.tail()))
}

async fn wait_probe_runs(dog: &Candidate, shoot: &str, at_least: u64) -> Result<()> {
    eventually(
        DEADLINE,
        &format!("{} to probe {shoot} {at_least} times", dog.name),
        || async {
            let runs = dog.probe_runs(shoot).await.map_err(|e| e.to_string())?;
            Ok((runs >= at_least).then_some(()))
        },
    )
    .await
    .map_err(|e| anyhow!("{e}\n{}", dog.tail()))
}

fn logs(dogs: &[Candidate]) -> String {
    dogs.iter()
        .map(|dog| dog.tail())
        .collect::<Vec<_>>()
        .join("\n")
}

/// The standard families of every controller-runtime controller, which operators' dashboards
/// and alerts read, as a leader and a follower export them after a few probe runs: client-go's
/// leader gauge and request counter (seed and shoot API servers by host:port),
/// client_golang's process metrics.
async fn assert_standard_metrics(
    leader: &Candidate,
    follower: &Candidate,
    seed: &ApiServer,
    shoots: &ApiServer,
) -> Result<()> {
    let text = leader.metrics().await?;
    let lease = [("name", PROBER_LEASE)];
    let status = "leader_election_master_status";
    ensure!(
        harness::binary::sample(&text, status, &lease) == Some(1.0),
        "leader: {status}{lease:?} 1\n{text}"
    );
    let idle = follower.metrics().await?;
    ensure!(
        harness::binary::sample(&idle, status, &lease) == Some(0.0),
        "follower: {status}{lease:?} 0\n{idle}"
    );
    // Cache lists and the probes' reads on the seed, /version and lease lists on the shoot,
    // lease renewals (PUT) on the seed.
    for (host, method) in [
        (seed.addr(), "GET"),
        (shoots.addr(), "GET"),
        (seed.addr(), "PUT"),
    ] {
        let host = host.to_string();
        let labels = [("code", "200"), ("method", method), ("host", host.as_str())];
        ensure!(
            harness::binary::sample(&text, "rest_client_requests_total", &labels)
                .is_some_and(|n| n >= 1.0),
            "leader: rest_client_requests_total{labels:?} counted\n{text}"
        );
    }
    for name in [
        "process_cpu_seconds_total",
        "process_resident_memory_bytes",
        "process_virtual_memory_bytes",
        "process_open_fds",
        "process_max_fds",
        "process_start_time_seconds",
    ] {
        ensure!(
            harness::binary::sample(&text, name, &[]).is_some_and(|v| v > 0.0),
            "leader: {name} > 0\n{text}"
        );
    }
    let rss =
        harness::binary::sample(&text, "process_resident_memory_bytes", &[]).unwrap_or_default();
    ensure!(
        rss > 1e6 && rss < 1e9,
        "resident memory {rss} bytes is implausible"
    );
    Ok(())
}

/// `(deployment, spec.replicas, replicas annotation)` each time one of them changed.
type ChangeLog = Arc<Mutex<Vec<(String, i32, Option<String>)>>>;

/// Records, in watch order, every change of a Deployment's replicas or replicas annotation.
fn record_changes(client: kube::Client, ns: &str) -> (ChangeLog, tokio::task::JoinHandle<()>) {
    let log: ChangeLog = Arc::default();
    let api: Api<Deployment> = Api::namespaced(client, ns);
    let sink = log.clone();
    let task = tokio::spawn(async move {
        let mut last = BTreeMap::<String, (i32, Option<String>)>::new();
        let mut stream = std::pin::pin!(watcher(api, watcher::Config::default()).applied_objects());
        while let Ok(Some(d)) = stream.try_next().await {
            let name = d.metadata.name.clone().unwrap_or_default();
            let replicas = d.spec.and_then(|s| s.replicas).unwrap_or(1);
            let annotation = d
                .metadata
                .annotations
                .and_then(|a| a.get(REPLICAS_ANNOTATION).cloned());
            let now = (replicas, annotation);
            if last.get(&name) != Some(&now) {
                last.insert(name.clone(), now.clone());
                sink.lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .push((name, now.0, now.1));
            }
        }
    });
    (log, task)
}

fn changes_of(log: &ChangeLog, name: &str) -> Vec<(i32, Option<String>)> {
    log.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .iter()
        .filter(|(n, ..)| n == name)
        .map(|(_, r, a)| (*r, a.clone()))
        .collect()
}

async fn wait_replicas(client: &kube::Client, ns: &str, want: &[(&str, i32)]) -> Result<()> {
    let api: Api<Deployment> = Api::namespaced(client.clone(), ns);
    eventually(DEADLINE, &format!("{ns}: replicas {want:?}"), || async {
        let mut seen = Vec::new();
        for (name, replicas) in want {
            let d = api.get(name).await.map_err(|e| e.to_string())?;
            let got = d.spec.and_then(|s| s.replicas).unwrap_or(1);
            seen.push((*name, got));
            if got != *replicas {
                return Err(format!("seen {seen:?}"));
            }
        }
        Ok(Some(()))
    })
    .await
    .map_err(|e| anyhow!(e))
}

/// Per target: the sequence of distinct replica counts and of replicas-annotation values it
/// went through must be exactly `replicas` and `annotation` (the first entry is the initial
/// state): each scaling step and each annotation write happened once.
/// `(deployment, replica counts, replicas-annotation values)` a target must go through.
type History<'a> = (&'a str, &'a [i32], &'a [Option<&'a str>]);

fn assert_history(log: &ChangeLog, want: &[History<'_>]) -> Result<()> {
    for (name, replicas, annotation) in want {
        let changes = changes_of(log, name);
        let mut got_replicas: Vec<i32> = changes.iter().map(|(r, _)| *r).collect();
        got_replicas.dedup();
        let mut got_annotation: Vec<Option<String>> =
            changes.iter().map(|(_, a)| a.clone()).collect();
        got_annotation.dedup();
        let want_annotation: Vec<Option<String>> =
            annotation.iter().map(|a| a.map(str::to_string)).collect();
        ensure!(
            got_replicas == *replicas && got_annotation == want_annotation,
            "{name}: replicas went {got_replicas:?} (want {replicas:?}), annotation {got_annotation:?} \
             (want {want_annotation:?}); all changes: {changes:?}"
        );
    }
    Ok(())
}

/// When the holder of the prober's Lease says it acquired it.
async fn acquire_time(admin: &kube::Client) -> Result<Timestamp> {
    Ok(Api::<Lease>::namespaced(admin.clone(), LEASE_NAMESPACE)
        .get(PROBER_LEASE)
        .await?
        .spec
        .and_then(|s| s.acquire_time)
        .context("new holder wrote no acquireTime")?
        .0)
}

/// Writes the prober's Lease over to `intruder_0`, renewed now, as a replica that missed the
/// leader's renewals would; returns when the write went through.
async fn steal_lease(admin: &kube::Client) -> Result<Instant> {
    let api: Api<Lease> = Api::namespaced(admin.clone(), LEASE_NAMESPACE);
    // The leader renews every 300 ms: retry while our write races with a renewal (409).
    eventually(DEADLINE, "taking the Lease over", || async {
        let mut stolen = api.get(PROBER_LEASE).await.map_err(|e| e.to_string())?;
        if let Some(spec) = stolen.spec.as_mut() {
            spec.holder_identity = Some("intruder_0".into());
            spec.renew_time = Some(MicroTime(Timestamp::now()));
        }
        match api
            .replace(PROBER_LEASE, &PostParams::default(), &stolen)
            .await
        {
            Ok(_) => Ok(Some(Instant::now())),
            Err(kube::Error::Api(s)) if s.code == 409 => Err("conflict with a renewal".into()),
            Err(e) => Err(e.to_string()),
        }
    })
    .await
    .map_err(|e| anyhow!(e))
}

/// `leader` sees a Lease written over by someone else at its next renewal, stops acting at
/// once and exits non-zero (to restart fresh), within its retry period and a margin.
async fn exits_once_its_lease_is_taken(
    admin: &kube::Client,
    leader: &Candidate,
    timing: Timing,
) -> Result<()> {
    let stolen_at = steal_lease(admin).await?;
    let status = leader
        .wait_exit(timing.renew + Duration::from_secs(1))
        .await?;
    let gone = stolen_at.elapsed();
    println!("leader exited ({status}) {gone:?} after its Lease was taken");
    ensure!(!status.success(), "losing leadership must exit non-zero");
    ensure!(
        gone <= timing.retry + Duration::from_millis(700),
        "the leader noticed the lost Lease only after {gone:?}"
    );
    ensure!(
        leader.tail().contains("leadership lost"),
        "{}",
        leader.tail()
    );
    Ok(())
}

#[tokio::test]
async fn only_the_leader_acts_and_a_killed_leader_is_replaced_without_double_scaling() -> Result<()>
{
    let World {
        _serial,
        seed,
        shoots: _shoots,
        admin,
        shoot,
        dir,
    } = World::new("kill").await?;
    let ns = shoot.namespace().to_string();
    let (log, watch) = record_changes(admin.clone(), &ns);

    let timing = Timing {
        lease: Duration::from_secs(2),
        renew: Duration::from_millis(1500),
        retry: Duration::from_millis(300),
    };
    let dogs = vec![
        Candidate::spawn("kill-a", &dir, &seed, Some(timing))?,
        Candidate::spawn("kill-b", &dir, &seed, Some(timing))?,
    ];
    let leader = wait_for_leader(&admin, &dogs).await?;
    let follower = 1 - leader;
    wait_probe_runs(&dogs[leader], &ns, 2).await?;
    dogs[follower].assert_idle(&ns).await?;

    // An outage: 4 of 5 kubelets stop renewing; the leader scales everything down, once.
    shoot.kubelets().silence_count(4);
    wait_replicas(&admin, &ns, &[(KCM, 0), (MCM, 0), (CA, 0)]).await?;
    dogs[follower].assert_idle(&ns).await?;

    // Kill the leader: the follower must take over within lease duration + retry period.
    let killed = Timestamp::now();
    dogs[leader].signal(Signal::KILL)?;
    wait_for_holder(&admin, &dogs[follower], DEADLINE).await?;
    // The new holder's acquireTime is when it decided to take over (same host, same clock):
    // unlike this test's polling, it measures the election alone.
    let acquired = acquire_time(&admin).await?;
    let takeover = Duration::try_from(acquired.duration_since(killed))
        .map_err(|e| anyhow!("acquireTime {acquired} before the kill at {killed}: {e}"))?;
    println!(
        "takeover after SIGKILL: {takeover:?} (lease {:?} + retry {:?})",
        timing.lease, timing.retry
    );
    // Plus 250 ms for the follower's own read of the Lease on a loaded machine.
    let bound = timing.lease + timing.retry + Duration::from_millis(250);
    ensure!(
        takeover <= bound,
        "takeover took {takeover:?} > {bound:?}\n{}",
        logs(&dogs)
    );

    // The new leader probes the shoot, still in its outage, and must not scale it again.
    let new_leader = &dogs[follower];
    wait_probe_runs(new_leader, &ns, 5).await?;
    let three = Some("3");
    let two = Some("2");
    assert_history(
        &log,
        &[
            (KCM, &[3, 0], &[None, three]),
            (MCM, &[2, 0], &[None, two]),
            (CA, &[2, 0], &[None, two]),
        ],
    )?;

    // Recovery, by the new leader: each target restored once.
    shoot.kubelets().resume_all();
    wait_replicas(&admin, &ns, &[(KCM, 3), (MCM, 2), (CA, 2)]).await?;
    wait_probe_runs(new_leader, &ns, new_leader.probe_runs(&ns).await? + 3).await?;
    assert_history(
        &log,
        &[
            (KCM, &[3, 0, 3], &[None, three, None]),
            (MCM, &[2, 0, 2], &[None, two, None]),
            (CA, &[2, 0, 2], &[None, two, None]),
        ],
    )
    .map_err(|e| anyhow!("{e}\n{}", logs(&dogs)))?;
    watch.abort();

    // Someone else writes the Lease (as a replica that missed our renewals would): the leader
    // sees it at its next renewal, stops acting at once and exits non-zero to restart fresh.
    exits_once_its_lease_is_taken(&admin, &dogs[follower], timing).await
}

/// A watchdog without leader election, probing shoot `ns`: it exports no leader-election
/// series, and SIGTERM makes it exit 0 within 2 s.
async fn sigterm_without_leader_election_exits_zero_promptly(
    dir: &Path,
    seed: &ApiServer,
    ns: &str,
) -> Result<()> {
    let alone = Candidate::spawn("term-alone", dir, seed, None)?;
    wait_probe_runs(&alone, ns, 2).await?;
    let text = alone.metrics().await?;
    ensure!(
        !text.contains("leader_election_master_status{"),
        "no leader-election series without leader election (client-go has none):\n{text}"
    );
    let stopped = Instant::now();
    alone.signal(Signal::TERM)?;
    let status = alone.wait_exit(Duration::from_secs(5)).await?;
    let exited = stopped.elapsed();
    println!("watchdog without leader election exited ({status}) after SIGTERM in {exited:?}");
    ensure!(status.success(), "exit: {status}\n{}", alone.tail());
    ensure!(
        exited < Duration::from_secs(2),
        "graceful exit took {exited:?}"
    );
    Ok(())
}

#[tokio::test]
async fn sigterm_exits_zero_promptly_and_hands_the_lease_over_at_once() -> Result<()> {
    let World {
        _serial,
        seed,
        shoots,
        admin,
        shoot,
        dir,
    } = World::new("term").await?;
    let ns = shoot.namespace().to_string();

    // A long lease, so a takeover by expiry and one by release can't be confused.
    let timing = Timing {
        lease: Duration::from_secs(6),
        renew: Duration::from_secs(4),
        retry: Duration::from_millis(300),
    };
    let dogs = vec![
        Candidate::spawn("term-a", &dir, &seed, Some(timing))?,
        Candidate::spawn("term-b", &dir, &seed, Some(timing))?,
        Candidate::spawn("term-c", &dir, &seed, Some(timing))?,
    ];
    let leader = wait_for_leader(&admin, &dogs).await?;
    wait_probe_runs(&dogs[leader], &ns, 2).await?;
    assert_standard_metrics(&dogs[leader], &dogs[(leader + 1) % 3], &seed, &shoots).await?;
    let transitions = lease_transitions(&admin).await?;

    // A follower shuts down at once and leaves the Lease alone.
    let follower = (leader + 1) % 3;
    let stopped = Instant::now();
    dogs[follower].signal(Signal::TERM)?;
    let status = dogs[follower].wait_exit(Duration::from_secs(5)).await?;
    ensure!(
        status.success(),
        "follower exit: {status}\n{}",
        dogs[follower].tail()
    );
    println!("follower exited 0 after SIGTERM in {:?}", stopped.elapsed());
    ensure!(holder(&admin).await? == dogs[leader].identity());

    // The leader stops its probes, releases the Lease and exits 0; the remaining candidate
    // takes over at its next retry instead of after the lease duration.
    let successor = (leader + 2) % 3;
    let stopped = Instant::now();
    dogs[leader].signal(Signal::TERM)?;
    let status = dogs[leader].wait_exit(Duration::from_secs(5)).await?;
    let exited = stopped.elapsed();
    ensure!(
        status.success(),
        "leader exit: {status}\n{}",
        dogs[leader].tail()
    );
    wait_for_holder(&admin, &dogs[successor], DEADLINE).await?;
    let takeover = stopped.elapsed();
    println!("leader exited 0 after SIGTERM in {exited:?}; successor leading after {takeover:?}");
    ensure!(
        exited < Duration::from_secs(2),
        "graceful exit took {exited:?}"
    );
    ensure!(
        takeover < timing.lease / 3,
        "takeover after a graceful shutdown took {takeover:?}: the lease was not released\n{}",
        logs(&dogs)
    );
    ensure!(
        lease_transitions(&admin).await? == transitions + 1,
        "one handover"
    );
    wait_probe_runs(&dogs[successor], &ns, 2).await?;

    // The last leader releases too: nobody holds the Lease afterwards.
    dogs[successor].signal(Signal::TERM)?;
    let status = dogs[successor].wait_exit(Duration::from_secs(5)).await?;
    ensure!(status.success(), "successor exit: {status}");
    ensure!(
        holder(&admin).await?.is_none(),
        "the Lease is released on shutdown"
    );

    // Without leader election too: SIGTERM while probing → exit 0, promptly.
    sigterm_without_leader_election_exits_zero_promptly(&dir, &seed, &ns).await
}

/// Two candidates of the library's elector on the real apiserver, the follower's wall clock
/// 30 s ahead of the leader's, then 30 s behind: a Lease being renewed is never taken (never
/// two leaders), and once its leader stops (without releasing it) the skewed follower takes it
/// after the lease duration, not 30 s early or late. Expiry is judged on the follower's own
/// monotonic clock; the wall clock only stamps what it writes.
#[tokio::test]
async fn a_follower_whose_wall_clock_is_skewed_30_s_never_takes_a_renewed_lease() -> Result<()> {
    use dependency_watchdog::process::leader::{LeaderElector, Timings, WallClock};
    use k8s_openapi::jiff::SignedDuration;

    let _serial = serial().await;
    let env = env().await?;
    let seed = env
        .start_apiserver_with("le-seed-skew", ApiServerOptions::seed())
        .await?;
    let admin = seed.client().await?;
    ensure_namespace(&admin, LEASE_NAMESPACE).await?;
    let timings = Timings {
        lease_duration: Duration::from_secs(2),
        renew_deadline: Duration::from_millis(1500),
        retry_period: Duration::from_millis(300),
    };
    for (skew, lease) in [(30_i64, "skew-ahead"), (-30, "skew-behind")] {
        let mut leader = LeaderElector::new(
            admin.clone(),
            LEASE_NAMESPACE,
            lease,
            "leader".into(),
            timings,
        );
        let started = tokio::time::timeout(DEADLINE, leader.acquire(|| {}))
            .await
            .context("the first candidate never led")?;
        let wall: WallClock = Arc::new(move || {
            Timestamp::now()
                .checked_add(SignedDuration::from_secs(skew))
                .unwrap_or_else(|_| Timestamp::now())
        });
        let follower = tokio::spawn({
            let client = admin.clone();
            async move {
                let mut skewed =
                    LeaderElector::new(client, LEASE_NAMESPACE, lease, "skewed".into(), timings)
                        .with_wall_clock(wall);
                skewed.acquire(|| {}).await;
                Instant::now()
            }
        });
        // Three lease durations of renewals, each one observed by the skewed follower.
        let kept = tokio::time::timeout(Duration::from_secs(6), leader.keep_leading(started)).await;
        ensure!(
            kept.is_err(),
            "skew {skew} s: the leader lost the lease it renewed (two leaders): {kept:?}"
        );
        ensure!(!follower.is_finished(), "skew {skew} s: two leaders");
        let stopped = Instant::now();
        drop(leader);
        let taken = tokio::time::timeout(Duration::from_secs(10), follower)
            .await
            .with_context(|| {
                format!("skew {skew} s: the abandoned lease was not taken in 10 s")
            })??;
        let after = taken - stopped;
        ensure!(
            after <= Duration::from_secs(4),
            "skew {skew} s: the abandoned lease taken {after:?} after its leader stopped (lease 2 s)"
        );
        let client = admin.clone();
        let api: Api<Lease> = Api::namespaced(client, LEASE_NAMESPACE);
        let held = api.get(lease).await?;
        ensure!(
            held.spec.and_then(|s| s.holder_identity).as_deref() == Some("skewed"),
            "skew {skew} s: the Lease is not held by the skewed follower"
        );
    }
    Ok(())
}
