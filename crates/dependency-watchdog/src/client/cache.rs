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
//!
//! A cache is ready ([`Cache::is_ready`]) only while it is in sync. kube-runtime's watcher
//! retries a failing watch forever, re-watching from where it was, and says nothing when a
//! retry succeeds; while it fails, the cache silently ages. So when the errors keep coming for
//! [`STALE_AFTER`] ([`FailureStreak`]), the cache is marked [`SyncState::Stale`] (not ready:
//! no decision is taken from it and `/readyz` fails, naming it) and the watch is started anew,
//! which lists everything again; the cache is ready again once that list completed.
//!
//! Every feed sends through [`feed_client`]: ahead of every write in the seed budget, and
//! paused by a seed's `Retry-After` for at most [`FEED_MAX_RETRY_AFTER`].

use std::collections::HashMap;
use std::fmt::Debug;
use std::sync::{Arc, RwLock};

use futures::{Stream, StreamExt, TryStreamExt};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Resource};
use serde::de::DeserializeOwned;
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;

/// The longest pause a seed's `Retry-After` puts on a cache feed's request (a re-watch after
/// a dropped connection, a re-list). client-go sleeps the server's whole wait; here every
/// decision and every write's precondition come from these caches, so a seed answering
/// `Retry-After: 30` to a re-watch would freeze what the scaler sees for 30 s: a write that
/// conflicted waits for the cache to show the newer version, and a restore stalls with it (the
/// fault suite's `retry_after_longer_than_the_calls_deadline` held a cluster-autoscaler at 0
/// past its 25 s bound that way). The scaler waits up to its call timeout for a newer version;
/// 5 s keeps a cache within that of the seed after a storm, and costs the seed one re-watch per
/// feed every 5 s while it sheds load (a handful of feeds, rate limited like every request).
pub(crate) const FEED_MAX_RETRY_AFTER: Duration = Duration::from_secs(5);

/// A client sending through `seed` (same stack, same buckets) for the lists and watches that
/// feed a cache: ranked `Priority::WATCH_CACHES` and with its `Retry-After` waits capped at
/// [`FEED_MAX_RETRY_AFTER`] (see [`crate::client::request_settings`]).
pub(crate) fn feed_client(seed: &kube::Client) -> kube::Client {
    let mut settings = http::Extensions::new();
    settings.insert(crate::client::rate_limit::Priority::WATCH_CACHES);
    settings.insert(crate::client::retry_after::WaitCap(FEED_MAX_RETRY_AFTER));
    crate::client::request_settings::with_settings(seed, settings)
}

/// Why [`Cache::wait_until`] returned without its condition holding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitEnd {
    /// The limit passed first.
    TimedOut,
    /// The cache was dropped.
    Closed,
}

type Shelf<T> = HashMap<String, HashMap<String, Arc<T>>>;

/// How long a watch may keep failing before its cache counts as stale.
pub(crate) const STALE_AFTER: Duration = Duration::from_secs(10);
/// Errors at least this many apart are separate failures (the watch worked in between, but
/// the watcher reports only errors, never a successful retry). Longer than the watcher's
/// largest back-off between retries (30 s, plus up to as much jitter).
pub(crate) const FAILURE_GAP: Duration = Duration::from_secs(90);
/// Fewest errors of one failure before the cache counts as stale: two isolated errors a
/// minute apart are not a failing watch.
pub(crate) const STALE_MIN_ERRORS: u32 = 3;

/// Where a cache stands with its watch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum SyncState {
    /// The first list has not completed yet.
    Listing,
    /// The last list completed and the watch has not been failing for long.
    Synced,
    /// The watch kept failing (why, in words): the content may be stale until a new list
    /// completes.
    Stale(String),
}

