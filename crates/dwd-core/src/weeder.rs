//! The weeder's event rules (docs/behaviour.md §3.2, §3.3).
//!
//! When a service comes back, pods that crash-looped while it was gone sit in a growing back-off;
//! the weeder deletes them so they restart at once. These functions decide which EndpointSlice
//! events start a weeder and which pods it deletes, so the controller only does the watching;
//! [`stepper`] steps the EndpointSlice watch (which slice starts a weeder) and each pod watch of
//! a weeder (what to delete, retry, or give up).

use k8s_openapi::api::core::v1::{ContainerStatus, Pod};
use k8s_openapi::api::discovery::v1::EndpointSlice;

pub mod stepper;

pub use stepper::{
    DeleteAnswer, DeletionTarget, PodEvent, PodStep, PodWatch, SliceWatch, deletion_target,
    in_scope, should_start,
};

/// Label linking an EndpointSlice to its Service.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";
/// The waiting reason of a crash-looping container.
pub const CRASH_LOOP_BACK_OFF: &str = "CrashLoopBackOff";

/// The service an EndpointSlice belongs to.
pub fn service_name(slice: &EndpointSlice) -> Option<&str> {
    slice
        .metadata
        .labels
        .as_ref()?
        .get(SERVICE_NAME_LABEL)
        .map(String::as_str)
}

/// Ready = at least one endpoint and every endpoint reports `conditions.ready == true`. Unlike the
/// reference, an empty slice is not ready: a service without endpoints has not come back.
pub fn slice_is_ready(slice: &EndpointSlice) -> bool {
    !slice.endpoints.is_empty()
        && slice
            .endpoints
            .iter()
            .all(|e| e.conditions.as_ref().and_then(|c| c.ready) == Some(true))
}

/// A weeder starts on creation of a ready slice, or an update turning a slice ready.
pub fn should_start_weeder(old: Option<&EndpointSlice>, new: &EndpointSlice) -> bool {
    slice_is_ready(new) && !old.is_some_and(slice_is_ready)
}

fn crashlooping(statuses: Option<&Vec<ContainerStatus>>) -> Option<String> {
    statuses?
        .iter()
        .find(|s| {
            s.state
                .as_ref()
                .and_then(|st| st.waiting.as_ref())
                .and_then(|w| w.reason.as_deref())
                == Some(CRASH_LOOP_BACK_OFF)
        })
        .map(|s| s.name.clone())
}

/// The name of a container (init containers first, then regular ones) waiting in
/// `CrashLoopBackOff`.
pub fn crashlooping_container(pod: &Pod) -> Option<String> {
    let status = pod.status.as_ref()?;
    crashlooping(status.init_container_statuses.as_ref())
        .or_else(|| crashlooping(status.container_statuses.as_ref()))
}

