//! Client-side rate limiting of the seed client (`--kube-api-qps`, `--kube-api-burst`) with
//! priorities.
//!
//! Like client-go's limiter, a token bucket holds `burst` tokens, refilled at `qps` per second,
//! and every request takes one token when it is sent. Unlike client-go's, waiting requests are
//! not served first come, first served: each carries a [`Priority`] (in its extensions, set by
//! the client handle that sends it: see [`prioritized`] and [`crate::client::request_settings`]) and
//! the most urgent waiter gets the next token. During a
//! region-wide outage a thousand shoots want their kube-controller-manager scaled down at
//! once; with priorities every shoot's level 0 is written before anyone's later levels, and
//! Kubernetes Events (nice to have) never delay a scaling write (the point of the watchdog).
//! Within one priority, requests go in arrival order.
//!
//! A watch takes one token when it starts; its events are not requests and are never delayed.
//!
//! A request may carry [`StopWaiting`]: when its token is cancelled while the request still
//! waits for the budget, the request is not sent and fails with [`NotSent`]. A scaling flow
//! that a newer verdict superseded stops this way without a write on the wire (a request
//! already sent is never abandoned: it may have been applied).

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;
use tower::ServiceExt;
use tower::buffer::Buffer;

/// client-go's default QPS, used when `--kube-api-qps` is 0 (or not a positive number).
pub(crate) const DEFAULT_QPS: f32 = 5.0;
/// client-go's default burst, used when `--kube-api-burst` is 0.
pub(crate) const DEFAULT_BURST: u32 = 10;
/// The smallest `--kube-api-qps` used (one request every 100 s); smaller rates are raised to
/// it. client-go's arithmetic overflows on rates like `1e-20` and waits for garbage times.
pub(crate) const MIN_QPS: f64 = 0.01;
/// Longest wait for one token (what [`MIN_QPS`] implies, and a bound for any arithmetic).
const MAX_TOKEN_WAIT: Duration = Duration::from_secs(100);
/// Shortest wait for one token: tokio's timer resolution.
const MIN_TOKEN_WAIT: Duration = Duration::from_millis(1);

/// Set once the clamped `--kube-api-qps` was warned about: every client of the process gets
/// the same flag, and the operator needs to hear it once.
static QPS_CLAMP_WARNED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// The rate used for `--kube-api-qps=qps`: the default for 0 or anything not a positive
/// number, [`MIN_QPS`] for smaller positive rates; and what to warn about, if anything.
pub(crate) fn effective_qps(qps: f32) -> (f64, Option<String>) {
    if !(qps.is_finite() && qps > 0.0) {
        return (f64::from(DEFAULT_QPS), None);
    }
    let qps = f64::from(qps);
    if qps < MIN_QPS {
        return (
            MIN_QPS,
            Some(format!(
                "--kube-api-qps={qps} is below the smallest rate this watchdog waits for: using {MIN_QPS} requests per second"
            )),
        );
    }
    (qps, None)
}

/// How urgent a request is: lower values get tokens first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct Priority(u16);

impl Priority {
    /// The lists and watches that feed the watch caches every decision reads from. They are
    /// few (a re-watch every few minutes per cache) and must never wait behind writes: the
    /// writes carry the cached `resourceVersion` as precondition, so with a cache starved of
    /// its re-watch every write would conflict, be retried, and starve it further.
    pub(crate) const WATCH_CACHES: Priority = Priority(0);

    /// Writes of a scaling flow at `level` (level 0 first: it protects the control plane).
    pub(crate) fn scaling_level(level: u32) -> Priority {
        Priority(
            u16::try_from(level)
                .unwrap_or(u16::MAX)
                .saturating_add(1)
                .min(998),
        )
    }

    /// The weeder's pod deletions: what it exists for, before starting more watches.
    pub(crate) const WEEDER_DELETE: Priority = Priority(999);

    /// Everything not marked otherwise: initial lists, watches, lookups.
    pub(crate) const DEFAULT: Priority = Priority(1000);

