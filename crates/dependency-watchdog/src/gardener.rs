//! The kinds of Gardener's API the watchdog reads on the seed, named once: the prober's
//! controller and caches, the events it writes about Clusters and the `explain` tool all
//! import them from here (they used to reach into `prober::controller` for them, which
//! made `events` and `prober` depend on each other).

use kube::api::GroupVersionKind;

/// GroupVersionKind of Gardener's extensions Cluster.
pub fn cluster_gvk() -> GroupVersionKind {
    GroupVersionKind::gvk("extensions.gardener.cloud", "v1alpha1", "Cluster")
}

/// GroupVersionKind of machine-controller-manager's Machine.
pub fn machine_gvk() -> GroupVersionKind {
    GroupVersionKind::gvk("machine.sapcloud.io", "v1alpha1", "Machine")
}
