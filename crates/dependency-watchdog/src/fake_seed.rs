//! An in-memory seed apiserver for unit tests: a tower service behind a real `kube::Client`,
//! so the code under test sends real requests and reads real answers, on a paused clock
//! (waits of seconds take no time, and the instants of the requests are exact).
//!
//! What it serves:
//! - cluster-wide lists and watches of one kind selected by `metadata.name` (the scaler's
//!   target caches), fed by every change the fake makes;
//! - cluster-wide lists and watches of every object of a kind (the Cluster controller's
//!   watcher), fed by [`FakeSeed::apply`] and [`FakeSeed::delete`] (`ADDED`, `MODIFIED`,
//!   `DELETED`); a watch that is lost ([`FakeSeed::expire_watches`]) resumes into `410 Gone`
//!   as on an apiserver whose history moved on, so the watcher has to list again, and
//!   [`FakeSeed::delete_unseen`] is a deletion made while no watch was there to see it;
//! - merge patches of objects and of their `scale` subresource, with the `resourceVersion`
//!   precondition enforced (`409 Conflict` on a stale one);
//! - `GET` of one object (`404 NotFound` when absent), `POST` (`409 AlreadyExists` when it
//!   exists) and `PUT` with the `resourceVersion` precondition: enough of
//!   `coordination.k8s.io/v1` Leases for the leader elector;
//! - injected failures: answers (status, `Retry-After`) for the next writes, and outages in
//!   which every request fails or never gets an answer (a partition);
//! - for the weeder: lists and watches with a `labelSelector` (`k=v`, `k in (…)`, `k notin
//!   (…)`, `k`, `!k`), cluster-wide (EndpointSlices) or namespaced (Pods), where an object
//!   entering or leaving a watch's selection is `ADDED` or `DELETED` for it; streaming lists
//!   (`sendInitialEvents`: an `ADDED` per object, then the bookmark that ends them), or `422`
//!   for them as on a seed without WatchList ([`FakeState::refuse_streaming_lists`]); `DELETE`
//!   with the uid and resourceVersion preconditions (`409 Conflict` on another), which removes
//!   the object at once or, for pods with [`FakeState::graceful_pod_deletes`], sets its
//!   `deletionTimestamp`.
//!
//! And, to stand in for a shoot's kube-apiserver (the probe's reads):
//! - `GET /version`;
//! - namespaced lists (`…/namespaces/{ns}/{plural}`: node leases) and cluster-wide lists
//!   without a field selector (all objects of the kind: nodes, Machines);
//! - injected answers (status, `Retry-After`) for the next requests whose path contains a
//!   given part, and delays before the answers to such requests;
//! - [`FakeSeed::shoot_client`]: a client with the shoot client's retry layer (its budget the
//!   probe timeout).
//!
//! Every request is recorded ([`Call`]) with its method, path, body, instant and answer.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures::channel::mpsc;
use http::{Method, Request, Response};
use http_body::Frame;
use http_body_util::{BodyExt, Full, StreamBody, combinators::BoxBody};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use serde_json::{Value, json};
use tokio::time::Instant;

use crate::client::retry_after::{MAX_RETRIES, RetryAfterLayer};

/// The body of the fake's answers.
pub(crate) type Body = BoxBody<Bytes, std::convert::Infallible>;

/// One request the fake received: (method, path, body, when, status). A request that never
/// got an answer (a hung outage) has status 0.
#[derive(Debug, Clone)]
pub(crate) struct Call {
    pub method: Method,
    pub path: String,
    /// The query string, decoded (`watch=true&resourceVersion=7&…`); empty without one.
    pub query: String,
    /// The request's JSON body (a merge patch, or the whole object of a `POST`/`PUT`);
    /// `null` without one.
    pub body: Value,
    pub at: Instant,
    /// When it was answered (for a hung request: when it was given up on by the fake).
    pub done: Instant,
    pub status: u16,
}

/// Where a watch's event lines go.
type EventSender = mpsc::UnboundedSender<Result<Frame<Bytes>, std::convert::Infallible>>;

/// One open watch: of a kind, optionally of one name, one namespace and a label selector.
struct Watcher {
    plural: String,
    /// The one name it watches (`fieldSelector=metadata.name=…`); empty: every name.
    name: String,
    /// The namespace of a namespaced watch; `None`: every namespace.
    namespace: Option<String>,
    /// Its `labelSelector`, if any.
    labels: Option<LabelSelector>,
    tx: EventSender,
}

impl Watcher {
    /// Whether `object` (of the watch's kind) is one this watch selects.
    fn selects(&self, object: &Value) -> bool {
        let name = object["metadata"]["name"].as_str().unwrap_or_default();
        let namespace = object["metadata"]["namespace"].as_str().unwrap_or_default();
        (self.name.is_empty() || self.name == name)
            && self.namespace.as_deref().is_none_or(|ns| ns == namespace)
            && self.labels.as_ref().is_none_or(|l| l.matches(object))
    }

