//! The acting weeder's hands: delete the pods the rules pick (docs/behaviour.md §3.3).
//!
//! Each attempt is one DELETE with the pod's UID as precondition, so a pod that was re-created
//! under the same name (a StatefulSet's `etcd-main-0`) is never deleted on the strength of its
//! predecessor's status, limited to [`DELETE_TIMEOUT`]: the watch that found the pod waits for
//! it, and a seed that never answers must not stall the weeder for good. Deletions go ahead of
//! other seed requests in the client's budget (`Priority::WEEDER_DELETE`): deleting is what the
//! weeder is for. A deleted pod is counted, logged and published as an Event; a deletion that
//! failed every attempt is counted by the category of its last failure.

use std::sync::Arc;
use std::time::Duration;

use dwd_core::PodSelector;
use dwd_core::weeder::{DeleteAnswer, DeletionTarget};
use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{DeleteParams, Preconditions};
use tracing::{debug, info, warn};

use super::pods::{Hands, PodHands, Weeder};
use crate::client::rate_limit::{Priority, prioritized};
use crate::metrics::{DeletionFailure, DeletionFailureLabels, Metrics, ServiceLabels};
use crate::observe::events::Events;

/// How long one deletion attempt may take, waiting for the seed budget included.
pub(crate) const DELETE_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a deletion attempt failed.
#[derive(Debug, thiserror::Error)]
enum DeleteError {
    /// The apiserver refused or the request failed.
    #[error(transparent)]
    Api(#[from] kube::Error),
    /// No answer within [`DELETE_TIMEOUT`].
    #[error("no answer within {0:?}")]
    TimedOut(Duration),
}

impl DeleteError {
    /// The failure's stable category: the `reason` label of
    /// `dwd_weeder_pod_deletion_failures_total`.
    fn category(&self) -> DeletionFailure {
        match self {
            DeleteError::TimedOut(_) => DeletionFailure::Timeout,
            DeleteError::Api(kube::Error::Api(s)) => match s.code {
                401 | 403 => DeletionFailure::Forbidden,
                429 => DeletionFailure::Throttled,
                500..=599 => DeletionFailure::ServerError,
                _ => DeletionFailure::Refused,
            },
            DeleteError::Api(_) => DeletionFailure::Transport,
        }
    }
}

/// The acting weeders' hands: every pod watch deletes.
pub(crate) struct Deleters {
    /// Process metrics (`pods_deleted`, `pod_deletion_failures`).
    metrics: Arc<Metrics>,
    /// Kubernetes Events: one per deleted pod.
    events: Events,
}

impl Deleters {
    /// Deleters counting in `metrics` and publishing through `events`.
    pub(crate) fn new(metrics: Arc<Metrics>, events: Events) -> Self {
        Deleters { metrics, events }
    }
}

impl Hands for Deleters {
    fn for_watch(&self, weeder: &Weeder, selector: &PodSelector) -> Box<dyn PodHands> {
        Box::new(Deleter {
            api: Api::namespaced(
                prioritized(&weeder.client, Priority::WEEDER_DELETE),
                &weeder.namespace,
            ),
            namespace: weeder.namespace.clone(),
            service: weeder.service.clone(),
            query: selector.to_query(),
            metrics: self.metrics.clone(),
            events: self.events.clone(),
            last_error: None,
        })
    }
}

/// One pod watch's deleter.
struct Deleter {
    /// The weeder's pods, at `Priority::WEEDER_DELETE`.
    api: Api<Pod>,
    namespace: String,
    service: String,
    /// The watch's selector, for the logs.
    query: String,
    metrics: Arc<Metrics>,
    events: Events,
    /// The failure of the latest attempt, counted when the deletion is given up.
    last_error: Option<DeleteError>,
}

impl PodHands for Deleter {
    fn attempt<'a>(&'a mut self, target: &'a DeletionTarget) -> BoxFuture<'a, DeleteAnswer> {
        Box::pin(async move {
            match delete_pod(&self.api, target).await {
                Ok(answer) => answer,
                Err(e) => {
                    debug!(pod = %target.name, error = %e, "delete failed");
                    self.last_error = Some(e);
                    DeleteAnswer::Failed
                }
            }
        })
    }

    fn done(&mut self, target: &DeletionTarget, deleted: bool) {
        if !deleted {
            debug!(pod = %target.name, "crash-looping pod already gone");
            return;
        }
        self.metrics
            .pods_deleted
            .get_or_create(&ServiceLabels {
                service: self.service.clone(),
            })
            .inc();
        info!(
            namespace = %self.namespace,
            pod = %target.name,
            service = %self.service,
            selector = %self.query,
            container = %target.container,
            "deleted crash-looping pod so it restarts now that its dependency is back"
        );
        // The pod is gone, but its event lives on in the namespace, found by name and UID.
        self.events.pod_deleted(
            &self.namespace,
            &target.name,
            &target.uid,
            &self.service,
            &target.container,
        );
    }

    fn gave_up(&mut self, target: &DeletionTarget, relist_after: Duration) {
        let error = self.last_error.take();
        let reason = error
            .as_ref()
            .map_or(DeletionFailure::Transport, DeleteError::category);
        self.metrics
            .pod_deletion_failures
            .get_or_create(&DeletionFailureLabels {
                service: self.service.clone(),
                reason,
            })
            .inc();
        let error = error.map(|e| e.to_string()).unwrap_or_default();
        warn!(
            namespace = %self.namespace,
            pod = %target.name,
            service = %self.service,
            selector = %self.query,
            error = %error,
            retry_in = ?relist_after,
            "deleting crash-looping pod failed"
        );
    }
}

/// One attempt to delete `target` (UID precondition) through `api`, limited to
/// [`DELETE_TIMEOUT`].
async fn delete_pod(api: &Api<Pod>, target: &DeletionTarget) -> Result<DeleteAnswer, DeleteError> {
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: Some(target.uid.clone()),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    let deleting = api.delete(&target.name, &params);
    match tokio::time::timeout(DELETE_TIMEOUT, deleting).await {
        Ok(Ok(_)) => Ok(DeleteAnswer::Deleted),
        // 404: gone; 409: the UID precondition failed, so the pod we saw is gone and a new
        // one took its name.
        Ok(Err(kube::Error::Api(s))) if s.code == 404 || s.code == 409 => Ok(DeleteAnswer::Gone),
        Ok(Err(e)) => Err(e.into()),
        Err(_) => Err(DeleteError::TimedOut(DELETE_TIMEOUT)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_deletion_counts_in_its_stable_category() {
        let api = |code: u16| {
            let status = kube::core::Status::failure("no", "Reason").with_code(code);
            DeleteError::Api(kube::Error::Api(status.boxed()))
        };
        let cases = [
            (
                DeleteError::TimedOut(DELETE_TIMEOUT),
                DeletionFailure::Timeout,
            ),
            (api(403), DeletionFailure::Forbidden),
            (api(401), DeletionFailure::Forbidden),
            (api(429), DeletionFailure::Throttled),
            (api(500), DeletionFailure::ServerError),
            (api(503), DeletionFailure::ServerError),
            (api(422), DeletionFailure::Refused),
            (
                DeleteError::Api(kube::Error::LinesCodecMaxLineLengthExceeded),
                DeletionFailure::Transport,
            ),
        ];
        for (error, category) in cases {
            assert_eq!(error.category(), category, "{error}");
        }
    }
}
