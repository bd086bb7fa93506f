//! The front door of an apiserver: a loopback TCP proxy that clients connect to instead
//! of the apiserver itself, so tests can inject network faults over real sockets.
//!
//! - **open**: bytes are piped to the apiserver untouched (TLS end to end, client
//!   certificates reach the apiserver, so authentication and RBAC are real);
//! - **closed** (apiserver stopped): the listener is dropped, connections are refused;
//! - **throttled**: the front door terminates TLS itself with the environment's serving
//!   certificate and answers every HTTP request with the apiserver's own
//!   `429 TooManyRequests` Status, with `Retry-After` ([`FrontDoorState::set_retry_after`];
//!   `0` unless set: a client that honours it, as client-go does, retries at once and gives
//!   up within one call), and closes the connection, so that a retry connects anew and
//!   passes once the throttling has ended ([`FrontDoorState::throttle_next`] throttles only
//!   the next few requests);
//! - **latency**: every new connection waits before it is piped through (a slow shoot);
//! - **hang after handshake**: the front door completes the TLS handshake itself and then
//!   reads whatever the client sends without ever answering (a peer that accepted the
//!   connection and went silent);
//! - **partitioned**: no byte moves in either direction, on new connections and on the ones
//!   already open (a network partition: nothing is refused or reset, everything waits); once
//!   lifted, held connections carry on where they stopped, as TCP would after a partition
//!   healed;
//! - **conflict on first write**: the front door terminates TLS and forwards HTTP requests to
//!   the apiserver as the environment's admin; the first `PATCH` or `PUT` to each object is
//!   preceded by a write of the front door's own to that object (a concurrent writer: the
//!   object gets a newer `resourceVersion`) and answered with the apiserver's
//!   `409 Conflict` Status; later writes to the object pass;
//! - **trickled bodies**: the front door terminates TLS and forwards HTTP requests to the
//!   apiserver as the environment's admin; a response's headers are sent at once and its body
//!   then drips out in small pieces with a pause before each ([`Trickle`]): a slow link or a
//!   peer that answers byte by byte, which no read timeout notices.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;

use crate::TestEnvError;
use crate::pki::CertAndKey;

/// The body kube-apiserver sends with a 429 (the Status of `apierrors.NewTooManyRequests`).
fn too_many_requests_body(retry_after: u64) -> String {
    format!(
        r#"{{"kind":"Status","apiVersion":"v1","metadata":{{}},"status":"Failure","message":"Too many requests, please try again later.","reason":"TooManyRequests","details":{{"retryAfterSeconds":{retry_after}}},"code":429}}"#
    )
}

/// [`FrontDoorState`]'s `throttled` value for "every request".
const THROTTLE_ALL: u64 = u64::MAX;
/// [`FrontDoorState`]'s `retry_after` value for "no `Retry-After` header".
const NO_RETRY_AFTER: u64 = u64::MAX;

/// The body kube-apiserver sends with a 409 for a stale `resourceVersion` precondition.
const CONFLICT_BODY: &str = r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"Operation cannot be fulfilled: the object has been modified; please apply your changes to the latest version and try again","reason":"Conflict","details":{},"code":409}"#;

/// The annotation the front door's own write sets on an object before it answers 409.
pub const CONFLICT_BUMP_ANNOTATION: &str = "dwd-testenv.front-door/concurrent-write";

/// Shared switches of one front door.
#[derive(Debug, Default)]
pub struct FrontDoorState {
    /// Requests still to answer with 429 ([`THROTTLE_ALL`]: every one).
    throttled: AtomicU64,
    /// Seconds of `Retry-After` on a 429 ([`NO_RETRY_AFTER`]: no header).
    retry_after: AtomicU64,
    latency_ms: AtomicU64,
    throttled_responses: AtomicU64,
    connections: AtomicU64,
    hang_after_handshake: AtomicBool,
    hung_connections: AtomicU64,
    partitioned: AtomicBool,
    partition_changed: tokio::sync::Notify,
    conflict: Mutex<Option<ConflictMode>>,
    conflicts_sent: AtomicU64,
    trickle: Mutex<Option<(Trickle, Arc<rustls::ClientConfig>)>>,
    trickled_responses: AtomicU64,
    drops: AtomicU64,
    dropped: tokio::sync::Notify,
}

