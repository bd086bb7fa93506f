//! The process's runtime: what `run` does for each subcommand - the signal handler and the
//! shutdown token, the metrics and health endpoints, leader election around the work. (The
//! supervision of the work's critical tasks is [`crate::supervision`], a leaf the prober
//! and the weeder use without depending on what runs them.)

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus_client::registry::Registry;
use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::server;
use crate::client::kube_client;
use crate::decisions::DecisionLog;
use crate::metrics::Metrics;
use crate::observe::events;
use crate::observe::health::{self, Health};
use crate::process::cli::{self, Cli, Command, CommonArgs};
use crate::process::config::{load_prober_config, load_weeder_config};
use crate::process::leader::{self, Lost};
use crate::shadow::Shadow;
use crate::{Error, Result, explain, memory_budget, prober, weeder};

/// The open-files limit to set for the limit `current` (soft, hard; `None` is unlimited):
/// the soft limit raised to the hard one, or `None` when there is nothing to raise.
pub(crate) fn raised_open_files_limit(current: Rlimit) -> Option<Rlimit> {
    let raise = match (current.current, current.maximum) {
        (_, None) => false,
        (None, Some(_)) => false,
        (Some(soft), Some(hard)) => soft < hard,
    };
    raise.then_some(Rlimit {
        current: current.maximum,
        maximum: current.maximum,
    })
}

/// A limit as a person reads it (`None` is unlimited).
fn limit_text(limit: Option<u64>) -> String {
    limit.map_or_else(|| "unlimited".to_owned(), |l| l.to_string())
}

/// Raises `RLIMIT_NOFILE`'s soft limit to the hard limit, as Go's runtime does at start: each
/// probe run and each watch holds a socket, and a seed with thousands of shoots passes a soft
/// limit of 1024 (the common default) long before the hard one. Logged at debug; a failure
/// only leaves the soft limit where it was. An unlimited hard limit is left alone (Linux
/// refuses an unlimited `RLIMIT_NOFILE`; it caps at `fs.nr_open`).
pub fn raise_open_files_limit() {
    let before = getrlimit(Resource::Nofile);
    let Some(raised) = raised_open_files_limit(before) else {
        debug!(soft = %limit_text(before.current), hard = %limit_text(before.maximum), "open-files limit already at its hard limit");
        return;
    };
    match setrlimit(Resource::Nofile, raised) {
        Ok(()) => {
            debug!(from = %limit_text(before.current), to = %limit_text(raised.current), "raised the open-files limit (RLIMIT_NOFILE) to its hard limit")
        }
        Err(error) => {
            debug!(soft = %limit_text(before.current), hard = %limit_text(before.maximum), %error, "cannot raise the open-files limit (RLIMIT_NOFILE)")
        }
    }
}

/// Cancels `token` on the first SIGTERM or SIGINT; a second one exits at once (code 130).
///
/// The handlers are installed before this returns, so a signal that arrives right after
/// start-up is handled (not the default action, which would kill the process) — the spawned
/// task only reacts to them.
pub(crate) fn spawn_signal_handler(token: CancellationToken) {
    use tokio::signal::unix::{SignalKind, signal};
    let (mut term, mut int) = match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) {
        (Ok(term), Ok(int)) => (term, int),
        (Err(e), _) | (_, Err(e)) => {
            warn!(error = %e, "cannot listen for SIGTERM/SIGINT: signals end the process at once");
            return;
        }
    };
    tokio::spawn(async move {
        for n in 0.. {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
            if n == 0 {
                info!("shutting down (a second signal exits at once)");
                token.cancel();
            } else {
                warn!("second signal: exiting at once");
                std::process::exit(130);
            }
        }
    });
}

/// Everything both subcommands start with: metrics registry, health, endpoints.
#[derive(Clone)]
struct Runtime {
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    shutdown: CancellationToken,
}