    /// Sends one watch event line; false when the watch is gone.
    fn send(&self, event: &str, object: &Value) -> bool {
        let line = format!("{}\n", json!({"type": event, "object": object}));
        self.tx
            .unbounded_send(Ok(Frame::data(Bytes::from(line))))
            .is_ok()
    }
}

/// One requirement of a label selector, as the apiserver reads `labelSelector`.
#[derive(Debug, Clone)]
enum LabelRequirement {
    Equals(String, String),
    NotEquals(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    DoesNotExist(String),
}

/// A `labelSelector` query parameter: every requirement must hold.
#[derive(Debug, Clone)]
struct LabelSelector(Vec<LabelRequirement>);

impl LabelSelector {
    /// Parses `k=v`, `k==v`, `k!=v`, `k in (a,b)`, `k notin (a,b)`, `k`, `!k`, comma-separated.
    fn parse(text: &str) -> LabelSelector {
        let mut parts = Vec::new();
        let (mut depth, mut start) = (0, 0);
        for (i, c) in text.char_indices() {
            match c {
                '(' => depth += 1,
                ')' => depth -= 1,
                ',' if depth == 0 => {
                    parts.push(&text[start..i]);
                    start = i + 1;
                }
                _ => {}
            }
        }
        parts.push(&text[start..]);
        let values = |v: &str| -> Vec<String> {
            v.trim()
                .trim_start_matches('(')
                .trim_end_matches(')')
                .split(',')
                .map(|v| v.trim().to_owned())
                .collect()
        };
        let requirement = |part: &str| {
            let part = part.trim();
            if let Some((k, v)) = part.split_once(" notin ") {
                LabelRequirement::NotIn(k.trim().into(), values(v))
            } else if let Some((k, v)) = part.split_once(" in ") {
                LabelRequirement::In(k.trim().into(), values(v))
            } else if let Some((k, v)) = part.split_once("!=") {
                LabelRequirement::NotEquals(k.trim().into(), v.trim().into())
            } else if let Some((k, v)) = part.split_once('=') {
                LabelRequirement::Equals(k.trim().into(), v.trim_start_matches('=').trim().into())
            } else if let Some(k) = part.strip_prefix('!') {
                LabelRequirement::DoesNotExist(k.trim().into())
            } else {
                LabelRequirement::Exists(part.into())
            }
        };
        LabelSelector(
            parts
                .into_iter()
                .filter(|p| !p.trim().is_empty())
                .map(requirement)
                .collect(),
        )
    }

    /// Whether `object`'s labels satisfy every requirement.
    fn matches(&self, object: &Value) -> bool {
        let label = |k: &str| object["metadata"]["labels"][k].as_str().map(str::to_owned);
        self.0.iter().all(|r| match r {
            LabelRequirement::Equals(k, v) => label(k).as_ref() == Some(v),
            LabelRequirement::NotEquals(k, v) => label(k).as_ref() != Some(v),
            LabelRequirement::In(k, vs) => label(k).is_some_and(|l| vs.contains(&l)),
            LabelRequirement::NotIn(k, vs) => label(k).is_none_or(|l| !vs.contains(&l)),
            LabelRequirement::Exists(k) => label(k).is_some(),
            LabelRequirement::DoesNotExist(k) => label(k).is_none(),
        })
    }
}

/// The `labelSelector` of `uri`'s query, percent-decoded, if any.
fn label_selector(uri: &http::Uri) -> Option<LabelSelector> {
    let raw = uri
        .query()?
        .split('&')
        .find_map(|kv| kv.strip_prefix("labelSelector="))?;
    let bytes = raw.as_bytes();
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => decoded.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("00");
                decoded.push(u8::from_str_radix(hex, 16).unwrap_or(b'?'));
                i += 2;
            }
            b => decoded.push(b),
        }
        i += 1;
    }
    Some(LabelSelector::parse(&String::from_utf8_lossy(&decoded)))
}

/// A kind the fake serves.
pub(crate) struct Kind {
    pub api_version: &'static str,
    pub kind: &'static str,
    pub plural: &'static str,
}

/// `apps/v1` Deployments.
pub(crate) const DEPLOYMENT: Kind = Kind {
    api_version: "apps/v1",
    kind: "Deployment",
    plural: "deployments",
};

/// Core v1's kind with a scale subresource: scaled through it, not through spec.
pub(crate) const RC: Kind = Kind {
    api_version: "v1",
    kind: "ReplicationController",
    plural: "replicationcontrollers",
};

/// How the apiserver is unreachable during an outage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outage {
    /// Every request is answered with this status.
    Fail(u16),
    /// No request is answered (and none reaches the store): a network partition.
    Hang,
}

