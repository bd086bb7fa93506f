//! Watch caches of seed objects, indexed by namespace.
//!
//! The prober reads the kubeconfig secrets, Machines and scaling targets of a thousand shoots
//! every few seconds; fetching them again on each run would put that load on the seed's
//! apiserver. Instead one watch per kind (with `default_backoff()`, re-listing as needed) feeds
//! a [`Cache`] that keeps only the few fields we read (`T`, not the whole object) and lets a
//! probe look up its own namespace without scanning everyone else's.
//!
//! Every change bumps a version on a `watch` channel, so a scaler can wait for "target ready"
//! by watching instead of polling.

use std::collections::HashMap;
use std::fmt::Debug;
use std::sync::{Arc, RwLock};

use futures::{StreamExt, TryStreamExt};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Resource};
use serde::de::DeserializeOwned;
use tokio::sync::watch;

use crate::rate_limit::{Priority, with_priority};

/// Why [`Cache::wait_until`] returned without its condition holding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitEnd {
    /// The limit passed first.
    TimedOut,
    /// The cache was dropped.
    Closed,
}

type Shelf<T> = HashMap<String, HashMap<String, Arc<T>>>;

/// A namespace-indexed cache of projections `T` of some Kubernetes kind.
#[derive(Debug)]
pub struct Cache<T> {
    what: &'static str,
    objects: RwLock<Shelf<T>>,
    version: watch::Sender<u64>,
    ready: watch::Sender<bool>,
}

impl<T: Send + Sync + 'static> Cache<T> {
    /// An empty, not yet synced cache; `what` names it in logs and errors.
    pub fn new(what: &'static str) -> Arc<Self> {
        Arc::new(Cache {
            what,
            objects: RwLock::new(HashMap::new()),
            version: watch::channel(0).0,
            ready: watch::channel(false).0,
        })
    }

    /// What this cache holds.
    pub fn what(&self) -> &'static str {
        self.what
    }

    /// Whether the initial list has completed.
    pub fn is_ready(&self) -> bool {
        *self.ready.borrow()
    }

    /// A receiver of the ready flag (current value marked seen).
    pub fn subscribe_ready(&self) -> watch::Receiver<bool> {
        self.ready.subscribe()
    }

    /// Waits until the initial list has completed.
    pub async fn wait_ready(&self) {
        let mut rx = self.ready.subscribe();
        let _ = rx.wait_for(|r| *r).await;
    }

    /// The object `namespace/name`, if cached.
    pub fn get(&self, namespace: &str, name: &str) -> Option<Arc<T>> {
        let shelf = self
            .objects
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        shelf.get(namespace).and_then(|ns| ns.get(name)).cloned()
    }

    /// All cached objects of one namespace.
    pub fn in_namespace(&self, namespace: &str) -> Vec<Arc<T>> {
        let shelf = self
            .objects
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        shelf
            .get(namespace)
            .map(|ns| ns.values().cloned().collect())
            .unwrap_or_default()
    }

    /// Number of cached objects.
    pub fn len(&self) -> usize {
        let shelf = self
            .objects
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        shelf.values().map(HashMap::len).sum()
    }

    /// Whether the cache is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A receiver that changes whenever any object changes.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.version.subscribe()
    }

    /// Waits, watching the cache (no polling), at most `limit` until `holds` is true of the
    /// cached `namespace/name` (`None` while absent).
    pub async fn wait_until(
        &self,
        namespace: &str,
        name: &str,
        limit: std::time::Duration,
        holds: impl Fn(Option<&T>) -> bool,
    ) -> Result<(), WaitEnd> {
        // Subscribed before the first look: a change in between is not missed.
        let mut changes = self.version.subscribe();
        let waited = tokio::time::timeout(limit, async {
            loop {
                if holds(self.get(namespace, name).as_deref()) {
                    return Ok(());
                }
                if changes.changed().await.is_err() {
                    return Err(WaitEnd::Closed);
                }
            }
        })
        .await;
        waited.unwrap_or(Err(WaitEnd::TimedOut))
    }

    fn bump(&self) {
        self.version.send_modify(|v| *v = v.wrapping_add(1));
    }

    fn apply(&self, namespace: String, name: String, value: T) {
        {
            let mut shelf = self
                .objects
                .write()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            shelf
                .entry(namespace)
                .or_default()
                .insert(name, Arc::new(value));
        }
        self.bump();
    }

    fn delete(&self, namespace: &str, name: &str) {
        {
            let mut shelf = self
                .objects
                .write()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if let Some(ns) = shelf.get_mut(namespace) {
                ns.remove(name);
                if ns.is_empty() {
                    shelf.remove(namespace);
                }
            }
        }
        self.bump();
    }

    fn replace(&self, fresh: Shelf<T>) {
        {
            let mut shelf = self
                .objects
                .write()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            *shelf = fresh;
        }
        self.ready.send_replace(true);
        self.bump();
    }
}

