//! Every interleaving, up to a bound, of what can happen to one shoot while its flows queue
//! for the seed's budget (docs/behaviour.md §2.20): the probe's verdict at each run (scale
//! down, scale up, or a failed run), the seed's answer to the next write (success, 409, 429
//! with a `Retry-After` past the call's deadline, 500 to all three attempts: a failed flow, or
//! a timeout: the write is made but its answer comes after the call gave up), and a process
//! restart (a new probe and
//! executor on the same seed). Not a model of the code: the code itself (probe loop, executor,
//! scaler, limiter) against the in-memory seed on a paused clock, for each of the
//! sequences of the bound below. After each sequence the shoot stays healthy until everything is
//! restored, and the seed's history of objects and requests is checked:
//!
//! 1. a target at 0 carries the meltdown marker, in every state the seed ever held;
//! 2. a `replicas` record is never lowered while the marker stays, and the marker goes only
//!    with the target at its record or above (never lost);
//! 3. levels keep their order: with kcm scaled down at level 0 and mcm at level 1 (up: mcm
//!    first), the state "kcm running, mcm at 0" never exists;
//! 4. no two writes of the shoot overlap on the wire;
//! 5. an outage after the sequence takes both targets down with their record (2),
//!    and in the end both run their 2 replicas without annotations;
//! 6. no write goes against the newest verdict: a scale-down write is never sent after a run
//!    found the leases fresh (the newest verdict before it), nor a restoring write after one
//!    found them expired, whether or not the flow had written before (issue 34: a newer
//!    verdict stops an opposite flow even when its own targets are already there). The
//!    verdicts are the probe's snapshots: what each run's lease list was answered with.
//!
//! The bound: runs × (3 verdicts × 5 write answers × restart or not) = 30^runs sequences, each
//! with a final healthy stretch; a write every 10 s (the budget) against a run every 10 s, so
//! flows span several runs and get superseded mid-flow. `cargo test --lib` plays 1 run (30
//! sequences, a fraction of a second); CI plays 3 (27,000 sequences, 214 s on 2 cores:
//! `DWD_INTERLEAVING_RUNS=3`, see `.ci/run`).

use super::*;

/// What a run finds.
#[derive(Debug, Clone, Copy)]
enum Verdict {
    /// Every lease expired: scale down.
    Down,
    /// Every lease fresh: scale up.
    Up,
    /// The API server probe fails: nothing decided.
    Failed,
}

/// The seed's answer to the next write.
#[derive(Debug, Clone, Copy)]
enum Answer {
    Ok,
    Conflict,
    /// 429 with a `Retry-After` past the call's deadline: returned, not waited out.
    Throttled,
    /// 500 to this write and its two retries: the target, its level and the flow fail.
    Rejected,
    /// The write is made, its answer held back past the call's timeout.
    TimedOut,
}

/// One step: what the next run finds, how the next write is answered, whether the process
/// restarts first.
#[derive(Debug, Clone, Copy)]
struct Step {
    verdict: Verdict,
    answer: Answer,
    restart: bool,
}

