//! The HTTP endpoints: Prometheus metrics on `--metrics-bind-addr`, `/healthz` and `/readyz`
//! on `--health-bind-addr`. Go-style `:port` addresses mean every interface.
//!
//! Both listen on every interface of a pod, so they are hardened against clients that hold
//! connections without using them: a client has [`HEADER_READ_TIMEOUT`] to send a request's
//! headers (which also ends idle keep-alive connections), a connection lives at most
//! [`CONNECTION_LIFETIME`] (a client that never reads its response), at most
//! [`MAX_CONNECTIONS`] are served at once, and a failing `accept` (out of file descriptors:
//! `EMFILE`) is retried after a pause that grows to [`ACCEPT_BACKOFF_MAX`] instead of
//! spinning a core.
//!
//! At the cap a new connection is served and the least recently used one (the one whose last
//! request, or accept, is oldest) is closed: clients holding idle keep-alive connections can't
//! keep the kubelet's next `/healthz` or `/readyz` probe out (refusing the new connection
//! would fail the liveness probe and restart a healthy pod). A probe sends its request as soon
//! as it is connected, so it is the most recently used connection while it is answered.

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http_body_util::Full;
use hyper::body::Bytes;
use hyper::{Request, Response, StatusCode};
use prometheus_client::registry::Registry;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use crate::observe::health::Health;
use crate::{Error, Result};

/// Connections served at once by one endpoint server. Prometheus and the kubelet's probes
/// need a few; the rest of the budget absorbs bursts.
pub const MAX_CONNECTIONS: usize = 64;
/// How long a client may take to send a request's headers, and how long a keep-alive
/// connection may sit idle before its next request.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(5);
/// The longest one connection may live, requests and all.
pub(crate) const CONNECTION_LIFETIME: Duration = Duration::from_secs(60);
/// First pause after a failed `accept`; doubled after each further failure.
pub(crate) const ACCEPT_BACKOFF_MIN: Duration = Duration::from_millis(10);
/// Longest pause after failed `accept`s.
pub(crate) const ACCEPT_BACKOFF_MAX: Duration = Duration::from_secs(1);

/// Parses `:9643`, `0.0.0.0:9643`, `127.0.0.1:0`.
pub(crate) fn parse_bind_addr(addr: &str) -> Result<SocketAddr, String> {
    let full = if addr.starts_with(':') {
        format!("0.0.0.0{addr}")
    } else {
        addr.to_string()
    };
    full.parse()
        .map_err(|e| format!("invalid bind address {addr:?}: {e}"))
}

/// What a server answers.
#[derive(Clone)]
pub enum Endpoints {
    /// `/metrics`; in shadow mode `/shadow` and `/shadow.json`; the prober's
    /// `/debug/decisions` (its decision records, [`crate::decisions`]).
    Metrics(
        Arc<Mutex<Registry>>,
        Option<Arc<crate::shadow::Shadow>>,
        Option<Arc<crate::decisions::DecisionLog>>,
    ),
    /// `/healthz`, `/readyz`.
    Health(Arc<Health>),
}

/// The answer to `GET path?query`.
fn respond(endpoints: &Endpoints, path: &str, query: Option<&str>) -> Response<Full<Bytes>> {
    let (status, ctype, body) = match (endpoints, path) {
        (Endpoints::Metrics(_, _, Some(decisions)), "/debug/decisions") => {
            let (found, body) = decisions.render(query);
            let status = if found {
                StatusCode::OK
            } else {
                StatusCode::NOT_FOUND
            };
            (status, "application/json", body)
        }
        (Endpoints::Metrics(_, Some(shadow), _), "/shadow") => (
            StatusCode::OK,
            "text/plain; charset=utf-8",
            shadow.render_text(&crate::shadow::Selection::parse(query)),
        ),
        (Endpoints::Metrics(_, Some(shadow), _), "/shadow.json") => (
            StatusCode::OK,
            "application/json",
            shadow.render_json(&crate::shadow::Selection::parse(query)),
        ),
        (Endpoints::Metrics(registry, _, _), "/metrics") => {
            let mut text = String::new();
            let registry = registry
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            match prometheus_client::encoding::text::encode(&mut text, &registry) {
                Ok(()) => (
                    StatusCode::OK,
                    "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    text,
                ),
                Err(e) => (
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "text/plain",
                    format!("encoding metrics: {e}"),
                ),
            }
        }
        (Endpoints::Health(h), "/healthz") => {
            if h.is_alive() {
                (StatusCode::OK, "text/plain", "ok".into())
            } else {
                (
                    StatusCode::SERVICE_UNAVAILABLE,
                    "text/plain",
                    "a critical task died".into(),
                )
            }
        }
        (Endpoints::Health(h), "/readyz") => match (h.is_alive(), h.readiness()) {
            (false, _) => (
                StatusCode::SERVICE_UNAVAILABLE,
                "text/plain",
                "a critical task died".into(),
            ),
            (true, Err(reason)) => (StatusCode::SERVICE_UNAVAILABLE, "text/plain", reason),
            (true, Ok(())) => {
                let body = match h.role() {
                    crate::observe::health::Role::Alone => "ok",
                    crate::observe::health::Role::Leader => "ok: leader",
                    crate::observe::health::Role::Follower => "ok: follower (idle until it leads)",
                };
                (StatusCode::OK, "text/plain", body.into())
            }
        },
        _ => (StatusCode::NOT_FOUND, "text/plain", "not found".into()),
    };
    let mut resp = Response::new(Full::new(Bytes::from(body)));
    *resp.status_mut() = status;
    if let Ok(v) = http::HeaderValue::from_str(ctype) {
        resp.headers_mut().insert(http::header::CONTENT_TYPE, v);
    }
    resp
}

