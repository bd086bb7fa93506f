//! Node leases and nodes as the lease probe reads them: straight from the wire into the
//! decision's own views ([`NodeLeaseView`], [`NodeView`]), keeping only what decides candidacy
//! and expiry.
//!
//! Every probe run of every shoot lists the shoot's node leases, and in an outage its nodes.
//! Deserialized as k8s-openapi `Lease`s and `Node`s, most of the work would go into
//! `managedFields` (a JSON tree per object, built and dropped again) and fields nobody reads
//! (a node's images, addresses, capacity, system info); these types let serde skip all of
//! that. [`NodeLease`] and [`ProbedNode`] are the items of the `coordination.k8s.io/v1` lease
//! and `v1` node lists ([`Listed`], read page by page by `shoot_reads`): each holds its view
//! and nothing else. An object without a name has no view (it can't be matched to a lease,
//! node or Machine): reading never fails on one, and it is dropped as its page is decoded.

use chrono::{DateTime, Utc};
use dwd_core::ZONE_LABEL;
use dwd_core::lease::{
    ConditionView, NODE_LEASE_NAMESPACE, NOT_MANAGED_BY_MCM_ANNOTATION, NodeLeaseView, NodeView,
    WORKER_POOL_LABEL,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use serde::Deserialize;
use serde::de::DeserializeOwned;

/// An item of a list the lease probe reads: decoded from the wire straight into its view.
pub(crate) trait Listed: DeserializeOwned {
    /// What the decision functions take.
    type View;
    /// The list's path on the shoot's apiserver.
    fn path() -> String;
    /// The view; `None` for an object without a name.
    fn into_view(self) -> Option<Self::View>;
    /// The bytes `view` holds, its slot in the run's list and what its strings and
    /// conditions allocated (charged to the run's memory grant).
    fn view_bytes(view: &Self::View) -> u64;
}

/// What a string holds on the heap: its capacity, at least one allocation's minimum.
fn string_bytes(s: &str) -> usize {
    s.len().max(16)
}

/// A `coordination.k8s.io/v1` Lease as the lease probe reads it.
#[derive(Debug, Clone, Deserialize)]
#[serde(from = "RawLease")]
pub(crate) struct NodeLease {
    /// What decides expiry; `None` for a lease without a name.
    view: Option<NodeLeaseView>,
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
    /// Parsed as k8s-openapi parses it (RFC 3339, microseconds).
    #[serde(rename = "renewTime")]
    renew_time: Option<MicroTime>,
}

impl From<RawLease> for NodeLease {
    fn from(raw: RawLease) -> Self {
        // Microseconds are what the wire carries; a time chrono can't hold has no renewal
        // the probe could trust, so it counts as none (expired).
        let renew_time = raw
            .spec
            .renew_time
            .and_then(|t| DateTime::<Utc>::from_timestamp_micros(t.0.as_microsecond()));
        NodeLease {
            view: raw
                .metadata
                .name
                .map(|name| NodeLeaseView { name, renew_time }),
        }
    }
}

impl Listed for NodeLease {
    type View = NodeLeaseView;
    fn path() -> String {
        format!("/apis/coordination.k8s.io/v1/namespaces/{NODE_LEASE_NAMESPACE}/leases")
    }

    fn into_view(self) -> Option<NodeLeaseView> {
        self.view
    }

    fn view_bytes(view: &NodeLeaseView) -> u64 {
        (std::mem::size_of::<NodeLeaseView>() + string_bytes(&view.name)) as u64
    }
}

/// A `v1` Node as the lease probe reads it: name, worker pool and zone labels, the
/// not-managed-by-MCM annotation, and each condition's type, status and reason.
#[derive(Debug, Clone, Deserialize)]
#[serde(from = "RawNode")]
pub(crate) struct ProbedNode {
    /// What decides candidacy; `None` for a node without a name.
    view: Option<NodeView>,
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
    #[serde(default)]
    labels: Option<PickedKeys>,
    #[serde(default)]
    annotations: Option<PickedKeys>,
}

/// The keys the probe reads from a node's labels (pool, zone) or annotations
/// (not-managed-by-MCM), picked while the map is decoded: every other key (a tenant's, any
/// number of them) is skipped, its value never built. A map of every label would cost about 16
/// times its bytes on the wire (`"a":"b",` is 8 bytes; a map entry with two strings over 100),
/// so one 16 MiB page of labels would have held 256 MiB for a moment. One type for both maps:
/// the node takes only the labels' pool and zone and only the annotations' marker.
#[derive(Default)]
struct PickedKeys {
    pool: Option<String>,
    zone: Option<String>,
    not_managed_by_mcm: bool,
}

/// A key of a node's labels or annotations, as far as the probe cares: which of the ones it
/// reads, compared without copying it.
enum NodeKey {
    Pool,
    Zone,
    NotManagedByMcm,
    Other,
}

impl<'de> Deserialize<'de> for NodeKey {
    fn deserialize<D: serde::Deserializer<'de>>(decoder: D) -> Result<Self, D::Error> {
        struct KeyVisitor;
        impl serde::de::Visitor<'_> for KeyVisitor {
            type Value = NodeKey;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a label or annotation key")
            }
            fn visit_str<E: serde::de::Error>(self, key: &str) -> Result<NodeKey, E> {
                Ok(match key {
                    WORKER_POOL_LABEL => NodeKey::Pool,
                    ZONE_LABEL => NodeKey::Zone,
                    NOT_MANAGED_BY_MCM_ANNOTATION => NodeKey::NotManagedByMcm,
                    _ => NodeKey::Other,
                })
            }
        }
        decoder.deserialize_str(KeyVisitor)
    }
}

