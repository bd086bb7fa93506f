//! Shoot "apiservers" that are not kube-apiservers, for the hostile scenario (issue 24,
//! item 7): what a tenant can put behind its shoot's address without running one.
//!
//! - [`Tarpit`]: one TLS listener behind every *slow* shoot's probe kubeconfig. It completes
//!   the handshake and answers every request only after a delay longer than the watchdog's
//!   `probeTimeout`, so each probe run of such a shoot waits its whole timeout with a
//!   connection open and then fails. Thousands of such shoots are what made the memory of
//!   runs in flight grow without bound before the run budget (README "Memory: one limit").
//! - [`Amplifier`]: the listener behind an *amplification* shoot. `/version` answers at
//!   once; every list of Leases or Nodes answers a page of empty items (`{}`, 3 bytes each on
//!   the wire, each a whole object once decoded) with a `continue` token, so a client that
//!   takes the page keeps asking. [`Pages::Oversized`] sends `--amplify-items` items whatever
//!   `limit` was asked (bytes that decode to far more memory than they cost on the wire unless
//!   the client counts items against what it asked for); [`Pages::Endless`] sends exactly the
//!   `limit` asked, page after page for ever (every page passes that count: only dropping
//!   nameless items while decoding and a cap on pages bound what a run holds).
//!
//! Both serve HTTP/1.1 and HTTP/2 on the test environment's serving certificate (which every
//! kubeconfig it issues trusts) and count what they saw, so the result says what the
//! watchdog did to them.

use std::convert::Infallible;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{Context, Result};
use dwd_sim::AbortOnDrop;
use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::{Value, json};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;

/// What a kube-apiserver answers on `/version` (every field of `version.Info`).
const VERSION_BODY: &str = r#"{"major":"1","minor":"34","gitVersion":"v1.34.4","gitCommit":"0000000000000000000000000000000000000000","gitTreeState":"clean","buildDate":"2026-01-01T00:00:00Z","goVersion":"go1.24.0","compiler":"gc","platform":"linux/amd64"}"#;

/// Counters of one fake server (atomics: every connection task updates them).
#[derive(Default)]
struct Counts {
    connections: AtomicU64,
    open: AtomicU64,
    max_open: AtomicU64,
    requests: AtomicU64,
    answered: AtomicU64,
    body_bytes: AtomicU64,
    version: AtomicU64,
    lease_lists: AtomicU64,
    node_lists: AtomicU64,
    other: AtomicU64,
}

impl Counts {
    fn to_json(&self) -> Value {
        let n = |a: &AtomicU64| a.load(Ordering::Relaxed);
        json!({
            "connections_accepted": n(&self.connections),
            "connections_open_max": n(&self.max_open),
            "requests": n(&self.requests),
            "requests_answered": n(&self.answered),
            "body_bytes_sent": n(&self.body_bytes),
            "requests_by_path": {
                "/version": n(&self.version),
                "leases list": n(&self.lease_lists),
                "nodes list": n(&self.node_lists),
                "other": n(&self.other),
            },
        })
    }

    fn count_path(&self, path: &str) {
        let counter = if path == "/version" {
            &self.version
        } else if is_lease_list(path) {
            &self.lease_lists
        } else if path == "/api/v1/nodes" {
            &self.node_lists
        } else {
            &self.other
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// Open connections, counted down when the connection's task ends however it ends.
struct OpenGuard(Arc<Counts>);

impl OpenGuard {
    fn new(counts: Arc<Counts>) -> OpenGuard {
        counts.connections.fetch_add(1, Ordering::Relaxed);
        let open = counts.open.fetch_add(1, Ordering::Relaxed) + 1;
        counts.max_open.fetch_max(open, Ordering::Relaxed);
        OpenGuard(counts)
    }
}

impl Drop for OpenGuard {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::Relaxed);
    }
}

fn is_lease_list(path: &str) -> bool {
    path == "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases"
}

/// A response with a JSON body, its length counted.
fn respond(counts: &Counts, status: StatusCode, body: Bytes) -> Response<Full<Bytes>> {
    counts.answered.fetch_add(1, Ordering::Relaxed);
    counts
        .body_bytes
        .fetch_add(body.len() as u64, Ordering::Relaxed);
    let mut response = Response::new(Full::new(body));
    *response.status_mut() = status;
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    response
}

/// The Status a kube-apiserver answers for a path it does not serve.
fn not_found() -> Bytes {
    Bytes::from_static(
        br#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"the server could not find the requested resource","reason":"NotFound","code":404}"#,
    )
}

/// Accepts TLS connections on a loopback port and serves each with `handler`.
async fn serve<H, F>(
    tls: Arc<rustls::ServerConfig>,
    counts: Arc<Counts>,
    handler: H,
) -> Result<(SocketAddr, AbortOnDrop)>
where
    H: Fn(Request<Incoming>) -> F + Clone + Send + Sync + 'static,
    F: std::future::Future<Output = Response<Full<Bytes>>> + Send + 'static,
{
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .await
        .context("bind a fake shoot apiserver")?;
    let addr = listener
        .local_addr()
        .context("fake shoot apiserver address")?;
    let acceptor = TlsAcceptor::from(tls);
    let accept = AbortOnDrop::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            tokio::spawn(connection(
                stream,
                acceptor.clone(),
                counts.clone(),
                handler.clone(),
            ));
        }
    });
    Ok((addr, accept))
}

