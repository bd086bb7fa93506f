//! Liveness and readiness, served on `--health-bind-addr` as `/healthz` and `/readyz`.
//!
//! Ready means the caches synced (and, with leader election, that the replica takes part in
//! the election), and stays true only while they are in sync: a cache whose watch keeps
//! failing takes readiness away again, with the reason, until it has re-listed. Alive turns
//! false when a critical task died.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};

/// Why `/readyz` fails when nobody said more.
pub(crate) const DEFAULT_NOT_READY_REASON: &str = "caches not synced";

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
    /// Why not ready (read by `/readyz` only while not ready).
    reason: Mutex<String>,
    alive: AtomicBool,
    role: AtomicU8,
}

impl Default for Health {
    fn default() -> Self {
        Health {
            ready: AtomicBool::new(false),
            reason: Mutex::new(DEFAULT_NOT_READY_REASON.to_string()),
            alive: AtomicBool::new(true),
            role: AtomicU8::new(0),
        }
    }
}

impl Health {
    fn lock_reason(&self) -> std::sync::MutexGuard<'_, String> {
        // Only ever replaced whole: a panic elsewhere can't leave it torn.
        self.reason
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Marks readiness; not ready without a reason reads as [`DEFAULT_NOT_READY_REASON`].
    pub fn set_ready(&self, ready: bool) {
        if ready {
            self.ready.store(true, Ordering::SeqCst);
        } else {
            self.set_not_ready(DEFAULT_NOT_READY_REASON);
        }
    }
    /// Marks not ready, saying why (`/readyz` answers with it).
    pub(crate) fn set_not_ready(&self, reason: impl Into<String>) {
        let mut current = self.lock_reason();
        *current = reason.into();
        self.ready.store(false, Ordering::SeqCst);
    }
    /// Whether ready.
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::SeqCst)
    }
    /// `Ok` when ready, else why not.
    pub fn readiness(&self) -> Result<(), String> {
        if self.is_ready() {
            return Ok(());
        }
        Err(self.lock_reason().clone())
    }
    /// Marks liveness.
    pub(crate) fn set_alive(&self, alive: bool) {
        self.alive.store(alive, Ordering::SeqCst);
    }
    /// Whether alive.
    pub(crate) fn is_alive(&self) -> bool {
        self.alive.load(Ordering::SeqCst)
    }

    /// Records this replica's election role.
    pub(crate) fn set_role(&self, role: Role) {
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
