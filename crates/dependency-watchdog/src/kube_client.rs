//! Building Kubernetes clients: the seed client (from `--kubeconfig` or in-cluster) and the
//! per-run shoot clients (from the probe secret's kubeconfig).
//!
//! kube's default retry of 429/503/504 is turned off for both: the prober must see a 429 to
//! space its runs out (SPEC §2.2.6), and the scaler has its own three attempts (§2.3).
//!
//! The seed client is rate limited on the client side like client-go's (`--kube-api-qps`,
//! `--kube-api-burst`): a token bucket holding `burst` tokens, refilled at `qps` per second;
//! every request takes one token when it is sent and waits for one when the bucket is empty.
//! A watch takes one token when it starts; its events are not requests and are never delayed.
//! Shoot clients are not limited: each serves one probe run against its own apiserver.

use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use kube::client::ClientBuilder;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use tokio::time::{Instant, Sleep};

use crate::{Error, Result};

/// client-go's defaults, used when a flag is 0 (or not a positive number).
pub const DEFAULT_QPS: f32 = 5.0;
/// See [`DEFAULT_QPS`].
pub const DEFAULT_BURST: u32 = 10;

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

/// A token bucket: `burst` tokens, refilled continuously at `qps` tokens per second.
///
/// A caller that finds the bucket empty still takes its token (the count goes negative) and
/// is told how long to wait: callers are served in the order they asked, like Go's
/// `rate.Limiter.Wait`, and N requests from a full bucket take (N − burst) / qps.
#[derive(Debug)]
pub struct TokenBucket {
    qps: f64,
    burst: f64,
    state: Mutex<BucketState>,
}

#[derive(Debug)]
struct BucketState {
    tokens: f64,
    updated: Instant,
}

impl TokenBucket {
    /// A full bucket; a `qps` that is not a positive number or a `burst` of 0 mean the defaults.
    pub fn new(qps: f32, burst: u32) -> Self {
        let qps = if qps.is_finite() && qps > 0.0 {
            f64::from(qps)
        } else {
            f64::from(DEFAULT_QPS)
        };
        let burst = f64::from(if burst == 0 { DEFAULT_BURST } else { burst });
        TokenBucket {
            qps,
            burst,
            state: Mutex::new(BucketState {
                tokens: burst,
                updated: Instant::now(),
            }),
        }
    }

    /// Takes one token at `now`; returns how long the caller must wait before using it.
    pub fn reserve(&self, now: Instant) -> Duration {
        // A panic while holding the lock can't leave the numbers half-updated; keep going.
        let mut state = self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let elapsed = now.saturating_duration_since(state.updated).as_secs_f64();
        state.tokens = (state.tokens + elapsed * self.qps).min(self.burst);
        state.updated = state.updated.max(now);
        state.tokens -= 1.0;
        if state.tokens >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-state.tokens / self.qps)
        }
    }
}

/// A tower layer putting a [`TokenBucket`] in front of a service.
#[derive(Debug, Clone)]
pub struct RateLimitLayer {
    bucket: Arc<TokenBucket>,
}

impl RateLimitLayer {
    /// A layer with a new full bucket (see [`TokenBucket::new`] for the defaults).
    pub fn new(qps: f32, burst: u32) -> Self {
        RateLimitLayer {
            bucket: Arc::new(TokenBucket::new(qps, burst)),
        }
    }
}

impl<S> tower::Layer<S> for RateLimitLayer {
    type Service = RateLimited<S>;

    fn layer(&self, inner: S) -> RateLimited<S> {
        RateLimited {
            inner,
            bucket: self.bucket.clone(),
            waiting: None,
            permitted: false,
        }
    }
}

/// A service whose `poll_ready` waits for a token of the shared bucket.
///
/// kube's `Client` drives its service from one buffer worker that calls `poll_ready` only
/// when it holds a request, so a token is taken per request, in arrival order, and waiting
/// requests queue in the buffer instead of being sent.
pub struct RateLimited<S> {
    inner: S,
    bucket: Arc<TokenBucket>,
    /// Set while waiting for the reserved token's time.
    waiting: Option<Pin<Box<Sleep>>>,
    /// A token is reserved and its time has come: the next `call` uses it.
    permitted: bool,
}

