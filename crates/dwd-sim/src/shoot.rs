//! The shoot's data plane, against the shoot apiserver: Nodes, node Leases and kubelets.
//!
//! The watchdog's lease probe lists the shoot's Nodes and the Leases in `kube-node-lease`
//! and counts the leases whose `spec.renewTime` is too old. Here [`ShootDataPlane`] creates
//! and mutates those objects, and [`Kubelets`] keeps the leases fresh the way kubelets do,
//! except for the nodes a test *silences* (a zone outage, a broken network).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, Node};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use tokio::sync::Semaphore;

use crate::kubelet_node::{self, NodeShape};
use crate::{
    AbortOnDrop, CREATE_CONCURRENCY, DEFAULT_RENEW_INTERVAL, Result, SimError, create_json,
    is_conflict, json_err, k8s_time, kube_err, micro_time, now_micros,
};

/// Namespace of the kubelets' node leases.
pub use dwd_core::lease::NODE_LEASE_NAMESPACE;
/// Node label naming the node's worker pool (the watchdog's own constant).
pub use dwd_core::lease::WORKER_POOL_LABEL as POOL_LABEL;
/// Node label naming the node's zone (the watchdog's own constant).
pub use dwd_core::zone::ZONE_LABEL;
/// Node label with the node's host name.
pub const HOSTNAME_LABEL: &str = "kubernetes.io/hostname";
/// Annotation marking a node that machine-controller-manager does not manage.
pub use dwd_core::lease::NOT_MANAGED_BY_MCM_ANNOTATION;
/// Worker pool of nodes made without an explicit pool.
pub const DEFAULT_POOL: &str = "worker-a";
/// `spec.leaseDurationSeconds` of the simulated leases (the kubelet's default).
pub const LEASE_DURATION_SECONDS: i32 = 40;

/// One node to create: its name, pool, extra labels, annotations and conditions, and its
/// shape (small by default, or [`NodeShape::KubeletSized`]: [`NodeSpec::kubelet_sized`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeSpec {
    /// Node name (also its lease's name and the `node` label of its Machine).
    pub name: String,
    /// Worker pool (label `worker.gardener.cloud/pool`).
    pub pool: String,
    /// Labels besides the pool and host name labels.
    pub labels: BTreeMap<String, String>,
    /// Annotations.
    pub annotations: BTreeMap<String, String>,
    /// Status conditions as `(type, status, reason)`.
    pub conditions: Vec<(String, String, String)>,
    /// How much else the Node carries ([`NodeShape::Small`] by default). Either way, the
    /// labels, annotations and conditions above are exactly as given.
    pub shape: NodeShape,
}

impl NodeSpec {
    /// A node in `pool` with condition `Ready=True` and nothing else.
    pub fn new(name: impl Into<String>, pool: impl Into<String>) -> Self {
        NodeSpec {
            name: name.into(),
            pool: pool.into(),
            labels: BTreeMap::new(),
            annotations: BTreeMap::new(),
            conditions: vec![("Ready".into(), "True".into(), "KubeletReady".into())],
            shape: NodeShape::Small,
        }
    }

    /// Makes the Node the size a real kubelet makes it ([`NodeShape::KubeletSized`]): 10–30
    /// KiB as served, with images, node info, capacity, realistic healthy conditions, Gardener
    /// labels and annotations, and the `managedFields` of the six field managers that
    /// write a real node. Its content is a function of the name (and pool), the same in every
    /// run; what the watchdog reads (pool, zone, this spec's labels, annotations and
    /// conditions) stays as this spec says. See [`crate::kubelet_node`].
    pub fn kubelet_sized(mut self) -> Self {
        self.shape = NodeShape::KubeletSized;
        self
    }

    /// Adds (or replaces) a condition of this type.
    pub fn with_condition(mut self, type_: &str, status: &str, reason: &str) -> Self {
        self.conditions.retain(|(t, _, _)| t != type_);
        self.conditions
            .push((type_.into(), status.into(), reason.into()));
        self
    }

    /// Adds an annotation.
    pub fn with_annotation(mut self, key: &str, value: &str) -> Self {
        self.annotations.insert(key.into(), value.into());
        self
    }

