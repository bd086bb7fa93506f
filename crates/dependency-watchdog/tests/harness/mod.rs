//! What the integration tests share, by what it runs:
//!
//! - [`in_process`]: the library's prober and weeder running inside the test process, on the
//!   shared test environment (a real seed kube-apiserver) and a shared shoot apiserver;
//! - [`binary`]: the real `dependency-watchdog` binary as a child process, its log and its
//!   `/metrics`;
//! - [`gardener`]: the seed as gardenlet sets it up (namespaces, the shipped manifests,
//!   fixtures), for the tests that run the binary as Gardener deploys it;
//! - [`monitoring`]: the metrics the binary exports, and checks that alerts and dashboards name
//!   only those.
//!
//! Each test binary declares `mod harness;` and uses what it needs (unused helpers are
//! allowed in each module).

// Test helpers: a failed assumption is a failed test (outside tests the workspace denies
// these); each test binary uses only some of them.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
#![allow(dead_code)]

pub(crate) mod binary;
pub(crate) mod gardener;
pub(crate) mod in_process;
pub(crate) mod monitoring;