#[derive(Default)]
pub(crate) struct FakeState {
    pub rv: u64,
    /// (plural, namespace, name) → object.
    pub objects: BTreeMap<(String, String, String), Value>,
    /// Each open watch: what it selects and where its events go.
    watchers: Vec<Watcher>,
    /// Watches of a plural resuming from a resourceVersion below this one are answered
    /// `410 Gone` (see [`FakeSeed::expire_watches`]).
    pub(crate) expired_before: BTreeMap<String, u64>,
    /// Every request, in order.
    pub calls: Vec<Call>,
    /// Answers (status, Retry-After) for the next writes, before they are applied.
    pub(crate) fail_writes: VecDeque<(u16, Option<&'static str>)>,
    /// Answers (path part, status, Retry-After) for the next requests whose path contains
    /// the part: each is used once, by the first such request.
    pub(crate) fail_requests: VecDeque<(&'static str, u16, Option<&'static str>)>,
    /// Delays (path part, delay) before answering each request whose path contains the part.
    pub delays: Vec<(&'static str, Duration)>,
    /// Answers as over an HTTP/2 connection (`Response::version`), which a shoot client may
    /// share among requests at once; HTTP/1.1 otherwise.
    pub(crate) http2: bool,
    /// Which HTTP each shoot client made for a probe run on this fake was asked to speak.
    pub(crate) clients: Vec<crate::client::kube_client::HttpVersion>,
    /// Until when requests meet an outage, and which.
    pub outage: Option<(Outage, Instant)>,
    /// Time from a change of spec.replicas until status.readyReplicas follows; `None`:
    /// never (a seed whose status lags without end).
    pub status_delay: Option<Duration>,
    /// Every object as a successful patch left it: (when, plural, name, object).
    pub(crate) history: Vec<(Instant, String, String, Value)>,
    /// For the next successful patches: how long after applying each the answer is held back
    /// (a caller that gives up first sees a timeout for a write that was made).
    pub(crate) slow_writes: VecDeque<Duration>,
    /// How long after a change its watch event goes out (`None`: at once): a watch that
    /// trails the writes, so a cache fed by it is stale for that long.
    pub(crate) watch_delay: Option<Duration>,
    /// Answers a streaming list (`sendInitialEvents=true`) with `422 Invalid`, as an
    /// apiserver without the WatchList feature does.
    pub(crate) refuse_streaming_lists: bool,
    /// Deletes of pods are graceful: they set `deletionTimestamp` (a `MODIFIED` event) and
    /// leave the pod in place, as for a pod on a node; otherwise a delete removes it at once.
    pub(crate) graceful_pod_deletes: bool,
}

/// Lease `namespace/name` held by `holder`, renewed now (by the wall clock) for 15 s, after
/// 3 transitions: another replica leading, to store with [`FakeSeed::put_lease`].
pub(crate) fn held_lease(namespace: &str, name: &str, holder: &str) -> Lease {
    let now = Timestamp::now();
    Lease {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(namespace.into()),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(holder.into()),
            acquire_time: Some(MicroTime(now)),
            renew_time: Some(MicroTime(now)),
            lease_duration_seconds: Some(15),
            lease_transitions: Some(3),
            ..LeaseSpec::default()
        }),
    }
}

/// The fake apiserver; clones share its state.
#[derive(Clone, Default)]
pub(crate) struct FakeSeed(Arc<Mutex<FakeState>>);