    /// The weeder's pod watches, on a budget of their own (see [`Priority::own_budget`]).
    pub(crate) const WEEDER_POD_WATCHES: Priority = Priority(1500);

    /// Kubernetes Events: useful to people, never worth delaying a scaling write for.
    pub(crate) const EVENTS: Priority = Priority(2000);
}

impl Priority {
    /// Whether requests of this priority draw from a second bucket of the same `qps` and
    /// `burst` instead of the main one. Only the weeder's pod watches do: the reference
    /// starts them through a clientset of its own (rate limited separately from the
    /// controller-runtime client that deletes the pods), so a storm of weeders gets two
    /// budgets there, and one here would make every deletion wait for every watch.
    pub(crate) fn own_budget(self) -> bool {
        self == Priority::WEEDER_POD_WATCHES
    }
}

/// A client sending through `seed` (same stack, same buckets) whose every request is ranked
/// at `priority` (see [`crate::client::request_settings`]).
pub(crate) fn prioritized(seed: &kube::Client, priority: Priority) -> kube::Client {
    let mut settings = http::Extensions::new();
    settings.insert(priority);
    crate::client::request_settings::with_settings(seed, settings)
}

/// A request that says how urgent it is.
pub(crate) trait HasPriority {
    /// The request's priority on the bucket.
    fn priority(&self) -> Priority;

    /// When to give up waiting for the budget, if ever (see [`StopWaiting`]).
    fn stop_waiting(&self) -> Option<StopWaiting> {
        None
    }

    /// Whom to tell when the request got its token (see [`OnSent`]).
    fn on_sent(&self) -> Option<OnSent> {
        None
    }
}

impl<B> HasPriority for http::Request<B> {
    /// The [`Priority`] in the request's extensions; [`Priority::DEFAULT`] without one.
    fn priority(&self) -> Priority {
        self.extensions()
            .get::<Priority>()
            .copied()
            .unwrap_or(Priority::DEFAULT)
    }

    fn stop_waiting(&self) -> Option<StopWaiting> {
        self.extensions().get::<StopWaiting>().cloned()
    }

    fn on_sent(&self) -> Option<OnSent> {
        self.extensions().get::<OnSent>().cloned()
    }
}

/// A request setting (in its extensions): notified (`notify_one`) each time the request got
/// its token and goes on to be sent, so a caller can start its own deadline there and not
/// count the wait for the budget against it.
#[derive(Debug, Clone)]
pub(crate) struct OnSent(pub Arc<Notify>);

/// A request setting (in its extensions): once this token is cancelled, the request, if it
/// still waits for a token of the budget, is not sent and fails with [`NotSent`].
#[derive(Debug, Clone)]
pub(crate) struct StopWaiting(pub tokio_util::sync::CancellationToken);

/// The error of a request that was never sent: its [`StopWaiting`] was cancelled while it
/// waited for the budget.
#[derive(Debug, thiserror::Error)]
#[error("not sent: stopped while waiting for the seed's request budget")]
pub(crate) struct NotSent;

/// Whether `error` (of a request through the limiter) means the request was never sent.
pub(crate) fn is_not_sent(error: &(dyn std::error::Error + 'static)) -> bool {
    crate::error::caused_by::<NotSent>(error)
}

/// A token bucket whose waiters are served by priority, then in arrival order.
#[derive(Debug)]
pub(crate) struct PriorityBucket {
    qps: f64,
    burst: f64,
    state: Mutex<BucketState>,
}

#[derive(Debug)]
struct BucketState {
    tokens: f64,
    updated: Instant,
    next_seq: u64,
    /// Waiting requests, most urgent first; each is woken through its own `Notify` when it
    /// becomes the head of the queue.
    waiters: BTreeMap<(Priority, u64), Arc<Notify>>,
}

impl BucketState {
    fn refill(&mut self, now: Instant, qps: f64, burst: f64) {
        let elapsed = now.saturating_duration_since(self.updated).as_secs_f64();
        self.tokens = (self.tokens + elapsed * qps).min(burst);
        self.updated = self.updated.max(now);
    }

    fn wake_head(&self) {
        if let Some(notify) = self.waiters.values().next() {
            notify.notify_one();
        }
    }
}

/// Removes a waiter that gave up (its request was dropped) and hands the head on.
struct Ticket<'a> {
    bucket: &'a PriorityBucket,
    key: (Priority, u64),
    done: bool,
}

