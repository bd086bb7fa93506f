//! Building Kubernetes clients: the seed client (from `--kubeconfig` or in-cluster) and the
//! per-run shoot clients (from the probe secret's kubeconfig).
//!
//! kube's default retry of 429/503/504 is turned off for both: the prober must see a 429 to
//! space its runs out (SPEC §2.2.6), and the scaler has its own three attempts (§2.3).

use std::path::Path;
use std::time::Duration;

use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};

use crate::{Error, Result};

/// The seed client: `--kubeconfig` when given, else in-cluster (or `$KUBECONFIG`).
pub async fn seed_client(kubeconfig: Option<&Path>) -> Result<Client> {
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
    Client::try_from(config).map_err(|e| Error::SeedClient(e.to_string()))
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