    /// Adds a label.
    pub fn with_label(mut self, key: &str, value: &str) -> Self {
        self.labels.insert(key.into(), value.into());
        self
    }

    /// Puts the node in `zone` (label [`ZONE_LABEL`]).
    pub fn in_zone(self, zone: &str) -> Self {
        self.with_label(ZONE_LABEL, zone)
    }

    /// The Node as [`ShootDataPlane::create_nodes`] leaves it when it writes at `now`, before
    /// the apiserver adds its own metadata (`uid`, `resourceVersion`, `creationTimestamp`,
    /// `managedFields`): for the small shape the one object created; for the kubelet-sized
    /// one all its writes merged. The same spec and `now` always give the same JSON.
    pub fn node_json(&self, now: DateTime<Utc>) -> Value {
        match self.shape {
            NodeShape::Small => self.small_json(now),
            NodeShape::KubeletSized => kubelet_node::node_json(self, now),
        }
    }

    /// The small Node object, its condition times `now`.
    fn small_json(&self, now: DateTime<Utc>) -> Value {
        let mut labels = self.labels.clone();
        labels.insert(POOL_LABEL.into(), self.pool.clone());
        labels.insert(HOSTNAME_LABEL.into(), self.name.clone());
        let now = k8s_time(now);
        let conditions: Vec<Value> = self
            .conditions
            .iter()
            .map(|(t, s, r)| condition_json(t, s, r, &now))
            .collect();
        json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": self.name, "labels": labels, "annotations": self.annotations},
            "status": {"conditions": conditions}
        })
    }
}

fn condition_json(type_: &str, status: &str, reason: &str, now: &str) -> Value {
    json!({
        "type": type_, "status": status, "reason": reason,
        "message": format!("simulated by dwd-sim: {type_}={status}"),
        "lastHeartbeatTime": now, "lastTransitionTime": now
    })
}

/// Like [`node_specs_with_prefix`], every node [`NodeSpec::kubelet_sized`]: `n` nodes
/// `<prefix>0 …` spread round-robin over `pools`, each `Ready=True` and 10–30 KiB as served.
pub fn kubelet_sized_node_specs_with_prefix(
    prefix: &str,
    n: usize,
    pools: &[&str],
) -> Vec<NodeSpec> {
    node_specs_with_prefix(prefix, n, pools)
        .into_iter()
        .map(NodeSpec::kubelet_sized)
        .collect()
}

/// `n` nodes `node-0 … node-<n-1>`, spread round-robin over `pools` ([`DEFAULT_POOL`] when
/// empty), each `Ready=True`.
pub fn node_specs(n: usize, pools: &[&str]) -> Vec<NodeSpec> {
    node_specs_with_prefix("node-", n, pools)
}

/// Like [`node_specs`] with names `<prefix>0 …`: shoots sharing one apiserver (a benchmark
/// that can't afford an apiserver per shoot) need distinct node names.
pub fn node_specs_with_prefix(prefix: &str, n: usize, pools: &[&str]) -> Vec<NodeSpec> {
    let pools: Vec<&str> = if pools.is_empty() {
        vec![DEFAULT_POOL]
    } else {
        pools.to_vec()
    };
    (0..n)
        .map(|i| NodeSpec::new(format!("{prefix}{i}"), pools[i % pools.len()]))
        .collect()
}

/// `per_zone` nodes in each of `zones`, named `<zone>-0 …` and labelled with their zone
/// ([`ZONE_LABEL`]), all in pool [`DEFAULT_POOL`]: a multi-zone shoot for zonal outages.
pub fn zoned_node_specs(zones: &[&str], per_zone: usize) -> Vec<NodeSpec> {
    zones
        .iter()
        .flat_map(|zone| {
            (0..per_zone)
                .map(move |i| NodeSpec::new(format!("{zone}-{i}"), DEFAULT_POOL).in_zone(zone))
        })
        .collect()
}

/// Converts a Kubernetes timestamp to chrono.
fn to_chrono(t: &k8s_openapi::jiff::Timestamp) -> Option<DateTime<Utc>> {
    DateTime::from_timestamp_micros(t.as_microsecond())
}

