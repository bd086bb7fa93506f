//! What the watchdog tells its operator beyond metrics: Kubernetes Events for what it decides
//! and does, logs as the reference writes them, and liveness and readiness.
//!
//! - [`events`]: Events on the Cluster, the targets and our own pod;
//! - [`logging`]: the reference's log format;
//! - [`health`]: `/healthz` and `/readyz`.

pub mod events;
pub mod health;
pub mod logging;
