//! Node leases and nodes as the lease probe reads them: only what decides candidacy and
//! expiry.
//!
//! Every probe run of every shoot lists the shoot's node leases, and in an outage its nodes.
//! Deserialized as k8s-openapi `Lease`s and `Node`s, most of the work would go into
//! `managedFields` (a JSON tree per object, built and dropped again) and fields nobody reads
//! (a node's images, addresses, capacity, system info); these types let serde skip all of
//! that. `Api<NodeLease>` and `Api<ProbedNode>` list the same `coordination.k8s.io/v1` leases
//! and `v1` nodes.

use std::borrow::Cow;
use std::collections::BTreeMap;

use dwd_core::ZONE_LABEL;
use dwd_core::lease::{NOT_MANAGED_BY_MCM_ANNOTATION, WORKER_POOL_LABEL};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{Node, NodeCondition, NodeStatus};
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

/// A `v1` Node reduced to what decides candidacy: name, worker pool and zone labels, the
/// not-managed-by-MCM annotation, and each condition's type, status and reason.
#[derive(Debug, Clone, Deserialize)]
#[serde(from = "RawNode")]
pub struct ProbedNode {
    /// `name`, and of the labels and annotations only those the decision reads.
    metadata: ObjectMeta,
    /// Type, status and reason of each condition.
    conditions: Vec<NodeCondition>,
}

#[derive(Deserialize)]
struct RawNode {
    #[serde(default)]
    metadata: RawNodeMeta,
    #[serde(default)]
    status: RawNodeStatus,
}

#[derive(Deserialize, Default)]
struct RawNodeMeta {
    name: Option<String>,
    labels: Option<BTreeMap<String, String>>,
    annotations: Option<BTreeMap<String, String>>,
}

#[derive(Deserialize, Default)]
struct RawNodeStatus {
    #[serde(default)]
    conditions: Option<Vec<RawCondition>>,
}

#[derive(Deserialize)]
struct RawCondition {
    #[serde(rename = "type")]
    type_: String,
    status: String,
    reason: Option<String>,
}

/// Keeps only `keys` of an optional map.
fn only(map: Option<BTreeMap<String, String>>, keys: &[&str]) -> Option<BTreeMap<String, String>> {
    map.map(|mut m| keys.iter().filter_map(|k| m.remove_entry(*k)).collect())
}

impl From<RawNode> for ProbedNode {
    fn from(raw: RawNode) -> Self {
        ProbedNode {
            metadata: ObjectMeta {
                name: raw.metadata.name,
                labels: only(raw.metadata.labels, &[WORKER_POOL_LABEL, ZONE_LABEL]),
                annotations: only(raw.metadata.annotations, &[NOT_MANAGED_BY_MCM_ANNOTATION]),
                ..ObjectMeta::default()
            },
            conditions: raw
                .status
                .conditions
                .unwrap_or_default()
                .into_iter()
                .map(|c| NodeCondition {
                    type_: c.type_,
                    status: c.status,
                    reason: c.reason,
                    ..NodeCondition::default()
                })
                .collect(),
        }
    }
}

impl ProbedNode {
    /// The k8s-openapi `Node` the decision functions take (the kept fields only).
    pub fn into_node(self) -> Node {
        Node {
            metadata: self.metadata,
            spec: None,
            status: Some(NodeStatus {
                conditions: Some(self.conditions),
                ..NodeStatus::default()
            }),
        }
    }
}

/// `kube::Resource` for a slim type: the API coordinates of the full type it is read from.
macro_rules! slim_resource {
    ($slim:ty, $scope:ty, kind: $kind:literal, group: $group:literal, plural: $plural:literal) => {
        impl kube::Resource for $slim {
            type DynamicType = ();
            type Scope = $scope;

            fn kind(_: &()) -> Cow<'_, str> {
                Cow::Borrowed($kind)
            }

            fn group(_: &()) -> Cow<'_, str> {
                Cow::Borrowed($group)
            }

            fn version(_: &()) -> Cow<'_, str> {
                Cow::Borrowed("v1")
            }

            fn plural(_: &()) -> Cow<'_, str> {
                Cow::Borrowed($plural)
            }

            fn meta(&self) -> &ObjectMeta {
                &self.metadata
            }

            fn meta_mut(&mut self) -> &mut ObjectMeta {
                &mut self.metadata
            }
        }
    };
}

