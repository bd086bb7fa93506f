//! Gardener's dependency-watchdog, in Rust.
//!
//! The binary (`main.rs`) only parses flags and calls [`run`]. Decisions live in the pure
//! `dwd_core` crate; this crate does the I/O: watch caches of the seed, per-run shoot clients,
//! the Cluster controller and probe tasks ([`prober`]), the weeder, metrics and health, and
//! leader election among replicas ([`leader`]).
//!
//! This file only declares the modules. Where things are: [`runtime`] runs a subcommand
//! (signals and shutdown, endpoints, leader election); [`supervision`] watches the
//! critical tasks of the prober and the weeder;
//! [`config`] loads the config files; [`cli`] and [`logging`] the command line and the log
//! format; [`rate_limit`], [`retry_after`] and [`request_settings`] the seed client's
//! per-request behaviour and `seed_transport` its connections; [`memory_budget`] the one pool of bytes every probe run in flight
//! draws on; [`gardener`] the kinds of Gardener's API that are read.

#![forbid(unsafe_code)]

pub mod cache;
pub mod cli;
pub mod config;
pub mod error;
pub mod events;
pub mod explain;
/// An in-memory seed apiserver behind a real `kube::Client`, for unit tests on a paused clock.
#[cfg(test)]
mod fake_seed;
pub mod gardener;
pub mod health;
pub mod kube_client;
pub mod leader;
pub mod logging;
pub mod memory_budget;
pub mod metrics;
pub mod prober;
pub mod rate_limit;
pub mod request_settings;
pub mod retry_after;
pub mod runtime;
mod seed_transport;
pub mod server;
pub mod shadow;
pub mod supervision;
mod text;
pub mod weeder;

pub use error::{Error, Result};
pub use runtime::run;
