//! How the prober reads a shoot's apiserver, which its tenant runs: consistent lists (never
//! the apiserver's possibly stale watch cache: a shoot whose etcd is down can keep serving
//! old leases from it, and a stale lease must never scale anything), paginated (`limit` and
//! `continue`, so no single response holds a whole large shoot), and bounded in bytes by the
//! client ([`crate::kube_client::ResponseLimits`]).

use kube::Api;
use kube::api::ListParams;
use serde::de::DeserializeOwned;

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