impl Drop for Ticket<'_> {
    fn drop(&mut self) {
        if !self.done {
            let mut state = self.bucket.lock();
            state.waiters.remove(&self.key);
            state.wake_head();
        }
    }
}

impl PriorityBucket {
    /// A full bucket; a `qps` that is not a positive number or a `burst` of 0 mean the
    /// defaults, a `qps` below [`MIN_QPS`] is raised to it (warned about once per process).
    pub(crate) fn new(qps: f32, burst: u32) -> Self {
        let (qps, warning) = effective_qps(qps);
        if let Some(warning) = warning
            && !QPS_CLAMP_WARNED.swap(true, std::sync::atomic::Ordering::Relaxed)
        {
            tracing::warn!("{warning}");
        }
        let burst = f64::from(if burst == 0 { DEFAULT_BURST } else { burst });
        PriorityBucket {
            qps,
            burst,
            state: Mutex::new(BucketState {
                tokens: burst,
                updated: Instant::now(),
                next_seq: 0,
                waiters: BTreeMap::new(),
            }),
        }
    }

    #[cfg(test)]
    /// `(qps, burst)` in effect.
    pub(crate) fn limits(&self) -> (f64, f64) {
        (self.qps, self.burst)
    }

    fn lock(&self) -> MutexGuard<'_, BucketState> {
        // Nothing panics while the lock is held; if something did, the numbers are whole.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Waits for a token at `priority`.
    pub(crate) async fn acquire(&self, priority: Priority) {
        let notify = Arc::new(Notify::new());
        let mut ticket = {
            let mut state = self.lock();
            let key = (priority, state.next_seq);
            state.next_seq += 1;
            state.waiters.insert(key, notify.clone());
            Ticket {
                bucket: self,
                key,
                done: false,
            }
        };
        loop {
            let wait = {
                let mut state = self.lock();
                let now = Instant::now();
                state.refill(now, self.qps, self.burst);
                let is_head = state.waiters.keys().next() == Some(&ticket.key);
                if is_head && state.tokens >= 1.0 {
                    state.tokens -= 1.0;
                    state.waiters.remove(&ticket.key);
                    ticket.done = true;
                    // The next waiter may find a token too (a burst), or starts its own timer.
                    state.wake_head();
                    return;
                }
                // Only the head sleeps until the next token; the others wait to become head.
                // Checked: the rate is clamped, but no number may make this panic. At least
                // the timer's resolution: a wait that rounds to zero would not let the clock
                // (a paused one in tests) move on to refill anything.
                is_head.then(|| {
                    Duration::try_from_secs_f64((1.0 - state.tokens) / self.qps)
                        .unwrap_or(MAX_TOKEN_WAIT)
                        .clamp(MIN_TOKEN_WAIT, MAX_TOKEN_WAIT)
                })
            };
            match wait {
                Some(wait) => {
                    tokio::select! {
                        _ = tokio::time::sleep(wait) => {}
                        // A more urgent request arrived, or a waiter left: look again.
                        _ = notify.notified() => {}
                    }
                }
                None => notify.notified().await,
            }
        }
    }
}

/// A tower layer putting a [`PriorityBucket`] in front of a service taking `Req`s.
#[derive(Debug)]
pub(crate) struct RateLimitLayer<Req> {
    buckets: Buckets,
    _requests: std::marker::PhantomData<fn(Req)>,
}

/// The main bucket and the one for priorities with [`Priority::own_budget`].
#[derive(Debug, Clone)]
struct Buckets {
    main: Arc<PriorityBucket>,
    own: Arc<PriorityBucket>,
}

impl Buckets {
    fn for_priority(&self, priority: Priority) -> &Arc<PriorityBucket> {
        if priority.own_budget() {
            &self.own
        } else {
            &self.main
        }
    }
}

