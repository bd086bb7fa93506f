//! Deployment status that follows spec, as if kube-controller-manager and kubelets ran.
//!
//! The prober scales Deployments and then waits for `status.readyReplicas`; in the test
//! environment no controller ever writes status, so [`DeploymentStatusSim`] does: one task
//! watches Deployments (all namespaces, or a set of them) and, `delay` after each change,
//! writes `replicas = readyReplicas = availableReplicas = updatedReplicas = spec.replicas`
//! and `observedGeneration = generation` through the status subresource.
//!
//! The task keeps a sequence number per Deployment so that only the newest desired status
//! is written when several changes pile up, and it bounds writes in flight. A write that
//! loses a race with a newer one is harmless: its watch event shows status ≠ spec again and
//! schedules a fresh write, so status always converges on the latest spec.

use std::collections::{HashMap, VecDeque};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures::stream::{BoxStream, FuturesUnordered};
use futures::{Future, StreamExt};
use k8s_openapi::api::apps::v1::Deployment;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::json;

use crate::{AbortOnDrop, CREATE_CONCURRENCY, is_not_found};

/// Pause before retrying a failed status write.
const RETRY_DELAY: Duration = Duration::from_millis(500);

/// What a [`DeploymentStatusSim`] watches and how fast it reacts.
#[derive(Debug, Clone)]
pub struct DeploymentStatusOptions {
    /// Namespaces to watch; `None` watches all namespaces with one watch.
    pub namespaces: Option<Vec<String>>,
    /// Optional label selector for the watch(es).
    pub label_selector: Option<String>,
    /// Time between a spec change and the status write (pods "starting"); default 0.
    pub delay: Duration,
    /// Status writes in flight at once (default 16).
    pub concurrency: usize,
}

impl Default for DeploymentStatusOptions {
    fn default() -> Self {
        DeploymentStatusOptions {
            namespaces: None,
            label_selector: None,
            delay: Duration::ZERO,
            concurrency: CREATE_CONCURRENCY,
        }
    }
}

impl DeploymentStatusOptions {
    /// Watches only these namespaces.
    pub fn namespaces<S: AsRef<str>>(namespaces: &[S]) -> Self {
        DeploymentStatusOptions {
            namespaces: Some(namespaces.iter().map(|s| s.as_ref().to_string()).collect()),
            ..Default::default()
        }
    }

    /// Sets the delay.
    pub fn with_delay(mut self, delay: Duration) -> Self {
        self.delay = delay;
        self
    }
}

#[derive(Default)]
struct Counters {
    writes: AtomicU64,
    failures: AtomicU64,
}

/// Makes Deployment status follow spec; one background task, stopped when dropped.
pub struct DeploymentStatusSim {
    counters: Arc<Counters>,
    _task: AbortOnDrop,
}

impl DeploymentStatusSim {
    /// Starts watching with `client` (a seed client).
    pub fn start(client: kube::Client, options: DeploymentStatusOptions) -> Self {
        let counters = Arc::new(Counters::default());
        let task = AbortOnDrop::spawn(run(client, options, counters.clone()));
        DeploymentStatusSim {
            counters,
            _task: task,
        }
    }

    /// Successful status writes so far.
    pub fn writes(&self) -> u64 {
        self.counters.writes.load(Ordering::SeqCst)
    }

    /// Failed status writes so far (e.g. the Deployment was deleted meanwhile).
    pub fn failures(&self) -> u64 {
        self.counters.failures.load(Ordering::SeqCst)
    }
}

/// `(namespace, name)` of a Deployment.
type Key = (String, String);

/// A status write to make, stamped with the sequence number it was scheduled under.
struct Desired {
    key: Key,
    seq: u64,
    replicas: i32,
    generation: Option<i64>,
}

type BoxFut<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// What to write for `d`, or `None` when status already matches spec.
fn desired_status(d: &Deployment) -> Option<(i32, Option<i64>)> {
    // The apiserver defaults spec.replicas to 1, so it is always there in practice.
    let replicas = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
    let generation = d.metadata.generation;
    // The apiserver drops zero-valued status fields: absent means 0.
    let status = d.status.clone().unwrap_or_default();
    let matches = status.replicas.unwrap_or(0) == replicas
        && status.ready_replicas.unwrap_or(0) == replicas
        && status.available_replicas.unwrap_or(0) == replicas
        && status.updated_replicas.unwrap_or(0) == replicas
        && status.observed_generation == generation;
    (!matches).then_some((replicas, generation))
}

/// One watch of the Deployments `options` selects: one for all namespaces, or one a namespace
/// listed.
fn deployment_watches(
    client: &kube::Client,
    options: &DeploymentStatusOptions,
) -> Vec<BoxStream<'static, Result<Deployment, watcher::Error>>> {
    let mut config = watcher::Config::default();
    if let Some(sel) = &options.label_selector {
        config = config.labels(sel);
    }
    match &options.namespaces {
        None => vec![
            watcher(Api::<Deployment>::all(client.clone()), config)
                .default_backoff()
                .applied_objects()
                .boxed(),
        ],
        Some(namespaces) => namespaces
            .iter()
            .map(|ns| {
                watcher(
                    Api::<Deployment>::namespaced(client.clone(), ns),
                    config.clone(),
                )
                .default_backoff()
                .applied_objects()
                .boxed()
            })
            .collect(),
    }
}

