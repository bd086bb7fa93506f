//! Every schedule, up to a bound, of hostile runs against one protected run (docs/behaviour.md
//! §2.21; issue 34): the budget itself ([`MemoryBudget`], not a model of it) on a paused clock,
//! two seats, three other shoots and the protected one, for each combination of
//!
//! - what each other shoot is, and when its run arrives: a shoot that hangs with a decision
//!   pending (its targets scaled down, then it stopped answering), a shoot that hangs with a
//!   clean history (the worst case: nothing tells it from an honest shoot until it hangs), a
//!   hanging shoot that was slow before, or a fat one (it charges a seat's worth past its floor,
//!   then hangs); arriving at 0, F/2 or F;
//! - what the protected shoot is: a shoot in outage with a decision pending, or the first
//!   outage run of a shoot whose last run was slow (no decision pending yet); arriving at 0+,
//!   F/2, F or 3F/2; once admitted it charges a seat's worth past its floor (its node list)
//!   and ends 100 ms later;
//! - whether the process is starved while the protected run reads (its run takes F longer in
//!   wall time, all of it lag the [`LagClock`] saw).
//!
//! After each schedule: the pool never held more than its capacity; the protected run was
//! admitted within `F × (A + 1)`, A the other shoots ahead of or beside it in line (each of
//! their runs may hold every seat for up to F before the protected run may take it back); and
//! with none ahead (A = 0), it was never refused a charge nor ended for room.
//!
//! `cargo test --lib` plays the schedules whose other shoots all arrive at 0 (1,024 of them);
//! CI plays every arrival (`DWD_INTERLEAVING_RUNS` ≥ 2: 27,648 schedules).

use super::*;

/// The prompt limit of the schedules.
const F: Duration = Duration::from_secs(2);
/// Call deadline of every run (a hanging run ends by itself after it).
const T: Duration = Duration::from_secs(4);
/// Seats of the pool.
const SEATS: u64 = 2;

/// What another shoot is.
#[derive(Debug, Clone, Copy)]
enum Other {
    /// Hangs; a decision pending, slow its last 8 runs.
    HangingPending,
    /// Hangs; clean history, no decision pending.
    HangingClean,
    /// Hangs; slow its last 2 runs.
    HangingSlow,
    /// Charges a seat past its floor (clean history, no decision pending), then hangs.
    Fat,
}

impl Other {
    fn claim(self) -> Claim {
        match self {
            Other::HangingPending => Claim {
                pending: true,
                history: SlowHistory::of_slow_runs(8),
                ticket: None,
            },
            Other::HangingClean | Other::Fat => Claim::default(),
            Other::HangingSlow => Claim {
                history: SlowHistory::of_slow_runs(2),
                ..Claim::default()
            },
        }
    }
}

const OTHERS: [Other; 4] = [
    Other::HangingPending,
    Other::HangingClean,
    Other::HangingSlow,
    Other::Fat,
];

/// What the protected shoot is.
#[derive(Debug, Clone, Copy)]
enum Protected {
    /// In outage, a decision pending, clean history.
    Pending,
    /// Its first outage run after one slow run: no decision pending yet.
    OnceSlow,
}

impl Protected {
    fn claim(self) -> Claim {
        match self {
            Protected::Pending => Claim {
                pending: true,
                ..Claim::default()
            },
            Protected::OnceSlow => Claim {
                history: SlowHistory::of_slow_runs(1),
                ..Claim::default()
            },
        }
    }
}

/// One schedule.
#[derive(Debug, Clone, Copy)]
struct Schedule {
    others: [(Other, Duration); 3],
    protected: Protected,
    arrives: Duration,
    starved: bool,
}

/// Arrivals of the other shoots: 0 only, or 0, F/2 and F.
fn other_arrivals(full: bool) -> Vec<Duration> {
    if full {
        vec![Duration::ZERO, F / 2, F]
    } else {
        vec![Duration::ZERO]
    }
}

fn schedules(full: bool) -> Vec<Schedule> {
    let mut out = Vec::new();
    let arrivals = other_arrivals(full);
    let mut each = Vec::new();
    for other in OTHERS {
        for at in &arrivals {
            each.push((other, *at));
        }
    }
    for a in &each {
        for b in &each {
            for c in &each {
                for protected in [Protected::Pending, Protected::OnceSlow] {
                    for arrives in [Duration::from_millis(1), F / 2, F, 3 * F / 2] {
                        for starved in [false, true] {
                            out.push(Schedule {
                                others: [*a, *b, *c],
                                protected,
                                arrives,
                                starved,
                            });
                        }
                    }
                }
            }
        }
    }
    out
}

/// Notes in `over` what the pool holds when it holds more than its capacity (looked at after
/// every admission and charge: the only steps that add to it).
fn watch(budget: &MemoryBudget, over: &std::sync::atomic::AtomicU64) {
    let held = budget.held();
    if held > budget.capacity() {
        over.store(held, std::sync::atomic::Ordering::Relaxed);
    }
}

