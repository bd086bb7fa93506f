//! Liveness and readiness, served on `--health-bind-addr` as `/healthz` and `/readyz`.
//!
//! Ready means the caches synced (and, with leader election, that the replica takes part in
//! the election). Alive turns false when a critical task died.

use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};

/// This replica's part in leader election, reported by `/readyz`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Leader election is off: this replica acts alone.
    Alone,
    /// Taking part in the election, not leading: idle.
    Follower,
    /// Leading: acting.
    Leader,
}

/// Shared health state.
#[derive(Debug)]
pub struct Health {
    ready: AtomicBool,
    alive: AtomicBool,
    role: AtomicU8,
}

impl Default for Health {
    fn default() -> Self {
        Health {
            ready: AtomicBool::new(false),
            alive: AtomicBool::new(true),
            role: AtomicU8::new(0),
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

    /// Records this replica's election role.
    pub fn set_role(&self, role: Role) {
        let v = match role {
            Role::Alone => 0,
            Role::Follower => 1,
            Role::Leader => 2,
        };
        self.role.store(v, Ordering::SeqCst);
    }
    /// This replica's election role.
    pub fn role(&self) -> Role {
        match self.role.load(Ordering::SeqCst) {
            1 => Role::Follower,
            2 => Role::Leader,
            _ => Role::Alone,
        }
    }
}
