//! Per-request settings of a kube client (the seed request's `Priority` on the shared
//! token bucket, the `Deadline` of `Retry-After` waits), carried explicitly in each HTTP
//! request's extensions.
//!
//! Why this shape: a kube [`Client`] hides its tower stack and an `Api` builds its requests
//! itself, so a setting can't be passed along with one call. Instead [`with_settings`] makes
//! a client *handle* whose every request carries the given extensions and is then sent
//! through the base client: the same stack (counted, rate limited, retried) and the same
//! token buckets, only ranked or bounded differently. The layers read the settings from the
//! request they are given (`rate_limit::RateLimited` its priority, `retry_after::RetryAfter`
//! its deadline; this module knows neither), so:
//!
//! - a function's priority shows in the handle it is given or builds (e.g.
//!   `rate_limit::prioritized(&seed, Priority::EVENTS)`), not in the task that happens to
//!   run it;
//! - a handle keeps its settings wherever it goes: a `tokio::spawn` can't drop them (a
//!   task-local would be silently lost there);
//! - requests without a setting get the layer's default (`Priority::DEFAULT`, no deadline
//!   but the layer's own budget).
//!
//! A handle made from another handle: the most recent settings win (they are stamped
//! first, and a stamp never overwrites what a request already carries).
//!
//! Cost: each handle is one more `tower::Buffer` (one idle task) between the caller and the
//! base client's buffer. Handles are made once per watch cache, event worker and weeder, and
//! once per scaling call (whose deadline is its own).

use futures::future::BoxFuture;
use http::{Extensions, Request, Response};
use kube::Client;
use kube::client::Body;
use std::task::{Context, Poll};

/// A client sending through `base`, every request carrying `settings` (unless it already
/// carries a value of the same type: see the module documentation).
pub(crate) fn with_settings(base: &Client, settings: Extensions) -> Client {
    Client::new(
        Stamp {
            base: base.clone(),
            settings,
        },
        base.default_namespace().to_owned(),
    )
}

/// Adds the settings to each request and sends it through the base client.
#[derive(Clone)]
struct Stamp {
    base: Client,
    settings: Extensions,
}

impl tower::Service<Request<Body>> for Stamp {
    type Response = Response<Body>;
    type Error = kube::Error;
    type Future = BoxFuture<'static, Result<Response<Body>, kube::Error>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // The base client's buffer is waited for in `send`.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, mut request: Request<Body>) -> Self::Future {
        let mut extensions = self.settings.clone();
        // What the request carries already (stamped by a more recent handle) wins.
        extensions.extend(std::mem::take(request.extensions_mut()));
        *request.extensions_mut() = extensions;
        let base = self.base.clone();
        Box::pin(async move { base.send(request).await })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    #[derive(Clone, Copy, Debug, PartialEq)]
    struct Setting(u32);

    /// A base client recording the `Setting` of every request it sees.
    fn recording() -> (Client, Arc<Mutex<Vec<Option<Setting>>>>) {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = seen.clone();
        let service = tower::service_fn(move |req: Request<Body>| {
            if let Ok(mut log) = log.lock() {
                log.push(req.extensions().get::<Setting>().copied());
            }
            std::future::ready(Ok::<_, std::convert::Infallible>(Response::new(
                Body::empty(),
            )))
        });
        (Client::new(service, "default"), seen)
    }

    fn settings(value: u32) -> Extensions {
        let mut e = Extensions::new();
        e.insert(Setting(value));
        e
    }

    async fn get(client: &Client) {
        let request = Request::get("/version")
            .body(Body::empty())
            .expect("request");
        client.send(request).await.expect("answer");
    }

    #[tokio::test]
    async fn requests_carry_the_handles_settings_across_spawns_and_the_newest_wins() {
        let (base, seen) = recording();
        get(&base).await;
        let one = with_settings(&base, settings(1));
        // A spawned task keeps the handle's setting (a task-local would be dropped here).
        let spawned = tokio::spawn({
            let one = one.clone();
            async move { get(&one).await }
        });
        spawned.await.expect("task");
        let two = with_settings(&one, settings(2));
        get(&two).await;
        assert_eq!(
            *seen.lock().expect("log"),
            vec![None, Some(Setting(1)), Some(Setting(2))]
        );
        assert_eq!(two.default_namespace(), "default");
    }
}
