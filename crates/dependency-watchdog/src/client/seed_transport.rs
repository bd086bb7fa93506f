//! The seed client's HTTP stack under kube's: how a seed that went silent is noticed.
//!
//! Every cache, decision and write comes from one kube-apiserver. Its network can fail without
//! a word: a connection left half-open when a node or load balancer died, an apiserver that
//! stopped answering, a list page that hangs or trickles mid-body. kube's own stack notices
//! none of these before its 295 s read timeout, and a watch frozen that long looks "in sync"
//! to everything reading its cache. Here, under the same layers kube would put (base URI,
//! auth, extra headers):
//!
//! - **TCP keepalive** as Go's dialer sets it ([`TCP_KEEPALIVE_IDLE`], [`TCP_KEEPALIVE_INTERVAL`],
//!   [`TCP_KEEPALIVE_PROBES`]): a connection to a peer that is gone ends;
//! - **HTTP/2 with client-go's connection health check**: kube-apiserver negotiates h2 over
//!   ALPN (as it does with client-go); a PING goes out after [`H2_PING_AFTER`] without a
//!   frame and the connection is closed when no answer comes within [`H2_PING_TIMEOUT`]. A
//!   quiet watch on a live connection is answered and kept, however long nothing changes; a
//!   silent connection fails every request on it within 45 s;
//! - **a deadline on every body that is not a watch** ([`SEED_BODY_DEADLINE`] after its
//!   headers): a list page that hangs or trickles fails with [`SeedBodyTimedOut`] instead of
//!   holding a re-list, and the old cache "synced", for good.
//!
//! [`is_silence`] tells a cache that an error means the seed said nothing for 30 s or more;
//! a synced cache turns stale on the first such error ([`crate::client::cache`]), where other errors
//! must repeat first. docs/faults.md states the resulting bounds.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper_timeout::TimeoutConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use kube::Config;
use kube::client::ConfigExt;

use super::guarded_body::{BodyGuard, GuardLayer, GuardResponses, GuardedBody};

/// Idle time before a seed connection's first TCP keepalive probe (Go's `net.Dialer` default).
pub(crate) const TCP_KEEPALIVE_IDLE: Duration = Duration::from_secs(15);
/// Time between unanswered TCP keepalive probes (Go's default).
pub(crate) const TCP_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(15);
/// Unanswered probes before the kernel ends the connection (Go's default; Linux's too).
pub(crate) const TCP_KEEPALIVE_PROBES: u32 = 9;
/// Time without a frame from the seed after which an HTTP/2 PING is sent (client-go's
/// `ReadIdleTimeout`).
pub(crate) const H2_PING_AFTER: Duration = Duration::from_secs(30);
/// How long the seed has to answer that PING before the connection is closed, failing every
/// request on it (client-go's `PingTimeout`).
pub(crate) const H2_PING_TIMEOUT: Duration = Duration::from_secs(15);
/// How long the body of a response that is not a watch may take after its headers.
///
/// kube-apiserver itself ends any request but a watch after its `--request-timeout` (60 s by
/// default, which gardenlet keeps), so a body still flowing after that is not coming from a
/// healthy apiserver. The largest bodies the watchdog reads are its list pages of 500
/// Clusters, each embedding a Shoot, a Seed and a CloudProfile: with 5,000 such Clusters of
/// 124 KB a page of 500 (62 MB) took at most 2.8 s (`cargo run -p dwd-bench --bin
/// cluster-pages`, crates/dwd-bench/results/cluster-pages/).
pub(crate) const SEED_BODY_DEADLINE: Duration = Duration::from_secs(60);

/// Why a seed client could not be built.
#[derive(Debug, thiserror::Error)]
#[error("building the seed client: {0}")]
pub(crate) struct SeedTransportError(String);

/// The HTTP service a seed client is built on: kube's layers over a connection pool with TCP
/// keepalive, HTTP/2 health checks and the body deadline (see the module doc).
pub(crate) fn seed_service(
    config: &Config,
) -> Result<
    impl tower::Service<
        http::Request<kube::client::Body>,
        Response = http::Response<DeadlineBody<hyper::body::Incoming>>,
        Error = tower::BoxError,
        Future = impl Send + 'static,
    > + Clone
    + Send
    + Sync
    + 'static,
    SeedTransportError,