/// One client connection: TLS, then HTTP/1.1 or HTTP/2 until the client goes.
async fn connection<H, F>(stream: TcpStream, acceptor: TlsAcceptor, counts: Arc<Counts>, handler: H)
where
    H: Fn(Request<Incoming>) -> F + Clone + Send + Sync + 'static,
    F: std::future::Future<Output = Response<Full<Bytes>>> + Send + 'static,
{
    let _open = OpenGuard::new(counts.clone());
    let _ = stream.set_nodelay(true);
    let Ok(tls) = acceptor.accept(stream).await else {
        return;
    };
    let service = hyper::service::service_fn(move |request: Request<Incoming>| {
        counts.requests.fetch_add(1, Ordering::Relaxed);
        counts.count_path(request.uri().path());
        let response = handler(request);
        async move { Ok::<_, Infallible>(response.await) }
    });
    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
        .serve_connection(TokioIo::new(tls), service)
        .await;
}

/// The slow shoots' server: every request answered after `delay`.
pub(crate) struct Tarpit {
    /// Where the slow shoots' kubeconfigs point.
    pub addr: SocketAddr,
    /// How long each request waits for its answer.
    pub delay: Duration,
    counts: Arc<Counts>,
    _accept: AbortOnDrop,
}

impl Tarpit {
    /// Starts the tarpit on a loopback port.
    pub(crate) async fn start(tls: Arc<rustls::ServerConfig>, delay: Duration) -> Result<Tarpit> {
        let counts = Arc::new(Counts::default());
        let c = counts.clone();
        let (addr, accept) = serve(tls, counts.clone(), move |request: Request<Incoming>| {
            let c = c.clone();
            async move {
                tokio::time::sleep(delay).await;
                if request.uri().path() == "/version" {
                    respond(
                        &c,
                        StatusCode::OK,
                        Bytes::from_static(VERSION_BODY.as_bytes()),
                    )
                } else {
                    respond(&c, StatusCode::NOT_FOUND, not_found())
                }
            }
        })
        .await?;
        Ok(Tarpit {
            addr,
            delay,
            counts,
            _accept: accept,
        })
    }

    /// What it saw.
    pub(crate) fn to_json(&self) -> Value {
        let mut v = self.counts.to_json();
        v["answer_delay_s"] = json!(self.delay.as_secs_f64());
        v
    }
}

/// How an [`Amplifier`] pages its lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pages {
    /// One page of this many empty items, whatever `limit` was asked.
    Oversized(usize),
    /// Exactly the `limit` asked (500 without one), with a `continue` token every time.
    Endless,
}

/// Items of an endless page when the request asks no `limit` (the apiserver's own default
/// is no limit; 500 is what a paging client asks for leases).
const ENDLESS_DEFAULT_LIMIT: usize = 500;

/// Most items an endless page holds, whatever `limit` asks (a client asking for a million
/// must not make the bench build a million).
const ENDLESS_MAX_LIMIT: usize = 10_000;

/// An amplification shoot's server: lists of empty items, paged as [`Pages`] says.
pub(crate) struct Amplifier {
    /// Where the amplification shoot's kubeconfig points.
    pub addr: SocketAddr,
    /// How it pages.
    pub pages: Pages,
    counts: Arc<Counts>,
    _accept: AbortOnDrop,
}

