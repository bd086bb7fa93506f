//! One memory budget for every probe run in flight (issue 24): a bound an operator's memory
//! limit can rely on, whatever hundreds of tenants' shoots do.
//!
//! Per run, the shoot client already bounds what one run may receive (16 MiB a response,
//! 64 MiB a run: `kube_client::ResponseLimits`); nothing bounded the sum. Two things grow it:
//! runs that wait on slow shoots (each holds a connection, TLS state, buffers and tasks while
//! it waits) and runs that receive large answers. Both are charged here, in bytes, against one
//! process-wide pool:
//!
//! - every run is **admitted** before it opens its connection: it reserves [`RUN_RESERVE`]
//!   bytes, what a run in flight costs before its first response byte plus a floor for a
//!   healthy shoot's small answers;
//! - every response byte past that floor is **charged** to the pool as it arrives, before
//!   anything buffers it; a charge the pool can't give fails that run at once, alone;
//! - a response body's bytes return to the pool once the run has decoded and dropped the body;
//!   the decoded views are charged instead, page by page, and kept until the run ends;
//! - the reserve and what is still charged return to the pool when the run ends (its
//!   [`MemoryGrant`] is dropped).
//!
//! So the runs in flight never hold more than the pool's capacity, however many shoots are
//! slow or send fat answers; README ("Memory: one limit") states the whole formula.
//!
//! **Fairness.** A shoot whose last run failed or did not end within its *prompt limit*
//! ([`prompt_limit`]: half its `probeTimeout`, at most [`PROMPT_WITHIN`], counted from its
//! admission) is [`Standing::Suspect`]; suspect runs together may hold at most half of the
//! pool. Two rules keep slow shoots out of the other half:
//!
//! - a run refused for room leaves the shoot's standing as it was (waiting is not the shoot's
//!   doing, and a suspect shoot must not turn trusted by not being run);
//! - a trusted run (a shoot that was prompt, or has not run yet) that has not ended at its
//!   prompt limit is slow: it moves into the suspect half ([`MemoryGrant::demote`]), or ends
//!   at once when that half is full ([`NoRunMemory::Slow`]).
//!
//! So however many slow or hostile shoots there are, they hold the other half for at most
//! [`PROMPT_WITHIN`] a run, and only until their first run has shown them slow (at start,
//! when no shoot has run yet, that takes a few prompt limits); the shoots that answer promptly
//! find it free, where a run holds its reserve for milliseconds. A run waits for admission at
//! most its `probeTimeout`; then it fails ("no memory for the run": no scaling, as for any
//! failed run). What this costs: among more slow shoots than the suspect half holds, a shoot
//! once slow competes with them for its runs until one of them is admitted and prompt again.
//!
//! Why hand-written on `tokio::sync::Semaphore` rather than a crate: the two nested limits
//! (class and pool), the non-blocking charges while a body streams and the release of
//! everything at the run's end are a few lines over tokio's fair semaphore, which queues the
//! admissions first come, first served.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// What a run reserves at admission: 128 KiB for a run in flight before its first response
/// byte (connection, TLS state, HTTP buffers, the client's tasks: the hostile bench measured
/// about 0.1 MiB per run waiting on a slow shoot), plus a floor of [`RUN_FLOOR`] for the
/// answers of a healthy shoot, which so never draws on the shared pool.
pub const RUN_RESERVE: u64 = (128 << 10) + RUN_FLOOR;

/// The part of [`RUN_RESERVE`] a run's response bytes use first: `GET /version` and the
/// lease list of a shoot with 100 nodes (about 45 KiB) fit.
pub const RUN_FLOOR: u64 = 64 << 10;

/// The smallest pool: room for 64 runs in flight whatever the container's limit says.
pub const MIN_CAPACITY: u64 = 64 * RUN_RESERVE;

/// The pool without a memory limit to derive it from, nor a flag: 128 MiB (a quarter of the
/// 512 MiB limit `deploy/prober/deployment.yaml` sets).
pub const DEFAULT_CAPACITY: u64 = 128 << 20;