fn status(code: u16, reason: &str) -> Response<Body> {
    let body = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": reason, "reason": reason, "code": code});
    Response::builder()
        .status(code)
        .header("Content-Type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())).boxed())
        .expect("response")
}

fn answer(code: u16, body: &Value) -> Response<Body> {
    Response::builder()
        .status(code)
        .header("Content-Type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())).boxed())
        .expect("response")
}

/// The query of `uri` with `=` and `,` decoded (kube encodes them inside values).
fn decoded_query(uri: &http::Uri) -> String {
    uri.query()
        .unwrap_or_default()
        .replace("%3D", "=")
        .replace("%2C", ",")
}

/// `metadata.resourceVersion` of `object`.
fn version(object: &Value) -> String {
    object["metadata"]["resourceVersion"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

fn ok(body: &Value) -> Response<Body> {
    answer(200, body)
}

/// RFC 7386 merge patch.
fn merge(target: &mut Value, patch: &Value) {
    let Value::Object(patch) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = json!({});
    }
    let object = target.as_object_mut().expect("object");
    for (k, v) in patch {
        if v.is_null() {
            object.remove(k);
        } else {
            merge(object.entry(k.clone()).or_insert(Value::Null), v);
        }
    }
}

impl FakeSeed {
    pub(crate) fn lock(&self) -> std::sync::MutexGuard<'_, FakeState> {
        self.0.lock().expect("fake seed")
    }

    /// Creates a `kind` `namespace/name` with `replicas`, ready.
    pub(crate) fn create(
        &self,
        kind: &Kind,
        namespace: &str,
        name: &str,
        replicas: i32,
        annotations: &[(&str, &str)],
    ) {
        let mut s = self.lock();
        s.rv += 1;
        let annotations: BTreeMap<&str, &str> = annotations.iter().copied().collect();
        let object = json!({
            "apiVersion": kind.api_version, "kind": kind.kind,
            "metadata": {"name": name, "namespace": namespace, "uid": format!("uid-{name}"),
                         "resourceVersion": s.rv.to_string(), "annotations": annotations},
            "spec": {"replicas": replicas},
            "status": {"readyReplicas": replicas},
        });
        s.objects
            .insert((kind.plural.into(), namespace.into(), name.into()), object);
    }

    pub(crate) fn object(&self, plural: &str, namespace: &str, name: &str) -> Value {
        self.lock().objects[&(plural.to_owned(), namespace.to_owned(), name.to_owned())].clone()
    }

    /// Every request that was not a `GET` (lists and watches are `GET`s too).
    pub(crate) fn writes(&self) -> Vec<Call> {
        self.lock()
            .calls
            .iter()
            .filter(|c| c.method != Method::GET)
            .cloned()
            .collect()
    }

    /// Every request whose path contains `part`.
    pub(crate) fn calls_to(&self, part: &str) -> Vec<Call> {
        self.lock()
            .calls
            .iter()
            .filter(|c| c.path.contains(part))
            .cloned()
            .collect()
    }

    /// Lease `namespace/name` as stored, if any.
    pub(crate) fn lease(&self, namespace: &str, name: &str) -> Option<Lease> {
        let key = ("leases".to_owned(), namespace.to_owned(), name.to_owned());
        let object = self.lock().objects.get(&key).cloned()?;
        Some(serde_json::from_value(object).expect("lease"))
    }

    /// Stores `lease` as another writer would (a new resourceVersion); returns that version.
    pub(crate) fn put_lease(&self, lease: &Lease) -> String {
        let (state, stored, _) = self.store("leases", serde_json::to_value(lease).expect("lease"));
        drop(state);
        version(&stored)
    }

    /// Stores `object` (JSON with `metadata.name`, and `metadata.namespace` unless it is
    /// cluster-scoped) as a `plural` as another writer would: a new resourceVersion.
    pub(crate) fn insert(&self, plural: &str, object: Value) {
        drop(self.store(plural, object));
    }

    /// Stores `object` (as [`FakeSeed::insert`]) and tells the watches of its kind: `ADDED`
    /// when it is new, `MODIFIED` when it replaces one. Returns its new resourceVersion.
    pub(crate) fn apply(&self, plural: &str, object: Value) -> String {
        let (mut s, object, replaced) = self.store(plural, object);
        let event = if replaced.is_some() {
            "MODIFIED"
        } else {
            "ADDED"
        };
        Self::notify_change(&mut s, event, plural, replaced.as_ref(), &object);
        version(&object)
    }

    /// Stores `object` as [`FakeSeed::insert`] says; returns the state, still locked (so a
    /// watch event can follow before anyone sees the object), the object as stored and
    /// the object it replaced, if any.
    fn store(
        &self,
        plural: &str,
        mut object: Value,
    ) -> (std::sync::MutexGuard<'_, FakeState>, Value, Option<Value>) {
        let namespace = object["metadata"]["namespace"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let name = object["metadata"]["name"]
            .as_str()
            .expect("object name")
            .to_owned();
        let mut s = self.lock();
        s.rv += 1;
        object["metadata"]["resourceVersion"] = json!(s.rv.to_string());
        let replaced = s
            .objects
            .insert((plural.into(), namespace, name), object.clone());
        (s, object, replaced)
    }

    /// Deletes `plural` `namespace/name` (empty namespace: cluster-scoped) and tells the
    /// watches of its kind (`DELETED`, the object at the deletion's resourceVersion).
    pub(crate) fn delete(&self, plural: &str, namespace: &str, name: &str) {
        let mut s = self.lock();
        if let Some(object) = Self::remove(&mut s, plural, namespace, name) {
            Self::notify_as(&mut s, "DELETED", plural, &object);
        }
    }

    /// Deletes `plural` `namespace/name` without any watch event: a deletion that happened
    /// while the watches were away (follow with [`FakeSeed::expire_watches`]).
    pub(crate) fn delete_unseen(&self, plural: &str, namespace: &str, name: &str) {
        let mut s = self.lock();
        Self::remove(&mut s, plural, namespace, name);
    }

    fn remove(s: &mut FakeState, plural: &str, namespace: &str, name: &str) -> Option<Value> {
        let key = (plural.to_owned(), namespace.to_owned(), name.to_owned());
        let mut object = s.objects.remove(&key)?;
        s.rv += 1;
        object["metadata"]["resourceVersion"] = json!(s.rv.to_string());
        Some(object)
    }

    /// Closes every open watch of `plural` (a lost connection) and makes a watch that resumes
    /// from a resourceVersion older than the current one meet `410 Gone`, as on an apiserver
    /// whose event history moved on: the watcher has to list anew.
    pub(crate) fn expire_watches(&self, plural: &str) {
        let mut s = self.lock();
        let now = s.rv;
        s.expired_before.insert(plural.to_owned(), now);
        s.watchers.retain(|w| w.plural != plural);
    }

    /// Every request meets `outage` from now for `length`.
    pub(crate) fn outage(&self, outage: Outage, length: Duration) {
        self.lock().outage = Some((outage, Instant::now() + length));
    }

    /// A client to the fake, with the seed client's retry layer and its limiter (a budget
    /// never spent: requests are sent as they come, but its request settings work).
    pub(crate) fn client(&self) -> kube::Client {
        self.limited_client(1e9, u32::MAX)
    }

    /// [`FakeSeed::client`] with the seed client's request budget in front of the fake
    /// (`qps`, `burst`, priorities and [`crate::client::rate_limit::StopWaiting`] as in
    /// `rate_limited_client`, which stacks the same layers): a flow's writes wait for it as
    /// they would on a busy seed.
    pub(crate) fn limited_client(&self, qps: f32, burst: u32) -> kube::Client {
        let fake = self.clone();
        let service = tower::service_fn(move |req: Request<kube::client::Body>| {
            let fake = fake.clone();
            async move { Ok::<_, std::convert::Infallible>(fake.serve(req).await) }
        });
        let service = tower::ServiceBuilder::new()
            .layer(RetryAfterLayer::new(MAX_RETRIES, None))
            .layer(crate::client::rate_limit::RateLimitLayer::new(qps, burst))
            .layer(tower::timeout::TimeoutLayer::new(
                crate::client::kube_client::SEED_RESPONSE_HEADERS_TIMEOUT,
            ))
            .layer(crate::client::guarded_body::GuardLayer(
                crate::client::seed_transport::BodyDeadline {
                    deadline: crate::client::seed_transport::SEED_BODY_DEADLINE,
                },
            ))
            .service(service);
        kube::Client::new(service, "default")
    }

    /// A client to the fake standing in for a shoot, with the shoot client's retry layer: a
    /// `Retry-After` wait is taken only while it ends within `probe_timeout` (see
    /// `PreparedShootConfig::client`).
    pub(crate) fn shoot_client(&self, probe_timeout: Duration) -> kube::Client {
        let fake = self.clone();
        let service = tower::service_fn(move |req: Request<kube::client::Body>| {
            let fake = fake.clone();
            async move {
                let mut response = fake.serve(req).await;
                if fake.lock().http2 {
                    *response.version_mut() = http::Version::HTTP_2;
                }
                Ok::<_, std::convert::Infallible>(response)
            }
        });
        let service = tower::ServiceBuilder::new()
            .layer(RetryAfterLayer::new(MAX_RETRIES, Some(probe_timeout)))
            .service(service);
        kube::Client::new(service, "default")
    }

    /// Sends `object` as a `MODIFIED` watch event to the watches of its kind and name.
    fn notify(s: &mut FakeState, plural: &str, object: &Value) {
        Self::notify_as(s, "MODIFIED", plural, object);
    }

    /// Sends `object` as a watch event of type `event` to the watches of its kind and name.
    fn notify_as(s: &mut FakeState, event: &str, plural: &str, object: &Value) {
        Self::notify_change(s, event, plural, None, object);
    }

    /// Sends `object` as a watch event of type `event` to the watches that select it. `old`:
    /// the object before a `MODIFIED` change, so that a watch with a namespace or label
    /// selector sees an object enter its selection as `ADDED` and leave it as `DELETED`, as
    /// the apiserver's watches do.
    fn notify_change(
        s: &mut FakeState,
        event: &str,
        plural: &str,
        old: Option<&Value>,
        object: &Value,
    ) {
        let event_for = |w: &Watcher| -> Option<&'static str> {
            let now = w.selects(object);
            let before = old.map(|o| w.selects(o));
            match (event, before, now) {
                ("MODIFIED", Some(false), true) => Some("ADDED"),
                ("MODIFIED", _, true) => Some("MODIFIED"),
                ("MODIFIED", Some(true), false) => Some("DELETED"),
                ("ADDED", _, true) => Some("ADDED"),
                ("DELETED", _, true) => Some("DELETED"),
                _ => None,
            }
        };
        if let Some(delay) = s.watch_delay {
            let lines: Vec<(EventSender, String)> = s
                .watchers
                .iter()
                .filter(|w| w.plural == plural)
                .filter_map(|w| {
                    let event = event_for(w)?;
                    let line = format!("{}\n", json!({"type": event, "object": object}));
                    Some((w.tx.clone(), line))
                })
                .collect();
            tokio::spawn(async move {
                tokio::time::sleep(delay).await;
                for (tx, line) in lines {
                    let _ = tx.unbounded_send(Ok(Frame::data(Bytes::from(line))));
                }
            });
            return;
        }
        s.watchers.retain(|w| {
            if w.plural != plural {
                return true;
            }
            match event_for(w) {
                Some(event) => w.send(event, object),
                None => true,
            }
        });
    }

    /// Makes status follow spec `delay` after a change, if the fake is set to.
    fn follow_status(&self, key: (String, String, String)) {
        let Some(delay) = self.lock().status_delay else {
            return;
        };
        let fake = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            let mut s = fake.lock();
            s.rv += 1;
            let rv = s.rv.to_string();
            let Some(object) = s.objects.get_mut(&key) else {
                return;
            };
            object["status"]["readyReplicas"] = object["spec"]["replicas"].clone();
            object["metadata"]["resourceVersion"] = json!(rv);
            let object = object.clone();
            Self::notify(&mut s, &key.0, &object);
        });
    }

    async fn serve(&self, req: Request<kube::client::Body>) -> Response<Body> {
        let (parts, body) = req.into_parts();
        let body = body.collect_bytes().await.unwrap_or_default();
        let mut call = Call {
            method: parts.method.clone(),
            path: parts.uri.path().to_owned(),
            query: decoded_query(&parts.uri),
            body: serde_json::from_slice(&body).unwrap_or(Value::Null),
            at: Instant::now(),
            done: Instant::now(),
            status: 0,
        };
        let outage = {
            let mut s = self.lock();
            match s.outage {
                Some((outage, until)) if call.at < until => Some(outage),
                Some(_) => {
                    s.outage = None;
                    None
                }
                None => None,
            }
        };
        match outage {
            Some(Outage::Fail(code)) => {
                call.status = code;
                call.done = Instant::now();
                self.lock().calls.push(call);
                return status(code, "Injected");
            }
            Some(Outage::Hang) => {
                self.lock().calls.push(call);
                return std::future::pending().await;
            }
            None => {}
        }
        let delay = self
            .lock()
            .delays
            .iter()
            .filter(|(part, _)| call.path.contains(part))
            .map(|(_, d)| *d)
            .max();
        if let Some(delay) = delay {
            tokio::time::sleep(delay).await;
        }
        let injected = {
            let mut s = self.lock();
            let at = s
                .fail_requests
                .iter()
                .position(|(part, _, _)| call.path.contains(part));
            at.and_then(|i| s.fail_requests.remove(i))
        };
        if let Some((_, code, retry_after)) = injected {
            let mut response = status(code, "Injected");
            if let Some(v) = retry_after {
                response
                    .headers_mut()
                    .insert("Retry-After", http::HeaderValue::from_static(v));
            }
            call.status = code;
            call.done = Instant::now();
            self.lock().calls.push(call);
            return response;
        }
        let response = self.answer(&parts, &call.body).await;
        if parts.method == Method::PATCH && response.status() == http::StatusCode::OK {
            let held_back = self.lock().slow_writes.pop_front();
            if let Some(delay) = held_back {
                tokio::time::sleep(delay).await;
            }
        }
        call.status = response.status().as_u16();
        call.done = Instant::now();
        self.lock().calls.push(call);
        response
    }

    async fn answer(&self, parts: &http::request::Parts, body: &Value) -> Response<Body> {
        let path = parts.uri.path().to_owned();
        let query = decoded_query(&parts.uri);
        let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
        if path == "/version" {
            return ok(
                &json!({"major": "1", "minor": "31", "gitVersion": "v1.31.0",
                "gitCommit": "fake", "gitTreeState": "clean", "buildDate": "2026-01-01T00:00:00Z",
                "goVersion": "go1.23", "compiler": "gc", "platform": "linux/amd64"}),
            );
        }
        let Some(ns_at) = segments.iter().position(|s| *s == "namespaces") else {
            // Cluster-wide list or watch of one kind, selected by name.
            let plural = segments.last().copied().unwrap_or_default().to_owned();
            let name = query
                .split('&')
                .find_map(|kv| kv.strip_prefix("fieldSelector=metadata.name="))
                .unwrap_or_default()
                .to_owned();
            let selection = Watcher {
                plural,
                name,
                namespace: None,
                labels: label_selector(&parts.uri),
                tx: mpsc::unbounded().0,
            };
            return self.list_or_watch(selection, &query);
        };
        let (Some(ns), Some(plural)) = (segments.get(ns_at + 1), segments.get(ns_at + 2)) else {
            return status(404, "NotFound");
        };
        if parts.method == Method::POST && segments.len() == ns_at + 3 {
            return self.post(ns, plural, body);
        }
        if parts.method == Method::GET && segments.len() == ns_at + 3 {
            // A namespaced list or watch.
            let selection = Watcher {
                plural: (*plural).to_owned(),
                name: String::new(),
                namespace: Some((*ns).to_owned()),
                labels: label_selector(&parts.uri),
                tx: mpsc::unbounded().0,
            };
            return self.list_or_watch(selection, &query);
        }
        let Some(name) = segments.get(ns_at + 3) else {
            return status(404, "NotFound");
        };
        let key = ((*plural).to_owned(), (*ns).to_owned(), (*name).to_owned());
        let scale = segments.get(ns_at + 4) == Some(&"scale");
        match parts.method {
            Method::PATCH => self.patch(key, scale, body),
            Method::GET if !scale => match self.lock().objects.get(&key) {
                Some(object) => ok(object),
                None => status(404, "NotFound"),
            },
            Method::PUT if !scale => self.put(key, body),
            Method::DELETE if !scale => self.delete_object(key, body),
            _ => status(405, "MethodNotAllowed"),
        }
    }

    /// Applies the merge `patch` to the object at `key` (to its `scale` subresource when
    /// `scale`), with the `resourceVersion` precondition enforced (`409 Conflict` on a stale one).
    fn patch(&self, key: (String, String, String), scale: bool, patch: &Value) -> Response<Body> {
        let (plural, ns, name) = (key.0.clone(), key.1.clone(), key.2.clone());
        let (plural, ns, name) = (plural.as_str(), ns.as_str(), name.as_str());
        let mut s = self.lock();
        if let Some(response) = Self::injected(&mut s) {
            return response;
        }
        s.rv += 1;
        let rv = s.rv.to_string();
        let Some(object) = s.objects.get_mut(&key) else {
            return status(404, "NotFound");
        };
        let precondition = patch["metadata"]["resourceVersion"].as_str();
        if precondition.is_some_and(|p| Some(p) != object["metadata"]["resourceVersion"].as_str()) {
            return status(409, "Conflict");
        }
        let replicas_before = object["spec"]["replicas"].clone();
        if scale {
            // A Scale: only spec.replicas reaches the parent.
            if let Some(r) = patch.pointer("/spec/replicas") {
                object["spec"]["replicas"] = r.clone();
            }
        } else {
            let mut patch = patch.clone();
            if let Some(m) = patch.get_mut("metadata").and_then(Value::as_object_mut) {
                m.remove("resourceVersion");
            }
            merge(object, &patch);
        }
        object["metadata"]["resourceVersion"] = json!(rv);
        let object = object.clone();
        let entry = (
            Instant::now(),
            (*plural).to_owned(),
            (*name).to_owned(),
            object.clone(),
        );
        s.history.push(entry);
        let answer = if scale {
            json!({"apiVersion": "autoscaling/v1", "kind": "Scale",
                "metadata": {"name": name, "namespace": ns, "uid": object["metadata"]["uid"],
                             "resourceVersion": rv},
                "spec": {"replicas": object["spec"]["replicas"]},
                "status": {"replicas": object["status"]["readyReplicas"]}})
        } else {
            object.clone()
        };
        Self::notify(&mut s, plural, &object);
        drop(s);
        if replicas_before != object["spec"]["replicas"] {
            self.follow_status(key);
        }
        ok(&answer)
    }

    /// Lists the objects `selection` selects, or (with `watch=true` in `query`) opens a
    /// watch of them: from a resourceVersion (`410 Gone` when it expired), or with
    /// `sendInitialEvents=true` a streaming list (an `ADDED` per object, then the bookmark
    /// that ends the initial events), as the apiserver does.
    fn list_or_watch(&self, mut selection: Watcher, query: &str) -> Response<Body> {
        let mut s = self.lock();
        let selected = |s: &FakeState, selection: &Watcher| -> Vec<Value> {
            s.objects
                .iter()
                .filter(|((p, _, _), o)| *p == selection.plural && selection.selects(o))
                .map(|(_, o)| o.clone())
                .collect()
        };
        if !query.contains("watch=true") {
            let items = selected(&s, &selection);
            return ok(&json!({"kind": "List", "apiVersion": "v1",
                "metadata": {"resourceVersion": s.rv.to_string()}, "items": items}));
        }
        let (tx, rx) = mpsc::unbounded();
        selection.tx = tx;
        let from = query
            .split('&')
            .find_map(|kv| kv.strip_prefix("resourceVersion="))
            .and_then(|rv| rv.parse::<u64>().ok());
        let expired = s
            .expired_before
            .get(&selection.plural)
            .is_some_and(|before| from.is_some_and(|from| from < *before));
        if query.contains("sendInitialEvents=true") {
            if s.refuse_streaming_lists {
                return status(422, "Invalid");
            }
            for object in selected(&s, &selection) {
                selection.send("ADDED", &object);
            }
            let end = json!({"kind": "Status", "apiVersion": "v1", "metadata": {
                "resourceVersion": s.rv.to_string(),
                "annotations": {"k8s.io/initial-events-end": "true"}}});
            selection.send("BOOKMARK", &end);
            s.watchers.push(selection);
        } else if expired {
            // As the apiserver answers a watch from a version it no longer has: one
            // ERROR event, then the end of the stream.
            let gone = json!({"kind": "Status",
                "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": "too old resource version", "reason": "Expired", "code": 410});
            selection.send("ERROR", &gone);
        } else {
            s.watchers.push(selection);
        }
        Response::builder()
            .header("Content-Type", "application/json")
            .body(BodyExt::boxed(StreamBody::new(rx)))
            .expect("response")
    }

    /// The next injected answer to a write, if any.
    fn injected(s: &mut FakeState) -> Option<Response<Body>> {
        let (code, retry_after) = s.fail_writes.pop_front()?;
        let mut response = status(code, "Injected");
        if let Some(v) = retry_after {
            response
                .headers_mut()
                .insert("Retry-After", http::HeaderValue::from_static(v));
        }
        Some(response)
    }

    /// Creates `object` in `namespace` (`409 AlreadyExists` if its name is taken).
    fn post(&self, namespace: &str, plural: &str, object: &Value) -> Response<Body> {
        let mut s = self.lock();
        if let Some(response) = Self::injected(&mut s) {
            return response;
        }
        let Some(name) = object["metadata"]["name"].as_str() else {
            return status(422, "Invalid");
        };
        let key = (plural.to_owned(), namespace.to_owned(), name.to_owned());
        if s.objects.contains_key(&key) {
            return status(409, "AlreadyExists");
        }
        if object["metadata"]["resourceVersion"].is_string() {
            // The apiserver refuses a create that names a version.
            return status(422, "Invalid");
        }
        s.rv += 1;
        let mut object = object.clone();
        object["metadata"]["resourceVersion"] = json!(s.rv.to_string());
        object["metadata"]["namespace"] = json!(namespace);
        object["metadata"]["uid"] = json!(format!("uid-{name}"));
        s.objects.insert(key, object.clone());
        Self::notify(&mut s, plural, &object);
        answer(201, &object)
    }

    /// Deletes the object at `key` as the apiserver does: `404` when there is none, `409
    /// Conflict` when the preconditions of the delete's `options` (uid, resourceVersion) name
    /// another. A pod, with [`FakeState::graceful_pod_deletes`], gets `deletionTimestamp` (now,
    /// 30 s of grace) and stays; otherwise the object is gone at once (a `DELETED` event).
    fn delete_object(&self, key: (String, String, String), options: &Value) -> Response<Body> {
        let mut s = self.lock();
        if let Some(response) = Self::injected(&mut s) {
            return response;
        }
        let Some(current) = s.objects.get(&key).cloned() else {
            return status(404, "NotFound");
        };
        let preconditions = &options["preconditions"];
        let differs = |field: &str| {
            preconditions[field]
                .as_str()
                .is_some_and(|p| Some(p) != current["metadata"][field].as_str())
        };
        if differs("uid") || differs("resourceVersion") {
            return status(409, "Conflict");
        }
        if key.0 == "pods" && s.graceful_pod_deletes {
            if current["metadata"]["deletionTimestamp"].is_string() {
                return ok(&current);
            }
            s.rv += 1;
            let mut object = current.clone();
            object["metadata"]["resourceVersion"] = json!(s.rv.to_string());
            object["metadata"]["deletionTimestamp"] = json!(Timestamp::now().to_string());
            object["metadata"]["deletionGracePeriodSeconds"] = json!(30);
            s.objects.insert(key.clone(), object.clone());
            Self::notify_change(&mut s, "MODIFIED", &key.0, Some(&current), &object);
            return ok(&object);
        }
        let Some(object) = Self::remove(&mut s, &key.0, &key.1, &key.2) else {
            return status(404, "NotFound");
        };
        Self::notify_as(&mut s, "DELETED", &key.0, &object);
        ok(&object)
    }

    /// Replaces the object at `key` with `object`: conditional on the version it names
    /// (`409 Conflict` on a stale one), `404` when there is none.
    fn put(&self, key: (String, String, String), object: &Value) -> Response<Body> {
        let mut s = self.lock();
        if let Some(response) = Self::injected(&mut s) {
            return response;
        }
        let Some(current) = s.objects.get(&key) else {
            return status(404, "NotFound");
        };
        if object["metadata"]["name"].as_str() != Some(key.2.as_str()) {
            return status(400, "BadRequest");
        }
        let precondition = object["metadata"]["resourceVersion"].as_str();
        if precondition.is_some_and(|p| Some(p) != current["metadata"]["resourceVersion"].as_str())
        {
            return status(409, "Conflict");
        }
        let uid = current["metadata"]["uid"].clone();
        s.rv += 1;
        let mut object = object.clone();
        object["metadata"]["resourceVersion"] = json!(s.rv.to_string());
        object["metadata"]["uid"] = uid;
        s.objects.insert(key.clone(), object.clone());
        Self::notify(&mut s, &key.0, &object);
        ok(&object)
    }
}
