//! Building Kubernetes clients: the seed client (from `--kubeconfig` or in-cluster) and the
//! per-run shoot clients (from the probe secret's kubeconfig).
//!
//! kube's default retry of 429/503/504 is turned off for both: the prober must see a 429 to
//! space its runs out (docs/behaviour.md §2.10), and the scaler has its own three attempts (§2.12).
//!
//! The seed client is rate limited on the client side like client-go's (`--kube-api-qps`,
//! `--kube-api-burst`), with priorities (see [`crate::client::rate_limit`]). Shoot clients are not
//! limited: each serves one probe run against its own apiserver.

use std::path::Path;
use std::time::Duration;

use std::sync::Arc;

use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use kube::client::{ClientBuilder, ConfigExt};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use tower::timeout::TimeoutLayer;

use crate::{Error, Result};

use crate::client::guarded_body::{BodyGuard, GuardLayer, GuardResponses};
use crate::client::rate_limit::RateLimitLayer;
use crate::client::retry_after::{self, RetryAfterLayer};
use crate::metrics::CountRequestsLayer;

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

/// The longest a seed request waits for its response's headers, per attempt.
///
/// A seed connection that completes the TLS handshake and then says nothing (a hung
/// apiserver, a half-dead load balancer) would otherwise hold a watch or list for good (kube's
/// `Config::read_timeout` is unset): the watch cache behind it stays frozen without an error, so it is
/// never marked stale, and a flow waiting on it never finishes (`tests/faults.rs`
/// `seed_hanging_or_slower_than_the_client_mid_flow` found this). Bounded, the watch fails,
/// is retried with its backoff on a new connection, and the errors count towards staleness.
/// 30 s is far above what a healthy apiserver needs for headers (watches and cached lists
/// answer them at once; API Priority and Fairness answers a request it cannot seat soon with
/// 429), and close to client-go's own detection of a dead HTTP/2 connection (a ping after
/// 30 s of silence, 15 s to answer it).
pub(crate) const SEED_RESPONSE_HEADERS_TIMEOUT: Duration = Duration::from_secs(30);

/// A client of `config` whose requests pass one token bucket of its own (`qps`, `burst`).
///
/// Each call makes a new bucket: two clients built from the same config don't share a budget
/// (the leader-election client has its own, so busy probes can't delay lease renewals).
pub fn rate_limited_client(config: Config, qps: f32, burst: u32) -> Result<Client> {
    let count = CountRequestsLayer::new(CountRequestsLayer::host_of(&config.cluster_url));
    // kube's own stack, plus what notices a seed gone silent (`crate::client::seed_transport`).
    let service = crate::client::seed_transport::seed_service(&config)
        .map_err(|e| Error::SeedClient(e.to_string()))?;
    let builder = ClientBuilder::new(service, config.default_namespace.clone());
    // Counted inside the limiter: only requests that were sent count (client-go's metric).
    // Retries of a `Retry-After` answer go outermost: each attempt takes a token again and is
    // counted, as client-go's do. No budget of its own: the seed is ours, and the callers
    // bound their calls (the scaler with its call timeout, a `retry_after::Deadline` on each
    // of its requests).
    // Innermost: every attempt that reaches the wire gets its own bound on the wait for the
    // response's headers (the body, e.g. a watch stream, is not bounded by it).
    Ok(builder
        .with_layer(&TimeoutLayer::new(SEED_RESPONSE_HEADERS_TIMEOUT))
        .with_layer(&count)
        .with_layer(&RateLimitLayer::new(qps, burst))
        .with_layer(&RetryAfterLayer::new(retry_after::MAX_RETRIES, None))
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
        .client(ResponseLimits::DEFAULT, HttpVersion::Negotiated)
}

/// Which HTTP a shoot client speaks ([`PreparedShootConfig::client`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HttpVersion {
    /// HTTP/2 where the shoot offers it (ALPN), HTTP/1.1 otherwise.
    Negotiated,
    /// HTTP/2 only: for a shoot known to speak it, so requests sent at once share one
    /// connection from the start.
    Http2Only,
}

/// The longest a shoot connection may take to establish, as client-go's dialer.
const MAX_CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

