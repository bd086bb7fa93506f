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

use std::sync::Arc;

use hyper_timeout::TimeoutConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use kube::client::{ClientBuilder, ConfigExt};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};

use crate::{Error, Result};

use crate::metrics::CountRequestsLayer;
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
    let count = CountRequestsLayer::new(CountRequestsLayer::host_of(&config.cluster_url));
    let builder = ClientBuilder::try_from(config)
        .map_err(|e| Error::SeedClient(format!("building the client: {e}")))?;
    // Counted inside the limiter: only requests that were sent count (client-go's metric).
    Ok(builder
        .with_layer(&count)
        .with_layer(&RateLimitLayer::new(qps, burst))
        .build())
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
    PreparedShootConfig::prepare(kubeconfig_yaml, timeout)
        .await?
        .client()
}

/// Resumable TLS sessions kept per shoot: a run needs one, the rest is slack.
const TLS_SESSIONS_PER_SHOOT: usize = 4;

/// A shoot kubeconfig parsed once, with the TLS client configuration built from it, for as
/// long as the probe secret's kubeconfig stays the same text.
///
/// Parsing the YAML and building the TLS configuration (certificates, key, root store) cost
/// more CPU than the rest of a healthy probe run together; a rotated secret is different
/// text and gets prepared anew on the run that first reads it ([`Self::matches`]). Each
/// [`Self::client`] still opens its own connection (nothing is held from one run to the next)
/// but may resume the last run's TLS session: a full handshake with the shoot's apiserver
/// anyway, minus the certificate-chain verification the previous one already did.
pub struct PreparedShootConfig {
    /// Fingerprint of the kubeconfig text this was prepared from.
    fingerprint: u64,
    /// The parsed kubeconfig (client certificate and key removed once in `tls`).
    config: Config,
    /// The TLS configuration with its session store; `None` where kube must build the
    /// client itself each run (exec plugins, which may hand out new certificates; proxies).
    tls: Option<Arc<rustls::ClientConfig>>,
}

impl std::fmt::Debug for PreparedShootConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PreparedShootConfig")
            .field("cluster_url", &self.config.cluster_url)
            .field("cached_tls", &self.tls.is_some())
            .finish_non_exhaustive()
    }
}

fn fingerprint(text: &str) -> u64 {
    use std::hash::{BuildHasher, Hasher};
    // Keyed per process (SipHash): a secret's author can't aim for a collision.
    static KEYS: std::sync::OnceLock<std::collections::hash_map::RandomState> =
        std::sync::OnceLock::new();
    let mut hasher = KEYS.get_or_init(Default::default).build_hasher();
    hasher.write(text.as_bytes());
    hasher.finish()
}

impl PreparedShootConfig {
    /// Parses `kubeconfig_yaml` and builds its TLS configuration; every timeout is `timeout`.
    pub async fn prepare(
        kubeconfig_yaml: &str,
        timeout: Duration,
    ) -> Result<Self, ShootClientError> {
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
        let builds_itself = config.proxy_url.is_some()
            || config.auth_info.exec.is_some()
            || config.cluster_url.scheme_str() != Some("https");
        let tls = if builds_itself {
            None
        } else {
            let mut tls = config.rustls_client_config().map_err(|e| {
                ShootClientError(format!("building client: {}", redact(&e.to_string())))
            })?;
            tls.resumption = rustls::client::Resumption::in_memory_sessions(TLS_SESSIONS_PER_SHOOT);
            // Now held (parsed) by the TLS configuration; one copy of a key is enough.
            config.auth_info.client_certificate_data = None;
            config.auth_info.client_key_data = None;
            Some(Arc::new(tls))
        };
        Ok(PreparedShootConfig {
            fingerprint: fingerprint(kubeconfig_yaml),
            config,
            tls,
        })
    }

    /// Whether this was prepared from exactly `kubeconfig_yaml`.
    pub fn matches(&self, kubeconfig_yaml: &str) -> bool {
        self.fingerprint == fingerprint(kubeconfig_yaml)
    }

    /// A client for one probe run: its own connection, dropped with it. The same layers as
    /// kube's own client (base URI, auth, extra headers, timeouts) without its retries.
    pub fn client(&self) -> Result<Client, ShootClientError> {
        let config = &self.config;
        let building = |e: kube::Error| {
            ShootClientError(format!("building client: {}", redact(&e.to_string())))
        };
        let count = CountRequestsLayer::new(CountRequestsLayer::host_of(&config.cluster_url));
        let Some(tls) = &self.tls else {
            return Ok(ClientBuilder::try_from(config.clone())
                .map_err(building)?
                .with_layer(&count)
                .build());
        };
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        let mut https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(rustls::ClientConfig::clone(tls))
            .https_only();
        if let Some(name) = &config.tls_server_name {
            let name = rustls::pki_types::ServerName::try_from(name.clone()).map_err(|e| {
                ShootClientError(format!("kubeconfig tls-server-name {name:?}: {e}"))
            })?;
            https =
                https.with_server_name_resolver(hyper_rustls::FixedServerNameResolver::new(name));
        }
        let mut connector = TimeoutConnector::new(https.enable_http1().wrap_connector(http));
        connector.set_connect_timeout(config.connect_timeout);
        connector.set_read_timeout(config.read_timeout);
        connector.set_write_timeout(config.write_timeout);
        let http_client = hyper_util::client::legacy::Builder::new(TokioExecutor::new())
            .build::<_, kube::client::Body>(connector);
        let service = tower::ServiceBuilder::new()
            .layer(count)
            .layer(config.base_uri_layer())
            .option_layer(config.auth_layer().map_err(building)?)
            .layer(config.extra_headers_layer().map_err(building)?)
            .map_err(tower::BoxError::from)
            .service(http_client);
        Ok(Client::new(service, config.default_namespace.clone()))
    }
}

/// Keeps error text short and free of anything that looks like key material.
fn redact(message: &str) -> String {
    if message.contains("-----BEGIN") || message.len() > 300 {
        "details withheld (may contain credentials)".to_string()
    } else {
        message.to_string()
    }
}
