//! Simulated data plane for dependency-watchdog: everything the watchdog reads, made real.
//!
//! No kubelet, kube-controller-manager or machine-controller-manager runs in the test
//! environment, so this crate plays their part against real kube-apiservers:
//!
//! - [`shoot`]: the shoot's data plane, against the shoot apiserver: Nodes, their Leases in
//!   `kube-node-lease`, and [`Kubelets`] — one background task per shoot renewing the leases,
//!   with nodes that can be silenced (a zone outage) and resumed.
//! - [`kubelet_node`]: Nodes the size a real kubelet makes them ([`NodeShape::KubeletSized`]):
//!   images, node info, realistic conditions, Gardener labels and annotations, and the
//!   `managedFields` of the writers of a real node, 10–30 KiB each as served.
//! - [`seed`]: the shoot's control-plane objects in the seed: shoot namespace, probe Secret,
//!   `Cluster` (with the `Shoot` inside), Machines, the scalable Deployments, crash-looping
//!   Pods and EndpointSlices.
//! - [`deployment_status`]: [`DeploymentStatusSim`], which makes Deployment status follow spec
//!   the way kube-controller-manager and the kubelets would.
//! - [`SimShoot`]: all of the above for one shoot, created in one call.
//!
//! Every background task lives in an [`AbortOnDrop`] handle, so dropping the owner stops it:
//! tests never leak tasks that keep writing to an apiserver.

#![forbid(unsafe_code)]

pub mod deployment_status;
pub mod kubelet_node;
pub mod seed;
pub mod shoot;
mod sim_shoot;

use std::time::Duration;

pub use deployment_status::{DeploymentStatusOptions, DeploymentStatusSim};
pub use kubelet_node::NodeShape;
pub use seed::{EndpointsState, SeedControlPlane, ShootState, WorkerPool};
pub use shoot::{
    KubeletOptions, Kubelets, NodeSpec, ShootDataPlane, ZONE_LABEL,
    kubelet_sized_node_specs_with_prefix, node_specs, node_specs_with_prefix, zoned_node_specs,
};
pub use sim_shoot::{SimShoot, SimShootOptions};

/// Errors of the simulator; each names what it was doing when it failed.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// A request to an apiserver failed.
    #[error("{action}: {source}")]
    Kube {
        /// What the simulator was doing, e.g. `create Lease kube-node-lease/node-0`.
        action: String,
        /// The client's error.
        #[source]
        source: kube::Error,
    },
    /// An object could not be built from (or read as) JSON.
    #[error("{action}: {source}")]
    Json {
        /// What the simulator was building or reading.
        action: String,
        /// The serialization error.
        #[source]
        source: serde_json::Error,
    },
    /// An object did not look as the simulator expected (e.g. a missing field).
    #[error("{action}: {detail}")]
    Unexpected {
        /// What the simulator was doing.
        action: String,
        /// What was wrong.
        detail: String,
    },
}

/// Result of simulator operations.
pub type Result<T, E = SimError> = std::result::Result<T, E>;

/// Adds the action to a kube error (`.map_err(kube_err("create Node node-0"))`).
pub(crate) fn kube_err(action: impl Into<String>) -> impl FnOnce(kube::Error) -> SimError {
    let action = action.into();
    move |source| SimError::Kube { action, source }
}

/// Adds the action to a JSON error.
pub(crate) fn json_err(action: impl Into<String>) -> impl FnOnce(serde_json::Error) -> SimError {
    let action = action.into();
    move |source| SimError::Json { action, source }
}

/// Creates the object `json` describes through `api`; `action` names it in errors. The
/// simulator writes its objects as the JSON they are on the wire.
pub(crate) async fn create_json<K>(
    api: &kube::Api<K>,
    json: serde_json::Value,
    action: String,
) -> Result<()>
where
    K: Clone
        + std::fmt::Debug
        + k8s_openapi::serde::de::DeserializeOwned
        + k8s_openapi::serde::Serialize,
{
    let object: K = serde_json::from_value(json).map_err(json_err(&action))?;
    api.create(&kube::api::PostParams::default(), &object)
        .await
        .map_err(kube_err(action))?;
    Ok(())
}

/// Whether a kube error is the apiserver's `404 Not Found`.
pub(crate) fn is_not_found(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 404)
}

/// Whether a kube error is the apiserver's `409 Conflict` (exists, or stale resourceVersion).
pub(crate) fn is_conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 409)
}

/// How many writes one setup step (creating nodes, leases, machines) keeps in flight: enough
/// to hide round trips, few enough that a thousand shoots don't swamp a 2-core machine.
pub const CREATE_CONCURRENCY: usize = 16;

/// Default kubelet lease renew interval (the kubelet's: a quarter of the 40 s lease).
pub const DEFAULT_RENEW_INTERVAL: Duration = Duration::from_secs(10);

/// A background task that is aborted when this handle is dropped.
///
/// Tokio's `JoinHandle` detaches on drop; the simulator's tasks must not outlive their
/// owner, or a finished test would keep renewing leases against a shared apiserver.
#[derive(Debug)]
pub struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl AbortOnDrop {
    /// Spawns `future` on the current tokio runtime.
    pub fn spawn(future: impl std::future::Future<Output = ()> + Send + 'static) -> Self {
        AbortOnDrop(tokio::spawn(future))
    }

    /// Whether the task has ended (it only ends on its own after a panic).
    pub fn is_finished(&self) -> bool {
        self.0.is_finished()
    }
}

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Now, truncated to microseconds: what a `MicroTime` stores, so a time we record equals the
/// time the apiserver hands back.
pub fn now_micros() -> chrono::DateTime<chrono::Utc> {
    let now = chrono::Utc::now();
    chrono::DateTime::from_timestamp_micros(now.timestamp_micros()).unwrap_or(now)
}

/// Formats a time as a Kubernetes `MicroTime` (`2006-01-02T15:04:05.000000Z`).
pub(crate) fn micro_time(t: chrono::DateTime<chrono::Utc>) -> String {
    t.to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
}

/// Formats a time as a Kubernetes `Time` (seconds precision).
pub(crate) fn k8s_time(t: chrono::DateTime<chrono::Utc>) -> String {
    t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}
