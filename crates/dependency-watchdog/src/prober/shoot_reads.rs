//! How the prober reads a shoot's apiserver, which its tenant runs: consistent lists (never
//! the apiserver's possibly stale watch cache: a shoot whose etcd is down can keep serving
//! old leases from it, and a stale lease must never scale anything), paginated (`limit` and
//! `continue`, so no single response holds a whole large shoot), and bounded in bytes by the
//! client ([`crate::client::kube_client::ResponseLimits`]). [`node_leases`] and [`nodes`] are the lease
//! probe's two reads, for the prober and `explain` alike.

use dwd_core::lease::{NodeLeaseView, NodeView};
use http_body_util::BodyExt;
use kube::Client;
use kube::api::ListParams;
use kube::core::Status;
use serde::de;

use super::page_stream::{MAX_ITEM_BYTES, PageSplitter, SplitError};
use super::slim::{Listed, NodeLease, ProbedNode};
use crate::memory_budget::MemoryGrant;

/// Leases per page: a lease is a few hundred bytes.
pub(crate) const LEASE_PAGE: u32 = 500;
/// Nodes per page: a Node with its images and conditions is several KiB.
pub(crate) const NODE_PAGE: u32 = 100;
/// More pages than any real shoot needs (500 × 1000 leases); a server that keeps handing out
/// `continue` tokens is not followed further.
pub(crate) const MAX_PAGES: usize = 1000;

/// The views of every `L` of the list, read page by page from one consistent snapshot (the
/// apiserver ties the `continue` token to the first page's resourceVersion).
///
/// What a page costs is bounded by what was asked, not by what the tenant's server sends:
/// each page is decoded from its body straight into `views` (no list of objects, no second
/// copy of the page), an item without a name is dropped as it is decoded, and a page with more
/// items than the `page_size` it was asked for fails the read. So the decoded memory of a page
/// is at most `page_size` views, each no larger than its own bytes on the wire, whatever the
/// bytes per item (a page of `{}` items costs its body, which the client's
/// [`crate::client::kube_client::ResponseLimits`] bound, and nothing more).
///
/// The views are charged to the run's `grant` page by page (their bytes, [`Listed::view_bytes`])
/// and each page body's bytes, charged by the client as they arrived, are released once it is
/// decoded: a list whose views the memory budget can't hold fails the run.
pub(crate) async fn list_all<L: Listed>(
    shoot: &Client,
    page_size: u32,
    grant: Option<&MemoryGrant>,
) -> kube::Result<Vec<L::View>> {
    let request = kube::core::Request::new(L::path());
    let mut views = Vec::new();
    let mut params = ListParams::default().limit(page_size);
    for _ in 0..MAX_PAGES {
        let before = views.len();
        let continue_token =
            read_page::<L>(shoot, &request, &params, page_size, &mut views, grant).await?;
        if let Some(grant) = grant {
            let bytes = views[before..].iter().map(L::view_bytes).sum::<u64>();
            grant
                .charge(bytes)
                .await
                .map_err(|e| kube::Error::Service(Box::new(e)))?;
        }
        match continue_token.filter(|c| !c.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => return Ok(views),
        }
    }
    Err(kube::Error::Service(
        format!("more than {MAX_PAGES} pages of {page_size}; the list was not followed further")
            .into(),
    ))
}