/// The share of a container's memory limit given to runs in flight; the rest is the base
/// (caches, per-shoot state, the runtime): see README, "Memory: one limit".
pub const LIMIT_SHARE: f64 = 0.25;

/// The longest a prompt run takes from its admission: a shoot apiserver answers `/version`
/// and a lease page in milliseconds, a busy one in a second or two. A trusted run not ended
/// by then is slow (see the module documentation); so a slow shoot holds the trusted half
/// at most this long.
pub const PROMPT_WITHIN: Duration = Duration::from_secs(5);

/// A run of a shoot with this `probe_timeout` is prompt if it ends within this long after
/// its admission: half its timeout, at most [`PROMPT_WITHIN`].
pub fn prompt_limit(probe_timeout: Duration) -> Duration {
    (probe_timeout / 2).min(PROMPT_WITHIN)
}

/// How a shoot's runs are classed (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Standing {
    /// Its last run ended promptly, or it has not run yet.
    #[default]
    Trusted,
    /// Its last run failed or did not end within its prompt limit.
    Suspect,
}

impl Standing {
    /// The standing a run earns for the next one: `failed`, or `took` its
    /// [`prompt_limit`] or longer, makes the shoot suspect. (A run refused for room earns
    /// nothing: the caller keeps the standing it had.)
    pub fn after_run(failed: bool, took: Duration, probe_timeout: Duration) -> Standing {
        if failed || took >= prompt_limit(probe_timeout) {
            Standing::Suspect
        } else {
            Standing::Trusted
        }
    }
}

/// Why a run got no memory.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NoRunMemory {
    /// Admission waited its whole limit.
    #[error(
        "no memory for the run: waited {waited:?} for {RUN_RESERVE} bytes of the runs' memory budget ({capacity} bytes, held by other runs in flight)"
    )]
    Admission {
        /// How long it waited.
        waited: Duration,
        /// The pool's capacity.
        capacity: u64,
    },
    /// A trusted run did not end within its prompt limit and the suspect runs' half had no
    /// room for it.
    #[error(
        "no memory for the run: it did not end within {after:?} of its admission and the slow runs' share of the budget ({share} bytes) is full"
    )]
    Slow {
        /// Its prompt limit.
        after: Duration,
        /// Bytes of the suspect runs' share.
        share: u64,
    },
    /// A response needed more than the pool had left.
    #[error(
        "no memory for the run: a response needed {wanted} more bytes than the runs' memory budget ({capacity} bytes) had left"
    )]
    Exhausted {
        /// Bytes the charge asked for.
        wanted: u64,
        /// The pool's capacity.
        capacity: u64,
    },
}

/// Where the pool's capacity came from, for the start-up log line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sizing {
    /// Bytes.
    pub capacity: u64,
    /// In words: the flag, the container's limit, or the default.
    pub source: String,
}

/// The pool's capacity: `flag` when given, else [`LIMIT_SHARE`] of the container's memory
/// limit (`cgroup_limit`, bytes) when one is set, else [`DEFAULT_CAPACITY`]; never below
/// [`MIN_CAPACITY`].
pub fn size(flag: Option<u64>, cgroup_limit: Option<u64>) -> Sizing {
    let (capacity, source) = match (flag, cgroup_limit) {
        (Some(bytes), _) => (bytes, "--run-memory-budget".to_owned()),
        (None, Some(limit)) => {
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            let share = (limit as f64 * LIMIT_SHARE) as u64;
            (
                share,
                format!("{LIMIT_SHARE} of the container's memory limit ({limit} bytes)"),
            )
        }
        (None, None) => (
            DEFAULT_CAPACITY,
            "the default (no container memory limit found)".to_owned(),
        ),
    };
    if capacity < MIN_CAPACITY {
        return Sizing {
            capacity: MIN_CAPACITY,
            source: format!("the minimum (64 runs; {source} gives {capacity} bytes)"),
        };
    }
    Sizing { capacity, source }
}