/// Nodes and Leases of one shoot, against its apiserver.
#[derive(Clone)]
pub struct ShootDataPlane {
    client: kube::Client,
    lease_labels: BTreeMap<String, String>,
}

impl ShootDataPlane {
    /// Works against the shoot apiserver behind `client`.
    pub fn new(client: kube::Client) -> Self {
        ShootDataPlane {
            client,
            lease_labels: BTreeMap::new(),
        }
    }

    /// Labels every lease this data plane creates from now on (none by default). Shoots that
    /// share one apiserver can then be told apart by a label selector on lease lists.
    pub fn with_lease_labels(mut self, labels: BTreeMap<String, String>) -> Self {
        self.lease_labels = labels;
        self
    }

    /// The shoot apiserver client.
    pub fn client(&self) -> &kube::Client {
        &self.client
    }

    fn nodes(&self) -> Api<Node> {
        Api::all(self.client.clone())
    }

    fn leases(&self) -> Api<Lease> {
        Api::namespaced(self.client.clone(), NODE_LEASE_NAMESPACE)
    }

    /// Creates the Nodes (with their conditions; Node status is kept on create, unlike Pod
    /// or Deployment status), [`CREATE_CONCURRENCY`] nodes at a time. A small node is one
    /// create; a kubelet-sized one a create by the `kubelet` and then one patch per other
    /// writer, in turn, so that the apiserver records each writer in `managedFields`. A
    /// node's spec conditions, labels and annotations are all in its create.
    pub async fn create_nodes(&self, nodes: &[NodeSpec]) -> Result<()> {
        let api = self.nodes();
        futures::stream::iter(nodes.iter().map(Ok))
            .try_for_each_concurrent(CREATE_CONCURRENCY, |spec| {
                let api = api.clone();
                async move {
                    match spec.shape {
                        NodeShape::Small => {
                            let action = format!("create Node {}", spec.name);
                            create_json(&api, spec.small_json(Utc::now()), action).await
                        }
                        NodeShape::KubeletSized => kubelet_node::create(&api, spec).await,
                    }
                }
            })
            .await
    }

    /// Ensures `kube-node-lease` exists. The apiserver creates it itself shortly after start;
    /// creating it here too removes that race.
    async fn ensure_lease_namespace(&self) -> Result<()> {
        let api: Api<Namespace> = Api::all(self.client.clone());
        let ns: Namespace =
            serde_json::from_value(json!({"metadata": {"name": NODE_LEASE_NAMESPACE}}))
                .map_err(json_err("build Namespace kube-node-lease"))?;
        match api.create(&PostParams::default(), &ns).await {
            Ok(_) => Ok(()),
            Err(e) if is_conflict(&e) => Ok(()),
            Err(e) => Err(kube_err("create Namespace kube-node-lease")(e)),
        }
    }

    /// Creates one lease per name with `renewTime` = now; returns the renew times written.
    pub async fn create_leases(&self, names: &[String]) -> Result<HashMap<String, DateTime<Utc>>> {
        self.ensure_lease_namespace().await?;
        futures::stream::iter(names.iter())
            .map(|name| async move {
                let t = now_micros();
                self.create_lease_json(name, Some(t)).await?;
                Ok::<_, SimError>((name.clone(), t))
            })
            .buffer_unordered(CREATE_CONCURRENCY)
            .try_collect()
            .await
    }

    /// Creates the lease of `node` with `renewTime` = now; returns that time.
    pub async fn create_lease(&self, node: &str) -> Result<DateTime<Utc>> {
        let t = now_micros();
        self.create_lease_json(node, Some(t)).await?;
        Ok(t)
    }

    /// Creates the lease of `node` without `spec.renewTime` (a lease with no heartbeat yet).
    /// A running, non-silenced kubelet gives it one at its next renewal.
    pub async fn create_lease_without_renew_time(&self, node: &str) -> Result<()> {
        self.create_lease_json(node, None).await
    }

