//! The memory budget's rules on a paused clock: who gets room first, when room is taken back,
//! charges before admissions, shoot time (docs/behaviour.md §2.6).

use super::*;

#[path = "interleavings.rs"]
mod interleavings;

const WAIT: Duration = Duration::from_secs(30);
/// The prompt limit of these tests.
const F: Duration = Duration::from_secs(5);

/// A pool of room for `runs` reserves.
fn pool(runs: u64) -> Arc<MemoryBudget> {
    MemoryBudget::new(
        runs * RUN_RESERVE,
        F,
        Arc::default(),
        BudgetMetrics::default(),
    )
}

const PENDING: Claim = Claim {
    pending: true,
    history: SlowHistory(0),
    ticket: None,
};
const PROMPT: Claim = Claim {
    pending: false,
    history: SlowHistory(0),
    ticket: None,
};

/// A shoot whose last `runs` runs were slow.
fn slow(runs: u32) -> Claim {
    Claim {
        history: SlowHistory::of_slow_runs(runs),
        ..PROMPT
    }
}

fn not_made(budget: &MemoryBudget, cause: NotMadeCause) -> u64 {
    budget
        .metrics
        .not_made
        .get_or_create(&CauseLabels { cause })
        .get()
}

/// Admits in the background; the task's result is the grant or the refusal.
fn admit_later(
    budget: &Arc<MemoryBudget>,
    claim: Claim,
    wait: Duration,
) -> tokio::task::JoinHandle<Result<MemoryGrant, NoRunMemory>> {
    let budget = budget.clone();
    tokio::spawn(async move { budget.admit(claim, wait).await })
}

