//! The prober: one probe per shoot control plane hosted by this seed (docs/behaviour.md §2).
//!
//! - [`start`]: starting the prober and keeping its readiness;
//! - [`context`]: what every probe shares ([`ProberContext`]);
//! - [`seed_caches`]: watch caches of probe secrets, Machines and scaling targets;
//! - [`controller`]: the Cluster controller deciding which shoots get a probe;
//! - [`manager`]: the registry of running probe tasks;
//! - [`probe`]: one shoot's probe loop (API-server probe, lease probe, decision);
//! - [`report`]: what one run reports to its shoot's executor, and what every executor
//!   publishes the same way;
//! - [`executor`]: one shoot's flows, one at a time, the newest verdict winning;
//! - [`recording`]: shadow mode's executor, which records instead of scaling;
//! - [`scaler`]: executes scaling flows;
//! - [`shadow_observer`]: in shadow mode, what the acting watchdog did to each shoot;
//! - [`shoot_reads`]: consistent, paginated, bounded lists of a shoot's objects, decoded as
//!   they stream in ([`page_stream`] splits a page into its items);
//! - [`view`]: the prober's reads as a public API, for tools (`explain`).

pub mod context;
pub mod controller;
pub mod executor;
pub mod manager;
mod page_stream;
pub mod probe;
pub mod recording;
pub mod report;
pub mod scaler;
pub mod seed_caches;
pub mod shadow_observer;
pub mod shoot_reads;
pub mod slim;
pub mod start;
pub mod view;

pub use context::ProberContext;
pub use start::{ProberStart, run};
