//! Names Gardener gives the watchdog's world, defined once for the watchdog and its tools:
//! the kinds it reads on the seed and the leader-election Leases of gardenlet's deployment.
//!
//! Plain strings, so that this crate stays free of kube: the library builds its
//! `GroupVersionKind`s from them, and the simulator, sandbox, parity runner and benchmark
//! spell no group, kind or Lease name of their own.

/// An API kind as group, version, kind and plural.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Kind {
    /// API group (`extensions.gardener.cloud`).
    pub group: &'static str,
    /// API version (`v1alpha1`).
    pub version: &'static str,
    /// Kind (`Cluster`).
    pub kind: &'static str,
    /// Resource name in URLs (`clusters`).
    pub plural: &'static str,
}

/// Gardener's extensions `Cluster` (cluster-scoped; one per shoot, named after its namespace).
pub const CLUSTER: Kind = Kind {
    group: "extensions.gardener.cloud",
    version: "v1alpha1",
    kind: "Cluster",
    plural: "clusters",
};

/// machine-controller-manager's `Machine` (in the shoot's namespace of the seed).
pub const MACHINE: Kind = Kind {
    group: "machine.sapcloud.io",
    version: "v1alpha1",
    kind: "Machine",
    plural: "machines",
};

/// The prober's leader-election Lease, as gardenlet's deployment names it.
pub const PROBER_LEASE: &str = "dwd-prober-leader-election";
/// The weeder's leader-election Lease, as gardenlet's deployment names it.
pub const WEEDER_LEASE: &str = "dwd-weeder-leader-election";
/// The prober's Lease in shadow mode: never the acting watchdog's.
pub const PROBER_SHADOW_LEASE: &str = "dwd-prober-leader-election-shadow";
/// The weeder's Lease in shadow mode: never the acting watchdog's.
pub const WEEDER_SHADOW_LEASE: &str = "dwd-weeder-leader-election-shadow";

// `concat!` takes only literals, so the shadow names are spelled out; this keeps them in step.
const _: () = {
    assert!(PROBER_SHADOW_LEASE.len() == PROBER_LEASE.len() + "-shadow".len());
    assert!(WEEDER_SHADOW_LEASE.len() == WEEDER_LEASE.len() + "-shadow".len());
};
