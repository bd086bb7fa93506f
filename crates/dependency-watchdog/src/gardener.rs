//! The kinds of Gardener's API the watchdog reads on the seed, named once: the prober's
//! controller and caches, the events it writes about Clusters and the `explain` tool all
//! import them from here (they used to reach into `prober::controller` for them, which
//! made `events` and `prober` depend on each other).

use dwd_core::gardener::{CLUSTER, Kind, MACHINE};
use kube::api::GroupVersionKind;

fn gvk(kind: Kind) -> GroupVersionKind {
    GroupVersionKind::gvk(kind.group, kind.version, kind.kind)
}

/// GroupVersionKind of Gardener's extensions Cluster.
pub(crate) fn cluster_gvk() -> GroupVersionKind {
    gvk(CLUSTER)
}

/// GroupVersionKind of machine-controller-manager's Machine.
pub(crate) fn machine_gvk() -> GroupVersionKind {
    gvk(MACHINE)
}