/// How trickled-bodies mode delivers a response body (see [`FrontDoorState::set_trickle`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Trickle {
    /// The pause before each piece of the body.
    pub every: Duration,
    /// How the body is cut into pieces.
    pub pieces: TricklePieces,
    /// Only responses to requests whose path (query included) contains this are trickled;
    /// `None`: every response.
    pub path_contains: Option<String>,
}

/// How a trickled body is cut into pieces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TricklePieces {
    /// Pieces of at most this many bytes, each after a pause of [`Trickle::every`]: a body of
    /// `n` bytes takes `ceil(n / bytes) × every`, however long that is.
    Bytes(usize),
    /// The whole body is read from the apiserver first, then cut into as many pieces as there
    /// are pauses of [`Trickle::every`] in this duration: the last byte arrives this long
    /// after the headers, whatever the body's size (for scenarios that need a known delay on
    /// a list whose size they do not control).
    Over(Duration),
}

impl Trickle {
    /// `bytes` every `every`, on every response.
    pub fn bytes(bytes: usize, every: Duration) -> Trickle {
        Trickle {
            every,
            pieces: TricklePieces::Bytes(bytes),
            path_contains: None,
        }
    }

    /// The body spread over `total` in pieces 100 ms apart, on every response.
    pub fn over(total: Duration) -> Trickle {
        Trickle {
            every: Duration::from_millis(100),
            pieces: TricklePieces::Over(total),
            path_contains: None,
        }
    }

    /// Only responses to requests whose path contains `fragment`.
    pub fn on_paths_containing(mut self, fragment: &str) -> Trickle {
        self.path_contains = Some(fragment.to_string());
        self
    }
}

/// What conflict-on-first-write mode needs: how to reach the apiserver as the admin, and the
/// objects written so far.
#[derive(Debug)]
struct ConflictMode {
    upstream: Arc<rustls::ClientConfig>,
    written: HashSet<String>,
}