/// What a shoot's server may send over HTTP/2 before the run reads it (flow control): the
/// run reads its answers as they arrive, each byte counted against its limits and charged to
/// its memory grant as it is read, so the windows are all a tenant can make a run hold
/// unread. 64 KiB a stream (HTTP/2's own initial window) and twice that the connection, for a
/// run's two lists at once: less than hyper's HTTP/1.1 read buffer may grow to (408 KiB), so
/// a run in flight costs what `memory_budget::RUN_RESERVE` was measured for. hyper's defaults
/// (2 MiB a stream, 5 MiB the connection) are for throughput; a run's lists are at most a few
/// MiB, read over the seed's own network.
const SHOOT_H2_STREAM_WINDOW: u32 = 64 << 10;
/// See [`SHOOT_H2_STREAM_WINDOW`].
const SHOOT_H2_CONNECTION_WINDOW: u32 = 2 * SHOOT_H2_STREAM_WINDOW;
/// The largest header block a shoot may answer with over HTTP/2 (hyper's default, stated:
/// headers are held whole before the body).
const SHOOT_H2_MAX_HEADER_LIST: u32 = 16 << 10;

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
    /// The TLS configuration with its session store.
    tls: Arc<rustls::ClientConfig>,
}

impl std::fmt::Debug for PreparedShootConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PreparedShootConfig")
            .field("cluster_url", &self.config.cluster_url)
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
        // Before kube sees it: kube would read the files and run the commands it names.
        check_inline_only(&kc)?;
        // kube's messages quote entry names; one that is not a plain name may hold other
        // lines YAML folded into it (a token), so its messages are withheld whole.
        let names_plain = entry_names(&kc).all(is_plain_name);
        let mut config = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
            .await
            .map_err(|e| {
                let details = if names_plain {
                    redact(&e.to_string())
                } else {
                    "details withheld (an entry name is not a plain name)".to_string()
                };
                ShootClientError(format!("kubeconfig unusable: {details}"))
            })?;
        config.default_retry = false;
        // Go's dialer gives up connecting after 30 s whatever the probe timeout (which may be
        // "none" when configured as zero).
        config.connect_timeout = Some(timeout.min(MAX_CONNECT_TIMEOUT));
        config.read_timeout = Some(timeout);
        config.write_timeout = Some(timeout);
        let mut tls = config.rustls_client_config().map_err(|e| {
            ShootClientError(format!("building client: {}", redact(&e.to_string())))
        })?;
        tls.resumption = rustls::client::Resumption::in_memory_sessions(TLS_SESSIONS_PER_SHOOT);
        // Now held (parsed) by the TLS configuration; one copy of a key is enough.
        config.auth_info.client_certificate_data = None;
        config.auth_info.client_key_data = None;
        let tls = Arc::new(tls);
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
    /// kube's own client (base URI, auth, extra headers, timeouts) without its retries. Every
    /// response byte counts against `limits`; the reads charge what they hold to the run's
    /// grant on the process-wide memory budget as they read it (`prober::shoot_reads`,
    /// [`crate::memory_budget`]).
    ///
    /// [`HttpVersion::Negotiated`] speaks HTTP/2 where the shoot offers it and HTTP/1.1
    /// otherwise, but requests sent at once before the connection is up each open their own
    /// (the protocol is known only once one is): send the first alone. With
    /// [`HttpVersion::Http2Only`] (the shoot is known to speak HTTP/2) requests sent at once
    /// wait for the one connection and share it; a shoot that no longer offers HTTP/2 fails
    /// them.
    pub fn client(
        &self,
        limits: ResponseLimits,
        version: HttpVersion,
    ) -> Result<Client, ShootClientError> {
        let config = &self.config;
        let building = |e: kube::Error| {
            ShootClientError(format!("building client: {}", redact(&e.to_string())))
        };
        let count = CountRequestsLayer::new(CountRequestsLayer::host_of(&config.cluster_url));
        let tls = &self.tls;
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
        // HTTP/2 where the shoot offers it (ALPN; kube-apiserver does, as client-go asks): a
        // run's lists can then share its one connection at once.
        let connector = super::seed_transport::timeout_connector(https, http, config);
        let http_client = hyper_util::client::legacy::Builder::new(TokioExecutor::new())
            .http2_only(version == HttpVersion::Http2Only)
            .http2_initial_stream_window_size(SHOOT_H2_STREAM_WINDOW)
            .http2_initial_connection_window_size(SHOOT_H2_CONNECTION_WINDOW)
            .http2_max_header_list_size(SHOOT_H2_MAX_HEADER_LIST)
            .build::<_, kube::client::Body>(connector);
        let service = tower::ServiceBuilder::new()
            // Outermost, so each attempt is counted. Its budget is the probe timeout, which
            // bounds every shoot call: a tenant's long `Retry-After` can't hold the run, and
            // a wait that would pass it returns the 429 (so the next run is spaced out).
            .layer(RetryAfterLayer::new(
                retry_after::MAX_RETRIES,
                config.read_timeout,
            ))
            .layer(count)
            .layer(ResponseBudget::layer(limits))
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

/// The longest entry name quoted in an error: a DNS subdomain's length, more than any
/// kubeconfig Gardener writes (`shoot--<project>--<name>`) needs.
const MAX_SHOWN_NAME: usize = 253;

/// Whether an entry name may be quoted in an error: one line without spaces or control
/// characters and at most [`MAX_SHOWN_NAME`] bytes. YAML folds a more-indented line into the
/// plain scalar above it (joined by a space, or a line break after a blank line), so a moved
/// `token:` line can become part of a `name:`; such a name always holds whitespace.
fn is_plain_name(name: &str) -> bool {
    name.len() <= MAX_SHOWN_NAME && !name.chars().any(|c| c.is_whitespace() || c.is_control())
}

/// Every name a kubeconfig's entries carry or refer to (kube may quote any in its errors).
fn entry_names(kc: &Kubeconfig) -> impl Iterator<Item = &str> {
    let contexts = kc.contexts.iter().flat_map(|c| {
        let refs = c.context.iter().flat_map(|x| {
            [
                Some(x.cluster.as_str()),
                x.user.as_deref(),
                x.namespace.as_deref(),
            ]
            .into_iter()
            .flatten()
        });
        std::iter::once(c.name.as_str()).chain(refs)
    });
    kc.clusters
        .iter()
        .map(|c| c.name.as_str())
        .chain(kc.auth_infos.iter().map(|u| u.name.as_str()))
        .chain(contexts)
        .chain(kc.current_context.as_deref())
}

/// How an error names the `index`th entry of a kind (`cluster`, `user`): by its name when it
/// [`is_plain_name`], by its position otherwise.
fn entry(what: &str, index: usize, name: &str) -> String {
    if is_plain_name(name) {
        format!("{what} {name:?}")
    } else {
        format!("{what} #{} (name not shown: not a plain name)", index + 1)
    }
}

/// Refuses every kubeconfig field that is not inline material.
///
/// The probe kubeconfig comes from a secret in the shoot namespace and is used against the
/// tenant's apiserver. Gardener writes only inline material (server, CA data, a token); kube
/// would honour much more: `tokenFile`/`client-key`/`certificate-authority` read files of ours
/// (`tokenFile: /var/run/secrets/.../token` would send the seed credential to the shoot's
/// `server`; `certificate-authority: /dev/zero` reads forever), `exec` and `auth-provider` run
/// commands on every run, `proxy-url` routes our credentials through a host of the author's
/// choice, `as`/`as-uid`/`as-groups`/`as-user-extra` ask for impersonation (kube sends each as
/// an `Impersonate-*` header: the tenant would pick whom our token acts as), `insecure-skip-tls-verify` and plain
/// `http://` servers expose the token to anyone in between. Each is an error naming the
/// entry and the field; nothing is read and nothing is run.
pub fn check_inline_only(kc: &Kubeconfig) -> Result<(), ShootClientError> {
    let refuse = |name: String, field: &str| {
        Err(ShootClientError(format!(
            "kubeconfig {name}: field {field} is not supported (only inline material is: \
             server, certificate-authority-data, tls-server-name, token, \
             client-certificate-data, client-key-data)"
        )))
    };
    for (index, named) in kc.clusters.iter().enumerate() {
        let Some(c) = &named.cluster else { continue };
        let name = entry("cluster", index, &named.name);
        if c.certificate_authority.is_some() {
            return refuse(name, "certificate-authority");
        }
        if c.proxy_url.is_some() {
            return refuse(name, "proxy-url");
        }
        if c.insecure_skip_tls_verify == Some(true) {
            return refuse(name, "insecure-skip-tls-verify");
        }
        if let Some(server) = &c.server
            && !server.starts_with("https://")
        {
            return Err(ShootClientError(format!(
                "kubeconfig {name}: server must be an https:// URL"
            )));
        }
    }
    for (index, named) in kc.auth_infos.iter().enumerate() {
        let Some(u) = &named.auth_info else { continue };
        let fields = [
            ("tokenFile", u.token_file.is_some()),
            ("client-certificate", u.client_certificate.is_some()),
            ("client-key", u.client_key.is_some()),
            ("exec", u.exec.is_some()),
            ("auth-provider", u.auth_provider.is_some()),
            ("username", u.username.is_some()),
            ("password", u.password.is_some()),
            ("as", u.impersonate.is_some()),
            ("as-uid", u.impersonate_uid.is_some()),
            ("as-groups", u.impersonate_groups.is_some()),
            ("as-user-extra", u.impersonate_user_extra.is_some()),
        ];
        if let Some((field, _)) = fields.iter().find(|(_, set)| *set) {
            return refuse(entry("user", index, &named.name), field);
        }
    }
    Ok(())
}

/// How many response bytes one probe run may receive from a shoot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResponseLimits {
    /// Bytes of one response body.
    pub(crate) per_response: u64,
    /// Bytes of all response bodies of one client (one client serves one probe run).
    pub per_run: u64,
}