/// The crash-looping container's name when the pod should be deleted: it crash-loops and is not
/// already being deleted.
pub fn should_delete_pod(pod: &Pod) -> Option<String> {
    if pod.metadata.deletion_timestamp.is_some() {
        return None;
    }
    crashlooping_container(pod)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{ContainerState, ContainerStateWaiting, PodStatus};
    use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
    use k8s_openapi::jiff::Timestamp;
    use std::collections::BTreeMap;

    fn slice(ready: &[Option<bool>]) -> EndpointSlice {
        EndpointSlice {
            metadata: ObjectMeta {
                name: Some("etcd-main-client-abc".into()),
                labels: Some(BTreeMap::from([(
                    SERVICE_NAME_LABEL.into(),
                    "etcd-main-client".into(),
                )])),
                ..Default::default()
            },
            address_type: "IPv4".into(),
            endpoints: ready
                .iter()
                .map(|r| Endpoint {
                    addresses: vec!["10.0.0.1".into()],
                    conditions: Some(EndpointConditions {
                        ready: *r,
                        ..Default::default()
                    }),
                    ..Default::default()
                })
                .collect(),
            ports: None,
        }
    }

    fn status(name: &str, reason: Option<&str>) -> ContainerStatus {
        ContainerStatus {
            name: name.into(),
            state: Some(ContainerState {
                waiting: Some(ContainerStateWaiting {
                    reason: reason.map(Into::into),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn pod(containers: Vec<ContainerStatus>, init: Vec<ContainerStatus>) -> Pod {
        Pod {
            status: Some(PodStatus {
                container_statuses: Some(containers),
                init_container_statuses: Some(init),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn service_name_comes_from_the_label() {
        assert_eq!(service_name(&slice(&[])), Some("etcd-main-client"));
        assert_eq!(service_name(&EndpointSlice::default()), None);
    }

    #[test]
    fn slice_with_all_endpoints_ready_is_ready() {
        assert!(slice_is_ready(&slice(&[Some(true), Some(true)])));
    }

    #[test]
    fn empty_slice_is_not_ready() {
        assert!(!slice_is_ready(&slice(&[])));
    }

    #[test]
    fn one_unready_or_unknown_endpoint_makes_slice_not_ready() {
        assert!(!slice_is_ready(&slice(&[Some(true), Some(false)])));
        assert!(!slice_is_ready(&slice(&[Some(true), None])));
        let mut s = slice(&[Some(true)]);
        s.endpoints[0].conditions = None;
        assert!(!slice_is_ready(&s));
    }

    #[test]
    fn create_of_ready_slice_starts_weeder() {
        assert!(should_start_weeder(None, &slice(&[Some(true)])));
        assert!(!should_start_weeder(None, &slice(&[Some(false)])));
    }

    #[test]
    fn update_from_not_ready_to_ready_starts_weeder() {
        assert!(should_start_weeder(
            Some(&slice(&[Some(false)])),
            &slice(&[Some(true)])
        ));
        assert!(should_start_weeder(
            Some(&slice(&[])),
            &slice(&[Some(true)])
        ));
    }

    #[test]
    fn update_of_already_ready_or_still_unready_slice_starts_nothing() {
        assert!(!should_start_weeder(
            Some(&slice(&[Some(true)])),
            &slice(&[Some(true), Some(true)])
        ));
        assert!(!should_start_weeder(
            Some(&slice(&[Some(true)])),
            &slice(&[Some(false)])
        ));
    }

    #[test]
    fn crashlooping_regular_or_init_container_is_found() {
        let p = pod(
            vec![
                status("ok", None),
                status("kapi", Some(CRASH_LOOP_BACK_OFF)),
            ],
            vec![],
        );
        assert_eq!(crashlooping_container(&p), Some("kapi".into()));
        let p = pod(vec![], vec![status("wait-etcd", Some(CRASH_LOOP_BACK_OFF))]);
        assert_eq!(crashlooping_container(&p), Some("wait-etcd".into()));
    }

    #[test]
    fn other_waiting_reasons_are_not_crashlooping() {
        let p = pod(
            vec![
                status("a", Some("ContainerCreating")),
                status("b", Some("ImagePullBackOff")),
            ],
            vec![],
        );
        assert_eq!(crashlooping_container(&p), None);
        assert_eq!(crashlooping_container(&Pod::default()), None);
    }

    #[test]
    fn crashlooping_pod_without_deletion_timestamp_is_deleted() {
        let p = pod(vec![status("kapi", Some(CRASH_LOOP_BACK_OFF))], vec![]);
        assert_eq!(should_delete_pod(&p), Some("kapi".into()));
    }

    #[test]
    fn pod_already_being_deleted_is_left_alone() {
        let mut p = pod(vec![status("kapi", Some(CRASH_LOOP_BACK_OFF))], vec![]);
        p.metadata.deletion_timestamp = Some(Time(Timestamp::UNIX_EPOCH));
        assert_eq!(should_delete_pod(&p), None);
    }

    #[test]
    fn healthy_pod_is_not_deleted() {
        let p = pod(vec![status("kapi", None)], vec![]);
        assert_eq!(should_delete_pod(&p), None);
    }
}
