//! Honouring `Retry-After` within the call, as client-go's rest client does.
//!
//! The reference talks to the seed and to shoots through client-go, whose every request is
//! retried when the apiserver answers `429 Too Many Requests` or any `5xx` *with* a
//! `Retry-After` header of whole seconds: it waits that long and sends the request again,
//! up to 10 times, only when the request body can be sent again, and only while the
//! caller's context lives (`rest/with_retry.go`: `checkWait`, `IsNextRetry`;
//! `rest/request.go`: `maxRetries: 10`, `retryAfterSeconds`). A shoot's probe call thus
//! survives an apiserver that sheds load for a second, and so does a scaling write to a busy
//! seed. [`RetryAfterLayer`] does the same for kube's clients.
//!
//! Differences, both about deadlines: client-go sleeps into an expiring context and then
//! fails with "context deadline exceeded"; here a wait that would end at or after the
//! deadline is not started and the server's answer is returned as it is, so the caller
//! still sees the 429 (docs/behaviour.md §2.10 spaces the next probe run out after a 429 that ended
//! a run). The deadline is the earlier of the layer's budget (per request; a shoot client's is its
//! probe timeout, so a tenant's `Retry-After: 86400` costs nothing) and the request's own
//! [`Deadline`], carried in its extensions by the client handle that sent it
//! ([`deadline_client`]; the scaler makes one per call, from its call timeout; see
//! [`crate::client::request_settings`]).
//!
//! client-go also retries a `GET` whose connection was reset or ended early (`request.go`:
//! `net.IsConnectionReset(err) || net.IsProbableEOF(err)`, only for `GET`, 1 s apart, within the
//! same 10 retries and the caller's context). So does this layer ([`is_reset_or_eof`],
//! [`RESET_RETRY_WAIT`]), within the same deadline: a shoot apiserver whose load balancer resets
//! a connection does not fail the probe run when a second attempt fits into `probeTimeout`.
//! Only reads are retried: a write whose connection broke may have been applied.
//!
//! The layer goes outermost: every attempt passes the client's rate limiter again and is
//! counted in `rest_client_requests_total`, as client-go's attempts are.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use http::{Request, Response, StatusCode};
use tokio::time::Instant;
use tracing::debug;

/// client-go's `maxRetries`: at most this many retries (11 attempts) per request.
pub(crate) const MAX_RETRIES: u32 = 10;

/// client-go's pause before a `GET` is sent again after a connection reset or EOF.
pub(crate) const RESET_RETRY_WAIT: Duration = Duration::from_secs(1);

/// Whether `error` (or one of its sources) is a connection reset or a connection that ended
/// before the response did: client-go's `IsConnectionReset || IsProbableEOF`.
pub(crate) fn is_reset_or_eof(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut current = Some(error);
    while let Some(e) = current {
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            if matches!(
                io.kind(),
                std::io::ErrorKind::ConnectionReset
                    | std::io::ErrorKind::ConnectionAborted
                    | std::io::ErrorKind::BrokenPipe
                    | std::io::ErrorKind::UnexpectedEof
            ) {
                return true;
            }
            // A wrapping io::Error (the TLS connector's) names the wrapped error's source as
            // its own, skipping the wrapped error: look into it.
            if let Some(inner) = io.get_ref() {
                current = Some(inner as &(dyn std::error::Error + 'static));
                continue;
            }
        }
        // "connection closed before message completed": the peer's EOF.
        if e.downcast_ref::<hyper::Error>()
            .is_some_and(hyper::Error::is_incomplete_message)
        {
            return true;
        }
        current = e.source();
    }
    false
}

/// The latest instant a `Retry-After` wait of a request may end at, carried in the request's
/// extensions (see [`crate::client::request_settings`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deadline(pub Instant);

/// The longest `Retry-After` wait a request takes, carried in its extensions: a longer one is
/// cut to this (the request goes again sooner than the server asked, still at most
/// [`MAX_RETRIES`] times). For requests without a call deadline whose pause costs more than
/// the server's load: the watches feeding the seed caches ([`crate::client::cache::feed_client`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct WaitCap(pub Duration);

/// A client sending through `client` (same stack, same budget) whose every request carries
/// `deadline`: retried only while a `Retry-After` wait ends before it.
pub fn deadline_client(client: &kube::Client, deadline: Instant) -> kube::Client {
    let mut settings = http::Extensions::new();
    settings.insert(Deadline(deadline));
    crate::client::request_settings::with_settings(client, settings)
}

/// A request body that may be sent again.
pub(crate) trait ReplayableBody: Sized {
    /// A copy to send again, or `None` when the body is a stream that can't be replayed
    /// (client-go's opaque reader: such a request is never retried).
    fn replay(&self) -> Option<Self>;
}

impl ReplayableBody for kube::client::Body {
    fn replay(&self) -> Option<Self> {
        self.try_clone()
    }
}

/// Retries requests answered 429 or 5xx with `Retry-After`; see the module documentation.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RetryAfterLayer {
    max_retries: u32,
    budget: Option<Duration>,
}