impl FrontDoorState {
    /// Answer every request with 429 (true) or pass through (false).
    pub fn set_throttled(&self, on: bool) {
        self.throttled
            .store(if on { THROTTLE_ALL } else { 0 }, Ordering::SeqCst);
    }
    /// Answer the next `n` requests (each on a connection of its own) with 429, then pass
    /// through again.
    pub fn throttle_next(&self, n: u64) {
        self.throttled
            .store(n.min(THROTTLE_ALL - 1), Ordering::SeqCst);
    }
    /// The `Retry-After` of a 429 in whole seconds (`None`: no header). Default `Some(0)`.
    pub fn set_retry_after(&self, seconds: Option<u32>) {
        // Stored shifted by one, so that the zeroed default means `Some(0)`.
        let stored = seconds.map_or(NO_RETRY_AFTER, |s| u64::from(s) + 1);
        self.retry_after.store(stored, Ordering::SeqCst);
    }
    fn retry_after(&self) -> Option<u64> {
        match self.retry_after.load(Ordering::SeqCst) {
            NO_RETRY_AFTER => None,
            0 => Some(0),
            shifted => Some(shifted - 1),
        }
    }
    /// Takes one throttled answer for a new connection, if any is left.
    fn take_throttled(&self) -> bool {
        self.throttled
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |left| match left {
                0 => None,
                THROTTLE_ALL => Some(THROTTLE_ALL),
                n => Some(n - 1),
            })
            .is_ok()
    }
    /// Delay applied to every new connection before it is piped through.
    pub fn set_latency(&self, latency: Duration) {
        self.latency_ms.store(
            u64::try_from(latency.as_millis()).unwrap_or(u64::MAX),
            Ordering::SeqCst,
        );
    }
    /// How many 429 responses this front door has sent.
    pub fn throttled_responses(&self) -> u64 {
        self.throttled_responses.load(Ordering::SeqCst)
    }
    /// How many connections this front door has accepted.
    pub fn connections(&self) -> u64 {
        self.connections.load(Ordering::SeqCst)
    }
    /// New connections complete the TLS handshake and then never get an answer (true), or
    /// are served as before (false). Connections already hanging stay so until the client
    /// closes them.
    pub fn set_hang_after_handshake(&self, on: bool) {
        self.hang_after_handshake.store(on, Ordering::SeqCst);
    }
    /// How many connections were left hanging after their TLS handshake.
    pub fn hung_connections(&self) -> u64 {
        self.hung_connections.load(Ordering::SeqCst)
    }
    /// Stops (true) or resumes (false) every byte through this front door, on open and new
    /// connections alike.
    pub fn set_partitioned(&self, on: bool) {
        self.partitioned.store(on, Ordering::SeqCst);
        self.partition_changed.notify_waiters();
    }
    /// Whether the front door is partitioned now.
    pub fn partitioned(&self) -> bool {
        self.partitioned.load(Ordering::SeqCst)
    }
    /// Turns conflict-on-first-write mode on for new connections, reaching the apiserver with
    /// `upstream` (a client configuration that trusts its serving certificate and presents
    /// an identity allowed to do what the clients do), or off (`None`). Turning it on again
    /// forgets which objects were written.
    pub fn set_conflict_on_first_write(&self, upstream: Option<Arc<rustls::ClientConfig>>) {
        *self.conflict.lock().unwrap_or_else(|e| e.into_inner()) =
            upstream.map(|upstream| ConflictMode {
                upstream,
                written: HashSet::new(),
            });
    }
    /// How many writes were answered 409 in conflict-on-first-write mode.
    pub fn conflicts_sent(&self) -> u64 {
        self.conflicts_sent.load(Ordering::SeqCst)
    }

    /// Turns trickled-bodies mode on for new connections, reaching the apiserver with
    /// `upstream` (as in [`Self::set_conflict_on_first_write`]), or off (`None`): new
    /// connections are piped again; responses already trickling go on trickling.
    pub fn set_trickle(&self, trickle: Option<(Trickle, Arc<rustls::ClientConfig>)>) {
        *self.trickle.lock().unwrap_or_else(|e| e.into_inner()) = trickle;
    }

    /// How many response bodies were trickled.
    pub fn trickled_responses(&self) -> u64 {
        self.trickled_responses.load(Ordering::SeqCst)
    }

    fn trickle(&self) -> Option<(Trickle, Arc<rustls::ClientConfig>)> {
        self.trickle
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Closes every connection open through this front door now (as a restarted load
    /// balancer would); new ones are served as the switches say.
    pub fn drop_connections(&self) {
        self.drops.fetch_add(1, Ordering::SeqCst);
        self.dropped.notify_waiters();
    }

    /// Returns once [`Self::drop_connections`] was called after the `seen`th time.
    async fn dropped_after(&self, seen: u64) {
        loop {
            let dropped = self.dropped.notified();
            tokio::pin!(dropped);
            dropped.as_mut().enable();
            if self.drops.load(Ordering::SeqCst) > seen {
                return;
            }
            dropped.await;
        }
    }

    fn conflict_upstream(&self) -> Option<Arc<rustls::ClientConfig>> {
        self.conflict
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map(|m| m.upstream.clone())
    }

    /// Records a write to `object`; true when it is the first one since the mode was turned
    /// on (false when the mode is off).
    fn first_write(&self, object: &str) -> bool {
        self.conflict
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_mut()
            .is_some_and(|m| m.written.insert(object.to_string()))
    }

    /// Returns once the front door is not partitioned.
    async fn unpartitioned(&self) {
        loop {
            let changed = self.partition_changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if !self.partitioned() {
                return;
            }
            changed.await;
        }
    }

    /// Returns once the front door is partitioned.
    async fn partition_starts(&self) {
        loop {
            let changed = self.partition_changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if self.partitioned() {
                return;
            }
            changed.await;
        }
    }
}

/// A running front door listener; dropping or [`FrontDoor::close`] refuses new connections.
pub struct FrontDoor {
    stop: watch::Sender<bool>,
}

impl FrontDoor {
    /// Binds `listen` (SO_REUSEADDR, so it can be re-bound after a close) and serves on the
    /// given runtime.
    pub async fn open(
        listen: SocketAddr,
        backend: SocketAddr,
        state: Arc<FrontDoorState>,
        tls: Arc<rustls::ServerConfig>,
        runtime: &tokio::runtime::Handle,
    ) -> Result<Self, TestEnvError> {
        let socket = tokio::net::TcpSocket::new_v4()
            .map_err(|e| TestEnvError::Io(format!("front door socket for {listen}"), e))?;
        socket
            .set_reuseaddr(true)
            .map_err(|e| TestEnvError::Io(format!("front door SO_REUSEADDR for {listen}"), e))?;
        let listener = runtime
            .spawn(async move {
                socket.bind(listen)?;
                socket.listen(1024)
            })
            .await
            .map_err(|e| TestEnvError::Spawn("front door".into(), e.to_string()))?
            .map_err(|e| TestEnvError::Io(format!("front door bind {listen}"), e))?;
        let (stop, mut stopped) = watch::channel(false);
        let acceptor = TlsAcceptor::from(tls);
        runtime.spawn(async move {
            loop {
                tokio::select! {
                    _ = stopped.changed() => break,
                    accepted = listener.accept() => {
                        let Ok((stream, _)) = accepted else { continue };
                        state.connections.fetch_add(1, Ordering::SeqCst);
                        tokio::spawn(serve(stream, backend, state.clone(), acceptor.clone()));
                    }
                }
            }
        });
        Ok(FrontDoor { stop })
    }

    /// Stops listening: later connections are refused.
    pub fn close(self) {}
}

impl Drop for FrontDoor {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
    }
}

