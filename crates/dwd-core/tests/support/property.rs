//! The generator and the case loop of our property tests, one file for dwd-core's
//! `tests/properties.rs` and dependency-watchdog's `tests/kubeconfig_properties.rs` (which pulls
//! it in with `#[path]`).
//!
//! Hand-written rather than a property-testing crate, for what these tests need and a crate
//! would change: every run starts from one printed seed (`DWD_PROPTEST_SEED` replays it, each
//! property's cases derived from it and the property's name), runs for a time budget
//! (`DWD_PROPTEST_MILLIS`, default 1000 ms per property) after a minimum of cases, and has no
//! shrinking (the inputs are small; a failure prints the input for the corpus). No extra crates.

// Each test crate uses part of it (the kubeconfig properties draw no magnitudes).
#![allow(dead_code)]

use std::time::{Duration, Instant};

/// SplitMix64: small, fast, good enough to explore inputs, reproducible from one `u64`.
pub(crate) struct Rng(pub u64);

impl Rng {
    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n > 0`).
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    pub(crate) fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    pub(crate) fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len() as u64) as usize]
    }

    /// A number spread over magnitudes: small ones often, huge ones sometimes.
    pub(crate) fn magnitude(&mut self, max: u64) -> u64 {
        let bits = self.below(65);
        let v = if bits == 64 {
            self.next_u64()
        } else {
            self.next_u64() & ((1u64 << bits) - 1)
        };
        v % max.saturating_add(1).max(1)
    }
}

/// The seed of this run: `DWD_PROPTEST_SEED`, else the clock; printed once so a failure can be
/// replayed.
pub(crate) fn run_seed() -> u64 {
    static SEED: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *SEED.get_or_init(|| {
        let seed = std::env::var("DWD_PROPTEST_SEED")
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_nanos() as u64)
                    .unwrap_or(1)
            });
        eprintln!("property seed: {seed} (replay with DWD_PROPTEST_SEED={seed})");
        seed
    })
}

/// How long each property runs: `DWD_PROPTEST_MILLIS`, default 1000 ms.
pub(crate) fn budget() -> Duration {
    let millis = std::env::var("DWD_PROPTEST_MILLIS")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(1000);
    Duration::from_millis(millis)
}

/// FNV-1a of a property's name, so each property draws its own cases from the one run seed.
pub(crate) fn fnv(s: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in s.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// The cases of one property: at least `at_least` of them, then more until the budget is spent.
/// Each case gets a seed of its own, named in a failure so the case can be found again.
pub(crate) struct Cases {
    name: String,
    seeds: Rng,
    started: Instant,
    budget: Duration,
    at_least: u64,
    /// Cases started so far; the current one is `done - 1`.
    done: u64,
}

impl Cases {
    pub(crate) fn new(name: &str, at_least: u64) -> Cases {
        Cases {
            name: name.to_owned(),
            seeds: Rng(run_seed() ^ fnv(name)),
            started: Instant::now(),
            budget: budget(),
            at_least,
            done: 0,
        }
    }

    /// The next case's seed, or `None` (after printing how many cases ran) once there were
    /// enough cases and the budget is spent.
    pub(crate) fn next_seed(&mut self) -> Option<u64> {
        if self.done >= self.at_least && self.started.elapsed() >= self.budget {
            eprintln!(
                "property {}: {} cases in {:.2}s",
                self.name,
                self.done,
                self.started.elapsed().as_secs_f64()
            );
            return None;
        }
        self.done += 1;
        Some(self.seeds.next_u64())
    }

    /// Fails the test on the current case, which returned `failure`.
    pub(crate) fn failed(&self, case_seed: u64, failure: &str) -> ! {
        panic!(
            "property {} failed on case {} (run seed {}, case seed {case_seed}):\n{failure}",
            self.name,
            self.done.saturating_sub(1),
            run_seed()
        )
    }

    /// Fails the test on the current case, which panicked (its input is printed above).
    pub(crate) fn panicked(&self, case_seed: u64) -> ! {
        panic!(
            "property {} panicked on case {} (run seed {}, case seed {case_seed}); the input is printed above",
            self.name,
            self.done.saturating_sub(1),
            run_seed()
        )
    }
}

// --- the edits the text mutators share ------------------------------------------------------

/// A text's lines (one empty line for an empty text) and one of them picked to edit.
pub(crate) fn lines_to_edit(rng: &mut Rng, text: &str) -> (Vec<String>, usize) {
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    if lines.is_empty() {
        lines.push(String::new());
    }
    let i = rng.below(lines.len() as u64) as usize;
    (lines, i)
}

/// The edits every mutator makes, its `choice`s 0 to 2: remove line `i`, duplicate it, swap it
/// with a random line. Returns whether `choice` was one of them (for other choices, nothing is
/// done and nothing drawn).
pub(crate) fn move_line(rng: &mut Rng, lines: &mut Vec<String>, i: usize, choice: u64) -> bool {
    match choice {
        0 => {
            lines.remove(i);
        }
        1 => {
            let l = lines[i].clone();
            lines.insert(i, l);
        }
        2 => {
            let j = rng.below(lines.len() as u64) as usize;
            lines.swap(i, j);
        }
        _ => return false,
    }
    true
}

/// Inserts one of `chars` (YAML syntax) at a random place of `line`.
pub(crate) fn insert_char(rng: &mut Rng, line: &mut String, chars: &[char]) {
    let c = *rng.pick(chars);
    let at = (0..=line.len())
        .filter(|&k| line.is_char_boundary(k))
        .nth(rng.below(line.len() as u64 + 1) as usize)
        .unwrap_or(0);
    line.insert(at, c);
}

/// Runs `check` on generated cases until the budget is spent (at least 100 cases). `check`
/// gets a generator of its own per case and returns the failure with the input it saw.
pub(crate) fn property(name: &str, mut check: impl FnMut(&mut Rng) -> Result<(), String>) {
    use std::panic::{AssertUnwindSafe, catch_unwind};
    let mut cases = Cases::new(name, 100);
    while let Some(case_seed) = cases.next_seed() {
        let mut rng = Rng(case_seed);
        match catch_unwind(AssertUnwindSafe(|| check(&mut rng))) {
            Ok(Ok(())) => {}
            Ok(Err(failure)) => cases.failed(case_seed, &failure),
            Err(_) => cases.panicked(case_seed),
        }
    }
}