/// Reads one page of `request`'s list with `params` into `views`; its `continue` token.
///
/// The page is decoded as its body streams in ([`PageSplitter`]): each item is decoded into
/// its view as soon as its last byte has arrived, and the run holds the frame being read and
/// the one item being received, never the page (a page of 100 real Nodes is 1-3 MiB; its
/// views a few tens of KiB). The frame and what the splitter keeps are charged to the run's
/// `grant` as they are read and returned once decoded.
async fn read_page<L: Listed>(
    shoot: &Client,
    request: &kube::core::Request,
    params: &ListParams,
    page_size: u32,
    views: &mut Vec<L::View>,
    grant: Option<&MemoryGrant>,
) -> kube::Result<Option<String>> {
    let mut http_request = request.list(params).map_err(kube::Error::BuildRequest)?;
    http_request.extensions_mut().insert("list");
    let response = shoot
        .send(http_request.map(kube::client::Body::from))
        .await?;
    let status = response.status();
    let mut body = response.into_body();
    if status.is_client_error() || status.is_server_error() {
        let body = read_body(body, grant).await?;
        let _release = Released {
            grant,
            bytes: body.len() as u64,
        };
        return Err(api_error(status, &body));
    }
    let mut splitter = PageSplitter::new(MAX_ITEM_BYTES);
    let mut items = 0usize;
    // What the splitter holds, as charged to the grant (returned when the page is read).
    let mut kept = Released { grant, bytes: 0 };
    while let Some(frame) = body.frame().await {
        let Ok(data) = frame?.into_data() else {
            continue;
        };
        charge(grant, data.len()).await?;
        let frame = Released {
            grant,
            bytes: data.len() as u64,
        };
        splitter
            .feed(&data, |item| {
                items += 1;
                if items > page_size as usize {
                    return Err(<serde_json::Error as de::Error>::custom(format!(
                        "the page holds more than the {page_size} items asked for"
                    )));
                }
                if let Some(view) = serde_json::from_slice::<L>(item)?.into_view() {
                    views.push(view);
                }
                Ok(())
            })
            .map_err(page_error)?;
        drop(data);
        drop(frame);
        let held = splitter.held_bytes() as u64;
        if held > kept.bytes {
            charge(grant, (held - kept.bytes) as usize).await?;
        } else if let Some(grant) = grant {
            grant.release_response(kept.bytes - held);
        }
        kept.bytes = held;
    }
    splitter.finish().map_err(|error| match error {
        SplitError::Metadata { source, .. } => kube::Error::SerdeError(source),
        other => kube::Error::SerdeError(<serde_json::Error as de::Error>::custom(other)),
    })
}

/// A page that could not be split or whose item could not be decoded: serde's error for an
/// item (as decoding the whole page reported it), else the splitter's.
fn page_error(error: SplitError<serde_json::Error>) -> kube::Error {
    match error {
        SplitError::Item { source, .. } => kube::Error::SerdeError(source),
        SplitError::Metadata { source, .. } => kube::Error::SerdeError(source),
        other => kube::Error::SerdeError(<serde_json::Error as de::Error>::custom(other)),
    }
}

/// A whole (small) response body, each frame charged to the run's `grant` as it is read (the
/// client's limits bound its size); the caller releases the charge once done with it
/// ([`Released`]).
async fn read_body(
    mut body: kube::client::Body,
    grant: Option<&MemoryGrant>,
) -> kube::Result<bytes::Bytes> {
    let mut whole = bytes::BytesMut::new();
    while let Some(frame) = body.frame().await {
        let frame = frame?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        charge(grant, data.len()).await?;
        whole.extend_from_slice(&data);
    }
    Ok(whole.freeze())
}

/// Charges `bytes` of a response being read to the run's `grant`; a refusal fails the read.
async fn charge(grant: Option<&MemoryGrant>, bytes: usize) -> kube::Result<()> {
    let Some(grant) = grant else {
        return Ok(());
    };
    grant
        .charge_response(bytes as u64)
        .await
        .map_err(|e| kube::Error::Service(Box::new(e)))
}

/// Returns a read's charged response bytes to the run's grant when dropped.
struct Released<'a> {
    grant: Option<&'a MemoryGrant>,
    bytes: u64,
}

impl Drop for Released<'_> {
    fn drop(&mut self) {
        if let Some(grant) = self.grant {
            grant.release_response(self.bytes);
        }
    }
}

/// The error of an answer with a 4xx or 5xx status, as kube makes it: the body's `Status` if
/// it is one, else one made of the body's text.
fn api_error(status: http::StatusCode, body: &[u8]) -> kube::Error {
    let status = match serde_json::from_slice::<Status>(body) {
        Ok(parsed) => parsed,
        Err(_) => Status::failure(
            String::from_utf8_lossy(body).trim(),
            "Failed to parse error data",
        )
        .with_code(status.as_u16()),
    };
    kube::Error::Api(status.boxed())
}