impl<'de> Deserialize<'de> for PickedKeys {
    fn deserialize<D: serde::Deserializer<'de>>(decoder: D) -> Result<Self, D::Error> {
        struct MapVisitor;
        impl<'de> serde::de::Visitor<'de> for MapVisitor {
            type Value = PickedKeys;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a node's labels or annotations")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<PickedKeys, A::Error> {
                let mut picked = PickedKeys::default();
                while let Some(key) = map.next_key::<NodeKey>()? {
                    match key {
                        NodeKey::Other => {
                            map.next_value::<serde::de::IgnoredAny>()?;
                        }
                        NodeKey::Pool => picked.pool = Some(map.next_value()?),
                        NodeKey::Zone => picked.zone = Some(map.next_value()?),
                        NodeKey::NotManagedByMcm => {
                            map.next_value::<String>()?;
                            picked.not_managed_by_mcm = true;
                        }
                    }
                }
                Ok(picked)
            }
        }
        decoder.deserialize_map(MapVisitor)
    }
}

#[derive(Deserialize, Default)]
struct RawNodeStatus {
    #[serde(default)]
    conditions: Option<NodeConditions>,
}

#[derive(Deserialize)]
struct RawCondition {
    #[serde(rename = "type")]
    type_: String,
    status: String,
    reason: Option<String>,
}

/// More conditions than a node has: a kubelet reports five, node-problem-detector and
/// Gardener's in-place updates add a handful. A node with more fails its page: a tenant's
/// `{"type":"a","status":"b"}` conditions (26 bytes on the wire, about 130 decoded) must not
/// multiply a page's memory.
pub(crate) const MAX_NODE_CONDITIONS: usize = 256;

/// A node's conditions, decoded straight into views and failing past
/// [`MAX_NODE_CONDITIONS`].
struct NodeConditions(Vec<ConditionView>);

impl<'de> Deserialize<'de> for NodeConditions {
    fn deserialize<D: serde::Deserializer<'de>>(decoder: D) -> Result<Self, D::Error> {
        struct ConditionsVisitor;
        impl<'de> serde::de::Visitor<'de> for ConditionsVisitor {
            type Value = NodeConditions;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a node's conditions")
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<NodeConditions, A::Error> {
                let mut conditions = Vec::new();
                while let Some(c) = seq.next_element::<RawCondition>()? {
                    if conditions.len() == MAX_NODE_CONDITIONS {
                        return Err(serde::de::Error::custom(format!(
                            "a node holds more than {MAX_NODE_CONDITIONS} conditions"
                        )));
                    }
                    conditions.push(ConditionView {
                        type_: c.type_,
                        status: c.status,
                        reason: c.reason,
                    });
                }
                Ok(NodeConditions(conditions))
            }
        }
        decoder.deserialize_seq(ConditionsVisitor)
    }
}

impl From<RawNode> for ProbedNode {
    fn from(raw: RawNode) -> Self {
        let RawNodeMeta {
            name,
            labels,
            annotations,
        } = raw.metadata;
        let view = name.map(|name| {
            let labels = labels.unwrap_or_default();
            NodeView {
                name,
                pool: labels.pool,
                zone: labels.zone,
                not_managed_by_mcm: annotations.is_some_and(|a| a.not_managed_by_mcm),
                conditions: raw.status.conditions.map(|c| c.0).unwrap_or_default(),
            }
        });
        ProbedNode { view }
    }
}

impl Listed for ProbedNode {
    type View = NodeView;
    fn path() -> String {
        "/api/v1/nodes".into()
    }

    fn into_view(self) -> Option<NodeView> {
        self.view
    }

