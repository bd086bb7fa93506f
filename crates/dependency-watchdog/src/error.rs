//! The library's error type: every variant names the object or field it is about.

use std::path::PathBuf;

/// Errors of the watchdog library.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The config file could not be read.
    #[error("reading config file {path}: {source}")]
    ReadConfig {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The config file is invalid (every bad field is named).
    #[error("config file {path}: {source}")]
    Config {
        /// The file.
        path: PathBuf,
        /// The problems.
        source: dwd_core::ConfigError,
    },
    /// The seed kubeconfig / in-cluster config could not be loaded.
    #[error("seed cluster client: {0}")]
    SeedClient(String),
    /// A shoot's kubeconfig secret is missing or unusable.
    #[error("shoot {namespace}: kubeconfig secret {secret}: {reason}")]
    ShootKubeconfig {
        /// Shoot namespace.
        namespace: String,
        /// Secret name.
        secret: String,
        /// Why it can't be used.
        reason: String,
    },
    /// A Kubernetes API call failed.
    #[error("{action}: {source}")]
    Kube {
        /// What we were doing, naming the object.
        action: String,
        /// The client error.
        source: kube::Error,
    },
    /// A call did not finish in time.
    #[error("{action}: timed out after {timeout:?}")]
    Timeout {
        /// What we were doing.
        action: String,
        /// The limit.
        timeout: std::time::Duration,
    },
    /// A scaling step was not made: a newer verdict superseded its flow (nothing was sent).
    #[error("{action}: stopped, a newer verdict superseded the flow")]
    Superseded {
        /// What was not done.
        action: String,
    },
    /// A scaling step failed for a reason that is not an API error.
    #[error("{0}")]
    Scaling(String),
    /// A server (metrics/health) could not bind.
    #[error("binding {what} on {addr}: {source}")]
    Bind {
        /// Which server.
        what: &'static str,
        /// The address.
        addr: String,
        /// Why.
        source: std::io::Error,
    },
    /// A critical background task ended.
    #[error("critical task {0} ended: {1}")]
    TaskDied(&'static str, String),
    /// Leader election is misconfigured, or this replica lost the leadership it held.
    #[error("leader election: {0}")]
    LeaderElection(String),
}

impl Error {
    /// Wraps a kube error with what we were doing.
    pub fn kube(action: impl Into<String>, source: kube::Error) -> Self {
        Error::Kube {
            action: action.into(),
            source,
        }
    }

    /// Whether the apiserver answered 429 Too Many Requests.
    pub(crate) fn is_throttled(&self) -> bool {
        matches!(self, Error::Kube { source: kube::Error::Api(s), .. } if s.code == 429)
    }

    /// Whether the apiserver answered 409 Conflict (a precondition on an older version).
    pub fn is_conflict(&self) -> bool {
        matches!(self, Error::Kube { source: kube::Error::Api(s), .. } if s.code == 409)
    }
}

/// Whether `error`, or anything in its source chain, is an `E`.
pub(crate) fn caused_by<E: std::error::Error + 'static>(
    error: &(dyn std::error::Error + 'static),
) -> bool {
    let mut next = Some(error);
    while let Some(e) = next {
        if e.is::<E>() {
            return true;
        }
        next = e.source();
    }
    false
}

/// Result with the library's error.
pub type Result<T, E = Error> = std::result::Result<T, E>;