/// The API-server probe: `GET /version`, its answer decoded as kube's
/// `Client::apiserver_version` decodes it (a body that is not a version fails the probe); its
/// value is the HTTP version the answer came over (HTTP/2: requests sent at once can share
/// the connection).
pub(crate) async fn apiserver_version(
    shoot: &Client,
    grant: Option<&MemoryGrant>,
) -> kube::Result<http::Version> {
    let request = http::Request::get("/version")
        .body(kube::client::Body::empty())
        .map_err(kube::Error::HttpError)?;
    let response = shoot.send(request).await?;
    let version = response.version();
    let status = response.status();
    let body = read_body(response.into_body(), grant).await?;
    let _release = Released {
        grant,
        bytes: body.len() as u64,
    };
    if status.is_client_error() || status.is_server_error() {
        return Err(api_error(status, &body));
    }
    serde_json::from_slice::<k8s_openapi::apimachinery::pkg::version::Info>(&body)
        .map_err(kube::Error::SerdeError)?;
    Ok(version)
}

/// The shoot's node leases (`kube-node-lease`), read straight into the views the lease probe
/// judges; a lease without a name has none and is left out.
pub(crate) async fn node_leases(
    shoot: &Client,
    grant: Option<&MemoryGrant>,
) -> kube::Result<Vec<NodeLeaseView>> {
    list_all::<NodeLease>(shoot, LEASE_PAGE, grant).await
}