    async fn create_lease_json(&self, node: &str, renew: Option<DateTime<Utc>>) -> Result<()> {
        let action = format!("create Lease {NODE_LEASE_NAMESPACE}/{node}");
        let mut spec =
            json!({"holderIdentity": node, "leaseDurationSeconds": LEASE_DURATION_SECONDS});
        if let Some(t) = renew {
            spec["renewTime"] = json!(micro_time(t));
        }
        let mut metadata = json!({"name": node});
        if !self.lease_labels.is_empty() {
            metadata["labels"] = json!(self.lease_labels);
        }
        create_json(
            &self.leases(),
            json!({"metadata": metadata, "spec": spec}),
            action,
        )
        .await?;
        Ok(())
    }

    /// Sets the lease's `spec.renewTime` (e.g. to a time long past, to expire it at once).
    pub async fn set_lease_renew_time(&self, node: &str, t: DateTime<Utc>) -> Result<()> {
        renew_lease(&self.leases(), node, t).await
    }

    /// Deletes the lease of `node`. [`Kubelets`] never recreate a lease (they only patch
    /// it), so it stays gone until [`ShootDataPlane::create_lease`].
    pub async fn delete_lease(&self, node: &str) -> Result<()> {
        self.leases()
            .delete(node, &DeleteParams::default())
            .await
            .map_err(kube_err(format!(
                "delete Lease {NODE_LEASE_NAMESPACE}/{node}"
            )))?;
        Ok(())
    }

    /// The lease's `spec.renewTime`, `None` when it has none.
    pub async fn lease_renew_time(&self, node: &str) -> Result<Option<DateTime<Utc>>> {
        let lease = self
            .leases()
            .get(node)
            .await
            .map_err(kube_err(format!("get Lease {NODE_LEASE_NAMESPACE}/{node}")))?;
        Ok(lease
            .spec
            .and_then(|s| s.renew_time)
            .and_then(|t| to_chrono(&t.0)))
    }

    /// Sets (adds or replaces) a node condition, e.g. `KernelDeadlock=True`, through the
    /// status subresource (a plain update would drop status changes).
    pub async fn set_node_condition(
        &self,
        node: &str,
        type_: &str,
        status: &str,
        reason: &str,
    ) -> Result<()> {
        let now = k8s_time(Utc::now());
        // Strategic merge merges conditions by `type`: the others stay untouched.
        let patch =
            json!({"status": {"conditions": [condition_json(type_, status, reason, &now)]}});
        let action = format!("set condition {type_}={status} on Node {node}");
        self.patch_node_status(node, patch, action).await
    }

    /// Strategic-merges `patch` into the node's status; `action` names it in an error.
    async fn patch_node_status(&self, node: &str, patch: Value, action: String) -> Result<()> {
        self.nodes()
            .patch_status(node, &PatchParams::default(), &Patch::Strategic(patch))
            .await
            .map_err(kube_err(action))?;
        Ok(())
    }

    /// Removes the node condition of this type (if present).
    pub async fn remove_node_condition(&self, node: &str, type_: &str) -> Result<()> {
        let patch = json!({"status": {"conditions": [{"type": type_, "$patch": "delete"}]}});
        let action = format!("remove condition {type_} from Node {node}");
        self.patch_node_status(node, patch, action).await
    }

    /// Sets an annotation on a node (e.g. [`NOT_MANAGED_BY_MCM_ANNOTATION`]).
    pub async fn set_node_annotation(&self, node: &str, key: &str, value: &str) -> Result<()> {
        self.patch_node_metadata(node, "annotations", key, json!(value))
            .await
    }

    /// Removes an annotation from a node.
    pub async fn remove_node_annotation(&self, node: &str, key: &str) -> Result<()> {
        self.patch_node_metadata(node, "annotations", key, Value::Null)
            .await
    }

    /// Sets a label on a node (e.g. move it to another pool with [`POOL_LABEL`]).
    pub async fn set_node_label(&self, node: &str, key: &str, value: &str) -> Result<()> {
        self.patch_node_metadata(node, "labels", key, json!(value))
            .await
    }

    async fn patch_node_metadata(
        &self,
        node: &str,
        field: &str,
        key: &str,
        value: Value,
    ) -> Result<()> {
        let action = format!("set {field} {key}={value} on Node {node}");
        let patch = json!({"metadata": {field: {key: value}}});
        self.nodes()
            .patch(node, &PatchParams::default(), &Patch::Merge(patch))
            .await
            .map_err(kube_err(action))?;
        Ok(())
    }

