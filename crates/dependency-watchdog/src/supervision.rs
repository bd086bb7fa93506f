//! Supervision of a subcommand's critical tasks: the prober and the weeder each run a set of
//! tasks that must live as long as the process; one ending early is a crash (`/healthz`
//! fails), one ending because of the shutdown is not.

use tokio_util::sync::CancellationToken;

use crate::observe::health::Health;
use crate::{Error, Result};

/// Waits until `shutdown` (→ `Ok`) or until one of the critical `tasks` ends (→ `TaskDied`,
/// and `/healthz` fails): these tasks must run for the life of the process. `what` names the
/// subcommand in the error.
pub(crate) async fn supervise(
    what: &'static str,
    tasks: &mut tokio::task::JoinSet<&'static str>,
    shutdown: &CancellationToken,
    health: &Health,
) -> Result<()> {
    let result = tokio::select! {
        // A task that ends *because* of the shutdown must not count as a crash.
        biased;
        _ = shutdown.cancelled() => Ok(()),
        ended = tasks.join_next() => {
            let task = match ended {
                Some(Ok(name)) => name,
                Some(Err(_)) => what,
                None => "every task",
            };
            Err(Error::TaskDied(task, format!("a {what} task must run for the life of the process")))
        }
    };
    if result.is_err() {
        health.set_alive(false);
    }
    result
}