/// Feeds `cache` from a watch on `api` forever (re-listing with backoff on errors), keeping
/// `project(obj)` of each object. Objects that project to `None` are not cached.
pub async fn run_cache<K, T, F>(
    api: Api<K>,
    config: watcher::Config,
    cache: Arc<Cache<T>>,
    project: F,
) where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    T: Send + Sync + 'static,
    F: Fn(&K) -> Option<T> + Send + 'static,
{
    // Ahead of every write in the seed budget (see `Priority::WATCH_CACHES`).
    with_priority(
        Priority::WATCH_CACHES,
        feed_cache(api, config, cache, project),
    )
    .await;
}

async fn feed_cache<K, T, F>(api: Api<K>, config: watcher::Config, cache: Arc<Cache<T>>, project: F)
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    T: Send + Sync + 'static,
    F: Fn(&K) -> Option<T> + Send + 'static,
{
    let what = cache.what();
    let mut fresh: Option<Shelf<T>> = None;
    let mut events = watcher::watcher(api, config).default_backoff().boxed();
    loop {
        let event = match events.try_next().await {
            Ok(Some(event)) => event,
            Ok(None) => break,
            Err(e) => {
                // default_backoff() already delays the retry; just report it.
                tracing::warn!(cache = what, error = %e, "watch failed, retrying");
                continue;
            }
        };
        match event {
            Event::Init => fresh = Some(HashMap::new()),
            Event::InitApply(obj) => {
                if let (Some(shelf), Some((ns, name))) = (fresh.as_mut(), key_of(&obj))
                    && let Some(value) = project(&obj)
                {
                    shelf.entry(ns).or_default().insert(name, Arc::new(value));
                }
            }
            Event::InitDone => {
                let shelf = fresh.take().unwrap_or_default();
                let count: usize = shelf.values().map(HashMap::len).sum();
                cache.replace(shelf);
                tracing::debug!(cache = what, objects = count, "cache synced");
            }
            Event::Apply(obj) => {
                if let Some((ns, name)) = key_of(&obj) {
                    match project(&obj) {
                        Some(value) => cache.apply(ns, name, value),
                        None => cache.delete(&ns, &name),
                    }
                }
            }
            Event::Delete(obj) => {
                if let Some((ns, name)) = key_of(&obj) {
                    cache.delete(&ns, &name);
                }
            }
        }
    }
}

fn key_of<K: Resource>(obj: &K) -> Option<(String, String)> {
    let name = obj.meta().name.clone()?;
    Some((obj.meta().namespace.clone().unwrap_or_default(), name))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn wait_until_sees_a_change_made_while_waiting_and_gives_up_at_its_limit() {
        let cache: Arc<Cache<u32>> = Cache::new("numbers");
        cache.apply("ns".into(), "a".into(), 1);
        // Already true: no wait.
        assert_eq!(
            cache
                .wait_until("ns", "a", Duration::ZERO, |v| v == Some(&1))
                .await,
            Ok(())
        );
        // Becomes true after 3 s of (paused) time.
        let writer = cache.clone();
        let started = tokio::time::Instant::now();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(3)).await;
            writer.apply("ns".into(), "a".into(), 2);
        });
        let newer = cache
            .wait_until("ns", "a", Duration::from_secs(30), |v| v != Some(&1))
            .await;
        assert_eq!(newer, Ok(()));
        assert_eq!(started.elapsed(), Duration::from_secs(3));
        // Never true: times out after exactly the limit.
        let started = tokio::time::Instant::now();
        let never = cache
            .wait_until("ns", "b", Duration::from_secs(30), |v| v.is_some())
            .await;
        assert_eq!(never, Err(WaitEnd::TimedOut));
        assert_eq!(started.elapsed(), Duration::from_secs(30));
    }
}
