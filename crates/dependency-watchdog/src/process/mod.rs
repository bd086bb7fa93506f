//! The process around a subcommand: what starts, stops and serves it. Nothing here decides
//! anything about a shoot.
//!
//! - [`cli`]: the reference's command line, plus ours;
//! - [`config`]: loading the config files (validated by `dwd_core`);
//! - [`leader`]: leader election on a Lease, with client-go's semantics;
//! - [`server`]: the HTTP endpoints (metrics, health, shadow mode's book);
//! - [`runtime`]: runs a subcommand: signals and shutdown, endpoints, leader election.

pub mod cli;
pub mod config;
pub mod leader;
pub mod runtime;
pub mod server;
