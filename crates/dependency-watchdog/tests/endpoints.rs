//! The metrics/health endpoints over real sockets: a flood of clients that connect and never
//! send a request neither keeps them busy for good nor stops them from answering.

// A test crate: a failed assumption is a failed test (outside tests the workspace denies these).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::time::Duration;

use dependency_watchdog::observe::health::Health;
use dependency_watchdog::process::server::{self, Endpoints, HEADER_READ_TIMEOUT, MAX_CONNECTIONS};
use dwd_testenv::eventually;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

/// `GET path` on a new connection; the status line, or why there is none.
async fn get(addr: std::net::SocketAddr, path: &str) -> Result<String, String> {
    let mut conn = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n");
    conn.write_all(request.as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(2), conn.read_to_end(&mut answer))
        .await
        .map_err(|_| "no answer within 2s".to_string())?
        .map_err(|e| e.to_string())?;
    String::from_utf8_lossy(&answer)
        .lines()
        .next()
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .ok_or_else(|| "closed without an answer".to_string())
}

#[tokio::test]
async fn a_flood_of_idle_connections_is_shed_and_the_server_stays_answerable() {
    let health = Arc::new(Health::default());
    health.set_ready(true);
    let shutdown = CancellationToken::new();
    let _stop = shutdown.clone().drop_guard();
    let (addr, _task) = server::serve("health", "127.0.0.1:0", Endpoints::Health(health), shutdown)
        .await
        .expect("serve");
    assert_eq!(
        get(addr, "/healthz").await.as_deref(),
        Ok("HTTP/1.1 200 OK")
    );

    // Three times the connection cap, each connected and silent.
    let mut idle = Vec::new();
    for _ in 0..3 * MAX_CONNECTIONS {
        idle.push(TcpStream::connect(addr).await.expect("connect"));
    }
    // Within the header timeout (plus slack for a loaded machine) every one is closed by the
    // server, and a request is answered again, while the flood's sockets are still open on
    // our side.
    let started = std::time::Instant::now();
    eventually(
        HEADER_READ_TIMEOUT + Duration::from_secs(10),
        "answered again",
        || async {
            Ok(get(addr, "/readyz")
                .await
                .ok()
                .filter(|s| s.contains("200")))
        },
    )
    .await
    .expect("server answers after the flood");
    let mut buf = [0u8; 1];
    for conn in &mut idle {
        let read = tokio::time::timeout(HEADER_READ_TIMEOUT * 3, conn.read(&mut buf)).await;
        assert!(
            matches!(read, Ok(Ok(0) | Err(_))),
            "an idle connection is still open after {:?}",
            started.elapsed()
        );
    }
}

/// The kubelet's liveness probe while clients hold more keep-alive connections than the cap,
/// each used once and then idle (well within the header timeout): the probe's new connection
/// is served at once (the least recently used idle one is closed for it), not refused until
/// the idle ones time out.
#[tokio::test]
async fn a_probe_is_answered_at_once_while_keep_alive_connections_fill_the_server() {
    let health = Arc::new(Health::default());
    health.set_ready(true);
    let shutdown = CancellationToken::new();
    let _stop = shutdown.clone().drop_guard();
    let (addr, _task) = server::serve("health", "127.0.0.1:0", Endpoints::Health(health), shutdown)
        .await
        .expect("serve");
    // The cap's worth, each answered, then more (each closes an older one: their own answers
    // are not the point).
    let mut held = Vec::new();
    for i in 0..MAX_CONNECTIONS + 8 {
        let mut conn = TcpStream::connect(addr).await.expect("connect");
        let _ = conn
            .write_all(b"GET /readyz HTTP/1.1\r\nHost: test\r\n\r\n")
            .await;
        // The answer (a short body); the connection stays open for the next request.
        let mut buf = [0u8; 512];
        let read = tokio::time::timeout(Duration::from_secs(2), conn.read(&mut buf)).await;
        if i < MAX_CONNECTIONS {
            let n = read.expect("answered in time").expect("read");
            assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"));
        }
        held.push(conn);
    }
    // Well within the header timeout: no idle connection has ended by itself.
    let started = std::time::Instant::now();
    for path in ["/healthz", "/readyz"] {
        let answer = tokio::time::timeout(Duration::from_secs(1), get(addr, path)).await;
        assert!(
            matches!(&answer, Ok(Ok(status)) if status == "HTTP/1.1 200 OK"),
            "{path} with {} keep-alive connections held: {answer:?}",
            held.len()
        );
    }
    assert!(started.elapsed() < HEADER_READ_TIMEOUT);
}