/// The container's memory limit in bytes, from the cgroup v2 `memory.max` or the cgroup v1
/// `memory.limit_in_bytes` text (`None`: no limit, or the file does not hold one).
pub fn cgroup_limit_from(
    v2_memory_max: Option<&str>,
    v1_limit_in_bytes: Option<&str>,
) -> Option<u64> {
    if let Some(text) = v2_memory_max {
        // "max" is no limit.
        return text.trim().parse::<u64>().ok();
    }
    // cgroup v1 says "no limit" with a huge number (the page-rounded i64 maximum).
    let limit = v1_limit_in_bytes?.trim().parse::<u64>().ok()?;
    (limit < 1 << 60).then_some(limit)
}

/// The container's memory limit, read from the process's cgroup files (see
/// [`cgroup_limit_from`]).
pub fn cgroup_limit() -> Option<u64> {
    let read = |path: &str| std::fs::read_to_string(path).ok();
    cgroup_limit_from(
        read("/sys/fs/cgroup/memory.max").as_deref(),
        read("/sys/fs/cgroup/memory/memory.limit_in_bytes").as_deref(),
    )
}

/// The metrics of the pool (registered by `crate::metrics`).
#[derive(Debug, Clone, Default)]
pub struct BudgetMetrics {
    /// Bytes held by runs in flight (reserves and charges).
    pub held: Gauge,
    /// The pool's capacity.
    pub capacity: Gauge,
    /// Runs that got no memory: waited out their admission.
    pub admission_refusals: Counter,
    /// Runs that got no memory: a response's charge was refused.
    pub charge_refusals: Counter,
    /// Runs ended at their prompt limit: slow, and the suspect runs' share was full.
    pub slow_refusals: Counter,
}

/// The process-wide pool of bytes for runs in flight. One per process, shared through the
/// prober's context.
#[derive(Debug)]
pub struct MemoryBudget {
    capacity: u64,
    /// The suspect runs' share of `capacity`.
    suspect_share: u64,
    /// Every byte held by a run, trusted or suspect.
    pool: Arc<Semaphore>,
    /// The bytes suspect runs may hold: half the pool.
    suspect: Arc<Semaphore>,
    metrics: BudgetMetrics,
}

/// A semaphore's permit count for `bytes` (its permits are bytes; it holds at most
/// `Semaphore::MAX_PERMITS`).
fn permits(bytes: u64) -> usize {
    usize::try_from(bytes)
        .unwrap_or(usize::MAX)
        .min(Semaphore::MAX_PERMITS)
}

/// `bytes` as one acquisition (tokio takes at most `u32::MAX` permits at once).
fn acquisition(bytes: u64) -> Option<u32> {
    u32::try_from(bytes).ok()
}

impl MemoryBudget {
    /// A pool of `capacity` bytes (at least one [`RUN_RESERVE`]).
    pub fn new(capacity: u64, metrics: BudgetMetrics) -> Arc<Self> {
        let capacity = capacity.max(RUN_RESERVE);
        metrics
            .capacity
            .set(i64::try_from(capacity).unwrap_or(i64::MAX));
        let suspect_share = (capacity / 2).max(RUN_RESERVE);
        Arc::new(MemoryBudget {
            capacity,
            suspect_share,
            pool: Arc::new(Semaphore::new(permits(capacity))),
            suspect: Arc::new(Semaphore::new(permits(suspect_share))),
            metrics,
        })
    }

    /// A pool too large to ever refuse (tests that are not about memory).
    #[cfg(test)]
    pub(crate) fn unbounded() -> Arc<Self> {
        Self::new(1 << 50, BudgetMetrics::default())
    }

    /// Bytes held by runs in flight now.
    pub fn held(&self) -> u64 {
        let available = self.pool.available_permits() as u64;
        self.capacity.saturating_sub(available)
    }

    fn publish(&self) {
        self.metrics
            .held
            .set(i64::try_from(self.held()).unwrap_or(i64::MAX));
    }