/// How many connections an endpoint server serves and for how long.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    /// Connections served at once.
    pub(crate) max_connections: usize,
    /// Time to send a request's headers (and idle time between keep-alive requests).
    pub(crate) header_read_timeout: Duration,
    /// Life of one connection.
    pub(crate) connection_lifetime: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_connections: MAX_CONNECTIONS,
            header_read_timeout: HEADER_READ_TIMEOUT,
            connection_lifetime: CONNECTION_LIFETIME,
        }
    }
}

/// The connections being served: when each was last used, and how to close it.
#[derive(Default)]
struct Served {
    next_id: u64,
    conns: HashMap<u64, (Instant, CancellationToken)>,
}

impl Served {
    /// Registers a new connection; at `max` first closes the least recently used one (and
    /// says so).
    fn admit(&mut self, max: usize) -> (u64, CancellationToken, bool) {
        let mut evicted = false;
        if self.conns.len() >= max
            && let Some(lru) = self
                .conns
                .iter()
                .min_by_key(|(id, (used, _))| (*used, **id))
                .map(|(id, _)| *id)
            && let Some((_, close)) = self.conns.remove(&lru)
        {
            close.cancel();
            evicted = true;
        }
        self.next_id += 1;
        let close = CancellationToken::new();
        self.conns
            .insert(self.next_id, (Instant::now(), close.clone()));
        (self.next_id, close, evicted)
    }

    /// Connection `id` just received a request.
    fn used(&mut self, id: u64) {
        if let Some((used, _)) = self.conns.get_mut(&id) {
            *used = Instant::now();
        }
    }
}

/// The registry; a panic while it was held leaves nothing half-written worth refusing for.
fn lock(served: &Mutex<Served>) -> std::sync::MutexGuard<'_, Served> {
    served
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Where connections come from: a TCP listener, or in tests an in-memory one.
pub(crate) trait Acceptor: Send + 'static {
    /// One accepted connection.
    type Conn: AsyncRead + AsyncWrite + Unpin + Send + 'static;
    /// The next connection, or why none could be accepted.
    fn accept(&mut self) -> impl Future<Output = std::io::Result<Self::Conn>> + Send;
}

impl Acceptor for TcpListener {
    type Conn = TcpStream;
    async fn accept(&mut self) -> std::io::Result<TcpStream> {
        TcpListener::accept(self).await.map(|(stream, _)| stream)
    }
}

/// Binds `addr` now (so a bad address fails at start) and serves until `shutdown`.
pub async fn serve(
    what: &'static str,
    addr: &str,
    endpoints: Endpoints,
    shutdown: CancellationToken,
) -> Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let bind_err = |source| Error::Bind {
        what,
        addr: addr.to_string(),
        source,
    };
    let sock = parse_bind_addr(addr)
        .map_err(|e| bind_err(std::io::Error::new(std::io::ErrorKind::InvalidInput, e)))?;
    let listener = TcpListener::bind(sock).await.map_err(bind_err)?;
    let local = listener.local_addr().map_err(bind_err)?;
    let task = tokio::spawn(accept_loop(
        what,
        listener,
        endpoints,
        Limits::default(),
        shutdown,
    ));
    Ok((local, task))
}