async fn serve(
    client: TcpStream,
    backend: SocketAddr,
    state: Arc<FrontDoorState>,
    acceptor: TlsAcceptor,
) {
    let seen = state.drops.load(Ordering::SeqCst);
    let dropped = state.clone();
    tokio::select! {
        () = serve_connection(client, backend, state, acceptor) => {}
        () = dropped.dropped_after(seen) => {}
    }
}

async fn serve_connection(
    client: TcpStream,
    backend: SocketAddr,
    state: Arc<FrontDoorState>,
    acceptor: TlsAcceptor,
) {
    let _ = client.set_nodelay(true);
    // A partition holds even the handshake: the client sees a connection that never speaks.
    state.unpartitioned().await;
    if state.take_throttled() {
        let Ok(tls) = acceptor.accept(client).await else {
            return;
        };
        let state_for_service = state.clone();
        let service = hyper::service::service_fn(move |_req| {
            state_for_service
                .throttled_responses
                .fetch_add(1, Ordering::SeqCst);
            let retry_after = state_for_service.retry_after();
            async move {
                let mut response = hyper::Response::builder()
                    .status(429)
                    .header("Content-Type", "application/json");
                if let Some(seconds) = retry_after {
                    response = response.header("Retry-After", seconds.to_string());
                }
                response.body(Full::new(Bytes::from(too_many_requests_body(
                    retry_after.unwrap_or(1),
                ))))
            }
        });
        // One request per throttled connection (`Connection: close`): the client's next
        // request connects anew and is throttled or passed as the state says by then.
        let _ = hyper::server::conn::http1::Builder::new()
            .keep_alive(false)
            .serve_connection(hyper_util::rt::TokioIo::new(tls), service)
            .await;
        return;
    }
    if state.hang_after_handshake.load(Ordering::SeqCst) {
        let Ok(mut tls) = acceptor.accept(client).await else {
            return;
        };
        state.hung_connections.fetch_add(1, Ordering::SeqCst);
        let mut sink = [0u8; 4096];
        while let Ok(n) = tls.read(&mut sink).await {
            if n == 0 {
                break;
            }
        }
        return;
    }
    if let Some(upstream) = state.conflict_upstream() {
        serve_terminated(client, backend, state, acceptor, upstream).await;
        return;
    }
    if let Some((_, upstream)) = state.trickle() {
        serve_terminated(client, backend, state, acceptor, upstream).await;
        return;
    }
    let latency = state.latency_ms.load(Ordering::SeqCst);
    if latency > 0 {
        tokio::time::sleep(Duration::from_millis(latency)).await;
    }
    let Ok(upstream) = TcpStream::connect(backend).await else {
        return;
    };
    let _ = upstream.set_nodelay(true);
    pipe(client, upstream, &state).await;
}

/// Copies bytes both ways until both sides closed (each direction passes its end of stream
/// on, as `copy_bidirectional` does); while the front door is partitioned, copies nothing
/// (the sockets stay open, unread).
async fn pipe(client: TcpStream, upstream: TcpStream, state: &FrontDoorState) {
    let (client_read, client_write) = client.into_split();
    let (upstream_read, upstream_write) = upstream.into_split();
    tokio::join!(
        copy_unless_partitioned(client_read, upstream_write, state),
        copy_unless_partitioned(upstream_read, client_write, state),
    );
}

