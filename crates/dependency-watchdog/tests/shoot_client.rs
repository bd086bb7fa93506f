//! The shoot client (`kube_client::PreparedShootConfig`, what every probe run reads through)
//! against a real kube-apiserver behind a loopback proxy that breaks the first connections:
//! client-go retries a `GET` after a connection reset or EOF (1 s apart, within the call), and
//! so must we, within the call's deadline (`probeTimeout`).
//!
//! Its own binary: it needs only an apiserver of the shared environment and its own proxy.

// A test crate: a failed assumption is a failed test (outside tests the workspace denies these).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use dependency_watchdog::client::kube_client::{HttpVersion, PreparedShootConfig, ResponseLimits};
use dwd_sim::AbortOnDrop;
use dwd_testenv::TestEnv;
use tokio::io::AsyncReadExt;
use tokio::net::{TcpListener, TcpStream};

/// A proxy to `upstream` that breaks its first connections once the client has sent its first
/// bytes (the TLS handshake): the 1st with a reset (RST), the others by closing them (EOF); the
/// later ones are piped through untouched.
struct BreakingProxy {
    addr: SocketAddr,
    connections: Arc<AtomicUsize>,
    _task: AbortOnDrop,
}

impl BreakingProxy {
    async fn start(upstream: SocketAddr, broken: usize) -> BreakingProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("address");
        let connections = Arc::new(AtomicUsize::new(0));
        let count = connections.clone();
        let task = AbortOnDrop::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                let n = count.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    if n < broken {
                        let mut buf = [0u8; 512];
                        let _ = client.read(&mut buf).await;
                        if n == 0 {
                            // Linger 0: the close sends RST, "connection reset by peer".
                            let _ = client.set_zero_linger();
                        }
                        drop(client);
                        return;
                    }
                    let Ok(mut server) = TcpStream::connect(upstream).await else {
                        return;
                    };
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                });
            }
        });
        BreakingProxy {
            addr,
            connections,
            _task: task,
        }
    }

    fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }
}

/// A shoot client for `kubeconfig` through `proxy`, every timeout `timeout`, negotiating
/// HTTP/2 or HTTP/1.1.
async fn client_via(
    kubeconfig: &str,
    upstream: SocketAddr,
    proxy: &BreakingProxy,
    timeout: Duration,
) -> kube::Client {
    client_speaking(
        kubeconfig,
        upstream,
        proxy,
        timeout,
        HttpVersion::Negotiated,
    )
    .await
}

/// [`client_via`] speaking `version`.
async fn client_speaking(
    kubeconfig: &str,
    upstream: SocketAddr,
    proxy: &BreakingProxy,
    timeout: Duration,
    version: HttpVersion,
) -> kube::Client {
    let yaml = kubeconfig.replace(&upstream.to_string(), &proxy.addr.to_string());
    assert_ne!(yaml, kubeconfig, "the kubeconfig points at the proxy");
    PreparedShootConfig::prepare(&yaml, timeout)
        .await
        .expect("kubeconfig")
        .client(ResponseLimits::DEFAULT, version)
        .expect("client")
}

/// A reset and an EOF on the first two connections: the GET is sent a third time, 1 s after
/// each, and succeeds within the call. Without the retry the first reset failed the call, and
/// with it the probe run (docs/faults.md).
#[tokio::test]
async fn a_get_is_retried_after_a_connection_reset_or_eof_within_the_deadline() {
    let env = TestEnv::shared().await.expect("test environment");
    let shoot = env
        .start_apiserver("shoot-resets")
        .await
        .expect("apiserver");
    let proxy = BreakingProxy::start(shoot.addr(), 2).await;
    let client = client_via(
        shoot.kubeconfig(),
        shoot.addr(),
        &proxy,
        Duration::from_secs(5),
    )
    .await;
    let started = Instant::now();
    let version = client
        .apiserver_version()
        .await
        .expect("GET /version succeeds after a reset and an EOF");
    let took = started.elapsed();
    assert!(!version.git_version.is_empty());
    assert_eq!(
        proxy.connections(),
        3,
        "two broken connections, one that answered"
    );
    assert!(
        took >= Duration::from_secs(2) && took < Duration::from_secs(5),
        "two retries 1 s apart, within the 5 s deadline: {took:?}"
    );
}

/// A retry that would end past the call's deadline (`probeTimeout`) is not started: the call
/// fails at once with the reset, and the run's failure is reported in time.
#[tokio::test]
async fn no_retry_is_started_that_would_pass_the_deadline() {
    let env = TestEnv::shared().await.expect("test environment");
    let shoot = env
        .start_apiserver("shoot-resets-deadline")
        .await
        .expect("apiserver");
    let proxy = BreakingProxy::start(shoot.addr(), 1).await;
    let client = client_via(
        shoot.kubeconfig(),
        shoot.addr(),
        &proxy,
        Duration::from_millis(900),
    )
    .await;
    let started = Instant::now();
    let error = client
        .apiserver_version()
        .await
        .expect_err("the reset fails the call");
    assert!(
        started.elapsed() < Duration::from_millis(900),
        "failed without waiting: {:?}",
        started.elapsed()
    );
    assert_eq!(proxy.connections(), 1, "{error}");
}

/// A run's reads share its one connection. Negotiated, kube-apiserver takes HTTP/2, but
/// three requests sent at once before the connection is up each open their own; with a
/// client that speaks HTTP/2 only (what a run uses once the shoot's last `GET /version` came
/// over HTTP/2) `GET /version` and the two lists, sent at once as the run's first requests,
/// ride one connection.
#[tokio::test]
async fn reads_sent_at_once_share_one_http2_connection() {
    use k8s_openapi::api::coordination::v1::Lease;
    use k8s_openapi::api::core::v1::Node;
    use kube::Api;
    use kube::api::ListParams;

    let env = TestEnv::shared().await.expect("test environment");
    let shoot = env.start_apiserver("shoot-http2").await.expect("apiserver");
    let mut connections = Vec::new();
    for version in [HttpVersion::Negotiated, HttpVersion::Http2Only] {
        let proxy = BreakingProxy::start(shoot.addr(), 0).await;
        let client = client_speaking(
            shoot.kubeconfig(),
            shoot.addr(),
            &proxy,
            Duration::from_secs(5),
            version,
        )
        .await;
        let request = http::Request::get("/version")
            .body(kube::client::Body::empty())
            .unwrap();
        let leases = Api::<Lease>::namespaced(client.clone(), "kube-node-lease");
        let nodes = Api::<Node>::all(client.clone());
        let limit = ListParams::default().limit(500);
        let (response, leases, nodes) = tokio::join!(
            client.send(request),
            leases.list(&limit),
            nodes.list(&limit)
        );
        let response = response.expect("GET /version");
        assert_eq!(response.version(), http::Version::HTTP_2, "{version:?}");
        assert!(response.status().is_success(), "{:?}", response.status());
        leases.expect("lease list");
        nodes.expect("node list");
        connections.push(proxy.connections());
    }
    assert!(connections[0] > 1, "negotiated: {connections:?}");
    assert_eq!(connections[1], 1, "HTTP/2 only: {connections:?}");
}
