//! Gardener's dependency-watchdog, in Rust.
//!
//! The binary (`main.rs`) only parses flags and calls [`run`]. Decisions live in the pure
//! `dwd_core` crate; this crate does the I/O: watch caches of the seed, per-run shoot clients,
//! the Cluster controller and probe tasks ([`prober`]), the weeder, metrics and health.

pub mod cache;
pub mod cli;
pub mod error;
pub mod health;
pub mod kube_client;
pub mod metrics;
pub mod prober;
pub mod server;
pub mod weeder;

use std::path::Path;
use std::sync::{Arc, Mutex};

use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

pub use error::{Error, Result};

use cli::{Cli, Command, CommonArgs, LogFormat};
use health::Health;
use metrics::Metrics;

/// Installs the tracing subscriber: `--zap-log-level` (or `RUST_LOG`) and the log format.
pub fn init_logging(args: &CommonArgs) {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        EnvFilter::new(format!(
            "{},kube=warn,hyper=warn",
            cli::zap_level_to_filter(&args.zap_log_level)
        ))
    });
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_target(false);
    let _ = match args.log_format() {
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
        LogFormat::Text => builder.try_init(),
    };
}

/// Reads and validates the prober config; every bad field is named in the error.
pub fn load_prober_config(path: &Path) -> Result<dwd_core::ProberConfig> {
    let text = std::fs::read_to_string(path).map_err(|source| Error::ReadConfig {
        path: path.into(),
        source,
    })?;
    let loaded = dwd_core::ProberConfig::from_yaml(&text).map_err(|source| Error::Config {
        path: path.into(),
        source,
    })?;
    for warning in &loaded.warnings {
        warn!(file = %path.display(), "{warning}");
    }
    Ok(loaded.config)
}

/// Reads and validates the weeder config; every bad field is named in the error.
pub fn load_weeder_config(path: &Path) -> Result<dwd_core::WeederConfig> {
    let text = std::fs::read_to_string(path).map_err(|source| Error::ReadConfig {
        path: path.into(),
        source,
    })?;
    let loaded = dwd_core::WeederConfig::from_yaml(&text).map_err(|source| Error::Config {
        path: path.into(),
        source,
    })?;
    for warning in &loaded.warnings {
        warn!(file = %path.display(), "{warning}");
    }
    Ok(loaded.config)
}

/// Cancels `token` on SIGTERM or SIGINT; a second signal exits at once.
pub fn spawn_signal_handler(token: CancellationToken) {
    tokio::spawn(async move {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(e) => {
                    warn!(error = %e, "cannot listen for SIGTERM");
                    return;
                }
            };
        for n in 0.. {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
            if n == 0 {
                info!("shutting down (a second signal exits at once)");
                token.cancel();
            } else {
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

async fn start_endpoints(args: &CommonArgs) -> Result<Runtime> {
    let metrics = Arc::new(Metrics::default());
    let mut registry = Registry::default();
    metrics.register(&mut registry);
    let health = Arc::new(Health::default());
    let shutdown = CancellationToken::new();
    let (maddr, _) = server::serve(
        "metrics",
        &args.metrics_bind_addr,
        server::Endpoints::Metrics(Arc::new(Mutex::new(registry))),
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

/// Runs the subcommand until shutdown.
pub async fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Prober(args) => {
            let config = load_prober_config(&args.config_file)?;
            let seed = kube_client::seed_client(args.kubeconfig.as_deref()).await?;
            if args.enable_leader_election {
                warn!(
                    "--enable-leader-election is accepted but not implemented yet: this replica acts alone"
                );
            }
            let rt = start_endpoints(&args).await?;
            spawn_signal_handler(rt.shutdown.clone());
            info!(targets = config.dependent_resource_infos.len(), interval = ?config.probe_interval, "prober starting");
            prober::run(
                config,
                seed,
                rt.metrics,
                rt.health,
                args.concurrent_reconciles,
                rt.shutdown,
            )
            .await
        }
        Command::Weeder(args) => {
            let config = load_weeder_config(&args.config_file)?;
            let seed = kube_client::seed_client(args.kubeconfig.as_deref()).await?;
            if args.enable_leader_election {
                warn!(
                    "--enable-leader-election is accepted but not implemented yet: this replica acts alone"
                );
            }
            let rt = start_endpoints(&args).await?;
            spawn_signal_handler(rt.shutdown.clone());
            info!(services = config.services_and_dependant_selectors.len(), watch_duration = ?config.watch_duration, "weeder starting");
            weeder::run(config, seed, rt.metrics, rt.health, rt.shutdown).await
        }
    }
}
