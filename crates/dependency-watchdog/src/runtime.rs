//! The process's runtime: what `run` does for each subcommand - the signal handler and the
//! shutdown token, the metrics and health endpoints, leader election around the work. (The
//! supervision of the work's critical tasks is [`crate::supervision`], a leaf the prober
//! and the weeder use without depending on what runs them.)

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::cli::{self, Cli, Command, CommonArgs};
use crate::config::{load_prober_config, load_weeder_config};
use crate::health::{self, Health};
use crate::leader::{self, Lost};
use crate::metrics::Metrics;
use crate::shadow::Shadow;
use crate::{Error, Result, events, explain, kube_client, prober, server, weeder};

/// Cancels `token` on the first SIGTERM or SIGINT; a second one exits at once (code 130).
///
/// The handlers are installed before this returns, so a signal that arrives right after
/// start-up is handled (not the default action, which would kill the process) — the spawned
/// task only reacts to them.
pub fn spawn_signal_handler(token: CancellationToken) {
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
struct Runtime {
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    shutdown: CancellationToken,
}

async fn start_endpoints(
    args: &CommonArgs,
    shutdown: CancellationToken,
    shadow: Option<Arc<Shadow>>,
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
        server::Endpoints::Metrics(Arc::new(Mutex::new(registry)), shadow),
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

/// Runs `work` until shutdown — at once without `--enable-leader-election`, else only while
/// this replica leads Lease `lease_name`.
///
/// `work` gets a token cancelled on shutdown and when leadership is lost. Followers are ready
/// (`/readyz`) once they take part in the election, and idle. A leader that loses the Lease
/// cancels the work at once and this returns an error, so the process exits non-zero and is
/// restarted as a fresh candidate (controller-runtime's behaviour: a replica that may have
/// missed events never resumes acting on stale state). On graceful shutdown the leader lets
/// the work wind down, still renewing, then releases the Lease so a follower takes over at
/// its next retry instead of after the lease duration.
async fn run_elected<F, Fut>(
    args: &CommonArgs,
    seed_config: &kube::Config,
    lease_name: &str,
    rt: &Runtime,
    work: F,
) -> Result<()>
where
    F: FnOnce(CancellationToken) -> Fut,
    Fut: Future<Output = Result<()>>,
{
    if !args.enable_leader_election {
        rt.metrics.leader.set(1);
        return after_shutdown(work(rt.shutdown.clone()).await, &rt.shutdown);
    }
    let timings = leader_timings(args)?;
    // A client (and rate-limit budget) of its own: renewals never queue behind the work's
    // requests, as controller-runtime gives its resource lock a client of its own.
    let client = kube_client::rate_limited_client(seed_config.clone(), args.qps(), args.burst())?;
    let mut elector = leader::LeaderElector::new(
        client,
        &args.leader_election_namespace,
        lease_name,
        leader::default_identity(),
        timings,
    );
    info!(lease = %elector.lease(), identity = %elector.identity(), "leader election: candidate");
    // client-go's gauge: 0 while a candidate follows, 1 while it leads.
    rt.metrics.set_leading(lease_name, false);
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
    rt.metrics.set_leading(lease_name, true);

    let work_token = rt.shutdown.child_token();
    let work = work(work_token.clone());
    tokio::pin!(work);
    let lost = tokio::select! {
        result = &mut work => {
            // Shutdown (or a critical task died): hand the Lease over before exiting.
            rt.metrics.set_leading(lease_name, false);
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
    rt.metrics.set_leading(lease_name, false);
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

/// Runs the subcommand until shutdown.
pub async fn run(cli: Cli) -> Result<()> {
    // First, so that a SIGTERM during start-up is a graceful shutdown too.
    let shutdown = CancellationToken::new();
    spawn_signal_handler(shutdown.clone());
    match cli.command {
        Command::Prober(args) => {
            let config = load_prober_config(&args.config_file)?;
            if args.enable_leader_election {
                leader_timings(&args)?;
            }
            let seed_config = kube_client::seed_config(args.kubeconfig.as_deref()).await?;
            let seed =
                kube_client::rate_limited_client(seed_config.clone(), args.qps(), args.burst())?;
            let shadow = args.shadow.then(|| {
                let window = args
                    .shadow_window
                    .unwrap_or_else(|| (config.probe_interval * 3).max(Duration::from_secs(120)));
                Shadow::new(events::Component::Prober, window)
            });
            let rt = start_endpoints(&args, shutdown, shadow.clone()).await?;
            info!(targets = config.dependent_resource_infos.len(), interval = ?config.probe_interval, "prober starting");
            let lease = match &shadow {
                Some(shadow) => {
                    warn!(window = ?shadow.window(), "shadow mode: deciding as usual, scaling nothing; comparing with the acting watchdog (GET /shadow on the metrics address)");
                    leader::PROBER_SHADOW_LEASE
                }
                None => leader::PROBER_LEASE,
            };
            let (metrics, health) = (rt.metrics.clone(), rt.health.clone());
            run_elected(&args, &seed_config, lease, &rt, |token| {
                prober::run_with_shadow(
                    config,
                    seed,
                    metrics,
                    health,
                    args.concurrent_reconciles,
                    events::PodRef::discover(&args.leader_election_namespace),
                    shadow,
                    token,
                )
            })
            .await
        }
        Command::Weeder(args) => {
            let config = load_weeder_config(&args.config_file)?;
            if args.enable_leader_election {
                leader_timings(&args)?;
            }
            let seed_config = kube_client::seed_config(args.kubeconfig.as_deref()).await?;
            let seed =
                kube_client::rate_limited_client(seed_config.clone(), args.qps(), args.burst())?;
            let shadow = args.shadow.then(|| {
                let window = args
                    .shadow_window
                    .unwrap_or_else(|| config.watch_duration.max(Duration::from_secs(60)));
                Shadow::new(events::Component::Weeder, window)
            });
            let rt = start_endpoints(&args, shutdown, shadow.clone()).await?;
            info!(services = config.services_and_dependant_selectors.len(), watch_duration = ?config.watch_duration, "weeder starting");
            let lease = match &shadow {
                Some(shadow) => {
                    warn!(window = ?shadow.window(), "shadow mode: deleting no pod; comparing with the acting watchdog (GET /shadow on the metrics address)");
                    leader::WEEDER_SHADOW_LEASE
                }
                None => leader::WEEDER_LEASE,
            };
            let (metrics, health) = (rt.metrics.clone(), rt.health.clone());
            run_elected(&args, &seed_config, lease, &rt, |token| {
                let own_pod = events::PodRef::discover(&args.leader_election_namespace);
                let weeders = weeder::Weeders::new(metrics, token.child_token());
                weeder::run_with_shadow(config, seed, weeders, health, own_pod, shadow, token)
            })
            .await
        }
        Command::Explain(args) => {
            let config = load_prober_config(&args.config_file)?;
            let seed = kube_client::seed_client(args.kubeconfig.as_deref(), 5.0, 10).await?;
            let explanation = explain::explain(&seed, &config, &args.namespace).await?;
            match args.output {
                cli::OutputFormat::Text => print!("{explanation}"),
                cli::OutputFormat::Json => match serde_json::to_string_pretty(&explanation) {
                    Ok(text) => println!("{text}"),
                    Err(e) => return Err(Error::Scaling(format!("encoding the explanation: {e}"))),
                },
            }
            Ok(())
        }
    }
}