/// One run of consecutive watch errors, to tell a failing watch from a passing error.
#[derive(Debug, Default, Clone)]
pub(crate) struct FailureStreak {
    first: Option<Instant>,
    last: Option<Instant>,
    errors: u32,
    /// Whether an error of this run was the seed's silence
    /// ([`crate::client::seed_transport::is_silence`]).
    silent: bool,
}

impl FailureStreak {
    /// Records an error at `now` (`silent`: it says the seed said nothing for 30 s or more);
    /// returns how long the watch has been failing.
    pub(crate) fn failed(&mut self, now: Instant, silent: bool) -> Duration {
        if self
            .last
            .is_some_and(|last| now.saturating_duration_since(last) >= FAILURE_GAP)
        {
            *self = FailureStreak::default();
        }
        let first = *self.first.get_or_insert(now);
        self.last = Some(now);
        self.errors = self.errors.saturating_add(1);
        self.silent |= silent;
        now.saturating_duration_since(first)
    }

    /// Records `error` at `now`, telling the seed's silence from other errors; returns why
    /// the cache behind the watch is stale when it is ([`Self::is_stale`]).
    pub(crate) fn record(
        &mut self,
        error: &(dyn std::error::Error + 'static),
        now: Instant,
    ) -> Option<String> {
        let silent = crate::client::seed_transport::is_silence(error);
        let failing_for = self.failed(now, silent);
        self.is_stale()
            .then(|| stale_reason(silent, failing_for, error))
    }

    /// Records an event: the watch works.
    pub(crate) fn succeeded(&mut self) {
        *self = FailureStreak::default();
    }

    /// Whether the watch has failed for long enough, often enough, to distrust its cache: at
    /// once after a silence (the seed already said nothing for 30 s or more, and a cache fed
    /// by a silent connection may be that far behind), else after [`STALE_MIN_ERRORS`] errors
    /// over [`STALE_AFTER`].
    pub(crate) fn is_stale(&self) -> bool {
        if self.silent {
            return true;
        }
        match (self.first, self.last) {
            (Some(first), Some(last)) => {
                self.errors >= STALE_MIN_ERRORS
                    && last.saturating_duration_since(first) >= STALE_AFTER
            }
            _ => false,
        }
    }
}

/// A namespace-indexed cache of projections `T` of some Kubernetes kind.
#[derive(Debug)]
pub struct Cache<T> {
    what: &'static str,
    objects: RwLock<Shelf<T>>,
    version: watch::Sender<u64>,
    sync: watch::Sender<SyncState>,
}

impl<T: Send + Sync + 'static> Cache<T> {
    /// An empty, not yet synced cache; `what` names it in logs and errors.
    pub fn new(what: &'static str) -> Arc<Self> {
        Arc::new(Cache {
            what,
            objects: RwLock::new(HashMap::new()),
            version: watch::channel(0).0,
            sync: watch::channel(SyncState::Listing).0,
        })
    }

    /// What this cache holds.
    pub fn what(&self) -> &'static str {
        self.what
    }

    /// Whether the cache is in sync: its last list completed and its watch is not failing
    /// for long. Decisions are taken only from ready caches.
    pub fn is_ready(&self) -> bool {
        *self.sync.borrow() == SyncState::Synced
    }

    /// Where the cache stands with its watch.
    pub(crate) fn sync_state(&self) -> SyncState {
        self.sync.borrow().clone()
    }

    /// A receiver of the sync state (current value marked seen).
    pub(crate) fn subscribe_sync(&self) -> watch::Receiver<SyncState> {
        self.sync.subscribe()
    }

    /// Waits until the cache is in sync.
    pub async fn wait_ready(&self) {
        let mut rx = self.sync.subscribe();
        let _ = rx.wait_for(|s| *s == SyncState::Synced).await;
    }

    /// The object `namespace/name`, if cached.
    pub fn get(&self, namespace: &str, name: &str) -> Option<Arc<T>> {
        let shelf = self
            .objects
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        shelf.get(namespace).and_then(|ns| ns.get(name)).cloned()
    }

    /// The namespaces holding at least one cached object.
    pub fn namespaces(&self) -> Vec<String> {
        let shelf = self
            .objects
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        shelf
            .iter()
            .filter(|(_, objects)| !objects.is_empty())
            .map(|(ns, _)| ns.clone())
            .collect()
    }

    /// All cached objects of one namespace.
    pub(crate) fn in_namespace(&self, namespace: &str) -> Vec<Arc<T>> {
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
    pub(crate) fn subscribe(&self) -> watch::Receiver<u64> {
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
        self.sync.send_replace(SyncState::Synced);
        self.bump();
    }

    fn mark_stale(&self, why: String) {
        self.sync.send_replace(SyncState::Stale(why));
    }
}

