//! One weeder: for `watchDuration` after its service came back, weed the service's
//! crash-looping dependants in the slice's namespace.
//!
//! Each pod selector gets its own watch (kube-runtime's `watcher`): one streaming list (a watch
//! that first sends the pods that already exist; list + watch on seeds without WatchList),
//! re-created when the server ends it, with back-off after errors. Every pod the watch reports
//! goes to the watch's rules (`dwd_core::weeder::PodWatch`), which say what to do: weed it,
//! wait before the next attempt, or give the pod up until the watch lists again; this loop
//! does it. Two selectors, or the weeders of two slices of one service, may pick the same pod:
//! only the holder of its claim ([`super::claims`]) weeds it.
//!
//! What weeding is depends on the mode, chosen once at start ([`Hands`]): the acting
//! [`super::deleter`] deletes the pod (UID precondition, each attempt limited); shadow mode's
//! [`super::shadow`] records that it would have, and watches for the acting watchdog's
//! deletions. Nothing here asks which mode it runs in.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use dwd_core::PodSelector;
use dwd_core::weeder::{DeleteAnswer, DeletionTarget, PodEvent, PodStep, PodWatch};
use futures::future::BoxFuture;
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::watcher::{self, Event};
use kube::runtime::{WatchStreamExt, watcher as watch_pods};
use kube::{Api, Client};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::claims::{Claim, NamespaceClaims};
use crate::client::rate_limit::{Priority, prioritized};

/// What the weeders do with the pods their rules pick, chosen once at start: the acting
/// deleter, or shadow mode's recorder. Makes the hands of each pod watch.
pub(crate) trait Hands: Send + Sync {
    /// The hands of `weeder`'s watch of the pods `selector` selects.
    fn for_watch(&self, weeder: &Weeder, selector: &PodSelector) -> Box<dyn PodHands>;
}

/// One pod watch's hands: what the watch saw goes to them, and they carry out the rules'
/// deletions. The hooks of a mode that has no use for them do nothing.
pub(crate) trait PodHands: Send {
    /// A (re-)list of the watch begins.
    fn list_begins(&mut self) {}
    /// The (re-)list is complete.
    fn list_done(&mut self) {}
    /// The watch reported `pod` listed, added or changed (before the rules weigh it).
    fn seen(&mut self, _pod: &Pod) {}
    /// The watch reported `pod` gone.
    fn gone(&mut self, _pod: &Pod) {}
    /// One attempt to weed `target`, claimed by this watch.
    fn attempt<'a>(&'a mut self, target: &'a DeletionTarget) -> BoxFuture<'a, DeleteAnswer>;
    /// `target` is weeded: by this watch (`deleted`), or it was gone already.
    fn done(&mut self, _target: &DeletionTarget, _deleted: bool) {}
    /// Every attempt to weed `target` failed; the watch lists again after `relist_after`.
    fn gave_up(&mut self, _target: &DeletionTarget, _relist_after: Duration) {}
}

/// One weeder: a slice of `service` in `namespace` turned ready.
pub struct Weeder {
    /// The slice's namespace: the only namespace this weeder touches.
    pub namespace: String,
    /// The EndpointSlice's name.
    pub slice: String,
    /// The service that came back.
    pub service: String,
    /// Selectors of the service's dependants.
    pub selectors: Arc<[PodSelector]>,
    /// How long the weeder lives.
    pub watch_duration: Duration,
    /// Seed client.
    pub client: Client,
    /// What its watches do with the pods the rules pick (delete, or in shadow mode record).
    pub(crate) hands: Arc<dyn Hands>,
    /// The pods claimed by the weeders of `namespace` (one per slice: a dual-stack service has
    /// two), shared so that each pod gets one deletion ([`super::claims`]).
    pub claims: Arc<NamespaceClaims>,
}

impl Weeder {
    /// `namespace/slice`: the registry key.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.slice)
    }

    /// Runs until `watchDuration` passed or `cancel` fired.
    pub async fn run(self, cancel: CancellationToken) {
        info!(watch_duration = ?self.watch_duration, selectors = self.selectors.len(), "weeder started");
        let watches = futures::future::join_all(
            self.selectors
                .iter()
                .map(|selector| self.watch_selector(selector)),
        );
        tokio::select! {
            _ = tokio::time::sleep(self.watch_duration) => info!("weeder ended: watch duration passed"),
            _ = cancel.cancelled() => info!("weeder stopped: replaced or shutting down"),
            _ = watches => warn!("weeder ended: its pod watches ended"),
        }
    }

    /// Feeds the watch of `selector`'s pods to its rules and its hands, and does what the
    /// rules say.
    async fn watch_selector(&self, selector: &PodSelector) {
        let mut hands = self.hands.for_watch(self, selector);
        let mut rules = PodWatch::new(&self.namespace, selector);
        // The watches' requests (their start, re-watches) go on the pod watches' own budget.
        let api = Api::namespaced(
            prioritized(&self.client, Priority::WEEDER_POD_WATCHES),
            &self.namespace,
        );
        let mut pods = PodStream::new(api, selector.to_query());
        while let Some(event) = pods.next().await {
            let pod = match event {
                Event::Apply(pod) | Event::InitApply(pod) => pod,
                Event::Init => {
                    hands.list_begins();
                    continue;
                }
                Event::InitDone => {
                    hands.list_done();
                    continue;
                }
                Event::Delete(pod) => {
                    hands.gone(&pod);
                    continue;
                }
            };
            hands.seen(&pod);
            let PodStep::Delete(target) = rules.step(PodEvent::Seen(&pod)) else {
                continue;
            };
            // Two selectors, or the weeders of two slices of one service (dual-stack), may
            // pick the same pod, and a deleted pod keeps sending events (deletionTimestamp,
            // finalizers) until it is gone: only the claim's holder weeds it.
            let Some(claim) = self.claims.claim(&target.uid) else {
                continue;
            };
            if let Some(relist_after) = weed(&mut rules, hands.as_mut(), &target, claim).await {
                tokio::time::sleep(relist_after).await;
                pods.restart();
            }
        }
    }
}