async fn start_endpoints(
    args: &CommonArgs,
    shutdown: CancellationToken,
    shadow: Option<Arc<Shadow>>,
    decisions: Option<Arc<DecisionLog>>,
) -> Result<Runtime> {
    let metrics = Arc::new(Metrics::default());
    let mut registry = Registry::default();
    metrics.register(&mut registry);
    if let Some(shadow) = &shadow {
        shadow.metrics.register(&mut registry);
    }
    let health = Arc::new(Health::default());
    let (maddr, _) = server::serve(
        "metrics",
        &args.metrics_bind_addr,
        server::Endpoints::Metrics(Arc::new(Mutex::new(registry)), shadow, decisions),
        shutdown.clone(),
    )
    .await?;
    let (haddr, _) = server::serve(
        "health",
        &args.health_bind_addr,
        server::Endpoints::Health(health.clone()),
        shutdown.clone(),
    )
    .await?;
    info!(metrics = %maddr, health = %haddr, "endpoints listening");
    Ok(Runtime {
        metrics,
        health,
        shutdown,
    })
}

/// The leader-election timings of the flags, checked.
fn leader_timings(args: &CommonArgs) -> Result<leader::Timings> {
    let timings = leader::Timings {
        lease_duration: args.leader_elect_lease_duration,
        renew_deadline: args.leader_elect_renew_deadline,
        retry_period: args.leader_elect_retry_period,
    };
    timings.validate().map_err(Error::LeaderElection)?;
    Ok(timings)
}

/// How long a leader shutting down may spend giving its Lease up.
const RELEASE_TIMEOUT: Duration = Duration::from_secs(5);

/// How long the work may take to unwind after leadership was lost, before we exit anyway.
const LOST_UNWIND_TIMEOUT: Duration = Duration::from_secs(2);

/// The work's result, except that a task ending once shutdown was requested is no failure:
/// tasks end *because* of the shutdown, and the work may notice that before it notices the
/// cancelled token. A graceful shutdown exits 0.
fn after_shutdown(result: Result<()>, shutdown: &CancellationToken) -> Result<()> {
    match result {
        Err(Error::TaskDied(task, _)) if shutdown.is_cancelled() => {
            info!(task, "task ended during shutdown");
            Ok(())
        }
        other => other,
    }
}