    fn view_bytes(view: &NodeView) -> u64 {
        let optional = |s: &Option<String>| s.as_deref().map_or(0, string_bytes);
        let conditions: usize = view
            .conditions
            .iter()
            .map(|c| {
                std::mem::size_of::<ConditionView>()
                    + string_bytes(&c.type_)
                    + string_bytes(&c.status)
                    + optional(&c.reason)
            })
            .sum();
        (std::mem::size_of::<NodeView>()
            + string_bytes(&view.name)
            + optional(&view.pool)
            + optional(&view.zone)
            + conditions) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::coordination::v1::Lease;
    use k8s_openapi::api::core::v1::Node;

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
        let node = slim
            .into_view()
            .unwrap_or_else(|| panic!("a named node has a view"));
        assert_eq!(Some(&node.name), full.metadata.name.as_ref());
        assert_eq!(node.pool.as_deref(), Some("pool-a"));
        assert_eq!(node.zone.as_deref(), Some("eu-1a"));
        assert!(node.not_managed_by_mcm);
        let full_conditions = full.status.and_then(|s| s.conditions).unwrap_or_default();
        assert_eq!(node.conditions.len(), full_conditions.len());
        for (slim, full) in node.conditions.iter().zip(&full_conditions) {
            assert_eq!(
                (&slim.type_, &slim.status, &slim.reason),
                (&full.type_, &full.status, &full.reason)
            );
        }
        assert_eq!(
            ProbedNode::path(),
            <Node as kube::Resource>::url_path(&(), None)
        );
    }

    #[test]
    fn a_bare_node_has_no_labels_annotations_or_conditions() {
        let slim: ProbedNode =
            serde_json::from_value(serde_json::json!({"metadata": {"name": "n"}}))
                .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            slim.into_view(),
            Some(NodeView {
                name: "n".into(),
                pool: None,
                zone: None,
                not_managed_by_mcm: false,
                conditions: Vec::new(),
            })
        );
    }

    #[test]
    fn objects_without_a_name_are_read_and_have_no_view() {
        let node: ProbedNode = serde_json::from_value(serde_json::json!({
            "metadata": {"labels": {"worker.gardener.cloud/pool": "a"}},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]}
        }))
        .unwrap_or_else(|e| panic!("{e}"));
        assert!(node.into_view().is_none());
        let lease: NodeLease = serde_json::from_value(
            serde_json::json!({"spec": {"renewTime": "2026-11-22T08:00:00.000000Z"}}),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert!(lease.into_view().is_none());
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
        let lease = slim
            .into_view()
            .unwrap_or_else(|| panic!("a named lease has a view"));
        assert_eq!(lease.name, "node-1");
        let full_renew = full
            .spec
            .and_then(|s| s.renew_time)
            .unwrap_or_else(|| panic!("the full Lease has a renew time"));
        // Microseconds survive: the view's time is the wire's, to the microsecond.
        assert_eq!(
            lease.renew_time.map(|t| t.timestamp_micros()),
            Some(full_renew.0.as_microsecond())
        );
        assert_eq!(
            lease
                .renew_time
                .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Micros, true)),
            Some("2026-11-22T08:00:00.123456Z".to_owned())
        );
        assert_eq!(
            NodeLease::path(),
            <Lease as kube::Resource>::url_path(&(), Some(NODE_LEASE_NAMESPACE))
        );
    }

    #[test]
    fn a_lease_without_spec_or_renew_time_has_none() {
        for json in [
            serde_json::json!({"metadata": {"name": "n"}}),
            serde_json::json!({"metadata": {"name": "n"}, "spec": {"holderIdentity": "n"}}),
        ] {
            let slim: NodeLease = serde_json::from_value(json).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(
                slim.into_view(),
                Some(NodeLeaseView {
                    name: "n".into(),
                    renew_time: None
                })
            );
        }
    }

    #[test]
    fn a_nodes_other_labels_and_annotations_are_skipped_and_too_many_conditions_fail() {
        // 10,000 labels of a tenant's (not all strings) around the two the probe reads.
        let mut labels = serde_json::Map::new();
        for i in 0..10_000 {
            labels.insert(format!("tenant.example/{i}"), serde_json::json!(i));
        }
        labels.insert(WORKER_POOL_LABEL.into(), serde_json::json!("pool-a"));
        labels.insert(ZONE_LABEL.into(), serde_json::json!("eu-1a"));
        let node = serde_json::json!({
            "metadata": {"name": "n", "labels": labels,
                         "annotations": {"x": {"nested": [1, 2]}, NOT_MANAGED_BY_MCM_ANNOTATION: ""}},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]}
        });
        let slim: ProbedNode = serde_json::from_value(node).unwrap_or_else(|e| panic!("{e}"));
        let view = slim.into_view().expect("named");
        assert_eq!(view.pool.as_deref(), Some("pool-a"));
        assert_eq!(view.zone.as_deref(), Some("eu-1a"));
        assert!(view.not_managed_by_mcm);
        assert_eq!(view.conditions.len(), 1);

        let conditions = |n: usize| {
            let list: Vec<_> = (0..n)
                .map(|i| serde_json::json!({"type": format!("C{i}"), "status": "False"}))
                .collect();
            serde_json::json!({"metadata": {"name": "n"}, "status": {"conditions": list}})
        };
        let at_most: ProbedNode = serde_json::from_value(conditions(MAX_NODE_CONDITIONS))
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            at_most.into_view().expect("named").conditions.len(),
            MAX_NODE_CONDITIONS
        );
        let error = serde_json::from_value::<ProbedNode>(conditions(MAX_NODE_CONDITIONS + 1))
            .expect_err("one condition too many");
        assert!(
            error.to_string().contains("more than 256 conditions"),
            "{error}"
        );
    }
}
