//! Gardener's dependency-watchdog, in Rust.
//!
//! The binary (`main.rs`) only parses flags and calls [`run`]. Decisions live in the pure
//! `dwd_core` crate; this crate does the I/O. This file only declares the modules, grouped by
//! concern (docs/architecture.md says why this cut):
//!
//! - [`prober`] and [`weeder`]: the two subcommands' controllers; [`explain`] shows a shoot
//!   as the prober sees it;
//! - [`client`]: talking to Kubernetes: the seed and shoot clients, their per-request
//!   settings, rate limit and `Retry-After`, the seed's transport, and watch caches;
//! - [`observe`]: what the watchdog tells its operator: Events, logs, health;
//! - [`process`]: the process around a subcommand: command line, config files, leader
//!   election, the HTTP endpoints, and [`process::runtime`], which runs it all;
//! - below them all: [`metrics`] (every layer counts, the client stack included),
//!   [`memory_budget`] (the one pool of bytes every probe run in flight draws on),
//!   [`shadow`] (shadow mode's book, shared by both subcommands), [`decisions`] (the
//!   prober's decision records: log lines and a ring per shoot), [`supervision`] (a
//!   subcommand's critical tasks), [`gardener`] (the kinds of Gardener's API that are read),
//!   [`error`], and the text helpers.

#![forbid(unsafe_code)]

pub mod client;
pub mod decisions;
pub mod error;
pub mod explain;
/// An in-memory seed apiserver behind a real `kube::Client`, for unit tests on a paused clock.
#[cfg(test)]
mod fake_seed;
pub mod gardener;
pub mod memory_budget;
pub mod metrics;
pub mod observe;
pub mod prober;
pub mod process;
pub mod shadow;
pub mod supervision;
mod text;
pub mod weeder;

pub use error::{Error, Result};
pub use process::runtime::run;
