//! The front door of an apiserver: a loopback TCP proxy that clients connect to instead
//! of the apiserver itself, so tests can inject network faults over real sockets.
//!
//! - **open**: bytes are piped to the apiserver untouched (TLS end to end, client
//!   certificates reach the apiserver, so authentication and RBAC are real);
//! - **closed** (apiserver stopped): the listener is dropped, connections are refused;
//! - **throttled**: the front door terminates TLS itself with the environment's serving
//!   certificate and answers every HTTP request with the apiserver's own
//!   `429 TooManyRequests` Status;
//! - **latency**: every new connection waits before it is piped through (a slow shoot).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use http_body_util::Full;
use hyper::body::Bytes;
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;

use crate::TestEnvError;
use crate::pki::CertAndKey;

/// The body kube-apiserver sends with a 429 (the Status of `apierrors.NewTooManyRequests`).
const TOO_MANY_REQUESTS_BODY: &str = r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"Too many requests, please try again later.","reason":"TooManyRequests","details":{"retryAfterSeconds":1},"code":429}"#;

/// Shared switches of one front door.
#[derive(Debug, Default)]
pub struct FrontDoorState {
    throttled: AtomicBool,
    latency_ms: AtomicU64,
    throttled_responses: AtomicU64,
    connections: AtomicU64,
}

impl FrontDoorState {
    /// Answer every request with 429 (true) or pass through (false).
    pub fn set_throttled(&self, on: bool) {
        self.throttled.store(on, Ordering::SeqCst);
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
    let _ = client.set_nodelay(true);
    if state.throttled.load(Ordering::SeqCst) {
        let Ok(tls) = acceptor.accept(client).await else {
            return;
        };
        let state_for_service = state.clone();
        let service = hyper::service::service_fn(move |_req| {
            state_for_service
                .throttled_responses
                .fetch_add(1, Ordering::SeqCst);
            async move {
                hyper::Response::builder()
                    .status(429)
                    .header("Content-Type", "application/json")
                    .header("Retry-After", "1")
                    .body(Full::new(Bytes::from_static(
                        TOO_MANY_REQUESTS_BODY.as_bytes(),
                    )))
            }
        });
        let _ = hyper::server::conn::http1::Builder::new()
            .serve_connection(hyper_util::rt::TokioIo::new(tls), service)
            .await;
        return;
    }
    let latency = state.latency_ms.load(Ordering::SeqCst);
    if latency > 0 {
        tokio::time::sleep(Duration::from_millis(latency)).await;
    }
    let Ok(mut upstream) = TcpStream::connect(backend).await else {
        return;
    };
    let _ = upstream.set_nodelay(true);
    let mut client = client;
    let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
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
