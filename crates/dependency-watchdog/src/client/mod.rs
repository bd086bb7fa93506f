//! Talking to Kubernetes: the seed client (rate-limited, ranked, its silence noticed) and the
//! shoot clients, what each request carries, and the watch caches read instead of GETs.
//!
//! - [`kube_client`]: building the seed client and the per-run shoot clients;
//! - [`guarded_body`]: one wrapper for the guards on response bodies (a shoot's byte budget,
//!   the seed's body deadline);
//! - [`seed_transport`]: the seed client's HTTP stack under kube's (a silent seed noticed);
//! - [`rate_limit`]: the seed's request budget (`--kube-api-qps`, `--kube-api-burst`),
//!   ranked by priority;
//! - [`retry_after`]: `Retry-After` honoured within a call's deadline, as client-go does;
//! - [`request_settings`]: per-request settings (priority, deadline) carried to those layers;
//! - [`cache`]: watch caches of seed objects, indexed by namespace.

pub mod cache;
pub(crate) mod guarded_body;
pub mod kube_client;
pub mod rate_limit;
pub mod request_settings;
pub mod retry_after;
pub(crate) mod seed_transport;
