//! The registry of running weeders: at most one per `namespace/slice`.
//!
//! A slice that turns ready again while its weeder still runs gets a fresh weeder with a fresh
//! `watchDuration` (docs/behaviour.md §3.4); the old one is cancelled first, so a namespace never
//! has two sets of pod watches for the same slice. Entries carry a generation so that a replaced
//! weeder finishing late cannot remove its successor's entry.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::pods::Weeder;
use crate::metrics::Metrics;

/// What [`Weeders::start`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartOutcome {
    /// No weeder ran for this key; one was started.
    Started,
    /// A running weeder for this key was cancelled and replaced.
    Replaced,
}

struct Running {
    generation: u64,
    cancel: CancellationToken,
}

/// Counts a weeder task from spawn until its future is dropped (finished or aborted).
struct LiveTask(Arc<AtomicUsize>);

impl LiveTask {
    fn new(count: Arc<AtomicUsize>) -> Self {
        count.fetch_add(1, Ordering::SeqCst);
        LiveTask(count)
    }
}

impl Drop for LiveTask {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Running weeders by `namespace/slice`.
pub struct Weeders {
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
    running: Mutex<HashMap<String, Running>>,
    started: AtomicU64,
    live: Arc<AtomicUsize>,
}

impl Weeders {
    /// An empty registry whose weeders all stop when `shutdown` is cancelled.
    pub fn new(metrics: Arc<Metrics>, shutdown: CancellationToken) -> Arc<Self> {
        Arc::new(Weeders {
            metrics,
            shutdown,
            running: Mutex::new(HashMap::new()),
            started: AtomicU64::new(0),
            live: Arc::new(AtomicUsize::new(0)),
        })
    }

    /// The process metrics weeders report to.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    fn running(&self) -> MutexGuard<'_, HashMap<String, Running>> {
        self.running
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn set_gauge(&self, running: &HashMap<String, Running>) {
        self.metrics
            .active_weeders
            .set(i64::try_from(running.len()).unwrap_or(i64::MAX));
    }

    /// Starts `weeder`, cancelling a weeder that still runs for the same key.
    pub fn start(self: &Arc<Self>, weeder: Weeder) -> StartOutcome {
        let key = weeder.key();
        let generation = self.started.fetch_add(1, Ordering::SeqCst) + 1;
        let cancel = self.shutdown.child_token();
        let span = tracing::info_span!(
            "weeder",
            namespace = %weeder.namespace,
            slice = %weeder.slice,
            service = %weeder.service,
        );
        let outcome = {
            let mut running = self.running();
            let previous = running.insert(
                key.clone(),
                Running {
                    generation,
                    cancel: cancel.clone(),
                },
            );
            self.set_gauge(&running);
            match previous {
                Some(old) => {
                    old.cancel.cancel();
                    StartOutcome::Replaced
                }
                None => StartOutcome::Started,
            }
        };
        // Counted before the spawn, so `live_tasks` never under-reports a weeder that exists.
        let live = LiveTask::new(self.live.clone());
        let this = Arc::clone(self);
        tokio::spawn(
            async move {
                let _live = live;
                weeder.run(cancel).await;
                this.finished(&key, generation);
            }
            .instrument(span),
        );
        outcome
    }

    /// Removes the entry of a weeder that ended, unless a newer weeder took its key.
    fn finished(&self, key: &str, generation: u64) {
        let mut running = self.running();
        if running.get(key).is_some_and(|r| r.generation == generation) {
            running.remove(key);
            self.set_gauge(&running);
        }
    }

    /// Number of weeders running (one per key).
    pub fn active(&self) -> usize {
        self.running().len()
    }

    /// Keys (`namespace/slice`) of the running weeders, sorted.
    pub fn keys(&self) -> Vec<String> {
        let mut keys: Vec<String> = self.running().keys().cloned().collect();
        keys.sort();
        keys
    }

    /// Weeder tasks that still exist, including cancelled ones that have not wound down yet:
    /// equals [`Weeders::active`] once things settle, or tasks leak.
    pub fn live_tasks(&self) -> usize {
        self.live.load(Ordering::SeqCst)
    }