const VERDICTS: [Verdict; 3] = [Verdict::Down, Verdict::Up, Verdict::Failed];
const ANSWERS: [Answer; 5] = [
    Answer::Ok,
    Answer::Conflict,
    Answer::Throttled,
    Answer::Rejected,
    Answer::TimedOut,
];
/// Runs per sequence: `DWD_INTERLEAVING_RUNS`, 1 without it.
fn runs() -> usize {
    std::env::var("DWD_INTERLEAVING_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1)
}

fn options() -> Vec<Step> {
    let mut out = Vec::new();
    for verdict in VERDICTS {
        for answer in ANSWERS {
            for restart in [false, true] {
                out.push(Step {
                    verdict,
                    answer,
                    restart,
                });
            }
        }
    }
    out
}

/// Runs every 10 s from 10 s on, no jitter.
const SCHEDULE: &str =
    "probeInterval: 10s\ninitialDelay: 10s\nprobeTimeout: 5s\nbackoffJitterFactor: 0\n";

/// Plays `steps` on a new harness and checks the invariants; the violations, in words.
async fn play(steps: &[Step]) -> Vec<String> {
    // One write every 10 s.
    let mut h = Harness::launch(SCHEDULE, GRACE, [FRESH; 3], Mode::Normal, Some((0.1, 1))).await;
    // When the leases changed and whether they were expired from then on (invariant 6).
    let mut leases_expired = vec![(h.t0, false)];
    let mut t = secs(5);
    for step in steps {
        let ages = match step.verdict {
            Verdict::Down => [EXPIRED; 3],
            Verdict::Up | Verdict::Failed => [FRESH; 3],
        };
        for (i, age) in ages.into_iter().enumerate() {
            h.shoot.insert("leases", lease(&format!("n{}", i + 1), age));
        }
        leases_expired.push((Instant::now(), matches!(step.verdict, Verdict::Down)));
        {
            let mut s = h.shoot.lock();
            s.fail_requests.clear();
            if let Verdict::Failed = step.verdict {
                s.fail_requests.push_back(("/version", 500, None));
            }
        }
        {
            // Queued behind any answers of earlier steps not yet used.
            let mut s = h.seed.lock();
            match step.answer {
                Answer::Ok => {}
                Answer::Conflict => s.fail_writes.push_back((409, None)),
                Answer::Throttled => s.fail_writes.push_back((429, Some("60"))),
                // Past the targets' 30 s call timeout.
                Answer::TimedOut => s.slow_writes.push_back(secs(40)),
                Answer::Rejected => {
                    for _ in 0..crate::prober::scaler::ATTEMPTS {
                        s.fail_writes.push_back((500, None));
                    }
                }
            }
        }
        if step.restart {
            h.restart().await;
        }
        t += secs(10);
        h.until(t).await;
    }
    // Then an outage (the steps' write answers still used up first): whatever came before,
    // both go down. Up to 9 failed attempts and 2 writes at one per 10 s, and a run to
    // retry each failed flow: 150 s.
    h.shoot.lock().fail_requests.clear();
    for node in ["n1", "n2", "n3"] {
        h.shoot.insert("leases", lease(node, EXPIRED));
    }
    leases_expired.push((Instant::now(), true));
    t += secs(150);
    h.until(t).await;
    let mut violations = Vec::new();
    for name in ["kcm", "mcm"] {
        let object = h.seed.object("deployments", NS, name);
        if object["spec"]["replicas"] != 0
            || object["metadata"]["annotations"][REPLICAS_ANNOTATION] != "2"
        {
            violations.push(format!(
                "after the outage {name} is not down with its record: {object}"
            ));
        }
    }
    // Healthy from here on: long enough for every restore at one write per 10 s.
    h.renew(&["n1", "n2", "n3"]);
    leases_expired.push((Instant::now(), false));
    h.until(t + secs(120)).await;
    violations.extend(check(&h));
    violations.extend(check_newest_verdict(&h, &leases_expired));
    h.stop().await;
    violations
}

/// The invariants over the seed's history (see the module docs).
fn check(h: &Harness) -> Vec<String> {
    let mut violations = Vec::new();
    let s = h.seed.lock();
    // The replicas of each target as the history goes, starting at 2.
    let mut state: BTreeMap<String, i64> = BTreeMap::from([("kcm".into(), 2), ("mcm".into(), 2)]);
    let mut record: BTreeMap<String, Option<i64>> = BTreeMap::new();
    for (at, plural, name, object) in &s.history {
        if plural != "deployments" {
            continue;
        }
        let at = *at - h.t0;
        let replicas = object["spec"]["replicas"].as_i64().unwrap_or(-1);
        let annotations = &object["metadata"]["annotations"];
        let marked = annotations.get(MELTDOWN_ANNOTATION).is_some();
        let recorded = annotations
            .get(REPLICAS_ANNOTATION)
            .and_then(Value::as_str)
            .and_then(|r| r.parse::<i64>().ok());
        if replicas == 0 && !marked {
            violations.push(format!("{at:?}: {name} at 0 without the marker: {object}"));
        }
        let before = record.get(name).copied().flatten();
        match (before, marked, recorded) {
            (Some(b), true, Some(r)) if r < b => {
                violations.push(format!("{at:?}: {name}'s record lowered from {b} to {r}"));
            }
            (Some(b), true, None) => {
                violations.push(format!("{at:?}: {name}'s record {b} lost under the marker"));
            }
            (Some(b), false, _) if replicas < b => {
                violations.push(format!(
                    "{at:?}: {name}'s marker gone at {replicas} replicas, record {b}"
                ));
            }
            _ => {}
        }
        record.insert(name.clone(), if marked { recorded } else { None });
        state.insert(name.clone(), replicas);
        if state["kcm"] > 0 && state["mcm"] == 0 {
            violations.push(format!("{at:?}: mcm at 0 while kcm runs (level order)"));
        }
    }
    let mut writes: Vec<&Call> = s
        .calls
        .iter()
        .filter(|c| c.method == Method::PATCH)
        .collect();
    writes.sort_by_key(|c| c.at);
    for pair in writes.windows(2) {
        if pair[1].at < pair[0].done {
            violations.push(format!(
                "writes overlap: {} at {:?} before {} answered at {:?}",
                pair[1].path,
                pair[1].at - h.t0,
                pair[0].path,
                pair[0].done - h.t0
            ));
        }
    }
    for name in ["kcm", "mcm"] {
        let object = s
            .objects
            .get(&("deployments".to_owned(), NS.to_owned(), name.to_owned()))
            .cloned()
            .unwrap_or_default();
        let annotations = object["metadata"]["annotations"].as_object();
        if object["spec"]["replicas"] != 2 || annotations.is_some_and(|a| !a.is_empty()) {
            violations.push(format!("in the end {name} is not restored: {object}"));
        }
    }
    violations
}

/// Invariant 6 (see the module docs): each scaling write follows the newest verdict before it.
/// `leases_expired`: when the shoot's leases changed, and whether expired from then on.
fn check_newest_verdict(h: &Harness, leases_expired: &[(Instant, bool)]) -> Vec<String> {
    // Each answered lease list is a run's snapshot: its verdict, by what the leases were then.
    let verdicts: Vec<(Instant, bool)> = h
        .shoot
        .calls_to("/leases")
        .iter()
        .filter(|c| c.status == 200)
        .map(|c| {
            let expired = leases_expired
                .iter()
                .rev()
                .find(|(at, _)| *at <= c.at)
                .is_some_and(|(_, expired)| *expired);
            (c.at, expired)
        })
        .collect();
    let mut violations = Vec::new();
    for write in h.seed.writes() {
        if write.method != Method::PATCH {
            continue;
        }
        let down = write.body["spec"]["replicas"] == 0;
        // The newest verdict taken before the write was sent (a run answered at the same
        // instant may have come before or after it: not judged).
        let Some(&(at, expired)) = verdicts.iter().rev().find(|(at, _)| *at < write.at) else {
            continue;
        };
        let same_instant = verdicts.iter().any(|(a, e)| *a == write.at && *e == down);
        if expired != down && !same_instant {
            violations.push(format!(
                "{:?}: {} write to {} after the run of {:?} found the leases {}",
                write.at - h.t0,
                if down { "a scale-down" } else { "a restoring" },
                write.path,
                at - h.t0,
                if expired { "expired" } else { "fresh" }
            ));
        }
    }
    violations
}

/// Plays sequences `first, first + every, …` of the `runs`-step sequences, each on a paused
/// clock of its own; the first 5 failures, in words.
fn play_share(runs: usize, first: usize, every: usize) -> Vec<String> {
    let options = options();
    let total = options.len().pow(runs as u32);
    let mut failures = Vec::new();
    for n in (first..total).step_by(every) {
        let steps: Vec<Step> = (0..runs)
            .map(|k| options[(n / options.len().pow(k as u32)) % options.len()])
            .collect();
        // A runtime per sequence: dropping it ends the watch caches and tasks the sequence
        // started (kept, they would pile up and slow every later sequence down).
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .expect("runtime");
        let violations = runtime.block_on(play(&steps));
        if !violations.is_empty() {
            failures.push(format!("{steps:?}:\n  {}", violations.join("\n  ")));
            if failures.len() >= 5 {
                break;
            }
        }
    }
    failures
}

#[test]
fn every_interleaving_of_verdicts_write_answers_and_restarts_keeps_the_invariants() {
    let runs = runs();
    let threads = std::thread::available_parallelism().map_or(1, usize::from);
    let shares: Vec<_> = (0..threads)
        .map(|i| std::thread::spawn(move || play_share(runs, i, threads)))
        .collect();
    let failures: Vec<String> = shares
        .into_iter()
        .flat_map(|share| share.join().expect("a share of the sequences"))
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
