//! A node lease as the lease probe reads it: name and renew time, nothing else.
//!
//! Every probe run of every shoot lists the shoot's node leases. Deserialized as
//! k8s-openapi `Lease`s, most of the work would go into `managedFields` (a JSON tree per
//! lease, built and dropped again) and fields nobody reads; this type lets serde skip all of
//! that. `Api<NodeLease>` lists the same `coordination.k8s.io/v1` leases.

use std::borrow::Cow;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use serde::Deserialize;

/// A `coordination.k8s.io/v1` Lease reduced to what decides expiry.
#[derive(Debug, Clone, Deserialize)]
#[serde(from = "RawLease")]
pub struct NodeLease {
    /// Only `name` is set.
    metadata: ObjectMeta,
    /// `spec.renewTime`.
    renew_time: Option<MicroTime>,
}

/// The wire shape; serde ignores every field not named here without building it.
#[derive(Deserialize)]
struct RawLease {
    #[serde(default)]
    metadata: RawMeta,
    #[serde(default)]
    spec: RawSpec,
}

#[derive(Deserialize, Default)]
struct RawMeta {
    name: Option<String>,
}

#[derive(Deserialize, Default)]
struct RawSpec {
    #[serde(rename = "renewTime")]
    renew_time: Option<MicroTime>,
}

impl From<RawLease> for NodeLease {
    fn from(raw: RawLease) -> Self {
        NodeLease {
            metadata: ObjectMeta {
                name: raw.metadata.name,
                ..ObjectMeta::default()
            },
            renew_time: raw.spec.renew_time,
        }
    }
}

impl NodeLease {
    /// The k8s-openapi `Lease` the decision functions take (name and renew time only).
    pub fn into_lease(self) -> Lease {
        Lease {
            metadata: self.metadata,
            spec: Some(LeaseSpec {
                renew_time: self.renew_time,
                ..LeaseSpec::default()
            }),
        }
    }
}

impl kube::Resource for NodeLease {
    type DynamicType = ();
    type Scope = k8s_openapi::NamespaceResourceScope;

    fn kind(_: &()) -> Cow<'_, str> {
        Cow::Borrowed("Lease")
    }

    fn group(_: &()) -> Cow<'_, str> {
        Cow::Borrowed("coordination.k8s.io")
    }

    fn version(_: &()) -> Cow<'_, str> {
        Cow::Borrowed("v1")
    }

    fn plural(_: &()) -> Cow<'_, str> {
        Cow::Borrowed("leases")
    }

    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::Resource;

    #[test]
    fn keeps_name_and_renew_time_and_skips_the_rest() {
        let json = serde_json::json!({
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {
                "name": "node-1",
                "namespace": "kube-node-lease",
                "managedFields": [{"manager": "kubelet", "fieldsV1": {"f:spec": {"f:renewTime": {}}}}],
                "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": "node-1", "uid": "u"}]
            },
            "spec": {"holderIdentity": "node-1", "leaseDurationSeconds": 40,
                     "renewTime": "2026-11-22T08:00:00.123456Z"}
        });
        let slim: NodeLease =
            serde_json::from_value(json.clone()).unwrap_or_else(|e| panic!("{e}"));
        let full: Lease = serde_json::from_value(json).unwrap_or_else(|e| panic!("{e}"));
        let lease = slim.into_lease();
        assert_eq!(lease.metadata.name.as_deref(), Some("node-1"));
        assert_eq!(
            lease.spec.and_then(|s| s.renew_time),
            full.spec.and_then(|s| s.renew_time)
        );
        assert_eq!(
            NodeLease::url_path(&(), Some("kube-node-lease")),
            "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases"
        );
    }

    #[test]
    fn a_lease_without_spec_or_renew_time_has_none() {
        let slim: NodeLease =
            serde_json::from_value(serde_json::json!({"metadata": {"name": "n"}}))
                .unwrap_or_else(|e| panic!("{e}"));
        assert!(slim.into_lease().spec.and_then(|s| s.renew_time).is_none());
    }
}