impl<Req> Clone for RateLimitLayer<Req> {
    fn clone(&self) -> Self {
        RateLimitLayer {
            buckets: self.buckets.clone(),
            _requests: std::marker::PhantomData,
        }
    }
}

impl<Req> RateLimitLayer<Req> {
    /// A layer with new full buckets (see [`PriorityBucket::new`] for the defaults).
    pub(crate) fn new(qps: f32, burst: u32) -> Self {
        RateLimitLayer {
            buckets: Buckets {
                main: Arc::new(PriorityBucket::new(qps, burst)),
                own: Arc::new(PriorityBucket::new(qps, burst)),
            },
            _requests: std::marker::PhantomData,
        }
    }
}

/// Requests waiting in the inner buffer at most (they already hold a token).
const BUFFER: usize = 1024;

impl<S, Req> tower::Layer<S> for RateLimitLayer<Req>
where
    S: tower::Service<Req> + Send + 'static,
    S::Future: Send,
    S::Error: Into<tower::BoxError> + Send + Sync,
    Req: HasPriority + Send + 'static,
{
    type Service = RateLimited<S, Req>;

    fn layer(&self, inner: S) -> RateLimited<S, Req> {
        RateLimited {
            // kube's client hands its stack to one buffer worker, which would serve waiters
            // in arrival order; the wait happens in the caller's task instead (in the
            // future `call` returns), and the request then goes through this buffer.
            inner: Buffer::new(inner, BUFFER),
            buckets: self.buckets.clone(),
        }
    }
}

/// A service that waits for a token of the shared bucket, at the request's priority
/// ([`HasPriority`]), before passing each request on.
pub(crate) struct RateLimited<S, Req>
where
    S: tower::Service<Req>,
{
    inner: Buffer<Req, S::Future>,
    buckets: Buckets,
}

