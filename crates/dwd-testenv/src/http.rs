//! One HTTP GET for tests and tools: reading a watchdog's `/metrics`, `/readyz` or `/shadow`
//! on loopback.
//!
//! Built on hyper's HTTP/1 client connection (hyper is already here for the front door), not on
//! a hand-written request: status line, headers, chunked or length-delimited bodies are hyper's
//! business. One connection per call (`Connection: close`), so nothing outlives a poll.

use std::net::SocketAddr;
use std::time::Duration;

use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;

/// Why a GET failed; each names the address and path.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    /// No connection.
    #[error("GET {path} from {addr}: connect: {source}")]
    Connect {
        /// Where.
        addr: SocketAddr,
        /// What.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// The exchange failed (bad answer, connection closed early, an invalid path).
    #[error("GET {path} from {addr}: {message}")]
    Exchange {
        /// Where.
        addr: SocketAddr,
        /// What.
        path: String,
        /// Why.
        message: String,
    },
    /// No whole answer in time.
    #[error("GET {path} from {addr}: no answer within {timeout:?}")]
    Timeout {
        /// Where.
        addr: SocketAddr,
        /// What.
        path: String,
        /// The limit.
        timeout: Duration,
    },
}

/// `GET path` on `addr`: the status code and the body (lossy UTF-8), within `timeout`.
pub async fn get(
    addr: SocketAddr,
    path: &str,
    timeout: Duration,
) -> Result<(u16, String), HttpError> {
    let exchange_failed = |message: String| HttpError::Exchange {
        addr,
        path: path.to_string(),
        message,
    };
    let exchange = async {
        let stream = tokio::net::TcpStream::connect(addr)
            .await
            .map_err(|source| HttpError::Connect {
                addr,
                path: path.to_string(),
                source,
            })?;
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| exchange_failed(e.to_string()))?;
        // The connection task drives the exchange; it ends with the answer (Connection: close).
        let driver = tokio::spawn(async move {
            let _ = connection.await;
        });
        let request = http::Request::get(path)
            .header(http::header::HOST, addr.to_string())
            .header(http::header::CONNECTION, "close")
            .body(Empty::<Bytes>::new())
            .map_err(|e| exchange_failed(e.to_string()))?;
        let answer = async {
            let response = sender
                .send_request(request)
                .await
                .map_err(|e| exchange_failed(e.to_string()))?;
            let status = response.status().as_u16();
            let body = response
                .into_body()
                .collect()
                .await
                .map_err(|e| exchange_failed(e.to_string()))?
                .to_bytes();
            Ok((status, String::from_utf8_lossy(&body).into_owned()))
        }
        .await;
        driver.abort();
        answer
    };
    tokio::time::timeout(timeout, exchange)
        .await
        .map_err(|_| HttpError::Timeout {
            addr,
            path: path.to_string(),
            timeout,
        })?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn gets_status_and_body_and_names_what_failed() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let (mut conn, _) = listener.accept().await.unwrap();
            let mut request = vec![0u8; 1024];
            let n = conn.read(&mut request).await.unwrap();
            assert!(String::from_utf8_lossy(&request[..n]).starts_with("GET /metrics HTTP/1.1"));
            conn.write_all(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 7\r\n\r\nnot yet")
                .await
                .unwrap();
        });
        let (status, body) = get(addr, "/metrics", Duration::from_secs(5)).await.unwrap();
        assert_eq!((status, body.as_str()), (503, "not yet"));
        server.await.unwrap();

        // Nothing listens there any more.
        let error = get(addr, "/readyz", Duration::from_secs(5))
            .await
            .unwrap_err();
        assert!(
            error
                .to_string()
                .starts_with(&format!("GET /readyz from {addr}: connect")),
            "{error}"
        );
    }
}