async fn copy_unless_partitioned(
    mut from: impl AsyncRead + Unpin,
    mut to: impl AsyncWrite + Unpin,
    state: &FrontDoorState,
) {
    let mut buf = vec![0u8; 16 << 10];
    loop {
        state.unpartitioned().await;
        let n = tokio::select! {
            read = from.read(&mut buf) => match read {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            },
            // Stop reading: what the peer sends now waits in the socket buffers.
            _ = state.partition_starts() => continue,
        };
        // Bytes already read are held until the partition lifts, then delivered.
        state.unpartitioned().await;
        if to.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    let _ = to.shutdown().await;
}

/// The object a request path names: the path without a subresource (`/scale`, `/status`)
/// and without the query.
fn object_path(path: &str) -> String {
    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let prefix = match segments.first() {
        Some(&"api") => 2,
        Some(&"apis") => 3,
        _ => return path.to_string(),
    };
    let rest = segments.len().saturating_sub(prefix);
    let keep = if segments.get(prefix) == Some(&"namespaces") && rest >= 4 {
        prefix + 4
    } else {
        prefix + rest.min(2)
    };
    format!("/{}", segments[..keep.min(segments.len())].join("/"))
}

type ProxyBody = http_body_util::combinators::BoxBody<Bytes, hyper::Error>;

fn full(body: impl Into<Bytes>) -> ProxyBody {
    Full::new(body.into())
        .map_err(|never: std::convert::Infallible| match never {})
        .boxed()
}

/// A response body delivered as `trickle` says: each piece after a pause.
fn trickled(body: hyper::body::Incoming, trickle: Trickle) -> ProxyBody {
    use hyper::body::Frame;
    enum Source {
        Upstream(hyper::body::Incoming),
        Done,
    }
    let every = trickle.every;
    let init = match trickle.pieces {
        TricklePieces::Bytes(n) => (Source::Upstream(body), Bytes::new(), n.max(1), None),
        TricklePieces::Over(total) => {
            let pauses = (total.as_millis() / every.as_millis().max(1)).max(1);
            (Source::Upstream(body), Bytes::new(), 0, Some(pauses))
        }
    };
    let stream = futures::stream::unfold(
        init,
        move |(mut source, mut pending, mut piece, pauses)| async move {
            loop {
                if !pending.is_empty() {
                    tokio::time::sleep(every).await;
                    let chunk = pending.split_to(piece.min(pending.len()));
                    return Some((Ok(Frame::data(chunk)), (source, pending, piece, pauses)));
                }
                let Source::Upstream(body) = &mut source else {
                    return None;
                };
                if let Some(pauses) = pauses {
                    // The whole body first, so it can be spread over the pauses.
                    let collected = match std::mem::replace(&mut source, Source::Done) {
                        Source::Upstream(body) => body.collect().await,
                        Source::Done => return None,
                    };
                    match collected {
                        Ok(all) => {
                            pending = all.to_bytes();
                            let pauses = usize::try_from(pauses).unwrap_or(usize::MAX);
                            piece = pending.len().div_ceil(pauses).max(1);
                        }
                        Err(e) => return Some((Err(e), (source, pending, piece, None))),
                    }
                    continue;
                }
                match body.frame().await {
                    None => return None,
                    Some(Err(e)) => return Some((Err(e), (Source::Done, pending, piece, pauses))),
                    Some(Ok(frame)) => match frame.into_data() {
                        Ok(data) => pending = data,
                        // Trailers pass as they are.
                        Err(frame) => return Some((Ok(frame), (source, pending, piece, pauses))),
                    },
                }
            }
        },
    );
    http_body_util::StreamBody::new(stream).boxed()
}

/// This client connection's own HTTP/1.1 connection to the apiserver at `backend`, driven on a
/// task of its own; `None` when it cannot be opened (the client's connection is then dropped).
async fn connect_upstream(
    backend: SocketAddr,
    upstream: Arc<rustls::ClientConfig>,
) -> Option<hyper::client::conn::http1::SendRequest<ProxyBody>> {
    let tcp = TcpStream::connect(backend).await.ok()?;
    let _ = tcp.set_nodelay(true);
    let server_name = rustls::pki_types::ServerName::IpAddress(backend.ip().into());
    let up = tokio_rustls::TlsConnector::from(upstream)
        .connect(server_name, tcp)
        .await
        .ok()?;
    let (sender, connection) =
        hyper::client::conn::http1::handshake::<_, ProxyBody>(hyper_util::rt::TokioIo::new(up))
            .await
            .ok()?;
    tokio::spawn(connection);
    Some(sender)
}

/// Conflict-on-first-write and trickled-bodies modes: TLS terminated here, each request
/// forwarded over a connection of our own to the apiserver (one per client connection,
/// HTTP/1.1), the first write to each object answered 409 (when that mode is on) and
/// response bodies trickled (when that one is).
async fn serve_terminated(
    client: TcpStream,
    backend: SocketAddr,
    state: Arc<FrontDoorState>,
    acceptor: TlsAcceptor,
    upstream: Arc<rustls::ClientConfig>,
) {
    let Ok(tls) = acceptor.accept(client).await else {
        return;
    };
    let Some(sender) = connect_upstream(backend, upstream).await else {
        return;
    };
    let sender = Arc::new(tokio::sync::Mutex::new(sender));
    let service = hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
        let (sender, state) = (sender.clone(), state.clone());
        async move {
            let bad_gateway = |e: hyper::Error| {
                hyper::Response::builder()
                    .status(502)
                    .body(full(format!("front door: {e}")))
            };
            let mut sender = sender.lock().await;
            let is_write =
                req.method() == hyper::Method::PATCH || req.method() == hyper::Method::PUT;
            let object = object_path(req.uri().path());
            if is_write && state.first_write(&object) {
                let n = state.conflicts_sent.fetch_add(1, Ordering::SeqCst) + 1;
                let bump = serde_json::json!({
                    "metadata": {"annotations": {CONFLICT_BUMP_ANNOTATION: n.to_string()}}
                });
                let mut request = hyper::Request::patch(object.as_str())
                    .header("Content-Type", "application/merge-patch+json")
                    .header("Accept", "application/json");
                if let Some(host) = req.headers().get(hyper::header::HOST) {
                    request = request.header(hyper::header::HOST, host);
                }
                let Ok(request) = request.body(full(bump.to_string())) else {
                    return hyper::Response::builder()
                        .status(500)
                        .body(full("front door: bad bump request"));
                };
                if let Err(e) = sender.ready().await {
                    return bad_gateway(e);
                }
                match sender.send_request(request).await {
                    Ok(response) => {
                        let _ = response.into_body().collect().await;
                    }
                    Err(e) => return bad_gateway(e),
                }
                // The client's request is not sent; its body is dropped unread.
                return hyper::Response::builder()
                    .status(409)
                    .header("Content-Type", "application/json")
                    .body(full(CONFLICT_BODY));
            }
            let trickle = state.trickle().map(|(t, _)| t).filter(|t| {
                t.path_contains.as_deref().is_none_or(|fragment| {
                    req.uri()
                        .path_and_query()
                        .is_some_and(|pq| pq.as_str().contains(fragment))
                })
            });
            if let Err(e) = sender.ready().await {
                return bad_gateway(e);
            }
            match sender.send_request(req.map(BodyExt::boxed)).await {
                Ok(response) => match trickle {
                    Some(trickle) => {
                        state.trickled_responses.fetch_add(1, Ordering::SeqCst);
                        Ok(response.map(|body| trickled(body, trickle)))
                    }
                    None => Ok(response.map(BodyExt::boxed)),
                },
                Err(e) => bad_gateway(e),
            }
        }
    });
    let _ = hyper::server::conn::http1::Builder::new()
        .serve_connection(hyper_util::rt::TokioIo::new(tls), service)
        .await;
}