/// Runs `work` until shutdown — at once without an `elector` (no `--enable-leader-election`),
/// else only while `elector` leads its Lease.
///
/// `work` gets a token cancelled on shutdown and when leadership is lost. Followers are ready
/// (`/readyz`) once they take part in the election, and idle. A leader that loses the Lease
/// cancels the work at once and this returns an error, so the process exits non-zero and is
/// restarted as a fresh candidate (controller-runtime's behaviour: a replica that may have
/// missed events never resumes acting on stale state). On graceful shutdown the leader lets
/// the work wind down, still renewing, then releases the Lease so a follower takes over at
/// its next retry instead of after the lease duration.
async fn run_elected<F, Fut>(
    elector: Option<leader::LeaderElector>,
    rt: &Runtime,
    work: F,
) -> Result<()>
where
    F: FnOnce(CancellationToken) -> Fut,
    Fut: Future<Output = Result<()>>,
{
    let Some(mut elector) = elector else {
        rt.metrics.leader.set(1);
        return after_shutdown(work(rt.shutdown.clone()).await, &rt.shutdown);
    };
    let lease_name = elector.name().to_string();
    info!(lease = %elector.lease(), identity = %elector.identity(), "leader election: candidate");
    // client-go's gauge: 0 while a candidate follows, 1 while it leads.
    rt.metrics.set_leading(&lease_name, false);
    let health = rt.health.clone();
    let last_renewed = tokio::select! {
        _ = rt.shutdown.cancelled() => {
            info!("shut down while following: nothing to release");
            return Ok(());
        }
        started = elector.acquire(|| {
            health.set_role(health::Role::Follower);
            health.set_ready(true);
        }) => started,
    };
    rt.health.set_role(health::Role::Leader);
    // A follower is ready while idle; a leader only once its work's caches have synced
    // (the work sets ready again), so readiness keeps meaning "caches synced".
    rt.health.set_ready(false);
    rt.metrics.leader.set(1);
    rt.metrics.set_leading(&lease_name, true);

    let work_token = rt.shutdown.child_token();
    let work = work(work_token.clone());
    tokio::pin!(work);
    let lost = tokio::select! {
        result = &mut work => {
            // Shutdown (or a critical task died): hand the Lease over before exiting.
            rt.metrics.set_leading(&lease_name, false);
            match tokio::time::timeout(RELEASE_TIMEOUT, elector.release()).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => warn!(lease = %elector.lease(), error = %e, "cannot release the leader-election lease; a follower takes over when it expires"),
                Err(_) => warn!(lease = %elector.lease(), "releasing the leader-election lease timed out; a follower takes over when it expires"),
            }
            return after_shutdown(result, &rt.shutdown);
        }
        lost = elector.keep_leading(last_renewed) => lost,
    };
    // Another replica may act from now on: stop acting at once.
    work_token.cancel();
    rt.metrics.leader.set(0);
    rt.metrics.set_leading(&lease_name, false);
    tracing::error!(reason = %lost.0, "leadership lost: stopped all work; exiting");
    if tokio::time::timeout(LOST_UNWIND_TIMEOUT, &mut work)
        .await
        .is_err()
    {
        warn!(timeout = ?LOST_UNWIND_TIMEOUT, "work did not unwind in time after leadership was lost");
    }
    let Lost(reason) = lost;
    Err(Error::LeaderElection(format!("leadership lost: {reason}")))
}

/// The names one subcommand runs under.
struct Subcommand {
    /// Who posts the shadow's Events.
    component: events::Component,
    /// The Lease of the acting watchdog.
    lease: &'static str,
    /// The Lease in shadow mode.
    shadow_lease: &'static str,
    /// What shadow mode leaves undone, for its warning.
    shadow_leaves_undone: &'static str,
}

const PROBER: Subcommand = Subcommand {
    component: events::Component::Prober,
    lease: leader::PROBER_LEASE,
    shadow_lease: leader::PROBER_SHADOW_LEASE,
    shadow_leaves_undone: "deciding as usual, scaling nothing",
};

const WEEDER: Subcommand = Subcommand {
    component: events::Component::Weeder,
    lease: leader::WEEDER_LEASE,
    shadow_lease: leader::WEEDER_SHADOW_LEASE,
    shadow_leaves_undone: "deleting no pod",
};

/// What a subcommand's work needs, started the same way for both.
struct Started {
    rt: Runtime,
    /// The work's seed client.
    seed: kube::Client,
    /// This replica's candidacy, with `--enable-leader-election`.
    elector: Option<leader::LeaderElector>,
    shadow: Option<Arc<Shadow>>,
}