impl RetryAfterLayer {
    /// At most `max_retries` retries per request, none whose wait would end `budget` or more
    /// after the request was first sent (`None`: only the caller's deadline limits them).
    pub(crate) fn new(max_retries: u32, budget: Option<Duration>) -> Self {
        RetryAfterLayer {
            max_retries,
            budget,
        }
    }
}

impl<S> tower::Layer<S> for RetryAfterLayer {
    type Service = RetryAfter<S>;

    fn layer(&self, inner: S) -> RetryAfter<S> {
        RetryAfter {
            inner: Arc::new(Mutex::new(inner)),
            layer: *self,
        }
    }
}

/// The service of [`RetryAfterLayer`].
pub(crate) struct RetryAfter<S> {
    /// Shared with the futures of calls in flight, which send each attempt through it
    /// (kube's stacks are not `Clone`).
    inner: Arc<Mutex<S>>,
    layer: RetryAfterLayer,
}

impl<S> Clone for RetryAfter<S> {
    fn clone(&self) -> Self {
        RetryAfter {
            inner: self.inner.clone(),
            layer: self.layer,
        }
    }
}

/// The wait `response` asks for before a retry: client-go's `checkWait` (status 429 or
/// `>= 500`, `Retry-After` parsing as a Go int; negative waits are no wait).
pub(crate) fn retry_wait<B>(response: &Response<B>) -> Option<Duration> {
    let status = response.status();
    if status != StatusCode::TOO_MANY_REQUESTS && !status.is_server_error() {
        return None;
    }
    let value = response
        .headers()
        .get(http::header::RETRY_AFTER)?
        .to_str()
        .ok()?;
    let (negative, digits) = match value.as_bytes().first() {
        Some(b'-') => (true, &value[1..]),
        Some(b'+') => (false, &value[1..]),
        _ => (false, value),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    if negative {
        return Some(Duration::ZERO);
    }
    // More seconds than a u64 holds: Go's Atoi fails there too (out of range), no retry.
    digits.parse::<u64>().ok().map(Duration::from_secs)
}

/// The request again, with `body`.
fn copy_request<B>(parts: &http::request::Parts, body: B) -> Request<B> {
    let mut request = Request::new(body);
    *request.method_mut() = parts.method.clone();
    *request.uri_mut() = parts.uri.clone();
    *request.version_mut() = parts.version;
    *request.headers_mut() = parts.headers.clone();
    *request.extensions_mut() = parts.extensions.clone();
    request
}

/// Sends `request` through the shared service: readiness and the call under one lock, so
/// no other caller can take the readiness this one waited for.
async fn send<S, ReqB, ResB>(
    inner: &Mutex<S>,
    request: Request<ReqB>,
) -> Result<Response<ResB>, tower::BoxError>
where
    S: tower::Service<Request<ReqB>, Response = Response<ResB>>,
    S::Error: Into<tower::BoxError>,
{
    let mut request = Some(request);
    let sent = std::future::poll_fn(|cx| {
        let mut service = inner.lock().unwrap_or_else(PoisonError::into_inner);
        match service.poll_ready(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Err(e)) => Poll::Ready(Err(e.into())),
            Poll::Ready(Ok(())) => Poll::Ready(match request.take() {
                Some(r) => Ok(service.call(r)),
                // Unreachable: a ready poll completes this future.
                None => Err(tower::BoxError::from("request already sent")),
            }),
        }
    })
    .await?;
    sent.await.map_err(Into::into)
}