> {
    let building = |e: kube::Error| SeedTransportError(e.to_string());
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_keepalive(Some(TCP_KEEPALIVE_IDLE));
    http.set_keepalive_interval(Some(TCP_KEEPALIVE_INTERVAL));
    http.set_keepalive_retries(Some(TCP_KEEPALIVE_PROBES));
    let tls = config.rustls_client_config().map_err(building)?;
    let mut https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http();
    if let Some(name) = &config.tls_server_name {
        let name = rustls::pki_types::ServerName::try_from(name.clone())
            .map_err(|e| SeedTransportError(format!("tls-server-name {name:?}: {e}")))?;
        https = https.with_server_name_resolver(hyper_rustls::FixedServerNameResolver::new(name));
    }
    let connector = timeout_connector(https, http, config);
    let http_client = hyper_util::client::legacy::Builder::new(TokioExecutor::new())
        .timer(TokioTimer::new())
        .pool_timer(TokioTimer::new())
        .http2_keep_alive_interval(Some(H2_PING_AFTER))
        .http2_keep_alive_timeout(H2_PING_TIMEOUT)
        .http2_keep_alive_while_idle(true)
        .build::<_, kube::client::Body>(connector);
    Ok(tower::ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(config.auth_layer().map_err(building)?)
        .layer(config.extra_headers_layer().map_err(building)?)
        .layer(GuardLayer(BodyDeadline {
            deadline: SEED_BODY_DEADLINE,
        }))
        .map_err(tower::BoxError::from)
        .service(http_client))
}

/// `https` over `http`, speaking HTTP/1 or HTTP/2 as the server offers (ALPN), under the
/// connect, read and write timeouts of `config` (as kube's own client builder sets them).
/// The seed's and the shoots' clients both connect so.
pub(crate) fn timeout_connector(
    https: hyper_rustls::HttpsConnectorBuilder<hyper_rustls::builderstates::WantsProtocols1>,
    http: HttpConnector,
    config: &Config,
) -> TimeoutConnector<hyper_rustls::HttpsConnector<HttpConnector>> {
    let mut connector =
        TimeoutConnector::new(https.enable_http1().enable_http2().wrap_connector(http));
    connector.set_connect_timeout(config.connect_timeout);
    connector.set_read_timeout(config.read_timeout);
    connector.set_write_timeout(config.write_timeout);
    connector
}

/// The error a body fails with when it has not ended [`SEED_BODY_DEADLINE`] after its headers.
#[derive(Debug, thiserror::Error)]
#[error(
    "the seed's response body did not end within {}s of its headers (a list hanging or trickling mid-body)",
    .0.as_secs()
)]
pub(crate) struct SeedBodyTimedOut(Duration);

/// Whether `error` means the seed said nothing for a long time (30 s or more): no headers
/// within the client's bound, an HTTP/2 PING unanswered, a TCP or socket read timeout, a body
/// past its deadline. Anything else (refused, reset, 5xx, 429, 410) is not silence.
pub(crate) fn is_silence(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut next = Some(error);
    while let Some(e) = next {
        if e.is::<SeedBodyTimedOut>() || e.is::<tower::timeout::error::Elapsed>() {
            return true;
        }
        if let Some(e) = e.downcast_ref::<hyper::Error>()
            && e.is_timeout()
        {
            return true;
        }
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            if io.kind() == std::io::ErrorKind::TimedOut {
                return true;
            }
            // An io::Error's `source` skips the error it wraps (kube wraps a watch body's
            // errors so); look at that one too.
            if let Some(inner) = io.get_ref() {
                next = Some(inner);
                continue;
            }
        }
        next = e.source();
    }
    false
}

/// Puts [`SEED_BODY_DEADLINE`] on the body of every response that is not a watch, from its
/// headers on (through [`GuardLayer`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct BodyDeadline {
    pub(crate) deadline: Duration,
}

impl GuardResponses for BodyDeadline {
    type Guard = DeadlineGuard;
    fn guard(&self, uri: &http::Uri) -> DeadlineGuard {
        let deadline = (!is_watch(uri)).then_some(self.deadline);
        DeadlineGuard {
            limit: self.deadline,
            timer: deadline.map(|limit| Box::pin(tokio::time::sleep(limit))),
        }
    }
}

/// Whether `uri` asks for a watch (`watch=true` or `watch=1`, as kube and client-go send it):
/// a watch's body is a stream that lasts until the server's `timeoutSeconds`.
fn is_watch(uri: &http::Uri) -> bool {
    uri.query().is_some_and(|query| {
        query
            .split('&')
            .any(|pair| pair == "watch=true" || pair == "watch=1")
    })
}

/// A response body's deadline: it fails with [`SeedBodyTimedOut`] once the deadline passes.
pub(crate) struct DeadlineGuard {
    // The deadline after the headers, for the error's text.
    limit: Duration,
    // Started when the headers arrived; `None` for a watch. Boxed: the body stays `Unpin`.
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl BodyGuard for DeadlineGuard {
    fn poll_expired(&mut self, cx: &mut Context<'_>) -> Poll<tower::BoxError> {
        let Some(timer) = self.timer.as_mut() else {
            return Poll::Pending;
        };
        let limit = self.limit;
        timer
            .as_mut()
            .poll(cx)
            .map(|()| Box::new(SeedBodyTimedOut(limit)) as tower::BoxError)
    }
}

/// A seed response body under its deadline.
pub(crate) type DeadlineBody<B> = GuardedBody<B, DeadlineGuard>;

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use http_body_util::{BodyExt, StreamBody};
    use std::convert::Infallible;
    use tower::{Service, ServiceExt};