/// Checks the leader-election flags, connects to the seed, starts the endpoints and, with
/// `--enable-leader-election`, makes this replica a candidate for `sub`'s Lease (the shadow's
/// in shadow mode, whose window is `--shadow-window` or `default_window`).
async fn start(
    args: &CommonArgs,
    shutdown: CancellationToken,
    sub: &Subcommand,
    default_window: impl FnOnce() -> Duration,
    decisions: Option<Arc<DecisionLog>>,
) -> Result<Started> {
    // Before connecting: invalid flags fail at once.
    let timings = match args.enable_leader_election {
        true => Some(leader_timings(args)?),
        false => None,
    };
    let seed_config = kube_client::seed_config(args.kubeconfig.as_deref()).await?;
    let seed = kube_client::rate_limited_client(seed_config.clone(), args.qps(), args.burst())?;
    let shadow = args.shadow.then(|| {
        let window = args.shadow_window.unwrap_or_else(default_window);
        Shadow::new(sub.component, window)
    });
    let rt = start_endpoints(args, shutdown, shadow.clone(), decisions).await?;
    let lease = match &shadow {
        Some(shadow) => {
            warn!(window = ?shadow.window(), "shadow mode: {}; comparing with the acting watchdog (GET /shadow on the metrics address)", sub.shadow_leaves_undone);
            sub.shadow_lease
        }
        None => sub.lease,
    };
    let elector = match timings {
        Some(timings) => {
            // A client (and rate-limit budget) of its own: renewals never queue behind the
            // work's requests, as controller-runtime gives its resource lock a client of its own.
            let client = kube_client::rate_limited_client(seed_config, args.qps(), args.burst())?;
            Some(leader::LeaderElector::new(
                client,
                &args.leader_election_namespace,
                lease,
                leader::default_identity(),
                timings,
            ))
        }
        None => None,
    };
    Ok(Started {
        rt,
        seed,
        elector,
        shadow,
    })
}

/// Runs the subcommand until shutdown.
pub async fn run(cli: Cli) -> Result<()> {
    // First, so that a SIGTERM during start-up is a graceful shutdown too.
    let shutdown = CancellationToken::new();
    spawn_signal_handler(shutdown.clone());
    match cli.command {
        Command::Prober(args) => {
            let config = load_prober_config(&args.config_file)?;
            let interval = config.probe_interval;
            let decisions = Arc::new(DecisionLog::new(config.dependent_resource_infos.len()));
            let window = || (interval * 3).max(Duration::from_secs(120));
            let started = start(&args, shutdown, &PROBER, window, Some(decisions.clone())).await?;
            info!(targets = config.dependent_resource_infos.len(), interval = ?config.probe_interval, "prober starting");
            let run_memory =
                memory_budget::size(args.run_memory_budget, memory_budget::cgroup_limit());
            info!(bytes = run_memory.capacity, from = %run_memory.source, "probe runs' memory budget");
            let (metrics, health) = (started.rt.metrics.clone(), started.rt.health.clone());
            run_elected(started.elector, &started.rt, |token| {
                let start = prober::ProberStart {
                    config,
                    run_memory_capacity: run_memory.capacity,
                    seed: started.seed,
                    metrics,
                    health,
                    own_pod: events::PodRef::discover(&args.leader_election_namespace),
                    shadow: started.shadow,
                    decisions,
                };
                prober::run(start, token)
            })
            .await
        }
        Command::Weeder(args) => {
            let config = load_weeder_config(&args.config_file)?;
            let watch_duration = config.watch_duration;
            let window = || watch_duration.max(Duration::from_secs(60));
            let started = start(&args, shutdown, &WEEDER, window, None).await?;
            info!(services = config.services_and_dependant_selectors.len(), watch_duration = ?config.watch_duration, "weeder starting");
            let (metrics, health) = (started.rt.metrics.clone(), started.rt.health.clone());
            run_elected(started.elector, &started.rt, |token| {
                let own_pod = events::PodRef::discover(&args.leader_election_namespace);
                let weeders = weeder::Weeders::new(metrics, token.child_token());
                let start = weeder::WeederStart {
                    config,
                    seed: started.seed,
                    weeders,
                    health,
                    own_pod,
                    shadow: started.shadow,
                };
                weeder::run(start, token)
            })
            .await
        }
        Command::Explain(args) => explain_command(args).await,
    }
}

/// `explain`: a shoot now, or with `--record` a past decision from its record.
async fn explain_command(args: cli::ExplainArgs) -> Result<()> {
    if let Some(source) = &args.record {
        return explain_record(&args, source);
    }
    let (Some(config_file), Some(namespace)) = (&args.config_file, &args.namespace) else {
        return Err(Error::Scaling(
            "explain needs --config-file and --namespace (or --record FILE to explain a past decision)"
                .into(),
        ));
    };
    let config = load_prober_config(config_file)?;
    let seed = kube_client::seed_client(args.kubeconfig.as_deref(), 5.0, 10).await?;
    let explanation = explain::explain(&seed, &config, namespace).await?;
    print_as(args.output, &explanation)
}

