//! One response-body wrapper for the clients' guards on what a server sends.
//!
//! Two guards watch response bodies as they arrive, before anything buffers them: the shoot
//! client's byte budget (a tenant's apiserver must not make the watchdog hold unbounded
//! memory, [`crate::client::kube_client`]) and the seed client's body deadline (a list page
//! that hangs mid-body must not hold a re-list for good, [`crate::client::seed_transport`]).
//! Each is a [`BodyGuard`]: it sees every data frame and may end the body with an error, and
//! it may end a body that is waiting for its next frame. The tower layer and the
//! `http_body::Body` that put a guard on every response are written once, here.

use std::pin::Pin;
use std::task::{Context, Poll};

use tower::BoxError;

/// A guard on one response body.
pub(crate) trait BodyGuard {
    /// Sees a data frame of `len` bytes as it arrives; an error ends the body with it.
    fn on_data(&mut self, len: u64) -> Result<(), BoxError> {
        let _ = len;
        Ok(())
    }

    /// Polled while the body waits for its next frame; `Ready(error)` ends the body.
    fn poll_expired(&mut self, cx: &mut Context<'_>) -> Poll<BoxError> {
        let _ = cx;
        Poll::Pending
    }
}

/// Makes the guard of each response, when its headers have arrived, from its request's URI
/// (a watch's body is a stream that lasts; a list's is not).
pub(crate) trait GuardResponses: Clone + Send + 'static {
    /// The guard it puts on a body.
    type Guard: BodyGuard;
    /// The guard of the response to a request for `uri`.
    fn guard(&self, uri: &http::Uri) -> Self::Guard;
}

/// Puts the guard `G` makes on every response body.
#[derive(Debug, Clone)]
pub(crate) struct GuardLayer<G>(pub(crate) G);

impl<S, G: Clone> tower::Layer<S> for GuardLayer<G> {
    type Service = Guarded<S, G>;
    fn layer(&self, inner: S) -> Self::Service {
        Guarded {
            inner,
            guards: self.0.clone(),
        }
    }
}

/// See [`GuardLayer`].
#[derive(Debug, Clone)]
pub(crate) struct Guarded<S, G> {
    inner: S,
    guards: G,
}

impl<S, G, ReqBody, B> tower::Service<http::Request<ReqBody>> for Guarded<S, G>
where
    S: tower::Service<http::Request<ReqBody>, Response = http::Response<B>>,
    S::Future: Send + 'static,
    G: GuardResponses,
    B: Send + 'static,
{
    type Response = http::Response<GuardedBody<B, G::Guard>>;
    type Error = S::Error;
    type Future = futures::future::BoxFuture<'static, Result<Self::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<ReqBody>) -> Self::Future {
        let (guards, uri) = (self.guards.clone(), req.uri().clone());
        let response = self.inner.call(req);
        Box::pin(async move {
            let response = response.await?;
            // Made now, not with the request: a deadline runs from the headers.
            let guard = guards.guard(&uri);
            Ok(response.map(|inner| GuardedBody { inner, guard }))
        })
    }
}

pin_project_lite::pin_project! {
    /// A response body under a guard: its frames pass through until the guard ends it.
    pub(crate) struct GuardedBody<B, K> {
        #[pin]
        inner: B,
        guard: K,
    }
}

impl<B, K> http_body::Body for GuardedBody<B, K>
where
    B: http_body::Body<Data = bytes::Bytes>,
    B::Error: Into<BoxError>,
    K: BodyGuard,
{
    type Data = bytes::Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        let this = self.project();
        match this.inner.poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                let len = frame.data_ref().map_or(0, |data| data.len() as u64);
                if let Err(error) = this.guard.on_data(len) {
                    return Poll::Ready(Some(Err(error)));
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(end) => Poll::Ready(end.map(|frame| frame.map_err(Into::into))),
            Poll::Pending => this.guard.poll_expired(cx).map(|error| Some(Err(error))),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}