    type Frames = futures::stream::BoxStream<'static, Result<http_body::Frame<Bytes>, Infallible>>;

    /// A service answering every request with headers at once and then a body that sends one
    /// frame and never ends (a list hanging mid-body; or a quiet watch).
    fn hanging_bodies() -> super::super::guarded_body::Guarded<
        impl Service<
            http::Request<()>,
            Response = http::Response<StreamBody<Frames>>,
            Error = Infallible,
            Future = impl Send + 'static,
        >,
        BodyDeadline,
    > {
        use tower::Layer;
        GuardLayer(BodyDeadline {
            deadline: SEED_BODY_DEADLINE,
        })
        .layer(tower::service_fn(|_req: http::Request<()>| async {
            let first = futures::stream::iter([Ok(http_body::Frame::data(Bytes::from_static(
                b"{\"items\":[",
            )))]);
            let frames: Frames =
                Box::pin(futures::StreamExt::chain(first, futures::stream::pending()));
            Ok::<_, Infallible>(http::Response::new(StreamBody::new(frames)))
        }))
    }

    async fn get(
        service: &mut (
                 impl Service<
            http::Request<()>,
            Response = http::Response<DeadlineBody<StreamBody<Frames>>>,
            Error = Infallible,
        > + Send
             ),
        uri: &str,
    ) -> DeadlineBody<StreamBody<Frames>> {
        let request = http::Request::get(uri).body(()).expect("request");
        let response = service
            .ready()
            .await
            .expect("ready")
            .call(request)
            .await
            .expect("response");
        response.into_body()
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_that_is_not_a_watch_fails_at_its_deadline_and_a_watch_never_does() {
        let mut service = hanging_bodies();
        let mut list = get(&mut service, "/apis/x/v1/clusters?limit=500").await;
        let started = tokio::time::Instant::now();
        assert!(list.frame().await.expect("first frame").is_ok());
        let error = tokio::time::timeout(2 * SEED_BODY_DEADLINE, list.frame())
            .await
            .expect("the hanging list ends within twice its deadline")
            .expect("an end")
            .expect_err("the hanging list fails");
        assert_eq!(started.elapsed(), SEED_BODY_DEADLINE);
        assert!(is_silence(error.as_ref()), "{error}");
        assert!(error.to_string().contains("60s"), "{error}");

        for uri in [
            "/api/v1/secrets?watch=true&resourceVersion=5",
            "/api/v1/secrets?fieldSelector=a&watch=1",
        ] {
            let mut watch = get(&mut service, uri).await;
            assert!(watch.frame().await.expect("first frame").is_ok());
            let quiet = tokio::time::timeout(10 * SEED_BODY_DEADLINE, watch.frame()).await;
            assert!(quiet.is_err(), "{uri}: a quiet watch was cut");
        }
        // `watch` must be a parameter of its own, not part of another's value.
        assert!(!is_watch(
            &"/api/v1/pods?fieldSelector=watch=true"
                .parse()
                .expect("uri")
        ));
    }

    #[test]
    fn silence_is_told_from_other_errors() {
        use kube::runtime::watcher;
        let body_timed_out = || Box::new(SeedBodyTimedOut(SEED_BODY_DEADLINE)) as tower::BoxError;
        let silences: Vec<(&str, Box<dyn std::error::Error + 'static>)> = vec![
            (
                "no headers within the client's bound",
                Box::new(watcher::Error::WatchStartFailed(kube::Error::Service(
                    Box::new(tower::timeout::error::Elapsed::new()),
                ))),
            ),
            (
                "a list's body past its deadline",
                Box::new(watcher::Error::InitialListFailed(kube::Error::Service(
                    body_timed_out(),
                ))),
            ),
            (
                "a watch body's error, wrapped in an io::Error as kube does",
                Box::new(watcher::Error::WatchFailed(kube::Error::ReadEvents(
                    std::io::Error::other(body_timed_out()),
                ))),
            ),
            (
                "a socket timed out (TCP keepalive, read timeout)",
                Box::new(watcher::Error::WatchFailed(kube::Error::ReadEvents(
                    std::io::Error::from(std::io::ErrorKind::TimedOut),
                ))),
            ),
        ];
        for (what, error) in &silences {
            assert!(is_silence(error.as_ref()), "{what}: {error}");
        }
        let gone = kube::core::Status::failure("too old", "Expired").with_code(410);
        let others: Vec<(&str, Box<dyn std::error::Error + 'static>)> = vec![
            (
                "410 Gone",
                Box::new(watcher::Error::WatchError(gone.boxed())),
            ),
            (
                "connection refused",
                Box::new(watcher::Error::WatchStartFailed(kube::Error::Service(
                    Box::new(std::io::Error::from(std::io::ErrorKind::ConnectionRefused)),
                ))),
            ),
            (
                "no resourceVersion",
                Box::new(watcher::Error::NoResourceVersion),
            ),
        ];
        for (what, error) in &others {
            assert!(!is_silence(error.as_ref()), "{what}: {error}");
        }
    }
}