/// `explain --record SOURCE`: reads the records, picks one, replays it (under
/// `--config-file` too, if given). No apiserver is contacted.
fn explain_record(args: &cli::ExplainArgs, source: &str) -> Result<()> {
    use explain::replay;
    let records = if source == "-" {
        replay::read_records(std::io::stdin().lock())?
    } else {
        let file = std::fs::File::open(source)
            .map_err(|e| Error::Scaling(format!("--record {source}: {e}")))?;
        replay::read_records(std::io::BufReader::new(file))?
    };
    let pick = replay::Pick {
        id: args.id.clone(),
        at: args.at,
        namespace: args.namespace.clone(),
    };
    let record = replay::pick(&records, &pick)?;
    let config = match &args.config_file {
        Some(path) => Some((load_prober_config(path)?, path.display().to_string())),
        None => None,
    };
    let replayed = replay::replayed(record, config.as_ref().map(|(c, p)| (c, p.as_str())))?;
    print_as(args.output, &replayed)
}

/// Prints `value` as text or JSON.
fn print_as(
    output: cli::OutputFormat,
    value: &(impl std::fmt::Display + serde::Serialize),
) -> Result<()> {
    match output {
        cli::OutputFormat::Text => print!("{value}"),
        cli::OutputFormat::Json => match serde_json::to_string_pretty(value) {
            Ok(text) => println!("{text}"),
            Err(e) => return Err(Error::Scaling(format!("encoding the explanation: {e}"))),
        },
    }
    Ok(())
}

/// [`run_elected`] against the fake seed apiserver ([`crate::fake_seed`]) on a paused clock,
/// with the flags' default timings (lease 15 s, renew deadline 10 s, retry period 2 s): the
/// instants at which the work starts, is cancelled and is given up are exact.
#[cfg(test)]
mod tests {
    use super::*;
    use crate::fake_seed::{FakeSeed, Outage, held_lease};
    use crate::metrics::LeaseLabels;
    use tokio::sync::oneshot;
    use tokio::task::JoinHandle;
    use tokio::time::Instant;

    const NS: &str = "garden";
    const ME: &str = "host-a_1";
    const OTHER: &str = "host-b_2";
    const SECOND: Duration = Duration::from_secs(1);

    fn runtime() -> Runtime {
        Runtime {
            metrics: Arc::new(Metrics::default()),
            health: Arc::new(Health::default()),
            shutdown: CancellationToken::new(),
        }
    }

    fn candidate(fake: &FakeSeed) -> leader::LeaderElector {
        let timings = leader::Timings {
            lease_duration: 15 * SECOND,
            renew_deadline: 10 * SECOND,
            retry_period: 2 * SECOND,
        };
        leader::LeaderElector::new(
            fake.client(),
            NS,
            leader::PROBER_LEASE,
            ME.to_string(),
            timings,
        )
    }

    /// `leader_election_master_status{name="dwd-prober-leader-election"}`.
    fn leading_gauge(rt: &Runtime) -> i64 {
        rt.metrics
            .leader_election_master_status
            .get_or_create(&LeaseLabels {
                name: leader::PROBER_LEASE.to_string(),
            })
            .get()
    }

    /// The stored Lease's holder.
    fn holder(fake: &FakeSeed) -> Option<String> {
        fake.lease(NS, leader::PROBER_LEASE)
            .and_then(|l| l.spec)
            .and_then(|s| s.holder_identity)
    }