/// What a cache stands for while the seed refuses its watch (403: forbidden, or 404: the
/// kind is no longer served).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OnRefusal {
    /// Not in sync, as for any watch that keeps failing: nothing is decided from it.
    Unsynced,
    /// *Absent*, for an optional scaling target: synced and empty, with one warning, so the
    /// target counts as not found (an optional target not found is skipped in every flow) and
    /// does not hold back the other targets' and shoots' decisions, nor readiness. The watch is
    /// started anew then, and fills the cache once it lists again.
    Absent,
}

/// Feeds `cache` from a watch on `api` forever (re-listing with backoff on errors), keeping
/// `project(obj)` of each object. Objects that project to `None` are not cached; a refused
/// watch leaves the cache as `on_refusal` says.
///
/// On the seed, `api` comes from [`feed_client`]: ahead of every write in the seed budget, its
/// `Retry-After` pauses capped.
pub(crate) async fn run_cache<K, T, F>(
    api: Api<K>,
    config: watcher::Config,
    cache: Arc<Cache<T>>,
    project: F,
    on_refusal: OnRefusal,
) where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    T: Send + Sync + 'static,
    F: Fn(&K) -> Option<T> + Send + 'static,
{
    let start = move || {
        watcher::watcher(api.clone(), config.clone())
            .default_backoff()
            .boxed()
    };
    feed(start, cache, project, on_refusal == OnRefusal::Absent).await;
}

/// Whether the seed refused the watch or list for good, as far as one call can tell: 403
/// (forbidden) or 404 (the kind is not served).
fn is_refusal(e: &watcher::Error) -> bool {
    let code = match e {
        watcher::Error::InitialListFailed(kube::Error::Api(s))
        | watcher::Error::WatchStartFailed(kube::Error::Api(s))
        | watcher::Error::WatchFailed(kube::Error::Api(s)) => s.code,
        watcher::Error::WatchError(s) => s.code,
        _ => return false,
    };
    matches!(code, 403 | 404)
}

/// Feeds `cache` from the watch streams `start` makes: the first at once, a new one (which
/// lists everything again) when the current one kept failing for [`STALE_AFTER`]; meanwhile
/// the cache is [`SyncState::Stale`]. With `absent_on_refusal`, a refused watch makes the
/// cache absent (see [`OnRefusal::Absent`]) instead of unsynced.
async fn feed<K, T, F, S>(
    mut start: impl FnMut() -> S,
    cache: Arc<Cache<T>>,
    project: F,
    absent_on_refusal: bool,
) where
    K: Resource,
    T: Send + Sync + 'static,
    F: Fn(&K) -> Option<T>,
    S: Stream<Item = Result<Event<K>, watcher::Error>> + Unpin,
{
    let mut state = FeedState {
        cache,
        fresh: None,
        streak: FailureStreak::default(),
        absent: false,
    };
    let mut events = start();
    loop {
        match events.try_next().await {
            Ok(Some(event)) => {
                state.streak.succeeded();
                state.apply(event, &project);
            }
            Ok(None) => break,
            Err(e) => {
                if state.failed(&e, absent_on_refusal) {
                    events = start();
                }
            }
        }
    }
}