impl<S, ReqB, ResB> tower::Service<Request<ReqB>> for RetryAfter<S>
where
    S: tower::Service<Request<ReqB>, Response = Response<ResB>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<tower::BoxError>,
    ReqB: ReplayableBody + Send + 'static,
    ResB: Send + 'static,
{
    type Response = Response<ResB>;
    type Error = tower::BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Response<ResB>, tower::BoxError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // Readiness is awaited per attempt, in the call's future.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<ReqB>) -> Self::Future {
        let inner = self.inner.clone();
        let RetryAfterLayer {
            max_retries,
            budget,
        } = self.layer;
        let own_deadline = request.extensions().get::<Deadline>().map(|d| d.0);
        let cap = request.extensions().get::<WaitCap>().map(|c| c.0);
        Box::pin(async move {
            let started = Instant::now();
            let deadline = [own_deadline, budget.and_then(|b| started.checked_add(b))]
                .into_iter()
                .flatten()
                .min();
            let (parts, body) = request.into_parts();
            let replay = body.replay();
            let mut result = send(&inner, copy_request(&parts, body)).await;
            let mut retries = 0;
            loop {
                let (wait, why) = match &result {
                    Ok(response) => match retry_wait(response) {
                        Some(wait) => (
                            wait,
                            format!("answered {} with Retry-After", response.status()),
                        ),
                        None => return result,
                    },
                    // Only reads: a write whose connection broke may have been applied.
                    Err(e) if parts.method == http::Method::GET && is_reset_or_eof(&**e) => (
                        RESET_RETRY_WAIT,
                        format!("connection reset or closed early ({e})"),
                    ),
                    Err(_) => return result,
                };
                let wait = cap.map_or(wait, |cap| wait.min(cap));
                let Some(body) = replay.as_ref().and_then(ReplayableBody::replay) else {
                    return result;
                };
                if retries >= max_retries {
                    return result;
                }
                if deadline.is_some_and(|d| Instant::now() + wait >= d) {
                    debug!(%why, ?wait, "a retry would pass the call's deadline; not retrying");
                    return result;
                }
                retries += 1;
                debug!(%why, ?wait, retry = retries, method = %parts.method,
                    path = parts.uri.path(), "retrying");
                // The answer's body is not needed; dropping it closes its connection.
                drop(result);
                tokio::time::sleep(wait).await;
                result = send(&inner, copy_request(&parts, body)).await;
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::VecDeque;
    use tower::{Layer, Service, ServiceExt};

    /// A body that is replayable unless it is a stream.
    #[derive(Debug, Clone, PartialEq)]
    enum TestBody {
        Bytes(&'static str),
        Stream,
    }

    impl ReplayableBody for TestBody {
        fn replay(&self) -> Option<Self> {
            match self {
                TestBody::Bytes(b) => Some(TestBody::Bytes(b)),
                TestBody::Stream => None,
            }
        }
    }

    /// (method, path, header x-test, body, when) of each request the server saw.
    type Seen = Arc<Mutex<Vec<(String, String, String, TestBody, Instant)>>>;

    /// A server answering with the scripted (status, Retry-After) answers in order, then 200.
    fn server(
        answers: &[(u16, Option<&'static str>)],
    ) -> (
        tower::util::BoxService<Request<TestBody>, Response<()>, std::convert::Infallible>,
        Seen,
    ) {
        type Answers = Arc<Mutex<VecDeque<(u16, Option<&'static str>)>>>;
        let answers: Answers = Arc::new(Mutex::new(answers.iter().copied().collect()));
        let seen: Seen = Arc::default();
        let log = seen.clone();
        let service = tower::service_fn(move |req: Request<TestBody>| {
            let (status, retry_after) = answers
                .lock()
                .expect("answers")
                .pop_front()
                .unwrap_or((200, None));
            log.lock().expect("log").push((
                req.method().to_string(),
                req.uri().to_string(),
                req.headers()
                    .get("x-test")
                    .map(|v| v.to_str().expect("ascii").to_owned())
                    .unwrap_or_default(),
                req.body().clone(),
                Instant::now(),
            ));
            let mut response = Response::builder().status(status);
            if let Some(v) = retry_after {
                response = response.header("Retry-After", v);
            }
            std::future::ready(Ok(response.body(()).expect("response")))
        });
        (tower::util::BoxService::new(service), seen)
    }

    fn patch() -> Request<TestBody> {
        Request::patch("/apis/apps/v1/namespaces/ns/deployments/kcm")
            .header("x-test", "kept")
            .body(TestBody::Bytes("{\"spec\":{\"replicas\":0}}"))
            .expect("request")
    }

    async fn run(
        layer: RetryAfterLayer,
        answers: &[(u16, Option<&'static str>)],
        request: Request<TestBody>,
    ) -> (u16, Vec<(String, String, String, TestBody, Instant)>) {
        let (inner, seen) = server(answers);
        let response = layer
            .layer(inner)
            .oneshot(request)
            .await
            .expect("no transport error");
        let seen = seen.lock().expect("seen").clone();
        (response.status().as_u16(), seen)
    }

    #[tokio::test(start_paused = true)]
    async fn a_429_with_retry_after_is_sent_again_after_the_wait_with_the_same_request() {
        let start = Instant::now();
        let (status, seen) = run(
            RetryAfterLayer::new(MAX_RETRIES, None),
            &[(429, Some("1")), (503, Some("2"))],
            patch(),
        )
        .await;
        assert_eq!(status, 200);
        assert_eq!(seen.len(), 3);
        for (method, path, header, body, _) in &seen {
            assert_eq!(method, "PATCH");
            assert_eq!(path, "/apis/apps/v1/namespaces/ns/deployments/kcm");
            assert_eq!(header, "kept");
            assert_eq!(body, &TestBody::Bytes("{\"spec\":{\"replicas\":0}}"));
        }
        let at: Vec<Duration> = seen.iter().map(|s| s.4 - start).collect();
        assert_eq!(
            at,
            [
                Duration::ZERO,
                Duration::from_secs(1),
                Duration::from_secs(3)
            ]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn only_429_and_5xx_with_whole_seconds_are_retried() {
        for (answer, retried) in [
            ((429, Some("0")), true),
            ((500, Some("1")), true),
            ((504, Some("+1")), true),
            ((429, Some("-3")), true),
            ((429, None), false),
            ((503, None), false),
            ((409, Some("1")), false),
            ((404, Some("1")), false),
            ((200, Some("1")), false),
            ((429, Some("1.5")), false),
            ((429, Some("Wed, 21 Oct 2015 07:28:00 GMT")), false),
            ((429, Some("")), false),
            ((429, Some("99999999999999999999999")), false),
        ] {
            let (status, seen) =
                run(RetryAfterLayer::new(MAX_RETRIES, None), &[answer], patch()).await;
            let want = if retried { 2 } else { 1 };
            assert_eq!(seen.len(), want, "{answer:?}");
            assert_eq!(status, if retried { 200 } else { answer.0 }, "{answer:?}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn at_most_ten_retries_like_client_go_then_the_answer_is_returned() {
        let answers = [(429, Some("0")); 20];
        let (status, seen) = run(RetryAfterLayer::new(MAX_RETRIES, None), &answers, patch()).await;
        assert_eq!(status, 429);
        assert_eq!(seen.len(), 11);
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_that_cannot_be_replayed_is_never_sent_twice() {
        let request = Request::post("/api/v1/namespaces/ns/configmaps")
            .body(TestBody::Stream)
            .expect("request");
        let (status, seen) = run(
            RetryAfterLayer::new(MAX_RETRIES, None),
            &[(429, Some("1"))],
            request,
        )
        .await;
        assert_eq!((status, seen.len()), (429, 1));
    }

    #[tokio::test(start_paused = true)]
    async fn no_wait_is_started_that_would_end_past_the_requests_deadline() {
        // Awaited by the caller, and spawned: the deadline travels with the request, not
        // with the task.
        for spawned in [false, true] {
            let start = Instant::now();
            let (inner, seen) = server(&[(429, Some("1")), (429, Some("1")), (429, Some("1"))]);
            let service = RetryAfterLayer::new(MAX_RETRIES, None).layer(inner);
            let mut request = patch();
            request
                .extensions_mut()
                .insert(Deadline(start + Duration::from_millis(1500)));
            let response = match spawned {
                false => service.oneshot(request).await,
                true => tokio::spawn(service.oneshot(request)).await.expect("task"),
            };
            let response = response.expect("response");
            // Sent at 0 s and 1 s; a second wait would end at 2 s, past the deadline: the 429
            // comes back at once, before the caller's own timeout could turn it into a
            // timeout.
            assert_eq!(response.status(), 429, "spawned: {spawned}");
            assert_eq!(seen.lock().expect("seen").len(), 2, "spawned: {spawned}");
            assert_eq!(
                Instant::now() - start,
                Duration::from_secs(1),
                "spawned: {spawned}"
            );
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_capped_request_waits_at_most_its_cap_then_goes_again() {
        let start = Instant::now();
        let (inner, seen) = server(&[(429, Some("30")), (429, Some("30")), (429, Some("2"))]);
        let service = RetryAfterLayer::new(MAX_RETRIES, None).layer(inner);
        let mut request = patch();
        request
            .extensions_mut()
            .insert(WaitCap(Duration::from_secs(5)));
        let response = service.oneshot(request).await.expect("response");
        assert_eq!(response.status(), 200);
        let at: Vec<u64> = seen
            .lock()
            .expect("seen")
            .iter()
            .map(|s| (s.4 - start).as_secs())
            .collect();
        // Asked for 30 s twice, waited 5 s each; a shorter wait than the cap is taken whole.
        assert_eq!(at, [0, 5, 10, 12]);
    }

    #[tokio::test(start_paused = true)]
    async fn the_layers_budget_bounds_a_tenants_long_retry_after() {
        // (budget, Retry-After, status, requests sent, time taken)
        let cases = [
            // Past the budget: answered at once.
            (Duration::from_secs(3), "86400", 429, 1, 0),
            // Within the budget it is retried.
            (Duration::from_secs(3), "2", 200, 2, 2),
            // A budget too large to add to the clock is no budget.
            (Duration::MAX, "1", 200, 2, 1),
        ];
        for (budget, retry_after, want_status, sent, secs) in cases {
            let start = Instant::now();
            let (status, seen) = run(
                RetryAfterLayer::new(MAX_RETRIES, Some(budget)),
                &[(429, Some(retry_after))],
                patch(),
            )
            .await;
            let case = format!("budget {budget:?}, Retry-After {retry_after}");
            assert_eq!((status, seen.len()), (want_status, sent), "{case}");
            assert_eq!(Instant::now() - start, Duration::from_secs(secs), "{case}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn calls_in_flight_share_the_service() {
        let (inner, seen) = server(&[(429, Some("1")), (429, Some("1"))]);
        let mut service = RetryAfterLayer::new(MAX_RETRIES, None).layer(inner);
        let a = service.ready().await.expect("ready").call(patch());
        let b = service.ready().await.expect("ready").call(patch());
        let (a, b) = futures::join!(a, b);
        assert_eq!(a.expect("a").status(), 200);
        assert_eq!(b.expect("b").status(), 200);
        assert_eq!(seen.lock().expect("seen").len(), 4);
    }

    #[tokio::test(start_paused = true)]
    async fn only_gets_are_retried_after_a_connection_reset_one_second_later() {
        for method in [http::Method::GET, http::Method::PATCH, http::Method::POST] {
            let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
            let count = calls.clone();
            let service = tower::service_fn(move |_req: Request<TestBody>| {
                let first = count.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0;
                std::future::ready(if first {
                    Err(std::io::Error::from(std::io::ErrorKind::ConnectionReset))
                } else {
                    Ok(Response::new(()))
                })
            });
            let mut svc = RetryAfterLayer::new(MAX_RETRIES, None).layer(service);
            let request = Request::builder()
                .method(method.clone())
                .uri("/api/v1/namespaces/ns/pods")
                .body(TestBody::Bytes(""))
                .expect("request");
            let started = Instant::now();
            let result = svc.ready().await.expect("ready").call(request).await;
            let is_get = method == http::Method::GET;
            assert_eq!(result.is_ok(), is_get, "{method}");
            let expected = if is_get { 2 } else { 1 };
            assert_eq!(
                calls.load(std::sync::atomic::Ordering::SeqCst),
                expected,
                "{method}"
            );
            let waited = if is_get {
                RESET_RETRY_WAIT
            } else {
                Duration::ZERO
            };
            assert_eq!(started.elapsed(), waited, "{method}");
        }
    }

    #[test]
    fn resets_and_early_ends_are_found_through_wrapping_errors() {
        use std::io::{Error, ErrorKind};
        let reset = Error::from(ErrorKind::ConnectionReset);
        assert!(is_reset_or_eof(&reset));
        // As the TLS connector wraps it.
        let wrapped = Error::other(Error::from(ErrorKind::ConnectionReset));
        assert!(is_reset_or_eof(&wrapped));
        assert!(is_reset_or_eof(&Error::from(ErrorKind::UnexpectedEof)));
        assert!(!is_reset_or_eof(&Error::from(ErrorKind::ConnectionRefused)));
        assert!(!is_reset_or_eof(&Error::from(ErrorKind::TimedOut)));
    }
}
