//! The prober's reads as a public API, for tools that show a shoot the way the prober sees it
//! (`explain`): the same shoot lists (consistent, paginated, error messages bounded), the same
//! projections of seed objects, the same target discovery. Tools use this facade, never the
//! prober's internals, so those can change without breaking them.

use dwd_core::{DependentResourceInfo, MachineView, NodeLeaseView, NodeView, TargetSnapshot};
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, ListParams};
use kube::{Api, Client};

use super::probe::bounded;
use super::seed_caches::{project_machine, project_target, split_api_version};
use super::shoot_reads;
use crate::gardener::machine_gvk;

/// The key of the probe secret's data that holds the shoot's kubeconfig.
pub use super::seed_caches::KUBECONFIG_KEY;

/// The shoot's Nodes, read by the lease probe's own read into the views it judges; an error
/// from the shoot's apiserver has its messages cut as the prober cuts them.
pub(crate) async fn shoot_nodes(shoot: &Client) -> kube::Result<Vec<NodeView>> {
    shoot_reads::nodes(shoot, None).await.map_err(bounded)
}

/// The shoot's node Leases, read as the lease probe reads them (errors as [`shoot_nodes`]).
pub(crate) async fn shoot_node_leases(shoot: &Client) -> kube::Result<Vec<NodeLeaseView>> {
    shoot_reads::node_leases(shoot, None).await.map_err(bounded)
}

/// The Machines of shoot `namespace` on the seed, as the prober's Machine cache keeps them
/// (read now, not from a cache).
pub(crate) async fn seed_machines(
    seed: &Client,
    namespace: &str,
) -> kube::Result<Vec<MachineView>> {
    let api: Api<DynamicObject> = Api::namespaced_with(
        seed.clone(),
        namespace,
        &ApiResource::from_gvk(&machine_gvk()),
    );
    Ok(api
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .filter_map(project_machine)
        .collect())
}

/// The seed's resource for a scaling target's kind, discovered as the prober does at start
/// ([`is_not_served`] tells a kind the seed does not serve).
pub(crate) async fn target_resource(
    seed: &Client,
    info: &DependentResourceInfo,
) -> kube::Result<ApiResource> {
    let r = &info.target;
    let (group, version) = split_api_version(&r.api_version);
    let gvk = GroupVersionKind::gvk(group, version, &r.kind);
    kube::discovery::pinned_kind(seed, &gvk)
        .await
        .map(|(resource, _caps)| resource)
}

/// Whether a discovery error means the seed does not serve the kind (so an optional target
/// is skipped, as the prober skips it).
pub(crate) fn is_not_served(error: &kube::Error) -> bool {
    super::seed_caches::is_not_served(error)
}

/// What the scaler reads of a target object (as its target cache keeps it); `None` for an
/// object it can't read.
pub(crate) fn target_snapshot(obj: &DynamicObject) -> Option<TargetSnapshot> {
    project_target(obj).map(|state| TargetSnapshot {
        spec_replicas: state.spec_replicas,
        annotations: state.annotations,
    })
}