/// A rustls client configuration trusting `ca_pem` and presenting `identity`: what
/// [`FrontDoorState::set_conflict_on_first_write`] reaches the apiserver with.
pub fn upstream_tls_config(
    ca_pem: &str,
    identity: &CertAndKey,
) -> Result<Arc<rustls::ClientConfig>, TestEnvError> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        let cert = cert.map_err(|e| TestEnvError::Pki(format!("front door CA: {e}")))?;
        roots
            .add(cert)
            .map_err(|e| TestEnvError::Pki(format!("front door CA: {e}")))?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| TestEnvError::Pki(format!("front door client TLS versions: {e}")))?
        .with_root_certificates(roots)
        .with_client_auth_cert(
            vec![CertificateDer::from(identity.cert_der.clone())],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(identity.key_der.clone())),
        )
        .map_err(|e| TestEnvError::Pki(format!("front door client certificate: {e}")))?;
    Ok(Arc::new(config))
}

/// rustls server config for throttled mode: our serving certificate, HTTP/1.1 only.
pub fn tls_config(serving: &CertAndKey) -> Result<Arc<rustls::ServerConfig>, TestEnvError> {
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| TestEnvError::Pki(format!("front door TLS versions: {e}")))?
        .with_no_client_auth()
        .with_single_cert(
            vec![CertificateDer::from(serving.cert_der.clone())],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(serving.key_der.clone())),
        )
        .map_err(|e| TestEnvError::Pki(format!("front door TLS certificate: {e}")))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}