impl<S, Req> tower::Service<Req> for RateLimited<S>
where
    S: tower::Service<Req>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        if !self.permitted {
            let waiting = match self.waiting.as_mut() {
                Some(sleep) => sleep,
                None => {
                    let now = Instant::now();
                    let wait = self.bucket.reserve(now);
                    self.waiting
                        .insert(Box::pin(tokio::time::sleep_until(now + wait)))
                }
            };
            std::task::ready!(waiting.as_mut().poll(cx));
            self.waiting = None;
            self.permitted = true;
        }
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Req) -> S::Future {
        self.permitted = false;
        self.inner.call(req)
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use tower::{Layer, Service, ServiceExt};

    use std::convert::Infallible;

    /// A service that answers at once with the (paused-clock) time it was called.
    struct Clock;

    impl Service<()> for Clock {
        type Response = Instant;
        type Error = Infallible;
        type Future = std::future::Ready<Result<Instant, Infallible>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, (): ()) -> Self::Future {
            std::future::ready(Ok(Instant::now()))
        }
    }

    fn clock_service() -> Clock {
        Clock
    }

    /// Sends one request through the limiter; returns when it reached the inner service.
    async fn send(svc: &mut RateLimited<Clock>) -> Instant {
        let Ok(ready) = svc.ready().await;
        let Ok(at) = ready.call(()).await;
        at
    }

    #[tokio::test(start_paused = true)]
    async fn burst_goes_at_once_then_requests_are_spaced_by_one_over_qps() {
        let mut svc = RateLimitLayer::new(5.0, 10).layer(clock_service());
        let start = Instant::now();
        let mut sent = Vec::new();
        for _ in 0..30 {
            sent.push(send(&mut svc).await - start);
        }
        // The first `burst` requests don't wait.
        assert!(sent[..10].iter().all(|d| d.is_zero()), "{sent:?}");
        // Request k (0-based, k ≥ burst) goes at (k + 1 − burst) / qps.
        for (k, at) in sent.iter().enumerate().skip(10) {
            let want = Duration::from_millis(200 * (k as u64 + 1 - 10));
            assert!(
                at.abs_diff(want) < Duration::from_millis(2),
                "request {k} at {at:?}, want {want:?}"
            );
        }
        // 30 requests with burst 10 at 5 qps: (30 − 10) / 5 = 4 s.
        assert!(sent[29].abs_diff(Duration::from_secs(4)) < Duration::from_millis(2));
    }

    #[tokio::test(start_paused = true)]
    async fn idle_time_refills_at_most_burst_tokens() {
        let mut svc = RateLimitLayer::new(2.0, 3).layer(clock_service());
        for _ in 0..3 {
            send(&mut svc).await;
        }
        tokio::time::advance(Duration::from_secs(60)).await;
        let start = Instant::now();
        let mut sent = Vec::new();
        for _ in 0..5 {
            sent.push(send(&mut svc).await - start);
        }
        // 60 s idle refill only 3 tokens: the 4th and 5th wait 0.5 s and 1 s.
        assert!(sent[..3].iter().all(|d| d.is_zero()), "{sent:?}");
        assert!(sent[3].abs_diff(Duration::from_millis(500)) < Duration::from_millis(2));
        assert!(sent[4].abs_diff(Duration::from_millis(1000)) < Duration::from_millis(2));
    }

    #[tokio::test(start_paused = true)]
    async fn concurrent_callers_share_one_bucket_in_order() {
        // Clones of one layer share its bucket, as every clone of a kube Client does.
        let layer = RateLimitLayer::new(10.0, 2);
        let start = Instant::now();
        let tasks: Vec<_> = (0..6)
            .map(|_| {
                let mut svc = layer.layer(clock_service());
                tokio::spawn(async move { send(&mut svc).await })
            })
            .collect();
        let mut sent = Vec::new();
        for t in tasks {
            match t.await {
                Ok(at) => sent.push(at - start),
                Err(e) => panic!("task: {e}"),
            }
        }
        sent.sort();
        let want: Vec<Duration> = [0, 0, 100, 200, 300, 400]
            .into_iter()
            .map(Duration::from_millis)
            .collect();
        for (got, want) in sent.iter().zip(&want) {
            assert!(got.abs_diff(*want) < Duration::from_millis(2), "{sent:?}");
        }
    }

    #[test]
    fn zero_or_invalid_flags_mean_client_go_defaults() {
        for (qps, burst) in [(0.0, 0), (-1.0, 0), (f32::NAN, 0)] {
            let b = TokenBucket::new(qps, burst);
            assert_eq!((b.qps, b.burst), (5.0, 10.0));
        }
        let b = TokenBucket::new(50.0, 100);
        assert_eq!((b.qps, b.burst), (50.0, 100.0));
    }
}
