//! How the prober reads a shoot's apiserver, which its tenant runs: consistent lists (never
//! the apiserver's possibly stale watch cache: a shoot whose etcd is down can keep serving
//! old leases from it, and a stale lease must never scale anything), paginated (`limit` and
//! `continue`, so no single response holds a whole large shoot), and bounded in bytes by the
//! client ([`crate::kube_client::ResponseLimits`]). [`node_leases`] and [`nodes`] are the lease
//! probe's two reads, for the prober and `explain` alike.

use dwd_core::lease::{NODE_LEASE_NAMESPACE, NodeLeaseView, NodeView};
use kube::api::ListParams;
use kube::{Api, Client};
use serde::de::DeserializeOwned;

use super::slim::{NodeLease, ProbedNode};

/// Leases per page: a lease is a few hundred bytes.
pub(crate) const LEASE_PAGE: u32 = 500;
/// Nodes per page: a Node with its images and conditions is several KiB.
pub(crate) const NODE_PAGE: u32 = 100;
/// More pages than any real shoot needs (500 × 1000 leases); a server that keeps handing out
/// `continue` tokens is not followed further.
pub(crate) const MAX_PAGES: usize = 1000;

/// Every object of `api`, read page by page from one consistent snapshot (the apiserver ties
/// the `continue` token to the first page's resourceVersion).
pub(crate) async fn list_all<K>(api: &Api<K>, page_size: u32) -> kube::Result<Vec<K>>
where
    K: kube::Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    let mut items = Vec::new();
    let mut params = ListParams::default().limit(page_size);
    for _ in 0..MAX_PAGES {
        let page = api.list(&params).await?;
        items.extend(page.items);
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => return Ok(items),
        }
    }
    Err(kube::Error::Service(
        format!("more than {MAX_PAGES} pages of {page_size}; the list was not followed further")
            .into(),
    ))
}

/// The shoot's node leases (`kube-node-lease`), read straight into the views the lease probe
/// judges; a lease without a name has none and is left out.
pub(crate) async fn node_leases(shoot: &Client) -> kube::Result<Vec<NodeLeaseView>> {
    let api: Api<NodeLease> = Api::namespaced(shoot.clone(), NODE_LEASE_NAMESPACE);
    let leases = list_all(&api, LEASE_PAGE).await?;
    Ok(leases
        .into_iter()
        .filter_map(NodeLease::into_view)
        .collect())
}