/// The `limit` of a request's query, if any.
fn limit_of(query: Option<&str>) -> Option<usize> {
    query?
        .split('&')
        .find_map(|p| p.strip_prefix("limit="))
        .and_then(|v| v.parse().ok())
}

/// One list page of `items` empty items, with a `continue` token so that a client that
/// takes the page keeps asking for more.
fn amplified_page(kind: &str, api_version: &str, items: usize) -> Bytes {
    let head = format!(
        r#"{{"kind":"{kind}","apiVersion":"{api_version}","metadata":{{"resourceVersion":"1","continue":"more"}},"items":["#
    );
    let mut body = String::with_capacity(head.len() + items * 3 + 2);
    body.push_str(&head);
    for i in 0..items {
        if i > 0 {
            body.push(',');
        }
        body.push_str("{}");
    }
    body.push_str("]}");
    Bytes::from(body)
}

impl Amplifier {
    /// Starts the amplifier on a loopback port (an oversized page is built once).
    pub(crate) async fn start(tls: Arc<rustls::ServerConfig>, pages: Pages) -> Result<Amplifier> {
        let oversized = match pages {
            Pages::Oversized(items) => Some((
                amplified_page("LeaseList", "coordination.k8s.io/v1", items),
                amplified_page("NodeList", "v1", items),
            )),
            Pages::Endless => None,
        };
        let counts = Arc::new(Counts::default());
        let c = counts.clone();
        let (addr, accept) = serve(tls, counts.clone(), move |request: Request<Incoming>| {
            let c = c.clone();
            // Bytes clones share the page: serving it costs no copy.
            let oversized = oversized.clone();
            async move {
                let path = request.uri().path();
                let page = |kind: &str, api_version: &str, prebuilt: Option<Bytes>| {
                    prebuilt.unwrap_or_else(|| {
                        let limit = limit_of(request.uri().query())
                            .unwrap_or(ENDLESS_DEFAULT_LIMIT)
                            .min(ENDLESS_MAX_LIMIT);
                        amplified_page(kind, api_version, limit)
                    })
                };
                if path == "/version" {
                    respond(
                        &c,
                        StatusCode::OK,
                        Bytes::from_static(VERSION_BODY.as_bytes()),
                    )
                } else if is_lease_list(path) {
                    let prebuilt = oversized.map(|(leases, _)| leases);
                    respond(
                        &c,
                        StatusCode::OK,
                        page("LeaseList", "coordination.k8s.io/v1", prebuilt),
                    )
                } else if path == "/api/v1/nodes" {
                    let prebuilt = oversized.map(|(_, nodes)| nodes);
                    respond(&c, StatusCode::OK, page("NodeList", "v1", prebuilt))
                } else {
                    respond(&c, StatusCode::NOT_FOUND, not_found())
                }
            }
        })
        .await?;
        Ok(Amplifier {
            addr,
            pages,
            counts,
            _accept: accept,
        })
    }

    /// What it saw.
    pub(crate) fn to_json(&self) -> Value {
        let mut v = self.counts.to_json();
        v["pages"] = match self.pages {
            Pages::Oversized(items) => json!({
                "oversized_items_per_page": items,
                // `{}` and a comma before every item but the first.
                "page_bytes": amplified_page("LeaseList", "coordination.k8s.io/v1", 0).len()
                    + (items * 3).saturating_sub(1),
            }),
            Pages::Endless => json!("endless: the limit asked, with a continue token every time"),
        };
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_amplified_page_is_a_list_of_empty_items_with_a_continue_token() {
        let page = amplified_page("LeaseList", "coordination.k8s.io/v1", 4);
        let v: Value = serde_json::from_slice(&page).expect("valid JSON");
        assert_eq!(v["items"], json!([{}, {}, {}, {}]));
        assert_eq!(v["metadata"]["continue"], "more");
        // Three bytes per item on the wire, whatever the count.
        let big = amplified_page("NodeList", "v1", 1000);
        let small = amplified_page("NodeList", "v1", 0);
        assert_eq!(big.len() - small.len(), 1000 * 3 - 1);
    }

    #[test]
    fn the_limit_is_read_from_the_query() {
        assert_eq!(limit_of(Some("limit=500&resourceVersion=")), Some(500));
        assert_eq!(limit_of(Some("continue=x&limit=100")), Some(100));
        assert_eq!(limit_of(Some("watch=true")), None);
        assert_eq!(limit_of(None), None);
    }
}