    /// Deletes a node (its lease stays, as in a real cluster until GC).
    pub async fn delete_node(&self, node: &str) -> Result<()> {
        self.nodes()
            .delete(node, &DeleteParams::default())
            .await
            .map_err(kube_err(format!("delete Node {node}")))?;
        Ok(())
    }

    /// Starts kubelets for `nodes` (whose leases exist); see [`Kubelets::start`].
    pub fn start_kubelets(
        &self,
        nodes: Vec<String>,
        initial_renewals: HashMap<String, DateTime<Utc>>,
        options: KubeletOptions,
    ) -> Kubelets {
        Kubelets::start(self.client.clone(), nodes, initial_renewals, options)
    }
}

/// Writes `renewTime` with a merge patch: one small request, no read, no conflicts.
async fn renew_lease(api: &Api<Lease>, node: &str, t: DateTime<Utc>) -> Result<()> {
    let patch = json!({"spec": {"renewTime": micro_time(t)}});
    api.patch(node, &PatchParams::default(), &Patch::Merge(patch))
        .await
        .map_err(kube_err(format!(
            "renew Lease {NODE_LEASE_NAMESPACE}/{node}"
        )))?;
    Ok(())
}

/// How [`Kubelets`] renew.
#[derive(Debug, Clone)]
pub struct KubeletOptions {
    /// Time between two renewal rounds (default 10 s, the kubelet's).
    pub renew_interval: Duration,
    /// Renewals in flight at once within this shoot (default 16).
    pub concurrency: usize,
    /// Optional limit shared by many shoots, so a benchmark bounds all lease writes together.
    pub limiter: Option<Arc<Semaphore>>,
}

impl Default for KubeletOptions {
    fn default() -> Self {
        KubeletOptions {
            renew_interval: DEFAULT_RENEW_INTERVAL,
            concurrency: CREATE_CONCURRENCY,
            limiter: None,
        }
    }
}

struct KubeletState {
    nodes: Vec<String>,
    silenced: Mutex<HashSet<String>>,
    /// Nodes to renew once more, stamped with the given time, and then silence.
    last_words: Mutex<HashMap<String, DateTime<Utc>>>,
    /// Starts a round at once (for last words).
    wake: tokio::sync::Notify,
    renewals: Mutex<HashMap<String, DateTime<Utc>>>,
    /// Node → when the apiserver acknowledged the renewal in `renewals` (its `renewTime` is
    /// taken before the write is sent, so on a loaded apiserver it lands later).
    landed: Mutex<HashMap<String, DateTime<Utc>>>,
    rounds: AtomicU64,
    failures: AtomicU64,
}

/// Locks a mutex, recovering the data if a panic poisoned it (the data is always valid).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The kubelets of one shoot: one background task renewing every non-silenced node's lease
/// each `renew_interval`. Dropping the handle stops it.
///
/// Silencing takes effect for renewals not yet sent: a renewal already in flight when
/// [`Kubelets::silence`] returns may still land (and is then recorded in
/// [`Kubelets::renewals`]). Rounds run one after another, so once [`Kubelets::rounds`] has
/// advanced by two since `silence`, no renewal of a silenced node is in flight.
pub struct Kubelets {
    state: Arc<KubeletState>,
    _task: AbortOnDrop,
}

impl Kubelets {
    /// Starts renewing the leases of `nodes` (in this order: [`Kubelets::silence_count`]
    /// silences the first ones). `initial_renewals` seeds [`Kubelets::renewals`], e.g. with
    /// the creation times from [`ShootDataPlane::create_leases`]. The first round starts at a
    /// random point within the first interval so that many shoots don't renew in lockstep.
    pub fn start(
        client: kube::Client,
        nodes: Vec<String>,
        initial_renewals: HashMap<String, DateTime<Utc>>,
        options: KubeletOptions,
    ) -> Kubelets {
        let state = Arc::new(KubeletState {
            nodes,
            silenced: Mutex::new(HashSet::new()),
            last_words: Mutex::new(HashMap::new()),
            wake: tokio::sync::Notify::new(),
            landed: Mutex::new(initial_renewals.clone()),
            renewals: Mutex::new(initial_renewals),
            rounds: AtomicU64::new(0),
            failures: AtomicU64::new(0),
        });
        let task = AbortOnDrop::spawn(run_kubelets(client, state.clone(), options));
        Kubelets { state, _task: task }
    }

