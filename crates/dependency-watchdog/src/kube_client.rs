//! Building Kubernetes clients: the seed client (from `--kubeconfig` or in-cluster) and the
//! per-run shoot clients (from the probe secret's kubeconfig).
//!
//! kube's default retry of 429/503/504 is turned off for both: the prober must see a 429 to
//! space its runs out (SPEC §2.2.6), and the scaler has its own three attempts (§2.3).
//!
//! The seed client is rate limited on the client side like client-go's (`--kube-api-qps`,
//! `--kube-api-burst`), with priorities (see [`crate::rate_limit`]). Shoot clients are not
//! limited: each serves one probe run against its own apiserver.

use std::path::Path;
use std::time::Duration;

use kube::client::ClientBuilder;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};

use crate::{Error, Result};

use crate::rate_limit::RateLimitLayer;
pub use crate::rate_limit::{DEFAULT_BURST, DEFAULT_QPS};

/// The seed's client configuration: `--kubeconfig` when given, else in-cluster (or
/// `$KUBECONFIG`), with kube's own retries off.
pub async fn seed_config(kubeconfig: Option<&Path>) -> Result<Config> {
    let mut config = match kubeconfig {
        Some(path) => {
            let kc = Kubeconfig::read_from(path).map_err(|e| {
                Error::SeedClient(format!("reading kubeconfig {}: {e}", path.display()))
            })?;
            Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
                .await
                .map_err(|e| Error::SeedClient(format!("kubeconfig {}: {e}", path.display())))?
        }
        None => Config::infer().await.map_err(|e| {
            Error::SeedClient(format!(
                "no --kubeconfig given and no in-cluster config: {e}"
            ))
        })?,
    };
    config.default_retry = false;
    Ok(config)
}

/// The seed client, limited to `qps` requests per second with bursts of `burst`.
pub async fn seed_client(kubeconfig: Option<&Path>, qps: f32, burst: u32) -> Result<Client> {
    rate_limited_client(seed_config(kubeconfig).await?, qps, burst)
}

/// A client of `config` whose requests pass one token bucket of its own (`qps`, `burst`).
///
/// Each call makes a new bucket: two clients built from the same config don't share a budget
/// (the leader-election client has its own, so busy probes can't delay lease renewals).
pub fn rate_limited_client(config: Config, qps: f32, burst: u32) -> Result<Client> {
    let builder = ClientBuilder::try_from(config)
        .map_err(|e| Error::SeedClient(format!("building the client: {e}")))?;
    Ok(builder.with_layer(&RateLimitLayer::new(qps, burst)).build())
}

/// Why a shoot kubeconfig could not become a client (never contains secret material).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ShootClientError(String);

/// A client for one probe run against a shoot. Every timeout is `timeout`.
pub async fn shoot_client(
    kubeconfig_yaml: &str,
    timeout: Duration,
) -> Result<Client, ShootClientError> {
    // The parser's messages may quote input; keep only the kind of problem, never the text.
    let kc = Kubeconfig::from_yaml(kubeconfig_yaml)
        .map_err(|_| ShootClientError("kubeconfig is not valid kubeconfig YAML".into()))?;
    let mut config = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .map_err(|e| {
            ShootClientError(format!("kubeconfig unusable: {}", redact(&e.to_string())))
        })?;
    config.default_retry = false;
    config.connect_timeout = Some(timeout);
    config.read_timeout = Some(timeout);
    config.write_timeout = Some(timeout);
    Client::try_from(config)
        .map_err(|e| ShootClientError(format!("building client: {}", redact(&e.to_string()))))
}

/// Keeps error text short and free of anything that looks like key material.
fn redact(message: &str) -> String {
    if message.contains("-----BEGIN") || message.len() > 300 {
        "details withheld (may contain credentials)".to_string()
    } else {
        message.to_string()
    }
}