    /// Admits a run of a shoot of `standing`: waits (first come, first served) at most `wait`
    /// for its [`RUN_RESERVE`].
    pub async fn admit(
        self: &Arc<Self>,
        standing: Standing,
        wait: Duration,
    ) -> Result<MemoryGrant, NoRunMemory> {
        let refused = || {
            self.metrics.admission_refusals.inc();
            NoRunMemory::Admission {
                waited: wait,
                capacity: self.capacity,
            }
        };
        let reserve = acquisition(RUN_RESERVE).unwrap_or(u32::MAX);
        let acquire = async {
            let class = match standing {
                Standing::Trusted => None,
                Standing::Suspect => Some(
                    self.suspect
                        .clone()
                        .acquire_many_owned(reserve)
                        .await
                        .ok()?,
                ),
            };
            let pool = self.pool.clone().acquire_many_owned(reserve).await.ok()?;
            Some((pool, class))
        };
        let Ok(Some((pool, class))) = tokio::time::timeout(wait, acquire).await else {
            return Err(refused());
        };
        self.publish();
        Ok(MemoryGrant {
            budget: self.clone(),
            state: Mutex::new(GrantState {
                permits: Some((pool, class)),
                floor_left: RUN_FLOOR,
                taken: 0,
                responses: 0,
            }),
        })
    }
}

/// One run's hold on the pool: its reserve and what it was charged. Everything returns to the
/// pool when it is dropped (the run's end); a response body's bytes return earlier, once the
/// run has decoded and dropped it ([`MemoryGrant::release_response`]).
#[derive(Debug)]
pub struct MemoryGrant {
    budget: Arc<MemoryBudget>,
    state: Mutex<GrantState>,
}

#[derive(Debug)]
struct GrantState {
    /// The pool's permits and, for a suspect run, its class's (taken out when dropped).
    permits: Option<(OwnedSemaphorePermit, Option<OwnedSemaphorePermit>)>,
    /// What is left of the reserve's floor.
    floor_left: u64,
    /// Bytes taken from the pool past the reserve.
    taken: u64,
    /// Bytes of response bodies charged and not yet released (from the floor or the pool).
    responses: u64,
}

impl MemoryGrant {
    /// Charges `bytes` the run holds until it ends (its decoded views): from the floor while
    /// it lasts, then from the pool (and the class's share), without waiting. A refusal fails
    /// the run.
    pub fn charge(&self, bytes: u64) -> Result<(), NoRunMemory> {
        self.take(bytes, false)
    }

    /// Charges `bytes` of a response body as they arrive, like [`MemoryGrant::charge`]; they
    /// return to the pool with [`MemoryGrant::release_response`] or at the run's end.
    pub fn charge_response(&self, bytes: u64) -> Result<(), NoRunMemory> {
        self.take(bytes, true)
    }

    /// Returns up to `bytes` of what response bodies were charged (never views, never the
    /// reserve): the run decoded a body and dropped it.
    pub fn release_response(&self, bytes: u64) {
        let mut state = self.lock();
        let n = bytes.min(state.responses);
        state.responses -= n;
        let from_pool = n.min(state.taken);
        if let Some((pool, class)) = state.permits.as_mut() {
            drop(pool.split(permits(from_pool)));
            if let Some(class) = class {
                drop(class.split(permits(from_pool)));
            }
        }
        state.taken -= from_pool;
        state.floor_left = (state.floor_left + (n - from_pool)).min(RUN_FLOOR);
        drop(state);
        self.budget.publish();
    }

    /// Whether the run holds a place in the suspect runs' share (admitted as suspect, or
    /// demoted).
    pub fn is_suspect(&self) -> bool {
        self.lock()
            .permits
            .as_ref()
            .is_some_and(|(_, class)| class.is_some())
    }