/// What [`feed`] keeps between the events of its watch.
struct FeedState<T> {
    cache: Arc<Cache<T>>,
    /// The list under way (from `Init` to `InitDone`), replacing the cache when done.
    fresh: Option<Shelf<T>>,
    streak: FailureStreak,
    /// Whether the cache stands for "absent" since the seed refused its watch.
    absent: bool,
}

impl<T: Send + Sync + 'static> FeedState<T> {
    /// Handles a failed watch call; whether a new watch is to be started (it lists
    /// everything again).
    fn failed(&mut self, e: &watcher::Error, absent_on_refusal: bool) -> bool {
        let what = self.cache.what();
        if absent_on_refusal && is_refusal(e) {
            let failing_for = self.streak.failed(Instant::now(), false);
            // Refused before the first list, or for as long as makes another cache stale.
            if !self.absent && (!self.cache.is_ready() || self.streak.is_stale()) {
                tracing::warn!(cache = what, error = %e, failing_for = ?failing_for,
                    "optional target: the seed refuses its watch; treated as absent (skipped in every flow, not holding back the others) until the watch lists again");
                self.absent = true;
                self.cache.replace(HashMap::new());
                // A new watch lists everything once the seed lets it, instead of resuming
                // from a resourceVersion whose objects the cache no longer holds.
                self.fresh = None;
                return true;
            }
            tracing::debug!(cache = what, error = %e, "watch refused, retrying");
            return false;
        }
        let stale = self.streak.record(e, Instant::now());
        if let Some(why) = stale.filter(|_| self.cache.is_ready()) {
            tracing::warn!(cache = what, error = %e, %why,
                "watch keeps failing or the seed went silent: cache out of sync (not ready, no decision taken from it) until it has listed everything again");
            self.cache.mark_stale(why);
            // The watcher would resume from its last resourceVersion without a word when the
            // seed is back; a new one lists, and its `InitDone` says "in sync" again.
            self.fresh = None;
            return true;
        }
        // The stream's back-off already delays the retry; just report it.
        tracing::warn!(cache = what, error = %e, "watch failed, retrying");
        false
    }

    /// Applies one event of the watch to the list under way or to the cache.
    fn apply<K: Resource>(&mut self, event: Event<K>, project: impl Fn(&K) -> Option<T>) {
        match event {
            Event::Init => self.fresh = Some(HashMap::new()),
            Event::InitApply(obj) => {
                if let (Some(shelf), Some((ns, name))) = (self.fresh.as_mut(), key_of(&obj))
                    && let Some(value) = project(&obj)
                {
                    shelf.entry(ns).or_default().insert(name, Arc::new(value));
                }
            }
            Event::InitDone => self.listed(),
            Event::Apply(obj) => {
                if let Some((ns, name)) = key_of(&obj) {
                    match project(&obj) {
                        Some(value) => self.cache.apply(ns, name, value),
                        None => self.cache.delete(&ns, &name),
                    }
                }
            }
            Event::Delete(obj) => {
                if let Some((ns, name)) = key_of(&obj) {
                    self.cache.delete(&ns, &name);
                }
            }
        }
    }

    /// A list is complete: it replaces the cache, which is in sync again.
    fn listed(&mut self) {
        let what = self.cache.what();
        if self.absent {
            tracing::info!(
                cache = what,
                "optional target: its watch lists again; no longer treated as absent"
            );
            self.absent = false;
        }
        let shelf = self.fresh.take().unwrap_or_default();
        let count: usize = shelf.values().map(HashMap::len).sum();
        let was = self.cache.sync_state();
        self.cache.replace(shelf);
        if matches!(was, SyncState::Stale(_)) {
            tracing::info!(cache = what, objects = count, "cache listed again: in sync");
        } else {
            tracing::debug!(cache = what, objects = count, "cache synced");
        }
    }
}