async fn run(client: kube::Client, options: DeploymentStatusOptions, counters: Arc<Counters>) {
    let streams = deployment_watches(&client, &options);
    // An empty namespace list would make select_all end at once; that is fine: nothing to do.
    let mut events = futures::stream::select_all(streams);
    let concurrency = options.concurrency.max(1);
    let mut next_seq: u64 = 0;
    let mut latest: HashMap<Key, u64> = HashMap::new();
    let mut delayed: FuturesUnordered<BoxFut<Desired>> = FuturesUnordered::new();
    let mut ready: VecDeque<Desired> = VecDeque::new();
    let mut writing: FuturesUnordered<BoxFut<Option<Desired>>> = FuturesUnordered::new();

    loop {
        tokio::select! {
            event = events.next() => match event {
                Some(Ok(d)) => {
                    let (Some(ns), Some(name)) =
                        (d.metadata.namespace.clone(), d.metadata.name.clone())
                    else {
                        continue;
                    };
                    let key = (ns, name);
                    next_seq += 1;
                    // Any newer observation supersedes writes scheduled for older ones.
                    latest.insert(key.clone(), next_seq);
                    if let Some((replicas, generation)) = desired_status(&d) {
                        let desired = Desired { key, seq: next_seq, replicas, generation };
                        let delay = options.delay;
                        delayed.push(Box::pin(async move {
                            tokio::time::sleep(delay).await;
                            desired
                        }));
                    }
                }
                Some(Err(e)) => tracing::debug!(error = %e, "deployment watch error; retrying"),
                None => {
                    tracing::debug!("deployment watch streams ended");
                    return;
                }
            },
            Some(desired) = delayed.next(), if !delayed.is_empty() => ready.push_back(desired),
            Some(retry) = writing.next(), if !writing.is_empty() => {
                if let Some(desired) = retry {
                    delayed.push(Box::pin(async move {
                        tokio::time::sleep(RETRY_DELAY).await;
                        desired
                    }));
                }
            }
        }
        while writing.len() < concurrency {
            let Some(desired) = ready.pop_front() else {
                break;
            };
            if latest.get(&desired.key) != Some(&desired.seq) {
                continue; // superseded by a newer observation
            }
            writing.push(Box::pin(write_status(
                client.clone(),
                desired,
                counters.clone(),
            )));
        }
    }
}

/// Writes the status; returns the write back when it failed for a reason other than the
/// Deployment being gone, to be retried (no watch event would come to trigger it).
async fn write_status(
    client: kube::Client,
    desired: Desired,
    counters: Arc<Counters>,
) -> Option<Desired> {
    let (ns, name) = &desired.key;
    let api: Api<Deployment> = Api::namespaced(client, ns);
    let r = desired.replicas;
    let mut status = json!({
        "replicas": r, "readyReplicas": r, "availableReplicas": r, "updatedReplicas": r,
        "unavailableReplicas": 0
    });
    if let Some(g) = desired.generation {
        status["observedGeneration"] = json!(g);
    }
    let patch = json!({"status": status});
    match api
        .patch_status(name, &PatchParams::default(), &Patch::Merge(patch))
        .await
    {
        Ok(_) => {
            counters.writes.fetch_add(1, Ordering::SeqCst);
            None
        }
        Err(e) => {
            counters.failures.fetch_add(1, Ordering::SeqCst);
            tracing::debug!(namespace = %ns, name = %name, error = %e,
                "deployment status write failed");
            (!is_not_found(&e)).then_some(desired)
        }
    }
}

#[cfg(test)]
mod tests {
    //! When a status write is due.

    use super::*;
    use serde_json::Value;

    fn deployment(spec: i32, generation: i64, status: Value) -> Deployment {
        serde_json::from_value(json!({
            "metadata": {"name": "d", "namespace": "n", "generation": generation},
            "spec": {"replicas": spec, "selector": {}, "template": {}},
            "status": status
        }))
        .expect("deployment JSON")
    }

    #[test]
    fn status_matching_spec_needs_no_write() {
        let d = deployment(
            2,
            3,
            json!({"replicas": 2, "readyReplicas": 2, "availableReplicas": 2,
                   "updatedReplicas": 2, "observedGeneration": 3}),
        );
        assert_eq!(desired_status(&d), None);
    }

    #[test]
    fn zero_replicas_match_an_empty_status() {
        assert_eq!(
            desired_status(&deployment(0, 4, json!({"observedGeneration": 4}))),
            None
        );
    }

    #[test]
    fn stale_status_asks_for_a_write() {
        let d = deployment(
            3,
            5,
            json!({"replicas": 3, "readyReplicas": 3, "availableReplicas": 3,
                   "updatedReplicas": 3, "observedGeneration": 4}),
        );
        assert_eq!(desired_status(&d), Some((3, Some(5))));
        assert_eq!(
            desired_status(&deployment(1, 1, json!({}))),
            Some((1, Some(1)))
        );
    }
}