slim_resource!(NodeLease, k8s_openapi::NamespaceResourceScope,
    kind: "Lease", group: "coordination.k8s.io", plural: "leases");
slim_resource!(ProbedNode, k8s_openapi::ClusterResourceScope,
    kind: "Node", group: "", plural: "nodes");

#[cfg(test)]
mod tests {
    use super::*;
    use kube::Resource;

    /// A node with everything a kubelet reports, and what the decision reads.
    fn full_node_json() -> serde_json::Value {
        serde_json::json!({
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": "node-1",
                "labels": {"worker.gardener.cloud/pool": "pool-a", "kubernetes.io/hostname": "node-1", "topology.kubernetes.io/zone": "eu-1a"},
                "annotations": {"node.machine.sapcloud.io/not-managed-by-mcm": "1", "volumes.kubernetes.io/controller-managed-attach-detach": "true"},
                "managedFields": [{"manager": "kubelet", "fieldsV1": {"f:status": {}}}]
            },
            "spec": {"podCIDR": "10.0.0.0/24", "providerID": "aws:///i-1"},
            "status": {
                "conditions": [
                    {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "ok",
                     "lastHeartbeatTime": "2026-11-22T08:00:00Z", "lastTransitionTime": "2026-11-22T08:00:00Z"},
                    {"type": "InPlaceUpdate", "status": "True", "reason": "ReadyForUpdate"},
                    {"type": "DiskPressure", "status": "False"}
                ],
                "images": [{"names": ["registry/x:1"], "sizeBytes": 1}],
                "addresses": [{"type": "InternalIP", "address": "10.0.0.1"}],
                "capacity": {"cpu": "2"},
                "nodeInfo": {"kubeletVersion": "v1.33.0", "architecture": "amd64", "bootID": "", "containerRuntimeVersion": "", "kernelVersion": "", "kubeProxyVersion": "", "machineID": "", "operatingSystem": "linux", "osImage": "", "systemUUID": ""}
            }
        })
    }

    #[test]
    fn a_probed_node_keeps_what_decides_candidacy() {
        let json = full_node_json();
        let full: Node = serde_json::from_value(json.clone()).unwrap_or_else(|e| panic!("{e}"));
        let slim: ProbedNode = serde_json::from_value(json).unwrap_or_else(|e| panic!("{e}"));
        let node = slim.into_node();
        assert_eq!(node.metadata.name, full.metadata.name);
        assert_eq!(
            node.metadata.labels,
            Some(BTreeMap::from([
                (WORKER_POOL_LABEL.to_string(), "pool-a".to_string()),
                (ZONE_LABEL.to_string(), "eu-1a".to_string()),
            ]))
        );
        assert_eq!(
            node.metadata.annotations,
            Some(BTreeMap::from([(
                NOT_MANAGED_BY_MCM_ANNOTATION.to_string(),
                "1".to_string()
            )]))
        );
        let conditions = |n: &Node| -> Vec<(String, String, Option<String>)> {
            n.status
                .as_ref()
                .and_then(|s| s.conditions.clone())
                .unwrap_or_default()
                .into_iter()
                .map(|c| (c.type_, c.status, c.reason))
                .collect()
        };
        assert_eq!(conditions(&node), conditions(&full));
        assert_eq!(ProbedNode::url_path(&(), None), "/api/v1/nodes");
    }

    #[test]
    fn a_bare_node_has_no_labels_annotations_or_conditions() {
        let slim: ProbedNode =
            serde_json::from_value(serde_json::json!({"metadata": {"name": "n"}}))
                .unwrap_or_else(|e| panic!("{e}"));
        let node = slim.into_node();
        assert!(node.metadata.labels.is_none() && node.metadata.annotations.is_none());
        assert_eq!(node.status.and_then(|s| s.conditions), Some(Vec::new()));
    }

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
