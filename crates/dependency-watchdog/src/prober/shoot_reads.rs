//! How the prober reads a shoot's apiserver, which its tenant runs: consistent lists (never
//! the apiserver's possibly stale watch cache: a shoot whose etcd is down can keep serving
//! old leases from it, and a stale lease must never scale anything), paginated (`limit` and
//! `continue`, so no single response holds a whole large shoot), and bounded in bytes by the
//! client ([`crate::kube_client::ResponseLimits`]). [`node_leases`] and [`nodes`] are the lease
//! probe's two reads, for the prober and `explain` alike.

use dwd_core::lease::{NODE_LEASE_NAMESPACE, NodeLeaseView, NodeView};
use kube::api::ListParams;
use kube::{Api, Client};
use serde::de::DeserializeOwned;

use super::slim::{NodeLease, ProbedNode};

/// Leases per page: a lease is a few hundred bytes.
pub const LEASE_PAGE: u32 = 500;
/// Nodes per page: a Node with its images and conditions is several KiB.
pub const NODE_PAGE: u32 = 100;
/// More pages than any real shoot needs (500 × 1000 leases); a server that keeps handing out
/// `continue` tokens is not followed further.
pub const MAX_PAGES: usize = 1000;

/// Every object of `api`, read page by page from one consistent snapshot (the apiserver ties
/// the `continue` token to the first page's resourceVersion).
pub async fn list_all<K>(api: &Api<K>, page_size: u32) -> kube::Result<Vec<K>>
where
    K: kube::Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    let mut items = Vec::new();
    let mut params = ListParams::default().limit(page_size);
    for _ in 0..MAX_PAGES {
        let page = api.list(&params).await?;
        items.extend(page.items);
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => return Ok(items),
        }
    }
    Err(kube::Error::Service(
        format!("more than {MAX_PAGES} pages of {page_size}; the list was not followed further")
            .into(),
    ))
}

/// The shoot's node leases (`kube-node-lease`), read straight into the views the lease probe
/// judges; a lease without a name has none and is left out.
pub async fn node_leases(shoot: &Client) -> kube::Result<Vec<NodeLeaseView>> {
    let api: Api<NodeLease> = Api::namespaced(shoot.clone(), NODE_LEASE_NAMESPACE);
    let leases = list_all(&api, LEASE_PAGE).await?;
    Ok(leases
        .into_iter()
        .filter_map(NodeLease::into_view)
        .collect())
}

/// The shoot's nodes, read straight into the views the lease probe judges; a node without a
/// name has none and is left out (it can't be matched to a lease or a Machine).
pub async fn nodes(shoot: &Client) -> kube::Result<Vec<NodeView>> {
    let api: Api<ProbedNode> = Api::all(shoot.clone());
    let nodes = list_all(&api, NODE_PAGE).await?;
    Ok(nodes
        .into_iter()
        .filter_map(ProbedNode::into_view)
        .collect())
}