impl<S, Req> tower::Service<Req> for RateLimited<S, Req>
where
    S: tower::Service<Req> + Send + 'static,
    S::Future: Send,
    S::Response: Send + 'static,
    S::Error: Into<tower::BoxError> + Send + Sync,
    Req: HasPriority + Send + 'static,
{
    type Response = S::Response;
    type Error = tower::BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, tower::BoxError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // Readiness is decided per request, in `call`'s future.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Req) -> Self::Future {
        let inner = self.inner.clone();
        let buckets = self.buckets.clone();
        let priority = req.priority();
        let stop = req.stop_waiting();
        let on_sent = req.on_sent();
        Box::pin(async move {
            let acquire = buckets.for_priority(priority).acquire(priority);
            match stop {
                None => acquire.await,
                Some(StopWaiting(stop)) => tokio::select! {
                    // Stopped before the wait began: not sent either.
                    biased;
                    _ = stop.cancelled() => return Err(NotSent.into()),
                    _ = acquire => {}
                },
            }
            if let Some(OnSent(sent)) = on_sent {
                sent.notify_one();
            }
            inner.oneshot(req).await
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::convert::Infallible;
    use tower::{Layer, Service};

    /// A test request: its id and its priority.
    #[derive(Clone, Copy)]
    struct Req(u32, Priority);

    impl HasPriority for Req {
        fn priority(&self) -> Priority {
            self.1
        }
    }

    /// A service that answers at once with the (paused-clock) time it was called.
    #[derive(Clone)]
    struct Clock;

    impl Service<Req> for Clock {
        type Response = (u32, Instant);
        type Error = Infallible;
        type Future = std::future::Ready<Result<(u32, Instant), Infallible>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, Req(id, _): Req) -> Self::Future {
            std::future::ready(Ok((id, Instant::now())))
        }
    }

    type Limited = RateLimited<Clock, Req>;

    /// Sends request `id` through the limiter; returns when it reached the inner service.
    async fn send(svc: &Limited, id: u32) -> Instant {
        send_at(svc, id, Priority::DEFAULT).await
    }

    /// Sends request `id` at `priority`; returns when it reached the inner service.
    async fn send_at(svc: &Limited, id: u32, priority: Priority) -> Instant {
        match svc.clone_service().oneshot(Req(id, priority)).await {
            Ok((_, at)) => at,
            Err(e) => panic!("request {id}: {e}"),
        }
    }

    impl Limited {
        fn clone_service(&self) -> Limited {
            RateLimited {
                inner: self.inner.clone(),
                buckets: self.buckets.clone(),
            }
        }
    }

    fn ms(d: Duration) -> u64 {
        u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
    }

    fn close(got: Duration, want_ms: u64) -> bool {
        got.abs_diff(Duration::from_millis(want_ms)) < Duration::from_millis(3)
    }

    #[tokio::test(start_paused = true)]
    async fn burst_goes_at_once_then_requests_are_spaced_by_one_over_qps() {
        let svc = RateLimitLayer::<Req>::new(5.0, 10).layer(Clock);
        let start = Instant::now();
        let mut sent = Vec::new();
        for i in 0..30 {
            sent.push(send(&svc, i).await - start);
        }
        // The first `burst` requests don't wait.
        assert!(sent[..10].iter().all(|d| ms(*d) < 3), "{sent:?}");
        // Request k (0-based, k ≥ burst) goes at (k + 1 − burst) / qps.
        for (k, at) in sent.iter().enumerate().skip(10) {
            let want = 200 * (k as u64 + 1 - 10);
            assert!(close(*at, want), "request {k} at {at:?}, want {want} ms");
        }
        // 30 requests with burst 10 at 5 qps: (30 − 10) / 5 = 4 s.
        assert!(close(sent[29], 4000), "{:?}", sent[29]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_stopped_while_it_waits_for_the_budget_is_not_sent_and_takes_no_token() {
        use tokio_util::sync::CancellationToken;
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = seen.clone();
        let inner = tower::service_fn(move |req: http::Request<u32>| {
            let id = *req.body();
            if let Ok(mut log) = log.lock() {
                log.push((id, Instant::now()));
            }
            std::future::ready(Ok::<_, Infallible>(()))
        });
        let mut svc = RateLimitLayer::<http::Request<u32>>::new(1.0, 1).layer(inner);
        let request = |id: u32, stop: Option<&CancellationToken>| {
            let mut req = http::Request::new(id);
            if let Some(stop) = stop {
                req.extensions_mut().insert(StopWaiting(stop.clone()));
            }
            req
        };
        let start = Instant::now();
        svc.call(request(0, None))
            .await
            .expect("the burst's request");
        // Request 1 waits for the next token (1 s), request 2 behind it.
        let stop = CancellationToken::new();
        let stopped = tokio::spawn(svc.call(request(1, Some(&stop))));
        let behind = tokio::spawn(svc.call(request(2, None)));
        tokio::time::sleep(Duration::from_millis(100)).await;
        stop.cancel();
        let error = stopped
            .await
            .expect("task")
            .expect_err("stopped while waiting");
        assert!(is_not_sent(error.as_ref()), "{error}");
        behind.await.expect("task").expect("sent");
        // A token already cancelled: not sent even with a token at hand (after 10 s idle).
        tokio::time::sleep(Duration::from_secs(10)).await;
        let error = svc
            .call(request(3, Some(&stop)))
            .await
            .expect_err("stopped before it waited");
        assert!(is_not_sent(error.as_ref()), "{error}");
        // Request 1 never reached the service, and its place went to request 2 at 1 s.
        let seen = seen.lock().expect("log").clone();
        let ids: Vec<u32> = seen.iter().map(|(id, _)| *id).collect();
        assert_eq!(ids, [0, 2], "{seen:?}");
        assert!(close(seen[1].1 - start, 1000), "{seen:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn pod_watches_draw_from_a_budget_of_their_own() {
        let svc = RateLimitLayer::<Req>::new(1.0, 2).layer(Clock);
        let start = Instant::now();
        // The main bucket's burst is used up...
        for i in 0..2 {
            send(&svc, i).await;
        }
        // ...yet two pod watches go at once (their own burst), the third waits for its refill,
        let mut watches = Vec::new();
        for i in 10..13 {
            watches.push(send_at(&svc, i, Priority::WEEDER_POD_WATCHES).await - start);
        }
        assert!(ms(watches[0]) < 3 && ms(watches[1]) < 3, "{watches:?}");
        assert!(close(watches[2], 1000), "{watches:?}");
        // ...and the main bucket refilled on its own meanwhile: one token after 1 s.
        let main = send(&svc, 3).await - start;
        assert!(close(main, 1000), "{main:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn idle_time_refills_at_most_burst_tokens() {
        let svc = RateLimitLayer::<Req>::new(2.0, 3).layer(Clock);
        for i in 0..3 {
            send(&svc, i).await;
        }
        tokio::time::advance(Duration::from_secs(60)).await;
        let start = Instant::now();
        let mut sent = Vec::new();
        for i in 0..5 {
            sent.push(send(&svc, i).await - start);
        }
        // 60 s idle refill only 3 tokens: the 4th and 5th wait 0.5 s and 1 s.
        assert!(sent[..3].iter().all(|d| ms(*d) < 3), "{sent:?}");
        assert!(close(sent[3], 500), "{sent:?}");
        assert!(close(sent[4], 1000), "{sent:?}");
    }

    /// Starts `n` requests at once from separate tasks, request `i` at `priority(i)`;
    /// returns `(id, sent after)` in the order they reached the service.
    async fn concurrent(
        svc: &Limited,
        n: u32,
        priority: impl Fn(u32) -> Priority,
    ) -> Vec<(u32, Duration)> {
        let start = Instant::now();
        let tasks: Vec<_> = (0..n)
            .map(|i| {
                let svc = svc.clone_service();
                let p = priority(i);
                tokio::spawn(async move { (i, send_at(&svc, i, p).await) })
            })
            .collect();
        let mut sent = Vec::new();
        for t in tasks {
            match t.await {
                Ok((i, at)) => sent.push((i, at - start)),
                Err(e) => panic!("task: {e}"),
            }
        }
        sent.sort_by_key(|(i, at)| (*at, *i));
        sent
    }

    #[tokio::test(start_paused = true)]
    async fn concurrent_callers_of_one_priority_share_one_bucket_in_order() {
        // Clones share the bucket, as every clone of a kube Client does.
        let svc = RateLimitLayer::<Req>::new(10.0, 2).layer(Clock);
        let sent = concurrent(&svc, 6, |_| Priority::DEFAULT).await;
        let times: Vec<u64> = sent.iter().map(|(_, d)| ms(*d)).collect();
        for (got, want) in times.iter().zip([0, 0, 100, 200, 300, 400]) {
            assert!(got.abs_diff(want) < 3, "{times:?}");
        }
        let order: Vec<u32> = sent.iter().map(|(i, _)| *i).collect();
        assert_eq!(
            order,
            vec![0, 1, 2, 3, 4, 5],
            "arrival order within a priority"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn urgent_requests_overtake_waiting_ones() {
        // Burst 1: request 0 goes at once, everything else waits; the even requests are
        // level 0 of a scale-down, the odd ones events.
        let svc = RateLimitLayer::<Req>::new(10.0, 1).layer(Clock);
        let sent = concurrent(&svc, 7, |i| {
            if i % 2 == 0 {
                Priority::scaling_level(0)
            } else {
                Priority::EVENTS
            }
        })
        .await;
        let order: Vec<u32> = sent.iter().map(|(i, _)| *i).collect();
        // 0 took the only token; then every level-0 request before any event.
        assert_eq!(order, vec![0, 2, 4, 6, 1, 3, 5], "{sent:?}");
        // Still one token per 100 ms: priorities reorder, they don't add capacity.
        assert!(close(sent[6].1, 600), "{sent:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_late_urgent_request_goes_before_earlier_less_urgent_ones() {
        let svc = RateLimitLayer::<Req>::new(10.0, 1).layer(Clock);
        send(&svc, 0).await; // empties the bucket
        let start = Instant::now();
        let low: Vec<_> = (1..=3)
            .map(|i| {
                let svc = svc.clone_service();
                tokio::spawn(async move { send_at(&svc, i, Priority::EVENTS).await - start })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(150)).await; // request 1 went at 100 ms
        let urgent = {
            let svc = svc.clone_service();
            tokio::spawn(async move { send_at(&svc, 9, Priority::scaling_level(0)).await - start })
        };
        let urgent_at = urgent.await.unwrap_or_default();
        let mut low_at = Vec::new();
        for t in low {
            low_at.push(t.await.unwrap_or_default());
        }
        assert!(close(low_at[0], 100), "{low_at:?}");
        // The urgent one takes the 200 ms token; requests 2 and 3 follow at 300 and 400 ms.
        assert!(close(urgent_at, 200), "{urgent_at:?}");
        assert!(close(low_at[1], 300) && close(low_at[2], 400), "{low_at:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_cancelled_waiter_passes_its_turn_on() {
        let svc = RateLimitLayer::<Req>::new(10.0, 1).layer(Clock);
        send(&svc, 0).await;
        let start = Instant::now();
        let first = {
            let svc = svc.clone_service();
            tokio::spawn(async move { send(&svc, 1).await })
        };
        tokio::task::yield_now().await;
        let second = {
            let svc = svc.clone_service();
            tokio::spawn(async move { send(&svc, 2).await - start })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        first.abort();
        // Without the hand-over the second would wait for a wake-up that never comes.
        let at = second.await.unwrap_or_default();
        assert!(close(at, 100), "{at:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn absurdly_small_rates_are_raised_and_never_panic() {
        for qps in [1e-20_f32, f32::MIN_POSITIVE, 1e-45] {
            assert_eq!(PriorityBucket::new(qps, 1).limits(), (MIN_QPS, 1.0));
            let (used, warning) = effective_qps(qps);
            assert_eq!(used, MIN_QPS);
            assert!(
                warning.is_some_and(|w| w.starts_with("--kube-api-qps=")),
                "{qps}"
            );
        }
        assert_eq!(effective_qps(0.5), (0.5, None));
        assert_eq!(effective_qps(f32::MAX).0, f64::from(f32::MAX));
        // The second request of a 1-token bucket at 1e-20 qps waits 100 s, not forever.
        let bucket = PriorityBucket::new(1e-20, 1);
        let started = Instant::now();
        bucket.acquire(Priority::DEFAULT).await;
        bucket.acquire(Priority::DEFAULT).await;
        assert!(
            started.elapsed() <= Duration::from_secs(101),
            "{:?}",
            started.elapsed()
        );
        // A huge rate refills at once and never overflows either.
        let bucket = PriorityBucket::new(f32::MAX, 1);
        for _ in 0..3 {
            bucket.acquire(Priority::DEFAULT).await;
        }
    }

    #[test]
    fn zero_or_invalid_flags_mean_client_go_defaults() {
        for (qps, burst) in [(0.0, 0), (-1.0, 0), (f32::NAN, 0)] {
            assert_eq!(PriorityBucket::new(qps, burst).limits(), (5.0, 10.0));
        }
        assert_eq!(PriorityBucket::new(50.0, 100).limits(), (50.0, 100.0));
    }

    #[test]
    fn priorities_rank_cache_feeds_then_scaling_levels_before_everything_else() {
        assert!(Priority::WATCH_CACHES < Priority::scaling_level(0));
        assert!(Priority::scaling_level(0) < Priority::scaling_level(1));
        assert!(Priority::scaling_level(u32::MAX) < Priority::WEEDER_DELETE);
        assert!(Priority::WEEDER_DELETE < Priority::DEFAULT);
        assert!(Priority::WEEDER_POD_WATCHES.own_budget());
        assert!(!Priority::DEFAULT.own_budget() && !Priority::WATCH_CACHES.own_budget());
        assert!(Priority::DEFAULT < Priority::EVENTS);
    }
}