    /// Weeders started since the registry was created (replacements included).
    pub fn started_total(&self) -> u64 {
        self.started.load(Ordering::SeqCst)
    }

    /// Cancels every weeder.
    pub(crate) fn stop_all(&self) {
        let mut running = self.running();
        for (_, r) in running.drain() {
            r.cancel.cancel();
        }
        self.set_gauge(&running);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// A weeder whose pod watches can never connect: the registry is what's under test.
    fn weeder(namespace: &str, watch_duration: Duration, metrics: &Arc<Metrics>) -> Weeder {
        let url = "http://127.0.0.1:9".parse().expect("static URL");
        let client = kube::Client::try_from(kube::Config::new(url)).expect("client");
        let selector = dwd_core::PodSelector::new(
            std::collections::BTreeMap::from([("role".to_string(), "apiserver".to_string())]),
            Vec::new(),
        )
        .expect("valid selector");
        Weeder {
            namespace: namespace.into(),
            slice: "etcd-main-client".into(),
            service: "etcd-main-client".into(),
            selectors: Arc::from(vec![selector]),
            watch_duration,
            client,
            hands: Arc::new(crate::weeder::deleter::Deleters::new(
                metrics.clone(),
                crate::observe::events::Events::disabled(metrics.clone()),
            )),
            claims: crate::weeder::claims::PodClaims::default().namespace(namespace),
        }
    }

    /// Lets spawned tasks run until `done` holds (within 10 s).
    async fn settle(done: impl Fn() -> bool) {
        for _ in 0..1000 {
            if done() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("did not settle");
    }

    #[tokio::test]
    async fn a_new_weeder_for_the_same_key_replaces_the_old_one() {
        let metrics = Arc::new(Metrics::default());
        let weeders = Weeders::new(metrics.clone(), CancellationToken::new());
        let minute = Duration::from_secs(60);
        assert_eq!(
            weeders.start(weeder("a", minute, &metrics)),
            StartOutcome::Started
        );
        assert_eq!(
            weeders.start(weeder("a", minute, &metrics)),
            StartOutcome::Replaced
        );
        assert_eq!(
            weeders.start(weeder("b", minute, &metrics)),
            StartOutcome::Started
        );
        assert_eq!(weeders.keys(), ["a/etcd-main-client", "b/etcd-main-client"]);
        assert_eq!(metrics.active_weeders.get(), 2);
        assert_eq!(weeders.started_total(), 3);
        settle(|| weeders.live_tasks() == 2).await;
        // The replaced weeder's late exit must not remove its successor.
        assert_eq!(weeders.active(), 2);
    }

    #[tokio::test]
    async fn a_weeder_ends_after_its_watch_duration() {
        let metrics = Arc::new(Metrics::default());
        let weeders = Weeders::new(metrics.clone(), CancellationToken::new());
        weeders.start(weeder("a", Duration::from_millis(100), &metrics));
        weeders.start(weeder("b", Duration::from_secs(3600), &metrics));
        settle(|| weeders.live_tasks() == 1).await;
        assert_eq!(weeders.keys(), ["b/etcd-main-client"]);
        assert_eq!(metrics.active_weeders.get(), 1);
        weeders.stop_all();
        settle(|| weeders.live_tasks() == 0).await;
    }

    #[tokio::test]
    async fn stop_all_and_shutdown_end_every_weeder() {
        let metrics = Arc::new(Metrics::default());
        let shutdown = CancellationToken::new();
        let weeders = Weeders::new(metrics.clone(), shutdown.child_token());
        let hour = Duration::from_secs(3600);
        weeders.start(weeder("a", hour, &metrics));
        weeders.stop_all();
        assert_eq!(weeders.active(), 0);
        assert_eq!(metrics.active_weeders.get(), 0);
        settle(|| weeders.live_tasks() == 0).await;
        weeders.start(weeder("b", hour, &metrics));
        shutdown.cancel();
        settle(|| weeders.live_tasks() == 0).await;
        assert_eq!(weeders.keys(), Vec::<String>::new());
    }
}