/// Waits, in steps of 100 ms of the paused clock, at most a minute, until `ended` says so.
async fn until(mut ended: impl FnMut() -> bool) {
    for _ in 0..600 {
        settle().await;
        if ended() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("not within a minute");
}

/// Lets spawned tasks run (no time passes).
async fn settle() {
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
}

#[tokio::test(start_paused = true)]
async fn runs_past_the_capacity_wait_in_line_then_are_refused_without_counting_on_their_shoot() {
    let budget = pool(2);
    let a = budget.admit(PROMPT, WAIT).await.expect("a");
    let _b = budget.admit(PROMPT, WAIT).await.expect("b");
    assert_eq!(budget.held(), 2 * RUN_RESERVE);
    // The third waits for a run to end: admitted the moment `a` ends.
    let third = admit_later(&budget, PROMPT, WAIT);
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(!third.is_finished());
    drop(a);
    let started = Instant::now();
    let c = third.await.expect("task").expect("admitted once a ended");
    assert_eq!(started.elapsed(), Duration::ZERO);
    // A fourth waits its whole limit: the two in flight are younger than F for 2 s, then
    // they are ended for it... unless the wait is shorter than that.
    let started = Instant::now();
    let refused = budget
        .admit(PROMPT, Duration::from_secs(1))
        .await
        .expect_err("full");
    assert_eq!(started.elapsed(), Duration::from_secs(1));
    assert!(
        matches!(refused, NoRunMemory::Admission { .. }),
        "{refused}"
    );
    assert_eq!(refused.cause(), NotMadeCause::NoRoomInTime);
    assert_eq!(not_made(&budget, NotMadeCause::NoRoomInTime), 1);
    drop(c);
}

#[tokio::test(start_paused = true)]
async fn a_pending_run_goes_before_prompt_and_slow_runs_that_waited_longer() {
    let budget = pool(1);
    let holder = budget.admit(PROMPT, WAIT).await.expect("holder");
    let slow_one = admit_later(&budget, slow(2), WAIT);
    settle().await;
    let prompt_one = admit_later(&budget, PROMPT, WAIT);
    settle().await;
    let pending_one = admit_later(&budget, PENDING, WAIT);
    settle().await;
    assert_eq!(
        budget
            .metrics
            .waiting
            .get_or_create(&LevelLabels {
                level: Level::Pending
            })
            .get(),
        1
    );
    drop(holder);
    let first = pending_one.await.expect("task").expect("pending first");
    assert_eq!(first.level(), Level::Pending);
    assert!(!prompt_one.is_finished() && !slow_one.is_finished());
    drop(first);
    let second = prompt_one.await.expect("task").expect("then prompt");
    assert!(!slow_one.is_finished());
    drop(second);
    let third = slow_one.await.expect("task").expect("then slow");
    assert_eq!(third.level(), Level::Slow);
}

#[tokio::test(start_paused = true)]
async fn within_a_level_fewer_slow_runs_in_a_row_go_first_then_first_come() {
    let budget = pool(1);
    let holder = budget.admit(PROMPT, WAIT).await.expect("holder");
    let hanging = admit_later(&budget, slow(6), WAIT);
    settle().await;
    let once_slow = admit_later(&budget, slow(1), WAIT);
    settle().await;
    drop(holder);
    let first = once_slow.await.expect("task").expect("once slow first");
    assert!(!hanging.is_finished());
    drop(first);
    hanging.await.expect("task").expect("then the hanging one");
}

#[tokio::test(start_paused = true)]
async fn slow_runs_hold_half_of_their_own_and_borrowed_room_is_taken_back_at_once() {
    let budget = pool(4);
    // Nobody else waits: slow runs borrow the whole pool.
    let mut slow_runs = Vec::new();
    for _ in 0..4 {
        slow_runs.push(budget.admit(slow(3), WAIT).await.expect("slow"));
    }
    assert_eq!(budget.held(), 4 * RUN_RESERVE);
    // A prompt run arrives: the youngest borrower is ended at once (it is young: no F).
    let started = Instant::now();
    let prompt = admit_later(&budget, PROMPT, WAIT);
    settle().await;
    let ended: Vec<usize> = slow_runs
        .iter()
        .enumerate()
        .filter(|(_, g)| g.end.is_cancelled())
        .map(|(i, _)| i)
        .collect();
    assert_eq!(ended, [3], "the youngest borrower");
    let why = slow_runs[3].ended_for_room().await;
    assert!(matches!(why, NoRunMemory::Reclaimed { .. }), "{why}");
    drop(slow_runs.pop());
    let _prompt = prompt.await.expect("task").expect("admitted");
    assert_eq!(started.elapsed(), Duration::ZERO);
    // A second prompt run takes back the next borrower; the last two are the slow half.
    let second = admit_later(&budget, PROMPT, WAIT);
    settle().await;
    assert!(slow_runs[2].end.is_cancelled());
    drop(slow_runs.pop());
    let _second = second.await.expect("task").expect("admitted");
    assert!(!slow_runs[0].end.is_cancelled() && !slow_runs[1].end.is_cancelled());
    assert_eq!(not_made(&budget, NotMadeCause::EndedForRoom), 2);
}

#[tokio::test(start_paused = true)]
async fn a_run_past_its_prompt_limit_is_ended_only_while_someone_waits_lowest_level_first() {
    let budget = pool(3);
    let pending = budget.admit(PENDING, WAIT).await.expect("pending");
    tokio::time::sleep(Duration::from_secs(1)).await;
    let prompt = budget.admit(PROMPT, WAIT).await.expect("prompt");
    tokio::time::sleep(Duration::from_secs(1)).await;
    let slow_one = budget.admit(slow(1), WAIT).await.expect("slow");
    // Long past F, nobody waits: nothing is ended.
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert!(!pending.end.is_cancelled() && !prompt.end.is_cancelled());
    assert!(!slow_one.end.is_cancelled());
    // A prompt run waits: the slow run goes first (lowest level), though it is the youngest.
    let waiter = admit_later(&budget, PROMPT, WAIT);
    settle().await;
    assert!(slow_one.end.is_cancelled());
    assert!(!prompt.end.is_cancelled() && !pending.end.is_cancelled());
    let why = slow_one.ended_for_room().await;
    assert!(
        matches!(why, NoRunMemory::EndedForRoom { in_flight, limit } if in_flight >= F && limit == F),
        "{why}"
    );
    drop(slow_one);
    let admitted = waiter.await.expect("task").expect("admitted");
    // A slow run waits: it may end the prompt run past F (slow this run, whatever its level
    // said), not the young one just admitted, nor the pending one.
    let slow_waiter = admit_later(&budget, slow(1), WAIT);
    settle().await;
    assert!(prompt.end.is_cancelled());
    assert!(!admitted.end.is_cancelled() && !pending.end.is_cancelled());
    drop(prompt);
    let _slow_admitted = slow_waiter.await.expect("task").expect("admitted");
    assert_eq!(not_made(&budget, NotMadeCause::EndedForRoom), 2);
}

#[tokio::test(start_paused = true)]
async fn a_run_past_its_limit_is_judged_by_what_its_shoot_does_now_and_ended_only_for_those_ahead()
{
    let budget = pool(1);
    let pending = budget.admit(PENDING, WAIT).await.expect("pending");
    tokio::time::sleep(Duration::from_secs(60)).await;
    // Slow now: as if its shoot had one slow run in a row, with a decision pending. Shoots
    // slower than that are behind it and end nothing of it.
    for claim in [slow(1), slow(2)] {
        let refused = budget.admit(claim, Duration::from_secs(1)).await;
        assert!(refused.is_err(), "{claim:?}");
        assert!(!pending.end.is_cancelled(), "{claim:?}");
    }
    // A shoot that answers promptly is ahead of it.
    let other = admit_later(&budget, PROMPT, WAIT);
    settle().await;
    assert!(pending.end.is_cancelled());
    drop(pending);
    other.await.expect("task").expect("admitted");
}

#[tokio::test(start_paused = true)]
async fn a_hanging_shoot_falls_behind_every_shoot_that_answers_whatever_it_claims() {
    let budget = pool(1);
    let holder = budget.admit(PROMPT, WAIT).await.expect("holder");
    // Hanging, slow many runs in a row, with a decision pending (its targets were scaled
    // down and it never answers since).
    let hanging_pending = admit_later(
        &budget,
        Claim {
            pending: true,
            ..slow(5)
        },
        WAIT,
    );
    settle().await;
    let once_slow = admit_later(&budget, slow(1), WAIT);
    settle().await;
    drop(holder);
    let first = once_slow
        .await
        .expect("task")
        .expect("the once-slow shoot first");
    assert!(!hanging_pending.is_finished());
    drop(first);
    hanging_pending
        .await
        .expect("task")
        .expect("then the hanging one");
}

#[tokio::test(start_paused = true)]
async fn a_waiter_finds_room_within_the_prompt_limit_whatever_holds_the_pool() {
    // Runs of shoots that were prompt until now fill the pool, all admitted just now, and
    // hang: nothing can be ended for F.
    let budget = pool(4);
    let mut hanging = Vec::new();
    for _ in 0..4 {
        hanging.push(budget.admit(PROMPT, WAIT).await.expect("hanging"));
    }
    let started = Instant::now();
    let waiter = admit_later(&budget, PENDING, WAIT);
    // The waiter looks again when the oldest passes F, and ends it.
    until(|| hanging.iter().any(|g| g.end.is_cancelled())).await;
    let ended = hanging
        .iter()
        .position(|g| g.end.is_cancelled())
        .expect("one ended");
    assert_eq!(started.elapsed(), F);
    drop(hanging.remove(ended));
    waiter.await.expect("task").expect("admitted within F");
    assert_eq!(started.elapsed(), F);
}

#[tokio::test(start_paused = true)]
async fn shoot_time_leaves_out_the_time_the_process_could_not_run() {
    let budget = pool(1);
    let run = budget.admit(PROMPT, WAIT).await.expect("run");
    // 8 s of wall time, 6 of which the process was starved: 2 s of shoot time.
    tokio::time::sleep(Duration::from_secs(8)).await;
    budget.lag_clock().add(Duration::from_secs(6));
    assert_eq!(run.shoot_time(), Duration::from_secs(2));
    // So a waiter does not end it yet: only once it is F old in shoot time (3 s later).
    let started = Instant::now();
    let waiter = admit_later(&budget, PROMPT, WAIT);
    settle().await;
    assert!(!run.end.is_cancelled());
    until(|| run.end.is_cancelled()).await;
    assert_eq!(started.elapsed(), Duration::from_secs(3));
    drop(run);
    waiter.await.expect("task").expect("admitted");
}

#[tokio::test(start_paused = true)]
async fn the_lag_clock_counts_how_late_its_ticker_wakes() {
    let clock = Arc::new(LagClock::default());
    let stop = CancellationToken::new();
    let ticker = tokio::spawn({
        let (clock, stop) = (clock.clone(), stop.clone());
        async move { clock.run(stop).await }
    });
    // On time: no lag.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(clock.lag(), Duration::ZERO);
    stop.cancel();
    ticker.await.expect("ticker");
}

#[tokio::test(start_paused = true)]
async fn charges_of_runs_in_flight_go_before_admissions_waiting() {
    // Two reserves and half of one: an admission waits while half a reserve is free.
    let budget = MemoryBudget::new(
        2 * RUN_RESERVE + RUN_RESERVE / 2,
        F,
        Arc::default(),
        BudgetMetrics::default(),
    );
    let reader = budget.admit(PROMPT, WAIT).await.expect("reader");
    let _holder = budget.admit(PROMPT, WAIT).await.expect("holder");
    let waiter = admit_later(&budget, PROMPT, WAIT);
    settle().await;
    assert!(!waiter.is_finished());
    // The reader's page passes its floor: it takes the free half reserve although an
    // admission waits. (A semaphore hands what is free to the queued admission first, so
    // every such charge of a run in flight failed while anyone waited.)
    reader
        .charge_response(RUN_FLOOR + RUN_RESERVE / 4)
        .await
        .expect("charged before the waiting admission");
    reader.release_response(u64::MAX);
    drop(reader);
    waiter.await.expect("task").expect("admitted");
}

#[tokio::test(start_paused = true)]
async fn a_runs_charge_waits_for_room_and_takes_it_from_runs_past_their_limit() {
    let budget = pool(3);
    let hanging = budget.admit(slow(4), WAIT).await.expect("hanging");
    let other = budget.admit(PROMPT, WAIT).await.expect("other");
    let reader = Arc::new(budget.admit(PENDING, WAIT).await.expect("pending"));
    // A node page past the floor and past what is free: it waits, and once the hanging run is
    // past F it is ended for it; the pending reader is never refused.
    let started = Instant::now();
    let charge = tokio::spawn({
        let reader = reader.clone();
        async move { reader.charge_response(RUN_FLOOR + RUN_RESERVE / 2).await }
    });
    until(|| hanging.end.is_cancelled()).await;
    assert_eq!(started.elapsed(), F);
    assert!(!other.end.is_cancelled(), "the slow one goes first");
    drop(hanging);
    charge.await.expect("task").expect("charged");
    // A charge past what the pool could ever give a run is refused at once.
    let refused = other
        .charge_response(RUN_FLOOR + 3 * RUN_RESERVE)
        .await
        .expect_err("more than the pool holds");
    assert_eq!(refused.cause(), NotMadeCause::ResponseRefused);
    reader.release_response(u64::MAX);
    drop(reader);
    drop(other);
    assert_eq!(budget.held(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_dropped_admission_leaves_the_line_and_gives_back_room_granted_too_late() {
    let budget = pool(1);
    let holder = budget.admit(PROMPT, WAIT).await.expect("holder");
    let gone = admit_later(&budget, PROMPT, WAIT);
    settle().await;
    gone.abort();
    settle().await;
    drop(holder);
    assert_eq!(budget.held(), 0);
    assert_eq!(
        budget
            .metrics
            .waiting
            .get_or_create(&LevelLabels {
                level: Level::Prompt
            })
            .get(),
        0
    );
    // The pool is whole again.
    let _again = budget
        .admit(PROMPT, Duration::ZERO)
        .await
        .expect("admitted");
}

#[tokio::test(start_paused = true)]
async fn a_decoded_bodys_bytes_return_to_the_pool_and_views_stay_until_the_runs_end() {
    let budget = pool(4);
    let grant = budget.admit(PENDING, WAIT).await.expect("admitted");
    // A body of the floor and one reserve's worth, then its views of 1,000 bytes.
    grant
        .charge_response(RUN_FLOOR + RUN_RESERVE)
        .await
        .expect("the body");
    grant.charge(1000).await.expect("its views");
    assert_eq!(budget.held(), 2 * RUN_RESERVE + 1000);
    // The body decoded and dropped: its bytes go back; the views fit in the floor.
    grant.release_response(u64::MAX);
    assert_eq!(budget.held(), RUN_RESERVE);
    // Releasing again returns nothing: views and the reserve stay until the run ends.
    grant.release_response(u64::MAX);
    assert_eq!(budget.held(), RUN_RESERVE);
    drop(grant);
    assert_eq!(budget.held(), 0);
    assert_eq!(budget.metrics.held.get(), 0);
}

#[test]
fn a_shoots_history_remembers_its_last_eight_runs_slow_or_not_whatever_the_result() {
    let quick = Duration::from_millis(40);
    let history = SlowHistory::default().after(quick, F);
    assert_eq!((history.slow_runs(), history.last_slow()), (0, false));
    let history = history.after(F, F);
    assert_eq!((history.slow_runs(), history.last_slow()), (1, true));
    // Prompt again: still one slow run remembered, the last not slow.
    let history = history.after(quick, F);
    assert_eq!((history.slow_runs(), history.last_slow()), (1, false));
    // Eight slow runs push it out; at most eight are remembered.
    let mut hanging = history;
    for _ in 0..20 {
        hanging = hanging.after(Duration::from_secs(30), F);
    }
    assert_eq!(hanging.slow_runs(), REMEMBERED_RUNS);
    assert_eq!(SlowHistory::of_slow_runs(3).slow_runs(), 3);
    assert_eq!(SlowHistory::of_slow_runs(30).slow_runs(), REMEMBERED_RUNS);
    // The prompt limit: half the timeout, never more than PROMPT_WITHIN.
    assert_eq!(prompt_limit(Duration::from_secs(10)), F);
    assert_eq!(prompt_limit(Duration::from_secs(4)), Duration::from_secs(2));
    assert_eq!(prompt_limit(Duration::from_secs(30)), PROMPT_WITHIN);
    // The levels of the metrics.
    assert_eq!(PENDING.level(), Level::Pending);
    assert_eq!(slow(2).level(), Level::Slow);
    assert_eq!(PROMPT.level(), Level::Prompt);
}

#[test]
fn admission_waits_at_most_the_probe_timeout_else_the_interval() {
    let timeout = Duration::from_secs(10);
    assert_eq!(admission_limit(timeout, Duration::from_secs(30)), timeout);
    let none = dwd_core::config::prober::NO_TIMEOUT;
    assert_eq!(
        admission_limit(none, Duration::from_secs(30)),
        Duration::from_secs(30)
    );
    assert_eq!(admission_limit(none, Duration::ZERO), PROMPT_WITHIN);
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

#[tokio::test(start_paused = true)]
async fn a_shoot_whose_run_was_not_made_keeps_its_place_among_equals() {
    let budget = pool(1);
    let holder = budget.admit(PROMPT, WAIT).await.expect("holder");
    // A shoot's run waits and is refused (the holder is young throughout).
    let ticket = budget.ticket();
    let first_try = Claim {
        ticket: Some(ticket),
        ..PROMPT
    };
    assert!(
        budget
            .admit(first_try, Duration::from_secs(1))
            .await
            .is_err()
    );
    // Another shoot's run arrives; then the first shoot's next run, with the same ticket.
    let later = admit_later(
        &budget,
        Claim {
            ticket: Some(budget.ticket()),
            ..PROMPT
        },
        WAIT,
    );
    settle().await;
    let again = admit_later(&budget, first_try, WAIT);
    settle().await;
    drop(holder);
    let admitted = again.await.expect("task").expect("ahead by its ticket");
    assert!(!later.is_finished());
    drop(admitted);
    later.await.expect("task").expect("then the later one");
}

#[tokio::test(start_paused = true)]
async fn shoots_that_hang_run_after_run_wait_their_turn_and_end_nobodys_run() {
    let budget = pool(1);
    let hanging = budget.admit(slow(5), WAIT).await.expect("hanging");
    tokio::time::sleep(Duration::from_secs(60)).await;
    // Another shoot slow three runs of late: it waits its turn, ending nothing.
    let refused = budget.admit(slow(3), Duration::from_secs(1)).await;
    assert!(refused.is_err());
    assert!(!hanging.end.is_cancelled());
    assert_eq!(not_made(&budget, NotMadeCause::EndedForRoom), 0);
    // A shoot slow once (a shoot in outage whose last run was slow) takes the room back.
    let once_slow = admit_later(&budget, slow(1), WAIT);
    settle().await;
    assert!(hanging.end.is_cancelled());
    drop(hanging);
    once_slow.await.expect("task").expect("admitted");
}