impl ResponseLimits {
    /// Room for a real shoot's pages of leases and nodes (a page of 100 Nodes with their
    /// images is a few MiB), not for a tenant who fattens every lease with 256 KiB of
    /// annotations: a page of those fails at the per-response limit, a shoot with too many at
    /// the per-run one.
    pub const DEFAULT: ResponseLimits = ResponseLimits {
        per_response: 16 << 20,
        per_run: 64 << 20,
    };
}

/// The error a response body fails with once a limit is passed.
#[derive(Debug, thiserror::Error)]
#[error(
    "shoot response too large: more than {limit} bytes {what}; a tenant's objects must not make the watchdog hold unbounded memory"
)]
pub(crate) struct ResponseTooLarge {
    /// The limit passed.
    pub limit: u64,
    /// `in one response` or `in this probe run`.
    pub what: &'static str,
}

/// Whether `error` (or anything in its source chain) is a [`ResponseTooLarge`].
pub(crate) fn is_response_too_large(error: &(dyn std::error::Error + 'static)) -> bool {
    crate::error::caused_by::<ResponseTooLarge>(error)
}

/// Fails every response body once it passes [`ResponseLimits`]: the bytes are counted as
/// they arrive, before anything buffers them (through [`GuardLayer`]). One per client, so
/// one per probe run.
#[derive(Clone)]
struct ResponseBudget {
    limits: ResponseLimits,
    /// Bytes received by this client so far (every response of one probe run).
    received: Arc<std::sync::atomic::AtomicU64>,
}

impl ResponseBudget {
    fn layer(limits: ResponseLimits) -> GuardLayer<Self> {
        GuardLayer(ResponseBudget {
            limits,
            received: Arc::default(),
        })
    }
}

impl GuardResponses for ResponseBudget {
    type Guard = ResponseCount;
    fn guard(&self, _uri: &http::Uri) -> ResponseCount {
        ResponseCount {
            in_response: 0,
            budget: self.clone(),
        }
    }
}

/// One response's bytes, against its limit and its client's budget.
struct ResponseCount {
    in_response: u64,
    budget: ResponseBudget,
}

impl BodyGuard for ResponseCount {
    fn on_data(&mut self, len: u64) -> Result<(), tower::BoxError> {
        use std::sync::atomic::Ordering;
        let limits = self.budget.limits;
        self.in_response += len;
        if self.in_response > limits.per_response {
            return Err(Box::new(ResponseTooLarge {
                limit: limits.per_response,
                what: "in one response",
            }));
        }
        let total = self.budget.received.fetch_add(len, Ordering::Relaxed) + len;
        if total > limits.per_run {
            return Err(Box::new(ResponseTooLarge {
                limit: limits.per_run,
                what: "in this probe run",
            }));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;
    use tower::{Service, ServiceExt};

    /// Gardener's probe kubeconfig: server, CA data, token.
    const GARDENER: &str = r#"
apiVersion: v1
kind: Config
clusters:
- name: shoot
  cluster:
    server: https://kube-apiserver
    certificate-authority-data: Q0E=
    tls-server-name: kube-apiserver
contexts:
- name: shoot
  context: {cluster: shoot, user: shoot}
current-context: shoot
users:
- name: shoot
  user:
    token: abc
"#;

    fn kubeconfig(cluster_extra: &str, user: &str) -> Kubeconfig {
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://x\n{cluster_extra}contexts:\n- name: c\n  context: {{cluster: c, user: u}}\ncurrent-context: c\nusers:\n- name: u\n  user:\n{user}"
        );
        Kubeconfig::from_yaml(&text).expect("test kubeconfig")
    }

    #[test]
    fn gardeners_inline_kubeconfig_is_accepted() {
        let kc = Kubeconfig::from_yaml(GARDENER).expect("kubeconfig");
        assert!(check_inline_only(&kc).is_ok());
        let kc = kubeconfig(
            "",
            "    client-certificate-data: Q0VSVA==\n    client-key-data: S0VZ\n",
        );
        assert!(check_inline_only(&kc).is_ok());
    }

    #[test]
    fn anything_that_reads_files_runs_commands_or_leaks_is_refused_naming_the_field() {
        // Cluster fields (with a plain token user), then user fields.
        let token = "    token: t\n";
        let cluster_fields = [
            ("certificate-authority", "/dev/zero"),
            ("proxy-url", "socks5://user:pass@evil:1080"),
            ("insecure-skip-tls-verify", "true"),
        ]
        .map(|(field, value)| (format!("    {field}: {value}\n"), token.to_owned(), field));
        let user_fields = [
            ("tokenFile", "/var/run/secrets/kubernetes.io/serviceaccount/token"),
            ("client-certificate", "/etc/passwd"),
            ("client-key", "/etc/shadow"),
            (
                "exec",
                "\n      apiVersion: client.authentication.k8s.io/v1\n      command: touch\n      args: [/tmp/pwned]\n      env: [{name: SECRET, value: s3cr3t}]",
            ),
            ("auth-provider", "\n      name: oidc\n      config: {}"),
            ("username", "admin\n    password: hunter2"),
            ("as", "system:admin"),
            ("as-uid", "\"0\""),
            ("as-groups", "[system:masters]"),
            ("as-user-extra", "\n      scopes: [s3cr3t]"),
        ]
        .map(|(field, value)| {
            // Impersonation comes with a token; the credential fields stand alone.
            let with_token = if field.starts_with("as") {
                token
            } else {
                ""
            };
            let user = format!("{with_token}    {field}: {value}\n");
            (String::new(), user, field)
        });
        let cases = cluster_fields.into_iter().chain(user_fields);
        for (cluster, user, field) in cases {
            let error = check_inline_only(&kubeconfig(&cluster, &user))
                .expect_err(field)
                .to_string();
            assert!(
                error.contains(&format!("field {field} ")),
                "{field}: {error}"
            );
            for secret in ["s3cr3t", "hunter2", "user:pass", "/tmp/pwned"] {
                assert!(!error.contains(secret), "{field}: {error}");
            }
        }
        let plain = Kubeconfig::from_yaml(&GARDENER.replace("https://", "http://")).expect("kc");
        let error = check_inline_only(&plain).expect_err("http").to_string();
        assert!(error.contains("https://"), "{error}");
    }

    type Answer = http::Response<http_body_util::Full<bytes::Bytes>>;

    /// Reads one response of `bytes` bytes through `layer`.
    async fn read(
        layer: &GuardLayer<ResponseBudget>,
        bytes: usize,
    ) -> Result<usize, tower::BoxError> {
        let inner = tower::service_fn(move |_req: http::Request<()>| {
            let body = http_body_util::Full::new(bytes::Bytes::from(vec![b'x'; bytes]));
            futures::future::ready(Ok::<Answer, std::convert::Infallible>(http::Response::new(
                body,
            )))
        });
        let mut svc = tower::Layer::layer(layer, inner);
        let response = svc.ready().await?.call(http::Request::new(())).await?;
        Ok(response.into_body().collect().await?.to_bytes().len())
    }

    #[tokio::test]
    async fn a_response_past_its_limit_fails_and_so_does_a_run_past_its_budget() {
        let limits = ResponseLimits {
            per_response: 10_000,
            per_run: 25_000,
        };
        // One client (one run): three responses of 8 KB fit, the fourth passes the budget.
        let run = ResponseBudget::layer(limits);
        for _ in 0..3 {
            assert_eq!(read(&run, 8000).await.expect("within limits"), 8000);
        }
        let error = read(&run, 8000).await.expect_err("past the run budget");
        assert!(is_response_too_large(error.as_ref()), "{error}");
        assert!(error.to_string().contains("in this probe run"), "{error}");

        // The next run starts a new budget; one response of 12 KB is too large on its own.
        let next = ResponseBudget::layer(limits);
        let error = read(&next, 12_000)
            .await
            .expect_err("past the response limit");
        assert!(error.to_string().contains("in one response"), "{error}");
        assert_eq!(read(&next, 9_000).await.expect("within limits"), 9_000);
    }
}