/// The shoot's nodes, read straight into the views the lease probe judges; a node without a
/// name has none and is left out (it can't be matched to a lease or a Machine).
pub(crate) async fn nodes(
    shoot: &Client,
    grant: Option<&MemoryGrant>,
) -> kube::Result<Vec<NodeView>> {
    list_all::<ProbedNode>(shoot, NODE_PAGE, grant).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::observe::logging::{
        self, LOG_VALUE_LIMIT, LogBuffer, Output, TimeEncoding, ZapLevel,
    };
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
                let error = node_leases(&shoot, None)
                    .await
                    .expect_err("an unparsable body fails the read");
                // As `Probe::report_failure` logs a failure, and every other way a call site
                // could put the error into a line: a span field, a Debug field, the message.
                let span = tracing::warn_span!("probe", failure = %error);
                let _span = span.enter();
                tracing::warn!(%error, "lease probe failed; no scaling this run");
                tracing::warn!(?error, "{error}");
                // The lists are decoded here; kube-client still decodes other answers (the
                // API-server probe's `GET /version`) and logs an unparsable body at warn.
                drop(_span);
                let _ = shoot.apiserver_version().await;
            }
            drop(_guard);
            let text = String::from_utf8(buffer.bytes()).expect("utf-8");
            let lines: Vec<&str> = text.lines().collect();
            // Per body: ours two (kube's own warning is asserted below).
            assert!(lines.len() >= 2 * bodies.len(), "{output:?}: {text}");
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

    /// A lease list page: `items` as given, `continue` when set.
    fn lease_page(items: &[serde_json::Value], continue_token: Option<&str>) -> Vec<u8> {
        serde_json::json!({
            "kind": "LeaseList",
            "apiVersion": "coordination.k8s.io/v1",
            "metadata": {"resourceVersion": "7", "continue": continue_token},
            "items": items,
        })
        .to_string()
        .into_bytes()
    }

    fn named_lease(name: &str) -> serde_json::Value {
        serde_json::json!({"metadata": {"name": name}, "spec": {"renewTime": "2026-11-26T08:00:00.000000Z"}})
    }

    #[tokio::test]
    async fn pages_are_followed_and_nameless_items_dropped_as_they_are_decoded() {
        let shoot = fake_shoot(|request_line| {
            assert!(request_line.contains("limit=500"), "{request_line}");
            if request_line.contains("continue=next") {
                // The last page; a null `items` is an empty one.
                lease_page(&[named_lease("b"), serde_json::json!({})], None)
            } else {
                let mut items = vec![serde_json::json!({}); 499];
                items.push(named_lease("a"));
                lease_page(&items, Some("next"))
            }
        })
        .await;
        let leases = node_leases(&shoot, None).await.expect("two pages");
        let names: Vec<&str> = leases.iter().map(|l| l.name.as_str()).collect();
        assert_eq!(names, ["a", "b"]);
        let empty =
            fake_shoot(|_| br#"{"kind":"LeaseList","metadata":{},"items":null}"#.to_vec()).await;
        assert!(
            node_leases(&empty, None)
                .await
                .expect("an empty list")
                .is_empty()
        );
    }

    #[tokio::test]
    async fn the_views_of_each_page_are_charged_to_the_runs_grant() {
        use crate::memory_budget::{
            BudgetMetrics, Claim, MemoryBudget, NoRunMemory, PROMPT_WITHIN, RUN_FLOOR, RUN_RESERVE,
        };
        let shoot = fake_shoot(|request_line| {
            if request_line.contains("continue=next") {
                lease_page(&[named_lease("b")], None)
            } else {
                lease_page(&[named_lease("a")], Some("next"))
            }
        })
        .await;
        let budget = MemoryBudget::new(
            4 * RUN_RESERVE,
            PROMPT_WITHIN,
            std::sync::Arc::default(),
            BudgetMetrics::default(),
        );
        let grant = budget
            .admit(Claim::default(), std::time::Duration::from_secs(1))
            .await
            .expect("room");
        // Spend the floor, so what the views are charged shows as held.
        grant.charge(RUN_FLOOR).await.expect("the floor");
        let leases = node_leases(&shoot, Some(&grant)).await.expect("two pages");
        let view_bytes: u64 = leases.iter().map(NodeLease::view_bytes).sum();
        assert_eq!(budget.held(), RUN_RESERVE + view_bytes);
        // A list the budget has no room for now waits for room (its call's deadline bounds
        // the wait) rather than failing: nothing is ended for it, everything here is young.
        grant
            .charge(3 * RUN_RESERVE - view_bytes)
            .await
            .expect("the rest of the pool");
        let waited = tokio::time::timeout(
            std::time::Duration::from_millis(200),
            node_leases(&shoot, Some(&grant)),
        )
        .await;
        assert!(waited.is_err(), "no room: the read waits");
        // More than the pool could ever give a run fails at once.
        let error = grant
            .charge(4 * RUN_RESERVE)
            .await
            .expect_err("past the pool");
        assert!(
            error.to_string().contains("can ever give one run"),
            "{error}"
        );
        let _ = NoRunMemory::Exhausted {
            wanted: 0,
            capacity: 0,
        };
    }

    #[tokio::test]
    async fn a_page_with_more_items_than_asked_for_fails_the_read() {
        // 3 bytes an item on the wire: 500,001 of them would decode to as many objects.
        let shoot = fake_shoot(|_| lease_page(&vec![serde_json::json!({}); 501], None)).await;
        let error = node_leases(&shoot, None)
            .await
            .expect_err("501 items in a page of 500");
        assert!(
            error
                .to_string()
                .contains("the page holds more than the 500 items asked for"),
            "{error}"
        );
    }

    #[test]
    fn an_error_status_is_the_apiservers_status() {
        let forbidden = br#"{"kind":"Status","apiVersion":"v1","status":"Failure","message":"leases is forbidden","reason":"Forbidden","code":403}"#;
        let error = api_error(http::StatusCode::FORBIDDEN, forbidden);
        assert!(
            matches!(&error, kube::Error::Api(s) if s.code == 403 && s.message == "leases is forbidden"),
            "{error}"
        );
        let error = api_error(http::StatusCode::BAD_GATEWAY, b"<html>bad gateway</html>");
        assert!(
            matches!(&error, kube::Error::Api(s) if s.code == 502),
            "{error}"
        );
    }
}