    /// The nodes these kubelets run on, in order.
    pub fn nodes(&self) -> &[String] {
        &self.state.nodes
    }

    /// Stops renewing these nodes' leases.
    pub fn silence(&self, nodes: &[&str]) {
        let mut silenced = lock(&self.state.silenced);
        silenced.extend(nodes.iter().map(|n| n.to_string()));
    }

    /// Silences the first `n` nodes; returns their names.
    pub fn silence_count(&self, n: usize) -> Vec<String> {
        let names: Vec<String> = self.state.nodes.iter().take(n).cloned().collect();
        lock(&self.state.silenced).extend(names.iter().cloned());
        names
    }

    /// Silences the first `n` nodes after one last renewal each, stamped `renew_time` (which
    /// may lie in the past): an outage that struck right after every one of them renewed at
    /// `renew_time`, so their leases all expire at the same instant — the hardest case for a
    /// watchdog, and one whose crossing time is exact. The last renewals are written by the
    /// renewing task itself in a round that starts at once (so no ordinary renewal can land
    /// after one), and recorded in [`Kubelets::renewals`] as they succeed; a failed one is
    /// retried next round. [`Kubelets::last_words_pending`] counts those not yet written.
    /// Returns the nodes' names.
    pub fn silence_count_stamped(&self, n: usize, renew_time: DateTime<Utc>) -> Vec<String> {
        let names: Vec<String> = self.state.nodes.iter().take(n).cloned().collect();
        lock(&self.state.last_words).extend(names.iter().map(|name| (name.clone(), renew_time)));
        self.state.wake.notify_one();
        names
    }

    /// Last renewals requested by [`Kubelets::silence_count_stamped`] not written yet.
    pub fn last_words_pending(&self) -> usize {
        lock(&self.state.last_words).len()
    }

    /// Renews these nodes' leases again from the next round on.
    pub fn resume(&self, nodes: &[&str]) {
        let mut silenced = lock(&self.state.silenced);
        for n in nodes {
            silenced.remove(*n);
        }
    }

    /// Renews every node's lease again (last words not yet written are dropped).
    pub fn resume_all(&self) {
        lock(&self.state.last_words).clear();
        lock(&self.state.silenced).clear();
    }

    /// The silenced nodes, in node order.
    pub fn silenced(&self) -> Vec<String> {
        let silenced = lock(&self.state.silenced);
        self.state
            .nodes
            .iter()
            .filter(|n| silenced.contains(*n))
            .cloned()
            .collect()
    }

    /// Node → the `renewTime` of its last successful renewal (exactly what the apiserver
    /// stores), so a benchmark can tell when the expired fraction really crossed a threshold.
    pub fn renewals(&self) -> HashMap<String, DateTime<Utc>> {
        lock(&self.state.renewals).clone()
    }

    /// Node → (`renewTime` of its last successful renewal, when the apiserver acknowledged
    /// it): until then the apiserver held the renewal before (a seeded renewal counts as
    /// landed at its own time).
    pub fn renewals_landed(&self) -> HashMap<String, (DateTime<Utc>, DateTime<Utc>)> {
        let renewals = lock(&self.state.renewals);
        let landed = lock(&self.state.landed);
        renewals
            .iter()
            .map(|(node, t)| (node.clone(), (*t, landed.get(node).copied().unwrap_or(*t))))
            .collect()
    }

    /// Completed renewal rounds.
    pub fn rounds(&self) -> u64 {
        self.state.rounds.load(Ordering::SeqCst)
    }

    /// Failed renewals so far (e.g. while the apiserver was stopped).
    pub fn failures(&self) -> u64 {
        self.state.failures.load(Ordering::SeqCst)
    }
}