/// Accepts and serves connections from `acceptor` within `limits` until `shutdown`.
pub(crate) async fn accept_loop<A: Acceptor>(
    what: &'static str,
    mut acceptor: A,
    endpoints: Endpoints,
    limits: Limits,
    shutdown: CancellationToken,
) {
    let served = Arc::new(Mutex::new(Served::default()));
    let mut backoff: Option<Duration> = None;
    let mut evictions: u64 = 0;
    loop {
        let accepted = tokio::select! {
            _ = shutdown.cancelled() => return,
            a = acceptor.accept() => a,
        };
        let conn = match accepted {
            Ok(conn) => {
                backoff = None;
                conn
            }
            Err(error) => {
                // The usual cause is running out of file descriptors, which retrying at once
                // cannot fix: pause, growing the pause while it keeps failing.
                let pause = backoff.map_or(ACCEPT_BACKOFF_MIN, |b| {
                    b.saturating_mul(2).min(ACCEPT_BACKOFF_MAX)
                });
                if backoff.is_none() {
                    warn!(server = what, %error, "accepting a connection failed; pausing before the next accept");
                } else {
                    debug!(server = what, %error, ?pause, "accepting a connection failed again");
                }
                backoff = Some(pause);
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep(pause) => {}
                }
                continue;
            }
        };
        let (id, close, evicted) = lock(&served).admit(limits.max_connections);
        if evicted {
            evictions += 1;
            if evictions.is_power_of_two() {
                warn!(
                    server = what,
                    evictions,
                    max = limits.max_connections,
                    "too many connections: closing the least recently used for each new one"
                );
            }
        }
        let endpoints = endpoints.clone();
        let served = served.clone();
        tokio::spawn(async move {
            let svc = hyper::service::service_fn({
                let served = served.clone();
                move |req: Request<hyper::body::Incoming>| {
                    lock(&served).used(id);
                    let resp = respond(&endpoints, req.uri().path(), req.uri().query());
                    async move { Ok::<_, std::convert::Infallible>(resp) }
                }
            });
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(limits.header_read_timeout);
            let conn_served = builder.serve_connection(hyper_util::rt::TokioIo::new(conn), svc);
            // Errors are the client's (a timeout, a reset): nothing to report.
            tokio::select! {
                _ = close.cancelled() => {}
                _ = tokio::time::timeout(limits.connection_lifetime, conn_served) => {}
            }
            lock(&served).conns.remove(&id);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::observe::health::Role;
    use http_body_util::BodyExt;

    async fn get(endpoints: &Endpoints, path: &str) -> (StatusCode, String) {
        let (path, query) = match path.split_once('?') {
            Some((path, query)) => (path, Some(query)),
            None => (path, None),
        };
        let resp = respond(endpoints, path, query);
        let status = resp.status();
        let body = resp
            .into_body()
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        (status, String::from_utf8_lossy(&body).into_owned())
    }

    #[tokio::test]
    async fn readyz_reports_sync_and_leadership_and_healthz_reports_dead_tasks() {
        let health = Arc::new(Health::default());
        let ep = Endpoints::Health(health.clone());
        assert_eq!(
            get(&ep, "/readyz").await,
            (StatusCode::SERVICE_UNAVAILABLE, "caches not synced".into())
        );
        health.set_not_ready("caches not synced: machines (watch failing for 12s)");
        assert_eq!(
            get(&ep, "/readyz").await,
            (
                StatusCode::SERVICE_UNAVAILABLE,
                "caches not synced: machines (watch failing for 12s)".into()
            )
        );
        health.set_ready(true);
        assert_eq!(get(&ep, "/readyz").await, (StatusCode::OK, "ok".into()));
        health.set_role(Role::Follower);
        assert!(get(&ep, "/readyz").await.1.starts_with("ok: follower"));
        health.set_role(Role::Leader);
        assert_eq!(get(&ep, "/readyz").await.1, "ok: leader");
        assert_eq!(get(&ep, "/healthz").await.0, StatusCode::OK);
        health.set_alive(false);
        assert_eq!(
            get(&ep, "/healthz").await.0,
            StatusCode::SERVICE_UNAVAILABLE
        );
        assert_eq!(get(&ep, "/readyz").await.0, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(get(&ep, "/nope").await.0, StatusCode::NOT_FOUND);
    }

    /// Hands out the connections a test sends it; none pending means wait.
    struct ChannelAcceptor(tokio::sync::mpsc::UnboundedReceiver<tokio::io::DuplexStream>);

    impl Acceptor for ChannelAcceptor {
        type Conn = tokio::io::DuplexStream;
        async fn accept(&mut self) -> std::io::Result<tokio::io::DuplexStream> {
            match self.0.recv().await {
                Some(conn) => Ok(conn),
                None => std::future::pending().await,
            }
        }
    }

    /// Fails like a process out of file descriptors, `limit` times, then waits forever.
    struct FailingAcceptor {
        calls: Arc<std::sync::atomic::AtomicUsize>,
        limit: usize,
    }

    impl Acceptor for FailingAcceptor {
        type Conn = tokio::io::DuplexStream;
        async fn accept(&mut self) -> std::io::Result<tokio::io::DuplexStream> {
            let n = self.calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            if n >= self.limit {
                std::future::pending::<()>().await;
            }
            // Give the runtime a turn, as a real failing accept does.
            tokio::task::yield_now().await;
            Err(std::io::Error::from_raw_os_error(libc::EMFILE))
        }
    }

    /// Sends `GET path` on a new in-memory connection; the answer's status line, or `None`
    /// when the server closed the connection without answering.
    async fn request(
        tx: &tokio::sync::mpsc::UnboundedSender<tokio::io::DuplexStream>,
        path: &str,
    ) -> Option<String> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (mut client, server) = tokio::io::duplex(64 * 1024);
        tx.send(server).ok()?;
        let req = format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n");
        client.write_all(req.as_bytes()).await.ok()?;
        let mut answer = Vec::new();
        client.read_to_end(&mut answer).await.ok()?;
        let text = String::from_utf8_lossy(&answer);
        text.lines()
            .next()
            .filter(|l| !l.is_empty())
            .map(str::to_string)
    }

    /// Whether the server closed `client` (end of stream, or an error).
    async fn closed(client: &mut tokio::io::DuplexStream) -> bool {
        use tokio::io::AsyncReadExt;
        let mut buf = [0u8; 16];
        matches!(
            tokio::time::timeout(Duration::from_millis(1), client.read(&mut buf)).await,
            Ok(Ok(0) | Err(_))
        )
    }

    #[tokio::test(start_paused = true)]
    async fn idle_connections_end_at_the_header_timeout_and_the_cap_closes_the_least_recently_used()
    {
        let health = Arc::new(Health::default());
        health.set_ready(true);
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let limits = Limits {
            max_connections: 4,
            header_read_timeout: Duration::from_secs(5),
            connection_lifetime: Duration::from_secs(60),
        };
        let shutdown = CancellationToken::new();
        tokio::spawn(accept_loop(
            "test",
            ChannelAcceptor(rx),
            Endpoints::Health(health),
            limits,
            shutdown.clone(),
        ));
        assert_eq!(
            request(&tx, "/healthz").await.as_deref(),
            Some("HTTP/1.1 200 OK")
        );
        // That connection's task ends (and gives its permit back).
        tokio::time::sleep(Duration::from_millis(100)).await;
        // A flood of clients that connect and send nothing.
        let mut idle = Vec::new();
        for _ in 0..10 {
            let (client, server) = tokio::io::duplex(1024);
            tx.send(server).expect("send");
            idle.push(client);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        // Each new one closed the least recently used: the last four hold the cap.
        let mut open = Vec::new();
        for client in &mut idle {
            open.push(!closed(client).await);
        }
        assert_eq!(open, [[false; 6].as_slice(), &[true; 4]].concat());
        // A probe is answered at once (closing the oldest idle one), not refused.
        assert_eq!(
            request(&tx, "/healthz").await.as_deref(),
            Some("HTTP/1.1 200 OK")
        );
        assert!(closed(&mut idle[6]).await, "the least recently used");
        // At the header timeout the idle ones are closed and the server answers again.
        tokio::time::sleep(Duration::from_secs(5)).await;
        for client in &mut idle {
            assert!(
                closed(client).await,
                "an idle connection outlived the header timeout"
            );
        }
        assert_eq!(
            request(&tx, "/healthz").await.as_deref(),
            Some("HTTP/1.1 200 OK")
        );
        shutdown.cancel();
    }

    #[tokio::test(start_paused = true)]
    async fn failing_accepts_are_retried_after_a_growing_pause_not_in_a_hot_loop() {
        let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let shutdown = CancellationToken::new();
        tokio::spawn(accept_loop(
            "test",
            FailingAcceptor {
                calls: calls.clone(),
                limit: 100_000,
            },
            Endpoints::Health(Arc::new(Health::default())),
            Limits::default(),
            shutdown.clone(),
        ));
        // In 10 s: pauses of 10, 20, … 640 ms, then 1 s each: about 16 attempts. A hot loop
        // would have used up all 100 000 before the (paused) clock could move.
        tokio::time::sleep(Duration::from_secs(10)).await;
        let n = calls.load(std::sync::atomic::Ordering::SeqCst);
        assert!((10..=20).contains(&n), "{n} accept attempts in 10 s");
        shutdown.cancel();
    }

    #[test]
    fn go_style_bind_addresses_parse() {
        assert_eq!(parse_bind_addr(":9643").map(|a| a.port()), Ok(9643));
        assert!(parse_bind_addr("127.0.0.1:0").is_ok());
        assert!(parse_bind_addr("nonsense").is_err());
    }
}