/// Why a cache turned stale, for `/readyz` and the log.
fn stale_reason(silent: bool, failing_for: Duration, error: &dyn std::fmt::Display) -> String {
    if silent {
        format!("the seed went silent: {error}")
    } else {
        format!("watch failing for {}s: {error}", failing_for.as_secs())
    }
}

fn key_of<K: Resource>(obj: &K) -> Option<(String, String)> {
    let name = obj.meta().name.clone()?;
    Some((obj.meta().namespace.clone().unwrap_or_default(), name))
}

/// The field selector of the object named `name`: `metadata.name=<name>`, the value escaped as
/// apimachinery's `fields.EscapeValue` does (`\` → `\\`, `,` → `\,`, `=` → `\=`).
///
/// Names come from the config, which accepts any string (as the reference does: it GETs its
/// targets by name, so a name no object can have only makes that target missing). Unescaped, a
/// `,` or `=` would make the apiserver refuse the selector, and the cache would never sync,
/// which holds back every decision; escaped, it selects nothing, and the target is missing.
pub(crate) fn name_field_selector(name: &str) -> String {
    let mut value = String::with_capacity(name.len());
    for c in name.chars() {
        if matches!(c, '\\' | ',' | '=') {
            value.push('\\');
        }
        value.push(c);
    }
    format!("metadata.name={value}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::channel::mpsc;
    use k8s_openapi::api::core::v1::ConfigMap;
    use std::collections::VecDeque;
    use std::sync::Mutex;

    type Feed = mpsc::UnboundedSender<Result<Event<ConfigMap>, watcher::Error>>;
    type Feeds = Arc<Mutex<VecDeque<Feed>>>;
    type Starts = Arc<std::sync::atomic::AtomicUsize>;

    fn cm(name: &str) -> ConfigMap {
        let mut cm = ConfigMap::default();
        cm.metadata.name = Some(name.into());
        cm.metadata.namespace = Some("ns".into());
        cm
    }

    /// A cache fed from watch streams the test writes to; `streams` counts the starts.
    fn fed_cache() -> (Arc<Cache<String>>, Feeds, Starts) {
        fed_cache_with(false)
    }

    fn fed_cache_with(absent_on_refusal: bool) -> (Arc<Cache<String>>, Feeds, Starts) {
        let cache: Arc<Cache<String>> = Cache::new("config maps");
        let feeds = Arc::new(Mutex::new(VecDeque::new()));
        let starts = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (f, n) = (feeds.clone(), starts.clone());
        let start = move || {
            let (tx, rx) = mpsc::unbounded();
            f.lock().expect("feeds").push_back(tx);
            n.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            rx
        };
        tokio::spawn(feed(
            start,
            cache.clone(),
            |c: &ConfigMap| c.metadata.name.clone(),
            absent_on_refusal,
        ));
        (cache, feeds, starts)
    }

    fn send(feeds: &Mutex<VecDeque<Feed>>, event: Result<Event<ConfigMap>, watcher::Error>) {
        let feeds = feeds.lock().expect("feeds");
        let Some(feed) = feeds.back() else {
            panic!("no watch started");
        };
        feed.unbounded_send(event).expect("feed");
    }

    fn list(feeds: &Mutex<VecDeque<Feed>>, names: &[&str]) {
        send(feeds, Ok(Event::Init));
        for name in names {
            send(feeds, Ok(Event::InitApply(cm(name))));
        }
        send(feeds, Ok(Event::InitDone));
    }

    async fn settle() {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_watch_failing_for_long_makes_the_cache_stale_until_a_new_list_completes() {
        let (cache, feeds, starts) = fed_cache();
        settle().await;
        list(&feeds, &["a"]);
        settle().await;
        assert!(cache.is_ready());
        // The seed goes away: the watcher reports an error at each retry.
        for _ in 0..10 {
            send(&feeds, Err(watcher::Error::NoResourceVersion));
            settle().await;
            assert!(cache.is_ready(), "stale before {STALE_AFTER:?}");
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        send(&feeds, Err(watcher::Error::NoResourceVersion));
        settle().await;
        let SyncState::Stale(why) = cache.sync_state() else {
            panic!("still {:?} after 10 s of errors", cache.sync_state());
        };
        assert!(why.starts_with("watch failing for 10s"), "{why}");
        // What it held is still there (nobody decides from it), and a new watch was started.
        assert!(cache.get("ns", "a").is_some());
        assert_eq!(starts.load(std::sync::atomic::Ordering::SeqCst), 2);
        // Errors of the new watch keep it stale; its completed list makes it ready again.
        send(&feeds, Err(watcher::Error::NoResourceVersion));
        settle().await;
        assert!(!cache.is_ready());
        list(&feeds, &["b"]);
        settle().await;
        assert!(cache.is_ready());
        assert!(cache.get("ns", "a").is_none());
        assert!(cache.get("ns", "b").is_some());
    }

    #[tokio::test(start_paused = true)]
    async fn one_silence_of_the_seed_makes_the_cache_stale_at_once() {
        let (cache, feeds, starts) = fed_cache();
        settle().await;
        list(&feeds, &["a"]);
        settle().await;
        assert!(cache.is_ready());
        // One error that says the seed was silent for 30 s or more (an HTTP/2 PING
        // unanswered, no headers, a list's body past its deadline; here a socket timeout).
        let silence = || {
            watcher::Error::WatchFailed(kube::Error::ReadEvents(std::io::Error::from(
                std::io::ErrorKind::TimedOut,
            )))
        };
        send(&feeds, Err(silence()));
        settle().await;
        let SyncState::Stale(why) = cache.sync_state() else {
            panic!("still {:?} after a silence", cache.sync_state());
        };
        assert!(why.starts_with("the seed went silent"), "{why}");
        assert_eq!(starts.load(std::sync::atomic::Ordering::SeqCst), 2);
        list(&feeds, &["a"]);
        settle().await;
        assert!(cache.is_ready());
        // Other errors still have to repeat over `STALE_AFTER` first.
        send(&feeds, Err(watcher::Error::NoResourceVersion));
        settle().await;
        assert!(cache.is_ready());
    }

    fn refused(code: u16) -> watcher::Error {
        let status = kube::core::Status::failure("refused", "Reason").with_code(code);
        watcher::Error::InitialListFailed(kube::Error::Api(status.boxed()))
    }

    #[tokio::test(start_paused = true)]
    async fn an_optional_targets_refused_watch_makes_its_cache_absent_not_unsynced() {
        // Refused from the start: absent at once.
        let (cache, feeds, starts) = fed_cache_with(true);
        settle().await;
        send(&feeds, Err(refused(403)));
        settle().await;
        assert!(
            cache.is_ready() && cache.is_empty(),
            "{:?}",
            cache.sync_state()
        );
        assert_eq!(starts.load(std::sync::atomic::Ordering::SeqCst), 2);
        // Let in later: it lists, and holds what it listed.
        list(&feeds, &["a"]);
        settle().await;
        assert!(cache.get("ns", "a").is_some());
        // Refused for as long as makes a cache stale (the kind removed): absent, not stale.
        for _ in 0..11 {
            send(&feeds, Err(refused(404)));
            settle().await;
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        send(&feeds, Err(refused(404)));
        settle().await;
        assert!(
            cache.is_ready() && cache.is_empty(),
            "{:?}",
            cache.sync_state()
        );
        // Other errors still make it stale, as any cache.
        let (cache, feeds, _) = fed_cache_with(true);
        settle().await;
        list(&feeds, &["a"]);
        settle().await;
        for _ in 0..12 {
            send(&feeds, Err(watcher::Error::NoResourceVersion));
            settle().await;
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        assert!(matches!(cache.sync_state(), SyncState::Stale(_)));
        // And without the option, a refusal is an error like any other: not ready.
        let (cache, feeds, _) = fed_cache();
        settle().await;
        send(&feeds, Err(refused(403)));
        settle().await;
        assert!(!cache.is_ready());
    }

    #[tokio::test(start_paused = true)]
    async fn isolated_watch_errors_leave_the_cache_in_sync() {
        let (cache, feeds, starts) = fed_cache();
        settle().await;
        list(&feeds, &["a"]);
        settle().await;
        // Errors far apart (the watch worked in between), and errors between events.
        for _ in 0..5 {
            send(&feeds, Err(watcher::Error::NoResourceVersion));
            tokio::time::sleep(FAILURE_GAP).await;
        }
        for _ in 0..5 {
            send(&feeds, Err(watcher::Error::NoResourceVersion));
            tokio::time::sleep(Duration::from_secs(5)).await;
            send(&feeds, Ok(Event::Apply(cm("c"))));
            settle().await;
        }
        assert!(cache.is_ready(), "{:?}", cache.sync_state());
        assert_eq!(starts.load(std::sync::atomic::Ordering::SeqCst), 1);
    }

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

    #[test]
    fn names_are_escaped_in_field_selectors_as_apimachinery_does() {
        assert_eq!(
            name_field_selector("kube-apiserver"),
            "metadata.name=kube-apiserver"
        );
        assert_eq!(name_field_selector(r"a,b=c\d"), r"metadata.name=a\,b\=c\\d");
    }

    #[tokio::test(start_paused = true)]
    async fn a_seeds_long_retry_after_pauses_a_feed_for_at_most_its_cap() {
        use crate::fake_seed::{DEPLOYMENT, FakeSeed};
        use crate::prober::seed_caches::project_target;
        use kube::api::{ApiResource, DynamicObject, GroupVersionKind};

        let fake = FakeSeed::default();
        fake.create(&DEPLOYMENT, "shoot--a", "kcm", 3, &[]);
        let resource = ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("apps", "v1", "Deployment"),
            "deployments",
        );
        let cache = Cache::new("scaling targets");
        let api: Api<DynamicObject> = Api::all_with(feed_client(&fake.client()), &resource);
        let config = watcher::Config::default().fields("metadata.name=kcm");
        tokio::spawn(run_cache(
            api,
            config,
            cache.clone(),
            project_target,
            OnRefusal::Unsynced,
        ));
        cache.wait_ready().await;

        // The target changes, then the watch's connection is lost before it could tell (the
        // re-watch meets `410 Gone`: the feed must list again) while the seed sheds load:
        // the feed's next request is answered 429 with `Retry-After: 30`.
        let mut changed = fake.object("deployments", "shoot--a", "kcm");
        changed["spec"]["replicas"] = serde_json::json!(0);
        fake.insert("deployments", changed);
        fake.lock()
            .fail_requests
            .push_back(("deployments", 429, Some("30")));
        fake.expire_watches("deployments");
        let lost = Instant::now();
        cache
            .wait_until("shoot--a", "kcm", Duration::from_secs(60), |s| {
                s.is_some_and(|s| s.spec_replicas == 0)
            })
            .await
            .unwrap_or_else(|e| {
                let calls: Vec<_> = fake
                    .calls_to("deployments")
                    .iter()
                    .map(|c| format!("{} {}?{} {}", c.method, c.path, c.query, c.status))
                    .collect();
                panic!("the cache did not see the change ({e:?}): {calls:#?}")
            });
        // Seen after the capped pause (5 s), not after the 30 s the seed asked for, which
        // would hold a write that conflicted (and the restore behind it) that long.
        let took = lost.elapsed();
        assert!(
            took >= FEED_MAX_RETRY_AFTER && took < FEED_MAX_RETRY_AFTER + Duration::from_secs(2),
            "{took:?}"
        );
        assert_eq!(
            fake.calls_to("deployments")
                .iter()
                .filter(|c| c.status == 429)
                .count(),
            1
        );
    }
}