/// A hanging (or fat) run of another shoot: holds its seat until ended for room or its
/// deadline.
async fn other_run(
    budget: Arc<MemoryBudget>,
    other: Other,
    at: Duration,
    over: Arc<std::sync::atomic::AtomicU64>,
) {
    tokio::time::sleep(at).await;
    let Ok(grant) = budget.admit(other.claim(), T).await else {
        return;
    };
    watch(&budget, &over);
    if let Other::Fat = other {
        // Its call's deadline bounds the wait, as in a run.
        let charged = tokio::time::timeout(T, grant.charge_response(RUN_FLOOR + RUN_RESERVE)).await;
        watch(&budget, &over);
        if !matches!(charged, Ok(Ok(()))) {
            return;
        }
    }
    tokio::select! {
        _ = grant.ended_for_room() => {}
        () = tokio::time::sleep(T) => {}
    }
}

/// Plays `schedule`; the violations, in words.
async fn play(schedule: Schedule) -> Vec<String> {
    let budget = MemoryBudget::new(
        SEATS * RUN_RESERVE,
        F,
        Arc::default(),
        BudgetMetrics::default(),
    );
    let over = Arc::new(std::sync::atomic::AtomicU64::new(0));
    for (other, at) in schedule.others {
        tokio::spawn(other_run(budget.clone(), other, at, over.clone()));
    }
    let mut violations = Vec::new();
    tokio::time::sleep(schedule.arrives).await;
    let arrived = Instant::now();
    match budget.admit(schedule.protected.claim(), 10 * T).await {
        Err(e) => violations.push(format!("the protected run was not admitted: {e}")),
        Ok(grant) => {
            watch(&budget, &over);
            let waited = arrived.elapsed();
            let claim = schedule.protected.claim();
            // Ahead or beside in line as docs/behaviour.md §2.21 says (not as the code under
            // test ranks: a mutation of its ranking must not move the bound with it).
            let spec_rank = |c: Claim| (c.history.slow_runs(), u8::from(!c.pending));
            let ahead = schedule
                .others
                .iter()
                .filter(|(other, _)| spec_rank(other.claim()) <= spec_rank(claim))
                .count() as u32;
            let bound = F * (ahead + 1);
            if waited > bound {
                violations.push(format!(
                    "the protected run waited {waited:?} for room, bound {bound:?} ({ahead} ahead)"
                ));
            }
            // Its call's deadline bounds the wait, as in a run.
            let charged =
                tokio::time::timeout(T, grant.charge_response(RUN_FLOOR + RUN_RESERVE)).await;
            match charged {
                Ok(Err(e)) if ahead == 0 => {
                    violations.push(format!("the protected run's charge was refused: {e}"));
                }
                Err(_) if ahead == 0 => violations.push(format!(
                    "the protected run's charge waited past its call's deadline ({T:?})"
                )),
                _ => {}
            }
            watch(&budget, &over);
            // Its reads: 100 ms, or, starved, F more of lag.
            let reads = async {
                if schedule.starved {
                    budget.lag_clock().add(F);
                    tokio::time::sleep(F).await;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            };
            tokio::select! {
                why = grant.ended_for_room() => if ahead == 0 {
                    violations.push(format!("the protected run was ended for room: {why}"));
                },
                () = reads => {}
            }
        }
    }
    // Everything ends; the pool is whole again.
    tokio::time::sleep(3 * T).await;
    let over = over.load(std::sync::atomic::Ordering::Relaxed);
    if over > 0 {
        violations.push(format!("the pool held {over} bytes, past its capacity"));
    }
    if budget.held() != 0 {
        violations.push(format!("{} bytes still held at the end", budget.held()));
    }
    violations
}

/// Plays schedules `first, first + every, …`, each on a paused clock of its own; the first 5
/// failures, in words.
fn play_share(schedules: &[Schedule], first: usize, every: usize) -> Vec<String> {
    let mut failures = Vec::new();
    for schedule in schedules.iter().skip(first).step_by(every) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .expect("runtime");
        let violations = runtime.block_on(play(*schedule));
        if !violations.is_empty() {
            failures.push(format!("{schedule:?}:\n  {}", violations.join("\n  ")));
            if failures.len() >= 5 {
                break;
            }
        }
    }
    failures
}

#[test]
fn no_schedule_of_hostile_runs_keeps_a_protected_run_waiting_past_its_bound() {
    let full = std::env::var("DWD_INTERLEAVING_RUNS")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .is_some_and(|runs| runs >= 2);
    let schedules = Arc::new(schedules(full));
    let threads = std::thread::available_parallelism().map_or(1, usize::from);
    let shares: Vec<_> = (0..threads)
        .map(|i| {
            let schedules = schedules.clone();
            std::thread::spawn(move || play_share(&schedules, i, threads))
        })
        .collect();
    let failures: Vec<String> = shares
        .into_iter()
        .flat_map(|share| share.join().expect("a share of the schedules"))
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
