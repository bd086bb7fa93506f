//! Liveness and readiness, served on `--health-bind-addr` as `/healthz` and `/readyz`.
//!
//! Ready means the caches synced (and, with leader election, that the replica takes part in
//! the election). Alive turns false when a critical task died.

use std::sync::atomic::{AtomicBool, Ordering};

/// Shared health state.
#[derive(Debug)]
pub struct Health {
    ready: AtomicBool,
    alive: AtomicBool,
}

impl Default for Health {
    fn default() -> Self {
        Health {
            ready: AtomicBool::new(false),
            alive: AtomicBool::new(true),
        }
    }
}

impl Health {
    /// Marks readiness.
    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::SeqCst);
    }
    /// Whether ready.
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::SeqCst)
    }
    /// Marks liveness.
    pub fn set_alive(&self, alive: bool) {
        self.alive.store(alive, Ordering::SeqCst);
    }
    /// Whether alive.
    pub fn is_alive(&self) -> bool {
        self.alive.load(Ordering::SeqCst)
    }
}