    /// (method, status) of each write of the Lease.
    fn lease_writes(fake: &FakeSeed) -> Vec<(String, u16)> {
        fake.writes()
            .into_iter()
            .filter(|c| c.path.contains("/leases"))
            .map(|c| (c.method.to_string(), c.status))
            .collect()
    }

    /// What the work saw when it started.
    #[derive(Debug)]
    struct Seen {
        at: Instant,
        role: health::Role,
        ready: bool,
        leader: i64,
        leading: i64,
        token: CancellationToken,
    }

    /// How the work ends once its token is cancelled.
    #[derive(Clone, Copy)]
    enum Ending {
        /// It returns `Ok`.
        Ok,
        /// A critical task of it reports that it ended.
        TaskDied,
        /// It never ends: it ignores its token.
        Never,
    }

    /// Runs [`run_elected`] in a task with a work that reports what it saw when it started,
    /// marks the caches synced (ready) and waits for its token, then ends as `ending` says.
    fn spawn_run(
        rt: &Runtime,
        elector: Option<leader::LeaderElector>,
        ending: Ending,
    ) -> (JoinHandle<Result<()>>, oneshot::Receiver<Seen>) {
        let (seen_tx, seen_rx) = oneshot::channel();
        let run = {
            let rt = rt.clone();
            tokio::spawn(async move {
                let (health, metrics) = (rt.health.clone(), rt.metrics.clone());
                run_elected(elector, &rt, move |token| async move {
                    let _ = seen_tx.send(Seen {
                        at: Instant::now(),
                        role: health.role(),
                        ready: health.is_ready(),
                        leader: metrics.leader.get(),
                        leading: metrics
                            .leader_election_master_status
                            .get_or_create(&LeaseLabels {
                                name: leader::PROBER_LEASE.to_string(),
                            })
                            .get(),
                        token: token.clone(),
                    });
                    health.set_ready(true);
                    match ending {
                        Ending::Never => std::future::pending().await,
                        Ending::Ok => {
                            token.cancelled().await;
                            Ok(())
                        }
                        Ending::TaskDied => {
                            token.cancelled().await;
                            Err(Error::TaskDied("cache", "watch ended".into()))
                        }
                    }
                })
                .await
            })
        };
        (run, seen_rx)
    }

    /// `rt`'s replica leads, its work started at `start`.
    async fn leading(
        fake: &FakeSeed,
        rt: &Runtime,
        ending: Ending,
    ) -> (JoinHandle<Result<()>>, Seen) {
        let start = Instant::now();
        let (run, seen) = spawn_run(rt, Some(candidate(fake)), ending);
        let seen = seen.await.expect("the work started");
        assert_eq!(seen.at, start, "a free Lease is taken at the first attempt");
        assert_eq!(holder(fake).as_deref(), Some(ME));
        (run, seen)
    }

    #[test]
    fn the_open_files_soft_limit_is_raised_to_a_finite_hard_limit() {
        let lim = |soft, hard| Rlimit {
            current: soft,
            maximum: hard,
        };
        assert_eq!(
            raised_open_files_limit(lim(Some(1024), Some(524_288))),
            Some(lim(Some(524_288), Some(524_288)))
        );
        assert_eq!(raised_open_files_limit(lim(Some(4096), Some(4096))), None);
        // Unlimited hard limits are left alone (Linux refuses RLIM_INFINITY for NOFILE).
        assert_eq!(raised_open_files_limit(lim(Some(1024), None)), None);
        assert_eq!(raised_open_files_limit(lim(None, None)), None);
    }

    #[tokio::test(start_paused = true)]
    async fn without_election_the_work_runs_at_once_as_the_only_replica() {
        let rt = runtime();
        let start = Instant::now();
        let (run, seen) = spawn_run(&rt, None, Ending::Ok);
        let seen = seen.await.expect("the work started");
        assert_eq!(seen.at, start);
        assert_eq!(seen.leader, 1);
        assert_eq!(seen.role, health::Role::Alone);
        assert!(!seen.token.is_cancelled());
        rt.shutdown.cancel();
        assert!(
            seen.token.is_cancelled(),
            "the work's token is the shutdown"
        );
        assert!(matches!(run.await.expect("run"), Ok(())));
    }