/// Weeds `target` (claimed by `claim`) as the rules say: attempts, with pauses between
/// them, until it is done or given up. Returns when the watch should list again, after a
/// deletion that failed every attempt (its claim released, so it is tried again: by this
/// watch's new list, or by another weeder of the namespace).
async fn weed(
    rules: &mut PodWatch,
    hands: &mut dyn PodHands,
    target: &DeletionTarget,
    claim: Claim,
) -> Option<Duration> {
    let mut attempt = 1;
    loop {
        let answer = hands.attempt(target).await;
        match rules.step(PodEvent::Answered { attempt, answer }) {
            PodStep::Wait {
                pause,
                attempt: next,
            } => {
                tokio::time::sleep(pause).await;
                attempt = next;
            }
            PodStep::Done { deleted } => {
                claim.keep();
                hands.done(target, deleted);
                return None;
            }
            PodStep::GiveUp { relist_after } => {
                drop(claim);
                hands.gave_up(target, relist_after);
                return Some(relist_after);
            }
            // An answer never asks for another deletion; the claim is released.
            PodStep::Nothing | PodStep::Delete(_) => return None,
        }
    }
}

/// Set once the seed answered a streaming list with "bad request"/"invalid" (an apiserver
/// without the WatchList feature): every later pod watch of the process lists, then watches.
static STREAMING_LISTS_REJECTED: AtomicBool = AtomicBool::new(false);

/// Whether `e` is the seed refusing a streaming list (400 or 422), not a passing failure.
fn rejects_streaming_lists(e: &watcher::Error) -> bool {
    let code = match e {
        watcher::Error::WatchStartFailed(kube::Error::Api(s))
        | watcher::Error::InitialListFailed(kube::Error::Api(s))
        | watcher::Error::WatchFailed(kube::Error::Api(s)) => s.code,
        watcher::Error::WatchError(s) => s.code,
        _ => return false,
    };
    matches!(code, 400 | 422)
}

/// The events of one selector's pod watch: a streaming list, or list + watch on a seed that
/// refuses streaming lists; errors are logged and retried with back-off.
struct PodStream {
    api: Api<Pod>,
    /// The selector, as a label-selector query.
    query: String,
    streaming: bool,
    events: BoxStream<'static, Result<Event<Pod>, watcher::Error>>,
}

impl PodStream {
    fn new(api: Api<Pod>, query: String) -> Self {
        let streaming = !STREAMING_LISTS_REJECTED.load(Ordering::Relaxed);
        let events = Self::watch(&api, &query, streaming);
        PodStream {
            api,
            query,
            streaming,
            events,
        }
    }

    fn watch(
        api: &Api<Pod>,
        query: &str,
        streaming: bool,
    ) -> BoxStream<'static, Result<Event<Pod>, watcher::Error>> {
        let config = watcher::Config::default().labels(query);
        // A streaming list (one watch request with `sendInitialEvents`) instead of a list
        // and then a watch: in a storm every weeder starts at once and the seed budget is
        // shared. Seeds whose apiserver lacks WatchList get list + watch.
        let config = if streaming {
            config.streaming_lists()
        } else {
            config
        };
        watch_pods(api.clone(), config).default_backoff().boxed()
    }

    /// A new watch, which lists first.
    fn restart(&mut self) {
        self.events = Self::watch(&self.api, &self.query, self.streaming);
    }

    /// The next event; `None` when the watch ended.
    async fn next(&mut self) -> Option<Event<Pod>> {
        loop {
            match self.events.try_next().await {
                Ok(event) => return event,
                Err(e) if self.streaming && rejects_streaming_lists(&e) => {
                    warn!(selector = %self.query, error = %e, "the seed rejects streaming lists (WatchList); using list + watch");
                    STREAMING_LISTS_REJECTED.store(true, Ordering::Relaxed);
                    self.streaming = false;
                    self.restart();
                }
                Err(e) => {
                    // default_backoff() already delays the retry; just report it.
                    warn!(selector = %self.query, error = %e, "pod watch failed, retrying");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_refused_streaming_list_switches_to_list_and_watch() {
        let status = |code: u16| {
            Box::new(kube::core::Status {
                code,
                ..kube::core::Status::default()
            })
        };
        assert!(rejects_streaming_lists(&watcher::Error::WatchError(
            status(400)
        )));
        assert!(rejects_streaming_lists(&watcher::Error::WatchStartFailed(
            kube::Error::Api(status(422))
        )));
        // Forbidden, gone, server trouble: retried as they are.
        for code in [403, 410, 500, 503] {
            assert!(
                !rejects_streaming_lists(&watcher::Error::WatchError(status(code))),
                "{code}"
            );
        }
        assert!(!rejects_streaming_lists(&watcher::Error::NoResourceVersion));
    }
}
