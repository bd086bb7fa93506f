//! One front per simulated shoot, so that shoots sharing a shoot apiserver look like shoots
//! with an apiserver of their own.
//!
//! K apiservers serve N shoots, and the watchdog lists *all* Nodes and node Leases of the
//! apiserver it probes: without help every probe run would list N/K shoots' worth of
//! objects (5 000 of each at N=1000, K=10) instead of its own M — more than either binary or
//! the apiservers could take on a small machine, and nothing like a real shoot. Each shoot's
//! probe kubeconfig therefore points at its own loopback TLS listener here, which forwards
//! every request to the shoot's apiserver (through its front door, so stopping and slowing
//! it still work) with the shoot's own client certificate (the audit log still names the
//! shoot), adding a label selector for this shoot to Node and Lease collection requests
//! (lists and watches). The apiserver then answers with exactly the shoot's M objects, and
//! its response-size metrics see what a real shoot apiserver would send. Bodies and content
//! types pass through untouched (JSON or protobuf alike).
//!
//! A connection is forwarded over its own upstream HTTP/2 connection, opened before the
//! client's TLS handshake completes: when the apiserver is stopped the client's connection
//! simply closes, and when the upstream connection ends the client's does too.

use std::convert::Infallible;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, Result};
use dwd_sim::AbortOnDrop;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::client::conn::http2::SendRequest;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo};
use kube::client::ConfigExt;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::{TlsAcceptor, TlsConnector};

/// Label on every Node and Lease of a shoot; its value is the shoot's index.
pub(crate) const SHOOT_LABEL: &str = "dwd-bench.local/shoot";

/// Collection paths whose requests get the shoot's label selector.
const FILTERED: [&str; 2] = [
    "/api/v1/nodes",
    "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases",
];

/// Headers of one HTTP/1 hop that must not be forwarded (and are invalid in HTTP/2).
const HOP_BY_HOP: [&str; 7] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "transfer-encoding",
    "upgrade",
    "te",
    "host",
];

type Body = BoxBody<Bytes, hyper::Error>;

/// The TLS server side shared by every shoot's front: the test environment's serving
/// certificate (trusted by every kubeconfig it issues), HTTP/2 and HTTP/1.1.
pub(crate) fn server_tls(env_dir: &Path) -> Result<Arc<rustls::ServerConfig>> {
    let cert_path = env_dir.join("serving.crt");
    let key_path = env_dir.join("serving.key");
    let cert = CertificateDer::from_pem_file(&cert_path)
        .with_context(|| format!("read {}", cert_path.display()))?;
    let key = PrivateKeyDer::from_pem_file(&key_path)
        .with_context(|| format!("read {}", key_path.display()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .context("TLS versions")?
        .with_no_client_auth()
        .with_single_cert(vec![cert], key)
        .context("serving certificate")?;
    // Offer both: client-go negotiates HTTP/2, kube-rs speaks HTTP/1.1.
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    // Stateless session tickets, as a real kube-apiserver (Go's crypto/tls) issues by
    // default: a client that keeps them may resume on its next connection. (rustls' default,
    // a 256-entry server-side cache, would forget most of 1000 shoots between two runs.)
    config.ticketer = rustls::crypto::ring::Ticketer::new().context("TLS session ticketer")?;
    Ok(Arc::new(config))
}

/// A running front for one shoot; stops accepting when dropped.
pub(crate) struct ShootProxy {
    /// Where the shoot's probe kubeconfig points.
    pub addr: SocketAddr,
    _accept: AbortOnDrop,
}

impl ShootProxy {
    /// Starts a front for shoot `index`, forwarding to `upstream` (its apiserver's front door)
    /// as the user of `kubeconfig` (the shoot's own, pointing at `upstream`).
    pub(crate) async fn start(
        index: usize,
        upstream: SocketAddr,
        kubeconfig: &str,
        server_tls: Arc<rustls::ServerConfig>,
    ) -> Result<ShootProxy> {
        let parsed = kube::config::Kubeconfig::from_yaml(kubeconfig)
            .with_context(|| format!("parse kubeconfig of shoot {index}"))?;
        let config = kube::Config::from_custom_kubeconfig(parsed, &Default::default())
            .await
            .with_context(|| format!("load kubeconfig of shoot {index}"))?;
        let mut client_tls = config
            .rustls_client_config()
            .with_context(|| format!("TLS client config of shoot {index}"))?;
        client_tls.alpn_protocols = vec![b"h2".to_vec()];
        let forward = Arc::new(Forward {
            upstream,
            connector: TlsConnector::from(Arc::new(client_tls)),
            acceptor: TlsAcceptor::from(server_tls),
            selector: format!("{SHOOT_LABEL}={index}"),
        });
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .await
            .context("bind shoot front")?;
        let addr = listener.local_addr().context("shoot front address")?;
        let accept = AbortOnDrop::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                tokio::spawn(forward.clone().serve(stream));
            }
        });
        Ok(ShootProxy {
            addr,
            _accept: accept,
        })
    }
}