    /// Moves a trusted run that did not end within its prompt limit (`after`) into the
    /// suspect runs' share: everything it holds is taken from that share too, without
    /// waiting. When the share has no room the run must end ([`NoRunMemory::Slow`]): a slow
    /// run may not stay among the prompt ones. Nothing to do for a suspect run.
    pub fn demote(&self, after: Duration) -> Result<(), NoRunMemory> {
        let budget = &self.budget;
        let mut state = self.lock();
        let held = RUN_RESERVE + state.taken;
        let GrantState { permits, .. } = &mut *state;
        let Some((_, class)) = permits.as_mut() else {
            return Ok(());
        };
        if class.is_some() {
            return Ok(());
        }
        let refused = || {
            budget.metrics.slow_refusals.inc();
            NoRunMemory::Slow {
                after,
                share: budget.suspect_share,
            }
        };
        let n = acquisition(held).ok_or_else(refused)?;
        let share = budget
            .suspect
            .clone()
            .try_acquire_many_owned(n)
            .map_err(|_| refused())?;
        *class = Some(share);
        Ok(())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, GrantState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn take(&self, bytes: u64, response: bool) -> Result<(), NoRunMemory> {
        let budget = &self.budget;
        let mut state = self.lock();
        let from_floor = state.floor_left.min(bytes);
        let rest = bytes - from_floor;
        if rest > 0 {
            let refused = || {
                budget.metrics.charge_refusals.inc();
                NoRunMemory::Exhausted {
                    wanted: rest,
                    capacity: budget.capacity,
                }
            };
            let n = acquisition(rest).ok_or_else(refused)?;
            let GrantState { permits, .. } = &mut *state;
            let Some((pool, class)) = permits.as_mut() else {
                return Err(refused());
            };
            let class_permit = match class {
                Some(_) => Some(
                    budget
                        .suspect
                        .clone()
                        .try_acquire_many_owned(n)
                        .map_err(|_| refused())?,
                ),
                None => None,
            };
            let pool_permit = budget
                .pool
                .clone()
                .try_acquire_many_owned(n)
                .map_err(|_| refused())?;
            pool.merge(pool_permit);
            if let (Some(class), Some(more)) = (class.as_mut(), class_permit) {
                class.merge(more);
            }
            state.taken += rest;
        }
        state.floor_left -= from_floor;
        if response {
            state.responses += bytes;
        }
        drop(state);
        budget.publish();
        Ok(())
    }
}

impl Drop for MemoryGrant {
    fn drop(&mut self) {
        // Released here rather than by the fields' own drop after this, so the gauge sees it.
        drop(
            self.state
                .get_mut()
                .unwrap_or_else(PoisonError::into_inner)
                .permits
                .take(),
        );
        self.budget.publish();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const WAIT: Duration = Duration::from_secs(10);

    /// A pool of room for `runs` reserves.
    fn pool(runs: u64) -> Arc<MemoryBudget> {
        MemoryBudget::new(runs * RUN_RESERVE, BudgetMetrics::default())
    }

    #[tokio::test(start_paused = true)]
    async fn runs_past_the_capacity_wait_first_come_first_served_then_are_refused() {
        let budget = pool(2);
        let a = budget.admit(Standing::Trusted, WAIT).await.expect("a");
        let _b = budget.admit(Standing::Trusted, WAIT).await.expect("b");
        assert_eq!(budget.held(), 2 * RUN_RESERVE);
        // The third waits for a run to end: admitted the moment `a` ends.
        let third = tokio::spawn({
            let budget = budget.clone();
            async move { budget.admit(Standing::Trusted, WAIT).await }
        });
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert!(!third.is_finished());
        drop(a);
        let started = tokio::time::Instant::now();
        let _c = third.await.expect("task").expect("admitted once a ended");
        assert_eq!(started.elapsed(), Duration::ZERO);
        // A fourth waits its whole limit and is refused.
        let started = tokio::time::Instant::now();
        let refused = budget
            .admit(Standing::Trusted, WAIT)
            .await
            .expect_err("full");
        assert_eq!(started.elapsed(), WAIT);
        assert!(
            matches!(refused, NoRunMemory::Admission { .. }),
            "{refused}"
        );
        assert_eq!(budget.metrics.admission_refusals.get(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn suspect_runs_fill_at_most_half_and_trusted_ones_keep_the_rest() {
        let budget = pool(8);
        let mut suspects = Vec::new();
        for _ in 0..4 {
            suspects.push(
                budget
                    .admit(Standing::Suspect, WAIT)
                    .await
                    .expect("suspect"),
            );
        }
        // A fifth suspect run waits out its limit though the pool has room.
        let refused = budget.admit(Standing::Suspect, WAIT).await;
        assert!(refused.is_err());
        // Trusted runs are admitted at once into the other half.
        let started = tokio::time::Instant::now();
        let mut trusted = Vec::new();
        for _ in 0..4 {
            trusted.push(
                budget
                    .admit(Standing::Trusted, WAIT)
                    .await
                    .expect("trusted"),
            );
        }
        assert_eq!(started.elapsed(), Duration::ZERO);
        assert_eq!(budget.held(), 8 * RUN_RESERVE);
        drop((suspects, trusted));
        assert_eq!(budget.held(), 0);
        assert_eq!(budget.metrics.held.get(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn responses_use_the_floor_then_the_pool_and_a_refused_charge_fails_only_its_run() {
        let budget = pool(4);
        let big = budget.admit(Standing::Trusted, WAIT).await.expect("big");
        let small = budget.admit(Standing::Trusted, WAIT).await.expect("small");
        // A healthy shoot's answers fit the floor: nothing more is held.
        small.charge(RUN_FLOOR).expect("floor");
        assert_eq!(budget.held(), 2 * RUN_RESERVE);
        // A large answer draws on the pool: the two reserves left, and no more.
        big.charge(RUN_FLOOR + 2 * RUN_RESERVE)
            .expect("the pool's rest");
        assert_eq!(budget.held(), 4 * RUN_RESERVE);
        let refused = big.charge(1).expect_err("exhausted");
        assert!(
            matches!(refused, NoRunMemory::Exhausted { wanted: 1, .. }),
            "{refused}"
        );
        assert_eq!(budget.metrics.charge_refusals.get(), 1);
        // The other run still has its reserve; the big one's end frees everything it held.
        small.charge(0).expect("nothing");
        drop(big);
        assert_eq!(budget.held(), RUN_RESERVE);
        let again = budget
            .admit(Standing::Trusted, WAIT)
            .await
            .expect("room again");
        drop((again, small));
        assert_eq!(budget.held(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_decoded_bodys_bytes_return_to_the_pool_and_views_stay_until_the_runs_end() {
        // The suspect half: 4 reserves.
        let budget = pool(8);
        let grant = budget
            .admit(Standing::Suspect, WAIT)
            .await
            .expect("admitted");
        // A body of the floor and one reserve's worth, then its views of 1,000 bytes.
        grant
            .charge_response(RUN_FLOOR + RUN_RESERVE)
            .expect("the body");
        grant.charge(1000).expect("its views");
        assert_eq!(budget.held(), 2 * RUN_RESERVE + 1000);
        // The body decoded and dropped: its bytes go back; the views now fit in the floor, so
        // only the reserve is held (in the suspect half too: three more suspect runs fit).
        grant.release_response(u64::MAX);
        assert_eq!(budget.held(), RUN_RESERVE);
        let mut others = Vec::new();
        for _ in 0..3 {
            others.push(
                budget
                    .admit(Standing::Suspect, Duration::ZERO)
                    .await
                    .expect("room in the suspect half again"),
            );
        }
        drop(others);
        let _other = budget
            .admit(Standing::Suspect, Duration::ZERO)
            .await
            .expect("room");
        // Releasing again returns nothing: views and the reserve stay until the run ends.
        grant.release_response(u64::MAX);
        assert_eq!(budget.held(), 2 * RUN_RESERVE);
        drop(grant);
        assert_eq!(budget.held(), RUN_RESERVE);
    }

    #[tokio::test(start_paused = true)]
    async fn a_suspect_runs_charges_count_against_its_half() {
        let budget = pool(4);
        let suspect = budget
            .admit(Standing::Suspect, WAIT)
            .await
            .expect("suspect");
        // Its half is 2 reserves: one held, one left to charge.
        suspect
            .charge(RUN_FLOOR + RUN_RESERVE)
            .expect("its half's rest");
        assert!(suspect.charge(1).is_err());
        // The trusted half is untouched.
        let _a = budget.admit(Standing::Trusted, WAIT).await.expect("a");
        let _b = budget.admit(Standing::Trusted, WAIT).await.expect("b");
    }

    #[tokio::test(start_paused = true)]
    async fn a_slow_trusted_run_moves_into_the_suspect_half_or_is_refused_when_it_is_full() {
        // The suspect half: 2 reserves.
        let budget = pool(4);
        let after = Duration::from_secs(5);
        let slow = budget.admit(Standing::Trusted, WAIT).await.expect("slow");
        slow.charge(RUN_FLOOR + 1000).expect("past the floor");
        assert!(!slow.is_suspect());
        slow.demote(after).expect("room in the suspect half");
        assert!(slow.is_suspect());
        // All it holds now counts in the suspect half: a suspect reserve no longer fits there.
        assert_eq!(budget.held(), RUN_RESERVE + 1000);
        assert!(
            budget
                .admit(Standing::Suspect, Duration::ZERO)
                .await
                .is_err()
        );
        // A second slow run finds the half full: refused, and the pool is unchanged by it.
        let other = budget.admit(Standing::Trusted, WAIT).await.expect("other");
        let refused = other.demote(after).expect_err("the suspect half is full");
        assert!(
            matches!(refused, NoRunMemory::Slow { share, .. } if share == 2 * RUN_RESERVE),
            "{refused}"
        );
        assert_eq!(budget.metrics.slow_refusals.get(), 1);
        assert!(!other.is_suspect());
        assert_eq!(budget.held(), 2 * RUN_RESERVE + 1000);
        // Demoting again costs nothing; once the first slow run ends, the half has room.
        slow.demote(after).expect("already suspect");
        drop(slow);
        other.demote(after).expect("room again");
        drop(other);
        assert_eq!(budget.held(), 0);
        let _full_half = [
            budget
                .admit(Standing::Suspect, Duration::ZERO)
                .await
                .expect("1"),
            budget
                .admit(Standing::Suspect, Duration::ZERO)
                .await
                .expect("2"),
        ];
    }

    #[test]
    fn the_capacity_comes_from_the_flag_then_the_containers_limit_then_the_default() {
        assert_eq!(size(Some(300 << 20), Some(1 << 30)).capacity, 300 << 20);
        let from_limit = size(None, Some(512 << 20));
        assert_eq!(from_limit.capacity, 128 << 20);
        assert!(
            from_limit.source.contains("536870912"),
            "{}",
            from_limit.source
        );
        assert_eq!(size(None, None).capacity, DEFAULT_CAPACITY);
        let tiny = size(None, Some(16 << 20));
        assert_eq!(tiny.capacity, MIN_CAPACITY);
        assert!(tiny.source.starts_with("the minimum"), "{}", tiny.source);
    }

    #[test]
    fn cgroup_limits_are_read_from_v2_then_v1_and_no_limit_is_none() {
        assert_eq!(
            cgroup_limit_from(Some("536870912\n"), None),
            Some(512 << 20)
        );
        assert_eq!(cgroup_limit_from(Some("max\n"), Some("1024")), None);
        assert_eq!(
            cgroup_limit_from(None, Some("268435456\n")),
            Some(256 << 20)
        );
        assert_eq!(cgroup_limit_from(None, Some("9223372036854771712")), None);
        assert_eq!(cgroup_limit_from(None, None), None);
    }

    #[test]
    fn a_failed_or_slow_run_makes_the_shoot_suspect() {
        let timeout = Duration::from_secs(10);
        let prompt = Duration::from_millis(40);
        assert_eq!(
            Standing::after_run(false, prompt, timeout),
            Standing::Trusted
        );
        assert_eq!(
            Standing::after_run(true, prompt, timeout),
            Standing::Suspect
        );
        // The prompt limit: half the timeout (5 s here), never more than PROMPT_WITHIN.
        assert_eq!(
            Standing::after_run(false, Duration::from_secs(5), timeout),
            Standing::Suspect
        );
        assert_eq!(prompt_limit(timeout), Duration::from_secs(5));
        assert_eq!(prompt_limit(Duration::from_secs(30)), PROMPT_WITHIN);
        assert_eq!(
            Standing::after_run(false, Duration::from_secs(6), Duration::from_secs(30)),
            Standing::Suspect
        );
    }
}