    #[tokio::test(start_paused = true)]
    async fn a_follower_is_ready_and_idle_and_shuts_down_without_touching_the_lease() {
        let fake = FakeSeed::default();
        let theirs = fake.put_lease(&held_lease(NS, leader::PROBER_LEASE, OTHER));
        let rt = runtime();
        let (run, mut seen) = spawn_run(&rt, Some(candidate(&fake)), Ending::Ok);
        // Five attempts (at 0, 2, 4, 6 and 8 s), all finding the other holder's valid Lease.
        tokio::time::sleep(9 * SECOND).await;
        assert_eq!(fake.calls_to("/leases").len(), 5);
        assert!(rt.health.is_ready(), "a follower is ready");
        assert_eq!(rt.health.role(), health::Role::Follower);
        assert!(seen.try_recv().is_err(), "a follower does no work");
        assert_eq!(rt.metrics.leader.get(), 0);
        assert_eq!(leading_gauge(&rt), 0);

        rt.shutdown.cancel();
        assert!(matches!(run.await.expect("run"), Ok(())));
        assert_eq!(lease_writes(&fake), [], "nothing to release");
        let stored = fake.lease(NS, leader::PROBER_LEASE).expect("lease");
        assert_eq!(stored.metadata.resource_version, Some(theirs));
        assert_eq!(holder(&fake).as_deref(), Some(OTHER));
    }

    #[tokio::test(start_paused = true)]
    async fn a_leader_runs_the_work_not_ready_until_the_work_says_so() {
        let fake = FakeSeed::default();
        let rt = runtime();
        let (_run, seen) = leading(&fake, &rt, Ending::Ok).await;
        assert_eq!(seen.role, health::Role::Leader);
        assert!(!seen.ready, "not ready until the work's caches synced");
        assert_eq!((seen.leader, seen.leading), (1, 1));
        assert!(rt.health.is_ready(), "the work said so");
        // Still leading, renewing, 7 s later.
        tokio::time::sleep(7 * SECOND).await;
        assert!(!seen.token.is_cancelled());
        assert_eq!(
            lease_writes(&fake),
            [("POST", 201), ("PUT", 200), ("PUT", 200), ("PUT", 200)]
                .map(|(m, s)| (m.to_string(), s))
        );
    }