/// The shoot's nodes, read straight into the views the lease probe judges; a node without a
/// name has none and is left out (it can't be matched to a lease or a Machine).
pub async fn nodes(shoot: &Client) -> kube::Result<Vec<NodeView>> {
    let api: Api<ProbedNode> = Api::all(shoot.clone());
    let nodes = list_all(&api, NODE_PAGE).await?;
    Ok(nodes
        .into_iter()
        .filter_map(ProbedNode::into_view)
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::logging::{self, LOG_VALUE_LIMIT, LogBuffer, Output, TimeEncoding, ZapLevel};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tracing_subscriber::layer::SubscriberExt;

    /// A fake shoot apiserver on loopback (plain HTTP, kube's own client): every request is
    /// answered `200 OK` with the body `body_for` gives its request line. Lives as long as the
    /// test's runtime.
    async fn fake_shoot(body_for: impl Fn(&str) -> Vec<u8> + Send + Sync + 'static) -> Client {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("address"));
        let body_for = std::sync::Arc::new(body_for);
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let body_for = body_for.clone();
                tokio::spawn(async move {
                    let mut request = Vec::new();
                    let mut buf = [0u8; 4096];
                    while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                        match stream.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => request.extend_from_slice(&buf[..n]),
                        }
                    }
                    let request = String::from_utf8_lossy(&request);
                    let body = body_for(request.lines().next().unwrap_or_default());
                    let head = format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                        body.len()
                    );
                    let _ = stream.write_all(head.as_bytes()).await;
                    let _ = stream.write_all(&body).await;
                    let _ = stream.shutdown().await;
                });
            }
        });
        let config = kube::Config::new(url.parse().expect("url"));
        Client::try_from(config).expect("client")
    }

    /// Tenant filler: no line may carry more of it than the cut.
    const FILLER: &str = "x";
    /// A forged line in each layout, which a tenant's newline would otherwise start.
    const FORGED: &str = "\n{\"level\":\"error\",\"msg\":\"FORGED\"}\n1999-01-01T00:00:00Z\tERROR\tdwd\tFORGED\n  1999-01-01T00:00:00Z ERROR FORGED\n";

    #[tokio::test]
    async fn a_shoots_bodies_reach_no_log_line_whole_nor_start_one_in_any_layout() {
        // Just under the per-response limit: kube reads the body, fails to parse it and logs
        // it at warn; the error we log quotes it again (serde quotes a whole string value).
        let huge = FILLER.repeat((16 << 20) - 4096);
        let bodies = [
            huge.clone(),
            format!("{FORGED}{huge}"),
            format!(
                "{{\"kind\":\"LeaseList\",\"items\":{}}}",
                serde_json::Value::String(format!("{FORGED}{huge}"))
            ),
        ];
        for output in [Output::Json, Output::Console, Output::Text] {
            let buffer = LogBuffer::default();
            let sink = buffer.clone();
            let subscriber = tracing_subscriber::registry()
                .with(tracing_subscriber::EnvFilter::new(
                    logging::filter_directives(ZapLevel::DEBUG),
                ))
                .with(logging::layer(output, TimeEncoding::Rfc3339, move || {
                    sink.clone()
                }));
            let _guard = tracing::subscriber::set_default(subscriber);
            for body in &bodies {
                let body = body.clone().into_bytes();
                let shoot = fake_shoot(move |_| body.clone()).await;
                let error = node_leases(&shoot)
                    .await
                    .expect_err("an unparsable body fails the read");
                // As `Probe::report_failure` logs a failure, and every other way a call site
                // could put the error into a line: a span field, a Debug field, the message.
                let span = tracing::warn_span!("probe", failure = %error);
                let _span = span.enter();
                tracing::warn!(%error, "lease probe failed; no scaling this run");
                tracing::warn!(?error, "{error}");
            }
            drop(_guard);
            let text = String::from_utf8(buffer.bytes()).expect("utf-8");
            let lines: Vec<&str> = text.lines().collect();
            // Per body: kube's own warning, then ours two.
            assert!(lines.len() >= 3 * bodies.len(), "{output:?}: {text}");
            let longest_run = FILLER.repeat(LOG_VALUE_LIMIT + 1);
            for line in &lines {
                assert!(
                    line.len() <= logging::line_bound(3) + 64,
                    "{output:?}: a line of {} bytes: {}",
                    line.len(),
                    crate::text::prefix(line, 400)
                );
                assert!(!line.contains(&longest_run), "{output:?}: {line}");
                let forged = match output {
                    Output::Json => {
                        let line: serde_json::Value = serde_json::from_str(line)
                            .unwrap_or_else(|e| panic!("not a JSON line ({e}): {line}"));
                        line["msg"] == "FORGED"
                    }
                    Output::Console | Output::Text => line.trim_start().starts_with("1999"),
                };
                assert!(!forged, "{output:?}: a forged line: {line}");
            }
            assert!(
                lines
                    .iter()
                    .any(|l| l.contains("kube_client") || output == Output::Text),
                "{output:?}: kube-client's own warning was logged: {text}"
            );
            assert!(
                lines
                    .iter()
                    .all(|l| !l.contains(&FILLER.repeat(LOG_VALUE_LIMIT / 3))
                        || l.contains("bytes)")),
                "{output:?}: every cut value is marked with its length: {text}"
            );
        }
    }
}
