//! The HTTP endpoints: Prometheus metrics on `--metrics-bind-addr`, `/healthz` and `/readyz`
//! on `--health-bind-addr`. Go-style `:port` addresses mean every interface.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use http_body_util::Full;
use hyper::body::Bytes;
use hyper::{Request, Response, StatusCode};
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::health::Health;
use crate::{Error, Result};

/// Parses `:9643`, `0.0.0.0:9643`, `127.0.0.1:0`.
pub fn parse_bind_addr(addr: &str) -> Result<SocketAddr, String> {
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
    /// `/metrics`.
    Metrics(Arc<Mutex<Registry>>),
    /// `/healthz`, `/readyz`.
    Health(Arc<Health>),
}

fn respond(endpoints: &Endpoints, path: &str) -> Response<Full<Bytes>> {
    let (status, ctype, body) = match (endpoints, path) {
        (Endpoints::Metrics(registry), "/metrics") => {
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
        (Endpoints::Health(h), "/readyz") => {
            if h.is_ready() && h.is_alive() {
                let body = match h.role() {
                    crate::health::Role::Alone => "ok",
                    crate::health::Role::Leader => "ok: leader",
                    crate::health::Role::Follower => "ok: follower (idle until it leads)",
                };
                (StatusCode::OK, "text/plain", body.into())
            } else {
                (
                    StatusCode::SERVICE_UNAVAILABLE,
                    "text/plain",
                    "caches not synced".into(),
                )
            }
        }
        _ => (StatusCode::NOT_FOUND, "text/plain", "not found".into()),
    };
    let mut resp = Response::new(Full::new(Bytes::from(body)));
    *resp.status_mut() = status;
    if let Ok(v) = http::HeaderValue::from_str(ctype) {
        resp.headers_mut().insert(http::header::CONTENT_TYPE, v);
    }
    resp
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
    let task = tokio::spawn(async move {
        loop {
            let accepted = tokio::select! {
                _ = shutdown.cancelled() => return,
                a = listener.accept() => a,
            };
            let Ok((stream, _)) = accepted else { continue };
            let endpoints = endpoints.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                    let resp = respond(&endpoints, req.uri().path());
                    async move { Ok::<_, std::convert::Infallible>(resp) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    Ok((local, task))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::health::Role;
    use http_body_util::BodyExt;

    async fn get(endpoints: &Endpoints, path: &str) -> (StatusCode, String) {
        let resp = respond(endpoints, path);
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
        assert_eq!(get(&ep, "/readyz").await.0, StatusCode::SERVICE_UNAVAILABLE);
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

    #[test]
    fn go_style_bind_addresses_parse() {
        assert_eq!(parse_bind_addr(":9643").map(|a| a.port()), Ok(9643));
        assert!(parse_bind_addr("127.0.0.1:0").is_ok());
        assert!(parse_bind_addr("nonsense").is_err());
    }
}