    #[tokio::test(start_paused = true)]
    async fn graceful_shutdown_while_leading_releases_the_lease() {
        let fake = FakeSeed::default();
        let rt = runtime();
        let (run, seen) = leading(&fake, &rt, Ending::Ok).await;
        tokio::time::sleep(SECOND).await;
        rt.shutdown.cancel();
        assert!(matches!(run.await.expect("run"), Ok(())));
        assert!(seen.token.is_cancelled());
        assert_eq!(holder(&fake), None, "released");
        assert_eq!(
            lease_writes(&fake),
            [("POST", 201), ("PUT", 200)].map(|(m, s)| (m.to_string(), s))
        );
        assert_eq!(leading_gauge(&rt), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn losing_the_lease_cancels_the_work_at_once_and_fails() {
        /// One way to lose the Lease.
        struct Case {
            name: &'static str,
            lose: fn(&FakeSeed),
            /// When the work's token is cancelled, after it started.
            lost_after: Duration,
            /// What the error says.
            reason: &'static str,
            /// (method, status) of the Lease's writes: no release among them.
            writes: &'static [(&'static str, u16)],
            holder_after: &'static str,
        }
        let cases = [
            Case {
                name: "another holder",
                lose: |fake| {
                    fake.put_lease(&held_lease(NS, leader::PROBER_LEASE, OTHER));
                },
                lost_after: 2 * SECOND,
                reason: "is now held by host-b_2",
                writes: &[("POST", 201), ("PUT", 409)],
                holder_after: OTHER,
            },
            Case {
                name: "renewals failing",
                lose: |fake| fake.outage(Outage::Fail(500), 60 * SECOND),
                lost_after: 10 * SECOND,
                reason: "not renewed within the renew deadline 10s",
                writes: &[
                    ("POST", 201),
                    ("PUT", 500),
                    ("PUT", 500),
                    ("PUT", 500),
                    ("PUT", 500),
                ],
                holder_after: ME,
            },
        ];
        for Case {
            name: case,
            lose,
            lost_after,
            reason,
            writes,
            holder_after,
        } in cases
        {
            let fake = FakeSeed::default();
            let rt = runtime();
            let (run, seen) = leading(&fake, &rt, Ending::Ok).await;
            lose(&fake);
            seen.token.cancelled().await;
            assert_eq!(Instant::now() - seen.at, lost_after, "{case}");
            let result = run.await.expect("run");
            assert_eq!(Instant::now() - seen.at, lost_after, "{case}: no wait");
            match result {
                Err(Error::LeaderElection(e)) => {
                    assert!(e.starts_with("leadership lost: "), "{case}: {e}");
                    assert!(e.contains(reason), "{case}: {e}");
                }
                other => panic!("{case}: {other:?}"),
            }
            assert!(!rt.shutdown.is_cancelled(), "{case}: only the work stops");
            assert_eq!((rt.metrics.leader.get(), leading_gauge(&rt)), (0, 0));
            // No release: the Lease is not ours to give up (or unreachable).
            let expected: Vec<(String, u16)> =
                writes.iter().map(|(m, s)| (m.to_string(), *s)).collect();
            assert_eq!(lease_writes(&fake), expected, "{case}");
            assert_eq!(holder(&fake).as_deref(), Some(holder_after), "{case}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_work_ignoring_cancellation_is_abandoned_after_the_unwind_timeout() {
        let fake = FakeSeed::default();
        let rt = runtime();
        let (run, seen) = leading(&fake, &rt, Ending::Never).await;
        fake.put_lease(&held_lease(NS, leader::PROBER_LEASE, OTHER));
        seen.token.cancelled().await;
        let lost = Instant::now();
        assert_eq!(lost - seen.at, 2 * SECOND);
        assert!(matches!(
            run.await.expect("run"),
            Err(Error::LeaderElection(_))
        ));
        assert_eq!(Instant::now() - lost, LOST_UNWIND_TIMEOUT);
    }

    #[tokio::test(start_paused = true)]
    async fn a_task_ending_after_shutdown_is_a_graceful_exit() {
        for elected in [false, true] {
            let fake = FakeSeed::default();
            let rt = runtime();
            let (run, seen) = match elected {
                true => leading(&fake, &rt, Ending::TaskDied).await,
                false => {
                    let (run, seen) = spawn_run(&rt, None, Ending::TaskDied);
                    (run, seen.await.expect("the work started"))
                }
            };
            rt.shutdown.cancel();
            assert!(
                matches!(run.await.expect("run"), Ok(())),
                "elected: {elected}"
            );
            assert!(seen.token.is_cancelled());
            if elected {
                assert_eq!(holder(&fake), None, "released");
            }
        }
        // Before shutdown the same end is a failure.
        let shutdown = CancellationToken::new();
        let died = || Err(Error::TaskDied("cache", "watch ended".into()));
        assert!(matches!(
            after_shutdown(died(), &shutdown),
            Err(Error::TaskDied("cache", _))
        ));
        shutdown.cancel();
        assert!(matches!(after_shutdown(died(), &shutdown), Ok(())));
        let other = Err(Error::LeaderElection("lost".into()));
        assert!(matches!(
            after_shutdown(other, &shutdown),
            Err(Error::LeaderElection(_))
        ));
    }
}