async fn run_kubelets(client: kube::Client, state: Arc<KubeletState>, options: KubeletOptions) {
    let api: Api<Lease> = Api::namespaced(client, NODE_LEASE_NAMESPACE);
    // tokio's interval panics on a zero period.
    let interval = options.renew_interval.max(Duration::from_millis(1));
    let phase_ms = rand::random_range(0..interval.as_millis().clamp(1, u128::from(u64::MAX)));
    let phase = Duration::from_millis(u64::try_from(phase_ms).unwrap_or(0));
    let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + phase, interval);
    // A slow round (overloaded apiserver) delays the next one instead of bursting to catch up.
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let concurrency = options.concurrency.max(1);
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            _ = state.wake.notified() => {}
        }
        futures::stream::iter(state.nodes.iter())
            .for_each_concurrent(concurrency, |node| {
                let (api, state, limiter) = (&api, &state, options.limiter.clone());
                async move {
                    // Checked per node, right before sending, to keep the window between
                    // `silence` and the last renewal small.
                    let last_word = lock(&state.last_words).get(node).copied();
                    if last_word.is_none() && lock(&state.silenced).contains(node) {
                        return;
                    }
                    let _permit = match limiter {
                        Some(l) => match l.acquire_owned().await {
                            Ok(p) => Some(p),
                            Err(_) => return, // closed limiter: the owner is shutting down
                        },
                        None => None,
                    };
                    let t = last_word.unwrap_or_else(now_micros);
                    match renew_lease(api, node, t).await {
                        Ok(()) if last_word.is_some() => {
                            // What the apiserver now holds, even if earlier than before.
                            lock(&state.renewals).insert(node.clone(), t);
                            lock(&state.landed).insert(node.clone(), Utc::now());
                            lock(&state.silenced).insert(node.clone());
                            lock(&state.last_words).remove(node);
                        }
                        Ok(()) => {
                            let mut renewals = lock(&state.renewals);
                            let last = renewals.entry(node.clone()).or_insert(t);
                            if *last <= t {
                                *last = t;
                                lock(&state.landed).insert(node.clone(), Utc::now());
                            }
                        }
                        Err(e) => {
                            state.failures.fetch_add(1, Ordering::SeqCst);
                            tracing::debug!(node = %node, error = %e, "lease renewal failed; retrying next round");
                        }
                    }
                }
            })
            .await;
        state.rounds.fetch_add(1, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    //! Node specs and time formats, without an apiserver.

    use super::*;

    #[test]
    fn node_specs_spread_over_pools() {
        let specs = node_specs(5, &["a", "b"]);
        let names: Vec<&str> = specs.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["node-0", "node-1", "node-2", "node-3", "node-4"]);
        let pools: Vec<&str> = specs.iter().map(|s| s.pool.as_str()).collect();
        assert_eq!(pools, ["a", "b", "a", "b", "a"]);
        assert!(node_specs(2, &[]).iter().all(|s| s.pool == DEFAULT_POOL));
    }

    #[test]
    fn node_json_carries_labels_and_conditions() {
        let spec = NodeSpec::new("n", "p")
            .with_condition("KernelDeadlock", "True", "Test")
            .with_annotation(NOT_MANAGED_BY_MCM_ANNOTATION, "1");
        let node = spec.node_json(Utc::now());
        assert_eq!(node["metadata"]["labels"][POOL_LABEL], "p");
        assert_eq!(node["metadata"]["labels"][HOSTNAME_LABEL], "n");
        assert_eq!(
            node["metadata"]["annotations"][NOT_MANAGED_BY_MCM_ANNOTATION],
            "1"
        );
        let types: Vec<&str> = node["status"]["conditions"]
            .as_array()
            .map(|a| a.iter().filter_map(|c| c["type"].as_str()).collect())
            .unwrap_or_default();
        assert_eq!(types, ["Ready", "KernelDeadlock"]);
        let parsed: Result<Node, _> = serde_json::from_value(node);
        assert!(parsed.is_ok(), "{parsed:?}");
    }

    #[test]
    fn micro_time_round_trips_through_the_api_type() {
        let t = now_micros();
        let lease: Lease = serde_json::from_value(json!({
            "metadata": {"name": "n"}, "spec": {"renewTime": micro_time(t)}
        }))
        .expect("lease JSON");
        let back = lease
            .spec
            .and_then(|s| s.renew_time)
            .map(|m| to_chrono(&m.0));
        assert_eq!(back, Some(Some(t)));
    }
}