/// What one shoot's front needs for each connection.
struct Forward {
    upstream: SocketAddr,
    connector: TlsConnector,
    acceptor: TlsAcceptor,
    selector: String,
}

impl Forward {
    /// Serves one client connection over one upstream HTTP/2 connection.
    async fn serve(self: Arc<Self>, client: TcpStream) {
        let _ = client.set_nodelay(true);
        // Upstream first: a stopped apiserver must look stopped (the client's connection closes).
        let Ok(upstream) = TcpStream::connect(self.upstream).await else {
            return;
        };
        let _ = upstream.set_nodelay(true);
        let name = ServerName::IpAddress(std::net::IpAddr::from(Ipv4Addr::LOCALHOST).into());
        let Ok(upstream) = self.connector.connect(name, upstream).await else {
            return;
        };
        let Ok((sender, connection)) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(upstream))
                .await
        else {
            return;
        };
        let Ok(client) = self.acceptor.accept(client).await else {
            return;
        };
        let me = self.clone();
        let service = hyper::service::service_fn(move |request| {
            let me = me.clone();
            let sender = sender.clone();
            async move { Ok::<_, Infallible>(me.forward(sender, request).await) }
        });
        let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
        let served = builder.serve_connection(TokioIo::new(client), service);
        // Whichever side ends first ends both: the client then sees its connection close.
        tokio::select! {
            _ = served => {}
            _ = connection => {}
        }
    }

    /// Forwards one request, with the shoot's selector on Node and Lease collections.
    async fn forward(
        &self,
        mut sender: SendRequest<Incoming>,
        request: Request<Incoming>,
    ) -> Response<Body> {
        let (mut parts, body) = request.into_parts();
        let path = parts
            .uri
            .path_and_query()
            .map(|p| p.as_str())
            .unwrap_or("/");
        let path = with_selector(path, &self.selector);
        parts.uri = match format!("https://{}{path}", self.upstream).parse() {
            Ok(uri) => uri,
            Err(e) => return error(StatusCode::BAD_REQUEST, &format!("bad path: {e}")),
        };
        parts.version = hyper::Version::HTTP_2;
        for h in HOP_BY_HOP {
            parts.headers.remove(h);
        }
        match sender.send_request(Request::from_parts(parts, body)).await {
            Ok(response) => {
                let (mut parts, body) = response.into_parts();
                // The client's hop decides its own version and framing.
                parts.version = hyper::Version::HTTP_11;
                for h in HOP_BY_HOP {
                    parts.headers.remove(h);
                }
                Response::from_parts(parts, body.boxed())
            }
            Err(e) => error(StatusCode::BAD_GATEWAY, &format!("shoot apiserver: {e}")),
        }
    }
}

/// A plain-text error response.
fn error(status: StatusCode, message: &str) -> Response<Body> {
    let mut response = Response::new(
        Full::new(Bytes::from(message.to_string()))
            .map_err(|never| match never {})
            .boxed(),
    );
    *response.status_mut() = status;
    response
}

/// `path_and_query` with `selector` ANDed into its `labelSelector` when it names a Node or
/// Lease collection; any other request unchanged.
fn with_selector(path_and_query: &str, selector: &str) -> String {
    let (path, query) = path_and_query
        .split_once('?')
        .unwrap_or((path_and_query, ""));
    if !FILTERED.contains(&path) {
        return path_and_query.to_string();
    }
    let encoded = selector.replace('/', "%2F").replace('=', "%3D");
    let mut found = false;
    let mut params: Vec<String> = query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| match p.strip_prefix("labelSelector=") {
            Some(existing) => {
                found = true;
                if existing.is_empty() {
                    format!("labelSelector={encoded}")
                } else {
                    format!("labelSelector={existing}%2C{encoded}")
                }
            }
            None => p.to_string(),
        })
        .collect();
    if !found {
        params.push(format!("labelSelector={encoded}"));
    }
    format!("{path}?{}", params.join("&"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selector_goes_on_node_and_lease_collections_only() {
        let sel = "dwd-bench.local/shoot=7";
        assert_eq!(
            with_selector("/api/v1/nodes", sel),
            "/api/v1/nodes?labelSelector=dwd-bench.local%2Fshoot%3D7"
        );
        assert_eq!(
            with_selector(
                "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases?resourceVersion=0&labelSelector=a%3Db",
                sel
            ),
            "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases?resourceVersion=0&labelSelector=a%3Db%2Cdwd-bench.local%2Fshoot%3D7"
        );
        assert_eq!(
            with_selector("/api/v1/nodes?watch=true&labelSelector=", sel),
            "/api/v1/nodes?watch=true&labelSelector=dwd-bench.local%2Fshoot%3D7"
        );
        assert_eq!(with_selector("/api/v1/nodes/n-1", sel), "/api/v1/nodes/n-1");
        assert_eq!(with_selector("/version", sel), "/version");
    }
}
